"""The records keeper: the single writer of `state_dir/records.db` (docs/design.md §1.2, §5).

A group commit (actors/group_commit.py) of `RecordCommand`s (protocol/records.py), applied
by a `RecordWriter`; a command still queued at close is answered `RecordRejected("closed")`.
"""

from __future__ import annotations

from ..protocol.records import RecordAck, RecordCommand, RecordRejected
from .group_commit import GroupCommit


class RecordKeeper(GroupCommit[RecordCommand, RecordAck]):
    """Owns the write connection of `records.db`; applies commands in batches."""

    def rejected(self, message: str) -> RecordAck:
        return RecordRejected(reason="closed", message=message)
