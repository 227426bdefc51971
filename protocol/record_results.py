"""What a records search answers (docs/design.md §5.6): results, their linked context, XML rendering.

A `RecordSearchResult` is one direct match (with a `distance`) or one linked record (reached
through a relation; `distance` None). Its `linked_results` are a shortest-path tree of
(stored relation, result) pairs, each vertex once.

Rendering is XML-safe prompt text: one `<record>` element per result,

    <record id="…" type="memory" status="valid" timestamp="2024-05-01T09:30:00Z">
    <content>likes aisle seats</content>
    <metadata><source>chat</source><meta key="not a tag">…</meta></metadata>
    <invalidation_reason>…</invalidation_reason>
    <linked relation="about" source="…" target="…">
    <record …>…</record>
    </linked>
    </record>

Text and attribute values are escaped (`&`, `<`, `>`; quotes, tabs and line breaks too in
attributes); characters XML 1.0 cannot carry (most control characters, lone surrogates,
U+FFFE/U+FFFF) become U+FFFD. A metadata key becomes the tag when it is a plain ASCII name
(`[A-Za-z_][A-Za-z0-9_.-]*`, at most 64 characters, not starting with "xml"); any other key
is written `<meta key="…">`. Values are strings: a string as it is, anything else as JSON.
Attributes whose value is unknown (an unscoped dimension, a message without a role, a linked
result's distance) are left out.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

import msgspec

from .errors import InvalidInputError
from .records import (
    Record,
    RecordRelation,
    RecordResultFormatConfig,
    RecordStatus,
    RecordType,
    SearchResultFormatConfig,
)

_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_TAG = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
_TEXT_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"})
_ATTR_ESCAPES = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        '"': "&quot;",
        "'": "&apos;",
        "\t": "&#9;",
        "\n": "&#10;",
        "\r": "&#13;",
    }
)
_encode_json = msgspec.json.Encoder().encode


def estimate_tokens(text: str) -> int:
    """The token estimate budgets count with: ceil(characters / 4).

    About right for English with common tokenizers; on the safe side for code and
    non-Latin scripts it undercounts, so leave headroom in budgets for those.
    """
    return (len(text) + 3) // 4


class RecordSearchResult(msgspec.Struct, frozen=True, kw_only=True):
    """One result of a records search (docs/design.md §5.6).

    `distance`: smaller is better. For a direct match it is `1 / (1 + s)`, where `s` is
    the FTS5 BM25 relevance (the negated `rank`, ≥ 0) multiplied by `1 + 0.5 × k`, `k` the
    number of non-exact scope values the record matches; so it lies in (0, 1]. A linked
    result is not ranked by the query: its distance is None.

    `linked_results`: (stored `RecordRelation`, result) pairs, the children of this record
    in the shortest-path tree of its graph expansion, recursively.

    `format_config`: the rendering `formatted_content` uses and `format_content` falls back
    to.
    """

    record: Record
    distance: float | None = None
    linked_results: list[tuple[RecordRelation, RecordSearchResult]] = []
    format_config: SearchResultFormatConfig = msgspec.field(
        default_factory=RecordResultFormatConfig
    )

    @property
    def id(self) -> str:
        """The record's id."""
        return self.record.id

    @property
    def content(self) -> str:
        """The record's text (an image's description)."""
        return self.record.content

    @property
    def metadata(self) -> dict[str, Any]:
        """The record's metadata."""
        return self.record.metadata

    @property
    def status(self) -> RecordStatus:
        """The record's lifecycle status."""
        return self.record.status

    @property
    def timestamp(self) -> float:
        """The record's timestamp (seconds since the epoch)."""
        return self.record.timestamp

    @property
    def record_type(self) -> RecordType:
        """The record's type."""
        return self.record.record_type

    @property
    def formatted_content(self) -> str:
        """This result and its linked context as XML-safe prompt text (`format_config`)."""
        return self.format_content()

    def format_content(self, config: SearchResultFormatConfig | None = None) -> str:
        """Render this result and its linked context as XML-safe prompt text.

        `config` replaces `format_config` for this call. A plain `SearchResultFormatConfig`
        sets only `include_invalid_results`; the `show_*` flags then come from
        `format_config`. Raises `InvalidInputError` for a config of another type.
        """
        effective = _effective(self.format_config, config)
        out: list[str] = []
        _render(self, effective, out, full=True)
        return "\n".join(out)


def _effective(
    default: SearchResultFormatConfig, config: SearchResultFormatConfig | None
) -> RecordResultFormatConfig:
    if config is None:
        config = default
    if not isinstance(config, SearchResultFormatConfig):
        raise InvalidInputError(
            f"config: expected a SearchResultFormatConfig, got {type(config).__name__}"
        )
    if isinstance(config, RecordResultFormatConfig):
        return config
    base = default if isinstance(default, RecordResultFormatConfig) else RecordResultFormatConfig()
    return msgspec.structs.replace(base, include_invalid_results=config.include_invalid_results)


def _render(
    result: RecordSearchResult, cfg: RecordResultFormatConfig, out: list[str], *, full: bool
) -> None:
    record = result.record
    attrs: list[tuple[str, str]] = [("id", record.id), ("type", record.record_type.value)]
    # An invalid record shown only as a path to valid ones keeps its status whatever the flag.
    if cfg.show_status or not full:
        attrs.append(("status", record.status.value))
    if cfg.show_role and record.role is not None:
        attrs.append(("role", record.role))
    for shown, name, value in (
        (cfg.show_user_id, "user_id", record.user_id),
        (cfg.show_agent_id, "agent_id", record.agent_id),
        (cfg.show_thread_id, "thread_id", record.thread_id),
    ):
        if shown and value is not None:
            attrs.append((name, value))
    if cfg.show_timestamp:
        attrs.append(("timestamp", iso_timestamp(record.timestamp)))
    if cfg.show_distance and result.distance is not None:
        attrs.append(("distance", f"{result.distance:.4f}"))
    out.append("<record " + " ".join(f'{k}="{escape_attr(v)}"' for k, v in attrs) + ">")
    if full:
        out.append(f"<content>{escape_text(record.content)}</content>")
        if cfg.show_metadata:
            if record.metadata:
                out.append(render_metadata(record.metadata))
            if record.invalid_reason is not None:
                reason = escape_text(record.invalid_reason)
                out.append(f"<invalidation_reason>{reason}</invalidation_reason>")
    for relation, child in result.linked_results:
        child_valid = child.record.status == RecordStatus.VALID
        if not cfg.include_invalid_results and not _holds_valid(child):
            continue  # an invalid branch: nothing valid below it
        out.append(
            f'<linked relation="{escape_attr(relation.relation)}"'
            f' source="{escape_attr(relation.source_id)}"'
            f' target="{escape_attr(relation.target_id)}">'
        )
        _render(child, cfg, out, full=cfg.include_invalid_results or child_valid)
        out.append("</linked>")
    out.append("</record>")


def _holds_valid(result: RecordSearchResult) -> bool:
    """Is this record, or any record below it, valid?"""
    if result.record.status == RecordStatus.VALID:
        return True
    return any(_holds_valid(child) for _, child in result.linked_results)


def render_metadata(metadata: dict[str, Any]) -> str:
    """`<metadata>` with one element per key (see the module docstring)."""
    parts = ["<metadata>"]
    for key, value in metadata.items():
        text = escape_text(value if isinstance(value, str) else json_text(value))
        if _TAG.fullmatch(key) and not key.lower().startswith("xml"):
            parts.append(f"<{key}>{text}</{key}>")
        else:
            parts.append(f'<meta key="{escape_attr(key)}">{text}</meta>')
    parts.append("</metadata>")
    return "".join(parts)


def json_text(value: object) -> str:
    """A metadata value that is not a string, as compact JSON."""
    try:
        return _encode_json(value).decode()
    except (UnicodeEncodeError, TypeError, ValueError, msgspec.EncodeError):
        # Text the store would refuse (a lone surrogate), built by hand: still rendered.
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def xml_safe(text: str) -> str:
    """`text` with every character XML 1.0 cannot carry replaced by U+FFFD."""
    return _NOT_XML.sub("\ufffd", text)


def escape_text(text: str) -> str:
    """`text` as XML character data."""
    return xml_safe(text).translate(_TEXT_ESCAPES)


def escape_attr(text: str) -> str:
    """`text` as a double-quoted XML attribute value (whitespace survives normalization)."""
    return xml_safe(text).translate(_ATTR_ESCAPES)


def iso_timestamp(seconds: float) -> str:
    """Seconds since the epoch as ISO 8601 UTC to the second (`2024-05-01T09:30:00Z`)."""
    try:
        moment = dt.datetime.fromtimestamp(seconds, tz=dt.UTC)
    except (OverflowError, OSError, ValueError):
        return repr(seconds)  # out of datetime's range: still a faithful value
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
