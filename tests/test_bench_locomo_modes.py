"""`activememory bench locomo --mode text|hybrid|both` and `--config` (docs/design.md §3, §7),
on the hand-written LoCoMo fixture of tests/test_import_locomo.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_import_locomo import SAMPLE, write

from activememory._cli import main


@pytest.fixture
def locomo(tmp_path: Path) -> Path:
    return write(tmp_path / "locomo.json", [SAMPLE])


def test_both_modes_in_one_run(capsys: pytest.CaptureFixture[str], locomo: Path) -> None:
    assert main(["bench", "locomo", "--data", str(locomo), "--mode", "both", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mode"] == "both" and list(result["modes"]) == ["text", "hybrid"]
    text, hybrid = result["modes"]["text"], result["modes"]["hybrid"]
    assert result["categories_1_4"] == text["categories_1_4"]  # the top level: text
    assert text["categories_1_4"]["recall_at"]["20"] == 1.0  # as test_import_locomo
    assert hybrid["categories_1_4"]["questions"] == 3
    assert hybrid["fallback_answers"] == 0 and text["fallback_answers"] == 0
    assert hybrid["latency_ms"]["queries"] == 4
    assert result["vector_seconds"] is not None
    assert result["hybrid"]["vectorWeight"] == 0.7 and result["hybrid"]["textWeight"] == 0.3


def test_hybrid_alone_and_its_table(capsys: pytest.CaptureFixture[str], locomo: Path) -> None:
    assert main(["bench", "locomo", "--data", str(locomo), "--mode", "hybrid"]) == 0
    table = capsys.readouterr().out
    assert "  mode hybrid " in table and "  mode text " not in table
    assert "hybrid: vectorWeight 0.7, textWeight 0.3, candidateMultiplier 4" in table
    assert "text only (fallback): 0" in table


def test_text_mode_waits_for_no_vectors(capsys: pytest.CaptureFixture[str], locomo: Path) -> None:
    assert main(["bench", "locomo", "--data", str(locomo), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["mode"] == "text" and list(result["modes"]) == ["text"]
    assert result["vector_seconds"] is None and result["hybrid"] is None


def test_config_weights_are_used_and_reported(
    capsys: pytest.CaptureFixture[str], locomo: Path, tmp_path: Path
) -> None:
    config = tmp_path / "weights.json5"
    config.write_text(
        "{agents: {defaults: {memorySearch: {query: {hybrid: "
        "{vectorWeight: 0.2, textWeight: 0.8, candidateMultiplier: 2}}}}}}"
    )
    args = ["bench", "locomo", "--data", str(locomo), "--mode", "hybrid", "--json"]
    assert main([*args, "--config", str(config)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"] == str(config)
    hybrid = result["hybrid"]
    assert (hybrid["vectorWeight"], hybrid["textWeight"], hybrid["candidateMultiplier"]) == (
        0.2,
        0.8,
        2,
    )
    config.write_text("{agents: {defaults: {memorySearch: {query: {hybrid: {textWeight: 2}}}}}}")
    assert main([*args, "--config", str(config)]) == 2
    assert "textWeight" in capsys.readouterr().err
