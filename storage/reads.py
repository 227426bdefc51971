"""What the API layer may ask of an agent's transcript reader, whatever the store
(docs/design.md §1.3, §11 "The seam").

`AgentStore.read(fn)` (actors/supervisor.py) runs `fn` with a reader of the agent's store:
a `TranscriptReader` on an SQLite connection, or a `PgTranscriptReader` on a connection of
the PostgreSQL pool. The API layer (activememory/, activememory/recall/) types its reader
functions with `TranscriptReads` and calls only these methods, so it never branches on the
store. `not_yet(feature)` is the error of a feature not on PostgreSQL yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Sequence

    import numpy

    from ..protocol.config import PrivateScope
    from ..protocol.recall import SessionSwitches
    from ..protocol.session_key import ChatType
    from ..protocol.transcript import Event, IndexStats, SessionInfo
    from ..protocol.userdata import AgentErasure
    from .footprint import DiskUsage
    from .fts_query import MatchPlan
    from .notes import NoteHit, NoteStat
    from .search import DbScope, ScopePage, TermStats
    from .userdata import SessionTree
    from .vectors import MessageRow, Near, NoteRow, PendingBatch


NOT_YET = "is not yet on PostgreSQL (docs/design.md §11)"
"""The end of every error saying a feature is not wired to the PostgreSQL store yet."""


class TranscriptReads(Protocol):
    """The reads of one agent's transcripts, each one snapshot (one read transaction)."""

    @property
    def agent(self) -> str: ...

    def session(self, key: str) -> SessionInfo | None: ...

    def sessions(self) -> list[SessionInfo]: ...

    def history(self, key: str, limit: int | None = None) -> list[Event] | None: ...

    def switches(self, key: str) -> SessionSwitches: ...

    def dirty_sessions(self, limit: int) -> list[tuple[str, int]]: ...

    def stats(
        self,
        *,
        check_integrity: bool = True,
        vector_name: str | None = None,
        vector_after: int = 0,
        vector_epoch: int | None = None,
    ) -> IndexStats: ...

    def list_sessions(
        self,
        *,
        chat_type: ChatType | None = None,
        peer: str | None = None,
        owner: PrivateScope | None = None,
        archived: bool | None = None,
    ) -> list[SessionInfo]:
        """`mem.sessions.list`'s filters (storage/userdata.py `list_sessions`)."""
        ...

    def sandboxed(self, key: str) -> bool:
        """Whether session `key` exists and is sandboxed."""
        ...

    def search_page(
        self,
        plan: MatchPlan,
        *,
        scope: DbScope,
        caller: str,
        session_key: str | None,
        keep: int,
        stats: TermStats,
    ) -> ScopePage:
        """The `keep` best visible matches of `plan` (storage/search.py `search_scope`);
        `stats` is the SQLite reader's cache of term counts (PostgreSQL counts each time)."""
        ...

    def private_message(
        self, event_id: int, key: str, caller: str, scope: PrivateScope
    ) -> tuple[str, float, str] | None:
        """(role, timestamp, text) of message `event_id` of session `key` if it is on its
        active branch and inside `caller`'s private scope (docs/design.md §4.2); else None."""
        ...

    def search_notes(self, plan: MatchPlan, keep: int) -> list[NoteHit]:
        """The `keep` best memory-note chunks (storage/notes.py `search_notes`)."""
        ...

    def note_files(self) -> dict[str, NoteStat]:
        """Every indexed note file by workspace-relative path."""
        ...

    def plan_erasure(self, scope: PrivateScope) -> AgentErasure:
        """What erasing the identity `scope` selects would remove, as the erase itself
        counts it (`mem.erase_identity(dry_run=True)`); one snapshot."""
        ...

    def session_trees(self, scope: PrivateScope | None) -> list[SessionTree]:
        """The sessions the identity `scope` selects (and those they spawned), or with None
        every session of the agent (`migrate`), oldest first, each with every message of its tree in write order and its switches
        (`mem.export_identity`); one snapshot."""
        ...

    def disk_usage(self) -> DiskUsage | None:
        """The database's bytes on disk by part; None where the store cannot tell."""
        ...

    # -- Vectors (docs/design.md §2.3, §4.7; on PostgreSQL: storage/pg/vectors.py) ---------

    def pending_vectors(
        self, name: str, *, after: int, epoch: int | None, limit: int
    ) -> PendingBatch:
        """Up to `limit` messages above the watermark `after` (under `epoch`) and note
        chunks lacking a vector of `name` (the embedder actor's feed); one snapshot."""
        ...

    def cached_vectors(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        """The content-hash cache's vectors of `name` for these text digests."""
        ...

    def nearest_messages(
        self,
        query: numpy.ndarray,
        *,
        name: str,
        scope: DbScope,
        caller: str,
        session_key: str | None,
        k: int,
    ) -> list[Near]:
        """The `k` messages nearest `query` among the clean sessions `caller` may see under
        `scope` (`scope_sql`'s rules, in SQL before `k`), best first."""
        ...

    def message_vectors(self, event_ids: Sequence[int], name: str) -> dict[int, numpy.ndarray]:
        """The stored vectors of `name` of these messages (those that have one)."""
        ...

    def message_rows(self, event_ids: Sequence[int]) -> list[MessageRow]:
        """These messages' rows (session key, time, role, text)."""
        ...

    def nearest_notes(self, query: numpy.ndarray, *, name: str, k: int) -> list[Near]:
        """The `k` note chunks nearest `query`, best first."""
        ...

    def note_vectors(self, chunk_ids: Sequence[int], name: str) -> dict[int, numpy.ndarray]:
        """The stored vectors of `name` of these note chunks (those that have one)."""
        ...

    def note_rows(self, chunk_ids: Sequence[int]) -> list[NoteRow]:
        """These note chunks' rows (path, lines, text)."""
        ...


def not_yet(feature: str) -> Any:
    """The `StorageError` of a feature not on PostgreSQL yet (raise it)."""
    from ..protocol.errors import StorageError

    return StorageError(f"{feature} {NOT_YET}")
