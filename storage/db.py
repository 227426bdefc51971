"""Opening agent databases: apsw best practice, schema migrations, errors users can read."""

from __future__ import annotations

import contextlib
import fcntl
import os
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal, TypeAlias

import apsw
import apsw.bestpractice

from ..protocol.errors import InvalidInputError, StorageError
from .fts_query import RANK, TOKENIZE
from .memstatus import sqlite_memory_statistics

# Each entry migrates from version i to i + 1; `PRAGMA user_version` holds the version.
Migration = Callable[[apsw.Connection], None]

BUSY_TIMEOUT_MS = 5000


def _v1_transcripts(conn: apsw.Connection) -> None:
    conn.execute(
        """
        CREATE TABLE sessions(
            id INTEGER PRIMARY KEY,
            key TEXT NOT NULL UNIQUE,
            agent TEXT,
            chat_type TEXT NOT NULL
                CHECK (chat_type IN ('direct', 'group', 'channel', 'explicit', 'unknown')),
            conversation_id TEXT,
            thread_id TEXT,
            persistent INTEGER NOT NULL DEFAULT 1,
            interactive INTEGER NOT NULL DEFAULT 1,
            archived INTEGER NOT NULL DEFAULT 0,
            sandboxed INTEGER NOT NULL DEFAULT 0,
            spawned_by TEXT,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            leaf_event_id INTEGER,
            leaf_depth INTEGER NOT NULL DEFAULT 0,
            next_seq INTEGER NOT NULL DEFAULT 1,
            -- bumped by every change to the session: the reconciler's fence
            revision INTEGER NOT NULL DEFAULT 0,
            -- the index does not match the active branch; hidden from search until rebuilt
            dirty INTEGER NOT NULL DEFAULT 0,
            -- index watermark: the last seq whose effect the index reflects
            indexed_seq INTEGER NOT NULL DEFAULT 0
        ) STRICT;
        CREATE INDEX sessions_spawned_by ON sessions(spawned_by) WHERE spawned_by IS NOT NULL;
        CREATE INDEX sessions_dirty ON sessions(id) WHERE dirty;

        CREATE TABLE events(
            id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL REFERENCES sessions(id),
            parent_id INTEGER REFERENCES events(id),
            seq INTEGER NOT NULL,
            depth INTEGER NOT NULL,
            ts REAL NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('message', 'rewind')),
            role TEXT CHECK (role IN ('user', 'assistant', 'tool')),
            content BLOB,
            -- the indexable text (user/assistant text blocks), NULL for everything else
            text TEXT,
            UNIQUE (session_id, seq)
        ) STRICT;

        -- the active branch projection: root (depth 1) to leaf, one row per message
        CREATE TABLE active_branch(
            session_id INTEGER NOT NULL,
            depth INTEGER NOT NULL,
            event_id INTEGER NOT NULL,
            PRIMARY KEY (session_id, depth)
        ) STRICT, WITHOUT ROWID;

        -- rowid = events.id. Contentless: the text lives in events.text, and snippets are
        -- cut from redacted text in Python, never by FTS5 from raw text.
        CREATE VIRTUAL TABLE message_fts USING fts5(
            text, content='', contentless_delete=1,
            tokenize='unicode61 remove_diacritics 2'
        );
        """
    )


def _v2_context_and_cjk(conn: apsw.Connection) -> None:
    # Three columns (storage/fts_query.py): `words` for everything but CJK, `grams` for CJK
    # bigrams, `context` for the previous message's words at a lower weight; Porter
    # stemming. Old rows cannot be converted in SQL, so every session with messages is
    # marked dirty and the reconciler rebuilds it.
    conn.execute(
        f"""
        DROP TABLE message_fts;
        CREATE VIRTUAL TABLE message_fts USING fts5(
            words, grams, context, content='', contentless_delete=1, tokenize='{TOKENIZE}'
        );
        INSERT INTO message_fts(message_fts, rank) VALUES ('rank', '{RANK}');
        UPDATE sessions SET dirty = 1, revision = revision + 1, indexed_seq = 0
            WHERE leaf_event_id IS NOT NULL;
        """
    )


def _v3_session_switches(conn: apsw.Connection) -> None:
    # Keyed by session key, not id: a switch may be set before the session's first message.
    conn.execute(
        """
        CREATE TABLE session_switches(
            key TEXT PRIMARY KEY,
            active_memory INTEGER NOT NULL DEFAULT 1,
            verbose INTEGER NOT NULL DEFAULT 0,
            trace TEXT NOT NULL DEFAULT 'off' CHECK (trace IN ('off', 'on', 'raw'))
        ) STRICT, WITHOUT ROWID;
        """
    )


def _v4_memory_notes(conn: apsw.Connection) -> None:
    # The index of the workspace's memory notes (storage/notes.py): the stat and digest of
    # each file (so an unchanged file is never read again), its chunks, and an FTS table
    # with the same tokenizer and columns as `message_fts` (`context`: the chunk's heading).
    conn.execute(
        f"""
        CREATE TABLE note_files(
            path TEXT PRIMARY KEY,
            mtime_ns INTEGER NOT NULL,
            size INTEGER NOT NULL,
            digest TEXT NOT NULL
        ) STRICT, WITHOUT ROWID;
        CREATE TABLE note_chunks(
            id INTEGER PRIMARY KEY,
            path TEXT NOT NULL,
            start_line INTEGER NOT NULL,
            end_line INTEGER NOT NULL,
            text TEXT NOT NULL
        ) STRICT;
        CREATE INDEX note_chunks_path ON note_chunks(path);
        CREATE VIRTUAL TABLE note_fts USING fts5(
            words, grams, context, content='', contentless_delete=1, tokenize='{TOKENIZE}'
        );
        INSERT INTO note_fts(note_fts, rank) VALUES ('rank', '{RANK}');
        """
    )


def _v5_vectors(conn: apsw.Connection) -> None:
    # Vectors for recall by meaning (storage/vectors.py, docs/design.md §2.3): one per
    # indexed message of a clean session and per note chunk, each of one embedder `name`;
    # rowid tables (a 1.5 KB vector fits in the row; a WITHOUT ROWID row that size spills
    # to an overflow page), a scope read through (session, name). `vector_cache`
    # keeps every vector by (sha256 of its text, name): rebuilds and re-imports reuse them.
    conn.execute(
        """
        CREATE TABLE message_vectors(
            event_id INTEGER PRIMARY KEY,
            session_id INTEGER NOT NULL,
            name TEXT NOT NULL,
            vector BLOB NOT NULL
        ) STRICT;
        CREATE INDEX message_vectors_scope ON message_vectors(session_id, name);
        CREATE TABLE note_vectors(
            chunk_id INTEGER PRIMARY KEY,
            name TEXT NOT NULL,
            vector BLOB NOT NULL
        ) STRICT;
        -- bumped when old messages may need vectors again (a session turns clean, one is
        -- deleted): the embedder actor then scans from the first message, else only new ones
        CREATE TABLE vector_epoch(
            id INTEGER PRIMARY KEY CHECK (id = 1),
            epoch INTEGER NOT NULL
        ) STRICT;
        INSERT INTO vector_epoch(id, epoch) VALUES (1, 0);
        CREATE TABLE vector_cache(
            digest BLOB NOT NULL,
            name TEXT NOT NULL,
            vector BLOB NOT NULL,
            PRIMARY KEY (digest, name)
        ) STRICT, WITHOUT ROWID;
        """
    )


def _v6_event_parents(conn: apsw.Connection) -> None:
    # `events.parent_id` references `events(id)` and foreign keys are on: without an index
    # on the child column, deleting a session checks every remaining event for each event
    # it deletes (1.5-2.3 s for 100 events at 100k; an erase likewise).
    conn.execute("CREATE INDEX events_parent ON events(parent_id)")


MIGRATIONS: tuple[Migration, ...] = (
    _v1_transcripts,
    _v2_context_and_cjk,
    _v3_session_switches,
    _v4_memory_notes,
    _v5_vectors,
    _v6_event_parents,
)
SCHEMA_VERSION = len(MIGRATIONS)


Durability: TypeAlias = Literal["crash", "power"]
DURABILITY_LEVELS: tuple[Durability, ...] = ("crash", "power")
# "crash": an acknowledged write survives the process dying at any moment (kill -9): WAL
# with synchronous=NORMAL, no fsync per commit. "power": it also survives power loss or an
# OS crash: synchronous=FULL, an fsync per commit.
_SYNCHRONOUS: dict[Durability, str] = {"crash": "NORMAL", "power": "FULL"}


def configure(
    conn: apsw.Connection, durability: Durability = "crash", *, readonly: bool = False
) -> None:
    """Apply apsw's best practices to one of our connections.

    Applied per connection rather than through `apsw.bestpractice.apply()`, which would
    change every apsw connection of the host process too. A read-only connection skips
    what writes (the journal mode, `PRAGMA optimize`) and refuses every write itself
    (`query_only`).
    """
    # First: `PRAGMA optimize` below may need a lock, and another writer may hold it.
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    if not readonly:
        apsw.bestpractice.connection_wal(conn)
    apsw.bestpractice.connection_enable_foreign_keys(conn)
    apsw.bestpractice.connection_dqs(conn)
    apsw.bestpractice.connection_recursive_triggers(conn)
    if readonly:
        conn.pragma("query_only", True)
        return
    optimize(conn)
    conn.pragma("synchronous", _SYNCHRONOUS[durability])


# FTS5's shadow tables (`<name>_data`, `_idx`, `_config`, `_docsize`): FTS5 reads them by key
# alone, so their statistics can only mislead the planner (docs/design.md §1.3).
_FTS_SHADOW_STATS = (
    "DELETE FROM sqlite_stat1 WHERE tbl GLOB '*_fts_data' OR tbl GLOB '*_fts_idx'"
    " OR tbl GLOB '*_fts_config' OR tbl GLOB '*_fts_docsize'"
)


def optimize(conn: apsw.Connection) -> None:
    """`PRAGMA optimize(0x10002)` (apsw's best practice at open), less FTS5's shadow tables.

    Analysed just after the schema was made, `message_fts_data` counts 2 rows; the planner
    trusts that for the life of the process, and every commit's segment merge cost 40% more
    CPU. The statistics go in the same transaction as the analysis, which other connections
    see at once (a new schema cookie); `ANALYZE sqlite_schema` reloads this one's.
    """
    if conn.readonly("main"):
        return
    try:
        with conn:
            apsw.bestpractice.connection_optimize(conn)
            stats = conn.execute(
                "SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = 'sqlite_stat1'"
            ).fetchone()
            if stats is not None:
                conn.execute(_FTS_SHADOW_STATS)
                if conn.changes():
                    conn.execute("ANALYZE sqlite_schema")
    except apsw.ReadOnlyError:  # the journal or the directory may still be read-only
        pass


def migrate(conn: apsw.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> int:
    """Bring the schema forward to the newest version; return that version."""
    version = int(conn.pragma("user_version"))
    if version > len(migrations):
        raise StorageError(
            f"{conn.filename}: schema version {version} is newer than this activememory "
            f"understands ({len(migrations)}); upgrade activememory"
        )
    for target, step in enumerate(migrations[version:], start=version + 1):
        with conn:
            step(conn)
            conn.pragma("user_version", target)
    return len(migrations)


def check_schema(conn: apsw.Connection, migrations: tuple[Migration, ...] = MIGRATIONS) -> None:
    """A read-only open's stand-in for `migrate`: the schema must be this code's, since a
    reader may not migrate it (docs/design.md §1.6)."""
    version = int(conn.pragma("user_version"))
    if version < len(migrations):
        raise StorageError(
            f"{conn.filename}: schema version {version} is older than this activememory's "
            f"({len(migrations)}) and readonly=True never migrates; open it once without "
            "readonly (or with the activememory that wrote it)"
        )
    if version > len(migrations):
        raise StorageError(
            f"{conn.filename}: schema version {version} is newer than this activememory "
            f"understands ({len(migrations)}); upgrade activememory"
        )


def readonly_error(state_dir: Path) -> StorageError:
    """The one wording of a write asked of a read-only memory (docs/design.md §1.6)."""
    return StorageError(
        f"readonly: {str(state_dir)!r} was opened with open_memory(readonly=True), which "
        "never writes; open it without readonly=True to write (one writer per state directory)"
    )


def _writable_dir(directory: Path) -> bool:
    """Whether `directory` may be written: by us, and by its permission bits (a copy made
    read-only with `chmod a-w` counts as read-only even for root, who could write it)."""
    return os.access(directory, os.W_OK) and bool(directory.stat().st_mode & 0o222)


def readonly_uri(path: Path) -> str:
    """The SQLite URI that reads `path` without writing anything (docs/design.md §1.6).

    - a `-shm` file exists (a writer has the database open, or this is a copy of one that
      did): `mode=ro&readonly_shm=1`, which reads the WAL's committed pages through the
      existing shared-memory index and never writes it;
    - no `-wal` file: every committed page is in the main file. In a writable directory
      `mode=ro` (SQLite makes the empty `-wal`/`-shm` any WAL reader needs, so a writer
      that starts later is seen safely); in a read-only one `immutable=1`, which creates
      nothing (no writer can start there either);
    - a `-wal` without its `-shm` in a read-only directory cannot be read without writing:
      a `StorageError` says so (copy the `-shm` file too, or checkpoint the original).
    """
    wal = path.with_name(path.name + "-wal")
    shm = path.with_name(path.name + "-shm")
    quoted = "file:" + urllib.parse.quote(str(path.resolve()))
    if shm.exists():
        return quoted + "?mode=ro&readonly_shm=1"
    writable = _writable_dir(path.parent)
    if writable:
        return quoted + "?mode=ro"
    if not wal.exists() or wal.stat().st_size == 0:
        return quoted + "?immutable=1"
    raise StorageError(
        f"cannot open {str(path)!r} read-only: its write-ahead log has no {shm.name!r} "
        "beside it and the directory is read-only; copy the -shm file too"
    )


def ensure_state_dir(state_dir: Path) -> Path:
    """Create `state_dir` if missing; raise a clear error if it cannot be a state directory."""
    if state_dir.exists() and not state_dir.is_dir():
        raise InvalidInputError(f"state_dir: {str(state_dir)!r} exists and is not a directory")
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StorageError(
            f"state_dir: cannot create {str(state_dir)!r} ({exc.strerror})"
        ) from None
    return state_dir


class WriterLock:
    """An exclusive lock on an agent database: one writer process per state directory.

    The OS drops it when the process dies, so a crash never leaves a stale lock.
    """

    def __init__(self, db_path: Path) -> None:
        self.path = db_path.with_name(db_path.name + ".lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StorageError(f"cannot open {str(self.path)!r} ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StorageError(
                f"{str(self.path.parent)!r} is already open for writing by another "
                "open_memory() (one writer per state directory)"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def open_connection(
    path: Path,
    *,
    writer: bool,
    durability: Durability = "crash",
    migrations: tuple[Migration, ...] = MIGRATIONS,
    reader_cache_kib: int | None = None,
    readonly: bool = False,
) -> apsw.Connection:
    """Open and configure one database (an agent's unless `migrations` say otherwise); the
    writer also creates and migrates it, a reader keeps up to `reader_cache_kib` of pages.

    The directory must exist (the supervisor creates it before taking the writer lock).
    `readonly` (a reader of `open_memory(readonly=True)`): opened through `readonly_uri`,
    the schema checked, never migrated; a database that does not exist reads as an empty
    one (a migrated in-memory database), and nothing is created on disk.
    """
    sqlite_memory_statistics()
    try:
        if readonly and not path.exists():
            conn = apsw.Connection(":memory:")
            migrate(conn, migrations)
        elif readonly:
            flags = apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI
            conn = apsw.Connection(readonly_uri(path), flags=flags)
        else:
            flags = apsw.SQLITE_OPEN_READWRITE | (apsw.SQLITE_OPEN_CREATE if writer else 0)
            conn = apsw.Connection(str(path), flags=flags)
    except apsw.Error as exc:
        raise StorageError(f"cannot open {str(path)!r} ({describe(exc)})") from None
    try:
        with translate_errors(path):
            configure(conn, durability, readonly=readonly)
            if writer:
                migrate(conn, migrations)
            elif readonly:
                check_schema(conn, migrations)
            if not writer and reader_cache_kib is not None:
                conn.pragma("cache_size", -reader_cache_kib)
    except BaseException:
        conn.close()
        raise
    return conn


def describe(exc: apsw.Error) -> str:
    """A short, readable reason for a SQLite error."""
    match exc:
        case apsw.FullError():
            return "disk full or database size limit reached"
        case apsw.ReadOnlyError():
            return "the database or its directory is read-only"
        case apsw.BusyError() | apsw.LockedError():
            return "the database is locked by another writer"
        case apsw.CantOpenError():
            return "cannot open the database file (missing directory or no permission)"
        case apsw.CorruptError() | apsw.NotADBError():
            return "the file is not a valid SQLite database or is corrupt"
        case _:
            return str(exc)


@contextlib.contextmanager
def translate_errors(path: Path) -> Iterator[None]:
    """Re-raise SQLite errors as `StorageError` naming the database."""
    try:
        yield
    except apsw.Error as exc:
        raise StorageError(f"{str(path)!r}: {describe(exc)}") from exc
