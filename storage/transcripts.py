"""The transcript store of one agent database (docs/design.md §2): writes and reads.

`TranscriptWriter` belongs to the indexer actor alone (the single writer); it turns a batch
of indexer commands into one transaction. `TranscriptReader` serves history and stats on its
own connection. Both are synchronous: their callers run them through an `Executor`.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import apsw
import msgspec
import numpy
from msgspec.structs import replace

from ..protocol.config import PrivateScope
from ..protocol.content import Content, Message
from ..protocol.indexer import (
    Appended,
    AppendMessage,
    Archived,
    ArchiveSession,
    Created,
    CreateSession,
    Deleted,
    DeleteSession,
    Erased,
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
from ..protocol.recall import SessionSwitches
from ..protocol.session_key import ChatType, SessionKey
from ..protocol.transcript import Event, ImportEntry, IndexStats, SessionInfo
from ..protocol.userdata import AgentErasure
from .db import describe
from .footprint import DiskUsage, disk_usage
from .fts_query import MatchPlan, index_row
from .notes import NoteHit, NoteStat, apply_sync_notes, indexed_note_files, search_notes
from .search import DbScope, ScopePage, TermStats, private_message, scope_sql, search_scope
from .userdata import (
    SessionTree,
    erase_extras,
    list_sessions,
    plan_erasure,
    purge,
    session_trees,
    unshared_digests,
)
from .vectors import (
    MessageRow,
    Near,
    NoteRow,
    PendingBatch,
    apply_store_vectors,
    bump_vector_epoch,
    cached_vectors,
    drop_session_vectors,
    message_vectors_of,
    nearest_message_rows,
    nearest_note_rows,
    note_vectors_of,
    pending_batch,
    pending_count,
)

_INSERT_MESSAGE = (
    "INSERT INTO events(id, session_id, parent_id, seq, depth, ts, kind, role, content, text)"
    " VALUES (?, ?, ?, ?, ?, ?, 'message', ?, ?, ?)"
)
_INSERT_BRANCH = "INSERT INTO active_branch(session_id, depth, event_id) VALUES (?, ?, ?)"
_INSERT_INDEX = "INSERT INTO message_fts(rowid, words, grams, context) VALUES (?, ?, ?, ?)"
# The newest indexable text on a session's active branch at or above a depth.
_TEXT_AT_OR_ABOVE = (
    "SELECT e.text FROM active_branch a JOIN events e ON e.id = a.event_id"
    " WHERE a.session_id = ? AND a.depth <= ? AND e.text IS NOT NULL"
    " ORDER BY a.depth DESC LIMIT 1"
)
_UNKNOWN = object()  # the writer has not looked up a session's last text yet
# `indexed_seq` of a session whose rebuild wrote some chunks but is not finished.
_PARTIAL = -1
_encode_content = msgspec.json.Encoder().encode
_decode_content = msgspec.json.Decoder(Content).decode


@dataclasses.dataclass
class _SessionState:
    """The writer's cached copy of a session row; flushed once per transaction."""

    id: int
    leaf_event_id: int | None
    leaf_depth: int
    next_seq: int
    revision: int
    dirty: bool
    indexed_seq: int
    updated_at: float
    # The newest indexable text on the active branch: the next message's index context.
    last_text: object = _UNKNOWN


@contextlib.contextmanager
def write_transaction(conn: apsw.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT, rolling back on error.

    Not `with conn:`: SQLite rolls back by itself on SQLITE_FULL and friends, and the
    savepoint release apsw would then attempt replaces the real error with "no transaction".
    IMMEDIATE takes the write lock up front, so a busy database fails before any work.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


class TranscriptWriter:
    """Applies indexer commands to the database, a batch per transaction (group commit)."""

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn
        self._sessions: dict[str, _SessionState] = {}
        self._touched: dict[str, _SessionState] = {}
        # Rows queued by appends, written by `_flush_rows` with one executemany per table.
        self._event_rows: list[tuple[object, ...]] = []
        self._branch_rows: list[tuple[int, int, int]] = []
        self._index_rows: list[tuple[int, str, str | None, str | None]] = []
        self._next_event_id = self._load_next_event_id()
        self._purge_after_commit = False  # set by an erase (docs/design.md §2.6)

    def _load_next_event_id(self) -> int:
        (max_id,) = self.conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone() or (0,)
        return int(max_id) + 1

    def apply(self, commands: Sequence[IndexerCommand]) -> list[IndexerAck]:
        """Apply `commands` in one transaction and return one ack per command, in order.

        If the transaction fails, it is rolled back whole and, unless the failure is a lock
        held by another writer, each command is retried in its own transaction so that one
        bad command (say, one that no longer fits on disk) cannot sink the others.
        """
        try:
            with write_transaction(self.conn):
                acks = [self._apply_one(cmd) for cmd in commands]
                self._flush_rows()
                self._flush_sessions()
        except apsw.Error as exc:
            self._forget_cache()
            self._purge_after_commit = False
            if len(commands) == 1 or isinstance(exc, apsw.BusyError | apsw.LockedError):
                return [Rejected(reason="storage", message=describe(exc)) for _ in commands]
            return [ack for cmd in commands for ack in self.apply([cmd])]
        if self._purge_after_commit:  # an erase committed: take its text off the disk
            self._purge_after_commit = False
            problem = purge(self.conn)
            acks = [
                Erased(erasure=replace(a.erasure, purged=problem is None, problem=problem))
                if isinstance(a, Erased)
                else a
                for a in acks
            ]
        return acks

    def _forget_cache(self) -> None:
        self._sessions.clear()
        self._touched.clear()
        self._event_rows.clear()
        self._branch_rows.clear()
        self._index_rows.clear()
        self._next_event_id = self._load_next_event_id()

    def _apply_one(self, cmd: IndexerCommand) -> IndexerAck:
        # Every handler decides to reject *before* it writes anything: a batch shares one
        # transaction, so a half-applied rejected command would be committed with the rest.
        if isinstance(cmd, AppendMessage):
            return self._append(cmd)
        self._flush_rows()  # the other handlers read the tables appends write
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
                return apply_sync_notes(self.conn, cmd)
            case StoreVectors():
                self._flush_sessions()  # its checks read `sessions.dirty`
                return apply_store_vectors(self.conn, cmd)
            case EraseIdentity():
                return self._erase(cmd)

    def _flush_rows(self) -> None:
        """Write the rows appends have queued, a statement per table for the whole batch."""
        if self._event_rows:
            self.conn.executemany(_INSERT_MESSAGE, self._event_rows)
            self.conn.executemany(_INSERT_BRANCH, self._branch_rows)
            self.conn.executemany(_INSERT_INDEX, self._index_rows)
            self._event_rows.clear()
            self._branch_rows.clear()
            self._index_rows.clear()

    # -- sessions -------------------------------------------------------------------------

    def _session(self, key: str) -> _SessionState | None:
        state = self._sessions.get(key)
        if state is None:
            row = self.conn.execute(
                "SELECT id, leaf_event_id, leaf_depth, next_seq, revision, dirty, indexed_seq,"
                " updated_at FROM sessions WHERE key = ?",
                (key,),
            ).fetchone()
            if row is None:
                return None
            state = _SessionState(*row)
            state.dirty = bool(state.dirty)
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
        self.conn.execute(
            "INSERT INTO sessions(key, agent, chat_type, conversation_id, thread_id, persistent,"
            " interactive, sandboxed, spawned_by, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                key.raw, key.agent, key.chat_type, key.conversation_id, key.thread_id,
                persistent, interactive, sandboxed, spawned_by, at, at,
            ),
        )  # fmt: skip
        state = _SessionState(
            id=self.conn.last_insert_rowid(),
            leaf_event_id=None,
            leaf_depth=0,
            next_seq=1,
            revision=0,
            dirty=False,
            indexed_seq=0,
            updated_at=at,
        )
        self._sessions[key.raw] = state
        return state

    def _touch(self, key: str, state: _SessionState, at: float) -> None:
        state.revision += 1
        state.updated_at = max(state.updated_at, at)
        self._touched[key] = state

    def _flush_sessions(self) -> None:
        if self._touched:
            self.conn.executemany(
                "UPDATE sessions SET leaf_event_id = ?, leaf_depth = ?, next_seq = ?,"
                " revision = ?, dirty = ?, indexed_seq = ?, updated_at = ? WHERE id = ?",
                [
                    (
                        s.leaf_event_id, s.leaf_depth, s.next_seq, s.revision, s.dirty,
                        s.indexed_seq, s.updated_at, s.id,
                    )
                    for s in self._touched.values()
                ],
            )  # fmt: skip
            self._touched.clear()

    # -- commands -------------------------------------------------------------------------

    def _append(self, cmd: AppendMessage) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key) or self._insert_session(cmd.key, cmd.at)
        message = cmd.message
        if message.timestamp is None:
            # A stamped copy; `structs.replace` would validate the content all over again.
            message = copy.copy(message)
            msgspec.structs.force_setattr(message, "timestamp", cmd.at)
        timestamp = cmd.at if cmd.message.timestamp is None else cmd.message.timestamp
        event_id = self._next_event_id
        depth = state.leaf_depth + 1
        seq = state.next_seq
        text = message.index_text
        self._event_rows.append(
            (
                event_id, state.id, state.leaf_event_id, seq, depth, timestamp, message.role,
                _encode_content(message.content), text,
            )
        )  # fmt: skip
        self._branch_rows.append((state.id, depth, event_id))
        # Same transaction as the event: a committed message is never missing from the
        # index. A dirty session is rebuilt whole later, so nothing is indexed now.
        indexed = False
        if not state.dirty:
            if text is not None:
                self._index_rows.append(index_row(event_id, text, self._last_text(state)))
                indexed = True
            state.indexed_seq = seq
        if text is not None:
            state.last_text = text
        self._next_event_id += 1
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
            state = self._insert_session(
                cmd.key,
                cmd.at,
                persistent=cmd.persistent,
                interactive=cmd.interactive,
                sandboxed=cmd.sandboxed,
                spawned_by=cmd.spawned_by,
            )
            return Created(session_id=state.id, created=True)
        self.conn.execute(
            "UPDATE sessions SET persistent = ?, interactive = ?, sandboxed = ?, spawned_by = ?"
            " WHERE id = ?",
            (cmd.persistent, cmd.interactive, cmd.sandboxed, cmd.spawned_by, state.id),
        )
        self._touch(cmd.key.raw, state, cmd.at)
        return Created(session_id=state.id, created=False)

    def _rewind(self, cmd: RewindSession) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key)
        if state is None:
            return Rejected(reason="not_found", message=f"session_key: no session {key!r}")
        row = self.conn.execute(
            "SELECT depth, kind FROM events WHERE id = ? AND session_id = ?",
            (cmd.to_event_id, state.id),
        ).fetchone()
        if row is None or row[1] != "message":
            return Rejected(
                reason="not_found",
                message=f"to_event_id: {cmd.to_event_id} is not a message of session {key!r}",
            )
        if cmd.to_event_id == state.leaf_event_id:
            return Rewound(leaf_event_id=cmd.to_event_id)
        target_depth = int(row[0])
        # Walk up from the target until we meet the current active branch; everything
        # below the meeting point is replaced by the walked path (a rewind or branch switch).
        path: list[tuple[int, int]] = []
        event_id: int | None = cmd.to_event_id
        depth = target_depth
        while event_id is not None:
            on_branch = self.conn.execute(
                "SELECT 1 FROM active_branch WHERE session_id = ? AND depth = ? AND event_id = ?",
                (state.id, depth, event_id),
            ).fetchone()
            if on_branch:
                break
            path.append((depth, event_id))
            parent = self.conn.execute(
                "SELECT parent_id FROM events WHERE id = ?", (event_id,)
            ).fetchone()
            event_id = parent[0] if parent else None
            depth -= 1
        self.conn.execute(
            "DELETE FROM active_branch WHERE session_id = ? AND depth > ?", (state.id, depth)
        )
        self.conn.executemany(_INSERT_BRANCH, [(state.id, d, e) for d, e in path])
        self.conn.execute(
            "INSERT INTO events(id, session_id, parent_id, seq, depth, ts, kind, content)"
            " VALUES (?, ?, ?, ?, ?, ?, 'rewind', ?)",
            (
                self._next_event_id, state.id, state.leaf_event_id, state.next_seq,
                target_depth, cmd.at, _encode_content(str(cmd.to_event_id)),
            ),
        )  # fmt: skip
        self._next_event_id += 1
        state.next_seq += 1
        state.leaf_event_id, state.leaf_depth = cmd.to_event_id, target_depth
        state.last_text = _UNKNOWN
        # Dirty from here on: its vectors go in this transaction (docs/design.md §2.3).
        drop_session_vectors(self.conn, state.id)
        state.dirty = True
        self._touch(key, state, cmd.at)
        return Rewound(leaf_event_id=cmd.to_event_id)

    def _delete(self, cmd: DeleteSession) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key)
        if state is None:
            return Rejected(reason="not_found", message=f"session_key: no session {key!r}")
        # Its texts' cached vectors go with it, unless another message or chunk holds the
        # same text (docs/design.md §2.3): a deleted chat leaves no vector of its words.
        digests = unshared_digests(self.conn, json.dumps([state.id]))
        events, index_rows = self._delete_session(key, state)
        self.conn.executemany("DELETE FROM vector_cache WHERE digest = ?", [(d,) for d in digests])
        bump_vector_epoch(self.conn)  # its event and session ids may be used again
        return Deleted(events=events, index_rows=index_rows)

    def _delete_session(self, key: str, state: _SessionState) -> tuple[int, int]:
        """Delete a session's rows, index rows, vectors and switches; (events, index rows)."""
        index_rows = self._drop_index_rows(state)
        self.conn.execute("DELETE FROM active_branch WHERE session_id = ?", (state.id,))
        self.conn.execute("DELETE FROM events WHERE session_id = ?", (state.id,))
        events = self.conn.changes()
        self.conn.execute("DELETE FROM sessions WHERE id = ?", (state.id,))
        self.conn.execute("DELETE FROM session_switches WHERE key = ?", (key,))
        del self._sessions[key]
        self._touched.pop(key, None)
        return events, index_rows

    def _erase(self, cmd: EraseIdentity) -> IndexerAck:
        """Erase an identity's data (docs/design.md §2.6); the purge follows the commit."""
        self._flush_sessions()  # the plan reads the session rows
        plan = plan_erasure(self.conn, cmd.agent, cmd.sessions)
        for key in plan.erasure.session_keys:
            state = self._session(key)
            assert state is not None
            self._delete_session(key, state)
        erase_extras(self.conn, plan)
        bump_vector_epoch(self.conn)
        self._purge_after_commit = True
        return Erased(erasure=plan.erasure)

    def _set_switches(self, cmd: SetSwitches) -> IndexerAck:
        key = cmd.key.raw
        self.conn.execute(
            "INSERT INTO session_switches(key) VALUES (?) ON CONFLICT DO NOTHING", (key,)
        )
        self.conn.execute(
            "UPDATE session_switches SET active_memory = coalesce(?, active_memory),"
            " verbose = coalesce(?, verbose), trace = coalesce(?, trace) WHERE key = ?",
            (cmd.active_memory, cmd.verbose, cmd.trace, key),
        )
        return SwitchesSet(switches=read_switches(self.conn, key))

    def _archive(self, cmd: ArchiveSession) -> IndexerAck:
        key = cmd.key.raw
        state = self._session(key)
        if state is None:
            return Rejected(reason="not_found", message=f"session_key: no session {key!r}")
        self.conn.execute("UPDATE sessions SET archived = ? WHERE id = ?", (cmd.archived, state.id))
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
        event_ids = (cmd.keep_ids and self._free_ids(cmd.entries)) or {
            entry.id: self._next_event_id + i for i, entry in enumerate(cmd.entries)
        }
        parents = {
            event_ids[e.id]: event_ids[e.parent_id] if e.parent_id else None for e in cmd.entries
        }
        self.conn.executemany(
            _INSERT_MESSAGE,
            [
                (
                    event_ids[e.id], state.id, parents[event_ids[e.id]], state.next_seq + i,
                    depths[e.id], e.timestamp, e.message.role, _encode_content(e.message.content),
                    e.message.index_text,
                )
                for i, e in enumerate(cmd.entries)
            ],
        )  # fmt: skip
        self._next_event_id = max([self._next_event_id, *(i + 1 for i in event_ids.values())])
        state.next_seq += len(cmd.entries)
        if leaf_import_id is not None:
            leaf_id, leaf_depth = event_ids[leaf_import_id], depths[leaf_import_id]
            branch: list[tuple[int, int, int]] = []
            node: int | None = leaf_id
            depth = leaf_depth
            while node is not None:
                branch.append((state.id, depth, node))
                node, depth = parents[node], depth - 1
            self.conn.executemany(_INSERT_BRANCH, branch)
            state.leaf_event_id, state.leaf_depth = leaf_id, leaf_depth
        # Pre-existing rows are reconciled, not indexed inline (docs/design.md §2.3).
        state.last_text = _UNKNOWN
        drop_session_vectors(self.conn, state.id)
        state.dirty = True
        self._touch(key, state, cmd.at)
        return Imported(session_id=state.id, events=len(cmd.entries))

    def _free_ids(self, entries: Sequence[ImportEntry]) -> dict[str, int] | None:
        """The entries' ids as event ids, if each is a positive integer no event has yet
        (an export imported again keeps its ids, docs/design.md §2.6); else None."""
        if not all(e.id.isascii() and e.id.isdigit() and int(e.id) > 0 for e in entries):
            return None
        ids = {e.id: int(e.id) for e in entries}
        taken = self.conn.execute(
            "SELECT count(*) FROM events WHERE id IN (SELECT value FROM json_each(?))",
            (msgspec.json.encode(list(ids.values())).decode(),),
        ).fetchone()
        if taken is None or taken[0] or len(set(ids.values())) != len(ids):
            return None
        return ids

    def _differs_from_stored(
        self, state: _SessionState, cmd: ImportTranscript, leaf_import_id: str | None
    ) -> str | None:
        """Why the session does not already hold `cmd`'s entries, or None if it does.

        A resumed import (docs/design.md §2.5) skips a session whose first events, in write
        order, are the entries: same parents (by position: the file's ids are not stored),
        timestamps, roles and content. Events after them (the bot went on) are allowed; with
        none, the leaf must be the import's too.
        """
        rows = cast(
            list[tuple[int, int | None, str, float, str | None, bytes]],
            self.conn.execute(
                "SELECT id, parent_id, kind, ts, role, content FROM events"
                " WHERE session_id = ? ORDER BY seq LIMIT ?",
                (state.id, len(cmd.entries) + 1),
            ).fetchall(),
        )
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
            keys = [k for (k,) in self.conn.execute("SELECT key FROM sessions WHERE dirty")]
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
            drop_session_vectors(self.conn, state.id)
            state.dirty = True
            self._touch(key, state, state.updated_at)  # the revision fences a running rebuild
            return MarkedDirty(sessions=1)
        self._flush_sessions()
        # Every row goes at once: cheaper than per-session deletes, and it clears rows a
        # damaged index may hold for no event. `indexed_seq = 0` says there is nothing to drop.
        self.conn.execute("DELETE FROM message_vectors")
        self.conn.execute("INSERT INTO message_fts(message_fts) VALUES ('delete-all')")
        self.conn.execute("UPDATE sessions SET dirty = 1, revision = revision + 1, indexed_seq = 0")
        sessions = self.conn.changes()
        self._sessions.clear()  # the cached rows are stale now
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
        elif state.indexed_seq != _PARTIAL or self._indexed_between(
            state.id, cmd.after_depth, last
        ):
            # A chunk that continues no rebuild: the reconciler always starts at 0, which
            # drops the rows and marks the rebuild under way; else stale rows of a rewound
            # branch would stay indexed in a session called clean, or its rows are indexed
            # already and FTS5 would take them twice.
            return Reindexed(stale=True)
        rows = self._index_branch(state.id, cmd.after_depth, last)
        if last < state.leaf_depth:
            return Reindexed(rows=rows, next_depth=last)
        # Published in the chunk's own transaction: nothing can slip in between.
        bump_vector_epoch(self.conn)  # its old messages need vectors again
        state.dirty = False
        state.indexed_seq = state.next_seq - 1
        self._touched[key] = state
        return Reindexed(rows=rows, next_depth=last, clean=True)

    def _drop_index_rows(self, state: _SessionState) -> int:
        """Delete every index row and vector the session may have; return how many index
        rows went.

        FTS rows are skipped when the session never had any (`indexed_seq == 0`: imported
        or migrated and not yet rebuilt): on a contentless table each delete writes a
        tombstone even for a row that is not there, which made rebuilding imports several
        times slower.
        """
        drop_session_vectors(self.conn, state.id)
        if state.indexed_seq == 0:
            return 0
        self.conn.execute(
            "DELETE FROM message_fts WHERE rowid IN"
            " (SELECT id FROM events WHERE session_id = ? AND text IS NOT NULL)",
            (state.id,),
        )
        return self.conn.changes()

    def _last_text(self, state: _SessionState) -> str | None:
        if state.last_text is _UNKNOWN:
            row = self.conn.execute(_TEXT_AT_OR_ABOVE, (state.id, state.leaf_depth)).fetchone()
            state.last_text = None if row is None else str(row[0])
        return cast(str | None, state.last_text)

    def _indexed_between(self, session_id: int, after_depth: int, last_depth: int) -> bool:
        """Whether an active-branch message at depths (after_depth, last_depth] has an index
        row (FTS5's `_docsize` holds one per indexed rowid)."""
        row = self.conn.execute(
            "SELECT 1 FROM active_branch a JOIN message_fts_docsize d ON d.id = a.event_id"
            " WHERE a.session_id = ? AND a.depth > ? AND a.depth <= ? LIMIT 1",
            (session_id, after_depth, last_depth),
        ).fetchone()
        return row is not None

    def _index_branch(self, session_id: int, after_depth: int, last_depth: int) -> int:
        """Index the active-branch messages at depths (after_depth, last_depth]."""
        row = self.conn.execute(_TEXT_AT_OR_ABOVE, (session_id, after_depth)).fetchone()
        previous = None if row is None else str(row[0])
        index_rows = []
        branch = self.conn.execute(
            "SELECT e.id, e.text FROM active_branch a JOIN events e ON e.id = a.event_id"
            " WHERE a.session_id = ? AND a.depth > ? AND a.depth <= ? AND e.text IS NOT NULL"
            " ORDER BY a.depth",
            (session_id, after_depth, last_depth),
        ).fetchall()
        for event_id, text in cast(list[tuple[int, str]], branch):
            index_rows.append(index_row(event_id, text, previous))
            previous = text
        self.conn.executemany(_INSERT_INDEX, index_rows)
        return len(index_rows)

    def rebuild_session(self, key: str) -> int:
        """Replace a session's index rows with its active branch; mark it clean."""
        state = self._session(key)
        assert state is not None
        self._drop_index_rows(state)
        rows = self._index_branch(state.id, 0, state.leaf_depth)
        bump_vector_epoch(self.conn)
        state.dirty = False
        state.indexed_seq = state.next_seq - 1
        self._touched[key] = state
        return rows


def import_tree(cmd: ImportTranscript) -> tuple[dict[str, int], str | None] | Rejected:
    """The depth of each entry of `cmd` and the entry id its leaf will be, or why the
    entries are not a tree in write order. Both stores' writers ask it (docs/design.md §2.5).
    """
    depths: dict[str, int] = {}
    for i, entry in enumerate(cmd.entries):
        if entry.id in depths:
            where = _entry_field(i, entry, "id")
            return Rejected(reason="invalid", message=f"{where}: {entry.id!r} is repeated")
        if entry.parent_id is not None and entry.parent_id not in depths:
            where = _entry_field(i, entry, "parent_id")
            return Rejected(
                reason="invalid",
                message=f"{where}: {entry.parent_id!r} names no earlier entry",
            )
        depths[entry.id] = depths[entry.parent_id] + 1 if entry.parent_id else 1
    leaf_import_id = cmd.leaf_id or (cmd.entries[-1].id if cmd.entries else None)
    if leaf_import_id is not None and leaf_import_id not in depths:
        return Rejected(reason="invalid", message=f"leaf_id: {leaf_import_id!r} names no entry")
    return depths, leaf_import_id


def import_prefix_differs(
    cmd: ImportTranscript,
    rows: Sequence[Sequence[Any]],
    leaf_event_id: int | None,
    leaf_import_id: str | None,
) -> str | None:
    """Why a session's first stored events (`rows`: id, parent_id, kind, ts, role, content in
    write order, up to one more than the entries) are not `cmd`'s entries, or None if they
    are (docs/design.md §2.5). Both stores' writers ask it, so a resumed import is judged
    by one rule.
    """
    position: dict[int, int] = {}  # stored event id -> its position
    index = {entry.id: i for i, entry in enumerate(cmd.entries)}
    for i, entry in enumerate(cmd.entries):
        where = entry.source or f"entries[{i}]"
        if i >= len(rows):
            return (
                f"{where}: session {cmd.key.raw!r} holds the messages before this one,"
                " not this one; import into a new session"
            )
        event_id, parent_id, kind, ts, role, content = rows[i]
        position[event_id] = i
        parent = None if entry.parent_id is None else index[entry.parent_id]
        what = None
        stored_parent = None if parent_id is None else position.get(parent_id, -1)
        if kind != "message" or stored_parent != parent:
            what = "its place in the tree"
        elif ts != entry.timestamp:
            what = "its timestamp"
        elif role != entry.message.role:
            what = "its role"
        elif bytes(content) != _encode_content(entry.message.content):
            what = "its content"
        if what is not None:
            return (
                f"{where}: session {cmd.key.raw!r} already holds other messages (stored event"
                f" #{event_id} differs in {what}); import into a new session"
            )
    if len(rows) == len(cmd.entries) and leaf_import_id is not None:
        leaf = rows[index[leaf_import_id]][0]
        if leaf_event_id != leaf:
            return (
                f"leaf_id: session {cmd.key.raw!r} holds these messages but its leaf is"
                f" event #{leaf_event_id}, not {leaf_import_id!r}"
            )
    return None


def _entry_field(i: int, entry: ImportEntry, field: str) -> str:
    """How an error names a field of an import entry: by its source line if it has one."""
    return f"{entry.source}: {field}" if entry.source else f"entries[{i}].{field}"


_SESSION_COLUMNS = (
    "key, id, agent, chat_type, conversation_id, thread_id, persistent, interactive, archived,"
    " sandboxed, spawned_by, created_at, updated_at, leaf_event_id, revision, dirty, indexed_seq"
)


class TranscriptReader:
    """Reads one agent database on its own connection (WAL: never blocks the writer)."""

    def __init__(self, conn: apsw.Connection, agent: str) -> None:
        self.conn = conn
        self.agent = agent

    def session(self, key: str) -> SessionInfo | None:
        row = self.conn.execute(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE key = ?", (key,)
        ).fetchone()
        return _session_info(row) if row else None

    def sessions(self) -> list[SessionInfo]:
        rows = self.conn.execute(f"SELECT {_SESSION_COLUMNS} FROM sessions ORDER BY id")
        return [_session_info(row) for row in rows]

    def history(self, key: str, limit: int | None = None) -> list[Event] | None:
        """The active branch, root first (the last `limit` messages); None if no session."""
        with self.conn:  # one read transaction: a consistent snapshot
            found = self.conn.execute("SELECT id FROM sessions WHERE key = ?", (key,)).fetchone()
            if found is None:
                return None
            rows = self.conn.execute(
                "SELECT e.id, e.parent_id, e.seq, e.ts, e.role, e.content FROM active_branch a"
                " JOIN events e ON e.id = a.event_id WHERE a.session_id = ?"
                " ORDER BY a.depth DESC LIMIT ?",
                (found[0], -1 if limit is None else limit),
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

    def switches(self, key: str) -> SessionSwitches:
        """The session's slash-command switches (the defaults if never set)."""
        return read_switches(self.conn, key)

    def dirty_sessions(self, limit: int) -> list[tuple[str, int]]:
        """Up to `limit` dirty sessions as (key, revision), oldest first."""
        rows = self.conn.execute(
            "SELECT key, revision FROM sessions WHERE dirty ORDER BY id LIMIT ?", (limit,)
        )
        return [(str(key), int(revision)) for key, revision in rows]

    def stats(
        self,
        *,
        check_integrity: bool = True,
        vector_name: str | None = None,
        vector_after: int = 0,
        vector_epoch: int | None = None,
    ) -> IndexStats:
        """The database's counts; with `vector_name`, how many rows wait for its vectors
        (counted above the embedder actor's watermark `vector_after`/`vector_epoch`:
        `storage.vectors.pending_count`)."""

        def one(sql: str) -> int:
            row = self.conn.execute(sql).fetchone()
            return int(row[0]) if row else 0

        with self.conn:
            sessions = one("SELECT count(*) FROM sessions")
            events = one("SELECT count(*) FROM events")
            active = one(
                "SELECT count(*) FROM active_branch a JOIN events e ON e.id = a.event_id"
                " WHERE e.text IS NOT NULL"
            )
            indexed = one("SELECT count(*) FROM message_fts")
            dirty = one("SELECT count(*) FROM sessions WHERE dirty")
            pending = (
                0
                if vector_name is None
                else pending_count(self.conn, vector_name, after=vector_after, epoch=vector_epoch)
            )
        pages = one("PRAGMA page_count") * one("PRAGMA page_size")
        return IndexStats(
            agent=self.agent,
            sessions=sessions,
            events=events,
            active_messages=active,
            indexed_messages=indexed,
            dirty_sessions=dirty,
            db_bytes=pages,
            fts_integrity_ok=fts_integrity_ok(self.conn) if check_integrity else True,
            vectors_pending=pending,
            embedder=vector_name,
        )

    def list_sessions(
        self,
        *,
        chat_type: ChatType | None = None,
        peer: str | None = None,
        owner: PrivateScope | None = None,
        archived: bool | None = None,
    ) -> list[SessionInfo]:
        """`mem.sessions.list`'s filters (storage/userdata.py `list_sessions`)."""
        return list_sessions(
            self.conn, chat_type=chat_type, peer=peer, owner=owner, archived=archived
        )

    def sandboxed(self, key: str) -> bool:
        """Whether session `key` exists and is sandboxed."""
        row = self.conn.execute("SELECT sandboxed FROM sessions WHERE key = ?", (key,)).fetchone()
        return row is not None and bool(row[0])

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
        """The `keep` best visible matches of `plan` (storage/search.py `search_scope`)."""
        return search_scope(
            self.conn,
            plan,
            scope=scope,
            caller=caller,
            session_key=session_key,
            keep=keep,
            stats=stats,
        )

    def private_message(
        self, event_id: int, key: str, caller: str, scope: PrivateScope
    ) -> tuple[str, float, str] | None:
        """The message behind a `session:<key>#<id>` path if `caller` may read it."""
        return private_message(self.conn, event_id, key, self.agent, caller, scope)

    def search_notes(self, plan: MatchPlan, keep: int) -> list[NoteHit]:
        """The `keep` best memory-note chunks (storage/notes.py `search_notes`)."""
        return search_notes(self.conn, plan, keep)

    def note_files(self) -> dict[str, NoteStat]:
        """Every indexed note file by workspace-relative path."""
        return indexed_note_files(self.conn)

    def plan_erasure(self, scope: PrivateScope) -> AgentErasure:
        """What erasing the identity `scope` would remove (storage/userdata.py
        `plan_erasure`, which the erase itself runs too), in one snapshot."""
        with self.conn:
            plan = plan_erasure(self.conn, self.agent, scope)
        return plan.erasure

    def session_trees(self, scope: PrivateScope | None) -> list[SessionTree]:
        """The identity's sessions (None: every session) with their whole trees
        (storage/userdata.py)."""
        return session_trees(self.conn, scope)

    def disk_usage(self) -> DiskUsage | None:
        """The database's bytes on disk by part (storage/footprint.py)."""
        return disk_usage(self.conn)

    # -- vectors (storage/reads.py "Vectors") --------------------------------------------

    def pending_vectors(
        self, name: str, *, after: int, epoch: int | None, limit: int
    ) -> PendingBatch:
        return pending_batch(self.conn, name, after=after, epoch=epoch, limit=limit)

    def cached_vectors(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        return cached_vectors(self.conn, name, digests)

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
        sql, params = scope_sql(scope, caller, session_key)
        return nearest_message_rows(
            self.conn,
            query,
            name=name,
            visible_sql=f"SELECT id FROM ({sql})",
            visible_params=params,
            k=k,
        )

    def message_vectors(self, event_ids: Sequence[int], name: str) -> dict[int, numpy.ndarray]:
        return message_vectors_of(self.conn, event_ids, name=name)

    def message_rows(self, event_ids: Sequence[int]) -> list[MessageRow]:
        return [
            MessageRow(int(i), str(key), float(ts), str(role), str(text), int(sid))
            for i, key, ts, role, text, sid in _by_ids(
                self.conn,
                "SELECT e.id, s.key, e.ts, e.role, e.text, e.session_id FROM events e"
                " JOIN sessions s ON s.id = e.session_id",
                "e.id",
                event_ids,
            )
        ]

    def nearest_notes(self, query: numpy.ndarray, *, name: str, k: int) -> list[Near]:
        return nearest_note_rows(self.conn, query, name=name, k=k)

    def note_vectors(self, chunk_ids: Sequence[int], name: str) -> dict[int, numpy.ndarray]:
        return note_vectors_of(self.conn, chunk_ids, name=name)

    def note_rows(self, chunk_ids: Sequence[int]) -> list[NoteRow]:
        return [
            NoteRow(int(i), str(path), int(start), int(end), str(text))
            for i, path, start, end, text in _by_ids(
                self.conn,
                "SELECT id, path, start_line, end_line, text FROM note_chunks",
                "id",
                chunk_ids,
            )
        ]


def _by_ids(
    conn: apsw.Connection, select: str, column: str, ids: Sequence[int]
) -> list[tuple[Any, ...]]:
    if not ids:
        return []
    sql = f"{select} WHERE {column} IN (SELECT value FROM json_each(?))"
    return cast(list[tuple[Any, ...]], conn.execute(sql, (json.dumps(list(ids)),)).fetchall())


def read_switches(conn: apsw.Connection, key: str) -> SessionSwitches:
    row = conn.execute(
        "SELECT active_memory, verbose, trace FROM session_switches WHERE key = ?", (key,)
    ).fetchone()
    if row is None:
        return SessionSwitches()
    active_memory, verbose, trace = row
    return SessionSwitches(active_memory=bool(active_memory), verbose=bool(verbose), trace=trace)


def fts_integrity_ok(conn: apsw.Connection) -> bool:
    """FTS5's own integrity check of the message index.

    Through `PRAGMA integrity_check(message_fts)` (SQLite ≥ 3.44), which only reads: the
    `INSERT ... ('integrity-check')` form would take the write lock and stall the indexer.
    """
    return conn.execute("PRAGMA integrity_check(message_fts)").fetchall() == [("ok",)]


_SESSION_FIELDS = [name.strip() for name in _SESSION_COLUMNS.split(",")]


def _session_info(row: Iterable[object]) -> SessionInfo:
    values = dict(zip(_SESSION_FIELDS, row, strict=True))
    values["session_id"] = values.pop("id")
    for flag in ("persistent", "interactive", "archived", "sandboxed", "dirty"):
        values[flag] = bool(values[flag])
    return msgspec.convert(values, SessionInfo)


def agent_db_path(state_dir: Path, agent: str) -> Path:
    """`state_dir/agents/<agent>/memory.db` (docs/design.md §1.4)."""
    return state_dir / "agents" / agent / "memory.db"
