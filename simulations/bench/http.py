"""Recall over HTTP (`activememory serve`) against recall in process.

See docs/design.md §12.1.

One store, `--users` users, each with a few facts in a private chat (`agent:main:dm:uK`);
every recall is a turn of the same user's other chat (`agent:main:direct:uK`), so
cross-conversation recall reads the facts (the offline `local/extractive` model, text-only
memory_search: no embedder, so the figures are the path, not a model). Every question has
its own words (a counter), so no recall is served by the cache.

1. In process: `open_memory` on the store, `mem.recall(turn)` at concurrency 1 and 64
   (N recalls, each level's tasks in one task group; latency measured per call).
2. Over HTTP: the store closed, `activememory serve` started on it as a process
   (loopback, no rate limit), and the same recalls as `POST /v1/recall` from an httpx
   client at the same concurrencies (one connection per task, kept alive).

Reported: p50/p90/p99 per side and level, recalls per second, and the ratios
HTTP p50 / in-process p50. The statuses of both sides are printed too (and must match:
a path that failed cannot look fast).

    activememory bench http [--users N] [--recalls N] [--state-dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from . import runner
from .runner import BenchmarkError

CONFIG = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
LEVELS = (1, 64)
FACTS = (
    "I keep {pet} named {name} at home.",
    "My favourite city is {city}.",
    "I always order {drink} in the morning.",
)
PETS = ("a cat", "a dog", "a parrot", "a tortoise")
NAMES = ("Miso", "Pico", "Luna", "Bruno", "Kiwi", "Nala")
CITIES = ("Lisbon", "Porto", "Kyoto", "Oslo", "Quito", "Dakar")
DRINKS = ("oolong tea", "an espresso", "mint tea", "a flat white")
QUESTIONS = (
    "what is the name of my pet at home, again? ({n})",
    "which city do I like best? ({n})",
    "what do I order in the morning? ({n})",
)


def main(argv: Sequence[str]) -> int:
    parser = runner.command("http", __doc__.split("\n")[0], state_dir="keep the store here")
    runner.add_sizes(parser, users=64, recalls=256)
    args = parser.parse_args(argv)
    return runner.main("http", args, measure, table)


def measure(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
    import trio

    state = run_dir / "state"
    trio.run(_load, state, args.users)
    inprocess = trio.run(_in_process, state, args.users, args.recalls)
    http = _over_http(run_dir, state, args.users, args.recalls)
    report: dict[str, Any] = {"users": args.users, "recalls": args.recalls, "levels": {}}
    for level in LEVELS:
        local, remote = inprocess[level], http[level]
        report["levels"][str(level)] = {
            "in_process": local,
            "http": remote,
            "p50_ratio": runner.ratio(remote["latency"]["p50"], local["latency"]["p50"]),
            "throughput_ratio": runner.ratio(remote["per_second"], local["per_second"]),
        }
        if local["statuses"] != remote["statuses"]:
            raise BenchmarkError(
                f"c={level}: statuses differ: in process {local['statuses']}, "
                f"over HTTP {remote['statuses']}"
            )
    report["environment"] = {**runner.environment(run_dir, kept=kept),
                             "load_average": list(os.getloadavg())}  # fmt: skip
    return report


def _facts(k: int) -> list[str]:
    pick = {
        "pet": PETS[k % len(PETS)],
        "name": NAMES[k % len(NAMES)],
        "city": CITIES[k % len(CITIES)],
        "drink": DRINKS[k % len(DRINKS)],
    }
    return [fact.format(**pick) for fact in FACTS]


def _turn(k: int, n: int) -> dict[str, Any]:
    question = QUESTIONS[n % len(QUESTIONS)].format(n=n)
    return {
        "session_key": f"agent:main:direct:u{k}",
        "messages": [{"role": "user", "content": question}],
    }


async def _load(state: Path, users: int) -> None:
    import activememory as am

    async with am.open_memory(state, config=CONFIG) as mem:
        if await mem.sessions.list(agent=None):
            return  # a kept store: loaded by an earlier run
        for k in range(users):
            for text in _facts(k):
                await mem.sessions.append(
                    f"agent:main:dm:u{k}", am.Message(role="user", content=text)
                )


async def _level(
    users: int, recalls: int, concurrency: int, call: Callable[[int, int], Awaitable[str]]
) -> dict[str, Any]:
    """`recalls` calls of `call(user, n)` from `concurrency` tasks: latency and statuses."""
    import trio

    latencies: list[float] = []
    statuses: Counter[str] = Counter()
    numbers = iter(range(recalls))

    async def worker() -> None:
        for n in numbers:
            start = time.perf_counter()
            status = await call(n % users, n)
            latencies.append(time.perf_counter() - start)
            statuses[status] += 1

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    wall = time.perf_counter() - start
    return {
        "latency": runner.percentiles(latencies),
        "per_second": round(recalls / wall, 1),
        "statuses": dict(sorted(statuses.items())),
    }


async def _in_process(state: Path, users: int, recalls: int) -> dict[int, dict[str, Any]]:
    import msgspec

    import activememory as am
    from activememory.protocol.service import TurnBody

    async with am.open_memory(state, config=CONFIG) as mem:

        async def call(k: int, n: int) -> str:
            body = msgspec.convert(_turn(k, n), TurnBody)
            turn = am.Turn(session_key=body.session_key, messages=body.messages)
            return (await mem.recall(turn)).status

        await _level(users, 16, 1, lambda k, n: call(k, 10**6 + n))  # warm up
        return {c: await _level(users, recalls, c, call) for c in LEVELS}


def _over_http(run_dir: Path, state: Path, users: int, recalls: int) -> dict[int, dict[str, Any]]:
    import trio

    config = run_dir / "bench-http-config.json"
    config.write_text(json.dumps(CONFIG))
    command = [sys.executable, "-m", "activememory", "serve", "--state-dir", str(state),
               "--config", str(config), "--port", "0", "--rate-limit", "0"]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        if "serving http://" not in line:
            raise BenchmarkError(f"activememory serve did not start: {line.strip()}")
        return trio.run(_http_levels, line.split()[-1], users, recalls)
    finally:
        process.terminate()
        process.communicate(timeout=60)


async def _http_levels(url: str, users: int, recalls: int) -> dict[int, dict[str, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=max(LEVELS), max_keepalive_connections=max(LEVELS))
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as client:

        async def call(k: int, n: int) -> str:
            response = await client.post("/v1/recall", json=_turn(k, n))
            if response.status_code != 200:
                raise BenchmarkError(f"POST /v1/recall: {response.status_code} {response.text}")
            return str(response.json()["status"])

        await _level(users, 16, 1, lambda k, n: call(k, 10**6 + n))  # warm up
        return {c: await _level(users, recalls, c, call) for c in LEVELS}


def table(report: dict[str, Any]) -> str:
    """The report for a person."""
    lines = [
        f"Recall over HTTP (activememory serve) vs in process: {report['recalls']} recalls per "
        f"side and level, {report['users']} users",
        runner.percentile_header("concurrency / side", 22),
    ]
    for level, found in report["levels"].items():
        for side in ("in_process", "http"):
            row = found[side]
            label = f"c={level} {side.replace('_', ' ')}"
            lines.append(
                runner.percentile_row(label, row["latency"], 22) + f"   {row['per_second']:>7.1f}/s"
            )
        lines.append(
            f"    c={level}: HTTP p50 / in-process p50 = {found['p50_ratio']:.2f}; "
            f"throughput HTTP / in process = {found['throughput_ratio']:.2f}; "
            f"statuses {found['in_process']['statuses']}"
        )
    lines.extend(runner.environment_lines(report["environment"]))
    return "\n".join(lines)
