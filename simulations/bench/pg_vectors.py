"""The vector side of hybrid search on PostgreSQL, on both vector paths (docs/design.md §11).

- exact: the store without pgvector (`storage.pgvector` off): one query reads the visible
  rows' float32 bytes and numpy scores them (`storage/pg/vectors.nearest_message_rows`);
- pgvector: the store with it: SQL ranks the visible rows by `<#>` over the `embedding`
  column (the HNSW index of the vector space when the planner takes it) and only the best
  `k + RERANKED` rows are read (`ranked_rows`).

Each path gets a database the benchmark creates and drops, filled with the same seeded
rows: ROWS vectors of 384 dimensions (all-MiniLM-L6-v2's size) in sessions of
IDENTITY_ROWS rows each. Two callers: one who sees every session (`all`) and one who sees
one session, one identity's rows (`identity`). It prints p50/p99 per path and scope after a
warm-up, the plan pgvector's ranking took (HNSW or a sort of the visible rows), and how
many queries gave pgvector the exact path's very top k.

    python -m activememory.simulations.bench.pg_vectors [--dsn ADMIN_DSN] [--rows 100000]
        [--identity-rows 2000] [--queries 15] [--k 20]
"""

from __future__ import annotations

import argparse
import io
import secrets
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy

from ...protocol.errors import StorageError
from ...storage.pg import db as pg_db
from ...storage.pg import vectors as pg_vectors
from ...storage.pg.search import scope_sql

DIM = 384
NAME = "m"
CALLER = "agent:main:direct:p1"
SCOPES = {"all": None, "identity": CALLER}  # label -> the one session it is limited to


def _blocks(rows: int, seed: int = 7) -> Iterator[tuple[int, numpy.ndarray]]:
    """(first event id, unit vectors) in blocks: the same rows for every path."""
    rng = numpy.random.default_rng(seed)
    for start in range(1, rows + 1, 10_000):
        block = rng.standard_normal((min(rows + 1, start + 10_000) - start, DIM)).astype("<f4")
        yield start, block / numpy.linalg.norm(block, axis=1, keepdims=True)


def _fill(conn: Any, agent: str, rows: int, sessions: int, pgvector: bool) -> float:
    """`rows` indexed messages with vectors over `sessions` sessions (COPY); pgvector: the
    `embedding` column too and the space's HNSW index, built after the rows. Seconds."""
    s = pg_db.SCHEMA
    started = time.perf_counter()
    conn.execute(
        f"INSERT INTO {s}.sessions(agent, id, key, chat_type, conversation_id, created_at,"
        " updated_at) SELECT %s, i, 'agent:main:direct:p' || i, 'direct', 'p' || i, 0, 0"
        " FROM generate_series(1, %s) i",
        (agent, sessions),
    )
    index = io.StringIO()
    for i in range(1, rows + 1):
        index.write(f"{agent}\t{i}\t{1 + i % sessions}\t{i}\t1\t\n")
    with conn.cursor().copy(
        f"COPY {s}.message_index(agent, event_id, session_id, depth, tokens, terms) FROM STDIN"
    ) as copy:
        copy.write(index.getvalue())
    columns = "agent, event_id, session_id, name, vector" + (", embedding" if pgvector else "")
    with conn.cursor().copy(f"COPY {s}.message_vectors({columns}) FROM STDIN") as copy:
        for start, block in _blocks(rows):
            for offset, vector in enumerate(block):
                i = start + offset
                row: tuple[object, ...] = (agent, i, 1 + i % sessions, NAME, vector.tobytes())
                if pgvector:  # pgvector's text form; float32 repr is read back bit for bit
                    row = (*row, "[" + ",".join(map(str, vector.tolist())) + "]")
                copy.write_row(row)
    if pgvector:
        conn.execute("SET maintenance_work_mem = '512MB'")  # the graph fits: one pass
        pg_vectors.ensure_vector_index(conn, "message_vectors", NAME, DIM)
    conn.execute(f"ANALYZE {s}.sessions")
    conn.execute(f"ANALYZE {s}.message_vectors")
    return time.perf_counter() - started


def _queries(count: int) -> list[numpy.ndarray]:
    rng = numpy.random.default_rng(11)
    out = []
    for _ in range(count):
        query = rng.standard_normal(DIM).astype("<f4")
        out.append(query / numpy.linalg.norm(query))
    return out


def _run(
    conn: Any, agent: str, only: str | None, queries: list[numpy.ndarray], k: int
) -> tuple[list[float], list[list[int]]]:
    """Milliseconds per query and the ids found, after one warm-up query."""
    sql, params = scope_sql(agent, "all", CALLER, only)
    times, found = [], []
    for query in [queries[0], *queries]:
        start = time.perf_counter()
        near = pg_vectors.nearest_message_rows(
            conn, agent, query, name=NAME, visible_sql=sql, visible_params=params, k=k
        )
        times.append((time.perf_counter() - start) * 1000)
        found.append([row.id for row in near])
    return times[1:], found[1:]


def _plan(conn: Any, agent: str, only: str | None, query: numpy.ndarray, k: int) -> str:
    """How the planner ranks on the pgvector path: HNSW or a sort of the visible rows."""
    sql, params = scope_sql(agent, "all", CALLER, only)
    condition, ordering = pg_vectors.ranked_sql(conn, NAME, DIM)
    with conn.transaction(), pg_vectors.embedding_cursor(conn) as cur:
        pg_vectors.search_settings(conn, k + pg_vectors.RERANKED)
        plan = cur.execute(
            f"EXPLAIN (COSTS OFF) SELECT v.event_id, v.vector, {ordering}"
            f" FROM {pg_db.SCHEMA}.message_vectors v"
            " WHERE v.agent = %(agent)s AND v.session_id IN"
            f" (SELECT id FROM ({sql}) visible WHERE NOT dirty) AND {condition}"
            f" ORDER BY {ordering} LIMIT {k + pg_vectors.RERANKED}",
            {**params, "agent": agent, "query": pg_vectors.Embedding.of(query.tobytes())},
        ).fetchall()
    text = "\n".join(str(line[0]) for line in plan)
    return "hnsw" if "_hnsw_" in text else "sort"


@contextmanager
def _database(admin_dsn: str, pgvector: str) -> Iterator[Any]:
    import psycopg
    import psycopg.conninfo

    name = f"activememory_bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            dsn = psycopg.conninfo.make_conninfo(admin_dsn, dbname=name)
            conn = pg_db.connect(pg_db.PgSettings(dsn=dsn, pgvector=pgvector))
            conn.autocommit = True
            try:
                yield conn
            finally:
                conn.close()
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000])
    parser.add_argument("--identity-rows", type=int, default=2_000)
    parser.add_argument("--queries", type=int, default=15)
    parser.add_argument("--k", type=int, default=20)
    args = parser.parse_args()
    queries = _queries(args.queries)
    print(f"{'rows':>8} {'path':>10} {'scope':>9} {'p50 ms':>8} {'p99 ms':>8}  notes")
    for rows in args.rows:
        sessions = max(1, rows // args.identity_rows)
        agent = f"bench{rows}"
        exact: dict[str, list[list[int]]] = {}
        for path, choice in (("exact", "off"), ("pgvector", "on")):
            try:
                with _database(args.dsn, choice) as conn:
                    fill = _fill(conn, agent, rows, sessions, path == "pgvector")
                    # pgvector as the planner chooses, then with sorting priced out
                    # (`enable_sort` off, so it walks the HNSW index) at two candidate lists
                    variants = [(path, False, 40)]
                    if path != "exact":
                        variants += [("hnsw", True, 40), ("hnsw ef200", True, 200)]
                    for label, forced, ef in variants:
                        conn.execute(f"SET enable_sort = {'off' if forced else 'on'}")
                        pg_vectors.EF_SEARCH = ef
                        for scope, only in SCOPES.items():
                            times, found = _run(conn, agent, only, queries, args.k)
                            times.sort()
                            p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
                            note = f"fill {fill:.0f} s"
                            if path == "exact":
                                exact[scope] = found
                            else:
                                pairs = list(zip(found, exact[scope], strict=True))
                                same = sum(a == b for a, b in pairs)
                                recall = statistics.mean(
                                    len(set(a) & set(b)) / len(b) for a, b in pairs
                                )
                                plan = _plan(conn, agent, only, queries[0], args.k)
                                note += (
                                    f", plan {plan}, exact top {args.k}: {same}/{len(found)},"
                                    f" recall@{args.k} {recall:.2f}"
                                )
                            median = statistics.median(times)
                            print(
                                f"{rows:>8} {label:>10} {scope:>9} {median:>8.1f} {p99:>8.1f}  {note}",
                                flush=True,
                            )
            except StorageError as exc:
                print(f"{rows:>8} {path:>9} skipped: {exc}")


if __name__ == "__main__":
    main()
