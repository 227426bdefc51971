"""The supervisor: the one place where actors are created and wired (docs/design.md §1.2).

It owns the task group of every actor. Agent databases are opened lazily, the first time a
session of that agent is used; each gets its writer lock, an indexer actor with its bounded
inbox, and a small pool of reader connections (`READERS`; and, with an embedder, an
embedder actor with its own reader). The records store (`records.db`, one for all agents) is
opened the same way on its first use, with the records keeper as its single writer (and,
with an embedder, its own embedder actor, docs/design.md §5.7); both are a `Database`
handle. A crashed actor is never silently lost: its exception propagates out of
`open_memory()`.

Read-only (`open_memory(readonly=True)`, docs/design.md §1.6): each database is only its
reader connections — no writer lock, no writer, no reconciler, no embedder actor — and every
write is refused with `readonly_error`; on PostgreSQL the same, on connections the server
itself keeps read-only (docs/design.md §11 "Read-only")."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar, cast

import anyio
import apsw
import msgspec
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from ..protocol.embedder import EmbedPoke
from ..protocol.embeddings import Embedder
from ..protocol.errors import InvalidInputError, MemoryClosedError, StorageError
from ..protocol.indexer import (
    Appended,
    Imported,
    IndexerAck,
    IndexerCommand,
    NotesSynced,
    Rebuilt,
    Reindexed,
)
from ..protocol.reconciler import Poke
from ..protocol.records import RecordAck, RecordAdded, RecordCommand
from ..protocol.transcript import IndexStats
from ..storage.control import Spool
from ..storage.db import (
    Durability,
    WriterLock,
    ensure_state_dir,
    open_connection,
    readonly_error,
    translate_errors,
)
from ..storage.executor import Executor, ExecutorKind, end_threads, make_executor, run_once
from ..storage.records import (
    RECORDS_DB,
    RecordReader,
    RecordWriter,
    open_records_connection,
    records_db_path,
)
from ..storage.transcripts import TranscriptReader, TranscriptWriter, agent_db_path
from ..storage.vector_index import VectorFeed, VectorIndexes, attach, detach
from .control import ControlActor, Handle
from .embedder import ALWAYS_HELD, AgentFeed, EmbedderActor, Lease, RecordFeed
from .embedder import VectorFeed as EmbedderFeed
from .embedder import open_inbox as embedder_inbox
from .group_commit import MAX_BATCH, A, C, GroupCommit, StorageWriter
from .indexer import Indexer
from .notes_watcher import NotesWatcher
from .recall_pool import RecallPool
from .recall_pool import open_inbox as recall_pool_inbox
from .reconciler import ReadDirty, Reconciler, Submit
from .reconciler import open_inbox as reconciler_inbox
from .records import RecordKeeper

if TYPE_CHECKING:
    from ..storage.pg.db import PgSettings
    from ..storage.pg.lease import Leases
    from ..storage.pg.store import PgStore

T = TypeVar("T")

READERS = 3
"""Reader connections per open agent database (docs/design.md §1.3): WAL readers run in
parallel and apsw releases the GIL inside SQLite, so concurrent recalls of one agent no
longer queue on one connection. Three: a search is mostly CPU, and two cores are the common
host; a third covers one slow read (a stats scan, a vector index load) without stalling the
rest. `records.db` keeps one reader: its page cache is 64 MiB (`READER_CACHE_KIB`), which a
pool would multiply."""


class _Reader(Protocol):
    @property
    def conn(self) -> apsw.Connection: ...


R = TypeVar("R", bound=_Reader)


@dataclass(kw_only=True)
class PooledReader(Generic[R]):
    """One reader connection of a database's pool, its executor, and the reads under way."""

    reader: R
    executor: Executor
    busy: int = 0


@dataclass(kw_only=True)
class Database(Generic[R, C, A]):
    """Everything open for one database: its single writer (`actor`), its readers and lock.

    `readers` is the pool of reader connections (`READERS`, docs/design.md §1.3); `reader`
    and `read_executor` are its first, the one an idle database reads on. Opened read-only
    (docs/design.md §1.6) it has readers alone: `actor` and `lock` are None, and `submit`
    raises `StorageError` naming readonly.
    """

    path: Path
    actor: GroupCommit[C, A] | None
    readers: tuple[PooledReader[R], ...]
    lock: WriterLock | None
    state_dir: Path
    stopped: anyio.Event = field(default_factory=anyio.Event)

    @property
    def reader(self) -> R:
        """The pool's first reader connection."""
        return self.readers[0].reader

    @property
    def read_executor(self) -> Executor:
        """The executor of the pool's first reader (for reads of files, not of SQLite)."""
        return self.readers[0].executor

    @property
    def readonly(self) -> bool:
        """Opened by `open_memory(readonly=True)`: readers alone."""
        return self.actor is None

    def writer(self) -> GroupCommit[C, A]:
        """The writer actor; `StorageError` naming readonly when there is none."""
        if self.actor is None:
            raise readonly_error(self.state_dir)
        return self.actor

    async def submit(self, command: C) -> A:
        """Queue `command` for the writer and wait for its ack (`GroupCommit.submit`)."""
        return await self.writer().submit(command)

    async def read(self, fn: Callable[[R], T]) -> T:
        """Run `fn` on the least busy reader of the pool; SQLite errors become `StorageError`.

        Each call is its own read (its own snapshot); ties go to the first reader, so an
        idle database keeps reading on one warm connection.

        Cancellation: a read that has started finishes on its worker; nothing is left behind.
        """
        pooled = min(self.readers, key=lambda p: p.busy)

        def run() -> T:
            with translate_errors(self.path):
                return fn(pooled.reader)

        pooled.busy += 1
        try:
            return await pooled.executor.run(run)
        finally:
            pooled.busy -= 1

    async def run_writer(self) -> None:
        """The writer's loop (a task of the supervisor); `stopped` is set when it ends."""
        try:
            await self.writer().run()
        finally:
            self.stopped.set()

    async def close_inbox(self) -> None:
        """Close the writer's inbox (it drains what is queued, then stops)."""
        if self.actor is not None:
            await self.actor.close_inbox()

    async def close(self) -> None:
        """Once the writer has stopped (its inbox closed and drained): close the connections,
        every pooled reader's too."""
        if self.actor is not None:
            await self.stopped.wait()
            await self.actor.executor.run(self.actor.writer.conn.close)
        for pooled in self.readers:
            await pooled.executor.run(pooled.reader.conn.close)
        if self.lock is not None:
            self.lock.release()
        await end_threads(self.executors())

    def executors(self) -> list[Executor]:
        """Every executor of this database (each connection's thread), for `close`."""
        own = [] if self.actor is None else [self.actor.executor]
        return own + [pooled.executor for pooled in self.readers]


@dataclass(kw_only=True)
class VectorDatabase(Database[R, C, A]):
    """A database whose rows get vectors in the background: its embedder actor (None: no
    embedder configured, or read-only) and the actor's own reader (docs/design.md §2.3)."""

    embedder: EmbedderActor[Any] | None = None
    embed_pokes: MemoryObjectSendStream[EmbedPoke] | None = None
    embedder_scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    embedder_stopped: anyio.Event = field(default_factory=anyio.Event)
    # The embedder actor's own reader: its scans for missing vectors (tens of ms at 100k
    # rows) never queue in front of a recall's reads on `reader`.
    embedder_reader: R | None = None
    embedder_read_executor: Executor | None = None

    async def read_for_embedder(self, fn: Callable[[R], T]) -> T:
        """Run `fn` on the embedder actor's reader; SQLite errors become `StorageError`.

        Cancellation: as for `read`.
        """
        reader, executor = self.embedder_reader, self.embedder_read_executor
        assert reader is not None and executor is not None

        def run() -> T:
            with translate_errors(self.path):
                return fn(reader)

        return await executor.run(run)

    async def close(self) -> None:
        """Close the embedder actor's reader (it has stopped), then the database."""
        await self.embedder_stopped.wait()
        if self.embedder_reader is not None and self.embedder_read_executor is not None:
            await self.embedder_read_executor.run(self.embedder_reader.conn.close)
        for pooled in self.readers:  # the shared vector index goes now, not when collected
            detach(pooled.reader.conn)
        await super().close()

    def executors(self) -> list[Executor]:
        own = self.embedder_read_executor
        return super().executors() + ([] if own is None else [own])

    def poke_embedder(self, reason: Literal["start", "write"]) -> None:
        """Tell the embedder actor vectors may be missing; never blocks (one slot)."""
        if self.embed_pokes is not None:
            # Closed or broken: the actor has stopped (shutdown); nobody needs the poke.
            with contextlib.suppress(
                anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError
            ):
                self.embed_pokes.send_nowait(EmbedPoke(reason=reason))
                if self.embedder is not None:
                    self.embedder.poke_sent()

    def vectors_pending(self) -> bool:
        """Whether the embedder actor is at work or has work queued (docs/design.md §2.3):
        a field read, for memory_search's `vectorsPending`. False without an embedder."""
        return self.embedder is not None and self.embedder.working()


@dataclass(kw_only=True)
class AgentStore(VectorDatabase[TranscriptReader, IndexerCommand, IndexerAck]):
    """Everything open for one agent database, with the reconciler of its index."""

    agent: str
    # None when read-only: nothing rebuilds; a dirty session stays hidden from this
    # memory's searches until the writer's reconciler has rebuilt it.
    reconciler: Reconciler | None
    pokes: MemoryObjectSendStream[Poke] | None
    reconciler_stopped: anyio.Event = field(default_factory=anyio.Event)
    embedder: EmbedderActor[AgentFeed] | None = None
    # The readers' in-memory vector index (None: read-only, or PostgreSQL).
    vector_index: VectorIndexes | None = None

    async def submit(self, command: IndexerCommand) -> IndexerAck:
        """Queue `command` for the indexer and wait for its ack; a write that may have
        added indexed rows pokes the embedder actor (after its commit, never waiting)."""
        ack = await self.writer().submit(command)
        if self.embed_pokes is not None and _may_need_vectors(ack):
            self.poke_embedder("write")
        return ack

    async def index_stats(self, *, check_integrity: bool = True) -> IndexStats:
        """The database's `IndexStats`, with the embedder's lag and last error."""
        name = None if self.embedder is None else self.embedder.name
        # The watermark before the read: what it covers was committed before the snapshot.
        after, epoch = (0, None) if self.embedder is None else self.embedder.watermark()
        stats = await self.read(
            lambda reader: reader.stats(
                check_integrity=check_integrity,
                vector_name=name,
                vector_after=after,
                vector_epoch=epoch,
            )
        )
        if self.embedder is None:
            return stats
        return msgspec.structs.replace(
            stats,
            embedder_error=self.embedder.last_error,
            embedder_lease=self.embedder.holds_lease(),
        )

    def poke(self, reason: Literal["search", "dirty"] = "search") -> None:
        """Tell the reconciler there may be dirty sessions; never blocks.

        A poke already waiting means the same, so a full inbox drops this one.
        """
        if self.pokes is None:
            return  # read-only: the writer's own reconciler does the rebuilding
        with contextlib.suppress(
            anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError
        ):
            self.pokes.send_nowait(Poke(reason=reason))

    async def read_dirty(self, limit: int) -> list[tuple[str, int]]:
        return await self.read(lambda reader: reader.dirty_sessions(limit))


@dataclass(kw_only=True)
class ReadSlot:
    """One of a PostgreSQL agent's read executors and the reads under way on it."""

    executor: Executor
    busy: int = 0


async def _on_least_busy(slots: tuple[ReadSlot, ...], run: Callable[[], T]) -> T:
    """Run `run` on the executor of the slot with the fewest reads under way (ties: the
    first). Cancellation: a read that has started finishes on its worker."""
    slot = min(slots, key=lambda s: s.busy)
    slot.busy += 1
    try:
        return await slot.executor.run(run)
    finally:
        slot.busy -= 1


@dataclass(kw_only=True)
class PgAgentStore(AgentStore):
    """An agent of the PostgreSQL store (docs/design.md §11 "Wiring"): the same writer
    actor over a `PgTranscriptWriter`, no writer lock (several processes may write one
    agent: the writer's row locks order them), and reads on connections of the store's pool,
    each read one snapshot on a connection taken for its length. `READERS` executors, as an
    SQLite agent has, so concurrent recalls of one agent read side by side."""

    pg: PgStore
    slots: tuple[ReadSlot, ...]

    @property
    def read_executor(self) -> Executor:
        """The first read executor (for reads of files, not of the store)."""
        return self.slots[0].executor

    def executors(self) -> list[Executor]:
        return super().executors() + [slot.executor for slot in self.slots]

    async def read(self, fn: Callable[[TranscriptReader], T]) -> T:
        """Run `fn` with a reader of this agent on the least busy executor; a pool
        connection for its length; errors become `StorageError` (the server's answer).

        Cancellation: a read that has started finishes on its worker; nothing is left behind.
        """
        # The PostgreSQL reader has every method of `storage/reads.TranscriptReads`.
        return await _on_least_busy(
            self.slots, partial(self.pg.read, self.agent, cast(Callable[[Any], T], fn))
        )


@dataclass(frozen=True, kw_only=True)
class ServerLease:
    """An embedder actor's lease on the PostgreSQL store (storage/pg/lease.py, docs/design.md
    §11 "One embedder per agent"): lease `key` of the store's `leases`, claimed on the
    leases' executor every `period` seconds."""

    leases: Leases
    key: int
    executor: Executor
    period: float

    async def claim(self) -> bool:
        return await self.executor.run(partial(self.leases.claim, self.key))

    async def release(self) -> None:
        await self.executor.run(partial(self.leases.release, self.key))


def _may_need_vectors(ack: IndexerAck) -> bool:
    """Whether a committed write may have added rows that need a vector (docs/design.md §2.3)."""
    match ack:
        case Appended(indexed=True) | Imported() | Rebuilt() | NotesSynced():
            return True
        case Reindexed(clean=True):
            return True
        case _:
            return False


@dataclass(kw_only=True)
class RecordsDatabase(VectorDatabase[RecordReader, RecordCommand, RecordAck]):
    """`state_dir/records.db` (docs/design.md §5): its keeper, its reader and, with an
    embedder, the records embedder actor (§5.7)."""

    embedder: EmbedderActor[RecordFeed] | None = None

    async def submit(self, command: RecordCommand) -> RecordAck:
        """Queue `command` for the keeper and wait for its ack; a stored record pokes the
        embedder actor (after its commit, never waiting)."""
        ack = await self.writer().submit(command)
        if isinstance(ack, RecordAdded):
            self.poke_embedder("write")
        return ack

    async def vector_lag(self) -> tuple[int, str | None]:
        """(records waiting for a vector, the embedder's last error); (0, None) without
        an embedder. Exact once the actor is idle."""
        if self.embedder is None:
            return 0, None
        pending = await self.embedder.feed.pending_count(self.embedder.name)
        return pending, self.embedder.last_error


@dataclass(kw_only=True)
class PgRecordsDatabase(RecordsDatabase):
    """The records of the PostgreSQL store (docs/design.md §11 "Wiring"): the same records
    keeper over a `PgRecordWriter` on a connection of its own, no writer lock (several
    processes may write the records: the server orders them), with an embedder the records
    embedder actor (record vectors on the server, storage/pg/record_vectors.py), and reads
    on connections of the store's pool, each read one snapshot on a connection taken for
    its length."""

    pg: PgStore
    slots: tuple[ReadSlot, ...]

    @property
    def read_executor(self) -> Executor:
        """The first read executor (for reads of files, not of the store)."""
        return self.slots[0].executor

    def executors(self) -> list[Executor]:
        return super().executors() + [slot.executor for slot in self.slots]

    async def read(self, fn: Callable[[RecordReader], T]) -> T:
        """Run `fn` with a records reader on the least busy executor; a pool connection
        for its length; errors become `StorageError` (the server's answer).

        Cancellation: a read that has started finishes on its worker; nothing is left behind.
        """
        # The PostgreSQL reader has every method of `RecordReader` the API layer calls.
        return await _on_least_busy(
            self.slots, partial(self.pg.read_records, cast(Callable[[Any], T], fn))
        )


class Supervisor:
    """Starts, wires and stops the actors of one `open_memory()`."""

    def __init__(
        self,
        task_group: TaskGroup,
        state_dir: Path,
        executor: ExecutorKind,
        *,
        durability: Durability = "crash",
        max_batch: int = MAX_BATCH,
        embedder: Embedder | None = None,
        readonly: bool = False,
        pg: PgStore | None = None,
    ) -> None:
        self._tg = task_group
        # The PostgreSQL store (docs/design.md §11); None: SQLite files in `state_dir`.
        self.pg = pg
        self.readonly = readonly
        # Read-only: no embedder actor makes vectors (the query side still embeds queries).
        self.embedder = None if readonly else embedder
        self.durability: Durability = durability
        self.state_dir = state_dir
        self.executor_kind: ExecutorKind = executor
        self.max_batch = max_batch
        self._agents: dict[str, AgentStore] = {}
        self._records: RecordsDatabase | None = None
        # Where the embedder actors' leases are claimed (PostgreSQL; made at the first).
        self._lease_executor: Executor | None = None
        self._opening = anyio.Lock()
        self._closed = False
        self.recall_inbox, recall_receive = recall_pool_inbox()
        self.recall_pool = RecallPool(recall_receive)
        self._recall_pool_stopped = anyio.Event()
        task_group.start_soon(self._run_recall_pool, name="recall-pool")
        self._control_scope = anyio.CancelScope()
        self._control_stopped = anyio.Event()
        self._control_stopped.set()  # until `serve_control` starts the actor
        # The notes watchers (docs/design.md §4.7), each with its cancel scope and end.
        self._watchers: list[tuple[anyio.CancelScope, anyio.Event]] = []

    def serve_control(self, handle: Handle) -> None:
        """Serve other processes' control requests with `handle` (docs/design.md §1.7):
        only a writer open with the thread executor (virtual time has no timers to spare),
        and only the first such open of the state directory (`serve.lock`)."""
        if self.readonly or self.executor_kind != "thread":
            return
        spool = Spool(self.state_dir)
        if spool.serve():
            self._control_stopped = anyio.Event()
            self._tg.start_soon(self._run_control, ControlActor(spool, handle), name="control")

    async def _run_control(self, actor: ControlActor) -> None:
        try:
            with self._control_scope:
                await actor.run()
        finally:
            self._control_stopped.set()

    def start_watcher(self, watcher: NotesWatcher) -> None:
        """Run a notes watcher until the memory closes (it is cancelled then: it writes
        through the indexer, which drains and closes after it). Nothing once closing."""
        if self._closed:
            return
        scope, stopped = anyio.CancelScope(), anyio.Event()
        self._watchers.append((scope, stopped))
        self._tg.start_soon(
            self._run_watcher, watcher, scope, stopped, name=f"notes-watcher:{watcher.agent}"
        )

    async def _run_watcher(
        self, watcher: NotesWatcher, scope: anyio.CancelScope, stopped: anyio.Event
    ) -> None:
        try:
            with scope:
                await watcher.run()
        finally:
            stopped.set()

    async def _run_recall_pool(self) -> None:
        try:
            await self.recall_pool.run()
        finally:
            self._recall_pool_stopped.set()

    async def agent(self, agent: str) -> AgentStore:
        """The open store of `agent`, opening it on first use."""
        store = self._agents.get(agent)
        if store is not None:
            return store
        async with self._opening:
            if self._closed:
                raise MemoryClosedError("the memory is closed")
            store = self._agents.get(agent)
            if store is None:
                store = await self._open_agent(agent)
                self._agents[agent] = store
        return store

    async def records(self) -> RecordsDatabase:
        """The open records store, opening it on first use."""
        if self._records is not None and not self._closed:
            return self._records
        async with self._opening:
            if self._closed:
                raise MemoryClosedError("the memory is closed")
            if self._records is None:
                self._records = await self._open_records()
        return self._records

    async def records_with_vectors(self) -> RecordsDatabase | None:
        """The records store when it has an embedder actor (opening it if `records.db`
        exists); None when there is nothing to embed there: no embedder, read-only, or no
        records store yet (never creates one)."""
        if self.embedder is None or self.readonly:
            return None
        return await self.stored_records()

    async def stored_records(self) -> RecordsDatabase | None:
        """The records store, opening it on first use, if there is one; None when
        `records.db` does not exist (never created just to be found empty). On PostgreSQL
        the records tables are part of the schema: always there."""
        stored = self.pg is not None or self._records is not None
        if not stored and not records_db_path(self.state_dir).exists():
            return None
        return await self.records()

    async def _open_records(self) -> RecordsDatabase:
        if self.pg is not None:
            return await self._open_pg_records(self.pg)
        path = records_db_path(self.state_dir)
        actor, readers, lock = await self._open(
            path, open_records_connection, RecordWriter, RecordKeeper, readers=1
        )
        embedder_reader: RecordReader | None = None
        embedder_executor: Executor | None = None
        if actor is not None and self.embedder is not None:  # before any task starts
            embedder_executor = make_executor(self.executor_kind, "embedder-reader")
            try:
                conn = await embedder_executor.run(
                    lambda: open_records_connection(path, writer=False)
                )
            except BaseException:
                await actor.executor.run(actor.writer.conn.close)
                _close_all(readers)
                if lock is not None:
                    lock.release()
                raise
            embedder_reader = RecordReader(conn)
        records = RecordsDatabase(
            path=path,
            actor=actor,
            readers=tuple(PooledReader(reader=RecordReader(c), executor=e) for c, e in readers),
            lock=lock,
            state_dir=self.state_dir,
            embedder_reader=embedder_reader,
            embedder_read_executor=embedder_executor,
        )
        if actor is not None:
            self._tg.start_soon(records.run_writer, name="records-keeper")
        self._start_embedder(
            records,
            RecordFeed(submit=records.submit, read=records.read_for_embedder),
            ALWAYS_HELD,
            name="embedder:records",
        )
        return records

    def _start_embedder(
        self,
        store: VectorDatabase[Any, Any, Any],
        feed: EmbedderFeed,
        lease: Lease,
        *,
        name: str,
    ) -> None:
        """With an embedder and a writer, the database's embedder actor (docs/design.md
        §2.3, §5.7) over `feed` (its reads on an executor of its own, its vectors stored
        through the database's writer), embedding while it holds `lease` (§11 "One
        embedder per agent")."""
        if store.actor is None or self.embedder is None:
            store.embedder_stopped.set()
            return
        embed_send, embed_receive = embedder_inbox()
        store.embed_pokes = embed_send
        store.embedder = EmbedderActor(
            embed_receive, embedder=self.embedder, feed=feed, lease=lease
        )
        self._tg.start_soon(self._run_embedder, store, name=name)
        store.poke_embedder("start")

    def _server_lease(self, pg: PgStore, tenant: str) -> Lease:
        """The embedder lease of `tenant` (an agent, or the records' tenant) on the
        PostgreSQL store, claimed every `lease.PERIOD` seconds (read now: a test sets it)."""
        from ..storage.pg import lease

        if self._lease_executor is None:
            self._lease_executor = make_executor(self.executor_kind, "leases")
        return ServerLease(
            leases=pg.leases,
            key=lease.lease_key("embedder", tenant),
            executor=self._lease_executor,
            period=lease.PERIOD,
        )

    async def _open_pg_records(self, pg: PgStore) -> RecordsDatabase:
        """The records of the PostgreSQL store: the records keeper over a `PgRecordWriter`
        (no lock: docs/design.md §11 "Several processes") and, with an embedder, the
        records embedder actor reading on an executor of its own. Read-only: the reads
        alone (docs/design.md §11 "Read-only")."""
        from ..storage.pg.store import RECORDS_TENANT

        actor = None
        if not self.readonly:
            write_executor = make_executor(self.executor_kind, "writer")
            writer = await write_executor.run(pg.record_writer)
            actor = RecordKeeper(
                cast(StorageWriter[RecordCommand, RecordAck], writer),
                write_executor,
                max_batch=self.max_batch,
            )
        records = PgRecordsDatabase(
            path=Path("postgresql:records"),
            actor=actor,
            readers=(),
            lock=None,
            state_dir=self.state_dir,
            pg=pg,
            # `READERS`, not SQLite's one reader (kept to one for its page cache): here the
            # pool holds the connections, so concurrent recalls' searches read side by side.
            slots=tuple(
                ReadSlot(executor=make_executor(self.executor_kind, "reader"))
                for _ in range(READERS)
            ),
        )
        if actor is not None:
            self._tg.start_soon(records.run_writer, name="records-keeper")
        own = (ReadSlot(executor=make_executor(self.executor_kind, "embedder-reader")),)
        feed = RecordFeed(
            submit=records.submit,
            read=lambda fn: _on_least_busy(own, partial(pg.read_records, cast(Any, fn))),
        )
        self._start_embedder(
            records, feed, self._server_lease(pg, RECORDS_TENANT), name="embedder:records"
        )
        return records

    async def _open(
        self,
        path: Path,
        connect: Callable[..., apsw.Connection],
        make_writer: Callable[[apsw.Connection], StorageWriter[C, A]],
        make_actor: type[GroupCommit[C, A]],
        *,
        readers: int,
    ) -> tuple[GroupCommit[C, A] | None, list[tuple[apsw.Connection, Executor]], WriterLock | None]:
        """The single writer of `path` (holding its writer lock) and `readers` reader
        connections, each on its own executor; `connect` opens a connection and migrates the
        writer's. Read-only: the readers alone (docs/design.md §1.6), no writer and no lock."""
        if self.readonly:
            return None, await self._open_readers(path, connect, readers, readonly=True), None
        write_executor = make_executor(self.executor_kind, "writer")
        lock = WriterLock(path)

        def open_writer() -> StorageWriter[C, A]:
            try:  # an agent's folder, on its first use (records.db's is the state directory)
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise StorageError(f"cannot create {str(path.parent)!r} ({exc.strerror})") from None
            lock.acquire()
            try:
                return make_writer(connect(path, writer=True, durability=self.durability))
            except BaseException:
                lock.release()
                raise

        writer = await write_executor.run(open_writer)
        try:
            conns = await self._open_readers(path, connect, readers, readonly=False)
        except BaseException:
            writer.conn.close()
            lock.release()
            raise
        actor = make_actor(writer, write_executor, max_batch=self.max_batch)
        return actor, conns, lock

    async def _open_readers(
        self, path: Path, connect: Callable[..., apsw.Connection], count: int, *, readonly: bool
    ) -> list[tuple[apsw.Connection, Executor]]:
        """`count` reader connections of `path`, each with its executor; if one cannot be
        opened, those already open are closed."""
        readers: list[tuple[apsw.Connection, Executor]] = []
        try:
            for _ in range(count):
                executor = make_executor(self.executor_kind, "reader")
                if readonly:
                    conn = await executor.run(lambda: connect(path, writer=False, readonly=True))
                else:
                    conn = await executor.run(lambda: connect(path, writer=False))
                readers.append((conn, executor))
        except BaseException:
            for conn, _ in readers:
                conn.close()
            raise
        return readers

    def open_agents(self) -> list[AgentStore]:
        return list(self._agents.values())

    async def known_agents(self) -> list[str]:
        """Agents with a database in the state directory, open or not (read-only: on disk
        only; an agent with no database reads as empty and is not listed). On PostgreSQL:
        the agents with a session in the store, and those open here."""
        if self.pg is not None:
            stored = await run_once(self.executor_kind, self.pg.agents)
            return sorted(set(stored) | set(self._agents))
        if self.readonly:
            return agents_on_disk(self.state_dir)
        return sorted(set(agents_on_disk(self.state_dir)) | set(self._agents))

    async def _open_agent(self, agent: str) -> AgentStore:
        if self.pg is not None:
            return await self._open_pg_agent(agent, self.pg)
        path = agent_db_path(self.state_dir, agent)
        actor, conns, lock = await self._open(
            path, open_connection, TranscriptWriter, Indexer, readers=READERS
        )
        readers = tuple(
            PooledReader(reader=TranscriptReader(c, agent), executor=e) for c, e in conns
        )
        if actor is None:  # read-only: readers alone (docs/design.md §1.6)
            store = AgentStore(
                agent=agent,
                path=path,
                actor=None,
                readers=readers,
                lock=None,
                state_dir=self.state_dir,
                reconciler=None,
                pokes=None,
            )
            store.embedder_stopped.set()
            return store  # no vector index: a writer in another process feeds nothing here
        assert lock is not None
        # The in-memory vector index of the readers' searches, fed by the writer's commits
        # (storage/vector_index.py, docs/design.md §2.3); installed before the first write.
        # One index shared by every pooled reader: one matrix in memory, loaded once
        # (docs/design.md §2.3, "The vector index").
        feed = VectorFeed()
        await actor.executor.run(lambda: feed.install(actor.writer.conn))
        indexes = VectorIndexes(feed)
        for conn, _ in conns:
            attach(conn, indexes)
        embedder_reader: TranscriptReader | None = None
        embedder_executor: Executor | None = None
        if self.embedder is not None:  # before any task starts: a failure leaves nothing
            embedder_executor = make_executor(self.executor_kind, "embedder-reader")
            try:
                conn = await embedder_executor.run(lambda: open_connection(path, writer=False))
            except BaseException:
                await actor.executor.run(actor.writer.conn.close)
                _close_all(conns)
                lock.release()
                raise
            embedder_reader = TranscriptReader(conn, agent)
        poke_send, poke_receive = reconciler_inbox()
        store = AgentStore(
            agent=agent,
            path=path,
            actor=actor,
            readers=readers,
            lock=lock,
            state_dir=self.state_dir,
            reconciler=Reconciler(
                poke_receive, submit=self._submit_for(agent), read_dirty=self._read_dirty_for(agent)
            ),
            pokes=poke_send,
            embedder_reader=embedder_reader,
            embedder_read_executor=embedder_executor,
            vector_index=indexes,
        )
        self._tg.start_soon(store.run_writer, name=f"indexer:{agent}")
        self._tg.start_soon(self._run_reconciler, store, name=f"reconciler:{agent}")
        missing = AgentFeed(
            agent=agent, submit=self._submit_for(agent), read=store.read_for_embedder
        )
        self._start_embedder(store, missing, ALWAYS_HELD, name=f"embedder:{agent}")
        return store

    async def _open_pg_agent(self, agent: str, pg: PgStore) -> AgentStore:
        """An agent of the PostgreSQL store: its writer actor (no lock: docs/design.md §11
        "Several processes"), reconciler and, with an embedder, embedder actor (it embeds
        while this process holds the agent's lease: §11 "One embedder per agent").
        Read-only: its reads alone (docs/design.md §11 "Read-only")."""
        slots = tuple(
            ReadSlot(executor=make_executor(self.executor_kind, "reader")) for _ in range(READERS)
        )
        if self.readonly:
            store = PgAgentStore(
                agent=agent,
                path=Path(f"postgresql:{agent}"),
                actor=None,
                readers=(),
                lock=None,
                state_dir=self.state_dir,
                reconciler=None,
                pokes=None,
                pg=pg,
                slots=slots,
            )
            store.embedder_stopped.set()
            return store
        write_executor = make_executor(self.executor_kind, "writer")
        writer = await write_executor.run(lambda: pg.writer(agent))
        actor = Indexer(
            cast(StorageWriter[IndexerCommand, IndexerAck], writer),
            write_executor,
            max_batch=self.max_batch,
        )
        poke_send, poke_receive = reconciler_inbox()
        store = PgAgentStore(
            agent=agent,
            path=Path(f"postgresql:{agent}"),
            actor=actor,
            readers=(),
            lock=None,
            state_dir=self.state_dir,
            reconciler=Reconciler(
                poke_receive, submit=self._submit_for(agent), read_dirty=self._read_dirty_for(agent)
            ),
            pokes=poke_send,
            pg=pg,
            slots=slots,
        )
        self._tg.start_soon(store.run_writer, name=f"indexer:{agent}")
        self._tg.start_soon(self._run_reconciler, store, name=f"reconciler:{agent}")
        # The embedder actor's scans read on an executor of their own, as on SQLite, so
        # they never queue a recall's read behind them.
        own = (ReadSlot(executor=make_executor(self.executor_kind, "embedder-reader")),)
        feed = AgentFeed(
            agent=agent,
            submit=self._submit_for(agent),
            read=lambda fn: _on_least_busy(own, partial(pg.read, agent, cast(Any, fn))),
        )
        # One process embeds the agent at a time: the holder of its lease (§11).
        self._start_embedder(store, feed, self._server_lease(pg, agent), name=f"embedder:{agent}")
        return store

    def _submit_for(self, agent: str) -> Submit:
        async def submit(command: IndexerCommand) -> IndexerAck:
            return await self._agents[agent].submit(command)

        return submit

    def _read_dirty_for(self, agent: str) -> ReadDirty:
        async def read_dirty(limit: int) -> list[tuple[str, int]]:
            return await self._agents[agent].read_dirty(limit)

        return read_dirty

    async def _run_reconciler(self, store: AgentStore) -> None:
        assert store.reconciler is not None
        try:
            await store.reconciler.run()
        finally:
            store.reconciler_stopped.set()

    async def _run_embedder(self, store: VectorDatabase[Any, Any, Any]) -> None:
        assert store.embedder is not None
        try:
            with store.embedder_scope:
                await store.embedder.run()
        finally:
            store.embedder_stopped.set()

    async def aclose(self) -> None:
        """Stop every actor after it has drained its inbox; close the databases.

        Cancellation: shielded by `open_memory()`, so queued commands are still committed.
        """
        async with self._opening:
            self._closed = True
        # A control request uses every writer: it ends first (answered with an error).
        self._control_scope.cancel()
        await self._control_stopped.wait()
        # The notes watchers write through the indexers: cancelled (an edit not yet synced
        # is found by the next open's first search).
        for scope, _ in self._watchers:
            scope.cancel()
        for _, stopped in self._watchers:
            await stopped.wait()
        # Recall runs read the agent databases: they end first (cancelled if still running).
        await self.recall_inbox.aclose()
        await self._recall_pool_stopped.wait()
        # The records embedder actor is cancelled (as the agents' below); nothing else
        # writes records then: the keeper drains its inbox and closes now.
        if self._records is not None:
            if self._records.embed_pokes is not None:
                await self._records.embed_pokes.aclose()
            self._records.embedder_scope.cancel()
            await self._records.embedder_stopped.wait()
            await self._records.close_inbox()
            await self._records.close()
        # The embedder actor writes through the indexer too; it is cancelled, not drained:
        # a hanging embedder must not hold the memory open, and missing vectors are made up
        # at the next start.
        for store in self._agents.values():
            if store.embed_pokes is not None:
                await store.embed_pokes.aclose()
            store.embedder_scope.cancel()
        for store in self._agents.values():
            await store.embedder_stopped.wait()
        # The reconciler writes through the indexer, so it stops first (after its chunk).
        for store in self._agents.values():
            if store.reconciler is not None and store.pokes is not None:
                store.reconciler.stopping = True
                await store.pokes.aclose()
            else:  # read-only: there is none
                store.reconciler_stopped.set()
        for store in self._agents.values():
            await store.reconciler_stopped.wait()
        for store in self._agents.values():
            await store.close_inbox()
        for store in self._agents.values():
            await store.close()


@contextlib.asynccontextmanager
async def open_supervisor(
    state_dir: Path,
    executor: ExecutorKind,
    *,
    durability: Durability = "crash",
    max_batch: int = MAX_BATCH,
    embedder: Embedder | None = None,
    readonly: bool = False,
    pg: PgSettings | None = None,
) -> AsyncIterator[Supervisor]:
    """Run a supervisor for the duration of the block; with `embedder`, each agent
    database also gets an embedder actor (docs/design.md §2.3). `readonly`: readers alone,
    on a state directory that must already hold a store (docs/design.md §1.6). `pg`: the
    transcripts are in that PostgreSQL store (docs/design.md §11), connected to (and its
    schema made or checked) before anything starts; the state directory keeps the rest
    (read-only, `pg.readonly`: the schema must exist; the state directory need not)."""
    store: PgStore | None = None
    if pg is not None:  # first: a server that cannot be used leaves no state directory
        from ..storage.pg.store import PgStore

        store = await run_once(executor, lambda: PgStore.open(pg))
    try:
        if not readonly:
            ensure_state_dir(state_dir)
        elif store is None:  # read-only on PostgreSQL: the server was checked to hold one
            require_store(state_dir)
        async with _supervised(
            state_dir,
            executor,
            durability=durability,
            max_batch=max_batch,
            embedder=embedder,
            readonly=readonly,
            pg=store,
        ) as supervisor:
            yield supervisor
    finally:
        if store is not None:
            with anyio.CancelScope(shield=True):
                await run_once(executor, store.close)


@contextlib.asynccontextmanager
async def _supervised(
    state_dir: Path,
    executor: ExecutorKind,
    *,
    durability: Durability,
    max_batch: int,
    embedder: Embedder | None,
    readonly: bool,
    pg: PgStore | None,
) -> AsyncIterator[Supervisor]:
    try:
        async with anyio.create_task_group() as tg:
            supervisor = Supervisor(
                tg,
                state_dir,
                executor,
                durability=durability,
                max_batch=max_batch,
                embedder=embedder,
                readonly=readonly,
                pg=pg,
            )
            try:
                yield supervisor
            finally:
                with anyio.CancelScope(shield=True):
                    await supervisor.aclose()
    except BaseExceptionGroup as group:
        # The host's own exception comes back wrapped by the task group; hand it back as
        # raised so `except am.StorageError:` around the block keeps working.
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


def _close_all(readers: list[tuple[apsw.Connection, Executor]]) -> None:
    """Close reader connections that no task uses yet (an open that failed half-way)."""
    for conn, _ in readers:
        detach(conn)
        conn.close()


def agents_on_disk(state_dir: Path) -> list[str]:
    """The agents with a database in `state_dir` (docs/design.md §1.4)."""
    root = state_dir / "agents"
    return sorted(p.parent.name for p in root.glob("*/memory.db")) if root.is_dir() else []


def require_store(state_dir: Path, field: str = "state_dir") -> None:
    """`InvalidInputError` naming `field` unless `state_dir` is a directory holding a store
    (`records.db` or an agent database): what a read-only open and the CLI's read commands
    need, so a mistyped path is an error, never a new empty store."""
    if not state_dir.exists():
        raise InvalidInputError(f"{field}: {str(state_dir)!r} does not exist")
    if not state_dir.is_dir():
        raise InvalidInputError(f"{field}: {str(state_dir)!r} is not a directory")
    if not (state_dir / RECORDS_DB).exists() and not agents_on_disk(state_dir):
        raise InvalidInputError(
            f"{field}: {str(state_dir)!r} holds no activememory store "
            f"(no {RECORDS_DB}, no agents/*/memory.db)"
        )
