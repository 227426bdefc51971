"""Erasing an identity on PostgreSQL equals erasing it on SQLite (docs/design.md §2.6, §11).

A differential hypothesis test builds the same store on both (tests/test_pg_store.py's
random batches, switch rows of keys with no session, vectors for every indexed message and
the content-hash cache), erases a random identity (`PrivateScope`: peers, owner) on both,
and holds equal: the dry run's plan, the `Erased` ack (sessions, events, index rows,
vectors, cached vectors, switches, purged), and everything left (sessions, histories,
switches, counts, vectors, cache). Then: the erase is one transaction, the erased text is
found by no search, and another agent's rows are untouched.
"""

from __future__ import annotations

import tempfile
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pg_store import Pair, ops, pair
from test_pg_vectors import embed, stored

import activememory as am
from activememory.protocol.config import PrivateScope
from activememory.protocol.indexer import (
    AppendMessage,
    Erased,
    EraseIdentity,
    NoteChunk,
    NoteFile,
    Rejected,
    SetSwitches,
    StoreVectors,
    SyncNotes,
    VectorRow,
)
from activememory.storage import userdata as lite_userdata
from activememory.storage import vectors as lite_vectors
from activememory.storage.fts_query import plan_match
from activememory.storage.pg import db as pg_db
from activememory.storage.pg import userdata as pg_userdata
from activememory.storage.pg import vectors as pg_vectors
from activememory.storage.pg.search import search_scope
from activememory.storage.pg.transcripts import PgTranscriptReader, PgTranscriptWriter

from pg_server import fresh_agent, pg_dsn

__all__ = ["pair", "pg_dsn"]  # the fixtures, imported for pytest

identities = st.builds(
    PrivateScope,
    peers=st.one_of(st.none(), st.sampled_from([("alice",), ("bob",), ("alice", "bob")])),
    owner=st.booleans(),
)
switch_only = st.sampled_from(
    [
        "agent:main:direct:alice",
        "agent:main:direct:carol",
        "agent:main:explicit:x",
        "agent:main:main",
    ]
)


def embed_all(stores: Pair) -> None:
    """Every pending message and chunk gets its vector on both stores."""
    lite = lite_vectors.pending_batch(
        stores.sqlite_reader.conn, "m", after=0, epoch=None, limit=10_000
    )
    pg = pg_vectors.pending_batch(
        stores.pg_reader.conn, stores.agent, "m", after=0, epoch=None, limit=10_000
    )
    assert sorted(pg.messages) == sorted(lite.messages)
    rows = tuple(
        VectorRow(id=i, digest=lite_vectors.text_digest(t), vector=embed(t))
        for i, t in lite.messages
    )
    notes = tuple(
        VectorRow(id=i, digest=lite_vectors.text_digest(t), vector=embed(t)) for i, t in lite.notes
    )
    command = StoreVectors(agent="main", name="m", messages=rows, notes=notes)
    assert stores.pg_writer.apply([command]) == stores.sqlite_writer.apply([command])


def cache(stores: Pair) -> tuple[set[bytes], set[bytes]]:
    lite = {
        bytes(d) for (d,) in stores.sqlite_reader.conn.execute("SELECT digest FROM vector_cache")
    }
    pg = {
        bytes(d)
        for (d,) in stores.pg_reader.conn.execute(
            f"SELECT digest FROM {pg_db.SCHEMA}.vector_cache WHERE agent = %s", (stores.agent,)
        ).fetchall()
    }
    return lite, pg


NOTE = SyncNotes(
    agent="main",
    files=(
        NoteFile(
            path="MEMORY.md",
            mtime_ns=1,
            size=1,
            digest="d",
            chunks=(NoteChunk(start_line=1, end_line=1, text="aisle seats"),),
        ),
    ),
)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=st.lists(st.lists(ops, min_size=1, max_size=3), min_size=1, max_size=6),
    switches=st.lists(switch_only, max_size=2),
    identity=identities,
)
def test_an_erase_removes_the_same_rows_as_on_sqlite(
    pair: Any, batches: list[list[tuple[Any, ...]]], switches: list[str], identity: PrivateScope
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        stores: Pair = pair(directory)
        try:
            assert stores.pg_writer.apply([NOTE]) == stores.sqlite_writer.apply([NOTE])
            for ops_of_batch in batches:
                sqlite_acks, pg_acks = stores.apply([stores.command(op) for op in ops_of_batch])
                assert pg_acks == sqlite_acks
            setting = [SetSwitches(key=am.parse_session_key(k), verbose=True) for k in switches]
            if setting:
                assert stores.pg_writer.apply(setting) == stores.sqlite_writer.apply(setting)
            embed_all(stores)
            lite_plan = lite_userdata.plan_erasure(stores.sqlite_reader.conn, "main", identity)
            pg_plan = pg_userdata.plan_erasure(
                stores.pg_reader.conn, stores.agent, identity, agent="main"
            )
            if pg_plan.erasure != lite_plan.erasure:
                print(
                    "FAILING2",
                    batches,
                    switches,
                    identity,
                    pg_plan.erasure,
                    lite_plan.erasure,
                    flush=True,
                )
            assert pg_plan.erasure == lite_plan.erasure
            assert sorted(pg_plan.digests) == sorted(lite_plan.digests)
            erase = EraseIdentity(agent="main", sessions=identity)
            (lite_ack,) = stores.sqlite_writer.apply([erase])
            (pg_ack,) = stores.pg_writer.apply([erase])
            assert isinstance(pg_ack, Erased) and pg_ack.erasure.purged, pg_ack
            assert pg_ack == lite_ack
            stores.assert_equal_state()
            lite, pg = stored(stores)
            assert pg == lite
            lite_cache, pg_cache = cache(stores)
            assert pg_cache == lite_cache
            # Nothing of the identity is left to plan.
            again = pg_userdata.plan_erasure(stores.pg_reader.conn, stores.agent, identity)
            assert (again.erasure.session_keys, again.erasure.switches) == ((), 0)
        finally:
            stores.close()


def test_the_erased_text_is_found_nowhere_and_other_agents_keep_theirs(pg_dsn: str) -> None:
    settings_ = pg_db.PgSettings(dsn=pg_dsn)
    mine, other = fresh_agent(), fresh_agent()
    dana = am.parse_session_key("agent:main:direct:dana")
    eve = am.parse_session_key("agent:main:direct:eve")
    for agent in (mine, other):
        writer = PgTranscriptWriter(pg_db.connect(settings_), agent)
        writer.apply(
            [
                AppendMessage(key=key, message=am.Message(role="user", content=text), at=1.0)
                for key, text in ((dana, "zanzibar trip"), (eve, "zanzibar too"))
            ]
        )
        writer.conn.close()
    writer = PgTranscriptWriter(pg_db.connect(settings_), mine)
    (ack,) = writer.apply(
        [EraseIdentity(agent="main", sessions=PrivateScope(peers=("dana",), owner=False))]
    )
    assert isinstance(ack, Erased)
    assert (ack.erasure.session_keys, ack.erasure.events, ack.erasure.index_rows) == (
        (dana.raw,),
        1,
        1,
    )
    assert ack.erasure.purged and ack.erasure.problem is None
    plan = plan_match("zanzibar")
    assert plan is not None
    for agent, texts in ((mine, {"zanzibar too"}), (other, {"zanzibar trip", "zanzibar too"})):
        reader = PgTranscriptReader(pg_db.connect(settings_), agent)
        page = search_scope(
            reader.conn, agent, plan, scope="all", caller=dana.raw, session_key=None, keep=10
        )
        assert {c.text for c in page.candidates} == texts
        reader.conn.close()
    writer.conn.close()


def test_an_erase_that_fails_leaves_everything(pg_dsn: str) -> None:
    # One transaction: a failure after the sessions were deleted rolls all of it back.
    agent = fresh_agent()
    settings_ = pg_db.PgSettings(dsn=pg_dsn)
    writer = PgTranscriptWriter(pg_db.connect(settings_), agent)
    key = am.parse_session_key("agent:main:direct:dana")
    writer.apply([AppendMessage(key=key, message=am.Message(role="user", content="x"), at=1.0)])
    writer.conn.execute(
        f"CREATE FUNCTION {pg_db.SCHEMA}.fail_{agent}() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN RAISE EXCEPTION 'cache refused'; END $$"
    )
    writer.conn.execute(
        f"CREATE TRIGGER fail_{agent} BEFORE DELETE ON {pg_db.SCHEMA}.vector_cache"
        f" FOR EACH STATEMENT EXECUTE FUNCTION {pg_db.SCHEMA}.fail_{agent}()"
    )
    try:
        (ack,) = writer.apply(
            [EraseIdentity(agent="main", sessions=PrivateScope(peers=None, owner=True))]
        )
        assert isinstance(ack, Rejected) and "cache refused" in ack.message
        reader = PgTranscriptReader(pg_db.connect(settings_), agent)
        history = reader.history(key.raw)
        assert history is not None and [e.message.content for e in history] == ["x"]
        reader.conn.close()
    finally:
        writer.conn.execute(f"DROP TRIGGER fail_{agent} ON {pg_db.SCHEMA}.vector_cache")
        writer.conn.execute(f"DROP FUNCTION {pg_db.SCHEMA}.fail_{agent}()")
        writer.conn.close()
