"""Leases: which process of a PostgreSQL store does a job that one process should do
(docs/design.md §11 "One embedder per agent").

A lease is a session-level advisory lock (`pg_try_advisory_lock`) held on a connection of
its own (`Leases`, one per open store): never in a transaction, so it holds back no vacuum
and no other process's watermark (storage/pg/vectors.py `pending_batch`). The server
releases it when that connection ends, so a process that dies (`kill -9`, a lost host)
gives its leases up by itself and another process takes them at its next try. A lost
connection is a lost lease: every lease of it is gone, and the next `claim` connects again
and tries anew. Everything here blocks: it runs on an executor's worker thread.
"""

from __future__ import annotations

import hashlib
import threading
from typing import TYPE_CHECKING, Any

from ...protocol.errors import StorageError
from .db import PgSettings, connect, lost

if TYPE_CHECKING:
    import psycopg

PERIOD = 2.0
"""Seconds between two claims of a lease (docs/design.md §11 "One embedder per agent"): the
holder's embedder looks for rows other processes wrote this often, and a process without
the lease tries to take it this often, so a dead holder is replaced within about a period.
A module attribute, read when an agent opens: a test sets it short."""


def lease_key(job: str, tenant: str) -> int:
    """The advisory lock key (a signed bigint) of `job` for `tenant` (an agent, or the
    records' tenant). 64 bits of SHA-256: two tenants sharing a key would leave one of them
    without a holder whenever the other's holder does not open it, so not `hashtext`'s 32."""
    digest = hashlib.sha256(f"activememory:{job}:{tenant}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Leases:
    """The leases one process holds on a store, on one connection (opened at the first
    claim; autocommit, so it never sits in a transaction). Thread-safe: a claim takes the
    connection for its statement. Leases go with the connection, at `close` (the store's
    close, after every embedder actor stopped); one is given back early only by an actor
    whose embedder keeps failing (`release`)."""

    def __init__(self, settings: PgSettings) -> None:
        self._settings = settings
        self._conn: psycopg.Connection[Any] | None = None
        self._held: set[int] = set()
        self._mutex = threading.Lock()
        self._closed = False

    def claim(self, key: int) -> bool:
        """Whether this process holds lease `key` now: taken if free, checked (one round
        trip) if already held. False when another session holds it, or when the server
        cannot be reached (the lease is then lost; a later claim reconnects). Always False
        once closed: nothing reconnects then."""
        import psycopg

        with self._mutex:
            if self._closed:
                return False
            # A connection that died while idle (backend terminated, server restarted) is
            # found by the statement failing: its leases are gone; try once on a new one.
            for attempt in range(2):
                stale = self._conn is not None
                try:
                    return self._claim(key)
                except (psycopg.Error, StorageError):
                    self._drop()
                    if not stale or attempt:
                        return False
            return False

    def _claim(self, key: int) -> bool:
        conn = self._connection()
        if key in self._held:  # held for as long as the connection lives: does it?
            conn.execute("SELECT 1")
            return True
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is not None and row[0]:
            self._held.add(key)
            return True
        return False

    def release(self, key: int) -> None:
        """Give lease `key` up (`pg_advisory_unlock`), if held: another process's next
        claim can take it. A connection that fails here is dropped: its leases are gone."""
        import psycopg

        with self._mutex:
            if key not in self._held or self._conn is None:
                return
            self._held.discard(key)
            try:
                self._conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
            except psycopg.Error:
                self._drop()

    def close(self) -> None:
        """Close the connection: the server releases every lease held on it."""
        with self._mutex:
            self._closed = True
            self._drop()

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is not None and lost(self._conn):
            self._drop()  # its session ended: the server released its locks
        if self._conn is None:
            conn = connect(self._settings)
            conn.autocommit = True
            self._conn = conn
        return self._conn

    def _drop(self) -> None:
        self._held.clear()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()
