"""Vectors kept in step by the embedder actor (docs/design.md §2.3): only for active-branch
messages of clean sessions, never on an append's path, re-embedded on a model change,
cached by content, backing off when the embedder fails; and nearest-neighbour search that
applies visibility before k."""

from __future__ import annotations

from pathlib import Path

import anyio
import apsw
import msgspec
import numpy
import pytest
import trio
import trio.testing

import activememory as am
from activememory.actors.supervisor import AgentStore
from activememory.protocol.config import PrivateScope
from activememory.protocol.embeddings import BACKGROUND
from activememory.protocol.indexer import (
    AppendMessage,
    NoteChunk,
    NoteFile,
    NotesSynced,
    StoreVectors,
    SyncNotes,
    VectorRow,
    VectorsStored,
)
from activememory.storage.db import MIGRATIONS, open_connection
from activememory.storage.search import _PRIVATE, private_params
from activememory.storage.transcripts import TranscriptWriter
from activememory.storage.vectors import (
    PendingBatch,
    nearest_messages,
    nearest_notes,
    pending_batch,
    text_digest,
    to_blob,
)

from fake_embedder import DIM, FakeEmbedder, embed_text

pytestmark = pytest.mark.anyio
DIRECT = "agent:main:direct:alice"
OTHER = "agent:main:direct:bob"
MOCK = {"clock": trio.testing.MockClock(autojump_threshold=0)}


def user(text: str) -> am.Message:
    return am.Message(role="user", content=text)


def db_path(state: Path, agent: str = "main") -> Path:
    return state / "agents" / agent / "memory.db"


def vectors(state: Path) -> set[tuple[int, str]]:
    """(event id, embedder name) of every stored message vector."""
    conn = apsw.Connection(str(db_path(state)), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {
            (int(e), str(n)) for e, n in conn.execute("SELECT event_id, name FROM message_vectors")
        }
    finally:
        conn.close()


def expected(state: Path, name: str) -> set[tuple[int, str]]:
    """Active-branch user/assistant messages of clean sessions, as (event id, name)."""
    conn = apsw.Connection(str(db_path(state)), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT e.id FROM active_branch a JOIN events e ON e.id = a.event_id"
            " JOIN sessions s ON s.id = a.session_id WHERE NOT s.dirty AND e.text IS NOT NULL"
        )
        return {(int(e), name) for (e,) in rows}
    finally:
        conn.close()


async def store_of(mem: am.Memory, agent: str = "main") -> AgentStore:
    return await mem._supervisor.agent(agent)


async def settle(mem: am.Memory) -> None:
    """Wait until every embedder actor is idle (bounded: a hang fails the test)."""

    def working() -> bool:
        return not all(
            s.embedder is None or s.embedder.idle() for s in mem._supervisor.open_agents()
        )

    with anyio.fail_after(30):
        while working():  # noqa: ASYNC110 - the state of several actors, no one event
            await anyio.sleep(0.001)


async def test_vectors_follow_appends_and_search_stays_in_scope(
    tmp_path: Path, executor: str
) -> None:
    state = tmp_path / "s"
    embedder = FakeEmbedder()
    async with am.open_memory(state, executor=executor, embedder=embedder) as mem:  # type: ignore[arg-type]
        first = await mem.sessions.append(DIRECT, user("my sister lives in Lisbon"))
        await mem.sessions.append(DIRECT, am.Message(role="assistant", content="noted"))
        tool = await mem.sessions.append(DIRECT, am.Message(role="tool", content="lisbon"))
        theirs = await mem.sessions.append(OTHER, user("my sister lives in Lisbon now"))
        await settle(mem)
        assert vectors(state) == expected(state, embedder.name)
        assert (tool.id, embedder.name) not in vectors(state)
        store = await store_of(mem)
        query = embed_text("where does my sister live")

        def alice_only(reader: am.Memory) -> list[tuple[int, float]]:
            return nearest_messages(
                reader.conn,  # type: ignore[attr-defined]
                query,
                name=embedder.name,
                visible_sql="SELECT id FROM sessions WHERE key = ?",
                visible_params=[DIRECT],
                k=1,
            )

        # Bob's message is more similar, but not visible: Alice's is still found (k=1).
        hits = await store.read(alice_only)  # type: ignore[arg-type]
        assert [event_id for event_id, _ in hits] == [first.id]
        assert hits[0][1] == pytest.approx(
            float(embed_text(first.message.index_text or "") @ query)
        )  # type: ignore[union-attr]

        def everyone(reader: am.Memory) -> list[tuple[int, float]]:
            return nearest_messages(
                reader.conn,  # type: ignore[attr-defined]
                query,
                name=embedder.name,
                visible_sql="SELECT id FROM sessions WHERE agent = :agent",
                visible_params={"agent": "main"},
                k=2,
            )

        assert [e for e, _ in await store.read(everyone)] == [theirs.id, first.id]  # type: ignore[arg-type]
        stats = (await mem.sessions.stats())[0]
        assert (stats.vectors_pending, stats.embedder, stats.embedder_error) == (
            0,
            embedder.name,
            None,
        )


async def test_the_privacy_rule_of_the_text_side_applies_before_k(tmp_path: Path) -> None:
    embedder = FakeEmbedder()
    async with am.open_memory(tmp_path / "s", executor="inline", embedder=embedder) as mem:
        mine = await mem.sessions.append(DIRECT, user("the blue bicycle is in the garage"))
        for key in (OTHER, "agent:main:group:g", "agent:main:main"):
            await mem.sessions.append(key, user("the blue bicycle"))
        await settle(mem)
        store = await store_of(mem)
        query = embed_text("the blue bicycle")
        # The owner's main session asks, for Alice only (her direct chats; not the owner's).
        params = private_params(
            "main", "agent:main:main", PrivateScope(peers=("alice",), owner=False)
        )

        def nearest(reader: object) -> list[tuple[int, float]]:
            return nearest_messages(
                reader.conn,  # type: ignore[attr-defined]
                query,
                name=embedder.name,
                visible_sql=f"SELECT id FROM ({_PRIVATE})",
                visible_params=params,
                k=1,
            )

        assert [e for e, _ in await store.read(nearest)] == [mine.id]

        def wrong_size(reader: object) -> object:
            return nearest_messages(
                reader.conn,  # type: ignore[attr-defined]
                query[:16],
                name=embedder.name,
                visible_sql="SELECT id FROM sessions",
                visible_params=(),
                k=1,
            )

        with pytest.raises(ValueError, match="query_vec: expected 32 dimensions, got 16"):
            await store.read(wrong_size)


async def test_a_rewind_drops_the_sessions_vectors_and_the_cache_saves_recomputing(
    tmp_path: Path, executor: str
) -> None:
    state = tmp_path / "s"
    embedder = FakeEmbedder()
    async with am.open_memory(state, executor=executor, embedder=embedder) as mem:  # type: ignore[arg-type]
        a = await mem.sessions.append(DIRECT, user("alpha"))
        await mem.sessions.append(DIRECT, user("beta"))
        await settle(mem)
        assert len(vectors(state)) == 2
        await mem.sessions.rewind(DIRECT, a.id)
        assert vectors(state) == set()  # dirty: committed with the rewind
        await mem.sessions.rebuild_index()
        await settle(mem)
        assert vectors(state) == {(a.id, embedder.name)}
        assert embedder.texts == ["alpha", "beta"]  # "alpha" again came from the cache
        store = await store_of(mem)
        assert store.embedder is not None and store.embedder.cache_hits == 1
        await mem.sessions.delete(DIRECT)
        assert vectors(state) == set()


async def test_the_reconcilers_rebuild_brings_the_vectors_back(
    tmp_path: Path, executor: str
) -> None:
    state = tmp_path / "s"
    embedder = FakeEmbedder()
    async with am.open_memory(state, executor=executor, embedder=embedder) as mem:  # type: ignore[arg-type]
        a = await mem.sessions.append(DIRECT, user("alpha"))
        await mem.sessions.append(DIRECT, user("beta"))
        await mem.sessions.rewind(DIRECT, a.id)
        await mem.sessions.search("alpha", caller=DIRECT)  # sees it dirty: pokes the reconciler
        with anyio.fail_after(10):
            while (await mem.sessions.info(DIRECT)).dirty:  # noqa: ASYNC110 - a stored flag
                await anyio.sleep(0.001)
        await settle(mem)
        assert vectors(state) == {(a.id, embedder.name)}


class Gated(FakeEmbedder):
    """Holds a call that embeds `gate` until `release`: lets a test commit writes after
    the actor has read its rows and before it stores their vectors."""

    def __init__(self, gate: str) -> None:
        super().__init__()
        self.gate = gate
        self.held = anyio.Event()
        self.release = anyio.Event()

    async def embed(self, texts, *, deadline=None):  # type: ignore[no-untyped-def]
        if self.gate in texts:
            self.held.set()
            await self.release.wait()
        return await super().embed(texts, deadline=deadline)


async def test_a_rewind_racing_the_embedder_leaves_no_off_branch_vector(
    tmp_path: Path, executor: str
) -> None:
    state = tmp_path / "s"
    embedder = Gated("beta")
    async with am.open_memory(state, executor=executor, embedder=embedder) as mem:  # type: ignore[arg-type]
        a = await mem.sessions.append(DIRECT, user("alpha"))
        b = await mem.sessions.append(DIRECT, user("beta"))
        with anyio.fail_after(10):
            await embedder.held.wait()  # the actor has read "beta" and is embedding it
        await mem.sessions.rewind(DIRECT, a.id)  # b leaves the branch, the session is dirty
        await mem.sessions.rebuild_index()  # clean again: a on the branch, b not
        embedder.release.set()
        await settle(mem)
        assert (b.id, embedder.name) not in vectors(state)
        assert vectors(state) == {(a.id, embedder.name)} == expected(state, embedder.name)
        store = await store_of(mem)
        assert store.embedder is not None and store.embedder.skipped >= 1


async def test_a_vector_read_before_a_session_turned_dirty_is_not_stored(
    tmp_path: Path, executor: str
) -> None:
    state = tmp_path / "s"
    embedder = Gated("beta")
    async with am.open_memory(state, executor=executor, embedder=embedder) as mem:  # type: ignore[arg-type]
        a = await mem.sessions.append(DIRECT, user("alpha"))
        b = await mem.sessions.append(DIRECT, user("beta"))
        await mem.sessions.append(DIRECT, user("gamma"))
        with anyio.fail_after(10):
            await embedder.held.wait()
        await mem.sessions.rewind(DIRECT, b.id)  # "beta" stays on the branch; dirty now
        embedder.release.set()
        await settle(mem)
        assert vectors(state) == set()  # a dirty session has none
        await mem.sessions.rebuild_index()
        await settle(mem)
        assert vectors(state) == {(a.id, embedder.name), (b.id, embedder.name)}


async def test_a_batch_that_changed_under_the_actor_does_not_end_its_work(
    tmp_path: Path,
) -> None:
    state = tmp_path / "s"
    async with am.open_memory(state, executor="inline", embedder=FakeEmbedder()) as mem:
        store = await store_of(mem)
        actor = store.embedder
        assert actor is not None
        actor.batch = 1
        submit, refused = actor.feed._submit, []

        async def racing(command):  # type: ignore[no-untyped-def]
            if isinstance(command, StoreVectors) and not refused:
                refused.append(command)  # as if its row had left the branch meanwhile
                return VectorsStored(messages=0, notes=0, skipped=len(command.messages))
            return await submit(command)

        actor.feed._submit = racing
        await settle(mem)  # the start poke is served
        entries = [
            am.ImportEntry(id=str(i), parent_id=str(i - 1) if i else None, timestamp=1.0,
                           message=user(text))
            for i, text in enumerate(["alpha", "beta"])
        ]  # fmt: skip
        await mem.sessions.import_transcript(DIRECT, entries)
        await settle(mem)  # dirty: nothing to embed yet
        await mem.sessions.rebuild_index()
        await settle(mem)
        beta = (await mem.sessions.history(DIRECT))[1]
        assert len(refused) == 1 and vectors(state) == {(beta.id, "fake/bag-of-words")}


async def test_a_model_change_re_embeds_and_never_mixes_names(tmp_path: Path) -> None:
    state = tmp_path / "s"
    old, new = FakeEmbedder("fake/old"), FakeEmbedder("fake/new")
    async with am.open_memory(state, executor="inline", embedder=old) as mem:
        for text in ("alpha", "beta", "gamma"):
            await mem.sessions.append(DIRECT, user(text))
        await settle(mem)
    assert {n for _, n in vectors(state)} == {"fake/old"}
    async with am.open_memory(state, executor="inline", embedder=new) as mem:
        await store_of(mem)  # databases open on first use; the start poke re-embeds
        await settle(mem)
        assert vectors(state) == expected(state, "fake/new")
        assert new.texts == ["alpha", "beta", "gamma"]
        store = await store_of(mem)

        def old_space(reader: object) -> list[tuple[int, float]]:
            return nearest_messages(
                reader.conn,  # type: ignore[attr-defined]
                embed_text("alpha"),
                name="fake/old",
                visible_sql="SELECT id FROM sessions",
                visible_params=[],
                k=5,
            )

        assert await store.read(old_space) == []
    # Back to the old model: its vectors come from the cache, nothing is embedded again.
    again = FakeEmbedder("fake/old")
    async with am.open_memory(state, executor="inline", embedder=again) as mem:
        await store_of(mem)
        await settle(mem)
        assert vectors(state) == expected(state, "fake/old")
        assert again.calls == 0


async def _failing(state: Path) -> tuple[list[float], am.IndexStats, am.IndexStats, list[str]]:
    embedder = FakeEmbedder()
    embedder.fail = True
    times: list[float] = []
    original = embedder.embed

    async def timed(texts, *, deadline=None):  # type: ignore[no-untyped-def]
        times.append(trio.current_time())
        return await original(texts, deadline=deadline)

    embedder.embed = timed  # type: ignore[method-assign]
    async with am.open_memory(state, executor="inline", embedder=embedder) as mem:
        start = trio.current_time()
        await mem.sessions.append(DIRECT, user("alpha"))
        await trio.sleep(10)
        failing = (await mem.sessions.stats())[0]
        report = await mem.doctor()
        embedder.fail = False
        await trio.sleep(10)
        healed = (await mem.sessions.stats())[0]
        details = [f"{c.level} {c.detail}" for c in report.checks if c.name == "index:main"]
        return [t - start for t in times], failing, healed, details


def test_a_failing_embedder_backs_off_and_shows_in_stats_and_doctor(tmp_path: Path) -> None:
    times, failing, healed, doctor = trio.run(_failing, tmp_path / "s", **MOCK)
    assert times == [0.0, 1.0, 3.0, 7.0, 15.0]  # 1, 2, 4, 8 s pauses; the last one succeeds
    assert failing.vectors_pending == 1
    assert failing.embedder_error == "fake/bag-of-words: the model is unavailable"
    assert doctor == [
        "warn 1 sessions, 1/1 messages indexed, 0 being re-indexed, FTS integrity ok, 1 waiting"
        " for a vector of fake/bag-of-words (embedder failing: fake/bag-of-words: the model"
        " is unavailable)"
    ]
    assert (healed.vectors_pending, healed.embedder_error) == (0, None)


async def _hanging(state: Path) -> tuple[float, float, str | None, int, list[int], float]:
    embedder = FakeEmbedder()
    embedder.hang = True
    async with am.open_memory(state, executor="inline", embedder=embedder) as mem:
        start = trio.current_time()
        for i in range(20):
            await mem.sessions.append(DIRECT, user(f"message {i}"))
        acked = trio.current_time() - start
        await embedder.started.wait()
        first_call = trio.current_time()
        # A batch of several texts that times out is retried at once with half of them
        # (slow, not failing); only a single text's time-out is an error. How many the first
        # batch took depends on the scheduler: 20 halve to 1 within five retries.
        error = None
        await trio.sleep(1)
        for _ in range(6):
            await trio.sleep(60)
            stats = (await mem.sessions.stats())[0]
            if (error := stats.embedder_error) is not None:
                break
        errored_after = trio.current_time() - first_call - 1
        closing = trio.current_time()
    return (
        acked, trio.current_time() - closing, error, stats.vectors_pending, embedder.sizes,
        errored_after,
    )  # fmt: skip


def test_appends_never_wait_for_a_hanging_embedder(tmp_path: Path) -> None:
    acked, closed_in, error, pending, sizes, errored_after = trio.run(
        _hanging, tmp_path / "s", **MOCK
    )
    assert acked == 0.0  # twenty appends acknowledged without the clock moving
    assert closed_in == 0.0  # closing cancels the hanging call
    assert error == "fake/bag-of-words: no answer within 60 s"
    assert pending == 20
    halving = [sizes[0]]
    while halving[-1] > 1:
        halving.append(halving[-1] // 2)
    assert sizes[: len(halving)] == halving  # one 60-second time-out each
    assert errored_after == 60.0 * len(halving)


class Broken(FakeEmbedder):
    """Answers with the wrong shape, or raises something other than `EmbeddingError`."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    async def embed(self, texts, *, deadline=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("boom")
        return numpy.zeros((len(texts), DIM - 1), numpy.float32)


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        ("raise", "fake/bag-of-words: RuntimeError: boom"),
        (
            "shape",
            "fake/bag-of-words: expected 1 finite vectors of 32 dimensions, got shape (1, 31)",
        ),
    ],
)
async def test_a_broken_embedder_is_recorded_never_raised(
    tmp_path: Path, mode: str, error: str
) -> None:
    embedder = Broken(mode)
    async with am.open_memory(tmp_path / "s", executor="inline", embedder=embedder) as mem:
        await mem.sessions.append(DIRECT, user("alpha"))
        with anyio.fail_after(10):
            while embedder.calls < 2:  # noqa: ASYNC110 - counting calls of a test double
                await anyio.sleep(0.05)
        stats = (await mem.sessions.stats())[0]
        assert (stats.embedder_error, stats.vectors_pending) == (error, 1)
        # The memory goes on: appends and reads work.
        await mem.sessions.append(DIRECT, user("beta"))
        assert len(await mem.sessions.history(DIRECT)) == 2


async def test_the_embedder_actor_reads_on_its_own_connection(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s", executor="inline", embedder=FakeEmbedder()) as mem:
        store = await store_of(mem)
        assert store.embedder_reader is not None
        assert store.embedder_reader.conn is not store.reader.conn


async def test_a_v4_database_gets_vectors_for_its_old_messages_on_start(tmp_path: Path) -> None:
    state = tmp_path / "s"
    path = db_path(state)
    path.parent.mkdir(parents=True)
    conn = open_connection(path, writer=True, migrations=MIGRATIONS[:4])
    TranscriptWriter(conn).apply(
        [AppendMessage(key=am.parse_session_key(DIRECT), message=user("alpha"), at=1.0)]
    )
    conn.close()
    embedder = FakeEmbedder()
    async with am.open_memory(state, executor="inline", embedder=embedder) as mem:
        await store_of(mem)
        await settle(mem)
    assert vectors(state) == expected(state, embedder.name) != set()


async def test_without_an_embedder_nothing_changes(tmp_path: Path) -> None:
    state = tmp_path / "s"
    async with am.open_memory(state, executor="inline") as mem:
        await mem.sessions.append(DIRECT, user("alpha"))
        store = await store_of(mem)
        assert store.embedder is None and store.embed_pokes is None
        stats = (await mem.sessions.stats())[0]
        assert (stats.vectors_pending, stats.embedder, stats.embedder_error) == (0, None, None)
    assert vectors(state) == set()


async def test_a_bad_embedder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(am.InvalidInputError) as info:
        async with am.open_memory(tmp_path / "s", embedder="minilm"):  # type: ignore[arg-type]
            pass
    assert str(info.value) == "embedder: expected an Embedder (name, dim, embed), got str"


def _note(path: str, *texts: str) -> NoteFile:
    chunks = tuple(NoteChunk(start_line=i + 1, end_line=i + 1, text=t) for i, t in enumerate(texts))
    return NoteFile(path=path, mtime_ns=1, size=1, digest=path + "".join(texts), chunks=chunks)


async def test_note_chunks_get_vectors_and_lose_them_with_their_file(
    tmp_path: Path, executor: str
) -> None:
    state = tmp_path / "s"
    embedder = FakeEmbedder()
    async with am.open_memory(state, executor=executor, embedder=embedder) as mem:  # type: ignore[arg-type]
        store = await store_of(mem)
        ack = await store.submit(
            SyncNotes(agent="main", files=(_note("MEMORY.md", "likes green tea", "owns a cat"),))
        )
        assert isinstance(ack, NotesSynced)
        await settle(mem)

        def nearest(reader: object) -> list[tuple[int, float]]:
            conn = reader.conn  # type: ignore[attr-defined]
            return nearest_notes(conn, embed_text("green tea"), name=embedder.name, k=5)

        hits = await store.read(nearest)
        assert len(hits) == 2 and hits[0][1] == pytest.approx(
            float(embed_text("likes green tea") @ embed_text("green tea"))
        )
        await store.submit(SyncNotes(agent="main", removed=("MEMORY.md",)))
        assert await store.read(nearest) == []


async def test_stored_only_while_the_text_and_branch_still_hold(tmp_path: Path) -> None:
    state = tmp_path / "s"
    async with am.open_memory(state, executor="inline") as mem:
        a = await mem.sessions.append(DIRECT, user("alpha"))
        store = await store_of(mem)
        vector = to_blob(embed_text("alpha"))
        ack = await store.submit(
            StoreVectors(
                agent="main",
                name="x",
                messages=(
                    VectorRow(id=a.id, digest=text_digest("alpha"), vector=vector),
                    VectorRow(id=a.id + 1, digest=text_digest("alpha"), vector=vector),
                    VectorRow(id=a.id, digest=text_digest("other text"), vector=vector),
                ),
                notes=(VectorRow(id=7, digest=text_digest("alpha"), vector=vector),),
            )
        )
        assert ack == VectorsStored(messages=1, notes=0, skipped=3)
    assert vectors(state) == {(a.id, "x")}


async def test_the_actor_reads_above_its_watermark_until_the_epoch_moves(tmp_path: Path) -> None:
    state = tmp_path / "s"
    async with am.open_memory(state, executor="inline") as mem:
        a = await mem.sessions.append(DIRECT, user("alpha"))
        b = await mem.sessions.append(DIRECT, user("beta"))
        store = await store_of(mem)

        def batch(after: int, epoch: int | None) -> PendingBatch:
            return pending_batch(store.reader.conn, "x", after=after, epoch=epoch, limit=10)

        first = batch(0, None)
        assert [i for i, _ in first.messages] == [a.id, b.id]
        assert first.scanned_to == b.id
        assert batch(a.id, first.epoch).messages == [(b.id, "beta")]
        assert batch(b.id, first.epoch).messages == []
        await mem.sessions.rewind(DIRECT, a.id)
        await mem.sessions.rebuild_index()  # a is clean again: the epoch moves
        again = batch(b.id, first.epoch)
        assert again.epoch == first.epoch + 1 and again.messages == [(a.id, "alpha")]


def test_store_vectors_round_trips_and_checks_dimensions() -> None:
    row = VectorRow(id=1, digest=b"d", vector=to_blob(numpy.ones(DIM)))
    cmd = StoreVectors(agent="main", name="x", messages=(row,))
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(cmd), type=StoreVectors) == cmd
    short = VectorRow(id=2, digest=b"d", vector=to_blob(numpy.ones(DIM - 1)))
    with pytest.raises(ValueError, match="float32 vectors of one dimension"):
        StoreVectors(agent="main", name="x", messages=(row,), notes=(short,))


class Marked(FakeEmbedder):
    """Records, per call, whether it ran as background work (protocol BACKGROUND)."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: list[tuple[bool, tuple[str, ...]]] = []

    async def embed(self, texts, *, deadline=None):  # type: ignore[no-untyped-def]
        self.marks.append((BACKGROUND.get(), tuple(texts)))
        return await super().embed(texts, deadline=deadline)


async def test_the_backlog_is_embedded_as_background_work_and_a_query_is_not(
    tmp_path: Path, executor: str
) -> None:
    # The shipped embedder runs background work at a lower CPU priority, so that on a small
    # host the backlog does not take the CPU a recall's budget needs (docs/design.md §4.7).
    embedder = Marked()
    async with am.open_memory(tmp_path / "s", executor=executor, embedder=embedder) as mem:  # type: ignore[arg-type]
        await mem.sessions.append(DIRECT, user("the aisle seat on long flights"))
        await settle(mem)
        await mem.sessions.search("seat preference", caller=DIRECT, mode="hybrid")
    stored = [
        background for background, texts in embedder.marks if any("aisle" in t for t in texts)
    ]
    queries = [background for background, texts in embedder.marks if texts == ("seat preference",)]
    assert stored and all(stored)
    assert queries == [False]
