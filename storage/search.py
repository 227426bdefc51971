"""The SQL half of `sessions_search` (SPEC §3) on one agent database.

Visibility is part of the query, never a filter on a page of results: the sessions the
caller may see (and that are clean) constrain the FTS5 match itself, so the `LIMIT` only
ever counts visible rows. Dirty sessions are hidden: their index rows may be stale.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeAlias, cast

import apsw

# "all" is every session in this database; the cross-agent part of `all` is the caller's.
DbScope: TypeAlias = Literal["self", "tree", "all"]


class Candidate(NamedTuple):
    """One visible match, best first; `rank` is FTS5's bm25 (lower is better)."""

    event_id: int
    rank: float
    session_id: int
    session_key: str
    timestamp: float
    role: str
    text: str


@dataclass(frozen=True)
class ScopePage:
    """The best visible matches of one database, and the index state of what is visible."""

    candidates: list[Candidate]
    visible_dirty: int  # sessions the caller may see whose index is being rebuilt
    any_dirty: bool  # anything for the reconciler to do in this database


_TREE = (
    "WITH RECURSIVE tree(key) AS (VALUES (?) UNION"
    " SELECT s.key FROM sessions s JOIN tree t ON s.spawned_by = t.key)"
    " SELECT s.id, s.dirty FROM sessions s JOIN tree USING (key)"
)
_MATCH = (
    "SELECT f.rowid, f.rank FROM message_fts f{join}"
    " WHERE message_fts MATCH ?{where} ORDER BY f.rank, f.rowid DESC LIMIT ?"
)
_DETAILS = (
    "SELECT e.id, e.session_id, s.key, e.ts, e.role, e.text FROM events e"
    " JOIN sessions s ON s.id = e.session_id WHERE e.id IN (SELECT value FROM json_each(?))"
)


def search_scope(
    conn: apsw.Connection,
    match: str,
    *,
    scope: DbScope,
    caller: str,
    session_key: str | None,
    pool: int,
) -> ScopePage:
    """The `pool` best visible matches of `match` (an FTS5 expression from `build_match`)."""
    with conn:  # one read transaction: visibility and matches from the same snapshot
        any_dirty = conn.execute("SELECT 1 FROM sessions WHERE dirty LIMIT 1").fetchone()
        join = where = ""
        params: list[object] = [match]
        if scope == "all" and session_key is None:
            visible_dirty = 0
            if any_dirty:
                (visible_dirty,) = conn.execute(
                    "SELECT count(*) FROM sessions WHERE dirty"
                ).fetchone() or (0,)
                join = " JOIN events e ON e.id = f.rowid"
                where = " AND e.session_id NOT IN (SELECT id FROM sessions WHERE dirty)"
        else:
            visible = _visible_sessions(conn, scope, caller)
            if session_key is not None:
                wanted = conn.execute(
                    "SELECT id FROM sessions WHERE key = ?", (session_key,)
                ).fetchone()
                visible = [v for v in visible if wanted is not None and v[0] == wanted[0]]
            clean = [sid for sid, dirty in visible if not dirty]
            visible_dirty = len(visible) - len(clean)
            if not clean:
                return ScopePage([], visible_dirty, bool(any_dirty))
            join = " JOIN events e ON e.id = f.rowid"
            where = " AND e.session_id IN (SELECT value FROM json_each(?))"
            params.append(json.dumps(clean))
        params.append(pool)
        ranked = cast(
            list[tuple[int, float]],
            conn.execute(_MATCH.format(join=join, where=where), params).fetchall(),
        )
        if not ranked:
            return ScopePage([], visible_dirty, bool(any_dirty))
        details = {
            row[0]: row
            for row in conn.execute(_DETAILS, (json.dumps([rowid for rowid, _ in ranked]),))
        }
    candidates = []
    for rowid, rank in ranked:
        _, session_id, key, ts, role, text = details[rowid]
        candidates.append(
            Candidate(
                int(rowid), float(rank), int(session_id), str(key), float(ts), str(role), str(text)
            )
        )
    return ScopePage(candidates, visible_dirty, bool(any_dirty))


def _visible_sessions(conn: apsw.Connection, scope: DbScope, caller: str) -> list[tuple[int, int]]:
    if scope == "self":
        rows = conn.execute("SELECT id, dirty FROM sessions WHERE key = ?", (caller,))
    elif scope == "tree":
        rows = conn.execute(_TREE, (caller,))
    else:
        rows = conn.execute("SELECT id, dirty FROM sessions")
    return [(int(sid), int(dirty)) for sid, dirty in rows]
