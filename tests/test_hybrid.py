"""Hybrid ranking (storage/hybrid.py): exact fused scores, and rules that hold for any input."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from activememory.storage.hybrid import SECONDS_PER_DAY, Candidate, HybridWeights, fuse


def unit(*values: float) -> np.ndarray:
    v = np.array(values, dtype=np.float32)
    return v / np.linalg.norm(v)


Q = unit(1, 0, 0)


def test_scores_are_the_weighted_sum_of_normalised_text_and_cosine() -> None:
    found = fuse(
        [
            Candidate("a", 4.0, unit(0, 1, 0)),  # the best text match, unrelated meaning
            Candidate("b", 1.0, unit(1, 1, 0)),  # a weaker text match, close in meaning
            Candidate("c", None, unit(1, 0, 0)),  # only the vector side found it
            Candidate("d", 2.0, None),  # no vector yet
        ],
        Q,
        HybridWeights(vector_weight=0.7, text_weight=0.3),
        limit=10,
    )
    assert [f.key for f in found] == ["c", "b", "a", "d"]
    scores = {f.key: f.score for f in found}
    assert math.isclose(scores["a"], 0.3 * 1.0 + 0.7 * 0.0)
    assert math.isclose(scores["b"], 0.3 * 0.25 + 0.7 * math.sqrt(0.5), rel_tol=1e-6)
    assert math.isclose(scores["c"], 0.7 * 1.0, rel_tol=1e-6)
    assert math.isclose(scores["d"], 0.3 * 0.5)
    assert {f.key: f.similarity for f in found}["d"] is None


def test_without_a_query_vector_the_text_order_stands() -> None:
    found = fuse(
        [Candidate("a", 1.0, unit(1, 0, 0)), Candidate("b", 3.0, None), Candidate("c", None, Q)],
        None,
        HybridWeights(),
        limit=10,
    )
    assert [f.key for f in found] == ["b", "a", "c"]
    assert all(f.similarity is None for f in found)


def test_temporal_decay_halves_per_half_life_and_spares_evergreen_notes() -> None:
    now = 100 * SECONDS_PER_DAY
    found = fuse(
        [
            Candidate("old", 1.0, None, timestamp=now - 30 * SECONDS_PER_DAY),
            Candidate("note", 1.0, None, timestamp=0.0, evergreen=True),
            Candidate("new", 1.0, None, timestamp=now),
        ],
        None,
        HybridWeights(text_weight=1.0, half_life_days=30),
        limit=10,
        now=now,
    )
    assert [(f.key, round(f.score, 6)) for f in found] == [
        ("note", 1.0),
        ("new", 1.0),
        ("old", 0.5),
    ]


def test_mmr_prefers_a_different_answer_over_a_near_duplicate() -> None:
    candidates = [
        Candidate("a", 1.0, unit(1, 0.1, 0)),
        Candidate("a-again", 1.0, unit(1, 0.1, 0)),
        Candidate("b", 0.9, unit(1, 0, 1)),
    ]
    plain = fuse(candidates, Q, HybridWeights(), limit=2)
    diverse = fuse(candidates, Q, HybridWeights(mmr_lambda=0.5), limit=2)
    assert [f.key for f in plain] == ["a", "a-again"]
    assert [f.key for f in diverse] == ["a", "b"]


vectors = st.one_of(
    st.none(),
    st.lists(st.floats(-1, 1, allow_nan=False), min_size=3, max_size=3)
    .filter(lambda v: sum(x * x for x in v) > 1e-3)
    .map(lambda v: unit(*v)),
)
candidate_lists = st.lists(
    st.tuples(st.one_of(st.none(), st.floats(0, 50, allow_nan=False)), vectors),
    max_size=12,
).map(lambda rows: [Candidate(i, text, vector) for i, (text, vector) in enumerate(rows)])


@settings(max_examples=200, deadline=None)
@given(
    candidate_lists,
    st.one_of(st.none(), vectors.filter(lambda v: v is not None)),
    st.floats(0, 1),
    st.one_of(st.none(), st.floats(0, 1)),
    st.integers(0, 15),
)
def test_any_input_gives_distinct_keys_within_the_limit_best_first(
    candidates: list[Candidate],
    query: np.ndarray | None,
    vector_weight: float,
    mmr_lambda: float | None,
    limit: int,
) -> None:
    weights = HybridWeights(vector_weight, 1 - vector_weight, mmr_lambda)
    found = fuse(candidates, query, weights, limit=limit)
    keys = [f.key for f in found]
    assert len(keys) == len(set(keys)) == min(limit, len(candidates))
    assert all(0.0 <= f.text <= 1.0 for f in found)
    assert all(f.similarity is None or 0.0 <= f.similarity <= 1.0 for f in found)
    assert all(-1e-9 <= f.score <= 1.0 + 1e-6 for f in found)
    if mmr_lambda is None or query is None:
        assert [f.score for f in found] == sorted((f.score for f in found), reverse=True)
        # Lambda 1 is plain relevance: MMR then changes nothing.
    if query is not None:
        same = fuse(
            candidates, query, HybridWeights(vector_weight, 1 - vector_weight, 1.0), limit=limit
        )
        plain = fuse(
            candidates, query, HybridWeights(vector_weight, 1 - vector_weight), limit=limit
        )
        assert [f.key for f in same] == [f.key for f in plain]
