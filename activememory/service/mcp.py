"""`activememory mcp`: a Model Context Protocol server over one conversation's memory
(docs/design.md §12.2).

The server is launched for one caller (`--session-key`): every tool runs as that
conversation, with the same code the recall sub-agent's tools and the public API run
(`recall.tools.builtin_tool`, `mem.sessions.search`, `mem.records`). No tool argument names
a caller, a user or a scope, so a model cannot widen what it sees by forging one; an
unknown argument is refused by name (the argument Structs forbid unknown fields).

Each tool's input schema is `protocol.tools.function_schema` of its argument Struct, the
same the recall model is shown; bad arguments are an MCP tool error (`isError`) naming the
argument and what is allowed, and nothing is written.

Transports: stdio (the client launches the server) and streamable HTTP (loopback by
default; any other address requires a bearer token, compared in constant time).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import anyio
import anyio.abc
import msgspec

from .._records import checked_relation
from .._redaction import Redactor
from ..protocol.config import Config
from ..protocol.content import Message
from ..protocol.errors import ActiveMemoryError, InvalidInputError
from ..protocol.recall import ToolResult, Turn
from ..protocol.records import Record
from ..protocol.session_key import SessionKey, parse_session_key
from ..protocol.tools import (
    TOOL_ARGUMENTS,
    RecordAddArgs,
    RecordInvalidateArgs,
    RecordLinkArgs,
    SessionsSearchArgs,
    function_schema,
)
from ..recall.tools import BUILTIN_TOOLS, builtin_tool, records_scope, tool_arguments
from .auth import (
    bearer_match,
    bind_socket,
    check_token,
    expand_env,
    is_loopback,
    refuse_unauthenticated,
    shown_url,
)

if TYPE_CHECKING:
    from mcp import types as mcp_types
    from mcp.server.lowlevel import Server

    from .._memory import Memory

TOOLS: Final[dict[str, type[msgspec.Struct]]] = {
    "sessions_search": SessionsSearchArgs,
    **TOOL_ARGUMENTS,  # memory_search, memory_get, memory_recall: the recall sub-agent's
    "records_add": RecordAddArgs,
    "records_link": RecordLinkArgs,
    "records_invalidate": RecordInvalidateArgs,
}
"""Every tool of the server and its argument Struct, in the order `tools/list` gives them."""
WRITE_TOOLS: Final = frozenset({"records_add", "records_link", "records_invalidate"})
"""The tools that write; a `--readonly` server lists none of them."""
TRANSPORTS: Final = ("stdio", "http")
MCP_PATH: Final = "/mcp"
SHUTDOWN_S: Final = 5
"""How long a stopping HTTP server waits for the requests in flight."""
TOKEN_ENV: Final = "ACTIVEMEMORY_MCP_TOKEN"
"""The environment variable read for the bearer token when `--token` is not given."""
# A planned turn stands for "this conversation asks now" (its text changes no verdict).
_PROBE = Message(role="user", content="memory tool call")
_encode = msgspec.json.Encoder().encode
log = logging.getLogger("activememory.mcp")


class MemoryTools:
    """The tools of one server, bound to the conversation it was launched for.

    `call` parses the arguments with the tool's Struct (`InvalidInputError` naming each bad
    one; nothing written), then runs the public API as `key`. Read tools answer what the
    recall sub-agent of `key` may see: memory_search and memory_get read the agent's other
    private conversations only when this conversation's recall may (`mem.plan_recall`'s
    cross-conversation path, docs/design.md §4.2). Record tools use `records_scope(key)`:
    records are added to this conversation's user, agent and thread, and only records of
    that user and agent can be linked or invalidated.
    """

    def __init__(self, memory: Memory, key: SessionKey) -> None:
        self._memory = memory
        self._key = key
        self._agent = key.agent or key.store_agent

    def names(self) -> tuple[str, ...]:
        """The tools this server offers (no write tool on a read-only memory)."""
        writes = not self._memory.readonly
        return tuple(name for name in TOOLS if writes or name not in WRITE_TOOLS)

    async def call(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """Run the tool `name` with `arguments` as this server's conversation.

        Raises `InvalidInputError` for an unknown tool or bad arguments (naming each), and
        the library's own errors (`StorageError`, ...) as they come.

        Cancellation: a read that has started finishes on its worker; a write cancelled
        while queued is not stored, once queued it may still be (as `mem.records.add`).
        """
        if name not in self.names():
            raise InvalidInputError(f"{name}: no such tool (tools: {', '.join(self.names())})")
        if name in BUILTIN_TOOLS:
            return await self._builtin(name, arguments)
        match tool_arguments(TOOLS[name], arguments):
            case SessionsSearchArgs() as args:
                return await self._sessions_search(args)
            case RecordAddArgs() as args:
                return await self._records_add(args)
            case RecordLinkArgs() as args:
                return await self._records_link(args)
            case RecordInvalidateArgs() as args:
                return await self._records_invalidate(args)
        raise AssertionError(name)  # every tool of TOOLS is dispatched above

    async def _builtin(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        memory, key = self._memory, self._key
        settings = memory._settings  # one snapshot for the whole call, as a recall run has
        transcripts = None
        if name != "memory_recall":
            plan = await memory.plan_recall(Turn(session_key=key.raw, messages=[_PROBE]))
            if "cross_conversation" in plan.paths:
                transcripts = settings.config.private_scope(key)
        tool = builtin_tool(
            name,
            key,
            self._agent,
            settings=settings,
            core=memory.notes,
            records=memory.records,
            transcripts=transcripts,
        )
        return await tool(arguments)

    async def _sessions_search(self, args: SessionsSearchArgs) -> ToolResult:
        found = await self._memory.sessions.search(
            args.query,
            caller=self._key.raw,
            session_key=args.session_key,
            limit=args.limit,
            match=args.match,
            mode=args.mode,
        )
        data = msgspec.to_builtins(found)
        hits = len(found.results)
        return ToolResult(
            name="sessions_search",
            content=_encode(data).decode(),
            data=data,
            evidence=hits > 0,
        )

    async def _records_add(self, args: RecordAddArgs) -> ToolResult:
        user_id, agent_id, thread_id = records_scope(self._key, self._agent, self._config())
        record_id = await self._memory.records.add(
            args.content,
            user_id=user_id,
            agent_id=agent_id,
            thread_id=thread_id,
            record_type=args.record_type,
            metadata=args.metadata,
        )
        return _written("records_add", {"id": record_id})

    async def _records_link(self, args: RecordLinkArgs) -> ToolResult:
        checked_relation(args.source_id, args.target_id, args.relation)  # before any read
        await self._own("source_id", args.source_id)
        await self._own("target_id", args.target_id)
        rel = await self._memory.records.link(
            args.source_id, args.target_id, relation=args.relation
        )
        return _written("records_link", {"relation": msgspec.to_builtins(rel)})

    async def _records_invalidate(self, args: RecordInvalidateArgs) -> ToolResult:
        await self._own("id", args.id)
        await self._memory.records.invalidate(args.id, reason=args.reason)
        return _written("records_invalidate", {"id": args.id, "status": "invalid"})

    async def _own(self, field: str, record_id: str) -> Record:
        """The record `record_id` if it is this conversation's user's and agent's, else
        `InvalidInputError` naming `field` — the same words whether it exists or not, so a
        guessed id tells nothing about other users' records."""
        user_id, agent_id, _ = records_scope(self._key, self._agent, self._config())
        record = await self._memory.records.get(record_id)
        if record is None or (record.user_id, record.agent_id) != (user_id, agent_id):
            raise InvalidInputError(f"{field}: no record {record_id!r} in this memory")
        return record

    def _config(self) -> Config:
        return self._memory.config

    def redactor(self) -> Redactor:
        """The redactor of this memory's `redactPatterns`, for what the server logs."""
        return Redactor(self._config().search.redact_patterns)


def _written(name: str, data: dict[str, Any]) -> ToolResult:
    return ToolResult(name=name, content=_encode(data).decode(), data=data, evidence=True)


def tool_list(names: tuple[str, ...]) -> list[mcp_types.Tool]:
    """The MCP `Tool`s named, each with its description and input schema from its Struct."""
    from mcp import types as mcp_types

    tools = []
    for name in names:
        schema = function_schema(TOOLS[name])
        annotations = mcp_types.ToolAnnotations(
            read_only_hint=name not in WRITE_TOOLS,
            destructive_hint=name == "records_invalidate",
            idempotent_hint=name not in ("records_add",),
            open_world_hint=False,
        )
        tools.append(
            mcp_types.Tool(
                name=name,
                description=schema["description"],
                input_schema=schema["parameters"],
                annotations=annotations,
            )
        )
    return tools


def make_server(tools: MemoryTools) -> Server[Any]:
    """The MCP server (the SDK's low-level `Server`) offering `tools`."""
    from mcp import types as mcp_types
    from mcp.server.lowlevel import Server

    from .. import __version__

    listed = mcp_types.ListToolsResult(tools=tool_list(tools.names()))
    redactor = tools.redactor()

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return listed

    async def call_tool(
        ctx: Any, params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        try:
            result = await tools.call(params.name, params.arguments or {})
        except ActiveMemoryError as exc:  # bad input, a read-only store, ...: said as is
            return _error(str(exc))
        except anyio.get_cancelled_exc_class():
            raise
        except Exception as exc:  # never a stack trace to the client; the log has it
            log.error("tool %s failed:\n%s", params.name, redactor.traceback(exc))
            return _error(f"{params.name} failed inside the server (see its log)")
        if result.error is not None:  # a tool's own failure (`recall.tools.tool_failure`)
            return _error(result.error)
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(type="text", text=result.content)],
            structured_content=result.data,
        )

    return Server(
        "activememory",
        version=__version__,
        instructions=(
            "The memory of one conversation: search its conversations, notes and records, "
            "and remember new facts about its user."
        ),
        on_list_tools=list_tools,
        on_call_tool=call_tool,
    )


def _error(message: str) -> mcp_types.CallToolResult:
    from mcp import types as mcp_types

    return mcp_types.CallToolResult(
        content=[mcp_types.TextContent(type="text", text=message)], is_error=True
    )


# -- launching: `activememory mcp` ------------------------------------------------------------


def resolve_token(value: str | None) -> str | None:
    """The bearer token: `value` (`${NAME}` reads the environment variable NAME, so the
    token need not appear in a process listing), else `$ACTIVEMEMORY_MCP_TOKEN`, else None.

    Raises `InvalidInputError` naming `--token` for an unset variable or a token shorter
    than 16 characters (`auth.check_token`).
    """
    if value is None:
        value = os.environ.get(TOKEN_ENV) or None
        if value is None:
            return None
    return check_token("--token", expand_env("--token", value))


class BearerAuth:
    """ASGI middleware: every HTTP request needs `Authorization: Bearer <token>`, compared
    in constant time (`auth.bearer_match`); otherwise 401 with an empty body."""

    def __init__(self, app: Any, token: str) -> None:
        self._app = app
        self._tokens = [(token.encode(), True)]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not bearer_match(given, self._tokens):
                await refuse_unauthenticated(send)
                return
        await self._app(scope, receive, send)


def serve(
    state_dir: Path,
    *,
    session_key: str,
    transport: str = "stdio",
    host: str = "127.0.0.1",
    port: int = 8765,
    config: Path | None = None,
    token: str | None = None,
    readonly: bool = False,
    storage: str | None = None,
) -> int:
    """Run the MCP server for the conversation `session_key` until stdin closes (stdio)
    or the process is interrupted (http). Returns the exit status. `storage`: the
    PostgreSQL store (`open_memory(storage=...)`); None: the config's, else `state_dir`.

    Raises `InvalidInputError` before anything starts for a bad session key, transport,
    port or token, and for a non-loopback `host` without a token.
    """
    key = parse_session_key(session_key, field="--session-key")
    if key.chat_type == "unknown":
        raise InvalidInputError(f"--session-key: {session_key!r} names no known conversation")
    if transport not in TRANSPORTS:
        raise InvalidInputError(f"--transport: expected one of {', '.join(TRANSPORTS)}")
    secret = None
    if transport == "http":
        if not 0 <= port <= 65535:
            raise InvalidInputError(f"--port: expected 0 to 65535, got {port}")
        secret = resolve_token(token)
        if secret is None and not is_loopback(host):
            raise InvalidInputError(
                f"--host: {host} is not a loopback address; serving it needs a bearer token "
                f"(--token '${{NAME}}' or ${TOKEN_ENV})"
            )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    async def run() -> None:
        from .._memory import open_memory

        async with open_memory(
            state_dir, config=config, readonly=readonly, storage=storage
        ) as memory:
            server = make_server(MemoryTools(memory, key))
            async with anyio.create_task_group() as tasks:
                # SIGTERM or Ctrl-C stop the transport, then the memory closes cleanly
                # (uvicorn's own handlers would re-raise the signal and skip that close).
                tasks.start_soon(_cancel_on_signal, tasks.cancel_scope)
                if transport == "stdio":
                    await _serve_stdio(server)
                else:
                    url = await tasks.start(
                        partial(serve_http, server, host=host, port=port, token=secret)
                    )
                    # The one line a launcher reads to find an ephemeral port (`--port 0`).
                    print(f"activememory mcp: serving {url}", file=sys.stderr, flush=True)
                    await anyio.sleep_forever()
                tasks.cancel_scope.cancel()

    anyio.run(run, backend="asyncio")  # uvicorn, the SDK's HTTP server, needs asyncio
    return 0


async def _cancel_on_signal(scope: anyio.CancelScope) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            scope.cancel()


async def _serve_stdio(server: Server[Any]) -> None:
    from mcp.server.stdio import stdio_server

    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())


async def serve_http(
    server: Server[Any],
    *,
    host: str,
    port: int,
    token: str | None,
    task_status: anyio.abc.TaskStatus[str] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `server` over streamable HTTP at `http://host:port/mcp` (port 0: a free one)
    until cancelled; `task_status.started` gets the URL once the socket listens. With
    `token`, every request needs `Authorization: Bearer <token>` (`BearerAuth`).

    Cancellation: uvicorn stops accepting, answers or drops the requests in flight within
    `SHUTDOWN_S`, and the call returns; the caller's memory closes after that.
    """
    app: Any = server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    if token is not None:
        app = BearerAuth(app, token)
    sock = bind_socket(host, port)
    url = shown_url(sock, host, MCP_PATH)
    http = _uvicorn_server(app)
    stopped = anyio.Event()

    async def run() -> None:
        try:
            with anyio.CancelScope(shield=True):  # stopped by `should_exit`, never midway
                await http.serve(sockets=[sock])
        finally:
            stopped.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(run)
        task_status.started(url)
        try:
            await stopped.wait()
        finally:
            http.should_exit = True
            with anyio.CancelScope(shield=True):
                await stopped.wait()


def _uvicorn_server(app: Any) -> Any:
    """uvicorn (the SDK's own HTTP server) serving `app`, leaving the signals to us."""
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # `serve` handles them: see there
            yield

    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_S,
    )
    return Server(config)
