"""The PostgreSQL ingest benchmark at a tiny size: the floor and the library run in worker
processes, every message is stored and indexed (the run checks it), and the report says
what it promises (timings are machine noise and are not checked). One worker count here:
each costs two databases and fresh interpreters; the realistic run is in the README."""

from __future__ import annotations

import json

import pytest

from activememory._cli import main
from activememory.simulations.bench.pgingest import format_table

from pg_server import ADMIN_DSN, scratch_database


def test_bench_pgingest_reports_the_floor_the_library_and_the_verdict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with scratch_database():  # skips (or fails under CI) without a server, as the store's tests
        pass
    tiny = ["--appenders", "3", "--messages-per-appender", "20", "--workers", "1", "--rounds", "1"]
    assert main(["bench", "pgingest", *tiny, "--dsn", ADMIN_DSN, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    [one] = result["by_workers"]
    assert one["workers"] == 1
    assert one["raw"]["messages"] == one["library"]["messages"] == 60
    assert one["raw"]["mean_batch_size"] == 3  # one message per appender a transaction
    assert 1 <= one["library"]["mean_batch_size"] <= 3
    assert one["pass"] == (one["ratio_to_raw"] >= result["target_ratio"] == 0.7)
    assert one["ratio_to_raw_by_round"] == [one["ratio_to_raw"]]
    assert result["scaling"]["workers"] == [1, 1] and result["pass"] == one["pass"]
    table = format_table(result)
    assert f"{one['ratio_to_raw']:.2f} (target >= 0.7): " in table
    assert "scaling, 1 workers / 1: library 1.00x" in table
