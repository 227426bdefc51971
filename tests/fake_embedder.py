"""A small deterministic embedder for tests: a hashed bag of words projected to 32
dimensions and L2-normalised (texts sharing words get similar vectors), with switches to
fail or hang and a `name` to simulate a model change."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import anyio
import anyio.lowlevel
import numpy

from activememory.protocol.errors import EmbeddingError

DIM = 32


def word_vector(word: str) -> numpy.ndarray:
    seed = int.from_bytes(
        hashlib.sha256(word.encode("utf-8", "surrogatepass")).digest()[:8], "little"
    )
    return numpy.random.default_rng(seed).standard_normal(DIM).astype(numpy.float32)


def embed_text(text: str) -> numpy.ndarray:
    total = numpy.zeros(DIM, dtype=numpy.float32)
    for word in re.findall(r"\w+", text.lower()):
        total += word_vector(word)
    norm = float(numpy.linalg.norm(total))
    if norm == 0.0:
        total[0], norm = 1.0, 1.0
    return total / norm


class FakeEmbedder:
    """Counts its calls and texts; `fail` raises, `hang` waits forever (until cancelled)."""

    def __init__(self, name: str = "fake/bag-of-words") -> None:
        self._name = name
        self.fail = False
        self.hang = False
        self.calls = 0
        self.texts: list[str] = []
        self.sizes: list[int] = []  # texts per call, hanging ones included
        self.started = anyio.Event()  # set at the first call (even a hanging one)

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return DIM

    async def embed(self, texts: Sequence[str], *, deadline: float | None = None) -> numpy.ndarray:
        self.calls += 1
        self.sizes.append(len(texts))
        self.started.set()
        if self.hang:
            await anyio.sleep_forever()
        if self.fail:
            raise EmbeddingError(f"{self._name}: the model is unavailable")
        self.texts.extend(texts)
        await anyio.lowlevel.checkpoint()
        return (
            numpy.stack([embed_text(t) for t in texts])
            if texts
            else numpy.zeros((0, DIM), numpy.float32)
        )
