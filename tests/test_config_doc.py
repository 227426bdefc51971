"""The README's configuration reference is the schema's, not a hand-made copy."""

from __future__ import annotations

from pathlib import Path

from activememory._config_doc import END, START, config_reference, splice

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_config_reference_matches_the_schema() -> None:
    text = README.read_text()
    assert START in text and END in text
    assert splice(text) == text, (
        "run: .venv/bin/python -m activememory._config_doc --write README.md"
    )


def test_reference_lists_every_key_with_its_range() -> None:
    table = config_reference()
    assert "| `timeoutMs` | integer 250–120000 | `15000` |" in table
    assert '| `qmd.searchMode` | inherit, search, vsearch, query | `"search"` |' in table
    assert table.count("\n| `") == 31
