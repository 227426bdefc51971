"""Ingest on PostgreSQL with 1, 2 and 4 worker processes against one server, and against raw
psycopg writing the same rows (docs/design.md §11 "Ingest with several workers").

Each worker is an OS process that opens `open_memory(storage=DSN)` on the same database and
drives `bench indexing`'s closed loop: `--appenders` appender tasks, each appending its own
session's messages and awaiting each ack (`indexing.closed_loop`, `indexing.make_corpus`:
the same generated chats), every worker on sessions of its own. The clock runs from a
barrier all workers pass once open to the last ack of the last worker, so a run's rate is
every message stored over that wall time.

The floor, measured in the same run and interleaved with the library's: as many processes,
each writing exactly the rows the library writes for its messages — the event, its
active-branch row, its index row (`terms.index_terms`, computed inside the timed loop as
the library does) and each touched session's leaf and counters — with plain psycopg
`executemany` into the library's own schema, `--appenders` messages a transaction (the
most a closed-loop commit can hold). The floor takes no row lock and draws no id from the
sequence (each process has its own id range), so it is a true floor.

Every run is in a database of its own, created and dropped here (as tests/pg_server.py and
`pg_locomo` do), and is checked afterwards: every message stored once and indexed.

    activememory bench pgingest [--dsn ADMIN_DSN] [--appenders N] [--messages-per-appender N]

Goal (issue 16): the library at >= 0.7 of the floor at each worker count, judged on the
median of `--rounds` interleaved rounds (PASS/MISS); the scaling ratio (4 workers against
1, best rounds) is printed beside it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.synchronize
import os
import secrets
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import trio

from . import runner
from .indexing import TEXT_ONLY, Corpus, closed_loop, interleaved, make_corpus
from .runner import BenchmarkError

AGENT = "bench"
WORKER_COUNTS = (1, 2, 4)
TARGET_RATIO = 0.7
DEFAULT_DSN = os.environ.get(
    "ACTIVEMEMORY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres"
)
ID_RANGE = 10**9  # the floor's event ids: worker w draws from w * ID_RANGE on
START_TIMEOUT_S = 120


def session_key(worker: int, n: int) -> str:
    """Appender `n` of worker `worker`: sessions of its own in the one benchmark agent."""
    return f"agent:{AGENT}:direct:w{worker}u{n}"


def worker_corpus(args: argparse.Namespace, worker: int) -> Corpus:
    """The chats of one worker: `indexing.make_corpus`, seeded per worker."""
    return make_corpus(
        appenders=args.appenders,
        messages_per_appender=args.messages_per_appender,
        seed=args.seed + worker,
    )


class Timing(msgspec.Struct, frozen=True):
    """What one worker process reports: its wall-clock start and end, and its batching."""

    start: float
    end: float
    messages: int
    batches: int
    commands: int


# -- the two kinds of worker (each in its own process) ----------------------------------


def _library_worker(
    dsn: str, args: argparse.Namespace, worker: int, barrier: Any, out: Any
) -> None:
    corpus = worker_corpus(args, worker)

    async def run() -> Timing:
        from ..._memory import open_memory

        with tempfile.TemporaryDirectory(prefix="bench-pgingest-") as state_dir:
            async with open_memory(state_dir, config=TEXT_ONLY, storage=dsn) as mem:
                store = await mem._supervisor.agent(AGENT)  # connected before the clock
                await trio.to_thread.run_sync(barrier.wait, START_TIMEOUT_S)
                start = time.time()
                await closed_loop(mem, corpus, lambda n: session_key(worker, n))
                end = time.time()
                writer = store.writer()
                return Timing(start, end, corpus.messages, writer.batches, writer.commands)

    out.put(msgspec.json.encode(trio.run(run)))


def _raw_worker(dsn: str, args: argparse.Namespace, worker: int, barrier: Any, out: Any) -> None:
    import psycopg

    from ...storage.pg.db import SCHEMA as S
    from ...storage.pg.terms import index_terms
    from ...storage.pg.transcripts import _encode_content, _text_bytes, configure_writer

    corpus = worker_corpus(args, worker)
    keys = [session_key(worker, n) for n in range(len(corpus.conversations))]
    ordered = interleaved(corpus)
    step = args.appenders
    conn = configure_writer(psycopg.connect(dsn))
    with conn:
        at = time.time()
        ids = [worker * ID_RANGE + n for n in range(1, len(keys) + 1)]
        # The sessions, before the clock (the library's first appends make them).
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {S}.sessions(agent, id, key, key_agent, chat_type,"
                " conversation_id, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, 'direct', %s, %s, %s)",
                [
                    (AGENT, i, k, AGENT, k.rsplit(":", 1)[1], at, at)
                    for i, k in zip(ids, keys, strict=True)
                ],
            )
        barrier.wait(START_TIMEOUT_S)
        start = time.time()
        leaf: list[int | None] = [None] * len(keys)
        previous: list[str | None] = [None] * len(keys)
        depth = [0] * len(keys)
        tokens = [0] * len(keys)
        next_id = worker * ID_RANGE
        for low in range(0, len(ordered), step):
            events, branch, index = [], [], []
            touched: set[int] = set()
            for s, i, message in ordered[low : low + step]:
                next_id += 1
                text = message.index_text
                events.append(
                    (
                        AGENT, next_id, ids[s], leaf[s], i + 1, i + 1, at, message.role,
                        _encode_content(message.content), _text_bytes(text),
                    )
                )  # fmt: skip
                branch.append((AGENT, ids[s], i + 1, next_id))
                if text is not None:
                    terms = index_terms(text, previous[s])
                    index.append((AGENT, next_id, ids[s], i + 1, terms.tokens, terms.terms))
                    tokens[s] += terms.tokens
                    previous[s] = text
                leaf[s], depth[s] = next_id, i + 1
                touched.add(s)
            leaves = [
                (leaf[s], depth[s], depth[s] + 1, depth[s], at, depth[s], tokens[s], AGENT, ids[s])
                for s in sorted(touched)
            ]
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(_RAW_EVENT.format(S=S), events)
                cur.executemany(_RAW_BRANCH.format(S=S), branch)
                cur.executemany(_RAW_INDEX.format(S=S), index)
                cur.executemany(_RAW_LEAF.format(S=S), leaves)
        end = time.time()
    batches = -(-len(ordered) // step)
    out.put(msgspec.json.encode(Timing(start, end, corpus.messages, batches, len(ordered))))


_RAW_EVENT = (
    "INSERT INTO {S}.events(agent, id, session_id, parent_id, seq, depth, ts, kind, role,"
    " content, text) VALUES (%s, %s, %s, %s, %s, %s, %s, 'message', %s, %s, %s)"
)
_RAW_BRANCH = (
    "INSERT INTO {S}.active_branch(agent, session_id, depth, event_id) VALUES (%s, %s, %s, %s)"
)
_RAW_INDEX = (
    "INSERT INTO {S}.message_index(agent, event_id, session_id, depth, tokens, terms)"
    " VALUES (%s, %s, %s, %s, %s, %s::tsvector)"
)
_RAW_LEAF = (
    "UPDATE {S}.sessions SET leaf_event_id = %s, leaf_depth = %s, next_seq = %s,"
    " revision = revision + 1, indexed_seq = %s, updated_at = %s, index_rows = %s,"
    " index_tokens = %s WHERE agent = %s AND id = %s"
)
_WORKERS = {"library": _library_worker, "raw": _raw_worker}


# -- one run: W processes in a database of their own ------------------------------------


@dataclass(frozen=True)
class Run:
    """One kind of writer at one worker count."""

    kind: str  # "library" or "raw"
    workers: int
    seconds: float  # first start to last end
    messages: int
    batches: int
    commands: int

    @property
    def rate(self) -> float:
        """Messages per second, over every worker."""
        return self.messages / self.seconds

    @property
    def mean_batch(self) -> float:
        """Messages per transaction."""
        return self.commands / self.batches if self.batches else 0.0


@contextmanager
def own_database(admin_dsn: str) -> Iterator[str]:
    """A new database with the store's schema; its DSN. Dropped on exit."""
    import psycopg
    import psycopg.conninfo

    from ...storage.pg.db import PgSettings, connect

    name = f"activememory_bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
            connect(PgSettings(dsn=dsn)).close()  # the schema, before any worker
            yield dsn
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_workers(admin_dsn: str, args: argparse.Namespace, kind: str, workers: int) -> Run:
    """`workers` processes of `kind` against a fresh database; checked afterwards."""
    context = multiprocessing.get_context("spawn")  # no forked event loop or connection
    with own_database(admin_dsn) as dsn:
        barrier = context.Barrier(workers)
        out = context.Queue()
        procs = [
            context.Process(target=_WORKERS[kind], args=(dsn, args, w, barrier, out))
            for w in range(workers)
        ]
        for p in procs:
            p.start()
        timings: list[Timing] = []
        try:
            for _ in procs:
                timings.append(msgspec.json.decode(out.get(timeout=3600), type=Timing))
        except Exception as exc:
            raise BenchmarkError(
                f"{kind} with {workers} workers: a worker failed ({exc!r})"
            ) from exc
        finally:
            for p in procs:
                p.join(timeout=60)
                if p.is_alive():
                    p.kill()
        _check_stored(dsn, f"{kind} with {workers} workers", sum(t.messages for t in timings))
    return Run(
        kind=kind,
        workers=workers,
        seconds=max(t.end for t in timings) - min(t.start for t in timings),
        messages=sum(t.messages for t in timings),
        batches=sum(t.batches for t in timings),
        commands=sum(t.commands for t in timings),
    )


def _check_stored(dsn: str, what: str, messages: int) -> None:
    """`BenchmarkError` unless every message is stored once, on its branch, and indexed."""
    import psycopg

    from ...storage.pg.db import SCHEMA as S

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            f"SELECT (SELECT count(*) FROM {S}.events WHERE agent = %(a)s),"
            f" (SELECT count(*) FROM {S}.active_branch WHERE agent = %(a)s),"
            f" (SELECT count(*) FROM {S}.message_index WHERE agent = %(a)s),"
            f" (SELECT coalesce(sum(index_rows), 0) FROM {S}.sessions WHERE agent = %(a)s)",
            {"a": AGENT},
        ).fetchone()
    got = tuple(int(n) for n in row) if row else ()
    if got != (messages,) * 4:
        raise BenchmarkError(
            f"{what}: expected {messages} events, branch rows, index rows and counted rows,"
            f" got {got}"
        )


# -- the report -------------------------------------------------------------------------


def run_all(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
    """`--rounds` rounds of every worker count, the floor and the library interleaved (the
    load of the moment hits both sides); the report."""
    runs: dict[int, list[tuple[Run, Run]]] = {w: [] for w in args.workers}
    for _round in range(args.rounds):
        for workers in args.workers:
            raw = run_workers(args.dsn, args, "raw", workers)
            library = run_workers(args.dsn, args, "library", workers)
            runs[workers].append((raw, library))
    return report(args, runs, run_dir, kept)


def report(
    args: argparse.Namespace, runs: dict[int, list[tuple[Run, Run]]], run_dir: Path, kept: bool
) -> dict[str, Any]:
    """The one JSON object `--json` prints; the table is drawn from it too. A worker
    count is judged on the median of its rounds' ratios; rates shown are the best round's."""

    def side(run: Run) -> dict[str, Any]:
        return {
            "seconds": round(run.seconds, 4),
            "messages": run.messages,
            "messages_per_s": round(run.rate, 1),
            "mean_batch_size": round(run.mean_batch, 2),
        }

    by_workers: list[dict[str, Any]] = []
    for workers, rounds in runs.items():
        ratios = [library.rate / raw.rate for raw, library in rounds]
        median = statistics.median(ratios)
        by_workers.append(
            {
                "workers": workers,
                "raw": side(min((raw for raw, _ in rounds), key=lambda r: r.seconds)),
                "library": side(min((lib for _, lib in rounds), key=lambda r: r.seconds)),
                "ratio_to_raw_by_round": [round(r, 4) for r in ratios],
                "ratio_to_raw": round(median, 4),
                "pass": median >= TARGET_RATIO,
            }
        )
    first, last = by_workers[0], by_workers[-1]
    scaling = last["library"]["messages_per_s"] / first["library"]["messages_per_s"]
    raw_scaling = last["raw"]["messages_per_s"] / first["raw"]["messages_per_s"]
    env = runner.environment(run_dir, kept=kept)
    env["load_average"] = [round(x, 2) for x in os.getloadavg()]
    env["postgresql"] = _server_version(args.dsn)
    return {
        "benchmark": "pgingest",
        "rows": {
            "appenders_per_worker": args.appenders,
            "messages_per_appender": args.messages_per_appender,
            "messages_per_worker": args.appenders * args.messages_per_appender,
            "seed": args.seed,
        },
        "rounds": args.rounds,
        "by_workers": by_workers,
        "scaling": {
            "workers": [first["workers"], last["workers"]],
            "library": round(scaling, 3),
            "raw": round(raw_scaling, 3),
        },
        "target_ratio": TARGET_RATIO,
        "pass": all(w["pass"] for w in by_workers),
        "environment": env,
    }


def _server_version(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "unknown"


def format_table(result: dict[str, Any]) -> str:
    """The report for a person."""
    rows, scaling = result["rows"], result["scaling"]
    lines = [
        "Ingest on PostgreSQL: worker processes sharing one server (closed-loop appenders,"
        " acks after commit, text only)",
        f"  rows: {rows['messages_per_worker']:,} messages per worker ="
        f" {rows['appenders_per_worker']} appenders x {rows['messages_per_appender']};"
        f" seed {rows['seed']}",
        "",
        f"  {'workers':>7} {'raw msg/s':>10} {'library msg/s':>14} {'mean batch':>11}"
        f" {'library/raw':>12}  (rates: best round; ratio: median of {result['rounds']})",
    ]
    for w in result["by_workers"]:
        lines.append(
            f"  {w['workers']:>7} {w['raw']['messages_per_s']:>10,.0f}"
            f" {w['library']['messages_per_s']:>14,.0f} {w['library']['mean_batch_size']:>11.1f}"
            f" {w['ratio_to_raw']:>12.2f}  "
            + runner.against(f"{w['ratio_to_raw']:.2f}", ">=", result["target_ratio"], w["pass"])
        )
        by_round = ", ".join(f"{r:.2f}" for r in w["ratio_to_raw_by_round"])
        lines.append(f"  {'':>7} rounds: {by_round}")
    a, b = scaling["workers"]
    lines += [
        "",
        f"  scaling, {b} workers / {a}: library {scaling['library']:.2f}x,"
        f" raw psycopg {scaling['raw']:.2f}x",
        f"  library / raw psycopg at every worker count: {runner.verdict(result['pass'])}",
        f"  PostgreSQL {result['environment']['postgresql']}",
        *runner.environment_lines(result["environment"]),
    ]
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (`sys.argv[1:]` when `argv` is None)."""
    parser = runner.command(
        "pgingest",
        "Ingest on PostgreSQL with 1, 2 and 4 worker processes against raw psycopg.",
        seed=7,
    )
    runner.add_sizes(parser, messages_per_appender=100, appenders=16, rounds=3)
    parser.add_argument(
        "--dsn",
        default=DEFAULT_DSN,
        help="a server's maintenance database; the benchmark creates and drops its own"
        " databases there (default: $ACTIVEMEMORY_TEST_PG or the local server)",
    )
    parser.add_argument(
        "--workers",
        type=runner.positive_int,
        nargs="+",
        default=list(WORKER_COUNTS),
        help="worker counts to run (default 1 2 4); the scaling is the last against the first",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`); 1 if a run lost rows."""
    return runner.main("pgingest", parse_args(argv), run_all, format_table)
