"""The bodies of the HTTP/JSON API (`activememory serve`, docs/design.md §12.1).

Only what the library has no Struct for: a request names the arguments of one public call
(`mem.sessions.append(session_key, message)` is `AppendBody`), and a response that is not
already a library Struct wraps it. The OpenAPI document is generated from these and the
library's own Structs (`Message`, `Event`, `SearchResult`, `RecallOutcome`, ...), so the
schema a client reads and the decoder the server runs are one declaration.

Unknown fields are refused (`forbid_unknown_fields`): a misspelt `sesion_key` is a 422
naming it, not a call that quietly ran with a default.
"""

from __future__ import annotations

from typing import Any, Literal, TypeAlias

import msgspec

from .content import Message
from .recall import RecallOutcome, Surface, Trigger
from .record_results import RecordSearchResult
from .records import RecordType
from .search import SearchMode, Visibility
from .transcript import Event, IndexStats

Layer: TypeAlias = Literal["thread", "client", "store"]
MatchMode: TypeAlias = Literal["phrase", "prefix"]
Unset: TypeAlias = msgspec.UnsetType


class _Body(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class AppendBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`mem.sessions.append(session_key, message)`."""

    session_key: str
    message: Message


class RewindBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`mem.sessions.rewind(session_key, to_event_id)`."""

    session_key: str
    to_event_id: int


class HistoryBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`mem.sessions.history(session_key, limit=...)`."""

    session_key: str
    limit: int | None = None


class SearchBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`mem.sessions.search(query, caller=..., ...)`.

    `caller` is the conversation asking. `visibility` may narrow what it sees, never widen
    it: "self" (its own session only) or the server's `tools.sessions.visibility`.
    """

    query: str
    caller: str
    session_key: str | None = None
    limit: int = 10
    match: MatchMode = "phrase"
    mode: SearchMode = "text"
    visibility: Visibility | None = None


class TurnBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An `am.Turn`: the conversation so far, ending with the latest user message."""

    session_key: str
    messages: list[Message]
    trigger: Trigger = "user"
    surface: Surface = "interactive"
    model: str | None = None


class PrefixReply(msgspec.Struct, frozen=True, kw_only=True):
    """What `/v1/turns/prefix` answers: the hidden block for the host's own model call.

    The latest user message is stored (`user_event_id`); the host calls its model with
    `prompt_prefix` (None: nothing recalled), then stores the answer with
    `/v1/sessions/append`, and sends `followups` after it. `problems`: what failed open.
    """

    prompt_prefix: str | None
    outcome: RecallOutcome
    followups: list[str]
    user_event_id: int | None
    problems: list[str]


class SenderBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """An `am.Sender`: who sent a slash command."""

    owner: bool = False
    scopes: list[str] = []
    id: str | None = None


class CommandBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`mem.command(session_key, text, sender=...)`."""

    session_key: str
    text: str
    sender: SenderBody = SenderBody()


class CommandReply(msgspec.Struct, frozen=True, kw_only=True):
    """The reply text to show; None when `text` was not one of the memory's commands."""

    reply: str | None


class Ok(msgspec.Struct, frozen=True, kw_only=True):
    ok: bool = True


class Events(msgspec.Struct, frozen=True, kw_only=True):
    events: list[Event]


class Stats(msgspec.Struct, frozen=True, kw_only=True):
    agents: list[IndexStats]


class RecordAddBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`mem.records.add(content, user_id=..., ...)`."""

    content: str
    user_id: str | None
    agent_id: str | None = None
    thread_id: str | None = None
    record_type: RecordType = RecordType.MEMORY
    metadata: dict[str, Any] | None = None
    timestamp: float | None = None
    expires_at: float | None = None
    role: str | None = None


class RecordId(msgspec.Struct, frozen=True, kw_only=True):
    id: str


class RecordLinkBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`mem.records.link(source_id, target_id, relation=...)`."""

    source_id: str
    target_id: str
    relation: str


class RecordInvalidateBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`mem.records.invalidate(id, reason=...)`."""

    id: str
    reason: str


class ThreadScope(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The thread a `layer: "thread"` search is for (`mem.records.thread(...)`)."""

    user_id: str | None
    agent_id: str | None
    thread_id: str | None


class RecordSearchBody(_Body, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A records search at one scope layer (docs/design.md §5.2).

    `layer`: "client" (`mem.records.search`: `user_id` required and exact), "thread"
    (`mem.records.thread(**thread).search`) or "store" (`mem.records.store.search`). A scope
    field left out is the layer's "omitted"; `null` is "not scoped in that dimension".
    `max_results` is `TopKMemorySearchConfig.max_results`.
    """

    query: str
    layer: Layer = "client"
    thread: ThreadScope | None = None
    user_id: str | Unset | None = msgspec.UNSET
    agent_id: str | Unset | None = msgspec.UNSET
    thread_id: str | Unset | None = msgspec.UNSET
    exact_user_match: bool | Unset = msgspec.UNSET
    exact_agent_match: bool | Unset = msgspec.UNSET
    exact_thread_match: bool | Unset = msgspec.UNSET
    include_invalid_results: bool | Unset = msgspec.UNSET
    num_hops: int = 0
    max_linked_results: int = 100
    record_types: list[RecordType] | None = None
    metadata_filter: dict[str, Any] | None = None
    max_results: int | None = None


class RecordResults(msgspec.Struct, frozen=True, kw_only=True):
    """The results, best first; `formatted` is each one's XML-safe prompt text."""

    results: list[RecordSearchResult]
    formatted: list[str]


class Problem(msgspec.Struct, frozen=True, kw_only=True):
    """A 4xx/5xx answer: `error` says what is wrong; `field` the JSON path, when one is."""

    error: str
    field: str | None = None
