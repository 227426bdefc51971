"""The indexer: the single writer of one agent database (docs/design.md §1.2, §2.3).

A group commit (actors/group_commit.py) of `IndexerCommand`s (protocol/indexer.py), applied
by a `TranscriptWriter`; a command still queued at close is answered `Rejected("closed")`.
"""

from __future__ import annotations

from ..protocol.indexer import IndexerAck, IndexerCommand, Rejected
from .group_commit import GroupCommit


class Indexer(GroupCommit[IndexerCommand, IndexerAck]):
    """Owns the write connection of one agent database; applies commands in batches."""

    def rejected(self, message: str) -> IndexerAck:
        return Rejected(reason="closed", message=message)
