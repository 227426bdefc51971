"""PostgreSQL search counts document frequencies only as far as they decide something
(docs/design.md §11 "Latency"): where the common-term rules apply, each term's count stops
one past the common threshold, and the queries run are those of exact counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import apsw
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activememory.protocol.content import Message
from activememory.protocol.indexer import AppendMessage
from activememory.protocol.records import AddRecord, Record, SearchScope
from activememory.protocol.session_key import parse_session_key
from activememory.storage.fts_query import RANK, TOKENIZE, index_row, plan_match
from activememory.storage.pg import db as pg_db
from activememory.storage.pg import search as pg_search
from activememory.storage.pg.records import PgRecordReader, PgRecordWriter
from activememory.storage.pg.terms import index_terms, pg_query
from activememory.storage.pg.transcripts import PgTranscriptWriter
from activememory.storage.records import RecordQuery
from activememory.storage.search import MIN_ROWS_TO_PRUNE, RANK_BUDGET

from pg_server import fresh_agent, pg_dsn

__all__ = ["pg_dsn"]  # the fixture, imported for pytest

WORDS = ["aisle", "seats", "running", "東京", "x1", "zeta", "cafe", "naïve", "the", "it's"]
queries = st.lists(st.sampled_from(WORDS), min_size=1, max_size=4, unique=True).map(" ".join)


@settings(max_examples=300, deadline=None)
@given(
    query=queries,
    match=st.sampled_from(["phrase", "prefix"]),
    total=st.one_of(
        st.integers(MIN_ROWS_TO_PRUNE, 10 * MIN_ROWS_TO_PRUNE), st.integers(250_000, 2_000_000)
    ),
    bounded=st.booleans(),
    data=st.data(),
)
def test_capped_frequencies_run_the_queries_exact_ones_run(
    query: str, match: Any, total: int, bounded: bool, data: st.DataObject
) -> None:
    plan = plan_match(query, match)
    assume_plan = plan is not None and pg_query(plan) is not None
    if not assume_plan:
        return
    assert plan is not None
    found = pg_query(plan)
    assert found is not None
    if not pg_search.prunes(plan, found, total):
        return
    threshold = pg_search.common_threshold(total)
    cap = pg_search.frequency_cap(total)
    # Around the threshold and the rank budget, where the decisions are made, and anywhere
    # up to every row.
    near = st.integers(max(0, threshold - 3), threshold + 3)
    budget = st.integers(pg_search.rank_budget() - 3, pg_search.rank_budget() + 3)
    frequency = st.one_of(near, budget, st.integers(0, total))
    exact = data.draw(st.lists(frequency, min_size=len(found.parts), max_size=len(found.parts)))
    capped = [min(n, cap) for n in exact]
    if found.has_phrase:
        capped[0] = 0  # never counted: read (`phrase_frequency`) only when ranked
        exact[0] = min(exact[1:])  # a phrase is in no more rows than any of its words

    def steps(df: list[int]) -> list[pg_search.Step]:
        return pg_search._ranking(
            plan, found, total, 12.5, df, bounded=bounded,
            newest=lambda i: 1000 + i, phrase_frequency=lambda: exact[0],
        )  # fmt: skip

    assert steps(capped) == steps(exact)
    # Reading the whole agent, while one term is within the rank budget the others are
    # counted only past it (`cached_frequencies`).
    budget_ = pg_search.rank_budget()
    terms_exact = exact[found.has_phrase :]
    if bounded and min(terms_exact) <= budget_:
        short = [n if n <= budget_ else budget_ + 1 for n in terms_exact]
        assert steps([0] * found.has_phrase + short) == steps(exact)


@pytest.fixture(scope="module")
def indexed(pg_dsn: str) -> Iterator[tuple[psycopg.Connection[Any], str, list[str]]]:
    """An agent whose index holds a few dozen messages of `WORDS`, and its texts."""
    agent = fresh_agent("cap")
    conn = pg_db.connect(pg_db.PgSettings(dsn=pg_dsn))
    writer = PgTranscriptWriter(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), agent)
    texts = [
        " ".join(WORDS[j] for j in range(len(WORDS)) if (i * 7 + j * 3) % (j + 2) == 0) or "zeta"
        for i in range(40)
    ]
    key = parse_session_key(f"agent:{agent}:direct:alice")
    writer.apply(
        [
            AppendMessage(key=key, message=Message(role="user", content=text), at=float(i))
            for i, text in enumerate(texts)
        ]
    )
    try:
        yield conn, agent, texts
    finally:
        writer.conn.close()
        conn.close()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(query=queries, match=st.sampled_from(["phrase", "prefix"]), cap=st.integers(1, 45))
def test_a_capped_count_is_the_exact_count_up_to_the_cap(
    indexed: tuple[psycopg.Connection[Any], str, list[str]], query: str, match: Any, cap: int
) -> None:
    conn, agent, _ = indexed
    plan = plan_match(query, match)
    found = None if plan is None else pg_query(plan)
    if found is None:
        return
    exact = [
        int(conn.execute(
            f"SELECT count(*) FROM {pg_db.SCHEMA}.message_index WHERE agent = %s"
            " AND terms @@ %s::tsquery",
            (agent, part.tsquery), prepare=False,
        ).fetchone()[0])  # type: ignore[index]
        for part in found.parts
    ]  # fmt: skip
    with conn.transaction():
        capped = pg_search.capped_frequencies(conn, agent, found, cap)
    expected = [min(n, cap) for n in exact]
    if found.has_phrase:
        expected[0] = 0
    assert capped == expected
    assert any(exact)  # the fixture's texts hold every word


def _prepared(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute("SELECT statement FROM pg_prepared_statements", prepare=False)
    return [str(row[0]) for row in rows]


def test_search_statements_are_planned_for_their_terms_each_time(
    indexed: tuple[psycopg.Connection[Any], str, list[str]],
) -> None:
    # psycopg prepares a statement run five times; PostgreSQL may then keep a generic plan,
    # blind to how many rows a term matches. The searches' statements are never prepared.
    conn, agent, _ = indexed
    for query in ["aisle", "zeta", "aisle seats", "running x1", "cafe"] * 3:
        plan = plan_match(query)
        assert plan is not None
        pg_search.search_scope(
            conn, agent, plan, scope="all", caller=f"agent:{agent}:direct:alice",
            session_key=None, keep=11,
        )  # fmt: skip
        pg_search.search_scope(
            conn, agent, plan, scope="tree", caller=f"agent:{agent}:direct:alice",
            session_key=None, keep=11,
        )  # fmt: skip
    assert _prepared(conn) == []


def test_records_search_statements_are_never_prepared(pg_dsn: str) -> None:
    conn = pg_db.connect(pg_db.PgSettings(dsn=pg_dsn))
    tenant = fresh_agent("rec")
    writer = PgRecordWriter(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), tenant)
    writer.apply(
        [
            AddRecord(
                record=Record(id=f"r{i}", content=f"aisle seat {i}", user_id="u", timestamp=1.0),
                at=1.0,
            )
            for i in range(8)
        ]
    )
    reader = PgRecordReader(conn, tenant)
    scope = SearchScope(
        user_id="u", agent_id=None, thread_id=None, exact_user_match=True,
        exact_agent_match=False, exact_thread_match=False,
    )  # fmt: skip
    try:
        for query in ["aisle", "seat", "aisle seat"] * 4:
            plan = plan_match(query)
            assert plan is not None
            hits = reader.search(plan, RecordQuery(scope=scope, now=2.0, limit=5, num_hops=2))
            assert hits
        assert _prepared(conn) == []
    finally:
        writer.conn.close()
        conn.close()


TEXT_WORDS = ["aisle", "seats", "seat", "running", "東京", "x1", "zeta", "café", "naïve"]


# Other rows of the index beside the one scored, so that N, the document frequencies and
# the average length vary with it.
OTHER_ROWS = [("aisle seats 東京", None), ("running café", "aisle"), ("zeta x1 naïve seat", "x1")]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    text=st.lists(st.sampled_from(TEXT_WORDS), min_size=1, max_size=12).map(" ".join),
    previous=st.one_of(st.none(), st.lists(st.sampled_from(TEXT_WORDS), max_size=6).map(" ".join)),
    query=st.lists(st.sampled_from(TEXT_WORDS), min_size=1, max_size=4).map(" ".join),
    match=st.sampled_from(["phrase", "prefix"]),
)
def test_the_bm25_of_a_row_is_fts5s(
    indexed: tuple[psycopg.Connection[Any], str, list[str]],
    text: str,
    previous: str | None,
    query: str,
    match: Any,
) -> None:
    """PostgreSQL's BM25 of a message (`bm25_sql`) is FTS5's `bm25(1.0, 1.0, 0.4)` of the
    same row among the same rows: a term counted in each column by its weight, a phrase
    (a CJK word's bigrams, the whole query) once per place it occurs."""
    conn, _, _ = indexed
    plan = plan_match(query, match)
    found = None if plan is None else pg_query(plan)
    if plan is None or found is None:
        return
    rows = [(text, previous), *OTHER_ROWS]
    fts = apsw.Connection(":memory:")
    fts.execute(f"CREATE VIRTUAL TABLE t USING fts5(words, grams, context, tokenize='{TOKENIZE}')")
    for rowid, (body, before) in enumerate(rows, 1):
        fts.execute("INSERT INTO t(rowid, words, grams, context) VALUES (?, ?, ?, ?)",
                    index_row(rowid, body, before))  # fmt: skip
    expected = fts.execute(
        f"SELECT -{RANK.replace('bm25(', 'bm25(t, ')} FROM t WHERE t MATCH ? AND rowid = 1",
        (plan.expression(),),
    ).fetchall()
    terms = [index_terms(body, before) for body, before in rows]
    frequencies = [
        sum(
            bool(conn.execute("SELECT %s::tsvector @@ %s::tsquery", (row.terms, part.tsquery))
                 .fetchone()[0])  # type: ignore[index]
            for row in terms
        )
        for part in found.parts
    ]  # fmt: skip
    avgdl = sum(row.tokens for row in terms) / len(rows)
    params = pg_search._bm25_params(found, len(rows), avgdl, frequencies)
    params |= {"terms": terms[0].terms, "tokens": terms[0].tokens}
    (score,) = conn.execute(
        f"SELECT {pg_search.bm25_sql('i')}"
        " FROM (SELECT %(terms)s::tsvector AS terms, %(tokens)s::integer AS tokens) i",
        params,
        prepare=False,
    ).fetchone() or (None,)
    if not expected:  # the row does not match: nothing on either side
        assert score == 0
        return
    assert score == pytest.approx(expected[0][0], rel=1e-9)


CappedFrequencies = Callable[..., list[int]]


def _count_calls(
    monkeypatch: pytest.MonkeyPatch, *, common_fraction: float
) -> tuple[list[tuple[int | None, list[int]]], CappedFrequencies]:
    """A rank budget of 2 rows and `common_fraction`; every later `capped_frequencies`
    call recorded as (its cap, the counts it found). Also returns the function unspied."""
    from activememory.storage import search as sqlite_search

    monkeypatch.setattr(sqlite_search, "RANK_BUDGET", 2)
    monkeypatch.setattr(pg_search, "RANK_BUDGET_DIVISOR", 1)
    monkeypatch.setattr(sqlite_search, "COMMON_FRACTION", common_fraction)
    calls: list[tuple[int | None, list[int]]] = []
    capped = pg_search.capped_frequencies

    def counting(*args: Any, **kwargs: Any) -> list[int]:
        found = capped(*args, **kwargs)
        calls.append((args[3], found))
        return found

    monkeypatch.setattr(pg_search, "capped_frequencies", counting)
    return calls, capped


def test_term_counts_are_remembered_until_the_index_grows_by_a_quarter(
    indexed: tuple[psycopg.Connection[Any], str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from activememory.storage.search import TermStats

    conn, agent, _ = indexed
    calls, _capped = _count_calls(monkeypatch, common_fraction=0.0)  # the cap: 3 rows
    stats = TermStats()
    plan = plan_match("zeta x1")
    found = None if plan is None else pg_query(plan)
    assert found is not None and found.has_phrase
    total = 40
    first = pg_search.cached_frequencies(conn, agent, found, total, stats)
    assert [len(counts) for _, counts in calls] == [2] and first[0] == 0  # the phrase's: never
    # A count that reached the cap reads as more rows than the index holds: it stays
    # common whatever the threshold becomes while it is remembered.
    exact = pg_search.capped_frequencies(conn, agent, found, 1000)
    assert first[1:] == [n if n < 3 else total + 1 for n in exact[1:]]
    assert total + 1 in first  # the fixture's texts hold "zeta" or "x1" more than 3 times
    calls.clear()
    again = pg_search.cached_frequencies(conn, agent, found, total + 10, stats)
    assert again == first and calls == []  # within a quarter: nothing counted
    pg_search.cached_frequencies(conn, agent, found, total * 2, stats)
    assert [len(counts) for _, counts in calls] == [2]  # grown by over a quarter: counted again


def test_postgresql_ranks_a_smaller_budget_of_rows_than_sqlite() -> None:
    # A row costs PostgreSQL's BM25 about ten times FTS5's (docs/design.md §11 "Latency"):
    # a term of a few hundred rows at 1M, ranked whole on SQLite, is ranked over its newest
    # `rank_budget()` matches here.
    total = 1_000_000
    budget = pg_search.rank_budget()
    assert budget == RANK_BUDGET // pg_search.RANK_BUDGET_DIVISOR < RANK_BUDGET
    plan = plan_match("heron")
    found = pg_query(plan)
    assert found is not None and pg_search.prunes(plan, found, total)
    for rows, since in [(budget, 0), (budget + 1, 77), (RANK_BUDGET, 77)]:
        steps = pg_search._ranking(
            plan, found, total, 12.5, [rows], bounded=True,
            newest=lambda i: 77, phrase_frequency=lambda: 0,
        )  # fmt: skip
        assert (steps[0].ordering, steps[0].since) == (pg_search._BY_RANK, since)
    assert pg_search.frequency_cap(total) == max(pg_search.common_threshold(total), budget) + 1


def test_a_rows_terms_are_unnested_once_per_query_part(
    indexed: tuple[psycopg.Connection[Any], str, list[str]],
) -> None:
    # BM25 reads a part's frequency twice (f * 2.2 / (f + ...)); pulled up into the sum,
    # the subquery computing it ran twice a row, each time unnesting the row's terms: the
    # ranking step's cost nearly doubled (docs/design.md §11 "Latency").
    conn, agent, _ = indexed
    for query, parts in [("aisle", 1), ("aisle seats", 3)]:
        plan = plan_match(query)
        found = None if plan is None else pg_query(plan)
        assert found is not None and len(found.parts) == parts
        params = pg_search._bm25_params(found, 100, 12.5, [1] * parts)
        sql = pg_search._MATCH.format(
            where="true", agent=pg_search.agent_condition("i.agent", False), **pg_search._BY_RANK
        )
        bindings = params | {"agent": agent, "query": found.match, "since": 0, "limit": 50}
        plan_text = "\n".join(
            str(row[0])
            for row in conn.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql, bindings, prepare=False
            )
        )
        # One lateral part per row of the parts' unnest, one unnest of the row's terms in it.
        assert plan_text.count("Function Scan on unnest u") == 1, plan_text


def test_bm25_unnests_only_the_query_lexemes_of_a_row(
    indexed: tuple[psycopg.Connection[Any], str, list[str]],
) -> None:
    # Unnesting a tsvector builds two arrays per lexeme; a row's other lexemes are cut away
    # first (two ts_delete), unless a prefix part must see them all (docs/design.md §11
    # "Latency").
    conn, agent, _ = indexed
    for query, match, removed in [("aisle", "phrase", False), ("ais", "prefix", True)]:
        plan = plan_match(query, match)
        found = None if plan is None else pg_query(plan)
        assert found is not None
        params = pg_search._bm25_params(found, 100, 12.5, [1] * len(found.parts))
        sql = pg_search._MATCH.format(
            where="true", agent=pg_search.agent_condition("i.agent", False), **pg_search._BY_RANK
        )
        bindings = params | {"agent": agent, "query": found.match, "since": 0, "limit": 50}
        plan_text = "\n".join(
            str(row[0])
            for row in conn.execute(
                "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + sql, bindings, prepare=False
            )
        )
        unnest = plan_text[plan_text.index("Function Scan on unnest u") :]
        assert ("Rows Removed by Filter" in unnest.split("\n")[2]) == removed, plan_text


def test_readers_plan_without_parallel_workers_or_jit(pg_dsn: str) -> None:
    # A parallel plan's workers took longer to start than the scan they shared (a search's
    # "newest rows holding any term" step: 26 ms, of which the scan 6), and JIT compiles
    # for longer than a search runs (docs/design.md §11 "Latency").
    from activememory.storage.pg.transcripts import PgTranscriptReader

    readers = [
        PgTranscriptReader(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), fresh_agent()),
        PgRecordReader(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), fresh_agent()),
    ]
    for reader in readers:
        with reader.conn.transaction():  # as each read runs
            shown = [
                reader.conn.execute(f"SHOW {name}").fetchone()
                for name in ("max_parallel_workers_per_gather", "jit")
            ]
        assert shown == [("0",), ("off",)]
        reader.conn.close()


def test_an_agent_that_is_the_whole_table_is_not_looked_up_by_its_index_key() -> None:
    # The full-text index is (agent, terms): for an agent holding every row its key selects
    # nothing, yet each lookup intersected a term's postings with all of the agent's (4-10
    # ms at 1M). There its condition is checked on the rows read; with another agent's rows
    # in the table the index keeps it. The answers are the same (docs/design.md §11).
    from pg_server import scratch_database

    def statements(conn: psycopg.Connection[Any], agent: str, query: str) -> list[str]:
        plan = plan_match(query)
        assert plan is not None
        with conn.transaction():
            steps = pg_search.ranking_steps(conn, agent, plan, bounded=True)
        return [
            "\n".join(
                str(row[0])
                for row in conn.execute(
                    "EXPLAIN (COSTS OFF) "
                    + pg_search._MATCH.format(where="true", agent=step.agent, **step.ordering),
                    {"agent": agent, "query": step.match, "since": step.since, "limit": 50}
                    | step.bindings,
                    prepare=False,
                )
            )
            for step in steps
            if step.ordering is pg_search._BY_RANK
        ]

    def search(conn: psycopg.Connection[Any], agent: str, query: str) -> list[int]:
        plan = plan_match(query)
        assert plan is not None
        page = pg_search.search_scope(
            conn, agent, plan, scope="all", caller=f"agent:{agent}:direct:alice",
            session_key=None, keep=11,
        )  # fmt: skip
        return [c.event_id for c in page.candidates]

    with scratch_database() as dsn:
        conn = pg_db.connect(pg_db.PgSettings(dsn=dsn))
        conn.autocommit = True
        conn.execute("SET enable_seqscan = off")  # a few hundred rows: as a large table would
        writers = {}
        for agent, rows in [("solo", 30), ("other", 300)]:
            writers[agent] = PgTranscriptWriter(pg_db.connect(pg_db.PgSettings(dsn=dsn)), agent)
            key = parse_session_key(f"agent:{agent}:direct:alice")
            texts = [f"aisle seat {i} zeta" if i % 3 else f"kite {i}" for i in range(rows)]
            writers[agent].apply(
                [
                    AppendMessage(key=key, message=Message(role="user", content=t), at=1.0)
                    for t in texts
                ]
            )
            conn.execute(f"ANALYZE {pg_db.SCHEMA}.message_index")
            plans = statements(conn, "solo", "aisle")
            assert plans, "a ranked step"
            index_cond = [line for p in plans for line in p.split("\n") if "Index Cond" in line]
            alone = agent == "solo"
            assert index_cond and all(("agent" in line) != alone for line in index_cond), plans
            if alone:
                whole = search(conn, "solo", "aisle kite")
        assert search(conn, "solo", "aisle kite") == whole  # the same answer either way
        for writer in writers.values():
            writer.conn.close()
        conn.close()


def test_terms_the_table_statistics_put_far_over_the_cap_are_common_without_a_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Counting a common term reads `frequency_cap` rows (5,001 at 1M, 20-60 ms): a lexeme
    # ANALYZE's sample puts in twice that many rows of an agent that is the whole table is
    # remembered as common at once; a rarer one is still counted (docs/design.md §11).
    from activememory.storage.search import TermStats

    from pg_server import scratch_database

    monkeypatch.setattr(pg_search, "frequency_cap", lambda total: 20)
    with scratch_database() as dsn:
        conn = pg_db.connect(pg_db.PgSettings(dsn=dsn))
        conn.autocommit = True
        writer = PgTranscriptWriter(pg_db.connect(pg_db.PgSettings(dsn=dsn)), "solo")
        key = parse_session_key("agent:solo:direct:alice")
        # A row is indexed with the one before it: "aisle" in all 300 rows, "kite" in 60
        # (over 2 x 20), "zeta" in 6.
        texts = [
            "aisle" + (" kite" if i % 10 == 0 else "") + (" zeta" if i % 100 == 0 else "")
            for i in range(300)
        ]
        writer.apply(
            [AppendMessage(key=key, message=Message(role="user", content=t), at=1.0) for t in texts]
        )
        conn.execute(f"ANALYZE {pg_db.SCHEMA}.message_index")

        def seeded(total: int, table: float) -> list[int | None]:
            stats = TermStats()
            with conn.transaction():
                pg_search.seed_common_terms(conn, total, table, stats)
            return [stats.cached(term, total) for term in ("'aisl'", "'kite'", "'zeta'")]

        assert seeded(300, 300.0) == [301, 301, None]  # more than the index holds: common
        # 50 rows of other agents, which may all hold "kite": 60 - 50 is not 2 x 20.
        assert seeded(250, 300.0) == [251, None, None]
        writer.conn.close()
        conn.close()


def test_reading_the_whole_agent_a_term_within_the_budget_stops_the_others_counts(
    indexed: tuple[psycopg.Connection[Any], str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # While one term is within the rank budget, no term over it is ranked or the rarest:
    # the others are counted to the budget + 1 only (501 rows a term at 1M, not 5,001).
    from activememory.storage.search import TermStats

    conn, agent, _ = indexed
    calls, capped = _count_calls(monkeypatch, common_fraction=0.5)  # 40 rows: the cap is 21
    total = 40
    for query, bounded, expected_caps in [
        ("aisle kite", True, [3]),  # "kite" is in no row
        ("aisle kite", False, [21]),
        ("aisle zeta", True, [3, 21]),  # both over the budget: counted on
    ]:
        plan = plan_match(query)
        found = None if plan is None else pg_query(plan)
        assert found is not None
        exact = capped(conn, agent, found, 1000)[found.has_phrase :]
        calls.clear()
        df = pg_search.cached_frequencies(conn, agent, found, total, TermStats(), False, bounded)
        assert [cap for cap, _ in calls] == expected_caps, query
        if expected_caps == [3]:
            assert df[found.has_phrase :] == [n if n <= 2 else 3 for n in exact]
        else:
            assert df[found.has_phrase :] == [n if n < 21 else total + 1 for n in exact]
