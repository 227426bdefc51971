"""The embedder actor: keeps a database's vectors in step, in the background
(docs/design.md §2.3, §5.7).

One actor, two feeds ("what needs vectors, and who stores them"): `AgentFeed` for an agent
database (messages and note chunks, stored by its indexer) and `RecordFeed` for
`records.db` (records, stored by the records keeper). Each database has its own actor.

Inbox: `EmbedPoke`s (protocol/embedder.py), bounded to one: a poke that finds one already
waiting is dropped, since both mean "look for work". Loop: on a poke, read a batch of rows
lacking a vector of the embedder's `name` through the feed (on the database's embedder
reader; above the feed's watermark, so an idle check costs only the new rows), take what
the content-hash cache already has, embed the rest with the embedder's own `embed` (never
on the writer's path: writes are acknowledged without waiting for it), and hand the vectors
to the database's single writer. The writer keeps only rows that still hold the text
embedded (for messages: still on an active branch of a clean session), so a rewind, a
delete or an erase between the read and the write never leaves a stale vector. Repeat
until nothing is missing.

A failing embedder (an error, or one text past its deadline) is retried after a pause that
doubles up to `MAX_BACKOFF` seconds, on the event loop's clock; the last error is kept for
stats and doctor. It never takes the memory down: embedding is an optimisation, text search
works without it. A call of several texts past the deadline is slowness, not failure: it is
tried again at once with half as many texts, until the backlog is done (no error, no pause;
`timeouts` counts it), so a machine so loaded that the background batch (its thread yields
the CPU to queries) cannot finish in `timeout` still makes progress, where the same batch
would time out for ever. A lease holder whose embedder fails `HAND_OVER_AFTER` times in a
row gives the lease up and claims again only after its pause: another process, whose
embedder may work (its own model load, its own network path), takes over meanwhile.

The lease (`Lease`, docs/design.md §11 "One embedder per agent"): where several processes
write one database (PostgreSQL), one process at a time embeds it, the holder of its lease.
The actor claims the lease once a `period` at most: holding it, it works on every poke and
at each claim, so rows other processes wrote get their vectors within a period; not
holding it, a poke does nothing and each claim tries to take it over. SQLite's lease is
`ALWAYS_HELD` (one writer process per state directory): no period, pokes alone.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, NamedTuple, Protocol, TypeVar

import anyio
import numpy
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..protocol.embedder import EmbedPoke
from ..protocol.embeddings import BACKGROUND, Embedder
from ..protocol.errors import EmbeddingError, MemoryClosedError, StorageError
from ..protocol.indexer import (
    IndexerAck,
    IndexerCommand,
    Rejected,
    StoreVectors,
    VectorRow,
    VectorsStored,
)
from ..protocol.records import (
    RecordAck,
    RecordCommand,
    RecordRejected,
    RecordVectorsStored,
    StoreRecordVectors,
)
from ..storage.reads import TranscriptReads
from ..storage.record_vectors import (
    RecordMark,
)
from ..storage.records import RecordReader
from ..storage.vectors import (
    PendingBatch,
    text_digest,
    to_blob,
)
from .poked import PokedActor

BATCH = 64  # texts per embed call and per StoreVectors: a short transaction next to appends
EMBED_TIMEOUT = 60.0  # seconds an embed call may take before it counts as a failure
FIRST_BACKOFF = 1.0
MAX_BACKOFF = 300.0
HAND_OVER_AFTER = 3
"""Embed calls failing in a row after which a lease holder gives its lease up (module
docstring): another process's embedder may work where this one does not."""

T = TypeVar("T")
Submit = Callable[[IndexerCommand], Awaitable[IndexerAck]]
SubmitRecord = Callable[[RecordCommand], Awaitable[RecordAck]]


class Read(Protocol):
    """Runs a function on a reader of the agent's store (`Database.read_for_embedder`;
    on PostgreSQL `PgAgentStore.read`): either store's `TranscriptReads`."""

    def __call__(self, fn: Callable[[TranscriptReads], T], /) -> Awaitable[T]: ...


class ReadRecords(Protocol):
    """Runs a function on a records reader of the embedder's own (`records.db`'s, or the
    PostgreSQL store's: both have the feed's three reads)."""

    def __call__(self, fn: Callable[[RecordReader], T], /) -> Awaitable[T]: ...


class Lease(Protocol):
    """Whether this process is the one that embeds a database (module docstring)."""

    @property
    def period(self) -> float | None:
        """Seconds between two claims; None: held for good, never claimed (SQLite)."""
        ...

    async def claim(self) -> bool:
        """Take the lease if it is free, or check it is still held; whether it is held."""
        ...

    async def release(self) -> None:
        """Give the lease up if held, so another process's claim can take it."""
        ...


class AlwaysHeld:
    """The lease of a database only this process writes (SQLite's writer lock sees to it)."""

    period: float | None = None

    async def claim(self) -> bool:
        return True

    async def release(self) -> None:
        pass  # nobody else could embed this database


ALWAYS_HELD = AlwaysHeld()


def open_inbox() -> tuple[MemoryObjectSendStream[EmbedPoke], MemoryObjectReceiveStream[EmbedPoke]]:
    """A one-slot inbox: pokes coalesce while the actor is busy."""
    return anyio.create_memory_object_stream[EmbedPoke](1)


class EmbedderFailed(Exception):
    """The embedder failed, returned malformed vectors, or the store refused them."""


class EmbedderTimedOut(EmbedderFailed):
    """The embedder gave no answer for `texts` texts within the actor's `timeout` (the
    batch may be too large for the CPU it gets: the next try takes half as many)."""

    def __init__(self, message: str, texts: int) -> None:
        super().__init__(message)
        self.texts = texts


class FeedBatch(NamedTuple):
    """Rows lacking a vector, as a feed read them: `rows` are (key, text); `state` is the
    feed's own (what it stores them with, its watermark once they are stored)."""

    rows: list[tuple[int, str]]
    state: object


class VectorFeed(Protocol):
    """What needs vectors in one database, and how they are stored (module docstring)."""

    async def pending(self, name: str, limit: int) -> FeedBatch:
        """Up to `limit` rows lacking a vector of `name`; with none, the feed's watermark
        moves to what was scanned."""
        ...

    async def cached(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        """The content-hash cache's vectors of `name` for these text digests."""
        ...

    async def store(self, name: str, batch: FeedBatch, rows: list[VectorRow]) -> tuple[int, int]:
        """Hand `rows` (of `batch`, in its order) to the single writer; (stored, skipped).
        Raises `EmbedderFailed` if refused, `MemoryClosedError` if the writer has closed;
        on success the watermark moves past the batch."""
        ...


F = TypeVar("F", bound=VectorFeed)


class AgentFeed:
    """An agent database's messages and note chunks; stored by its indexer.

    The watermark: messages up to an event id were considered under a `vector_epoch`
    (None: never read, so the first scan starts from the first message).
    """

    def __init__(self, *, agent: str, submit: Submit, read: Read) -> None:
        self.agent = agent
        self._submit = submit
        self._read = read
        self._after = 0
        self._epoch: int | None = None

    def watermark(self) -> tuple[int, int | None]:
        """(event id, `vector_epoch`): every message up to that id has been given its vector
        (or needs none) under that epoch; None: nothing read yet. `stats` counts only the
        messages above it (`storage.vectors.pending_count`)."""
        return self._after, self._epoch

    async def pending(self, name: str, limit: int) -> FeedBatch:
        after, epoch = self._after, self._epoch
        batch = await self._read(
            lambda r: r.pending_vectors(name, after=after, epoch=epoch, limit=limit)
        )
        if not batch.messages and not batch.notes:
            self._after, self._epoch = batch.scanned_to, batch.epoch
        return FeedBatch(batch.messages + batch.notes, batch)

    async def cached(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        return await self._read(lambda r: r.cached_vectors(name, digests))

    async def store(self, name: str, batch: FeedBatch, rows: list[VectorRow]) -> tuple[int, int]:
        pending = batch.state
        assert isinstance(pending, PendingBatch)
        split = len(pending.messages)
        ack = await self._submit(
            StoreVectors(
                agent=self.agent,
                name=name,
                messages=tuple(rows[:split]),
                notes=tuple(rows[split:]),
            )
        )
        if isinstance(ack, Rejected):
            if ack.reason == "closed":
                raise MemoryClosedError(ack.message)
            raise EmbedderFailed(f"storing vectors: {ack.message}")
        assert isinstance(ack, VectorsStored), ack
        # Rows skipped here changed: they come back through the epoch if they need a vector.
        self._after, self._epoch = pending.scanned_to, pending.epoch
        return ack.messages + ack.notes, ack.skipped


class RecordFeed:
    """`records.db`'s records; stored by the records keeper (docs/design.md §5.7).

    The watermark (`RecordMark`): records up to a seq were considered; a scan starts over
    when the record at it is gone (storage/record_vectors.py).
    """

    def __init__(self, *, submit: SubmitRecord, read: ReadRecords) -> None:
        self._submit = submit
        self._read = read
        self._mark = RecordMark()

    def watermark(self) -> RecordMark:
        """Every record up to it has its vector or has changed since; `pending_count`
        counts above it."""
        return self._mark

    async def pending_count(self, name: str) -> int:
        """How many records wait for a vector of `name` (exact once the actor is idle)."""
        mark = self._mark
        return await self._read(lambda r: r.pending_record_count(name, mark=mark))

    async def pending(self, name: str, limit: int) -> FeedBatch:
        mark = self._mark
        found = await self._read(lambda r: r.pending_records(name, mark=mark, limit=limit))
        if not found.rows:
            self._mark = found.mark
        return FeedBatch(found.rows, found.mark)

    async def cached(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        return await self._read(lambda r: r.cached_record_vectors(name, digests))

    async def store(self, name: str, batch: FeedBatch, rows: list[VectorRow]) -> tuple[int, int]:
        assert isinstance(batch.state, RecordMark)
        ack = await self._submit(StoreRecordVectors(name=name, rows=tuple(rows)))
        if isinstance(ack, RecordRejected):
            if ack.reason == "closed":
                raise MemoryClosedError(ack.message)
            raise EmbedderFailed(f"storing vectors: {ack.message}")
        assert isinstance(ack, RecordVectorsStored), ack
        # A skipped record was deleted (its seq maybe reused): the mark's check rescans.
        self._mark = batch.state
        return ack.stored, ack.skipped


class EmbedderActor(PokedActor, Generic[F]):
    """Owns the background embedding of one database, through its `feed`.

    Cancellation of `run`: stops at once (the supervisor cancels it at shutdown, so a
    hanging embedder cannot hold the memory open); a store command already queued may still
    commit, and anything not stored is simply missing until the next start. The lease is
    not given back here: it goes with its connection when the store closes (on PostgreSQL
    `PgStore.close`), and a process that dies gives it up with its connection.
    """

    def __init__(
        self,
        inbox: MemoryObjectReceiveStream[EmbedPoke],
        *,
        embedder: Embedder,
        feed: F,
        lease: Lease = ALWAYS_HELD,
        batch: int = BATCH,
        timeout: float = EMBED_TIMEOUT,
    ) -> None:
        self.inbox = inbox
        self.feed = feed
        self.lease = lease
        self.lease_held = lease.period is None  # as of the last claim
        # When to claim next, on the event loop's clock: at once, or never (held for good).
        self._next_claim = math.inf if lease.period is None else -math.inf
        self.embedder = embedder
        self.name = embedder.name
        self.batch = batch
        # Texts the next batch asks for: `batch`, halved after each time-out until the
        # backlog is done (module docstring).
        self.batch_now = batch
        self.timeout = timeout
        self.busy = False
        # Not the holder, and a row this process knows of may still lack its vector.
        self.awaiting_holder = False
        # Awake for the periodic claim of the lease alone (no poke), no missing row found.
        self._checking = False
        # A poke was sent and not yet received (handed to the waiting actor, which has not
        # run since): `poke_sent`.
        self._poke_sent = False
        self._backoff = FIRST_BACKOFF  # the next pause after a failure; kept across leases
        self.last_error: str | None = None
        # Counters for tests and benchmarks.
        self.embed_calls = 0
        self.texts_embedded = 0
        self.cache_hits = 0
        self.stored = 0
        self.skipped = 0
        self.failures = 0
        self.timeouts = 0  # embed calls past `timeout` tried again smaller (not failures)

    def idle(self) -> bool:
        """Waiting for a poke, with none queued (a poke handed straight to a waiting
        receiver leaves the buffer empty, so "waiting" is checked too)."""
        inbox = self.inbox.statistics()
        return not self.busy and inbox.tasks_waiting_receive == 1 and inbox.current_buffer_used == 0

    def working(self) -> bool:
        """Busy or with a poke queued: vectors may be missing for what was acknowledged
        (memory_search says so as `vectorsPending`, docs/design.md §2.3). A field read, never
        a query: cheap enough for the recall path. Without the lease: until the holder has
        embedded what this process knows is missing (`_watch_holder`). Not while the actor
        is awake only for its periodic claim of the lease and has found no row missing
        (`_checking`): that is every period on PostgreSQL, and memory_search's flag
        flickered with it."""
        if self.awaiting_holder or self._poke_sent or self.inbox.statistics().current_buffer_used:
            return True
        if self._checking or (not self.busy and anyio.current_time() >= self._next_claim):
            return False  # awake, or waking up, for the claim alone
        return not self.idle()

    def poke_sent(self) -> None:
        """Called by whoever has just poked the actor (`VectorDatabase.poke_embedder`): until
        the actor receives the poke, `working` is true even if it was idle or checking."""
        self._poke_sent = True

    def holds_lease(self) -> bool | None:
        """Whether this process held the lease at its last claim (for stats and doctor);
        None when the lease is held for good (SQLite)."""
        return None if self.lease.period is None else self.lease_held

    async def run(self) -> None:
        """Serve pokes, and claims of the lease once a period, until the inbox closes or
        the writer it uses has closed (`PokedActor.run`, with the lease's clock)."""
        async with self.inbox:
            while True:
                poked = False
                # `_checking` keeps the last round's value into the wait (receiving starts
                # with a checkpoint, when the actor is neither busy nor waiting yet).
                with anyio.move_on_after(self._next_claim - anyio.current_time()):
                    try:
                        await self.inbox.receive()
                        poked = True
                        self._poke_sent = False  # from here the actor is not idle
                    except anyio.EndOfStream:
                        return
                self._checking = not poked
                due = anyio.current_time() >= self._next_claim
                if not await self._holds_lease():
                    # Another process embeds: its own claims find the rows.
                    if not await self._watch_holder(poked=poked, due=due):
                        return
                    continue
                self.awaiting_holder = False
                if not await self._round():
                    return

    async def _watch_holder(self, *, poked: bool, due: bool) -> bool:
        """Not the holder: a poke (this process wrote, or opened the store) means rows may
        wait for the holder's vectors; `working` says so until a claim's check finds none
        missing, so memory_search's `vectorsPending` is as honest here as in the holder
        (docs/design.md §11 "One embedder per agent"). One read a period, only while
        waiting. False once the store has closed."""
        if poked:
            self.awaiting_holder = True
        if due and self.awaiting_holder:
            try:
                batch = await self.feed.pending(self.name, 1)
            except MemoryClosedError:
                return False
            except StorageError:
                return True  # unknown: stay pending, check again at the next claim
            self.awaiting_holder = bool(batch.rows)
        return True

    async def _holds_lease(self) -> bool:
        """Claim the lease if a period has passed since the last claim; else the last
        claim's answer (a poke costs no round trip)."""
        period = self.lease.period
        if period is None:
            return True
        now = anyio.current_time()
        if now >= self._next_claim:
            self._next_claim = now + period
            self.lease_held = await self.lease.claim()
        return self.lease_held

    async def _hand_over(self, pause: float) -> None:
        """Give the lease up after failing embed calls, and claim again only after `pause`
        (the wait before the next try it would have made anyway): another process takes the
        lease at its next claim meanwhile. `working` stays true (the rows still wait) until a
        claim's check finds them embedded (`_watch_holder`)."""
        with contextlib.suppress(StorageError):  # its connection is gone: so is the lease
            await self.lease.release()
        self.lease_held = False
        self.awaiting_holder = True
        self._next_claim = anyio.current_time() + max(pause, self.lease.period or 0.0)

    def watermark(self: EmbedderActor[AgentFeed]) -> tuple[int, int | None]:
        """The agent feed's watermark (`AgentFeed.watermark`)."""
        return self.feed.watermark()

    async def _work(self) -> None:
        fruitless = 0  # batches in a row whose rows all changed before they were stored
        failed = 0  # embed calls failing in a row, under this claim of the lease
        while True:
            if not await self._holds_lease():
                return  # lost mid-backlog: the new holder goes on from what is stored
            try:
                read, stored = await self._one_batch()
            except (EmbedderFailed, StorageError) as exc:  # a read can fail too (disk, lock)
                if isinstance(exc, EmbedderTimedOut) and exc.texts > 1:
                    # Slow, not failing: the same texts in smaller batches, at once.
                    self.timeouts += 1
                    self.batch_now = max(1, min(self.batch_now, exc.texts) // 2)
                    continue
                self.failures += 1
                self.last_error = str(exc)
                pause, self._backoff = self._backoff, min(self._backoff * 2, MAX_BACKOFF)
                failed += isinstance(exc, EmbedderFailed)
                if failed >= HAND_OVER_AFTER and self.lease.period is not None:
                    await self._hand_over(pause)
                    return
                await anyio.sleep(pause)
                continue
            self.last_error = None
            self._backoff = FIRST_BACKOFF
            failed = 0
            fruitless = 0 if stored else fruitless + 1
            # Done when nothing is missing. Rows that changed under us (a rewind) are not
            # read again, so other missing rows come next; a third fruitless batch in a row
            # waits for the next poke rather than spin against a writer.
            if not read or fruitless >= 3:
                self.batch_now = self.batch
                return

    async def _one_batch(self) -> tuple[int, int]:
        """Embed and store one batch; (rows read, rows stored)."""
        name = self.name
        batch = await self.feed.pending(name, self.batch_now)
        if not batch.rows:
            return 0, 0
        self._checking = False  # rows lack their vectors: work, whatever woke the actor
        texts = [t for _, t in batch.rows]
        digests = [text_digest(t) for t in texts]
        vectors = await self.feed.cached(name, digests)
        self.cache_hits += sum(d in vectors for d in digests)
        missing = {d: t for d, t in zip(digests, texts, strict=True) if d not in vectors}
        if missing:
            embedded = await self._embed(list(missing.values()))
            vectors.update(zip(missing, embedded, strict=True))
        rows = [
            VectorRow(id=i, digest=d, vector=vectors[d])
            for (i, _), d in zip(batch.rows, digests, strict=True)
        ]
        stored, skipped = await self.feed.store(name, batch, rows)
        self.stored += stored
        self.skipped += skipped
        return len(rows), stored

    async def _embed(self, texts: Sequence[str]) -> list[bytes]:
        """The embedder's vectors as stored BLOBs; any failure is `EmbedderFailed`."""
        self.embed_calls += 1
        background = BACKGROUND.set(True)  # the backlog yields the CPU to queries
        try:
            with anyio.fail_after(self.timeout):
                deadline = anyio.current_time() + self.timeout
                matrix = await self.embedder.embed(texts, deadline=deadline)
        except TimeoutError:
            raise EmbedderTimedOut(
                f"{self.name}: no answer within {self.timeout:g} s", len(texts)
            ) from None
        except EmbeddingError as exc:
            raise EmbedderFailed(str(exc)) from exc
        except Exception as exc:  # fail-open: a broken embedder never takes the memory down
            raise EmbedderFailed(f"{self.name}: {type(exc).__name__}: {exc}") from exc
        finally:
            BACKGROUND.reset(background)
        array = numpy.asarray(matrix)
        dim = self.embedder.dim
        if array.shape != (len(texts), dim) or not numpy.all(numpy.isfinite(array)):
            raise EmbedderFailed(
                f"{self.name}: expected {len(texts)} finite vectors of {dim} dimensions,"
                f" got shape {array.shape}"
            )
        self.texts_embedded += len(texts)
        return [to_blob(row) for row in array]
