"""The SQL half of `sessions_search` (docs/design.md §3) on one agent database.

Visibility is part of the query, never a filter on a page of results: the sessions the
caller may see (and that are clean) constrain the FTS5 match itself, so the `LIMIT` only
ever counts visible rows. Dirty sessions are hidden: their index rows may be stale.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypeAlias, TypeVar, cast

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
    "WITH RECURSIVE tree(key) AS (VALUES (:caller) UNION"
    " SELECT s.key FROM sessions s JOIN tree t ON s.spawned_by = t.key)"
    " SELECT s.id, s.dirty FROM sessions s JOIN tree USING (key)"
)
# The pool of best BM25 matches that conversational reranking then reorders. `{rank}` is
# `f.rank` (BM25), or 0.0 with `{order}` newest-first when every term is common.
# The rowids a step may read: the step's window (`Step.since`) and a scope's span, as one
# range (FTS5 takes a single lower bound; given two, it may walk past the higher one).
_MATCH_FILTERED = (
    "SELECT f.rowid, {rank}, e.session_id, e.depth FROM message_fts f"
    " JOIN events e ON e.id = f.rowid"
    " WHERE message_fts MATCH :expr AND f.rowid BETWEEN :low AND :high AND {where}"
    " ORDER BY {order} LIMIT :lim"
)
# Nothing to filter: rank first, then look up only the pool's rows.
_MATCH_ALL = (
    "SELECT m.rowid, m.r, e.session_id, e.depth FROM"
    " (SELECT rowid, {rank} AS r FROM message_fts f WHERE message_fts MATCH :expr"
    "  AND f.rowid >= :low ORDER BY {order} LIMIT :lim) m"
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
# What one agent-wide search may rank (docs/design.md §3): BM25 costs a few microseconds
# per matching row, so ranking terms just under the common threshold (up to 5,000 rows each
# at a million messages) was the search's tail. The rarer terms are ranked while their
# matches add up to at most RANK_BUDGET rows; the rest answer by recency after them. A
# rarest term holding more is ranked over its newest RANK_BUDGET matches (its window). A
# cost, not a share: a row costs the same in any index.
RANK_BUDGET = 1500
# When even the rarest term is over the budget, "messages holding every term first" is
# judged among the newest RECENCY_WIDE holding any: FTS5 checks a rowid bound only at each
# match of an AND, so an AND of long doclists that rarely meet walks them whole.
RECENCY_WIDE = 200
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
    """How many rows of one FTS5 `table` hold a term, up to its common threshold; cached
    per reader connection.

    A term held by more than `threshold(indexed rows)` rows is common: messages use a share
    (`COMMON_FRACTION`), records a count (storage/records.py). An answer is reused until the
    index has grown or shrunk by a quarter since it was found; a term near the threshold may
    be misjudged for a while, which only moves it between "ranked" and "left out when rarer
    terms exist" (or "answered by recency"). The PostgreSQL search remembers its own counts
    in it by the same rule (`cached`, `remember`: storage/pg/search.py).
    """

    def __init__(
        self, table: str = "message_fts", threshold: Callable[[int], int] = _message_threshold
    ) -> None:
        self.table = table
        self.threshold = threshold
        self._docs: dict[str, tuple[int, int]] = {}
        # Terms found over a shorter count's cap (`docs_up_to`): (cap, rows indexed then).
        self._over: dict[str, tuple[int, int]] = {}

    def docs(self, conn: apsw.Connection, term_expr: str, total: int) -> int:
        """How many of the `total` indexed rows hold the term, counted up to one more than
        the threshold (a common term reads as threshold + 1)."""
        cached = self.cached(term_expr, total)
        if cached is not None:
            return cached
        count = self._count(conn, term_expr, self.threshold(total) + 1)
        self.remember(term_expr, count, total)
        return count

    def docs_up_to(self, conn: apsw.Connection, term_expr: str, total: int, cap: int) -> int:
        """`docs`, but counted only up to `cap` (at most the threshold + 1): min(count, cap).
        An exact count is remembered as `docs` remembers it; "at least `cap`" apart, by the
        same quarter rule, so a common term is not walked again each time it is asked."""
        cached = self.cached(term_expr, total)
        if cached is not None:
            return min(cached, cap)
        over = self._over.get(term_expr)
        if over is not None and over[0] >= cap and _still_holds(over[1], total):
            return cap
        count = self._count(conn, term_expr, cap)
        if count < cap:
            self.remember(term_expr, count, total)
        else:
            _put(self._over, term_expr, (cap, total))
        return count

    def _count(self, conn: apsw.Connection, term_expr: str, cap: int) -> int:
        """min(rows holding the term, `cap`): walks at most `cap` doclist entries, no
        ranking, no IDF."""
        row = conn.execute(
            f"SELECT count(*) FROM (SELECT rowid FROM {self.table} WHERE {self.table} MATCH ?"
            " LIMIT ?)",
            (term_expr, cap),
        ).fetchone()
        return int(row[0]) if row is not None else 0

    def cached(self, term: str, total: int) -> int | None:
        """The count remembered for `term`, unless the index has grown or shrunk by a
        quarter since (`total` indexed rows now)."""
        cached = self._docs.get(term)
        if cached is not None and _still_holds(cached[1], total):
            return cached[0]
        return None

    def remember(self, term: str, count: int, total: int) -> None:
        """`count`, found for `term` in an index of `total` rows."""
        _put(self._docs, term, (count, total))

    def is_common(self, conn: apsw.Connection, term_expr: str, total: int) -> bool:
        """Whether more than the threshold of the `total` indexed rows hold the term."""
        return self.docs(conn, term_expr, total) > self.threshold(total)


def _still_holds(found_at: int, total: int) -> bool:
    """Whether a count found when the index held `found_at` rows is still used at `total`:
    until the index has grown or shrunk by a quarter (`TermStats`)."""
    return abs(total - found_at) * 4 <= found_at


def _put(cache: dict[str, tuple[int, int]], term: str, entry: tuple[int, int]) -> None:
    """`cache[term] = entry`, the cache emptied first when full (`_TERM_CACHE_SIZE`)."""
    if len(cache) >= _TERM_CACHE_SIZE:
        cache.clear()
    cache[term] = entry


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


class Rankable(NamedTuple):
    """What `rankable` decided: the terms to rank, the rarest's index, and whether the
    rarest is ranked over its newest `RANK_BUDGET` matches only (`newest_match`)."""

    ranked: list[bool]
    rarest: int
    windowed: bool


def rankable(
    docs: Sequence[int], threshold: int, *, bounded: bool, budget: int | None = None
) -> Rankable:
    """Which terms (by their `TermStats.docs`) to rank by BM25.

    Not the common ones (over `threshold`); when `bounded`, only the rarer terms while their
    rows add up to at most `RANK_BUDGET`, and the rarest always (over the budget: over its
    newest `RANK_BUDGET` matches). The messages' and the records' searches both decide here
    (docs/design.md §3, §5). `budget`: another store's own (PostgreSQL's, §11), else
    `RANK_BUDGET`.
    """
    budget = RANK_BUDGET if budget is None else budget
    ranked = [d <= threshold for d in docs]
    rarest = min(range(len(docs)), key=docs.__getitem__)
    if bounded:
        spent = 0
        for i in sorted((i for i in range(len(docs)) if ranked[i]), key=docs.__getitem__):
            spent += docs[i]
            ranked[i] = i == rarest or spent <= budget
    return Rankable(ranked, rarest, bounded and docs[rarest] > budget)


class Step(NamedTuple):
    """One FTS5 query of a search: its MATCH expression, its ordering (`_BY_RANK`,
    `_BY_RECENCY`...) and its window, the lowest rowid it reads (0: all). `wide`: read that
    many rows, those holding every term first (`every_term_first`)."""

    expression: str
    ordering: dict[str, str]
    since: int = 0
    wide: int = 0


def ranking_steps(
    conn: apsw.Connection, plan: MatchPlan, stats: TermStats, *, bounded: bool = True
) -> list[Step]:
    """The queries to run on `stats.table`, in order, until the pool is full: what is left of
    `plan` after pruning (docs/design.md §3). `bounded`: the search reads the whole table
    (not a small scope's rowid span), so what it ranks is held to `RANK_BUDGET` rows. The
    benchmark's pruned floor runs the same steps on a bare FTS5 table."""
    total = indexed_rows(conn, stats.table)
    if total < MIN_ROWS_TO_PRUNE:
        return [Step(plan.expression(), _BY_RANK)]
    docs = term_docs(conn, plan, stats, total, bounded=bounded)
    ranked, rarest, windowed = rankable(docs, stats.threshold(total), bounded=bounded)
    window = newest_match(conn, stats.table, plan.term_exprs[rarest]) if windowed else 0
    # Then the newest messages holding all the terms, then any of them. Not the phrase: it
    # orders nothing by recency, and finding its next match newest first walks the terms'
    # doclists until their words meet in order, which common words rarely do.
    any_term = " OR ".join(plan.term_exprs)
    by_recency = [Step(any_term, _BY_RECENCY)]
    if len(plan.term_exprs) > 1 and docs[rarest] > RANK_BUDGET:  # even the rarest is long
        by_recency = [Step(any_term, _BY_RECENCY, wide=RECENCY_WIDE)]
    elif len(plan.term_exprs) > 1:  # an AND led by a short doclist: cheap
        by_recency.insert(0, Step(plan.expression(joiner=" AND "), _BY_RECENCY_ALL_TERMS))
    if any(ranked):
        # The rarer terms ranked first; when they match too few rows (a name or id found
        # nowhere), the others still answer, newest first, as if asked alone.
        return [Step(plan.expression(ranked), _BY_RANK, window), *by_recency]
    return by_recency


def term_docs(
    conn: apsw.Connection, plan: MatchPlan, stats: TermStats, total: int, *, bounded: bool
) -> list[int]:
    """Each term's `TermStats.docs`, as `rankable` needs them. Reading the whole table
    (`bounded`), the terms are first counted only to `RANK_BUDGET` + 1: while one term is
    within the budget, `rankable` ranks none over it and none is the rarest, so "over the
    budget" decides as its exact count would; only when every term is over it are they
    counted on to the threshold (the rarest's window, and which is common). A common term
    beside a rare one then walks 1,501 doclist entries, not 5,001 at 1M: the first sight of
    such a term was the agent-wide search's CPU tail (docs/design.md §3). The PostgreSQL
    store does the same (storage/pg/search.py `cached_frequencies`)."""
    exprs = plan.term_exprs
    short = RANK_BUDGET + 1
    if bounded and short <= stats.threshold(total):
        counted = [stats.docs_up_to(conn, expr, total, short) for expr in exprs]
        if any(n < short for n in counted):
            return counted
    return [stats.docs(conn, expr, total) for expr in exprs]


Row = TypeVar("Row", bound=tuple[Any, ...])


def every_term_first(
    conn: apsw.Connection, table: str, plan: MatchPlan, rows: list[Row]
) -> list[Row]:
    """`rows` (rowid, rank, ...) of a `wide` step, newest first, with those holding every
    term of `plan` first, ranked -1.0 (as the AND step would). Each term reads only its
    rows between the oldest and newest of `rows`: at most `len(rows)` each."""
    if not rows:
        return rows
    span = (min(r[0] for r in rows), max(r[0] for r in rows))
    held: dict[int, int] = {}
    for expr in plan.term_exprs:
        for (rowid,) in conn.execute(
            f"SELECT rowid FROM {table} WHERE {table} MATCH ? AND rowid BETWEEN ? AND ?",
            (expr, *span),
        ):
            held[rowid] = held.get(rowid, 0) + 1
    every = len(plan.term_exprs)
    marked = [cast(Row, (r[0], -1.0, *r[2:])) if held.get(r[0]) == every else r for r in rows]
    return sorted(marked, key=lambda r: (r[1], -r[0]))


def newest_match(conn: apsw.Connection, table: str, term_expr: str) -> int:
    """The start of a term's window: the rowid of the `RANK_BUDGET`-th newest row holding it
    (0 if fewer hold it)."""
    row = conn.execute(
        f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid DESC LIMIT 1 OFFSET ?",
        (term_expr, RANK_BUDGET - 1),
    ).fetchone()
    return 0 if row is None else int(row[0])


class Visible(NamedTuple):
    """What a scope admits in this database (`visible`): its clean sessions' ids as one
    JSON array (`json_each` reads it in each FTS5 query), how many sessions of the scope are
    dirty (hidden while they are rebuilt), whether any session of the database is, and for
    a small scope the event-id span of its clean sessions."""

    clean_ids: str
    clean: int
    dirty: int
    any_dirty: bool
    span: tuple[int, int] | None  # None: more than SPAN_MAX_SESSIONS clean sessions


def visible(conn: apsw.Connection, scope_sql: str, params: ScopeParams) -> Visible:
    """Resolve the sessions of `scope_sql` (a SELECT of `id, dirty`, named bindings) in one
    statement; a small scope's span in a second one.

    The session list comes back as one JSON text built inside SQLite, never as a row per
    session: at a thousand sessions those rows, each a return to the interpreter, were a
    search's largest share of time holding the GIL (docs/design.md §3). The ids are then
    bound as that text (`json_each`): a subquery of the scope inside each FTS5 query was
    re-planned per query with an automatic index, 3-5 times slower than reading the text.
    """
    row = conn.execute(
        "SELECT coalesce(json_group_array(v.id) FILTER (WHERE NOT v.dirty), '[]'),"
        " count(*) FILTER (WHERE NOT v.dirty), count(*) FILTER (WHERE v.dirty),"
        " (SELECT 1 FROM sessions WHERE dirty LIMIT 1)"
        f" FROM ({scope_sql}) v",
        params,
    ).fetchone()
    assert row is not None  # an aggregate always has its row
    ids, clean, dirty, any_dirty = str(row[0]), int(row[1]), int(row[2]), bool(row[3])
    if not clean or clean > SPAN_MAX_SESSIONS:
        return Visible(ids, clean, dirty, any_dirty, None)
    # Two index seeks per session (ids grow with seq), inside SQLite.
    span = conn.execute(
        "SELECT min((SELECT id FROM events WHERE session_id = v.value ORDER BY seq LIMIT 1)),"
        " max((SELECT id FROM events WHERE session_id = v.value ORDER BY seq DESC LIMIT 1))"
        " FROM json_each(?) v",
        (ids,),
    ).fetchone()
    low, high = span if span is not None else (None, None)
    return Visible(ids, clean, dirty, any_dirty, (low or 0, high or 0))


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
        params: dict[str, object] = {}
        sql = _MATCH_ALL
        low, high = 0, 2**62
        bounded = True  # the search reads the whole table
        if scope == "all" and session_key is None:
            row = conn.execute("SELECT count(*) FROM sessions WHERE dirty").fetchone()
            visible_dirty = int(row[0]) if row is not None else 0
            any_dirty = visible_dirty > 0
            if any_dirty:
                sql = _MATCH_FILTERED.replace(
                    "{where}", "e.session_id NOT IN (SELECT id FROM sessions WHERE dirty)"
                )
        else:
            seen_scope = visible(conn, *scope_sql(scope, caller, session_key))
            visible_dirty, any_dirty = seen_scope.dirty, seen_scope.any_dirty
            if not seen_scope.clean:
                return ScopePage([], visible_dirty, any_dirty)
            # The visible sessions' rowid span bounds what FTS5 walks. For many sessions the
            # span is most of the table anyway: only a small scope is worth bounding.
            if seen_scope.span is not None:
                low, high = seen_scope.span
                bounded = False  # ranking reads only the span's rows
            sql = _MATCH_FILTERED.replace(
                "{where}", "e.session_id IN (SELECT value FROM json_each(:ids))"
            )
            params = {"ids": seen_scope.clean_ids}
        pool_size = max(POOL, keep)
        pooled: list[tuple[int, float, int, int]] = []
        seen: set[int] = set()
        for step in ranking_steps(conn, plan, stats, bounded=bounded):
            query = sql.format(**step.ordering)
            limit = step.wide or pool_size - len(pooled)
            if sql == _MATCH_ALL:
                bindings: dict[str, object] = {"expr": step.expression, "low": step.since}
            else:
                bindings = {"expr": step.expression, "low": max(low, step.since), "high": high}
            found = conn.execute(query, {**params, **bindings, "lim": limit}).fetchall()
            rows = cast(list[tuple[int, float, int, int]], found)
            if step.wide:
                rows = every_term_first(conn, stats.table, plan, rows)
            for row in rows:
                if row[0] not in seen and len(pooled) < pool_size:
                    seen.add(row[0])
                    pooled.append(row)
            if len(pooled) >= pool_size:
                break
        if not pooled:
            return ScopePage([], visible_dirty, any_dirty)
        ranked = rerank(pooled)[:keep]
        details = {
            row[0]: row
            for row in conn.execute(_DETAILS, (_json_ints(rowid for rowid, _ in ranked),))
        }
    candidates = []
    for rowid, score in ranked:
        _, session_id, key, ts, role, text = details[rowid]
        candidates.append(
            Candidate(rowid, score, int(session_id), str(key), float(ts), str(role), str(text))
        )
    return ScopePage(candidates, visible_dirty, any_dirty)


def _json_ints(values: Iterable[int]) -> str:
    """A JSON array of integers (`json_each` reads it), without the JSON encoder's cost."""
    return "[" + ",".join(map(str, values)) + "]"


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
    near = own.get
    scored = []
    for rowid, rank, sid, depth in pooled:
        base = -rank
        around = near((sid, depth - 1), 0.0) + near((sid, depth + 1), 0.0)
        scored.append((base + NEIGHBOUR * around + SESSION * (per_session[sid] - base), rowid))
    # Best score first, then the highest rowid: tuples compare in C (a key function costs a
    # Python call per row, and this runs on a reader thread holding the GIL).
    scored.sort(reverse=True)
    return [(rowid, score) for score, rowid in scored]


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


# The message behind a `session:<key>#<id>` path (memory_get), if it lies inside the
# caller's private scope: the same predicate as the transcript search, applied again because
# a path is model output and proves nothing (docs/design.md §4.7).
_PRIVATE_MESSAGE = (
    "SELECT e.role, e.ts, e.text FROM events e"
    " JOIN sessions s ON s.id = e.session_id"
    " JOIN active_branch a ON a.session_id = e.session_id AND a.event_id = e.id"
    " WHERE e.id = :id AND s.key = :key AND e.kind = 'message' AND e.text IS NOT NULL"
    f" AND e.session_id IN (SELECT id FROM ({_PRIVATE}))"
)


def private_message(
    conn: apsw.Connection, event_id: int, key: str, agent: str, caller: str, scope: PrivateScope
) -> tuple[str, float, str] | None:
    """(role, timestamp, text) of message `event_id` of session `key` when it is on the
    active branch and inside `caller`'s private scope (of `agent`); else None."""
    params = {"id": event_id, "key": key, **private_params(agent, caller, scope)}
    row = conn.execute(_PRIVATE_MESSAGE, params).fetchone()
    return None if row is None else (str(row[0]), float(row[1]), str(row[2]))


ScopeParams: TypeAlias = dict[str, object]


def scope_sql(scope: DbScope, caller: str, session_key: str | None) -> tuple[str, ScopeParams]:
    """The sessions of this database `caller` may see under `scope`, as SQL: a SELECT of
    `id, dirty` and its named bindings (`:caller`, `:only`, and `private_params`'s).

    `session_key` narrows it to that one session, if visible (with `all`: that session).
    The one definition of a scope: the text side (`search_scope`, through `visible`,
    docs/design.md §3) and the vector side (`storage/vectors.nearest_messages`) both read
    it, so a vector can never reach a session the full-text search would not.
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
    elif scope == "all":
        sql, params = "SELECT id, dirty FROM sessions", {}
        if session_key is not None:
            return "SELECT id, dirty FROM sessions WHERE key = :only", {"only": session_key}
    else:
        sql = "SELECT id, dirty FROM sessions WHERE key = :caller" if scope == "self" else _TREE
        params = {"caller": caller}
    if session_key is None:
        return sql, params
    return f"SELECT id, dirty FROM ({sql}) WHERE id IN ({_ONE_NAMED})", {
        **params,
        "only": session_key,
    }


_ONE_NAMED = "SELECT id FROM sessions WHERE key = :only"
