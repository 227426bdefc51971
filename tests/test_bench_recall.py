"""The recall benchmarks at a tiny size: they run end to end and report what they promise.

Timings are not checked (they are machine noise); the report's structure is.
"""

from __future__ import annotations

import contextlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

import activememory as am
from activememory._cli import main
from activememory.simulations.bench import recall as bench_recall

TINY = [
    "--messages", "300",
    "--sessions", "8",
    "--notes", "4",
    "--recalls", "6",
    "--concurrency", "1,4",
    "--scaling-rounds", "2",
    "--runs", "3",
    "--runs-ignoring", "1",
    "--meaning-recalls", "4",
    "--embedder", "all-MiniLM-L6-v2",  # the small shipped model: quick to embed the corpus
]  # fmt: skip
PERCENTILES = {"p50", "p90", "p99", "max", "mean"}
# A hang guard, not a timing check: a whole CLI run took 20-25 s on a loaded CI machine.
HANG_S = 180


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


def test_both_benchmarks_report_their_structure_through_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["bench", "recall", *TINY, "--profile", "--state-dir", str(tmp_path), "--json"]
    with bounded(HANG_S):
        assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)

    assert result["benchmark"] == "recall"
    overhead = result["overhead"]
    assert overhead["corpus"] == {
        "messages": 300,
        "sessions": 8,
        "notes": 4,
        "vocabulary": 20_000,
        "seed": 1,
    }
    assert [level["concurrency"] for level in overhead["levels"]] == [1, 4]
    one, four = overhead["levels"]
    assert one["recalls"] == 6 and one["batches"] == 6
    assert four["batches"] == bench_recall.MIN_BATCHES
    assert four["recalls"] == 4 * bench_recall.MIN_BATCHES
    for level in [one, four, overhead["inline"]]:
        assert sum(level["statuses"].values()) == level["recalls"]
        for key in ("raw_ms", "recall_ms", "overhead_ms", "overhead_per_op_ms"):
            assert set(level[key]) == PERCENTILES
        assert 0 <= level["rescans"] <= level["batches"]
        if level["rescans"] < level["batches"]:
            assert set(level["overhead_without_rescans_ms"]) == PERCENTILES
    assert set(one["breakdown_ms"]) == {
        "memory_search_tool",
        "preflight",
        "tool_beyond_sql",
        "rest_of_pipeline",
    }
    assert "breakdown_ms" not in four
    assert overhead["inline"]["executor"] == "inline"
    assert set(overhead["note_rescan_ms"]) == PERCENTILES
    assert overhead["profile"][0] == "6 recalls at concurrency 1, thread executor"
    assert "tottime" in overhead["profile"][1]
    assert overhead["cores"] >= 1

    meaning = overhead["meaning"]
    assert meaning["recalls"] == 4 and meaning["statuses"] == {"ok": 8}
    assert meaning["embedder"] == "local/all-MiniLM-L6-v2"
    assert meaning["vectors"] >= 300  # every message and note chunk has its vector
    for key in (
        "recall_text_ms",
        "recall_meaning_ms",
        "embed_ms",
        "tool_text_ms",
        "tool_meaning_ms",
        "vector_reads_ms",
        "vector_scan_ms",
    ):
        assert set(meaning[key]) == PERCENTILES
    bound = meaning["recall_text_ms"]["p50"] + 1.2 * meaning["embed_ms"]["p50"]
    assert meaning["bound_p50_ms"] == pytest.approx(bound, abs=1e-3)
    assert meaning["pass"] == (meaning["recall_meaning_ms"]["p50"] <= meaning["bound_p50_ms"])
    extra = meaning["extra_p50_ms"]
    assert set(extra) == {"recall", "tool", "embed", "vector_reads", "rest"}
    parts = extra["embed"] + extra["vector_reads"] + extra["rest"]
    assert extra["tool"] == pytest.approx(parts, abs=1e-3)

    runs = result["overshoot"]["runs"]
    assert [(r["name"], r["runs"], r["bound_ms"]) for r in runs] == [
        ("hang", 3, 250.0),
        ("ignores_cancellation", 1, 1750.0),
    ]
    assert [r["statuses"] for r in runs] == [{"timeout": 3}, {"timeout": 1}]
    for run in runs:
        assert set(run["overshoot_ms"]) == PERCENTILES
        assert run["overshoot_ms"]["p50"] >= 0  # never back before the budget ends

    verdicts = result["verdicts"]
    assert [v["name"] for v in verdicts] == [
        "recall overhead, concurrency 1",
        "recall overhead, concurrency 4",
        "recall against the raw query, concurrency 1",
        "throughput scaling, concurrency 4 vs serial",
        "recall by meaning, concurrency 1",
        "budget overshoot, hang",
        "budget overshoot, ignores_cancellation",
    ]
    assert [v["measure"] for v in verdicts[:2]] == ["paired latency", "per op at throughput"]
    ratio, scaling = verdicts[2], verdicts[3]
    assert ratio["ratio"] == pytest.approx(one["recall_ms"]["p50"] / one["raw_ms"]["p50"], abs=1e-3)
    assert ratio["pass"] == (ratio["ratio"] <= bench_recall.TARGET_RAW_RATIO)
    paired = overhead["scaling"]
    assert (paired["concurrency"], paired["rounds"], len(paired["per_round"])) == (4, 2, 2)
    expected = paired["concurrent_per_s"] / paired["serial_per_s"]
    assert scaling["ratio"] == paired["ratio"] == pytest.approx(expected, rel=0.01)
    assert scaling["pass"] == (scaling["ratio"] >= bench_recall.TARGET_SCALING)
    assert f"{overhead['cores']} cores" in scaling["measure"]
    assert paired["raw_ceiling"] > 0 and paired["raw_threads"] >= 2
    assert all(isinstance(v["pass"], bool) for v in verdicts)


def test_the_state_dir_is_reused_and_the_report_ends_with_verdicts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = [*TINY, "--concurrency", "1", "--only", "overhead", "--state-dir", str(tmp_path)]
    with bounded(HANG_S):
        assert bench_recall.main(args) == 0
        first = capsys.readouterr().out
        assert bench_recall.main(args) == 0
    second = capsys.readouterr().out

    assert "reused" not in first.splitlines()[2]
    assert "(reused: times from the run that loaded it)" in second.splitlines()[2]
    tail = second.splitlines()[-4:]
    assert tail[0] == "Verdicts"
    assert tail[1].startswith(("  PASS recall overhead, concurrency 1", "  MISS recall overhead"))
    assert tail[2].startswith(("  PASS recall against the raw", "  MISS recall against the raw"))
    assert tail[3].startswith(("  PASS recall by meaning", "  MISS recall by meaning"))
    assert "by meaning (default config: embedder local/all-MiniLM-L6-v2, hybrid;" in second
    assert "Recall budget overshoot" not in second


@pytest.mark.parametrize(
    ("data", "by_meaning", "problem"),
    [
        ({"effectiveMode": "hybrid", "fallback": None}, True, None),
        ({"effectiveMode": "search", "fallback": None}, False, None),
        ({"effectiveMode": "search", "fallback": None}, True, "ran 'search'"),
        ({"effectiveMode": "search", "fallback": "the embedder took over 1 s"}, True, "fallback"),
        ({"effectiveMode": "hybrid", "fallback": None, "vectorsPending": True}, True, "pending"),
    ],
)
def test_a_recall_by_meaning_that_did_not_search_by_meaning_fails_the_run(
    data: dict[str, object], by_meaning: bool, problem: str | None
) -> None:
    """A broken (text-only, or lagging) by-meaning path must not look fast: the run fails."""
    model = bench_recall.ZeroThinkModel()
    probe = bench_recall.Probe(
        turn=am.Turn(
            session_key="agent:main:direct:a", messages=[am.Message(role="user", content="q")]
        ),
        query="q",
        caller="agent:main:direct:a",
    )
    model.seen["q"] = am.ToolResult(name="memory_search", content="{}", data=data)
    outcome = am.RecallOutcome(status="ok")
    if problem is None:
        bench_recall._check_meaning(model, probe, outcome, by_meaning=by_meaning)
    else:
        with pytest.raises(bench_recall.BenchmarkError, match=problem):
            bench_recall._check_meaning(model, probe, outcome, by_meaning=by_meaning)
