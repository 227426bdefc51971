"""The vectors benchmark at a tiny size: it runs end to end and reports what it promises.

Timings are not checked (machine noise); the report's structure is, and a second run on the
same state directory reuses the database.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from activememory._cli import main

TINY = ["--messages", "600", "--identity-rows", "200", "--dim", "16", "--queries", "3"]


def test_the_vectors_benchmark_runs_and_reuses_its_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["bench", "vectors", *TINY, "--state-dir", str(tmp_path), "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert (first["messages"], first["dim"], first["k"]) == (600, 16, 10)
    assert first["identity"]["rows"] == 200 and first["all"]["rows"] == 600
    assert set(first["identity"]["numpy"]) == {"p50", "p90", "p99", "max", "mean"}
    assert set(first["all"]["index"]) == {"p50", "p90", "p99", "max", "mean"}  # same rows
    assert first["build_s"] > 0
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["build_s"] == 0  # reused
