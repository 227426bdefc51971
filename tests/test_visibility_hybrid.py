"""Who sees what in sessions_search by meaning (docs/design.md §3): the visibility matrix of
tests/test_visibility.py again, in `mode="hybrid"`, where the question shares no word with
the needles, so every hit comes from the vector side.

On both stores (the vector side's SQL is each store's own). The embedder puts every needle ("needle") and the question ("haystack") on one direction
and every other text on an orthogonal one: each needle is a perfect match by meaning and
invisible to the words. A vector side that reached past the caller's scope would show it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import numpy
import pytest
from test_visibility import CALLERS, KEYS, SESSIONS, SETTINGS, config, expected, populate

import activememory as am

from fake_embedder import DIM
from pg_server import pg_exact_memory_dsn, pg_pgvector_memory_dsn, storage_each_vector_path

__all__ = ["pg_exact_memory_dsn", "pg_pgvector_memory_dsn", "storage_each_vector_path"]
pytestmark = pytest.mark.anyio


@pytest.fixture
def storage(storage_each_vector_path: str | None) -> str | None:
    """Each test on SQLite and on both PostgreSQL vector paths (docs/design.md §11)."""
    return storage_each_vector_path


QUESTION = "haystack"


class NeedleEmbedder:
    """ "needle" and "haystack" mean the same; nothing else is close to them."""

    name = "test/needle"
    dim = DIM

    async def embed(self, texts: Sequence[str], *, deadline: float | None = None) -> numpy.ndarray:
        await anyio.lowlevel.checkpoint()
        out = numpy.zeros((len(texts), DIM), dtype=numpy.float32)
        for i, text in enumerate(texts):
            out[i, 0 if ("needle" in text or "haystack" in text) else 1] = 1.0
        return out


@pytest.mark.parametrize(("visibility", "a2a", "sandbox"), SETTINGS)
async def test_hybrid_visibility_matrix(
    tmp_path: Path, executor: str, storage: str | None, visibility: str, a2a: bool, sandbox: str
) -> None:
    async with am.open_memory(
        tmp_path / "state",
        config=config(visibility, a2a, sandbox),
        executor=executor,  # type: ignore[arg-type]
        embedder=NeedleEmbedder(),
        storage=storage,
    ) as mem:
        await populate(mem)
        assert await mem.sessions.vectors_ready()
        for caller in CALLERS:
            want = expected(caller, visibility, a2a, sandbox)
            text = await mem.sessions.search(QUESTION, caller=KEYS[caller], limit=25)
            assert text.results == ()  # no word in common: only meaning finds the needles
            res = await mem.sessions.search(QUESTION, caller=KEYS[caller], limit=25, mode="hybrid")
            assert res.fallback is None
            got = {hit.session_key for hit in res.results}
            assert got == {KEYS[n] for n in want}, (caller, visibility, a2a, sandbox)
            assert len(res.results) == len(want)
            assert all(h.similarity == pytest.approx(1.0) for h in res.results)
            assert not res.truncated and not res.indexing
            # Narrowing to one session never reaches past the visible set.
            for name in SESSIONS:
                one = await mem.sessions.search(
                    QUESTION,
                    caller=KEYS[caller],
                    session_key=KEYS[name],
                    limit=25,
                    mode="hybrid",
                )
                assert {h.session_key for h in one.results} == (
                    {KEYS[name]} if name in want else set()
                ), (caller, name)


@pytest.mark.parametrize(
    ("visibility", "a2a", "sandbox"),
    [("tree", False, "spawned"), ("agent", False, "spawned"), ("all", True, "all")],
)
async def test_hidden_vectors_never_change_the_visible_top_k(
    tmp_path: Path, storage: str | None, visibility: str, a2a: bool, sandbox: str
) -> None:
    async with am.open_memory(
        tmp_path / "state",
        config=config(visibility, a2a, sandbox),
        executor="thread" if storage else "inline",
        embedder=NeedleEmbedder(),
        storage=storage,
    ) as mem:
        await populate(mem)
        assert await mem.sessions.vectors_ready()
        for caller in CALLERS:
            before = await mem.sessions.search(
                QUESTION, caller=KEYS[caller], limit=2, mode="hybrid"
            )
            want = expected(caller, visibility, a2a, sandbox)
            hidden = [n for n in SESSIONS if n not in want]
            # Many perfect matches by meaning where the caller cannot look.
            for name in hidden:
                for _ in range(3):
                    await mem.sessions.append(
                        SESSIONS[name][0], am.Message(role="user", content="needle needle")
                    )
            assert await mem.sessions.vectors_ready()
            after = await mem.sessions.search(QUESTION, caller=KEYS[caller], limit=2, mode="hybrid")
            assert [h.message_id for h in after.results] == [h.message_id for h in before.results]
            assert [h.session_key for h in after.results] == [h.session_key for h in before.results]
            assert after.truncated == before.truncated


async def test_a_rewound_needle_never_surfaces_by_meaning(
    tmp_path: Path, storage: str | None
) -> None:
    """Rewound off the active branch: dirty (hidden) first, then re-indexed without it."""
    async with am.open_memory(
        tmp_path / "state",
        executor="thread" if storage else "inline",
        embedder=NeedleEmbedder(),
        storage=storage,
    ) as mem:
        await populate(mem)
        assert await mem.sessions.vectors_ready()
        key = SESSIONS["grandchild"][0]
        filler, needle = await mem.sessions.history(key)
        await mem.sessions.rewind(key, filler.id)
        tree = {KEYS["root"], KEYS["child"]}
        for _ in range(200):
            res = await mem.sessions.search(QUESTION, caller=KEYS["root"], mode="hybrid")
            assert needle.id not in {h.message_id for h in res.results if h.session_key == key}
            assert {h.session_key for h in res.results} == tree
            if not res.indexing:
                break
            await anyio.sleep(0.01)
        assert not res.indexing
