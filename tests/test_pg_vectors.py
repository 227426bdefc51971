"""Vectors on PostgreSQL equal vectors on SQLite (docs/design.md §2.3, §11).

A differential hypothesis test drives both stores with tests/test_pg_store.py's random
batches (appends, rewinds, deletes, imports, rebuilds, reindex chunks...) and, between
batches, an embedder that reads what lacks a vector from each store from its own watermark
(`pending_batch`) and stores vectors (and one for a row that is gone). It
holds equal: each `StoreVectors` ack; once each embedder is idle, the vectors stored (none
missing, none of a row off the active branch or in a dirty session) and the nearest rows
under every scope of §3 (the same ids with the same similarities).
"""

from __future__ import annotations

import hashlib
import secrets
import tempfile
import time
from typing import Any

import numpy
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pg_store import KEYS, Pair, ops, pair, scopes

from activememory.protocol.errors import InvalidInputError, StorageError
from activememory.protocol.indexer import (
    NoteFile,
    StoreVectors,
    SyncNotes,
    VectorRow,
    VectorsStored,
)
from activememory.storage import vectors as lite_vectors
from activememory.storage.notes import chunk_note, note_lines
from activememory.storage.pg import db as pg_db
from activememory.storage.pg import vectors as pg_vectors
from activememory.storage.pg.search import scope_sql as pg_scope_sql
from activememory.storage.pg.transcripts import PgTranscriptWriter
from activememory.storage.search import scope_sql as lite_scope_sql

from pg_server import fresh_agent, pg_dsn_each_path, pg_exact_dsn, pg_pgvector_dsn

# the fixtures, imported for pytest
__all__ = ["pair", "pg_dsn_each_path", "pg_exact_dsn", "pg_pgvector_dsn"]


@pytest.fixture
def pg_dsn(pg_dsn_each_path: str) -> str:
    """Every test here on both vector paths: exact, then pgvector (docs/design.md §11)."""
    return pg_dsn_each_path


DIM = 8
NAMES = ["model-a", "model-b"]


def embed(text: str) -> bytes:
    """A stand-in embedder: a unit vector decided by the text."""
    seed = int.from_bytes(hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:8])
    vector = numpy.random.default_rng(seed).standard_normal(DIM).astype("<f4")
    return lite_vectors.to_blob(vector / numpy.linalg.norm(vector))


class Embedders:
    """One embedder per store, each with its own watermark, as the embedder actor keeps."""

    def __init__(self, stores: Pair) -> None:
        self.stores = stores
        # (side, name) -> (watermark, epoch): each name is its own embedder's
        self.marks: dict[tuple[str, str], tuple[int, int | None]] = {}

    def _pending(self, side: str, name: str, limit: int) -> lite_vectors.PendingBatch:
        after, epoch = self.marks.get((side, name), (0, None))
        if side == "lite":
            return lite_vectors.pending_batch(
                self.stores.sqlite_reader.conn, name, after=after, epoch=epoch, limit=limit
            )
        return pg_vectors.pending_batch(
            self.stores.pg_reader.conn,
            self.stores.agent,
            name,
            after=after,
            epoch=epoch,
            limit=limit,
        )

    def rows(self, pending: list[tuple[int, str]], stale: bool) -> tuple[VectorRow, ...]:
        return tuple(
            VectorRow(
                id=i,
                digest=lite_vectors.text_digest(text + ("!" if stale and i % 3 == 0 else "")),
                vector=embed(text),
            )
            for i, text in pending
        )

    def step(self, name: str, stale: bool, extra: int) -> None:
        """One round on each store: read a batch, store it (plus a row that may be gone)."""
        for side in ("lite", "pg"):
            batch = self._pending(side, name, 4)
            messages = self.rows(batch.messages, stale) + self.rows([(extra, "gone")], False)
            command = StoreVectors(
                agent="main", name=name, messages=messages, notes=self.rows(batch.notes, stale)
            )
            writer = self.stores.sqlite_writer if side == "lite" else self.stores.pg_writer
            (ack,) = writer.apply([command])
            assert isinstance(ack, VectorsStored), ack
            self.marks[side, name] = (batch.scanned_to, batch.epoch)

    def drain(self, name: str) -> None:
        """Embed until neither store has anything left for `name` above its watermark,
        then check that nothing at all is pending (the watermarks skipped nothing)."""
        for _ in range(200):
            lite = self._pending("lite", name, 16)
            pg = self._pending("pg", name, 16)
            if not (lite.messages or lite.notes or pg.messages or pg.notes):
                break
            for side, batch in (("lite", lite), ("pg", pg)):
                command = StoreVectors(
                    agent="main",
                    name=name,
                    messages=self.rows(batch.messages, False),
                    notes=self.rows(batch.notes, False),
                )
                writer = self.stores.sqlite_writer if side == "lite" else self.stores.pg_writer
                (ack,) = writer.apply([command])
                assert ack == VectorsStored(
                    messages=len(batch.messages), notes=len(batch.notes), skipped=0
                )
                self.marks[side, name] = (batch.scanned_to, batch.epoch)
        assert lite_vectors.pending_count(self.stores.sqlite_reader.conn, name) == 0
        assert pg_vectors.pending_count(self.stores.pg_reader.conn, self.stores.agent, name) == 0


def stored(stores: Pair) -> tuple[set[tuple[int, str, bytes]], set[tuple[int, str, bytes]]]:
    lite = {
        (int(i), str(n), bytes(v))
        for i, n, v in stores.sqlite_reader.conn.execute(
            "SELECT event_id, name, vector FROM message_vectors"
        ).fetchall()
    }
    pg = {
        (int(i), str(n), bytes(v))
        for i, n, v in stores.pg_reader.conn.execute(
            f"SELECT event_id, name, vector FROM {pg_db.SCHEMA}.message_vectors WHERE agent = %s",
            (stores.agent,),
        ).fetchall()
    }
    return lite, pg


def off_branch_vectors(stores: Pair) -> int:
    """PostgreSQL vectors of a message not on the active branch of a clean session."""
    row = stores.pg_reader.conn.execute(
        f"SELECT count(*) FROM {pg_db.SCHEMA}.message_vectors v WHERE v.agent = %(a)s AND NOT"
        f" EXISTS (SELECT 1 FROM {pg_db.SCHEMA}.active_branch b JOIN {pg_db.SCHEMA}.sessions s"
        "  ON s.agent = b.agent AND s.id = b.session_id AND NOT s.dirty"
        "  WHERE b.agent = v.agent AND b.event_id = v.event_id AND b.session_id = v.session_id)",
        {"a": stores.agent},
    ).fetchone()
    return int(row[0]) if row else -1


def assert_equal_nearest(stores: Pair, name: str, query: bytes) -> None:
    vector = numpy.frombuffer(query, dtype="<f4")
    for scope in scopes:
        for caller in KEYS[:3]:
            for only in (None, KEYS[1]):
                sql, params = lite_scope_sql(scope, caller, only)
                lite = lite_vectors.scan_message_rows(
                    stores.sqlite_reader.conn,
                    vector,
                    name=name,
                    visible_sql=f"SELECT id FROM ({sql})",
                    visible_params={**params, "agent": "main"},
                    k=5,
                )
                pg_sql, pg_params = pg_scope_sql(stores.agent, scope, caller, only)
                pg = pg_vectors.nearest_message_rows(
                    stores.pg_reader.conn,
                    stores.agent,
                    vector,
                    name=name,
                    visible_sql=pg_sql,
                    visible_params=pg_params,
                    k=5,
                )
                assert [(r.id, r.similarity) for r in pg] == [(r.id, r.similarity) for r in lite], (
                    scope,
                    caller,
                    only,
                )


batches = st.lists(st.lists(ops, min_size=1, max_size=3), min_size=1, max_size=8)
embedding = st.tuples(st.just(NAMES[0]), st.just(False), st.integers(1, 60))


def reachable(op: tuple[Any, ...]) -> tuple[Any, ...]:
    """`op` as the reconciler can send it: a rebuild's chunks start at depth 0 (the first
    drops the session's index rows). A chunk from a later depth of a session that no
    earlier chunk of its revision dropped would publish it clean with rows unindexed, a
    state no reconciler makes, where the stores may differ on which rows want a vector
    (SQLite: every active-branch message of a clean session; PostgreSQL: every indexed
    one)."""
    if op[0] == "reindex":
        return (*op[:2], 0, *op[3:])
    return op


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    batches=batches,
    rounds=st.lists(st.lists(embedding, max_size=2), min_size=8, max_size=8),
    note=st.text(alphabet="ab #\n", max_size=80),
)
def test_vectors_follow_the_active_branches_as_on_sqlite(
    pair: Any, batches: list[list[tuple[Any, ...]]], rounds: list[Any], note: str
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        stores: Pair = pair(directory)
        embedders = Embedders(stores)
        chunks = chunk_note(note_lines(note), max_chars=20)
        notes = SyncNotes(
            agent="main",
            files=(NoteFile(path="MEMORY.md", mtime_ns=1, size=1, digest="d", chunks=chunks),),
        )
        try:
            assert stores.pg_writer.apply([notes]) == stores.sqlite_writer.apply([notes])
            for ops_of_batch, embeds in zip(batches, rounds, strict=False):
                batch = [stores.command(reachable(op)) for op in ops_of_batch]
                sqlite_acks, pg_acks = stores.apply(batch)
                assert pg_acks == sqlite_acks, batch
                assert off_branch_vectors(stores) == 0
                for name, stale, extra in embeds:
                    embedders.step(name, stale, extra)
                    assert off_branch_vectors(stores) == 0
            embedders.drain(NAMES[0])
            lite, pg = stored(stores)
            assert pg == lite
            assert_equal_nearest(stores, NAMES[0], embed("aisle seats"))
            # Another model: its embedder starts from no watermark and replaces every vector.
            embedders.drain(NAMES[1])
            lite, pg = stored(stores)
            assert pg == lite and {n for _, n, _ in pg} <= {NAMES[1]}
            assert_equal_nearest(stores, NAMES[1], embed("aisle seats"))
            lite_notes = lite_vectors.scan_note_rows(
                stores.sqlite_reader.conn,
                numpy.frombuffer(embed("a"), dtype="<f4"),
                name=NAMES[0],
                k=3,
            )
            pg_notes = pg_vectors.nearest_note_rows(
                stores.pg_reader.conn,
                stores.agent,
                numpy.frombuffer(embed("a"), dtype="<f4"),
                name=NAMES[0],
                k=3,
            )
            assert [(r.id, r.similarity) for r in pg_notes] == [
                (r.id, r.similarity) for r in lite_notes
            ]
        finally:
            stores.close()


def test_a_vector_goes_with_its_message_and_a_changed_text_is_skipped(pg_dsn: str) -> None:
    import activememory as am
    from activememory.protocol.indexer import AppendMessage, DeleteSession, RewindSession

    agent = fresh_agent()
    writer = PgTranscriptWriter(pg_db.connect(pg_db.PgSettings(dsn=pg_dsn)), agent)
    key = am.parse_session_key("agent:main:direct:alice")
    acks = writer.apply(
        [
            AppendMessage(key=key, message=am.Message(role="user", content=text), at=1.0)
            for text in ("aisle seats", "window seats")
        ]
    )
    first, second = (a.event.id for a in acks)  # type: ignore[attr-defined]

    def row(event_id: int, text: str) -> VectorRow:
        return VectorRow(id=event_id, digest=lite_vectors.text_digest(text), vector=embed(text))

    store = StoreVectors(
        agent="main", name="m", messages=(row(first, "aisle seats"), row(second, "edited"))
    )
    assert writer.apply([store]) == [VectorsStored(messages=1, notes=0, skipped=1)]

    def count(table: str) -> int:
        found = writer.conn.execute(
            f"SELECT count(*) FROM {pg_db.SCHEMA}.{table} WHERE agent = %s", (agent,)
        ).fetchone()
        return int(found[0]) if found else -1

    def epoch() -> int:
        found = writer.conn.execute(
            f"SELECT epoch FROM {pg_db.SCHEMA}.vector_epochs WHERE agent = %s", (agent,)
        ).fetchone()
        return int(found[0]) if found else 0

    assert (count("message_vectors"), count("vector_cache")) == (1, 1)
    before = epoch()
    # A rewind makes the session dirty: its vectors go in that transaction.
    assert writer.apply([RewindSession(key=key, to_event_id=first, at=2.0)])
    assert count("message_vectors") == 0 and epoch() > before
    assert count("vector_cache") == 1  # the cache keeps it for the rebuild
    writer.apply([DeleteSession(key=key)])
    assert count("message_vectors") == 0
    writer.conn.close()


def test_a_query_of_other_dimensions_is_refused(pg_dsn: str) -> None:
    with pytest.raises(ValueError, match="query_vec: expected 8 dimensions, got 3"):
        pg_vectors._top_k([(1, embed("x"))], numpy.ones(3, dtype="<f4"), 1)


def test_the_watermark_waits_for_a_transaction_in_flight(pg_dsn: str) -> None:
    # Event ids come from one sequence drawn by several processes: while another
    # transaction of the database is in flight it may still commit an id below the ones
    # seen, so the watermark stays where it was; once it ends, the watermark moves on.
    import activememory as am
    from activememory.protocol.indexer import AppendMessage

    settings_ = pg_db.PgSettings(dsn=pg_dsn)
    agent = fresh_agent()
    writer = PgTranscriptWriter(pg_db.connect(settings_), agent)
    reader = pg_db.connect(settings_)
    reader.autocommit = True
    other = pg_db.connect(settings_)
    key = am.parse_session_key("agent:main:direct:dana")

    def append(text: str) -> int:
        (ack,) = writer.apply(
            [AppendMessage(key=key, message=am.Message(role="user", content=text), at=1.0)]
        )
        return int(ack.event.id)  # type: ignore[attr-defined]

    def settled(after: int, epoch: int | None) -> lite_vectors.PendingBatch:
        # Another database's transaction that ended between the snapshot and the look at
        # pg_stat_activity also holds the watermark: on a busy server, ask again.
        for _ in range(100):
            found = pg_vectors.pending_batch(reader, agent, "m", after=after, epoch=epoch, limit=10)
            if found.scanned_to > after:
                return found
            time.sleep(0.02)
        raise AssertionError("the watermark never moved")

    first = append("one")
    batch = settled(0, None)
    assert [i for i, _ in batch.messages] == [first] and batch.scanned_to >= first
    with other.transaction():
        other.execute("SELECT pg_current_xact_id()")  # a writer in flight in this database
        second = append("two")
        held = pg_vectors.pending_batch(
            reader, agent, "m", after=batch.scanned_to, epoch=batch.epoch, limit=10
        )
        assert [i for i, _ in held.messages] == [second]
        assert held.scanned_to == batch.scanned_to  # not past what may still commit
    moved = settled(held.scanned_to, held.epoch)
    assert [i for i, _ in moved.messages] == [second] and moved.scanned_to >= second
    for conn in (writer.conn, reader, other):
        conn.close()


# --- The two vector paths (docs/design.md §11 "Vectors with pgvector") -----------------------


def _store_one(dsn: str, agent: str, texts: list[str], name: str = "m") -> PgTranscriptWriter:
    """A writer of `agent` with one session of `texts`, each with its vector of `name`."""
    import activememory as am
    from activememory.protocol.indexer import AppendMessage

    writer = PgTranscriptWriter(pg_db.connect(pg_db.PgSettings(dsn=dsn)), agent)
    key = am.parse_session_key("agent:main:direct:alice")
    acks = writer.apply(
        [AppendMessage(key=key, message=am.Message(role="user", content=t), at=1.0) for t in texts]
    )
    rows = tuple(
        VectorRow(id=a.event.id, digest=lite_vectors.text_digest(t), vector=embed(t))  # type: ignore[attr-defined]
        for a, t in zip(acks, texts, strict=True)
    )
    store = StoreVectors(agent="main", name=name, messages=rows)
    assert writer.apply([store]) == [VectorsStored(messages=len(texts), notes=0, skipped=0)]
    return writer


def _nearest(conn: Any, agent: str, query: numpy.ndarray, k: int) -> list[Any]:
    sql, params = pg_scope_sql(agent, "all", "agent:main:direct:alice", None)  # type: ignore[arg-type]
    return pg_vectors.nearest_message_rows(
        conn, agent, query, name="m", visible_sql=sql, visible_params=params, k=k
    )


def test_the_store_records_its_vector_path_and_every_worker_keeps_it(
    pg_dsn: str, request: pytest.FixtureRequest
) -> None:
    path = request.node.callspec.params["pg_dsn_each_path"]
    conn = pg_db.connect(pg_db.PgSettings(dsn=pg_dsn))  # auto: whatever was chosen
    assert pg_vectors.uses_pgvector(conn) == (path == "pgvector")
    conn.close()
    other = "off" if path == "pgvector" else "on"
    with pytest.raises(StorageError, match=f"storage.pgvector: {other}, but this store was"):
        pg_db.connect(pg_db.PgSettings(dsn=pg_dsn, pgvector=other))
    with pytest.raises(StorageError, match=f"storage.pgvector: {other}, but this store was"):
        pg_db.connect(pg_db.PgSettings(dsn=pg_dsn, pgvector=other, readonly=True))


def test_the_recorded_path_is_read_once_per_connection(pg_dsn: str) -> None:
    # Every vector read and write asks which path the store took; the answer never changes
    # once recorded, so a connection reads it once (the row hidden afterwards changes nothing).
    conn = pg_db.connect(pg_db.PgSettings(dsn=pg_dsn))
    try:
        first = pg_vectors.uses_pgvector(conn)
        with conn.transaction(force_rollback=True):
            conn.execute(
                f"DELETE FROM {pg_db.SCHEMA}.activememory_meta WHERE key = %s",
                (pg_db.VECTOR_SEARCH_KEY,),
            )
            assert pg_vectors.uses_pgvector(conn) == first
    finally:
        conn.close()


def test_a_bad_pgvector_setting_names_the_key() -> None:
    with pytest.raises(
        InvalidInputError, match="storage.pgvector: expected auto, on or off, got 'yes'"
    ):
        pg_db.PgSettings(dsn="postgresql://h/db", pgvector="yes")


def test_the_pgvector_path_ranks_in_sql_as_the_exact_path_ranks(pg_pgvector_dsn: str) -> None:
    # Ties included: a text stored twice has one vector, and the newer row ranks first.
    agent = fresh_agent()
    texts = [f"seat {i % 7}" for i in range(30)]
    writer = _store_one(pg_pgvector_dsn, agent, texts)
    rows = writer.conn.execute(
        f"SELECT event_id, vector, embedding::text FROM {pg_db.SCHEMA}.message_vectors"
        " WHERE agent = %s",
        (agent,),
    ).fetchall()
    for _, blob, text in rows:  # the same numbers, bit for bit
        assert numpy.array_equal(
            numpy.array(text.strip("[]").split(","), dtype="<f4"), numpy.frombuffer(blob, "<f4")
        )
    query = numpy.frombuffer(embed("seat 3"), dtype="<f4")
    for k in (1, 5, 30):
        assert _plain(_nearest(writer.conn, agent, query, k)) == _top_k_of(rows, query, k)
    writer.conn.close()


def _top_k_of(rows: list[Any], query: numpy.ndarray, k: int) -> list[Any]:
    """The exact path's ranking of these (id, bytes) rows, as `_plain`."""
    return _plain(pg_vectors._top_k([(i, bytes(b)) for i, b, *_ in rows], query, k))


def _plain(near: list[Any]) -> list[tuple[int, float, bytes]]:
    return [(row.id, row.similarity, row.vector.tobytes()) for row in near]


def test_a_query_of_other_dimensions_is_refused_on_each_path(pg_dsn: str) -> None:
    agent = fresh_agent()
    writer = _store_one(pg_dsn, agent, ["aisle seats"])
    with pytest.raises(ValueError, match="query_vec: expected 8 dimensions, got 3"):
        _nearest(writer.conn, agent, numpy.ones(3, dtype="<f4") / 3**0.5, 5)
    writer.conn.close()


def test_a_bound_worker_stores_and_ranks_on_the_pgvector_path(pg_pgvector_dsn: str) -> None:
    # A worker under row security (docs/design.md §11) writes the embedding column too.
    import psycopg
    import psycopg.conninfo

    from pg_server import ADMIN_DSN

    role, agent, name = f"am_pgv_{secrets.token_hex(4)}", fresh_agent(), "space-of-a-worker"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            owner = pg_db.connect(pg_db.PgSettings(dsn=pg_pgvector_dsn))
            owner.execute(f"SELECT {pg_db.SCHEMA}.grant_agent(%s, %s)", (role, agent))
            owner.commit()
            worker_dsn = psycopg.conninfo.make_conninfo(pg_pgvector_dsn, user=role)
            writer = _store_one(worker_dsn, agent, ["aisle seats", "window seats"], name)
            assert pg_vectors.uses_pgvector(writer.conn)
            query = numpy.frombuffer(embed("aisle seats"), dtype="<f4")
            near = pg_vectors.nearest_message_rows(
                writer.conn,
                agent,
                query,
                name=name,
                visible_sql=_all_sessions(agent),
                visible_params={},
                k=1,
            )
            assert near[0].similarity == pytest.approx(1.0)
            writer.conn.close()
            owner.execute(f"SELECT {pg_db.SCHEMA}.revoke_agent(%s)", (role,))
            owner.commit()
            owner.close()
        finally:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def _all_sessions(agent: str) -> str:
    return f"SELECT id, dirty FROM {pg_db.SCHEMA}.sessions WHERE agent = '{agent}'"


def test_a_role_that_may_not_create_pgvector_gets_the_exact_path_or_a_clear_error() -> None:
    # auto: the server decides who may create the extension (a superuser, for pgvector);
    # on: its refusal, quoted, naming the key.
    import psycopg
    import psycopg.conninfo

    from pg_server import ADMIN_DSN, scratch_database

    role = f"am_pgv_{secrets.token_hex(4)}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        if (
            admin.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
            is None
        ):
            pytest.skip("the server has no vector extension: nothing to refuse")
        admin.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            for setting in ("auto", "on"):
                with scratch_database() as dsn:
                    admin.execute(
                        f'ALTER DATABASE "{psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]}" OWNER TO "{role}"'
                    )
                    settings_ = pg_db.PgSettings(
                        dsn=psycopg.conninfo.make_conninfo(dsn, user=role), pgvector=setting
                    )
                    if setting == "auto":
                        conn = pg_db.connect(settings_)
                        assert not pg_vectors.uses_pgvector(conn)
                        conn.close()
                    else:
                        with pytest.raises(
                            StorageError,
                            match="storage.pgvector: on, but the vector extension cannot be"
                            " created here: permission denied",
                        ):
                            pg_db.connect(settings_)
        finally:
            admin.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_a_store_made_before_the_pgvector_step_gets_its_vectors_as_embeddings() -> None:
    from pg_server import scratch_database

    with scratch_database() as dsn, pytest.MonkeyPatch.context() as patch:
        patch.setattr(pg_db, "STEPS", pg_db.STEPS[:5])
        patch.setattr(pg_db, "SCHEMA_VERSION", 5)
        agent = fresh_agent()
        writer = _store_one(dsn, agent, [f"seat {i}" for i in range(12)])
        writer.conn.close()
        patch.undo()
        try:
            conn = pg_db.connect(pg_db.PgSettings(dsn=dsn, pgvector="on"))
        except StorageError as exc:
            pytest.skip(f"the pgvector path needs the vector extension on the server: {exc}")
        assert pg_db.schema_version(conn) == pg_db.SCHEMA_VERSION and pg_vectors.uses_pgvector(conn)
        rows = conn.execute(
            f"SELECT event_id, vector, embedding::text FROM {pg_db.SCHEMA}.message_vectors"
            " WHERE agent = %s",
            (agent,),
        ).fetchall()
        assert len(rows) == 12
        for _, blob, text in rows:  # backfilled in SQL from the bytes, bit for bit
            assert numpy.array_equal(
                numpy.array(text.strip("[]").split(","), dtype="<f4"),
                numpy.frombuffer(blob, "<f4"),
            )
        query = numpy.frombuffer(embed("seat 4"), dtype="<f4")
        assert _plain(_nearest(conn, agent, query, 5)) == _top_k_of(rows, query, 5)
        conn.close()


def test_ties_past_the_rows_fetched_rank_newest_first_on_each_path(pg_dsn: str) -> None:
    # One vector stored 40 times: more ties than the pgvector path fetches at first.
    agent = fresh_agent()
    writer = _store_one(pg_dsn, agent, ["same seat"] * 40 + ["other"])
    ids = [
        int(i)
        for (i,) in writer.conn.execute(
            f"SELECT event_id FROM {pg_db.SCHEMA}.message_vectors WHERE agent = %s"
            " ORDER BY event_id DESC",
            (agent,),
        ).fetchall()
    ]
    query = numpy.frombuffer(embed("same seat"), dtype="<f4")
    near = _nearest(writer.conn, agent, query, 5)
    assert [row.id for row in near] == ids[1:6]  # the newest of the ties ("other" is last)
    writer.conn.close()


@pytest.mark.anyio
async def test_the_config_key_reaches_the_store(pg_exact_dsn: str, tmp_path: Any) -> None:
    import activememory as am

    config = {"storage": {"backend": "postgresql", "dsn": pg_exact_dsn, "pgvector": "on"}}
    with pytest.raises(am.StorageError, match="storage.pgvector: on, but this store was created"):
        async with am.open_memory(tmp_path / "s", config=config):
            pass
