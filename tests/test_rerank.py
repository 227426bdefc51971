"""Conversational reranking of a search's pool (storage/search.py `rerank`, docs/design.md §3)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from activememory.storage.search import NEIGHBOUR, SESSION, rerank

# (rowid, bm25 rank, session id, depth): distinct rowids and (session, depth) places, ranks
# from a few values so that ties happen.
pools = st.lists(
    st.tuples(st.integers(0, 3), st.integers(0, 6), st.sampled_from([-3.0, -1.5, -1.0, -0.0])),
    unique_by=lambda row: (row[0], row[1]),
    max_size=30,
).flatmap(
    lambda places: st.permutations(range(1, len(places) + 1)).map(
        lambda rowids: [
            (rowid, rank, sid, depth)
            for rowid, (sid, depth, rank) in zip(rowids, places, strict=True)
        ]
    )
)


@given(pools)
def test_a_message_gains_from_its_neighbours_and_its_session(
    pooled: list[tuple[int, float, int, int]],
) -> None:
    """Score = -bm25 + NEIGHBOUR x the pool messages just before and after it + SESSION x
    the rest of its session's pool; best first, ties newest (highest rowid) first."""
    base = {(sid, depth): -rank for _, rank, sid, depth in pooled}
    expected = []
    for rowid, rank, sid, depth in pooled:
        around = base.get((sid, depth - 1), 0.0) + base.get((sid, depth + 1), 0.0)
        rest = sum(-r for _, r, s, d in pooled if s == sid and d != depth)
        expected.append((rowid, -rank + NEIGHBOUR * around + SESSION * rest))
    got = rerank(pooled)
    assert sorted(rowid for rowid, _ in got) == sorted(rowid for rowid, *_ in pooled)
    scores = dict(got)
    for rowid, score in expected:
        assert abs(scores[rowid] - score) < 1e-9
    order = [(score, rowid) for rowid, score in got]
    assert order == sorted(order, reverse=True)
