"""The PostgreSQL store as `open_memory(storage=...)` opens it (docs/design.md §11 "Wiring").

One `PgStore` per open memory: its settings and the connection pool its readers share. Each
open agent gets a writer of its own (`writer`: a dedicated connection, reconnected after a
loss) that the supervisor runs in the same group-commit actor as an SQLite writer; its reads
take a connection from the pool for the length of one read (`read`). Everything here blocks:
it runs on the storage executor's worker threads, as apsw does for SQLite.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ...protocol.errors import StorageError
from .db import (
    SCHEMA,
    PgSettings,
    connect,
    lost,
    open_pool,
    reopen_connection,
    reopen_from_pool,
    translate_errors,
)
from .lease import Leases
from .records import PgRecordReader, PgRecordWriter
from .transcripts import PgTranscriptReader, PgTranscriptWriter

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

T = TypeVar("T")

RECORDS_TENANT = ":records"
"""The tenant (`agent` column) of the scoped records an `open_memory` keeps on PostgreSQL
(docs/design.md §11 "Records"): one for the whole store, as `records.db` is one file for
every agent of a state directory, so every process opening the DSN shares the records. Not
an agent id (the colon), so it never names an agent's rows; row-level security binds a
worker to it as to an agent: `grant_agent(role, ':records')`."""


class PgStore:
    """The open PostgreSQL store of one `open_memory`: settings, the readers' pool, and the
    leases this process holds (`leases`: the embedder actors', docs/design.md §11 "One
    embedder per agent"; their connection opens at the first claim)."""

    def __init__(
        self,
        settings: PgSettings,
        pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[object, ...]]],
    ) -> None:
        self.settings = settings
        self.pool = pool
        self._reopen = reopen_from_pool(pool)
        self.leases = Leases(settings)

    @classmethod
    def open(cls, settings: PgSettings) -> PgStore:
        """Connect, make or check the schema (one transaction: nothing half-created) and
        fill the pool to `pool_min`; `StorageError` naming `storage.dsn` otherwise."""
        return cls(settings, open_pool(settings))

    def writer(self, agent: str) -> PgTranscriptWriter:
        """A writer of `agent` on a connection of its own (not the pool's: it is held for
        as long as the agent is open), replaced after a loss (`reopen_connection`)."""
        return PgTranscriptWriter(
            connect(self.settings), agent, reopen=reopen_connection(self.settings)
        )

    def read(self, agent: str, fn: Callable[[PgTranscriptReader], T]) -> T:
        """Run `fn` with a reader of `agent` on a connection of the pool, given back after;
        psycopg errors become `StorageError` (`reading agent ...: <the server's answer>`)."""
        what = f"reading agent {agent!r}"
        with translate_errors(what):
            conn = self.pool.getconn()
        reader = PgTranscriptReader(conn, agent, reopen=self._reopen)
        try:
            with translate_errors(what):
                return fn(reader)
        finally:
            # ValueError: `reopen` already gave this (lost) connection back.
            with contextlib.suppress(ValueError):
                self.pool.putconn(reader.conn)

    def record_writer(self) -> PgRecordWriter:
        """The records writer (`RECORDS_TENANT`) on a connection of its own, replaced
        after a loss (`reopen_connection`), as an agent's writer is."""
        return PgRecordWriter(
            connect(self.settings), RECORDS_TENANT, reopen=reopen_connection(self.settings)
        )

    def read_records(self, fn: Callable[[PgRecordReader], T]) -> T:
        """Run `fn` with a records reader (`RECORDS_TENANT`) on a connection of the pool,
        given back after; errors become `StorageError` (`reading the records: <the
        server's answer>`). A read whose connection turns out lost (it died while idle in
        the pool) runs once more on a new one: a read changes nothing."""
        what = "reading the records"
        with translate_errors(what):
            conn = self.pool.getconn()
        try:
            try:
                with translate_errors(what):
                    return fn(PgRecordReader(conn, RECORDS_TENANT))
            except StorageError:
                if not lost(conn):
                    raise
            conn = self._reopen(conn)
            with translate_errors(what):
                return fn(PgRecordReader(conn, RECORDS_TENANT))
        finally:
            # ValueError: `reopen` already gave this (lost) connection back.
            with contextlib.suppress(ValueError):
                self.pool.putconn(conn)

    def agents(self) -> list[str]:
        """Every agent with a session in the store, sorted."""
        with translate_errors("listing the agents"), self.pool.connection() as conn:
            rows = conn.execute(f"SELECT DISTINCT agent FROM {SCHEMA}.sessions ORDER BY agent")
            return [str(row[0]) for row in rows]

    def close(self) -> None:
        """Close the pool (every reader has given its connection back) and the leases'
        connection (the server releases them: another process takes them over)."""
        try:
            self.leases.close()
        finally:
            self.pool.close()
