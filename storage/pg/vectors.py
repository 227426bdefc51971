"""Vectors on PostgreSQL (docs/design.md §2.3, §11): the twin of storage/vectors.py.

Tables, keyed by agent first: `message_vectors(agent, event_id)`, `note_vectors(agent,
chunk_id)` (one vector of one embedder `name` per row, float32 little-endian as on SQLite,
`bytea`), `vector_cache(agent, digest, name)` and `vector_epochs(agent)`.

Consistency is kept by the schema, so no write path of storage/pg/transcripts.py has to
remember it (several processes write one agent):

- a message's vector references its index row (`message_index`, foreign key `ON DELETE
  CASCADE`), a chunk's vector its chunk: whatever deletes an index row or a chunk (a
  delete, a rebuild, an agent-wide reindex, an erase, a note changed) deletes its vector
  in that statement;
- a session row turning dirty deletes its vectors (trigger `vectors_of_dirty`), in the
  transaction that made it dirty (the writer writes its session rows before it commits,
  and before any `StoreVectors` reads them);
- the agent's epoch is bumped when a session turns clean and when vectors are deleted
  (triggers): old messages may need vectors again, so the embedder actor rescans.

`apply_store_vectors` stores a message's vector only if, in the writer's transaction, the
message has an index row in a clean session (exactly: on the active branch of a clean
session, with text) and its text is the one embedded; a chunk's only if the chunk still
has that text. Both stores give the same `VectorsStored` (tests/test_pg_vectors.py).

Search takes the path the store recorded when it was created (storage/pg/db.py
`choose_vector_search`, docs/design.md §11 "Vectors with pgvector"):

- exact (no pgvector): exact scoring over the caller's visible candidates. The visible
  sessions are the caller's scope SQL (storage/pg/search.py `scope_sql`), clean ones only,
  and their vectors of `name` are read in one query and ranked by storage/vector_index.py's
  `pick`, the SQLite plain scan's own ranking (the same rows, the same numbers). Bounded:
  at most `MAX_SCANNED` rows are scored per query, the newest (largest event ids) of the
  visible ones; measured in docs/design.md §11.
- pgvector: every vector table also holds the vector as pgvector's `vector` (`embedding`,
  written by the same statement as the bytes). SQL ranks the visible rows by inner product
  (`<#>`: the vectors are unit length, so it is the cosine) under the same WHERE as the
  exact path, ties newest first, and only the best `k + RERANKED` rows cross the wire;
  `pick` then orders them exactly as above. Exact, with no index: an HNSW index was
  measured and left out (approximate; docs/design.md §11 "Vectors with pgvector").
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast

import numpy
import psycopg
from psycopg import pq
from psycopg.adapt import Dumper

from ...protocol.indexer import IndexerAck, StoreVectors, VectorsStored
from ..vector_index import Near, pick, products, rounding_margin
from ..vectors import PendingBatch, from_blobs, text_digest
from .db import SCHEMA, VECTOR_SEARCH_KEY
from .transcripts import Connection, _text

__all__ = ["MAX_SCANNED", "Near"]

_S = SCHEMA
MAX_SCANNED = 100_000
"""The most visible vectors one query scores on the exact path (the newest): bounds a
search's time and memory (measured in docs/design.md §11 "Notes, vectors and erase")."""
RERANKED = 16
"""pgvector path: rows fetched beyond `k`, so rows SQL ranks within float32 rounding of the
k-th are rescored by `pick` as the exact path rescores them."""


def vectors_ddl() -> str:
    """The vector tables and the triggers that keep them consistent (a schema step)."""
    return f"""
CREATE TABLE {_S}.message_vectors(
    agent text NOT NULL,
    event_id bigint NOT NULL,
    session_id bigint NOT NULL,
    name text NOT NULL,
    vector bytea NOT NULL,
    PRIMARY KEY (agent, event_id),
    FOREIGN KEY (agent, event_id) REFERENCES {_S}.message_index(agent, event_id)
        ON DELETE CASCADE
);
-- A scope's rows by (session, name), their ids in the index: the bound picks the newest
-- ids without reading a vector (storage/pg/vectors.py `nearest_message_rows`).
CREATE INDEX message_vectors_scope ON {_S}.message_vectors(agent, session_id, name, event_id);
CREATE TABLE {_S}.note_vectors(
    agent text NOT NULL,
    chunk_id bigint NOT NULL,
    name text NOT NULL,
    vector bytea NOT NULL,
    PRIMARY KEY (agent, chunk_id),
    FOREIGN KEY (agent, chunk_id) REFERENCES {_S}.note_chunks(agent, id) ON DELETE CASCADE
);
CREATE TABLE {_S}.vector_cache(
    agent text NOT NULL,
    digest bytea NOT NULL,
    name text NOT NULL,
    vector bytea NOT NULL,
    PRIMARY KEY (agent, digest, name)
);
-- Bumped when old messages may need vectors again: the embedder actor then rescans.
CREATE TABLE {_S}.vector_epochs(
    agent text NOT NULL,
    epoch bigint NOT NULL,
    PRIMARY KEY (agent)
);
CREATE FUNCTION {_S}.bump_vector_epoch(agent_id text) RETURNS void LANGUAGE sql AS $$
    INSERT INTO {_S}.vector_epochs(agent, epoch) VALUES (agent_id, 1)
    ON CONFLICT (agent) DO UPDATE SET epoch = {_S}.vector_epochs.epoch + 1
$$;
CREATE FUNCTION {_S}.drop_dirty_vectors() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {_S}.message_vectors WHERE agent = NEW.agent AND session_id = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER vectors_of_dirty AFTER UPDATE OF dirty ON {_S}.sessions
    FOR EACH ROW WHEN (NEW.dirty AND NOT OLD.dirty)
    EXECUTE FUNCTION {_S}.drop_dirty_vectors();
CREATE FUNCTION {_S}.epoch_of_clean() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {_S}.bump_vector_epoch(NEW.agent);
    RETURN NULL;
END $$;
CREATE TRIGGER epoch_of_clean AFTER UPDATE OF dirty ON {_S}.sessions
    FOR EACH ROW WHEN (OLD.dirty AND NOT NEW.dirty)
    EXECUTE FUNCTION {_S}.epoch_of_clean();
CREATE FUNCTION {_S}.epoch_of_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {_S}.bump_vector_epoch(g.agent) FROM (SELECT DISTINCT agent FROM gone) g;
    RETURN NULL;
END $$;
CREATE TRIGGER epoch_of_deleted AFTER DELETE ON {_S}.message_vectors
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION {_S}.epoch_of_deleted();
"""


# -- pgvector (docs/design.md §11 "Vectors with pgvector") --------------------------------

# A schema step: nothing unless the store chose pgvector (storage/pg/db.py records the
# choice before the steps run). The type is named in the extension's own schema, wherever
# a DBA put it; the queries below name it unqualified (it must be on the search_path).
_PGVECTOR_DDL = """
DO $step$
DECLARE ext name; t text;
BEGIN
    IF (SELECT value FROM @S@.activememory_meta WHERE key = '@KEY@')
       IS DISTINCT FROM 'pgvector' THEN
        RETURN;
    END IF;
    SELECT extnamespace::regnamespace::name INTO ext FROM pg_extension WHERE extname = 'vector';
    -- float32 little-endian bytes as a vector, bit for bit: the backfill of a store that
    -- had vectors before this step (writers send `embedding` themselves).
    EXECUTE format($f$
        CREATE FUNCTION @S@.vector_of(bytes bytea) RETURNS %1$I.vector
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
            SELECT array_agg(
                CASE WHEN e = 0 THEN m * 2.0::float8 ^ -149
                     ELSE (m + 8388608) * 2.0::float8 ^ (e - 150) END
                * CASE WHEN s = 1 THEN -1 ELSE 1 END ORDER BY i)::real[]::%1$I.vector
            FROM (SELECT i, (w >> 31) & 1 AS s, (w >> 23) & 255 AS e, w & 8388607 AS m
                  FROM (SELECT i, get_byte(bytes, 4 * i)::bigint
                          | (get_byte(bytes, 4 * i + 1)::bigint << 8)
                          | (get_byte(bytes, 4 * i + 2)::bigint << 16)
                          | (get_byte(bytes, 4 * i + 3)::bigint << 24) AS w
                        FROM generate_series(0, length(bytes) / 4 - 1) i) x) y
        $$$f$, ext);
    FOREACH t IN ARRAY ARRAY['message_vectors', 'note_vectors', 'record_vectors'] LOOP
        EXECUTE format('ALTER TABLE @S@.%I ADD COLUMN embedding %I.vector', t, ext);
        -- Kept in the row (MAIN), so a row too big for a page moves the bytes out to
        -- TOAST instead: ranking reads every visible embedding, the bytes only of the top k.
        EXECUTE format('ALTER TABLE @S@.%I ALTER COLUMN embedding SET STORAGE MAIN', t);
        EXECUTE format('UPDATE @S@.%I SET embedding = @S@.vector_of(vector)', t);
        -- NOT NULL: a writer that forgot the vector fails instead of hiding its row
        EXECUTE format('ALTER TABLE @S@.%I ALTER COLUMN embedding SET NOT NULL', t);
    END LOOP;
END $step$;
"""


def pgvector_ddl() -> str:
    """The pgvector step of storage/pg/db.py: the `embedding` columns (backfilled), when
    the store chose pgvector; nothing otherwise."""
    return _PGVECTOR_DDL.replace("@S@", _S).replace("@KEY@", VECTOR_SEARCH_KEY)


# The recorded path of each connection's store, once read: it never changes once recorded
# (a contradicting setting is refused, docs/design.md §11), and every vector read and write
# asks. Not remembered while nothing is recorded (a store another process has not upgraded).
_recorded_paths: weakref.WeakKeyDictionary[Connection, bool] = weakref.WeakKeyDictionary()


def uses_pgvector(conn: Connection) -> bool:
    """Whether this store ranks vectors with pgvector (its recorded choice, one row, read
    once per connection)."""
    known = _recorded_paths.get(conn)
    if known is not None:
        return known
    row = conn.execute(
        f"SELECT value FROM {_S}.activememory_meta WHERE key = %s", (VECTOR_SEARCH_KEY,)
    ).fetchone()
    if row is None:
        return False
    recorded: bool = row[0] == "pgvector"
    _recorded_paths[conn] = recorded
    return recorded


class Embedding(bytes):
    """A vector in pgvector's binary format (`vector_recv`: dimensions, a zero, then
    big-endian float32s), sent as a binary parameter the server reads as `vector`."""

    @classmethod
    def of(cls, blob: bytes) -> Embedding:
        """From the store's float32 little-endian bytes: the same numbers, bit for bit."""
        values = numpy.frombuffer(blob, dtype="<f4")
        return cls(struct.pack(">HH", len(values), 0) + values.astype(">f4").tobytes())


class _EmbeddingDumper(Dumper):
    format = pq.Format.BINARY
    # oid 0: the server takes the type from the statement's `%s::vector`, so no lookup of
    # the extension's type oid is needed.

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


def embedding_sql(pgvector: bool) -> tuple[str, str, str]:
    """The `embedding` column's parts of a vector upsert (column list, value, update), on
    the pgvector path; empty on the exact path."""
    if not pgvector:
        return "", "", ""
    return ", embedding", ", %s::vector", ", embedding = excluded.embedding"


def embedding_cursor(conn: Connection, *, binary: bool = False) -> psycopg.Cursor[Any]:
    """A cursor that sends `Embedding` parameters as pgvector's binary `vector`."""
    cur = conn.cursor(binary=binary)
    cur.adapters.register_dumper(Embedding, _EmbeddingDumper)
    return cur


# -- the writer's half (inside the writer's transaction) ----------------------------------

# A message with an index row in a clean session: on its active branch, with text.
_INDEXED_IN_CLEAN = (
    f"SELECT i.event_id, i.session_id, e.text FROM {_S}.message_index i"
    f" JOIN {_S}.sessions s ON s.agent = i.agent AND s.id = i.session_id AND NOT s.dirty"
    f" JOIN {_S}.events e ON e.agent = i.agent AND e.id = i.event_id"
    " WHERE i.agent = %s AND i.event_id = ANY(%s)"
)
_CACHE = (
    f"INSERT INTO {_S}.vector_cache(agent, digest, name, vector) VALUES (%s, %s, %s, %s)"
    " ON CONFLICT DO NOTHING"
)


def apply_store_vectors(conn: Connection, agent: str, cmd: StoreVectors) -> IndexerAck:
    """The writer's handler of `StoreVectors` (storage/vectors.py `apply_store_vectors`):
    store what still holds, cache every vector whose text is still stored.

    The caller has written its session rows first, so `sessions.dirty` is current.
    """
    found = {
        int(i): (int(sid), _text(text))
        for i, sid, text in conn.execute(
            _INDEXED_IN_CLEAN, (agent, [row.id for row in cmd.messages])
        ).fetchall()
    }
    missed = [row.id for row in cmd.messages if row.id not in found]
    stored_texts = {
        int(i): _text(text)
        for i, text in conn.execute(
            f"SELECT id, text FROM {_S}.events WHERE agent = %s AND id = ANY(%s)"
            " AND text IS NOT NULL",
            (agent, missed),
        ).fetchall()
    }
    chunks = {
        int(i): _text(text)
        for i, text in conn.execute(
            f"SELECT id, text FROM {_S}.note_chunks WHERE agent = %s AND id = ANY(%s)",
            (agent, [row.id for row in cmd.notes]),
        ).fetchall()
    }
    cache: list[tuple[object, ...]] = []
    message_rows: list[tuple[object, ...]] = []
    note_rows: list[tuple[object, ...]] = []
    skipped = 0
    for row in cmd.messages:
        hit = found.get(row.id)
        if hit is None or text_digest(hit[1]) != row.digest:
            skipped += 1
            text = stored_texts.get(row.id) if hit is None else hit[1]
            if text is not None and text_digest(text) == row.digest:
                cache.append((agent, row.digest, cmd.name, row.vector))  # off the branch now
            continue
        cache.append((agent, row.digest, cmd.name, row.vector))
        message_rows.append((agent, row.id, hit[0], cmd.name, row.vector))
    for row in cmd.notes:
        text = chunks.get(row.id)
        if text is None or text_digest(text) != row.digest:
            skipped += 1
            continue
        cache.append((agent, row.digest, cmd.name, row.vector))
        note_rows.append((agent, row.id, cmd.name, row.vector))
    pgvector = uses_pgvector(conn)
    if pgvector:  # each row's bytes also as pgvector's `vector`
        message_rows = [(*row, Embedding.of(cast(bytes, row[-1]))) for row in message_rows]
        note_rows = [(*row, Embedding.of(cast(bytes, row[-1]))) for row in note_rows]
    column, value, update = embedding_sql(pgvector)
    with embedding_cursor(conn) as cur:
        cur.executemany(_CACHE, cache)
        # Any other name's vector is replaced: two spaces never coexist for one row.
        cur.executemany(
            f"INSERT INTO {_S}.message_vectors(agent, event_id, session_id, name, vector{column})"
            f" VALUES (%s, %s, %s, %s, %s{value}) ON CONFLICT (agent, event_id) DO UPDATE SET"
            " session_id = excluded.session_id, name = excluded.name, vector = excluded.vector"
            f"{update}",
            message_rows,
        )
        cur.executemany(
            f"INSERT INTO {_S}.note_vectors(agent, chunk_id, name, vector{column})"
            f" VALUES (%s, %s, %s, %s{value}) ON CONFLICT (agent, chunk_id) DO UPDATE SET"
            f" name = excluded.name, vector = excluded.vector{update}",
            note_rows,
        )
    return VectorsStored(messages=len(message_rows), notes=len(note_rows), skipped=skipped)


# -- the embedder actor's reads (reader connection) ---------------------------------------

_PENDING_MESSAGES = (
    f"SELECT i.event_id, e.text FROM {_S}.message_index i"
    f" JOIN {_S}.sessions s ON s.agent = i.agent AND s.id = i.session_id AND NOT s.dirty"
    f" JOIN {_S}.events e ON e.agent = i.agent AND e.id = i.event_id"
    " WHERE i.agent = %(agent)s AND i.event_id > %(after)s AND NOT EXISTS ("
    f"  SELECT 1 FROM {_S}.message_vectors v WHERE v.agent = i.agent"
    "  AND v.event_id = i.event_id AND v.name = %(name)s)"
)
_PENDING_NOTES = (
    f"SELECT c.id, c.text FROM {_S}.note_chunks c WHERE c.agent = %(agent)s AND NOT EXISTS ("
    f" SELECT 1 FROM {_S}.note_vectors v WHERE v.agent = c.agent AND v.chunk_id = c.id"
    " AND v.name = %(name)s)"
)
# Whether a transaction of this database was in flight when the snapshot was taken: it may
# hold event ids below ones already committed (ids are drawn from one sequence by several
# processes), so the watermark must not pass them. A transaction still running in another
# database does not count; one that ended since the snapshot might have been ours.
_IN_FLIGHT = (
    "SELECT EXISTS (SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) x"
    " WHERE (x::text::bigint % 4294967296) NOT IN (SELECT backend_xid::text::bigint"
    "  FROM pg_stat_activity WHERE backend_xid IS NOT NULL"
    "  AND datname IS DISTINCT FROM current_database()))"
)


def _epoch(conn: Connection, agent: str) -> int:
    row = conn.execute(
        f"SELECT epoch FROM {_S}.vector_epochs WHERE agent = %s", (agent,)
    ).fetchone()
    return int(row[0]) if row else 0


def pending_batch(
    conn: Connection, agent: str, name: str, *, after: int, epoch: int | None, limit: int
) -> PendingBatch:
    """Up to `limit` messages (ids above `after`) and note chunks lacking a vector of `name`
    (storage/vectors.py `pending_batch`), in one snapshot.

    The watermark returned (`scanned_to`) passes only ids no transaction still in flight can
    be below: with another writer of this database running, it stays at `after` (the rows
    found are returned all the same; a row that got its vector is not found again).
    """
    with conn.transaction():
        current = _epoch(conn, agent)
        start = after if epoch == current else 0
        row = conn.execute(
            f"SELECT coalesce(max(event_id), 0) FROM {_S}.message_index WHERE agent = %s",
            (agent,),
        ).fetchone()
        top = int(row[0]) if row else 0
        rows = conn.execute(
            _PENDING_MESSAGES + " ORDER BY i.event_id LIMIT %(limit)s",
            {"agent": agent, "after": start, "name": name, "limit": limit},
        ).fetchall()
        messages = [(int(i), _text(t)) for i, t in rows]
        full = len(messages) == limit
        notes = [] if full else pending_notes(conn, agent, name, limit - len(messages))
        in_flight = bool((conn.execute(_IN_FLIGHT).fetchone() or (True,))[0])
    scanned_to = messages[-1][0] if full else top
    return PendingBatch(current, start if in_flight else scanned_to, messages, notes)


def pending_notes(conn: Connection, agent: str, name: str, limit: int) -> list[tuple[int, str]]:
    """Up to `limit` (chunk id, text) of `agent`'s note chunks lacking a vector of `name`."""
    rows = conn.execute(
        _PENDING_NOTES + " ORDER BY c.id LIMIT %(limit)s",
        {"agent": agent, "name": name, "limit": limit},
    ).fetchall()
    return [(int(i), _text(t)) for i, t in rows]


def pending_count(
    conn: Connection, agent: str, name: str, *, after: int = 0, epoch: int | None = None
) -> int:
    """How many messages and note chunks of `agent` wait for a vector of `name`
    (storage/vectors.py `pending_count`: above the watermark when its epoch is current)."""
    start = after if epoch == _epoch(conn, agent) else 0
    params = {"agent": agent, "after": start, "name": name}
    row = conn.execute(
        f"SELECT (SELECT count(*) FROM ({_PENDING_MESSAGES}) m),"
        f" (SELECT count(*) FROM ({_PENDING_NOTES}) n)",
        params,
    ).fetchone()
    return int(row[0]) + int(row[1]) if row else 0


def cached_vectors(
    conn: Connection, agent: str, name: str, digests: Iterable[bytes]
) -> dict[bytes, bytes]:
    """The cached vectors of `name` for these text digests (those found)."""
    rows = conn.execute(
        f"SELECT digest, vector FROM {_S}.vector_cache WHERE agent = %s AND name = %s"
        " AND digest = ANY(%s)",
        (agent, name, list(set(digests))),
    ).fetchall()
    return {bytes(d): bytes(v) for d, v in rows}


# -- search (reader connection) -----------------------------------------------------------


def nearest_message_rows(
    conn: Connection,
    agent: str,
    query_vec: numpy.ndarray,
    *,
    name: str,
    visible_sql: str,
    visible_params: Mapping[str, Any],
    k: int,
) -> list[Near]:
    """The `k` messages most similar to `query_vec` among the visible ones, best first
    (storage/vectors.py `nearest_message_rows`: the same rows, similarities and vectors).

    `visible_sql` selects the caller's sessions as `id, dirty` (storage/pg/search.py
    `scope_sql`) with its named bindings; dirty sessions are never ranked, and only
    vectors of `name`. At most `MAX_SCANNED` visible vectors are scored: the newest.
    """
    if uses_pgvector(conn):  # the same rows allowed, ranked in SQL, unbounded
        return ranked_rows(
            conn,
            f"{_S}.message_vectors v",
            "event_id",
            "v.agent = %(agent)s AND v.session_id IN"
            f" (SELECT id FROM ({visible_sql}) visible WHERE NOT dirty)",
            {**visible_params, "agent": agent},
            query_vec,
            name=name,
            k=k,
        )
    # The bound is a cutoff id found from the ids alone (the scope index holds them), so
    # the vectors are read once, in index order, and never sorted; binary results carry
    # each vector as its bytes, not as hex text.
    visible = (
        f"FROM {_S}.message_vectors v WHERE v.agent = %(agent)s AND v.name = %(vector_name)s"
        f" AND v.session_id IN (SELECT id FROM ({visible_sql}) visible WHERE NOT dirty)"
    )
    with conn.transaction(), conn.cursor(binary=True) as cur:
        rows = cur.execute(
            f"WITH newest AS (SELECT v.event_id {visible}"
            "  ORDER BY v.event_id DESC LIMIT %(scanned)s)"
            f" SELECT v.event_id, v.vector {visible}"
            " AND v.event_id >= (SELECT min(event_id) FROM newest)",
            {**visible_params, "agent": agent, "vector_name": name, "scanned": MAX_SCANNED},
        ).fetchall()
    return _top_k(rows, query_vec, k)


def nearest_note_rows(
    conn: Connection, agent: str, query_vec: numpy.ndarray, *, name: str, k: int
) -> list[Near]:
    """The `k` note chunks of `agent` most similar to `query_vec`, best first."""
    if uses_pgvector(conn):
        return ranked_rows(
            conn,
            f"{_S}.note_vectors v",
            "chunk_id",
            "v.agent = %(agent)s",
            {"agent": agent},
            query_vec,
            name=name,
            k=k,
        )
    with conn.cursor(binary=True) as cur:
        rows = cur.execute(
            f"SELECT chunk_id, vector FROM {_S}.note_vectors WHERE agent = %s AND chunk_id IN"
            f" (SELECT chunk_id FROM {_S}.note_vectors WHERE agent = %s AND name = %s"
            "  ORDER BY chunk_id DESC LIMIT %s)",
            (agent, agent, name, MAX_SCANNED),
        ).fetchall()
    return _top_k(rows, query_vec, k)


def ranked_rows(
    conn: Connection,
    source: str,
    key: str,
    where: str,
    params: Mapping[str, Any],
    query_vec: numpy.ndarray,
    *,
    name: str,
    k: int,
) -> list[Near]:
    """The pgvector path: the `k` rows of `source` (vectors as `v`, keyed by `v.{key}`)
    that `where` admits, nearest to `query_vec` by inner product, ranked in SQL (ties newest
    first, as `pick`); the best `k + RERANKED` cross the wire and `_top_k` orders them as
    the exact path does. Rows within float32 rounding of the k-th are all rescored by
    `pick`: when such near-ties reach past the rows fetched, every row within the margin is
    fetched too."""
    query = numpy.asarray(query_vec, dtype="<f4").reshape(-1)
    if k <= 0 or not len(query):
        return []
    dims = len(query)
    distance = "v.embedding <#> %(query)s::vector"
    limit = k + RERANKED
    select = (
        f"SELECT v.{key}, v.vector, {distance} FROM {source} WHERE {where}"
        f" AND v.name = %(vector_name)s AND vector_dims(v.embedding) = {dims}"
    )
    bound = {**params, "vector_name": name, "query": Embedding.of(query.tobytes())}
    with conn.transaction():
        with embedding_cursor(conn, binary=True) as cur:
            rows = cur.execute(
                f"{select} ORDER BY {distance}, v.{key} DESC LIMIT {limit}", bound
            ).fetchall()
            distances = sorted(float(row[2]) for row in rows)
            margin = rounding_margin(dims, float(numpy.linalg.norm(query)), 1.0)
            if len(rows) == limit and distances[-1] <= distances[k - 1] + margin:
                rows = cur.execute(
                    f"{select} AND {distance} <= %(reach)s",
                    {**bound, "reach": distances[k - 1] + margin},
                ).fetchall()
        # Nothing found: are vectors of other dimensions hiding rows (a query of another
        # space)? A space has one size, so a found row says no; asked only then, so a
        # small scope's search is not one more round trip.
        if not rows:
            other = conn.execute(
                f"SELECT vector_dims(v.embedding) FROM {source} WHERE {where}"
                f" AND v.name = %(vector_name)s AND vector_dims(v.embedding) <> {dims} LIMIT 1",
                {**params, "vector_name": name},
            ).fetchone()
            if other is not None:
                raise ValueError(f"query_vec: expected {int(other[0])} dimensions, got {dims}")
    return _top_k(rows, query, k)


def _top_k(rows: Sequence[Sequence[Any]], query_vec: numpy.ndarray, k: int) -> list[Near]:
    if not rows or k <= 0:
        return []
    query = numpy.asarray(query_vec, dtype=numpy.float32).reshape(-1)
    ids = numpy.fromiter((int(r[0]) for r in rows), dtype=numpy.int64, count=len(rows))
    matrix = from_blobs([bytes(r[1]) for r in rows], len(rows[0][1]) // 4)
    if matrix.shape[1] != query.shape[0]:
        raise ValueError(f"query_vec: expected {matrix.shape[1]} dimensions, got {query.shape[0]}")
    return pick(ids, products(matrix, query), matrix, query, k)


def message_vectors_of(
    conn: Connection, agent: str, event_ids: Sequence[int], *, name: str
) -> dict[int, numpy.ndarray]:
    """The stored vectors of `name` of these messages (those that have one)."""
    return _vectors_of(conn, agent, "message_vectors", "event_id", event_ids, name)


def note_vectors_of(
    conn: Connection, agent: str, chunk_ids: Sequence[int], *, name: str
) -> dict[int, numpy.ndarray]:
    """The stored vectors of `name` of these note chunks (those that have one)."""
    return _vectors_of(conn, agent, "note_vectors", "chunk_id", chunk_ids, name)


def _vectors_of(
    conn: Connection, agent: str, table: str, key: str, ids: Sequence[int], name: str
) -> dict[int, numpy.ndarray]:
    if not ids:
        return {}
    rows = conn.execute(
        f"SELECT {key}, vector FROM {_S}.{table} WHERE agent = %s AND name = %s"
        f" AND {key} = ANY(%s)",
        (agent, name, [int(i) for i in ids]),
    ).fetchall()
    return {int(i): numpy.frombuffer(bytes(blob), dtype="<f4") for i, blob in rows}
