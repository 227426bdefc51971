"""docs/architecture.svg is what docs/architecture.py draws, and it shows every actor."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Modules in actors/ that hold no actor of their own (shared machinery).
NOT_ACTORS: set[str] = {"__init__", "group_commit", "poked"}  # the writers' one loop


def _drawing() -> object:
    spec = importlib.util.spec_from_file_location("architecture", ROOT / "docs/architecture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_picture_is_up_to_date() -> None:
    drawing = _drawing()
    assert (ROOT / "docs/architecture.svg").read_text() == drawing.render()  # type: ignore[attr-defined]


def test_every_actor_module_is_in_the_picture() -> None:
    svg = (ROOT / "docs/architecture.svg").read_text()
    for module in sorted((ROOT / "actors").glob("*.py")):
        if module.stem not in NOT_ACTORS and module.name != "composer.py":
            assert f"actors/{module.name}" in svg, module.name
    assert "composer" in svg
