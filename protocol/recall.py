"""What a bot hands the recall pipeline, and what it gets back (docs/design.md §4, §9).

`Turn` and `Sender` come from the host; `SessionSwitches` are the per-session slash-command
switches (docs/design.md §4.3), persisted in the agent database; `RecallOutcome` is the answer of
`mem.recall`.
"""

from __future__ import annotations

import math
from typing import Any, Literal, TypeAlias, get_args

import msgspec

from .content import Message, check_choice
from .errors import InvalidInputError
from .session_key import parse_session_key

Trigger: TypeAlias = Literal["user", "heartbeat", "system", "inter_session"]
TRIGGERS: tuple[Trigger, ...] = ("user", "heartbeat", "system", "inter_session")
Surface: TypeAlias = Literal["interactive", "headless", "background", "agent_command", "subagent"]
SURFACES: tuple[Surface, ...] = get_args(Surface)
TraceMode: TypeAlias = Literal["off", "on", "raw"]
TRACE_MODES: tuple[TraceMode, ...] = ("off", "on", "raw")

RecallStatus: TypeAlias = Literal[
    "ok",
    "timeout_partial",
    "timeout",
    "empty",
    "no_relevant_memory",
    "unavailable",
    "failed",
    "skipped",
]
# The two activation paths of docs/design.md §4.2.
RecallPath: TypeAlias = Literal["cross_conversation", "advanced"]


class Turn(msgspec.Struct, frozen=True, kw_only=True):
    """One turn the bot is about to answer.

    `messages` is the conversation so far, oldest first, ending with the latest user
    message. `trigger` and `surface` say where the turn comes from; recall runs only for
    `trigger="user"` on the `interactive` surface. `model` is the session's current model
    (`provider/model`), if the host has one. Construction raises `InvalidInputError` naming
    the field.
    """

    session_key: str
    messages: tuple[Message, ...] | list[Message]  # a list is stored as a tuple
    trigger: Trigger = "user"
    surface: Surface = "interactive"
    model: str | None = None

    def __post_init__(self) -> None:
        parse_session_key(self.session_key, field="Turn.session_key")
        messages = self.messages
        if not isinstance(messages, list | tuple):
            raise InvalidInputError(
                f"Turn.messages: expected a list of am.Message, got {type(messages).__name__}"
            )
        for i, message in enumerate(messages):
            if not isinstance(message, Message):
                raise InvalidInputError(
                    f"Turn.messages[{i}]: expected am.Message, got {type(message).__name__}"
                )
        if not messages:
            raise InvalidInputError("Turn.messages: is empty; it must end with a user message")
        if messages[-1].role != "user":
            raise InvalidInputError(
                f"Turn.messages[{len(messages) - 1}]: the last message has role "
                f"{messages[-1].role!r}; it must be the latest user message"
            )
        if isinstance(messages, list):
            msgspec.structs.force_setattr(self, "messages", tuple(messages))
        check_choice("Turn.trigger", self.trigger, TRIGGERS)
        check_choice("Turn.surface", self.surface, SURFACES)
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            raise InvalidInputError(
                f"Turn.model: expected a provider/model string, got {self.model!r}"
            )


class Sender(msgspec.Struct, frozen=True, kw_only=True):
    """Who sent a slash command: `--global` needs the owner or the `operator.admin` scope."""

    owner: bool = False
    scopes: tuple[str, ...] = ()
    id: str | None = None

    @property
    def is_admin(self) -> bool:
        return self.owner is True or "operator.admin" in self.scopes


class SessionSwitches(msgspec.Struct, frozen=True, kw_only=True):
    """The per-session switches of docs/design.md §4.3; a session nobody switched has the defaults."""

    active_memory: bool = True
    verbose: bool = False
    trace: TraceMode = "off"


class RecallRequest(msgspec.Struct, frozen=True, kw_only=True):
    """What the recall sub-agent is given (docs/design.md §4.4-§4.8), built in preflight.

    `prompt` is the system prompt (the style's, or `promptOverride`, then `promptAppend`);
    `context` the conversation as `query_mode` shows it (injected Active Memory output
    stripped); `search_query` the short query for memory tools; `tools` the memory tools it
    may call; `transcripts` whether memory_search may read the agent's other private
    conversations (cross-conversation recall). `thinking` and `fast_mode` apply to the
    recall model only. `latest` is the latest user message (stripped of injected text).
    """

    session_key: str
    agent: str
    model: str
    prompt: str
    prompt_style: str
    query_mode: str
    context: str
    latest: str = ""
    search_query: str
    tools: tuple[str, ...]
    transcripts: bool
    thinking: str = "off"
    fast_mode: bool | str | None = None
    timeout_ms: int
    setup_grace_timeout_ms: int = 0
    max_summary_chars: int
    # When the recall work must be done, on the `anyio.current_time()` clock (set when the
    # run starts); a model passes the time left down as its request timeout.
    deadline: float = math.inf


class RecallPlan(msgspec.Struct, frozen=True, kw_only=True):
    """The preflight's verdict: a `request` to run, or the `status` and `reason` it ends with.

    `status` is None when there is a request to run.
    """

    request: RecallRequest | None
    status: RecallStatus | None = None
    reason: str = ""
    paths: tuple[RecallPath, ...] = ()
    model: str | None = None


class RecallOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """What `mem.recall(turn)` answers.

    `prompt_prefix` is the hidden block for the reply model (None unless a note was
    recalled). `status_line` and `debug_line` are always filled in; `followups` holds the
    ones the session's `/verbose` and `/trace` switches ask to send after the reply (with
    `/trace raw`, the raw prefix block too). `paths` are the activation paths that let the
    turn recall; `reason` says why a `skipped` or `unavailable` turn did not.
    """

    status: RecallStatus
    summary: str | None = None
    elapsed_ms: float = 0.0
    prompt_prefix: str | None = None
    status_line: str = ""
    debug_line: str = ""
    followups: tuple[str, ...] = ()
    cached: bool = False
    query_mode: str = ""
    model: str | None = None
    paths: tuple[RecallPath, ...] = ()
    reason: str = ""


class ToolResult(msgspec.Struct, frozen=True, kw_only=True):
    """What one memory tool call gave the recall model.

    `content` is the text the model reads (JSON for the built-in tools); `data` the
    structured fields, when the tool has them; `evidence` whether it counts as recall
    evidence (docs/design.md §4.7: non-empty, unless its structured fields say empty or failed);
    `error` a failure message (never evidence).
    """

    name: str
    content: str
    data: dict[str, object] | None = None
    evidence: bool = False
    error: str | None = None


class RecallTrace(msgspec.Struct, frozen=True, kw_only=True):
    """What `mem.trace_recall(turn)` answers: the outcome, and the sub-agent run behind it.

    `run_id` is None when no sub-agent ran (the turn was skipped, the answer came from the
    cache, the circuit breaker was open). `transcript` holds the run's transcript lines as
    its JSONL file has them (`{"at": seconds since the run started, "type": "prompt" |
    "tool_call" | "tool_result" | "draft" | "end", ...}`, at most 1000, a line over 8000
    characters reduced to its `at`, `type` and `"truncated": true`); `tool_results` each
    tool call's whole result, in call order: the ones with `evidence` are what lets an
    answer through (docs/design.md §4.7, §4.10).
    """

    outcome: RecallOutcome
    run_id: str | None = None
    transcript: tuple[dict[str, Any], ...] = ()
    tool_results: tuple[ToolResult, ...] = ()


class RecallCacheInfo(msgspec.Struct, frozen=True, kw_only=True):
    """The recall cache now (`mem.recall_cache_info()`, docs/design.md §4.10).

    `entries`: grounded answers held and not yet expired, at most `max_entries`; `ttl_ms`:
    how long the current config keeps one (`cacheTtlMs`); `clears`: how often it was
    emptied (an erase empties it).
    """

    entries: int
    max_entries: int
    ttl_ms: int
    clears: int


class Reply(msgspec.Struct, frozen=True, kw_only=True):
    """What `mem.reply(turn, respond)` answers: the bot's reply and what to send after it.

    `text` is what the host's `respond` returned; `outcome` the recall step's; `followups`
    the status/debug lines the session's `/verbose` and `/trace` switches ask for, to send
    after the reply. `problems` lists what failed open on the way (a transcript write that
    failed, say): the reply went on without it.
    """

    text: str
    outcome: RecallOutcome
    followups: tuple[str, ...] = ()
    user_event_id: int | None = None
    assistant_event_id: int | None = None
    problems: tuple[str, ...] = ()
