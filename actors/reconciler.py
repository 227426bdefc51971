"""The reconciler: rebuilds the index of dirty sessions in the background (docs/design.md §2.4).

Inbox: `Poke`s (protocol/reconciler.py), bounded to one: a poke that finds one already
waiting is dropped, since both mean "look for work". Loop: on a poke, read the dirty
sessions, and rebuild each through the indexer (the single writer) as a series of
`ReindexChunk` commands, each its own short transaction. Every chunk carries the revision
the session had when its rebuild started; a change in between fails the fence and the
session starts over, so a session is never published clean with a stale index.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..protocol.indexer import IndexerAck, IndexerCommand, ReindexChunk, Reindexed, Rejected
from ..protocol.reconciler import Poke
from ..protocol.session_key import parse_session_key
from .poked import PokedActor

CHUNK_ROWS = 256  # active-branch rows per chunk: a short transaction next to appends
SESSIONS_PER_READ = 32

Submit = Callable[[IndexerCommand], Awaitable[IndexerAck]]
# Reads up to n dirty sessions as (key, revision), oldest first.
ReadDirty = Callable[[int], Awaitable[list[tuple[str, int]]]]


def open_inbox() -> tuple[MemoryObjectSendStream[Poke], MemoryObjectReceiveStream[Poke]]:
    """A one-slot inbox: pokes coalesce while the reconciler is busy."""
    return anyio.create_memory_object_stream[Poke](1)


class Reconciler(PokedActor):
    """Owns the rebuild job of one agent database.

    Cancellation of `run`: stops between chunks or while a chunk is queued; a chunk already
    committed stays (the session stays dirty until a later rebuild completes it).
    """

    def __init__(
        self,
        inbox: MemoryObjectReceiveStream[Poke],
        *,
        submit: Submit,
        read_dirty: ReadDirty,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        self.inbox = inbox
        self._submit = submit
        self._read_dirty = read_dirty
        self.chunk_rows = chunk_rows
        self.busy = False
        self.stopping = False  # set by the supervisor at shutdown: stop after this chunk
        # Why the last chunk was refused by storage (None once one succeeds): a caller
        # waiting for a rebuild (`Sessions.reindex`) reports it instead of waiting forever.
        self.failure: str | None = None

    async def _work(self) -> None:
        while True:
            dirty = await self._read_dirty(SESSIONS_PER_READ)
            progressed = False
            for key, revision in dirty:
                if self.stopping:
                    return
                progressed |= await self._rebuild(key, revision)
            if not progressed:
                return  # nothing dirty, or only failures: wait for the next poke

    async def _rebuild(self, key: str, revision: int) -> bool:
        """Rebuild one session; False if the indexer refused (storage error, deleted)."""
        session_key = parse_session_key(key)
        after = 0
        while not self.stopping:
            ack = await self._submit(
                ReindexChunk(
                    key=session_key,
                    revision=revision,
                    after_depth=after,
                    max_rows=self.chunk_rows,
                )
            )
            if not isinstance(ack, Reindexed):
                if isinstance(ack, Rejected) and ack.reason == "storage":
                    self.failure = ack.message
                return False
            self.failure = None
            if ack.stale or ack.clean:
                return True  # done, or changed while we worked: the next read sees its revision
            after = ack.next_depth
        return False
