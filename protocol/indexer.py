"""The indexer dialog: commands to the single writer of an agent database, and its acks.

Sent by the `Sessions` facade (and later the reconciler), received by
`activememory.actors.indexer`. Every command is acknowledged exactly once, after the
transaction holding it has committed (or with `Rejected` when it changed nothing).
"""

from __future__ import annotations

import re
from typing import Literal, TypeAlias

import msgspec

from .config import PrivateScope
from .content import Message
from .recall import SessionSwitches, TraceMode
from .session_key import SessionKey
from .transcript import Event, ImportEntry
from .userdata import AgentErasure


class _Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    key: SessionKey


class CreateSession(_Command, tag="create", frozen=True, kw_only=True):
    """Facade → indexer: create a session with its metadata (no-op if it exists)."""

    persistent: bool = True
    interactive: bool = True
    sandboxed: bool = False
    spawned_by: str | None = None
    at: float


class AppendMessage(_Command, tag="append", frozen=True, kw_only=True):
    """Facade → indexer: append a message at the session's leaf (creating the session)."""

    message: Message
    at: float


class RewindSession(_Command, tag="rewind", frozen=True, kw_only=True):
    """Facade → indexer: move the session's leaf back to an earlier event; marks it dirty."""

    to_event_id: int
    at: float


class DeleteSession(_Command, tag="delete", frozen=True, kw_only=True):
    """Facade → indexer: delete the session, its events and its index rows in one go."""


class ArchiveSession(_Command, tag="archive", frozen=True, kw_only=True):
    """Facade → indexer: set or clear the session's archived flag."""

    archived: bool = True
    at: float


class ImportTranscript(_Command, tag="import", frozen=True, kw_only=True):
    """Importer → indexer: store pre-existing rows unindexed; the session is marked dirty.

    A session that already has messages is refused, unless `resume` and it already holds
    exactly these entries first (docs/design.md §2.5): then nothing is written and the ack
    says `skipped`.
    """

    entries: tuple[ImportEntry, ...]
    leaf_id: str | None = None
    persistent: bool = True
    interactive: bool = True
    # The entry ids are event ids to keep (an export, docs/design.md §2.6): kept when
    # every one is a free positive integer, else the session gets fresh ids as usual.
    keep_ids: bool = False

    resume: bool = False
    at: float


class RebuildIndex(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="rebuild"):
    """Facade → indexer: rebuild the index rows of dirty sessions (all, or one)."""

    key: SessionKey | None = None


class MarkDirty(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="mark_dirty"):
    """Facade → indexer: have the reconciler rebuild sessions (`reindex`, docs/design.md §2.4).

    One session (`key`), or every session of the agent database (`key` None), whose index
    rows are then all removed at once, so a damaged index is rebuilt from nothing. The
    sessions are dirty (hidden from search) and lose their vectors in this transaction.
    """

    agent: str
    key: SessionKey | None = None


class ReindexChunk(_Command, tag="reindex", frozen=True, kw_only=True):
    """Reconciler → indexer: index the next rows of a dirty session's active branch.

    Applied only if the session's revision is still `revision` (the fence): otherwise the
    session changed while it was being rebuilt and the ack says `stale`. The first chunk
    (`after_depth == 0`) first drops every index row the session has. The chunk that
    reaches the leaf publishes the session clean, in the same transaction.
    """

    revision: int
    after_depth: int
    max_rows: int


class SetSwitches(_Command, tag="switches", frozen=True, kw_only=True):
    """Commands → indexer: change a session's slash-command switches (None: unchanged).

    The session need not exist yet: a switch set before the first message applies to it.
    """

    active_memory: bool | None = None
    verbose: bool | None = None
    trace: TraceMode | None = None


# A memory note's path inside the agent workspace (docs/design.md §4.7): `MEMORY.md` or
# `memory/<name>.md`, one level only, no hidden files, no separators or control characters.
NOTE_PATH = re.compile(r"MEMORY\.md|memory/[^./\\\x00-\x1f\x7f][^/\\\x00-\x1f\x7f]*\.md")


class NoteChunk(msgspec.Struct, frozen=True, kw_only=True):
    """One indexed piece of a memory note: 1-based inclusive lines, its text, its heading.

    `heading` is the trail of headings above the chunk (indexed as low-weight context);
    None when the chunk starts with its own heading or has none above it.
    """

    start_line: int
    end_line: int
    text: str
    heading: str | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.start_line <= self.end_line:
            raise ValueError(f"lines {self.start_line}-{self.end_line} are not 1-based and ordered")


class NoteFile(msgspec.Struct, frozen=True, kw_only=True):
    """A memory note as last read: its stat, its content digest and its chunks.

    `chunks` None means the content is unchanged (same `digest` as indexed): only the stat
    is updated, so a touched file is not read again by the next scan.
    """

    path: str
    mtime_ns: int
    size: int
    digest: str
    chunks: tuple[NoteChunk, ...] | None = None

    def __post_init__(self) -> None:
        if NOTE_PATH.fullmatch(self.path) is None:
            raise ValueError(f"path: {self.path!r} is not MEMORY.md or memory/<name>.md")


class SyncNotes(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="sync_notes"):
    """Memory core → indexer: mirror the agent workspace's memory notes (docs/design.md §4.7).

    In one transaction: each of `files` replaces its chunks (or only its stat), each of
    `removed` loses its chunks and its file row. Not a session command: the database is
    the agent's, so `agent` (for messages and logs) stands where others have a `key`.
    """

    agent: str
    files: tuple[NoteFile, ...] = ()
    removed: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        paths = [f.path for f in self.files] + list(self.removed)
        if len(set(paths)) != len(paths):
            raise ValueError("a note path appears twice in files/removed")
        for path in self.removed:
            if NOTE_PATH.fullmatch(path) is None:
                raise ValueError(f"removed: {path!r} is not MEMORY.md or memory/<name>.md")


class VectorRow(msgspec.Struct, frozen=True, kw_only=True):
    """One embedded text: the message's event id or the note chunk's id, the sha256 of the
    text that was embedded, and its vector (float32, little-endian)."""

    id: int
    digest: bytes
    vector: bytes


class StoreVectors(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="store_vectors"):
    """Embedder actor → indexer: store vectors of the embedder `name` (docs/design.md §2.3).

    A message's vector is stored only if, in the applying transaction, its event is on the
    active branch of a clean session and its text still has `digest`; a chunk's only if it
    still exists with that text. Anything else changed meanwhile and is skipped. Every
    vector also goes to the content-hash cache. Not a session command, like `SyncNotes`.
    """

    agent: str
    name: str
    messages: tuple[VectorRow, ...] = ()
    notes: tuple[VectorRow, ...] = ()

    def __post_init__(self) -> None:
        sizes = {len(row.vector) for row in self.messages + self.notes}
        if len(sizes) > 1 or any(size == 0 or size % 4 for size in sizes):
            raise ValueError("vectors: expected float32 vectors of one dimension")


class EraseIdentity(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="erase"):
    """Facade (`mem.erase_identity`) → indexer: erase an identity's data (docs/design.md §2.6).

    In one transaction: every session `sessions` selects and every session they spawned
    (events, active branch, index rows, vectors, switches), the switch rows of its keys
    that have no session, and the cached vectors of its texts no other row uses; the index
    is merged so no deleted term stays in it. After the commit the writer rewrites the
    file (VACUUM) and truncates the WAL, so the text is off the disk. Not a session
    command, like `SyncNotes`.
    """

    agent: str
    sessions: PrivateScope


IndexerCommand: TypeAlias = (
    CreateSession
    | AppendMessage
    | RewindSession
    | DeleteSession
    | ArchiveSession
    | ImportTranscript
    | RebuildIndex
    | MarkDirty
    | ReindexChunk
    | SetSwitches
    | SyncNotes
    | StoreVectors
    | EraseIdentity
)


class _Ack(msgspec.Struct, frozen=True, kw_only=True, tag_field="ack"):
    pass


class Created(_Ack, tag="created", frozen=True, kw_only=True):
    """Indexer → facade: the session exists (`created` is False if it already did)."""

    session_id: int
    created: bool


class Appended(_Ack, tag="appended", frozen=True, kw_only=True):
    """Indexer → facade: the message is committed (and indexed unless the session is dirty)."""

    event: Event
    indexed: bool


class Rewound(_Ack, tag="rewound", frozen=True, kw_only=True):
    """Indexer → facade: the leaf moved; the session is dirty until rebuilt."""

    leaf_event_id: int


class Deleted(_Ack, tag="deleted", frozen=True, kw_only=True):
    """Indexer → facade: the session and its index rows are gone."""

    events: int
    index_rows: int


class Archived(_Ack, tag="archived", frozen=True, kw_only=True):
    """Indexer → facade: the archived flag is set as asked."""

    archived: bool


class Imported(_Ack, tag="imported", frozen=True, kw_only=True):
    """Indexer → importer: the rows are stored; the session is dirty until rebuilt.

    `skipped`: a resumed import found the entries already stored; nothing was written.
    """

    session_id: int
    events: int
    skipped: bool = False


class Rebuilt(_Ack, tag="rebuilt", frozen=True, kw_only=True):
    """Indexer → facade: these sessions were rebuilt and are clean."""

    sessions: int
    index_rows: int


class MarkedDirty(_Ack, tag="marked_dirty", frozen=True, kw_only=True):
    """Indexer → facade: `sessions` are dirty, for the reconciler to rebuild."""

    sessions: int


class Reindexed(_Ack, tag="reindexed", frozen=True, kw_only=True):
    """Indexer → reconciler: a chunk's outcome.

    `stale`: the fence failed, nothing was written, start the session over. Otherwise
    `rows` index rows were written and the session is clean if `clean`, else the next chunk
    starts after `next_depth`.
    """

    stale: bool = False
    rows: int = 0
    next_depth: int = 0
    clean: bool = False


class SwitchesSet(_Ack, tag="switches_set", frozen=True, kw_only=True):
    """Indexer → commands: the session's switches as committed."""

    switches: SessionSwitches


class NotesSynced(_Ack, tag="notes_synced", frozen=True, kw_only=True):
    """Indexer → memory core: the notes are mirrored.

    `files` rows written (stat-only updates included), `removed` files dropped, `chunks`
    chunks inserted.
    """

    files: int
    removed: int
    chunks: int


class VectorsStored(_Ack, tag="vectors_stored", frozen=True, kw_only=True):
    """Indexer → embedder actor: `messages` and `notes` vectors stored; `skipped` rows had
    changed since they were read (off the branch, dirty, deleted, new text)."""

    messages: int
    notes: int
    skipped: int


class Erased(_Ack, tag="erased", frozen=True, kw_only=True):
    """Indexer → facade: what the erase removed, and whether the purge finished."""

    erasure: AgentErasure


RejectReason: TypeAlias = Literal["not_found", "invalid", "storage", "closed"]


class Rejected(_Ack, tag="rejected", frozen=True, kw_only=True):
    """Indexer → facade: the command changed nothing; `message` says why."""

    reason: RejectReason
    message: str


IndexerAck: TypeAlias = (
    Created
    | Appended
    | Rewound
    | Deleted
    | Archived
    | Imported
    | Rebuilt
    | MarkedDirty
    | Reindexed
    | SwitchesSet
    | NotesSynced
    | VectorsStored
    | Erased
    | Rejected
)
