"""The embedder: texts to vectors, for recall by meaning (docs/design.md §4.7).

Vectors of one embedder live in one space, named by `name`; vectors of two names are never
ranked together, and a change of embedder re-embeds in the background.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .errors import EmbeddingError

if TYPE_CHECKING:
    import numpy

# True while the embedder actor embeds its backlog (messages, notes, records behind their
# acks), False for a query a search or recall waits on. An embedder may run background work
# at a lower CPU priority (the shipped one does, docs/design.md §4.7): on a small host the
# backlog must not take the CPU a recall's budget needs.
BACKGROUND: ContextVar[bool] = ContextVar("activememory_embed_background", default=False)

# True while a search's query is embedded (`recall.hybrid.embed_query`, the one place that
# embeds a query), False for a text that is stored. A model trained with task prefixes
# ("search_query: " / "search_document: ") puts the matching one before the text
# (docs/design.md §4.7); other embedders ignore it.
QUERY: ContextVar[bool] = ContextVar("activememory_embed_query", default=False)


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised float32 vectors of `dim` dimensions."""

    @property
    def name(self) -> str:
        """The vector space, e.g. "local/all-MiniLM-L6-v2"."""
        ...

    @property
    def dim(self) -> int:
        """How many dimensions each vector has.

        An embedder that learns its size from its model or server (a `local.modelPath`
        model, an unknown remote model) raises `EmbeddingError` here until its first
        successful `embed`.
        """
        ...

    async def embed(self, texts: Sequence[str], *, deadline: float | None = None) -> numpy.ndarray:
        """float32 vectors, shape (len(texts), dim), each row of length 1.

        `deadline` is on the event loop's clock (`anyio.current_time()`): past it the call
        raises `EmbeddingDeadlineError` (an `EmbeddingError`) instead of waiting. Raises
        `EmbeddingError` for any failure.

        Cancellation: the vectors are lost; work already started on a worker thread or a
        server finishes there, unobserved.
        """
        ...


class EmbeddingDeadlineError(EmbeddingError):
    """The deadline passed before the vectors were ready: the embedder itself may be fine, so
    no fallback takes over for this."""
