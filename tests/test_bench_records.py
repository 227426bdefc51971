"""The records benchmark at a tiny size: it runs end to end and reports what it promises.

Timings are not checked (they are machine noise); the report's structure is, and a second
run on the same state directory reuses the loaded stores.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from activememory._cli import main
from activememory.simulations.bench import records as bench_records
from activememory.storage import records as records_storage
from activememory.storage import search as search_storage

TINY = [
    "--records", "1500",
    "--degree", "4",
    "--users", "12",
    "--agents", "4",
    "--threads", "20",
    "--vocab", "3000",
    "--queries", "25",
    "--warmup", "3",
    "--hops", "2",
]  # fmt: skip
PERCENTILES = {"p50", "p90", "p99", "max", "mean"}
SIDES = {
    "raw_or_ms",
    "raw_plan_ms",
    "client_ms",
    "store_ms",
    "client_sql_cpu_ms",
    "store_sql_cpu_ms",
}


@contextlib.contextmanager
def bounded(seconds: float) -> Iterator[None]:
    """Fail instead of hanging: the benchmark runs its own trio loop, so a SIGALRM bounds it."""

    def expire(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"the benchmark ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_the_benchmark_reports_its_structure_through_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["bench", "records", *TINY, "--state-dir", str(tmp_path), "--json"]
    with bounded(60):
        assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)

    assert result["benchmark"] == "records"
    corpus = result["corpus"]
    assert corpus["records"] == 1500 and corpus["relations"] == 3000
    assert 2990 <= corpus["stored_relations"] <= 3000  # a repeated random edge is stored once
    assert (corpus["users"], corpus["agents"], corpus["threads"]) == (12, 4, 20)
    assert result["load"]["reused"] is False
    assert result["queries"] == {
        "count": 25,
        "warmup": 3,
        "words": [1, 3],
        "limit": 10,
        "hops": 2,
        "floor_every": 1,
    }
    assert set(result["sides"]) == SIDES
    for side in SIDES:
        assert set(result["sides"][side]) == PERCENTILES
    assert set(result["ratios"]) == {"client_p50", "client_p99", "store_p50", "store_p99"}
    assert set(result["pass"]) == {
        "client_p99_ms",
        "store_p99_ms",
        "client_tail_ratio",
        "store_tail_ratio",
    }
    assert result["targets"] == {
        "p99_ms_max": bench_records.TARGET_P99_MS,
        "tail_ratio_max": bench_records.TARGET_TAIL_RATIO,
    }
    assert set(result["tail_ratios"]) == {"client", "store"}
    res = result["results"]
    assert 0 < res["client_mean_hits"] <= res["store_mean_hits"] <= 10
    assert res["store_mean_linked"] > 0  # the graph is expanded
    for side in ("client", "store"):
        slowest = result["slowest"][side]
        assert len(slowest) == 5
        assert [s["ms"] for s in slowest] == sorted((s["ms"] for s in slowest), reverse=True)
        # A query word may be in no record (queries are drawn from the law, not the corpus); at
        # this seed one query ('proarming') has no word in any, so among five one has documents.
        assert all(s["term_docs"] and min(s["term_docs"].values()) >= 0 for s in slowest)
        assert any(sum(s["term_docs"].values()) > 0 for s in slowest)
        assert all(0 <= s["at"] < 25 and s["other_ms"] > 0 for s in slowest)
    assert result["environment"]["state_dir_kept"] is True

    # The same parameters again: the stores are reused, the table is printed.
    with bounded(60):
        assert main(["bench", "records", *TINY, "--state-dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "reused" in table
    assert "client / raw OR" in table and "store / raw OR" in table
    assert ("PASS" in table) or ("MISS" in table)


@pytest.mark.parametrize("budget", [1500, 20], ids=["budget-default", "budget-20"])
@pytest.mark.parametrize("factor", [0, 5], ids=["join", "scope-list"])
def test_pruned_answers_agree_with_the_raw_index(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, factor: int, budget: int
) -> None:
    # The store's common-term rules at a tiny size (ranked, ranked + filled, recency only,
    # the rank budget and its window; users listed or not): the benchmark checks every
    # answer against the raw index, the number of hits included.
    monkeypatch.setattr(records_storage, "COMMON_DOCS", 60)
    monkeypatch.setattr(records_storage, "SMALL_SCOPE_FACTOR", factor)
    monkeypatch.setattr(search_storage, "RANK_BUDGET", budget)
    with bounded(60):
        assert bench_records.main([*TINY, "--queries", "60", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["results"]["client_mean_hits"] > 0


def test_a_directory_holding_foreign_databases_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "raw.db").write_bytes(b"")
    assert bench_records.main([*TINY, "--state-dir", str(tmp_path)]) == 1
    assert "use an empty directory" in capsys.readouterr().err
