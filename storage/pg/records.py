"""Scoped memory records on PostgreSQL (docs/design.md §5, §11): the twin of storage/records.py.

`PgRecordWriter.apply` gives the acks `RecordWriter.apply` gives for the same commands, and
`PgRecordReader.search` the same hits as `RecordReader.search` (the differential test,
tests/test_pg_records.py, holds both equal). What is shared is imported, not copied: the
search steps (`search_steps`: common terms, the rank budget, windows), the shortest-path
tree (`grow_trees`) and the hits (`hits_of`) from storage/records.py; the terms, the
tsquery and BM25 (`activememory.bm25`, `_idf`, `_bm25_params`) from this package.

Keying (docs/design.md §11, "Records"): `records.db` is one file for every agent of a
state directory, records being scoped by their own fields. Here every table is keyed by
the records' **tenant** first, in a column named `agent` (the schema-wide rule that
row-level security and Citus distribution follow): the deployment whose records these are.
A record's `agent_id` stays a scope field like `user_id`.

Layout: `records(agent, seq)` holds the record and its index row (`tokens`, `terms`: the
SQLite index's own tokens as a tsvector, storage/pg/terms.py); `record_relations(agent,
id)` the typed edges; `record_stats(agent, slot)` BM25's N and total length, summed over a
few slots so concurrent writers do not queue on one row. Seqs and relation ids come from
sequences: they grow with insertion as SQLite's do, which is all the tie-breaks use.

Vectors: `record_vectors(agent, seq)` (storage/pg/record_vectors.py); a search given a
`RecordMeaning` fuses both sides as on SQLite (storage/records.py `fused_hits`).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any, cast

import msgspec
import psycopg
import psycopg.errors
from psycopg.types.json import Jsonb

from ...protocol.errors import StorageError
from ...protocol.records import (
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
    RecordsErased,
    RecordsLinked,
    RecordStatus,
    RecordType,
    RestoreRecord,
    StoreRecordVectors,
)
from ...protocol.userdata import RecordErasure
from ..fts_query import MatchPlan
from ..record_vectors import PendingRecords, RecordMark
from ..records import (
    BOOST,
    COMMON_DOCS,
    RECENCY_POOL,
    SMALL_SCOPE_FACTOR,
    Edge,
    RecordHit,
    RecordMeaning,
    RecordQuery,
    _decode_metadata,
    _dimensions,
    _encode_metadata,
    distance_of,
    fused_hits,
    grow_trees,
    hits_of,
    link_ends,
    linked_seqs,
    search_steps,
)
from ..search import RANK_BUDGET
from ..userdata import UserRecords
from .db import SCHEMA, Reopen, describe, lost
from .record_vectors import (
    apply_store_record_vectors,
    cached_record_vectors,
    nearest_records,
    pending_record_count,
    pending_records,
    record_vectors_of,
)
from .search import _bm25_params, bm25_sql, execute_custom
from .terms import PgQuery, index_terms, pg_query
from .transcripts import (
    BulkRows,
    Connection,
    _text,
    _text_bytes,
    configure_reader,
    configure_writer,
)

_S = SCHEMA
STAT_SLOTS = 16
"""BM25's counters are spread over this many rows per tenant (`record_stats`): a writer
adds to a random one, a search sums them."""
_RACE_RETRIES = 8
_RACES = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.UniqueViolation,
)


def records_ddl() -> str:
    """The records tables (schema step 2, storage/pg/db.py): keyed by tenant (`agent`) first."""
    types = ", ".join(f"'{t.value}'" for t in RecordType)
    return f"""
CREATE SEQUENCE {_S}.record_seqs;
CREATE SEQUENCE {_S}.relation_ids;
CREATE TABLE {_S}.records(
    agent text NOT NULL,
    seq bigint NOT NULL,
    id text NOT NULL,
    -- bytea: a record's content and reason may hold NUL, which text cannot
    content bytea NOT NULL,
    record_type text NOT NULL CHECK (record_type IN ({types})),
    user_id text,
    agent_id text,
    thread_id text,
    status text NOT NULL DEFAULT 'valid' CHECK (status IN ('valid', 'invalid')),
    invalid_reason bytea,
    invalidated_at double precision,
    -- the JSON text as written (jsonb would renumber 1e300 and rejects \\u0000), and a
    -- jsonb copy to filter by, its strings NUL-escaped (`_filterable`)
    metadata text NOT NULL DEFAULT '{{}}',
    meta jsonb NOT NULL DEFAULT '{{}}',
    role text,
    ts double precision NOT NULL,
    expires_at double precision,
    created_at double precision NOT NULL,
    tokens integer NOT NULL,
    terms tsvector NOT NULL,
    PRIMARY KEY (agent, seq),
    UNIQUE (agent, id)
);
CREATE INDEX records_user ON {_S}.records(agent, user_id, agent_id, thread_id);
CREATE INDEX records_agent ON {_S}.records(agent, agent_id, thread_id);
CREATE INDEX records_thread ON {_S}.records(agent, thread_id);
CREATE INDEX records_expiry ON {_S}.records(agent, expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX records_terms ON {_S}.records USING gin (agent, terms);
CREATE TABLE {_S}.record_relations(
    agent text NOT NULL,
    id bigint NOT NULL,
    source bigint NOT NULL,
    target bigint NOT NULL,
    relation text NOT NULL,
    created_at double precision NOT NULL,
    PRIMARY KEY (agent, id),
    UNIQUE (agent, source, target, relation),
    FOREIGN KEY (agent, source) REFERENCES {_S}.records(agent, seq) ON DELETE CASCADE,
    FOREIGN KEY (agent, target) REFERENCES {_S}.records(agent, seq) ON DELETE CASCADE,
    CHECK (source <> target)
);
CREATE INDEX record_relations_target ON {_S}.record_relations(agent, target);
CREATE TABLE {_S}.record_stats(
    agent text NOT NULL,
    slot integer NOT NULL,
    records bigint NOT NULL DEFAULT 0,
    tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, slot)
);
"""


_COLUMNS = (
    "{a}.seq, {a}.id, {a}.content, {a}.record_type, {a}.user_id, {a}.agent_id, {a}.thread_id,"
    " {a}.status, {a}.invalid_reason, {a}.metadata, {a}.ts, {a}.expires_at, {a}.role"
)


def _record(row: Sequence[Any]) -> tuple[int, Record]:
    seq, id_, content, rtype, user, agent, thread, status, reason, meta, ts, expires, role = row
    return int(seq), Record(
        id=id_,
        content=_text(content),
        record_type=RecordType(rtype),
        user_id=user,
        agent_id=agent,
        thread_id=thread,
        status=RecordStatus(status),
        invalid_reason=None if reason is None else _text(reason),
        metadata=_decode_metadata(meta),
        timestamp=ts,
        expires_at=expires,
        role=role,
    )


class PgRecordWriter:
    """Applies record commands for one tenant, a batch per transaction (group commit).

    Every handler decides to reject before it writes, as on SQLite. Several processes may
    write one tenant: a lost race (deadlock, serialization failure, a unique key taken
    meanwhile) tries the batch again. With `reopen` (`db.reopen_connection`) a lost
    connection is replaced as `PgTranscriptWriter`'s is (docs/design.md §11 "Crash safety
    and faults"): the next batch first replaces it, and a batch that found it lost before
    COMMIT was sent runs once more on the new one.
    """

    def __init__(self, conn: Connection, agent: str, *, reopen: Reopen | None = None) -> None:
        self.conn = configure_writer(conn)
        self.agent = agent
        self._reopen = reopen
        self._records = 0
        self._tokens = 0
        self._erased = False
        self.bulk = BulkRows()

    def apply(self, commands: Sequence[RecordCommand]) -> list[RecordAck]:
        """Apply `commands` in one transaction; one ack per command, in order.

        A failed batch of several is tried command by command, so one bad command cannot
        sink the others; a lost connection rejects the batch with the server's answer and
        writes nothing. After a batch with an erase commits, the tables are vacuumed.
        """
        # Lost in an earlier batch, which was rejected: never retried here, since its
        # commit may have reached the server before the connection went.
        lost_before = self._reopen is not None and lost(self.conn)
        if lost_before and (refused := self._replace_connection()) is not None:
            return [RecordRejected(reason="storage", message=refused) for _ in commands]
        failure: psycopg.Error | None = None
        replaced = False
        for _ in range(_RACE_RETRIES):
            self._records = self._tokens = 0
            self._erased = False
            self.bulk.rolled_back()
            sent_commit = False
            try:
                with self.conn.transaction():
                    acks = [self._apply_one(cmd) for cmd in commands]
                    self._flush_stats()
                    sent_commit = True  # from here the server may commit what we cannot see
            except _RACES as exc:
                failure = exc
                continue
            except psycopg.Error as exc:
                failure = exc
                if sent_commit or replaced or self._reopen is None or not lost(self.conn):
                    break
                # Lost before COMMIT was sent (it died while idle): the server rolled back,
                # so once on a new connection is safe.
                replaced = True
                if (refused := self._replace_connection()) is not None:
                    return [RecordRejected(reason="storage", message=refused) for _ in commands]
                continue
            self.bulk.committed(self.conn)
            return self._purged(acks) if self._erased else acks
        assert failure is not None
        if len(commands) == 1 or lost(self.conn):
            message = describe(failure)
            return [RecordRejected(reason="storage", message=message) for _ in commands]
        return [ack for cmd in commands for ack in self.apply([cmd])]

    def _replace_connection(self) -> str | None:
        """Swap the lost connection for a new one (`reopen`); the error when none came."""
        assert self._reopen is not None
        try:
            self.conn = configure_writer(self._reopen(self.conn))
        except StorageError as exc:
            return str(exc)
        return None

    def _apply_one(self, cmd: RecordCommand) -> RecordAck:
        match cmd:
            case AddRecord():
                return self._add(cmd.record, cmd.at)
            case LinkRecords():
                return self._link(cmd)
            case InvalidateRecord():
                return self._invalidate(cmd)
            case DeleteRecord():
                return self._delete(cmd)
            case RestoreRecord():
                return self._restore(cmd)
            case EraseUserRecords():
                return self._erase(cmd)
            case StoreRecordVectors():
                return apply_store_record_vectors(self.conn, self.agent, cmd.name, cmd.rows)

    def _flush_stats(self) -> None:
        if self._records or self._tokens:
            self.conn.execute(
                f"INSERT INTO {_S}.record_stats AS s(agent, slot, records, tokens)"
                " VALUES (%s, %s, %s, %s) ON CONFLICT (agent, slot) DO UPDATE"
                " SET records = s.records + excluded.records, tokens = s.tokens + excluded.tokens",
                (self.agent, random.randrange(STAT_SLOTS), self._records, self._tokens),
            )

    def _seq(self, record_id: str) -> int | None:
        row = self.conn.execute(
            f"SELECT seq FROM {_S}.records WHERE agent = %s AND id = %s", (self.agent, record_id)
        ).fetchone()
        return None if row is None else int(row[0])

    def _add(self, r: Record, at: float) -> RecordAck:
        if self._seq(r.id) is not None:
            return RecordRejected(reason="invalid", message=f"id: {r.id!r} already exists")
        terms = index_terms(r.content, None)
        self.conn.execute(
            f"INSERT INTO {_S}.records(agent, seq, id, content, record_type, user_id, agent_id,"
            " thread_id, metadata, meta, role, ts, expires_at, created_at, tokens, terms)"
            f" VALUES (%s, nextval('{_S}.record_seqs'), %s, %s, %s, %s, %s, %s, %s, %s, %s,"
            " %s, %s, %s, %s, %s::tsvector)",
            (
                self.agent, r.id, _text_bytes(r.content), r.record_type.value, r.user_id,
                r.agent_id, r.thread_id, _encode_metadata(r.metadata).decode(),
                Jsonb(_filterable(r.metadata)), r.role, r.timestamp, r.expires_at, at,
                terms.tokens, terms.terms,
            ),
        )  # fmt: skip
        self._records += 1
        self._tokens += terms.tokens
        return RecordAdded(id=r.id)

    def _restore(self, cmd: RestoreRecord) -> RecordAck:
        """An exported record back as it was: `_add`, then its status and times."""
        r = cmd.record
        ack = self._add(r, cmd.created_at)
        if isinstance(ack, RecordAdded):
            self.bulk.add("records", 1)
        if isinstance(ack, RecordAdded) and r.status == RecordStatus.INVALID:
            self.conn.execute(
                f"UPDATE {_S}.records SET status = 'invalid', invalid_reason = %s,"
                " invalidated_at = %s WHERE agent = %s AND id = %s",
                (_text_bytes(r.invalid_reason), cmd.invalidated_at, self.agent, r.id),
            )
        return ack

    def _link(self, cmd: LinkRecords) -> RecordAck:
        rel = cmd.relation
        ends = link_ends(rel, self._seq(rel.source_id), self._seq(rel.target_id))
        if isinstance(ends, RecordRejected):
            return ends
        source, target = ends
        cur = self.conn.execute(
            f"INSERT INTO {_S}.record_relations(agent, id, source, target, relation, created_at)"
            f" VALUES (%s, nextval('{_S}.relation_ids'), %s, %s, %s, %s)"
            " ON CONFLICT (agent, source, target, relation) DO NOTHING",
            (self.agent, source, target, rel.relation, cmd.at),
        )
        self.bulk.add("record_relations", cur.rowcount)
        return RecordsLinked(relation=rel, created=cur.rowcount > 0)

    def _invalidate(self, cmd: InvalidateRecord) -> RecordAck:
        cur = self.conn.execute(
            f"UPDATE {_S}.records SET status = 'invalid', invalid_reason = %s,"
            " invalidated_at = %s WHERE agent = %s AND id = %s",
            (_text_bytes(cmd.reason), cmd.at, self.agent, cmd.id),
        )
        if cur.rowcount == 0:
            return RecordRejected(reason="not_found", message=f"id: no record {cmd.id!r}")
        return RecordInvalidated(id=cmd.id, reason=cmd.reason)

    def _delete(self, cmd: DeleteRecord) -> RecordAck:
        seq = self._seq(cmd.id)
        if seq is None:
            return RecordRejected(reason="not_found", message=f"id: no record {cmd.id!r}")
        (relations,) = self.conn.execute(
            f"SELECT count(*) FROM {_S}.record_relations WHERE agent = %(agent)s"
            " AND (source = %(seq)s OR target = %(seq)s)",
            {"agent": self.agent, "seq": seq},
        ).fetchone() or (0,)
        row = self.conn.execute(
            f"DELETE FROM {_S}.records WHERE agent = %s AND seq = %s RETURNING tokens",
            (self.agent, seq),
        ).fetchone()  # relations cascade
        self._records -= 1
        self._tokens -= int(row[0]) if row else 0
        return RecordDeleted(id=cmd.id, relations=int(relations))

    def _erase(self, cmd: EraseUserRecords) -> RecordAck:
        from .userdata import plan_record_erasure  # here: it imports this module

        erasure = plan_record_erasure(self.conn, self.agent, cmd.user_ids)
        found = self.conn.execute(
            f"DELETE FROM {_S}.records WHERE agent = %s AND user_id = ANY(%s)"
            " RETURNING tokens",  # relations cascade
            (self.agent, list(cmd.user_ids)),
        ).fetchall()
        self._records -= len(found)
        self._tokens -= sum(int(row[0]) for row in found)
        self._erased = True
        return RecordsErased(erasure=erasure)

    def _purged(self, acks: list[RecordAck]) -> list[RecordAck]:
        """After an erase commits: VACUUM the tables (outside a transaction), so the
        erased rows' space is reclaimed; the server's WAL and backups are its own."""
        problem = None
        try:
            for table in ("records", "record_relations", "record_vectors"):
                self.conn.execute(f"VACUUM {_S}.{table}")
        except psycopg.Error as exc:
            problem = f"the purge failed: {describe(exc)}"
        return [
            RecordsErased(
                erasure=msgspec.structs.replace(a.erasure, purged=problem is None, problem=problem)
            )
            if isinstance(a, RecordsErased)
            else a
            for a in acks
        ]


class PgRecordReader:
    """Reads one tenant's records (the methods of `RecordReader`), each read one snapshot
    on a connection of its own (`configure_reader`)."""

    def __init__(self, conn: Connection, agent: str) -> None:
        self.conn = configure_reader(conn)
        self.agent = agent

    def get(self, record_id: str, now: float) -> Record | None:
        """The record `record_id`, unless it does not exist or has expired."""
        row = self.conn.execute(
            f"SELECT {_COLUMNS.format(a='r')} FROM {_S}.records r WHERE r.agent = %s"
            " AND r.id = %s AND (r.expires_at IS NULL OR r.expires_at > %s)",
            (self.agent, record_id, now),
        ).fetchone()
        return None if row is None else _record(row)[1]

    def linked(self, record_id: str, query: RecordQuery) -> RecordHit | None:
        """`RecordReader.linked`: the record with the linked tree a search would attach."""
        with self.conn.transaction():
            row = self.conn.execute(
                f"SELECT {_COLUMNS.format(a='r')} FROM {_S}.records r WHERE r.agent = %s"
                " AND r.id = %s AND (r.expires_at IS NULL OR r.expires_at > %s)",
                (self.agent, record_id, query.now),
            ).fetchone()
            if row is None:
                return None
            seq, rec = _record(row)
            memory = rec.record_type == RecordType.MEMORY
            trees = grow_trees([seq], query, self._edges(query)) if memory else {}
            records = self._records(linked_seqs(trees))
        return hits_of([(seq, rec, 0.0)], trees, records)[0]

    def records_of(self, user_ids: tuple[str, ...] | None, agent: str | None) -> UserRecords:
        """`RecordReader.records_of`: these users' records and their relations, as an
        export writes them; one snapshot."""
        from .userdata import records_of  # here: it imports this module

        with self.conn.transaction():
            return records_of(self.conn, self.agent, user_ids, agent)

    def plan_record_erasure(self, user_ids: tuple[str, ...]) -> RecordErasure:
        """`RecordReader.plan_record_erasure`: what erasing these users' records would
        remove, as the erase counts it; one snapshot."""
        from .userdata import plan_record_erasure  # here: it imports this module

        return plan_record_erasure(self.conn, self.agent, user_ids)

    def count(self) -> int:
        """How many records are stored (expired ones included)."""
        row = self.conn.execute(
            f"SELECT count(*) FROM {_S}.records WHERE agent = %s", (self.agent,)
        ).fetchone()
        return int(row[0]) if row else 0

    # -- the records embedder actor's reads (actors/embedder.py `RecordFeed`) ---------------

    def pending_records(self, name: str, *, mark: RecordMark, limit: int) -> PendingRecords:
        return pending_records(self.conn, self.agent, name, mark=mark, limit=limit)

    def pending_record_count(self, name: str, *, mark: RecordMark) -> int:
        return pending_record_count(self.conn, self.agent, name, mark=mark)

    def cached_record_vectors(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        return cached_record_vectors(self.conn, self.agent, name, digests)

    def search(
        self, plan: MatchPlan, query: RecordQuery, meaning: RecordMeaning | None = None
    ) -> list[RecordHit]:
        """The best `query.limit` records in scope matching `plan`, each with its linked
        tree (`query.num_hops`), best first; one snapshot. With `meaning`, the text and
        vector sides fused as on SQLite (storage/records.py `fused_hits`)."""
        with self.conn.transaction():
            if meaning is None:
                ranked = [
                    (seq, rec, distance_of(score)) for score, seq, rec in self._matches(plan, query)
                ]
            else:
                ranked = self._fused(plan, query, meaning)
            roots = [seq for seq, rec, _ in ranked if rec.record_type == RecordType.MEMORY]
            trees = grow_trees(roots, query, self._edges(query))
            records = self._records(linked_seqs(trees))
        return hits_of(ranked, trees, records)

    def _fused(
        self, plan: MatchPlan, query: RecordQuery, meaning: RecordMeaning
    ) -> list[tuple[int, Record, float]]:
        """Hybrid (storage/records.py `RecordReader._fused`): each side's `limit x
        multiplier` candidates, the vector side under the text side's very filters."""
        pool = query.limit * meaning.multiplier
        text = self._matches(plan, dataclasses.replace(query, limit=pool))
        params: dict[str, Any] = {}
        where = _filters("r", query, params)
        if not query.include_invalid:
            where.append("r.status = 'valid'")
        near = [
            row
            for row in nearest_records(
                self.conn,
                self.agent,
                meaning.vector,
                name=meaning.name,
                where=where,
                params=params,
                k=pool,
            )
            if row.similarity >= meaning.min_similarity
        ]
        return fused_hits(
            query,
            meaning,
            text,
            near,
            lambda seqs: record_vectors_of(self.conn, self.agent, seqs, name=meaning.name),
            self._records,
        )

    # -- statistics ---------------------------------------------------------------------

    def _totals(self) -> tuple[int, float]:
        """(N, average tokens per record): BM25's statistics, from the tenant's slots."""
        row = execute_custom(
            self.conn,
            f"SELECT coalesce(sum(records), 0), coalesce(sum(tokens), 0) FROM {_S}.record_stats"
            " WHERE agent = %s",
            (self.agent,),
        ).fetchone()
        total, tokens = (int(row[0]), int(row[1])) if row else (0, 0)
        return total, (tokens / total if total else 1.0)

    def _docs(self, tsquery: str | None, cap: int) -> int:
        """How many records hold `tsquery`, counted up to `cap`."""
        if tsquery is None:
            return 0
        row = execute_custom(
            self.conn,
            f"SELECT count(*) FROM (SELECT 1 FROM {_S}.records WHERE agent = %s"
            " AND terms @@ %s::tsquery LIMIT %s) t",
            (self.agent, tsquery, cap),
        ).fetchone()
        return int(row[0]) if row else 0

    def _newest(self, tsquery: str | None) -> int:
        """The seq of the `RANK_BUDGET`-th newest record holding `tsquery` (0: fewer)."""
        if tsquery is None:
            return 0
        row = execute_custom(
            self.conn,
            f"SELECT seq FROM {_S}.records WHERE agent = %s AND terms @@ %s::tsquery"
            " ORDER BY seq DESC OFFSET %s LIMIT 1",
            (self.agent, tsquery, RANK_BUDGET - 1),
        ).fetchone()
        return 0 if row is None else int(row[0])

    def _frequencies(self, query: PgQuery) -> list[int]:
        """Each part's document frequency over the tenant's records (BM25's n)."""
        counts = ", ".join(
            f"count(*) FILTER (WHERE terms @@ %(p{i})s::tsquery)" for i in range(len(query.parts))
        )
        params: dict[str, Any] = {f"p{i}": part.tsquery for i, part in enumerate(query.parts)}
        row = execute_custom(
            self.conn,
            f"SELECT {counts} FROM {_S}.records WHERE agent = %(agent)s"
            " AND terms @@ %(query)s::tsquery",
            params | {"agent": self.agent, "query": query.match},
        ).fetchone()
        return [int(n) for n in row] if row else [0] * len(query.parts)

    # -- matching -------------------------------------------------------------------------

    def _matches(self, plan: MatchPlan, query: RecordQuery) -> list[tuple[float, int, Record]]:
        """The direct matches, best first: ranked, then (when pruned) by recency; the
        steps of storage/records.py `search_steps`."""
        params: dict[str, Any] = {"agent": self.agent, "limit": query.limit}
        where = _filters("r", query, params)
        if not query.include_invalid:
            where.append("r.status = 'valid'")
        boosts = []
        for dim, value, exact in _dimensions(query.scope):
            if not exact and dim in query.boosts:
                params[f"boost_{dim}"] = value
                boosts.append(f"(r.{dim} IS NOT DISTINCT FROM %(boost_{dim})s::text)::int")
        boost = f" * (1.0 + {BOOST} * ({' + '.join(boosts)}))" if boosts else ""
        total, avgdl = self._totals()
        small = self._scope_is_small(query, total)
        terms = [
            pg_query(plan, [j == i for j in range(len(plan.terms))]) for i in range(len(plan.terms))
        ]
        steps = search_steps(
            plan,
            total,
            bounded=not small,
            docs=lambda i: self._docs(_tsquery(terms[i]), COMMON_DOCS + 1),
            newest=lambda i: self._newest(_tsquery(terms[i])),
        )
        hits: list[tuple[float, int, Record]] = []
        ranked = None if steps.ranked is None else pg_query(plan, steps.ranked)
        if ranked is not None:
            bm25 = _bm25_params(ranked, total, avgdl, self._frequencies(ranked))
            sql = (
                f"SELECT -{bm25_sql('r')}{boost} AS score, {_COLUMNS.format(a='r')}"
                f" FROM {_S}.records r"
                " WHERE r.terms @@ %(match)s::tsquery AND r.seq >= %(since)s"
                f" AND {' AND '.join(where)} ORDER BY score, r.seq DESC LIMIT %(limit)s"
            )
            rows = execute_custom(
                self.conn, sql, params | bm25 | {"match": ranked.match, "since": steps.since}
            ).fetchall()
            hits = [(float(row[0]), *_record(row[1:])) for row in rows]
        recent = None if steps.recent is None else pg_query(plan, steps.recent)
        if recent is not None and len(hits) < query.limit:
            # The newest in-scope records holding a term (none already found), reordered
            # by how many terms they hold times their boost, as BM25 scores would. Terms
            # only: the recency step of SQLite matches no phrase.
            parts = recent.parts[1:] if recent.has_phrase else recent.parts
            held = " + ".join(f"(r.terms @@ %(h{i})s::tsquery)::int" for i in range(len(parts)))
            sql = (
                f"SELECT ({held}) * 1.0{boost}, {_COLUMNS.format(a='r')} FROM {_S}.records r"
                f" WHERE r.terms @@ %(match)s::tsquery AND {' AND '.join(where)}"
                " AND NOT r.seq = ANY(%(found)s) ORDER BY r.seq DESC LIMIT %(pool)s"
            )
            bindings = params | {f"h{i}": part.tsquery for i, part in enumerate(parts)}
            bindings |= {
                "match": PgQuery(parts, False).match,
                "found": [seq for _, seq, _ in hits],
                "pool": max(query.limit, RECENCY_POOL),
            }
            found = execute_custom(self.conn, sql, bindings).fetchall()
            found.sort(key=lambda row: -cast(float, row[0]))  # stable: newest first on ties
            hits += [(0.0, *_record(row[1:])) for row in found[: query.limit - len(hits)]]
        return hits

    def _scope_is_small(self, query: RecordQuery, total: int) -> bool:
        """Whether the exact scope leaves few enough records to list (storage/records.py):
        it decides whether the rank budget holds, so both stores must agree on it."""
        params: dict[str, Any] = {"agent": self.agent}
        exact = _exact_scope("records", query, params)
        if not exact:
            return False
        small = int(SMALL_SCOPE_FACTOR * math.sqrt(total))
        row = execute_custom(
            self.conn,
            f"SELECT count(*) FROM (SELECT 1 FROM {_S}.records WHERE agent = %(agent)s"
            f" AND {' AND '.join(exact)} LIMIT %(small)s) t",
            params | {"small": small + 1},
        ).fetchone()
        return row is not None and int(row[0]) <= small

    def _edges(self, query: RecordQuery) -> Any:
        """One hop of graph expansion for every tree at once: the relations touching the
        frontier whose other end passes the link filters (a memory, in scope, not
        expired, the types and metadata asked for; any status)."""
        params: dict[str, Any] = {"agent": self.agent}
        where = " AND ".join(["n.record_type = 'memory'", *_filters("n", query, params)])
        sql = (
            f"SELECT e.id, e.relation, e.source, e.target, e.source FROM {_S}.record_relations e"
            f" JOIN {_S}.records n ON n.agent = e.agent AND n.seq = e.target"
            f" WHERE e.agent = %(agent)s AND e.source = ANY(%(frontier)s) AND {where}"
            " UNION ALL"
            f" SELECT e.id, e.relation, e.source, e.target, e.target FROM {_S}.record_relations e"
            f" JOIN {_S}.records n ON n.agent = e.agent AND n.seq = e.source"
            f" WHERE e.agent = %(agent)s AND e.target = ANY(%(frontier)s) AND {where}"
        )

        def edges_of(frontier: list[int]) -> list[Edge]:
            rows = execute_custom(self.conn, sql, params | {"frontier": frontier}).fetchall()
            return [(int(i), str(name), int(s), int(t), int(v)) for i, name, s, t, v in rows]

        return edges_of

    def _records(self, seqs: set[int]) -> dict[int, Record]:
        if not seqs:
            return {}
        rows = execute_custom(
            self.conn,
            f"SELECT {_COLUMNS.format(a='r')} FROM {_S}.records r WHERE r.agent = %s"
            " AND r.seq = ANY(%s)",
            (self.agent, sorted(seqs)),
        ).fetchall()
        return dict(_record(row) for row in rows)


def _tsquery(query: PgQuery | None) -> str | None:
    return None if query is None else query.match


def _exact_scope(alias: str, query: RecordQuery, params: dict[str, Any]) -> list[str]:
    """The exact scope dimensions as conditions (NULL: only records not scoped there)."""
    clauses = []
    for dim, value, exact in _dimensions(query.scope):
        if exact:
            if value is None:
                clauses.append(f"{alias}.{dim} IS NULL")
            else:
                params[f"exact_{dim}"] = value
                clauses.append(f"{alias}.{dim} = %(exact_{dim})s")
    return clauses


def _filters(alias: str, query: RecordQuery, params: dict[str, Any]) -> list[str]:
    """The SQL conditions every returned record (direct or linked) must meet: storage/
    records.py `_filters` on PostgreSQL, the tenant first."""
    params["now"] = query.now
    clauses = [
        f"{alias}.agent = %(agent)s",
        f"({alias}.expires_at IS NULL OR {alias}.expires_at > %(now)s)",
        *_exact_scope(alias, query, params),
    ]
    if query.record_types is not None:
        params["types"] = [t.value for t in query.record_types]
        clauses.append(f"{alias}.record_type = ANY(%(types)s)")
    for i, (key, wanted) in enumerate(query.metadata):
        clauses.append(_metadata_value(alias, i, key, wanted, params))
    return clauses


_ESCAPE = "\U0010ffff"


def _escaped(text: str) -> str:
    # Injective: the escape character itself is escaped first.
    return text.replace(_ESCAPE, _ESCAPE + "1").replace("\x00", _ESCAPE + "0")


def _filterable(value: object) -> object:
    """`value` as jsonb can hold it: every string and key NUL-escaped (`_escaped`), so the
    metadata filter compares escaped with escaped and finds what SQLite finds."""
    if isinstance(value, str):
        return _escaped(value)
    if isinstance(value, dict):
        return {_escaped(k): _filterable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_filterable(v) for v in value]
    return value


def _metadata_value(alias: str, i: int, key: str, value: object, params: dict[str, Any]) -> str:
    """One metadata condition: the top-level `key` holds `value` (SQLite's json_each types:
    true/false/null apart from 1/0/'null' text, numbers compared as numbers)."""
    params[f"meta_key_{i}"] = _escaped(key)
    field = f"({alias}.meta -> %(meta_key_{i})s::text)"
    if value is None:
        return f"jsonb_typeof({field}) = 'null'"
    if value is True or value is False:
        return f"{field} = '{str(value).lower()}'::jsonb"
    if isinstance(value, int | float):
        assert math.isfinite(value)
        params[f"meta_value_{i}"] = value
        # An integer exactly (numeric); a float as the double SQLite would compare with.
        kind = "numeric" if isinstance(value, int) else "float8"
        text = f"({alias}.meta ->> %(meta_key_{i})s::text)"
        return f"jsonb_typeof({field}) = 'number' AND {text}::{kind} = %(meta_value_{i})s::{kind}"
    params[f"meta_value_{i}"] = Jsonb(_filterable(value))
    return f"{field} = %(meta_value_{i})s"
