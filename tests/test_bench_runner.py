"""The benchmark registry and the runner every benchmark shares: exact figures and lines."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from activememory._cli import main as cli
from activememory.simulations.bench import BENCHMARKS, runner


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_registered_benchmark_answers_help(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as raised:
        cli(["bench", name, "--help"])
    assert raised.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: activememory bench {name} [-h] [--json]")


def test_the_command_offers_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli(["bench", "nonesuch"])
    err = capsys.readouterr().err
    assert (
        "(choose from 'indexing', 'locomo', 'search', 'cjk', 'recall', 'records', 'pgsearch',"
        " 'paraphrase', 'vectors', 'startup', 'http', 'pgingest')" in err
    )
    with pytest.raises(SystemExit):
        cli(["bench", "--help"])
    # argparse wraps the help at hyphens too ("nearest-" / "neighbour"): join them back.
    out = " ".join(capsys.readouterr().out.split()).replace("- ", "-")
    assert all(f"{name}: {what}" in out for name, what in BENCHMARKS.items())


def test_percentiles_are_nearest_rank() -> None:
    assert runner.percentile([5, 1, 4, 2, 3], 50) == 3.0
    assert runner.percentile(range(1, 11), 90) == 9.0
    assert runner.percentile(range(1, 11), 99) == 10.0
    assert runner.percentile(range(1, 101), 99) == 99.0
    assert runner.percentile([7], 1) == 7.0
    assert runner.percentile([], 50) == 0.0
    seconds = [0.004, 0.001, 0.003, 0.002]
    assert runner.percentiles(seconds) == {
        "p50": 2.0,
        "p90": 4.0,
        "p99": 4.0,
        "max": 4.0,
        "mean": 2.5,
    }
    assert runner.percentiles([]) == {}


def test_ratios_and_verdict_lines() -> None:
    assert runner.ratio(1.0, 3.0) == 0.333
    assert runner.ratio(2.0, 3.0, 4) == 0.6667
    assert runner.against("0.24", ">=", "0.50", False) == "0.24 (target >= 0.50): MISS"
    assert runner.against("p99 6.46 ms", "<=", 10.0, True) == "p99 6.46 ms (target <= 10): PASS"
    assert runner.against("p50 1.10", "<=", 1.5, True) == "p50 1.10 (target <= 1.5): PASS"


def test_table_rows() -> None:
    p = {"p50": 1.0, "p90": 2.5, "p99": 10.25, "max": 1234.5678}
    assert (
        runner.percentile_header("side", 6)
        == "  side        p50      p90      p99       max   (ms)"
    )
    assert runner.percentile_row("raw", p, 4) == "    raw     1.000    2.500   10.250  1234.568"
    assert runner.percentile_row("raw", {}, 4, indent=2) == "  raw  (none)"


def test_integer_options_say_what_they_expect() -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a positive integer, got '0'$"):
        runner.positive_int("0")
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected an integer >= 2, got 'x'$"):
        runner.int_at_least(2)("x")
    assert runner.int_at_least(0)("0") == 0


def _args(**values: Any) -> argparse.Namespace:
    return argparse.Namespace(**{"json": False, "state_dir": None, **values})


def test_main_prints_json_or_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    def measure(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
        assert run_dir.is_dir() and run_dir.name.startswith("bench-demo-")
        return {"kept": kept, "n": 1.5}

    assert runner.main("demo", _args(json=True), measure, lambda r: "table") == 0
    assert json.loads(capsys.readouterr().out) == {"kept": False, "n": 1.5}
    assert runner.main("demo", _args(), measure, lambda r: f"table {r['n']}") == 0
    assert capsys.readouterr().out == "table 1.5\n"


def test_main_exit_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    def broken(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
        raise runner.BenchmarkError("3 results where the raw index has 4")

    assert runner.main("demo", _args(), broken, str) == 1
    err = capsys.readouterr().err
    assert err == "activememory bench demo: 3 results where the raw index has 4\n"

    blocked = tmp_path / "file"
    blocked.write_text("")
    assert runner.main("demo", _args(state_dir=blocked / "sub"), broken, str) == 2
    err = capsys.readouterr().err
    assert (
        err == f"activememory bench demo: --state-dir {str(blocked / 'sub')!r}: Not a directory\n"
    )


def test_a_state_dir_is_kept_and_fresh_runs_get_their_own(tmp_path: Path) -> None:
    seen: list[tuple[Path, bool]] = []

    def measure(run_dir: Path, kept: bool) -> None:
        seen.append((run_dir, kept))

    runner.in_state_dir(tmp_path / "s", "bench-x-", measure)
    runner.in_state_dir(tmp_path / "s", "bench-x-", measure, fresh=True)
    assert seen[0] == (tmp_path / "s", True)
    assert seen[1][0].parent == tmp_path / "s" and seen[1][0].name.startswith("bench-x-")


def test_loads_are_reused_only_for_the_same_parameters(tmp_path: Path) -> None:
    loads: list[int] = []

    def load() -> dict[str, float]:
        loads.append(1)
        (tmp_path / "library").mkdir()
        (tmp_path / "raw.db").write_text("")
        return {"store": 1.25}

    def reuse(params: dict[str, int]) -> tuple[dict[str, Any], bool]:
        outputs = ("library", "raw.db*")
        return runner.reuse_or_load(tmp_path, "p.json", params, load, outputs=outputs)

    assert reuse({"seed": 1}) == ({"store": 1.25}, False)
    assert reuse({"seed": 1}) == ({"store": 1.25}, True)
    assert len(loads) == 1
    # Other parameters: what the first run left is removed, then loaded again.
    assert reuse({"seed": 2}) == ({"store": 1.25}, False)
    assert len(loads) == 2
    (tmp_path / "p.json").unlink()
    with pytest.raises(runner.BenchmarkError, match="holds databases without a p.json"):
        reuse({"seed": 2})


def test_code_digests_follow_the_code() -> None:
    assert runner.code_digest("a", "b") == runner.code_digest("ab")
    assert runner.code_digest(runner) != runner.code_digest("ab")
    assert len(runner.code_digest(runner.ratio)) == 16
