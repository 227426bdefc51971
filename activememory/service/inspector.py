"""The inspector page (docs/design.md §12.3): server-rendered HTML over the public API.

`routes(memory)` gives the Starlette routes, relative to wherever they are mounted
(`activememory serve --ui` mounts them under `/ui`): an overview, the sessions and their
active branches, a search run as a chosen caller (what it sees, and which matching
sessions it may not see and why), a recall runner (status and debug lines, the hidden
block, the sub-agent transcript and the evidence behind it), the breakers and the recall
cache, and the records with their linked context drawn as a small SVG graph.

Read-mostly: every view is a read, except the recall runner, which runs a recall when the
user submits it (POST): that recall writes what any recall writes (the notes index, when
its rescan finds a change; the sub-agent transcript, when `persistTranscripts` is on and
the memory is not read-only; the recall cache and breakers, in memory). No JavaScript:
links and forms only. Every value shown is escaped (messages and records are untrusted),
and a Content-Security-Policy that allows no script backs that up.
"""

from __future__ import annotations

import datetime as dt
import html
import json
import urllib.parse
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, cast

import msgspec
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import BaseRoute, Route

import activememory as am

MAX_SESSIONS_CHECKED = 200
"""The most sessions a search page checks one by one for what the caller may not see."""
MAX_HISTORY = 500
"""The most events of an active branch a session page shows (the latest ones)."""
_SEARCH_MODES = ("text", "hybrid")
_MATCH_MODES = ("phrase", "prefix")
_HEADERS = {
    # No script may run, whatever a stored message holds: escaping is the rule, this the net.
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; "
        "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#1f3a5f;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}
header .mode{margin-left:auto;font-size:12px;opacity:.85}
main{padding:12px 16px;max-width:1200px}
table{border-collapse:collapse;background:#fff;margin:8px 0;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#eef1f4}
pre{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #d0d7de;
padding:6px;margin:4px 0}
form{background:#fff;border:1px solid #d0d7de;padding:8px;margin:8px 0}
label{margin-right:12px}
.error{background:#ffebe9;border:1px solid #cf222e;padding:8px}
.ok{color:#1a7f37}.warn{color:#9a6700}.bad{color:#cf222e}
.muted{color:#57606a}
svg{background:#fff;border:1px solid #d0d7de}
"""

Handler = Callable[[Request], Awaitable[HTMLResponse]]


def routes(memory: am.Memory) -> list[BaseRoute]:
    """The inspector's routes over `memory`, relative to their mount point.

    Links are built from the request's `root_path`, so the page works under any prefix.
    """
    pages, ro = _Pages(memory), memory.readonly
    return [
        Route("/", _page(pages.overview, ro), name="inspector_overview"),
        Route("/sessions", _page(pages.sessions, ro), name="inspector_sessions"),
        Route("/sessions/{key:path}", _page(pages.session, ro), name="inspector_session"),
        Route("/search", _page(pages.search, ro), name="inspector_search"),
        Route("/recall", _page(pages.recall, ro), methods=["GET", "POST"], name="inspector_recall"),
        Route("/state", _page(pages.state, ro), name="inspector_state"),
        Route("/records", _page(pages.records, ro), name="inspector_records"),
        Route("/records/{id}", _page(pages.record, ro), name="inspector_record"),
    ]


def _page(handler: Handler, readonly: bool) -> Handler:
    """Bad input is a 400 page naming the field; a missing session or record a 404."""

    async def run(request: Request) -> HTMLResponse:
        request.state.inspector_readonly = readonly  # shown in every page's header
        try:
            return await handler(request)
        except (am.InvalidInputError, am.ConfigError) as exc:
            return _error(request, 400, "Bad input", str(exc))
        except (_NotFound, am.SessionNotFoundError) as exc:
            return _error(request, 404, "Not found", str(exc))
        except am.ActiveMemoryError as exc:
            return _error(request, 500, "The memory could not answer", str(exc))

    return run


class _NotFound(Exception):
    """A record the page was asked for does not exist."""


class _Pages:
    """One method per view; each reads `memory` through its public API only."""

    def __init__(self, memory: am.Memory) -> None:
        self.mem = memory

    # -- overview -------------------------------------------------------------------------

    async def overview(self, request: Request) -> HTMLResponse:
        stats = await self.mem.sessions.stats(check_integrity=False)
        rows = [
            [
                s.agent,
                s.sessions,
                s.events,
                s.active_messages,
                s.indexed_messages,
                s.dirty_sessions,
                s.vectors_pending,
                s.embedder or "none",
            ]
            for s in stats
        ]
        cache = self.mem.recall_cache_info()
        breakers = self.mem.breaker_states()
        open_ = sum(1 for b in breakers if b.state != "closed")
        body = [
            _p(f"State directory: {self.mem.state_dir}"),
            "<h2>Agents</h2>",
            _table(
                [
                    "agent",
                    "sessions",
                    "events",
                    "active messages",
                    "indexed",
                    "re-indexing",
                    "vectors pending",
                    "embedder",
                ],
                rows,
            )
            if rows
            else _p("No agent database yet."),
            "<h2>Recall</h2>",
            _p(
                f"Cache: {cache.entries} of {cache.max_entries} entries, TTL {cache.ttl_ms} ms. "
                f"Breakers: {len(breakers)}, {open_} not closed."
            ),
            _p(
                "Views: "
                + ", ".join(
                    _link(request, path, name)
                    for path, name in (
                        ("/sessions", "sessions and their active branches"),
                        ("/search", "search as a caller"),
                        ("/recall", "recall runner"),
                        ("/state", "breakers, cache and doctor"),
                        ("/records", "records and their linked context"),
                    )
                ),
                escape=False,
            ),
        ]
        return _html(request, "Overview", body)

    # -- sessions -------------------------------------------------------------------------

    async def sessions(self, request: Request) -> HTMLResponse:
        agent = _param(request, "agent") or None
        infos = await self.mem.sessions.list(agent=agent, archived=None)
        rows = [
            [
                _Raw(_link(request, _session_path(i.key), i.key)),
                i.agent or "",
                i.chat_type,
                _when(i.updated_at),
                "" if i.leaf_event_id is None else i.leaf_event_id,
                i.revision,
                _flags(i),
                i.spawned_by or "",
            ]
            for i in infos
        ]
        head = [
            "session",
            "agent",
            "chat",
            "updated (UTC)",
            "branch leaf",
            "revision",
            "state",
            "spawned by",
        ]
        body = [
            _p(f"{len(infos)} sessions. Open one to see its active branch."),
            _table(head, rows) if rows else _p("No sessions stored."),
        ]
        return _html(request, "Sessions", body)

    async def session(self, request: Request) -> HTMLResponse:
        key = request.path_params["key"]
        info = await self.mem.sessions.info(key)
        events = await self.mem.sessions.history(key, limit=MAX_HISTORY)
        facts: list[list[Any]] = [
            ["key", info.key],
            ["agent", info.agent or ""],
            ["chat type", info.chat_type],
            ["created / updated (UTC)", f"{_when(info.created_at)} / {_when(info.updated_at)}"],
            ["active branch", f"{len(events)} events shown, leaf event {info.leaf_event_id}"],
            ["revision", info.revision],
            ["state", _flags(info) or "indexed"],
            ["indexed up to seq", info.indexed_seq],
            ["spawned by", info.spawned_by or ""],
        ]
        rows = [
            [
                e.id,
                "" if e.parent_id is None else e.parent_id,
                _when(e.timestamp),
                e.kind if e.message is None else e.message.role,
                _Pre(_message_text(e.message)) if e.message is not None else "",
            ]
            for e in events
        ]
        body = [
            _table(["", ""], facts, header=False),
            "<h2>Active branch (oldest first)</h2>",
            _table(["event", "parent", "time (UTC)", "role", "content"], rows)
            if rows
            else _p("No events."),
        ]
        return _html(request, f"Session {key}", body)

    # -- search ---------------------------------------------------------------------------

    async def search(self, request: Request) -> HTMLResponse:
        query = _param(request, "q")
        caller = _param(request, "caller")
        mode = _param(request, "mode") or "text"
        match = _param(request, "match") or "phrase"
        limit = _int_param(request, "limit", 10, 1, 25)
        infos = await self.mem.sessions.list(archived=None)
        form = _form(
            request,
            "/search",
            "get",
            [
                _input("q", "query", query),
                _input("caller", "caller (session key)", caller, options=[i.key for i in infos]),
                _select("mode", "mode", mode, _SEARCH_MODES),
                _select("match", "match", match, _MATCH_MODES),
                _input("limit", "limit", str(limit), size=3),
            ],
            "Search",
        )
        body = [form]
        if not query and not caller:
            body.append(_p("Runs the search as the caller: the caller's visibility decides."))
            return _html(request, "Search", body)
        if not caller:
            raise am.InvalidInputError(
                "caller: required: the session key of the conversation the search runs as"
            )
        found = await self.mem.sessions.search(
            query, caller=caller, limit=limit, mode=cast(Any, mode), match=cast(Any, match)
        )
        notes = []
        if found.indexing:
            notes.append(f"indexing: {found.warning}")
        if found.truncated:
            notes.append("truncated: more matches than shown, or snippets were cut")
        if found.fallback:
            notes.append(f"fallback: {found.fallback}")
        rows = [
            [
                _Raw(_link(request, _session_path(h.session_key), h.session_key)),
                h.role,
                _when(h.timestamp),
                f"{h.score:.4f}",
                h.snippet,
            ]
            for h in found.results
        ]
        body += [
            f"<h2>What {_e(caller)} sees: {len(found.results)} hits</h2>",
            *[_p(n, cls="warn") for n in notes],
            _table(["session", "role", "time (UTC)", "score", "snippet"], rows)
            if rows
            else _p("No visible match."),
        ]
        hidden, unchecked = await self._hidden(query, caller, mode, match, infos)
        body.append(f"<h2>Matching sessions {_e(caller)} may not see: {len(hidden)}</h2>")
        if hidden:
            body.append(_table(["session", "why"], [[key, why] for key, why in hidden]))
        else:
            body.append(_p("None: every session with a match is visible to this caller."))
        if unchecked:
            body.append(
                _p(
                    f"{unchecked} sessions beyond the first {MAX_SESSIONS_CHECKED} "
                    "were not checked.",
                    cls="muted",
                )
            )
        return _html(request, "Search", body)

    async def _hidden(
        self, query: str, caller: str, mode: str, match: str, infos: Sequence[am.SessionInfo]
    ) -> tuple[list[tuple[str, str]], int]:
        """The sessions with a match that `caller` does not get, and why; how many were not
        checked. Each session is asked twice through the public search: as itself (does it
        match at all?) and as the caller, narrowed to it (may the caller see it?). The
        library decides both; the reasons only name the settings and facts behind it."""
        caller_key = am.parse_session_key(caller, field="caller")
        settings = self.mem.config.search
        hidden = []
        for info in infos[:MAX_SESSIONS_CHECKED]:
            if info.key == caller_key.raw:
                continue
            if info.dirty:
                hidden.append((info.key, "being re-indexed: searches skip it until rebuilt"))
                continue
            own = await self.mem.sessions.search(
                query,
                caller=info.key,
                session_key=info.key,
                limit=1,
                mode=cast(Any, mode),
                match=cast(Any, match),
            )
            if not own.results:
                continue
            seen = await self.mem.sessions.search(
                query,
                caller=caller,
                session_key=info.key,
                limit=1,
                mode=cast(Any, mode),
                match=cast(Any, match),
            )
            if not seen.results:
                hidden.append((info.key, _why_hidden(settings, caller_key, info)))
        return hidden, max(0, len(infos) - MAX_SESSIONS_CHECKED)

    # -- recall ---------------------------------------------------------------------------

    async def recall(self, request: Request) -> HTMLResponse:
        fields = dict(request.query_params)  # a GET only fills the form in
        if request.method == "POST":
            fields = {
                k: v[-1]
                for k, v in urllib.parse.parse_qs(
                    (await request.body()).decode(errors="replace"), keep_blank_values=True
                ).items()
            }
        key, text = fields.get("session_key", ""), fields.get("message", "")
        model = fields.get("model", "")
        infos = await self.mem.sessions.list(archived=None)
        form = _form(
            request,
            "/recall",
            "post",
            [
                _input("session_key", "session key", key, options=[i.key for i in infos]),
                _input("message", "user message", text, size=50),
                _input("model", "recall model (optional)", model, size=20),
            ],
            "Run recall",
        )
        body = [
            form,
            _p(
                "A run is a real recall: it uses and fills the recall cache, counts in the "
                "circuit breaker, and writes what a recall writes (see the README).",
                cls="muted",
            ),
        ]
        if request.method != "POST":
            return _html(request, "Recall", body)
        if not text.strip():
            raise am.InvalidInputError("message: required: the user message to recall for")
        turn = am.Turn(
            session_key=key,
            messages=[am.Message(role="user", content=text)],
            model=model or None,
        )
        trace = await self.mem.trace_recall(turn)
        body += _recall_report(trace)
        return _html(request, "Recall", body)

    # -- state ----------------------------------------------------------------------------

    async def state(self, request: Request) -> HTMLResponse:
        breakers = self.mem.breaker_states()
        cache = self.mem.recall_cache_info()
        report = await self.mem.doctor()
        breaker_rows = [
            [
                b.agent,
                b.model,
                _Raw(_status(b.state, b.state == "closed")),
                b.consecutive_timeouts,
                "" if b.reopens_in_ms is None else f"{b.reopens_in_ms:.0f}",
            ]
            for b in breakers
        ]
        checks = [
            [c.name, _Raw(_status(c.level, c.level == "ok")), c.detail, c.fix or ""]
            for c in report.checks
        ]
        body = [
            "<h2>Circuit breakers</h2>",
            _table(
                ["agent", "model", "state", "consecutive timeouts", "probe in (ms)"], breaker_rows
            )
            if breaker_rows
            else _p("No recall has run yet: no breaker."),
            "<h2>Recall cache</h2>",
            _table(
                ["entries", "max entries", "TTL (ms)", "times emptied"],
                [[cache.entries, cache.max_entries, cache.ttl_ms, cache.clears]],
            ),
            f"<h2>Doctor: {'ok' if report.ok else 'problems'}</h2>",
            _table(["check", "level", "detail", "fix"], checks),
        ]
        return _html(request, "Breakers, cache, doctor", body)

    # -- records --------------------------------------------------------------------------

    async def records(self, request: Request) -> HTMLResponse:
        query = _param(request, "q")
        scope = {dim: _param(request, dim) for dim in ("user_id", "agent_id", "thread_id")}
        hops = _int_param(request, "hops", 1, 0, 5)
        form = _form(
            request,
            "/records",
            "get",
            [
                _input("q", "query", query),
                *[
                    _input(dim, dim + " (empty: any)", value, size=14)
                    for dim, value in scope.items()
                ],
                _input("hops", "hops", str(hops), size=2),
            ],
            "Search records",
        )
        body = [form]
        if not query:
            body.append(_p("Searches every scope (the store layer); a filled-in id is exact."))
            return _html(request, "Records", body)
        results = await self.mem.records.store.search(
            query,
            user_id=scope["user_id"] or am.NOT_SET,
            agent_id=scope["agent_id"] or am.NOT_SET,
            thread_id=scope["thread_id"] or am.NOT_SET,
            num_hops=hops,
        )
        body.append(f"<h2>{len(results)} records</h2>")
        for n, result in enumerate(results):
            body.append(_record_card(request, result, f"r{n}"))
        return _html(request, "Records", body)

    async def record(self, request: Request) -> HTMLResponse:
        record_id = request.path_params["id"]
        hops = _int_param(request, "hops", 2, 0, 5)
        result = await self.mem.records.linked(record_id, num_hops=hops)
        if result is None:
            raise _NotFound(f"id: no record {record_id!r} (or it has expired)")
        rec = result.record
        facts: list[list[Any]] = [
            ["id", rec.id],
            ["type / status", f"{rec.record_type.value} / {rec.status.value}"],
            ["invalid because", rec.invalid_reason or ""],
            ["user / agent / thread", f"{rec.user_id} / {rec.agent_id} / {rec.thread_id}"],
            ["time (UTC)", _when(rec.timestamp)],
            ["expires (UTC)", "" if rec.expires_at is None else _when(rec.expires_at)],
            ["role", rec.role or ""],
            ["content", _Pre(rec.content)],
            ["metadata", _Pre(_json(rec.metadata))],
        ]
        edges = [[rel.source_id, rel.relation, rel.target_id] for rel, _ in _walk(result)]
        body = [
            _table(["", ""], facts, header=False),
            f"<h2>Linked context ({hops} hops)</h2>",
            _graph(request, result, "g"),
            _table(["source", "relation", "target"], edges) if edges else "",
            _p(
                _link(request, f"/records/{_q(rec.id)}?hops={min(hops + 1, 5)}", "one hop more"),
                escape=False,
            ),
        ]
        return _html(request, f"Record {rec.id}", body)


# -- rendering helpers ----------------------------------------------------------------------


class _Raw(str):
    """HTML that is already safe: put in as it is."""


class _Pre(str):
    """Text shown preformatted (escaped)."""


def _e(value: object) -> str:
    """`value` as escaped HTML text (attributes too: quotes are escaped)."""
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, _Pre):
        return f"<pre>{html.escape(str(value))}</pre>"
    return html.escape(str(value))


def _p(text: str, *, cls: str = "", escape: bool = True) -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<p{attr}>{_e(text) if escape else text}</p>"


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]], *, header: bool = True) -> str:
    top = "<tr>" + "".join(f"<th>{_e(h)}</th>" for h in head) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{top}{body}</table>"


def _base(request: Request) -> str:
    """Where the inspector is mounted (`/ui` under `serve --ui`), from the ASGI root path."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _link(request: Request, path: str, text: str) -> str:
    return f'<a href="{_e(_base(request) + path)}">{_e(text)}</a>'


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _session_path(key: str) -> str:
    return "/sessions/" + urllib.parse.quote(key, safe=":@")


def _html(request: Request, title: str, body: Sequence[str], status: int = 200) -> HTMLResponse:
    nav = " ".join(
        _link(request, path, name)
        for path, name in (
            ("/", "Overview"),
            ("/sessions", "Sessions"),
            ("/search", "Search"),
            ("/recall", "Recall"),
            ("/state", "Breakers & cache"),
            ("/records", "Records"),
        )
    )
    mode = "read-only" if getattr(request.state, "inspector_readonly", False) else "read-write"
    page = (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{_e(title)} · activememory inspector</title><style>{_CSS}</style></head>"
        f"<body><header><span>activememory</span>{nav}<span class=mode>{_e(mode)}</span>"
        f"</header><main><h1>{_e(title)}</h1>{''.join(body)}</main></body></html>"
    )
    return HTMLResponse(page, status_code=status, headers=_HEADERS)


def _error(request: Request, status: int, title: str, message: str) -> HTMLResponse:
    return _html(request, title, [f'<div class="error">{_e(_Pre(message))}</div>'], status)


def _param(request: Request, name: str) -> str:
    return request.query_params.get(name, "").strip()


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = _param(request, name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise am.InvalidInputError(f"{name}: {raw!r} is not an integer from {low} to {high}")
    return value


def _form(request: Request, path: str, method: str, fields: Sequence[str], submit: str) -> str:
    action = _e(_base(request) + path)
    return (
        f'<form action="{action}" method="{method}">{"".join(fields)}'
        f"<button type=submit>{_e(submit)}</button></form>"
    )


def _input(
    name: str, label: str, value: str, *, size: int = 30, options: Sequence[str] = ()
) -> str:
    """A labelled text input; `options` are offered as suggestions (a datalist)."""
    field = f'<input name="{name}" value="{_e(value)}" size="{size}"'
    if not options:
        return f"<label>{_e(label)} {field}></label>"
    items = "".join(f'<option value="{_e(o)}">' for o in options[:MAX_SESSIONS_CHECKED])
    suggestions = f'<datalist id="{name}-list">{items}</datalist>'
    return f'<label>{_e(label)} {field} list="{name}-list">{suggestions}</label>'


def _select(name: str, label: str, value: str, choices: Sequence[str]) -> str:
    opts = "".join(f"<option{' selected' if c == value else ''}>{_e(c)}</option>" for c in choices)
    return f'<label>{_e(label)} <select name="{name}">{opts}</select></label>'


def _status(text: str, good: bool) -> str:
    return f'<span class="{"ok" if good else "bad"}">{_e(text)}</span>'


def _when(timestamp: float) -> str:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1, default=str)


def _flags(info: am.SessionInfo) -> str:
    flags = [
        name
        for name, on in (
            ("re-indexing", info.dirty),
            ("archived", info.archived),
            ("sandboxed", info.sandboxed),
        )
        if on
    ]
    return ", ".join(flags)


def _message_text(message: am.Message) -> str:
    """A message's text; non-text blocks as their type and JSON."""
    if isinstance(message.content, str):
        return message.content
    parts = []
    for block in message.content:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            parts.append(text)
        else:
            parts.append(f"[{type(block).__name__}] {_json(msgspec.to_builtins(block))}")
    return "\n".join(parts)


def _why_hidden(settings: Any, caller: am.SessionKey, info: am.SessionInfo) -> str:
    """Which setting and which fact keep `info` from `caller` (the library decided)."""
    visibility = settings.visibility
    other_agent = am.parse_session_key(info.key).store_agent != caller.store_agent
    if other_agent and (visibility != "all" or not settings.agent_to_agent):
        return (
            f"another agent's session ({info.agent}): other agents are searched only "
            f"with tools.sessions.visibility 'all' and tools.agentToAgent.enabled "
            f"(now {visibility!r}, {settings.agent_to_agent})"
        )
    if visibility == "self":
        return "tools.sessions.visibility is 'self': a caller sees only its own session"
    if visibility == "tree":
        return (
            "tools.sessions.visibility is 'tree': not the caller's own session nor one it spawned"
        )
    return (
        f"tools.sessions.visibility is {visibility!r}, but the caller is held to its own tree "
        f"(a sandboxed caller, sessionToolsVisibility {settings.sandbox_visibility!r})"
    )


def _recall_report(trace: am.RecallTrace) -> list[str]:
    out = trace.outcome
    facts: list[list[Any]] = [
        ["status", _Raw(_status(out.status, out.status == "ok"))],
        ["reason", out.reason],
        ["elapsed (ms)", f"{out.elapsed_ms:.0f}"],
        ["cached", out.cached],
        ["model", out.model or ""],
        ["paths", ", ".join(out.paths)],
        ["status line", _Pre(out.status_line)],
        ["debug line", _Pre(out.debug_line)],
    ]
    parts = [
        "<h2>Outcome</h2>",
        _table(["", ""], facts, header=False),
        "<h2>Hidden block (the reply model's prompt prefix)</h2>",
        _e(_Pre(out.prompt_prefix)) if out.prompt_prefix else _p("None: nothing is injected."),
    ]
    if trace.run_id is None:
        parts.append(_p("No sub-agent ran (skipped, cached or breaker open): no transcript."))
        return parts
    lines = [
        [f"{line.get('at', 0):.3f}", line.get("type", ""), _Pre(_transcript_detail(line))]
        for line in trace.transcript
    ]
    evidence = [r for r in trace.tool_results if r.evidence]
    other = [r for r in trace.tool_results if not r.evidence]
    parts += [
        f"<h2>Sub-agent transcript ({_e(trace.run_id)})</h2>",
        _table(["at (s)", "type", "detail"], lines),
        f"<h2>Evidence: {len(evidence)} tool results</h2>",
        _table(
            ["tool", "content", "data"],
            [[r.name, _Pre(r.content), _Pre(_json(r.data)) if r.data else ""] for r in evidence],
        )
        if evidence
        else _p("No tool result counts as evidence: no answer can be injected."),
    ]
    if other:
        parts += [
            "<h2>Results that are not evidence</h2>",
            _table(
                ["tool", "error", "content"],
                [[r.name, r.error or "empty", _Pre(r.content)] for r in other],
            ),
        ]
    return parts


def _transcript_detail(line: dict[str, Any]) -> str:
    shown = {k: v for k, v in line.items() if k not in ("at", "type")}
    return _json(shown)


def _walk(result: am.RecordSearchResult) -> list[tuple[am.RecordRelation, am.RecordSearchResult]]:
    out = []
    stack = list(result.linked_results)
    while stack:
        rel, child = stack.pop(0)
        out.append((rel, child))
        stack.extend(child.linked_results)
    return out


def _record_card(request: Request, result: am.RecordSearchResult, tag: str) -> str:
    rec = result.record
    distance = "" if result.distance is None else f"distance {result.distance:.4f} · "
    title = _link(request, f"/records/{_q(rec.id)}", rec.id)
    meta = (
        f"{distance}{rec.record_type.value} · {rec.status.value} · user {rec.user_id} · "
        f"agent {rec.agent_id} · thread {rec.thread_id}"
    )
    graph = _graph(request, result, tag) if result.linked_results else ""
    return f"<h3>{title}</h3><p class=muted>{_e(meta)}</p>{_e(_Pre(rec.content))}{graph}"


_NODE_W, _NODE_H, _COL_W, _ROW_H = 190, 40, 250, 56


def _graph(request: Request, result: am.RecordSearchResult, tag: str) -> str:
    """The record and its linked context as an inline SVG: one column per hop, an arrow
    per stored relation (source to target), each node a link to its record page."""
    columns: list[list[tuple[am.RecordSearchResult, int | None, am.RecordRelation | None]]] = [
        [(result, None, None)]
    ]
    place: dict[str, tuple[int, int]] = {result.record.id: (0, 0)}
    frontier = [result]
    while frontier:
        nxt: list[am.RecordSearchResult] = []
        column: list[tuple[am.RecordSearchResult, int | None, am.RecordRelation | None]] = []
        for parent in frontier:
            parent_row = place[parent.record.id][1]
            for rel, child in parent.linked_results:
                place[child.record.id] = (len(columns), len(column))
                column.append((child, parent_row, rel))
                nxt.append(child)
        if column:
            columns.append(column)
        frontier = nxt
    rows = max(len(c) for c in columns)
    width = 20 + len(columns) * _COL_W
    height = 20 + rows * _ROW_H
    marker = f"arrow-{tag}"
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="linked records">',
        f'<defs><marker id="{marker}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="8" '
        'markerHeight="8" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
        'fill="#57606a"/></marker></defs>',
    ]

    def box(col: int, row: int) -> tuple[int, int]:
        return 10 + col * _COL_W, 10 + row * _ROW_H

    for col, column in enumerate(columns[1:], start=1):
        for row, (child, from_row, via) in enumerate(column):
            assert from_row is not None and via is not None
            px, py = box(col - 1, from_row)
            cx, cy = box(col, row)
            x1, y1, x2, y2 = px + _NODE_W, py + _NODE_H // 2, cx, cy + _NODE_H // 2
            forward = via.source_id != child.record.id  # parent -> child
            end = "marker-end" if forward else "marker-start"
            parts.append(
                f'<line x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="#57606a" '
                f'{end}="url(#{marker})"/>'
                f'<text x="{(x1 + x2) // 2}" y="{(y1 + y2) // 2 - 4}" font-size="11" '
                f'text-anchor="middle" fill="#1f3a5f">{_e(via.relation)}</text>'
            )
    for col, column in enumerate(columns):
        for row, (node, _, _) in enumerate(column):
            x, y = box(col, row)
            rec = node.record
            fill = "#dbe9f8" if col == 0 else "#ffffff"
            dash = ' stroke-dasharray="4 3"' if rec.status.value != "valid" else ""
            label = rec.content if len(rec.content) <= 28 else rec.content[:27] + "…"
            href = _e(_base(request) + f"/records/{_q(rec.id)}")
            parts.append(
                f'<a href="{href}"><title>{_e(rec.content[:300])}</title>'
                f'<rect x="{x}" y="{y}" width="{_NODE_W}" height="{_NODE_H}" rx="6" '
                f'fill="{fill}" stroke="#1f3a5f"{dash}/>'
                f'<text x="{x + 8}" y="{y + 16}" font-size="12" fill="#1b1f24">{_e(label)}</text>'
                f'<text x="{x + 8}" y="{y + 32}" font-size="10" fill="#57606a">'
                f"{_e(rec.id[:12])} · {_e(rec.status.value)}</text></a>"
            )
    parts.append("</svg>")
    return "".join(parts)
