"""A user's data on PostgreSQL (docs/design.md §2.6, §11): what an erase removes, the erase
in the writer's transaction, and the purge after its commit. The twin of storage/userdata.py,
with the same selection (`_OWNED`: a `PrivateScope`'s sessions and every session they
spawned), the same `AgentErasure` and `RecordErasure` counts and the same export rows.

The erase locks the selected session rows first (key order, `FOR UPDATE`), then counts
and deletes, so an append another process is making to one of them lands before (and is
erased) or waits and then finds its session gone. Vectors go with their index rows (a
foreign key, storage/pg/vectors.py); the cached vectors of the erased texts that no
remaining message or note chunk of the agent has are deleted too. After the commit the
writer VACUUMs the tables the erase touched (`purged`): the erased rows' space is
reclaimed; a snapshot older than the erase keeps them until a later VACUUM, and the
server's WAL and backups are the operator's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import psycopg

from ...protocol.config import PrivateScope
from ...protocol.content import Message
from ...protocol.errors import InvalidInputError
from ...protocol.indexer import Erased, EraseIdentity, IndexerAck
from ...protocol.recall import SessionSwitches
from ...protocol.session_key import parse_session_key
from ...protocol.transcript import Event
from ...protocol.userdata import AgentErasure, RecordErasure
from ..userdata import (
    ErasurePlan,
    RecordRow,
    SessionTree,
    UserRecords,
    user_relations,
)
from ..vectors import text_digest
from .db import SCHEMA, describe
from .records import _COLUMNS, _record
from .transcripts import (
    _SESSION_COLUMNS,
    Connection,
    _decode_content,
    _session_info,
    _text,
    read_switches,
)

_S = SCHEMA
# storage/userdata.py `_OWNED` for one agent: `owned(id, key)`.
_OWNED = (
    "WITH RECURSIVE owned(id, key) AS ("
    f" SELECT id, key FROM {_S}.sessions WHERE agent = %(agent)s"
    "  AND chat_type IN ('direct', 'explicit') AND CASE"
    "  WHEN chat_type = 'direct' AND conversation_id IS NOT NULL"
    "  THEN %(peers)s::text[] IS NULL OR conversation_id = ANY(%(peers)s::text[])"
    "  ELSE %(owner)s END"
    f" UNION SELECT s.id, s.key FROM {_S}.sessions s JOIN owned o"
    "  ON s.agent = %(agent)s AND s.spawned_by = o.key)"
)
# What the purge VACUUMs: every table an erase deletes from.
_ERASED_TABLES = (
    "events",
    "active_branch",
    "message_index",
    "message_vectors",
    "vector_cache",
    "sessions",
    "session_switches",
)


def _scope_params(agent: str, scope: PrivateScope) -> dict[str, Any]:
    peers = None if scope.peers is None else list(scope.peers)
    return {"agent": agent, "peers": peers, "owner": scope.owner}


def plan_erasure(
    conn: Connection,
    tenant: str,
    scope: PrivateScope,
    *,
    agent: str | None = None,
    lock: bool = False,
) -> ErasurePlan:
    """Count what erasing the identity `scope` selects in `tenant`'s rows would remove
    (storage/userdata.py `plan_erasure`); reads only. `agent` names the ack's agent
    (default: `tenant`). With `lock` (the erase, in the writer's transaction) the selected
    session rows are locked first, in key order."""
    params = _scope_params(tenant, scope)
    rows = conn.execute(
        f"{_OWNED} SELECT s.id, s.key FROM {_S}.sessions s JOIN owned USING (id)"
        " WHERE s.agent = %(agent)s ORDER BY s.id",
        params,
    ).fetchall()
    if lock and rows:
        conn.execute(
            f"SELECT 1 FROM {_S}.sessions WHERE agent = %s AND id = ANY(%s) ORDER BY key FOR UPDATE",
            (tenant, [int(r[0]) for r in rows]),
        )
    ids = [int(r[0]) for r in rows]
    keys = [str(r[1]) for r in rows]
    count = conn.execute(
        f"SELECT (SELECT count(*) FROM {_S}.events WHERE agent = %(agent)s"
        "  AND session_id = ANY(%(ids)s)),"
        f" (SELECT count(*) FROM {_S}.message_index WHERE agent = %(agent)s"
        "  AND session_id = ANY(%(ids)s)),"
        f" (SELECT count(*) FROM {_S}.message_vectors WHERE agent = %(agent)s"
        "  AND session_id = ANY(%(ids)s))",
        {"agent": tenant, "ids": ids},
    ).fetchone()
    events, index_rows, vectors = (int(n) for n in count) if count else (0, 0, 0)
    switch_keys = _switch_keys(conn, tenant, set(keys), scope)
    digests = unshared_digests(conn, tenant, ids)
    row = conn.execute(
        f"SELECT count(*) FROM {_S}.vector_cache WHERE agent = %s AND digest = ANY(%s)",
        (tenant, digests),
    ).fetchone()
    erasure = AgentErasure(
        agent=tenant if agent is None else agent,
        session_keys=tuple(keys),
        events=events,
        index_rows=index_rows,
        vectors=vectors,
        cached_vectors=int(row[0]) if row else 0,
        switches=len(switch_keys),
    )
    return ErasurePlan(erasure=erasure, switch_keys=switch_keys, digests=digests)


def _switch_keys(conn: Connection, tenant: str, keys: set[str], scope: PrivateScope) -> list[str]:
    """Switch rows of the erased sessions, and of keys of the identity with no session."""
    found = []
    rows = conn.execute(
        f"SELECT w.key, s.id IS NOT NULL FROM {_S}.session_switches w LEFT JOIN {_S}.sessions s"
        " ON s.agent = w.agent AND s.key = w.key WHERE w.agent = %s ORDER BY w.key",
        (tenant,),
    ).fetchall()
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


def unshared_digests(conn: Connection, tenant: str, ids: Sequence[int]) -> list[bytes]:
    """Content-hash keys of the erased texts that no remaining message or note chunk of the
    agent has (only remaining texts of a byte length some erased text has are read)."""
    if not ids:
        return []
    erased = conn.execute(
        f"SELECT text FROM {_S}.events WHERE agent = %s AND session_id = ANY(%s)"
        " AND text IS NOT NULL",
        (tenant, list(ids)),
    ).fetchall()
    if not erased:
        return []
    texts = {_text(t) for (t,) in erased}
    lengths = sorted({len(t.encode("utf-8")) for t in texts})
    kept = conn.execute(
        f"SELECT text FROM {_S}.events WHERE agent = %(agent)s AND session_id <> ALL(%(ids)s)"
        " AND text IS NOT NULL AND octet_length(text) = ANY(%(lengths)s)"
        f" UNION SELECT text FROM {_S}.note_chunks WHERE agent = %(agent)s"
        " AND octet_length(text) = ANY(%(lengths)s)",
        {"agent": tenant, "ids": list(ids), "lengths": lengths},
    ).fetchall()
    shared = texts & {_text(t) for (t,) in kept}
    return sorted(text_digest(t) for t in texts - shared)


def session_trees(conn: Connection, tenant: str, scope: PrivateScope | None) -> list[SessionTree]:
    """The sessions of `tenant` that the identity `scope` selects (and those they spawned),
    or with None every session of `tenant` (`migrate`), oldest first, with their whole trees (storage/userdata.py `session_trees`: every
    message in write order, the switches); the caller's one snapshot."""
    columns = ", ".join(f"s.{c.strip()}" for c in _SESSION_COLUMNS.split(","))
    if scope is None:
        sql = f"SELECT {columns} FROM {_S}.sessions s WHERE s.agent = %(agent)s ORDER BY s.id"
        params: dict[str, Any] = {"agent": tenant}
    else:
        sql = (
            f"{_OWNED} SELECT {columns} FROM {_S}.sessions s JOIN owned USING (id)"
            " WHERE s.agent = %(agent)s ORDER BY s.id"
        )
        params = _scope_params(tenant, scope)
    infos = [_session_info(row) for row in conn.execute(sql, params).fetchall()]
    trees = []
    for info in infos:
        rows = conn.execute(
            f"SELECT id, parent_id, seq, ts, role, content FROM {_S}.events"
            " WHERE agent = %s AND session_id = %s AND kind = 'message' ORDER BY id",
            (tenant, info.session_id),
        ).fetchall()
        events = [
            Event(
                id=int(event_id),
                session_key=info.key,
                parent_id=parent_id,
                seq=int(seq),
                timestamp=float(ts),
                message=Message(role=role, content=_decode_content(content)),
            )
            for event_id, parent_id, seq, ts, role, content in rows
        ]
        switches: SessionSwitches | None = None
        if conn.execute(
            f"SELECT 1 FROM {_S}.session_switches WHERE agent = %s AND key = %s",
            (tenant, info.key),
        ).fetchone():
            switches = read_switches(conn, tenant, info.key)
        trees.append(SessionTree(info, events, switches))
    return trees


def erase_identity(
    conn: Connection, tenant: str, cmd: EraseIdentity, delete_session: Callable[[str], object]
) -> IndexerAck:
    """The writer's handler of `EraseIdentity`, in its transaction: plan (locking the
    sessions), delete each session as `DeleteSession` does (`delete_session(key)`, the
    writer's own), then the switch rows and the unshared cached vectors. The writer has
    written its session rows first; `purged` follows the commit."""
    plan = plan_erasure(conn, tenant, cmd.sessions, agent=cmd.agent, lock=True)
    for key in plan.erasure.session_keys:
        delete_session(key)
    with conn.cursor() as cur:
        cur.executemany(
            f"DELETE FROM {_S}.session_switches WHERE agent = %s AND key = %s",
            [(tenant, key) for key in plan.switch_keys],
        )
    conn.execute(
        f"DELETE FROM {_S}.vector_cache WHERE agent = %s AND digest = ANY(%s)",
        (tenant, plan.digests),
    )
    return Erased(erasure=plan.erasure)


def purged(conn: Connection, acks: list[IndexerAck]) -> list[IndexerAck]:
    """`acks` as they are, or, when one is `Erased` (its transaction committed), after a
    VACUUM of the tables an erase deletes from, with `purged` (or `problem`) set. Outside
    any transaction, on the writer's connection."""
    if not any(isinstance(a, Erased) for a in acks):
        return acks
    problem = None
    try:
        # A worker bound by row-level security does not own the tables: VACUUM would skip
        # them with a mere warning, so say so instead of reporting a purge.
        row = conn.execute(
            "SELECT current_user, bool_and(pg_has_role(c.relowner, 'USAGE'))"
            " FROM pg_catalog.pg_class c WHERE c.oid = ANY(%s::regclass[])",
            ([f"{_S}.{table}" for table in _ERASED_TABLES],),
        ).fetchone()
        if row is not None and not row[1]:
            problem = (
                f"the purge was not run: role {row[0]} does not own the tables; the owner's"
                " VACUUM (or autovacuum) reclaims the erased rows' space"
            )
        else:
            for table in _ERASED_TABLES:
                conn.execute(f"VACUUM {_S}.{table}")
    except psycopg.Error as exc:
        problem = f"the purge failed: {describe(exc)}"
    return [
        Erased(erasure=msgspec.structs.replace(a.erasure, purged=problem is None, problem=problem))
        if isinstance(a, Erased)
        else a
        for a in acks
    ]


# -- records (the records tenant, storage/pg/records.py) ----------------------------------


def plan_record_erasure(conn: Connection, tenant: str, user_ids: tuple[str, ...]) -> RecordErasure:
    """Count `tenant`'s records of these users and the relations touching them; reads only.
    The same function plans a dry run (on a reader) and the erase (in the writer's
    transaction), so the two always agree."""
    row = conn.execute(
        f"WITH gone AS (SELECT seq FROM {_S}.records WHERE agent = %(agent)s"
        "  AND user_id = ANY(%(users)s))"
        " SELECT (SELECT count(*) FROM gone),"
        f" (SELECT count(*) FROM {_S}.record_relations WHERE agent = %(agent)s"
        "  AND (source IN (SELECT seq FROM gone) OR target IN (SELECT seq FROM gone)))",
        {"agent": tenant, "users": list(user_ids)},
    ).fetchone()
    records, relations = (int(row[0]), int(row[1])) if row else (0, 0)
    return RecordErasure(user_ids=user_ids, records=records, relations=relations)


def records_of(
    conn: Connection, tenant: str, user_ids: tuple[str, ...] | None, agent: str | None
) -> UserRecords:
    """`tenant`'s records of these users (None: every record; with `agent`: those scoped
    to it or to no agent) and their relations (storage/userdata.py `records_of`); the
    caller's one snapshot."""
    where = "r.agent = %(tenant)s AND (%(users)s::text[] IS NULL OR r.user_id = ANY(%(users)s))"
    if agent is not None:
        where += " AND (r.agent_id IS NULL OR r.agent_id = %(agent)s)"
    users = None if user_ids is None else list(user_ids)
    params = {"tenant": tenant, "users": users, "agent": agent}
    rows = conn.execute(
        f"SELECT {_COLUMNS.format(a='r')}, r.created_at, r.invalidated_at FROM {_S}.records r"
        f" WHERE {where} ORDER BY r.seq",
        params,
    ).fetchall()
    records: list[RecordRow] = []
    seqs: dict[int, str] = {}
    for row in rows:
        seq, record = _record(row[:-2])
        seqs[seq] = record.id
        records.append(RecordRow(record, float(row[-2]), row[-1]))
    edges = conn.execute(
        f"SELECT source, target, relation, created_at FROM {_S}.record_relations"
        " WHERE agent = %(tenant)s AND (source = ANY(%(seqs)s) OR target = ANY(%(seqs)s))"
        " ORDER BY id",
        {"tenant": tenant, "seqs": sorted(seqs)},
    ).fetchall()
    relations, outside = user_relations(
        seqs, [(int(s), int(t), str(name), float(at)) for s, t, name, at in edges]
    )
    return UserRecords(records, relations, outside)
