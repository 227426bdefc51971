"""The records keeper: the single writer of `state_dir/records.db` (docs/design.md §1.2, §5).

Inbox: `RecordCall`s carrying `RecordCommand`s (protocol/records.py), bounded. Loop: wait
for one call, drain whatever else is already waiting (up to `max_batch`), apply the whole
batch in one transaction (group commit), then acknowledge each call. An ack is only ever
sent after the commit that holds its command.
"""

from __future__ import annotations

import math
from functools import partial

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..protocol.records import RecordAck, RecordCommand, RecordRejected
from ..storage.executor import Executor
from ..storage.records import RecordWriter

INBOX_SIZE = 1024
MAX_BATCH = 512


class RecordCall:
    """One command in flight and the slot its acknowledgement is delivered to.

    Callers wait on the keeper's per-batch `committed` event and check their slot: one
    event per batch, not one per call.
    """

    __slots__ = ("ack", "command")

    def __init__(self, command: RecordCommand) -> None:
        self.command = command
        self.ack: RecordAck | None = None


def open_inbox(
    size: int = INBOX_SIZE,
) -> tuple[MemoryObjectSendStream[RecordCall], MemoryObjectReceiveStream[RecordCall]]:
    """A bounded inbox: senders wait when the writer falls behind (backpressure)."""
    assert size != math.inf
    return anyio.create_memory_object_stream[RecordCall](size)


class RecordKeeper:
    """Owns the write connection of `records.db` (through `writer`); applies batches."""

    def __init__(
        self,
        writer: RecordWriter,
        executor: Executor,
        inbox: MemoryObjectReceiveStream[RecordCall],
        *,
        max_batch: int = MAX_BATCH,
    ) -> None:
        self.writer = writer
        self.executor = executor
        self.inbox = inbox
        self.max_batch = max_batch
        self.batches = 0
        self.commands = 0
        self._committed = anyio.Event()

    async def wait_for(self, call: RecordCall) -> RecordAck:
        """Wait until `call` is acknowledged (it must already be in the inbox).

        Cancellation: stops waiting; the command may still be committed.
        """
        while call.ack is None:
            await self._committed.wait()
        return call.ack

    def _acknowledge(self, batch: list[RecordCall], acks: list[RecordAck]) -> None:
        for call, ack in zip(batch, acks, strict=True):
            call.ack = ack
        committed, self._committed = self._committed, anyio.Event()
        committed.set()

    async def run(self) -> None:
        """Serve until every sender has closed the inbox; then return.

        Cancellation: a batch already handed to the executor commits in full and is
        acknowledged; calls still queued are answered `RecordRejected(reason="closed")`.
        """
        batch: list[RecordCall] = []
        async with self.inbox:
            try:
                async for first in self.inbox:
                    batch = [first]
                    while len(batch) < self.max_batch:
                        try:
                            batch.append(self.inbox.receive_nowait())
                        except (anyio.WouldBlock, anyio.EndOfStream):
                            break
                    commands = [call.command for call in batch]
                    # Shielded: a batch handed over commits, and its callers must hear so.
                    with anyio.CancelScope(shield=True):
                        acks = await self.executor.run(partial(self.writer.apply, commands))
                    self._acknowledge(batch, acks)
                    self.batches += 1
                    self.commands += len(batch)
                    batch = []
            finally:
                self._reject_unapplied(batch)

    def _reject_unapplied(self, batch: list[RecordCall]) -> None:
        closed = RecordRejected(
            reason="closed", message="the memory was closed before this command was applied"
        )
        while True:
            try:
                batch.append(self.inbox.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        unapplied = [call for call in batch if call.ack is None]
        self._acknowledge(unapplied, [closed] * len(unapplied))
