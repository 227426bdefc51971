"""`activememory serve`: the HTTP/JSON API over the public API (docs/design.md §12.1).

One process owns the state (`open_memory`) and serves many clients: a Starlette app served
by hypercorn, under trio (the default) or asyncio. Every endpoint is one call of `Memory`,
`Sessions` or `Records`; no rule of the library is written here again. Bodies are msgspec
Structs (`protocol/service.py` and the library's own), and `/openapi.json` is generated
from the same Structs.

What the server adds, in `Guard` (before any body is read) and `_endpoint`:

- authentication: with tokens configured, `Authorization: Bearer <token>` on every request,
  compared in constant time against each token (`hmac.compare_digest`); a wrong or missing
  one is 401 with an empty body. A non-loopback bind without a token refuses to start.
- the caller: a token may be bound to one session key (`--caller-token KEY=TOKEN`); its
  requests act as that conversation only (see `Principal`). The host's token acts as any.
- a request size limit (413), a per-client token-bucket rate limit (429, `Retry-After`),
- errors: a body that does not decode is 400/422 naming the JSON path and what is allowed,
  and nothing is called; the library's `InvalidInputError` is 422 with its message; any
  other failure is 500 with a fixed message, logged with secrets redacted.
- cancellation: a client that disconnects cancels its request's call, which then behaves
  as that call documents on cancellation (`Sessions.append`: nothing written if it was not
  yet queued, else it may still commit; `Memory.recall`: reads finish on their thread, a
  run in the pool goes on until its budget ends).
"""

from __future__ import annotations

import logging
import os
import socket
import types
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._doctor import DoctorCheck
from .._memory import Memory
from .._redaction import Redactor
from ..protocol.errors import (
    InvalidInputError,
    MemoryClosedError,
    SessionNotFoundError,
    StorageError,
)
from ..protocol.recall import RecallOutcome, Sender, Turn
from ..protocol.record_results import RecordSearchResult
from ..protocol.records import NOT_SET, RankingError, RecordRelation, TopKMemorySearchConfig
from ..protocol.search import SearchResult
from ..protocol.service import (
    AppendBody,
    CommandBody,
    CommandReply,
    Events,
    HistoryBody,
    Ok,
    PrefixReply,
    Problem,
    RecordAddBody,
    RecordId,
    RecordInvalidateBody,
    RecordLinkBody,
    RecordResults,
    RecordSearchBody,
    RewindBody,
    SearchBody,
    Stats,
    TurnBody,
)
from ..protocol.transcript import Event
from .auth import bearer_match, bind_socket, check_token, expand_env, is_loopback

log = logging.getLogger("activememory.serve")

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8787
DEFAULT_MAX_BODY_BYTES: Final = 4 * 1024 * 1024
"""A message's content may be 1 MiB (`MAX_CONTENT_BYTES`), up to twice that as escaped JSON."""
DEFAULT_RATE: Final = 200.0
"""Requests per second per client (its token, or its address without one)."""
DEFAULT_BURST: Final = 400
TOKEN_ENV: Final = "ACTIVEMEMORY_TOKEN"
INTERNAL_ERROR: Final = "internal error; the server log has the details"
_MAX_BUCKETS = 10_000
_DRAIN_BYTES = 1024 * 1024  # an oversized body without a content-length: read this much more


class Doctor(msgspec.Struct, frozen=True, kw_only=True):
    """`mem.doctor()`: `ok` when no finding is an error."""

    ok: bool
    checks: list[DoctorCheck]


@dataclass(frozen=True)
class Principal:
    """Who a request is, from its token.

    `caller` None: the host (a bot gateway), trusted to say which conversation is asking,
    as an in-process host is; the library then enforces what that conversation may see.
    `caller` set (a token bound to one session key): every session key the request names
    (`session_key`, `caller`, a turn's key) must be that one, a command's sender is never
    the owner, and the store-wide endpoints (records, doctor, stats) are refused (403).
    """

    caller: str | None = None
    key: str = "anonymous"


class ServeOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How `serve` listens and guards. `tokens`: token -> the caller it is bound to (None:
    the host's token, any caller)."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    tokens: dict[str, str | None] = {}
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    rate: float = DEFAULT_RATE
    burst: int = DEFAULT_BURST


def check_bind(options: ServeOptions) -> None:
    """Refuse a bind that would expose the store without authentication."""
    if not is_loopback(options.host) and not options.tokens:
        raise InvalidInputError(
            f"--host: {options.host!r} is not a loopback address, and no token is set; "
            f"give one with --token (or ${TOKEN_ENV}, or `serve.token` in the config) "
            "so that only clients holding it are served"
        )
    if options.max_body_bytes < 1024:
        raise InvalidInputError(f"--max-body-bytes: {options.max_body_bytes} is below 1024")
    if options.rate < 0 or options.burst < 1:
        raise InvalidInputError("--rate-limit: must be 0 (off) or more, with a burst of 1 or more")


class RateLimiter:
    """A token bucket per client: `rate` requests per second, up to `burst` at once.
    `rate` 0 turns it off."""

    def __init__(self, rate: float, burst: int) -> None:
        self.rate = rate
        self.burst = burst
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)

    def wait(self, key: str, now: float) -> float:
        """0 if `key` may go now (and count it), else the seconds until it may."""
        if self.rate <= 0:
            return 0.0
        tokens, when = self._buckets.get(key, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + (now - when) * self.rate)
        if tokens < 1:
            self._buckets[key] = (tokens, now)
            return (1 - tokens) / self.rate
        if len(self._buckets) >= _MAX_BUCKETS and key not in self._buckets:
            self._buckets.clear()  # forgetting full buckets is harmless; a flood of addresses
        self._buckets[key] = (tokens - 1, now)
        return 0.0


class _BodyTooLarge(Exception):
    pass


class Guard:
    """The ASGI layer in front of the app: authentication, rate limit, size limit."""

    def __init__(self, app: ASGIApp, options: ServeOptions) -> None:
        self.app = app
        self.tokens = [
            (t.encode(), Principal(caller=caller, key=f"token{i}"))
            for i, (t, caller) in enumerate(options.tokens.items())
        ]
        self.max_body = options.max_body_bytes
        self.limiter = RateLimiter(options.rate, options.burst)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        principal = self._authenticate(scope)
        if principal is None:
            await _plain(send, 401, b"", [(b"www-authenticate", b"Bearer")])
            return
        retry = self.limiter.wait(principal.key, anyio.current_time())
        if retry > 0:
            body = _encode(Problem(error="rate limit: too many requests; retry after a pause"))
            headers = [(b"retry-after", str(max(1, round(retry + 0.5))).encode())]
            await _plain(send, 429, body, headers)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _plain(send, 413, self._too_large())
            return
        scope["activememory.principal"] = principal
        scope["activememory.max_body"] = self.max_body
        await self.app(scope, receive, send)

    def _too_large(self) -> bytes:
        return _encode(Problem(error=f"body: over the limit of {self.max_body} bytes"))

    def _authenticate(self, scope: Scope) -> Principal | None:
        if not self.tokens:
            client = scope.get("client")
            return Principal(key=str(client[0]) if client else "anonymous")
        header = dict(scope["headers"]).get(b"authorization", b"")
        return bearer_match(header, self.tokens)


async def _plain(
    send: Send, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    kind = [(b"content-type", b"application/json")] if body else []
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-length", str(len(body)).encode()), *kind, *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


_encode = msgspec.json.Encoder().encode


class _Refused(Exception):
    """A 4xx decided here (a bound caller's limits), with its Problem."""

    def __init__(self, status: int, problem: Problem | None) -> None:
        self.status = status
        self.problem = problem


# --- the endpoints: one public call each --------------------------------------------------

Handler = Callable[[Memory, Any, Principal], Awaitable[msgspec.Struct]]


@dataclass(frozen=True)
class Endpoint:
    """One route: `body` decodes the request (None: no body), `answer` is what it returns."""

    method: Literal["GET", "POST"]
    path: str
    body: type[msgspec.Struct] | None
    answer: Any
    handler: Handler
    summary: str
    store_wide: bool = False
    errors: tuple[int, ...] = field(default=(400, 401, 403, 404, 413, 422, 429, 500, 503))


def _own(principal: Principal, *keys: str | None) -> None:
    """A bound caller names only its own session (403 with no detail otherwise)."""
    if principal.caller is not None and any(k not in (None, principal.caller) for k in keys):
        raise _Refused(403, None)


async def _append(mem: Memory, body: AppendBody, who: Principal) -> Event:
    _own(who, body.session_key)
    return await mem.sessions.append(body.session_key, body.message)


async def _rewind(mem: Memory, body: RewindBody, who: Principal) -> Ok:
    _own(who, body.session_key)
    await mem.sessions.rewind(body.session_key, body.to_event_id)
    return Ok()


async def _history(mem: Memory, body: HistoryBody, who: Principal) -> Events:
    _own(who, body.session_key)
    return Events(events=await mem.sessions.history(body.session_key, limit=body.limit))


async def _search(mem: Memory, body: SearchBody, who: Principal) -> SearchResult:
    _own(who, body.caller)
    session_key = body.session_key
    configured = mem.config.search.visibility
    if body.visibility not in (None, "self", configured):
        raise InvalidInputError(
            f"visibility: {body.visibility!r} is not allowed here (allowed: 'self', or the "
            f"server's tools.sessions.visibility {configured!r}; a client cannot widen it)"
        )
    if body.visibility == "self":  # the caller's own session: narrowing, by `session_key`
        if session_key not in (None, body.caller):
            raise InvalidInputError(
                "session_key: with visibility 'self' it can only be the caller's own session"
            )
        session_key = body.caller
    return await mem.sessions.search(
        body.query,
        caller=body.caller,
        session_key=session_key,
        limit=body.limit,
        match=body.match,
        mode=body.mode,
    )


def _turn(body: TurnBody, who: Principal) -> Turn:
    _own(who, body.session_key)
    return Turn(
        session_key=body.session_key,
        messages=body.messages,
        trigger=body.trigger,
        surface=body.surface,
        model=body.model,
    )


async def _recall(mem: Memory, body: TurnBody, who: Principal) -> RecallOutcome:
    # Fails open as the library does: a timeout is `status: "timeout"`, a 200.
    return await mem.recall(_turn(body, who))


async def _prefix(mem: Memory, body: TurnBody, who: Principal) -> PrefixReply:
    """`mem.reply` with the host's model left out: the composer stores the user message
    and recalls; the stand-in `respond` keeps the prefix and answers "", which the composer
    does not store. The host stores its model's answer with /v1/sessions/append."""
    turn = _turn(body, who)
    kept: list[str | None] = []

    async def respond(prompt_prefix: str | None, _turn: Turn) -> str:
        kept.append(prompt_prefix)
        return ""

    reply = await mem.reply(turn, respond)
    return PrefixReply(
        prompt_prefix=kept[0] if kept else None,
        outcome=reply.outcome,
        followups=list(reply.followups),
        user_event_id=reply.user_event_id,
        problems=list(reply.problems),
    )


async def _command(mem: Memory, body: CommandBody, who: Principal) -> CommandReply:
    _own(who, body.session_key)
    sender = Sender(owner=body.sender.owner, scopes=tuple(body.sender.scopes), id=body.sender.id)
    if who.caller is not None:  # a user's own client never speaks as the owner
        sender = Sender(id=body.sender.id)
    return CommandReply(reply=await mem.command(body.session_key, body.text, sender=sender))


async def _record_add(mem: Memory, body: RecordAddBody, _: Principal) -> RecordId:
    record_id = await mem.records.add(
        body.content,
        user_id=body.user_id,
        agent_id=body.agent_id,
        thread_id=body.thread_id,
        record_type=body.record_type,
        metadata=body.metadata,
        timestamp=body.timestamp,
        expires_at=body.expires_at,
        role=body.role,
    )
    return RecordId(id=record_id)


async def _record_link(mem: Memory, body: RecordLinkBody, _: Principal) -> RecordRelation:
    return await mem.records.link(body.source_id, body.target_id, relation=body.relation)


async def _record_invalidate(mem: Memory, body: RecordInvalidateBody, _: Principal) -> Ok:
    await mem.records.invalidate(body.id, reason=body.reason)
    return Ok()


def _given(value: Any) -> Any:
    return NOT_SET if value is msgspec.UNSET else value


async def _record_search(mem: Memory, body: RecordSearchBody, _: Principal) -> RecordResults:
    if body.layer == "thread":
        if body.thread is None:
            raise InvalidInputError(
                "thread: required with layer 'thread' (user_id, agent_id, thread_id)"
            )
        layer: Any = mem.records.thread(
            user_id=body.thread.user_id,
            agent_id=body.thread.agent_id,
            thread_id=body.thread.thread_id,
        )
    elif body.thread is not None:
        raise InvalidInputError(f"thread: only with layer 'thread', not {body.layer!r}")
    else:
        layer = mem.records.store if body.layer == "store" else mem.records
    config = None
    if body.max_results is not None:
        if not 1 <= body.max_results <= 100:
            raise InvalidInputError(f"max_results: {body.max_results} is not from 1 to 100")
        config = TopKMemorySearchConfig(max_results=body.max_results)
    results: list[RecordSearchResult] = await layer.search(
        body.query,
        user_id=_given(body.user_id),
        agent_id=_given(body.agent_id),
        thread_id=_given(body.thread_id),
        exact_user_match=_given(body.exact_user_match),
        exact_agent_match=_given(body.exact_agent_match),
        exact_thread_match=_given(body.exact_thread_match),
        include_invalid_results=_given(body.include_invalid_results),
        num_hops=body.num_hops,
        max_linked_results=body.max_linked_results,
        record_types=body.record_types,
        metadata_filter=body.metadata_filter,
        config=config,
    )
    return RecordResults(results=results, formatted=[r.formatted_content for r in results])


async def _doctor(mem: Memory, _body: None, _: Principal) -> Doctor:
    report = await mem.doctor()
    return Doctor(ok=report.ok, checks=list(report.checks))


async def _stats(mem: Memory, _body: None, _: Principal) -> Stats:
    return Stats(agents=await mem.sessions.stats(check_integrity=False))


ENDPOINTS: Final = (
    Endpoint("POST", "/v1/sessions/append", AppendBody, Event, _append,
             "Append a message at the session's leaf; the stored event"),
    Endpoint("POST", "/v1/sessions/rewind", RewindBody, Ok, _rewind,
             "Move the session's leaf back to an earlier event"),
    Endpoint("POST", "/v1/sessions/history", HistoryBody, Events, _history,
             "The session's active branch, oldest first"),
    Endpoint("POST", "/v1/sessions/search", SearchBody, SearchResult, _search,
             "Search what `caller` may see"),
    Endpoint("POST", "/v1/recall", TurnBody, RecallOutcome, _recall,
             "Run the recall step for a turn (fails open: a timeout is a status)"),
    Endpoint("POST", "/v1/turns/prefix", TurnBody, PrefixReply, _prefix,
             "Store the latest user message and recall: the hidden block for the host's model"),
    Endpoint("POST", "/v1/commands", CommandBody, CommandReply, _command,
             "Handle /active-memory, /verbose or /trace"),
    Endpoint("POST", "/v1/records/add", RecordAddBody, RecordId, _record_add,
             "Store a record", store_wide=True),
    Endpoint("POST", "/v1/records/link", RecordLinkBody, RecordRelation, _record_link,
             "Link two records", store_wide=True),
    Endpoint("POST", "/v1/records/invalidate", RecordInvalidateBody, Ok, _record_invalidate,
             "Mark a record invalid, with a reason", store_wide=True),
    Endpoint("POST", "/v1/records/search", RecordSearchBody, RecordResults, _record_search,
             "Search records at one scope layer", store_wide=True),
    Endpoint("GET", "/v1/doctor", None, Doctor, _doctor, "Check the setup", store_wide=True),
    Endpoint("GET", "/v1/stats", None, Stats, _stats, "Index statistics per agent",
             store_wide=True),
)  # fmt: skip


# --- decoding, errors, cancellation -------------------------------------------------------


def _status_of(exc: BaseException) -> tuple[int, Problem] | None:
    """The 4xx/503 a library error is, or None for a failure that is ours (500)."""
    if isinstance(exc, SessionNotFoundError):
        return 404, Problem(error=str(exc))
    if isinstance(exc, InvalidInputError):
        return 422, Problem(error=str(exc))
    if isinstance(exc, MemoryClosedError):
        return 503, Problem(error="the memory is closing")
    if isinstance(exc, StorageError | RankingError):
        return 503, Problem(error=str(exc))
    return None


def validation_problem(error: msgspec.ValidationError, root: type[msgspec.Struct]) -> Problem:
    """A `msgspec.ValidationError` as a Problem: the JSON path (`$` for the body itself),
    what was wrong, and what is allowed: a choice's values (a Literal, an enum, a tagged
    union's tags) or an object's fields."""
    text = str(error)
    reason, sep, where = text.rpartition(" - at `")
    path, reason = (where.rstrip("`"), reason) if sep else ("$", text)
    steps = path.removeprefix("$").replace("[", ".[").split(".")[1:]
    allowed: tuple[object, ...] = ()
    if "unknown field" in reason:
        found = _type_at(root, steps)
        if isinstance(found, type) and issubclass(found, msgspec.Struct):
            allowed = found.__struct_fields__
    elif reason.startswith("Invalid"):
        allowed = tuple(repr(a) for a in _choices(root, steps))
    if allowed:
        reason = f"{reason} (allowed: {', '.join(map(str, allowed))})"
    return Problem(error=f"{path}: {reason}", field=path)


def _type_at(root: Any, steps: Sequence[str]) -> Any:
    """The declared type at a JSON path's `steps` (`["message", "role"]`); Any if unknown."""
    current = root
    for step in steps:
        current = _one_struct_or_list(current)
        if step.startswith("["):
            args = typing.get_args(current)
            current = args[0] if args else Any
        elif isinstance(current, type) and issubclass(current, msgspec.Struct):
            current = typing.get_type_hints(current).get(step, Any)
        else:
            return Any
    return current


def _choices(root: Any, steps: Sequence[str]) -> tuple[object, ...]:
    """The values the choice at `steps` allows; () if it is not a choice."""
    if steps:  # the tag field of a tagged union (a content block's `type`)
        members = typing.get_args(_type_at(root, steps[:-1]))
        configs = [getattr(m, "__struct_config__", None) for m in members]
        if members and all(c is not None and c.tag_field == steps[-1] for c in configs):
            return tuple(c.tag for c in configs if c is not None)
    current = _type_at(root, steps)
    for candidate in (current, *typing.get_args(current)):
        if typing.get_origin(candidate) is Literal:
            return typing.get_args(candidate)
        if isinstance(candidate, type) and hasattr(candidate, "__members__"):
            return tuple(m.value for m in candidate.__members__.values())
    return ()


def _one_struct_or_list(t: Any) -> Any:
    """Unwrap `X | None` (and other unions) to the member a path step can go into."""
    args = typing.get_args(t)
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        for a in args:
            if (isinstance(a, type) and issubclass(a, msgspec.Struct)) or typing.get_origin(a) in (
                list,
                tuple,
            ):
                return a
    return t


async def _read_body(request: Request) -> bytes:
    limit: int = request.scope.get("activememory.max_body", DEFAULT_MAX_BODY_BYTES)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit + _DRAIN_BYTES:
            raise _BodyTooLarge  # the connection is closed under a client still sending
        if size <= limit:
            chunks.append(chunk)
    if size > limit:  # read to its end, so that the client, done sending, reads the 413
        raise _BodyTooLarge
    return b"".join(chunks)


class _Disconnected(Exception):
    pass


async def _until_disconnect(receive: Receive, work: Callable[[], Awaitable[Any]]) -> Any:
    """Run `work()`; a client disconnect cancels it (`_Disconnected`)."""
    done: list[Any] = []
    failed: list[Exception] = []

    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while True:
                message: Message = await receive()
                if message["type"] == "http.disconnect":
                    tg.cancel_scope.cancel()
                    return

        tg.start_soon(watch)
        try:
            done.append(await work())
        except Exception as exc:
            failed.append(exc)
        tg.cancel_scope.cancel()
    if failed:
        raise failed[0]
    if not done:
        raise _Disconnected
    return done[0]


def _json(status: int, value: msgspec.Struct) -> Response:
    return Response(_encode(value), status_code=status, media_type="application/json")


def _route(memory: Memory, endpoint: Endpoint, redactor: Redactor) -> Route:
    async def run(request: Request) -> Response:
        principal: Principal = request.scope.get("activememory.principal", Principal())
        try:
            if endpoint.store_wide and principal.caller is not None:
                raise _Refused(403, None)
            body = None
            if endpoint.body is not None:
                raw = await _read_body(request)
                try:
                    body = msgspec.json.decode(raw, type=endpoint.body)
                except msgspec.ValidationError as exc:
                    return _json(422, validation_problem(exc, endpoint.body))
                except msgspec.DecodeError as exc:
                    return _json(400, Problem(error=f"body: not a JSON object ({exc})"))
            result = await _until_disconnect(
                request.receive, lambda: endpoint.handler(memory, body, principal)
            )
            return _json(200, result)
        except _BodyTooLarge:
            limit = request.scope.get("activememory.max_body", DEFAULT_MAX_BODY_BYTES)
            return _json(413, Problem(error=f"body: over the limit of {limit} bytes"))
        except _Refused as exc:
            if exc.problem is None:
                return Response(b"", status_code=exc.status)
            return _json(exc.status, exc.problem)
        except _Disconnected:
            return Response(b"", status_code=499)  # nobody reads it
        except Exception as exc:
            known = _status_of(exc)
            if known is not None:
                return _json(known[0], known[1])
            log.error("%s %s failed:\n%s", request.method, endpoint.path, redactor.traceback(exc))
            return _json(500, Problem(error=INTERNAL_ERROR))

    return Route(endpoint.path, run, methods=[endpoint.method])


# --- the OpenAPI document -----------------------------------------------------------------


def openapi(endpoints: Sequence[Endpoint] = ENDPOINTS) -> dict[str, Any]:
    """The OpenAPI 3.1 document, its schemas generated from the bodies' Structs."""
    types: list[Any] = [Problem]
    for e in endpoints:
        types.extend([e.answer] if e.body is None else [e.body, e.answer])
    schemas, components = msgspec.json.schema_components(
        types, ref_template="#/components/schemas/{name}"
    )
    refs = dict(zip(map(id, types), schemas, strict=True))
    error = {"content": {"application/json": {"schema": refs[id(Problem)]}}}
    paths: dict[str, Any] = {}
    for e in endpoints:
        responses: dict[str, Any] = {
            "200": {
                "description": e.summary,
                "content": {"application/json": {"schema": refs[id(e.answer)]}},
            }
        }
        for status in e.errors:
            responses[str(status)] = {"description": _REASONS[status], **error}
        responses["401"] = {"description": _REASONS[401]}
        operation: dict[str, Any] = {
            "summary": e.summary,
            "operationId": e.path.removeprefix("/v1/").replace("/", "_"),
            "responses": responses,
        }
        if e.body is not None:
            operation["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": refs[id(e.body)]}},
            }
        paths[e.path] = {e.method.lower(): operation}
    return {
        "openapi": "3.1.0",
        "info": {"title": "activememory", "version": "1", "description": __doc__.split("\n")[0]},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],
    }


_REASONS: Final = {
    400: "The body is not JSON",
    401: "No or a wrong bearer token (no body)",
    403: "Not this token's caller (no body)",
    404: "No such session",
    413: "The body is over the size limit",
    422: "Bad input: `error` names the field and what is allowed; nothing changed",
    429: "Rate limit; see Retry-After",
    500: "An internal error (a fixed message; the log has the details)",
    503: "Storage trouble or the memory is closing",
}


# --- the app and the server ---------------------------------------------------------------


def build_app(
    memory: Memory,
    options: ServeOptions,
    *,
    ui: Sequence[BaseRoute] | None = None,
    endpoints: Sequence[Endpoint] = ENDPOINTS,
) -> ASGIApp:
    """The ASGI app: `Guard` in front of the routes of `endpoints`, `/openapi.json`, and
    the inspector's routes under `/ui` when given."""
    redactor = Redactor(memory.config.search.redact_patterns)
    document = _encode(openapi(endpoints))

    async def schema(_: Request) -> Response:
        return Response(document, media_type="application/json")

    routes: list[BaseRoute] = [_route(memory, e, redactor) for e in endpoints]
    routes.append(Route("/openapi.json", schema, methods=["GET"]))
    if ui is not None:
        routes.append(Mount("/ui", routes=list(ui)))
    return Guard(Starlette(routes=routes), options)


def load_inspector() -> Callable[[Memory], Sequence[BaseRoute]]:
    """The inspector page's `routes(memory)` (`activememory serve --ui`), imported only
    then (docs/design.md §12.3)."""
    from .inspector import routes

    return routes


async def serve(
    app: ASGIApp,
    sock: socket.socket,
    *,
    shutdown: anyio.Event,
) -> None:
    """Serve `app` on the listening `sock` with hypercorn until `shutdown` is set, under the
    running backend (trio or asyncio). Requests in flight finish first (graceful, at most
    5 s). `sock` stays the caller's to close.

    Cancellation: cancelling the call stops the server at once: connections are closed and
    the requests in flight are cancelled (each as its library call documents).
    """
    import sniffio
    from hypercorn.config import Config as HypercornConfig

    config = HypercornConfig()
    config.bind = [f"fd://{os.dup(sock.fileno())}"]  # hypercorn closes its copy; we ours
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 5.0
    config.keep_alive_timeout = 30.0
    trigger = shutdown.wait
    if sniffio.current_async_library() == "trio":
        from hypercorn.trio import serve as hypercorn_serve
    else:
        from hypercorn.asyncio import serve as hypercorn_serve  # type: ignore[assignment]
    await hypercorn_serve(app, config, shutdown_trigger=trigger)  # type: ignore[arg-type]


def options_from(
    *,
    host: str,
    port: int,
    token: str | None,
    caller_tokens: Sequence[str],
    config_raw: Mapping[str, Any],
    max_body_bytes: int,
    rate: float,
    burst: int,
) -> ServeOptions:
    """The options of `activememory serve`: the host's token from `--token`, else the
    config's `serve.token`, else `$ACTIVEMEMORY_TOKEN` (`${NAME}` expanded in the first
    two); `--caller-token KEY=TOKEN` binds a token to one caller."""
    tokens: dict[str, str | None] = {}
    section = config_raw.get("serve") if isinstance(config_raw, Mapping) else None
    from_config = section.get("token") if isinstance(section, Mapping) else None
    if token is not None:
        host_token = expand_env("--token", token)
    elif isinstance(from_config, str):
        host_token = expand_env("serve.token", from_config)
    else:
        host_token = os.environ.get(TOKEN_ENV, "")
    if host_token:
        tokens[host_token] = None
    from ..protocol.session_key import parse_session_key

    for item in caller_tokens:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise InvalidInputError(f"--caller-token: {item!r} is not KEY=TOKEN")
        parse_session_key(key, field="--caller-token")
        tokens[expand_env("--caller-token", value)] = key
    for t, caller in tokens.items():
        check_token("--token" if caller is None else "--caller-token", t)
    options = ServeOptions(
        host=host,
        port=port,
        tokens=tokens,
        max_body_bytes=max_body_bytes,
        rate=rate,
        burst=burst,
    )
    check_bind(options)
    return options


__all__ = [
    "ENDPOINTS",
    "Guard",
    "Principal",
    "RateLimiter",
    "ServeOptions",
    "bind_socket",
    "build_app",
    "check_bind",
    "load_inspector",
    "openapi",
    "options_from",
    "serve",
]
