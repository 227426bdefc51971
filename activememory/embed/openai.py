"""An OpenAI-compatible `/v1/embeddings` client (docs/design.md §4.7).

Speaks the wire format OpenAI, Ollama (`/v1`), vLLM and llama.cpp's server share: POST
`{base_url}/embeddings` with `{"model": ..., "input": [...]}`, answered by
`{"data": [{"index": i, "embedding": [...]}, ...]}`. No retries: a failure is an
EmbeddingError at once, and search goes on with text alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import anyio
import numpy as np

from .._http import HttpFailure, post_json
from ..protocol.embeddings import EmbeddingDeadlineError
from ..protocol.errors import EmbeddingError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["OpenAIEmbedder"]

BATCH: Final = 64  # texts per request
NO_DEADLINE_SECONDS: Final = 60.0  # a call without a deadline still ends
MAX_ANSWER_BYTES: Final = 64 * 1024 * 1024  # a runaway or hostile server cannot fill memory

# Vector sizes of well-known models, so `dim` is known before the first request.
KNOWN_DIMS: Final[Mapping[str, int]] = {
    "text-embedding-3-small": 1536,
    "text-embedding-3-large": 3072,
    "text-embedding-ada-002": 1536,
    "nomic-embed-text": 768,
    "mxbai-embed-large": 1024,
    "all-minilm": 384,
    "bge-m3": 1024,
}


class OpenAIEmbedder:
    """An `Embedder` served by an OpenAI-compatible embeddings endpoint.

    `name` is `<provider>/<model>` (e.g. `openai/text-embedding-3-small`). Requests carry
    `Authorization: Bearer <api_key>` when a key is set, and `headers`. One
    `httpx.AsyncClient` serves every request; `aclose` closes it.
    """

    def __init__(
        self,
        *,
        provider: str,
        base_url: str,
        model: str,
        api_key: str | None = None,
        headers: Mapping[str, str] | None = None,
        dim: int | None = None,
    ) -> None:
        self._name = f"{provider}/{model}"
        self._model = model
        self.url = base_url.rstrip("/") + "/embeddings"
        self._headers = dict(headers or {})
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._dim = dim if dim is not None else KNOWN_DIMS.get(model)
        import httpx  # when a client is made: see `_http`

        self._client = httpx.AsyncClient()

    @property
    def name(self) -> str:
        """The vector space: `<provider>/<model>`."""
        return self._name

    @property
    def dim(self) -> int:
        """Dimensions of each vector: known for well-known models, else after the first
        successful `embed` (EmbeddingError before)."""
        if self._dim is None:
            raise EmbeddingError(f"{self._name}: the vector size is known after the first embed")
        return self._dim

    async def embed(
        self, texts: Sequence[str], *, deadline: float | None = None
    ) -> npt.NDArray[np.float32]:
        """float32 unit vectors, shape (len(texts), dim), in the order of `texts`.

        Texts go in requests of up to 64, one after the other; each request's timeout is the
        time left to `deadline` (on `anyio.current_time()`; without one, 60 s, after which
        the server counts as failed). Raises EmbeddingError for a late answer, a network error, a non-2xx status, an answer that
        is not JSON or not in the embeddings shape, or vectors of the wrong size. Vectors
        are L2-normalised here, whatever the server sends.

        Cancellation: the request in flight is abandoned (its connection is dropped); no
        further request is sent.
        """
        texts = list(texts)
        if any(not isinstance(t, str) for t in texts):
            raise EmbeddingError("texts: expected a sequence of strings")
        # Without a caller's deadline, a server that does not answer has failed.
        late: type[EmbeddingError] = EmbeddingDeadlineError
        if deadline is None:
            deadline, late = anyio.current_time() + NO_DEADLINE_SECONDS, EmbeddingError
        rows: list[npt.NDArray[np.float32]] = []
        for start in range(0, len(texts), BATCH):
            rows.append(await self._request(texts[start : start + BATCH], deadline, late))
        if not rows:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        return np.concatenate(rows)

    async def _request(
        self, texts: list[str], deadline: float, late: type[EmbeddingError]
    ) -> npt.NDArray[np.float32]:
        seconds = deadline - anyio.current_time()
        if seconds <= 0:
            raise late(f"{self._name}: the embedding deadline passed")
        body = {"model": self._model, "input": texts}
        try:
            answer = await post_json(
                self._client,
                self.url,
                body,
                headers=self._headers,
                seconds=seconds,
                max_bytes=MAX_ANSWER_BYTES,
            )
        except HttpFailure as failure:
            error = late if failure.kind == "timeout" else EmbeddingError
            raise error(
                self._name
                + ": "
                + {
                    "timeout": f"no answer from {self.url} within {seconds:.2f} s",
                    "network": f"the request to {self.url} failed ({failure.detail})",
                    "too_large": f"the answer is larger than {MAX_ANSWER_BYTES} bytes",
                    "status": f"the server answered {failure.detail}",
                    "json": f"the answer is not valid JSON ({failure.detail})",
                }[failure.kind]
            ) from failure.__cause__
        return self._vectors(answer, len(texts))

    def _vectors(self, answer: Any, count: int) -> npt.NDArray[np.float32]:
        """The answer's vectors in `index` order, checked and normalised."""
        data = answer.get("data") if isinstance(answer, dict) else None
        if not isinstance(data, list) or len(data) != count:
            got = len(data) if isinstance(data, list) else "no"
            raise EmbeddingError(f"{self._name}: expected {count} embeddings in data[], got {got}")
        by_index: dict[int, Any] = {}
        for position, item in enumerate(data):
            index = item.get("index", position) if isinstance(item, dict) else None
            vector = item.get("embedding") if isinstance(item, dict) else None
            if not isinstance(index, int) or not 0 <= index < count or index in by_index:
                raise EmbeddingError(f"{self._name}: data[{position}].index is not valid")
            if not isinstance(vector, list) or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)
                for x in vector
            ):
                raise EmbeddingError(
                    f"{self._name}: data[{position}].embedding is not a list of numbers"
                )
            by_index[index] = vector
        sizes = {len(v) for v in by_index.values()}
        size = sizes.pop() if len(sizes) == 1 else None
        if size is None or size == 0 or (self._dim is not None and size != self._dim):
            want = f"{self._dim}" if self._dim is not None else "one size"
            found = ", ".join(str(s) for s in sorted({len(v) for v in by_index.values()}))
            raise EmbeddingError(
                f"{self._name}: expected vectors of {want} dimensions, got {found}"
            )
        self._dim = size
        vectors = np.array([by_index[i] for i in range(count)], dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.all(norms > 0):
            raise EmbeddingError(f"{self._name}: the server sent a zero vector")
        unit: npt.NDArray[np.float32] = (vectors / norms).astype(np.float32)
        return unit

    async def aclose(self) -> None:
        """Close the HTTP client.

        Cancellation: shielded, so closing is never interrupted half-way; connections are
        dropped.
        """
        with anyio.CancelScope(shield=True):
            await self._client.aclose()

    def __repr__(self) -> str:
        return f"OpenAIEmbedder(name={self._name!r}, url={self.url!r})"
