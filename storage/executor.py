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
from functools import partial
from typing import Any, Generic, Literal, Protocol, TypeAlias, TypeVar

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


class Job(Generic[T]):
    """One call handed to a `WriterThread`, and its outcome once it has run."""

    __slots__ = ("_done", "_error", "_result", "fn", "state")

    def __init__(self, fn: Callable[[], T], done: Callable[[Job[T]], object]) -> None:
        self.fn = fn
        self._done = done
        self.state = _QUEUED  # changed under the thread's lock, once: started or dropped
        self._result: T | None = None
        self._error: BaseException | None = None

    def outcome(self) -> T:
        """What the call returned; re-raises what it raised."""
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def _run(self) -> None:
        try:
            self._result = self.fn()
        except BaseException as exc:  # handed to whoever reads `outcome()`
            self._error = exc


class WriterThread:
    """One long-lived thread that runs a connection's calls in order, fed by a queue.

    Started by `dedicated` and stopped (and joined) when its block ends. The thread hands
    each finished call back with the backend's own thread-safe callback (trio's token,
    asyncio's `call_soon_threadsafe`): one wake-up of the loop per call, nothing else.
    """

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Job[Any] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._call_soon = _call_soon_threadsafe()
        self._stopped = anyio.Event()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def post(self, fn: Callable[[], T], done: Callable[[Job[T]], object]) -> Job[T]:
        """Queue `fn` behind the calls posted before it; never blocks. Once it has run,
        `done(job)` is called on the event loop's thread (it must not raise: under trio it
        runs where an exception would end the run)."""
        job = Job(fn, done)
        self._jobs.put(job)
        return job

    async def run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the thread, after the calls queued before it, and return its result.

        Cancellation: a call still queued is dropped (it never runs); a call that has
        started runs to completion and the cancellation is delivered when it returns.
        """
        finished = anyio.Event()
        job = self.post(fn, lambda job: finished.set())
        try:
            await finished.wait()
        finally:
            if not finished.is_set() and not self._drop(job):
                with anyio.CancelScope(shield=True):  # started: it finishes, we hear of it
                    await finished.wait()
        return job.outcome()

    def _drop(self, job: Job[Any]) -> bool:
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
            job._run()
            self._wake(partial(job._done, job))
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
