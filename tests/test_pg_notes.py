"""Memory notes on PostgreSQL equal memory notes on SQLite (docs/design.md §4.7, §11).

A differential hypothesis test applies the same random `SyncNotes` batches (notes with
headings, CJK, diacritics, NUL, FTS syntax; changed files, stat-only updates with the right
and a stale digest, removals) to `TranscriptWriter` and `PgTranscriptWriter`, and holds the
acks, the indexed files and the search answers equal: the same chunks (ids, paths, lines,
text) for every query, with the same BM25 scores for one-word queries (a phrase counts once
per chunk on PostgreSQL, each time on SQLite: docs/design.md §11 "Ranking").
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from activememory.protocol.indexer import NoteFile, NotesSynced, Rejected, SyncNotes
from activememory.storage import notes as sqlite_notes
from activememory.storage.db import open_connection
from activememory.storage.fts_query import plan_match
from activememory.storage.notes import chunk_note, note_lines
from activememory.storage.pg import db as pg_db
from activememory.storage.pg import notes as pg_notes
from activememory.storage.pg.transcripts import PgTranscriptReader, PgTranscriptWriter
from activememory.storage.transcripts import TranscriptWriter

from pg_server import fresh_agent, pg_dsn

__all__ = ["pg_dsn"]  # the fixture, imported for pytest

PATHS = ["MEMORY.md", "memory/a.md", "memory/b.md", "memory/日記.md"]
WORDS = [
    "aisle", "seats", "seat", "café", "cafe", "naïve", "running", "the", "東京", "京都",
    "ß", '"quoted"', "OR", "NOT", "x1", "a\x00b", "it's",
]  # fmt: skip
QUERIES = [
    "aisle", "seats", "café", "cafe", "naive", "run", "東京", "京", "ß", "ss", "x1",
    "aisle seat", '"quoted" OR NOT', "it's", "the",
]  # fmt: skip

lines = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join),
    st.sampled_from(["", "# Title", "## Trip", "### Food café", "```", "- item aisle"]),
)
documents = st.lists(lines, min_size=0, max_size=12).map("\n".join)


def note_file(path: str, text: str, mtime: int) -> NoteFile:
    digest = hashlib.sha256(text.encode()).hexdigest()
    chunks = chunk_note(note_lines(text), max_chars=60)  # small chunks: several per note
    return NoteFile(path=path, mtime_ns=mtime, size=len(text), digest=digest, chunks=chunks)


class Notes:
    """Both stores' notes, fed the same commands, and what each holds."""

    def __init__(self, directory: str, dsn: str) -> None:
        path = Path(directory) / "memory.db"
        self.lite = TranscriptWriter(open_connection(path, writer=True))
        self.lite_reader = open_connection(path, writer=False)
        self.agent = fresh_agent()
        pg_settings = pg_db.PgSettings(dsn=dsn)
        self.pg = PgTranscriptWriter(pg_db.connect(pg_settings), self.agent)
        self.pg_reader = PgTranscriptReader(pg_db.connect(pg_settings), self.agent)
        self.texts: dict[str, str] = {}
        self.mtime = 0

    def close(self) -> None:
        for conn in (self.lite.conn, self.lite_reader, self.pg.conn, self.pg_reader.conn):
            conn.close()

    def command(self, op: tuple[Any, ...]) -> SyncNotes:
        self.mtime += 1
        kind, path = op[0], op[1]
        if kind == "write":
            self.texts[path] = op[2]
            return SyncNotes(agent="main", files=(note_file(path, op[2], self.mtime),))
        if kind == "touch":  # a stat-only update: right digest if indexed, else a stale one
            text = self.texts.get(path, "never indexed")
            known = note_file(path, text, self.mtime)
            stale = op[2] or path not in self.texts
            digest = "0" * 64 if stale else known.digest
            return SyncNotes(
                agent="main",
                files=(NoteFile(path=path, mtime_ns=self.mtime, size=1, digest=digest),),
            )
        self.texts.pop(path, None)
        return SyncNotes(agent="main", removed=(path,))

    def assert_equal(self, queries: list[str]) -> None:
        lite_files = sqlite_notes.indexed_note_files(self.lite_reader)
        assert pg_notes.indexed_note_files(self.pg_reader.conn, self.agent) == lite_files
        for query in queries:
            plan = plan_match(query)
            if plan is None:
                continue
            lite = sqlite_notes.search_notes(self.lite_reader, plan, 50)
            pg = pg_notes.search_notes(self.pg_reader.conn, self.agent, plan, 50)
            assert {h._replace(score=0.0) for h in pg} == {h._replace(score=0.0) for h in lite}
            if len(plan.terms) == 1 and len(query.split()) == 1:
                lite_scores = {h.chunk_id: h.score for h in lite}
                for hit in pg:
                    assert hit.score == pytest.approx(lite_scores[hit.chunk_id], rel=1e-6)
                assert [h.score for h in pg] == sorted((h.score for h in pg), reverse=True)


ops = st.one_of(
    st.tuples(st.just("write"), st.sampled_from(PATHS), documents),
    st.tuples(st.just("write"), st.sampled_from(PATHS), documents),
    st.tuples(st.just("touch"), st.sampled_from(PATHS), st.booleans()),
    st.tuples(st.just("remove"), st.sampled_from(PATHS)),
)


@pytest.fixture
def notes(pg_dsn: str) -> Iterator[Any]:
    def make(directory: str) -> Notes:
        return Notes(directory, pg_dsn)

    yield make


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=st.lists(st.lists(ops, min_size=1, max_size=3), min_size=1, max_size=6),
    queries=st.lists(st.sampled_from(QUERIES), min_size=3, max_size=6),
)
def test_the_same_syncs_give_the_same_notes_and_answers(
    notes: Any, batches: list[list[tuple[Any, ...]]], queries: list[str]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        stores: Notes = notes(directory)
        try:
            for ops_of_batch in batches:
                batch = [stores.command(op) for op in ops_of_batch]
                lite_acks = stores.lite.apply(batch)
                pg_acks = stores.pg.apply(batch)
                assert pg_acks == lite_acks, batch
                stores.assert_equal(queries)
        finally:
            stores.close()


def test_a_stale_stat_update_is_rejected_and_writes_nothing(pg_dsn: str) -> None:
    with tempfile.TemporaryDirectory() as directory:
        stores = Notes(directory, pg_dsn)
        try:
            first = note_file("MEMORY.md", "# Trip\naisle seats", 1)
            assert stores.pg.apply([SyncNotes(agent="main", files=(first,))]) == [
                NotesSynced(files=1, removed=0, chunks=1)
            ]
            stale = NoteFile(path="MEMORY.md", mtime_ns=2, size=3, digest="f" * 64)
            other = note_file("memory/a.md", "café", 3)
            acks = stores.pg.apply([SyncNotes(agent="main", files=(other, stale))])
            assert acks == [
                Rejected(
                    reason="invalid",
                    message="files[1].chunks: 'MEMORY.md' changed; send its chunks",
                )
            ]
            assert set(pg_notes.indexed_note_files(stores.pg_reader.conn, stores.agent)) == {
                "MEMORY.md"
            }
        finally:
            stores.close()


def test_notes_of_two_agents_stay_apart(pg_dsn: str) -> None:
    settings_ = pg_db.PgSettings(dsn=pg_dsn)
    a, b = fresh_agent(), fresh_agent()
    conn = pg_db.connect(settings_)
    for agent, text in ((a, "aisle seats"), (b, "window seats")):
        writer = PgTranscriptWriter(pg_db.connect(settings_), agent)
        writer.apply([SyncNotes(agent=agent, files=(note_file("MEMORY.md", text, 1),))])
        writer.conn.close()
    plan = plan_match("seats")
    assert plan is not None
    hits = {agent: pg_notes.search_notes(conn, agent, plan, 10) for agent in (a, b)}
    assert [h.text for h in hits[a]] == ["aisle seats"]
    assert [h.text for h in hits[b]] == ["window seats"]
    # Each agent numbers its chunks from 1, as each SQLite agent database does.
    assert hits[a][0].chunk_id == hits[b][0].chunk_id == 1
    conn.close()


def test_notes_search_statements_are_planned_for_their_terms_each_time(pg_dsn: str) -> None:
    # As the message search's (docs/design.md §11 "Latency"): psycopg prepares a statement
    # run five times, and PostgreSQL may then keep a generic plan blind to a term's rows.
    with tempfile.TemporaryDirectory() as directory:
        stores = Notes(directory, pg_dsn)
        try:
            text = "# Trip\naisle seats\n\n## Food\ncafé naïve running"
            stores.pg.apply([SyncNotes(agent="main", files=(note_file("MEMORY.md", text, 1),))])
            conn = stores.pg_reader.conn
            for query in ["aisle", "cafe", "aisle seats", "running"] * 3:
                plan = plan_match(query)
                assert plan is not None
                assert pg_notes.search_notes(conn, stores.agent, plan, 5)
            prepared = conn.execute("SELECT statement FROM pg_prepared_statements", prepare=False)
            assert prepared.fetchall() == []
        finally:
            stores.close()


@given(total=st.integers(0, 10**7), data=st.data())
def test_frequencies_counted_up_to_the_idf_floor_give_the_exact_idf(
    total: int, data: st.DataObject
) -> None:
    from activememory.storage.pg.search import _idf, idf_cap

    cap = idf_cap(total)
    near = st.integers(max(0, cap - 3), cap + 3)
    frequency = data.draw(st.one_of(near, st.integers(0, max(total, 1))))
    assert _idf(total, min(frequency, cap)) == _idf(total, frequency)


# -- row-level security (docs/design.md §11): the notes and vector tables are covered ------


def test_a_bound_role_reaches_only_its_agents_notes_and_vectors(pg_dsn: str) -> None:
    import secrets

    import numpy
    import psycopg
    import psycopg.conninfo

    import activememory as am
    from activememory.protocol.config import PrivateScope
    from activememory.protocol.indexer import (
        AppendMessage,
        Erased,
        EraseIdentity,
        StoreVectors,
        VectorRow,
        VectorsStored,
    )
    from activememory.storage import vectors as lite_vectors
    from activememory.storage.pg import userdata as pg_userdata
    from activememory.storage.pg import vectors as pg_vectors

    from pg_server import ADMIN_DSN

    tag = secrets.token_hex(4)
    roles = (f"am_rls_notes_{tag}_a", f"am_rls_notes_{tag}_b")
    agents = {roles[0]: fresh_agent("na"), roles[1]: fresh_agent("nb")}
    key = am.parse_session_key("agent:main:direct:dana")
    vector = numpy.ones(4, dtype="<f4") / 2
    owner = pg_db.connect(pg_db.PgSettings(dsn=pg_dsn))
    owner.autocommit = True
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        for role in roles:
            admin.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            for role, agent in agents.items():
                owner.execute(f"SELECT {pg_db.SCHEMA}.grant_agent(%s, %s)", (role, agent))

            def as_role(role: str) -> Any:
                dsn = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
                return pg_db.connect(pg_db.PgSettings(dsn=dsn))

            for role, agent in agents.items():  # each writes its own through the store
                writer = PgTranscriptWriter(as_role(role), agent)
                sync = SyncNotes(agent=agent, files=(note_file("MEMORY.md", f"seats {agent}", 1),))
                append = AppendMessage(
                    key=key, message=am.Message(role="user", content="dana's seats"), at=1.0
                )
                assert writer.apply([sync, append])[0] == NotesSynced(files=1, removed=0, chunks=1)
                pending = pg_vectors.pending_batch(
                    writer.conn, agent, "m", after=0, epoch=None, limit=10
                )
                rows = tuple(
                    VectorRow(id=i, digest=lite_vectors.text_digest(t), vector=vector.tobytes())
                    for i, t in pending.messages + pending.notes
                )
                command = StoreVectors(agent=agent, name="m", messages=rows[:1], notes=rows[1:])
                assert writer.apply([command]) == [VectorsStored(messages=1, notes=1, skipped=0)]
                writer.conn.close()
            for role, other in zip(roles, reversed(roles), strict=True):
                mine, theirs = agents[role], agents[other]
                conn = as_role(role)
                conn.autocommit = True
                plan = plan_match("seats")
                assert plan is not None
                assert [h.text for h in pg_notes.search_notes(conn, mine, plan, 5)] == [
                    f"seats {mine}"
                ]
                assert pg_notes.search_notes(conn, theirs, plan, 5) == []
                assert pg_notes.indexed_note_files(conn, theirs) == {}
                assert pg_vectors.nearest_note_rows(conn, theirs, vector, name="m", k=5) == []
                assert len(pg_vectors.nearest_note_rows(conn, mine, vector, name="m", k=5)) == 1
                for table in ("note_files", "note_chunks", "note_vectors", "message_vectors",
                              "vector_cache", "vector_epochs"):  # fmt: skip
                    found = conn.execute(
                        f"SELECT count(*) FROM {pg_db.SCHEMA}.{table} WHERE agent = %s", (theirs,)
                    ).fetchone()
                    assert found == (0,), table
                # Writing another agent's notes is refused by the policy.
                writer = PgTranscriptWriter(as_role(role), theirs)
                sync = SyncNotes(agent=theirs, files=(note_file("memory/x.md", "x", 1),))
                (ack,) = writer.apply([sync])
                assert isinstance(ack, Rejected) and "row-level security" in ack.message
                writer.conn.close()
                # Its own erase goes through; the purge is the owner's, and it says so.
                writer = PgTranscriptWriter(as_role(role), mine)
                (ack,) = writer.apply(
                    [EraseIdentity(agent=mine, sessions=PrivateScope(peers=None, owner=True))]
                )
                writer.conn.close()
                assert isinstance(ack, Erased) and ack.erasure.vectors == 1
                assert not ack.erasure.purged and ack.erasure.problem is not None
                assert "does not own the tables" in ack.erasure.problem
                plan_left = pg_userdata.plan_erasure(
                    owner, theirs, PrivateScope(peers=None, owner=True)
                )
                # The other agent's session is untouched until its own role erases it.
                expected = (key.raw,) if role == roles[0] else ()
                assert plan_left.erasure.session_keys == expected
                conn.close()
        finally:
            for role in roles:
                owner.execute(f"SELECT {pg_db.SCHEMA}.revoke_agent(%s)", (role,))
                admin.execute(f'DROP ROLE IF EXISTS "{role}"')
            owner.close()
