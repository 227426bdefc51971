"""Indexing throughput: the library's append path against the raw apsw floor (docs/design.md §7).

One run, one set of generated chat messages, three ways of storing and indexing them:

1. raw floor: plain apsw, the library's schema and connection settings, every row in ONE
   transaction (`executemany`) — the fastest this machine can store and index these rows;
2. library, group commit: `open_memory()`, concurrent appenders each awaiting their own
   acknowledgement, the indexer batching whatever is queued into one transaction;
3. library, one transaction per message: the same with `max_batch=1`, i.e. no group commit.

plus a diagnostic: raw apsw committing at the batch size group commit reached, which splits
the gap to the floor into what transaction granularity costs SQLite and what the library adds.

It prints ratios to the floor, since absolute rates on a shared machine are noise. After each
run the index is checked against the number of messages, so a broken path cannot look fast.

    activememory bench indexing [--json] [--appenders N] ...
"""

from __future__ import annotations

import argparse
import itertools
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import msgspec
import trio

import activememory as am

from ..._memory import Memory
from ...actors.supervisor import open_supervisor
from ...protocol.content import Role
from ...protocol.session_key import parse_session_key
from ...storage.db import DURABILITY_LEVELS, Durability, configure, migrate
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
TARGET_RATIO = 0.5  # group commit should reach at least half of the raw floor

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


def run_raw(
    path: Path, corpus: Corpus, durability: Durability, *, batch: int | None = None
) -> RunResult:
    """The floor: the library's rows, inserted by plain apsw in one transaction.

    With `batch`, the same rows are committed `batch` messages at a time instead, to show
    what transaction granularity alone costs SQLite (a diagnostic, not the floor).
    """
    conn = apsw.Connection(str(path))
    try:
        configure(conn, durability)
        migrate(conn)
        keys = [parse_session_key(session_key(n)) for n in range(len(corpus.conversations))]
        encode = msgspec.json.Encoder().encode
        rows = interleaved(corpus)
        start = time.perf_counter()
        at = time.time()
        leaf: list[int | None] = [None] * len(keys)
        previous: list[str | None] = [None] * len(keys)
        events = []
        index = []
        for event_id, (s, i, message) in enumerate(rows, start=1):
            text = message.index_text
            events.append(
                (
                    event_id, s + 1, leaf[s], i + 1, i + 1, at, message.role,
                    encode(message.content), text,
                )
            )  # fmt: skip
            if text is not None:
                index.append(index_row(event_id, text, previous[s]))
                previous[s] = text
            leaf[s] = event_id
        sessions = [
            (
                s + 1, k.raw, k.agent, k.chat_type, k.conversation_id, k.thread_id, at, at,
                leaf[s], len(c), len(c) + 1, len(c), len(c),
            )
            for s, (k, c) in enumerate(zip(keys, corpus.conversations, strict=True))
        ]  # fmt: skip
        step = batch or len(events)
        index_by_batch: dict[int, list[tuple[object, ...]]] = {}
        for row in index:  # event ids are 1..n: batch b holds ids b*step+1 .. (b+1)*step
            index_by_batch.setdefault((row[0] - 1) // step, []).append(row)
        for low in range(0, len(events), step):
            with conn:
                if low == 0:
                    conn.executemany(
                        "INSERT INTO sessions(id, key, agent, chat_type, conversation_id,"
                        " thread_id, created_at, updated_at, leaf_event_id, leaf_depth,"
                        " next_seq, revision, indexed_seq)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        sessions,
                    )
                conn.executemany(
                    "INSERT INTO events(id, session_id, parent_id, seq, depth, ts, kind, role,"
                    " content, text) VALUES (?, ?, ?, ?, ?, ?, 'message', ?, ?, ?)",
                    events[low : low + step],
                )
                conn.executemany(
                    "INSERT INTO message_fts(rowid, words, grams, context) VALUES (?, ?, ?, ?)",
                    index_by_batch.get(low // step, []),
                )
        seconds = time.perf_counter() - start
        # The floor writes no active_branch rows (the library does: one more insert each).
        check_stats("raw floor", [TranscriptReader(conn, AGENT).stats()], corpus, branch=False)
    finally:
        conn.close()
    batches = -(-len(events) // step)
    return RunResult(
        seconds=seconds, messages=corpus.messages, batches=batches, commands=len(events)
    )


async def append_all(mem: Memory, corpus: Corpus) -> RunResult:
    """One appender task per conversation, each awaiting its own acks; timed to the last.

    Cancellation: as for `Sessions.append`; appends already queued still commit when the
    memory closes.
    """
    await mem._supervisor.agent(AGENT)  # open and migrate the database before the clock

    async def appender(key: str, messages: list[am.Message]) -> None:
        for message in messages:
            await mem.sessions.append(key, message)

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for n, conversation in enumerate(corpus.conversations):
            nursery.start_soon(appender, session_key(n), conversation)
    seconds = time.perf_counter() - start
    (store,) = mem._supervisor.open_agents()
    return RunResult(
        seconds=seconds,
        messages=corpus.messages,
        batches=store.writer().batches,
        commands=store.writer().commands,
    )


async def run_group_commit(state_dir: Path, corpus: Corpus, durability: Durability) -> RunResult:
    """The library as users open it: group commit on."""
    async with am.open_memory(state_dir, executor="thread", durability=durability) as mem:
        result = await append_all(mem, corpus)
        check_stats("group commit", await mem.sessions.stats(), corpus)
    return result


async def run_per_message(state_dir: Path, corpus: Corpus, durability: Durability) -> RunResult:
    """The library with group commit off: one transaction per message."""
    async with open_supervisor(
        state_dir, "thread", durability=durability, max_batch=1
    ) as supervisor:
        mem = Memory(
            supervisor, config=am.load_config({}), models=None, tools=None, clock=time.time
        )
        result = await append_all(mem, corpus)
        check_stats("one transaction per message", await mem.sessions.stats(), corpus)
    return result


# -- the report -------------------------------------------------------------------------


@dataclass(frozen=True)
class Results:
    """Every run of one benchmark invocation, on the same corpus."""

    raw: RunResult
    group: RunResult
    raw_batched: RunResult  # diagnostic: raw apsw at the group-commit run's batch size
    single: RunResult


def report(
    args: argparse.Namespace, corpus: Corpus, results: Results, env: dict[str, Any]
) -> dict[str, Any]:
    """The one JSON object `--json` prints; the table is drawn from it too."""
    raw = results.raw

    def run(result: RunResult) -> dict[str, Any]:
        mean = result.mean_batch
        return {
            "seconds": round(result.seconds, 4),
            "messages_per_s": round(result.rate, 1),
            "ratio_to_raw": runner.ratio(result.rate, raw.rate, 4),
            "batches": result.batches,
            "mean_batch_size": None if mean is None else round(mean, 2),
        }

    group = run(results.group)
    group["target_ratio"] = TARGET_RATIO
    group["pass"] = results.group.rate / raw.rate >= TARGET_RATIO
    group["ratio_to_raw_same_batches"] = runner.ratio(
        results.group.rate, results.raw_batched.rate, 4
    )
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
        "raw_floor": {"seconds": round(raw.seconds, 4), "messages_per_s": round(raw.rate, 1)},
        "group_commit": group,
        "per_message_commit": run(results.single),
        "raw_same_batches": run(results.raw_batched),
        "environment": env,
    }


def format_table(result: dict[str, Any]) -> str:
    """The report for a person."""
    rows, raw = result["rows"], result["raw_floor"]
    group, single = result["group_commit"], result["per_message_commit"]
    same = result["raw_same_batches"]
    low, high = rows["words_per_message"]

    def line(label: str, run: dict[str, Any]) -> str:
        return (
            f"  {label:<38} {run['messages_per_s']:>10,.0f} {run['seconds']:>9.3f}"
            f" {run['ratio_to_raw']:>8.2f} {run['mean_batch_size']:>11.1f}"
        )

    lines = [
        "Indexing throughput (events + FTS5 index; library writes acknowledged after commit)",
        f"  durability: {result['durability']} (same settings for every path)",
        f"  rows: {rows['messages']:,} messages = {rows['appenders']} appenders x "
        f"{rows['messages_per_appender']}; {rows['words']:,} words, {rows['text_bytes']:,} bytes",
        f"        Zipf({rows['zipf_exponent']}) over {rows['vocabulary']:,} words, "
        f"{low}-{high} words/message, seed {rows['seed']}",
        "",
        f"  {'path':<38} {'msg/s':>10} {'seconds':>9} {'vs raw':>8} {'mean batch':>11}",
        f"  {'raw floor (apsw, one transaction)':<38} {raw['messages_per_s']:>10,.0f}"
        f" {raw['seconds']:>9.3f} {'1.00':>8} {rows['messages']:>11,.1f}",
        line("library, group commit", group),
        line("library, one transaction per message", single),
        line("(raw apsw, group commit's batch size)", same),
        "",
        "  group commit / raw floor = "
        + runner.against(
            f"{group['ratio_to_raw']:.2f}", ">=", f"{group['target_ratio']:.2f}", group["pass"]
        ),
        f"  group commit / per-message commit = "
        f"{group['messages_per_s'] / single['messages_per_s']:.1f}x "
        f"({group['batches']:,} transactions vs {single['batches']:,})",
        f"  group commit / raw apsw at the same batch size = "
        f"{group['ratio_to_raw_same_batches']:.2f} (the library's own overhead)",
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
    runner.add_sizes(parser, messages_per_appender=300, appenders=64)
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
    raw = run_raw(run_dir / "raw.db", corpus, durability)
    group = trio.run(run_group_commit, run_dir / "group-commit", corpus, durability)
    batch = max(1, round(group.mean_batch or 1))
    raw_batched = run_raw(run_dir / f"raw-batch-{batch}.db", corpus, durability, batch=batch)
    single = trio.run(run_per_message, run_dir / "per-message-commit", corpus, durability)
    results = Results(raw=raw, group=group, raw_batched=raw_batched, single=single)
    return report(args, corpus, results, runner.environment(run_dir, kept=kept))


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`).

    Returns 0, or 1 if a run lost or misindexed rows, or 2 if `--state-dir` is unusable.
    """
    return runner.main("indexing", parse_args(argv), run_all, format_table, fresh=True)
