"""What every benchmark shares (docs/design.md §7): the command line, the state directory and
its reuse, percentiles, PASS/MISS lines against a target, the environment, the output.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import apsw

from ...protocol.errors import ActiveMemoryError

T = TypeVar("T")
Report = dict[str, Any]
REUSE_HELP = (
    "keep the databases here and reuse them when the parameters match; "
    "default: a temporary directory, removed afterwards"
)


class BenchmarkError(Exception):
    """A run stored, indexed or answered something other than its floor implies."""


class StateDirError(Exception):
    """`--state-dir` cannot be created."""


# -- the command line -------------------------------------------------------------------


def prog(name: str) -> str:
    """How benchmark `name` is run, and how its usage and errors begin."""
    return f"activememory bench {name}"


def int_at_least(low: int, expected: str | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= `low`, refused with "expected `expected`"."""
    wanted = expected or f"an integer >= {low}"

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = low - 1
        if number < low:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {value!r}")
        return number

    return parse


positive_int = int_at_least(1, "a positive integer")


def command(
    name: str, description: str, *, seed: int | None = None, state_dir: str | None = None
) -> argparse.ArgumentParser:
    """The parser of `activememory bench NAME` with the options every benchmark spells alike:
    `--json`, and `--seed` / `--state-dir` when given a default / a help text."""
    parser = argparse.ArgumentParser(prog=prog(name), description=description)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    if seed is not None:
        parser.add_argument("--seed", type=int, default=seed)
    if state_dir is not None:
        parser.add_argument("--state-dir", type=Path, help=state_dir)
    return parser


def add_sizes(parser: argparse.ArgumentParser, **defaults: int) -> None:
    """A positive `--NAME` option per keyword (`messages_per_appender` is `--messages-per-appender`)."""
    for name, default in defaults.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=positive_int, default=default)


# -- the run ----------------------------------------------------------------------------


def main(
    name: str,
    args: argparse.Namespace,
    measure: Callable[[argparse.Namespace, Path, bool], Report],
    table: Callable[[Report], str],
    *,
    fresh: bool = False,
) -> int:
    """Run `measure(args, run_dir, kept)` in the state directory and print the table (or `--json`).

    Returns 0 (whatever the verdicts), 1 if the run raised `BenchmarkError` or the library
    raised, 2 if `--state-dir` is unusable.
    """
    state_dir = getattr(args, "state_dir", None)  # absent: the benchmark keeps nothing
    try:
        result = in_state_dir(state_dir, f"bench-{name}-", partial(measure, args), fresh=fresh)
    except StateDirError as exc:
        return fail(prog(name), exc, 2)
    except (BenchmarkError, ActiveMemoryError) as exc:
        return fail(prog(name), exc, 1)
    emit(result, table, as_json=args.json)
    return 0


def in_state_dir(
    state_dir: Path | None, prefix: str, measure: Callable[[Path, bool], T], *, fresh: bool = False
) -> T:
    """`measure(run_dir, kept)` in `state_dir` (with `fresh`, in a new `prefix*` directory inside
    it), kept; or in a temporary directory, removed afterwards.

    Raises `StateDirError` if `state_dir` cannot be created.
    """
    if state_dir is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            return measure(Path(tmp), False)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir=state_dir)) if fresh else state_dir
    except OSError as exc:
        raise StateDirError(f"--state-dir {str(state_dir)!r}: {exc.strerror}") from exc
    return measure(run_dir, True)


def reuse_or_load(
    run_dir: Path,
    params_file: str,
    params: Mapping[str, Any],
    load: Callable[[], Mapping[str, Any]],
    *,
    outputs: Sequence[str],
) -> tuple[dict[str, Any], bool]:
    """The load times an earlier complete run with the same `params` recorded, and True; or
    `load()`'s, and False, after removing the `outputs` (glob patterns) another run left.

    Raises `BenchmarkError` if `run_dir` holds `outputs` but no `params_file`: not ours.
    """
    record = run_dir / params_file
    left = [path for pattern in outputs for path in run_dir.glob(pattern)]
    if record.exists():
        try:
            found = json.loads(record.read_text())
        except (OSError, ValueError):
            found = {}
        if found.get("params") == params and found.get("complete"):
            return dict(found["load"]), True
        for path in left:  # ours, but for other parameters or unfinished: start over
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink()
    elif left:
        raise BenchmarkError(
            f"{str(run_dir)!r} holds databases without a {params_file}; use an empty directory"
        )
    record.write_text(json.dumps({"params": params, "complete": False}))
    times = dict(load())
    record.write_text(json.dumps({"params": params, "complete": True, "load": times}))
    return times, False


def code_digest(*parts: ModuleType | Callable[..., Any] | str) -> str:
    """A digest of the code (modules, classes, or text) that decides what a stored corpus holds:
    other code, other databases."""
    source = "".join(p if isinstance(p, str) else inspect.getsource(p) for p in parts)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def fail(prog: str, error: object, code: int) -> int:
    """Say `prog: error` on stderr; return the exit code `code`."""
    print(f"{prog}: {error}", file=sys.stderr)
    return code


def emit(result: Report, table: Callable[[Report], str], *, as_json: bool) -> None:
    """Print `result` as one JSON object, or as `table` draws it for a person."""
    print(json.dumps(result) if as_json else table(result))


class Progress:
    """A live line on stderr: rewritten in place on a terminal, else a new line every 10 s."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def due(self, now: float, *, force: bool = False) -> bool:
        """Whether a line is due at `now` (seconds since the start); if so, it is taken."""
        if not self.enabled or (not force and now - self.last < (1.0 if self.tty else 10.0)):
            return False
        self.last = now
        return True

    def write(self, line: str) -> None:
        """Show `line`."""
        sys.stderr.write("\r" + line + "\x1b[K" if self.tty else line + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        """End the live line."""
        if self.enabled and self.tty:
            sys.stderr.write("\n")
            sys.stderr.flush()


# -- the figures ------------------------------------------------------------------------


def percentile(values: Sequence[float], p: int) -> float:
    """Nearest-rank percentile (no interpolation: every figure was measured); 0.0 of nothing."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return float(ordered[max(1, -(-len(ordered) * p // 100)) - 1])


def percentiles(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max/mean in milliseconds; {} of nothing."""
    if not seconds:
        return {}
    ordered = sorted(seconds)
    return {
        "p50": round(percentile(ordered, 50) * 1000, 4),
        "p90": round(percentile(ordered, 90) * 1000, 4),
        "p99": round(percentile(ordered, 99) * 1000, 4),
        "max": round(ordered[-1] * 1000, 4),
        "mean": round(sum(ordered) / len(ordered) * 1000, 4),
    }


def ratio(value: float, floor: float, digits: int = 3) -> float:
    """`value / floor`, rounded: how far a side is from its floor."""
    return round(value / floor, digits)


def verdict(ok: bool) -> str:
    """PASS or MISS."""
    return "PASS" if ok else "MISS"


def against(shown: str, op: str, target: float | str, ok: bool) -> str:
    """`shown (target op target): PASS|MISS`, the shape of every verdict line."""
    limit = target if isinstance(target, str) else f"{target:g}"
    return f"{shown} (target {op} {limit}): {verdict(ok)}"


def percentile_header(label: str, width: int, indent: int = 2) -> str:
    """The column heads over `percentile_row`s."""
    pad = " " * indent
    return f"{pad}{label:<{width}} {'p50':>8} {'p90':>8} {'p99':>8} {'max':>9}   (ms)"


def percentile_row(label: str, p: Mapping[str, float], width: int, indent: int = 4) -> str:
    """One side's p50/p90/p99/max in ms, or "(none)"."""
    pad = " " * indent
    if not p:
        return f"{pad}{label:<{width}} (none)"
    return (
        f"{pad}{label:<{width}} {p['p50']:>8.3f} {p['p90']:>8.3f} {p['p99']:>8.3f} {p['max']:>9.3f}"
    )


def environment(run_dir: Path, *, kept: bool) -> dict[str, Any]:
    """What the figures depend on besides the code: interpreter, SQLite, CPUs, disk."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "sqlite": apsw.sqlite_lib_version(),
        "apsw": apsw.apsw_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "state_dir": str(run_dir),
        "state_dir_kept": kept,
    }


def environment_lines(env: Mapping[str, Any]) -> list[str]:
    """The table's closing lines about `environment()` (and a load average, when recorded)."""
    load = env.get("load_average")
    return [
        "",
        f"  environment: Python {env['python']} ({env['implementation']}), "
        f"SQLite {env['sqlite']}, apsw {env['apsw']}, {env['cpus']} CPUs"
        + ("" if load is None else f", load average {' '.join(map(str, load))} at the end"),
        f"               {env['platform']}",
        f"               state dir {env['state_dir']}"
        + ("" if env["state_dir_kept"] else " (temporary, removed)"),
    ]
