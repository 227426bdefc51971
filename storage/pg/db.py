"""Connecting to PostgreSQL and creating the store's schema (docs/design.md §11).

psycopg is imported here and in the other modules of this package only: the embedded
SQLite store never needs it (it is the `postgres` extra).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, TypeAlias

import msgspec

from ...protocol.errors import InvalidInputError, StorageError

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

# Given the connection a writer or reader lost (server restarted, backend terminated),
# a live one in its place; `StorageError` when the server cannot be reached yet.
Reopen: TypeAlias = Callable[["psycopg.Connection[Any]"], "psycopg.Connection[Any]"]

# Every table lives in this schema, so none can clash with a host's own `sessions`.
SCHEMA = "activememory"
# The extensions the schema needs: btree_gin lets the GIN index of the terms be keyed by
# agent first (docs/design.md §11). A module constant so a test can ask for a missing one.
EXTENSIONS: tuple[str, ...] = ("btree_gin",)
CONNECT_TIMEOUT_S = 5
# A read-only store's connections: the server refuses every write in them, whatever the
# code asks (docs/design.md §11 "Read-only").
READ_ONLY_OPTION = "-c default_transaction_read_only=on"
# Any two processes creating the schema at once: the second waits, then finds it made.
_SCHEMA_LOCK = 0x616D_7367  # "amsg"

# Made before any step: it records which steps ran.
_META_DDL = f"""
CREATE SCHEMA {SCHEMA};
CREATE TABLE {SCHEMA}.activememory_meta(
    key text PRIMARY KEY,
    value text NOT NULL
);
"""
_DDL = f"""
-- Event ids are unique per agent (the primary key) and drawn from one sequence, so they
-- grow with each session's seq whichever process appends (docs/design.md §11).
CREATE SEQUENCE {SCHEMA}.event_ids;
CREATE TABLE {SCHEMA}.sessions(
    agent text NOT NULL,
    id bigint NOT NULL,
    key text NOT NULL,
    key_agent text,
    chat_type text NOT NULL
        CHECK (chat_type IN ('direct', 'group', 'channel', 'explicit', 'unknown')),
    conversation_id text,
    thread_id text,
    persistent boolean NOT NULL DEFAULT true,
    interactive boolean NOT NULL DEFAULT true,
    archived boolean NOT NULL DEFAULT false,
    sandboxed boolean NOT NULL DEFAULT false,
    spawned_by text,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    leaf_event_id bigint,
    leaf_depth integer NOT NULL DEFAULT 0,
    next_seq bigint NOT NULL DEFAULT 1,
    revision bigint NOT NULL DEFAULT 0,
    dirty boolean NOT NULL DEFAULT false,
    indexed_seq bigint NOT NULL DEFAULT 0,
    -- the session's index rows and their tokens: BM25's N and average length, summed
    -- over the agent's sessions, rows every writer already holds locked
    index_rows bigint NOT NULL DEFAULT 0,
    index_tokens bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, id),
    UNIQUE (agent, key)
);
CREATE INDEX sessions_spawned_by ON {SCHEMA}.sessions(agent, spawned_by)
    WHERE spawned_by IS NOT NULL;
CREATE INDEX sessions_dirty ON {SCHEMA}.sessions(agent, id) WHERE dirty;
CREATE TABLE {SCHEMA}.events(
    agent text NOT NULL,
    id bigint NOT NULL,
    session_id bigint NOT NULL,
    parent_id bigint,
    seq bigint NOT NULL,
    depth integer NOT NULL,
    ts double precision NOT NULL,
    kind text NOT NULL CHECK (kind IN ('message', 'rewind')),
    role text CHECK (role IN ('user', 'assistant', 'tool')),
    content bytea,
    -- the indexable text as UTF-8 (bytea: text cannot hold NUL), NULL for everything else
    text bytea,
    PRIMARY KEY (agent, id),
    UNIQUE (agent, session_id, seq),
    FOREIGN KEY (agent, session_id) REFERENCES {SCHEMA}.sessions(agent, id),
    FOREIGN KEY (agent, parent_id) REFERENCES {SCHEMA}.events(agent, id)
);
CREATE INDEX events_parent ON {SCHEMA}.events(agent, parent_id);
CREATE TABLE {SCHEMA}.active_branch(
    agent text NOT NULL,
    session_id bigint NOT NULL,
    depth integer NOT NULL,
    event_id bigint NOT NULL,
    PRIMARY KEY (agent, session_id, depth)
);
-- One row per indexed message (storage/pg/terms.py): `terms` holds the SQLite index's own
-- tokens, the message's words and CJK bigrams weighted A, the context weighted B.
CREATE TABLE {SCHEMA}.message_index(
    agent text NOT NULL,
    event_id bigint NOT NULL,
    session_id bigint NOT NULL,
    depth integer NOT NULL,
    tokens integer NOT NULL,
    terms tsvector NOT NULL,
    PRIMARY KEY (agent, event_id)
);
CREATE INDEX message_index_terms ON {SCHEMA}.message_index USING gin (agent, terms);
CREATE INDEX message_index_session ON {SCHEMA}.message_index(agent, session_id);
CREATE TABLE {SCHEMA}.session_switches(
    agent text NOT NULL,
    key text NOT NULL,
    active_memory boolean NOT NULL DEFAULT true,
    "verbose" boolean NOT NULL DEFAULT false,
    trace text NOT NULL DEFAULT 'off' CHECK (trace IN ('off', 'on', 'raw')),
    PRIMARY KEY (agent, key)
);
"""


# Row-level security (docs/design.md §11 "Row-level security"): a worker role sees and
# writes only the agents `grant_agent` bound it to; the owner that created the schema (and
# superusers) bypass it. Created in the schema's own transaction, after every table.
_ROW_SECURITY_DDL = f"""
CREATE TABLE {SCHEMA}.agent_roles(
    role name NOT NULL,
    agent text NOT NULL,
    PRIMARY KEY (role, agent)
);
-- A worker reads its own bindings (the policies below ask them), never another's.
ALTER TABLE {SCHEMA}.agent_roles ENABLE ROW LEVEL SECURITY;
CREATE POLICY own_bindings ON {SCHEMA}.agent_roles FOR SELECT USING (role = current_user);
-- Every table of the schema with an `agent` column, whoever added it (records, vectors...).
CREATE FUNCTION {SCHEMA}.agent_tables() RETURNS SETOF regclass LANGUAGE sql STABLE AS $$
    SELECT c.oid::regclass FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attname = 'agent'
        AND NOT a.attisdropped
    WHERE n.nspname = '{SCHEMA}' AND c.relkind IN ('r', 'p') AND c.relname <> 'agent_roles'
    ORDER BY c.relname
$$;
-- The privileges a bound worker needs: its rows are then cut down by the policies.
CREATE FUNCTION {SCHEMA}.grant_tables(worker name) RETURNS void LANGUAGE plpgsql AS $$
DECLARE t regclass;
BEGIN
    EXECUTE format('GRANT USAGE ON SCHEMA {SCHEMA} TO %I', worker);
    EXECUTE format('GRANT SELECT ON {SCHEMA}.activememory_meta, {SCHEMA}.agent_roles TO %I',
                   worker);
    -- nextval for event ids; setval when an import keeps its ids (docs/design.md §2.6)
    EXECUTE format('GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {SCHEMA} TO %I',
                   worker);
    FOR t IN SELECT * FROM {SCHEMA}.agent_tables() LOOP
        EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %I', t, worker);
    END LOOP;
END $$;
-- Idempotent: a schema version that adds a table calls it again.
CREATE FUNCTION {SCHEMA}.secure_agent_tables() RETURNS void LANGUAGE plpgsql AS $$
DECLARE t regclass; worker name;
BEGIN
    FOR t IN SELECT * FROM {SCHEMA}.agent_tables() LOOP
        EXECUTE format('ALTER TABLE %s ENABLE ROW LEVEL SECURITY', t);
        EXECUTE format('DROP POLICY IF EXISTS bound_agents ON %s', t);
        EXECUTE format(
            'CREATE POLICY bound_agents ON %s'
            ' USING (agent IN (SELECT g.agent FROM {SCHEMA}.agent_roles g'
            '  WHERE g.role = current_user))'
            ' WITH CHECK (agent IN (SELECT g.agent FROM {SCHEMA}.agent_roles g'
            '  WHERE g.role = current_user))', t);
    END LOOP;
    FOR worker IN SELECT DISTINCT role FROM {SCHEMA}.agent_roles LOOP
        PERFORM {SCHEMA}.grant_tables(worker);
    END LOOP;
END $$;
-- Bind `worker` to `agent_id`: it may then read and write that agent's rows, and no other's.
CREATE FUNCTION {SCHEMA}.grant_agent(worker name, agent_id text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE bypasses boolean;
BEGIN
    IF agent_id IS NULL OR agent_id = '' THEN
        RAISE EXCEPTION 'grant_agent: agent: expected an agent id, got %', quote_nullable(agent_id);
    END IF;
    SELECT r.rolsuper OR r.rolbypassrls OR pg_has_role(r.oid, c.relowner, 'USAGE')
      INTO bypasses FROM pg_catalog.pg_roles r, pg_catalog.pg_class c
     WHERE r.rolname = worker AND c.oid = '{SCHEMA}.agent_roles'::regclass;
    IF bypasses IS NULL THEN
        RAISE EXCEPTION 'grant_agent: role: no role %', quote_ident(worker);
    ELSIF bypasses THEN
        RAISE EXCEPTION 'grant_agent: role: % bypasses row-level security (a superuser, '
            'BYPASSRLS or the schema''s owner): it would see every agent', quote_ident(worker);
    END IF;
    INSERT INTO {SCHEMA}.agent_roles(role, agent) VALUES (worker, agent_id)
        ON CONFLICT DO NOTHING;
    PERFORM {SCHEMA}.grant_tables(worker);
END $$;
-- Unbind `worker` from `agent_id`, or from every agent when it is NULL; a role left with no
-- agent loses its privileges too (then DROP ROLE needs nothing else from this schema).
CREATE FUNCTION {SCHEMA}.revoke_agent(worker name, agent_id text DEFAULT NULL) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {SCHEMA}.agent_roles g
     WHERE g.role = worker AND (agent_id IS NULL OR g.agent = agent_id);
    IF NOT EXISTS (SELECT 1 FROM {SCHEMA}.agent_roles g WHERE g.role = worker)
       AND EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = worker) THEN
        EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA {SCHEMA} FROM %I', worker);
        EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA {SCHEMA} FROM %I', worker);
        EXECUTE format('REVOKE ALL ON SCHEMA {SCHEMA} FROM %I', worker);
    END IF;
END $$;
REVOKE ALL ON FUNCTION {SCHEMA}.grant_tables(name), {SCHEMA}.secure_agent_tables(),
    {SCHEMA}.grant_agent(name, text), {SCHEMA}.revoke_agent(name, text) FROM PUBLIC;
"""


def _row_security_ddl() -> str:
    """Row-level security on every table of the schema with an `agent` column, and the
    functions an owner binds worker roles to agents with (docs/design.md §11). A later step
    that adds a table ends with `SELECT activememory.secure_agent_tables()` again."""
    return _ROW_SECURITY_DDL + f"SELECT {SCHEMA}.secure_agent_tables();\n"


def _transcripts_ddl() -> str:
    return _DDL


def _records_ddl() -> str:
    from .records import records_ddl  # psycopg and the records stack: only when creating

    return records_ddl()


def _notes_vectors_ddl() -> str:
    # Memory notes and vectors (storage/pg/notes.py, storage/pg/vectors.py), then row
    # security again: it covers the new tables and grants them to the bound roles.
    from .notes import notes_ddl
    from .vectors import vectors_ddl

    return notes_ddl() + vectors_ddl() + f"SELECT {SCHEMA}.secure_agent_tables();\n"


def _record_vectors_ddl() -> str:
    # Vectors of scoped records (storage/pg/record_vectors.py), then row security again.
    from .record_vectors import record_vectors_ddl

    return record_vectors_ddl() + f"SELECT {SCHEMA}.secure_agent_tables();\n"


def _pgvector_ddl() -> str:
    # pgvector's columns, backfill and index function when the store chose it
    # (storage/pg/vectors.py `pgvector_ddl`; the choice is `choose_vector_search`'s).
    from .vectors import pgvector_ddl

    return pgvector_ddl()


# Each full-text index's pending list, in kB (PostgreSQL's least; its default is 4 MB). A
# GIN index first appends new rows to a pending list, which every search of the index then
# reads whole, every row of it (the `agent` key of each matches), until an insert finds it
# over this limit and merges it into the index (or VACUUM does). With autovacuum slow or
# off a list of up to 4 MB cost each term lookup up to ~20 ms: the searches' tail; at
# 64 kB a lookup reads at most 8 pages, and an insert costs ~60 µs more a row
# (docs/design.md §11 "Latency").
GIN_PENDING_LIST_KB = 64
_TERMS_INDEXES = ("message_index_terms", "records_terms", "note_chunks_terms")


def _gin_pending_ddl() -> str:
    """The full-text indexes' pending lists bounded (`GIN_PENDING_LIST_KB`), and what a
    store made before holds in them merged now."""
    return "".join(
        f"ALTER INDEX {SCHEMA}.{index} SET (gin_pending_list_limit = {GIN_PENDING_LIST_KB});\n"
        f"SELECT gin_clean_pending_list('{SCHEMA}.{index}'::regclass);\n"
        for index in _TERMS_INDEXES
    )


def _drop_bm25_function_ddl() -> str:
    """A store made before kept BM25 also as an SQL function, which no query called (the
    searches write it into the query: storage/pg/search.py `bm25_sql`, the one definition)
    and which counted a phrase once per message, unlike FTS5."""
    return (
        f"DROP FUNCTION IF EXISTS {SCHEMA}.bm25(tsvector, integer, text[], boolean[],"
        " tsquery[], double precision[], double precision);\n"
    )


# The schema's steps (SQL text, each run once, in order, in one transaction): a store at
# version v lacks STEPS[v:]. A new table or index is a new step at the end.
# Row security comes after the tables it covers.
STEPS: tuple[Callable[[], str], ...] = (
    _transcripts_ddl,
    _records_ddl,
    _row_security_ddl,
    _notes_vectors_ddl,
    _record_vectors_ddl,
    _pgvector_ddl,
    _gin_pending_ddl,
    _drop_bm25_function_ddl,
)
SCHEMA_VERSION = len(STEPS)

# How a store scores vectors (docs/design.md §11 "Vectors with pgvector"), recorded once in
# `activememory_meta` under this key when the pgvector step runs, so every worker of the
# database takes the same path: "pgvector" (a `vector` column beside the bytes, ranked in
# SQL) or "exact" (the bytes alone, ranked by numpy).
VECTOR_SEARCH_KEY = "vector_search"
PGVECTOR_CHOICES = ("auto", "on", "off")


class PgSettings(msgspec.Struct, frozen=True, kw_only=True):
    """Where the PostgreSQL store is and how many connections it keeps.

    `dsn`: a libpq connection string (`postgresql://user@host/db` or `host=... dbname=...`);
    `pool_min`/`pool_max`: the connection pool's bounds. Bad values raise
    `InvalidInputError` naming the config key (`storage.dsn`, `storage.poolMin`,
    `storage.poolMax`); the password is never shown. `readonly` (`open_memory(readonly=
    True)`, docs/design.md §11 "Read-only"): every connection's transactions are read-only
    (`READ_ONLY_OPTION`), and the schema is checked, never created or migrated.
    `pgvector` (`storage.pgvector`: auto, on, off): whether a store being created uses the
    pgvector extension (`choose_vector_search`); an existing store keeps its choice.
    """

    dsn: str
    pool_min: int = 1
    pool_max: int = 4
    readonly: bool = False
    pgvector: str = "auto"

    def __post_init__(self) -> None:
        check_dsn(self.dsn)
        if self.pgvector not in PGVECTOR_CHOICES:
            raise InvalidInputError(
                f"storage.pgvector: expected auto, on or off, got {self.pgvector!r}"
            )
        for name, value in (("poolMin", self.pool_min), ("poolMax", self.pool_max)):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 256:
                raise InvalidInputError(
                    f"storage.{name}: expected an integer from 1 to 256, got {value!r}"
                )
        if self.pool_min > self.pool_max:
            raise InvalidInputError(
                f"storage.poolMin: {self.pool_min} is more than storage.poolMax ({self.pool_max})"
            )


_PASSWORD_IN_URL = re.compile(r"(://[^:/@]*:)[^@]*@")
_PASSWORD_KEYWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def masked(dsn: str) -> str:
    """`dsn` with its password replaced by `***`, for error messages and logs."""
    return _PASSWORD_KEYWORD.sub(r"\1***", _PASSWORD_IN_URL.sub(r"\1***@", dsn))


def check_dsn(dsn: object) -> str:
    """`dsn` if libpq can parse it; else `InvalidInputError` naming `storage.dsn`."""
    import psycopg.conninfo

    if not isinstance(dsn, str) or not dsn.strip():
        raise InvalidInputError(
            f"storage.dsn: expected a PostgreSQL connection string, got {dsn!r}"
        )
    if "://" in dsn and not dsn.startswith(("postgresql://", "postgres://")):
        raise InvalidInputError(f"storage.dsn: expected postgresql://..., got {masked(dsn)!r}")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise InvalidInputError(
            f"storage.dsn: {masked(dsn)!r} is not a connection string ({_first_line(exc)})"
        ) from None
    return dsn


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def describe(exc: BaseException) -> str:
    """The server's (or libpq's) own answer, one line, for a `StorageError`."""
    return _first_line(exc)


def connection_options(settings: PgSettings) -> dict[str, Any]:
    """The libpq parameters every connection of the store gets besides its DSN (a direct
    one and the pool's): the timeout and, read-only, `READ_ONLY_OPTION` added to the DSN's
    own `options`."""
    import psycopg.conninfo

    options: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}
    if settings.readonly:
        given = psycopg.conninfo.conninfo_to_dict(settings.dsn).get("options")
        options["options"] = f"{given} {READ_ONLY_OPTION}" if given else READ_ONLY_OPTION
    return options


def connect(settings: PgSettings) -> psycopg.Connection[tuple[object, ...]]:
    """One connection to the server, with the schema made or checked (read-only: checked
    alone, `check_schema`); `StorageError` quoting the server's answer when it cannot be
    reached or used."""
    import psycopg

    try:
        conn = psycopg.connect(settings.dsn, **connection_options(settings))
    except psycopg.Error as exc:
        raise StorageError(
            f"storage.dsn: cannot connect to {masked(settings.dsn)!r}: {describe(exc)}"
        ) from None
    try:
        if settings.readonly:
            check_schema(conn, pgvector=settings.pgvector)
        else:
            ensure_schema(conn, pgvector=settings.pgvector)
    except BaseException:
        conn.close()
        raise
    return conn


def open_pool(
    settings: PgSettings,
) -> psycopg_pool.ConnectionPool[psycopg.Connection[tuple[object, ...]]]:
    """A connection pool for the store: the schema is made or checked first, on one
    connection, so a bad server fails here with its answer, not in the pool's retries."""
    import psycopg_pool

    connect(settings).close()
    pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[object, ...]]] = (
        psycopg_pool.ConnectionPool(
            settings.dsn,
            min_size=settings.pool_min,
            max_size=settings.pool_max,
            kwargs=connection_options(settings),
            open=False,
        )
    )
    try:
        pool.open(wait=True, timeout=CONNECT_TIMEOUT_S * 2)
    except psycopg_pool.PoolTimeout:
        pool.close()
        raise StorageError(
            f"storage.dsn: {masked(settings.dsn)!r} did not give the pool "
            f"{settings.pool_min} connection(s) in {CONNECT_TIMEOUT_S * 2} s"
        ) from None
    return pool


def lost(conn: psycopg.Connection[Any]) -> bool:
    """Whether `conn` can no longer run a transaction: closed, broken, or left stuck by a
    failure mid-pipeline (a backend terminated during `executemany` leaves psycopg's
    pipeline aborted and the connection not marked broken; every later query then fails
    with "PQsendQuery not allowed in pipeline mode"). A caller holding a `Reopen`
    replaces such a connection; one that does not closes it."""
    from psycopg import pq

    if conn.closed or conn.broken:
        return True
    return conn.pgconn.pipeline_status != pq.PipelineStatus.OFF


def reopen_connection(settings: PgSettings) -> Reopen:
    """A `Reopen` that closes the lost connection and connects again (`connect`)."""

    def reopen(lost: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        lost.close()
        return connect(settings)

    return reopen


def reopen_from_pool(
    pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[object, ...]]],
    *,
    timeout: float = CONNECT_TIMEOUT_S,
) -> Reopen:
    """A `Reopen` that gives the lost connection back to `pool` (which discards a broken
    one and opens another in the background) and waits up to `timeout` s for a live one.
    While the server is down, the pool's own reconnection rules apply (psycopg_pool's
    `reconnect_timeout`)."""
    import psycopg

    def reopen(lost: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        # ValueError: given back already, by an earlier attempt that found no live one
        with suppress(ValueError):
            pool.putconn(lost)
        try:
            return pool.getconn(timeout=timeout)
        except psycopg.Error as exc:  # PoolTimeout, PoolClosed
            raise StorageError(
                f"storage.dsn: no live connection from the pool: {describe(exc)}"
            ) from None

    return reopen


def schema_version(conn: psycopg.Connection[tuple[object, ...]]) -> int | None:
    """The store's schema version, or None when the schema does not exist yet."""
    row = conn.execute(
        "SELECT to_regclass(%s) IS NOT NULL", (f"{SCHEMA}.activememory_meta",)
    ).fetchone()
    if row is None or not row[0]:
        return None
    found = conn.execute(
        f"SELECT value FROM {SCHEMA}.activememory_meta WHERE key = 'schema_version'"
    ).fetchone()
    return None if found is None else int(str(found[0]))


def ensure_schema(conn: psycopg.Connection[tuple[object, ...]], *, pgvector: str = "auto") -> int:
    """Create the schema if it is missing, in one transaction (nothing is half-created);
    refuse a schema newer than this code, or a `pgvector` setting the store's recorded
    choice contradicts (`check_vector_search`). Returns the version."""
    import psycopg

    try:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
            version = schema_version(conn)
            if version is None:
                for name in EXTENSIONS:
                    conn.execute(f'CREATE EXTENSION IF NOT EXISTS "{name}"')
                conn.execute(_META_DDL.encode())
                conn.execute(
                    f"INSERT INTO {SCHEMA}.activememory_meta(key, value)"
                    " VALUES ('schema_version', '0')"
                )
                version = 0
            if version < SCHEMA_VERSION:
                if _pgvector_ddl in STEPS[version:]:  # the choice is made now, once
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.activememory_meta(key, value) VALUES (%s, %s)",
                        (VECTOR_SEARCH_KEY, choose_vector_search(conn, pgvector)),
                    )
                # The steps this store lacks, in order, in this one transaction.
                for step in STEPS[version:]:
                    conn.execute(step().encode())
                conn.execute(
                    f"UPDATE {SCHEMA}.activememory_meta SET value = %s"
                    " WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION),),
                )
                version = SCHEMA_VERSION
            recorded = _recorded_vector_search(conn) if version <= SCHEMA_VERSION else None
    except psycopg.Error as exc:
        raise StorageError(
            f"storage.dsn: cannot create the activememory schema: {describe(exc)}"
        ) from None
    _refuse_newer(version)
    check_vector_search(recorded, pgvector)
    return version


def choose_vector_search(conn: psycopg.Connection[tuple[object, ...]], pgvector: str) -> str:
    """How a store being created scores vectors (docs/design.md §11 "Vectors with
    pgvector"): "pgvector" when the `vector` extension is in the database already, or the
    server has it and lets this role create it (tried in a savepoint: the server decides
    who may); else "exact". `pgvector="off"` is always "exact"; `"on"` without the extension
    is a `StorageError` naming `storage.pgvector` and quoting the server's answer."""
    import psycopg

    if pgvector == "off":
        return "exact"
    row = conn.execute(
        "SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'vector'),"
        " EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'vector')"
    ).fetchone()
    installed, available = (bool(row[0]), bool(row[1])) if row else (False, False)
    if installed:
        return "pgvector"
    if not available:
        if pgvector == "on":
            raise StorageError(
                "storage.pgvector: on, but the server has no vector extension"
                " (pg_available_extensions lacks it): install pgvector there, or set"
                " storage.pgvector to auto or off"
            )
        return "exact"
    try:
        with conn.transaction():  # a savepoint: a refusal leaves the schema's transaction
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except psycopg.Error as exc:
        if pgvector == "on":
            raise StorageError(
                f"storage.pgvector: on, but the vector extension cannot be created here:"
                f" {describe(exc)} (a superuser may CREATE EXTENSION vector in this database"
                " first; or set storage.pgvector to auto or off)"
            ) from None
        return "exact"
    return "pgvector"


def _recorded_vector_search(conn: psycopg.Connection[tuple[object, ...]]) -> str | None:
    row = conn.execute(
        f"SELECT value FROM {SCHEMA}.activememory_meta WHERE key = %s", (VECTOR_SEARCH_KEY,)
    ).fetchone()
    return None if row is None else str(row[0])


def check_vector_search(recorded: str | None, pgvector: str) -> None:
    """Refuse a `storage.pgvector` that contradicts the store's recorded choice: the choice
    is made once, when the schema step runs, and every worker must take the same path."""
    if recorded == "exact" and pgvector == "on":
        raise StorageError(
            "storage.pgvector: on, but this store was created without pgvector"
            f" ({SCHEMA}.activememory_meta {VECTOR_SEARCH_KEY} = exact); the choice is made"
            " once, when the store is created: set storage.pgvector to auto, or use a new"
            " database"
        )
    if recorded == "pgvector" and pgvector == "off":
        raise StorageError(
            "storage.pgvector: off, but this store was created with pgvector"
            f" ({SCHEMA}.activememory_meta {VECTOR_SEARCH_KEY} = pgvector) and every worker"
            " must take the same path: set storage.pgvector to auto"
        )


def check_schema(conn: psycopg.Connection[tuple[object, ...]], *, pgvector: str = "auto") -> int:
    """A read-only open's stand-in for `ensure_schema` (storage/db.py `check_schema`):
    the schema must exist and be this code's, since a reader may not make or migrate it.
    Returns the version."""
    import psycopg

    try:
        with conn.transaction():
            version = schema_version(conn)
            recorded = _recorded_vector_search(conn) if version is not None else None
    except psycopg.Error as exc:
        raise StorageError(
            f"storage.dsn: cannot read the activememory schema: {describe(exc)}"
        ) from None
    database = conn.info.dbname
    if version is None:
        raise StorageError(
            f"storage.dsn: database {database!r} holds no activememory store (no schema "
            f"{SCHEMA}) and readonly=True never creates one; open it once without readonly"
        )
    if version < SCHEMA_VERSION:
        raise StorageError(
            f"storage.dsn: schema version {version} of database {database!r} is older than "
            f"this activememory's ({SCHEMA_VERSION}) and readonly=True never migrates; open it "
            "once without readonly (or with the activememory that wrote it)"
        )
    _refuse_newer(version)
    check_vector_search(recorded, pgvector)
    return version


def _refuse_newer(version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StorageError(
            f"storage.dsn: schema version {version} is newer than this activememory "
            f"understands ({SCHEMA_VERSION}); upgrade activememory"
        )


@contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Re-raise psycopg errors as `StorageError` saying what failed and the server's answer."""
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        raise StorageError(f"{what}: {describe(exc)}") from exc
