"""A user's data in the databases (docs/design.md §2.6): whose sessions and records are whose,
what an erase removes, and the purge that takes erased text off the disk.

Whose: an identity's sessions are selected by a `PrivateScope` (`Config.sessions_of`: the
direct chats of its peers, and the main and explicit sessions if it is the owner) and every
session those spawned, transitively; its records by `user_id`. The selection is SQL run
inside the erasing transaction, so a session created just before the erase is erased too.

The purge: deleting rows leaves their bytes in free pages, in the FTS5 segments (a
contentless table's delete is a tombstone; the terms stay until segments merge) and in
the WAL. So the erase merges the index (`optimize`) in its transaction, and after the
commit the writer runs `VACUUM` (every page rebuilt from live rows) and a `TRUNCATE`
checkpoint (the WAL emptied to zero bytes).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

import apsw

from ..protocol.config import PrivateScope
from ..protocol.content import Message, Role
from ..protocol.errors import InvalidInputError
from ..protocol.recall import SessionSwitches
from ..protocol.records import Record, RecordRelation
from ..protocol.session_key import ChatType, parse_session_key
from ..protocol.transcript import Event, SessionInfo
from ..protocol.userdata import AgentErasure, RecordErasure
from .db import describe
from .vectors import text_digest

# The sessions of a `PrivateScope` and those they spawned: `owned(key)`, with `:peers`
# (JSON list or NULL for every peer) and `:owner` bound (docs/design.md §2.6).
_OWNED = (
    "WITH RECURSIVE owned(key) AS ("
    " SELECT key FROM sessions WHERE chat_type IN ('direct', 'explicit') AND CASE"
    "  WHEN chat_type = 'direct' AND conversation_id IS NOT NULL"
    "  THEN :peers IS NULL OR conversation_id IN (SELECT value FROM json_each(:peers))"
    "  ELSE :owner END"
    " UNION SELECT s.key FROM sessions s JOIN owned o ON s.spawned_by = o.key)"
)


def _scope_params(scope: PrivateScope) -> dict[str, object]:
    peers = None if scope.peers is None else json.dumps(scope.peers)
    return {"peers": peers, "owner": scope.owner}


def list_sessions(
    conn: apsw.Connection,
    *,
    chat_type: ChatType | None = None,
    peer: str | None = None,
    owner: PrivateScope | None = None,
    archived: bool | None = None,
) -> list[SessionInfo]:
    """The sessions of one agent database that pass every filter given, oldest first.

    `peer`: direct chats with that conversation id; `owner`: the sessions of an identity
    (`Config.sessions_of`) and those they spawned; `archived`: only (un)archived ones.
    """
    # Here, not at the top: storage/transcripts.py (the writer) imports this module.
    from .transcripts import _SESSION_COLUMNS, _session_info

    where: list[str] = []
    params: dict[str, object] = {}
    prefix = ""
    if owner is not None:
        prefix = _OWNED
        params |= _scope_params(owner)
        where.append("key IN (SELECT key FROM owned)")
    if chat_type is not None:
        where.append("chat_type = :chat_type")
        params["chat_type"] = chat_type
    if peer is not None:
        where.append("chat_type = 'direct' AND conversation_id = :peer")
        params["peer"] = peer
    if archived is not None:
        where.append("archived = :archived")
        params["archived"] = archived
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    sql = f"{prefix} SELECT {_SESSION_COLUMNS} FROM sessions{condition} ORDER BY id"
    return [_session_info(row) for row in conn.execute(sql, params)]


@dataclass
class ErasurePlan:
    """What an erase of one identity removes from one agent database (`plan_erasure`)."""

    erasure: AgentErasure
    switch_keys: list[str] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)  # vector_cache entries to delete


def plan_erasure(conn: apsw.Connection, agent: str, scope: PrivateScope) -> ErasurePlan:
    """Count what erasing the identity `scope` selects would remove; reads only.

    The same function plans a dry run (on a reader) and the erase (in the writer's
    transaction), so the two always agree.
    """
    params = _scope_params(scope)
    rows = cast(
        list[tuple[int, str]],
        conn.execute(
            f"{_OWNED} SELECT s.id, s.key FROM sessions s JOIN owned USING (key) ORDER BY s.id",
            params,
        ).fetchall(),
    )
    ids = json.dumps([int(r[0]) for r in rows])
    keys = [str(r[1]) for r in rows]

    def count(sql: str) -> int:
        return _count(conn, sql, ids)

    in_ids = "IN (SELECT value FROM json_each(?1))"
    events = count(f"SELECT count(*) FROM events WHERE session_id {in_ids}")
    index_rows = count(
        "SELECT count(*) FROM message_fts WHERE rowid IN"
        f" (SELECT id FROM events WHERE session_id {in_ids} AND text IS NOT NULL)"
    )
    vectors = count(f"SELECT count(*) FROM message_vectors WHERE session_id {in_ids}")
    switch_keys = _switch_keys(conn, set(keys), scope)
    digests = unshared_digests(conn, ids)
    cached = sum(
        _count(conn, "SELECT count(*) FROM vector_cache WHERE digest = ?", d) for d in digests
    )
    erasure = AgentErasure(
        agent=agent,
        session_keys=tuple(keys),
        events=events,
        index_rows=index_rows,
        vectors=vectors,
        cached_vectors=cached,
        switches=len(switch_keys),
    )
    return ErasurePlan(erasure=erasure, switch_keys=switch_keys, digests=digests)


def _count(conn: apsw.Connection, sql: str, value: object) -> int:
    row = conn.execute(sql, (value,)).fetchone()
    return int(cast(int, row[0])) if row else 0


def _switch_keys(conn: apsw.Connection, keys: set[str], scope: PrivateScope) -> list[str]:
    """Switch rows of the erased sessions, and of keys of the identity with no session (a
    switch may be set before a session's first message)."""
    found = []
    rows = conn.execute(
        "SELECT w.key, s.id IS NOT NULL FROM session_switches w LEFT JOIN sessions s USING (key)"
    )
    for key, has_session in rows:
        if key in keys:
            found.append(str(key))
        elif not has_session:
            try:
                parsed = parse_session_key(key)
            except InvalidInputError:
                continue
            if scope.holds(parsed):
                found.append(str(key))
    return found


def unshared_digests(conn: apsw.Connection, ids: str) -> list[bytes]:
    """Content-hash keys of the texts of sessions `ids` (erased or deleted) that no remaining
    message or note chunk has.

    Only remaining texts of a length some erased text has are hashed (SQL filters by
    length first), so this is one scan in C and little hashing. The length is in bytes
    (`octet_length`): SQLite's `length` stops at a NUL, which a message's text may hold.
    """
    erased = conn.execute(
        "SELECT text FROM events WHERE session_id IN (SELECT value FROM json_each(?))"
        " AND text IS NOT NULL",
        (ids,),
    ).fetchall()
    if not erased:
        return []
    texts = {str(t) for (t,) in erased}
    lengths = json.dumps(sorted({len(t.encode("utf-8", "surrogatepass")) for t in texts}))
    kept = conn.execute(
        "SELECT text FROM events WHERE session_id NOT IN (SELECT value FROM json_each(?1))"
        " AND text IS NOT NULL AND octet_length(text) IN (SELECT value FROM json_each(?2))"
        " UNION SELECT text FROM note_chunks"
        " WHERE octet_length(text) IN (SELECT value FROM json_each(?2))",
        (ids, lengths),
    ).fetchall()
    shared = texts & {str(t) for (t,) in kept}
    return sorted(text_digest(t) for t in texts - shared)


def erase_extras(conn: apsw.Connection, plan: ErasurePlan) -> None:
    """The rest of an erase once its sessions are deleted (writer only, in its transaction):
    switch rows, unshared cached vectors, and a merge of the index so that no deleted
    term stays in an FTS5 segment."""
    conn.executemany("DELETE FROM session_switches WHERE key = ?", [(k,) for k in plan.switch_keys])
    conn.executemany("DELETE FROM vector_cache WHERE digest = ?", [(d,) for d in plan.digests])
    if plan.erasure.index_rows:
        conn.execute("INSERT INTO message_fts(message_fts) VALUES ('optimize')")


# -- records.db ---------------------------------------------------------------------------


def plan_record_erasure(conn: apsw.Connection, user_ids: tuple[str, ...]) -> RecordErasure:
    """Count the records of these users and the relations touching them; reads only."""
    users = json.dumps(list(user_ids))
    row = conn.execute(
        "WITH gone(seq) AS (SELECT seq FROM records WHERE user_id IN"
        " (SELECT value FROM json_each(?)))"
        " SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM relations"
        "  WHERE source IN (SELECT seq FROM gone) OR target IN (SELECT seq FROM gone))",
        (users,),
    ).fetchone()
    records, relations = (int(row[0]), int(row[1])) if row else (0, 0)
    return RecordErasure(user_ids=user_ids, records=records, relations=relations)


def erase_records(conn: apsw.Connection, user_ids: tuple[str, ...]) -> RecordErasure:
    """Delete the records of these users, their relations and index rows, and merge the
    index (writer only, in its transaction); return what went."""
    erasure = plan_record_erasure(conn, user_ids)
    users = json.dumps(list(user_ids))
    gone = "SELECT seq FROM records WHERE user_id IN (SELECT value FROM json_each(?))"
    conn.execute(f"DELETE FROM record_fts WHERE rowid IN ({gone})", (users,))
    conn.execute(f"DELETE FROM records WHERE seq IN ({gone})", (users,))  # relations cascade
    if erasure.records:
        conn.execute("INSERT INTO record_fts(record_fts) VALUES ('optimize')")
    return erasure


# -- the purge ----------------------------------------------------------------------------


def purge(conn: apsw.Connection) -> str | None:
    """Rewrite the database from its live rows and empty its WAL; None when both finished,
    else what stopped them (the erase itself is committed either way).

    Writer only, outside any transaction. `VACUUM` rebuilds every page, so no deleted
    byte survives in a free page or a page's unused space; the `TRUNCATE` checkpoint copies
    the WAL into the file and cuts the WAL to zero bytes (it waits up to the busy timeout
    for readers still on an older snapshot).
    """
    try:
        conn.execute("VACUUM")
        busy, _log, _done = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone() or (1, 0, 0)
    except apsw.Error as exc:
        return f"the purge failed: {describe(exc)}"
    if busy:
        return "the WAL could not be emptied: a reader held an old snapshot; run the erase again"
    return None


# -- export (reader connections) ----------------------------------------------------------


class SessionTree(NamedTuple):
    """One session as an export needs it: its metadata, every message of its tree in write
    order (rewind events, which only moved the leaf, are left out) and its switches."""

    info: SessionInfo
    events: list[Event]
    switches: SessionSwitches | None


def session_trees(conn: apsw.Connection, scope: PrivateScope | None) -> list[SessionTree]:
    """The sessions of the identity `scope` selects (and those they spawned), or with None
    every session of the database (`migrate`), with their whole trees; one read transaction."""
    # Here, not at the top: storage/transcripts.py (the writer) imports this module.
    from .transcripts import _decode_content

    with conn:
        trees = []
        for info in list_sessions(conn, owner=scope):
            rows = cast(
                list[tuple[int, int | None, int, float, Role, bytes]],
                conn.execute(
                    "SELECT id, parent_id, seq, ts, role, content FROM events"
                    " WHERE session_id = ? AND kind = 'message' ORDER BY id",
                    (info.session_id,),
                ).fetchall(),
            )
            events = [
                Event(
                    id=event_id,
                    session_key=info.key,
                    parent_id=parent_id,
                    seq=seq,
                    timestamp=ts,
                    message=Message(role=role, content=_decode_content(content)),
                )
                for event_id, parent_id, seq, ts, role, content in rows
            ]
            switch = conn.execute(
                "SELECT active_memory, verbose, trace FROM session_switches WHERE key = ?",
                (info.key,),
            ).fetchone()
            switches = None
            if switch is not None:
                switches = SessionSwitches(
                    active_memory=bool(switch[0]), verbose=bool(switch[1]), trace=switch[2]
                )
            trees.append(SessionTree(info, events, switches))
    return trees


class RecordRow(NamedTuple):
    """A record as an export needs it: the record and its stored times."""

    record: Record
    created_at: float
    invalidated_at: float | None


class RelationRow(NamedTuple):
    """A relation between two exported records, and when it was stored."""

    relation: RecordRelation
    created_at: float


class UserRecords(NamedTuple):
    """A user's records as an export needs them (`records_of`, on either store): the
    records in insertion order, the relations among them in insertion order, and how many
    relations lead from them to other records (not exported: their other end is not the
    user's)."""

    records: list[RecordRow]
    relations: list[RelationRow]
    outside: int


def user_relations(
    seqs: dict[int, str], edges: Sequence[tuple[int, int, str, float]]
) -> tuple[list[RelationRow], int]:
    """The `edges` (source seq, target seq, relation, created_at) touching a user's records
    `seqs` (seq -> id) whose both ends are the user's, and how many lead elsewhere."""
    relations = [
        RelationRow(RecordRelation(relation=name, source_id=seqs[s], target_id=seqs[t]), at)
        for s, t, name, at in edges
        if s in seqs and t in seqs
    ]
    return relations, len(edges) - len(relations)


def records_of(
    conn: apsw.Connection, user_ids: tuple[str, ...] | None, agent: str | None
) -> UserRecords:
    """The records of these users (None: of every user and none, as `migrate` copies them;
    with `agent`: those scoped to it or to no agent) and
    their relations (`UserRecords`); one read transaction. Expired records are included:
    they are still stored."""
    # Here, not at the top: storage/records.py (the writer) imports this module.
    from .records import _COLUMNS, _record

    users = None if user_ids is None else json.dumps(list(user_ids))
    where = "(:users IS NULL OR r.user_id IN (SELECT value FROM json_each(:users)))"
    if agent is not None:
        where += " AND (r.agent_id IS NULL OR r.agent_id = :agent)"
    params = {"users": users, "agent": agent}
    with conn:
        rows = cast(
            list[tuple[Any, ...]],
            conn.execute(
                f"SELECT {_COLUMNS.format(a='r')}, r.created_at, r.invalidated_at FROM records r"
                f" WHERE {where} ORDER BY r.seq",
                params,
            ).fetchall(),
        )
        records: list[RecordRow] = []
        seqs: dict[int, str] = {}
        for row in rows:
            seq, record = _record(row[:-2])
            seqs[seq] = record.id
            records.append(RecordRow(record, float(row[-2]), row[-1]))
        chosen = json.dumps(sorted(seqs))
        edges = cast(
            list[tuple[int, int, str, float]],
            conn.execute(
                "SELECT source, target, relation, created_at FROM relations"
                " WHERE source IN (SELECT value FROM json_each(?1))"
                " OR target IN (SELECT value FROM json_each(?1)) ORDER BY id",
                (chosen,),
            ).fetchall(),
        )
    relations, outside = user_relations(seqs, edges)
    return UserRecords(records, relations, outside)
