"""The in-memory vector index (storage/vector_index.py, docs/design.md §2.3) answers exactly
what the plain path (every visible vector read from SQLite) answers, for any mix of
appends, rewinds, deletes, imports (dirty sessions), rebuilds, model changes, note changes,
raw writes to the vector tables and rolled-back transactions; and it never surfaces a row
the caller may not see."""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import apsw
import numpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import activememory as am
from activememory.protocol.indexer import (
    AppendMessage,
    DeleteSession,
    ImportEntry,
    ImportTranscript,
    NoteChunk,
    NoteFile,
    RebuildIndex,
    RewindSession,
    StoreVectors,
    SyncNotes,
    VectorRow,
)
from activememory.storage import vector_index
from activememory.storage.db import open_connection
from activememory.storage.transcripts import TranscriptWriter
from activememory.storage.vector_index import VectorFeed, VectorIndexes, attach, attached
from activememory.storage.vectors import (
    Near,
    nearest_message_rows,
    nearest_note_rows,
    pending_batch,
    scan_message_rows,
    scan_note_rows,
    text_digest,
    to_blob,
)

from fake_embedder import embed_text

KEYS = ["agent:main:direct:a", "agent:main:direct:b", "agent:main:group:g", "agent:main:main"]
WORDS = ["lisbon", "sister", "peanut", "tea", "cat", "seat", "aisle", "wings"]
NAMES = ["model-a", "model-b"]
VISIBLE = "SELECT id FROM sessions WHERE key IN (SELECT value FROM json_each(?))"

texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
ops = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(KEYS), texts),
    st.tuples(st.just("append"), st.sampled_from(KEYS), texts),
    st.tuples(st.just("rewind"), st.sampled_from(KEYS), st.integers(0, 6)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS)),
    st.tuples(st.just("import"), st.sampled_from(KEYS), st.lists(texts, min_size=1, max_size=3)),
    st.tuples(st.just("rebuild")),
    st.tuples(st.just("embed"), st.sampled_from(NAMES), st.integers(1, 8)),
    st.tuples(st.just("embed"), st.sampled_from(NAMES), st.integers(1, 8)),
    st.tuples(st.just("notes"), st.lists(texts, max_size=3)),
    st.tuples(st.just("raw_delete"), st.integers(2, 4)),
    st.tuples(st.just("raw_update"), st.sampled_from(WORDS)),
    st.tuples(st.just("rolled_back")),
    st.tuples(
        st.just("query"),
        st.sampled_from(NAMES),
        st.lists(st.sampled_from(KEYS), unique=True),
        texts,
        st.integers(1, 6),
    ),
)


def vector_of(name: str, text: str) -> numpy.ndarray:
    """A deterministic embedding per (model name, text): two names, two spaces."""
    return embed_text(f"{text} {name}")


class Store:
    """A real agent database: the writer (with the feed) and a reader (with the index)."""

    def __init__(self, path: Path) -> None:
        self.writer_conn = open_connection(path, writer=True)
        self.writer = TranscriptWriter(self.writer_conn)
        self.feed = VectorFeed()
        self.feed.install(self.writer_conn)
        self.reader = open_connection(path, writer=False)
        self.index = VectorIndexes(self.feed)
        attach(self.reader, self.index)
        self.clock = 1.0

    def close(self) -> None:
        self.reader.close()
        self.writer_conn.close()

    def at(self) -> float:
        self.clock += 1.0
        return self.clock

    def apply(self, *commands: object) -> None:
        self.writer.apply(list(commands))  # type: ignore[arg-type]

    def embed(self, name: str, limit: int) -> None:
        batch = pending_batch(self.reader, name, after=0, epoch=None, limit=limit)
        rows = [
            VectorRow(id=i, digest=text_digest(t), vector=to_blob(vector_of(name, t)))
            for i, t in batch.messages + batch.notes
        ]
        count = len(batch.messages)
        self.apply(
            StoreVectors(
                agent="main", name=name, messages=tuple(rows[:count]), notes=tuple(rows[count:])
            )
        )

    def both(
        self, name: str, keys: list[str], query: numpy.ndarray, k: int
    ) -> tuple[list[Near], list[Near], list[Near], list[Near]]:
        params = [json.dumps(keys)]
        indexed = nearest_message_rows(
            self.reader, query, name=name, visible_sql=VISIBLE, visible_params=params, k=k
        )
        plain = scan_message_rows(
            self.reader, query, name=name, visible_sql=VISIBLE, visible_params=params, k=k
        )
        notes = nearest_note_rows(self.reader, query, name=name, k=k)
        plain_notes = scan_note_rows(self.reader, query, name=name, k=k)
        return indexed, plain, notes, plain_notes


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    path = tmp_path / "agents" / "main" / "memory.db"
    path.parent.mkdir(parents=True)
    opened = Store(path)
    yield opened
    opened.close()


def same(a: list[Near], b: list[Near]) -> bool:
    return [(n.id, n.similarity) for n in a] == [(n.id, n.similarity) for n in b] and all(
        numpy.array_equal(x.vector, y.vector) for x, y in zip(a, b, strict=True)
    )


def visible_ids(conn: apsw.Connection, keys: list[str]) -> set[int]:
    rows = conn.execute(
        "SELECT v.event_id FROM message_vectors v JOIN sessions s ON s.id = v.session_id"
        " WHERE NOT s.dirty AND s.key IN (SELECT value FROM json_each(?))",
        (json.dumps(keys),),
    )
    return {int(r[0]) for r in rows}


def check_matrices(index: VectorIndexes) -> None:
    """Each loaded matrix maps every live id to its one row (deletes masked, compactions
    renumbered)."""
    for matrix in index._matrices.values():
        live = numpy.flatnonzero(matrix.alive[: matrix.size])
        ids = matrix.ids[live].tolist()
        assert len(ids) == len(set(ids)) == len(matrix.row_of)
        assert all(matrix.row_of[i] == r for i, r in zip(ids, live.tolist(), strict=True))
        assert matrix.dead == matrix.size - len(live)


def run(store: Store, steps: list[tuple[object, ...]]) -> None:
    for step in steps:
        check_matrices(store.index)
        match step:
            case ("append", key, text):
                message = am.Message(role="user", content=str(text))
                store.apply(
                    AppendMessage(
                        key=am.parse_session_key(str(key)), message=message, at=store.at()
                    )
                )
            case ("rewind", key, back):
                branch = [
                    int(r[0])
                    for r in store.reader.execute(
                        "SELECT a.event_id FROM active_branch a JOIN sessions s"
                        " ON s.id = a.session_id WHERE s.key = ? ORDER BY a.depth",
                        (key,),
                    )
                ]
                if len(branch) > int(back):  # type: ignore[arg-type]
                    target = branch[-1 - int(back)]  # type: ignore[arg-type]
                    store.apply(
                        RewindSession(
                            key=am.parse_session_key(str(key)), to_event_id=target, at=store.at()
                        )
                    )
            case ("delete", key):
                store.apply(DeleteSession(key=am.parse_session_key(str(key))))
            case ("import", key, items):
                entries = tuple(
                    ImportEntry(
                        id=f"e{i}",
                        parent_id=f"e{i - 1}" if i else None,
                        timestamp=store.at(),
                        message=am.Message(role="user", content=t),
                    )
                    for i, t in enumerate(items)  # type: ignore[arg-type]
                )
                store.apply(
                    ImportTranscript(
                        key=am.parse_session_key(str(key)), entries=entries, at=store.at()
                    )
                )
            case ("rebuild",):
                store.apply(RebuildIndex())
            case ("embed", name, limit):
                store.embed(str(name), int(limit))  # type: ignore[call-overload]
            case ("notes", items):
                chunks = tuple(
                    NoteChunk(start_line=i + 1, end_line=i + 1, text=t)
                    for i, t in enumerate(items)  # type: ignore[arg-type]
                )
                digest = json.dumps(items)
                note = NoteFile(path="MEMORY.md", mtime_ns=1, size=1, digest=digest, chunks=chunks)
                store.apply(SyncNotes(agent="main", files=(note,)))
            case ("raw_delete", modulus):  # another code path writing the table
                store.writer_conn.execute(
                    "DELETE FROM message_vectors WHERE event_id % ? = 0", (modulus,)
                )
            case ("raw_update", word):
                store.writer_conn.execute(
                    "UPDATE message_vectors SET vector = ? WHERE event_id = (SELECT max(event_id)"
                    " FROM message_vectors)",
                    (to_blob(vector_of("raw", str(word))),),
                )
            case ("rolled_back",):
                store.writer_conn.execute("BEGIN IMMEDIATE")
                store.writer_conn.execute("DELETE FROM message_vectors")
                store.writer_conn.execute("DELETE FROM note_vectors")
                store.writer_conn.execute("ROLLBACK")
            case ("query", name, keys, text, k):
                query = vector_of(str(name), str(text))
                indexed, plain, notes, plain_notes = store.both(
                    str(name), list(keys), query, int(k)
                )  # type: ignore[arg-type, call-overload]
                assert same(indexed, plain), (indexed, plain)
                assert same(notes, plain_notes), (notes, plain_notes)
                assert {n.id for n in indexed} <= visible_ids(store.reader, list(keys))  # type: ignore[arg-type]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(ops, min_size=1, max_size=30))
def test_the_index_answers_what_the_plain_path_answers(steps: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as patch:
        patch.setattr(vector_index, "COMPACT_MIN", 2)  # compactions happen in small examples
        path = Path(tmp) / "memory.db"
        store = Store(path)
        try:
            run(store, steps)
            for name in NAMES:  # and once more at the end, for every name
                run(store, [("query", name, KEYS, "lisbon sister", 5)])
            # Exact by itself: the plain path never had to answer for it.
            assert store.index.fallbacks == 0
        finally:
            store.close()


def test_the_index_serves_the_search_and_follows_the_writer(store: Store) -> None:
    """Loaded once, then fed: later searches read no vector table in full."""
    key = KEYS[0]
    run(store, [("append", key, "my sister lives in lisbon"), ("embed", "model-a", 8)])
    run(store, [("query", "model-a", [key], "lisbon", 3)])
    assert store.index.loads == 2  # the messages' matrix and the notes'
    run(
        store,
        [
            ("append", key, "an aisle seat please"),
            ("embed", "model-a", 8),
            ("rewind", key, 1),
            ("query", "model-a", [key], "aisle seat", 3),
            ("rebuild",),
            ("embed", "model-a", 8),
            ("query", "model-a", [key], "aisle seat", 3),
        ],
    )
    assert store.index.loads == 2 and store.index.fallbacks == 0
    run(store, [("rolled_back",), ("query", "model-a", [key], "aisle seat", 3)])
    assert store.index.loads == 4  # a rollback may undo a published change: both reload


def test_its_bytes_are_the_vectors_it_holds(store: Store) -> None:
    """`nbytes` (what the soak takes out of RSS growth) counts each loaded matrix: at least
    a float32 row per vector, growing as vectors are added, nothing before a load."""
    assert store.index.nbytes() == 0
    run(store, [("append", KEYS[0], f"{w} tea") for w in WORDS] + [("embed", "model-a", 50)])
    run(store, [("query", "model-a", [KEYS[0]], "tea", 3)])
    dim = len(vector_of("model-a", "tea"))
    loaded = store.index.nbytes()
    assert loaded >= len(WORDS) * dim * 4
    more = [("append", KEYS[1], f"{w} cat {i}") for i in range(40) for w in WORDS[:2]]
    run(store, [*more, ("embed", "model-a", 100), ("query", "model-a", [KEYS[1]], "cat", 3)])
    grown = store.index.nbytes()
    assert grown >= (len(WORDS) + 80) * dim * 4 and grown > loaded


def test_a_change_published_before_its_commit_is_never_surfaced(store: Store) -> None:
    """The commit hook publishes before the commit is visible: a reader whose snapshot does
    not hold the row yet must not return it (the SQL verification drops it)."""
    key = KEYS[0]
    run(store, [("append", key, "tea"), ("embed", "model-a", 8)])
    run(store, [("query", "model-a", [key], "tea", 3)])  # loaded
    run(store, [("append", key, "peanut")])
    (event_id,) = store.reader.execute("SELECT max(id) FROM events").fetchone()
    store.writer_conn.execute("BEGIN IMMEDIATE")
    store.writer_conn.execute(
        "INSERT INTO message_vectors(event_id, session_id, name, vector)"
        " SELECT ?, session_id, 'model-a', ? FROM events WHERE id = ?",
        (event_id, to_blob(vector_of("model-a", "peanut")), event_id),
    )
    store.feed._commit()  # the hook, as SQLite calls it just before the commit lands
    query = vector_of("model-a", "peanut")
    indexed, plain, _, _ = store.both("model-a", [key], query, 3)
    assert same(indexed, plain) and event_id not in {n.id for n in indexed}
    store.writer_conn.execute("COMMIT")
    indexed, plain, _, _ = store.both("model-a", [key], query, 3)
    assert same(indexed, plain) and indexed[0].id == event_id


def test_only_the_writers_readers_get_an_index(tmp_path: Path) -> None:
    """A connection with no feed behind it (a read-only open, a benchmark's own) scans."""
    path = tmp_path / "memory.db"
    conn = open_connection(path, writer=True)
    try:
        assert attached(conn) is None
        assert (
            nearest_message_rows(
                conn,
                vector_of("m", "tea"),
                name="m",
                visible_sql=VISIBLE,
                visible_params=["[]"],
                k=3,
            )
            == []
        )
    finally:
        conn.close()


@pytest.mark.anyio
async def test_the_supervisor_attaches_an_index_to_the_agents_reader(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s", executor="inline") as mem:
        store = await mem._supervisor.agent("main")
        assert isinstance(attached(store.reader.conn), VectorIndexes)
        assert store.embedder_reader is None or attached(store.embedder_reader.conn) is None
    assert attached(store.reader.conn) is None  # released at close


def test_a_read_only_connection_feeds_nothing_so_its_readers_scan(tmp_path: Path) -> None:
    """A read-only open beside a live writer in another process sees changes the feed
    cannot: such a feed is never live, and its index never answers."""
    path = tmp_path / "memory.db"
    writer = Store(path)
    try:
        run(writer, [("append", KEYS[0], "tea"), ("embed", "model-a", 8)])
        readonly = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        feed = VectorFeed()
        feed.install(readonly)
        index = VectorIndexes(feed)
        attach(readonly, index)
        query = vector_of("model-a", "tea")
        found = nearest_message_rows(
            readonly,
            query,
            name="model-a",
            visible_sql=VISIBLE,
            visible_params=[json.dumps(KEYS)],
            k=3,
        )
        assert not feed.live and index.loads == 0 and [n.id for n in found] != []
        readonly.close()
    finally:
        writer.close()


def test_no_load_inside_the_callers_transaction(store: Store) -> None:
    """A snapshot older than the feed's oldest change cannot seed a matrix."""
    run(store, [("append", KEYS[0], "tea"), ("embed", "model-a", 8)])
    query = vector_of("model-a", "tea")
    with store.reader:
        indexed, plain, notes, plain_notes = store.both("model-a", KEYS, query, 3)
        assert store.index.loads == 0 and same(indexed, plain) and same(notes, plain_notes)
    store.both("model-a", KEYS, query, 3)
    assert store.index.loads == 2
    with store.reader:  # loaded: searching inside a transaction is fine
        indexed, plain, _, _ = store.both("model-a", KEYS, query, 3)
        assert same(indexed, plain) and store.index.loads == 2


def test_searches_beside_a_writing_thread_match_the_scan_of_their_snapshot(
    tmp_path: Path,
) -> None:
    """Real threads: while the writer appends and stores vectors (commits publishing to the
    feed at any moment), each search inside one read transaction returns exactly what the
    plain scan of that same snapshot returns."""
    path = tmp_path / "memory.db"
    store = Store(path)
    writer_store = store
    run(store, [("append", KEYS[0], "tea"), ("embed", "model-a", 8)])
    store.both("model-a", KEYS, vector_of("model-a", "tea"), 3)  # loaded
    stop = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(300):
                if stop.is_set():
                    return
                key = KEYS[i % len(KEYS)]
                run(writer_store, [("append", key, WORDS[i % len(WORDS)] + f" w{i}")])
                # The writer's own read of what lacks a vector, on its own connection.
                batch = pending_batch(
                    writer_store.writer_conn, "model-a", after=0, epoch=None, limit=4
                )
                rows = tuple(
                    VectorRow(id=e, digest=text_digest(t), vector=to_blob(vector_of("model-a", t)))
                    for e, t in batch.messages
                )
                writer_store.apply(StoreVectors(agent="main", name="model-a", messages=rows))
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    thread = threading.Thread(target=write)
    thread.start()
    searches = 0
    try:
        while thread.is_alive() and searches < 400:
            query = vector_of("model-a", WORDS[searches % len(WORDS)])
            with store.reader:  # one snapshot for both paths
                indexed, plain, notes, plain_notes = store.both("model-a", KEYS, query, 40)
            assert same(indexed, plain) and same(notes, plain_notes)
            searches += 1
    finally:
        stop.set()
        thread.join(timeout=30)
        store.close()
    assert not failures and searches > 0


@pytest.mark.anyio
async def test_a_read_only_memory_gets_no_index(tmp_path: Path) -> None:
    """Beside a live bot the writer is another process's: nothing here could feed one."""
    state = tmp_path / "s"
    async with am.open_memory(state, executor="inline") as mem:
        await mem.sessions.append(KEYS[0], am.Message(role="user", content="tea"))
    async with am.open_memory(state, executor="inline", readonly=True) as mem:
        store = await mem._supervisor.agent("main")
        assert attached(store.reader.conn) is None
