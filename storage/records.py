"""The scoped memory records store (docs/design.md §5): `state_dir/records.db`, one file for all agents.

Tables (schema v2, `PRAGMA user_version`, its own migrations):

- `records`: one row per record; `seq` (the integer key, also the FTS rowid and the
  insertion order) and the public `id`; scope columns NULL when not scoped; `metadata` a
  JSON object.
- `relations`: typed, directed edges `source -relation-> target` between records, indexed
  from both ends; `id` is the insertion order (the graph tie-break).
- `record_fts`: FTS5 over the content with the transcript index's tokenizer and columns
  (storage/fts_query.py: Porter stemming, diacritics removed, CJK bigrams), so a query
  finds records the way it finds messages and notes; `context` stays empty.
- `record_vectors` (v2): a record's vector, written by the records embedder actor through
  the keeper (storage/record_vectors.py, docs/design.md §5.7).

Hybrid search (`RecordMeaning` given): the text side's best `limit x candidate multiplier`
matches and the vector side's nearest records under the same SQL filters, fused by
`storage.hybrid.fuse`; `distance` is then 1 - cosine for a record with a vector.

Every filter is SQL: scope (`exact` dimensions), lifecycle (top level only), expiry,
record types and metadata constrain the FTS match itself, so the `LIMIT` counts only rows
in scope. Non-exact scope values only weigh the BM25 rank (`BOOST` per matching dimension).
Equal scores go to the newest record (the highest `seq`).

Common terms (the transcript side's rule, storage/search.py, with a cost threshold and
the matched set kept): ranking by BM25 makes FTS5 read the whole doclist of every term
(its document count), then score and join every row holding any term, a few microseconds
each; for a term in most records that is seconds at a million records. So a term held by
more than `COMMON_DOCS` records is *common* (probed once per reader and term, walking at
most that many doclist entries, newest first), and:

- a query with rarer terms is ranked by those alone (without the whole-query phrase,
  whose matching walks the common terms' doclists); only if fewer than `limit` records in
  scope hold one of them is the rest filled from the records holding a common term, by
  recency (below). What it trades: a common term adds nothing to a record's score, and
  records holding only common terms come after every record holding a rarer one;
- a query of only common terms is answered by recency alone.

The rank budget (storage/search.py `rankable`, docs/design.md §3): a search whose scope is
not listed (below) also ranks at most `RANK_BUDGET` rows: the rarer terms while their
documents add up to it; the others answer by recency like common terms. A rarest term
holding more is ranked over its newest `RANK_BUDGET` matches (`f.rowid >= since`), and every
term then answers by recency after them, so older in-scope matches still fill the limit.

Recency: the newest `max(limit, RECENCY_POOL)` in-scope records holding a common term,
reordered by (common terms held) x (1 + `BOOST` x matching boosted scope values) as BM25
would order them, newest first on ties. What it trades: a record older than that pool
(holding every term, or a boosted value) is not found while newer ones hold a term. Such
records have no relevance score: their distance is 1.0. Whatever is pruned, every record
returned holds a query term and passes every filter, and `limit` records come back
whenever that many in scope hold a term. A store of at most `COMMON_DOCS` records ranks
exactly by BM25. The threshold is a cost, not a share: at a million records a term in 0.2%
of them still has a real BM25 weight (IDF about 6) that is given up for the latency bound.

Small scopes: when the exact scope dimensions leave few records, their seqs are listed
first (one index range) and every FTS row is checked against that in-memory list before its
record is read. A search in a scope holding a share `s` of the store reads about
`RECENCY_POOL / s` records on its way down a common term's doclist (about 1.5 us each,
scattered), where listing costs about 0.35 us per scope record: the list wins below about
`SMALL_SCOPE_FACTOR x sqrt(records in the store)` records (5000 at a million), counted on
the scope index reading at most that many entries.

Graph expansion (docs/design.md §5.4) is a breadth-first search run one SQL query per hop for all
direct results at once: the query returns every relation touching the current frontier
whose other end passes the link filters (memory records only, same scope/metadata/type
filters, not expired; any status). Python then grows each result's tree in BFS order.

Tie-breaking (what makes the tree deterministic): a level's frontier is processed in the
order its vertices were discovered; each vertex's relations in insertion order (relation
`id`), outgoing and incoming merged. A vertex is attached to the first parent that reaches
it, and `max_linked_results` stops the search at that many linked records per result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, cast

import apsw
import msgspec
import numpy

from ..protocol.records import (
    AddRecord,
    DeleteRecord,
    EraseUserRecords,
    InvalidateRecord,
    LinkRecords,
    Record,
    RecordAck,
    RecordAdded,
    RecordCommand,
    RecordDeleted,
    RecordInvalidated,
    RecordRejected,
    RecordRelation,
    RecordsErased,
    RecordsLinked,
    RecordStatus,
    RecordType,
    RestoreRecord,
    SearchScope,
    StoreRecordVectors,
)
from ..protocol.userdata import RecordErasure
from .db import Migration, describe, open_connection
from .fts_query import RANK, TOKENIZE, MatchPlan, index_columns
from .hybrid import Candidate, HybridWeights, fuse
from .record_vectors import (
    PendingRecords,
    RecordMark,
    apply_store_record_vectors,
    cached_record_vectors,
    nearest_records,
    pending_record_count,
    pending_records,
    record_vectors_of,
    v2_record_vectors,
)
from .search import TermStats, indexed_rows, newest_match, rankable
from .transcripts import write_transaction
from .userdata import UserRecords, erase_records, plan_record_erasure, purge, records_of
from .vectors import Near

RECORDS_DB = "records.db"
BOOST = 0.5
"""How much each matching non-exact scope value multiplies a record's BM25 relevance by,
on top of 1 (two matching dimensions: x 2.0)."""
COMMON_DOCS = 2000
"""A term held by more records than this is common (module docstring): ranking by it would
score and join them all."""
RECENCY_POOL = 20
"""At least this many of the newest in-scope matches are reordered when answering by recency
(module docstring); a small scope walks about this many / its share of the store."""
SMALL_SCOPE_FACTOR = 5
"""An exact scope holding at most this x sqrt(indexed records) records is listed before the
FTS match (module docstring)."""
READER_CACHE_KIB = 64 * 1024
"""The reader's page cache (SQLite's default is 2 MiB). A search reads index and record
pages scattered over the file; at a million records those no longer stay in a small or
busy OS page cache, and each one read again costs a system call or a disk read. Used only
as pages are read: a small store never fills it."""
READER_MMAP_BYTES = 1 << 30
"""How much of `records.db` the reader maps (`PRAGMA mmap_size`): a page the OS has cached is
then read in place, with no system call and no copy into SQLite's cache. At a million
records a search's first sight of a few thousand scattered pages was its tail (CPU p99 of
`bench records` 13 -> 6 ms in-process, same run); address space only, the file's pages stay
the OS's to evict."""


def _v1_records(conn: apsw.Connection) -> None:
    types = ", ".join(f"'{t.value}'" for t in RecordType)
    conn.execute(
        f"""
        CREATE TABLE records(
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            content TEXT NOT NULL,
            record_type TEXT NOT NULL CHECK (record_type IN ({types})),
            user_id TEXT,
            agent_id TEXT,
            thread_id TEXT,
            status TEXT NOT NULL DEFAULT 'valid' CHECK (status IN ('valid', 'invalid')),
            invalid_reason TEXT,
            invalidated_at REAL,
            metadata TEXT NOT NULL DEFAULT '{{}}',
            role TEXT,
            ts REAL NOT NULL,
            expires_at REAL,
            created_at REAL NOT NULL
        ) STRICT;
        -- exact scope filters; each dimension leads one index so any exact one can drive
        CREATE INDEX records_user ON records(user_id, agent_id, thread_id);
        CREATE INDEX records_agent ON records(agent_id, thread_id);
        CREATE INDEX records_thread ON records(thread_id);
        CREATE INDEX records_expiry ON records(expires_at) WHERE expires_at IS NOT NULL;

        CREATE TABLE relations(
            id INTEGER PRIMARY KEY,
            source INTEGER NOT NULL REFERENCES records(seq) ON DELETE CASCADE,
            target INTEGER NOT NULL REFERENCES records(seq) ON DELETE CASCADE,
            relation TEXT NOT NULL,
            created_at REAL NOT NULL,
            UNIQUE (source, target, relation),
            CHECK (source <> target)
        ) STRICT;
        CREATE INDEX relations_target ON relations(target);

        -- rowid = records.seq; contentless: the text lives in records.content
        CREATE VIRTUAL TABLE record_fts USING fts5(
            words, grams, context, content='', contentless_delete=1, tokenize='{TOKENIZE}'
        );
        INSERT INTO record_fts(record_fts, rank) VALUES ('rank', '{RANK}');
        """
    )


MIGRATIONS: tuple[Migration, ...] = (_v1_records, v2_record_vectors)
SCHEMA_VERSION = len(MIGRATIONS)


def records_db_path(state_dir: Path) -> Path:
    """`state_dir/records.db` (docs/design.md §1.4)."""
    return state_dir / RECORDS_DB


# `records.db`: its own migrations, and a reader that keeps more pages in memory.
open_records_connection = partial(
    open_connection, migrations=MIGRATIONS, reader_cache_kib=READER_CACHE_KIB
)


_encode_metadata = msgspec.json.Encoder().encode
_decode_metadata = msgspec.json.Decoder(dict[str, Any]).decode

_COLUMNS = (
    "{a}.seq, {a}.id, {a}.content, {a}.record_type, {a}.user_id, {a}.agent_id, {a}.thread_id,"
    " {a}.status, {a}.invalid_reason, {a}.metadata, {a}.ts, {a}.expires_at, {a}.role"
)
_INSERT = (
    "INSERT INTO records(id, content, record_type, user_id, agent_id, thread_id, metadata,"
    " role, ts, expires_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_INSERT_FTS = "INSERT INTO record_fts(rowid, words, grams, context) VALUES (?, ?, ?, NULL)"


def _record(row: Sequence[Any]) -> tuple[int, Record]:
    seq, id_, content, rtype, user, agent, thread, status, reason, meta, ts, expires, role = row
    return int(seq), Record(
        id=id_,
        content=content,
        record_type=RecordType(rtype),
        user_id=user,
        agent_id=agent,
        thread_id=thread,
        status=RecordStatus(status),
        invalid_reason=reason,
        metadata=_decode_metadata(meta),
        timestamp=ts,
        expires_at=expires,
        role=role,
    )


def link_ends(
    rel: RecordRelation, source: int | None, target: int | None
) -> tuple[int, int] | RecordRejected:
    """The seqs of a link's two records (None: not stored), or why they cannot be linked.
    Both stores' writers ask it."""
    if source is None:
        return RecordRejected(reason="not_found", message=f"source_id: no record {rel.source_id!r}")
    if target is None:
        return RecordRejected(reason="not_found", message=f"target_id: no record {rel.target_id!r}")
    if source == target:
        return RecordRejected(
            reason="invalid", message="target_id: a record cannot be linked to itself"
        )
    return source, target


class RecordWriter:
    """Applies record commands, a batch per transaction (group commit).

    Belongs to the records keeper alone. Every handler decides to reject *before* it
    writes: a batch shares one transaction, so a half-applied rejected command would be
    committed with the others.
    """

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn
        self._purge_after_commit = False  # set by an erase (docs/design.md §2.6)

    def apply(self, commands: Sequence[RecordCommand]) -> list[RecordAck]:
        """Apply `commands` in one transaction; one ack per command, in order.

        If the transaction fails, it is rolled back whole and, unless another writer holds
        the lock, each command is retried alone so one bad command cannot sink the others.
        After a batch with an erase commits, the file is purged (storage/userdata.py).
        """
        try:
            with write_transaction(self.conn):
                acks = [self._apply_one(cmd) for cmd in commands]
        except apsw.Error as exc:
            self._purge_after_commit = False
            if len(commands) == 1 or isinstance(exc, apsw.BusyError | apsw.LockedError):
                return [RecordRejected(reason="storage", message=describe(exc)) for _ in commands]
            return [ack for cmd in commands for ack in self.apply([cmd])]
        if self._purge_after_commit:
            self._purge_after_commit = False
            problem = purge(self.conn)
            acks = [
                RecordsErased(
                    erasure=msgspec.structs.replace(
                        a.erasure, purged=problem is None, problem=problem
                    )
                )
                if isinstance(a, RecordsErased)
                else a
                for a in acks
            ]
        return acks

    def _apply_one(self, cmd: RecordCommand) -> RecordAck:
        match cmd:
            case AddRecord():
                return self._add(cmd)
            case LinkRecords():
                return self._link(cmd)
            case InvalidateRecord():
                return self._invalidate(cmd)
            case DeleteRecord():
                return self._delete(cmd)
            case RestoreRecord():
                return self._restore(cmd)
            case EraseUserRecords():
                self._purge_after_commit = True
                return RecordsErased(erasure=erase_records(self.conn, cmd.user_ids))
            case StoreRecordVectors():
                return apply_store_record_vectors(self.conn, cmd.name, cmd.rows)

    def _seq(self, record_id: str) -> int | None:
        row = self.conn.execute("SELECT seq FROM records WHERE id = ?", (record_id,)).fetchone()
        return None if row is None else int(row[0])

    def _add(self, cmd: AddRecord) -> RecordAck:
        r = cmd.record
        if self._seq(r.id) is not None:
            return RecordRejected(reason="invalid", message=f"id: {r.id!r} already exists")
        self.conn.execute(
            _INSERT,
            (
                r.id,
                r.content,
                r.record_type.value,
                r.user_id,
                r.agent_id,
                r.thread_id,
                _encode_metadata(r.metadata).decode(),
                r.role,
                r.timestamp,
                r.expires_at,
                cmd.at,
            ),
        )
        seq = self.conn.last_insert_rowid()
        self.conn.execute(_INSERT_FTS, (seq, *index_columns(r.content)))
        return RecordAdded(id=r.id)

    def _restore(self, cmd: RestoreRecord) -> RecordAck:
        """An exported record back as it was: `_add`, then its status and times."""
        r = cmd.record
        ack = self._add(AddRecord(record=r, at=cmd.created_at))
        if isinstance(ack, RecordAdded) and r.status == RecordStatus.INVALID:
            self.conn.execute(
                "UPDATE records SET status = 'invalid', invalid_reason = ?, invalidated_at = ?"
                " WHERE id = ?",
                (r.invalid_reason, cmd.invalidated_at, r.id),
            )
        return ack

    def _link(self, cmd: LinkRecords) -> RecordAck:
        rel = cmd.relation
        ends = link_ends(rel, self._seq(rel.source_id), self._seq(rel.target_id))
        if isinstance(ends, RecordRejected):
            return ends
        source, target = ends
        self.conn.execute(
            "INSERT OR IGNORE INTO relations(source, target, relation, created_at)"
            " VALUES (?, ?, ?, ?)",
            (source, target, rel.relation, cmd.at),
        )
        return RecordsLinked(relation=rel, created=self.conn.changes() > 0)

    def _invalidate(self, cmd: InvalidateRecord) -> RecordAck:
        self.conn.execute(
            "UPDATE records SET status = 'invalid', invalid_reason = ?, invalidated_at = ?"
            " WHERE id = ?",
            (cmd.reason, cmd.at, cmd.id),
        )
        if self.conn.changes() == 0:
            return RecordRejected(reason="not_found", message=f"id: no record {cmd.id!r}")
        return RecordInvalidated(id=cmd.id, reason=cmd.reason)

    def _delete(self, cmd: DeleteRecord) -> RecordAck:
        seq = self._seq(cmd.id)
        if seq is None:
            return RecordRejected(reason="not_found", message=f"id: no record {cmd.id!r}")
        (relations,) = self.conn.execute(
            "SELECT (SELECT count(*) FROM relations WHERE source = ?1)"
            " + (SELECT count(*) FROM relations WHERE target = ?1)",
            (seq,),
        ).fetchone() or (0,)
        self.conn.execute("DELETE FROM record_fts WHERE rowid = ?", (seq,))
        self.conn.execute("DELETE FROM records WHERE seq = ?", (seq,))  # relations cascade
        return RecordDeleted(id=cmd.id, relations=int(relations))


@dataclass(frozen=True)
class RecordQuery:
    """A search as the store runs it: every filter resolved.

    `metadata`: (key, value) pairs a record must all hold at the top level of its metadata,
    with equal scalar values (str, int/float as numbers, bool, None; True is not 1).
    `record_types`: None for any type. `include_invalid` applies to direct matches only.
    `boosts`: the non-exact scope dimensions whose value ranks matching records higher (an
    omitted dimension is neither filtered nor boosted).
    """

    scope: SearchScope
    now: float
    limit: int
    boosts: frozenset[str] = frozenset()  # non-exact dimensions whose value ranks higher
    include_invalid: bool = True
    record_types: tuple[RecordType, ...] | None = None
    metadata: tuple[tuple[str, object], ...] = ()
    num_hops: int = 0
    max_linked: int = 100


class RecordMeaning(NamedTuple):
    """The vector side of a hybrid records search (docs/design.md §5.7): the query's vector
    in the embedder's space `name`, the fusion weights, how many candidates each side
    brings per result wanted, and how close a record only the vector side found must be."""

    vector: numpy.ndarray
    name: str
    weights: HybridWeights
    multiplier: int = 4
    min_similarity: float = 0.0


class LinkedNode(NamedTuple):
    """A record reached by graph expansion, the stored relation it was reached through,
    and its own children."""

    relation: RecordRelation
    record: Record
    children: list[LinkedNode]


class RecordHit(NamedTuple):
    """A direct match: its record, its distance (see `distance_of`) and its linked tree."""

    record: Record
    distance: float
    linked: list[LinkedNode]


def distance_of(score: float) -> float:
    """`1 / (1 + s)` for the boosted BM25 relevance `s = -score` (FTS5 rank is ≤ 0)."""
    return 1.0 / (1.0 + max(0.0, -score))


def _common_docs(total: int) -> int:
    return COMMON_DOCS


_TERMS_HELD = "record_terms_held"


def _terms_held(api: apsw.FTS5ExtensionApi, *args: apsw.SQLiteValue) -> int:
    """FTS5 auxiliary function: how many of the query's phrases the current row holds."""
    return sum(1 for phrase in range(api.phrase_count) if api.phrase_columns(phrase))


@dataclass
class _Node:
    seq: int
    edge: tuple[int, str, int, int] | None  # (relation id, name, source seq, target seq)
    children: list[_Node] = field(default_factory=list)


class RecordReader:
    """Reads `records.db` on its own connection (WAL: never blocks the writer)."""

    def __init__(self, conn: apsw.Connection) -> None:
        self.conn = conn
        conn.pragma("mmap_size", READER_MMAP_BYTES)
        self._terms = TermStats("record_fts", _common_docs)
        conn.register_fts5_function(_TERMS_HELD, _terms_held)

    def get(self, record_id: str, now: float) -> Record | None:
        """The record `record_id`, unless it does not exist or has expired."""
        row = self.conn.execute(
            f"SELECT {_COLUMNS.format(a='r')} FROM records r"
            " WHERE r.id = ? AND (r.expires_at IS NULL OR r.expires_at > ?)",
            (record_id, now),
        ).fetchone()
        return None if row is None else _record(row)[1]

    def linked(self, record_id: str, query: RecordQuery) -> RecordHit | None:
        """The record `record_id` (unless it does not exist or has expired) with the linked
        tree a search would attach to it (`query.num_hops`, `query.max_linked`, the link
        filters); distance 0. One read transaction."""
        with self.conn:
            row = self.conn.execute(
                f"SELECT {_COLUMNS.format(a='r')} FROM records r"
                " WHERE r.id = ? AND (r.expires_at IS NULL OR r.expires_at > ?)",
                (record_id, query.now),
            ).fetchone()
            if row is None:
                return None
            seq, rec = _record(row)
            trees = self._expand([seq], query) if rec.record_type == RecordType.MEMORY else {}
            records = self._records(linked_seqs(trees))
        return hits_of([(seq, rec, 0.0)], trees, records)[0]

    def records_of(self, user_ids: tuple[str, ...] | None, agent: str | None) -> UserRecords:
        """The records of these users (None: every record, as `migrate` copies them; with
        `agent`: those scoped to it or to no agent) and
        the relations among them, as `mem.export_identity` writes them (storage/userdata.py
        `records_of`); one snapshot."""
        return records_of(self.conn, user_ids, agent)

    def plan_record_erasure(self, user_ids: tuple[str, ...]) -> RecordErasure:
        """What `EraseUserRecords(user_ids)` would remove, as the erase counts it
        (`mem.erase_identity(dry_run=True)`); one snapshot."""
        return plan_record_erasure(self.conn, user_ids)

    # -- the records embedder actor's reads (actors/embedder.py `RecordFeed`) ---------------

    def pending_records(self, name: str, *, mark: RecordMark, limit: int) -> PendingRecords:
        return pending_records(self.conn, name, mark=mark, limit=limit)

    def pending_record_count(self, name: str, *, mark: RecordMark) -> int:
        return pending_record_count(self.conn, name, mark=mark)

    def cached_record_vectors(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        return cached_record_vectors(self.conn, name, digests)

    def count(self) -> int:
        """How many records are stored (expired ones included)."""
        row = self.conn.execute("SELECT count(*) FROM records").fetchone()
        return int(row[0]) if row else 0

    def search(
        self, plan: MatchPlan, query: RecordQuery, meaning: RecordMeaning | None = None
    ) -> list[RecordHit]:
        """The best `query.limit` records in scope matching `plan`, each with its linked
        tree (`query.num_hops`), best first; one read transaction. With `meaning`, the
        text and vector sides fused (module docstring, `_fused`)."""
        with self.conn:  # one snapshot for the matches and their graph
            if meaning is None:
                ranked = [
                    (seq, rec, distance_of(score)) for score, seq, rec in self._matches(plan, query)
                ]
            else:
                ranked = self._fused(plan, query, meaning)
            roots = [seq for seq, rec, _ in ranked if rec.record_type == RecordType.MEMORY]
            trees = self._expand(roots, query)
            records = self._records(linked_seqs(trees))
        return hits_of(ranked, trees, records)

    def _fused(
        self, plan: MatchPlan, query: RecordQuery, meaning: RecordMeaning
    ) -> list[tuple[int, Record, float]]:
        """Hybrid: (seq, record, distance) of the best `query.limit`, fused.

        Each side brings `limit x multiplier` candidates: the text side's best matches, and
        the records nearest the query vector (at least `min_similarity`) under the very
        filters of the text side, in SQL before `k`. Every candidate with a vector is
        scored by meaning, whichever side found it (`storage.hybrid.fuse`). `distance`:
        1 - cosine for a record with a vector, else the text side's `distance_of`.
        """
        pool = query.limit * meaning.multiplier
        text = self._matches(plan, dataclasses.replace(query, limit=pool))
        params: dict[str, object] = {}
        where = _filters("r", query, params)
        if not query.include_invalid:
            where.append("r.status = 'valid'")
        near = [
            row
            for row in nearest_records(
                self.conn, meaning.vector, name=meaning.name, where=where, params=params, k=pool
            )
            if row.similarity >= meaning.min_similarity
        ]
        return fused_hits(
            query,
            meaning,
            text,
            near,
            lambda seqs: record_vectors_of(self.conn, seqs, name=meaning.name),
            self._records,
        )

    def _matches(self, plan: MatchPlan, query: RecordQuery) -> list[tuple[float, int, Record]]:
        """The direct matches, best first: ranked, then (when pruned) by recency."""
        params: dict[str, object] = {"limit": query.limit}
        where = _filters("r", query, params)
        if not query.include_invalid:
            where.append("r.status = 'valid'")
        boosts = []
        for dim, value, exact in _dimensions(query.scope):
            if not exact and dim in query.boosts:
                params[f"boost_{dim}"] = value
                boosts.append(f"(r.{dim} IS :boost_{dim})")
        level = " + ".join(boosts) if boosts else "0"
        total = indexed_rows(self.conn, "record_fts")
        scoped = [f"{dim} IS :exact_{dim}" for dim, _, on in _dimensions(query.scope) if on]
        small = bool(scoped) and self._scope_is_small(scoped, params, total)
        if small:
            # Checked against an in-memory list before the record is read (`+`: not a
            # constraint FTS5 would answer with one doclist seek per listed record).
            where.append(f"+f.rowid IN (SELECT seq FROM records WHERE {' AND '.join(scoped)})")
        ranked, recent, since = self._steps(plan, total, bounded=not small)
        hits: list[tuple[float, int, Record]] = []
        if ranked is not None:
            score = f"f.rank * (1.0 + {BOOST} * ({level}))" if boosts else "f.rank"
            sql = (
                f"SELECT {score} AS score, {_COLUMNS.format(a='r')}"
                " FROM record_fts f JOIN records r ON r.seq = f.rowid"
                f" WHERE {' AND '.join(['record_fts MATCH :match', 'f.rowid >= :since', *where])}"
                " ORDER BY score, r.seq DESC LIMIT :limit"
            )
            ranked_rows = self.conn.execute(sql, params | {"match": ranked, "since": since})
            hits = [(cast(float, row[0]), *_record(row[1:])) for row in ranked_rows]
        if recent is not None and len(hits) < query.limit:
            # The newest in-scope records holding a term (none already found), reordered
            # by how many terms they hold times their boost, as BM25 scores would.
            sql = (
                f"SELECT {_TERMS_HELD}(record_fts) * (1.0 + {BOOST} * ({level})),"
                f" {_COLUMNS.format(a='r')} FROM record_fts f JOIN records r ON r.seq = f.rowid"
                f" WHERE {' AND '.join(['record_fts MATCH :match', *where])}"
                " AND f.rowid NOT IN (SELECT value FROM json_each(:found))"
                " ORDER BY f.rowid DESC LIMIT :pool"
            )
            found = msgspec.json.encode([seq for _, seq, _ in hits]).decode()
            pool = max(query.limit, RECENCY_POOL)
            rows = self.conn.execute(
                sql, params | {"match": recent, "found": found, "pool": pool}
            ).fetchall()
            rows.sort(key=lambda row: -cast(float, row[0]))  # stable: newest first on ties
            hits += [(0.0, *_record(row[1:])) for row in rows[: query.limit - len(hits)]]
        return hits

    def _scope_is_small(self, exact: list[str], params: dict[str, object], total: int) -> bool:
        """Whether the `exact` scope conditions leave few enough records to list (module
        docstring); reads at most that many index entries."""
        small = int(SMALL_SCOPE_FACTOR * math.sqrt(total))
        row = self.conn.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM records WHERE {' AND '.join(exact)}"
            " LIMIT :small)",
            params | {"small": small + 1},
        ).fetchone()
        return row is not None and int(row[0]) <= small

    def _steps(
        self, plan: MatchPlan, total: int, *, bounded: bool
    ) -> tuple[str | None, str | None, int]:
        """`search_steps` as FTS5 expressions: (ranked by BM25, answered by recency after
        it, the lowest seq the ranked one reads), either expression None."""
        found = search_steps(
            plan,
            total,
            bounded=bounded,
            docs=lambda i: self._terms.docs(self.conn, plan.term_exprs[i], total),
            newest=lambda i: newest_match(self.conn, "record_fts", plan.term_exprs[i]),
        )
        ranked = None if found.ranked is None else plan.expression(found.ranked)
        recent = None
        if found.recent is not None:
            recent = " OR ".join(e for e, r in zip(plan.term_exprs, found.recent, strict=True) if r)
        return ranked, recent, found.since

    def _expand(self, roots: list[int], query: RecordQuery) -> dict[int, _Node]:
        """Each root's shortest-path tree, grown breadth first, one query per hop."""
        params: dict[str, object] = {}
        link_filters = ["n.record_type = 'memory'", *_filters("n", query, params)]
        where = " AND ".join(link_filters)
        sql = (
            # CROSS JOIN: the frontier drives (SQLite never reorders a CROSS JOIN), so each
            # hop is index seeks from the frontier, never a scan of the relations.
            "SELECT e.id, e.relation, e.source, e.target, e.source FROM json_each(:frontier) fr"
            " CROSS JOIN relations e ON e.source = fr.value JOIN records n ON n.seq = e.target"
            f" WHERE {where}"
            " UNION ALL"
            " SELECT e.id, e.relation, e.source, e.target, e.target FROM json_each(:frontier) fr"
            " CROSS JOIN relations e ON e.target = fr.value JOIN records n ON n.seq = e.source"
            f" WHERE {where}"
        )

        def edges_of(wanted: list[int]) -> list[Edge]:
            params["frontier"] = msgspec.json.encode(wanted).decode()
            return cast(list[Edge], self.conn.execute(sql, params).fetchall())

        return grow_trees(roots, query, edges_of)

    def _records(self, seqs: set[int]) -> dict[int, Record]:
        if not seqs:
            return {}
        rows = self.conn.execute(
            f"SELECT {_COLUMNS.format(a='r')} FROM records r"
            " WHERE r.seq IN (SELECT value FROM json_each(?))",
            (msgspec.json.encode(sorted(seqs)).decode(),),
        )
        return dict(_record(row) for row in rows)


Edge = tuple[int, str, int, int, int]
"""A relation found by one hop: (relation id, name, source seq, target seq, the frontier
vertex it touches)."""


class SearchSteps(NamedTuple):
    """What a search ranks and what it answers by recency (module docstring): a keep-mask
    over the plan's terms for each step (`ranked` all True: the whole query, phrase
    included), None for a step not run; `since`, the lowest seq the ranked step reads."""

    ranked: list[bool] | None
    recent: list[bool] | None
    since: int


def search_steps(
    plan: MatchPlan,
    total: int,
    *,
    bounded: bool,
    docs: Callable[[int], int],
    newest: Callable[[int], int],
) -> SearchSteps:
    """The common-term and rank-budget rules of a records search, for any store: `total`
    indexed records; `docs(i)` how many hold term i, counted up to `COMMON_DOCS` + 1;
    `newest(i)` the seq of term i's `RANK_BUDGET`-th newest record; `bounded` as for
    `storage.search.rankable`."""
    every = [True] * len(plan.term_exprs)
    if total <= COMMON_DOCS:
        return SearchSteps(every, None, 0)
    counts = [docs(i) for i in range(len(plan.term_exprs))]
    ranked, rarest, windowed = rankable(counts, COMMON_DOCS, bounded=bounded)
    since = newest(rarest) if windowed else 0
    if all(ranked) and not since:
        return SearchSteps(every, None, 0)
    # By recency after the ranked ones: the terms left out, and with a window every term
    # (the rarest's older matches come after the window's best).
    rest = [bool(since) or not r for r in ranked]
    if not any(ranked):
        return SearchSteps(None, rest, 0)
    # Without the phrase unless every term is ranked: matching it walks the others'
    # doclists.
    return SearchSteps(ranked, rest, since)


def grow_trees(
    roots: list[int], query: RecordQuery, edges_of: Callable[[list[int]], list[Edge]]
) -> dict[int, _Node]:
    """Each root's shortest-path tree (module docstring, "Tie-breaking"), breadth first:
    `edges_of(frontier)` answers one hop for every tree at once (the relations touching
    those seqs whose other end passes the link filters)."""
    trees = {seq: _Node(seq, None) for seq in roots}
    if query.num_hops == 0 or query.max_linked == 0 or not trees:
        return trees
    visited = {seq: {seq} for seq in trees}
    frontiers = {seq: [tree] for seq, tree in trees.items()}
    for _hop in range(query.num_hops):
        wanted = sorted({node.seq for nodes in frontiers.values() for node in nodes})
        if not wanted:
            break
        edges: dict[int, list[tuple[int, str, int, int]]] = {}
        for edge_id, name, source, target, vertex in edges_of(wanted):
            edges.setdefault(vertex, []).append((edge_id, name, source, target))
        for found in edges.values():
            found.sort()  # insertion order, both directions merged
        for root, frontier in frontiers.items():
            seen = visited[root]
            room = query.max_linked - (len(seen) - 1)
            nxt: list[_Node] = []
            for node in frontier:
                for edge in edges.get(node.seq, ()):
                    other = edge[3] if edge[2] == node.seq else edge[2]
                    if other in seen or room <= 0:
                        continue
                    seen.add(other)
                    room -= 1
                    child = _Node(other, edge)
                    node.children.append(child)
                    nxt.append(child)
            frontiers[root] = nxt
    return trees


def hits_of(
    ranked: list[tuple[int, Record, float]],
    trees: dict[int, _Node],
    records: dict[int, Record],
) -> list[RecordHit]:
    """The search's answer: each ranked (seq, record, distance) with its linked tree;
    `records` holds every linked record by seq."""
    id_of = {seq: rec.id for seq, rec, _ in ranked} | {s: r.id for s, r in records.items()}
    return [
        RecordHit(
            record=rec,
            distance=distance,
            linked=[_linked(child, records, id_of) for child in trees[seq].children]
            if seq in trees
            else [],
        )
        for seq, rec, distance in ranked
    ]


def linked_seqs(trees: dict[int, _Node]) -> set[int]:
    """The seqs of every linked record of these trees."""
    return {n.seq for tree in trees.values() for n in _walk(tree)}


def _walk(node: _Node) -> list[_Node]:
    out = []
    stack = list(node.children)
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(current.children)
    return out


def _linked(node: _Node, records: dict[int, Record], id_of: dict[int, str]) -> LinkedNode:
    assert node.edge is not None
    _, name, source, target = node.edge
    return LinkedNode(
        relation=RecordRelation(relation=name, source_id=id_of[source], target_id=id_of[target]),
        record=records[node.seq],
        children=[_linked(child, records, id_of) for child in node.children],
    )


def _dimensions(scope: SearchScope) -> list[tuple[str, str | None, bool]]:
    return [
        ("user_id", scope.user_id, scope.exact_user_match),
        ("agent_id", scope.agent_id, scope.exact_agent_match),
        ("thread_id", scope.thread_id, scope.exact_thread_match),
    ]


def fused_hits(
    query: RecordQuery,
    meaning: RecordMeaning,
    text: list[tuple[float, int, Record]],
    near: list[Near],
    read_vectors: Callable[[list[int]], dict[int, numpy.ndarray]],
    read_records: Callable[[set[int]], dict[int, Record]],
) -> list[tuple[int, Record, float]]:
    """The hybrid half of a records search both stores share (`RecordReader._fused`):
    the text side's matches (score, seq, record) and the vector side's `near` records as
    `fuse` candidates, every candidate with a stored vector scored by meaning; (seq,
    record, distance) of the best `query.limit`, distance 1 - cosine for a record with a
    vector, else the text side's `distance_of`. `read_vectors` and `read_records` read
    the store inside the search's snapshot."""
    vectors = {row.id: row.vector for row in near}
    missing = [seq for _, seq, _ in text if seq not in vectors]
    vectors |= read_vectors(missing)
    found = {seq: (score, rec) for score, seq, rec in text}
    only = read_records({row.id for row in near if row.id not in found})
    records = {seq: rec for seq, (_, rec) in found.items()} | only
    boosted = [
        (dim, value)
        for dim, value, exact in _dimensions(query.scope)
        if not exact and dim in query.boosts
    ]

    def boost(rec: Record) -> float:  # as the text side's SQL (`_matches`)
        return 1.0 + BOOST * sum(bool(getattr(rec, dim) == value) for dim, value in boosted)

    candidates = [
        Candidate(seq, max(0.0, -score), vectors.get(seq), rec.timestamp, boost=boost(rec))
        for seq, (score, rec) in found.items()
    ] + [
        Candidate(row.id, None, row.vector, records[row.id].timestamp, boost=boost(only[row.id]))
        for row in near
        if row.id not in found
    ]
    fused = fuse(candidates, meaning.vector, meaning.weights, limit=query.limit, now=query.now)
    query_vec = numpy.asarray(meaning.vector, dtype=numpy.float32)
    out = []
    for hit in fused:
        seq = cast(int, hit.key)
        vector = vectors.get(seq)
        if vector is not None:
            distance = min(2.0, max(0.0, 1.0 - float(vector @ query_vec)))
        else:
            distance = distance_of(found[seq][0])
        out.append((seq, records[seq], distance))
    return out


def _filters(alias: str, query: RecordQuery, params: dict[str, object]) -> list[str]:
    """The SQL conditions every returned record (direct or linked) must meet."""
    params["now"] = query.now
    clauses = [f"({alias}.expires_at IS NULL OR {alias}.expires_at > :now)"]
    for dim, value, exact in _dimensions(query.scope):
        if exact:
            params[f"exact_{dim}"] = value
            clauses.append(f"{alias}.{dim} IS :exact_{dim}")
    if query.record_types is not None:
        params["types"] = msgspec.json.encode([t.value for t in query.record_types]).decode()
        clauses.append(f"{alias}.record_type IN (SELECT value FROM json_each(:types))")
    for i, (key, wanted) in enumerate(query.metadata):
        params[f"meta_key_{i}"] = key
        clauses.append(
            f"EXISTS (SELECT 1 FROM json_each({alias}.metadata) j WHERE j.key = :meta_key_{i}"
            f" AND {_metadata_value(i, wanted, params)})"
        )
    return clauses


def _metadata_value(i: int, value: object, params: dict[str, object]) -> str:
    # json_each's `type` tells JSON true/false/null apart from 1/0/'null' text.
    if value is None:
        return "j.type = 'null'"
    if value is True:
        return "j.type = 'true'"
    if value is False:
        return "j.type = 'false'"
    params[f"meta_value_{i}"] = value
    if isinstance(value, int | float):
        assert math.isfinite(value)
        return f"j.type IN ('integer', 'real') AND j.atom = :meta_value_{i}"
    return f"j.type = 'text' AND j.atom = :meta_value_{i}"


def fts_integrity_ok(conn: apsw.Connection) -> bool:
    """FTS5's own integrity check of the records index (read-only)."""
    rows = conn.execute("PRAGMA integrity_check(record_fts)").fetchall()
    return cast(list[tuple[str]], rows) == [("ok",)]
