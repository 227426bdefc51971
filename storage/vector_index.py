"""An in-memory index of an agent database's vectors (docs/design.md §2.3, "The vector
index"): the nearest visible rows without reading every visible vector from SQLite.

`storage/vectors.py` scores by reading the BLOB of every visible vector on each query
(~3 ms per 1,000 rows). This module keeps, per agent database and per (table, embedder
name), a float32 matrix of the stored vectors with their ids (and, for messages, session
ids), scored with one matrix-vector product masked to the caller's visible sessions. The
database stays the truth:

- **Freshness: a change feed from the writer.** The agent database has one writer, the
  indexer's connection, in this process (the writer lock). `VectorFeed.install` puts TEMP
  triggers on that connection (`message_vectors`, `note_vectors`: every insert, delete and
  update, whichever code path wrote it) that hand each change to the feed; a commit hook
  publishes the transaction's changes in order, a rollback hook drops them (and, since a
  commit can still fail after its hook, makes every index reload). A reader drains the feed
  after its read transaction has taken its snapshot, so every change committed before the
  snapshot is applied; changes not yet committed may be applied early (an extra row the
  verification below drops; a row deleted a moment early). A first load reads every vector
  of the name once and replays the feed from the transaction that may still have been in
  flight (replaying a change the snapshot already holds changes nothing).
- **Exactness: the candidates are verified in SQL.** The visible sessions come from the
  caller's own visibility SQL (`visible_sql`, clean sessions only), in the same read
  transaction. The index proposes the rows within a rounding margin of the k-th best
  score; their vectors are read back from SQLite (a handful of BLOBs) and each must still
  exist with this name, in a visible session, and with the very bytes the index scored —
  else it is left out for this query (not committed yet) or, if the index disagrees with
  the database, the index reloads and the plain path answers. Final scores are computed
  from the database's vectors the way the plain path computes them (`canonical_scores`),
  so both paths return the same rows with the same numbers (tests/test_vector_index.py).

Where it lives: one `VectorIndexes` per agent database, attached to the agent's reader
connection by the supervisor (`attach`), looked up by `storage.vectors.nearest_*_rows`.
A connection with none attached (a read-only open, a benchmark's own connection) takes the
plain path. Calls are serialised by a lock (the reader runs one call at a time anyway).

Cost: 4 bytes × dimensions per vector (101k × 384 float32 = 155 MB at the recall
benchmark's size), built lazily by the first query of a name (1.3-2.5 s at 100k here: two to
four plain scans of every row, mostly the fresh memory's page faults). Deleted rows are compacted away once they are a quarter of the matrix.
"""

from __future__ import annotations

import json
import sys
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Literal, NamedTuple, cast

import apsw
import numpy

Table = Literal["m", "n"]  # message_vectors, note_vectors
_TABLES: dict[Table, tuple[str, str]] = {
    "m": ("message_vectors", "event_id"),
    "n": ("note_vectors", "chunk_id"),
}
_FUNCTION = "activememory_vector_changed"
GATHER_BELOW = 0.25
"""Visible rows below this share of the matrix are gathered and scored alone; above it the
whole matrix is scored and masked (one product beats a copy)."""
COMPACT_AT = 0.25  # share of dead rows at which the matrix is rebuilt without them
COMPACT_MIN = 1024  # ... once there are at least this many
MAX_ROUNDS = 4  # verification rounds before the plain path answers instead
MAX_HELD = 20_000  # changes the feed keeps for indexes that do not read it (then: reload)
FORGET_AFTER_S = 600.0  # a matrix of another name unused this long is dropped
_SNAPSHOT = "SELECT epoch FROM vector_epoch"  # any read: the transaction's snapshot


class Near(NamedTuple):
    """One of the `k` nearest rows: its id, its cosine to the query, its stored vector."""

    id: int
    similarity: float
    vector: numpy.ndarray


# -- scoring shared with the plain path ---------------------------------------------------


def rounding_margin(dim: int, query_norm: float, max_norm: float) -> float:
    """A bound on twice the float32 rounding error of one dot product of this size.

    The float32 product ranks; any row within this margin of the k-th best is rescored by
    `canonical_scores`, so both paths agree whatever BLAS does with the last bits.
    """
    return 4.0 * dim * 2.0**-24 * query_norm * max(max_norm, 1.0) + 1e-12


def products(matrix: numpy.ndarray, query: numpy.ndarray) -> numpy.ndarray:
    """`matrix @ query` in float32 on the calling thread. Not BLAS: OpenBLAS splits even a
    2,000-row product over its threads, and on a busy machine (2 cores shared with the
    event loop, the embedder and the host) waiting for them took 18-35 ms instead of 0.1
    (measured); numpy's own loop is as fast single-threaded, the product being bound by
    memory bandwidth."""
    return cast(numpy.ndarray, numpy.einsum("ij,j->i", matrix, query))


def canonical_scores(matrix: numpy.ndarray, query: numpy.ndarray) -> numpy.ndarray:
    """Dot products in float64, row by row (float32 × float32 is exact in float64, and the
    sum of each row depends on that row alone): the same number on every path."""
    product = matrix.astype(numpy.float64) * query.astype(numpy.float64)
    return cast(numpy.ndarray, product.sum(axis=1))


def pick(
    ids: numpy.ndarray, scores: numpy.ndarray, matrix: numpy.ndarray, query: numpy.ndarray, k: int
) -> list[Near]:
    """The plain path's top `k` of a scored matrix: float32 `scores` pick the rows within
    the margin of the k-th best, float64 rescoring orders them; ties newest (largest id)
    first."""
    n = len(ids)
    keep = min(k, n)
    if keep <= 0:
        return []
    kth = float(numpy.partition(scores, n - keep)[n - keep])
    norms = numpy.sqrt(numpy.max(numpy.einsum("ij,ij->i", matrix, matrix)))
    margin = rounding_margin(matrix.shape[1], float(numpy.linalg.norm(query)), float(norms))
    chosen = numpy.flatnonzero(scores >= kth - margin)
    exact = canonical_scores(matrix[chosen], query)
    order = sorted(range(len(chosen)), key=lambda j: (-float(exact[j]), -int(ids[chosen[j]])))
    return [Near(int(ids[chosen[j]]), float(exact[j]), matrix[chosen[j]]) for j in order[:keep]]


# -- the writer's change feed -------------------------------------------------------------


class Change(NamedTuple):
    """One row of a vector table changed: deleted (`name` None) or now this vector."""

    table: Table
    id: int
    session_id: int | None
    name: str | None
    vector: bytes | None


class VectorFeed:
    """The writer connection's changes to the vector tables, published at each commit.

    Thread-safety: the hooks run on the writer's thread, `since` on a reader's; one lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: list[Change] = []  # the writer's open transaction (writer thread only)
        self._log: list[tuple[int, list[Change]]] = []  # published transactions, in order
        self._last = 0  # sequence number of the last published transaction
        self._held = 0  # changes in `_log`
        self._floor: int | None = None  # what the loaded indexes still need; None: none
        self.resets = 0  # bumped by a rollback or an overflow: every index reloads
        # True once installed on a writable connection (or for a database nothing writes):
        # an index answers only then; else a writer the feed cannot see (another process,
        # a read-only open beside a live bot) would leave it stale.
        self.live = False

    @classmethod
    def unwritten(cls) -> VectorFeed:
        """A feed for a database that nothing writes while it is searched (a benchmark's
        finished corpus): its indexes load once and never need a change."""
        feed = cls()
        feed.live = True
        return feed

    def install(self, conn: apsw.Connection) -> None:
        """Feed on `conn` (the writer): TEMP triggers on both vector tables and the hooks.
        Run it on the connection's own executor, before the writer's first command. A
        read-only connection gets nothing, and the feed's indexes never answer."""
        if conn.readonly("main"):
            return
        conn.create_scalar_function(_FUNCTION, self._changed, 5)  # type: ignore[arg-type]
        statements = []
        for table, (name, key) in _TABLES.items():
            session = "NEW.session_id" if table == "m" else "NULL"
            insert = f"SELECT {_FUNCTION}('{table}', NEW.{key}, {session}, NEW.name, NEW.vector);"
            delete = f"SELECT {_FUNCTION}('{table}', OLD.{key}, NULL, NULL, NULL);"
            statements += [
                f"CREATE TEMP TRIGGER IF NOT EXISTS activememory_{name}_insert"
                f" AFTER INSERT ON main.{name} BEGIN {insert} END;",
                f"CREATE TEMP TRIGGER IF NOT EXISTS activememory_{name}_delete"
                f" AFTER DELETE ON main.{name} BEGIN {delete} END;",
                f"CREATE TEMP TRIGGER IF NOT EXISTS activememory_{name}_update"
                f" AFTER UPDATE ON main.{name} BEGIN {delete} {insert} END;",
            ]
        conn.execute("\n".join(statements))
        conn.set_commit_hook(self._commit, id=self)
        conn.set_rollback_hook(self._rollback, id=self)
        self.live = True

    def _changed(
        self, table: str, row_id: int, session: int | None, name: str | None, blob: bytes | None
    ) -> None:
        self._open.append(
            Change(
                cast(Table, table),
                int(row_id),
                None if session is None else int(session),
                name,
                None if blob is None else bytes(blob),
            )
        )

    def _commit(self) -> bool:
        if self._open:
            with self._lock:
                self._last += 1
                self._log.append((self._last, self._open))
                self._held += len(self._open)
                self._trim()
            self._open = []
        return False  # never veto the commit

    def _rollback(self) -> None:
        self._open = []
        with self._lock:  # the last published transaction may be the one rolled back
            self.resets += 1

    def _trim(self) -> None:
        """Forget what no index needs: before the consumers' floor (all of it but the last
        transaction, which a load may replay, when no index is loaded); past `MAX_HELD`
        changes unread, everything, and the indexes reload (a reset)."""
        floor = self._last if self._floor is None else min(self._floor, self._last)
        if self._held > MAX_HELD:
            floor, self.resets = self._last, self.resets + 1
        if self._log and self._log[0][0] < floor:
            self._log = [(s, c) for s, c in self._log if s >= floor]
            self._held = sum(len(c) for _, c in self._log)

    def mark(self) -> tuple[int, int]:
        """(the first sequence number a load made now must replay, `resets`): the last
        published transaction may still be committing, so it is replayed too."""
        with self._lock:
            return max(self._last, 1), self.resets

    def since(self, seq: int) -> tuple[list[tuple[int, Change]], int, int]:
        """The changes of transactions numbered `seq` and later (with their numbers), the
        next number to ask for, and `resets`."""
        with self._lock:
            out = [(s, c) for s, changes in self._log if s >= seq for c in changes]
            return out, self._last + 1, self.resets

    def consumed(self, floor: int | None) -> None:
        """Every loaded index has applied what is below `floor` (None: no index is loaded)."""
        with self._lock:
            self._floor = floor
            self._trim()


# -- one matrix ---------------------------------------------------------------------------


class _Matrix:
    """The vectors of one (table, name): rows appended, deleted rows masked, compacted."""

    def __init__(self, table: Table, name: str) -> None:
        self.table = table
        self.name = name
        self.size = 0
        self.dead = 0
        self.dim = 0
        self.max_norm = 0.0
        self.ids = numpy.zeros(0, dtype=numpy.int64)
        self.sessions = numpy.zeros(0, dtype=numpy.int64)
        self.alive = numpy.zeros(0, dtype=bool)
        self.vectors = numpy.zeros((0, 0), dtype=numpy.float32)
        self.row_of: dict[int, int] = {}
        self.next_seq = 0  # the feed's next transaction to apply; 0: not loaded
        self.resets = -1
        self.used = 0.0  # time.monotonic() of the last search

    def nbytes(self) -> int:
        """The arrays' bytes and the id map's (`VectorIndexes.nbytes`)."""
        arrays = (self.ids, self.sessions, self.alive, self.vectors)
        # A dict entry is its slot in the table plus two int objects (ids past 256).
        entries = sys.getsizeof(self.row_of) + 2 * 32 * len(self.row_of)
        return sum(a.nbytes for a in arrays) + entries

    def load(self, conn: apsw.Connection, seq: int, resets: int) -> None:
        """Every vector of the name, from the transaction's snapshot."""
        table, key = _TABLES[self.table]
        session = "session_id" if self.table == "m" else "0"
        rows = cast(
            list[tuple[int, int, bytes]],
            conn.execute(
                f"SELECT {key}, {session}, vector FROM {table} WHERE name = ?", (self.name,)
            ).fetchall(),
        )
        self.__init__(self.table, self.name)  # type: ignore[misc]
        self.next_seq, self.resets, self.used = seq, resets, time.monotonic()
        if not rows:
            return
        dims = {len(r[2]) for r in rows}
        if len(dims) != 1 or next(iter(dims)) % 4:
            raise _Disagrees(f"{self.name}: vectors of {sorted(dims)} bytes")
        n = len(rows)
        capacity = n + max(64, n // 8)  # room for new rows before the first copy
        self.dim = dims.pop() // 4
        self.ids = numpy.zeros(capacity, dtype=numpy.int64)
        self.ids[:n] = numpy.fromiter((r[0] for r in rows), dtype=numpy.int64, count=n)
        self.sessions = numpy.zeros(capacity, dtype=numpy.int64)
        self.sessions[:n] = numpy.fromiter((r[1] for r in rows), dtype=numpy.int64, count=n)
        self.vectors = numpy.zeros((capacity, self.dim), dtype=numpy.float32)
        self.vectors[:n] = numpy.frombuffer(b"".join(r[2] for r in rows), dtype="<f4").reshape(
            n, self.dim
        )
        self.alive = numpy.zeros(capacity, dtype=bool)
        self.alive[:n] = True
        live = self.vectors[:n]
        self.max_norm = float(numpy.sqrt(numpy.einsum("ij,ij->i", live, live).max()))
        self.row_of = {int(i): r for r, i in enumerate(self.ids[:n].tolist())}
        self.size = n

    def _grow(self, need: int) -> None:
        capacity = len(self.ids)
        if self.size + need <= capacity:
            return
        capacity = max(self.size + need, 2 * capacity, 64)
        self.ids = numpy.resize(self.ids, capacity)
        self.sessions = numpy.resize(self.sessions, capacity)
        alive = numpy.zeros(capacity, dtype=bool)
        alive[: self.size] = self.alive[: self.size]
        self.alive = alive
        if self.dim:
            vectors = numpy.zeros((capacity, self.dim), dtype=numpy.float32)
            vectors[: self.size] = self.vectors[: self.size]
            self.vectors = vectors

    def put(self, row_id: int, session_id: int, blob: bytes) -> None:
        """The row is now this vector (a new row, or a replaced one)."""
        vector = numpy.frombuffer(blob, dtype="<f4")
        if not self.dim:
            self.dim = len(vector)
            self.vectors = numpy.zeros((len(self.ids), self.dim), dtype=numpy.float32)
        if len(vector) != self.dim:
            raise _Disagrees(f"{self.name}: a vector of {len(vector)} dimensions, not {self.dim}")
        self.remove(row_id)
        self._grow(1)
        i = self.size
        self.ids[i], self.sessions[i], self.alive[i] = row_id, session_id, True
        self.vectors[i] = vector
        self.max_norm = max(self.max_norm, float(numpy.linalg.norm(vector)))
        self.row_of[row_id] = i
        self.size += 1

    def remove(self, row_id: int) -> None:
        i = self.row_of.pop(row_id, None)
        if i is not None:
            self.alive[i] = False
            self.dead += 1

    def apply(self, changes: Sequence[Change]) -> None:
        """Replay the writer's changes in order (a change the matrix holds already is a
        no-op: the last change of each row decides)."""
        for change in changes:
            if change.table != self.table:
                continue
            if change.name == self.name and change.vector is not None:
                self.put(change.id, change.session_id or 0, change.vector)
            else:  # deleted, or now of another name (one vector per row id)
                self.remove(change.id)
        if self.dead >= COMPACT_MIN and self.dead > COMPACT_AT * self.size:
            self.compact()

    def compact(self) -> None:
        keep = numpy.flatnonzero(self.alive[: self.size])
        self.ids = self.ids[keep].copy()
        self.sessions = self.sessions[keep].copy()
        self.vectors = self.vectors[keep].copy() if self.dim else self.vectors
        self.alive = numpy.ones(len(keep), dtype=bool)
        self.size, self.dead = len(keep), 0
        self.row_of = {int(i): r for r, i in enumerate(self.ids.tolist())}


class _Disagrees(Exception):
    """The index and the database disagree: reload, and let the plain path answer."""


# -- the per-database index ---------------------------------------------------------------


class VectorIndexes:
    """Every (table, embedder name) matrix of one agent database, fed by its writer."""

    def __init__(self, feed: VectorFeed) -> None:
        self.feed = feed
        self._lock = threading.Lock()
        self._matrices: dict[tuple[Table, str], _Matrix] = {}
        # Counters for tests and benchmarks.
        self.loads = 0
        self.fallbacks = 0

    def nbytes(self) -> int:
        """The bytes this index holds in memory: every matrix's arrays (vectors with their
        room to grow, ids, sessions, the live mask) and its id map. Grows with the vectors
        held, by design (docs/design.md §2.3); the soak judges RSS growth beyond it."""
        with self._lock:
            return sum(matrix.nbytes() for matrix in self._matrices.values())

    def nearest_messages(
        self,
        conn: apsw.Connection,
        query: numpy.ndarray,
        *,
        name: str,
        visible_sql: str,
        visible_params: object,
        k: int,
    ) -> list[Near] | None:
        """`storage.vectors.nearest_message_rows` through the index; None: the index could
        not answer exactly (it reloads next time), use the plain path."""
        sql = (
            f"WITH visible(session_id) AS ({visible_sql})"
            " SELECT s.id FROM visible CROSS JOIN sessions s"
            " ON s.id = visible.session_id AND NOT s.dirty"
        )
        return self._nearest(conn, "m", query, name, k, (sql, visible_params))

    def nearest_notes(
        self, conn: apsw.Connection, query: numpy.ndarray, *, name: str, k: int
    ) -> list[Near] | None:
        """`storage.vectors.nearest_note_rows` through the index (every chunk is visible)."""
        return self._nearest(conn, "n", query, name, k, None)

    def _nearest(
        self,
        conn: apsw.Connection,
        table: Table,
        query_vec: numpy.ndarray,
        name: str,
        k: int,
        visible: tuple[str, object] | None,
    ) -> list[Near] | None:
        query = numpy.asarray(query_vec, dtype=numpy.float32).reshape(-1)
        if not self.feed.live:
            return None
        # Inside the caller's transaction the snapshot may predate what the feed still
        # holds: a load then waits for a search in a transaction of its own.
        outer = conn.in_transaction
        with self._lock:
            matrix = self._matrices.get((table, name))
            if matrix is None:
                matrix = self._matrices[(table, name)] = _Matrix(table, name)
            self._forget_unused(table, name)
            matrix.used = time.monotonic()
            try:
                for _ in range(2):  # a rollback seen while catching up: reload once
                    if outer and not matrix.next_seq:
                        return None
                    with conn:  # one read transaction: visibility, catch-up, verification
                        if not matrix.next_seq:
                            seq, resets = self.feed.mark()
                            matrix.load(conn, seq, resets)  # its first read: the snapshot
                            self.loads += 1
                        else:  # the snapshot first, then the feed: nothing slips between
                            conn.execute(_SNAPSHOT).fetchall()
                        if not self._catch_up():
                            continue
                        sessions = self._visible(conn, visible)
                        return self._search(conn, matrix, query, k, sessions)
                raise _Disagrees("the writer keeps rolling back")
            except _Disagrees:
                matrix.next_seq = 0
                self.fallbacks += 1
                return None

    def _forget_unused(self, table: Table, name: str) -> None:
        """Drop the matrices of other names of `table` unused for `FORGET_AFTER_S` (an old
        embedder's, after a model change)."""
        now = time.monotonic()
        for key, matrix in list(self._matrices.items()):
            if key[0] == table and key[1] != name and now - matrix.used > FORGET_AFTER_S:
                del self._matrices[key]

    def _visible(
        self, conn: apsw.Connection, visible: tuple[str, object] | None
    ) -> set[int] | None:
        if visible is None:
            return None
        sql, params = visible
        rows = conn.execute(sql, params).fetchall()  # type: ignore[arg-type]
        return {int(cast(int, r[0])) for r in rows}

    def _catch_up(self) -> bool:
        """Apply what the writer published since to every loaded matrix; False: a rollback
        (or a feed that overflowed), and every matrix reloads."""
        loaded = [m for m in self._matrices.values() if m.next_seq]
        start = min((m.next_seq for m in loaded), default=0)
        changes, next_seq, resets = self.feed.since(start)
        ok = True
        for matrix in loaded:
            if resets != matrix.resets:
                matrix.next_seq, ok = 0, False
                continue
            matrix.apply([c for s, c in changes if s >= matrix.next_seq])
            matrix.next_seq = next_seq
        self.feed.consumed(next_seq if ok and loaded else None)
        return ok

    def _search(
        self,
        conn: apsw.Connection,
        matrix: _Matrix,
        query: numpy.ndarray,
        k: int,
        sessions: set[int] | None,
    ) -> list[Near]:
        size = matrix.size
        if k <= 0 or size == 0:
            return []
        if query.shape[0] != matrix.dim:
            raise ValueError(f"query_vec: expected {matrix.dim} dimensions, got {query.shape[0]}")
        mask = matrix.alive[:size].copy()
        if sessions is not None:
            if not sessions:
                return []
            known = numpy.fromiter(sessions, dtype=numpy.int64, count=len(sessions))
            row_sessions = matrix.sessions[:size]
            top = int(max(int(row_sessions.max(initial=0)), int(known.max())))
            if top > 8 * size + 65536:  # sparse ids: a lookup table would be mostly holes
                mask &= numpy.isin(row_sessions, known)
            else:  # session ids are small rowids: one table lookup per row
                lookup = numpy.zeros(top + 1, dtype=bool)
                lookup[known[known >= 0]] = True
                mask &= lookup[numpy.clip(row_sessions, 0, top)] & (row_sessions >= 0)
        rows = numpy.flatnonzero(mask)
        if len(rows) == 0:
            return []
        if len(rows) < GATHER_BELOW * size:
            scores = products(matrix.vectors[rows], query)
        else:
            scores = products(matrix.vectors[:size], query)[rows]
        margin = rounding_margin(matrix.dim, float(numpy.linalg.norm(query)), matrix.max_norm)
        excluded = numpy.zeros(len(rows), dtype=bool)
        for _ in range(MAX_ROUNDS):
            live = numpy.flatnonzero(~excluded)
            keep = min(k, len(live))
            if keep == 0:
                return []
            live_scores = scores[live]
            kth = float(numpy.partition(live_scores, len(live) - keep)[len(live) - keep])
            chosen = live[live_scores >= kth - margin]
            found = self._verify(conn, matrix, rows[chosen], sessions)
            missing = [j for j in chosen.tolist() if int(rows[j]) not in found]
            if missing:  # not in this snapshot yet: left out, the next ranking decides
                excluded[missing] = True
                continue
            ids = [int(matrix.ids[r]) for r in rows[chosen].tolist()]
            vectors = numpy.stack([found[r] for r in rows[chosen].tolist()])
            exact = canonical_scores(vectors, query)
            order = sorted(range(len(ids)), key=lambda j: (-float(exact[j]), -ids[j]))
            return [Near(ids[j], float(exact[j]), vectors[j]) for j in order[:keep]]
        raise _Disagrees("too many rows not committed yet")

    def _verify(
        self, conn: apsw.Connection, matrix: _Matrix, rows: numpy.ndarray, sessions: set[int] | None
    ) -> dict[int, numpy.ndarray]:
        """The chosen matrix rows that the snapshot holds as indexed, with their stored
        vectors; raises `_Disagrees` if the database holds one differently."""
        table, key = _TABLES[matrix.table]
        session = "session_id" if matrix.table == "m" else "0"
        by_id = {int(matrix.ids[r]): int(r) for r in rows.tolist()}
        stored = cast(
            list[tuple[int, int, str, bytes]],
            conn.execute(
                f"SELECT {key}, {session}, name, vector FROM {table}"
                f" WHERE {key} IN (SELECT value FROM json_each(?))",
                (json.dumps(list(by_id)),),
            ).fetchall(),
        )
        found: dict[int, numpy.ndarray] = {}
        for row_id, session_id, name, blob in stored:
            r = by_id[int(row_id)]
            if name != matrix.name:
                continue  # replaced by another name, not yet in the feed we applied
            if (
                int(session_id) != int(matrix.sessions[r])
                or bytes(blob) != matrix.vectors[r].astype("<f4").tobytes()
            ):
                raise _Disagrees(f"{table} {row_id} differs from the index")
            if sessions is not None and int(session_id) not in sessions:
                raise _Disagrees(f"{table} {row_id}: its session is not visible")
            found[r] = numpy.frombuffer(blob, dtype="<f4")
        return found


_ATTACHED: weakref.WeakKeyDictionary[apsw.Connection, VectorIndexes] = weakref.WeakKeyDictionary()
_ATTACHED_LOCK = threading.Lock()


def attach(conn: apsw.Connection, indexes: VectorIndexes) -> None:
    """Searches on `conn` (a reader of the database whose writer feeds `indexes`) use it."""
    with _ATTACHED_LOCK:
        _ATTACHED[conn] = indexes


def attached(conn: apsw.Connection) -> VectorIndexes | None:
    """The index attached to `conn`, if any."""
    with _ATTACHED_LOCK:
        return _ATTACHED.get(conn)


def detach(conn: apsw.Connection) -> None:
    """`conn` searches without an index from now on (its memory is released)."""
    with _ATTACHED_LOCK:
        _ATTACHED.pop(conn, None)
