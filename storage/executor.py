"""Where blocking SQLite calls run (docs/design.md §1.3).

`thread` (production): each connection's calls run in order on a thread of its own, fed by a
queue (`ThreadExecutor`), so the event loop never blocks on disk. `inline` (virtual-time
simulations): calls run on the event-loop thread, so trio's MockClock sees no hidden waiting
and stays deterministic. A single writer's loop (actors/group_commit.py) posts its batches to
its connection's thread (`dedicated`).
"""

from __future__ import annotations

import contextlib
import contextvars
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterable
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


class InlineExecutor:
    """Runs each call on the event-loop thread, after a checkpoint."""

    async def run(self, fn: Callable[[], T]) -> T:
        await anyio.lowlevel.checkpoint()
        return fn()


def make_executor(kind: ExecutorKind, role: str = "connection") -> Executor:
    """Return a fresh executor of `kind` (one per connection); a thread executor's thread is
    named `activememory-<role>`."""
    return ThreadExecutor(f"activememory-{role}") if kind == "thread" else InlineExecutor()


async def run_once(kind: ExecutorKind, fn: Callable[[], T]) -> T:
    """`fn()` off the loop once, for a call that belongs to no connection of ours (opening
    a server's pool, say): on a pooled worker thread (`thread`) or inline.

    Cancellation: as `Executor.run`.
    """
    if kind == "inline":
        return await InlineExecutor().run(fn)
    return await anyio.to_thread.run_sync(fn, abandon_on_cancel=False)


# -- the connection thread ------------------------------------------------------------------


def _call_soon_threadsafe() -> Callable[[Callable[[], object]], object]:
    """How another thread schedules a callback on the running event loop, without waiting."""
    if sniffio.current_async_library() == "trio":
        import trio.lowlevel

        return trio.lowlevel.current_trio_token().run_sync_soon
    import asyncio

    return asyncio.get_running_loop().call_soon_threadsafe


_QUEUED, _STARTED, _DROPPED = range(3)
# How long a connection's thread waits for its next call before it ends (the next call
# starts a new one): trio's own thread cache keeps an idle thread as long.
IDLE_S = 10.0


class Job(Generic[T]):
    """One call handed to a `ThreadExecutor`, and its outcome once it has run."""

    __slots__ = ("_call_soon", "_context", "_done", "_error", "_result", "fn", "state")

    def __init__(self, fn: Callable[[], T], done: Callable[[Job[T]], object]) -> None:
        self.fn = fn
        self._done = done
        # Where `done` runs: the loop that posted the call, in the poster's context (as
        # `anyio.to_thread` runs a call: the same context variables).
        self._call_soon = _call_soon_threadsafe()
        self._context = contextvars.copy_context()
        self.state = _QUEUED  # changed under the executor's lock, once: started or dropped
        self._result: T | None = None
        self._error: BaseException | None = None

    def outcome(self) -> T:
        """What the call returned; re-raises what it raised."""
        if self._error is not None:
            raise self._error
        return self._result  # type: ignore[return-value]

    def _run(self) -> None:
        try:
            self._result = self._context.run(self.fn)
        except BaseException as exc:  # handed to whoever reads `outcome()`
            self._error = exc
        self._deliver()

    def _deliver(self) -> None:
        # The loop outlives the call's waiter; if it is gone anyway, nobody is left to tell.
        with contextlib.suppress(Exception):
            self._call_soon(partial(self._done, self))


def _stop() -> bool:
    """The call `ThreadExecutor.aclose` queues; the thread answers it itself: whether it ended."""
    raise AssertionError("answered by the thread, never run")


class ThreadExecutor:
    """Runs one connection's calls in order on a thread of its own, fed by a queue
    (docs/design.md §1.3).

    The thread starts at the first call and ends after `IDLE_S` without one, or at
    `aclose`. Each finished call is handed back with the backend's own thread-safe callback
    (trio's token, asyncio's `call_soon_threadsafe`): one wake-up of the loop per call. The
    thread takes the next queued call as soon as one returns, without waiting for the loop:
    with a thread-pool hop per call (and a limiter of one per connection) the connection
    sat idle until the busy loop had run the caller again, which is what kept concurrent
    recalls from scaling.
    """

    def __init__(self, name: str = "activememory-connection", *, idle_s: float = IDLE_S) -> None:
        self._jobs: queue.SimpleQueue[Job[Any]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._name = name
        self._idle_s = idle_s

    @property
    def running(self) -> bool:
        """Whether the thread is alive now (it starts at the next call otherwise)."""
        return self._thread is not None

    def rename(self, name: str) -> None:
        """Name the thread (now, if it runs, and when it starts again)."""
        with self._lock:
            self._name = name
            if self._thread is not None:
                self._thread.name = name

    def post(self, fn: Callable[[], T], done: Callable[[Job[T]], object]) -> Job[T]:
        """Queue `fn` behind the calls posted before it; never blocks. Once it has run,
        `done(job)` is called on the event loop's thread (it must not raise: under trio it
        runs where an exception would end the run)."""
        job = Job(fn, done)
        with self._lock:  # `_serve` ends only under the lock and with nothing queued
            self._jobs.put(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
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
        while True:
            try:
                job: Job[Any] | None = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                job = None
            stopping = job is None or job.fn is _stop
            with self._lock:  # `post` starts a thread when it finds none
                ending = stopping and self._jobs.empty()
                if ending:
                    self._thread = None
                elif job is None or job.state == _DROPPED:
                    continue
                else:
                    job.state = _STARTED
            if job is not None and stopping:
                job._result = ending  # calls queued after the stop: served first
                job._deliver()
            elif job is not None:
                job._run()
            if ending:
                return

    async def aclose(self) -> None:
        """End the thread once the calls queued before are done, and join it; a later call
        starts a new one. Calls queued after this one keep it serving (it then ends when
        idle, unjoined).

        Cancellation: shielded; the thread is always ended (or left serving later calls).
        """
        with self._lock:
            thread = self._thread
            if thread is None:
                return
        with anyio.CancelScope(shield=True):
            ended = await self.run(_stop)
        if ended:
            thread.join()  # it has nothing left but to return


async def end_threads(executors: Iterable[Executor]) -> None:
    """End the threads of the thread executors among `executors` (`ThreadExecutor.aclose`):
    a closed database leaves none behind. Cancellation: shielded, as `aclose`."""
    for executor in executors:
        if isinstance(executor, ThreadExecutor):
            await executor.aclose()


@contextlib.asynccontextmanager
async def dedicated(executor: Executor, name: str) -> AsyncIterator[Executor]:
    """`executor` for the duration of the block; a `ThreadExecutor`'s thread is named
    `name`, and ended and joined when the block ends (a writer's loop leaves no thread
    behind). The inline executor (virtual time must see no thread) is itself."""
    if not isinstance(executor, ThreadExecutor):
        yield executor
        return
    executor.rename(name)
    try:
        yield executor
    finally:
        await executor.aclose()
