"""Search latency: `mem.sessions.search` against a raw FTS5 query, at 1M messages (docs/design.md §3, §7).

One seeded synthetic corpus (Zipf-distributed words over a made-up vocabulary, roles
alternating user/assistant, spread evenly over many sessions of one agent) is stored twice:

- through the library: `open_memory()`, each session imported (`import_transcript`), then
  `rebuild_index()` (or, with `--load append`, every message appended live);
- as the raw floor: a separate SQLite file with nothing but an FTS5 table defined as the
  library's (its CREATE statement and rank function are copied from the library's database)
  holding the same rows (rowids, and column values from the library's own `index_row`),
  filled in one transaction, WAL.

Then the same seeded queries (1-4 words drawn from the same Zipf law, so common words show up
as often as in real queries) run on both, interleaved query by query so machine noise hits
every side alike:

- raw OR: `SELECT rowid, rank FROM t WHERE t MATCH '"a" OR "b"' ORDER BY rank LIMIT 10`,
  synchronous on the calling thread: the floor;
- raw phrase: the same SQL with the library's own expression (`build_match`, which adds the
  whole query as a phrase): what the query semantics cost, apart from the library;
- raw pruned (the second floor): exactly the FTS5 queries the library runs after pruning
  common terms (`storage.search.ranking_steps`, decided on the raw table untimed, as the
  library's reader has them cached), each with the library's ordering and pool size, in
  order until the pool is full; no visibility, no thread hop, no rerank, no details. The
  raw OR floor flatters the library (it answers a costlier query); this one does not;
- raw OR, top-k (a diagnostic, not the floor): the OR query with the library's tie-break
  `ORDER BY rank, rowid DESC`, which SQLite sorts keeping only the top rows, where
  `ORDER BY rank` alone goes through FTS5's own sorted cursor and is markedly slower;
- library SQL, in-thread (a diagnostic): the library's `storage.search.search_scope` on a
  read-only connection of its own database, on the calling thread, timed in wall time and
  in the thread's CPU time. On shared CPUs a wall-clock tail is mostly the scheduler (the
  raw pruned floor's own p99 / p50 shows how much); the CPU time is the work's own tail;
- library: `await mem.sessions.search(q, caller=..., limit=10)` end to end from the trio
  loop, once per visibility setting (`agent`; the default `tree` from a caller that spawned
  nothing; `tree` from a caller that spawned two sessions).

It prints p50/p90/p99/max per side, the library/raw ratios, and PASS/MISS against the
targets: a flat tail, library p99 <= 3 x library p50 (issue 15); p50 library/raw-OR ratio
<= 1.5; p99 <= 10 ms. Absolute times on a shared machine
are noise; the ratios are the result. With `--state-dir`, the loaded databases are kept with
their parameters (`bench-search.json`) and reused by a later run with the same parameters.

    activememory bench search [--messages N] [--json] ...
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, Generic, Literal, TypeAlias, TypeVar, cast

import apsw
import trio

import activememory as am

from ...protocol.content import Role
from ...storage import fts_query, transcripts
from ...storage.db import SCHEMA_VERSION, configure
from ...storage.fts_query import STOPWORDS, MatchPlan, build_match, index_row, plan_match
from ...storage.search import (
    POOL,
    DbScope,
    TermStats,
    every_term_first,
    ranking_steps,
    search_scope,
)
from ...storage.transcripts import agent_db_path
from . import runner
from .runner import BenchmarkError, percentile_row, percentiles, ratio

AGENT = "main"
ZIPF_EXPONENT = 1.1
WORD_LENGTH = (3, 10)
WORDS_PER_MESSAGE = (4, 30)
QUERY_WORDS = (1, 4)
TURNS: tuple[Role, Role] = ("user", "assistant")
LIMIT = 10
SPAWN_EVERY = 50  # every 50th session spawns the next two
CHILDREN = 2
IMPORTERS = 8  # concurrent import_transcript calls: lets group commit batch them
APPENDERS = 64
WARMUP = 100
TARGET_P50_RATIO = 1.5
TARGET_P99_MS = 10.0
TARGET_TAIL_RATIO = 3.0  # library p99 / library p50
PARAMS_FILE = "bench-search.json"
# Text search alone: with the default embedder the library would also embed every message
# in the background (docs/design.md §2.3), on the CPUs the searches are timed on.
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
LAYOUT = 1  # bump when what a reused state directory holds changes
RAW_QUERY = "SELECT rowid, rank FROM t WHERE t MATCH ? ORDER BY rank LIMIT 10"
# Not the floor, a diagnostic: `ORDER BY rank` alone is served by FTS5's own sorted cursor;
# with a second sort key (the library's tie-break) SQLite sorts, keeping only the top rows.
RAW_TOPK_QUERY = "SELECT rowid, rank FROM t WHERE t MATCH ? ORDER BY rank, rowid DESC LIMIT 10"

T = TypeVar("T")
LoadMethod: TypeAlias = Literal["import", "append"]
LOAD_METHODS: tuple[LoadMethod, ...] = ("import", "append")

_ONSETS = (
    "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "y",
    "z", "br", "ch", "cl", "cr", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "st", "th", "tr",
)  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ea", "ee", "ie", "oa", "oo", "ou")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "rt")


# -- the corpus -------------------------------------------------------------------------


@dataclass(frozen=True)
class Params:
    """What the stored databases depend on: a state directory is reused only if they match."""

    messages: int
    sessions: int
    vocab: int
    seed: int
    load: LoadMethod

    def as_dict(self) -> dict[str, Any]:
        """The parameters as recorded in `bench-search.json`."""
        return {
            "layout": LAYOUT,
            **asdict(self),
            "zipf_exponent": ZIPF_EXPONENT,
            "word_length": list(WORD_LENGTH),
            "words_per_message": list(WORDS_PER_MESSAGE),
            "spawn_every": SPAWN_EVERY,
            "children": CHILDREN,
            "schema_version": SCHEMA_VERSION,
            "index_code": runner.code_digest(fts_query, transcripts),
        }


class Zipf:
    """The vocabulary and its Zipf law: rank r is drawn with weight 1 / r**ZIPF_EXPONENT."""

    def __init__(self, vocab: int, seed: int) -> None:
        self.words = make_vocabulary(random.Random(f"{seed}:vocabulary"), vocab)
        self.cum_weights = list(
            itertools.accumulate(1.0 / rank**ZIPF_EXPONENT for rank in range(1, vocab + 1))
        )

    def draw(self, rng: random.Random, k: int) -> list[str]:
        """`k` words, with repetition."""
        return rng.choices(self.words, cum_weights=self.cum_weights, k=k)


def searchable(word: str) -> bool:
    """3-10 letters and no English stopword: the library drops stopwords from queries and the
    raw floor would not, which is not what is measured."""
    return WORD_LENGTH[0] <= len(word) <= WORD_LENGTH[1] and word not in STOPWORDS


def make_vocabulary(
    rng: random.Random, size: int, keep: Callable[[str], bool] = searchable
) -> list[str]:
    """`size` distinct pronounceable lowercase words that `keep` keeps, shortest first
    (frequent words are short)."""
    words: dict[str, None] = {}
    while len(words) < size:
        syllables = rng.choices((1, 2, 3, 4), weights=(3, 5, 3, 1))[0]
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        )
        if keep(word):
            words[word] = None
    return sorted(words, key=len)  # stable: generation order within a length


def session_key(n: int) -> str:
    """Session `n` of the benchmark agent: a direct chat."""
    return f"agent:{AGENT}:direct:s{n}"


def spawned(n: int, sessions: int) -> list[int]:
    """The sessions session `n` spawned: the next two after every 50th session."""
    if n % SPAWN_EVERY:
        return []
    return [c for c in range(n + 1, n + 1 + CHILDREN) if c < sessions]


def session_sizes(messages: int, sessions: int) -> list[int]:
    """Messages per session: spread evenly, the first few sessions one more."""
    base, extra = divmod(messages, sessions)
    return [base + (n < extra) for n in range(sessions)]


def conversation(zipf: Zipf, seed: int, n: int, size: int) -> list[str]:
    """The texts of session `n`, from its own seeded generator (any order of generation)."""
    rng = random.Random(f"{seed}:session:{n}")
    low, high = WORDS_PER_MESSAGE
    return [
        " ".join(zipf.draw(rng, rng.randint(low, high))).capitalize() + "." for _ in range(size)
    ]


def make_queries(zipf: Zipf, seed: int, count: int) -> list[str]:
    """`count` seeded queries of 1-4 distinct words from the corpus's Zipf law."""
    rng = random.Random(f"{seed}:queries")
    low, high = QUERY_WORDS
    queries = []
    for _ in range(count):
        words = list(dict.fromkeys(zipf.draw(rng, rng.randint(low, high))))
        queries.append(" ".join(words))
    return queries


def or_match(query: str) -> str:
    """The floor's MATCH expression: every word a quoted string, OR-ed."""
    return " OR ".join(f'"{word}"' for word in query.split())


# -- loading ----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadTimes:
    """How long the stores took to fill (seconds), as first measured."""

    method: LoadMethod
    generate_and_store: float  # imports or appends, including generating the texts
    rebuild: float  # rebuild_index() (0 for appends: indexed as they commit)
    raw: float  # the raw floor's table, one transaction
    reused: bool = False

    @property
    def library(self) -> float:
        """The library's whole load."""
        return self.generate_and_store + self.rebuild


async def load_library(state_dir: Path, params: Params, zipf: Zipf) -> tuple[float, float]:
    """Store the corpus through the library; (store seconds, rebuild seconds).

    Cancellation: as for `import_transcript`/`append`; a cancelled load leaves a partial
    store that the next run discards (its parameters file says it is incomplete).
    """
    sizes = session_sizes(params.messages, params.sessions)
    async with am.open_memory(state_dir, executor="thread", config=TEXT_ONLY) as mem:
        start = time.perf_counter()
        if params.load == "import":
            await import_all(mem, zipf, params.seed, sizes)
        else:
            await _append_all(mem, zipf, params.seed, sizes)
        for parent in range(0, params.sessions, SPAWN_EVERY):
            for child in spawned(parent, params.sessions):
                await mem.sessions.create(session_key(child), spawned_by=session_key(parent))
        stored = time.perf_counter()
        await mem.sessions.rebuild_index()
        rebuilt = time.perf_counter()
        (stats,) = await mem.sessions.stats(check_integrity=False)
    expected = {"sessions": params.sessions, "indexed": params.messages, "dirty": 0}
    got = {
        "sessions": stats.sessions,
        "indexed": stats.indexed_messages,
        "dirty": stats.dirty_sessions,
    }
    if got != expected:
        raise BenchmarkError(f"library load: expected {expected}, got {got}")
    return stored - start, rebuilt - stored


async def import_all(mem: am.Memory, zipf: Zipf, seed: int, sizes: Sequence[int]) -> None:
    """Import session `n` with `sizes[n]` messages, for every `n`, a few sessions at a time.

    Cancellation: as for `import_transcript`; the sessions imported so far stay.
    """
    at = 1_700_000_000.0
    todo = iter(range(len(sizes)))

    async def importer() -> None:
        for n in todo:  # shared iterator: each task takes the next session
            entries = [
                am.ImportEntry(
                    id=str(i),
                    parent_id=str(i - 1) if i else None,
                    timestamp=at + i,
                    message=am.Message(role=TURNS[i % 2], content=text),
                )
                for i, text in enumerate(conversation(zipf, seed, n, sizes[n]))
            ]
            await mem.sessions.import_transcript(session_key(n), entries)

    async with trio.open_nursery() as nursery:
        for _ in range(IMPORTERS):
            nursery.start_soon(importer)


async def _append_all(mem: am.Memory, zipf: Zipf, seed: int, sizes: Sequence[int]) -> None:
    async def appender(first: int) -> None:
        for n in range(first, len(sizes), APPENDERS):
            key = session_key(n)
            for i, text in enumerate(conversation(zipf, seed, n, sizes[n])):
                await mem.sessions.append(key, am.Message(role=TURNS[i % 2], content=text))

    async with trio.open_nursery() as nursery:
        for first in range(min(APPENDERS, len(sizes))):
            nursery.start_soon(appender, first)


def load_raw(raw_path: Path, library_db: Path) -> float:
    """The floor's table: a copy of the library's index, filled in one transaction.

    Same definition (columns, tokenizer, contentless, rank function: read from the library's
    database, so the floor follows the schema), same rowids, same column values (the
    library's own `index_row` over each session's active branch). Returns the insert's seconds.
    """
    source = apsw.Connection(str(library_db), flags=apsw.SQLITE_OPEN_READONLY)
    conn = apsw.Connection(str(raw_path))
    try:
        configure(conn)  # WAL and the rest, as the library's connections
        schema, columns, rank = _library_index(source)
        conn.execute(schema)
        if rank is not None:
            conn.execute("INSERT INTO t(t, rank) VALUES ('rank', ?)", (rank,))
        branch = source.execute(
            "SELECT a.session_id, e.id, e.text FROM active_branch a"
            " JOIN events e ON e.id = a.event_id WHERE e.text IS NOT NULL"
            " ORDER BY a.session_id, a.depth"
        )
        placeholders = ", ".join("?" * (len(columns) + 1))
        insert = f"INSERT INTO t(rowid, {', '.join(columns)}) VALUES ({placeholders})"
        start = time.perf_counter()
        with conn:
            conn.executemany(insert, _index_rows(branch, len(columns)))
        return time.perf_counter() - start
    finally:
        conn.close()
        source.close()


def _library_index(source: apsw.Connection) -> tuple[str, list[str], str | None]:
    """The library's FTS5 table as (CREATE statement for `t`, columns, rank function)."""
    row = source.execute(
        "SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = 'message_fts'"
    ).fetchone()
    if row is None:
        raise BenchmarkError("the library's database has no message_fts table")
    schema = str(row[0]).replace("message_fts", "t", 1)
    columns = [str(c[1]) for c in source.execute("PRAGMA table_info(message_fts)")]
    rank = source.execute("SELECT v FROM message_fts_config WHERE k = 'rank'").fetchone()
    return schema, columns, None if rank is None else str(rank[0])


def _index_rows(branch: Iterable[tuple[Any, ...]], columns: int) -> Iterator[tuple[object, ...]]:
    previous: str | None = None
    session = None
    for session_id, event_id, text in branch:
        if session_id != session:
            session, previous = session_id, None
        row = index_row(event_id, text, previous)
        if len(row) != columns + 1:
            raise BenchmarkError(
                f"index_row gives {len(row) - 1} columns, the library's table has {columns}"
            )
        yield row
        previous = text


def prepare(run_dir: Path, params: Params, zipf: Zipf) -> LoadTimes:
    """Load both stores into `run_dir`, or reuse what a run with the same parameters left."""

    def load() -> dict[str, float]:
        store, rebuild = trio.run(load_library, run_dir / "library", params, zipf)
        raw = load_raw(run_dir / "raw.db", agent_db_path(run_dir / "library", AGENT))
        return {"generate_and_store": store, "rebuild": rebuild, "raw": raw}

    outputs = ("library", "raw.db*")
    times, reused = runner.reuse_or_load(
        run_dir, PARAMS_FILE, params.as_dict(), load, outputs=outputs
    )
    return LoadTimes(method=params.load, **times, reused=reused)


# -- the queries ------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One way of opening the memory and choosing callers for the library side."""

    name: str
    visibility: str
    callers: Literal["any", "leaf", "parent"]
    description: str


SETTINGS = (
    Setting("agent", "agent", "any", "visibility agent: every session of the agent"),
    Setting("tree", "tree", "leaf", "visibility tree (default), caller spawned nothing"),
    Setting("tree+2", "tree", "parent", "visibility tree (default), caller spawned 2 sessions"),
)
SETTING_NAMES = tuple(s.name for s in SETTINGS)


def callers_for(setting: Setting, sessions: int, count: int, seed: int) -> list[int]:
    """The calling session of each query, seeded (the same list for every run)."""
    if setting.callers == "parent":
        pool = [n for n in range(0, sessions, SPAWN_EVERY) if len(spawned(n, sessions)) == CHILDREN]
    elif setting.callers == "leaf":
        pool = [n for n in range(sessions) if not spawned(n, sessions)]
    else:
        pool = list(range(sessions))
    if not pool:
        raise BenchmarkError(f"setting {setting.name}: no session can be its caller")
    rng = random.Random(f"{seed}:callers:{setting.name}")
    return [rng.choice(pool) for _ in range(count)]


@dataclass(frozen=True)
class Timings:
    """Per-query seconds of each side in one setting, in query order."""

    raw_or: list[float]
    raw_or_topk: list[float]
    raw_phrase: list[float]
    raw_pruned: list[float]
    raw_pruned_cpu: list[float]
    core: list[float]
    core_cpu: list[float]
    library: list[float]
    hits: list[int]  # results the library returned


async def run_setting(
    run_dir: Path,
    setting: Setting,
    queries: Sequence[str],
    callers: Sequence[int],
    *,
    warmup: int,
    sessions: int,
    floor_every: int = 1,
) -> Timings:
    """Time every query on every side, interleaved, after `warmup` untimed queries; the three
    slow raw sides (OR, top-k, build_match: up to seconds each at 1M) only every
    `floor_every`-th query, so the library's tail is measured over many more queries.

    Cancellation: a search already started finishes on its worker thread; nothing is written.
    """
    config = TEXT_ONLY | {"tools": {"sessions": {"visibility": setting.visibility}}}
    raw = apsw.Connection(str(run_dir / "raw.db"))
    configure(raw)
    timings = Timings([], [], [], [], [], [], [], [], [])
    raw_terms = TermStats("t")  # the raw table's own: same rows, same decisions
    own = agent_db_path(run_dir / "library", AGENT)
    core_conn = apsw.Connection(str(own), flags=apsw.SQLITE_OPEN_READONLY)
    core_terms = TermStats()
    scope: DbScope = "all" if setting.visibility == "agent" else "tree"
    try:
        async with am.open_memory(run_dir / "library", executor="thread", config=config) as mem:
            for i, (query, caller) in enumerate(zip(queries, callers, strict=True)):
                key = session_key(caller)
                raw_or = RawSide(raw, or_match(query))
                raw_or_topk = RawSide(raw, or_match(query), RAW_TOPK_QUERY)
                raw_phrase = RawSide(raw, build_match(query))
                raw_pruned = PrunedSide(raw, query, raw_terms)
                core = CoreSide(core_conn, raw_pruned.plan, scope, key, core_terms)
                library = LibrarySide(partial(mem.sessions.search, query, caller=key, limit=LIMIT))
                slow = i % floor_every == 0
                sides: list[RawSide | PrunedSide | CoreSide | LibrarySide[Any]] = [
                    raw_pruned,
                    core,
                    library,
                ]
                if slow:
                    sides = [raw_or, raw_or_topk, raw_phrase, *sides]
                # Rotate which side goes first, so no side always finds the caches warmer.
                turn = i % len(sides)
                for side in sides[turn:] + sides[:turn]:
                    await side.run()
                if i < warmup:
                    continue
                assert library.result is not None
                _check(setting, query, raw, raw_phrase, caller, sessions, library.result)
                if slow:
                    timings.raw_or.append(raw_or.seconds)
                    timings.raw_or_topk.append(raw_or_topk.seconds)
                    timings.raw_phrase.append(raw_phrase.seconds)
                timings.raw_pruned.append(raw_pruned.seconds)
                timings.raw_pruned_cpu.append(raw_pruned.cpu)
                timings.core.append(core.seconds)
                timings.core_cpu.append(core.cpu)
                timings.library.append(library.seconds)
                timings.hits.append(len(library.result.results))
    finally:
        core_conn.close()
        raw.close()
    return timings


class RawSide:
    """The floor: one FTS5 query, synchronous on the calling thread."""

    def __init__(self, conn: apsw.Connection, expression: str | None, sql: str = RAW_QUERY) -> None:
        self.conn = conn
        self.expression = expression
        self.sql = sql
        self.seconds = 0.0
        self.rows: list[tuple[int, float]] = []

    async def run(self) -> None:
        start = time.perf_counter()
        rows = self.conn.execute(self.sql, (self.expression,)).fetchall()
        self.seconds = time.perf_counter() - start
        self.rows = cast(list[tuple[int, float]], rows)


class PrunedSide:
    """The second floor: the library's own FTS5 steps after pruning, on the bare table."""

    SQL = (
        "SELECT f.rowid, {rank} FROM t f WHERE t MATCH ? AND f.rowid >= ? ORDER BY {order} LIMIT ?"
    )

    def __init__(self, conn: apsw.Connection, query: str, terms: TermStats) -> None:
        self.conn = conn
        plan = plan_match(query)
        if plan is None:
            raise BenchmarkError(f"{query!r}: nothing searchable")
        self.plan: MatchPlan = plan
        # Decided before the clock starts: the library's reader has seen most terms before.
        self.steps = ranking_steps(conn, plan, terms)
        self.seconds = self.cpu = 0.0

    async def run(self) -> None:
        pool = max(POOL, LIMIT + 1)  # what the library asks of its pool (`search_scope`)
        start, cpu = time.perf_counter(), time.thread_time()
        seen: set[int] = set()
        for step in self.steps:
            sql = self.SQL.format(**step.ordering)
            limit = step.wide or pool - len(seen)
            found = self.conn.execute(sql, (step.expression, step.since, limit)).fetchall()
            rows = cast(list[tuple[int, float]], found)
            if step.wide:
                rows = every_term_first(self.conn, "t", self.plan, rows)
            seen.update(rowid for rowid, _ in rows[: pool - len(seen)])
            if len(seen) >= pool:
                break
        self.seconds = time.perf_counter() - start
        self.cpu = time.thread_time() - cpu


class CoreSide:
    """A diagnostic: the library's SQL path (`search_scope`) on the calling thread, timed in
    wall and thread CPU time; no thread hop, no redaction or snippets."""

    def __init__(
        self, conn: apsw.Connection, plan: MatchPlan, scope: DbScope, caller: str, terms: TermStats
    ) -> None:
        self.call = partial(
            search_scope,
            conn,
            plan,
            scope=scope,
            caller=caller,
            session_key=None,
            keep=LIMIT + 1,
            stats=terms,
        )
        self.seconds = self.cpu = 0.0

    async def run(self) -> None:
        start, cpu = time.perf_counter(), time.thread_time()
        self.call()
        self.seconds = time.perf_counter() - start
        self.cpu = time.thread_time() - cpu


class LibrarySide(Generic[T]):
    """One library call (a search), end to end from the event loop."""

    def __init__(self, call: Callable[[], Awaitable[T]]) -> None:
        self.call = call
        self.seconds = 0.0
        self.result: T | None = None

    async def run(self) -> None:
        start = time.perf_counter()
        result = await self.call()
        self.seconds = time.perf_counter() - start
        self.result = result


def _check(
    setting: Setting,
    query: str,
    raw: apsw.Connection,
    phrase: RawSide,
    caller: int,
    sessions: int,
    result: am.SearchResult,
) -> None:
    """Raise `BenchmarkError` unless the library answered what the raw index implies.

    Every hit must match the library's expression in the raw index and be visible to the
    caller; with visibility `agent` there must be as many hits as the raw query found (the
    library may reorder them: it reranks a pool of BM25 matches).
    """
    hits = result.results
    ids = [h.message_id for h in hits]
    matching = {
        rowid
        for (rowid,) in raw.execute(
            "SELECT rowid FROM t WHERE t MATCH ? AND rowid IN (SELECT value FROM json_each(?))",
            (phrase.expression, json.dumps(ids)),
        )
    }
    # Any LIMIT rows: counting needs no ranking (the raw side may not have run this query).
    (expected,) = raw.execute(
        "SELECT count(*) FROM (SELECT 1 FROM t WHERE t MATCH ? LIMIT ?)",
        (phrase.expression, LIMIT),
    ).fetchone() or (0,)
    problem = None
    if matching != set(ids):
        problem = f"message ids {sorted(set(ids) - matching)[:5]} do not match the query"
    elif setting.visibility == "agent" and len(hits) != expected:
        problem = f"{len(hits)} results where the raw index has {expected}"
    elif setting.visibility == "tree":
        visible = {session_key(n) for n in [caller, *spawned(caller, sessions)]}
        outside = [h.session_key for h in hits if h.session_key not in visible]
        if outside:
            problem = f"results from sessions the caller cannot see: {outside[:3]}"
    if problem is not None:
        raise BenchmarkError(f"{setting.name}: {query!r}: {problem}")


# -- the report -------------------------------------------------------------------------


def setting_report(setting: Setting, timings: Timings) -> dict[str, Any]:
    """One setting's figures, ratios and verdicts."""
    raw_or = percentiles(timings.raw_or)
    raw_or_topk = percentiles(timings.raw_or_topk)
    raw_phrase = percentiles(timings.raw_phrase)
    raw_pruned = percentiles(timings.raw_pruned)
    raw_pruned_cpu = percentiles(timings.raw_pruned_cpu)
    core = percentiles(timings.core)
    core_cpu = percentiles(timings.core_cpu)
    library = percentiles(timings.library)
    ratio_p50 = ratio(library["p50"], raw_or["p50"])
    return {
        "name": setting.name,
        "description": setting.description,
        "visibility": setting.visibility,
        "queries": len(timings.library),
        "mean_results": round(sum(timings.hits) / len(timings.hits), 2),
        "raw_or_ms": raw_or,
        "raw_or_topk_ms": raw_or_topk,
        "raw_phrase_ms": raw_phrase,
        "raw_pruned_ms": raw_pruned,
        "raw_pruned_cpu_ms": raw_pruned_cpu,
        "core_ms": core,
        "core_cpu_ms": core_cpu,
        # The work's own tail, apart from the scheduler: CPU time of the SQL path.
        "core_cpu_tail_ratio": ratio(core_cpu["p99"], core_cpu["p50"]),
        "library_ms": library,
        # The flat-tail target: the library's own p99 against its own p50.
        "tail_ratio": ratio(library["p99"], library["p50"]),
        "pass_tail_ratio": library["p99"] <= TARGET_TAIL_RATIO * library["p50"],
        # Against the second floor: the very queries the library runs, on the bare table.
        "ratio_pruned_p50": ratio(library["p50"], raw_pruned["p50"]),
        "ratio_pruned_p99": ratio(library["p99"], raw_pruned["p99"]),
        "raw_pruned_tail_ratio": ratio(raw_pruned["p99"], raw_pruned["p50"]),
        "ratio_p50": ratio_p50,
        "ratio_p99": ratio(library["p99"], raw_or["p99"]),
        # The split: what the library's query semantics cost SQLite, and what the rest costs.
        "semantics_p50": ratio(raw_phrase["p50"], raw_or["p50"]),
        "overhead_p50": ratio(library["p50"], raw_phrase["p50"]),
        "overhead_p99": ratio(library["p99"], raw_phrase["p99"]),
        # Against the same OR query sorted by SQLite (top-k) instead of FTS5's sorted cursor.
        "ratio_topk_p50": ratio(library["p50"], raw_or_topk["p50"]),
        "ratio_topk_p99": ratio(library["p99"], raw_or_topk["p99"]),
        "pass_p50_ratio": library["p50"] / raw_or["p50"] <= TARGET_P50_RATIO,
        "pass_p99_ms": library["p99"] <= TARGET_P99_MS,
    }


def format_table(result: dict[str, Any]) -> str:
    """The report for a person."""
    corpus, load, q = result["corpus"], result["load"], result["queries"]
    low, high = corpus["words_per_message"]
    reuse = " (reused: times from the run that loaded it)" if load["reused"] else ""
    lines = [
        "Search latency (sessions_search vs raw FTS5, same rows, same run)",
        f"  corpus: {corpus['messages']:,} messages in {corpus['sessions']:,} sessions "
        f"({corpus['spawning_sessions']} spawn {CHILDREN} each); Zipf({corpus['zipf_exponent']}) "
        f"over {corpus['vocabulary']:,} words, {low}-{high} words/message, seed {corpus['seed']}",
        f"  load ({load['method']}){reuse}: library {load['library_s']:.1f} s "
        f"({load['library_messages_per_s']:,.0f} msg/s: store {load['store_s']:.1f} s + "
        f"rebuild_index {load['rebuild_s']:.1f} s); raw floor {load['raw_s']:.1f} s",
        f"  queries: {q['count']:,} timed after {q['warmup']} warm-up, {q['words'][0]}-"
        f"{q['words'][1]} words, limit {q['limit']}; sides interleaved per query; raw OR,"
        f" top-k and build_match on every {q.get('floor_every', 1)} query",
        "",
        runner.percentile_header("setting / side", 34),
    ]
    for s in result["settings"]:
        lines.append(f"  {s['name']}: {s['description']} (mean {s['mean_results']} results)")
        for label, key in (
            ("raw OR (floor)", "raw_or_ms"),
            ("raw OR, top-k sort (diagnostic)", "raw_or_topk_ms"),
            ("raw build_match", "raw_phrase_ms"),
            ("raw pruned (second floor)", "raw_pruned_ms"),
            ("  the same, thread CPU time", "raw_pruned_cpu_ms"),
            ("library SQL in-thread (diag.)", "core_ms"),
            ("  the same, thread CPU time", "core_cpu_ms"),
            ("library", "library_ms"),
        ):
            lines.append(percentile_row(label, s[key], 32))
        tail = runner.against(
            f"library p99 / p50 {s['tail_ratio']:.2f}",
            "<=",
            TARGET_TAIL_RATIO,
            s["pass_tail_ratio"],
        )
        lines.append(f"    {tail}")
        lines.append(
            f"    library / raw pruned: p50 {s['ratio_pruned_p50']:.2f}, "
            f"p99 {s['ratio_pruned_p99']:.2f} (raw pruned p99 / p50 "
            f"{s['raw_pruned_tail_ratio']:.2f}); library SQL CPU p99 / p50 "
            f"{s['core_cpu_tail_ratio']:.2f}"
        )
        p50 = runner.against(
            f"p50 {s['ratio_p50']:.2f}", "<=", TARGET_P50_RATIO, s["pass_p50_ratio"]
        )
        p99 = f"p99 {s['library_ms']['p99']:.2f} ms"
        p99 = runner.against(p99, "<=", f"{TARGET_P99_MS:g} ms", s["pass_p99_ms"])
        lines.append(f"    library / raw OR: {p50}; p99 {s['ratio_p99']:.2f}; {p99}")
        lines.append(
            f"    split at p50: query semantics (build_match / OR) {s['semantics_p50']:.2f}, "
            f"library overhead (library / build_match) {s['overhead_p50']:.2f}"
        )
        lines.append(
            f"    library / raw OR with top-k sort: p50 {s['ratio_topk_p50']:.2f}, "
            f"p99 {s['ratio_topk_p99']:.2f}"
        )
    return "\n".join(lines + runner.environment_lines(result["environment"]))


# -- the command ------------------------------------------------------------------------


def _settings(value: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [n for n in names if n not in SETTING_NAMES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {', '.join(SETTING_NAMES)}, got {value!r}"
        )
    return names


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (`sys.argv[1:]` when `argv` is None)."""
    parser = runner.command(
        "search",
        "sessions_search latency against a raw FTS5 query.",
        seed=1,
        state_dir=runner.REUSE_HELP,
    )
    runner.add_sizes(parser, messages=1_000_000, sessions=10_000, vocab=50_000, queries=2000)
    parser.add_argument("--warmup", type=int, default=WARMUP, help="untimed queries per setting")
    parser.add_argument(
        "--floor-every",
        type=runner.positive_int,
        default=1,
        help="run the slow raw OR / top-k / build_match sides on every Nth query only "
        "(the pruned floor and the library run on every query)",
    )
    parser.add_argument(
        "--settings",
        type=_settings,
        default=SETTING_NAMES,
        help=f"comma-separated, default all: {','.join(SETTING_NAMES)}",
    )
    parser.add_argument(
        "--load",
        choices=LOAD_METHODS,
        default="import",
        help="import_transcript per session + rebuild_index (default, faster), or append",
    )
    args = parser.parse_args(argv)
    if args.messages < args.sessions:
        parser.error("--messages must be at least --sessions")
    if args.warmup < 0:
        parser.error("--warmup must not be negative")
    return args


def run_all(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
    """Load (or reuse) the stores in `run_dir`, time every setting, return the report."""
    params = Params(
        messages=args.messages,
        sessions=args.sessions,
        vocab=args.vocab,
        seed=args.seed,
        load=args.load,
    )
    zipf = Zipf(args.vocab, args.seed)
    load = prepare(run_dir, params, zipf)
    all_queries = make_queries(zipf, args.seed, args.warmup + args.queries)
    settings = []
    for setting in SETTINGS:
        if setting.name not in args.settings:
            continue
        callers = callers_for(setting, args.sessions, len(all_queries), args.seed)
        run = partial(
            run_setting,
            run_dir,
            setting,
            all_queries,
            callers,
            warmup=args.warmup,
            sessions=args.sessions,
            floor_every=args.floor_every,
        )
        timings = trio.run(run)
        settings.append(setting_report(setting, timings))
    spawning = sum(1 for n in range(0, args.sessions, SPAWN_EVERY) if spawned(n, args.sessions))
    return {
        "benchmark": "search",
        "corpus": {
            "messages": args.messages,
            "sessions": args.sessions,
            "spawning_sessions": spawning,
            "vocabulary": args.vocab,
            "zipf_exponent": ZIPF_EXPONENT,
            "words_per_message": list(WORDS_PER_MESSAGE),
            "seed": args.seed,
        },
        "load": {
            "method": load.method,
            "reused": load.reused,
            "library_s": round(load.library, 3),
            "store_s": round(load.generate_and_store, 3),
            "rebuild_s": round(load.rebuild, 3),
            "library_messages_per_s": round(args.messages / load.library, 1),
            "raw_s": round(load.raw, 3),
        },
        "queries": {
            "count": args.queries,
            "warmup": args.warmup,
            "words": list(QUERY_WORDS),
            "limit": LIMIT,
            "floor_every": args.floor_every,
        },
        "targets": {
            "tail_ratio_max": TARGET_TAIL_RATIO,
            "p50_ratio_max": TARGET_P50_RATIO,
            "p99_ms_max": TARGET_P99_MS,
        },
        "settings": settings,
        "environment": runner.environment(run_dir, kept=kept),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`).

    Returns 0 (whatever the verdicts), 1 if the library answered something the raw index
    contradicts or the state directory holds foreign databases, 2 if `--state-dir` is unusable.
    """
    return runner.main("search", parse_args(argv), run_all, format_table)
