"""What the transcript store hands back: events on a session's tree and session metadata."""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

from .content import Message, check_timestamp
from .session_key import ChatType

EventKind: TypeAlias = Literal["message", "rewind"]


class Event(msgspec.Struct, frozen=True, kw_only=True):
    """One stored event of a session's tree (docs/design.md §2.2).

    `parent_id` is the event it follows (None for a root); `seq` counts the session's events
    in write order. Rewind events are leaf controls: they are stored, but never part of the
    active branch that `history` returns.
    """

    id: int
    session_key: str
    parent_id: int | None
    seq: int
    timestamp: float
    kind: EventKind = "message"
    message: Message | None = None

    @property
    def role(self) -> str | None:
        """The message role, or None for a control event."""
        return self.message.role if self.message else None


class SessionInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A session's metadata (docs/design.md §2.1) and its index state."""

    key: str
    session_id: int
    agent: str | None
    chat_type: ChatType
    conversation_id: str | None
    thread_id: str | None
    persistent: bool
    interactive: bool
    archived: bool
    sandboxed: bool
    spawned_by: str | None
    created_at: float
    updated_at: float
    leaf_event_id: int | None
    revision: int
    dirty: bool
    indexed_seq: int

    @property
    def unknown(self) -> bool:
        """Too little metadata to classify: never eligible for recall."""
        return self.chat_type == "unknown" or self.agent is None


class IndexStats(msgspec.Struct, frozen=True, kw_only=True):
    """Counts describing one agent database, its full-text index and its vectors.

    `vectors_pending`: indexed messages and note chunks still waiting for a vector of the
    configured `embedder` (None: no embedder, no vectors); `embedder_error`: why its last
    attempt failed (None once one succeeds); `embedder_lease`: on PostgreSQL, whether this
    process holds the agent's embedder lease, so its embedder actor is the one making the
    vectors (docs/design.md §11 "One embedder per agent"; None on SQLite or without an
    embedder). A process without the lease still counts every row waiting.
    """

    agent: str
    sessions: int
    events: int
    active_messages: int
    indexed_messages: int
    dirty_sessions: int
    db_bytes: int
    fts_integrity_ok: bool
    vectors_pending: int = 0
    embedder: str | None = None
    embedder_error: str | None = None
    embedder_lease: bool | None = None


ImportEntryId: TypeAlias = str


class ImportEntry(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One message of a transcript written before indexing existed (JSONL import).

    `source` says where the entry was read from (`file.jsonl:12`); errors about the entry
    name it instead of its position in the list. `timestamp`: epoch seconds in
    `MAX_TIMESTAMP`'s range, else `InvalidInputError`.
    """

    id: ImportEntryId
    parent_id: ImportEntryId | None
    timestamp: float
    message: Message
    source: str | None = None

    def __post_init__(self) -> None:
        where = "ImportEntry.timestamp" if self.source is None else f"{self.source}: timestamp"
        check_timestamp(where, self.timestamp)
