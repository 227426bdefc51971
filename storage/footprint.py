"""What a store costs: the process's resident memory and a database's bytes on disk.

Read by `mem.doctor()` and `activememory bench indexing` (docs/design.md §1.4): the bytes
of an agent database split into the full-text index (the FTS5 tables), the content (the
`events` table and its indexes), the vectors, and the rest, from SQLite's `dbstat` table.
"""

from __future__ import annotations

import os
import resource
import sys
from typing import cast

import apsw
import msgspec

# The tables whose b-trees (and their indexes') make up each part of an agent database.
_PARTS = {"index": ("message_fts_",), "content": ("events",), "vectors": ("message_vectors",)}


def resident_bytes() -> int:
    """The process's resident set size now; where that cannot be read (not Linux), its
    peak so far."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes there, KiB here


class DiskUsage(msgspec.Struct, frozen=True, kw_only=True):
    """The bytes of one agent database by part; `other` holds the sessions, the active
    branches, notes, free pages and the schema. `messages`: stored message events. The
    parts are None when this SQLite has no `dbstat` table (then only `total` is known)."""

    total: int
    index: int | None
    content: int | None
    vectors: int | None
    other: int | None
    messages: int

    def per_message(self, part: int | None) -> float | None:
        """`part`'s bytes per stored message; None for an empty database or no part."""
        return None if part is None or not self.messages else part / self.messages


def disk_usage(conn: apsw.Connection) -> DiskUsage:
    """The bytes of the agent database `conn` reads, by part (a scan of every page)."""
    total = _number(conn, "PRAGMA page_size") * _number(conn, "PRAGMA page_count")
    messages = _number(conn, "SELECT count(*) FROM events WHERE kind = 'message'")
    try:
        sizes = conn.execute("SELECT name, sum(pgsize) FROM dbstat GROUP BY name").fetchall()
    except apsw.SQLError:  # built without SQLITE_ENABLE_DBSTAT_VTAB: the page count alone
        return DiskUsage(
            total=total, index=None, content=None, vectors=None, other=None, messages=messages
        )
    table_of = {str(n): str(t) for n, t in conn.execute("SELECT name, tbl_name FROM sqlite_schema")}
    parts = dict.fromkeys(_PARTS, 0)
    for name, size in cast(list[tuple[str, int]], sizes):
        table = table_of.get(name, name)
        for part, prefixes in _PARTS.items():
            if table.startswith(prefixes):
                parts[part] += size
    return DiskUsage(total=total, other=total - sum(parts.values()), messages=messages, **parts)


def _number(conn: apsw.Connection, sql: str) -> int:
    (value,) = conn.execute(sql).fetchone() or (0,)
    return cast(int, value)
