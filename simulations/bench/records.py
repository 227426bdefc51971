"""Records search latency: `mem.records` search with graph expansion at 1M records, against
a raw FTS5 query on the same rows (docs/design.md §5, §7).

One seeded synthetic store is built twice:

- the library's `records.db`, written through the store's own writer (`RecordWriter.apply`,
  the records keeper's code) in transactions of `BATCH` commands: `AddRecord` for every
  record, `InvalidateRecord` for a few, then `LinkRecords` for a random graph. That is the
  documented bulk path: the same SQL as live writes, without a million actor round trips;
- the raw floor: a separate SQLite file with nothing but an FTS5 table defined as the store's
  (CREATE statement and rank function copied from `records.db`), same rowids, same column
  values (`index_columns` of each record's content), filled in one transaction.

The records: content of 4-30 words drawn from a Zipf law over a made-up vocabulary (the
`bench search` corpus generator); mostly `memory` records, with messages, documents, actor
profiles and images (`TYPE_MIX`); a few hundred users (some far more active than others,
`USER_SKEW`), agents and threads, with a share of records unscoped in each dimension
(`UNSCOPED`); a few invalidated, a few expiring (half of them already expired). The graph:
`records x degree / 2` directed relations of a few types; each joins two records drawn
uniformly, except that for `SAME_USER_SHARE` of them the target is another record of the
source's user (a user's memories are about each other, so the exact-user search's hops find
something to follow).

The same seeded queries (1-3 distinct words from the same Zipf law, so common words show up
as often as they do in real queries) then run on every side, interleaved query by query
(rotating which side goes first) so machine noise hits every side alike:

- raw OR (the floor): `SELECT rowid FROM t WHERE t MATCH '"a" OR "b"' ORDER BY rank LIMIT 10`,
  synchronous on the calling thread;
- raw plan (a diagnostic): the same SQL with the store's full expression (`plan_match`: the
  terms and the whole query as a phrase), what the query semantics cost SQLite;
- client: `await mem.records.search(q, user_id=<an existing user>, num_hops=H)` (exact user,
  agent and thread unfiltered), end to end from the trio loop;
- store: `await mem.records.store.search(q, num_hops=H)` (nothing filtered);
- client and store SQL, in-thread (diagnostics): the store's own `RecordReader.search` for the
  same two searches on a read-only connection of its own, on the calling thread, in thread
  CPU time: the work's own tail, apart from the scheduler of a shared machine.

What the sides share besides the CPU: the floor's `ORDER BY rank` over a term held by most
records sorts that many rows and spills temporary files (gigabytes over a run at 1M); on a
machine with a small or busy OS page cache that pushes the library's pages out, and the
library sides then pay for cold reads the floor caused. Interleaving spreads that cost over
the whole run instead of sparing one side.

Every answer is checked against the raw index (each hit matches the store's expression and
is in scope, the number of hits is what the index implies, linked records are unexpired
in-scope memories). It prints p50/p90/p99/max per side, the library/raw ratios, and PASS/MISS
against the targets: a flat tail, p99 <= 3 x p50 per side (issue 15), and p99 <= 20 ms. Absolute times on a shared machine are noise; the ratios are
the result. With `--state-dir`, the loaded databases are kept with their parameters
(`bench-records.json`) and reused by a later run with the same parameters.

    activememory bench records [--records N] [--degree 4] [--hops 2] ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import apsw
import trio

import activememory as am

from ...protocol.record_results import RecordSearchResult
from ...protocol.records import (
    DEFAULT_MAX_RESULTS,
    AddRecord,
    InvalidateRecord,
    LinkRecords,
    Record,
    RecordAck,
    RecordAdded,
    RecordCommand,
    RecordInvalidated,
    RecordRelation,
    RecordsLinked,
    RecordType,
    SearchScope,
)
from ...storage import fts_query
from ...storage import records as records_storage
from ...storage.db import configure
from ...storage.fts_query import MatchPlan, index_columns, plan_match
from ...storage.records import (
    RecordQuery,
    RecordReader,
    RecordWriter,
    open_records_connection,
    records_db_path,
)
from . import runner
from .runner import BenchmarkError, percentiles
from .search import ZIPF_EXPONENT, LibrarySide, RawSide, Zipf, or_match

NOW = 1_700_000_000.0  # the benchmark's clock: expiry is judged against it
SPACING = 30.0  # seconds between consecutive records' timestamps
WORDS_PER_RECORD = (4, 30)
QUERY_WORDS = (1, 3)
LIMIT = DEFAULT_MAX_RESULTS  # what a search with no config returns at most
TYPE_MIX = {
    RecordType.MEMORY: 0.80,
    RecordType.MESSAGE: 0.10,
    RecordType.DOCUMENT: 0.05,
    RecordType.IMAGE: 0.03,
    RecordType.ACTOR_PROFILE: 0.02,
}
USER_SKEW = 0.5  # user r owns records with weight 1 / r**USER_SKEW: some users far busier
UNSCOPED = {"user_id": 0.05, "agent_id": 0.20, "thread_id": 0.30}  # share left None
INVALID_SHARE = 0.02
EXPIRING_SHARE = 0.01  # half of them already expired at NOW
METADATA_SOURCES = ("chat", "import", "tool")
RELATION_NAMES = ("about", "related_to", "part_of", "supersedes", "mentions")
SAME_USER_SHARE = 0.5
BATCH = 20_000  # commands per writer transaction
WARMUP = 50
QUERIES = 500  # the floor ranks every row holding a term: about a second a query at 1M
TARGET_P99_MS = 20.0
TARGET_TAIL_RATIO = 3.0  # a side's p99 / its own p50 (issue 15)
PARAMS_FILE = "bench-records.json"
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
LAYOUT = 1  # bump when what a reused state directory holds changes
RAW_QUERY = "SELECT rowid FROM t WHERE t MATCH ? ORDER BY rank LIMIT 10"
_ID_MULTIPLIER = 0x9E3779B97F4A7C15F39CC0605CEDC835  # odd: i -> id is a bijection mod 2**128


# -- the corpus -------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """What the stored databases depend on: a state directory is reused only if they match."""

    records: int
    degree: int
    users: int
    agents: int
    threads: int
    vocab: int
    seed: int

    @property
    def relations(self) -> int:
        """Relations to store: mean degree x records / 2 (each joins two records)."""
        return self.records * self.degree // 2

    def as_dict(self) -> dict[str, Any]:
        """The parameters as recorded in `bench-records.json`."""
        return {
            "layout": LAYOUT,
            **asdict(self),
            "zipf_exponent": ZIPF_EXPONENT,
            "words_per_record": list(WORDS_PER_RECORD),
            "type_mix": {t.value: share for t, share in TYPE_MIX.items()},
            "user_skew": USER_SKEW,
            "unscoped": UNSCOPED,
            "invalid_share": INVALID_SHARE,
            "expiring_share": EXPIRING_SHARE,
            "same_user_share": SAME_USER_SHARE,
            "schema_version": records_storage.SCHEMA_VERSION,
            "store_code": runner.code_digest(
                fts_query,
                *records_storage.MIGRATIONS,
                RecordWriter,
                records_storage._INSERT,
                records_storage._INSERT_FTS,
            ),
        }


def record_id(i: int) -> str:
    """The id of the `i`-th record (0-based): 32 hex digits, scattered like uuid4 hex."""
    return f"{(i + 1) * _ID_MULTIPLIER % 2**128:032x}"


def user_weights(users: int) -> list[float]:
    """Cumulative weights of users 0..users-1: user r (1-based) weighs 1 / r**USER_SKEW."""
    return list(itertools.accumulate(1.0 / r**USER_SKEW for r in range(1, users + 1)))


@dataclass
class Corpus:
    """What the graph and the checks need to know about the generated records."""

    owner: list[int] = field(default_factory=list)  # user index per record, -1 if unscoped
    expired: int = 0
    invalid: int = 0
    types: dict[str, int] = field(default_factory=dict)


def generate_records(params: Params, zipf: Zipf, corpus: Corpus) -> Iterator[RecordCommand]:
    """Every record's `AddRecord`, in order (and an `InvalidateRecord` after some)."""
    rng = random.Random(f"{params.seed}:records")
    types = list(TYPE_MIX)
    type_weights = list(itertools.accumulate(TYPE_MIX.values()))
    users = user_weights(params.users)
    low, high = WORDS_PER_RECORD
    for i in range(params.records):
        rtype = rng.choices(types, cum_weights=type_weights)[0]
        if rng.random() < UNSCOPED["user_id"]:
            user = -1
        else:
            user = rng.choices(range(params.users), cum_weights=users)[0]
        agent = None
        if rng.random() >= UNSCOPED["agent_id"]:
            agent = f"agent-{rng.randrange(params.agents)}"
        thread = None
        if rng.random() >= UNSCOPED["thread_id"]:
            thread = f"thread-{rng.randrange(params.threads)}"
        ts = NOW - (params.records - i) * SPACING
        expires = None
        if rng.random() < EXPIRING_SHARE:
            expires = NOW + rng.choice((-1.0, 1.0)) * rng.uniform(60.0, 86_400.0 * 30)
            corpus.expired += expires <= NOW
        metadata = {}
        if rng.random() < 0.5:
            metadata["source"] = rng.choice(METADATA_SOURCES)
        words = zipf.draw(rng, rng.randint(low, high))
        record = Record(
            id=record_id(i),
            content=" ".join(words).capitalize() + ".",
            record_type=rtype,
            user_id=None if user < 0 else f"user-{user}",
            agent_id=agent,
            thread_id=thread,
            metadata=metadata,
            timestamp=ts,
            expires_at=expires,
            role=rng.choice(("user", "assistant")) if rtype == RecordType.MESSAGE else None,
        )
        corpus.owner.append(user)
        corpus.types[rtype.value] = corpus.types.get(rtype.value, 0) + 1
        yield AddRecord(record=record, at=ts)
        if rng.random() < INVALID_SHARE:
            corpus.invalid += 1
            yield InvalidateRecord(id=record.id, reason="superseded by a newer memory", at=ts)


def generate_relations(params: Params, corpus: Corpus) -> Iterator[RecordCommand]:
    """The random graph's `LinkRecords` (see the module docstring)."""
    rng = random.Random(f"{params.seed}:graph")
    by_user: dict[int, list[int]] = {}
    for i, user in enumerate(corpus.owner):
        if user >= 0:
            by_user.setdefault(user, []).append(i)
    n = params.records
    made = 0
    while made < params.relations:
        source = rng.randrange(n)
        mine = by_user.get(corpus.owner[source])
        if mine is not None and len(mine) > 1 and rng.random() < SAME_USER_SHARE:
            target = rng.choice(mine)
        else:
            target = rng.randrange(n)
        if target == source:
            continue
        relation = RecordRelation(
            relation=rng.choice(RELATION_NAMES),
            source_id=record_id(source),
            target_id=record_id(target),
        )
        made += 1
        yield LinkRecords(relation=relation, at=NOW)


# -- loading ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadTimes:
    """How long the stores took to fill (seconds), as first measured."""

    records: float  # adds and invalidations through the writer, generation included
    relations: float  # links through the writer, generation included
    raw: float  # the raw floor's table, one transaction
    stored_relations: int  # relations stored (a repeated random edge is stored once)
    reused: bool = False

    @property
    def library(self) -> float:
        """The library's whole load."""
        return self.records + self.relations


def write_all(writer: RecordWriter, commands: Iterator[RecordCommand]) -> int:
    """Apply `commands` in transactions of `BATCH`; return how many relations were new."""
    created = 0
    while batch := list(itertools.islice(commands, BATCH)):
        for ack in writer.apply(batch):
            created += _accepted(ack)
    return created


def _accepted(ack: RecordAck) -> int:
    if isinstance(ack, RecordsLinked):
        return int(ack.created)
    if isinstance(ack, RecordAdded | RecordInvalidated):
        return 0
    raise BenchmarkError(f"the writer rejected a command: {ack}")


def load_library(library: Path, params: Params, zipf: Zipf) -> tuple[float, float, int]:
    """Write the corpus through the store's writer; (records s, relations s, relations)."""
    library.mkdir(parents=True, exist_ok=True)
    conn = open_records_connection(records_db_path(library), writer=True)
    try:
        writer = RecordWriter(conn)
        corpus = Corpus()
        start = time.perf_counter()
        write_all(writer, generate_records(params, zipf, corpus))
        stored = time.perf_counter()
        created = write_all(writer, generate_relations(params, corpus))
        linked = time.perf_counter()
        (count,) = conn.execute("SELECT count(*) FROM records").fetchone() or (0,)
    finally:
        conn.close()
    if count != params.records:
        raise BenchmarkError(f"library load: {count} records stored, expected {params.records}")
    return stored - start, linked - stored, created


def load_raw(raw_path: Path, library_db: Path) -> float:
    """The floor's table: the store's FTS5 definition and rows, filled in one transaction.

    Returns the insert's seconds.
    """
    source = apsw.Connection(str(library_db), flags=apsw.SQLITE_OPEN_READONLY)
    conn = apsw.Connection(str(raw_path))
    try:
        configure(conn)  # WAL and the rest, as the store's connections
        row = source.execute(
            "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'record_fts'"
        ).fetchone()
        if row is None:
            raise BenchmarkError("records.db has no record_fts table")
        conn.execute(str(row[0]).replace("record_fts", "t", 1))
        rank = source.execute("SELECT v FROM record_fts_config WHERE k = 'rank'").fetchone()
        if rank is not None:
            conn.execute("INSERT INTO t(t, rank) VALUES ('rank', ?)", (str(rank[0]),))
        rows = (
            (seq, *index_columns(str(content)))
            for seq, content in source.execute("SELECT seq, content FROM records ORDER BY seq")
        )
        start = time.perf_counter()
        with conn:
            conn.executemany(
                "INSERT INTO t(rowid, words, grams, context) VALUES (?, ?, ?, NULL)", rows
            )
        return time.perf_counter() - start
    finally:
        conn.close()
        source.close()


def prepare(run_dir: Path, params: Params, zipf: Zipf) -> LoadTimes:
    """Load both stores into `run_dir`, or reuse what a run with the same parameters left."""

    def load() -> dict[str, float]:
        stored, linked, created = load_library(run_dir / "library", params, zipf)
        raw = load_raw(run_dir / "raw.db", records_db_path(run_dir / "library"))
        return {"records": stored, "relations": linked, "raw": raw, "stored_relations": created}

    outputs = ("library", "raw.db*")
    times, reused = runner.reuse_or_load(
        run_dir, PARAMS_FILE, params.as_dict(), load, outputs=outputs
    )
    return LoadTimes(**times, reused=reused)


# -- the queries ------------------------------------------------------------------------


def make_queries(zipf: Zipf, seed: int, count: int) -> list[str]:
    """`count` seeded queries of 1-3 distinct words from the corpus's Zipf law."""
    rng = random.Random(f"{seed}:queries")
    low, high = QUERY_WORDS
    return [" ".join(dict.fromkeys(zipf.draw(rng, rng.randint(low, high)))) for _ in range(count)]


def query_users(params: Params, count: int) -> list[str]:
    """The user of each client query: busy users search more (the records' user law)."""
    rng = random.Random(f"{params.seed}:query-users")
    weights = user_weights(params.users)
    return [f"user-{u}" for u in rng.choices(range(params.users), cum_weights=weights, k=count)]


@dataclass
class Timings:
    """Per-query seconds of each side, in query order, and what the library returned."""

    raw_or: list[float | None] = field(default_factory=list)  # None: not run (`floor_every`)
    raw_plan: list[float | None] = field(default_factory=list)
    client: list[float] = field(default_factory=list)
    store: list[float] = field(default_factory=list)
    client_sql_cpu: list[float] = field(default_factory=list)
    store_sql_cpu: list[float] = field(default_factory=list)
    client_hits: list[int] = field(default_factory=list)
    store_hits: list[int] = field(default_factory=list)
    client_linked: list[int] = field(default_factory=list)
    store_linked: list[int] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)


async def run_queries(
    run_dir: Path,
    queries: Sequence[str],
    users: Sequence[str],
    *,
    hops: int,
    warmup: int,
    floor_every: int = 1,
) -> Timings:
    """Time every query on all four sides, interleaved, after `warmup` untimed queries; the
    two raw sides only every `floor_every`-th query (the library's tail wants many queries).

    Cancellation: a search already started finishes on its worker thread; nothing is written.
    """
    raw = apsw.Connection(str(run_dir / "raw.db"))
    configure(raw)
    checker = Checker(run_dir)
    timings = Timings()
    sql_conn = open_records_connection(records_db_path(run_dir / "library"), writer=False)
    sql_reader = RecordReader(sql_conn)
    try:
        # Text only: this measures the full-text side against the raw index; with the
        # default embedder the library would also embed every record in the background
        # and fuse by meaning (docs/design.md §5.7), which the raw side cannot check.
        async with am.open_memory(run_dir / "library", clock=lambda: NOW, config=TEXT_ONLY) as mem:
            for i, (query, user) in enumerate(zip(queries, users, strict=True)):
                plan = plan_match(query)
                if plan is None:
                    raise BenchmarkError(f"{query!r}: nothing searchable")
                raw_or = RawSide(raw, or_match(query), RAW_QUERY)
                raw_plan = RawSide(raw, plan.expression(), RAW_QUERY)
                client = LibrarySide(
                    partial(mem.records.search, query, num_hops=hops, user_id=user)
                )
                store = LibrarySide(partial(mem.records.store.search, query, num_hops=hops))
                client_sql = SqlSide(sql_reader, plan, user, hops)
                store_sql = SqlSide(sql_reader, plan, None, hops)
                slow = i % floor_every == 0
                sides: list[RawSide | LibrarySide[Any] | SqlSide] = [
                    client,
                    store,
                    client_sql,
                    store_sql,
                ]
                if slow:
                    sides = [raw_or, raw_plan, *sides]
                turn = i % len(sides)  # no side always finds the caches warmer
                for side in sides[turn:] + sides[:turn]:
                    await side.run()
                if i < warmup:
                    continue
                assert client.result is not None and store.result is not None
                checker.check(query, plan.expression(), client.result, user, hops)
                checker.check(query, plan.expression(), store.result, None, hops)
                timings.raw_or.append(raw_or.seconds if slow else None)
                timings.raw_plan.append(raw_plan.seconds if slow else None)
                timings.client.append(client.seconds)
                timings.store.append(store.seconds)
                timings.client_sql_cpu.append(client_sql.cpu)
                timings.store_sql_cpu.append(store_sql.cpu)
                timings.client_hits.append(len(client.result))
                timings.store_hits.append(len(store.result))
                timings.client_linked.append(sum(_linked_count(r) for r in client.result))
                timings.store_linked.append(sum(_linked_count(r) for r in store.result))
                timings.queries.append(query)
    finally:
        sql_conn.close()
        checker.close()
        raw.close()
    return timings


class SqlSide:
    """A diagnostic: the store's `RecordReader.search` on the calling thread, timed in thread
    CPU time (client: an exact user; store: nothing filtered)."""

    def __init__(self, reader: RecordReader, plan: MatchPlan, user: str | None, hops: int) -> None:
        scope = SearchScope(
            user_id=user,
            agent_id=None,
            thread_id=None,
            exact_user_match=user is not None,
            exact_agent_match=False,
            exact_thread_match=False,
        )
        self.call = partial(
            reader.search, plan, RecordQuery(scope=scope, now=NOW, limit=LIMIT, num_hops=hops)
        )
        self.cpu = 0.0

    async def run(self) -> None:
        start = time.thread_time()
        self.call()
        self.cpu = time.thread_time() - start


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _shown(ms: float | None) -> str:
    return "not run" if ms is None else f"{ms:.3f}"


def _linked_count(result: RecordSearchResult) -> int:
    return sum(1 + _linked_count(child) for _, child in result.linked_results)


class Checker:
    """Checks the library's answers against the raw index (and `records.db`, read-only)."""

    def __init__(self, run_dir: Path) -> None:
        self.conn = apsw.Connection(
            str(run_dir / "raw.db"), flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
        )
        library = records_db_path(run_dir / "library")
        self.conn.execute("ATTACH ? AS lib", (f"file:{library}?mode=ro",))

    def close(self) -> None:
        self.conn.close()

    def check(
        self,
        query: str,
        expression: str,
        results: list[RecordSearchResult],
        user: str | None,
        hops: int,
    ) -> None:
        """Raise `BenchmarkError` unless `results` are what the raw index implies.

        Each hit matches `expression` and is in scope; there are as many hits as unexpired
        in-scope matches, up to `LIMIT`; linked records are unexpired in-scope memories, at
        most `hops` deep, each once per tree.
        """
        side = "store" if user is None else f"client {user}"
        ids = [r.id for r in results]
        matching = {
            str(rid)
            for (rid,) in self.conn.execute(
                "SELECT r.id FROM t JOIN lib.records r ON r.seq = t.rowid WHERE t MATCH ?"
                " AND t.rowid IN (SELECT seq FROM lib.records"
                "  WHERE id IN (SELECT value FROM json_each(?)))",
                (expression, json.dumps(ids)),
            )
        }
        scope = "" if user is None else " AND r.user_id = :user"
        (expected,) = self.conn.execute(
            "SELECT count(*) FROM (SELECT 1 FROM t JOIN lib.records r ON r.seq = t.rowid"
            " WHERE t MATCH :match AND (r.expires_at IS NULL OR r.expires_at > :now)"
            f"{scope} LIMIT :limit)",
            {"match": expression, "now": NOW, "user": user, "limit": LIMIT},
        ).fetchone() or (0,)
        problem = None
        if matching != set(ids) or len(ids) != len(set(ids)):
            problem = f"ids {sorted(set(ids) - matching)[:3]} do not match, or repeat"
        elif len(ids) != expected:
            problem = f"{len(ids)} results where the raw index has {expected}"
        elif user is not None and any(r.record.user_id != user for r in results):
            problem = "a result of another user"
        else:
            for result in results:
                problem = _linked_problem(result, user, hops)
                if problem is not None:
                    break
        if problem is not None:
            raise BenchmarkError(f"{side}: {query!r}: {problem}")


def _linked_problem(result: RecordSearchResult, user: str | None, hops: int) -> str | None:
    seen = {result.id}
    level = [child for _, child in result.linked_results]
    depth = 0
    while level:
        depth += 1
        if depth > hops:
            return f"{result.id}: linked records {depth} hops away"
        for child in level:
            record = child.record
            if child.id in seen:
                return f"{result.id}: {child.id} linked twice"
            seen.add(child.id)
            if record.record_type != RecordType.MEMORY:
                return f"{result.id}: a linked {record.record_type.value}"
            if record.expires_at is not None and record.expires_at <= NOW:
                return f"{result.id}: an expired linked record"
            if user is not None and record.user_id != user:
                return f"{result.id}: a linked record of another user"
        level = [grandchild for child in level for _, grandchild in child.linked_results]
    return None


# -- the report -------------------------------------------------------------------------


def slowest(timings: Timings, side: str, raw: Path, count: int = 5) -> list[dict[str, Any]]:
    """The `count` slowest queries of `side`, with each term's document frequency."""
    seconds: list[float] = getattr(timings, side)
    other = "store" if side == "client" else "client"
    order = sorted(range(len(seconds)), key=lambda i: -seconds[i])[:count]
    conn = apsw.Connection(str(raw), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        conn.execute("CREATE VIRTUAL TABLE temp.v USING fts5vocab(main, t, 'row')")
        out = []
        for i in order:
            plan = plan_match(timings.queries[i])
            assert plan is not None
            docs = {}
            for term in plan.terms:
                stem = conn.execute(
                    "SELECT coalesce((SELECT doc FROM temp.v WHERE term = ?), 0)",
                    (_stem(conn, term),),
                ).fetchone()
                docs[term] = int(stem[0]) if stem else 0
            out.append(
                {
                    "query": timings.queries[i],
                    "at": i,  # its place among the timed queries: bursts of noise cluster
                    "ms": round(seconds[i] * 1000, 3),
                    "raw_or_ms": _ms(timings.raw_or[i]),
                    # The other library side on the same query: both slow points at the machine.
                    "other_ms": round(getattr(timings, other)[i] * 1000, 3),
                    "term_docs": docs,
                }
            )
        return out
    finally:
        conn.close()


def _stem(conn: apsw.Connection, term: str) -> str:
    """`term` as the index stores it (Porter-stemmed)."""
    tokenizer = conn.fts5_tokenizer("porter", list(fts_query.TOKENIZER_ARGS))
    found = [t for _, _, t in fts_query.tokens(tokenizer, term.encode(), apsw.FTS5_TOKENIZE_QUERY)]
    return found[0] if found else term


def report(
    args: argparse.Namespace,
    params: Params,
    load: LoadTimes,
    timings: Timings,
    run_dir: Path,
    *,
    kept: bool,
) -> dict[str, Any]:
    """The figures, ratios and verdicts as one JSON-able object."""
    sides = {
        "raw_or_ms": percentiles([t for t in timings.raw_or if t is not None]),
        "raw_plan_ms": percentiles([t for t in timings.raw_plan if t is not None]),
        "client_ms": percentiles(timings.client),
        "store_ms": percentiles(timings.store),
        "client_sql_cpu_ms": percentiles(timings.client_sql_cpu),
        "store_sql_cpu_ms": percentiles(timings.store_sql_cpu),
    }
    floor = sides["raw_or_ms"]
    ratios = {
        f"{side}_{p}": runner.ratio(sides[f"{side}_ms"][p], floor[p])
        for side in ("client", "store")
        for p in ("p50", "p99")
    }
    n = len(timings.client)
    return {
        "benchmark": "records",
        "corpus": {
            "records": params.records,
            "relations": params.relations,
            "stored_relations": load.stored_relations,
            "degree": params.degree,
            "users": params.users,
            "agents": params.agents,
            "threads": params.threads,
            "vocabulary": params.vocab,
            "zipf_exponent": ZIPF_EXPONENT,
            "words_per_record": list(WORDS_PER_RECORD),
            "type_mix": {t.value: share for t, share in TYPE_MIX.items()},
            "unscoped": UNSCOPED,
            "same_user_share": SAME_USER_SHARE,
            "seed": params.seed,
        },
        "load": {
            "reused": load.reused,
            "library_s": round(load.library, 3),
            "records_s": round(load.records, 3),
            "relations_s": round(load.relations, 3),
            "library_records_per_s": round(params.records / load.records, 1),
            "library_relations_per_s": round(params.relations / max(load.relations, 1e-9), 1),
            "raw_s": round(load.raw, 3),
        },
        "queries": {
            "count": n,
            "warmup": args.warmup,
            "words": list(QUERY_WORDS),
            "limit": LIMIT,
            "hops": args.hops,
            "floor_every": args.floor_every,
        },
        "targets": {"p99_ms_max": TARGET_P99_MS, "tail_ratio_max": TARGET_TAIL_RATIO},
        "tail_ratios": {
            side: runner.ratio(sides[f"{side}_ms"]["p99"], sides[f"{side}_ms"]["p50"])
            for side in ("client", "store")
        },
        # The work's own tail (thread CPU time of the SQL path), apart from the scheduler.
        "sql_cpu_tail_ratios": {
            side: runner.ratio(
                sides[f"{side}_sql_cpu_ms"]["p99"], sides[f"{side}_sql_cpu_ms"]["p50"]
            )
            for side in ("client", "store")
        },
        "sides": sides,
        "ratios": ratios,
        "results": {
            "client_mean_hits": round(sum(timings.client_hits) / n, 2),
            "client_mean_linked": round(sum(timings.client_linked) / n, 2),
            "store_mean_hits": round(sum(timings.store_hits) / n, 2),
            "store_mean_linked": round(sum(timings.store_linked) / n, 2),
        },
        "pass": {
            "client_p99_ms": sides["client_ms"]["p99"] <= TARGET_P99_MS,
            "store_p99_ms": sides["store_ms"]["p99"] <= TARGET_P99_MS,
            "client_tail_ratio": sides["client_ms"]["p99"]
            <= TARGET_TAIL_RATIO * sides["client_ms"]["p50"],
            "store_tail_ratio": sides["store_ms"]["p99"]
            <= TARGET_TAIL_RATIO * sides["store_ms"]["p50"],
        },
        "slowest": {
            "client": slowest(timings, "client", run_dir / "raw.db"),
            "store": slowest(timings, "store", run_dir / "raw.db"),
        },
        "environment": runner.environment(run_dir, kept=kept)
        | {"load_average": [round(x, 2) for x in os.getloadavg()]},  # at the end of the run
    }


def format_table(result: dict[str, Any]) -> str:
    """The report for a person."""
    corpus, load, q = result["corpus"], result["load"], result["queries"]
    low, high = corpus["words_per_record"]
    reuse = " (reused: times from the run that loaded it)" if load["reused"] else ""
    mix = ", ".join(f"{t} {share:.0%}" for t, share in corpus["type_mix"].items())
    lines = [
        "Records search latency (mem.records search + graph expansion vs raw FTS5, same run)",
        f"  corpus: {corpus['records']:,} records ({mix}); Zipf({corpus['zipf_exponent']}) over "
        f"{corpus['vocabulary']:,} words, {low}-{high} words/record, seed {corpus['seed']}",
        f"          {corpus['users']} users, {corpus['agents']} agents, {corpus['threads']} "
        f"threads; unscoped: " + ", ".join(f"{d} {s:.0%}" for d, s in corpus["unscoped"].items()),
        f"  graph: {corpus['stored_relations']:,} relations (mean degree {corpus['degree']}), "
        f"{corpus['same_user_share']:.0%} within a user",
        f"  load{reuse}: library {load['library_s']:.1f} s (records {load['records_s']:.1f} s, "
        f"{load['library_records_per_s']:,.0f}/s; relations {load['relations_s']:.1f} s, "
        f"{load['library_relations_per_s']:,.0f}/s); raw floor {load['raw_s']:.1f} s",
        f"  queries: {q['count']:,} timed after {q['warmup']} warm-up, {q['words'][0]}-"
        f"{q['words'][1]} words, limit {q['limit']}, num_hops {q['hops']}; sides interleaved; "
        f"raw sides on every {q.get('floor_every', 1)} query",
        "",
        runner.percentile_header("side", 44),
    ]
    res = result["results"]
    for label, key in (
        ("raw OR (floor)", "raw_or_ms"),
        ("raw plan_match expression (diagnostic)", "raw_plan_ms"),
        (f"client, exact user ({res['client_mean_hits']} hits, "
         f"{res['client_mean_linked']} linked)", "client_ms"),
        (f"store, unfiltered ({res['store_mean_hits']} hits, "
         f"{res['store_mean_linked']} linked)", "store_ms"),
        ("client SQL in-thread, thread CPU (diag.)", "client_sql_cpu_ms"),
        ("store SQL in-thread, thread CPU (diag.)", "store_sql_cpu_ms"),
    ):  # fmt: skip
        lines.append(runner.percentile_row(label, result["sides"][key], 44, indent=2))
    lines.append("")
    for side in ("client", "store"):
        p99 = result["sides"][f"{side}_ms"]["p99"]
        ok = result["pass"][f"{side}_p99_ms"]
        lines.append(
            f"  {side} / raw OR: p50 {result['ratios'][f'{side}_p50']:.2f}, "
            f"p99 {result['ratios'][f'{side}_p99']:.2f}; "
            + runner.against(f"p99 {p99:.2f} ms", "<=", f"{TARGET_P99_MS:g} ms", ok)
        )
        tail = result["tail_ratios"][side]
        ok_tail = result["pass"][f"{side}_tail_ratio"]
        lines.append(
            f"  {side} "
            + runner.against(f"p99 / p50 {tail:.2f}", "<=", TARGET_TAIL_RATIO, ok_tail)
            + f"; its SQL in-thread, CPU p99 / p50 {result['sql_cpu_tail_ratios'][side]:.2f}"
        )
    for side in ("client", "store"):
        lines.append(f"  slowest {side} queries (term: documents holding it):")
        for s in result["slowest"][side]:
            docs = ", ".join(f"{t}: {d:,}" for t, d in s["term_docs"].items())
            lines.append(
                f"    {s['ms']:>9.3f} ms (#{s['at']}: raw OR {_shown(s['raw_or_ms'])}, "
                f"{'store' if side == 'client' else 'client'} {s['other_ms']:.3f})  "
                f"{s['query']!r}  [{docs}]"
            )
    return "\n".join(lines + runner.environment_lines(result["environment"]))


# -- the command ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (`sys.argv[1:]` when `argv` is None)."""
    parser = runner.command(
        "records",
        "mem.records search with graph expansion against a raw FTS5 query.",
        seed=1,
        state_dir=runner.REUSE_HELP,
    )
    parser.add_argument("--records", type=runner.int_at_least(2), default=1_000_000)
    parser.add_argument("--degree", type=runner.int_at_least(0), default=4, help="mean degree")
    runner.add_sizes(parser, users=300, agents=30, threads=500, vocab=50_000, queries=QUERIES)
    parser.add_argument("--warmup", type=runner.int_at_least(0), default=WARMUP)
    parser.add_argument("--hops", type=int, choices=range(6), default=2, help="num_hops, 0-5")
    parser.add_argument(
        "--floor-every",
        type=runner.positive_int,
        default=1,
        help="run the raw sides (up to seconds each at 1M) on every Nth query only",
    )
    return parser.parse_args(argv)


def run_all(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
    """Load (or reuse) the stores in `run_dir`, time the queries, return the report."""
    params = Params(
        records=args.records,
        degree=args.degree,
        users=args.users,
        agents=args.agents,
        threads=args.threads,
        vocab=args.vocab,
        seed=args.seed,
    )
    zipf = Zipf(args.vocab, args.seed)
    load = prepare(run_dir, params, zipf)
    count = args.warmup + args.queries
    queries = make_queries(zipf, args.seed, count)
    users = query_users(params, count)
    run = partial(
        run_queries,
        run_dir,
        queries,
        users,
        hops=args.hops,
        warmup=args.warmup,
        floor_every=args.floor_every,
    )
    timings = trio.run(run)
    return report(args, params, load, timings, run_dir, kept=kept)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`).

    Returns 0 (whatever the verdicts), 1 if the library answered something the raw index
    contradicts or the state directory holds foreign databases, 2 if `--state-dir` is unusable.
    """
    return runner.main("records", parse_args(argv), run_all, format_table)
