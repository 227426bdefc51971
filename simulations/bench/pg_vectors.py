"""The vector side of hybrid search on PostgreSQL, on both vector paths (docs/design.md §11).

- exact: the store without pgvector (`storage.pgvector` off): one query reads the visible
  rows' float32 bytes and numpy scores them (`storage/pg/vectors.nearest_message_rows`);
- pgvector: the store with it: SQL ranks the visible rows by `<#>` over the `embedding`
  column and only the best `k + RERANKED` rows are read (`ranked_rows`);
- hnsw (with `--hnsw`): the alternative the store does not take, measured here: an HNSW
  index of the same rows (`vector_ip_ops`) walked with `hnsw.iterative_scan` under the
  same visibility filter, at two candidate lists (`hnsw.ef_search` 40 and 200).

Each path gets a database the benchmark creates and drops, filled with the same seeded
rows: ROWS random unit vectors of 384 dimensions (all-MiniLM-L6-v2's size; random vectors
are the hard case for an approximate index) in sessions of IDENTITY_ROWS rows each. Two
callers: one who sees every session (`all`) and one who sees one session, one identity's
rows (`identity`). It prints p50/p99 per path and scope after a warm-up, how many queries
gave the exact path's very top k, and recall@k (the share of the exact top k found).

    python -m activememory.simulations.bench.pg_vectors [--dsn ADMIN_DSN] [--rows 100000]
        [--identity-rows 2000] [--queries 15] [--k 20] [--hnsw]
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
    """`rows` indexed messages with vectors over `sessions` sessions (COPY; pgvector: the
    `embedding` column too). Seconds."""
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


def _hnsw_index(conn: Any) -> float:
    """An HNSW index of the rows (what the store does not make). Seconds to build it."""
    started = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '512MB'")  # the graph fits: one pass
    conn.execute(
        f"CREATE INDEX bench_hnsw ON {pg_db.SCHEMA}.message_vectors USING hnsw"
        f" ((embedding::vector({DIM})) vector_ip_ops) WHERE name = '{NAME}'"
    )
    conn.execute(f"ANALYZE {pg_db.SCHEMA}.message_vectors")
    return time.perf_counter() - started


def _run_hnsw(
    conn: Any, agent: str, only: str | None, queries: list[numpy.ndarray], k: int, ef: int
) -> tuple[list[float], list[list[int]]]:
    """`_run` through the HNSW index: ordered by the distance alone, the filter applied as
    the index is walked (iterative scan), the `k` best read back and ranked by `pick`."""
    sql, params = scope_sql(agent, "all", CALLER, only)
    statement = (
        f"SELECT v.event_id, v.vector FROM {pg_db.SCHEMA}.message_vectors v"
        " WHERE v.agent = %(agent)s AND v.session_id IN"
        f" (SELECT id FROM ({sql}) visible WHERE NOT dirty) AND v.name = '{NAME}'"
        f" ORDER BY (v.embedding::vector({DIM})) <#> %(query)s::vector({DIM})"
        f" LIMIT {k + pg_vectors.RERANKED}"
    )
    times, found = [], []
    for turn, query in enumerate([queries[0], *queries]):
        start = time.perf_counter()
        with conn.transaction(), pg_vectors.embedding_cursor(conn, binary=True) as cur:
            conn.execute(
                "SELECT set_config('hnsw.iterative_scan', 'relaxed_order', true),"
                " set_config('hnsw.ef_search', %s, true), set_config('enable_sort', 'off', true)",
                (str(ef),),
            )
            if turn == 0:  # the warm-up: is the index taken?
                taken = cur.execute(
                    f"EXPLAIN {statement}",
                    {**params, "agent": agent, "query": pg_vectors.Embedding.of(query.tobytes())},
                ).fetchall()
                if "bench_hnsw" not in str(taken):
                    raise RuntimeError("the planner did not take the HNSW index")
            rows = cur.execute(
                statement,
                {**params, "agent": agent, "query": pg_vectors.Embedding.of(query.tobytes())},
            ).fetchall()
        near = pg_vectors._top_k(rows, query, k)
        times.append((time.perf_counter() - start) * 1000)
        found.append([row.id for row in near])
    return times[1:], found[1:]


def _line(rows: int, label: str, scope: str, times: list[float], note: str) -> None:
    times = sorted(times)
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    median = statistics.median(times)
    print(f"{rows:>8} {label:>10} {scope:>9} {median:>8.1f} {p99:>8.1f}  {note}", flush=True)


def _agreement(found: list[list[int]], exact: list[list[int]], k: int) -> str:
    pairs = list(zip(found, exact, strict=True))
    same = sum(a == b for a, b in pairs)
    recall = statistics.mean(len(set(a) & set(b)) / max(1, len(b)) for a, b in pairs)
    return f"exact top {k}: {same}/{len(pairs)}, recall@{k} {recall:.2f}"


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
    parser.add_argument("--hnsw", action="store_true", help="measure an HNSW index too")
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
                    for scope, only in SCOPES.items():
                        times, found = _run(conn, agent, only, queries, args.k)
                        note = f"fill {fill:.0f} s"
                        if path == "exact":
                            exact[scope] = found
                        else:
                            note += ", " + _agreement(found, exact[scope], args.k)
                        _line(rows, path, scope, times, note)
                    if path == "pgvector" and args.hnsw:
                        built = _hnsw_index(conn)
                        for ef in (40, 200):
                            for scope, only in SCOPES.items():
                                times, found = _run_hnsw(conn, agent, only, queries, args.k, ef)
                                note = f"index {built:.0f} s, " + _agreement(
                                    found, exact[scope], args.k
                                )
                                _line(rows, f"hnsw ef{ef}", scope, times, note)
            except StorageError as exc:
                print(f"{rows:>8} {path:>10} skipped: {exc}")


if __name__ == "__main__":
    main()
