"""The SQL half of `sessions_search` on PostgreSQL (docs/design.md §3, §11).

As on SQLite (storage/search.py, whose pool, reranking, common-term rules and rank budget
(`rankable`) this reuses):
the visible, clean sessions are a condition of the matching query itself, before its
LIMIT. The ranking is FTS5's BM25 computed from term statistics (`activememory.bm25`,
storage/pg/db.py): document frequencies counted in the agent's index, N and the average
length summed from the session rows; not `ts_rank`, which has no inverse document
frequency and no length normalisation of the BM25 kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

from ...protocol.config import PrivateScope
from ...protocol.session_key import parse_session_key
from .. import search as lite
from ..fts_query import MatchPlan
from ..search import Candidate, DbScope, ScopePage, TermStats, rankable, rerank
from .db import SCHEMA
from .terms import PgQuery, QueryPhrase, pg_query, quote
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


# A lookup's agent condition where the agent holds (nearly) every indexed row of the table
# (at least this share of `pg_class.reltuples`). The full-text index is (agent, terms):
# there the agent key selects nothing, yet the index intersects a term's postings with all
# of the agent's, 4-10 ms a lookup at 1M (0.4-0.8 without). So the condition is written
# where the index cannot use it (`|| ''`) and each row read is checked instead; with other
# agents' rows in the table the index keeps it (docs/design.md §11 "Latency").
WHOLE_TABLE_SHARE = 0.9


def agent_condition(column: str, whole: bool) -> str:
    """`column = %(agent)s`, or (`whole`: the agent is nearly the whole table) the same
    condition kept out of the full-text index (`WHOLE_TABLE_SHARE`)."""
    return f"{column} || '' = %(agent)s" if whole else f"{column} = %(agent)s"


_MATCH = (
    "SELECT i.event_id, {rank} AS r, i.session_id, i.depth FROM "
    + f"{_S}.message_index i"
    + " WHERE {agent} AND i.terms @@ %(query)s::tsquery"
    " AND i.event_id >= %(since)s AND {where} ORDER BY {order} LIMIT %(limit)s"
)


def bm25_sql(row: str) -> str:
    """FTS5's BM25 (k1 1.2, b 0.75, IDF floored at 1e-6) of the index row aliased `row`
    (its `terms` and `tokens`) for the bound query parts (`_bm25_params`), written into the
    query itself, where PostgreSQL plans it once as a subquery (an SQL function that cannot
    be inlined costs ~3 x as much a row; docs/design.md §11 "Latency").

    A part's frequency is FTS5's: a lexeme's A positions (the message's words and bigrams)
    plus 0.4 x its B positions (the context column); a phrase's places, each 1 or 0.4 by
    the column of its first word (no phrase spans two columns: terms.py). `OFFSET 0` keeps
    a part's frequency `f` one value: a subquery the planner may pull up is written out
    wherever `f` is read (twice), and each copy unnested the row's terms again. Unnesting
    builds two arrays per lexeme, so the row's terms are first cut to the query's lexemes
    (`%(only)s`: its lexemes, or NULL when a prefix part must see them all): every other
    lexeme deleted (`ts_delete`)."""
    return (
        "(SELECT coalesce(sum(q.idf * f.f * 2.2 / (f.f + 1.2 * (0.25 + 0.75 *"
        f" {row}.tokens / %(avgdl)s::float8))), 0)"
        f" FROM (SELECT CASE WHEN %(only)s::text[] IS NULL THEN {row}.terms"
        f" ELSE ts_delete({row}.terms, tsvector_to_array(ts_delete({row}.terms,"
        " %(only)s::text[]))) END AS terms OFFSET 0) k"
        " CROSS JOIN unnest(%(lexemes)s::text[], %(prefixes)s::boolean[],"
        " %(phrases)s::text[]::tsquery[], %(words)s::text[], %(idf)s::float8[])"
        " AS q(lexeme, prefix, phrase, words, idf)"
        " CROSS JOIN LATERAL (SELECT CASE WHEN q.phrase IS NOT NULL THEN"
        f" CASE WHEN {row}.terms @@ q.phrase THEN {_PHRASE_PLACES} ELSE 0.0 END"
        " ELSE coalesce((SELECT sum(cardinality(array_positions(u.weights, 'A'))"
        " + 0.4 * cardinality(array_positions(u.weights, 'B')))"
        " FROM unnest(k.terms) u WHERE u.lexeme = q.lexeme"
        " OR (q.prefix AND starts_with(u.lexeme, q.lexeme))), 0.0) END AS f OFFSET 0) f)"
    )


# The places of phrase `q` (its lexemes space-separated in `q.words`, the last a prefix
# when `q.prefix`) in the cut terms `k`: every position of its first word at which each
# later word stands as many positions on, weighted by the first word's column.
_PHRASE_PLACES = (
    "(SELECT coalesce(sum(CASE WHEN s.weight = 'A' THEN 1.0 ELSE 0.4 END), 0.0)"
    " FROM (SELECT string_to_array(q.words, ' ') AS w) p"
    " CROSS JOIN unnest(k.terms) h CROSS JOIN LATERAL unnest(h.positions, h.weights)"
    " AS s(at, weight)"
    " WHERE h.lexeme = p.w[1] AND NOT EXISTS (SELECT 1"
    " FROM generate_series(2, cardinality(p.w)) j WHERE NOT EXISTS (SELECT 1"
    " FROM unnest(k.terms) t WHERE s.at + j - 1 = ANY(t.positions) AND (t.lexeme = p.w[j]"
    " OR (q.prefix AND j = cardinality(p.w) AND starts_with(t.lexeme, p.w[j]))))))"
)


_BM25 = "-" + bm25_sql("i")
_BY_RANK = {"rank": _BM25, "order": "r, i.event_id DESC"}
_BY_RECENCY = {"rank": "0.0", "order": "i.event_id DESC"}
# `+ 0`: the AND's newest rows found from its terms' postings (led by one of at most
# `RANK_BUDGET` rows), then sorted; ordered by the bare key, the planner may walk the
# primary key backwards, filtering every row for an AND that rarely holds: 588 ms against
# 10 ms at 1M (docs/design.md §11 "Latency").
_BY_RECENCY_ALL_TERMS = {"rank": "-1.0", "order": "i.event_id + 0 DESC"}
# The newest rows holding any term, those holding every term marked -1.0 as the AND step
# would (storage/search.py `every_term_first`): the mark is a condition on each row read,
# so one query does what SQLite does in one read per term.
_EVERY_TERM_FIRST = {
    "rank": "CASE WHEN i.terms @@ %(every)s::tsquery THEN -1.0 ELSE 0.0 END",
    "order": "i.event_id DESC",
}
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


class Step(NamedTuple):
    """One matching query of a search (storage/search.py `Step` on PostgreSQL): its tsquery,
    its ordering (`_BY_RANK`, `_BY_RECENCY`...), the bindings that ordering reads (BM25's,
    or `every`), its window (the lowest event id it reads; 0: all), `wide`: read that
    many rows and reorder them by rank (`_EVERY_TERM_FIRST`), and its agent condition
    (`agent_condition`: the recency steps keep the indexable one, which lets the planner
    walk the primary key newest first)."""

    match: str
    ordering: dict[str, str]
    bindings: dict[str, Any]
    since: int = 0
    wide: int = 0
    agent: str = agent_condition("i.agent", False)


def ranking_steps(
    conn: Connection,
    agent: str,
    plan: MatchPlan,
    *,
    bounded: bool,
    stats: TermStats | None = None,
) -> list[Step]:
    """The queries to run, in order, until the pool is full (storage/search.py
    `ranking_steps`, whose rules these are: `rankable` decides): with the agent's term
    statistics (`_statistics`) and, for a window, the rarest term's newest matches.
    `bounded`: the search reads the whole agent, not a listed scope's sessions; `stats`:
    the reader's cache of term counts (`cached_frequencies`), None to count each time."""
    query = pg_query(plan)
    if query is None:
        return []
    total, avgdl, df, whole = _statistics(conn, agent, plan, query, stats, bounded)
    return _ranking(
        plan, query, total, avgdl, df, bounded=bounded, whole=whole,
        newest=lambda i: newest_match(conn, agent, _term(query, i).tsquery, whole=whole),
        phrase_frequency=lambda: capped_frequencies(
            conn, agent, PgQuery(query.parts[:1], False), None, whole=whole
        )[0],
    )  # fmt: skip


def _term(query: PgQuery, i: int) -> QueryPhrase:
    """The part of term i of the plan (where `prunes`: one part per term, after the phrase)."""
    return query.parts[i + query.has_phrase]


def _statistics(
    conn: Connection,
    agent: str,
    plan: MatchPlan,
    query: PgQuery,
    stats: TermStats | None = None,
    bounded: bool = False,
) -> tuple[int, float, list[int], bool]:
    """(N, average tokens per row, each part's document frequency) of the agent's index,
    and whether the agent is nearly the whole table (`agent_condition`).

    Where the common-term rules apply (`prunes`), a term's frequency is counted only up to
    `frequency_cap` (over it the exact figure is never used, and counting a common term's
    rows was the search's tail) and the phrase's not at all (0: `_ranking` counts it
    when it ranks it): docs/design.md §11 "Latency"."""
    row = execute_custom(
        conn,
        f"SELECT coalesce(sum(index_rows), 0), coalesce(sum(index_tokens), 0),"
        f" (SELECT reltuples FROM pg_catalog.pg_class"
        f"  WHERE oid = '{_S}.message_index'::regclass)"
        f" FROM {_S}.sessions WHERE agent = %s",
        (agent,),
    ).fetchone()
    total, tokens, table = (int(row[0]), int(row[1]), float(row[2] or 0)) if row else (0, 0, 0)
    avgdl = tokens / total if total else 1.0
    whole = table > 0 and total >= WHOLE_TABLE_SHARE * table
    if prunes(plan, query, total):
        if whole and stats is not None:
            seed_common_terms(conn, total, table, stats)
        df = cached_frequencies(conn, agent, query, total, stats, whole, bounded)
        return total, avgdl, df, whole
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
    return total, avgdl, frequencies, whole


# BM25 from term statistics costs PostgreSQL ≈ 30–50 µs a row against FTS5's ≈ 4 (docs/design.md
# §11 "Latency"): ranking SQLite's 1,500 rows was the 1M tail. The budget is one of time, so
# here it is a smaller number of rows.
RANK_BUDGET_DIVISOR = 3


def rank_budget() -> int:
    """The most rows an agent-wide search ranks on PostgreSQL (storage/search.py `rankable`):
    SQLite's `RANK_BUDGET` over `RANK_BUDGET_DIVISOR`."""
    return max(1, lite.RANK_BUDGET // RANK_BUDGET_DIVISOR)


def common_threshold(total: int) -> int:
    """The most rows a term may match in an index of `total` and not be common."""
    return int(total * lite.COMMON_FRACTION)


def frequency_cap(total: int) -> int:
    """How far a term's rows are counted where the common-term rules apply: one past the
    larger of the common threshold and the rank budget, so that "common" and "even the
    rarest term is over the budget" are decided as exact counts would decide them."""
    return max(common_threshold(total), rank_budget()) + 1


def prunes(plan: MatchPlan, query: PgQuery, total: int) -> bool:
    """Whether `_ranking` decides by the common-term rules (not one BM25 query over every
    part), so that it reads no frequency over `frequency_cap(total)` and no phrase's
    unless it ranks it."""
    terms = len(query.parts) - query.has_phrase
    return total >= lite.MIN_ROWS_TO_PRUNE and terms == len(plan.terms)


def capped_frequencies(
    conn: Connection,
    agent: str,
    query: PgQuery,
    cap: int | None,
    *,
    table: str = "message_index",
    phrase: bool = False,
    whole: bool = False,
) -> list[int]:
    """Each part's document frequency over the agent's rows of `table` (its `terms`),
    counted up to `cap` (min(exact, cap); None: every row); the whole-query phrase's only
    with `phrase` (else 0: pruning reads it only when it ranks it); `whole`: the agent is
    nearly the whole table (`agent_condition`). One statement, planned for its terms."""
    first = 0 if phrase else query.has_phrase
    counts = ", ".join(
        f"(SELECT count(*) FROM (SELECT 1 FROM {_S}.{table}"
        f" WHERE {agent_condition('agent', whole)}"
        f" AND terms @@ %(p{i})s::tsquery LIMIT %(cap)s) c{i})"
        for i in range(first, len(query.parts))
    )
    params: dict[str, Any] = {f"p{i}": part.tsquery for i, part in enumerate(query.parts)}
    found = execute_custom(
        conn, f"SELECT {counts}", params | {"agent": agent, "cap": cap}
    ).fetchone()
    assert found is not None
    return [0] * first + [int(n) for n in found]


def idf_cap(total: int) -> int:
    """The document frequency from which BM25's IDF is at its floor in an index of `total`
    rows (a part in half the rows or more): counted up to it, every IDF is the exact one."""
    return (total + 1) // 2


def cached_frequencies(
    conn: Connection,
    agent: str,
    query: PgQuery,
    total: int,
    stats: TermStats | None,
    whole: bool = False,
    bounded: bool = False,
) -> list[int]:
    """`capped_frequencies` at `frequency_cap(total)`, each term's count remembered in
    `stats` (storage/search.py `TermStats`, one per agent and process) and reused until
    the agent's index has grown or shrunk by a quarter: counting a term to the cap reads up
    to 5,001 rows at 1M, most of a search's time there (docs/design.md §11 "Latency").
    A count that reached the cap is remembered as more than the index holds, so it stays
    common however the threshold moves meanwhile; a rarer term's may be off by what
    other processes wrote since (its IDF with it), as SQLite's `TermStats` decisions are.

    `bounded` (the search reads the whole agent): the terms are first counted only up to
    `rank_budget()` + 1. While one term is within the budget, `rankable` never ranks a term
    over it (the rows would not fit), nor is one the rarest, so "over the budget" decides
    as its exact count would: those are given as `rank_budget()` + 1 (and not remembered),
    and only when every term is over it are they counted on to the cap (the rarest's
    window and IDF, and which is common) — 501 rows read a term, not 5,001, at 1M."""
    cap = frequency_cap(total)
    if stats is None:
        return capped_frequencies(conn, agent, query, cap, whole=whole)
    terms = query.parts[query.has_phrase :]
    found = [stats.cached(part.tsquery, total) for part in terms]
    missing = [i for i, count in enumerate(found) if count is None]
    short = rank_budget() + 1
    if bounded and missing and short < cap:
        wanted = PgQuery(tuple(terms[i] for i in missing), False)
        counted = capped_frequencies(conn, agent, wanted, short, whole=whole)
        for i, count in zip(missing, counted, strict=True):
            if count < short:  # the exact count
                found[i] = count
                stats.remember(terms[i].tsquery, count, total)
        if any(count is not None and count < short for count in found):
            return [0] * query.has_phrase + [short if n is None else n for n in found]
        missing = [i for i, count in enumerate(found) if count is None]
    if missing:
        wanted = PgQuery(tuple(terms[i] for i in missing), False)
        for i, count in zip(
            missing, capped_frequencies(conn, agent, wanted, cap, whole=whole), strict=True
        ):
            found[i] = count if count < cap else total + 1
            stats.remember(terms[i].tsquery, found[i] or 0, total)
    return [0] * query.has_phrase + [count or 0 for count in found]


# A lexeme the table's statistics put in this many times the rows a count stops at (or
# more) is remembered as common without counting it (`seed_common_terms`).
COMMON_BY_STATISTICS = 2
_SEEDED = "\0seeded"  # no tsquery: the TermStats entry saying when the seeding was done


def seed_common_terms(conn: Connection, total: int, table: float, stats: TermStats) -> None:
    """Remember in `stats` as common (`cached_frequencies`' "more than the index holds")
    the lexemes that ANALYZE's sample of `message_index` (`pg_stats.most_common_elems`:
    the ~1,000 most frequent, each with the share of rows holding it) puts in at least
    `COMMON_BY_STATISTICS` x `frequency_cap(total)` of the agent's `total` rows: those
    counts, each reading `frequency_cap` rows (5,001 at 1M, 20-60 ms), were the first
    searches' tail. For an agent that is nearly the whole table (`agent_condition`): the
    rows of other agents (`table` - `total`) are taken as all holding the lexeme. The
    sample's error at the common threshold is a few percent: a lexeme twice over the cap
    by the estimate is over it by count. Once per agent and process, again when the index
    has grown or shrunk by a quarter (`TermStats`' rule); docs/design.md §11 "Latency"."""
    if stats.cached(_SEEDED, total) is not None:
        return
    stats.remember(_SEEDED, 1, total)
    row = execute_custom(
        conn,
        "SELECT most_common_elems::text::text[], most_common_elem_freqs"
        " FROM pg_catalog.pg_stats WHERE schemaname = %s AND tablename = 'message_index'"
        " AND attname = 'terms'",
        (SCHEMA,),
    ).fetchone()
    if row is None or row[0] is None or row[1] is None:
        return
    floor = COMMON_BY_STATISTICS * frequency_cap(total) + max(0.0, table - total)
    for lexeme, share in zip(row[0], row[1], strict=False):  # the shares end with 3 more
        if share * table >= floor:
            stats.remember(quote(str(lexeme)), total + 1, total)


def newest_match(conn: Connection, agent: str, tsquery: str, *, whole: bool = False) -> int:
    """The start of a term's window: the event id of the `rank_budget()`-th newest row of
    the agent holding it (0 if fewer hold it); storage/search.py `newest_match`. Sorted
    from the term's postings (`+ 0`, as the AND step): it is not common, so they are few.
    `whole`: `agent_condition`'s."""
    row = execute_custom(
        conn,
        f"SELECT event_id FROM {_S}.message_index WHERE {agent_condition('agent', whole)}"
        " AND terms @@ %(term)s::tsquery ORDER BY event_id + 0 DESC OFFSET %(skip)s LIMIT 1",
        {"agent": agent, "term": tsquery, "skip": rank_budget() - 1},
    ).fetchone()
    return 0 if row is None else int(row[0])


def _idf(total: int, frequency: int) -> float:
    # A count may exceed the index: a capped one is remembered as `total + 1`, and a
    # remembered one outlives a shrinking index by up to a quarter (`cached_frequencies`).
    # Over half the rows the IDF is at its floor anyway, so clamp rather than fail.
    frequency = min(frequency, total)
    value = math.log((total - frequency + 0.5) / (frequency + 0.5))
    return value if value > 0 else _MIN_IDF


def _bm25_params(query: PgQuery, total: int, avgdl: float, df: list[int]) -> dict[str, Any]:
    prefixed = any(part.prefix for part in query.parts)
    only = None
    if not prefixed:
        only = [lexeme for part in query.parts for lexeme in (part.lexeme, *part.words) if lexeme]
    return {
        "only": only,
        "lexemes": [part.lexeme for part in query.parts],
        "prefixes": [part.prefix for part in query.parts],
        "phrases": [part.phrase for part in query.parts],
        "words": [" ".join(part.words) if part.words else None for part in query.parts],
        "idf": [_idf(total, n) for n in df],
        "avgdl": max(avgdl, 1e-9),
    }


def _ranking(
    plan: MatchPlan,
    query: PgQuery,
    total: int,
    avgdl: float,
    df: list[int],
    *,
    bounded: bool,
    newest: Callable[[int], int],
    phrase_frequency: Callable[[], int],
    whole: bool = False,
) -> list[Step]:
    """The steps of storage/search.py `ranking_steps` for `query` (`pg_query(plan)`), `df`
    as `_statistics` counts it: exact, or (`prunes`) capped at `frequency_cap`, which
    decides the same. `newest(i)`: the window of term i (`newest_match`); `phrase_frequency()`:
    the whole-query phrase's, read only when every term is ranked (as SQLite, the phrase is
    ranked then, and never in a recency step). `whole`: the ranked and AND steps' agent
    condition is kept out of the full-text index (`agent_condition`)."""
    agent = agent_condition("i.agent", whole)
    if not prunes(plan, query, total):
        return [Step(query.match, _BY_RANK, _bm25_params(query, total, avgdl, df), agent=agent)]
    terms = query.parts[query.has_phrase :]
    docs = df[query.has_phrase :]
    ranked, rarest, windowed = rankable(
        docs, common_threshold(total), bounded=bounded, budget=rank_budget()
    )
    any_term = PgQuery(terms, False).match
    by_recency = [Step(any_term, _BY_RECENCY, {})]
    every = " & ".join(f"({part.tsquery})" for part in terms)
    if len(terms) > 1 and docs[rarest] > rank_budget():  # even the rarest is long
        by_recency = [Step(any_term, _EVERY_TERM_FIRST, {"every": every}, wide=lite.RECENCY_WIDE)]
    elif len(terms) > 1:  # an AND led by a short posting list: cheap
        by_recency.insert(0, Step(every, _BY_RECENCY_ALL_TERMS, {}, agent=agent))
    if not any(ranked):
        return by_recency
    # The rarer terms ranked first; when they match too few rows (a name or id found
    # nowhere), the others still answer, newest first, as if asked alone.
    window = newest(rarest) if windowed else 0
    kept = pg_query(plan, ranked)
    assert kept is not None  # the rarest term is kept, and has a part
    kept_df = [n for n, keep in zip(docs, ranked, strict=True) if keep]
    if kept.has_phrase:
        kept_df.insert(0, phrase_frequency())
    bm25 = _bm25_params(kept, total, avgdl, kept_df)
    return [Step(kept.match, _BY_RANK, bm25, window, agent=agent), *by_recency]


def search_scope(
    conn: Connection,
    agent: str,
    plan: MatchPlan,
    *,
    scope: DbScope,
    caller: str,
    session_key: str | None,
    keep: int,
    stats: TermStats | None = None,
) -> ScopePage:
    """The `keep` best visible matches of `plan` in `agent`'s sessions (storage/search.py
    `search_scope` on PostgreSQL), read in one snapshot (`configure_reader`); `stats`,
    the term counts remembered for the agent (`cached_frequencies`)."""
    with conn.transaction():
        any_dirty = execute_custom(
            conn, f"SELECT 1 FROM {_S}.sessions WHERE agent = %s AND dirty LIMIT 1", (agent,)
        ).fetchone()
        params: dict[str, Any] = {"agent": agent}
        bounded = True  # the search reads the whole agent
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
            # A listed scope's sessions are read, not the agent's (SQLite: a small scope's
            # rowid span): ranked in full, as on SQLite.
            bounded = len(clean) > lite.SPAN_MAX_SESSIONS
        pool_size = max(lite.POOL, keep)
        pooled: list[tuple[int, float, int, int]] = []
        seen: set[int] = set()
        for step in ranking_steps(conn, agent, plan, bounded=bounded, stats=stats):
            sql = _MATCH.format(where=where, agent=step.agent, **step.ordering)
            limit = step.wide or pool_size - len(pooled)
            bindings = params | step.bindings | {"query": step.match, "since": step.since}
            rows = [
                (int(rowid), float(rank), int(sid), int(depth))
                for rowid, rank, sid, depth in execute_custom(
                    conn, sql, bindings | {"limit": limit}
                ).fetchall()
            ]
            if step.wide:  # holding every term first, then newest first
                rows.sort(key=lambda row: (row[1], -row[0]))
            for row in rows:
                if row[0] not in seen and len(pooled) < pool_size:
                    seen.add(row[0])
                    pooled.append(row)
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
