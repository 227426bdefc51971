"""Scoped records on PostgreSQL equal the SQLite records store (docs/design.md §5, §11).

A differential hypothesis test applies the same random record command batches (add,
restore, link, invalidate, delete, erase, with metadata, expiry, NUL and CJK text) to
`RecordWriter` (SQLite, a temporary file) and `PgRecordWriter`, and holds the acks equal
and the searches equal: for every scope layer (thread, client, store, resolved by
`resolve_scope` as the API does), random queries, lifecycle, types, metadata filters and
graph hops give the same records in the same order with the same linked trees and
distances. Run again with the common-term and rank-budget rules forced at a reachable
size. Then the graph property test's invariants on PostgreSQL, and clear errors.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_records_graph import (
    assert_shortest_path_tree,
    graph_commands,
    graph_query,
    graphs,
)

from activememory._records import resolve_scope
from activememory.protocol.errors import InvalidInputError
from activememory.protocol.indexer import VectorRow
from activememory.protocol.records import (
    NOT_SET,
    AddRecord,
    DeleteRecord,
    EraseUserRecords,
    InvalidateRecord,
    LinkRecords,
    Record,
    RecordCommand,
    RecordRejected,
    RecordRelation,
    RecordStatus,
    RecordType,
    RestoreRecord,
    StoreRecordVectors,
)
from activememory.storage import records as sqlite_records
from activememory.storage import search as sqlite_search
from activememory.storage.fts_query import index_tokens, plan_match
from activememory.storage.pg import db as pg_db
from activememory.storage.pg import records as pg_records
from activememory.storage.pg.records import PgRecordReader, PgRecordWriter
from activememory.storage.records import (
    LinkedNode,
    RecordHit,
    RecordQuery,
    RecordReader,
    RecordWriter,
    open_records_connection,
)
from activememory.storage.vectors import text_digest

from pg_server import fresh_agent, pg_dsn, scratch_database

__all__ = ["pg_dsn"]  # the fixture, imported for pytest

NOW = 1_700_000_000.0
# Distinct stems, so a phrase of two or more words occurs at most once in a record (below).
WORDS = [
    "aisle", "seat", "window", "café", "naïve", "running", "the", "blue", "東京都", "大阪",
    "x1", "ß",
]  # fmt: skip
QUERIES = [
    "aisle seat", "seat", "café", "cafe", "naive", "run", "runn", "東京", "京", "東京都",
    "the blue", "x1 seat", "window aisle seat", "ß", "blue", "大阪 aisle",
]  # fmt: skip
USERS = [None, "u1", "u2"]
AGENTS = [None, "a1"]
THREADS = [None, "t1", "t2"]
META_VALUES = ["a", "b", 1, 1.0, 2.5, True, False, None, "a\x00"]


@st.composite
def contents(draw: st.DrawFn) -> str:
    # Words of distinct stems, one non-CJK word perhaps repeated: FTS5 counts each
    # occurrence of a phrase, PostgreSQL's bm25 once (docs/design.md §11), so no drawn
    # record holds a phrase twice; a repeated word tests term frequencies.
    if draw(st.integers(0, 2)) == 0:  # the same text again: equal scores, the tie-break
        return draw(st.sampled_from(["aisle seat", "seat blue", "window"]))
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6, unique=True))
    repeat = draw(st.sampled_from([None, *[w for w in words if w.isascii()]]))
    if repeat is not None:
        words.insert(draw(st.integers(0, len(words))), repeat)
    if draw(st.integers(0, 9)) == 0:
        words.append("nul\x00byte")
    return " ".join(words)


metadata = st.dictionaries(st.sampled_from(["k", "j", "k\x00"]), st.sampled_from(META_VALUES))
records = st.fixed_dictionaries(
    {
        "content": contents(),
        "type": st.sampled_from(["memory", "memory", "memory", "document", "message"]),
        "user": st.sampled_from(USERS),
        "agent": st.sampled_from(AGENTS),
        "thread": st.sampled_from(THREADS),
        "metadata": metadata,
        "expires": st.sampled_from([None, None, None, NOW - 1.0, NOW + 100.0]),
    }
)
refs = st.integers(0, 12)  # record r{n}; some never exist
ops = st.one_of(
    st.tuples(st.just("add"), records),
    st.tuples(st.just("add"), records),
    st.tuples(st.just("add"), records),
    st.tuples(st.just("add"), records),
    st.tuples(st.just("add"), records),
    st.tuples(st.just("add"), records),
    st.tuples(st.just("add_again"), refs, records),
    st.tuples(st.just("restore"), records, st.text(min_size=1, max_size=5)),
    st.tuples(st.just("link"), refs, refs, st.sampled_from(["about", "part_of"])),
    st.tuples(st.just("link"), refs, refs, st.sampled_from(["about", "part_of"])),
    st.tuples(st.just("invalidate"), refs, st.sampled_from(["stale", "wrong\x00"])),
    st.tuples(st.just("delete"), refs),
    st.tuples(st.just("erase"), st.lists(st.sampled_from(["u1", "u2"]), min_size=1, max_size=2)),
)
batches = st.lists(st.lists(ops, min_size=1, max_size=6), min_size=1, max_size=5)


def scope_args() -> st.SearchStrategy[tuple[Any, ...]]:
    value = st.sampled_from([NOT_SET, None, "u1", "a1", "t1"])
    flag = st.sampled_from([NOT_SET, True, False])
    return st.tuples(value, value, value, flag, flag, flag)


searches = st.lists(
    st.fixed_dictionaries(
        {
            "query": st.sampled_from(QUERIES),
            "match": st.sampled_from(["phrase", "prefix"]),
            "scope": scope_args(),
            "limit": st.integers(1, 6),
            "include_invalid": st.booleans(),
            "types": st.sampled_from([None, ("memory",), ("memory", "message")]),
            "metadata": st.lists(
                st.tuples(st.sampled_from(["k", "k\x00"]), st.sampled_from(META_VALUES)),
                max_size=1,
            ),
            "hops": st.integers(0, 3),
            "max_linked": st.sampled_from([0, 1, 2, 100]),
        }
    ),
    min_size=3,
    max_size=6,
)


class Pair:
    """The two records stores side by side, fed the same commands."""

    def __init__(self, directory: Path, dsn: str) -> None:
        self.sqlite_conn = open_records_connection(directory / "records.db", writer=True)
        self.sqlite_writer = RecordWriter(self.sqlite_conn)
        settings = pg_db.PgSettings(dsn=dsn)
        self.agent = fresh_agent("r")
        self.pg_writer = PgRecordWriter(pg_db.connect(settings), self.agent)
        self.pg_reader = PgRecordReader(pg_db.connect(settings), self.agent)
        self.next_id = 0
        self.at = NOW - 100.0

    def close(self) -> None:
        self.sqlite_conn.close()
        self.pg_writer.conn.close()
        self.pg_reader.conn.close()

    def record(self, fields: dict[str, Any], record_id: str | None = None, **kw: Any) -> Record:
        if record_id is None:
            record_id = f"r{self.next_id}"
            self.next_id += 1
        rtype = RecordType(fields["type"])
        return Record(
            id=record_id,
            content=fields["content"],
            record_type=rtype,
            user_id=fields["user"],
            agent_id=fields["agent"],
            thread_id=fields["thread"],
            metadata=fields["metadata"],
            timestamp=self.at,
            expires_at=fields["expires"],
            role="user" if rtype == RecordType.MESSAGE else None,
            **kw,
        )

    def command(self, op: tuple[Any, ...]) -> RecordCommand:
        self.at += 1.0
        match op[0]:
            case "add":
                return AddRecord(record=self.record(op[1]), at=self.at)
            case "add_again":
                return AddRecord(record=self.record(op[2], f"r{op[1]}"), at=self.at)
            case "restore":
                record = self.record(op[1], status=RecordStatus.INVALID, invalid_reason=op[2])
                return RestoreRecord(record=record, created_at=self.at, invalidated_at=self.at)
            case "link":
                rel = RecordRelation(relation=op[3], source_id=f"r{op[1]}", target_id=f"r{op[2]}")
                return LinkRecords(relation=rel, at=self.at)
            case "invalidate":
                return InvalidateRecord(id=f"r{op[1]}", reason=op[2], at=self.at)
            case "delete":
                return DeleteRecord(id=f"r{op[1]}")
            case "erase":
                return EraseUserRecords(user_ids=tuple(op[1]))
        raise AssertionError(op)

    def assert_equal_search(self, layer: str, search: dict[str, Any]) -> None:
        plan = plan_match(search["query"], search["match"])
        assert plan is not None
        user, agent, thread, *flags = search["scope"]
        try:
            scope, boosts = resolve_scope(
                layer,  # type: ignore[arg-type]
                (user, agent, thread),
                (flags[0], flags[1], flags[2]),
                _THREAD if layer == "thread" else None,
            )
        except InvalidInputError:
            return  # the client layer's rejected cells: no search runs
        query = RecordQuery(
            scope=scope,
            boosts=boosts,
            now=NOW,
            limit=search["limit"],
            include_invalid=search["include_invalid"],
            record_types=None
            if search["types"] is None
            else tuple(RecordType(t) for t in search["types"]),
            metadata=tuple(search["metadata"]),
            num_hops=search["hops"],
            max_linked=search["max_linked"],
        )
        # A fresh SQLite reader: its term counts are cached per reader (TermStats), the
        # PostgreSQL reader counts every time.
        lite = RecordReader(self.sqlite_conn).search(plan, query)
        pg = self.pg_reader.search(plan, query)
        assert _shape(pg) == _shape(lite), (search, scope, boosts)
        for a, b in zip(pg, lite, strict=True):
            assert a.distance == pytest.approx(b.distance, rel=1e-9, abs=1e-12)
        # One record's graph (`mem.records.linked`) under the same link filters.
        for i in range(min(self.next_id, 4)):
            lite_one = RecordReader(self.sqlite_conn).linked(f"r{i}", query)
            pg_one = self.pg_reader.linked(f"r{i}", query)
            assert _shape([pg_one] if pg_one else []) == _shape([lite_one] if lite_one else [])

    def assert_equal_user_records(self) -> None:
        """A user's records as an export and an erase's dry run read them (docs/design.md
        §2.6): the same rows, times, relations and counts on both stores."""
        lite = RecordReader(self.sqlite_conn)
        for users in [("u1",), ("u2", "u1"), ("nobody",)]:
            assert self.pg_reader.plan_record_erasure(users) == lite.plan_record_erasure(users)
            for agent in (None, "a1", "a2"):
                assert self.pg_reader.records_of(users, agent) == lite.records_of(users, agent)


class _Thread:
    user_id = "u1"
    agent_id = "a1"
    thread_id = "t1"


_THREAD: Any = _Thread()


def _shape(hits: list[RecordHit]) -> list[Any]:
    def node(n: LinkedNode) -> Any:
        return (n.relation, n.record, [node(c) for c in n.children])

    return [(h.record, [node(c) for c in h.linked]) for h in hits]


@pytest.fixture
def pair(pg_dsn: str) -> Iterator[Any]:
    def make(directory: str) -> Pair:
        return Pair(Path(directory), pg_dsn)

    yield make


def run_both(pair: Any, layer: str, batches: list[list[Any]], searches: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        stores: Pair = pair(directory)
        try:
            for ops_of_batch in batches:
                batch = [stores.command(op) for op in ops_of_batch]
                sqlite_acks = stores.sqlite_writer.apply(batch)
                pg_acks = stores.pg_writer.apply(batch)
                assert pg_acks == sqlite_acks, batch
                assert stores.pg_reader.count() == RecordReader(stores.sqlite_conn).count()
                stores.assert_equal_user_records()
                for search in searches:
                    stores.assert_equal_search(layer, search)
        finally:
            stores.close()


LAYERS = ["thread", "client", "store"]
_SETTINGS = settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.mark.parametrize("layer", LAYERS)
@_SETTINGS
@given(batches=batches, searches=searches)
def test_the_same_commands_give_the_same_records_and_searches(
    pair: Any, layer: str, batches: list[list[Any]], searches: list[Any]
) -> None:
    run_both(pair, layer, batches, searches)


@pytest.mark.parametrize("layer", LAYERS)
@_SETTINGS
@given(batches=batches, searches=searches)
def test_common_terms_and_the_rank_budget_prune_as_on_sqlite(
    pair: Any, layer: str, batches: list[list[Any]], searches: list[Any]
) -> None:
    # The records' pruning rules (docs/design.md §5.5) at a size the test reaches: over 2
    # records a term in more than 2 is common, ranking stops after 2 rows, a term in more
    # than 2 is ranked over its 2 newest, recency reorders at least 2, and a scope of at
    # most sqrt(records) is listed.
    with pytest.MonkeyPatch.context() as patch:
        for module in (sqlite_records, pg_records):
            patch.setattr(module, "COMMON_DOCS", 2)
            patch.setattr(module, "RECENCY_POOL", 2)
            patch.setattr(module, "SMALL_SCOPE_FACTOR", 1)
        patch.setattr(sqlite_search, "RANK_BUDGET", 2)
        patch.setattr(pg_records, "RANK_BUDGET", 2)
        run_both(pair, layer, batches, searches)


# -- the graph property test's invariants, on PostgreSQL ---------------------------------


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(graphs())
def test_expansion_is_the_reference_shortest_path_tree_on_postgresql(
    pg_dsn: str, graph: tuple[list[str], list[tuple[int, int, str]], int, int]
) -> None:
    kinds, edges, hops, cap = graph
    settings_ = pg_db.PgSettings(dsn=pg_dsn)
    writer = PgRecordWriter(pg_db.connect(settings_), fresh_agent("g"))
    reader = PgRecordReader(pg_db.connect(settings_), writer.agent)
    try:
        acks = writer.apply(graph_commands(kinds, edges))
        assert not any(isinstance(ack, RecordRejected) for ack in acks)
        plan = plan_match("anchor")
        assert plan is not None
        [hit] = reader.search(plan, graph_query(hops, cap))
    finally:
        writer.conn.close()
        reader.conn.close()
    assert_shortest_path_tree(hit, kinds, edges, hops, cap)


# -- tenants, errors -----------------------------------------------------------------------


def test_tenants_never_see_each_others_records(pg_dsn: str) -> None:
    settings_ = pg_db.PgSettings(dsn=pg_dsn)
    a, b = fresh_agent("a"), fresh_agent("b")
    for tenant in (a, b):
        writer = PgRecordWriter(pg_db.connect(settings_), tenant)
        record = Record(id="same-id", content=f"seat of {tenant}", timestamp=NOW)
        assert writer.apply([AddRecord(record=record, at=NOW)])[0].id == "same-id"  # type: ignore[union-attr]
        writer.conn.close()
    reader = PgRecordReader(pg_db.connect(settings_), a)
    plan = plan_match("seat")
    assert plan is not None
    scope, _ = resolve_scope("store", (NOT_SET,) * 3, (NOT_SET,) * 3)
    hits = reader.search(plan, RecordQuery(scope=scope, now=NOW, limit=10))
    assert [h.record.content for h in hits] == [f"seat of {a}"]
    assert reader.count() == 1
    reader.conn.close()


def test_record_vectors_are_stored_as_on_sqlite(pg_dsn: str, tmp_path: Path) -> None:
    """`StoreRecordVectors`: a vector of the record's content is stored, one of other
    content or of no record skipped, and another name's vector replaced — the same acks
    and the same table on both stores (storage/pg/record_vectors.py)."""
    sqlite_conn = open_records_connection(tmp_path / "records.db", writer=True)
    writers = [
        RecordWriter(sqlite_conn),
        PgRecordWriter(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), fresh_agent()),
    ]
    blob = numpy.ones(4, dtype="<f4").tobytes()
    other = (numpy.ones(4, dtype="<f4") / 2).tobytes()
    results = []
    for writer in writers:
        writer.apply(
            [AddRecord(record=Record(id=i, content=i, timestamp=NOW), at=NOW) for i in "ab"]
        )
        seqs = _seqs(writer)
        rows = (
            VectorRow(id=seqs["a"], digest=text_digest("a"), vector=blob),
            VectorRow(id=seqs["b"], digest=text_digest("not b"), vector=blob),
            VectorRow(id=max(seqs.values()) + 100, digest=text_digest("a"), vector=blob),
        )
        first = writer.apply([StoreRecordVectors(name="m1", rows=rows)])
        again = writer.apply(
            [
                StoreRecordVectors(
                    name="m2",
                    rows=(VectorRow(id=seqs["a"], digest=text_digest("a"), vector=other),),
                )
            ]
        )
        results.append((first, again, _vectors(writer)))
    assert results[0] == results[1]
    assert results[0][2] == {"a": ("m2", other)}
    sqlite_conn.close()
    writers[1].conn.close()


def _seqs(writer: RecordWriter | PgRecordWriter) -> dict[str, int]:
    if isinstance(writer, RecordWriter):
        rows = writer.conn.execute("SELECT id, seq FROM records").fetchall()
    else:
        rows = writer.conn.execute(
            "SELECT id, seq FROM activememory.records WHERE agent = %s", (writer.agent,)
        ).fetchall()
    return {str(i): int(s) for i, s in rows}


def _vectors(writer: RecordWriter | PgRecordWriter) -> dict[str, tuple[str, bytes]]:
    if isinstance(writer, RecordWriter):
        rows = writer.conn.execute(
            "SELECT r.id, v.name, v.vector FROM record_vectors v JOIN records r USING (seq)"
        ).fetchall()
    else:
        rows = writer.conn.execute(
            "SELECT r.id, v.name, v.vector FROM activememory.record_vectors v"
            " JOIN activememory.records r USING (agent, seq) WHERE v.agent = %s",
            (writer.agent,),
        ).fetchall()
    return {str(i): (str(n), bytes(v)) for i, n, v in rows}


def test_rejections_name_the_field_as_on_sqlite(pg_dsn: str) -> None:
    writer = PgRecordWriter(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), fresh_agent())
    record = Record(id="r1", content="seat", timestamp=NOW)
    acks = writer.apply(
        [
            AddRecord(record=record, at=NOW),
            AddRecord(record=record, at=NOW),
            LinkRecords(
                relation=RecordRelation(relation="about", source_id="r1", target_id="nope"),
                at=NOW,
            ),
            LinkRecords(
                relation=RecordRelation(relation="about", source_id="r1", target_id="r1"),
                at=NOW,
            ),
            InvalidateRecord(id="nope", reason="x", at=NOW),
            DeleteRecord(id="nope"),
        ]
    )
    assert [getattr(a, "message", None) for a in acks[1:]] == [
        "id: 'r1' already exists",
        "target_id: no record 'nope'",
        "target_id: a record cannot be linked to itself",
        "id: no record 'nope'",
        "id: no record 'nope'",
    ]
    writer.conn.close()


def test_a_terminated_connection_rejects_the_batch_and_writes_nothing(pg_dsn: str) -> None:
    settings_ = pg_db.PgSettings(dsn=pg_dsn)
    writer = PgRecordWriter(pg_db.connect(settings_), fresh_agent())
    reader = PgRecordReader(pg_db.connect(settings_), writer.agent)

    def add(n: int) -> list[Any]:
        return writer.apply(
            [
                AddRecord(record=Record(id=f"r{n}{i}", content="seat", timestamp=NOW), at=NOW)
                for i in range(2)
            ]
        )

    assert all(not isinstance(ack, RecordRejected) for ack in add(1))
    reader.conn.execute("SELECT pg_terminate_backend(%s)", (writer.conn.info.backend_pid,))
    acks = add(2)
    assert all(isinstance(a, RecordRejected) and a.reason == "storage" for a in acks)
    assert "terminat" in acks[0].message
    assert reader.count() == 2
    reader.conn.close()


def test_the_records_tables_are_keyed_by_tenant_first(pg_dsn: str) -> None:
    # Row-level security and Citus distribution (docs/design.md §11) need the `agent`
    # column first in every primary key of the records tables.
    with pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)) as conn:
        rows = conn.execute(
            "SELECT c.relname, a.attname FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = i.indkey[0]"
            " WHERE i.indisprimary AND n.nspname = %s"
            " AND c.relname IN ('records', 'record_relations', 'record_stats')",
            (pg_db.SCHEMA,),
        ).fetchall()
    assert sorted(rows) == [
        ("record_relations", "agent"),
        ("record_stats", "agent"),
        ("records", "agent"),
    ]


def test_query_terms_of_the_test_vocabulary_have_distinct_stems() -> None:
    # The premise of `contents`: no two drawn words share a stem.
    terms = [t for w in WORDS for _, _, t in index_tokens(w.encode("utf-8"))]
    assert len(terms) == len(set(terms))


def test_a_store_made_before_the_records_step_gets_it() -> None:
    with scratch_database() as dsn, pytest.MonkeyPatch.context() as patch:
        patch.setattr(pg_db, "STEPS", pg_db.STEPS[:1])
        patch.setattr(pg_db, "SCHEMA_VERSION", 1)
        pg_db.connect(pg_db.PgSettings(dsn=dsn)).close()
        patch.undo()
        conn = pg_db.connect(pg_db.PgSettings(dsn=dsn))
        assert pg_db.schema_version(conn) == pg_db.SCHEMA_VERSION == len(pg_db.STEPS)
        conn.close()
        writer = PgRecordWriter(pg_db.connect(pg_db.PgSettings(dsn=dsn)), fresh_agent())
        record = Record(id="r1", content="seat", timestamp=NOW)
        assert writer.apply([AddRecord(record=record, at=NOW)])[0].id == "r1"  # type: ignore[union-attr]
        writer.conn.close()


# -- through open_memory: connections lost ------------------------------------------------


def test_records_of_an_open_memory_outlive_their_connections(tmp_path: Path) -> None:
    # Every backend of the memory terminated (the records writer's connection and the
    # pool's): the next add runs once more on a new connection (the old one died while
    # idle, before COMMIT was sent), and a read on a dead pool connection on another.
    import time

    import psycopg

    import activememory as am

    text_only = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    with (
        scratch_database() as dsn,
        psycopg.connect(dsn, autocommit=True) as admin,
        am.sync.open_memory(tmp_path / "s", storage=dsn, config=text_only) as mem,
    ):
        first = mem.records.add("likes aisle seats", user_id="u1")
        assert [h.id for h in mem.records.search("seat", user_id="u1")] == [first]
        others = (
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND pid <> pg_backend_pid()"
        )
        pids = [row[0] for row in admin.execute(others)]
        assert len(pids) >= 2  # the records writer and a reader of the pool
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (pids,))
        deadline = time.monotonic() + 5
        while {row[0] for row in admin.execute(others)} & set(pids):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        second = mem.records.add("likes window seats", user_id="u1")
        assert {h.id for h in mem.records.search("seat", user_id="u1")} == {first, second}
        record = mem.records.get(second)
        assert record is not None and record.content == "likes window seats"
