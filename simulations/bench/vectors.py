"""Nearest-neighbour latency: the library's BLOB table scored with numpy against sqlite-vec.

One seeded synthetic agent database is built with the storage writer directly: MESSAGES
messages in sessions of 200, direct chats of many peers, each message with a random unit
vector of DIM dimensions (the library's `message_vectors` rows, of one embedder name). The
peer `alice` has IDENTITY_ROWS of them. Then the same seeded queries run, interleaved query
by query, over two scopes: one identity's private chats (the cross-conversation privacy rule
of the text search, as SQL) and every row of the agent:

- library: `nearest_messages` (storage/vectors.py): the scope's vectors read by their
  primary key range, scored with numpy, top k;
- index: the same call on a connection with the agent's in-memory vector index attached
  (storage/vector_index.py; nothing writes during the benchmark, so its feed stays empty):
  one matrix-vector product masked to the scope, the candidates re-read from SQLite; its
  first query (the load of every vector) is reported apart, as `index_load_s`;
- sqlite-vec (only when the `sqlite_vec` package is installed): a `vec0` table of the same
  vectors (`float[DIM]`, cosine), KNN with `rowid IN (SELECT ...)` of the scope's events,
  so visibility applies before k.

It prints p50/p90/p99/max per side and checks that all return the same top k.

    activememory bench vectors [--messages N] [--dim D] [--json] ...
"""

from __future__ import annotations

import argparse
import functools
import importlib
import random
import time
from pathlib import Path
from typing import Any, cast

import apsw
import numpy

from ...protocol.content import Message, Role
from ...protocol.indexer import AppendMessage
from ...protocol.session_key import parse_session_key
from ...storage.db import open_connection
from ...storage.search import _PRIVATE
from ...storage.transcripts import TranscriptWriter
from ...storage.vector_index import VectorFeed, VectorIndexes, attach
from ...storage.vectors import nearest_message_rows, nearest_messages, to_blob
from . import runner
from .runner import BenchmarkError

NAME = "bench/random"
SESSION_ROWS = 200
CALLER = "agent:main:main"
# The identity scope: the same privacy rule as the text side, one column of session ids.
IDENTITY_SQL = f"SELECT id FROM ({_PRIVATE})"
ALL_SQL = "SELECT id FROM sessions"


def build(path: Path, *, messages: int, identity_rows: int, dim: int, seed: int) -> float:
    """The database at `path`: messages and their vectors; the seconds it took."""
    started = time.perf_counter()
    conn = open_connection(path, writer=True)
    writer = TranscriptWriter(conn)
    rng = numpy.random.default_rng(seed)
    # Alice's direct chat holds `identity_rows`; other peers' chats SESSION_ROWS each.
    plan = [("alice", identity_rows)]
    for s in range(max(0, messages - identity_rows) // SESSION_ROWS):
        plan.append((f"peer{s}", SESSION_ROWS))
    batch = []
    for peer, rows in plan:
        key = parse_session_key(f"agent:main:direct:{peer}")
        for i in range(rows):
            role: Role = "user" if i % 2 == 0 else "assistant"
            message = Message(role=role, content=f"message {peer} {i}")
            batch.append(AppendMessage(key=key, message=message, at=1.0))
            if len(batch) >= 512:
                writer.apply(batch)
                batch = []
    if batch:
        writer.apply(batch)
    ids = [int(e) for (e,) in conn.execute("SELECT id FROM events ORDER BY id")]
    vectors = rng.standard_normal((len(ids), dim)).astype(numpy.float32)
    vectors /= numpy.linalg.norm(vectors, axis=1, keepdims=True)
    with conn:
        conn.executemany(
            "INSERT INTO message_vectors(session_id, name, event_id, vector)"
            " SELECT session_id, ?, id, ? FROM events WHERE id = ?",
            ((NAME, to_blob(v), i) for i, v in zip(ids, vectors, strict=True)),
        )
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return time.perf_counter() - started


def load_vec0(conn: apsw.Connection, dim: int) -> bool:
    """Load sqlite-vec into `conn` and fill its `vec0` table; False if not installed."""
    try:
        sqlite_vec = importlib.import_module("sqlite_vec")  # optional: not a dependency
    except ImportError:
        return False
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    conn.enable_load_extension(False)
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'vec_messages'").fetchone():
        with conn:
            conn.execute(
                f"CREATE VIRTUAL TABLE vec_messages USING vec0("
                f"embedding float[{dim}] distance_metric=cosine)"
            )
            conn.execute(
                "INSERT INTO vec_messages(rowid, embedding)"
                " SELECT event_id, vector FROM message_vectors WHERE name = ?",
                (NAME,),
            )
    return True


def vec0_nearest(
    conn: apsw.Connection, query: numpy.ndarray, visible_sql: str, params: Any, k: int
) -> list[tuple[int, float]]:
    """KNN in `vec0` over the events of the visible sessions (visibility before k)."""
    sql = (
        "SELECT rowid, distance FROM vec_messages WHERE embedding MATCH :q AND k = :k"
        f" AND rowid IN (SELECT id FROM events WHERE session_id IN ({visible_sql}))"
    )
    rows = conn.execute(sql, {**params, "q": to_blob(query), "k": k}).fetchall()
    return [(int(r), 1.0 - float(d)) for r, d in cast(list[tuple[int, float]], rows)]


def run(args: argparse.Namespace, run_dir: Path, kept: bool) -> runner.Report:
    path = run_dir / f"vectors-{args.messages}-{args.dim}-{args.seed}.db"
    build_s = 0.0
    if not path.exists():  # built under another name: an interrupted build is never reused
        partial = path.with_name(path.name + ".part")
        for leftover in run_dir.glob(partial.name + "*"):
            leftover.unlink()
        build_s = build(
            partial,
            messages=args.messages,
            identity_rows=args.identity_rows,
            dim=args.dim,
            seed=args.seed,
        )
        partial.rename(path)
    conn = open_connection(path, writer=False)
    has_vec0 = load_vec0(conn, args.dim)
    indexed = open_connection(path, writer=False)
    index = VectorIndexes(VectorFeed.unwritten())
    attach(indexed, index)
    private = {"agent": "main", "caller": CALLER, "peers": '["alice"]', "owner": False}
    scopes = {"identity": (IDENTITY_SQL, private), "all": (ALL_SQL, {})}
    rng = random.Random(args.seed)
    result: runner.Report = {"messages": args.messages, "dim": args.dim, "k": args.k}
    result["build_s"] = round(build_s, 3)
    result["vec0"] = has_vec0
    t0 = time.perf_counter()
    nearest_message_rows(indexed, numpy.ones(args.dim), name=NAME, visible_sql=ALL_SQL,
                         visible_params={}, k=1)  # fmt: skip
    result["index_load_s"] = round(time.perf_counter() - t0, 3)
    for scope, (sql, params) in scopes.items():
        visible = conn.execute(
            f"SELECT count(*) FROM message_vectors WHERE session_id IN ({sql})", params
        ).fetchone()
        times: dict[str, list[float]] = {"numpy": [], "index": [], "vec0": []}
        for _ in range(args.queries):
            q = numpy.array([rng.gauss(0, 1) for _ in range(args.dim)], dtype=numpy.float32)
            q /= numpy.linalg.norm(q)
            t0 = time.perf_counter()
            ours = nearest_messages(
                conn, q, name=NAME, visible_sql=sql, visible_params=params, k=args.k
            )
            times["numpy"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            fast = nearest_messages(
                indexed, q, name=NAME, visible_sql=sql, visible_params=params, k=args.k
            )
            times["index"].append(time.perf_counter() - t0)
            if fast != ours:
                raise BenchmarkError(f"{scope}: the index and the plain scan disagree")
            if has_vec0:
                t0 = time.perf_counter()
                theirs = vec0_nearest(conn, q, sql, params, args.k)
                times["vec0"].append(time.perf_counter() - t0)
                if [e for e, _ in ours] != [e for e, _ in theirs]:
                    raise BenchmarkError(f"{scope}: numpy and vec0 disagree on the top {args.k}")
        result[scope] = {
            "rows": int(visible[0]) if visible else 0,
            **{side: runner.percentiles(t) for side, t in times.items() if t},
        }
    if index.loads != 1 or index.fallbacks:
        raise BenchmarkError(f"the index loaded {index.loads} times, fell back {index.fallbacks}")
    conn.close()
    indexed.close()
    return result


def format_table(result: runner.Report) -> str:
    lines = [
        f"{result['messages']} messages, {result['dim']} dims, k={result['k']},"
        f" built in {result['build_s']} s (0: reused);"
        f" the index loaded in {result['index_load_s']} s"
    ]
    for scope in ("identity", "all"):
        part = result[scope]
        for side in ("numpy", "index", "vec0"):
            if side in part:
                p = part[side]
                lines.append(
                    f"{scope:9} {part['rows']:>8} rows  {side:6} p50 {p['p50']:8.2f} ms"
                    f"  p90 {p['p90']:8.2f}  p99 {p['p99']:8.2f}  max {p['max']:8.2f}"
                )
    if not result["vec0"]:
        lines.append("sqlite-vec is not installed: the vec0 side was skipped")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`)."""
    parser = runner.command("vectors", __doc__ or "", seed=5, state_dir=runner.REUSE_HELP)
    parser.add_argument("--messages", type=runner.positive_int, default=10_000)
    parser.add_argument("--identity-rows", type=runner.positive_int, default=2_000)
    parser.add_argument("--dim", type=runner.positive_int, default=384)
    parser.add_argument("--k", type=runner.positive_int, default=10)
    parser.add_argument("--queries", type=runner.positive_int, default=50)
    args = parser.parse_args(argv)
    return runner.main("vectors", args, run, functools.partial(format_table))
