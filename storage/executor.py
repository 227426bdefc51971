"""Where blocking SQLite calls run (docs/design.md §1.3).

`thread` (production): each connection's calls run on a worker thread, one at a time, so the
event loop never blocks on disk. `inline` (virtual-time simulations): calls run on the
event-loop thread, so trio's MockClock sees no hidden waiting and stays deterministic.

A single writer's loop (actors/group_commit.py) runs its batches on a `WriterThread`: one
long-lived thread fed by a queue, instead of a thread-pool hop per batch (`dedicated`).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import Generic, Literal, Protocol, TypeAlias, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread
import sniffio

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


# -- the writer thread ----------------------------------------------------------------------


def _call_soon_threadsafe() -> Callable[[Callable[[], object]], object]:
    """How another thread schedules a callback on the running event loop, without waiting."""
    if sniffio.current_async_library() == "trio":
        import trio.lowlevel

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    return asyncio.get_running_loop().call_soon_threadsafe


_QUEUED, _STARTED, _DROPPED = range(3)


class _Job(Generic[T]):
    """One call handed to a `WriterThread`, and where its outcome lands."""

    __slots__ = ("done", "error", "fn", "result", "state")

    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.state = _QUEUED  # changed under the thread's lock: started or dropped, once
        self.done = anyio.Event()  # set on the loop's thread, by the writer thread's callback
        self.result: T | None = None
        self.error: BaseException | None = None


class WriterThread:
    """One long-lived thread that runs a connection's calls in order, fed by a queue.

    Started by `dedicated` and stopped (and joined) when its block ends. The thread wakes
    the loop with the backend's own thread-safe callback (trio's token, asyncio's
    `call_soon_threadsafe`): one wake-up per call, no thread-pool bookkeeping.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job[object] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._call_soon = _call_soon_threadsafe()
        self._stopped = anyio.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the thread, after the calls queued before it, and return its result.

        Cancellation: a call still queued is dropped (it never runs); a call that has
        started runs to completion and the cancellation is delivered when it returns.
        """
        job = _Job(fn)
        self._jobs.put(job)  # type: ignore[arg-type]
        try:
            await job.done.wait()
        finally:
            if not job.done.is_set() and not self._drop(job):
                with anyio.CancelScope(shield=True):  # started: it commits, we hear of it
                    await job.done.wait()
        if job.error is not None:
            raise job.error
        return job.result  # type: ignore[return-value]

    def _drop(self, job: _Job[T]) -> bool:
        with self._lock:
            if job.state == _QUEUED:
                job.state = _DROPPED
                return True
            return False

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                if job.state == _DROPPED:
                    continue
                job.state = _STARTED
            try:
                job.result = job.fn()
            except BaseException as exc:  # handed to the caller, who re-raises it
                job.error = exc
            self._wake(job.done.set)
        self._wake(self._stopped.set)

    def _wake(self, callback: Callable[[], object]) -> None:
        # The loop outlives the thread (`dedicated` joins it first); if it is gone anyway,
        # nobody is left to tell.
        with contextlib.suppress(Exception):
            self._call_soon(callback)

    async def aclose(self) -> None:
        """Stop the thread once the calls queued before are done, and join it.

        Cancellation: shielded; the thread is always stopped and joined.
        """
        self._jobs.put(None)
        with anyio.CancelScope(shield=True):
            await self._stopped.wait()
        self._thread.join()  # it has nothing left but to return


@contextlib.asynccontextmanager
async def dedicated(executor: Executor, name: str) -> AsyncIterator[Executor]:
    """`executor`, for the duration of the block, on a `WriterThread` of its own when it
    runs calls on threads; otherwise (inline: virtual time must see no thread) itself."""
    if not isinstance(executor, ThreadExecutor):
        yield executor
        return
    thread = WriterThread(name)
    try:
        yield thread
    finally:
        await thread.aclose()
