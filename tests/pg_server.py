"""The PostgreSQL server the PostgreSQL store's tests use: a database of their own.

`pg_dsn` (session-scoped) creates `activememory_test_<random>` on the server named by
`ACTIVEMEMORY_TEST_PG` (default: the local server, user postgres, trust auth) and drops it at
the end. No server: the tests are skipped with the reason, except under CI=true, where a
missing server is a failure (.ci/run starts it).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ADMIN_DSN = os.environ.get("ACTIVEMEMORY_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _unavailable(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required under CI=true: {why}")
    pytest.skip(f"no PostgreSQL server for the PostgreSQL store's tests: {why}")


def dsn_of(database: str) -> str:
    """`ADMIN_DSN` with its database replaced."""
    import psycopg.conninfo

    return psycopg.conninfo.make_conninfo(ADMIN_DSN, dbname=database)


@contextmanager
def scratch_database() -> Iterator[str]:
    """A new, empty database; its DSN. Dropped on exit (also with connections still open)."""
    try:
        import psycopg
    except ImportError as exc:  # the `postgres` extra is not installed
        _unavailable(str(exc))
        raise
    try:
        admin = psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        _unavailable(f"{ADMIN_DSN}: {str(exc).strip()}")
        raise
    name = f"activememory_test_{secrets.token_hex(6)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield dsn_of(name)
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    """The DSN of this test session's own database (its store takes `storage.pgvector`'s
    default, auto: pgvector where the server has it, the exact path elsewhere)."""
    with scratch_database() as dsn:
        yield dsn


# --- The two vector paths (docs/design.md §11 "Vectors with pgvector") ----------------------

VECTOR_PATHS = ("exact", "pgvector")


def made_store(dsn: str, path: str) -> None:
    """The store's schema in `dsn`, on vector path `path` ("exact": storage.pgvector off;
    "pgvector": on). pgvector missing on the server: the test is skipped with its answer."""
    from activememory.protocol.errors import StorageError
    from activememory.storage.pg import db as pg_db

    choice = "on" if path == "pgvector" else "off"
    try:
        pg_db.connect(pg_db.PgSettings(dsn=dsn, pgvector=choice)).close()
    except StorageError as exc:
        if path != "pgvector":
            raise
        pytest.skip(f"the pgvector path needs the vector extension on the server: {exc}")


@pytest.fixture(scope="session")
def pg_exact_dsn() -> Iterator[str]:
    """A database of its own whose store takes the exact path (storage.pgvector off)."""
    with scratch_database() as dsn:
        made_store(dsn, "exact")
        yield dsn


@pytest.fixture(scope="session")
def pg_pgvector_dsn() -> Iterator[str]:
    """A database of its own whose store takes the pgvector path; skipped without it."""
    with scratch_database() as dsn:
        made_store(dsn, "pgvector")
        yield dsn


@pytest.fixture(params=VECTOR_PATHS)
def pg_dsn_each_path(request: pytest.FixtureRequest) -> str:
    """A store on each vector path, in turn: a module running its PostgreSQL vector tests
    on both overrides `pg_dsn` with it (`pg_dsn = pg_dsn_each_path` does not: define a
    fixture named pg_dsn that returns it)."""
    return str(request.getfixturevalue(f"pg_{request.param}_dsn"))


_agents = iter(range(1, 10**9))


def fresh_agent(prefix: str = "t") -> str:
    """An agent name no earlier test of this session used: its rows start empty."""
    return f"{prefix}{secrets.token_hex(3)}{next(_agents)}"


# --- Memories on PostgreSQL: the public-API tests run on both stores ------------------------


@contextmanager
def memory_database(path: str | None = None) -> Iterator[str]:
    """A database of its own for `open_memory(storage=...)` tests, emptied before each
    (`storage`): they use agent `main` as on SQLite, so they cannot share rows. Commits
    do not wait for the WAL flush here (`synchronous_commit = off`): these tests are about
    answers, not durability (tests/test_pg_crash.py is), and a suite appends thousands.
    `path`: its store made on that vector path first (`made_store`); None: left to
    `open_memory` (storage.pgvector auto)."""
    import psycopg

    with scratch_database() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            database = conn.info.dbname
            conn.execute(f'ALTER DATABASE "{database}" SET synchronous_commit = off')
        if path is not None:
            made_store(dsn, path)
        yield dsn


@pytest.fixture(scope="session")
def pg_memory_dsn() -> Iterator[str]:
    """`memory_database` with storage.pgvector auto."""
    with memory_database() as dsn:
        yield dsn


@pytest.fixture(scope="session")
def pg_exact_memory_dsn() -> Iterator[str]:
    """`memory_database` on the exact vector path."""
    with memory_database("exact") as dsn:
        yield dsn


@pytest.fixture(scope="session")
def pg_pgvector_memory_dsn() -> Iterator[str]:
    """`memory_database` on the pgvector path; skipped where the server lacks it."""
    with memory_database("pgvector") as dsn:
        yield dsn


@pytest.fixture(name="dsn")
def emptied_memory_dsn(pg_memory_dsn: str) -> str:
    """`pg_memory_dsn`, every row of its store deleted first: each test starts empty
    (a test module imports it with `pg_memory_dsn`; its tests ask for `dsn`)."""
    empty_store(pg_memory_dsn)
    return pg_memory_dsn


def empty_store(dsn: str) -> None:
    """Delete every row of the store's tables (the schema, once made, stays)."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        tables = [
            row[0]
            for row in conn.execute(
                "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'activememory'"
                " AND tablename <> 'activememory_meta'"
            )
        ]
        # DELETE, not TRUNCATE (which makes new files for every table: slow when repeated
        # before each test); foreign keys are not checked meanwhile (replica role).
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            for table in tables:
                conn.execute(f"DELETE FROM activememory.{table}")


@pytest.fixture(params=["sqlite", "postgresql"])
def storage(request: pytest.FixtureRequest) -> str | None:
    """Both stores for a module that imports this fixture (it overrides conftest.py's
    SQLite-only `storage`): None (SQLite in the test's state directory), then this test
    session's PostgreSQL database, emptied first. Pass it as `open_memory(storage=...)`."""
    return _store_for(request, "pg_memory_dsn")


@pytest.fixture(params=["sqlite", *(f"pg-{path}" for path in VECTOR_PATHS)])
def storage_each_vector_path(request: pytest.FixtureRequest) -> str | None:
    """`storage` with PostgreSQL on each vector path (pg-exact, pg-pgvector: skipped where
    the server lacks pgvector). A module of vector tests overrides `storage` with it."""
    database = {"pg-exact": "pg_exact_memory_dsn", "pg-pgvector": "pg_pgvector_memory_dsn"}
    return _store_for(request, database.get(request.param, "sqlite"))


def _store_for(request: pytest.FixtureRequest, database: str) -> str | None:
    if request.param == "sqlite":
        return None
    marker = request.node.get_closest_marker("sqlite_only")
    if marker is not None:
        pytest.skip(f"SQLite only: {marker.args[0]}")
    # Once per test: the store is the same under either event loop and executor (the
    # storage tests of tests/test_pg_*.py run it on threads; `inline` blocks the loop).
    # (A blocking test has no event loop of its own: it runs once as it is.)
    if (
        "anyio_backend" in request.fixturenames
        and request.getfixturevalue("anyio_backend") != "trio"
    ) or ("executor" in request.fixturenames and request.getfixturevalue("executor") != "thread"):
        pytest.skip("PostgreSQL runs each public-API test once: on trio, thread executor")
    dsn = str(request.getfixturevalue(database))
    empty_store(dsn)
    return dsn


def sqlite_only(storage: str | None, why: str) -> None:
    """Skip a test of a store-wide suite on PostgreSQL, saying why it is SQLite's alone."""
    if storage is not None:
        pytest.skip(f"SQLite only: {why}")


def store_index(state_dir: Path, storage: str | None, agent: str = "main") -> set[int]:
    """The event ids the agent's index holds, read behind the library's back, on either
    store (`storage` as the test's `open_memory` got it)."""
    if storage is None:
        from index_probe import agent_db, indexed_tokens

        return set(indexed_tokens(agent_db(state_dir, agent)))
    import psycopg

    with psycopg.connect(storage) as conn:
        rows = conn.execute(
            "SELECT event_id FROM activememory.message_index WHERE agent = %s", (agent,)
        )
        return {int(row[0]) for row in rows}


def store_match(state_dir: Path, storage: str | None, query: str, agent: str = "main") -> list[int]:
    """The event ids the agent's index matches for the word `query`, in id order, on a
    connection of its own (SQLite: FTS5's MATCH; PostgreSQL: the tsquery of the store)."""
    if storage is None:
        from index_probe import agent_db, match

        return match(agent_db(state_dir, agent), query)
    import psycopg

    from activememory.storage.fts_query import plan_match
    from activememory.storage.pg.terms import pg_query

    plan = plan_match(query)
    found = None if plan is None else pg_query(plan)
    if found is None:
        return []
    with psycopg.connect(storage) as conn:
        rows = conn.execute(
            "SELECT event_id FROM activememory.message_index WHERE agent = %s"
            " AND terms @@ %s::tsquery ORDER BY event_id",
            (agent, found.match),
        )
        return [int(row[0]) for row in rows]
