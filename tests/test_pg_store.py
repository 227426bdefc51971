"""The PostgreSQL store equals the SQLite store (docs/design.md §11).

A differential hypothesis test applies the same random batches of indexer commands to
`TranscriptWriter` (SQLite, a temporary file) and `PgTranscriptWriter`, and holds the acks,
histories, session infos, switches, dirty sessions, counts and search hits equal. Then the
connection errors (§11: a bad DSN, an unreachable server, a missing extension, a newer
schema) and the term encoding.
"""

from __future__ import annotations

import concurrent.futures
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import activememory as am
from activememory.protocol.config import PrivateScope
from activememory.protocol.errors import InvalidInputError, StorageError
from activememory.protocol.indexer import (
    Appended,
    AppendMessage,
    ArchiveSession,
    CreateSession,
    DeleteSession,
    ImportTranscript,
    IndexerAck,
    IndexerCommand,
    MarkDirty,
    RebuildIndex,
    ReindexChunk,
    Reindexed,
    RewindSession,
    SetSwitches,
)
from activememory.storage.db import open_connection
from activememory.storage.fts_query import plan_match
from activememory.storage.pg import db as pg_db
from activememory.storage.pg.search import search_scope as pg_search_scope
from activememory.storage.pg.terms import index_terms, quote
from activememory.storage.pg.transcripts import (
    PgTranscriptReader,
    PgTranscriptWriter,
)
from activememory.storage.search import POOL, DbScope, TermStats, search_scope
from activememory.storage.transcripts import TranscriptReader, TranscriptWriter

from pg_server import fresh_agent, pg_dsn, scratch_database

__all__ = ["pg_dsn"]  # the fixture, imported for pytest

KEYS = [
    "agent:main:direct:alice",
    "agent:main:direct:bob",
    "agent:main:main",
    "agent:main:group:g",
    "agent:main:explicit:ui",
    "legacy-key",
]
WORDS = [
    "aisle", "seats", "seat", "café", "cafe", "naïve", "running", "runner", "the", "what",
    "東京", "京都", "に", "行きました", "ß", "it's", "back\\slash", '"quoted"', "OR", "NOT",
    "x1", "a\x00b", "",
]  # fmt: skip
QUERIES = [
    "aisle seat", "seats", "café", "cafe", "naive", "run", "runn", "東京", "京", "東京都",
    "it's", "back\\slash", '"quoted" OR NOT', "the what", "x1 seats", "ß", "ss",
]  # fmt: skip

texts = st.one_of(
    st.lists(st.sampled_from(WORDS[:10]), min_size=1, max_size=4).map(" ".join),
    st.lists(st.sampled_from(WORDS), min_size=0, max_size=5).map(" ".join),
)
roles = st.sampled_from(["user", "assistant", "user", "assistant", "tool"])
keys = st.sampled_from(KEYS)


def contents() -> st.SearchStrategy[Any]:
    blocks = st.lists(
        st.one_of(
            texts.map(lambda t: {"type": "text", "text": t}),
            texts.map(lambda t: {"type": "thinking", "thinking": t}),
        ),
        min_size=1,
        max_size=3,
    )
    return st.one_of(texts, blocks)


@st.composite
def import_entries(draw: st.DrawFn) -> tuple[tuple[am.ImportEntry, ...], str | None, bool]:
    n = draw(st.integers(0, 4))
    base = draw(st.sampled_from([1, 3, 100]))
    entries = []
    for i in range(n):
        parent = draw(st.one_of(st.none(), st.integers(0, max(i - 1, 0))))
        if i == 0 or draw(st.booleans()):
            parent_id = None if i == 0 or parent is None else str(base + parent)
        else:
            parent_id = str(base + i - 1)
        if draw(st.integers(0, 20)) == 0:
            parent_id = "nowhere"  # names no earlier entry: rejected
        entries.append(
            am.ImportEntry(
                id=str(base + i),
                parent_id=parent_id,
                timestamp=float(i),
                message=am.Message(role=draw(roles), content=draw(contents())),
            )
        )
    leaf = draw(st.one_of(st.none(), st.sampled_from([e.id for e in entries] or ["x"])))
    return tuple(entries), leaf, draw(st.booleans())


appends = st.tuples(st.just("append"), keys, roles, contents())
ops = st.one_of(
    appends,
    appends,
    appends,
    appends,
    appends,
    appends,
    appends,
    appends,
    st.tuples(
        st.just("create"),
        keys,
        st.booleans(),
        st.booleans(),
        st.booleans(),
        st.one_of(st.none(), keys),
    ),
    st.tuples(st.just("rewind"), keys, st.integers(0, 40)),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("archive"), keys, st.booleans()),
    st.tuples(st.just("import"), keys, import_entries(), st.booleans()),
    st.tuples(st.just("rebuild"), st.one_of(st.none(), keys)),
    st.tuples(st.just("mark_dirty"), st.one_of(st.none(), keys)),
    st.tuples(st.just("reindex"), keys, st.integers(0, 3), st.integers(1, 3), st.booleans()),
    st.tuples(
        st.just("switches"),
        keys,
        st.one_of(st.none(), st.booleans()),
        st.one_of(st.none(), st.sampled_from(["off", "on", "raw"])),
    ),
)
batches = st.lists(st.lists(ops, min_size=1, max_size=4), min_size=1, max_size=12)
scopes: list[DbScope] = [
    "all",
    "self",
    "tree",
    PrivateScope(peers=None, owner=True),
    PrivateScope(peers=("alice",), owner=False),
]


class Pair:
    """The two stores side by side, fed the same commands."""

    def __init__(self, sqlite_path: Path, dsn: str) -> None:
        self.sqlite_writer = TranscriptWriter(open_connection(sqlite_path, writer=True))
        self.sqlite_reader = TranscriptReader(open_connection(sqlite_path, writer=False), "main")
        self.agent = fresh_agent()
        settings = pg_db.PgSettings(dsn=dsn)
        self.pg_writer = PgTranscriptWriter(pg_db.connect(settings), self.agent)
        self.pg_reader = PgTranscriptReader(pg_db.connect(settings), self.agent)
        # Event ids come from one sequence: restarted, they are SQLite's ids exactly.
        self.pg_writer.conn.execute(f"ALTER SEQUENCE {pg_db.SCHEMA}.event_ids RESTART")
        self.at = 1000.0
        self.event_ids: list[int] = []

    def close(self) -> None:
        self.sqlite_writer.conn.close()
        self.sqlite_reader.conn.close()
        self.pg_writer.conn.close()
        self.pg_reader.conn.close()

    def command(self, op: tuple[Any, ...]) -> IndexerCommand:
        self.at += 1.0
        kind = op[0]
        key = am.parse_session_key(op[1]) if op[1] is not None else None
        match kind:
            case "append":
                assert key is not None
                message = am.Message(role=op[2], content=op[3])
                return AppendMessage(key=key, message=message, at=self.at)
            case "create":
                assert key is not None
                return CreateSession(
                    key=key,
                    persistent=op[2],
                    interactive=op[3],
                    sandboxed=op[4],
                    spawned_by=op[5],
                    at=self.at,
                )
            case "rewind":
                assert key is not None
                ids = self.event_ids or [1]
                return RewindSession(key=key, to_event_id=ids[op[2] % len(ids)], at=self.at)
            case "delete":
                assert key is not None
                return DeleteSession(key=key)
            case "archive":
                assert key is not None
                return ArchiveSession(key=key, archived=op[2], at=self.at)
            case "import":
                assert key is not None
                entries, leaf, keep_ids = op[2]
                return ImportTranscript(
                    key=key, entries=entries, leaf_id=leaf, keep_ids=keep_ids, resume=op[3],
                    at=self.at,
                )  # fmt: skip
            case "rebuild":
                return RebuildIndex(key=key)
            case "mark_dirty":
                return MarkDirty(agent="main", key=key)
            case "reindex":
                assert key is not None
                info = self.sqlite_reader.session(key.raw)
                revision = (info.revision if info else 0) + (0 if op[4] else 1)
                return ReindexChunk(key=key, revision=revision, after_depth=op[2], max_rows=op[3])
            case "switches":
                assert key is not None
                return SetSwitches(key=key, active_memory=op[2], trace=op[3])
        raise AssertionError(kind)

    def apply(self, batch: list[IndexerCommand]) -> tuple[list[IndexerAck], list[IndexerAck]]:
        sqlite_acks = self.sqlite_writer.apply(batch)
        pg_acks = self.pg_writer.apply(batch)
        for ack in sqlite_acks:
            event = getattr(ack, "event", None)
            if event is not None:
                self.event_ids.append(event.id)
        return sqlite_acks, pg_acks

    def assert_equal_state(self) -> None:
        lite, pg = self.sqlite_reader, self.pg_reader
        assert pg.sessions() == lite.sessions()
        for key in KEYS:
            assert pg.session(key) == lite.session(key)
            assert pg.history(key) == lite.history(key)
            assert pg.history(key, limit=2) == lite.history(key, limit=2)
            assert pg.switches(key) == lite.switches(key)
        assert pg.dirty_sessions(3) == lite.dirty_sessions(3)
        lite_stats = lite.stats()
        pg_stats = pg.stats()
        assert pg_stats.fts_integrity_ok and lite_stats.fts_integrity_ok
        ignore = {"agent", "db_bytes"}
        assert {k: v for k, v in am_fields(pg_stats).items() if k not in ignore} == {
            k: v for k, v in am_fields(lite_stats).items() if k not in ignore
        }
        # The events the index holds: on both, exactly the same rows.
        pg_rows = {
            int(r[0])
            for r in pg.conn.execute(
                f"SELECT event_id FROM {pg_db.SCHEMA}.message_index WHERE agent = %s",
                (self.agent,),
            ).fetchall()
        }
        assert pg_stats.indexed_messages == len(pg_rows)

    def assert_equal_search(self, query: str, match: str, scope: DbScope, caller: str,
                            session_key: str | None) -> None:  # fmt: skip
        plan = plan_match(query, match)  # type: ignore[arg-type]
        if plan is None:
            return
        lite = search_scope(
            self.sqlite_reader.conn, plan, scope=scope, caller=caller, session_key=session_key,
            keep=POOL, stats=TermStats(),
        )  # fmt: skip
        pg = pg_search_scope(
            self.pg_reader.conn, self.agent, plan, scope=scope, caller=caller,
            session_key=session_key, keep=POOL,
        )  # fmt: skip
        assert (pg.visible_dirty, pg.any_dirty) == (lite.visible_dirty, lite.any_dirty)
        if len(lite.candidates) < POOL:  # every match fits: the same set on both
            lite_hits = {(c.event_id, c.session_key, c.role, c.text) for c in lite.candidates}
            pg_hits = {(c.event_id, c.session_key, c.role, c.text) for c in pg.candidates}
            assert pg_hits == lite_hits, (query, match, scope, caller, session_key)


def am_fields(stats: am.IndexStats) -> dict[str, object]:
    return {f: getattr(stats, f) for f in stats.__struct_fields__}


@pytest.fixture
def pair(pg_dsn: str) -> Iterator[Any]:
    def make(directory: str) -> Pair:
        return Pair(Path(directory) / "memory.db", pg_dsn)

    yield make


searches = st.lists(
    st.tuples(
        st.sampled_from(QUERIES),
        st.sampled_from(["phrase", "prefix"]),
        st.sampled_from(scopes),
        keys,
        st.one_of(st.none(), keys),
    ),
    min_size=4,
    max_size=8,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=batches, searches=searches)
def test_the_same_commands_give_the_same_store(
    pair: Any, batches: list[list[tuple[Any, ...]]], searches: list[tuple[Any, ...]]
) -> None:
    run_both(pair, batches, searches)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches=batches, searches=searches)
def test_common_terms_are_left_out_as_on_sqlite(
    pair: Any, batches: list[list[tuple[Any, ...]]], searches: list[tuple[Any, ...]]
) -> None:
    # The common-term rules (docs/design.md §3) at a size the test can reach: every index
    # is pruned, and a term in more than a fifth of the rows is common. One place: the
    # PostgreSQL search reads storage/search.py's figures.
    from activememory.storage import search as sqlite_search

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sqlite_search, "MIN_ROWS_TO_PRUNE", 0)
        patch.setattr(sqlite_search, "COMMON_FRACTION", 0.2)
        run_both(pair, batches, searches)


def run_both(
    pair: Any, batches: list[list[tuple[Any, ...]]], searches: list[tuple[Any, ...]]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        stores: Pair = pair(directory)
        try:
            for ops_of_batch in batches:
                batch = [stores.command(op) for op in ops_of_batch]
                sqlite_acks, pg_acks = stores.apply(batch)
                assert pg_acks == sqlite_acks, batch
                stores.assert_equal_state()
                for search in searches:
                    stores.assert_equal_search(*search)
        finally:
            stores.close()


def test_a_chunk_that_continues_no_rebuild_is_stale_on_both_stores(pair: Any) -> None:
    # Found by the differential test above: a chunk past depth 0 that no chunk at 0 began
    # (the reconciler never sends one) met rows still indexed. PostgreSQL rejected the whole
    # batch (duplicate key) and its per-command retry then drew the next event id; SQLite's
    # FTS5 took the same rowid twice. Both now answer it stale, indexing nothing.
    group, alice = "agent:main:group:g", KEYS[0]
    entries = tuple(
        am.ImportEntry(
            id=str(i + 1), parent_id=None if i == 0 else str(i), timestamp=float(i),
            message=am.Message(role="user", content=text),
        )
        for i, text in enumerate(["aisle", "aisle aisle"])
    )  # fmt: skip
    batches = [
        [("import", group, (entries, None, False), False)],
        [("rebuild", None), ("mark_dirty", group)],
        [("append", alice, "user", "aisle"), ("reindex", group, 1, 1, True)],
    ]
    searches = [("aisle", "phrase", "all", alice, None)]
    run_both(pair, batches, searches)


def test_a_chunk_past_depth_0_of_a_rebuild_never_begun_is_stale(pair: Any) -> None:
    # Found by test_pg_erase's differential test: a rewind leaves the session dirty with
    # the rewound message's index row still there (the rebuild's chunk at 0 drops it). A
    # chunk past depth 0 with nothing of the branch left to index then called the session
    # clean on both stores, the stale row kept (PostgreSQL's vector backlog listed it,
    # SQLite's did not). Only a chunk at 0 begins a rebuild; any other is stale until then.
    alice = KEYS[0]
    with tempfile.TemporaryDirectory() as directory:
        stores: Pair = pair(directory)
        try:
            first = [("append", alice, "user", "aisle"), ("append", alice, "user", "aisle")]
            stores.apply([stores.command(op) for op in [*first, ("rewind", alice, 0)]])
            sqlite_acks, pg_acks = stores.apply([stores.command(("reindex", alice, 1, 1, True))])
            assert sqlite_acks == pg_acks == [Reindexed(stale=True)]
            info = stores.sqlite_reader.session(alice)
            assert info is not None and info.dirty
            # The rebuild from 0 drops the rewound message's row on both stores.
            sqlite_acks, pg_acks = stores.apply([stores.command(("reindex", alice, 0, 3, True))])
            assert sqlite_acks == pg_acks and sqlite_acks[0].clean  # type: ignore[union-attr]
            lite = stores.sqlite_reader.conn.execute("SELECT id FROM message_fts_docsize")
            pg = stores.pg_reader.conn.execute(
                f"SELECT event_id FROM {pg_db.SCHEMA}.message_index WHERE agent = %s",
                (stores.agent,),
            )
            assert [r[0] for r in lite] == [r[0] for r in pg.fetchall()] == [1]
        finally:
            stores.close()


def test_appends_to_several_sessions_in_one_batch_index_each_ones_previous_text(
    pair: Any,
) -> None:
    # The writer reads the sessions' last texts (the context column, §2.3) for a whole
    # append run in one query: each reply must still be found by its own question's words.
    alice, bob = KEYS[0], KEYS[1]
    first = [("append", alice, "user", "apple orchard"), ("append", bob, "user", "banana boat")]
    replies = [("append", alice, "assistant", "yes"), ("append", bob, "assistant", "no")]
    searches = [(word, "phrase", "all", alice, None) for word in ("apple", "banana", "boat")]
    run_both(pair, [first, replies, [*replies, *replies]], searches)
    with tempfile.TemporaryDirectory() as directory:
        stores: Pair = pair(directory)
        try:
            for batch in (first, replies):
                stores.apply([stores.command(op) for op in batch])
            found = stores.pg_reader.conn.execute(
                f"SELECT m.session_id, m.depth FROM {pg_db.SCHEMA}.message_index m"
                " WHERE m.agent = %s AND m.terms @@ 'banana'::tsquery ORDER BY 1, 2",
                (stores.agent,),
            ).fetchall()
            assert [depth for _session, depth in found] == [1, 2]  # the question and "no"
        finally:
            stores.close()


# -- connecting: clear errors, nothing half-created ------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"dsn": ""}, "storage.dsn: expected a PostgreSQL connection string, got ''"),
        ({"dsn": "mysql://db/x"}, "storage.dsn: expected postgresql://..., got 'mysql://db/x'"),
        (
            {"dsn": "dbname='unterminated"},
            "storage.dsn: \"dbname='unterminated\" is not a connection string"
            " (unterminated quoted string in connection info string)",
        ),
        ({"dsn": "postgresql://h/db", "pool_min": 0}, "storage.poolMin: expected an integer from 1 to 256, got 0"),
        ({"dsn": "postgresql://h/db", "pool_max": 1000}, "storage.poolMax: expected an integer from 1 to 256, got 1000"),
        ({"dsn": "postgresql://h/db", "pool_max": True}, "storage.poolMax: expected an integer from 1 to 256, got True"),
        ({"dsn": "postgresql://h/db", "pool_min": 5, "pool_max": 2}, "storage.poolMin: 5 is more than storage.poolMax (2)"),
    ],
)  # fmt: skip
def test_bad_settings_name_the_key(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInputError) as caught:
        pg_db.PgSettings(**kwargs)
    assert str(caught.value) == error


def test_the_password_is_never_shown() -> None:
    assert pg_db.masked("postgresql://u:s3cret@h:5/db") == "postgresql://u:***@h:5/db"
    assert pg_db.masked("host=h password=s3cret dbname=x") == "host=h password=*** dbname=x"
    with pytest.raises(StorageError) as caught:
        pg_db.connect(pg_db.PgSettings(dsn="postgresql://u:s3cret@127.0.0.1:1/db"))
    assert "s3cret" not in str(caught.value)


def test_an_unreachable_server_is_a_storage_error_quoting_libpq() -> None:
    with pytest.raises(StorageError) as caught:
        pg_db.connect(pg_db.PgSettings(dsn="postgresql://postgres@127.0.0.1:1/x"))
    message = str(caught.value)
    assert message.startswith(
        "storage.dsn: cannot connect to 'postgresql://postgres@127.0.0.1:1/x': "
    )
    assert "refused" in message


def test_a_missing_database_quotes_the_server(pg_dsn: str) -> None:
    dsn = psycopg.conninfo.make_conninfo(pg_dsn, dbname="activememory_no_such_db")
    with pytest.raises(StorageError) as caught:
        pg_db.connect(pg_db.PgSettings(dsn=dsn))
    assert 'database "activememory_no_such_db" does not exist' in str(caught.value)


def _schema_exists(dsn: str) -> bool:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_namespace WHERE nspname = %s", (pg_db.SCHEMA,)
        ).fetchone()
    return bool(row and row[0])


def test_a_missing_extension_creates_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_db, "EXTENSIONS", ("btree_gin", "activememory_no_such_extension"))
    with scratch_database() as dsn:
        with pytest.raises(StorageError) as caught:
            pg_db.connect(pg_db.PgSettings(dsn=dsn))
        message = str(caught.value)
        assert message.startswith("storage.dsn: cannot create the activememory schema: ")
        assert "activememory_no_such_extension" in message
        assert not _schema_exists(dsn)  # one transaction: rolled back whole
        with psycopg.connect(dsn) as conn:  # the extension before it too
            assert conn.execute(
                "SELECT count(*) FROM pg_extension WHERE extname = 'btree_gin'"
            ).fetchone() == (0,)


def test_a_newer_schema_is_refused(pg_dsn: str) -> None:
    with scratch_database() as dsn:
        pg_db.connect(pg_db.PgSettings(dsn=dsn)).close()
        with psycopg.connect(dsn) as conn:
            conn.execute(
                f"UPDATE {pg_db.SCHEMA}.activememory_meta SET value = '99'"
                " WHERE key = 'schema_version'"
            )
        with pytest.raises(StorageError) as caught:
            pg_db.connect(pg_db.PgSettings(dsn=dsn))
        assert str(caught.value) == (
            f"storage.dsn: schema version 99 is newer than this activememory understands"
            f" ({pg_db.SCHEMA_VERSION}); upgrade activememory"
        )


def test_connecting_twice_keeps_the_schema(pg_dsn: str) -> None:
    for _ in range(2):
        conn = pg_db.connect(pg_db.PgSettings(dsn=pg_dsn))
        assert pg_db.schema_version(conn) == pg_db.SCHEMA_VERSION
        conn.close()


def test_the_pool_opens_and_serves(pg_dsn: str) -> None:
    pool = pg_db.open_pool(pg_db.PgSettings(dsn=pg_dsn, pool_min=1, pool_max=2))
    try:
        with pool.connection() as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


# -- terms -----------------------------------------------------------------------------------


def test_terms_are_the_sqlite_index_tokens_with_columns_apart(pg_dsn: str) -> None:
    # words 1-4 (A), a gap, CJK bigrams 6-7 (A), a gap, the previous message's end 9-12 (B)
    terms = index_terms("Running to the Café 東京都", "it's back\\slash")
    assert terms.tokens == 4 + 2 + 4
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT %s::tsvector::text", (terms.terms,)).fetchone()
    assert row is not None
    assert row[0] == (
        "'back':11B 'cafe':4A 'it':9B 'run':1A 's':10B 'slash':12B 'the':3A 'to':2A"
        " '京都':7A '東京':6A"
    )


def test_quoted_lexemes_are_never_syntax(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        for lexeme in ["it's", "a\\b", "x|y", "(", "!", "<->", ":*"]:
            row = conn.execute("SELECT %s::tsquery::text", (quote(lexeme),)).fetchone()
            assert row is not None and row[0] == quote(lexeme)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    texts=st.lists(st.text(min_size=1, max_size=40), min_size=1, max_size=4),
    queries=st.lists(st.text(min_size=1, max_size=30), min_size=1, max_size=4),
    match=st.sampled_from(["phrase", "prefix"]),
)
def test_any_unicode_is_stored_and_searched_as_on_sqlite(
    pair: Any, texts: list[str], queries: list[str], match: str
) -> None:
    # Arbitrary text (control characters, quotes, tsquery operators, astral planes) is
    # never PostgreSQL syntax and is found exactly where SQLite finds it.
    texts = [t for t in texts if _valid(t)]
    queries = [q for q in queries if _valid(q) and q.strip()]
    with tempfile.TemporaryDirectory() as directory:
        stores: Pair = pair(directory)
        try:
            key = "agent:main:direct:alice"
            batch = [stores.command(("append", key, "user", t)) for t in texts]
            sqlite_acks, pg_acks = stores.apply(batch)
            assert pg_acks == sqlite_acks
            stores.assert_equal_state()
            for query in queries:
                stores.assert_equal_search(query, match, "all", key, None)
        finally:
            stores.close()


def _valid(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def test_a_message_of_more_words_than_a_tsvector_holds_is_stored(pg_dsn: str) -> None:
    # ~1 MB of distinct words: over PostgreSQL's 1 MiB tsvector limit with every position.
    words = [f"w{i:06d}" for i in range(120_000)]
    writer = PgTranscriptWriter(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), fresh_agent())
    reader = PgTranscriptReader(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), writer.agent)
    key = am.parse_session_key("agent:main:direct:alice")
    (ack,) = writer.apply(
        [AppendMessage(key=key, message=am.Message(role="user", content=" ".join(words)), at=1.0)]
    )
    assert isinstance(ack, Appended) and ack.indexed
    for word, found in (("w000000", True), ("w050000", True), ("w119999", False)):
        plan = plan_match(word)
        assert plan is not None
        page = pg_search_scope(
            reader.conn, writer.agent, plan, scope="all", caller=key.raw, session_key=None, keep=5
        )
        assert bool(page.candidates) is found, word  # the words past the limit are not
    assert reader.stats().fts_integrity_ok
    writer.conn.close()
    reader.conn.close()


def test_a_terminated_connection_rejects_the_batch_and_writes_nothing(pg_dsn: str) -> None:
    settings = pg_db.PgSettings(dsn=pg_dsn)
    writer = PgTranscriptWriter(pg_db.connect(settings), fresh_agent())
    reader = PgTranscriptReader(pg_db.connect(settings), writer.agent)
    key = am.parse_session_key("agent:main:direct:alice")

    def append(text: str) -> list[IndexerAck]:
        message = am.Message(role="user", content=text)
        return writer.apply([AppendMessage(key=key, message=message, at=1.0)] * 2)

    assert all(isinstance(ack, Appended) for ack in append("kept"))
    reader.conn.execute("SELECT pg_terminate_backend(%s)", (writer.conn.info.backend_pid,))
    acks = append("lost")
    assert [type(ack).__name__ for ack in acks] == ["Rejected", "Rejected"]
    assert all(ack.reason == "storage" and "terminat" in ack.message for ack in acks)  # type: ignore[union-attr]
    history = reader.history(key.raw)
    assert history is not None and [e.message.content for e in history] == ["kept", "kept"]  # type: ignore[union-attr]
    reader.conn.close()


def test_two_processes_creating_the_schema_at_once_both_succeed() -> None:
    # Threads stand in for processes: each connects on its own connection to one fresh
    # database; the advisory lock makes the second wait, then find the schema made.
    with scratch_database() as dsn:
        settings = pg_db.PgSettings(dsn=dsn)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            conns = list(pool.map(lambda _: pg_db.connect(settings), range(4)))
        for conn in conns:
            assert pg_db.schema_version(conn) == pg_db.SCHEMA_VERSION
            conn.close()


def test_the_full_text_indexes_keep_a_short_pending_list() -> None:
    # Every term lookup reads a GIN index's whole pending list; left at PostgreSQL's 4 MB
    # (autovacuum off or slow) it was the searches' tail (docs/design.md §11 "Latency").
    # A store made before the step gets the limit, and its lists merged.
    indexes = ("message_index_terms", "records_terms", "note_chunks_terms")
    with scratch_database() as dsn, pytest.MonkeyPatch.context() as patch:
        patch.setattr(pg_db, "STEPS", pg_db.STEPS[:6])
        patch.setattr(pg_db, "SCHEMA_VERSION", 6)
        writer = PgTranscriptWriter(pg_db.connect(pg_db.PgSettings(dsn=dsn)), fresh_agent())
        key = am.parse_session_key(KEYS[0])
        texts = [f"aisle seat {i} of the kite" for i in range(40)]
        writer.apply(
            [
                AppendMessage(key=key, message=am.Message(role="user", content=t), at=1.0)
                for t in texts
            ]
        )
        writer.conn.close()
        patch.undo()
        conn = pg_db.connect(pg_db.PgSettings(dsn=dsn))
        try:
            assert pg_db.schema_version(conn) == pg_db.SCHEMA_VERSION
            for index in indexes:
                options = conn.execute(
                    "SELECT reloptions FROM pg_class WHERE oid = %s::regclass",
                    (f"{pg_db.SCHEMA}.{index}",),
                ).fetchone()
                assert options == ([f"gin_pending_list_limit={pg_db.GIN_PENDING_LIST_KB}"],)
            merged = conn.execute(
                f"SELECT gin_clean_pending_list('{pg_db.SCHEMA}.message_index_terms'::regclass)"
            ).fetchone()
            assert merged == (0,)  # the rows appended before were merged by the step
        finally:
            conn.close()


@pytest.mark.parametrize("budget", [1500, 1])
@pytest.mark.parametrize(
    "query", ["aisle", "aisle x1", "aisle seats", "seats zeta", "kite", "kite x1", "kite aisle"]
)
def test_common_terms_fill_the_pool_as_on_sqlite(pair: Any, query: str, budget: int) -> None:
    # A pool of 3 over 14 messages: which rows fill it is decided by the common-term rules
    # and the rank budget alone (rarer terms ranked first, the rarest over its newest
    # `budget` matches, then newest with every term, then newest with any). One place: the
    # PostgreSQL search reads storage/search.py's figures.
    from activememory.storage import search as sqlite_search
    from activememory.storage.pg import search as pg_search

    texts = [f"aisle {'seats ' * (i % 3 == 0)}{'zeta' * (i == 4)}m{i}" for i in range(11)]
    texts += ["x1 alone", "kite kite kite first", "kite later"]
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as directory:
        patch.setattr(sqlite_search, "MIN_ROWS_TO_PRUNE", 0)
        patch.setattr(sqlite_search, "COMMON_FRACTION", 0.2)
        patch.setattr(sqlite_search, "POOL", 3)
        patch.setattr(sqlite_search, "RANK_BUDGET", budget)
        patch.setattr(pg_search, "RANK_BUDGET_DIVISOR", 1)  # the same budget on both
        stores: Pair = pair(directory)
        try:
            key = "agent:main:direct:alice"
            stores.apply([stores.command(("append", key, "user", t)) for t in texts])
            plan = plan_match(query)
            assert plan is not None
            lite = search_scope(
                stores.sqlite_reader.conn, plan, scope="all", caller=key, session_key=None,
                keep=3, stats=TermStats(),
            )  # fmt: skip
            pg = pg_search_scope(
                stores.pg_reader.conn, stores.agent, plan, scope="all", caller=key,
                session_key=None, keep=3,
            )  # fmt: skip
            assert lite.candidates
            assert [c.text for c in pg.candidates] == [c.text for c in lite.candidates]
        finally:
            stores.close()
