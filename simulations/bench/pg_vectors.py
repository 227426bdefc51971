"""The vector side of hybrid search on PostgreSQL without pgvector (docs/design.md §11).

Exact scoring over the caller's visible vectors (`storage/pg/vectors.nearest_message_rows`:
one query reads the visible rows' vectors, numpy scores them). This measures it at 10k and
100k stored vectors of 384 dimensions (all-MiniLM-L6-v2's size) in 100 sessions, for a
caller who sees every session (`all`) and one who sees one session (1% of the rows), in a
database the benchmark creates and drops.

    python -m activememory.simulations.bench.pg_vectors [--dsn ADMIN_DSN] [--rows 10000 100000]
"""

from __future__ import annotations

import argparse
import io
import secrets
import statistics
import time

import numpy

from ...storage.pg import db as pg_db
from ...storage.pg import vectors as pg_vectors
from ...storage.pg.search import scope_sql

DIM = 384
SESSIONS = 100
QUERIES = 15


def _fill(conn: object, agent: str, rows: int) -> None:
    """`rows` indexed messages with vectors, spread over `SESSIONS` sessions (COPY)."""
    s = pg_db.SCHEMA
    rng = numpy.random.default_rng(7)
    with conn.transaction():  # type: ignore[attr-defined]
        conn.execute(  # type: ignore[attr-defined]
            f"INSERT INTO {s}.sessions(agent, id, key, chat_type, conversation_id, created_at,"
            " updated_at) SELECT %s, i, 'agent:main:direct:p' || i, 'direct', 'p' || i, 0, 0"
            " FROM generate_series(1, %s) i",
            (agent, SESSIONS),
        )
        index = io.StringIO()
        for i in range(1, rows + 1):
            index.write(f"{agent}\t{i}\t{1 + i % SESSIONS}\t{i}\t1\t\n")
        with conn.cursor().copy(  # type: ignore[attr-defined]
            f"COPY {s}.message_index(agent, event_id, session_id, depth, tokens, terms) FROM STDIN"
        ) as copy:
            copy.write(index.getvalue())
        with conn.cursor().copy(  # type: ignore[attr-defined]
            f"COPY {s}.message_vectors(agent, event_id, session_id, name, vector) FROM STDIN"
        ) as copy:
            for start in range(1, rows + 1, 10_000):
                stop = min(rows + 1, start + 10_000)
                block = rng.standard_normal((stop - start, DIM)).astype("<f4")
                block /= numpy.linalg.norm(block, axis=1, keepdims=True)
                for offset, vector in enumerate(block):
                    i = start + offset
                    copy.write_row((agent, i, 1 + i % SESSIONS, "m", vector.tobytes()))
    conn.execute(f"ANALYZE {s}.message_vectors")  # type: ignore[attr-defined]


def _time(conn: object, agent: str, scope: str, caller: str, only: str | None) -> list[float]:
    sql, params = scope_sql(agent, scope, caller, only)  # type: ignore[arg-type]
    rng = numpy.random.default_rng(11)
    times = []
    for _ in range(QUERIES):
        query = rng.standard_normal(DIM).astype("<f4")
        query /= numpy.linalg.norm(query)
        start = time.perf_counter()
        pg_vectors.nearest_message_rows(
            conn,  # type: ignore[arg-type]
            agent,
            query,
            name="m",
            visible_sql=sql,
            visible_params=params,
            k=20,
        )
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args()
    import psycopg
    import psycopg.conninfo

    name = f"activememory_bench_{secrets.token_hex(4)}"
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            dsn = psycopg.conninfo.make_conninfo(args.dsn, dbname=name)
            conn = pg_db.connect(pg_db.PgSettings(dsn=dsn))
            conn.autocommit = True
            print(f"{'rows':>8} {'visible':>8} {'p50 ms':>8} {'p99 ms':>8}")
            for rows in args.rows:
                agent = f"bench{rows}"
                _fill(conn, agent, rows)
                for label, scope, only in (
                    ("all", "all", None),
                    ("1%", "all", "agent:main:direct:p1"),
                ):
                    _time(conn, agent, scope, "agent:main:direct:p1", only)  # warm the cache
                    times = sorted(_time(conn, agent, scope, "agent:main:direct:p1", only))
                    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
                    print(f"{rows:>8} {label:>8} {statistics.median(times):>8.1f} {p99:>8.1f}")
            conn.close()
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
