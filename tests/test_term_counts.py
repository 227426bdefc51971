"""SQLite's term counts for pruning (storage/search.py `term_docs`, docs/design.md §3): reading
the whole table, a term is first counted only to the rank budget + 1, which must decide
exactly as its full count would, for any frequencies — and must read fewer rows."""

from __future__ import annotations

import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activememory.storage import search as storage_search
from activememory.storage.db import RANK, TOKENIZE
from activememory.storage.fts_query import plan_match

BUDGET = 6  # the rank budget of these tests (RANK_BUDGET is 1,500)
THRESHOLD = 20  # the common threshold of these tests (more than the budget, as at 1M)
WORDS = ("alpha", "bravo", "charlie", "delta")


def table(counts: dict[str, int]) -> apsw.Connection:
    """An FTS5 table like message_fts: row i holds each word whose count is over i."""
    conn = apsw.Connection(":memory:")
    conn.execute(
        "CREATE VIRTUAL TABLE message_fts USING fts5(words, grams, context, content='',"
        f" contentless_delete=1, tokenize='{TOKENIZE}');"
        f"INSERT INTO message_fts(message_fts, rank) VALUES ('rank', '{RANK}');"
    )
    rows = max(THRESHOLD * 2, *counts.values())
    for i in range(rows):
        text = " ".join(["filler", *(w for w, n in counts.items() if n > i)])
        conn.execute("INSERT INTO message_fts(rowid, words) VALUES (?, ?)", (i + 1, text))
    return conn


class Exact(storage_search.TermStats):
    """Counts every term to the threshold, as before the shorter first count."""

    def docs_up_to(self, conn: apsw.Connection, term_expr: str, total: int, cap: int) -> int:
        return self.docs(conn, term_expr, total)


def count_caps(conn: apsw.Connection) -> list[int]:
    """The LIMIT of every term count `conn` runs from now on (its exec trace)."""
    caps: list[int] = []

    def trace(cursor: apsw.Cursor, sql: str, bindings: object) -> bool:
        if sql.startswith("SELECT count(*) FROM (SELECT rowid") and isinstance(bindings, tuple):
            caps.append(int(bindings[1]))
        return True

    conn.exec_trace = trace
    return caps


@pytest.fixture(autouse=True)
def small_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(storage_search, "MIN_ROWS_TO_PRUNE", 1)
    monkeypatch.setattr(storage_search, "RANK_BUDGET", BUDGET)


near = st.integers(BUDGET - 2, BUDGET + 2) | st.integers(THRESHOLD - 1, THRESHOLD + 2)


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(near | st.integers(0, 30), min_size=1, max_size=4),
    bounded=st.booleans(),
    twice=st.booleans(),
)
def test_the_shorter_first_count_decides_as_the_full_count(
    counts: list[int], bounded: bool, twice: bool
) -> None:
    words = dict(zip(WORDS, counts, strict=False))
    conn = table(words)
    plan = plan_match(" ".join(words))
    assert plan is not None
    exact = Exact(threshold=lambda total: THRESHOLD)
    short = storage_search.TermStats(threshold=lambda total: THRESHOLD)
    if twice:  # a second search finds what the first remembered
        storage_search.ranking_steps(conn, plan, short, bounded=bounded)
    assert storage_search.ranking_steps(
        conn, plan, short, bounded=bounded
    ) == storage_search.ranking_steps(conn, plan, exact, bounded=bounded)


def test_beside_a_term_within_the_budget_a_common_one_is_counted_to_the_budget_only() -> None:
    conn = table({"alpha": 3, "bravo": 30})
    caps = count_caps(conn)
    stats = storage_search.TermStats(threshold=lambda total: THRESHOLD)
    plan = plan_match("alpha bravo")
    assert plan is not None
    storage_search.ranking_steps(conn, plan, stats, bounded=True)
    assert caps == [BUDGET + 1, BUDGET + 1]
    # Asked again, "bravo" is known to be over the budget: nothing is counted.
    storage_search.ranking_steps(conn, plan, stats, bounded=True)
    assert caps == [BUDGET + 1, BUDGET + 1]
    # A small scope's search (not bounded) counts "bravo" to the threshold.
    storage_search.ranking_steps(conn, plan, stats, bounded=False)
    assert caps == [BUDGET + 1, BUDGET + 1, THRESHOLD + 1]


def test_with_every_term_over_the_budget_they_are_counted_on_to_the_threshold() -> None:
    conn = table({"charlie": 9, "bravo": 30})
    caps = count_caps(conn)
    plan = plan_match("charlie bravo")
    assert plan is not None
    stats = storage_search.TermStats(threshold=lambda total: THRESHOLD)
    storage_search.ranking_steps(conn, plan, stats, bounded=True)
    assert caps == [BUDGET + 1, BUDGET + 1, THRESHOLD + 1, THRESHOLD + 1]
