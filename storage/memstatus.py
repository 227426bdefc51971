"""SQLite's memory statistics, off in this process when that is safe (docs/design.md §1.3).

SQLite's memory statistics (SQLITE_CONFIG_MEMSTATUS, on in apsw's build) take one
process-wide mutex around every allocation: with an agent's readers searching side by side,
that mutex is where they meet. It can only be changed while SQLite is shut down, so it is
turned off once, before the first connection of ours, and only if no apsw connection is open
in the process at all (a host's own would be torn down). `MEMSTATUS_ENV=on` keeps it on;
then `apsw.memory_used()` and SQLite's soft heap limit work, which need it.
"""

from __future__ import annotations

import os
import threading

import apsw

from ..protocol.errors import InvalidInputError

MEMSTATUS_ENV = "ACTIVEMEMORY_SQLITE_MEMSTATUS"
_lock = threading.Lock()
_memstatus: bool | None = None  # None: not decided yet in this process


def sqlite_memory_statistics() -> bool:
    """Whether SQLite keeps memory statistics in this process: decided (and, when it can
    be, turned off) at the first call, before any connection of ours opens."""
    global _memstatus
    with _lock:
        if _memstatus is None:
            wanted = os.environ.get(MEMSTATUS_ENV, "off").strip().lower()
            if wanted not in ("on", "off"):
                raise InvalidInputError(f"{MEMSTATUS_ENV}: expected 'on' or 'off', got {wanted!r}")
            _memstatus = True
            if wanted == "off" and not apsw.connections():
                apsw.shutdown()
                try:
                    apsw.config(apsw.SQLITE_CONFIG_MEMSTATUS, 0)
                    _memstatus = False
                finally:
                    apsw.initialize()
        return _memstatus
