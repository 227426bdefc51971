"""A user's data (docs/design.md §2.6): what an erase of one identity removed, or would remove.

`AgentErasure` is counted by the indexer of one agent database (in the erasing transaction,
or on the reader for a dry run), `RecordErasure` by the records keeper; `ErasureSummary` is
what `mem.erase_identity` returns.
"""

from __future__ import annotations

import msgspec

NOT_COVERED = (
    "not covered: the memory notes (MEMORY.md, memory/*.md) that mention the identity, "
    "group and channel conversations (their messages name no user), and kept recall "
    "transcripts (persistTranscripts)"
)
"""What an export or an erase of an identity leaves alone, in the words both print."""


class AgentErasure(msgspec.Struct, frozen=True, kw_only=True):
    """What one agent database holds (or held) of an identity.

    `session_keys`: its sessions (their events, index rows and vectors go with them);
    `switches`: slash-command switch rows of its keys; `cached_vectors`: content-hash cache
    entries of its texts that no remaining message or note uses. `purged`: the freed
    pages were rewritten and the WAL truncated (docs/design.md §2.6); `problem` says why
    not, when the erase committed but the purge did not finish. A dry run purges nothing.
    """

    agent: str
    session_keys: tuple[str, ...] = ()
    events: int = 0
    index_rows: int = 0
    vectors: int = 0
    cached_vectors: int = 0
    switches: int = 0
    purged: bool = False
    problem: str | None = None


class RecordErasure(msgspec.Struct, frozen=True, kw_only=True):
    """What `records.db` holds (or held) of an identity: the records whose user scope
    resolves to it, and every relation touching one of them. `purged`, `problem`: as for
    `AgentErasure`."""

    user_ids: tuple[str, ...] = ()
    records: int = 0
    relations: int = 0
    purged: bool = False
    problem: str | None = None


class ErasureSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What `mem.erase_identity(identity)` removed (`dry_run` False) or would remove.

    One `AgentErasure` per agent database (each erased in one transaction), the records,
    and `not_covered`: what the erase leaves alone.
    """

    identity: str
    dry_run: bool
    agents: tuple[AgentErasure, ...]
    records: RecordErasure
    not_covered: str = NOT_COVERED

    @property
    def sessions(self) -> int:
        """How many sessions, over every agent database."""
        return sum(len(a.session_keys) for a in self.agents)

    @property
    def purged(self) -> bool:
        """Every database that lost rows was purged (False for a dry run)."""
        touched = [a.purged for a in self.agents if a.session_keys or a.switches]
        if self.records.records:
            touched.append(self.records.purged)
        return not self.dry_run and all(touched)
