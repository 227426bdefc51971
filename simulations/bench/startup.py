"""Start-up: what a bot process and every CLI call pay before doing anything.

Every figure comes from fresh interpreters (`sys.executable`), REPEAT of each, interleaved
so that all sides share the machine's load, reported as the median:

- `import activememory`: its cumulative time under `python -X importtime`, against the
  floor `import msgspec` (the one dependency the public types cannot do without);
- `activememory --help` and `--version`: the process's wall time, against `python -c pass`
  (the interpreter alone); and the modules `--help` loads, which must hold none of the
  runtime (trio, the store, httpx, numpy, onnxruntime, the benchmarks, the soak);
- `activememory simulate`: the process's wall time against its CPU time (user + system).
  Virtual time should make it finish in about its CPU time; on a loaded machine it also
  waits for a CPU, so the child reports its run-queue wait (Linux: /proc schedstat), shown
  beside with the rest: time spent blocked (disk, sleeps, locks, threads). A process that
  blocks often also waits for a CPU after each wake-up, so the verdict is on wall / CPU.

`--against DIR` also measures a checkout of another commit (e.g. `git worktree add
/tmp/before <commit>`, imported through PYTHONPATH) the same way, and checks the issue's
goal: import at most 0.3 × that checkout's.

    activememory bench startup [--repeat N] [--against DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from . import BENCHMARKS, runner
from .runner import BenchmarkError

# What start-up must not load (modules named, or under them). `--help` parses a command
# line: no runtime, no benchmark, no soak, no simulation.
RUNTIME = ("trio", "httpx", "numpy", "onnxruntime", "tokenizers")
NOT_FOR_HELP = (
    *RUNTIME,
    "activememory._memory",
    "activememory._records",
    "activememory._config",
    "activememory.actors",
    "activememory.recall",
    "activememory.embed",
    "activememory.simulations.soak",
    "activememory.simulations.timeouts",
    "activememory.simulations.bench.runner",
    *(f"activememory.simulations.bench.{name}" for name in BENCHMARKS),
)
# `import activememory` is the protocol types alone (docs/design.md §9).
NOT_FOR_IMPORT = (
    *NOT_FOR_HELP,
    "anyio",
    "apsw",
    "json5",
    "activememory.storage",
    "activememory.simulations",
    "activememory._redaction",
)

IMPORT_TARGET = 3.0  # import activememory <= 3 x import msgspec
AGAINST_TARGET = 0.3  # the goal: <= 0.3 x the import before the change
SIMULATE_TARGET = 1.5  # simulate's wall <= 1.5 x its CPU time

# Run in the child of `simulate`: its CPU time and run-queue wait, from the kernel's
# schedstat of each of its threads, printed as one JSON line on stderr at exit.
SIMULATE_CHILD = """
import atexit, json, os, sys

def report():
    run = wait = 0
    try:
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                on_cpu, queued, _ = f.read().split()
            run, wait = run + int(on_cpu), wait + int(queued)
    except OSError:
        return
    print(json.dumps({"schedstat": [run, wait]}), file=sys.stderr)

atexit.register(report)
from activememory._cli import main
sys.exit(main(["simulate"]))
"""


def unwanted(loaded: Iterable[str], names: Sequence[str]) -> list[str]:
    """The `names` of which `loaded` holds the module itself or one inside it."""
    modules = set(loaded)
    return [n for n in names if n in modules or any(m.startswith(n + ".") for m in modules)]


def environment(pycache: Path, against: Path | None = None) -> dict[str, str]:
    """The children's environment: bytecode cached in `pycache` (an installed package has
    its .pyc files; a `PYTHONDONTWRITEBYTECODE` shell would time the compiler instead), and
    the checkout `against` first on the path when given (else the installed package)."""
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env["PYTHONSAFEPATH"] = "1"  # the working directory's activememory/ must not shadow `against`
    if against is not None:
        env["PYTHONPATH"] = str(against)
    return env


def _run(argv: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise BenchmarkError(f"{' '.join(argv)} exited with {done.returncode}: {done.stderr}")
    return done


def import_times(argv: Sequence[str], env: Mapping[str, str]) -> tuple[dict[str, int], set[str]]:
    """Run `python -X importtime ARGV`: each top-level import's cumulative µs, and every
    module it loaded."""
    stderr = _run(["-X", "importtime", *argv], env).stderr
    top: dict[str, int] = {}
    loaded: set[str] = set()
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "imported package" in line:
            continue
        _, cumulative, name = line.split("|")
        loaded.add(name.strip())
        if name.startswith(" ") and not name.startswith("  "):  # not nested in another
            top[name.strip()] = int(cumulative)
    return top, loaded


def import_us(module: str, env: Mapping[str, str]) -> int:
    """`import module` in a fresh interpreter: its cumulative µs under -X importtime."""
    top, _ = import_times(["-c", f"import {module}"], env)
    if module not in top:
        raise BenchmarkError(f"python -X importtime -c 'import {module}' did not list it")
    return top[module]


def wall_s(argv: Sequence[str], env: Mapping[str, str]) -> float:
    """The wall time of `python ARGV`, start to exit."""
    started = time.perf_counter()
    _run(argv, env)
    return time.perf_counter() - started


class SimulateRun(NamedTuple):
    """One `activememory simulate` process."""

    wall_s: float
    cpu_s: float  # user + system
    runqueue_s: float | None  # waiting for a CPU (None where /proc has no schedstat)


def simulate(env: Mapping[str, str]) -> SimulateRun:
    """`activememory simulate` in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    stderr = _run(["-c", SIMULATE_CHILD], env).stderr
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    queued = None
    for line in stderr.splitlines():
        if line.startswith('{"schedstat"'):
            queued = json.loads(line)["schedstat"][1] / 1e9
    return SimulateRun(wall, cpu, queued)


def simulate_figures(runs: Sequence[SimulateRun]) -> dict[str, float]:
    """Medians of wall, CPU, wall / CPU and, with schedstat, of the run-queue wait, of wall
    without it over CPU, and of the rest (blocked: neither running nor waiting for a CPU)."""
    out = {
        "wall_s": _median([r.wall_s for r in runs]),
        "cpu_s": _median([r.cpu_s for r in runs]),
        "ratio": _median([r.wall_s / r.cpu_s for r in runs]),
    }
    queued = [r.runqueue_s for r in runs if r.runqueue_s is not None]
    if len(queued) == len(runs):
        out["runqueue_s"] = _median(queued)
        out["ratio_without_runqueue"] = _median(
            [(r.wall_s - q) / r.cpu_s for r, q in zip(runs, queued, strict=True)]
        )
        out["blocked_s"] = _median(
            [max(0.0, r.wall_s - r.cpu_s - q) for r, q in zip(runs, queued, strict=True)]
        )
    return {k: round(v, 3) for k, v in out.items()}


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


COMMANDS: dict[str, list[str]] = {
    "help": ["-m", "activememory", "--help"],
    "version": ["-m", "activememory", "--version"],
}


def measure_sides(sides: Mapping[str, Mapping[str, str]], repeat: int) -> dict[str, Any]:
    """Each side's figures (`sides`: name -> environment), and the floors, measured in turn in
    every repetition so that all share the machine's load; medians."""
    floor_env = next(iter(sides.values()))
    for env in sides.values():  # fill the bytecode cache: each first run compiles
        import_us("activememory", env)
        for argv in COMMANDS.values():
            wall_s(argv, env)
        simulate(env)
    import_us("msgspec", floor_env)
    samples: dict[str, dict[str, list[float]]] = {
        name: {"import": [], **{command: [] for command in COMMANDS}} for name in sides
    }
    floors: dict[str, list[float]] = {"msgspec": [], "pass": []}
    for _ in range(repeat):
        floors["msgspec"].append(import_us("msgspec", floor_env) / 1000)
        floors["pass"].append(wall_s(["-c", "pass"], floor_env) * 1000)
        for name, env in sides.items():
            samples[name]["import"].append(import_us("activememory", env) / 1000)
            for command, argv in COMMANDS.items():
                samples[name][command].append(wall_s(argv, env) * 1000)
    simulations: dict[str, list[SimulateRun]] = {name: [] for name in sides}
    for _ in range(max(1, (repeat + 1) // 2)):
        for name, env in sides.items():
            simulations[name].append(simulate(env))
    out: dict[str, Any] = {
        "floor_import_msgspec_ms": round(_median(floors["msgspec"]), 2),
        "floor_python_ms": round(_median(floors["pass"]), 1),
    }
    for name, env in sides.items():
        _, help_loaded = import_times(COMMANDS["help"], env)
        _, import_loaded = import_times(["-c", "import activememory"], env)
        out[name] = {
            "import_ms": round(_median(samples[name]["import"]), 2),
            "help_ms": round(_median(samples[name]["help"]), 1),
            "version_ms": round(_median(samples[name]["version"]), 1),
            "simulate": simulate_figures(simulations[name]),
            "help_loads": unwanted(help_loaded, NOT_FOR_HELP),
            "import_loads": unwanted(import_loaded, NOT_FOR_IMPORT),
        }
    return out


def run(args: argparse.Namespace, run_dir: Path, kept: bool) -> runner.Report:
    """This code's figures, the floors and (`--against`) the other checkout's."""
    pycache = run_dir / "pycache"
    sides = {"current": environment(pycache)}
    if args.against is not None:
        sides["against"] = environment(pycache, args.against)
    report: runner.Report = {"repeat": args.repeat} | measure_sides(sides, args.repeat)
    if args.against is not None:
        report["against"]["dir"] = str(args.against)
    report["verdicts"] = verdicts(report)
    report["environment"] = runner.environment(run_dir, kept=kept) | {
        "load_average": [round(x, 2) for x in os.getloadavg()]  # at the end of the run
    }
    return report


def verdicts(report: runner.Report) -> dict[str, bool]:
    """Each target, met or not."""
    now = report["current"]
    sim = now["simulate"]
    out = {
        "import_vs_msgspec": now["import_ms"] <= IMPORT_TARGET * report["floor_import_msgspec_ms"],
        "import_loads_no_runtime": not now["import_loads"],
        "help_loads_no_runtime": not now["help_loads"],
        "simulate_wall_vs_cpu": sim["ratio"] <= SIMULATE_TARGET,
    }
    if "against" in report:
        out["import_vs_against"] = (
            now["import_ms"] <= AGAINST_TARGET * report["against"]["import_ms"]
        )
    return out


def _side_lines(side: Mapping[str, Any], report: runner.Report) -> list[str]:
    floor_import, floor_python = report["floor_import_msgspec_ms"], report["floor_python_ms"]
    sim = side["simulate"]
    lines = [
        f"    import activememory       {side['import_ms']:9.1f} ms"
        f"   {side['import_ms'] / floor_import:6.2f} x import msgspec",
        f"    activememory --help       {side['help_ms']:9.1f} ms"
        f"   {side['help_ms'] / floor_python:6.2f} x python -c pass",
        f"    activememory --version    {side['version_ms']:9.1f} ms"
        f"   {side['version_ms'] / floor_python:6.2f} x python -c pass",
        f"    activememory simulate     {sim['wall_s']:9.3f} s wall, {sim['cpu_s']:.3f} s CPU:"
        f" {sim['ratio']:.2f} x",
    ]
    if "runqueue_s" in sim:
        lines.append(
            f"      waiting for a CPU {sim['runqueue_s']:.3f} s; without it"
            f" {sim['ratio_without_runqueue']:.2f} x CPU; blocked {sim['blocked_s']:.3f} s"
        )
    for what, key in (("import activememory", "import_loads"), ("--help", "help_loads")):
        if side[key]:
            lines.append(f"      {what} loads {', '.join(side[key])}")
    return lines


def format_table(report: runner.Report) -> str:
    """The report for a person."""
    now, ok = report["current"], report["verdicts"]
    sim = now["simulate"]
    lines = [
        f"Start-up, median of {report['repeat']} fresh processes each",
        f"  floors: import msgspec {report['floor_import_msgspec_ms']:.1f} ms (-X importtime),"
        f" python -c pass {report['floor_python_ms']:.1f} ms (wall)",
        "  this code:",
        *_side_lines(now, report),
    ]
    if "against" in report:
        then = report["against"]
        lines += [f"  against {then['dir']}:", *_side_lines(then, report)]
        lines.append(
            f"  now / then: import {now['import_ms'] / then['import_ms']:.3f},"
            f" --help {now['help_ms'] / then['help_ms']:.3f},"
            f" --version {now['version_ms'] / then['version_ms']:.3f},"
            f" simulate wall {sim['wall_s'] / then['simulate']['wall_s']:.3f}"
        )
    lines += [
        "",
        "  "
        + runner.against(
            f"import activememory / import msgspec {now['import_ms'] / report['floor_import_msgspec_ms']:.2f}",
            "<=",
            IMPORT_TARGET,
            ok["import_vs_msgspec"],
        ),
    ]
    if "import_vs_against" in ok:
        then_ms = report["against"]["import_ms"]
        lines.append(
            "  "
            + runner.against(
                f"import activememory now / then {now['import_ms'] / then_ms:.3f}",
                "<=",
                AGAINST_TARGET,
                ok["import_vs_against"],
            )
        )
    lines += [
        f"  import activememory loads no runtime: {runner.verdict(ok['import_loads_no_runtime'])}",
        f"  --help loads no runtime: {runner.verdict(ok['help_loads_no_runtime'])}",
        "  "
        + runner.against(
            f"simulate wall / CPU {sim['ratio']:.2f}",
            "<=",
            SIMULATE_TARGET,
            ok["simulate_wall_vs_cpu"],
        ),
    ]
    lines += runner.environment_lines(report["environment"])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`)."""
    parser = runner.command("startup", __doc__ or "")
    parser.add_argument("--repeat", type=runner.positive_int, default=7)
    parser.add_argument(
        "--against",
        type=Path,
        help="a checkout of another commit (its activememory/ folder inside), measured beside",
    )
    args = parser.parse_args(argv)
    if args.against is not None and not (args.against / "activememory" / "__init__.py").is_file():
        parser.error(f"--against: {str(args.against)!r} holds no activememory/__init__.py")
    return runner.main("startup", args, run, format_table)
