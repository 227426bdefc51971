"""WAL checkpoints on a thread of their own, off the writer's commits (docs/design.md §1.3).

SQLite's own autocheckpoint runs inside the commit that takes the WAL past 1,000 pages: that
commit copies the WAL into the database file (and syncs both) while every caller of its
batch waits for the ack; a closed-loop writer spent about a quarter of its time there. Here
the writer's WAL hook only signals a thread with a connection of its own once `PAGES` frames
are not yet copied, and the thread runs a PASSIVE checkpoint (it never blocks the writer or
readers). SQLite restarts the WAL at a write only once a checkpoint has copied all of it,
and a busy writer keeps adding frames while the thread copies: so at `BEHIND` x `PAGES` the
writer copies what is left itself, as SQLite's hook would (little, the thread did the rest),
and the WAL starts over. The same step keeps the WAL bounded if the thread fails.

Only with a writer thread (`actors/group_commit.py` starts and stops it as jobs of that
thread, before its first batch and after its last): with the inline executor (virtual time)
no thread may run, and SQLite's autocheckpoint stays.
"""

from __future__ import annotations

import contextlib
import threading

import apsw

from .db import describe

# SQLite's default autocheckpoint threshold, in WAL pages.
PAGES = 1000
# The writer checkpoints inline once the WAL holds this many times `PAGES`.
BEHIND = 4


class Checkpointer:
    """The checkpoint thread of one writer connection. `start` and `stop` run on the
    writer's thread (they use its connection) and never raise."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pages = PAGES
        self.checkpoints = 0  # PASSIVE checkpoints the thread ran
        self.inline = 0  # checkpoints the writer ran itself (the thread was behind)
        self.longest = 0  # the most pages the WAL held after a commit
        self.last_error: str | None = None
        self.synchronous: int | None = None  # the writer's: the checkpoints sync as it does
        self._due = threading.Event()
        self._lock = threading.Lock()  # one checkpoint at a time: the thread's or the writer's
        self._copied = 0  # frames of the WAL the thread's last checkpoint had copied
        self._stopping = False
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    @property
    def started(self) -> bool:
        """Whether `start` hooked a writer (an SQLite WAL database): the counters mean
        something."""
        return self.synchronous is not None

    @property
    def alive(self) -> bool:
        """Whether the thread is checkpointing now (False once it ended: stopped, or its
        connection failed, when the writer checkpoints alone at `BEHIND` x `PAGES`)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self, writer: object) -> None:
        """Hook `writer`'s commits and start the thread; nothing for a connection that is not
        SQLite's or keeps no WAL (in memory, another journal mode)."""
        try:
            if not isinstance(writer, apsw.Connection) or not writer.filename:
                return
            if writer.pragma("journal_mode") != "wal":
                return
            # A checkpoint syncs by its own connection's setting: the writer's durability.
            synchronous = int(writer.pragma("synchronous"))
            # Opened here, on the writer's thread before its first batch: setting a pragma
            # reads the schema, and a read marks the WAL index (the -shm) — done later on
            # the thread, that touched the files of a store that had gone quiet.
            conn = apsw.Connection(writer.filename, flags=apsw.SQLITE_OPEN_READWRITE)
        except apsw.Error as exc:  # no hook installed: SQLite's own autocheckpoint stays
            self.last_error = describe(exc)
            return
        try:
            conn.pragma("synchronous", synchronous)
            writer.set_wal_hook(self._committed)
        except apsw.Error as exc:
            self.last_error = describe(exc)
            conn.close()
            return
        self.synchronous = synchronous
        self._thread = threading.Thread(
            target=self._serve, args=(conn,), name=self.name, daemon=True
        )
        self._thread.start()

    def stop(self, writer: object) -> None:
        """After the writer's last commit: SQLite's own autocheckpoint back on `writer`, and
        the thread ended once a checkpoint it is running is done."""
        if self._thread is None:
            return
        assert isinstance(writer, apsw.Connection)
        with contextlib.suppress(apsw.Error):
            writer.wal_autocheckpoint(PAGES)
        self._stopping = True
        self._due.set()
        self._thread.join()
        self._thread = None

    def _committed(self, writer: apsw.Connection, dbname: str, pages: int) -> int:
        # SQLite's WAL hook, on the writer's thread after each commit; `pages` is the WAL's
        # length. A checkpoint here is what SQLite's own hook does, and is allowed.
        self.longest = max(self.longest, pages)
        if pages >= BEHIND * self.pages:
            # The writer's commits keep the thread a little behind, and SQLite restarts the
            # WAL only once a checkpoint has copied all of it: copy the rest here, after
            # the thread's checkpoint in progress (a PASSIVE one would find it busy).
            with self._lock, contextlib.suppress(apsw.Error):  # as SQLite's hook: the commit stands
                writer.wal_checkpoint(dbname, apsw.SQLITE_CHECKPOINT_PASSIVE)
                self.inline += 1
        elif pages - (self._copied if pages >= self._copied else 0) >= self.pages:
            self._due.set()
        return apsw.SQLITE_OK

    def _serve(self, conn: apsw.Connection) -> None:
        try:
            while True:
                self._due.wait()
                if self._stopping:
                    return
                self._due.clear()
                try:
                    with self._lock:
                        _frames, self._copied = conn.wal_checkpoint(
                            mode=apsw.SQLITE_CHECKPOINT_PASSIVE
                        )
                    self.checkpoints += 1
                except apsw.BusyError:
                    pass  # another checkpoint is running; the next commit signals again
                except apsw.Error as exc:  # the writer steps in at BEHIND x PAGES
                    self.last_error = describe(exc)
        finally:
            conn.close()
