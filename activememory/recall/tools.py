"""The memory tools a recall model may call, and the `RecallModel` protocol (docs/design.md §4.7-§4.8).

A `RecallTools` is made for one recall run (`run_tools`): it knows the tools the run may
call, bound to the settings the run started with, calls them, keeps every result (the
evidence gate reads it afterwards), records the run's transcript lines, and holds the
model's latest draft answer (what a timed-out run can still offer as a partial answer).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import anyio
import msgspec

from .._config import problems
from ..protocol.content import check_text
from ..protocol.errors import InvalidInputError
from ..protocol.recall import RecallRequest, ToolResult
from ..protocol.session_key import SessionKey
from ..protocol.tools import TOOL_ARGUMENTS, function_schema

if TYPE_CHECKING:  # they import this module
    from .._records import Records
    from .._settings import Settings
    from ..protocol.config import Config, PrivateScope
    from ..storage.run_transcripts import SubAgentTranscript
    from .memory_core import MemoryCore

ToolHandler = Callable[[Mapping[str, Any]], Awaitable[ToolResult]]
# A line of the sub-agent transcript (JSONL): {"type": ..., "at": seconds since start, ...}.
TranscriptSink = Callable[[dict[str, Any]], None]

# The built-in tools in the OpenAI function-calling shape, derived from their argument Structs.
TOOL_SCHEMAS = {name: function_schema(args) for name, args in TOOL_ARGUMENTS.items()}
# A host tool without a `schema` attribute takes any object.
ANY_ARGUMENTS: dict[str, Any] = {"type": "object", "additionalProperties": True}
MAX_TOOL_CONTENT_CHARS = 16_000  # what one tool call can put in front of the model

_encode = msgspec.json.Encoder().encode
Args = TypeVar("Args", bound=msgspec.Struct)


class RecallTools:
    """The tools of one recall run. Model authors call `call` and, optionally, `draft`.

    Cancellation: `call` is cancelled like any await; a tool stuck in a thread keeps the
    call waiting, but never the bot: the run is abandoned at its budget.
    """

    def __init__(
        self,
        handlers: Mapping[str, ToolHandler],
        *,
        schemas: Mapping[str, dict[str, Any]] | None = None,
        transcript: TranscriptSink | None = None,
    ) -> None:
        self._handlers = dict(handlers)
        self._schemas = dict(schemas or {})
        self._transcript = transcript
        self.results: list[ToolResult] = []
        self.draft_text: str | None = None
        self.draft_at: float | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The tools this run may call, in the order `toolsAllow` gave them."""
        return tuple(self._handlers)

    @property
    def evidence(self) -> bool:
        """Has any call of this run returned recall evidence?"""
        return any(r.evidence for r in self.results)

    def schemas(self) -> list[dict[str, Any]]:
        """The allowed tools as OpenAI `tools` entries (`{"type": "function", ...}`)."""
        out = []
        for name in self._handlers:
            schema = self._schemas.get(name) or TOOL_SCHEMAS.get(name) or {}
            out.append(
                {
                    "type": "function",
                    "function": {
                        "name": name,
                        "description": schema.get("description", f"The {name} memory tool."),
                        "parameters": schema.get("parameters", ANY_ARGUMENTS),
                    },
                }
            )
        return out

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> ToolResult:
        """Call the memory tool `name` with `arguments`; never raises for a tool's failure.

        A tool that is not allowed, bad arguments, or an exception inside the tool give a
        `ToolResult` with `error` set (not evidence), so a model can read what went wrong.
        """
        args = dict(arguments or {})
        self._record({"type": "tool_call", "name": name, "arguments": args})
        handler = self._handlers.get(name)
        if handler is None:
            allowed = ", ".join(self._handlers) or "none"
            result = tool_failure(
                name, f"{name} is not an allowed memory tool (allowed: {allowed})"
            )
        else:
            try:
                result = await handler(args)
            except InvalidInputError as exc:
                result = tool_failure(name, str(exc))
            except anyio.get_cancelled_exc_class():
                raise
            except Exception as exc:  # a tool's own bug must not sink the run
                result = tool_failure(name, f"{type(exc).__name__}: {exc}")
        self.results.append(result)
        self._record(
            {
                "type": "tool_result",
                "name": name,
                "evidence": result.evidence,
                "error": result.error,
                "content": result.content[:2000],
            }
        )
        return result

    def draft(self, text: str) -> None:
        """Offer `text` as the answer so far: used as a partial answer if the budget ends."""
        if isinstance(text, str) and text.strip():
            self.draft_text = text
            self.draft_at = anyio.current_time()
            self._record({"type": "draft", "text": text[:2000]})

    def _record(self, line: dict[str, Any]) -> None:
        if self._transcript is not None:
            self._transcript(line)


@runtime_checkable
class RecallModel(Protocol):
    """A recall model: given the request and the run's tools, call tools and answer.

    Return one short note about the user grounded in tool results, or "NONE". The answer is
    used only if this run's tools returned recall evidence. Raising means `failed`.

    Cancellation: the run is cancelled at its budget; a model that ignores cancellation is
    abandoned (never awaited past the bound), and what it returns afterwards is dropped.
    """

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str: ...


def tool_failure(name: str, message: str) -> ToolResult:
    """The result of a tool call that failed: `{"error": message}`, not evidence."""
    # ASCII JSON: a lone surrogate echoed from the model's arguments stays encodable.
    content = json.dumps({"error": message})
    return ToolResult(name=name, content=content, error=message, evidence=False)


def tool_arguments(shape: type[Args], args: Mapping[str, Any]) -> Args:
    """A tool call's `args` as its argument Struct (protocol/tools.py).

    Raises `InvalidInputError` naming each bad argument and what is allowed, one a line,
    in the config loader's words (`maxResults: 0 is below the minimum 1`).
    """
    if not isinstance(args, Mapping):
        raise InvalidInputError(f"arguments: expected an object, got {type(args).__name__}")
    try:
        parsed = msgspec.convert(args, shape)
    except (msgspec.ValidationError, UnicodeEncodeError) as exc:  # a key with a lone surrogate
        raise InvalidInputError("\n".join(problems(shape, args)) or f"arguments: {exc}") from None
    for name, value in msgspec.structs.asdict(parsed).items():
        if isinstance(value, str):  # JSON can spell a lone surrogate; SQLite and FTS cannot
            check_text(shape.__struct_encode_fields__[shape.__struct_fields__.index(name)], value)
    return parsed


def host_result(name: str, value: object) -> ToolResult:
    """Turn what a host tool returned into a `ToolResult` with the docs/design.md §4.7 evidence rule.

    A string is the content; a mapping or list is JSON. Evidence: non-empty content, unless
    structured fields say the result is empty or a failure (`error`, `ok: false`,
    `status` of empty/error/failed/unavailable, `empty: true`, an empty `results`/`hits`
    list, or `count`/`hits` of 0).
    """
    data: dict[str, object] | None = None
    if isinstance(value, str):
        content = value
    elif isinstance(value, Mapping):
        data = {str(k): v for k, v in value.items()}
        content = _encode_loose(data)
    elif value is None:
        content = ""
    else:
        content = _encode_loose(value)
    content = content[:MAX_TOOL_CONTENT_CHARS]
    error = None
    empty = not content.strip() or content.strip() in ("[]", "{}", "null")
    if data is not None:
        status = str(data.get("status", "")).lower()
        if data.get("error"):
            error = str(data["error"])
        if data.get("ok") is False or status in ("error", "failed", "failure"):
            error = error or f"{name} reported {status or 'a failure'}"
        if data.get("empty") is True or status in ("empty", "unavailable", "none"):
            empty = True
        for field in ("results", "hits", "items", "memories"):
            found = data.get(field)
            if (isinstance(found, list) and not found) or (type(found) is int and found == 0):
                empty = True
        if type(data.get("count")) is int and data.get("count") == 0:
            empty = True
    return ToolResult(
        name=name, content=content, data=data, evidence=not empty and error is None, error=error
    )


def _encode_loose(value: object) -> str:
    try:
        return _encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return json.dumps(value, default=str, ensure_ascii=False)


def run_tools(
    request: RecallRequest,
    key: SessionKey,
    *,
    settings: Settings,
    core: MemoryCore,
    records: Records,
    host_tools: Mapping[str, Any],
    transcript: SubAgentTranscript,
) -> RecallTools:
    """The tools of one run: the built-in ones under `settings`, then the host's."""
    handlers: dict[str, ToolHandler] = {}
    # The other private conversations this run may read (docs/design.md §4.2), or none.
    transcripts = settings.config.private_scope(key) if request.transcripts else None
    for name in request.tools:
        if name in BUILTIN_TOOLS and not (name == "memory_recall" and name in host_tools):
            handlers[name] = builtin_tool(
                name,
                key,
                request.agent,
                settings=settings,
                core=core,
                records=records,
                transcripts=transcripts,
            )
        elif name in host_tools:
            handlers[name] = _host_handler(name, host_tools[name])
    schemas = {name: fn.schema for name, fn in host_tools.items() if hasattr(fn, "schema")}
    return RecallTools(
        handlers,
        schemas=schemas,
        transcript=lambda line: transcript.write(line, at=anyio.current_time()),
    )


BUILTIN_TOOLS = ("memory_search", "memory_get", "memory_recall")


def builtin_tool(
    name: str,
    key: SessionKey,
    agent: str,
    *,
    settings: Settings,
    core: MemoryCore,
    records: Records,
    transcripts: PrivateScope | None,
) -> ToolHandler:
    """The built-in tool `name` (one of `BUILTIN_TOOLS`) as the conversation `key` of
    `agent` calls it: a recall run's, and `activememory mcp`'s (docs/design.md §12.2).

    `transcripts`: the other private conversations memory_search and memory_get may read
    (`Config.private_scope`), or None for the memory notes alone.
    """
    if name in ("memory_search", "memory_get"):
        tool = core.search if name == "memory_search" else core.get
        return partial(tool, agent, caller=key, transcripts=transcripts, settings=settings)
    if name == "memory_recall":
        return _records_handler(records, key, agent, settings)
    raise InvalidInputError(f"{name} is not a built-in memory tool ({', '.join(BUILTIN_TOOLS)})")


def records_scope(key: SessionKey, agent: str, config: Config) -> tuple[str | None, str, str]:
    """The (user_id, agent_id, thread_id) of the records the conversation `key` of `agent`
    reads and writes.

    The user of a direct conversation is its identity (`Config.identity_of`: the peer of
    `agent:<a>:direct:<peer>` unless session.identityLinks links it, "main" for the main
    conversation unless ownerIdentity names the owner); a group, channel or explicit
    session names no user, so only records scoped to no user are searched there. The
    agent is exact; the session key is the thread, a boost rather than a filter.
    """
    user_id = config.identity_of(key) if key.chat_type == "direct" else None
    return user_id, agent, key.raw


def _records_handler(
    records: Records, key: SessionKey, agent: str, settings: Settings
) -> ToolHandler:
    """memory_recall over the records store, scoped to this conversation (`records_scope`)."""
    from .._records import recall_tool  # here: `_records` imports this module

    user_id, agent_id, thread_id = records_scope(key, agent, settings.config)
    return partial(
        recall_tool,
        records,
        user_id=user_id,
        agent_id=agent_id,
        thread_id=thread_id,
        redactor=settings.redactor,
    )


def _host_handler(name: str, fn: Callable[[Mapping[str, Any]], Any]) -> ToolHandler:
    async def call(args: Mapping[str, Any]) -> ToolResult:
        return host_result(name, await fn(args))

    return call
