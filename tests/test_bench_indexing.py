"""The indexing benchmark at a tiny size: every path stores and indexes every row, and the
report says what it promises (timings are machine noise and are not checked)."""

from __future__ import annotations

import json

import pytest

from activememory._cli import main

TINY = ["--appenders", "6", "--messages-per-appender", "8", "--rounds", "2", "--json"]


def test_bench_indexing_reports_every_path_and_the_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "indexing", *TINY]) == 0
    result = json.loads(capsys.readouterr().out)
    closed = result["closed_loop"]
    assert len(closed["ratio_to_same_batches_by_round"]) == 2
    assert closed["pass"] == (closed["ratio_to_same_batches"] >= closed["target_ratio"] == 0.8)
    assert result["raw_same_batches"]["mean_batch_size"] == 6  # one message per appender
    assert closed["mean_batch_size"] <= 6 and result["per_message_commit"]["mean_batch_size"] == 1
    assert result["open_loop"]["batches"] >= 1
    disk = result["disk"]
    assert disk["messages"] == 48 and disk["index"] > 0 and disk["content"] > 0
    assert disk["total"] == disk["index"] + disk["content"] + disk["vectors"] + disk["other"]
    assert result["memory"]["resident_bytes_per_agent_database"] is not None
