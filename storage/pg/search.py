"""The SQL half of `sessions_search` on PostgreSQL (docs/design.md §3, §11).

As on SQLite (storage/search.py, whose pool, reranking and common-term rules this reuses):
the visible, clean sessions are a condition of the matching query itself, before its
LIMIT. The ranking is FTS5's BM25 computed from term statistics (`activememory.bm25`,
storage/pg/db.py): document frequencies counted in the agent's index, N and the average
length summed from the session rows; not `ts_rank`, which has no inverse document
frequency and no length normalisation of the BM25 kind.
"""

from __future__ import annotations

import math
from typing import Any

from ...protocol.config import PrivateScope
from ...protocol.session_key import parse_session_key
from ..fts_query import MatchPlan
from ..search import (
    COMMON_FRACTION,
    MIN_ROWS_TO_PRUNE,
    POOL,
    Candidate,
    DbScope,
    ScopePage,
    rerank,
)
from .db import SCHEMA
from .terms import PgQuery, pg_query
from .transcripts import Connection, _text

_S = SCHEMA
# FTS5's floor for the IDF of a term in more than half the rows.
_MIN_IDF = 1e-6

_TREE = (
    f"WITH RECURSIVE tree(key) AS (VALUES (%(caller)s::text) UNION"
    f" SELECT s.key FROM {_S}.sessions s JOIN tree t ON s.spawned_by = t.key"
    "  WHERE s.agent = %(agent)s)"
    f" SELECT s.id, s.dirty FROM {_S}.sessions s JOIN tree USING (key) WHERE s.agent = %(agent)s"
)
# storage/search.py `_PRIVATE`, the privacy boundary of cross-conversation recall.
_PRIVATE = (
    f"SELECT id, dirty FROM {_S}.sessions WHERE agent = %(agent)s"
    " AND key_agent = %(key_agent)s AND key <> %(caller)s"
    " AND chat_type IN ('direct', 'explicit') AND persistent AND interactive"
    " AND NOT archived AND NOT sandboxed AND spawned_by IS NULL"
    " AND CASE WHEN chat_type = 'direct' AND conversation_id IS NOT NULL"
    "  THEN %(peers)s::text[] IS NULL OR conversation_id = ANY(%(peers)s::text[])"
    "  ELSE %(owner)s END"
)


def scope_sql(
    agent: str, scope: DbScope, caller: str, session_key: str | None
) -> tuple[str, dict[str, Any]]:
    """The sessions of `agent` that `caller` may see under `scope` (storage/search.py
    `scope_sql`'s rules), as a SELECT of `id, dirty` and its named bindings."""
    params: dict[str, Any] = {"agent": agent, "caller": caller}
    if isinstance(scope, PrivateScope):
        key = parse_session_key(caller, field="caller")
        if not key.is_private or key.agent is None:
            sql = f"SELECT id, dirty FROM {_S}.sessions WHERE false"
        else:
            sql = _PRIVATE
            peers = None if scope.peers is None else list(scope.peers)
            params |= {"key_agent": key.agent, "peers": peers, "owner": scope.owner}
    elif scope == "all":
        sql = f"SELECT id, dirty FROM {_S}.sessions WHERE agent = %(agent)s"
    elif scope == "self":
        sql = f"SELECT id, dirty FROM {_S}.sessions WHERE agent = %(agent)s AND key = %(caller)s"
    else:
        sql = _TREE
    if session_key is not None:
        sql = (
            f"SELECT id, dirty FROM ({sql}) v WHERE id IN (SELECT id FROM {_S}.sessions"
            " WHERE agent = %(agent)s AND key = %(only)s)"
        )
        params["only"] = session_key
    return sql, params


_MATCH = (
    "SELECT i.event_id, {rank} AS r, i.session_id, i.depth FROM "
    + f"{_S}.message_index i"
    + " WHERE i.agent = %(agent)s AND i.terms @@ %(query)s::tsquery AND {where}"
    " ORDER BY {order} LIMIT %(limit)s"
)


def bm25_sql(row: str) -> str:
    """BM25 of the index row aliased `row` (its `terms` and `tokens`) for the bound query
    parts (`_bm25_params`): the body of `activememory.bm25` (storage/pg/db.py) written into
    the query itself, where PostgreSQL plans it once as a subquery instead of calling an
    SQL function that cannot be inlined once per row: the same value, ~3 x cheaper a row
    (docs/design.md §11 "Latency")."""
    return (
        "(SELECT coalesce(sum(q.idf * f.f * 2.2 / (f.f + 1.2 * (0.25 + 0.75 *"
        f" {row}.tokens / %(avgdl)s::float8))), 0)"
        " FROM unnest(%(lexemes)s::text[], %(prefixes)s::boolean[],"
        " %(phrases)s::text[]::tsquery[], %(idf)s::float8[]) AS q(lexeme, prefix, phrase, idf)"
        " CROSS JOIN LATERAL (SELECT CASE WHEN q.phrase IS NOT NULL THEN"
        f" CASE WHEN ts_filter({row}.terms, '{{a}}') @@ q.phrase THEN 1.0"
        f" WHEN {row}.terms @@ q.phrase THEN 0.4 ELSE 0.0 END"
        " ELSE coalesce((SELECT sum(cardinality(array_positions(u.weights, 'A'))"
        " + 0.4 * cardinality(array_positions(u.weights, 'B')))"
        f" FROM unnest({row}.terms) u WHERE u.lexeme = q.lexeme"
        " OR (q.prefix AND starts_with(u.lexeme, q.lexeme))), 0.0) END AS f) f)"
    )


_BM25 = "-" + bm25_sql("i")
_BY_RANK = {"rank": _BM25, "order": "r, i.event_id DESC"}
_BY_RECENCY = {"rank": "0.0", "order": "i.event_id DESC"}
_BY_RECENCY_ALL_TERMS = {"rank": "-1.0", "order": "i.event_id DESC"}
_DETAILS = (
    f"SELECT e.id, e.session_id, s.key, e.ts, e.role, e.text FROM {_S}.events e"
    f" JOIN {_S}.sessions s ON s.agent = e.agent AND s.id = e.session_id"
    " WHERE e.agent = %s AND e.id = ANY(%s)"
)


def execute_custom(conn: Connection, sql: str, params: Any = None) -> Any:
    """`conn.execute(sql, params)` planned for these parameters every time: never a
    server-side prepared statement, whose generic plan (chosen after five runs by
    PostgreSQL's `plan_cache_mode = auto`) cannot see how many rows a term matches, and
    walked a whole index for a rare one: the searches' tail (docs/design.md §11 "Latency")."""
    return conn.execute(sql, params, prepare=False)


def _statistics(
    conn: Connection, agent: str, plan: MatchPlan, query: PgQuery
) -> tuple[int, float, list[int]]:
    """(N, average tokens per row, each part's document frequency) of the agent's index.

    Where the common-term rules apply (`prunes`), a frequency is counted only up to the
    common threshold plus one (`capped_frequencies`): over it the exact figure is never used,
    and counting a common term's rows was the search's tail (docs/design.md §11 "Latency")."""
    row = execute_custom(
        conn,
        f"SELECT coalesce(sum(index_rows), 0), coalesce(sum(index_tokens), 0)"
        f" FROM {_S}.sessions WHERE agent = %s",
        (agent,),
    ).fetchone()
    total, tokens = (int(row[0]), int(row[1])) if row else (0, 0)
    avgdl = tokens / total if total else 1.0
    if prunes(plan, query, total):
        return total, avgdl, capped_frequencies(conn, agent, query, common_threshold(total) + 1)
    counts = ", ".join(
        f"count(*) FILTER (WHERE terms @@ %(p{i})s::tsquery)" for i in range(len(query.parts))
    )
    params: dict[str, Any] = {f"p{i}": part.tsquery for i, part in enumerate(query.parts)}
    found = execute_custom(
        conn,
        f"SELECT {counts} FROM {_S}.message_index WHERE agent = %(agent)s"
        " AND terms @@ %(query)s::tsquery",
        params | {"agent": agent, "query": query.match},
    ).fetchone()
    frequencies = [int(n) for n in found] if found else [0] * len(query.parts)
    return total, avgdl, frequencies


def common_threshold(total: int) -> int:
    """The most rows a term may match in an index of `total` and not be common."""
    return int(total * COMMON_FRACTION)


def prunes(plan: MatchPlan, query: PgQuery, total: int) -> bool:
    """Whether `_ranking` decides by the common-term rules (not one BM25 query over every
    part), so that it reads no frequency over `common_threshold(total)` and no phrase's."""
    terms = len(query.parts) - query.has_phrase
    return total >= MIN_ROWS_TO_PRUNE and terms == len(plan.terms)


def capped_frequencies(conn: Connection, agent: str, query: PgQuery, cap: int) -> list[int]:
    """Each term part's document frequency counted up to `cap` (min(exact, cap)); the
    whole-query phrase's, which pruning never reads, as 0."""
    counts = ", ".join(
        f"(SELECT count(*) FROM (SELECT 1 FROM {_S}.message_index WHERE agent = %(agent)s"
        f" AND terms @@ %(p{i})s::tsquery LIMIT %(cap)s) c{i})"
        for i in range(query.has_phrase, len(query.parts))
    )
    params: dict[str, Any] = {f"p{i}": part.tsquery for i, part in enumerate(query.parts)}
    found = execute_custom(
        conn, f"SELECT {counts}", params | {"agent": agent, "cap": cap}
    ).fetchone()
    assert found is not None
    return [0] * query.has_phrase + [int(n) for n in found]


def _idf(total: int, frequency: int) -> float:
    value = math.log((total - frequency + 0.5) / (frequency + 0.5))
    return value if value > 0 else _MIN_IDF


def _bm25_params(query: PgQuery, total: int, avgdl: float, df: list[int]) -> dict[str, Any]:
    return {
        "lexemes": [part.lexeme for part in query.parts],
        "prefixes": [part.prefix for part in query.parts],
        "phrases": [part.phrase for part in query.parts],
        "idf": [_idf(total, n) for n in df],
        "avgdl": max(avgdl, 1e-9),
    }


def _ranking(
    plan: MatchPlan, query: PgQuery, total: int, avgdl: float, df: list[int]
) -> list[tuple[str, dict[str, str], dict[str, Any]]]:
    """The (tsquery, ordering, bindings) queries to run, in order, to fill the pool: the
    common-term rules of storage/search.py `_ranking`. `df` as `_statistics` counts it:
    exact, or (`prunes`) capped over the common threshold, which decides the same."""
    if not prunes(plan, query, total):
        return [(query.match, _BY_RANK, _bm25_params(query, total, avgdl, df))]
    terms = query.parts[1:] if query.has_phrase else query.parts
    term_df = df[1:] if query.has_phrase else df
    common = [n > common_threshold(total) for n in term_df]
    # Only common terms: newest messages holding all of them, then any of them.
    by_recency: list[tuple[str, dict[str, str], dict[str, Any]]] = [(query.match, _BY_RECENCY, {})]
    if len(terms) > 1:
        all_terms = " & ".join(f"({part.tsquery})" for part in terms)
        by_recency.insert(0, (all_terms, _BY_RECENCY_ALL_TERMS, {}))
    if not all(common):
        rare = PgQuery(tuple(p for p, c in zip(terms, common, strict=True) if not c), False)
        rare_df = [n for n, c in zip(term_df, common, strict=True) if not c]
        return [(rare.match, _BY_RANK, _bm25_params(rare, total, avgdl, rare_df)), *by_recency]
    return by_recency


def search_scope(
    conn: Connection,
    agent: str,
    plan: MatchPlan,
    *,
    scope: DbScope,
    caller: str,
    session_key: str | None,
    keep: int,
) -> ScopePage:
    """The `keep` best visible matches of `plan` in `agent`'s sessions (storage/search.py
    `search_scope` on PostgreSQL), read in one snapshot (`configure_reader`)."""
    query = pg_query(plan)
    with conn.transaction():
        any_dirty = execute_custom(
            conn, f"SELECT 1 FROM {_S}.sessions WHERE agent = %s AND dirty LIMIT 1", (agent,)
        ).fetchone()
        params: dict[str, Any] = {"agent": agent}
        if scope == "all" and session_key is None:
            visible_dirty = 0
            where = "true"
            if any_dirty:
                (visible_dirty,) = execute_custom(
                    conn, f"SELECT count(*) FROM {_S}.sessions WHERE agent = %s AND dirty", (agent,)
                ).fetchone() or (0,)
                where = (
                    f"i.session_id NOT IN (SELECT id FROM {_S}.sessions"
                    " WHERE agent = %(agent)s AND dirty)"
                )
        else:
            sql, scope_params = scope_sql(agent, scope, caller, session_key)
            visible = execute_custom(conn, sql, scope_params).fetchall()
            clean = [int(sid) for sid, dirty in visible if not dirty]
            visible_dirty = len(visible) - len(clean)
            if not clean:
                return ScopePage([], visible_dirty, bool(any_dirty))
            where = "i.session_id = ANY(%(clean)s)"
            params["clean"] = clean
        if query is None:
            return ScopePage([], visible_dirty, bool(any_dirty))
        total, avgdl, df = _statistics(conn, agent, plan, query)
        pool_size = max(POOL, keep)
        pooled: list[tuple[int, float, int, int]] = []
        seen: set[int] = set()
        for match, ordering, extra in _ranking(plan, query, total, avgdl, df):
            sql = _MATCH.format(where=where, **ordering)
            bindings = params | extra | {"query": match, "limit": pool_size - len(pooled)}
            for rowid, rank, sid, depth in execute_custom(conn, sql, bindings).fetchall():
                if rowid not in seen:
                    seen.add(rowid)
                    pooled.append((int(rowid), float(rank), int(sid), int(depth)))
            if len(pooled) >= pool_size:
                break
        if not pooled:
            return ScopePage([], visible_dirty, bool(any_dirty))
        ranked = rerank(pooled)[:keep]
        details = {
            int(row[0]): row
            for row in execute_custom(
                conn, _DETAILS, (agent, [rowid for rowid, _ in ranked])
            ).fetchall()
        }
    candidates = []
    for rowid, score in ranked:
        _, session_id, key, ts, role, text = details[rowid]
        candidates.append(
            Candidate(rowid, score, int(session_id), str(key), float(ts), str(role), _text(text))
        )
    return ScopePage(candidates, visible_dirty, bool(any_dirty))
