"""memory_search by meaning (docs/design.md §4.7): the query's vector, the vector side of the
search, and its fusion with the full-text side.

The vector side reads only what the text side may read: the agent's note chunks, and —
only with a privacy scope — the messages of the sessions `storage/search.py::_PRIVATE`
admits for the caller, in the same SQL, before any `k` (scored in the agent's in-memory
vector index when the reader has one, its candidates re-checked in SQL: storage/
vector_index.py). Every candidate of either side gets
its stored vector, so a row the text side found is also scored by meaning (and the other
way round), then `storage/hybrid.fuse` orders them. A failing, slow or missing embedder
means the text side alone, said in the result's `fallback` field; the search never fails
for it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple

import anyio
import numpy as np

from ..protocol.config import HybridQuery, PrivateScope
from ..protocol.embeddings import QUERY, Embedder
from ..protocol.errors import EmbeddingError
from ..storage.hybrid import Candidate, Fused, HybridWeights, fuse
from ..storage.reads import TranscriptReads
from ..storage.search import DbScope
from ..storage.vectors import MessageRow, Near, NoteRow

QUERY_EMBED_S = 1.0
"""The most a query's embedding may take on the recall path; past it, text alone answers."""
MIN_SIMILARITY = 0.3
"""How close (cosine) a row that only the vector side found must be to the query. Nearest
neighbours always exist, even for a query that matches nothing: below this they are not
evidence. With the shipped model unrelated sentences fall under 0.2 and rephrased facts
land around 0.4 (tests/test_embeddings.py)."""


class QueryVector(NamedTuple):
    """The query's vector and its space, or why there is none."""

    vector: np.ndarray | None
    name: str | None
    fallback: str | None  # why the search is text only, or None


async def embed_query(embedder: Embedder | None, query: str) -> QueryVector:
    """The vector of `query`, or the reason there is none; never raises for the embedder."""
    if embedder is None:
        return QueryVector(None, None, None)
    asking = QUERY.set(True)  # a model with task prefixes puts its query prefix first
    try:
        with anyio.fail_after(QUERY_EMBED_S):
            deadline = anyio.current_time() + QUERY_EMBED_S
            vectors = await embedder.embed([query], deadline=deadline)
        # The name after the call: a fallback embedder may have switched spaces during it.
        return QueryVector(np.asarray(vectors[0], dtype=np.float32), embedder.name, None)
    except TimeoutError:
        return QueryVector(None, None, f"the embedder took over {QUERY_EMBED_S:g} s")
    except EmbeddingError as exc:
        return QueryVector(None, None, f"the embedder failed: {exc}")
    except Exception as exc:  # a host's embedder: memory must fail open, never stop a turn
        return QueryVector(None, None, f"the embedder failed: {type(exc).__name__}")
    finally:
        QUERY.reset(asking)


class MessageSide(NamedTuple):
    """The vector side over messages: the nearest visible ones (at least MIN_SIMILARITY),
    the stored vectors of every candidate, and the rows of those only it found."""

    near: list[tuple[int, float]]
    vectors: dict[int, np.ndarray]
    rows: dict[int, MessageRow]


class VectorSide(NamedTuple):
    """What the reader found by meaning, and the vectors of every candidate."""

    near_notes: list[tuple[int, float]]
    near_messages: list[tuple[int, float]]
    note_vectors: dict[int, np.ndarray]
    message_vectors: dict[int, np.ndarray]
    notes: dict[int, NoteRow]  # rows of the chunks only the vector side found
    messages: dict[int, MessageRow]  # rows of the messages only the vector side found


def message_side(
    reader: TranscriptReads,
    query: QueryVector,
    *,
    pool: int,
    text_messages: Sequence[int],
    scope: DbScope,
    caller: str,
    session_key: str | None = None,
) -> MessageSide:
    """The `pool` messages nearest `query` among the sessions `caller` may see under
    `scope` (`storage.search.scope_sql`, in the store's SQL before `k`); plus the vectors
    of those and of `text_messages` (what the text side found). Shared by memory_search and
    `sessions_search` in hybrid mode (docs/design.md §3, §4.7); on either store."""
    assert query.vector is not None and query.name is not None
    near = _close(
        reader.nearest_messages(
            query.vector,
            name=query.name,
            scope=scope,
            caller=caller,
            session_key=session_key,
            k=pool,
        )
    )
    text = set(text_messages)
    only = [row.id for row in near if row.id not in text]
    return MessageSide(
        [(row.id, row.similarity) for row in near],
        _with_read(near, reader.message_vectors, text_messages, query.name),
        {row.id: row for row in reader.message_rows(only)},
    )


def vector_side(
    reader: TranscriptReads,
    query: QueryVector,
    *,
    pool: int,
    text_notes: Sequence[int],
    text_messages: Sequence[int],
    caller: str,
    scope: PrivateScope | None,
) -> VectorSide:
    """Runs on the agent's reader, after the text side: see the module docstring."""
    assert query.vector is not None and query.name is not None
    name = query.name
    near_notes = _close(reader.nearest_notes(query.vector, name=name, k=pool))
    messages = MessageSide([], {}, {})
    if scope is not None:
        messages = message_side(
            reader, query, pool=pool, text_messages=text_messages, scope=scope, caller=caller
        )
    text = set(text_notes)
    only_notes = [row.id for row in near_notes if row.id not in text]
    return VectorSide(
        [(row.id, row.similarity) for row in near_notes],
        messages.near,
        _with_read(near_notes, reader.note_vectors, text_notes, name),
        messages.vectors,
        {row.id: row for row in reader.note_rows(only_notes)},
        messages.rows,
    )


def _close(near: list[Near]) -> list[Near]:
    return [row for row in near if row.similarity >= MIN_SIMILARITY]


def _with_read(
    near: Sequence[Near],
    read: Callable[[Sequence[int], str], dict[int, np.ndarray]],
    text_ids: Sequence[int],
    name: str,
) -> dict[int, np.ndarray]:
    """The vectors of every candidate: the near rows' came with them, only the text side's
    others are read."""
    vectors = {row.id: row.vector for row in near}
    missing = [i for i in text_ids if i not in vectors]
    return {**read(missing, name), **vectors}


def weights_of(hybrid: HybridQuery) -> HybridWeights:
    """The fusion settings of `agents.defaults.memorySearch.query.hybrid` (off: vectors only)."""
    return HybridWeights(
        vector_weight=hybrid.vector_weight,
        text_weight=hybrid.text_weight if hybrid.enabled else 0.0,
        mmr_lambda=hybrid.mmr.lambda_ if hybrid.mmr.enabled else None,
        half_life_days=hybrid.temporal_decay.half_life_days
        if hybrid.temporal_decay.enabled
        else None,
    )


def candidates(
    text_hits: Sequence[Sequence[tuple[Hashable, float]]],
    vector_hits: Sequence[Hashable],
    vectors: Mapping[Hashable, np.ndarray],
    meta: Mapping[Hashable, tuple[float | None, bool]],
) -> list[Candidate]:
    """The union of both sides as `fuse` candidates, text hits first in their order.

    `text_hits`: per source, (key, score) best first; each source's scores are divided by
    its own best (notes and conversations are ranked by different indexes; a source whose
    best is not positive is ranked by position, 1/(1 + i)). `meta`: key -> (timestamp,
    evergreen).
    """
    found: dict[Hashable, Candidate] = {}
    for hits in text_hits:
        if not hits:
            continue
        best = max(score for _, score in hits)
        for i, (key, score) in enumerate(hits):
            norm = score / best if best > 0 else 1.0 / (1 + i)
            timestamp, evergreen = meta.get(key, (None, True))
            found[key] = Candidate(key, norm, vectors.get(key), timestamp, evergreen)
    for key in vector_hits:
        if key not in found:
            timestamp, evergreen = meta.get(key, (None, True))
            found[key] = Candidate(key, None, vectors.get(key), timestamp, evergreen)
    return list(found.values())


def rank(
    found: Sequence[Candidate], query: np.ndarray, hybrid: HybridQuery, *, limit: int
) -> list[Fused]:
    """`fuse` under the config's hybrid settings, on the wall clock (docs/design.md §4.7)."""
    return fuse(found, query, weights_of(hybrid), limit=limit, now=time.time())


def with_similarity(result: dict[str, Any], fused: Fused) -> dict[str, Any]:
    """A result dict with the fused score and the cosine the local model weighs."""
    result["score"] = round(fused.score, 4)
    if fused.similarity is not None:
        result["similarity"] = round(fused.similarity, 4)
    return result
