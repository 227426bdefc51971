"""Scripted recall models and tools that misbehave on purpose (docs/design.md §7).

Each is deterministic: it waits on the event loop's clock only, so under trio's `MockClock`
the same script gives the same virtual times every run.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import anyio
import apsw

from ..protocol.recall import RecallRequest
from ..recall.tools import RecallTools

ANSWER = "The user drinks oolong tea every morning."


async def _search(request: RecallRequest, tools: RecallTools) -> None:
    """Ground the run: one memory_search, as a real model would start."""
    if "memory_search" in tools.names:
        await tools.call("memory_search", {"query": request.search_query})


class Grounded:
    """A well-behaved model: searches, thinks for `think_s`, answers."""

    def __init__(self, think_s: float = 0.0, answer: str = ANSWER) -> None:
        self.think_s = think_s
        self.answer = answer

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        await _search(request, tools)
        await anyio.sleep(self.think_s)
        return self.answer


class HangForever:
    """Searches, then never answers (a hung socket)."""

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        await _search(request, tools)
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


class IgnoresCancellation:
    """Searches, then sleeps `hold_s` shielded from cancellation before answering."""

    def __init__(self, hold_s: float = 3600.0) -> None:
        self.hold_s = hold_s

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        await _search(request, tools)
        with anyio.CancelScope(shield=True):
            await anyio.sleep(self.hold_s)
        return ANSWER


class LateAnswer:
    """Answers `late_s` after the budget; `shielded` keeps working through the cancel."""

    def __init__(self, late_s: float, *, shielded: bool) -> None:
        self.late_s = late_s
        self.shielded = shielded

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        await _search(request, tools)
        wait = request.deadline - anyio.current_time() + self.late_s
        if self.shielded:
            with anyio.CancelScope(shield=True):
                await anyio.sleep(wait)
        else:
            await anyio.sleep(wait)
        return ANSWER


class Raises:
    """Searches, waits `after_s`, then raises."""

    def __init__(self, after_s: float = 0.2) -> None:
        self.after_s = after_s

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        await _search(request, tools)
        await anyio.sleep(self.after_s)
        raise RuntimeError("the model crashed")


class ColdStart:
    """Warms up for `warmup_s` from its first call (model load, index load), then is quick.

    The warm-up goes on even if the first recall gives up on it, as a loading model does.
    """

    def __init__(self, warmup_s: float) -> None:
        self.warmup_s = warmup_s
        self.ready_at: float | None = None

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        if self.ready_at is None:
            self.ready_at = anyio.current_time() + self.warmup_s
        await anyio.sleep_until(self.ready_at)
        await _search(request, tools)
        return ANSWER


class CallsTool:
    """Calls the host tool `name` first (a misbehaving tool), then answers like `Grounded`."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        await tools.call(self.name, {"query": request.search_query})
        await _search(request, tools)
        return ANSWER


class ThreadBlocker:
    """A host tool stuck in a worker thread that cannot be cancelled.

    `release()` lets the thread go (the simulation calls it when it ends).
    """

    def __init__(self) -> None:
        self._gate = threading.Event()

    async def __call__(self, args: Mapping[str, Any]) -> str:
        await anyio.to_thread.run_sync(self._gate.wait)  # not abandon-on-cancel: stuck
        return "late"

    def release(self) -> None:
        self._gate.set()


class BusyDatabase:
    """A host tool whose SQLite database is locked by another writer: retries, then fails.

    Each attempt meets SQLITE_BUSY and backs off on the event loop's clock, as a tool with
    `busy_timeout=0` and its own retry loop does; after `attempts` it gives up.
    """

    def __init__(self, attempts: int = 5, backoff_s: float = 0.1) -> None:
        self.attempts = attempts
        self.backoff_s = backoff_s

    async def __call__(self, args: Mapping[str, Any]) -> str:
        for _ in range(self.attempts):
            await anyio.sleep(self.backoff_s)
        raise apsw.BusyError("database is locked")
