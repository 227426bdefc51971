"""The content-hash cache of vectors (docs/design.md §2.3) on both stores: a deleted session
takes its texts' cached vectors with it, unless another session holds the same text."""

from __future__ import annotations

from pathlib import Path

import apsw
import pytest

import activememory as am
from activememory.storage.vectors import text_digest

from fake_embedder import FakeEmbedder
from index_probe import agent_db
from pg_server import pg_memory_dsn, storage

__all__ = ["pg_memory_dsn", "storage"]
pytestmark = pytest.mark.anyio

TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
ALICE, BOB = "agent:main:direct:alice", "agent:main:direct:bob"


def cached(state: Path, storage: str | None) -> set[bytes]:
    """The digests in the agent's vector cache, read behind the library's back."""
    if storage is None:
        conn = apsw.Connection(str(agent_db(state, "main")), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            return {bytes(d) for (d,) in conn.execute("SELECT digest FROM vector_cache")}
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(storage) as conn:
        rows = conn.execute(
            "SELECT digest FROM activememory.vector_cache WHERE agent = 'main'"
        ).fetchall()
    return {bytes(d) for (d,) in rows}


async def test_a_deleted_session_takes_its_cached_vectors_along(
    tmp_path: Path, storage: str | None
) -> None:
    state = tmp_path / "state"
    secret, shared = "my locker code is 4471", "see you tomorrow"
    async with am.open_memory(
        state, storage=storage, embedder=FakeEmbedder(), config=TEXT_ONLY, executor="thread"
    ) as mem:
        for key, text in [(ALICE, secret), (ALICE, shared), (BOB, shared)]:
            await mem.sessions.append(key, am.Message(role="user", content=text))
        assert await mem.sessions.vectors_ready()
        assert {text_digest(secret), text_digest(shared)} <= cached(state, storage)
        await mem.sessions.delete(ALICE)
        left = cached(state, storage)
        assert text_digest(secret) not in left
        assert text_digest(shared) in left  # bob still says it
        await mem.sessions.delete(BOB)
        assert text_digest(shared) not in cached(state, storage)
