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

from .db import (
    SCHEMA,
    PgSettings,
    connect,
    open_pool,
    reopen_connection,
    reopen_from_pool,
    translate_errors,
)
from .transcripts import PgTranscriptReader, PgTranscriptWriter

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

T = TypeVar("T")


class PgStore:
    """The open PostgreSQL store of one `open_memory`: settings, the readers' pool."""

    def __init__(
        self,
        settings: PgSettings,
        pool: psycopg_pool.ConnectionPool[psycopg.Connection[tuple[object, ...]]],
    ) -> None:
        self.settings = settings
        self.pool = pool
        self._reopen = reopen_from_pool(pool)

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

    def agents(self) -> list[str]:
        """Every agent with a session in the store, sorted."""
        with translate_errors("listing the agents"), self.pool.connection() as conn:
            rows = conn.execute(f"SELECT DISTINCT agent FROM {SCHEMA}.sessions ORDER BY agent")
            return [str(row[0]) for row in rows]

    def close(self) -> None:
        """Close the pool (every reader has given its connection back)."""
        self.pool.close()
