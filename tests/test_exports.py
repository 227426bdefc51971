"""The public surface is exactly what the README documents, and every name has a docstring."""

from __future__ import annotations

import re
from pathlib import Path

import activememory as am

README = Path(__file__).resolve().parent.parent / "README.md"


def exported() -> set[str]:
    return {name for name in vars(am) if not name.startswith("_")} - {
        "actors", "protocol", "storage", "simulations", "recall", "embed",  # sub-packages, not API names
    }  # fmt: skip


def test_exports_match_the_readme() -> None:
    section = README.read_text().split("## Public API", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`am\.(\w+)`", section))
    assert exported() == documented


def test_every_public_name_has_a_docstring() -> None:
    for name in exported():
        obj = getattr(am, name)
        if callable(obj):
            assert obj.__doc__, name
