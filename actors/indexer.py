"""The indexer: the single writer of one agent database (docs/design.md §1.2, §2.3).

Inbox: `Call`s carrying `IndexerCommand`s (protocol/indexer.py), bounded. Loop: wait for one
call, drain whatever else is already waiting (up to `max_batch`), apply the whole batch in
one transaction (group commit), then acknowledge each call. An ack is only ever sent after
the commit that holds its command.
"""

from __future__ import annotations

import math
from functools import partial

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..protocol.indexer import IndexerAck, IndexerCommand, Rejected
from ..storage.executor import Executor
from ..storage.transcripts import TranscriptWriter

INBOX_SIZE = 1024
MAX_BATCH = 512


class Call:
    """One command in flight and the slot its acknowledgement is delivered to.

    No event per call: callers wait on the indexer's per-batch `committed` event and check
    their slot, which keeps a 64-way batch to one event instead of 64.
    """

    __slots__ = ("ack", "command")

    def __init__(self, command: IndexerCommand) -> None:
        self.command = command
        self.ack: IndexerAck | None = None


def open_inbox(
    size: int = INBOX_SIZE,
) -> tuple[MemoryObjectSendStream[Call], MemoryObjectReceiveStream[Call]]:
    """A bounded inbox: senders wait when the writer falls behind (backpressure)."""
    assert size != math.inf
    return anyio.create_memory_object_stream[Call](size)


class Indexer:
    """Owns the write connection (through `writer`) and applies commands in batches."""

    def __init__(
        self,
        writer: TranscriptWriter,
        executor: Executor,
        inbox: MemoryObjectReceiveStream[Call],
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

    async def wait_for(self, call: Call) -> IndexerAck:
        """Wait until `call` is acknowledged (it must already be in the inbox).

        Cancellation: stops waiting; the command may still be committed.
        """
        while call.ack is None:
            await self._committed.wait()
        return call.ack

    def _acknowledge(self, batch: list[Call], acks: list[IndexerAck]) -> None:
        for call, ack in zip(batch, acks, strict=True):
            call.ack = ack
        committed, self._committed = self._committed, anyio.Event()
        committed.set()

    async def run(self) -> None:
        """Serve until every sender has closed the inbox; then return.

        Cancellation: a batch already handed to the executor commits in full and is
        acknowledged; calls still queued are answered `Rejected(reason="closed")` (not written).
        """
        batch: list[Call] = []
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
                    # Shielded: once a batch is handed over it commits, and its callers must
                    # hear so; an ack of "closed" always means "not written".
                    with anyio.CancelScope(shield=True):
                        acks = await self.executor.run(partial(self.writer.apply, commands))
                    self._acknowledge(batch, acks)
                    self.batches += 1
                    self.commands += len(batch)
                    batch = []
            finally:
                self._reject_unapplied(batch)

    def _reject_unapplied(self, batch: list[Call]) -> None:
        closed = Rejected(
            reason="closed", message="the memory was closed before this command was applied"
        )
        while True:
            try:
                batch.append(self.inbox.receive_nowait())
            except (anyio.WouldBlock, anyio.EndOfStream):
                break
        unapplied = [call for call in batch if call.ack is None]
        self._acknowledge(unapplied, [closed] * len(unapplied))
