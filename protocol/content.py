"""Messages and their content blocks (docs/design.md §2.2, §2.3, §9).

Content is a string or a list of blocks. Only `user`/`assistant` text is ever indexed: the
text of a string, or of text/input_text/output_text blocks. Everything else is stored as-is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias, TypeVar, cast

import msgspec

from .errors import InvalidInputError

# Largest content of one message: a string's UTF-8 bytes, or a list of blocks as JSON (the
# quotes and escapes of a string are not counted; docs/design.md §2.2). Bigger payloads belong
# in files, not transcripts.
MAX_CONTENT_BYTES = 1_048_576

# The times a message may carry, as epoch seconds: from 1970-01-01 up to, not including,
# 10000-01-01 UTC — what a datetime, ISO 8601 and every reader of a transcript can show
# (docs/design.md §2.2). NaN, infinities and 1e300 are refused where they come in.
MAX_TIMESTAMP = 253_402_300_800
TIMESTAMP_RANGE = "epoch seconds from 0 (1970-01-01) to below 253402300800 (year 10000)"

ROLES = ("user", "assistant", "tool")
Role: TypeAlias = Literal["user", "assistant", "tool"]
INDEXED_ROLES = frozenset(("user", "assistant"))


class _Block(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    pass


class TextBlock(_Block, tag="text", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Plain text; indexed for user and assistant messages."""

    text: str


class InputTextBlock(
    _Block, tag="input_text", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Text in the Responses-API input shape; indexed like `text`."""

    text: str


class OutputTextBlock(
    _Block, tag="output_text", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """Text in the Responses-API output shape; indexed like `text`."""

    text: str


class ThinkingBlock(_Block, tag="thinking", frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A model's thinking; stored, never indexed."""

    thinking: str
    signature: str | None = None


class ReasoningBlock(
    _Block, tag="reasoning", frozen=True, kw_only=True, forbid_unknown_fields=True
):
    """A model's reasoning summary; stored, never indexed."""

    text: str = ""
    summary: str | None = None


class ImageBlock(_Block, tag="image", frozen=True, kw_only=True):
    """An image (by source, url or inline data); stored, never indexed."""

    source: Any = None
    url: str | None = None
    data: str | None = None
    mime_type: str | None = None
    description: str | None = None


class ToolUseBlock(_Block, tag="tool_use", frozen=True, kw_only=True):
    """A tool call made by the assistant; stored, never indexed."""

    id: str
    name: str
    input: Any = None


class ToolResultBlock(_Block, tag="tool_result", frozen=True, kw_only=True):
    """A tool's result; stored, never indexed."""

    tool_use_id: str
    content: Any = None
    is_error: bool = False


Block: TypeAlias = (
    TextBlock
    | InputTextBlock
    | OutputTextBlock
    | ThinkingBlock
    | ReasoningBlock
    | ImageBlock
    | ToolUseBlock
    | ToolResultBlock
)
Content: TypeAlias = str | list[Block]

BLOCK_TYPES = (
    "text", "input_text", "output_text", "thinking", "reasoning", "image", "tool_use",
    "tool_result",
)  # fmt: skip
T = TypeVar("T")
_TEXT_BLOCKS = (TextBlock, InputTextBlock, OutputTextBlock)
_MSGSPEC_PATH = re.compile(r" - at `\$(.*)`$")
_encode = msgspec.json.Encoder().encode


class Message(msgspec.Struct, frozen=True, kw_only=True):
    """One transcript message: a role and its content.

    `content` is a string or a list of blocks (mappings or block Structs; mappings are
    validated and converted on construction). Construction raises `InvalidInputError` naming
    the field for an unknown role, an unknown block type, a lone surrogate, or content larger
    than `MAX_CONTENT_BYTES` (a string's UTF-8 bytes; a list of blocks as JSON).
    """

    role: Role
    content: Content
    timestamp: float | None = None

    def __post_init__(self) -> None:
        check_choice("Message.role", self.role, ROLES)
        content = self.content
        if not isinstance(content, str):
            content = _convert_blocks(content)
            msgspec.structs.force_setattr(self, "content", content)
        try:
            size = len(content.encode()) if isinstance(content, str) else len(_encode(content))
        except UnicodeEncodeError:
            _check_unicode("Message.content", content)  # finds and names the bad string
            raise
        if size > MAX_CONTENT_BYTES:
            raise InvalidInputError(
                f"Message.content: {size} bytes is over the limit of {MAX_CONTENT_BYTES} bytes"
            )

    @property
    def index_text(self) -> str | None:
        """The text that goes into the full-text index, or None when nothing does."""
        if self.role not in INDEXED_ROLES:
            return None
        if isinstance(self.content, str):
            text = self.content
        else:
            text = "\n".join(b.text for b in self.content if isinstance(b, _TEXT_BLOCKS))
        return text if text.strip() else None


def _convert_blocks(content: object) -> list[Block]:
    if not isinstance(content, list | tuple):
        raise InvalidInputError(
            f"Message.content: expected a string or a list of blocks, got {type(content).__name__}"
        )
    try:
        return msgspec.convert(list(content), list[Block], from_attributes=True)
    except msgspec.ValidationError as exc:
        raise InvalidInputError(_block_error(content, str(exc))) from None


def _block_error(content: list[Any] | tuple[Any, ...], error: str) -> str:
    match = _MSGSPEC_PATH.search(error)
    path = match.group(1) if match else ""
    reason = error[: match.start()] if match else error
    where = f"Message.content{path}"
    if path.endswith(".type") and reason.startswith("Invalid value"):
        allowed = ", ".join(BLOCK_TYPES)
        value = reason.removeprefix("Invalid value ")
        return f"{where}: {value} is not a known block type (allowed: {allowed})"
    if "missing required field `type`" in reason:
        return f"{where}: block has no `type` (allowed: {', '.join(BLOCK_TYPES)})"
    return f"{where}: {reason}"


def check_text(where: str, value: str) -> str:
    """`value`, if it can be stored; else `InvalidInputError` naming `where`. SQLite and JSON
    take UTF-8, which has no lone surrogates (they also break FTS)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{where}: lone surrogate {value[exc.start]!r} at index {exc.start} "
            "(text must be valid Unicode)"
        ) from None
    return value


def check_timestamp(where: str, value: object) -> float:
    """`value` as float, if it is a time a transcript may hold (`MAX_TIMESTAMP`); else
    `InvalidInputError` naming `where` and the range."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidInputError(f"{where}: expected a number of epoch seconds, got {value!r}")
    # Compared before any float(): an int such as 10**400 has no float.
    if (isinstance(value, float) and math.isnan(value)) or not 0 <= value < MAX_TIMESTAMP:
        raise InvalidInputError(f"{where}: {value!r} is out of range ({TIMESTAMP_RANGE})")
    return float(value)


def check_nonblank(where: str, value: object, max_chars: int) -> str:
    """`value`, if it is a string, not blank, at most `max_chars` characters and valid
    Unicode; else `InvalidInputError` naming `where`."""
    if not isinstance(value, str):
        raise InvalidInputError(f"{where}: expected a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(f"{where}: must not be blank")
    if len(value) > max_chars:
        raise InvalidInputError(f"{where}: {len(value)} characters is over the maximum {max_chars}")
    return check_text(where, value)


def check_int(name: str, value: object, low: int, high: int | None = None) -> int:
    """`value`, if it is an int (not a bool) from `low` to `high` (or up); else
    `InvalidInputError` naming `name`."""
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or value < low
        or (high is not None and value > high)
    ):
        upper = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise InvalidInputError(f"{name}: {value!r} is not an integer {upper}")
    return value


def check_choice(name: str, value: object, allowed: Sequence[T]) -> T:
    """`value`, if it is one of `allowed`; else `InvalidInputError` naming `name`."""
    if value not in allowed:
        options = ", ".join(repr(a) for a in allowed)
        raise InvalidInputError(f"{name}: {value!r} is not one of {options}")
    return cast(T, value)


def check_bool(name: str, value: object) -> bool:
    """`value`, if it is True or False; else `InvalidInputError` naming `name`."""
    if not isinstance(value, bool):
        raise InvalidInputError(f"{name}: expected True or False, got {value!r}")
    return value


def _check_unicode(where: str, value: object) -> None:
    """Reject lone surrogates anywhere in a message (`check_text` on every string)."""
    if isinstance(value, str):
        check_text(where, value)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_unicode(f"{where}[{i}]", item)
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_unicode(f"{where}.{key}", key)
            _check_unicode(f"{where}.{key}", item)
    elif isinstance(value, msgspec.Struct):
        for field in value.__struct_fields__:
            _check_unicode(f"{where}.{field}", getattr(value, field))


_MESSAGE_FIELDS = ("role", "content", "timestamp")


def message_from_mapping(value: Mapping[str, Any], where: str = "message") -> Message:
    """Build a `Message` from a mapping (JSON, a host's dict), with errors naming `where`."""
    unknown = sorted(set(value) - set(_MESSAGE_FIELDS))
    if unknown:
        raise InvalidInputError(
            f"{where}: unknown field {unknown[0]!r} (allowed: {', '.join(_MESSAGE_FIELDS)})"
        )
    for name in ("role", "content"):
        if name not in value:
            raise InvalidInputError(f"{where}: missing field {name!r}")
    timestamp = value.get("timestamp")
    if timestamp is not None:
        timestamp = check_timestamp(f"{where}.timestamp", timestamp)
    try:
        return Message(role=value["role"], content=value["content"], timestamp=timestamp)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None
