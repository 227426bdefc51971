"""The embedder's lag, seen cheaply (docs/design.md §2.3): memory_search says when vectors
are still being computed (`vectorsPending`, a flag the embedder actor keeps, no query), and
`stats` counts the rows waiting for a vector above the actor's watermark, exact once it is
idle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

import activememory as am
from activememory.actors.supervisor import AgentStore
from activememory.storage.vectors import pending_count

from fake_embedder import FakeEmbedder

pytestmark = pytest.mark.anyio
DIRECT = "agent:main:direct:alice"
CALLER = am.parse_session_key("agent:main:direct:bob")


def user(text: str) -> am.Message:
    return am.Message(role="user", content=text)


async def store_of(mem: am.Memory) -> AgentStore:
    return await mem._supervisor.agent("main")


async def search(mem: am.Memory, query: str) -> dict[str, object]:
    result = await mem.notes.search("main", {"query": query}, caller=CALLER, transcripts=None)
    data = json.loads(result.content)
    assert isinstance(data, dict)
    return data


async def idle(store: AgentStore) -> None:
    assert store.embedder is not None
    with anyio.fail_after(30):
        while not store.embedder.idle():  # noqa: ASYNC110 - an actor's state, no one event
            await anyio.sleep(0.001)


async def test_memory_search_says_vectors_are_pending_while_the_embedder_hangs(
    tmp_path: Path,
) -> None:
    embedder = FakeEmbedder()
    async with am.open_memory(tmp_path / "s", executor="inline", embedder=embedder) as mem:  # type: ignore[arg-type]
        store = await store_of(mem)
        await idle(store)
        before = await search(mem, "lisbon")
        assert "vectorsPending" not in before  # caught up: the flag is absent
        assert before["effectiveMode"] == "hybrid"
        embedder.started = anyio.Event()  # the search above embedded its query: a new event
        embedder.hang = True
        await mem.sessions.append(DIRECT, user("my sister lives in Lisbon"))
        with anyio.fail_after(10):
            await embedder.started.wait()  # the background call hangs (for 60 s)
        embedder.hang = False  # the query's own embedding answers: only the lag shows
        during = await search(mem, "lisbon")
        assert during["vectorsPending"] is True
        assert during["effectiveMode"] == "hybrid" and during["fallback"] is None
        assert store.vectors_pending()
        (stats,) = await mem.sessions.stats(check_integrity=False)
        assert stats.vectors_pending == 1


async def test_a_poke_waiting_counts_as_pending_and_no_embedder_never_is(tmp_path: Path) -> None:
    embedder = FakeEmbedder()
    async with am.open_memory(tmp_path / "s", executor="inline", embedder=embedder) as mem:  # type: ignore[arg-type]
        store = await store_of(mem)
        await idle(store)
        assert not store.vectors_pending()
        # The ack pokes the actor; before it has run, the work is queued: pending.
        await mem.sessions.append(DIRECT, user("alpha"))
        assert store.vectors_pending()
        await idle(store)
        assert not store.vectors_pending()
    async with am.open_memory(tmp_path / "t", executor="inline") as mem:
        store = await store_of(mem)
        await mem.sessions.append(DIRECT, user("alpha"))
        assert not store.vectors_pending()
        assert "vectorsPending" not in await search(mem, "alpha")


async def test_stats_counts_above_the_watermark_and_is_exact_when_idle(tmp_path: Path) -> None:
    embedder = FakeEmbedder()
    async with am.open_memory(tmp_path / "s", executor="inline", embedder=embedder) as mem:  # type: ignore[arg-type]
        store = await store_of(mem)
        for i in range(5):
            await mem.sessions.append(DIRECT, user(f"message {i}"))
        await idle(store)
        assert store.embedder is not None
        after, epoch = store.embedder.watermark()
        assert after > 0 and epoch is not None
        (stats,) = await mem.sessions.stats(check_integrity=False)
        assert stats.vectors_pending == 0
        embedder.hang = True
        for i in range(3):
            await mem.sessions.append(DIRECT, user(f"later {i}"))
        (stats,) = await mem.sessions.stats(check_integrity=False)
        assert stats.vectors_pending == 3  # above the watermark, the actor busy

        def counts(reader: object) -> tuple[int, int, int]:
            conn = store.reader.conn
            return (
                pending_count(conn, embedder.name),  # a full scan
                pending_count(conn, embedder.name, after=after, epoch=epoch),
                pending_count(conn, embedder.name, after=after, epoch=epoch + 1),
            )

        assert await store.read(counts) == (3, 3, 3)
        # Rows under the watermark are not read again: a vector removed behind the actor's
        # back (never done by the library) shows the count reads only above it.
        conn = store.actor.writer.conn
        conn.execute(
            "DELETE FROM message_vectors WHERE event_id = (SELECT min(event_id) FROM message_vectors)"
        )
        assert await store.read(counts) == (4, 3, 4)  # another epoch: everything again


@pytest.mark.parametrize("executor", ["inline", "thread"])
async def test_vectors_ready_waits_for_the_embedder_to_be_at_rest(
    tmp_path: Path, executor: str
) -> None:
    # A poke with nothing to embed (a store opening, a write) still sets the embedder to
    # work for a scan: memory_search would say vectorsPending. vectors_ready() must not
    # return before that scan is done, or a caller that waited sees the flag anyway.
    embedder = FakeEmbedder()
    async with am.open_memory(tmp_path / "s", executor=executor, embedder=embedder) as mem:  # type: ignore[arg-type]
        await mem.sessions.append(DIRECT, user("my sister lives in Lisbon"))
        store = await store_of(mem)
        for _ in range(20):
            store.poke_embedder("write")
            with anyio.fail_after(30):
                assert await mem.sessions.vectors_ready()
            assert not store.vectors_pending()
            assert "vectorsPending" not in await search(mem, "lisbon")


async def test_the_query_is_embedded_while_the_text_side_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An embedder that answers only once the text side has read: it can, because the two
    # run at once. Embedded first and read after, it would wait out the query's deadline
    # and the search would fall back to text alone.
    text_read = anyio.Event()

    class AfterTheTextSide(FakeEmbedder):
        async def embed(self, texts: list[str], *, deadline: float | None = None) -> Any:
            if texts == ["lisbon"]:  # the query, not the background's rows
                await text_read.wait()
            return await super().embed(texts, deadline=deadline)

    embedder = AfterTheTextSide()
    async with am.open_memory(tmp_path / "s", executor="inline", embedder=embedder) as mem:  # type: ignore[arg-type]
        await mem.sessions.append(DIRECT, user("my sister lives in Lisbon"))
        store = await store_of(mem)
        await idle(store)
        read = store.read

        async def read_then_say(fn: Any) -> Any:
            answer = await read(fn)
            # memory_search's read of the notes and the conversations
            if getattr(fn, "__name__", "") == "text_side":
                text_read.set()
            return answer

        monkeypatch.setattr(store, "read", read_then_say)
        with anyio.fail_after(5):
            found = await search(mem, "lisbon")
        assert found["effectiveMode"] == "hybrid" and found["fallback"] is None
