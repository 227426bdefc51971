"""The group commit: the one loop of every single writer of a database (docs/design.md §1.2).

Inbox: `Call`s carrying commands, bounded. Loop: wait for one call, drain whatever else is
already waiting (up to `max_batch`), apply the whole batch in one transaction through the
storage writer, then acknowledge each call. An ack is only ever sent after the commit that
holds its command. `actors/indexer.py` and `actors/records.py` are its two writers.

With the thread executor the batches run on the writer connection's thread
(`storage/executor.ThreadExecutor`) and two are in flight: the thread applies the next batch
while the loop answers the callers of the last one and collects their next commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Generic, Protocol, TypeVar

import anyio
import apsw

from ..protocol.errors import MemoryClosedError
from ..storage.checkpoints import Checkpointer
from ..storage.executor import Executor, Job, ThreadExecutor, dedicated

INBOX_SIZE = 1024
MAX_BATCH = 512
# Batches handed to a writer thread and not yet answered: one applying, one queued behind.
PIPELINE_DEPTH = 2
CLOSED = "the memory was closed before this command was applied"

C = TypeVar("C")
A = TypeVar("A")
C_contra = TypeVar("C_contra", contravariant=True)


class StorageWriter(Protocol[C_contra, A]):
    """What the group commit applies batches with (storage/transcripts.py, storage/records.py)."""

    @property
    def conn(self) -> apsw.Connection: ...

    def apply(self, commands: Sequence[C_contra]) -> list[A]:
        """Apply `commands` in one transaction; one ack per command, in order."""
        ...


class Call(Generic[C, A]):
    """One command in flight and the slot its acknowledgement is delivered to.

    Most callers share one event: they wait on the writer's per-batch `committed` event and
    check their slot, which keeps a 64-way batch to one event instead of 64. A call queued
    behind `max_batch` others gets an event of its own (`answered`): on the shared one it
    would wake, and wait again, at every commit before its own.
    """

    __slots__ = ("ack", "answered", "command")

    def __init__(self, command: C, answered: anyio.Event | None = None) -> None:
        self.command = command
        self.ack: A | None = None
        self.answered = answered


class GroupCommit(Generic[C, A]):
    """Owns the write connection (through `writer`) and applies commands in batches.

    A writer says what a command still queued at close is answered with (`rejected`).
    """

    def __init__(
        self,
        writer: StorageWriter[C, A],
        executor: Executor,
        *,
        max_batch: int = MAX_BATCH,
        inbox_size: int = INBOX_SIZE,
    ) -> None:
        self.writer = writer
        self.executor = executor
        self.max_batch = max_batch
        self.batches = 0
        self.commands = 0
        self._queued = 0  # calls queued and not yet answered
        # While running on a writer thread: the thread that checkpoints the WAL.
        self.checkpointer: Checkpointer | None = None
        self._committed = anyio.Event()
        # Bounded: senders wait when the writer falls behind (backpressure).
        self._send, self._inbox = anyio.create_memory_object_stream[Call[C, A]](inbox_size)

    def rejected(self, message: str) -> A:
        """The ack of a command that was not written because the writer closed."""
        raise NotImplementedError

    async def submit(self, command: C) -> A:
        """Queue `command` and wait for its ack.

        Cancellation: if cancelled while waiting for room in the inbox, nothing was queued;
        if cancelled after, the command may still commit.
        """
        behind = self._queued >= self.max_batch
        call: Call[C, A] = Call(command, anyio.Event() if behind else None)
        try:
            try:
                self._send.send_nowait(call)  # the common case: no checkpoint before queuing
            except anyio.WouldBlock:
                await self._send.send(call)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            raise MemoryClosedError("the memory is closed") from None
        self._queued += 1
        if call.answered is not None:
            await call.answered.wait()
        while call.ack is None:
            await self._committed.wait()
        return call.ack

    async def close_inbox(self) -> None:
        """Accept no more commands; `run` returns once it has drained what is queued."""
        await self._send.aclose()

    def _acknowledge(self, batch: list[Call[C, A]], acks: list[A]) -> None:
        for call, ack in zip(batch, acks, strict=True):
            call.ack = ack
            if call.answered is not None:
                call.answered.set()
        self._queued -= len(batch)
        committed, self._committed = self._committed, anyio.Event()
        committed.set()

    async def run(self) -> None:
        """Serve until the inbox is closed; then return.

        With the thread executor the batches run on a writer thread of their own, started
        here and joined before this returns (`storage/executor.dedicated`).

        Cancellation: a batch already handed to the executor commits in full and is
        acknowledged; calls still queued are answered `rejected(...)` (not written).
        """
        # The inbox closes first: between the last rejection of what it holds and its
        # close there must be no checkpoint, or a call sent then would never be answered.
        name = f"activememory-{type(self).__name__}"
        async with dedicated(self.executor, name) as executor, self._inbox:
            if isinstance(executor, ThreadExecutor):
                await self._run_pipelined(executor, Checkpointer(f"{name}-checkpoints"))
            else:
                await self._run_serial(executor)

    async def _next_batch(self) -> list[Call[C, A]]:
        """The calls waiting, at least one (waits for it) and at most `max_batch`; [] once
        the inbox is closed and empty."""
        try:
            batch = [await self._inbox.receive()]
        except anyio.EndOfStream:
            return []
        while len(batch) < self.max_batch:
            try:
                batch.append(self._inbox.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        return batch

    def _applied(self, batch: list[Call[C, A]], acks: list[A]) -> None:
        self._acknowledge(batch, acks)
        self.batches += 1
        self.commands += len(batch)

    async def _run_serial(self, executor: Executor) -> None:
        # One batch at a time, applied through `executor.run` (the inline executor).
        batch: list[Call[C, A]] = []
        try:
            while True:
                batch = await self._next_batch()
                if not batch:
                    break
                commands = [call.command for call in batch]
                # Shielded: once a batch is handed over it commits, and its callers must
                # hear so; an ack of "closed" always means "not written".
                with anyio.CancelScope(shield=True):
                    acks = await executor.run(partial(self.writer.apply, commands))
                self._applied(batch, acks)
                batch = []
        finally:
            self._reject_unapplied(batch)

    async def _run_pipelined(self, thread: ThreadExecutor, checkpointer: Checkpointer) -> None:
        # Up to PIPELINE_DEPTH batches posted to the thread, answered in `_landed` on the
        # loop's thread as each commits: the loop never waits on the thread to hand over.
        # The WAL's checkpoint thread starts before the first batch and stops after the
        # last, as jobs of the writer thread: posted, never awaited, so nothing here waits
        # between the last rejection and the inbox's close (`run`).
        self.checkpointer = checkpointer
        thread.post(partial(checkpointer.start, self.writer.conn), _ignore)
        pipeline = _Pipeline[C, A]()
        batch: list[Call[C, A]] = []
        try:
            while True:
                while len(pipeline.flying) >= PIPELINE_DEPTH and pipeline.failure is None:
                    await pipeline.landed.wait()
                if pipeline.failure is not None:
                    break
                batch = await self._next_batch()
                if not batch:
                    break
                pipeline.flying.append(batch)
                thread.post(
                    partial(self._apply_unless_failed, pipeline, batch),
                    partial(self._landed, pipeline, batch),
                )
                batch = []
        finally:
            # Shielded: what was handed over commits (or fails) and its callers hear so.
            with anyio.CancelScope(shield=True):
                while pipeline.flying:
                    await pipeline.landed.wait()
            self._reject_unapplied(batch + pipeline.unapplied)
            thread.post(partial(checkpointer.stop, self.writer.conn), _ignore)
        if pipeline.failure is not None:
            raise pipeline.failure

    def _apply_unless_failed(self, pipeline: _Pipeline[C, A], batch: list[Call[C, A]]) -> list[A]:
        # On the writer thread, in posting order: after a batch failed nothing later is
        # applied, as when the batches ran one at a time (the actor stops on a failure).
        if pipeline.thread_failed:
            raise _NotApplied
        try:
            return self.writer.apply([call.command for call in batch])
        except BaseException:
            pipeline.thread_failed = True
            raise

    def _landed(
        self, pipeline: _Pipeline[C, A], batch: list[Call[C, A]], job: Job[list[A]]
    ) -> None:
        # On the loop's thread, once per posted batch, in posting order; must not raise.
        pipeline.flying.remove(batch)
        try:
            self._applied(batch, job.outcome())
        except BaseException as exc:  # the batch failed, was skipped, or its acks do not fit
            pipeline.unapplied += batch
            if pipeline.failure is None and not isinstance(exc, _NotApplied):
                pipeline.failure = exc
                # The writer is done for: new calls are refused, and a writer waiting for
                # one wakes (end of stream) to stop and raise this.
                self._send.close()
        landed, pipeline.landed = pipeline.landed, anyio.Event()
        landed.set()

    def _reject_unapplied(self, batch: list[Call[C, A]]) -> None:
        # The calls of `batch` and those still in the inbox: answered, as not written.
        while True:
            try:
                batch.append(self._inbox.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        unapplied = [call for call in batch if call.ack is None]
        self._acknowledge(unapplied, [self.rejected(CLOSED)] * len(unapplied))


def _ignore(job: Job[None]) -> None:
    """The answer to a job nobody waits for (its function never raises)."""


class _NotApplied(Exception):
    """A batch skipped on the writer thread because one posted before it failed."""


class _Pipeline(Generic[C, A]):
    """The batches a pipelined group commit has posted to its writer thread."""

    def __init__(self) -> None:
        self.flying: list[list[Call[C, A]]] = []  # posted, not yet answered; oldest first
        self.landed = anyio.Event()  # set (and replaced) each time a batch is answered
        self.unapplied: list[Call[C, A]] = []  # calls of batches that failed or were skipped
        self.failure: BaseException | None = None  # the first failure: `run` raises it
        self.thread_failed = False  # read and written on the writer thread alone
