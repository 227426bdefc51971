"""Where blocking SQLite calls run (docs/design.md §1.3).

`thread` (production): each connection's calls run on a worker thread, one at a time, so the
event loop never blocks on disk. `inline` (virtual-time simulations): calls run on the
event-loop thread, so trio's MockClock sees no hidden waiting and stays deterministic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol, TypeAlias, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

T = TypeVar("T")
ExecutorKind: TypeAlias = Literal["thread", "inline"]
EXECUTOR_KINDS: tuple[ExecutorKind, ...] = ("thread", "inline")


class Executor(Protocol):
    """Runs blocking calls for one connection, one call at a time."""

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` and return its result.

        Cancellation: a call that has started always runs to completion (a SQLite transaction
        is never torn in half); the cancellation is delivered when it returns.
        """
        ...


class ThreadExecutor:
    """Runs each call on a worker thread; a limiter of one keeps the connection single-use."""

    def __init__(self) -> None:
        self._limiter = anyio.CapacityLimiter(1)

    async def run(self, fn: Callable[[], T]) -> T:
        return await anyio.to_thread.run_sync(fn, limiter=self._limiter)


class InlineExecutor:
    """Runs each call on the event-loop thread, after a checkpoint."""

    async def run(self, fn: Callable[[], T]) -> T:
        await anyio.lowlevel.checkpoint()
        return fn()


def make_executor(kind: ExecutorKind) -> Executor:
    """Return a fresh executor of `kind` (one per connection)."""
    return ThreadExecutor() if kind == "thread" else InlineExecutor()
