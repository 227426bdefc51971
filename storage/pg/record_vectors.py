"""Vectors of scoped records on PostgreSQL (docs/design.md §5.7, §11): the twin of
storage/record_vectors.py.

One table, `record_vectors(agent, seq)`: the records tenant first (`agent`, as every table
of the schema, so row security binds it), one row per record holding the vector of one
embedder `name` and the sha256 of the content it embedded. `(agent, seq)` references
`records(agent, seq)` with ON DELETE CASCADE: deleting or erasing a record drops its vector
in the same statement. Only the records writer stores a vector, and only if, in its
transaction, the record still has the content embedded (`apply_store_record_vectors`). The
content-hash cache is the table itself, as on SQLite.

Search: the vectors of the records the search's own filters admit (scope, lifecycle,
expiry, type, metadata: storage/pg/records.py `_filters`), applied in SQL before `k`. Without
pgvector they are all read and ranked exactly (storage/vector_index.py `pick`, through
storage/pg/vectors.py); with it (the store's recorded choice, docs/design.md §11 "Vectors
with pgvector") SQL ranks them by the `embedding` column under the same filters and only
the best `k + RERANKED` are read (storage/pg/vectors.py `ranked_rows`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy

from ...protocol.indexer import VectorRow
from ...protocol.records import RecordVectorsStored
from ..record_vectors import PendingRecords, RecordMark
from ..vectors import Near, text_digest
from .db import SCHEMA
from .transcripts import Connection, _text
from .vectors import (
    Embedding,
    _top_k,
    embedding_cursor,
    embedding_sql,
    ranked_rows,
    uses_pgvector,
)

_S = SCHEMA


def record_vectors_ddl() -> str:
    """The record vectors table (a schema step of storage/pg/db.py)."""
    return f"""
CREATE TABLE {_S}.record_vectors(
    agent text NOT NULL,
    seq bigint NOT NULL,
    name text NOT NULL,
    digest bytea NOT NULL,
    vector bytea NOT NULL,
    PRIMARY KEY (agent, seq),
    FOREIGN KEY (agent, seq) REFERENCES {_S}.records(agent, seq) ON DELETE CASCADE
);
CREATE INDEX record_vectors_digest ON {_S}.record_vectors(agent, digest, name);
"""


_PENDING = (
    f"SELECT r.seq, r.content FROM {_S}.records r WHERE r.agent = %(agent)s"
    " AND r.seq > %(start)s AND NOT EXISTS ("
    f" SELECT 1 FROM {_S}.record_vectors v WHERE v.agent = r.agent AND v.seq = r.seq"
    " AND v.name = %(name)s)"
)


def _start(conn: Connection, tenant: str, mark: RecordMark) -> int:
    """Where a scan starts: after the watermark, unless the record at it is gone (its seq
    may be used again), as on SQLite."""
    if mark.id is None:
        return 0
    row = conn.execute(
        f"SELECT id FROM {_S}.records WHERE agent = %s AND seq = %s", (tenant, mark.seq)
    ).fetchone()
    return mark.seq if row is not None and row[0] == mark.id else 0


def pending_records(
    conn: Connection, tenant: str, name: str, *, mark: RecordMark, limit: int
) -> PendingRecords:
    """Up to `limit` records above the watermark lacking a vector of `name`, in seq order;
    one snapshot."""
    with conn.transaction():
        params: dict[str, Any] = {"agent": tenant, "name": name, "limit": limit}
        params["start"] = _start(conn, tenant, mark)
        rows = conn.execute(_PENDING + " ORDER BY r.seq LIMIT %(limit)s", params).fetchall()
        found = [(int(s), _text(c)) for s, c in rows]
        if len(found) == limit:
            last = found[-1][0]
        else:
            top = conn.execute(
                f"SELECT max(seq) FROM {_S}.records WHERE agent = %s", (tenant,)
            ).fetchone()
            last = int(top[0]) if top and top[0] is not None else 0
        at = conn.execute(
            f"SELECT id FROM {_S}.records WHERE agent = %s AND seq = %s", (tenant, last)
        ).fetchone()
    return PendingRecords(RecordMark(last, None if at is None else str(at[0])), found)


def pending_record_count(conn: Connection, tenant: str, name: str, *, mark: RecordMark) -> int:
    """How many records wait for a vector of `name`, above the watermark."""
    with conn.transaction():
        start = _start(conn, tenant, mark)
        row = conn.execute(
            f"SELECT count(*) FROM ({_PENDING}) p", {"agent": tenant, "name": name, "start": start}
        ).fetchone()
    return int(row[0]) if row else 0


def cached_record_vectors(
    conn: Connection, tenant: str, name: str, digests: Iterable[bytes]
) -> dict[bytes, bytes]:
    """The vectors of `name` that live records with these content digests already have."""
    rows = conn.execute(
        f"SELECT DISTINCT ON (digest) digest, vector FROM {_S}.record_vectors"
        " WHERE agent = %s AND name = %s AND digest = ANY(%s)",
        (tenant, name, list(set(digests))),
    ).fetchall()
    return {bytes(d): bytes(v) for d, v in rows}


def apply_store_record_vectors(
    conn: Connection, tenant: str, name: str, rows: Sequence[VectorRow]
) -> RecordVectorsStored:
    """Store each vector whose record still has the content embedded; any other name's
    vector of that record is replaced (storage/record_vectors.py's rule)."""
    stored = skipped = 0
    pgvector = uses_pgvector(conn)
    column, value, update = embedding_sql(pgvector)
    with embedding_cursor(conn) as cur:
        for row in rows:
            found = cur.execute(
                f"SELECT content FROM {_S}.records WHERE agent = %s AND seq = %s",
                (tenant, row.id),
            ).fetchone()
            if found is None or text_digest(_text(found[0])) != row.digest:
                skipped += 1
                continue
            values: tuple[object, ...] = (tenant, row.id, name, row.digest, row.vector)
            if pgvector:
                values += (Embedding.of(row.vector),)
            cur.execute(
                f"INSERT INTO {_S}.record_vectors(agent, seq, name, digest, vector{column})"
                f" VALUES (%s, %s, %s, %s, %s{value}) ON CONFLICT (agent, seq) DO UPDATE SET"
                " name = excluded.name, digest = excluded.digest, vector = excluded.vector"
                f"{update}",
                values,
            )
            stored += 1
    return RecordVectorsStored(stored=stored, skipped=skipped)


def nearest_records(
    conn: Connection,
    tenant: str,
    query_vec: numpy.ndarray,
    *,
    name: str,
    where: Sequence[str],
    params: Mapping[str, object],
    k: int,
) -> list[Near]:
    """The `k` records most similar to `query_vec` among those `where` (conditions on
    `records r`, with named `params`) admits, best first; the filters apply in SQL."""
    source = f"{_S}.records r JOIN {_S}.record_vectors v ON v.agent = r.agent AND v.seq = r.seq"
    if uses_pgvector(conn):
        admitted = " AND ".join(["r.agent = %(agent)s", *where])
        return ranked_rows(
            conn, source, "seq", admitted, {**params, "agent": tenant}, query_vec, name=name, k=k
        )
    conditions = " AND ".join(["r.agent = %(agent)s", "v.name = %(vector_name)s", *where])
    with conn.cursor(binary=True) as cur:
        rows = cur.execute(
            f"SELECT v.seq, v.vector FROM {source} WHERE {conditions}",
            {**params, "agent": tenant, "vector_name": name},
        ).fetchall()
    return _top_k(rows, query_vec, k)


def record_vectors_of(
    conn: Connection, tenant: str, seqs: Sequence[int], *, name: str
) -> dict[int, numpy.ndarray]:
    """The stored vectors of `name` of these records (those that have one)."""
    if not seqs:
        return {}
    rows = conn.execute(
        f"SELECT seq, vector FROM {_S}.record_vectors WHERE agent = %s AND name = %s"
        " AND seq = ANY(%s)",
        (tenant, name, [int(s) for s in seqs]),
    ).fetchall()
    return {int(s): numpy.frombuffer(bytes(blob), dtype="<f4") for s, blob in rows}
