"""The transcript store on PostgreSQL (docs/design.md §11): the twin of storage/transcripts.py.

`PgTranscriptWriter.apply` gives the acks `TranscriptWriter.apply` gives for the same
commands (the differential test holds them equal), with every row keyed by agent first.
Several processes may write one agent at once: each transaction first locks the session
rows its commands touch, in key order (`SELECT ... FOR UPDATE`), so appends to one session
take turns and every event's parent is the leaf at its append (docs/design.md §11).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeAlias, TypeVar, cast

import msgspec
import numpy
import psycopg
import psycopg.errors

from ...protocol.config import PrivateScope
from ...protocol.content import Content, Message
from ...protocol.errors import StorageError
from ...protocol.indexer import (
    Appended,
    AppendMessage,
    Archived,
    ArchiveSession,
    Created,
    CreateSession,
    Deleted,
    DeleteSession,
    EraseIdentity,
    Imported,
    ImportTranscript,
    IndexerAck,
    IndexerCommand,
    MarkDirty,
    MarkedDirty,
    RebuildIndex,
    Rebuilt,
    ReindexChunk,
    Reindexed,
    Rejected,
    RewindSession,
    Rewound,
    SetSwitches,
    StoreVectors,
    SwitchesSet,
    SyncNotes,
)
from ...protocol.recall import SessionSwitches
from ...protocol.session_key import ChatType, SessionKey, parse_session_key
from ...protocol.transcript import Event, ImportEntry, IndexStats, SessionInfo
from ...protocol.userdata import AgentErasure
from ..footprint import DiskUsage
from ..fts_query import MatchPlan
from ..notes import NoteHit, NoteStat
from ..search import DbScope, ScopePage, TermStats
from ..transcripts import import_prefix_differs, import_tree
from ..vectors import MessageRow, Near, NoteRow, PendingBatch
from .db import SCHEMA, Reopen, describe, lost, translate_errors
from .terms import index_terms

if TYPE_CHECKING:
    from ..userdata import SessionTree

Connection: TypeAlias = psycopg.Connection[Any]

_S = SCHEMA
_STATE_COLUMNS = (
    "id, leaf_event_id, leaf_depth, next_seq, revision, dirty, indexed_seq, updated_at,"
    " index_rows, index_tokens"
)
_INSERT_MESSAGE = (
    f"INSERT INTO {_S}.events(agent, id, session_id, parent_id, seq, depth, ts, kind, role,"
    " content, text) VALUES (%s, %s, %s, %s, %s, %s, %s, 'message', %s, %s, %s)"
)
_INSERT_BRANCH = (
    f"INSERT INTO {_S}.active_branch(agent, session_id, depth, event_id) VALUES (%s, %s, %s, %s)"
)
_INSERT_INDEX = (
    f"INSERT INTO {_S}.message_index(agent, event_id, session_id, depth, tokens, terms)"
    " VALUES (%s, %s, %s, %s, %s, %s::tsvector)"
)
_TEXT_AT_OR_ABOVE = (
    f"SELECT e.text FROM {_S}.active_branch a JOIN {_S}.events e"
    " ON e.agent = a.agent AND e.id = a.event_id"
    " WHERE a.agent = %s AND a.session_id = %s AND a.depth <= %s AND e.text IS NOT NULL"
    " ORDER BY a.depth DESC LIMIT 1"
)
# `_TEXT_AT_OR_ABOVE` for several sessions at once: (session id, text or NULL).
_LAST_TEXTS = (
    f"SELECT w.id, (SELECT e.text FROM {_S}.active_branch a JOIN {_S}.events e"
    " ON e.agent = a.agent AND e.id = a.event_id"
    " WHERE a.agent = %s AND a.session_id = w.id AND a.depth <= w.depth"
    " AND e.text IS NOT NULL ORDER BY a.depth DESC LIMIT 1)"
    " FROM unnest(%s::bigint[], %s::int[]) AS w(id, depth)"
)
_UNKNOWN = object()
_PARTIAL = -1
# A batch that lost a race (a deadlock between two batches' session locks, two new
# sessions given the same id) is tried again from the start this many times.
_RACE_RETRIES = 8
_RACES = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
_encode_content = msgspec.json.Encoder().encode
_decode_content = msgspec.json.Decoder(Content).decode


def _text_bytes(text: str | None) -> bytes | None:
    # bytea, not text: PostgreSQL's text type cannot hold NUL, a message's text can.
    return None if text is None else text.encode("utf-8")


def _text(value: object) -> str:
    return bytes(cast(bytes, value)).decode("utf-8")


@dataclasses.dataclass
class _SessionState:
    """A locked session row, as this transaction changes it; flushed before the commit."""

    id: int
    leaf_event_id: int | None
    leaf_depth: int
    next_seq: int
    revision: int
    dirty: bool
    indexed_seq: int
    updated_at: float
    index_rows: int
    index_tokens: int
    last_text: object = _UNKNOWN


def configure_writer(conn: Connection) -> Connection:
    """Autocommit outside `conn.transaction()` blocks, so each block is one transaction."""
    conn.autocommit = True
    return conn


# A writer ANALYZEs a table once the rows its bulk paths (import, index rebuild and
# reindex, record restore) added since it last did reach this many and this share of the
# table's estimated rows (docs/design.md §11 "Statistics").
ANALYZE_MIN_ROWS = 1000
ANALYZE_SHARE = 0.2


class BulkRows:
    """The rows a writer's bulk paths added per table since it last ANALYZEd it, and the
    ANALYZE once they are many (`ANALYZE_MIN_ROWS`, `ANALYZE_SHARE`).

    Without statistics the planner guesses how many rows a term or an agent holds and
    picks plans several times slower (docs/design.md §11 "Latency"); autovacuum would
    ANALYZE soon after a bulk load, but it may be slow, off, or not yet run. A table this
    role does not own (a worker bound by row-level security) is autovacuum's alone.
    """

    def __init__(self) -> None:
        self.added: dict[str, int] = {}
        self.pending: dict[str, int] = {}  # this transaction's, until it commits
        self.owned = True

    def add(self, table: str, rows: int) -> None:
        """`rows` added to `table` in the transaction under way."""
        self.pending[table] = self.pending.get(table, 0) + rows

    def rolled_back(self) -> None:
        self.pending.clear()

    def committed(self, conn: Connection) -> None:
        """Count the committed transaction's rows; ANALYZE the tables they grew enough.
        Outside any transaction. A failure is left to autovacuum: statistics only ever
        make plans better, never answers different. Only a commit that added bulk rows
        looks: the others leave the counts as they were, so the catalog is not read on
        every append after a bulk load."""
        if not self.pending:
            return
        for table, rows in self.pending.items():
            self.added[table] = self.added.get(table, 0) + rows
        self.pending.clear()
        due = [table for table, rows in self.added.items() if rows >= ANALYZE_MIN_ROWS]
        if not due or not self.owned:
            return
        try:
            found = conn.execute(
                "SELECT c.relname, c.reltuples, pg_has_role(c.relowner, 'USAGE')"
                " FROM pg_catalog.pg_class c WHERE c.oid = ANY(%s::regclass[])",
                ([f"{_S}.{table}" for table in due],),
            ).fetchall()
            for table, estimate, owned in found:
                if not owned:
                    self.owned = False
                    return
                if estimate < 0 or self.added[table] >= ANALYZE_SHARE * estimate:
                    conn.execute(f"ANALYZE {_S}.{table}")
                    self.added[table] = 0
        except psycopg.Error:
            return


# A reader's statements are short: a parallel plan's workers take longer to start than
# the scan they share (20+ ms on a busy server, for a 6 ms scan), and JIT compiles for
# tens of ms what runs in a few (docs/design.md §11 "Latency").
READER_SETTINGS = "SET max_parallel_workers_per_gather = 0; SET jit = off"


def configure_reader(conn: Connection) -> Connection:
    """Each read is one REPEATABLE READ, read-only transaction: one consistent snapshot;
    planned without parallel workers or JIT (`READER_SETTINGS`)."""
    conn.autocommit = True
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    conn.read_only = True
    conn.execute(READER_SETTINGS)
    return conn


class PgTranscriptWriter:
    """Applies indexer commands for one agent, a batch per transaction (group commit).

    A batch whose connection is lost during its commit is rejected whole
    (`Rejected(storage)`, the server's answer); with `reopen` (`db.reopen_connection`,
    `db.reopen_from_pool`) the next batch first replaces the connection, so the writer
    recovers without being made again. A batch that finds its connection lost before it
    sent COMMIT is tried once more on a new one (docs/design.md §11 "Crash safety and
    faults").
    """

    def __init__(self, conn: Connection, agent: str, *, reopen: Reopen | None = None) -> None:
        self.conn = configure_writer(conn)
        self.agent = agent
        self._reopen = reopen
        self._sessions: dict[str, _SessionState] = {}
        self._touched: dict[str, _SessionState] = {}
        self._event_rows: list[tuple[object, ...]] = []
        self._branch_rows: list[tuple[object, ...]] = []
        self._index_rows: list[tuple[object, ...]] = []
        self._event_ids: list[int] = []  # drawn for the run of appends being applied
        self.bulk = BulkRows()

    def apply(self, commands: Sequence[IndexerCommand]) -> list[IndexerAck]:
        """Apply `commands` in one transaction and return one ack per command, in order.

        A lost race (deadlock, serialization failure, a session id taken meanwhile) tries
        the batch again; any other failure rolls it back and, for a batch of several, tries
        each command in its own transaction so one bad command cannot sink the others.
        """
        # Lost in an earlier batch, which was rejected: never retried here, since its
        # commit may have reached the server before the connection went.
        lost_before = self._reopen is not None and lost(self.conn)
        if lost_before and (refused := self._replace_connection()) is not None:
            return [Rejected(reason="storage", message=refused) for _ in commands]
        failure: psycopg.Error | None = None
        replaced = False
        for _ in range(_RACE_RETRIES):
            sent_commit = False
            try:
                with self.conn.transaction():
                    acks = self._apply_batch(commands)
                    sent_commit = True  # from here the server may commit what we cannot see
                from .userdata import purged  # here: it imports this module

                self.bulk.committed(self.conn)
                return purged(self.conn, acks)  # an erase committed: VACUUM after it
            except (*_RACES, psycopg.errors.UniqueViolation) as exc:
                failure = exc
                self._forget()
                if isinstance(exc, psycopg.errors.UniqueViolation) and not _session_id_race(exc):
                    break
            except psycopg.Error as exc:
                failure = exc
                self._forget()
                if sent_commit or replaced or self._reopen is None or not lost(self.conn):
                    break
                # Lost before COMMIT was sent (a connection that died while idle): the
                # server rolled back, so once on a new connection is safe.
                replaced = True
                if (refused := self._replace_connection()) is not None:
                    return [Rejected(reason="storage", message=refused) for _ in commands]
        assert failure is not None
        if len(commands) == 1 or lost(self.conn):
            message = describe(failure)
            return [Rejected(reason="storage", message=message) for _ in commands]
        return [ack for cmd in commands for ack in self.apply([cmd])]

    def _replace_connection(self) -> str | None:
        """Swap the lost connection for a new one (`reopen`); the error when none came."""
        assert self._reopen is not None
        try:
            self.conn = configure_writer(self._reopen(self.conn))
        except StorageError as exc:
            return str(exc)
        return None

    def _forget(self) -> None:
        self.bulk.rolled_back()
        self._sessions.clear()
        self._touched.clear()
        self._event_rows.clear()
        self._branch_rows.clear()
        self._index_rows.clear()
        self._event_ids.clear()

    def _apply_batch(self, commands: Sequence[IndexerCommand]) -> list[IndexerAck]:
        self._forget()  # another process may have changed any session since the last batch
        self._lock_sessions(commands)
        acks: list[IndexerAck] = []
        for i, cmd in enumerate(commands):
            if isinstance(cmd, AppendMessage):
                if not self._event_ids:
                    self._start_append_run(commands, i)
                acks.append(self._append(cmd))
                continue
            self._flush_rows()
            acks.append(self._apply_one(cmd))
        self._flush_rows()
        self._flush_sessions()
        return acks

    def _lock_sessions(self, commands: Sequence[IndexerCommand]) -> None:
        """Lock the existing session rows the batch touches, in key order (two batches
        then never wait on each other in a cycle); every agent's row for agent-wide ones."""
        keys: set[str] = set()
        whole_agent = False
        for cmd in commands:
            key = getattr(cmd, "key", None)
            if isinstance(key, SessionKey):
                keys.add(key.raw)
            elif isinstance(cmd, RebuildIndex | MarkDirty):
                whole_agent = True
        if not keys and not whole_agent:
            return
        where = "" if whole_agent else " AND key = ANY(%s)"
        params: list[object] = [self.agent] if whole_agent else [self.agent, sorted(keys)]
        rows = self.conn.execute(
            f"SELECT key, {_STATE_COLUMNS} FROM {_S}.sessions WHERE agent = %s{where}"
            " ORDER BY key FOR UPDATE",
            params,
        ).fetchall()
        for key, *state in rows:
            self._sessions[str(key)] = _SessionState(*state)

    def _start_append_run(self, commands: Sequence[IndexerCommand], start: int) -> None:
        """Make (or lock) the sessions of the appends from `start` on, then draw their
        event ids: drawn after every lock, ids grow with each session's seq."""
        run: list[AppendMessage] = []
        for cmd in commands[start:]:
            if not isinstance(cmd, AppendMessage):
                break
            run.append(cmd)
        for cmd in run:
            if self._session(cmd.key.raw) is None:
                self._insert_session(cmd.key, cmd.at)
        self._read_last_texts([self._sessions[cmd.key.raw] for cmd in run])
        self._event_ids = self._draw_event_ids(len(run))

    def _read_last_texts(self, states: Sequence[_SessionState]) -> None:
        """The last active-branch text of every session of an append run whose text is not
        known yet (the previous message's end, indexed with the next one: §2.3), in one
        query instead of one per session. A statement of its own after the locks, so it
        sees what other processes committed before them, as `_last_text` would."""
        wanted = {s.id: s for s in states if s.last_text is _UNKNOWN and not s.dirty}
        for state in [s for s in wanted.values() if s.leaf_depth == 0]:
            state.last_text = None  # a new or empty session: nothing above its first message
            del wanted[state.id]
        if len(wanted) < 2:
            return  # one session: `_last_text` asks for it as it always did
        # Planned each time: psycopg prepares a statement run often, and the generic plan
        # of this one (arrays of unknown length) took ~3 ms a batch against ~0.6 ms planned.
        rows = self.conn.execute(
            _LAST_TEXTS,
            (self.agent, list(wanted), [s.leaf_depth for s in wanted.values()]),
            prepare=False,
        ).fetchall()
        for session_id, text in rows:
            wanted[int(session_id)].last_text = None if text is None else _text(text)

    def _draw_event_ids(self, count: int) -> list[int]:
        rows = self.conn.execute(
            f"SELECT nextval('{_S}.event_ids') FROM generate_series(1, %s)", (count,)
        ).fetchall()
        return sorted(int(row[0]) for row in rows)

    def _apply_one(self, cmd: IndexerCommand) -> IndexerAck:
        # Every handler decides to reject before it writes, as on SQLite.
        match cmd:
            case CreateSession():
                return self._create(cmd)
            case RewindSession():
                return self._rewind(cmd)
            case DeleteSession():
                return self._delete(cmd)
            case ArchiveSession():
                return self._archive(cmd)
            case ImportTranscript():
                return self._import(cmd)
            case RebuildIndex():
                return self._rebuild(cmd)
            case MarkDirty():
                return self._mark_dirty(cmd)
            case ReindexChunk():
                return self._reindex_chunk(cmd)
            case SetSwitches():
                return self._set_switches(cmd)
            case SyncNotes():
                from .notes import apply_sync_notes  # here: they import this module

                return apply_sync_notes(self.conn, self.agent, cmd)
            case StoreVectors():
                from .vectors import apply_store_vectors

                self._flush_sessions()  # its checks read `sessions.dirty`
                return apply_store_vectors(self.conn, self.agent, cmd)
            case EraseIdentity():
                from .userdata import erase_identity

                self._flush_sessions()  # the plan reads the session rows
                return erase_identity(
                    self.conn,
                    self.agent,
                    cmd,
                    lambda key: self._delete(DeleteSession(key=parse_session_key(key))),
                )
            case AppendMessage():  # handled by `_apply_batch`
                return self._append(cmd)

    def _flush_rows(self) -> None:
        if self._event_rows:
            with self.conn.cursor() as cur:
                cur.executemany(_INSERT_MESSAGE, self._event_rows)
                cur.executemany(_INSERT_BRANCH, self._branch_rows)
                if self._index_rows:
                    cur.executemany(_INSERT_INDEX, self._index_rows)
            self._event_rows.clear()
            self._branch_rows.clear()
            self._index_rows.clear()

    # -- sessions -------------------------------------------------------------------------

    def _session(self, key: str) -> _SessionState | None:
        state = self._sessions.get(key)
        if state is None:
            row = self.conn.execute(
                f"SELECT {_STATE_COLUMNS} FROM {_S}.sessions WHERE agent = %s AND key = %s"
                " FOR UPDATE",
                (self.agent, key),
            ).fetchone()
            if row is None:
                return None
            state = _SessionState(*row)
            self._sessions[key] = state
        return state

    def _insert_session(
        self,
        key: SessionKey,
        at: float,
        *,
        persistent: bool = True,
        interactive: bool = True,
        sandboxed: bool = False,
        spawned_by: str | None = None,
    ) -> _SessionState:
        return self._insert_or_lock(
            key,
            at,
            persistent=persistent,
            interactive=interactive,
            sandboxed=sandboxed,
            spawned_by=spawned_by,
        )[0]

    def _insert_or_lock(
        self,
        key: SessionKey,
        at: float,
        *,
        persistent: bool = True,
        interactive: bool = True,
        sandboxed: bool = False,
        spawned_by: str | None = None,
    ) -> tuple[_SessionState, bool]:
        """A new session row with SQLite's rowid rule (one past the agent's largest id),
        and True; or, when another process created the key meanwhile, that row, locked,
        and False."""
        row = self.conn.execute(
            f"INSERT INTO {_S}.sessions(agent, id, key, key_agent, chat_type, conversation_id,"
            " thread_id, persistent, interactive, sandboxed, spawned_by, created_at,"
            " updated_at) SELECT %s, coalesce(max(id), 0) + 1, %s, %s, %s, %s, %s, %s, %s,"
            f" %s, %s, %s, %s FROM {_S}.sessions WHERE agent = %s"
            " ON CONFLICT (agent, key) DO NOTHING RETURNING id",
            (
                self.agent, key.raw, key.agent, key.chat_type, key.conversation_id,
                key.thread_id, persistent, interactive, sandboxed, spawned_by, at, at,
                self.agent,
            ),
        ).fetchone()  # fmt: skip
        if row is None:
            found = self._session(key.raw)
            assert found is not None
            return found, False
        state = _SessionState(
            id=int(row[0]),
            leaf_event_id=None,
            leaf_depth=0,
            next_seq=1,
            revision=0,
            dirty=False,
            indexed_seq=0,
            updated_at=at,
            index_rows=0,
            index_tokens=0,
        )
        self._sessions[key.raw] = state
        return state, True

    def _touch(self, key: str, state: _SessionState, at: float) -> None:
        state.revision += 1
        state.updated_at = max(state.updated_at, at)
        self._touched[key] = state

    def _flush_sessions(self) -> None:
        if self._touched:
            with self.conn.cursor() as cur:
                cur.executemany(
                    f"UPDATE {_S}.sessions SET leaf_event_id = %s, leaf_depth = %s,"
                    " next_seq = %s, revision = %s, dirty = %s, indexed_seq = %s,"
                    " updated_at = %s, index_rows = %s, index_tokens = %s"
                    " WHERE agent = %s AND id = %s",
                    [
                        (
                            s.leaf_event_id, s.leaf_depth, s.next_seq, s.revision, s.dirty,
                            s.indexed_seq, s.updated_at, s.index_rows, s.index_tokens,
                            self.agent, s.id,
                        )
                        for s in self._touched.values()
                    ],
                )  # fmt: skip
            self._touched.clear()

    def _queue_index_row(
        self, state: _SessionState, event_id: int, depth: int, text: str, previous: str | None
    ) -> None:
        terms = index_terms(text, previous)
        self._index_rows.append((self.agent, event_id, state.id, depth, terms.tokens, terms.terms))
        state.index_rows += 1
        state.index_tokens += terms.tokens

    # -- commands -------------------------------------------------------------------------

    def _append(self, cmd: AppendMessage) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key)
        assert state is not None  # `_start_append_run` made it
        message = cmd.message
        if message.timestamp is None:
            message = copy.copy(message)
            msgspec.structs.force_setattr(message, "timestamp", cmd.at)
        timestamp = cmd.at if cmd.message.timestamp is None else cmd.message.timestamp
        event_id = self._event_ids.pop(0)
        depth = state.leaf_depth + 1
        seq = state.next_seq
        text = message.index_text
        self._event_rows.append(
            (
                self.agent, event_id, state.id, state.leaf_event_id, seq, depth, timestamp,
                message.role, _encode_content(message.content), _text_bytes(text),
            )
        )  # fmt: skip
        self._branch_rows.append((self.agent, state.id, depth, event_id))
        # Same transaction as the event (docs/design.md §2.3); a dirty session waits.
        indexed = False
        if not state.dirty:
            if text is not None:
                self._queue_index_row(state, event_id, depth, text, self._last_text(state))
                indexed = True
            state.indexed_seq = seq
        if text is not None:
            state.last_text = text
        parent_id = state.leaf_event_id
        state.leaf_event_id, state.leaf_depth, state.next_seq = event_id, depth, seq + 1
        self._touch(key, state, cmd.at)
        event = Event(
            id=event_id,
            session_key=key,
            parent_id=parent_id,
            seq=seq,
            timestamp=timestamp,
            message=message,
        )
        return Appended(event=event, indexed=indexed)

    def _create(self, cmd: CreateSession) -> IndexerAck:
        state = self._session(cmd.key.raw)
        if state is None:
            state, created = self._insert_or_lock(
                cmd.key,
                cmd.at,
                persistent=cmd.persistent,
                interactive=cmd.interactive,
                sandboxed=cmd.sandboxed,
                spawned_by=cmd.spawned_by,
            )
            if created:
                return Created(session_id=state.id, created=True)
        self.conn.execute(
            f"UPDATE {_S}.sessions SET persistent = %s, interactive = %s, sandboxed = %s,"
            " spawned_by = %s WHERE agent = %s AND id = %s",
            (
                cmd.persistent, cmd.interactive, cmd.sandboxed, cmd.spawned_by, self.agent,
                state.id,
            ),
        )  # fmt: skip
        self._touch(cmd.key.raw, state, cmd.at)
        return Created(session_id=state.id, created=False)

    def _rewind(self, cmd: RewindSession) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key)
        if state is None:
            return Rejected(reason="not_found", message=f"session_key: no session {key!r}")
        row = self.conn.execute(
            f"SELECT depth, kind FROM {_S}.events WHERE agent = %s AND id = %s AND session_id = %s",
            (self.agent, cmd.to_event_id, state.id),
        ).fetchone()
        if row is None or row[1] != "message":
            return Rejected(
                reason="not_found",
                message=f"to_event_id: {cmd.to_event_id} is not a message of session {key!r}",
            )
        if cmd.to_event_id == state.leaf_event_id:
            return Rewound(leaf_event_id=cmd.to_event_id)
        target_depth = int(row[0])
        # The target's path up to where it meets the active branch replaces what is below.
        path = self.conn.execute(
            f"WITH RECURSIVE up(id, parent_id, depth) AS ("
            f" SELECT id, parent_id, depth FROM {_S}.events WHERE agent = %(agent)s AND id = %(to)s"
            f" UNION ALL SELECT e.id, e.parent_id, e.depth FROM {_S}.events e JOIN up"
            "  ON e.agent = %(agent)s AND e.id = up.parent_id"
            f"  WHERE NOT EXISTS (SELECT 1 FROM {_S}.active_branch a WHERE a.agent = %(agent)s"
            "   AND a.session_id = %(sid)s AND a.depth = up.depth AND a.event_id = up.id))"
            f" SELECT u.depth, u.id FROM up u WHERE NOT EXISTS (SELECT 1 FROM {_S}.active_branch a"
            "  WHERE a.agent = %(agent)s AND a.session_id = %(sid)s AND a.depth = u.depth"
            "  AND a.event_id = u.id)",
            {"agent": self.agent, "to": cmd.to_event_id, "sid": state.id},
        ).fetchall()
        meet = min((int(d) for d, _ in path), default=target_depth + 1) - 1
        self.conn.execute(
            f"DELETE FROM {_S}.active_branch WHERE agent = %s AND session_id = %s AND depth > %s",
            (self.agent, state.id, meet),
        )
        with self.conn.cursor() as cur:
            cur.executemany(
                _INSERT_BRANCH, [(self.agent, state.id, int(d), int(e)) for d, e in path]
            )
        (event_id,) = self._draw_event_ids(1)
        self.conn.execute(
            f"INSERT INTO {_S}.events(agent, id, session_id, parent_id, seq, depth, ts, kind,"
            " content) VALUES (%s, %s, %s, %s, %s, %s, %s, 'rewind', %s)",
            (
                self.agent, event_id, state.id, state.leaf_event_id, state.next_seq,
                target_depth, cmd.at, _encode_content(str(cmd.to_event_id)),
            ),
        )  # fmt: skip
        state.next_seq += 1
        state.leaf_event_id, state.leaf_depth = cmd.to_event_id, target_depth
        state.last_text = _UNKNOWN
        state.dirty = True
        self._touch(key, state, cmd.at)
        return Rewound(leaf_event_id=cmd.to_event_id)

    def _delete(self, cmd: DeleteSession) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key)
        if state is None:
            return Rejected(reason="not_found", message=f"session_key: no session {key!r}")
        from .userdata import unshared_digests  # here: it imports this module

        # As on SQLite: the session's texts' cached vectors go with it, unless shared.
        digests = unshared_digests(self.conn, self.agent, [state.id])
        index_rows = self._drop_index_rows(state)
        params = (self.agent, state.id)
        self.conn.execute(
            f"DELETE FROM {_S}.active_branch WHERE agent = %s AND session_id = %s", params
        )
        events = self.conn.execute(
            f"DELETE FROM {_S}.events WHERE agent = %s AND session_id = %s", params
        ).rowcount
        self.conn.execute(f"DELETE FROM {_S}.sessions WHERE agent = %s AND id = %s", params)
        self.conn.execute(
            f"DELETE FROM {_S}.session_switches WHERE agent = %s AND key = %s", (self.agent, key)
        )
        if digests:
            self.conn.execute(
                f"DELETE FROM {_S}.vector_cache WHERE agent = %s AND digest = ANY(%s)",
                (self.agent, digests),
            )
        del self._sessions[key]
        self._touched.pop(key, None)
        return Deleted(events=events, index_rows=index_rows)

    def _set_switches(self, cmd: SetSwitches) -> IndexerAck:
        key = cmd.key.raw
        self.conn.execute(
            f"INSERT INTO {_S}.session_switches(agent, key) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (self.agent, key),
        )
        self.conn.execute(
            f"UPDATE {_S}.session_switches SET active_memory = coalesce(%s, active_memory),"
            ' "verbose" = coalesce(%s, "verbose"), trace = coalesce(%s, trace)'
            " WHERE agent = %s AND key = %s",
            (cmd.active_memory, cmd.verbose, cmd.trace, self.agent, key),
        )
        return SwitchesSet(switches=read_switches(self.conn, self.agent, key))

    def _archive(self, cmd: ArchiveSession) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key)
        if state is None:
            return Rejected(reason="not_found", message=f"session_key: no session {key!r}")
        self.conn.execute(
            f"UPDATE {_S}.sessions SET archived = %s WHERE agent = %s AND id = %s",
            (cmd.archived, self.agent, state.id),
        )
        self._touch(key, state, cmd.at)
        return Archived(archived=cmd.archived)

    def _import(self, cmd: ImportTranscript) -> IndexerAck:
        key = cmd.key.raw
        shape = import_tree(cmd)
        if isinstance(shape, Rejected):
            return shape
        depths, leaf_import_id = shape
        state = self._session(key)
        if state is not None and state.leaf_event_id is not None:
            if not cmd.resume:
                return Rejected(
                    reason="invalid",
                    message=f"session_key: {key!r} already has messages; import into a new session",
                )
            differs = self._differs_from_stored(state, cmd, leaf_import_id)
            if differs is not None:
                return Rejected(reason="invalid", message=differs)
            return Imported(session_id=state.id, events=0, skipped=True)

        if state is None:
            state = self._insert_session(
                cmd.key, cmd.at, persistent=cmd.persistent, interactive=cmd.interactive
            )
            self.bulk.add("sessions", 1)
        kept = self._free_ids(cmd.entries) if cmd.keep_ids else None
        if kept is not None and kept:
            # The sequence moves past kept ids, as SQLite's next id does (docs/design.md §2.6).
            self.conn.execute(
                f"SELECT setval('{_S}.event_ids', greatest(%s,"
                f" (SELECT last_value FROM {_S}.event_ids)))",
                (max(kept.values()),),
            )
        event_ids = kept or dict(
            zip(
                (e.id for e in cmd.entries),
                self._draw_event_ids(len(cmd.entries)) if cmd.entries else [],
                strict=True,
            )
        )
        parents = {
            event_ids[e.id]: event_ids[e.parent_id] if e.parent_id else None for e in cmd.entries
        }
        with self.conn.cursor() as cur:
            cur.executemany(
                _INSERT_MESSAGE,
                [
                    (
                        self.agent, event_ids[e.id], state.id, parents[event_ids[e.id]],
                        state.next_seq + i, depths[e.id], e.timestamp, e.message.role,
                        _encode_content(e.message.content), _text_bytes(e.message.index_text),
                    )
                    for i, e in enumerate(cmd.entries)
                ],
            )  # fmt: skip
        state.next_seq += len(cmd.entries)
        self.bulk.add("events", len(cmd.entries))
        if leaf_import_id is not None:
            leaf_id, leaf_depth = event_ids[leaf_import_id], depths[leaf_import_id]
            branch: list[tuple[object, ...]] = []
            node: int | None = leaf_id
            depth = leaf_depth
            while node is not None:
                branch.append((self.agent, state.id, depth, node))
                node, depth = parents[node], depth - 1
            with self.conn.cursor() as cur:
                cur.executemany(_INSERT_BRANCH, branch)
            self.bulk.add("active_branch", len(branch))
            state.leaf_event_id, state.leaf_depth = leaf_id, leaf_depth
        state.last_text = _UNKNOWN
        state.dirty = True
        self._touch(key, state, cmd.at)
        return Imported(session_id=state.id, events=len(cmd.entries))

    def _free_ids(self, entries: Sequence[ImportEntry]) -> dict[str, int] | None:
        """The entries' ids as event ids, if each is a positive integer no event of the
        agent has yet; else None (as SQLite's `_free_ids`)."""
        if not all(e.id.isascii() and e.id.isdigit() and int(e.id) > 0 for e in entries):
            return None
        ids = {e.id: int(e.id) for e in entries}
        if any(i >= 2**63 for i in ids.values()) or len(set(ids.values())) != len(ids):
            return None
        taken = self.conn.execute(
            f"SELECT count(*) FROM {_S}.events WHERE agent = %s AND id = ANY(%s)",
            (self.agent, list(ids.values())),
        ).fetchone()
        if taken is None or taken[0]:
            return None
        return ids

    def _differs_from_stored(
        self, state: _SessionState, cmd: ImportTranscript, leaf_import_id: str | None
    ) -> str | None:
        """Why the session does not already hold `cmd`'s entries, or None if it does
        (storage/transcripts.py `_differs_from_stored`, docs/design.md §2.5)."""
        rows = self.conn.execute(
            f"SELECT id, parent_id, kind, ts, role, content FROM {_S}.events"
            " WHERE agent = %s AND session_id = %s ORDER BY seq LIMIT %s",
            (self.agent, state.id, len(cmd.entries) + 1),
        ).fetchall()
        return import_prefix_differs(cmd, rows, state.leaf_event_id, leaf_import_id)

    def _rebuild(self, cmd: RebuildIndex) -> IndexerAck:
        if cmd.key is not None:
            state = self._session(cmd.key.raw)
            if state is None:
                return Rejected(
                    reason="not_found", message=f"session_key: no session {cmd.key.raw!r}"
                )
            keys = [cmd.key.raw] if state.dirty else []
        else:
            self._flush_sessions()
            keys = [
                str(k)
                for (k,) in self.conn.execute(
                    f"SELECT key FROM {_S}.sessions WHERE agent = %s AND dirty ORDER BY id",
                    (self.agent,),
                )
            ]
        index_rows = 0
        for key in keys:
            index_rows += self.rebuild_session(key)
        return Rebuilt(sessions=len(keys), index_rows=index_rows)

    def _mark_dirty(self, cmd: MarkDirty) -> IndexerAck:
        if cmd.key is not None:
            key = cmd.key.raw
            state = self._session(key)
            if state is None:
                return Rejected(reason="not_found", message=f"session_key: no session {key!r}")
            state.dirty = True
            self._touch(key, state, state.updated_at)
            return MarkedDirty(sessions=1)
        self._flush_sessions()
        self.conn.execute(f"DELETE FROM {_S}.message_index WHERE agent = %s", (self.agent,))
        sessions = self.conn.execute(
            f"UPDATE {_S}.sessions SET dirty = true, revision = revision + 1, indexed_seq = 0,"
            " index_rows = 0, index_tokens = 0 WHERE agent = %s",
            (self.agent,),
        ).rowcount
        self._sessions.clear()
        return MarkedDirty(sessions=sessions)

    def _reindex_chunk(self, cmd: ReindexChunk) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key)
        if state is None:
            return Rejected(reason="not_found", message=f"session_key: no session {key!r}")
        if state.revision != cmd.revision or not state.dirty:
            return Reindexed(stale=True)
        last = min(state.leaf_depth, cmd.after_depth + cmd.max_rows)
        if cmd.after_depth == 0:
            self._drop_index_rows(state)
            state.indexed_seq = _PARTIAL  # a rebuild under way: later chunks continue it
            self._touched[key] = state
        elif state.indexed_seq != _PARTIAL or self._indexed_between(state, cmd.after_depth, last):
            # A chunk that continues no rebuild: the reconciler always starts at 0, which
            # drops the rows and marks the rebuild under way; else stale rows of a rewound
            # branch would stay indexed in a session called clean (as on SQLite), or its
            # rows are indexed already.
            return Reindexed(stale=True)
        rows = self._index_branch(state, cmd.after_depth, last)
        self._touched[key] = state  # its index counters moved
        if last < state.leaf_depth:
            return Reindexed(rows=rows, next_depth=last)
        state.dirty = False
        state.indexed_seq = state.next_seq - 1
        return Reindexed(rows=rows, next_depth=last, clean=True)

    def _drop_index_rows(self, state: _SessionState) -> int:
        """Delete every index row of the session; return how many went."""
        if state.indexed_seq == 0 and state.index_rows == 0:
            return 0
        dropped = self.conn.execute(
            f"DELETE FROM {_S}.message_index WHERE agent = %s AND session_id = %s",
            (self.agent, state.id),
        ).rowcount
        state.index_rows = state.index_tokens = 0
        return dropped

    def _last_text(self, state: _SessionState) -> str | None:
        if state.last_text is _UNKNOWN:
            row = self.conn.execute(
                _TEXT_AT_OR_ABOVE, (self.agent, state.id, state.leaf_depth)
            ).fetchone()
            state.last_text = None if row is None else _text(row[0])
        return cast(str | None, state.last_text)

    def _indexed_between(self, state: _SessionState, after_depth: int, last_depth: int) -> bool:
        """Whether an active-branch message at depths (after_depth, last_depth] has an
        index row."""
        row = self.conn.execute(
            f"SELECT 1 FROM {_S}.active_branch a JOIN {_S}.message_index m"
            " ON m.agent = a.agent AND m.event_id = a.event_id"
            " WHERE a.agent = %s AND a.session_id = %s AND a.depth > %s AND a.depth <= %s LIMIT 1",
            (self.agent, state.id, after_depth, last_depth),
        ).fetchone()
        return row is not None

    def _index_branch(self, state: _SessionState, after_depth: int, last_depth: int) -> int:
        """Index the active-branch messages at depths (after_depth, last_depth]."""
        row = self.conn.execute(_TEXT_AT_OR_ABOVE, (self.agent, state.id, after_depth)).fetchone()
        previous = None if row is None else _text(row[0])
        branch = self.conn.execute(
            f"SELECT e.id, a.depth, e.text FROM {_S}.active_branch a JOIN {_S}.events e"
            " ON e.agent = a.agent AND e.id = a.event_id"
            " WHERE a.agent = %s AND a.session_id = %s AND a.depth > %s AND a.depth <= %s"
            " AND e.text IS NOT NULL ORDER BY a.depth",
            (self.agent, state.id, after_depth, last_depth),
        ).fetchall()
        for event_id, depth, raw in branch:
            text = _text(raw)
            self._queue_index_row(state, int(event_id), int(depth), text, previous)
            previous = text
        if self._index_rows:
            with self.conn.cursor() as cur:
                cur.executemany(_INSERT_INDEX, self._index_rows)
            self.bulk.add("message_index", len(self._index_rows))
            self._index_rows.clear()
        return len(branch)

    def rebuild_session(self, key: str) -> int:
        """Replace a session's index rows with its active branch; mark it clean."""
        state = self._session(key)
        assert state is not None
        self._drop_index_rows(state)
        rows = self._index_branch(state, 0, state.leaf_depth)
        state.dirty = False
        state.indexed_seq = state.next_seq - 1
        self._touched[key] = state
        return rows


def _session_id_race(exc: psycopg.errors.UniqueViolation) -> bool:
    """Whether a unique violation is two processes giving new sessions the same id, or
    drawing an event id that a kept-id import took: lost races, tried again."""
    constraint = exc.diag.constraint_name or ""
    return constraint in {"sessions_pkey", "events_pkey"}


_SESSION_COLUMNS = (
    "key, id, key_agent, chat_type, conversation_id, thread_id, persistent, interactive,"
    " archived, sandboxed, spawned_by, created_at, updated_at, leaf_event_id, revision, dirty,"
    " indexed_seq"
)
_SESSION_FIELDS = [name.strip() for name in _SESSION_COLUMNS.split(",")]


def _session_info(row: Sequence[object]) -> SessionInfo:
    values = dict(zip(_SESSION_FIELDS, row, strict=True))
    values["session_id"] = values.pop("id")
    values["agent"] = values.pop("key_agent")
    return msgspec.convert(values, SessionInfo)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _read(
    method: Callable[Concatenate[PgTranscriptReader, _P], _R],
) -> Callable[Concatenate[PgTranscriptReader, _P], _R]:
    """A read of `PgTranscriptReader`: on a live connection (`connection()`), its
    failures a `StorageError` with the server's answer. A read whose connection turns out
    lost (it died while idle) runs once more on a new one: a read changes nothing."""

    @functools.wraps(method)
    def read(reader: PgTranscriptReader, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        what = f"reading agent {reader.agent!r}"
        reader.connection()
        try:
            with translate_errors(what):
                return method(reader, *args, **kwargs)
        except StorageError:
            if reader._reopen is None or not lost(reader.conn):
                raise
        reader.connection()
        with translate_errors(what):
            return method(reader, *args, **kwargs)

    return read


class PgTranscriptReader:
    """Reads one agent's transcripts (the methods of `TranscriptReader`), each read one
    snapshot on a connection of its own (`configure_reader`).

    A read that loses its connection raises `StorageError`; with `reopen` it is tried once
    more on a new connection, and the next read replaces a lost one first (docs/design.md
    §11 "Crash safety and faults").
    """

    def __init__(self, conn: Connection, agent: str, *, reopen: Reopen | None = None) -> None:
        self.conn = configure_reader(conn)
        self.agent = agent
        self._reopen = reopen

    def connection(self) -> Connection:
        """The reader's connection, replaced first if it was lost (and `reopen` given);
        for the searches that read through it (storage/pg/search.py)."""
        if self._reopen is not None and lost(self.conn):
            self.conn = configure_reader(self._reopen(self.conn))
        return self.conn

    @_read
    def session(self, key: str) -> SessionInfo | None:
        row = self.conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM {_S}.sessions WHERE agent = %s AND key = %s",
            (self.agent, key),
        ).fetchone()
        return _session_info(row) if row else None

    @_read
    def sessions(self) -> list[SessionInfo]:
        rows = self.conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM {_S}.sessions WHERE agent = %s ORDER BY id",
            (self.agent,),
        ).fetchall()
        return [_session_info(row) for row in rows]

    @_read
    def history(self, key: str, limit: int | None = None) -> list[Event] | None:
        """The active branch, root first (the last `limit` messages); None if no session."""
        with self.conn.transaction():
            found = self.conn.execute(
                f"SELECT id FROM {_S}.sessions WHERE agent = %s AND key = %s", (self.agent, key)
            ).fetchone()
            if found is None:
                return None
            rows = self.conn.execute(
                f"SELECT e.id, e.parent_id, e.seq, e.ts, e.role, e.content FROM {_S}.active_branch a"
                f" JOIN {_S}.events e ON e.agent = a.agent AND e.id = a.event_id"
                " WHERE a.agent = %s AND a.session_id = %s ORDER BY a.depth DESC LIMIT %s",
                (self.agent, found[0], limit),
            ).fetchall()
        return [
            Event(
                id=event_id,
                session_key=key,
                parent_id=parent_id,
                seq=seq,
                timestamp=ts,
                message=Message(role=role, content=_decode_content(content), timestamp=ts),
            )
            for event_id, parent_id, seq, ts, role, content in reversed(rows)
        ]

    @_read
    def switches(self, key: str) -> SessionSwitches:
        """The session's slash-command switches (the defaults if never set)."""
        return read_switches(self.conn, self.agent, key)

    @_read
    def dirty_sessions(self, limit: int) -> list[tuple[str, int]]:
        """Up to `limit` dirty sessions as (key, revision), oldest first."""
        rows = self.conn.execute(
            f"SELECT key, revision FROM {_S}.sessions WHERE agent = %s AND dirty"
            " ORDER BY id LIMIT %s",
            (self.agent, limit),
        ).fetchall()
        return [(str(key), int(revision)) for key, revision in rows]

    @_read
    def stats(
        self,
        *,
        check_integrity: bool = True,
        vector_name: str | None = None,
        vector_after: int = 0,
        vector_epoch: int | None = None,
    ) -> IndexStats:
        """The agent's counts. `db_bytes` is the whole store's size (every agent's rows
        share its tables); with `vector_name`, the rows waiting for its vectors above the
        embedder actor's watermark (storage/pg/vectors.py `pending_count`)."""
        a = self.agent

        def one(sql: str) -> int:
            row = self.conn.execute(sql, {"agent": a}).fetchone()
            return int(row[0]) if row and row[0] is not None else 0

        with self.conn.transaction():
            sessions = one(f"SELECT count(*) FROM {_S}.sessions WHERE agent = %(agent)s")
            events = one(f"SELECT count(*) FROM {_S}.events WHERE agent = %(agent)s")
            active = one(
                f"SELECT count(*) FROM {_S}.active_branch b JOIN {_S}.events e"
                " ON e.agent = b.agent AND e.id = b.event_id"
                " WHERE b.agent = %(agent)s AND e.text IS NOT NULL"
            )
            indexed = one(f"SELECT count(*) FROM {_S}.message_index WHERE agent = %(agent)s")
            dirty = one(f"SELECT count(*) FROM {_S}.sessions WHERE agent = %(agent)s AND dirty")
            size = one(
                "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c"
                f" JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = '{_S}'"
                " AND c.relkind = 'r' AND %(agent)s::text IS NOT NULL"
            )
            ok = not check_integrity or index_integrity_ok(self.conn, a)
            pending = 0
            if vector_name is not None:
                from .vectors import pending_count

                pending = pending_count(
                    self.conn, a, vector_name, after=vector_after, epoch=vector_epoch
                )
        return IndexStats(
            agent=a,
            sessions=sessions,
            events=events,
            active_messages=active,
            indexed_messages=indexed,
            dirty_sessions=dirty,
            db_bytes=size,
            fts_integrity_ok=ok,
            vectors_pending=pending,
            embedder=vector_name,
        )

    @_read
    def list_sessions(
        self,
        *,
        chat_type: ChatType | None = None,
        peer: str | None = None,
        owner: PrivateScope | None = None,
        archived: bool | None = None,
    ) -> list[SessionInfo]:
        """`mem.sessions.list`'s filters (storage/userdata.py `list_sessions`'s rules, here
        over the agent's session rows: an identity's sessions are few)."""
        found = self.sessions()
        if owner is not None:
            owned = {s.key for s in found if _owned_root(s, owner)}
            children: dict[str, list[str]] = {}
            for s in found:
                if s.spawned_by is not None:
                    children.setdefault(s.spawned_by, []).append(s.key)
            todo = list(owned)
            while todo:  # and every session they spawned, at any depth
                for child in children.get(todo.pop(), ()):
                    if child not in owned:
                        owned.add(child)
                        todo.append(child)
            found = [s for s in found if s.key in owned]
        if chat_type is not None:
            found = [s for s in found if s.chat_type == chat_type]
        if peer is not None:
            found = [s for s in found if s.chat_type == "direct" and s.conversation_id == peer]
        if archived is not None:
            found = [s for s in found if s.archived == archived]
        return found

    @_read
    def sandboxed(self, key: str) -> bool:
        """Whether session `key` exists and is sandboxed."""
        row = self.conn.execute(
            f"SELECT sandboxed FROM {_S}.sessions WHERE agent = %s AND key = %s",
            (self.agent, key),
        ).fetchone()
        return row is not None and bool(row[0])

    @_read
    def search_page(
        self,
        plan: MatchPlan,
        *,
        scope: DbScope,
        caller: str,
        session_key: str | None,
        keep: int,
        stats: TermStats,
    ) -> ScopePage:
        """The `keep` best visible matches of `plan` (storage/pg/search.py `search_scope`;
        `stats`, the agent's remembered term counts)."""
        from .search import search_scope

        return search_scope(
            self.conn,
            self.agent,
            plan,
            scope=scope,
            caller=caller,
            session_key=session_key,
            keep=keep,
            stats=stats,
        )

    @_read
    def private_message(
        self, event_id: int, key: str, caller: str, scope: PrivateScope
    ) -> tuple[str, float, str] | None:
        """The message behind a `session:<key>#<id>` path if `caller` may read it
        (storage/search.py `private_message`'s rule, with storage/pg/search.py's scope)."""
        from .search import scope_sql

        visible, params = scope_sql(self.agent, scope, caller, None)
        row = self.conn.execute(
            f"SELECT e.role, e.ts, e.text FROM {_S}.events e"
            f" JOIN {_S}.sessions s ON s.agent = e.agent AND s.id = e.session_id"
            f" JOIN {_S}.active_branch a ON a.agent = e.agent AND a.session_id = e.session_id"
            "  AND a.event_id = e.id"
            " WHERE e.agent = %(agent)s AND e.id = %(id)s AND s.key = %(key)s"
            " AND e.kind = 'message' AND e.text IS NOT NULL"
            f" AND e.session_id IN (SELECT id FROM ({visible}) v)",
            params | {"id": event_id, "key": key},
        ).fetchone()
        return None if row is None else (str(row[0]), float(row[1]), _text(row[2]))

    @_read
    def search_notes(self, plan: MatchPlan, keep: int) -> list[NoteHit]:
        """The `keep` best memory-note chunks (storage/pg/notes.py `search_notes`)."""
        from .notes import search_notes  # here: it imports this module

        return search_notes(self.conn, self.agent, plan, keep)

    @_read
    def note_files(self) -> dict[str, NoteStat]:
        """Every indexed note file by workspace-relative path."""
        from .notes import indexed_note_files

        return indexed_note_files(self.conn, self.agent)

    @_read
    def plan_erasure(self, scope: PrivateScope) -> AgentErasure:
        """What erasing the identity `scope` would remove (storage/pg/userdata.py
        `plan_erasure`, which the erase itself runs too), in one snapshot."""
        from .userdata import plan_erasure

        with self.conn.transaction():
            return plan_erasure(self.conn, self.agent, scope).erasure

    @_read
    def session_trees(self, scope: PrivateScope | None) -> list[SessionTree]:
        """The identity's sessions (None: every session) with their whole trees (storage/pg/userdata.py), in one
        snapshot."""
        from .userdata import session_trees

        with self.conn.transaction():
            return session_trees(self.conn, self.agent, scope)

    def disk_usage(self) -> DiskUsage | None:
        """None: the server's files are shared by every agent (see `stats().db_bytes`)."""
        return None

    # -- vectors (storage/reads.py "Vectors"; storage/pg/vectors.py) -----------------------

    @_read
    def pending_vectors(
        self, name: str, *, after: int, epoch: int | None, limit: int
    ) -> PendingBatch:
        from .vectors import pending_batch

        return pending_batch(self.conn, self.agent, name, after=after, epoch=epoch, limit=limit)

    @_read
    def cached_vectors(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        from .vectors import cached_vectors

        return cached_vectors(self.conn, self.agent, name, digests)

    @_read
    def nearest_messages(
        self,
        query: numpy.ndarray,
        *,
        name: str,
        scope: DbScope,
        caller: str,
        session_key: str | None,
        k: int,
    ) -> list[Near]:
        from .search import scope_sql
        from .vectors import nearest_message_rows

        sql, params = scope_sql(self.agent, scope, caller, session_key)
        return nearest_message_rows(
            self.conn, self.agent, query, name=name, visible_sql=sql, visible_params=params, k=k
        )

    @_read
    def message_vectors(self, event_ids: Sequence[int], name: str) -> dict[int, numpy.ndarray]:
        from .vectors import message_vectors_of

        return message_vectors_of(self.conn, self.agent, event_ids, name=name)

    @_read
    def message_rows(self, event_ids: Sequence[int]) -> list[MessageRow]:
        if not event_ids:
            return []
        rows = self.conn.execute(
            f"SELECT e.id, s.key, e.ts, e.role, e.text, e.session_id FROM {_S}.events e"
            f" JOIN {_S}.sessions s ON s.agent = e.agent AND s.id = e.session_id"
            " WHERE e.agent = %s AND e.id = ANY(%s)",
            (self.agent, [int(i) for i in event_ids]),
        ).fetchall()
        return [
            MessageRow(int(i), str(key), float(ts), str(role), _text(text), int(sid))
            for i, key, ts, role, text, sid in rows
        ]

    @_read
    def nearest_notes(self, query: numpy.ndarray, *, name: str, k: int) -> list[Near]:
        from .vectors import nearest_note_rows

        return nearest_note_rows(self.conn, self.agent, query, name=name, k=k)

    @_read
    def note_vectors(self, chunk_ids: Sequence[int], name: str) -> dict[int, numpy.ndarray]:
        from .vectors import note_vectors_of

        return note_vectors_of(self.conn, self.agent, chunk_ids, name=name)

    @_read
    def note_rows(self, chunk_ids: Sequence[int]) -> list[NoteRow]:
        if not chunk_ids:
            return []
        rows = self.conn.execute(
            f"SELECT id, path, start_line, end_line, text FROM {_S}.note_chunks"
            " WHERE agent = %s AND id = ANY(%s)",
            (self.agent, [int(i) for i in chunk_ids]),
        ).fetchall()
        return [
            NoteRow(int(i), str(path), int(start), int(end), _text(text))
            for i, path, start, end, text in rows
        ]


def _owned_root(info: SessionInfo, owner: PrivateScope) -> bool:
    """storage/userdata.py `_OWNED`'s first part: a session of the identity itself."""
    if info.chat_type not in ("direct", "explicit"):
        return False
    if info.chat_type == "direct" and info.conversation_id is not None:
        return owner.peers is None or info.conversation_id in owner.peers
    return owner.owner


def index_integrity_ok(conn: Connection, agent: str) -> bool:
    """The index's own consistency: every row is a stored message's, in its session, at
    its depth, and each session's counts (BM25's statistics) add up."""
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM {_S}.message_index i WHERE i.agent = %(agent)s AND NOT"
        f"  EXISTS (SELECT 1 FROM {_S}.events e WHERE e.agent = i.agent AND e.id = i.event_id"
        "  AND e.session_id = i.session_id AND e.depth = i.depth AND e.text IS NOT NULL)),"
        f" (SELECT count(*) FROM {_S}.sessions s LEFT JOIN (SELECT session_id, count(*) AS n,"
        f"  sum(tokens) AS t FROM {_S}.message_index WHERE agent = %(agent)s GROUP BY session_id)"
        "  c ON c.session_id = s.id WHERE s.agent = %(agent)s"
        "  AND (s.index_rows, s.index_tokens) <> (coalesce(c.n, 0), coalesce(c.t, 0)))",
        {"agent": agent},
    ).fetchone()
    return row is not None and row[0] == 0 and row[1] == 0


def read_switches(conn: Connection, agent: str, key: str) -> SessionSwitches:
    row = conn.execute(
        f'SELECT active_memory, "verbose", trace FROM {_S}.session_switches'
        " WHERE agent = %s AND key = %s",
        (agent, key),
    ).fetchone()
    if row is None:
        return SessionSwitches()
    active_memory, verbose, trace = row
    return SessionSwitches(active_memory=bool(active_memory), verbose=bool(verbose), trace=trace)
