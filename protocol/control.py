"""Control requests (docs/design.md §1.7): the dialog between an operator's command (the
CLI's `activememory erase` finding the store held by a bot) and the control actor of the
bot holding it, through the spool files of `storage/control.py`.

Requests are decoded from files another process wrote, so unknown fields are refused and
every error names the field; the answer is always a `ControlResult`.
"""

from __future__ import annotations

import msgspec

from .userdata import ErasureSummary


class _Request(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="op", forbid_unknown_fields=True
):
    pass


class EraseRequest(_Request, tag="erase", frozen=True, kw_only=True):
    """Sent by `activememory erase --identity I` (without `--dry-run`); the bot runs
    `mem.erase_identity(identity)` through its own writers, with its own config."""

    identity: str


ControlRequest = EraseRequest  # a closed family: new requests join as a union


class ControlResult(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Written by the bot's control actor for every request it took: `erasure` when it ran,
    `error` (what was wrong, naming the field) when it did not; `served_by`: the bot's pid."""

    served_by: int
    erasure: ErasureSummary | None = None
    error: str | None = None


REQUEST_DECODER = msgspec.json.Decoder(ControlRequest)
RESULT_DECODER = msgspec.json.Decoder(ControlResult)
