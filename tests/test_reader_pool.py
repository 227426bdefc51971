"""The pool of reader connections per database (docs/design.md §1.3).

Reads spread over `READERS` connections; each is its own snapshot, so what one reader may
show every reader must: a session being rebuilt stays hidden on each until the rebuild is
published, one vector index serves them all, and closing the memory closes every one.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import anyio
import apsw
import pytest

import activememory as am
from activememory.actors.supervisor import READERS, AgentStore, PooledReader
from activememory.protocol.indexer import ReindexChunk, Reindexed
from activememory.protocol.session_key import parse_session_key
from activememory.storage.vector_index import VectorIndexes, attached

pytestmark = [pytest.mark.anyio, pytest.mark.full_matrix]  # about executors and loops

T = TypeVar("T")
KEY = "agent:main:direct:alice"
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


def entries(n: int) -> list[am.ImportEntry]:
    return [
        am.ImportEntry(
            id=str(i),
            parent_id=str(i - 1) if i else None,
            timestamp=float(i),
            message=am.Message(role="user", content=f"imported message {i}"),
        )
        for i in range(n)
    ]


async def on_reader(store: AgentStore, i: int, call: Callable[[], Awaitable[T]]) -> T:
    """`call` with every read of `store` sent to reader `i` (the others look busy)."""
    others = [p for j, p in enumerate(store.readers) if j != i]
    for pooled in others:
        pooled.busy += 1
    try:
        return await call()
    finally:
        for pooled in others:
            pooled.busy -= 1


async def test_reads_go_to_the_least_busy_reader(tmp_path: Path, executor: str) -> None:
    async with am.open_memory(tmp_path / "s", config=TEXT_ONLY, executor=executor) as mem:  # type: ignore[arg-type]
        await mem.sessions.append(KEY, am.Message(role="user", content="hello"))
        store = await mem._supervisor.agent("main")
        assert len(store.readers) == READERS >= 2
        assert len({id(p.reader.conn) for p in store.readers}) == READERS
        seen = []
        for i in range(READERS):
            conn = await on_reader(store, i, lambda: store.read(lambda r: r.conn))
            seen.append(conn)
        assert seen == [p.reader.conn for p in store.readers]
        # Idle: the first reader, the warm one.
        assert await store.read(lambda r: r.conn) is store.reader.conn


async def test_no_pooled_reader_shows_a_session_mid_rebuild(tmp_path: Path) -> None:
    """A rebuild published chunk by chunk: every pooled reader of a read-only memory hides
    the session (saying `indexing`) until the last chunk makes it clean, then finds it."""
    state = tmp_path / "s"
    key = parse_session_key(KEY)
    with anyio.fail_after(60):
        async with am.open_memory(state, config=TEXT_ONLY) as writer:
            await writer.sessions.import_transcript(KEY, entries(300))  # stored dirty
            store = await writer._supervisor.agent("main")
            revision = (await writer.sessions.info(KEY)).revision
            async with am.open_memory(state, config=TEXT_ONLY, readonly=True) as ro:
                pool = await ro._supervisor.agent("main")
                assert len(pool.readers) == READERS
                after, chunks, clean = 0, 0, False
                while not clean:
                    for i in range(READERS):
                        found = await on_reader(
                            pool, i, lambda: ro.sessions.search("imported", caller=KEY)
                        )
                        assert (found.results, found.indexing) == ((), True), (chunks, i)
                    command = ReindexChunk(
                        key=key, revision=revision, after_depth=after, max_rows=64
                    )
                    ack = await store.submit(command)
                    assert isinstance(ack, Reindexed) and not ack.stale
                    after, clean, chunks = ack.next_depth, ack.clean, chunks + 1
                assert chunks == 5
                for i in range(READERS):
                    found = await on_reader(
                        pool, i, lambda: ro.sessions.search("imported", caller=KEY)
                    )
                    assert len(found.results) == 10 and not found.indexing


async def test_one_vector_index_serves_every_reader_and_closing_closes_them(
    tmp_path: Path, executor: str
) -> None:
    async with am.open_memory(tmp_path / "s", config=TEXT_ONLY, executor=executor) as mem:  # type: ignore[arg-type]
        await mem.sessions.append(KEY, am.Message(role="user", content="hello"))
        store = await mem._supervisor.agent("main")
        readers: list[PooledReader[Any]] = list(store.readers)
        indexes = {id(attached(p.reader.conn)) for p in readers}
        assert len(indexes) == 1 and isinstance(attached(store.reader.conn), VectorIndexes)
        assert store.embedder_reader is None or attached(store.embedder_reader.conn) is None
    for pooled in readers:
        assert attached(pooled.reader.conn) is None
        with pytest.raises(apsw.ConnectionClosedError):
            pooled.reader.conn.execute("SELECT 1")


async def test_a_read_only_memory_closes_every_reader(tmp_path: Path) -> None:
    state = tmp_path / "s"
    async with am.open_memory(state, config=TEXT_ONLY) as mem:
        await mem.sessions.append(KEY, am.Message(role="user", content="hello"))
    async with am.open_memory(state, config=TEXT_ONLY, readonly=True) as ro:
        await ro.sessions.history(KEY)
        store = await ro._supervisor.agent("main")
        readers = list(store.readers)
        assert len(readers) == READERS
    for pooled in readers:
        with pytest.raises(apsw.ConnectionClosedError):
            pooled.reader.conn.execute("SELECT 1")
