"""The embedder actor: keeps an agent database's vectors in step, in the background
(docs/design.md §2.3).

Inbox: `EmbedPoke`s (protocol/embedder.py), bounded to one: a poke that finds one already
waiting is dropped, since both mean "look for work". Loop: on a poke, read a batch of
indexed rows lacking a vector of the embedder's `name` (on its own reader connection;
above a watermark of event ids, unless the writer's `vector_epoch` says older messages
may need vectors again, so an idle check costs only the new rows), take
what the content-hash cache already has, embed the rest with the embedder's own `embed`
(never on the writer's path: appends are acknowledged without waiting for it), and hand
the vectors to the indexer, the single writer, as one `StoreVectors`. The indexer keeps
only rows that are still on an active branch of a clean session, so a rewind between the
read and the write never leaves an off-branch vector. Repeat until nothing is missing.

A failing embedder (error or past its deadline) is retried after a pause that doubles up
to `MAX_BACKOFF` seconds, on the event loop's clock; the last error is kept for stats and
doctor. It never takes the memory down: embedding is an optimisation, text search works
without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import anyio
import numpy
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..protocol.embedder import EmbedPoke
from ..protocol.embeddings import Embedder
from ..protocol.errors import EmbeddingError, MemoryClosedError, StorageError
from ..protocol.indexer import (
    IndexerAck,
    IndexerCommand,
    Rejected,
    StoreVectors,
    VectorRow,
    VectorsStored,
)
from ..storage.transcripts import TranscriptReader
from ..storage.vectors import (
    cached_vectors,
    pending_batch,
    text_digest,
    to_blob,
)
from .poked import PokedActor

BATCH = 64  # texts per embed call and per StoreVectors: a short transaction next to appends
EMBED_TIMEOUT = 60.0  # seconds an embed call may take before it counts as a failure
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0

T = TypeVar("T")
Submit = Callable[[IndexerCommand], Awaitable[IndexerAck]]


class Read(Protocol):
    """Runs a function on the agent database's reader (`Database.read`)."""

    def __call__(self, fn: Callable[[TranscriptReader], T], /) -> Awaitable[T]: ...


def open_inbox() -> tuple[MemoryObjectSendStream[EmbedPoke], MemoryObjectReceiveStream[EmbedPoke]]:
    """A one-slot inbox: pokes coalesce while the actor is busy."""
    return anyio.create_memory_object_stream[EmbedPoke](1)


class EmbedderFailed(Exception):
    """The embedder failed, returned malformed vectors, or the store refused them."""


class EmbedderActor(PokedActor):
    """Owns the background embedding of one agent database.

    Cancellation of `run`: stops at once (the supervisor cancels it at shutdown, so a
    hanging embedder cannot hold the memory open); a `StoreVectors` already queued may still
    commit, and anything not stored is simply missing until the next start.
    """

    def __init__(
        self,
        inbox: MemoryObjectReceiveStream[EmbedPoke],
        *,
        agent: str,
        embedder: Embedder,
        submit: Submit,
        read: Read,
        batch: int = BATCH,
        timeout: float = EMBED_TIMEOUT,
    ) -> None:
        self.inbox = inbox
        self.agent = agent
        self.embedder = embedder
        self.name = embedder.name
        self._submit = submit
        self._read = read
        self.batch = batch
        self.timeout = timeout
        self.busy = False
        self.last_error: str | None = None
        # The watermark: messages up to `_after` were considered under `vector_epoch`
        # `_epoch` (None: never read, so the first scan starts from the first message).
        self._after = 0
        self._epoch: int | None = None
        # Counters for tests and benchmarks.
        self.embed_calls = 0
        self.texts_embedded = 0
        self.cache_hits = 0
        self.stored = 0
        self.skipped = 0
        self.failures = 0

    def idle(self) -> bool:
        """Waiting for a poke, with none queued (a poke handed straight to a waiting
        receiver leaves the buffer empty, so "waiting" is checked too)."""
        inbox = self.inbox.statistics()
        return not self.busy and inbox.tasks_waiting_receive == 1 and inbox.current_buffer_used == 0

    def working(self) -> bool:
        """Busy or with a poke queued: vectors may be missing for what was acknowledged
        (memory_search says so as `vectorsPending`, docs/design.md §2.3). A field read, never
        a query: cheap enough for the recall path."""
        return not self.idle()

    def watermark(self) -> tuple[int, int | None]:
        """(event id, `vector_epoch`): every message up to that id has been given its vector
        (or needs none) under that epoch; None: nothing read yet. `stats` counts only the
        messages above it (`storage.vectors.pending_count`)."""
        return self._after, self._epoch

    async def _work(self) -> None:
        backoff = FIRST_BACKOFF
        fruitless = 0  # batches in a row whose rows all changed before they were stored
        while True:
            try:
                read, stored = await self._one_batch()
            except (EmbedderFailed, StorageError) as exc:  # a read can fail too (disk, lock)
                self.failures += 1
                self.last_error = str(exc)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            self.last_error = None
            backoff = FIRST_BACKOFF
            fruitless = 0 if stored else fruitless + 1
            # Done when nothing is missing. Rows that changed under us (a rewind) are not
            # read again, so other missing rows come next; a third fruitless batch in a row
            # waits for the next poke rather than spin against a writer.
            if not read or fruitless >= 3:
                return

    async def _one_batch(self) -> tuple[int, int]:
        """Embed and store one batch; (rows read, rows stored)."""
        name, limit, after, epoch = self.name, self.batch, self._after, self._epoch
        batch = await self._read(
            lambda r: pending_batch(r.conn, name, after=after, epoch=epoch, limit=limit)
        )
        messages, notes = batch.messages, batch.notes
        if not messages and not notes:
            self._after, self._epoch = batch.scanned_to, batch.epoch
            return 0, 0
        texts = [t for _, t in messages] + [t for _, t in notes]
        digests = [text_digest(t) for t in texts]
        vectors = await self._read(lambda r: cached_vectors(r.conn, name, digests))
        self.cache_hits += sum(d in vectors for d in digests)
        missing = {d: t for d, t in zip(digests, texts, strict=True) if d not in vectors}
        if missing:
            embedded = await self._embed(list(missing.values()))
            vectors.update(zip(missing, embedded, strict=True))
        rows = [
            VectorRow(id=i, digest=d, vector=vectors[d])
            for (i, _), d in zip(messages + notes, digests, strict=True)
        ]
        ack = await self._submit(
            StoreVectors(
                agent=self.agent,
                name=name,
                messages=tuple(rows[: len(messages)]),
                notes=tuple(rows[len(messages) :]),
            )
        )
        if isinstance(ack, Rejected):
            if ack.reason == "closed":
                raise MemoryClosedError(ack.message)
            raise EmbedderFailed(f"storing vectors: {ack.message}")
        assert isinstance(ack, VectorsStored), ack
        # Rows skipped here changed: they come back through the epoch if they need a vector.
        self._after, self._epoch = batch.scanned_to, batch.epoch
        self.stored += ack.messages + ack.notes
        self.skipped += ack.skipped
        return len(messages) + len(notes), ack.messages + ack.notes

    async def _embed(self, texts: Sequence[str]) -> list[bytes]:
        """The embedder's vectors as stored BLOBs; any failure is `EmbedderFailed`."""
        self.embed_calls += 1
        try:
            with anyio.fail_after(self.timeout):
                deadline = anyio.current_time() + self.timeout
                matrix = await self.embedder.embed(texts, deadline=deadline)
        except TimeoutError:
            raise EmbedderFailed(f"{self.name}: no answer within {self.timeout:g} s") from None
        except EmbeddingError as exc:
            raise EmbedderFailed(str(exc)) from exc
        except Exception as exc:  # fail-open: a broken embedder never takes the memory down
            raise EmbedderFailed(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        array = numpy.asarray(matrix)
        dim = self.embedder.dim
        if array.shape != (len(texts), dim) or not numpy.all(numpy.isfinite(array)):
            raise EmbedderFailed(
                f"{self.name}: expected {len(texts)} finite vectors of {dim} dimensions,"
                f" got shape {array.shape}"
            )
        self.texts_embedded += len(texts)
        return [to_blob(row) for row in array]
