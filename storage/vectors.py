"""Vectors in an agent database (schema v5; docs/design.md §2.3): the writer's half, the
embedder actor's reads, and nearest-neighbour search over the caller's visible rows.

Three tables: `message_vectors` (one per indexed message of a clean session, of one
embedder `name`, read by (session, name) for a scope), `note_vectors` (one per note chunk) and `vector_cache` ((sha256 of the text, name) -> vector: rebuilds, rewinds and
re-imports never embed a text twice). Vectors are float32, little-endian, L2-normalised,
so the dot product is the cosine similarity.

Consistency (docs/design.md §2.3): only the indexer writes these tables. It stores a
message's vector only if, in that transaction, the event is on the active branch of a clean
session and its text is the one embedded (`apply_store_vectors`), and it deletes a
session's vectors in the transaction that makes it dirty or deletes it. So a vector exists
only for an active-branch message of a clean session, at every committed point.

Search: on the agent's reader, the in-memory vector index (`storage/vector_index.py`, fed
by the writer's commits, its candidates verified in SQL); elsewhere, and as the reference
the index is tested against, the plain scan (`scan_message_rows`, `scan_note_rows`): the
BLOBs of the visible rows only (read through the (session, name) index), so visibility
applies before `k`. Both rank by float32 products and order the rows within a rounding
margin of the k-th by float64 ones (`vector_index.pick`), so they return the same rows
with the same numbers. sqlite-vec's `vec0` was measured against the scan (`activememory
bench vectors`): faster over every row of an agent, but it scans its whole table whatever
the filter, so one identity's 2,000 rows cost 7x more at 100k messages.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, cast

import apsw
import numpy

from ..protocol.indexer import IndexerAck, StoreVectors, VectorsStored
from .vector_index import Near, attached, pick, products

__all__ = ["Near"]  # defined with the index, which shares the plain path's ranking

VectorParams = Sequence[object] | Mapping[str, object]

# An indexed message (user/assistant text on the active branch) of a clean session.
_MESSAGE_ON_BRANCH = (
    "SELECT e.session_id, e.text FROM events e"
    " JOIN active_branch a ON a.session_id = e.session_id AND a.depth = e.depth"
    " AND a.event_id = e.id"
    " JOIN sessions s ON s.id = e.session_id"
    " WHERE e.id = ? AND NOT s.dirty AND e.text IS NOT NULL"
)
# Indexed messages of clean sessions without a vector of this name.
_PENDING_MESSAGES = (
    "SELECT e.id, e.text FROM sessions s"
    " JOIN active_branch a ON a.session_id = s.id"
    " JOIN events e ON e.id = a.event_id"
    " WHERE NOT s.dirty AND e.text IS NOT NULL AND NOT EXISTS ("
    "  SELECT 1 FROM message_vectors v"
    "  WHERE v.session_id = s.id AND v.name = ?1 AND v.event_id = e.id)"
)
# The same, above a watermark of event ids (?2).
_PENDING_ABOVE = (
    "SELECT e.id, e.text FROM events e"
    " JOIN active_branch a ON a.session_id = e.session_id AND a.depth = e.depth"
    " AND a.event_id = e.id"
    " JOIN sessions s ON s.id = e.session_id"
    " WHERE e.id > ?2 AND NOT s.dirty AND e.text IS NOT NULL AND NOT EXISTS ("
    "  SELECT 1 FROM message_vectors v WHERE v.event_id = e.id AND v.name = ?1)"
)
# In id order, a batch at a time: what the embedder actor reads.
_PENDING_AFTER = _PENDING_ABOVE + " ORDER BY e.id LIMIT ?3"
_PENDING_NOTES = (
    "SELECT c.id, c.text FROM note_chunks c WHERE NOT EXISTS ("
    " SELECT 1 FROM note_vectors v WHERE v.name = ?1 AND v.chunk_id = c.id)"
)


def text_digest(text: str) -> bytes:
    """The content-hash cache key of a text (sha256 of its UTF-8)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def to_blob(vector: numpy.ndarray) -> bytes:
    """A vector as stored: float32, little-endian."""
    return numpy.asarray(vector, dtype="<f4").tobytes()


def from_blobs(blobs: Sequence[bytes], dim: int) -> numpy.ndarray:
    """Stored vectors as a (len(blobs), dim) float32 matrix."""
    return numpy.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), dim)


# -- the embedder actor's reads (reader connection) ---------------------------------------


class MessageRow(NamedTuple):
    """A message the vector side found, as both readers return it (storage/reads.py)."""

    id: int
    session_key: str
    timestamp: float
    role: str
    text: str
    session_id: int


class NoteRow(NamedTuple):
    """A note chunk the vector side found, as both readers return it."""

    id: int
    path: str
    start_line: int
    end_line: int
    text: str


class PendingBatch(NamedTuple):
    """Rows lacking a vector, as the embedder actor reads them (`pending_batch`)."""

    epoch: int  # `vector_epoch` when read
    scanned_to: int  # every message up to this event id has been considered
    messages: list[tuple[int, str]]  # (event id, text)
    notes: list[tuple[int, str]]  # (chunk id, text)


def pending_batch(
    conn: apsw.Connection, name: str, *, after: int, epoch: int | None, limit: int
) -> PendingBatch:
    """Up to `limit` messages (ids above `after`) and note chunks lacking a vector of `name`.

    Messages only ever join the index above the watermark, except when a session turns
    clean or one is deleted (its ids may be reused): then the writer bumps `vector_epoch`,
    and an `epoch` other than the stored one scans from the first message again. One read
    transaction: the epoch, the watermark and the rows are of one snapshot.
    """
    with conn:
        row = conn.execute("SELECT epoch FROM vector_epoch").fetchone()
        current = int(row[0]) if row else 0
        start = after if epoch == current else 0
        (top,) = conn.execute("SELECT coalesce(max(id), 0) FROM events").fetchone() or (0,)
        rows = conn.execute(_PENDING_AFTER, (name, start, limit)).fetchall()
        messages = [(int(i), str(t)) for i, t in cast(list[tuple[int, str]], rows)]
        full = len(messages) == limit
        notes = [] if full else pending_notes(conn, name, limit - len(messages))
    return PendingBatch(current, messages[-1][0] if full else int(top), messages, notes)


def bump_vector_epoch(conn: apsw.Connection) -> None:
    """Old messages may need vectors again: the embedder actor rescans (writer only)."""
    conn.execute("UPDATE vector_epoch SET epoch = epoch + 1")


def pending_notes(conn: apsw.Connection, name: str, limit: int) -> list[tuple[int, str]]:
    """Up to `limit` (chunk id, text) of note chunks lacking a vector of `name`."""
    rows = conn.execute(_PENDING_NOTES + " LIMIT ?2", (name, limit)).fetchall()
    return [(int(i), str(t)) for i, t in cast(list[tuple[int, str]], rows)]


def pending_count(
    conn: apsw.Connection, name: str, *, after: int = 0, epoch: int | None = None
) -> int:
    """How many messages and note chunks wait for a vector of `name`.

    With the embedder actor's watermark (`after`, `epoch`: every message up to `after` was
    given its vector under `vector_epoch` `epoch`), only the messages above it are counted:
    cheap when the actor keeps up, and exact once it is idle. An `epoch` other than the
    stored one (a rewind, an import, a rebuild) counts every message. Call it inside a read
    transaction, with the watermark read before it, so the two are of one snapshot or the
    watermark is older (docs/design.md §2.3).
    """
    row = conn.execute("SELECT epoch FROM vector_epoch").fetchone()
    current = int(row[0]) if row else 0
    start = after if epoch == current else 0
    if start == 0:
        row = conn.execute(f"SELECT count(*) FROM ({_PENDING_MESSAGES})", (name,)).fetchone()
    else:
        row = conn.execute(f"SELECT count(*) FROM ({_PENDING_ABOVE})", (name, start)).fetchone()
    count = int(row[0]) if row else 0
    row = conn.execute(f"SELECT count(*) FROM ({_PENDING_NOTES})", (name,)).fetchone()
    return count + (int(row[0]) if row else 0)


def cached_vectors(
    conn: apsw.Connection, name: str, digests: Iterable[bytes]
) -> dict[bytes, bytes]:
    """The cached vectors of `name` for these text digests (those found)."""
    return vectors_by_digest(
        conn, "SELECT vector FROM vector_cache WHERE digest = ? AND name = ?", name, digests
    )


def vectors_by_digest(
    conn: apsw.Connection, select: str, name: str, digests: Iterable[bytes]
) -> dict[bytes, bytes]:
    """digest -> vector BLOB for each of `digests` that `select` (one vector column, bound
    to (digest, name)) finds."""
    out: dict[bytes, bytes] = {}
    for digest in set(digests):
        row = conn.execute(select, (digest, name)).fetchone()
        if row is not None:
            out[digest] = bytes(row[0])
    return out


# -- the writer's half (inside the indexer's transaction) ---------------------------------


def apply_store_vectors(conn: apsw.Connection, cmd: StoreVectors) -> IndexerAck:
    """The indexer's handler of `StoreVectors`: store what still holds, and cache every
    vector whose text is still stored (a rebuild reuses it; the vector of a text deleted
    or erased meanwhile is dropped, docs/design.md §2.6).

    The caller has flushed its session cache first, so `sessions.dirty` is current.
    """
    cache = "INSERT OR IGNORE INTO vector_cache(digest, name, vector) VALUES (?, ?, ?)"
    messages = notes = skipped = 0
    for row in cmd.messages:
        found = conn.execute(_MESSAGE_ON_BRANCH, (row.id,)).fetchone()
        if found is None or text_digest(str(found[1])) != row.digest:
            skipped += 1
            text = conn.execute("SELECT text FROM events WHERE id = ?", (row.id,)).fetchone()
            if text is not None and text[0] is not None and text_digest(text[0]) == row.digest:
                conn.execute(cache, (row.digest, cmd.name, row.vector))  # off the branch now
            continue
        conn.execute(cache, (row.digest, cmd.name, row.vector))
        # Any other name's vector goes: two spaces never coexist for one message.
        conn.execute("DELETE FROM message_vectors WHERE event_id = ?", (row.id,))
        conn.execute(
            "INSERT INTO message_vectors(session_id, name, event_id, vector) VALUES (?, ?, ?, ?)",
            (int(found[0]), cmd.name, row.id, row.vector),
        )
        messages += 1
    for row in cmd.notes:
        found = conn.execute("SELECT text FROM note_chunks WHERE id = ?", (row.id,)).fetchone()
        if found is None or text_digest(str(found[0])) != row.digest:
            skipped += 1
            continue
        conn.execute(cache, (row.digest, cmd.name, row.vector))
        conn.execute("DELETE FROM note_vectors WHERE chunk_id = ?", (row.id,))
        conn.execute(
            "INSERT INTO note_vectors(name, chunk_id, vector) VALUES (?, ?, ?)",
            (cmd.name, row.id, row.vector),
        )
        notes += 1
    return VectorsStored(messages=messages, notes=notes, skipped=skipped)


def drop_session_vectors(conn: apsw.Connection, session_id: int) -> int:
    """Delete every vector of a session (it turned dirty or is deleted); return how many."""
    conn.execute("DELETE FROM message_vectors WHERE session_id = ?", (session_id,))
    return conn.changes()


def drop_note_vectors(conn: apsw.Connection, path: str) -> None:
    """Delete the vectors of a note file's chunks (before the chunks themselves go)."""
    conn.execute(
        "DELETE FROM note_vectors WHERE chunk_id IN (SELECT id FROM note_chunks WHERE path = ?)",
        (path,),
    )


# -- search (reader connection) -----------------------------------------------------------


def nearest_messages(
    conn: apsw.Connection,
    query_vec: numpy.ndarray,
    *,
    name: str,
    visible_sql: str,
    visible_params: VectorParams,
    k: int,
) -> list[tuple[int, float]]:
    """`nearest_message_rows` as (event id, cosine similarity)."""
    rows = nearest_message_rows(
        conn, query_vec, name=name, visible_sql=visible_sql, visible_params=visible_params, k=k
    )
    return [(row.id, row.similarity) for row in rows]


def nearest_message_rows(
    conn: apsw.Connection,
    query_vec: numpy.ndarray,
    *,
    name: str,
    visible_sql: str,
    visible_params: VectorParams,
    k: int,
) -> list[Near]:
    """The `k` messages most similar to `query_vec` among the visible ones, best first.

    `visible_sql` is a SELECT of one column of session ids (the caller's scope, the same
    rule as the text side: storage/search.py, e.g. `f"SELECT id FROM ({_PRIVATE})"` with
    `private_params(...)`); `visible_params` its bindings, positional or named (then
    `:vector_name` is taken). Only vectors of `name` are ranked, and dirty
    sessions never. Ties: newest event first. Each row keeps its vector, so a caller that
    needs it (hybrid fusion, MMR) does not read it again.

    Served by the agent's in-memory vector index when one is attached to `conn`
    (storage/vector_index.py), else by `scan_message_rows`; both give the same rows.
    """
    index = attached(conn)
    if index is not None:
        found = index.nearest_messages(
            conn, query_vec, name=name, visible_sql=visible_sql, visible_params=visible_params, k=k
        )
        if found is not None:
            return found
    return scan_message_rows(
        conn, query_vec, name=name, visible_sql=visible_sql, visible_params=visible_params, k=k
    )


def scan_message_rows(
    conn: apsw.Connection,
    query_vec: numpy.ndarray,
    *,
    name: str,
    visible_sql: str,
    visible_params: VectorParams,
    k: int,
) -> list[Near]:
    """`nearest_message_rows` the plain way, the reference of the index: every visible
    vector read from SQLite and scored."""
    if isinstance(visible_params, Mapping):
        params: VectorParams = {**visible_params, "vector_name": name}
        name_param = ":vector_name"
    else:
        params = [*visible_params, name]
        name_param = "?"
    # CROSS JOIN fixes the order: the visible sessions first, then their vectors through
    # the (session, name) index; left to itself the planner scans every vector.
    sql = (
        f"WITH visible(session_id) AS ({visible_sql})"
        " SELECT v.event_id, v.vector FROM visible"
        " CROSS JOIN sessions s ON s.id = visible.session_id AND NOT s.dirty"
        " CROSS JOIN message_vectors v INDEXED BY message_vectors_scope"
        f" ON v.session_id = s.id AND v.name = {name_param}"
    )
    rows = cast(list[tuple[int, bytes]], conn.execute(sql, params).fetchall())
    return _top_k(rows, query_vec, k)


def nearest_notes(
    conn: apsw.Connection, query_vec: numpy.ndarray, *, name: str, k: int
) -> list[tuple[int, float]]:
    """`nearest_note_rows` as (chunk id, cosine similarity)."""
    return [(row.id, row.similarity) for row in nearest_note_rows(conn, query_vec, name=name, k=k)]


def nearest_note_rows(
    conn: apsw.Connection, query_vec: numpy.ndarray, *, name: str, k: int
) -> list[Near]:
    """The `k` note chunks most similar to `query_vec`, best first, with their vectors.

    Notes belong to the agent's workspace: every chunk is visible to the agent's recall.
    Served by the in-memory vector index when one is attached to `conn`, like messages.
    """
    index = attached(conn)
    if index is not None:
        found = index.nearest_notes(conn, query_vec, name=name, k=k)
        if found is not None:
            return found
    return scan_note_rows(conn, query_vec, name=name, k=k)


def scan_note_rows(
    conn: apsw.Connection, query_vec: numpy.ndarray, *, name: str, k: int
) -> list[Near]:
    """`nearest_note_rows` the plain way: every vector of `name` read and scored."""
    rows = cast(
        list[tuple[int, bytes]],
        conn.execute(
            "SELECT chunk_id, vector FROM note_vectors WHERE name = ?", (name,)
        ).fetchall(),
    )
    return _top_k(rows, query_vec, k)


def _top_k(rows: list[tuple[int, bytes]], query_vec: numpy.ndarray, k: int) -> list[Near]:
    if not rows or k <= 0:
        return []
    query = numpy.asarray(query_vec, dtype=numpy.float32).reshape(-1)
    ids = numpy.fromiter((r[0] for r in rows), dtype=numpy.int64, count=len(rows))
    matrix = from_blobs([r[1] for r in rows], len(rows[0][1]) // 4)
    if matrix.shape[1] != query.shape[0]:
        raise ValueError(f"query_vec: expected {matrix.shape[1]} dimensions, got {query.shape[0]}")
    return pick(ids, products(matrix, query), matrix, query, k)


def message_vectors_of(
    conn: apsw.Connection, event_ids: Sequence[int], *, name: str
) -> dict[int, numpy.ndarray]:
    """The stored vectors of `name` of these messages (those that have one)."""
    return _vectors_of(conn, "message_vectors", "event_id", event_ids, name)


def note_vectors_of(
    conn: apsw.Connection, chunk_ids: Sequence[int], *, name: str
) -> dict[int, numpy.ndarray]:
    """The stored vectors of `name` of these note chunks (those that have one)."""
    return _vectors_of(conn, "note_vectors", "chunk_id", chunk_ids, name)


def _vectors_of(
    conn: apsw.Connection, table: str, key: str, ids: Sequence[int], name: str
) -> dict[int, numpy.ndarray]:
    if not ids:
        return {}
    rows = cast(
        list[tuple[int, bytes]],
        conn.execute(
            f"SELECT {key}, vector FROM {table}"
            f" WHERE name = ? AND {key} IN (SELECT value FROM json_each(?))",
            (name, json.dumps([int(i) for i in ids])),
        ).fetchall(),
    )
    return {int(i): numpy.frombuffer(blob, dtype="<f4") for i, blob in rows}
