"""Deterministic timeout simulations of the recall budget (docs/design.md §4.9, §7).

Every scenario runs a scripted adversary (`simulations/adversaries.py`) through the real
`mem.recall` path — preflight, cache, breaker, the recall pool, the finalize window — under
trio's `MockClock(autojump_threshold=0)` with the inline storage executor, so time is
virtual and exact. A scenario is a list of turns at set virtual times; each turn's expected
return time, status, cache and breaker state are written down, and the run checks them.
Same scenario, same trace, byte for byte.

`activememory simulate` runs them all and prints a table.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
import trio.testing

import activememory as am

from ..protocol.recall import RecallRequest
from ..recall.tools import RecallTools
from .adversaries import (
    ANSWER,
    BusyDatabase,
    CallsTool,
    ColdStart,
    Grounded,
    HangForever,
    IgnoresCancellation,
    LateAnswer,
    Raises,
    ThreadBlocker,
)

MODEL = "sim/adversary"
ASKER = "agent:main:direct:alice"
SOURCE = "agent:main:dm:alice"  # alice's other chat: recall reads only her identity's
FACT = "I drink oolong tea every morning."
QUESTION = "what tea do I drink in the morning?"
FINALIZE_S = 1.5
PREFLIGHT_S = 1.5
# Where a scenario's throwaway store goes when the machine has a RAM-backed folder: virtual
# time does not wait for the disk, but the process does, and creating and removing a store
# per scenario (directories, the WAL's fsyncs, unlinks) on a busy disk was most of the
# wall time of `activememory simulate` (docs/design.md §7).
RAM_FOLDERS = (Path("/dev/shm"),)


class Switchable:
    """A model whose behaviour the script can change between turns."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        return await self.inner.recall(request, tools)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Turn:
    """One recall at virtual time `at`, and what must come of it."""

    at: float
    status: str
    returns_at: float  # virtual time at which mem.recall returns
    cached: bool = False
    breaker: str = "closed"  # the breaker's state after the turn
    switch_to: Any = None  # replace the model's behaviour before this turn


@dataclass
class Scenario:
    name: str
    what: str
    model: Callable[[], Any]
    turns: list[Turn]
    config: dict[str, Any] = field(default_factory=dict)
    tools: Callable[[], dict[str, Any]] = dict


@dataclass(frozen=True)
class TurnResult:
    at: float
    returned_at: float
    status: str
    elapsed_ms: float
    cached: bool
    breaker: str
    consecutive: int
    status_line: str


@dataclass
class ScenarioResult:
    scenario: Scenario
    results: list[TurnResult]
    trace: list[str]
    bound_s: float

    @property
    def problems(self) -> list[str]:
        """Every difference between what the scenario expects and what happened."""
        out = []
        for i, (want, got) in enumerate(zip(self.scenario.turns, self.results, strict=True)):
            for name, expected, actual in (
                ("status", want.status, got.status),
                ("returns_at", want.at + want.returns_at, got.returned_at),
                ("cached", want.cached, got.cached),
                ("breaker", want.breaker, got.breaker),
            ):
                if expected != actual:
                    out.append(f"turn {i}: {name} {actual!r}, expected {expected!r}")
            if got.returned_at - got.at > self.bound_s:
                out.append(f"turn {i}: returned after {got.returned_at - got.at}s > bound")
        return out


def _config(overrides: dict[str, Any]) -> dict[str, Any]:
    settings = {"timeoutMs": 2000, "model": MODEL, **overrides}
    return {"plugins": {"entries": {"active-memory": {"config": settings}}}}


def scenarios() -> list[Scenario]:
    """The adversaries of docs/design.md §7, each with its exact expected virtual times."""
    breaker_model = HangForever()
    return [
        Scenario(
            "hang forever",
            "the model never answers (hung socket)",
            HangForever,
            [Turn(0, "timeout", 2.0, breaker="closed")],
        ),
        Scenario(
            "ignore cancellation",
            "the model shields itself from cancellation for an hour",
            IgnoresCancellation,
            [Turn(0, "timeout", 2.0 + FINALIZE_S)],
        ),
        Scenario(
            "answer just after the budget",
            "answers 100 ms late and obeys cancellation: nothing to use",
            lambda: LateAnswer(0.1, shielded=False),
            [Turn(0, "timeout", 2.0)],
        ),
        Scenario(
            "late answer in the finalize window",
            "answers 100 ms late, shielded: a grounded partial answer, not cached",
            lambda: LateAnswer(0.1, shielded=True),
            [Turn(0, "timeout_partial", 2.1), Turn(10, "timeout_partial", 2.1)],
        ),
        Scenario(
            "late answer after the finalize window",
            "answers 2 s late, shielded: abandoned at the finalize deadline",
            lambda: LateAnswer(2.0, shielded=True),
            [Turn(0, "timeout", 2.0 + FINALIZE_S)],
        ),
        Scenario(
            "raise",
            "the model raises after 200 ms: failed, the breaker does not count it",
            lambda: Raises(0.2),
            [Turn(0, "failed", 0.2)],
        ),
        Scenario(
            "block a thread",
            "a memory tool is stuck in a worker thread that cannot be cancelled",
            lambda: CallsTool("stuck_tool"),
            [Turn(0, "timeout", 2.0 + FINALIZE_S)],
            tools=lambda: {"stuck_tool": ThreadBlocker()},  # a fresh gate per run
            config={"toolsAllow": ["memory_search", "stuck_tool"]},
        ),
        Scenario(
            "slow cold start",
            "3 s of warm-up before the first answer, no setup grace",
            lambda: ColdStart(3.0),
            [Turn(0, "timeout", 2.0), Turn(10, "ok", 0.0)],
        ),
        Scenario(
            "slow cold start with grace",
            "the same warm-up with setupGraceTimeoutMs 2000",
            lambda: ColdStart(3.0),
            [Turn(0, "ok", 3.0)],
            config={"setupGraceTimeoutMs": 2000},
        ),
        Scenario(
            "sqlite busy",
            "a memory tool meets SQLITE_BUSY and retries every 100 ms past the budget",
            lambda: CallsTool("busy_tool"),
            [Turn(0, "timeout", 2.0)],
            tools=lambda: {"busy_tool": BusyDatabase(attempts=30, backoff_s=0.1)},
            config={"toolsAllow": ["memory_search", "busy_tool"]},
        ),
        Scenario(
            "circuit breaker",
            "3 timeouts 100 s apart (beyond the 60 s cooldown) trip it; a probe closes it",
            lambda: breaker_model,
            [
                Turn(0, "timeout", 2.0, breaker="closed"),
                Turn(100, "timeout", 2.0, breaker="closed"),
                Turn(200, "timeout", 2.0, breaker="open"),
                Turn(230, "timeout", 0.0, breaker="open"),
                Turn(300, "ok", 0.0, breaker="closed", switch_to=Grounded()),
            ],
        ),
        Scenario(
            "cache",
            "the same turn within cacheTtlMs reuses the grounded answer",
            lambda: Grounded(think_s=0.3),
            [Turn(0, "ok", 0.3), Turn(5, "ok", 0.0, cached=True), Turn(30, "ok", 0.3)],
        ),
    ]


async def _run(scenario: Scenario, state_dir: Path) -> ScenarioResult:
    model = Switchable(scenario.model())
    tools = scenario.tools()
    config = am.load_config(_config(scenario.config))
    settings = config.active_memory
    bound_s = (settings.timeout_ms + settings.setup_grace_timeout_ms) / 1000 + 3.0
    results: list[TurnResult] = []
    trace: list[str] = [f"# {scenario.name}: {scenario.what}"]
    async with am.open_memory(
        state_dir, config=config, models={MODEL: model}, tools=tools, executor="inline"
    ) as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        base = trio.current_time()
        for i, turn in enumerate(scenario.turns):
            await trio.sleep_until(base + turn.at)
            if turn.switch_to is not None:
                model.inner = turn.switch_to
            started = trio.current_time()
            outcome = await mem.recall(
                am.Turn(session_key=ASKER, messages=[am.Message(role="user", content=QUESTION)])
            )
            returned = trio.current_time()
            infos = [b for b in mem.breaker_states() if b.model == MODEL]
            state = infos[0].state if infos else "closed"
            consecutive = infos[0].consecutive_timeouts if infos else 0
            result = TurnResult(
                at=round(started - base, 6),
                returned_at=round(returned - base, 6),
                status=outcome.status,
                elapsed_ms=round(outcome.elapsed_ms, 3),
                cached=outcome.cached,
                breaker=state,
                consecutive=consecutive,
                status_line=outcome.status_line,
            )
            results.append(result)
            trace.append(
                f"t={result.at:9.3f} turn={i} returned={result.returned_at:9.3f} "
                f"status={result.status} elapsed={result.elapsed_ms:.3f}ms "
                f"cached={result.cached} breaker={state}/{consecutive} "
                f"summary={outcome.summary!r}"
            )
        if hasattr(tools.get("stuck_tool"), "release"):
            tools["stuck_tool"].release()  # let the abandoned thread end before closing
    return ScenarioResult(scenario, results, trace, bound_s)


def scratch_root() -> str | None:
    """A writable RAM-backed folder for the scenarios' stores, or None: the temp default."""
    for folder in RAM_FOLDERS:
        if folder.is_dir() and os.access(folder, os.W_OK | os.X_OK):
            return str(folder)
    return None


def run_scenario(scenario: Scenario) -> ScenarioResult:
    """Run one scenario under a fresh MockClock in a fresh state directory (removed after)."""
    with tempfile.TemporaryDirectory(prefix="am-sim-", dir=scratch_root()) as tmp:
        clock = trio.testing.MockClock(autojump_threshold=0)
        return trio.run(_run, scenario, Path(tmp) / "state", clock=clock)


def run_all() -> list[ScenarioResult]:
    return [run_scenario(s) for s in scenarios()]


def table(results: list[ScenarioResult]) -> str:
    """A readable table: one line per turn, and whether it matched."""
    lines = [
        f"{'scenario':<38} {'turn at':>8} {'returned':>9} {'status':<16} {'cached':<6} "
        f"{'breaker':<10} ok"
    ]
    for res in results:
        bad = res.problems
        for i, r in enumerate(res.results):
            lines.append(
                f"{res.scenario.name if i == 0 else '':<38} {r.at:8.3f} "
                f"{r.returned_at - r.at:8.3f}s {r.status:<16} {r.cached!s:<6} "
                f"{r.breaker:<10} {'yes' if not bad else 'NO'}"
            )
        for problem in bad:
            lines.append(f"    ! {problem}")
    return "\n".join(lines)


__all__ = [
    "ANSWER",
    "Scenario",
    "ScenarioResult",
    "Turn",
    "run_all",
    "run_scenario",
    "scenarios",
    "table",
]
