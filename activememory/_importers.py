"""Reading transcripts written before indexing existed (JSONL), for `import_transcript`.

Format, one JSON object per line:

    {"type": "session", "key": "agent:main:direct:alice"}            optional header
    {"type": "message", "id": "m1", "parentId": null, "timestamp": 1700000000.0,
     "message": {"role": "user", "content": "..."}}
    {"type": "leaf", "id": "m1"}                                     optional: the active leaf

`parentId` omitted means "the previous message line"; `timestamp` is epoch seconds or an
ISO 8601 string. Unknown fields are errors, reported with the file and line.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from .protocol.content import message_from_mapping
from .protocol.errors import InvalidInputError
from .protocol.session_key import parse_session_key
from .protocol.transcript import ImportEntry

_UNSET: Any = msgspec.UNSET


class _Header(msgspec.Struct, tag="session", tag_field="type", forbid_unknown_fields=True):
    key: str
    persistent: bool = True
    interactive: bool = True


class _MessageLine(msgspec.Struct, tag="message", tag_field="type", forbid_unknown_fields=True):
    id: str
    message: dict[str, Any]
    timestamp: float | str
    parentId: str | msgspec.UnsetType | None = _UNSET


class _LeafLine(msgspec.Struct, tag="leaf", tag_field="type", forbid_unknown_fields=True):
    id: str


_decode_line = msgspec.json.Decoder(_Header | _MessageLine | _LeafLine).decode


@dataclass(frozen=True)
class Transcript:
    """A parsed JSONL transcript, ready for `mem.sessions.import_transcript`."""

    session_key: str
    entries: tuple[ImportEntry, ...]
    leaf_id: str | None
    persistent: bool
    interactive: bool


def read_jsonl_transcript(path: Path, session_key: str | None = None) -> Transcript:
    """Parse `path`; `session_key` overrides (or stands in for) the header's key."""
    header: _Header | None = None
    entries: list[ImportEntry] = []
    leaf: str | None = None
    previous: str | None = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInputError(f"{path}: cannot read ({exc})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = _decode_line(line)
        except msgspec.DecodeError as exc:
            raise InvalidInputError(f"{where}: {exc}") from None
        match item:
            case _Header():
                if header is not None or entries:
                    raise InvalidInputError(f"{where}: the session header must be the first line")
                header = item
            case _LeafLine():
                leaf = item.id
            case _MessageLine():
                parent = previous if item.parentId is _UNSET else item.parentId
                message = message_from_mapping(item.message, where=f"{where}: message")
                entries.append(
                    ImportEntry(
                        id=item.id,
                        parent_id=parent,  # type: ignore[arg-type]
                        timestamp=_timestamp(item.timestamp, where),
                        message=message,
                    )
                )
                previous = item.id
    key = session_key or (header.key if header else None)
    if key is None:
        raise InvalidInputError(f"{path}: no session header line and no session key given")
    parse_session_key(key, field=f"{path}: session key")
    return Transcript(
        session_key=key,
        entries=tuple(entries),
        leaf_id=leaf,
        persistent=header.persistent if header else True,
        interactive=header.interactive if header else True,
    )


def _timestamp(value: float | str, where: str) -> float:
    if isinstance(value, int | float):
        return float(value)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(
            f"{where}: timestamp {value!r} is neither epoch seconds nor ISO 8601"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return parsed.timestamp()
