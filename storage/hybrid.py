"""Hybrid ranking: text and vector evidence fused into one order (docs/design.md §4.7).

A pure function over candidates that the SQL already scoped to what the caller may see, so
nothing here can widen visibility. Each candidate carries its full-text score (None when the
text side did not find it) and its vector (None when it has none yet):

- text scores are divided by the best text score among the candidates (0..1; the text side
  is ranked by BM25 plus conversational context, unbounded);
- the vector score is the cosine similarity to the query, clipped to 0..1, computed for
  every candidate that has a vector — also for those only the text side found, so a row is
  never scored 0 on a side just because that side's top-k missed it;
- fused = vector_weight × vector score + text_weight × text score (the weights are used as
  given; they need not sum to 1);
- a candidate's `boost` (1 unless given) multiplies it: the records search's ranking of
  matching scope values (docs/design.md §5.2);
- temporal decay (optional) multiplies by 0.5 ** (age / half-life) — never for evergreen
  candidates (memory notes without a date);
- MMR (optional) then picks, one at a time, the candidate maximising
  lambda × fused − (1 − lambda) × its highest cosine to those already picked.

Ties keep the candidates' input order (the text side's order, then the vector side's).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

SECONDS_PER_DAY = 86_400.0


class Candidate(NamedTuple):
    """One row either side found, already inside the caller's scope."""

    key: Hashable
    text_score: float | None  # higher is better; None: the text side did not find it
    vector: np.ndarray | None  # L2-normalised; None: no vector yet
    timestamp: float | None = None  # seconds since the epoch
    evergreen: bool = False  # never decayed (a note without a date)
    boost: float = 1.0  # multiplies the fused score (a records search's scope boost, §5.2)


class Fused(NamedTuple):
    """A candidate's place in the fused order, with the evidence that put it there."""

    key: Hashable
    score: float
    text: float  # the normalised text score, 0..1
    similarity: float | None  # cosine to the query, 0..1; None without a vector


class HybridWeights(NamedTuple):
    """How the two sides and the optional stages combine."""

    vector_weight: float = 0.7
    text_weight: float = 0.3
    mmr_lambda: float | None = None  # None: no MMR
    half_life_days: float | None = None  # None: no temporal decay


def fuse(
    candidates: Sequence[Candidate],
    query: np.ndarray | None,
    weights: HybridWeights,
    *,
    limit: int,
    now: float = 0.0,
) -> list[Fused]:
    """The best `limit` candidates, best first (see the module docstring).

    Without a query vector (the embedder failed or is off) the vector side is empty and the
    order is the text side's alone.
    """
    if limit <= 0 or not candidates:
        return []
    best_text = max((c.text_score for c in candidates if c.text_score is not None), default=0.0)
    similarities = _similarities(candidates, query)
    scored: list[Fused] = []
    for candidate, similarity in zip(candidates, similarities, strict=True):
        text = 0.0
        if candidate.text_score is not None and best_text > 0:
            text = max(0.0, candidate.text_score / best_text)
        score = weights.text_weight * text + weights.vector_weight * (similarity or 0.0)
        score *= candidate.boost
        if weights.half_life_days and candidate.timestamp is not None and not candidate.evergreen:
            age_days = max(0.0, now - candidate.timestamp) / SECONDS_PER_DAY
            score *= 0.5 ** (age_days / weights.half_life_days)
        scored.append(Fused(candidate.key, score, text, similarity))
    order = sorted(range(len(scored)), key=lambda i: -scored[i].score)  # stable: ties in order
    if weights.mmr_lambda is None or query is None:
        return [scored[i] for i in order[:limit]]
    return _mmr(scored, candidates, order, weights.mmr_lambda, limit)


def _similarities(candidates: Sequence[Candidate], query: np.ndarray | None) -> list[float | None]:
    if query is None:
        return [None] * len(candidates)
    with_vectors = [i for i, c in enumerate(candidates) if c.vector is not None]
    out: list[float | None] = [None] * len(candidates)
    if with_vectors:
        matrix = np.stack([candidates[i].vector for i in with_vectors])  # type: ignore[misc]
        cosines = np.clip(matrix @ query.astype(np.float32), 0.0, 1.0)
        for i, value in zip(with_vectors, cosines.tolist(), strict=True):
            out[i] = float(value)
    return out


def _mmr(
    scored: list[Fused],
    candidates: Sequence[Candidate],
    order: list[int],
    lam: float,
    limit: int,
) -> list[Fused]:
    picked: list[int] = []
    remaining = list(order)
    while remaining and len(picked) < limit:
        best, best_value = remaining[0], -np.inf
        for i in remaining:
            redundancy = max((_cosine(candidates[i], candidates[j]) for j in picked), default=0.0)
            value = lam * scored[i].score - (1 - lam) * redundancy
            if value > best_value:
                best, best_value = i, value
        picked.append(best)
        remaining.remove(best)
    return [scored[i] for i in picked]


def _cosine(a: Candidate, b: Candidate) -> float:
    if a.vector is None or b.vector is None:
        return 0.0
    return float(np.clip(a.vector @ b.vector, 0.0, 1.0))
