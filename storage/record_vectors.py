"""Vectors of scoped records in `records.db` (schema v2; docs/design.md §5.7).

One table, `record_vectors`: one row per record (`seq`, its key in `records`) holding the
vector of one embedder `name` and the sha256 of the content it embedded. Vectors follow the
agent databases' convention (storage/vectors.py: float32, little-endian, L2-normalised, so
the dot product is the cosine similarity; `to_blob`, `from_blobs`, `text_digest`).

Consistency: only the records keeper writes the table. It stores a vector only if, in that
transaction, the record exists and its content still has the digest that was embedded
(`apply_store_record_vectors`); `seq` references `records(seq)` with ON DELETE CASCADE, so
deleting or erasing a record (storage/userdata.py `erase_records`) drops its vector in the
same statement, and a reused `seq` never inherits one. Invalid and expired records keep
their vector: the search filters them in SQL exactly as the text side does.

The content-hash cache is the table itself: a record whose content another live record
already has takes that vector (`cached_record_vectors`, through the (digest, name) index).
It holds only live records' vectors, so nothing of an erased record survives in it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, cast

import apsw
import numpy

from ..protocol.indexer import VectorRow
from ..protocol.records import RecordVectorsStored
from .vectors import Near, _top_k, text_digest, vectors_by_digest


def v2_record_vectors(conn: apsw.Connection) -> None:
    """Schema v2 of `records.db`: `record_vectors` (module docstring)."""
    conn.execute(
        """
        CREATE TABLE record_vectors(
            seq INTEGER PRIMARY KEY REFERENCES records(seq) ON DELETE CASCADE,
            name TEXT NOT NULL,
            digest BLOB NOT NULL,
            vector BLOB NOT NULL
        ) STRICT;
        CREATE INDEX record_vectors_digest ON record_vectors(digest, name);
        """
    )


# -- the embedder actor's reads (its own reader connection) -----------------------------


class RecordMark(NamedTuple):
    """The records embedder's watermark: every record up to `seq` was considered, and
    `id` was the record at `seq` then (None: nothing read yet)."""

    seq: int = 0
    id: str | None = None


class PendingRecords(NamedTuple):
    """Records lacking a vector, as the embedder actor reads them."""

    mark: RecordMark  # the watermark once these are stored
    rows: list[tuple[int, str]]  # (seq, content)


_PENDING = (
    "SELECT r.seq, r.content FROM records r WHERE r.seq > ?2 AND NOT EXISTS ("
    " SELECT 1 FROM record_vectors v WHERE v.seq = r.seq AND v.name = ?1)"
)


def _start(conn: apsw.Connection, mark: RecordMark) -> int:
    """Where a scan starts: after the watermark, unless the record at it is gone.

    A new record takes a seq above every live one, so nothing joins below the watermark
    while the record at it lives; once it is deleted, its seq may be reused (SQLite's
    rowid is max + 1), so the scan starts over.
    """
    if mark.id is None:
        return 0
    row = conn.execute("SELECT id FROM records WHERE seq = ?", (mark.seq,)).fetchone()
    return mark.seq if row is not None and row[0] == mark.id else 0


def pending_records(
    conn: apsw.Connection, name: str, *, mark: RecordMark, limit: int
) -> PendingRecords:
    """Up to `limit` records above the watermark lacking a vector of `name`, in seq order;
    one read transaction."""
    with conn:
        start = _start(conn, mark)
        rows = conn.execute(_PENDING + " ORDER BY r.seq LIMIT ?3", (name, start, limit)).fetchall()
        found = [(int(s), str(c)) for s, c in cast(list[tuple[int, str]], rows)]
        if len(found) == limit:
            last = found[-1][0]
        else:
            top = conn.execute("SELECT max(seq) FROM records").fetchone()
            last = int(top[0]) if top and top[0] is not None else 0
        at = conn.execute("SELECT id FROM records WHERE seq = ?", (last,)).fetchone()
    return PendingRecords(RecordMark(last, None if at is None else str(at[0])), found)


def pending_record_count(conn: apsw.Connection, name: str, *, mark: RecordMark) -> int:
    """How many records wait for a vector of `name`: above the watermark only, so it is
    cheap while the actor keeps up and exact once it is idle (as `vectors.pending_count`)."""
    with conn:
        start = _start(conn, mark)
        row = conn.execute(f"SELECT count(*) FROM ({_PENDING})", (name, start)).fetchone()
    return int(row[0]) if row else 0


def cached_record_vectors(
    conn: apsw.Connection, name: str, digests: Iterable[bytes]
) -> dict[bytes, bytes]:
    """The vectors of `name` that live records with these content digests already have."""
    return vectors_by_digest(
        conn,
        "SELECT vector FROM record_vectors WHERE digest = ? AND name = ? LIMIT 1",
        name,
        digests,
    )


# -- the writer's half (inside the records keeper's transaction) --------------------------


def apply_store_record_vectors(
    conn: apsw.Connection, name: str, rows: Sequence[VectorRow]
) -> RecordVectorsStored:
    """Store each vector whose record still has the content embedded (module docstring);
    any other name's vector of that record is replaced: two spaces never coexist."""
    stored = skipped = 0
    for row in rows:
        found = conn.execute("SELECT content FROM records WHERE seq = ?", (row.id,)).fetchone()
        if found is None or text_digest(str(found[0])) != row.digest:
            skipped += 1
            continue
        conn.execute(
            "INSERT OR REPLACE INTO record_vectors(seq, name, digest, vector) VALUES (?, ?, ?, ?)",
            (row.id, name, row.digest, row.vector),
        )
        stored += 1
    return RecordVectorsStored(stored=stored, skipped=skipped)


# -- search (reader connection, inside the search's read transaction) ---------------------


def nearest_records(
    conn: apsw.Connection,
    query_vec: numpy.ndarray,
    *,
    name: str,
    where: Sequence[str],
    params: Mapping[str, object],
    k: int,
) -> list[Near]:
    """The `k` records most similar to `query_vec` among those `where` admits, best first
    (ties: newest first), each with its vector.

    `where`: SQL conditions on `records r` (the search's scope, lifecycle, expiry, type and
    metadata filters: storage/records.py `_filters`), with named `params`; they apply in
    SQL before `k`, so a vector never surfaces a record outside the caller's scope.
    """
    sql = (
        "SELECT v.seq, v.vector FROM records r JOIN record_vectors v ON v.seq = r.seq"
        f" WHERE {' AND '.join(['v.name = :vector_name', *where])}"
    )
    rows = cast(
        list[tuple[int, bytes]], conn.execute(sql, {**params, "vector_name": name}).fetchall()
    )
    return _top_k(rows, query_vec, k)


def record_vectors_of(
    conn: apsw.Connection, seqs: Sequence[int], *, name: str
) -> dict[int, numpy.ndarray]:
    """The stored vectors of `name` of these records (those that have one)."""
    if not seqs:
        return {}
    rows = cast(
        list[tuple[int, bytes]],
        conn.execute(
            "SELECT seq, vector FROM record_vectors"
            " WHERE name = ? AND seq IN (SELECT value FROM json_each(?))",
            (name, json.dumps([int(s) for s in seqs])),
        ).fetchall(),
    )
    return {int(s): numpy.frombuffer(blob, dtype="<f4") for s, blob in rows}
