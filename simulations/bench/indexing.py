"""Indexing throughput: the library's append path against raw apsw floors (docs/design.md §7).

One run, one set of generated chat messages. The floors are plain apsw writing exactly the
rows the library writes (the events, the active branch, the FTS5 index, and each session's
leaf as of each commit), with the library's schema and connection settings:

1. one-transaction floor: every row in ONE transaction — the fastest this machine stores
   and indexes these rows;
2. same-batch floor: `appenders` messages a commit — as many as closed-loop appenders
   (each waits for its ack before it sends its next message) can put in one transaction.

The library, text only (vectors are made after the ack, docs/design.md §2.3, and have
`bench vectors`):

3. closed loop: `appenders` concurrent appenders, each awaiting its own ack; against the
   same-batch floor in `--rounds` interleaved rounds, judged on the median ratio (a burst
   of load on a shared machine moves one round, not the verdict); target >= 0.8;
4. open loop: the same appenders sending without waiting for their acks (each session's
   messages still queue in order), so batches can grow; against the one-transaction floor;
5. one transaction per message (`max_batch=1`): what group commit buys;

plus a diagnostic: raw apsw writing only the events and the index at the same batch size
(the floor of earlier runs). And what the store costs (docs/design.md §1.4): resident
memory per agent database opened and per 100k indexed messages, bytes on disk per message.

It prints ratios to the floors, since absolute rates on a shared machine are noise. After
each run the index is checked against the number of messages, so a broken path cannot look
fast.

    activememory bench indexing [--json] [--appenders N] [--rounds N] ...
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import apsw
import msgspec
import trio
import trio.lowlevel

import activememory as am

from ..._memory import Memory
from ...actors.group_commit import MAX_BATCH
from ...actors.supervisor import AgentStore, open_supervisor
from ...protocol.content import Role
from ...protocol.session_key import parse_session_key
from ...storage.checkpoints import Checkpointer
from ...storage.db import DURABILITY_LEVELS, Durability, configure, migrate
from ...storage.footprint import DiskUsage, disk_usage, resident_bytes
from ...storage.fts_query import index_row
from ...storage.transcripts import TranscriptReader
from . import runner
from .runner import BenchmarkError
from .search import make_vocabulary

AGENT = "bench"
VOCABULARY_SIZE = 20_000
ZIPF_EXPONENT = 1.1
WORDS_PER_MESSAGE = (10, 60)
TURNS: tuple[Role, Role] = ("user", "assistant")
# Closed-loop group commit against raw apsw committing the same number of messages a time.
TARGET_RATIO = 0.8
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
EXTRA_AGENTS = 8  # opened empty, for the resident memory one more agent database costs

# -- the rows ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Corpus:
    """The generated conversations: one list of messages per appender (session)."""

    conversations: list[list[am.Message]]

    @property
    def messages(self) -> int:
        """How many messages, over all conversations."""
        return sum(len(c) for c in self.conversations)

    @property
    def words(self) -> int:
        """How many words, over all messages."""
        return sum(len(str(m.content).split()) for c in self.conversations for m in c)

    @property
    def text_bytes(self) -> int:
        """UTF-8 size of all message texts."""
        return sum(len(str(m.content).encode()) for c in self.conversations for m in c)


def make_corpus(*, appenders: int, messages_per_appender: int, seed: int) -> Corpus:
    """Seeded synthetic chats: Zipf-distributed words, roles alternating user/assistant."""
    rng = random.Random(seed)
    vocabulary = make_vocabulary(rng, VOCABULARY_SIZE, keep=lambda word: True)
    cum_weights = list(
        itertools.accumulate(1.0 / rank**ZIPF_EXPONENT for rank in range(1, VOCABULARY_SIZE + 1))
    )
    low, high = WORDS_PER_MESSAGE
    conversations = []
    for _ in range(appenders):
        messages = []
        for i in range(messages_per_appender):
            words = rng.choices(vocabulary, cum_weights=cum_weights, k=rng.randint(low, high))
            text = " ".join(words).capitalize() + rng.choice(".?!.")
            messages.append(am.Message(role=TURNS[i % 2], content=text))
        conversations.append(messages)
    return Corpus(conversations)


def session_key(n: int) -> str:
    """The session of appender `n`: a direct chat, all in the one benchmark agent."""
    return f"agent:{AGENT}:direct:u{n}"


def interleaved(corpus: Corpus) -> list[tuple[int, int, am.Message]]:
    """(session, position, message) in round-robin order, as concurrent appenders arrive."""
    longest = max(len(c) for c in corpus.conversations)
    return [
        (s, i, conversation[i])
        for i in range(longest)
        for s, conversation in enumerate(corpus.conversations)
        if i < len(conversation)
    ]


# -- the runs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    """One way of storing the corpus: its wall time and, for the library, its batching."""

    seconds: float
    messages: int
    batches: int | None = None
    commands: int | None = None

    @property
    def rate(self) -> float:
        """Messages per second."""
        return self.messages / self.seconds

    @property
    def mean_batch(self) -> float | None:
        """Messages per transaction, when known."""
        if not self.batches or self.commands is None:
            return None
        return self.commands / self.batches


def check_stats(
    what: str, stats: Sequence[am.IndexStats], corpus: Corpus, *, branch: bool = True
) -> None:
    """Raise `BenchmarkError` unless every message is stored, indexed (and on its branch)."""
    expected = {
        "sessions": len(corpus.conversations),
        "events": corpus.messages,
        "indexed_messages": corpus.messages,
        "dirty_sessions": 0,
    }
    if branch:
        expected["active_messages"] = corpus.messages
    got = {name: sum(getattr(s, name) for s in stats) for name in expected}
    if got != expected or not all(s.fts_integrity_ok for s in stats):
        raise BenchmarkError(
            f"{what}: expected {expected} and a passing FTS integrity-check, got {got} "
            f"(integrity ok: {[s.fts_integrity_ok for s in stats]})"
        )


Rows = Literal["all", "events+index"]
Checkpoints = Literal["inline", "thread"]


def run_raw(
    path: Path,
    corpus: Corpus,
    durability: Durability,
    *,
    batch: int | None = None,
    rows: Rows = "all",
    checkpoints: Checkpoints = "inline",
) -> RunResult:
    """A floor: the library's rows, written by plain apsw in one transaction, or `batch`
    messages a commit. `rows="events+index"`: only the events and the index (a diagnostic:
    the floor of earlier runs, which wrote no active branch and no session leaves).
    `checkpoints="thread"`: the WAL checkpointed on a thread of its own, as the library's
    writer does (storage/checkpoints.py), instead of SQLite's autocheckpoint in the commit."""
    conn = apsw.Connection(str(path))
    checkpointer = Checkpointer("bench-raw-checkpoints")
    try:
        configure(conn, durability)
        migrate(conn)
        if checkpoints == "thread":
            checkpointer.start(conn)
        keys = [parse_session_key(session_key(n)) for n in range(len(corpus.conversations))]
        encode = msgspec.json.Encoder().encode
        ordered = interleaved(corpus)
        step = batch or len(ordered)
        start = time.perf_counter()
        at = time.time()
        leaf: list[int | None] = [None] * len(keys)
        previous: list[str | None] = [None] * len(keys)
        depth = [0] * len(keys)
        sessions = [
            (s + 1, k.raw, k.agent, k.chat_type, k.conversation_id, k.thread_id, at, at)
            for s, k in enumerate(keys)
        ]
        for low in range(0, len(ordered), step):
            events, branch, index = [], [], []
            touched: set[int] = set()
            for event_id, (s, i, message) in enumerate(ordered[low : low + step], start=low + 1):
                text = message.index_text
                events.append(
                    (
                        event_id, s + 1, leaf[s], i + 1, i + 1, at, message.role,
                        encode(message.content), text,
                    )
                )  # fmt: skip
                branch.append((s + 1, i + 1, event_id))
                if text is not None:
                    index.append(index_row(event_id, text, previous[s]))
                    previous[s] = text
                leaf[s], depth[s] = event_id, i + 1
                touched.add(s)
            with conn:
                if low == 0:
                    conn.executemany(_RAW_SESSION, sessions)
                conn.executemany(_RAW_EVENT, events)
                if rows == "all":
                    conn.executemany(_RAW_BRANCH, branch)
                conn.executemany(_RAW_INDEX, index)
                if rows == "all":  # each session's leaf as of this commit, as the library's
                    conn.executemany(
                        _RAW_LEAF,
                        [(leaf[s], depth[s], depth[s] + 1, depth[s], at, s + 1) for s in touched],
                    )
        seconds = time.perf_counter() - start
        check_stats(
            f"raw apsw ({rows})", [TranscriptReader(conn, AGENT).stats()], corpus,
            branch=rows == "all",
        )  # fmt: skip
    finally:
        checkpointer.stop(conn)
        conn.close()
    batches = -(-len(ordered) // step)
    return RunResult(
        seconds=seconds, messages=corpus.messages, batches=batches, commands=len(ordered)
    )


_RAW_SESSION = (
    "INSERT INTO sessions(id, key, agent, chat_type, conversation_id, thread_id, created_at,"
    " updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)
_RAW_EVENT = (
    "INSERT INTO events(id, session_id, parent_id, seq, depth, ts, kind, role, content, text)"
    " VALUES (?, ?, ?, ?, ?, ?, 'message', ?, ?, ?)"
)
_RAW_BRANCH = "INSERT INTO active_branch(session_id, depth, event_id) VALUES (?, ?, ?)"
_RAW_INDEX = "INSERT INTO message_fts(rowid, words, grams, context) VALUES (?, ?, ?, ?)"
_RAW_LEAF = (
    "UPDATE sessions SET leaf_event_id = ?, leaf_depth = ?, next_seq = ?,"
    " revision = revision + 1, indexed_seq = ? , updated_at = ? WHERE id = ?"
)


Appenders = Callable[[Memory, Corpus], Awaitable[None]]


async def closed_loop(
    mem: Memory, corpus: Corpus, key_of: Callable[[int], str] = session_key
) -> None:
    """One appender task per conversation, each awaiting its own ack before its next;
    conversation `n` goes to session `key_of(n)`."""

    async def appender(key: str, messages: list[am.Message]) -> None:
        for message in messages:
            await mem.sessions.append(key, message)

    async with trio.open_nursery() as nursery:
        for n, conversation in enumerate(corpus.conversations):
            nursery.start_soon(appender, key_of(n), conversation)


async def open_loop(mem: Memory, corpus: Corpus) -> None:
    """One appender per conversation that sends each message without waiting for the ack
    of the one before; its messages still queue in order (below)."""

    async def appender(key: str, messages: list[am.Message]) -> None:
        async with trio.open_nursery() as sends:
            for message in messages:
                sends.start_soon(mem.sessions.append, key, message)
                # An append queues in its first step; this one runs before the next starts.
                await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        for n, conversation in enumerate(corpus.conversations):
            nursery.start_soon(appender, session_key(n), conversation)


async def run_library(
    state_dir: Path,
    corpus: Corpus,
    durability: Durability,
    appenders: Appenders,
    *,
    max_batch: int = MAX_BATCH,
) -> RunResult:
    """The library (text only) storing the corpus with `appenders`; timed to the last ack.

    Cancellation: as for `Sessions.append`; appends already queued still commit when the
    memory closes.
    """
    async with open_supervisor(
        state_dir, "thread", durability=durability, max_batch=max_batch
    ) as sup:
        mem = Memory(
            sup, config=am.load_config(TEXT_ONLY), models=None, tools=None, clock=time.time
        )
        store = await sup.agent(AGENT)  # open and migrate the database before the clock
        start = time.perf_counter()
        await appenders(mem, corpus)
        seconds = time.perf_counter() - start
        check_stats("library", await mem.sessions.stats(), corpus)
        writer = store.writer()
        return RunResult(
            seconds=seconds,
            messages=corpus.messages,
            batches=writer.batches,
            commands=writer.commands,
        )


@dataclass(frozen=True)
class Footprint:
    """Resident memory and disk of the library, measured on one closed-loop run."""

    per_database: float  # resident bytes one more (empty) agent database adds when opened
    per_100k_messages: float  # resident bytes added while indexing, per 100k messages
    disk: DiskUsage


async def measure_footprint(state_dir: Path, corpus: Corpus, durability: Durability) -> Footprint:
    """Open the memory and `EXTRA_AGENTS` more agent databases, then store the corpus closed
    loop, reading the process's resident memory at each step (the first library run of the
    benchmark, so no earlier run's freed memory hides its growth)."""
    async with open_supervisor(state_dir, "thread", durability=durability) as sup:
        mem = Memory(
            sup, config=am.load_config(TEXT_ONLY), models=None, tools=None, clock=time.time
        )
        store: AgentStore = await sup.agent(AGENT)
        await mem.sessions.stats(check_integrity=False)  # the reader's first page reads
        opened = resident_bytes()
        for n in range(EXTRA_AGENTS):
            extra = await sup.agent(f"{AGENT}-extra-{n}")
            await extra.read(lambda reader: reader.stats(check_integrity=False))
        per_database = (resident_bytes() - opened) / EXTRA_AGENTS
        before = resident_bytes()
        await closed_loop(mem, corpus)
        per_100k = (resident_bytes() - before) * 100_000 / corpus.messages
        check_stats("library (footprint)", [await store.index_stats()], corpus)
        disk = await store.read(lambda reader: disk_usage(reader.conn))
    return Footprint(per_database=per_database, per_100k_messages=per_100k, disk=disk)


# -- the report -------------------------------------------------------------------------


@dataclass(frozen=True)
class Round:
    """One round: the same-batch floor, that floor checkpointing on a thread (as the
    library), and the closed loop, run one after the other."""

    same: RunResult
    same_checkpoint_thread: RunResult
    closed: RunResult


@dataclass(frozen=True)
class Results:
    """Every run of one benchmark invocation, on the same corpus."""

    raw: RunResult  # the one-transaction floor
    rounds: list[Round]  # interleaved
    open_loop: RunResult
    single: RunResult
    events_and_index: RunResult  # diagnostic: the floor of earlier runs, at the same batch
    footprint: Footprint


def report(
    args: argparse.Namespace, corpus: Corpus, results: Results, env: dict[str, Any]
) -> dict[str, Any]:
    """The one JSON object `--json` prints; the table is drawn from it too."""
    raw = results.raw

    def run(result: RunResult, floor: RunResult = raw) -> dict[str, Any]:
        mean = result.mean_batch
        return {
            "seconds": round(result.seconds, 4),
            "messages_per_s": round(result.rate, 1),
            "ratio_to_raw": runner.ratio(result.rate, floor.rate, 4),
            "batches": result.batches,
            "mean_batch_size": None if mean is None else round(mean, 2),
        }

    ratios = [r.closed.rate / r.same.rate for r in results.rounds]
    median = statistics.median(ratios)
    threaded = [r.closed.rate / r.same_checkpoint_thread.rate for r in results.rounds]
    best_same = min((r.same for r in results.rounds), key=lambda r: r.seconds)
    best_threaded = min((r.same_checkpoint_thread for r in results.rounds), key=lambda r: r.seconds)
    best_group = min((r.closed for r in results.rounds), key=lambda r: r.seconds)
    closed = run(best_group)
    closed |= {
        "ratio_to_same_batches_by_round": [round(r, 4) for r in ratios],
        "ratio_to_same_batches": round(median, 4),
        "ratio_to_same_batches_best_of": runner.ratio(best_group.rate, best_same.rate, 4),
        "ratio_to_same_batches_checkpoint_thread_by_round": [round(r, 4) for r in threaded],
        "ratio_to_same_batches_checkpoint_thread": round(statistics.median(threaded), 4),
        "target_ratio": TARGET_RATIO,
        "pass": median >= TARGET_RATIO,
    }
    footprint = results.footprint
    disk = footprint.disk
    return {
        "benchmark": "indexing",
        "durability": args.durability,
        "rows": {
            "messages": corpus.messages,
            "appenders": args.appenders,
            "messages_per_appender": args.messages_per_appender,
            "seed": args.seed,
            "vocabulary": VOCABULARY_SIZE,
            "zipf_exponent": ZIPF_EXPONENT,
            "words_per_message": list(WORDS_PER_MESSAGE),
            "words": corpus.words,
            "text_bytes": corpus.text_bytes,
        },
        "rounds": args.rounds,
        "raw_floor": {"seconds": round(raw.seconds, 4), "messages_per_s": round(raw.rate, 1)},
        "raw_same_batches": run(best_same),
        "raw_same_batches_checkpoint_thread": run(best_threaded),
        "closed_loop": closed,
        "open_loop": run(results.open_loop),
        "per_message_commit": run(results.single),
        "raw_events_and_index_same_batches": run(results.events_and_index),
        "memory": {
            "resident_bytes_per_agent_database": round(footprint.per_database),
            "resident_bytes_per_100k_messages": round(footprint.per_100k_messages),
        },
        "disk": msgspec.to_builtins(disk)
        | {
            "index_bytes_per_message": _rounded(disk.per_message(disk.index)),
            "content_bytes_per_message": _rounded(disk.per_message(disk.content)),
            "total_bytes_per_message": _rounded(disk.per_message(disk.total)),
        },
        "environment": env,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def format_table(result: dict[str, Any]) -> str:
    """The report for a person."""
    rows, raw = result["rows"], result["raw_floor"]
    closed, opened = result["closed_loop"], result["open_loop"]
    single, same = result["per_message_commit"], result["raw_same_batches"]
    threaded = result["raw_same_batches_checkpoint_thread"]
    partial_rows = result["raw_events_and_index_same_batches"]
    memory, disk = result["memory"], result["disk"]
    low, high = rows["words_per_message"]

    def line(label: str, run: dict[str, Any]) -> str:
        return (
            f"  {label:<46} {run['messages_per_s']:>10,.0f} {run['seconds']:>9.3f}"
            f" {run['ratio_to_raw']:>8.2f} {run['mean_batch_size']:>11.1f}"
        )

    by_round = ", ".join(f"{r:.2f}" for r in closed["ratio_to_same_batches_by_round"])
    threaded_by_round = ", ".join(
        f"{r:.2f}" for r in closed["ratio_to_same_batches_checkpoint_thread_by_round"]
    )
    mb = 1e6
    lines = [
        "Indexing throughput (events, active branch, session leaves + FTS5 index;"
        " library writes acknowledged after commit, text only)",
        f"  durability: {result['durability']} (same settings for every path)",
        f"  rows: {rows['messages']:,} messages = {rows['appenders']} appenders x "
        f"{rows['messages_per_appender']}; {rows['words']:,} words, {rows['text_bytes']:,} bytes",
        f"        Zipf({rows['zipf_exponent']}) over {rows['vocabulary']:,} words, "
        f"{low}-{high} words/message, seed {rows['seed']}",
        "",
        f"  {'path':<46} {'msg/s':>10} {'seconds':>9} {'vs raw':>8} {'mean batch':>11}",
        f"  {'raw floor (apsw, one transaction)':<46} {raw['messages_per_s']:>10,.0f}"
        f" {raw['seconds']:>9.3f} {'1.00':>8} {rows['messages']:>11,.1f}",
        line(
            f"raw apsw, {same['mean_batch_size']:.0f} messages a commit (best of {result['rounds']})",
            same,
        ),
        line(f"  same, WAL checkpoints on a thread (best of {result['rounds']})", threaded),
        line(f"library, closed loop (best of {result['rounds']})", closed),
        line("library, open loop", opened),
        line("library, one transaction per message", single),
        line("(raw apsw, events + index only, same batches)", partial_rows),
        "",
        "  closed loop / raw at the same batches = "
        + runner.against(
            f"{closed['ratio_to_same_batches']:.2f}", ">=", closed["target_ratio"], closed["pass"]
        ),
        f"    median of {result['rounds']} interleaved rounds ({by_round});"
        f" best against best {closed['ratio_to_same_batches_best_of']:.2f}",
        "    (the library checkpoints its WAL on a thread of its own; against raw doing the"
        f" same: {closed['ratio_to_same_batches_checkpoint_thread']:.2f},"
        f" rounds {threaded_by_round})",
        f"  open loop / one-transaction floor = {opened['ratio_to_raw']:.2f}"
        f" (mean batch {opened['mean_batch_size']:.1f})",
        f"  closed loop / one transaction per message = "
        f"{closed['messages_per_s'] / single['messages_per_s']:.1f}x",
        "",
        f"  resident memory: {memory['resident_bytes_per_agent_database'] / mb:.2f} MB per agent"
        f" database opened, {memory['resident_bytes_per_100k_messages'] / mb:.1f} MB per 100k"
        " messages indexed (measured over this run's messages)",
        f"  on disk: {disk['total'] / mb:.1f} MB, {disk['total_bytes_per_message']:,.0f} B/message:"
        f" index {disk['index_bytes_per_message']:,.0f}, content"
        f" {disk['content_bytes_per_message']:,.0f}, other {disk['other'] / mb:.1f} MB",
        *runner.environment_lines(result["environment"]),
    ]
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (`sys.argv[1:]` when `argv` is None)."""
    parser = runner.command(
        "indexing",
        "Indexing throughput of the library against raw apsw inserts.",
        seed=7,
        state_dir="where the databases go (a fresh bench-indexing-* directory inside it, kept); "
        "default: a temporary directory, removed afterwards",
    )
    runner.add_sizes(parser, messages_per_appender=300, appenders=64, rounds=5)
    parser.add_argument(
        "--durability",
        choices=DURABILITY_LEVELS,
        default="crash",
        help="as open_memory(durability=...): 'crash' (default) or 'power' (fsync per commit)",
    )
    return parser.parse_args(argv)


def run_all(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
    """Generate the rows, run every path on them in `run_dir`, and return the report."""
    corpus = make_corpus(
        appenders=args.appenders,
        messages_per_appender=args.messages_per_appender,
        seed=args.seed,
    )
    durability = args.durability
    footprint = trio.run(measure_footprint, run_dir / "footprint", corpus, durability)
    batch = min(args.appenders, MAX_BATCH)  # the most a commit can hold, closed loop
    rounds = []
    for n in range(args.rounds):  # interleaved: the load of the moment hits both sides
        same = run_raw(run_dir / f"raw-batch-{batch}-{n}.db", corpus, durability, batch=batch)
        threaded = run_raw(
            run_dir / f"raw-batch-{batch}-checkpoint-thread-{n}.db",
            corpus,
            durability,
            batch=batch,
            checkpoints="thread",
        )
        group = trio.run(run_library, run_dir / f"closed-loop-{n}", corpus, durability, closed_loop)
        rounds.append(Round(same, threaded, group))
    results = Results(
        raw=run_raw(run_dir / "raw.db", corpus, durability),
        rounds=rounds,
        open_loop=trio.run(run_library, run_dir / "open-loop", corpus, durability, open_loop),
        single=trio.run(
            lambda: run_library(
                run_dir / "per-message-commit", corpus, durability, closed_loop, max_batch=1
            )
        ),
        events_and_index=run_raw(
            run_dir / f"raw-events-index-{batch}.db",
            corpus,
            durability,
            batch=batch,
            rows="events+index",
        ),
        footprint=footprint,
    )
    env = runner.environment(run_dir, kept=kept)
    env["load_average"] = [round(x, 2) for x in os.getloadavg()]  # at the end of the run
    return report(args, corpus, results, env)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`).

    Returns 0, or 1 if a run lost or misindexed rows, or 2 if `--state-dir` is unusable.
    """
    return runner.main("indexing", parse_args(argv), run_all, format_table, fresh=True)
