"""The SQL half of `sessions_search` (docs/design.md §3) on one agent database.

Visibility is part of the query, never a filter on a page of results: the sessions the
caller may see (and that are clean) constrain the FTS5 match itself, so the `LIMIT` only
ever counts visible rows. Dirty sessions are hidden: their index rows may be stale.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple, TypeAlias, cast

import apsw

from ..protocol.config import PrivateScope
from ..protocol.session_key import parse_session_key
from .fts_query import MatchPlan

# "all" is every session in this database; the cross-agent part of `all` is the caller's.
# A `PrivateScope` is cross-conversation recall's boundary (docs/design.md §4.2), never a
# visibility setting.
DbScope: TypeAlias = Literal["self", "tree", "all"] | PrivateScope


class Candidate(NamedTuple):
    """One visible match, best first; `score` is higher for better matches."""

    event_id: int
    score: float
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
# The pool of best BM25 matches that conversational reranking then reorders. `{rank}` is
# `f.rank` (BM25), or 0.0 with `{order}` newest-first when every term is common.
_MATCH_FILTERED = (
    "SELECT f.rowid, {rank}, e.session_id, e.depth FROM message_fts f"
    " JOIN events e ON e.id = f.rowid"
    " WHERE message_fts MATCH ? AND {where} ORDER BY {order} LIMIT ?"
)
# Nothing to filter: rank first, then look up only the pool's rows.
_MATCH_ALL = (
    "SELECT m.rowid, m.r, e.session_id, e.depth FROM"
    " (SELECT rowid, {rank} AS r FROM message_fts f WHERE message_fts MATCH ?"
    "  ORDER BY {order} LIMIT ?) m"
    " JOIN events e ON e.id = m.rowid ORDER BY m.r, m.rowid DESC"
)
_BY_RANK = {"rank": "f.rank", "order": "f.rank, f.rowid DESC"}
_BY_RECENCY = {"rank": "0.0", "order": "f.rowid DESC"}
_BY_RECENCY_ALL_TERMS = {"rank": "-1.0", "order": "f.rowid DESC"}  # ahead of any-term rows

# A term in more than COMMON_FRACTION of an agent's indexed messages is "common": BM25
# gives it almost no weight, yet ranking by it means FTS5 reads its whole doclist (bm25's
# document frequency), tens of milliseconds at a million messages. Common terms are left
# out when the query has others; a query of only common terms is answered newest first.
# Small indexes are never pruned: there every term is cheap.
COMMON_FRACTION = 0.005  # one message in 200
MIN_ROWS_TO_PRUNE = 20_000
_TERM_CACHE_SIZE = 4096
POOL = 50
SPAN_MAX_SESSIONS = 64
# Conversational reranking (tuned on the LoCoMo dev split, stable within ±0.01 R@10 for
# NEIGHBOUR 0.1-0.3, SESSION 0.05-0.2): a message gains a share of the scores of the pool
# messages right before and after it, and of its session's other pool messages.
NEIGHBOUR = 0.2
SESSION = 0.1
_DETAILS = (
    "SELECT e.id, e.session_id, s.key, e.ts, e.role, e.text FROM events e"
    " JOIN sessions s ON s.id = e.session_id WHERE e.id IN (SELECT value FROM json_each(?))"
)


def _message_threshold(total: int) -> int:
    return int(total * COMMON_FRACTION)


class TermStats:
    """Which terms are common in one FTS5 `table`, cached per reader connection.

    A term held by more than `threshold(indexed rows)` rows is common: messages use a share
    (`COMMON_FRACTION`), records a count (storage/records.py). An answer is reused until the
    index has grown or shrunk by a quarter since it was found; a term near the threshold may
    be misjudged for a while, which only moves it between "ranked" and "left out when rarer
    terms exist" (or "answered by recency").
    """

    def __init__(
        self, table: str = "message_fts", threshold: Callable[[int], int] = _message_threshold
    ) -> None:
        self.table = table
        self._threshold = threshold
        self._common: dict[str, tuple[bool, int]] = {}

    def is_common(self, conn: apsw.Connection, term_expr: str, total: int) -> bool:
        """Whether more than the threshold of the `total` indexed rows hold the term."""
        cached = self._common.get(term_expr)
        if cached is not None and abs(total - cached[1]) * 4 <= cached[1]:
            return cached[0]
        # Walks at most `threshold` entries of the doclist, newest first: no ranking, no IDF.
        row = conn.execute(
            f"SELECT rowid FROM {self.table} WHERE {self.table} MATCH ?"
            " ORDER BY rowid DESC LIMIT 1 OFFSET ?",
            (term_expr, self._threshold(total)),
        ).fetchone()
        if len(self._common) >= _TERM_CACHE_SIZE:
            self._common.clear()
        self._common[term_expr] = (row is not None, total)
        return row is not None


def indexed_rows(conn: apsw.Connection, table: str = "message_fts") -> int:
    """How many rows the FTS5 `table` holds, from FTS5's own totals record (no scan)."""
    row = conn.execute(f"SELECT block FROM {table}_data WHERE id = 1").fetchone()
    if row is None or not row[0]:
        return 0
    return _varint(bytes(row[0]))


def _varint(data: bytes) -> int:
    """SQLite's big-endian variable-length integer at the start of `data`."""
    value = 0
    for i, byte in enumerate(data[:9]):
        if i == 8:
            return (value << 8) | byte
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value
    return value


def _ranking(
    conn: apsw.Connection, plan: MatchPlan, stats: TermStats
) -> list[tuple[str, dict[str, str]]]:
    """The (MATCH expression, ordering) queries to run, in order, to fill the pool."""
    total = indexed_rows(conn)
    if total < MIN_ROWS_TO_PRUNE:
        return [(plan.expression(), _BY_RANK)]
    common = [stats.is_common(conn, expr, total) for expr in plan.term_exprs]
    # Only common terms: newest messages holding all of them, then any of them.
    by_recency = [(plan.expression(), _BY_RECENCY)]
    if len(plan.term_exprs) > 1:
        by_recency.insert(0, (plan.expression(joiner=" AND "), _BY_RECENCY_ALL_TERMS))
    if not all(common):
        # The rarer terms ranked first; when they match too few rows (a name or id found
        # nowhere), the common terms still answer, newest first, as if asked alone.
        return [(plan.expression([not c for c in common]), _BY_RANK), *by_recency]
    return by_recency


def search_scope(
    conn: apsw.Connection,
    plan: MatchPlan,
    *,
    scope: DbScope,
    caller: str,
    session_key: str | None,
    keep: int,
    stats: TermStats,
) -> ScopePage:
    """The `keep` best visible matches of `plan` (from `plan_match`)."""
    with conn:  # one read transaction: visibility and matches from the same snapshot
        any_dirty = conn.execute("SELECT 1 FROM sessions WHERE dirty LIMIT 1").fetchone()
        params: list[object] = []
        sql = _MATCH_ALL
        if scope == "all" and session_key is None:
            visible_dirty = 0
            if any_dirty:
                (visible_dirty,) = conn.execute(
                    "SELECT count(*) FROM sessions WHERE dirty"
                ).fetchone() or (0,)
                sql = _MATCH_FILTERED.replace(
                    "{where}", "e.session_id NOT IN (SELECT id FROM sessions WHERE dirty)"
                )
        else:
            visible = _visible_sessions(conn, scope, caller, session_key)
            clean = [sid for sid, dirty in visible if not dirty]
            visible_dirty = len(visible) - len(clean)
            if not clean:
                return ScopePage([], visible_dirty, bool(any_dirty))
            # The visible sessions' rowid span bounds what FTS5 walks (ids grow with seq). It
            # costs two index seeks per session, and for many sessions the span is most of
            # the table anyway: only a small scope is worth bounding.
            if len(clean) <= SPAN_MAX_SESSIONS:
                low, high = _rowid_span(conn, clean)
            else:
                low, high = 0, 2**62
            sql = _MATCH_FILTERED.replace(
                "{where}",
                "f.rowid BETWEEN ? AND ? AND e.session_id IN (SELECT value FROM json_each(?))",
            )
            params += [low, high, json.dumps(clean)]
        pool_size = max(POOL, keep)
        pooled: list[tuple[int, float, int, int]] = []
        seen: set[int] = set()
        for expression, ordering in _ranking(conn, plan, stats):
            query = sql.format(**ordering)
            rows = conn.execute(query, [expression, *params, pool_size - len(pooled)])
            for row in cast(list[tuple[int, float, int, int]], rows.fetchall()):
                if row[0] not in seen:
                    seen.add(row[0])
                    pooled.append(row)
            if len(pooled) >= pool_size:
                break
        if not pooled:
            return ScopePage([], visible_dirty, bool(any_dirty))
        ranked = rerank(pooled)[:keep]
        details = {
            row[0]: row
            for row in conn.execute(_DETAILS, (json.dumps([rowid for rowid, _ in ranked]),))
        }
    candidates = []
    for rowid, score in ranked:
        _, session_id, key, ts, role, text = details[rowid]
        candidates.append(
            Candidate(rowid, score, int(session_id), str(key), float(ts), str(role), str(text))
        )
    return ScopePage(candidates, visible_dirty, bool(any_dirty))


def rerank(pooled: list[tuple[int, float, int, int]]) -> list[tuple[int, float]]:
    """Reorder a pool of (rowid, bm25 rank, session id, depth) by conversational score.

    The score is -bm25 plus NEIGHBOUR x the scores of the messages just before and after
    it and SESSION x the scores of the rest of its session, counting only pool members
    (which are all visible). Ties: newest (highest rowid) first.
    """
    own = {(sid, depth): -rank for _, rank, sid, depth in pooled}
    per_session: dict[int, float] = {}
    for _, rank, sid, _ in pooled:
        per_session[sid] = per_session.get(sid, 0.0) - rank
    scored = []
    for rowid, rank, sid, depth in pooled:
        base = -rank
        around = own.get((sid, depth - 1), 0.0) + own.get((sid, depth + 1), 0.0)
        score = base + NEIGHBOUR * around + SESSION * (per_session[sid] - base)
        scored.append((rowid, score))
    scored.sort(key=lambda item: (-item[1], -item[0]))
    return scored


def _rowid_span(conn: apsw.Connection, session_ids: list[int]) -> tuple[int, int]:
    """The smallest and largest event id of these sessions: two index seeks each."""
    low = high = None
    for sid in session_ids:
        row = conn.execute(
            "SELECT (SELECT id FROM events WHERE session_id = ?1 ORDER BY seq LIMIT 1),"
            " (SELECT id FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT 1)",
            (sid,),
        ).fetchone()
        if row is None or row[0] is None:
            continue
        low = row[0] if low is None else min(low, row[0])
        high = row[1] if high is None else max(high, row[1])
    return (low or 0, high or 0)


# The privacy boundary of cross-conversation recall, as SQL: only the same agent's other
# private conversations (direct, or explicit UI sessions) that are persistent, interactive,
# not archived, and not a sandboxed or spawned helper run. Groups, channels, unknown keys
# (chat type `unknown`, no agent) and the current conversation never match. Of those, only
# the caller identity's direct chats (`:peers`, a JSON list; NULL: every peer) and, when
# `:owner`, the main and explicit sessions (`private_params`).
_PRIVATE = (
    "SELECT id, dirty FROM sessions WHERE agent = :agent AND key <> :caller"
    " AND chat_type IN ('direct', 'explicit') AND persistent = 1 AND interactive = 1"
    " AND archived = 0 AND sandboxed = 0 AND spawned_by IS NULL"
    " AND CASE WHEN chat_type = 'direct' AND conversation_id IS NOT NULL"
    "  THEN :peers IS NULL OR conversation_id IN (SELECT value FROM json_each(:peers))"
    "  ELSE :owner END"
)


def private_params(agent: str, caller: str, scope: PrivateScope) -> dict[str, object]:
    """The bindings of `_PRIVATE` for `caller` (a private key of `agent`)."""
    peers = None if scope.peers is None else json.dumps(scope.peers)
    return {"agent": agent, "caller": caller, "peers": peers, "owner": scope.owner}


ScopeParams: TypeAlias = list[object] | dict[str, object]


def scope_sql(scope: DbScope, caller: str, session_key: str | None) -> tuple[str, ScopeParams]:
    """The sessions of this database `caller` may see under `scope`, as SQL: a SELECT of
    `id, dirty` and its bindings (positional, or named for a `PrivateScope`).

    `session_key` narrows it to that one session, if visible (with `all`: that session).
    The one definition of a scope: the text side (`search_scope`) and the vector side
    (`storage/vectors.nearest_messages`, docs/design.md §3) both read it, so a vector can
    never reach a session the full-text search would not.
    """
    sql: str
    params: ScopeParams
    if isinstance(scope, PrivateScope):
        key = parse_session_key(caller, field="caller")
        if not key.is_private or key.agent is None:
            # A group, channel or unknown conversation is never a recall target.
            sql, params = "SELECT id, dirty FROM sessions WHERE 0", {}
        else:
            sql, params = _PRIVATE, private_params(key.agent, key.raw, scope)
        if session_key is not None:
            sql = f"SELECT id, dirty FROM ({sql}) WHERE id IN ({_ONE_NAMED})"
            params = {**params, "only": session_key}
        return sql, params
    if scope == "all":
        if session_key is None:
            return "SELECT id, dirty FROM sessions", []
        return "SELECT id, dirty FROM sessions WHERE key = ?", [session_key]
    sql = "SELECT id, dirty FROM sessions WHERE key = ?" if scope == "self" else _TREE
    if session_key is None:
        return sql, [caller]
    return f"SELECT id, dirty FROM ({sql}) WHERE id IN ({_ONE})", [caller, session_key]


_ONE = "SELECT id FROM sessions WHERE key = ?"
_ONE_NAMED = "SELECT id FROM sessions WHERE key = :only"


def _visible_sessions(
    conn: apsw.Connection, scope: DbScope, caller: str, session_key: str | None = None
) -> list[tuple[int, int]]:
    sql, params = scope_sql(scope, caller, session_key)
    return [(int(sid), int(dirty)) for sid, dirty in conn.execute(sql, params)]
