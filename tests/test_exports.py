"""The public surface is exactly what the README documents, every name has a docstring and
resolves, eagerly or on first use (docs/design.md §9; what the import loads: test_startup.py)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import activememory as am

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def exported() -> set[str]:
    return set(am.__all__)


def loaded_after(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_exports_match_the_readme() -> None:
    section = README.read_text().split("## Public API", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"`am\.(\w+)`", section))
    assert exported() == documented
    assert len(am.__all__) == len(exported())  # no name twice


def test_every_public_name_resolves_and_has_a_docstring() -> None:
    for name in exported():
        obj = getattr(am, name)
        if callable(obj):
            assert obj.__doc__, name
    assert set(dir(am)) >= exported()


def test_every_name_resolves_by_from_import_in_a_fresh_interpreter() -> None:
    names = ", ".join(sorted(exported()))
    loaded = loaded_after(f"from activememory import {names}")
    assert "activememory._memory" in loaded  # the lazy names did load their modules


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        am.open_memroy  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert str(exc) == "module 'activememory' has no attribute 'open_memroy'"
    else:
        raise AssertionError("no AttributeError")


def test_the_lazy_table_and_the_type_checking_imports_agree() -> None:
    """`_LAZY` (what runs) and the `TYPE_CHECKING` block (what type checkers see) name the same
    names from the same modules."""
    tree = ast.parse((ROOT / "activememory" / "__init__.py").read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING"
    ]
    seen = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1
        for alias in node.names:
            assert alias.asname == alias.name  # an explicit re-export
            seen[alias.name] = node.module or alias.name  # `from . import sync`
    assert seen == am._LAZY


def test_a_lazy_name_loads_its_module_once_and_stays() -> None:
    loaded = loaded_after(
        "import activememory as am\n"
        "first = am.load_config\n"
        "assert am.load_config is first and 'load_config' in vars(am)\n"
        "assert 'activememory._memory' not in __import__('sys').modules"
    )
    assert "activememory._config" in loaded
