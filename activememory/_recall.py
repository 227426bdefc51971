"""`mem.recall(turn)`: the recall coordinator (docs/design.md §4.9-§4.11).

One recall: a preflight of at most 1500 ms (switches, eligibility, model and tools, what the
sub-agent sees); the cache and the circuit breaker; then the recall work, run by a
sub-agent in the supervisor's recall pool (`actors/recall_pool.py`) with a budget of
`timeoutMs + setupGraceTimeoutMs` that starts when the preflight ends; then the finalize
window of 1500 ms in which the coordinator still waits for the run's report. The
coordinator never waits on the run itself, only on its report, so whatever the model,
tools or disk do, `recall` returns by `timeoutMs + setupGraceTimeoutMs + 3000` ms.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from ._commands import Commands
from ._guards import BreakerInfo, CircuitBreakers, RecallCache
from ._local_model import LocalExtractiveModel
from ._memory_core import MemoryCore
from ._openai_model import model_from_config
from ._output import debug_line, hidden_prefix, status_line, summarize
from ._policy import decide
from ._query import (
    LOCAL_MODEL,
    agent_primary_model,
    build_query_text,
    build_search_query,
    filter_tools_allow,
    latest_user_text,
    resolve_prompt_style,
    resolve_recall_model,
    system_prompt,
)
from ._records import Records, recall_tool
from ._results import judge
from ._search import SessionSearch
from ._tools import RecallModel, RecallTools, ToolHandler, host_result
from .actors.supervisor import Supervisor
from .protocol.config import Config, PrivateScope
from .protocol.errors import InvalidInputError
from .protocol.recall import (
    RecallOutcome,
    RecallPath,
    RecallPlan,
    RecallRequest,
    RecallStatus,
    SessionSwitches,
    ToolResult,
    Turn,
)
from .protocol.recall_pool import RunRecall, RunReport
from .protocol.session_key import SessionKey, parse_session_key
from .protocol.transcript import SessionInfo
from .storage.run_transcripts import SubAgentTranscript, TranscriptPlace

PREFLIGHT_S = 1.5
FINALIZE_S = 1.5
# The tools each built-in memory slot provides (memory-lancedb: the source's name).
_SLOT_TOOLS = {
    "memory-core": frozenset({"memory_search", "memory_get"}),
    "memory-records": frozenset({"memory_recall"}),
    "memory-lancedb": frozenset({"memory_recall"}),
}
_LOG_LINE_CHARS = 500
log = logging.getLogger("activememory.recall")


class Recaller:
    """Runs `mem.recall` against the config snapshot current when the turn starts."""

    def __init__(
        self,
        supervisor: Supervisor,
        search: SessionSearch,
        commands: Commands,
        get_config: Callable[[], Config],
        *,
        models: Mapping[str, Any],
        tools: Mapping[str, Any],
        pool: MemoryObjectSendStream[RunRecall],
        core: MemoryCore,
        transcripts: TranscriptPlace,
        records: Records,
    ) -> None:
        self._supervisor = supervisor
        self._search = search
        self._commands = commands
        self._get_config = get_config
        self._models = models
        self._tools = tools
        self._pool = pool
        self._core = core
        self._records = records
        self._transcripts = transcripts
        self._local = LocalExtractiveModel()
        self._provider_models: dict[tuple[str, str | None, str | None], RecallModel] = {}
        self.cache = RecallCache()
        self.breakers = CircuitBreakers()
        self._run_ids = itertools.count(1)

    async def recall(self, turn: Turn) -> RecallOutcome:
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turn: expected am.Turn, got {type(turn).__name__}")
        config = self._get_config()  # one snapshot: a reload applies from the next turn
        started = anyio.current_time()
        query_mode = config.active_memory.query_mode
        switches = SessionSwitches()
        plan: RecallPlan | None = None
        with anyio.move_on_after(PREFLIGHT_S):
            key = parse_session_key(turn.session_key, field="Turn.session_key")
            session, switches = await self._session_state(key)
            plan = await self._plan(config, turn, key, session, switches)
        if plan is None:  # the preflight ran out of time: no recall, and no recall time lost
            return self._finish(
                "skipped", started, query_mode, switches, reason="preflight over 1500 ms"
            )
        request = plan.request
        if request is None:
            assert plan.status is not None
            return self._finish(
                plan.status,
                started,
                query_mode,
                switches,
                plan.paths,
                model=plan.model,
                reason=plan.reason,
            )
        return await self._run(config, key, request, plan.paths, switches, started)

    async def _run(
        self,
        config: Config,
        key: SessionKey,
        request: RecallRequest,
        paths: tuple[RecallPath, ...],
        switches: SessionSwitches,
        started: float,
    ) -> RecallOutcome:
        am = config.active_memory
        # Whose conversations this run may read: in the key, so no identity gets another's.
        scope = config.private_scope(key) if request.transcripts else None
        cache_key = RecallCache.key(
            request.agent,
            request.session_key,
            request.context,
            request.search_query,
            request.model,
            request.tools,
            config.memory_slot,
            scope,
            config.identity_of(key),
            request.prompt,
            paths,
        )
        now = anyio.current_time()
        cached = self.cache.get(cache_key, now)
        if cached is not None:
            return self._finish(
                "ok",
                started,
                request.query_mode,
                switches,
                paths,
                model=request.model,
                summary=cached.summary or "",
                cached=True,
                details={"cached": "yes"},
            )
        breaker = (request.agent, request.model)
        if not self.breakers.allow(breaker, now):
            return self._finish(
                "timeout",
                started,
                request.query_mode,
                switches,
                paths,
                model=request.model,
                reason="circuit breaker open",
                circuit_breaker=True,
                elapsed_ms=0.0,
            )
        model = self._model(config, request.model)
        if model is None:
            self.breakers.record_failed(breaker)
            return self._finish(
                "failed",
                started,
                request.query_mode,
                switches,
                paths,
                model=request.model,
                reason=f"recall model {request.model} cannot be built",
            )
        run_id = f"recall-{next(self._run_ids):06d}"
        budget_s = (request.timeout_ms + request.setup_grace_timeout_ms) / 1000
        request = msgspec.structs.replace(request, deadline=now + budget_s)
        finalize_deadline = request.deadline + FINALIZE_S
        transcript = self._open_transcript(
            am.persist_transcripts, am.transcript_dir, run_id, request
        )
        tools = self._run_tools(request, key, transcript, scope, config)
        if am.logging:
            _log(
                f"active-memory: start run={run_id} agent={request.agent} session={key.raw} "
                f"model={request.model} query={request.query_mode} "
                f"chars={len(request.context)} tools={','.join(request.tools)}",
                self._search,
            )
        report = await self._submit_and_wait(
            run_id, request, finalize_deadline, model, tools, transcript
        )
        verdict = judge(report, deadline=request.deadline, finalize_deadline=finalize_deadline)
        if verdict.status in ("timeout", "timeout_partial"):
            self.breakers.record_timeout(
                breaker,
                anyio.current_time(),
                max_timeouts=am.circuit_breaker_max_timeouts,
                cooldown_s=am.circuit_breaker_cooldown_ms / 1000,
            )
            if am.logging:
                _log(
                    f"active-memory: timeout after {budget_s * 1000:.0f}ms run={run_id}",
                    self._search,
                )
        elif verdict.status == "failed":
            self.breakers.record_failed(breaker)
        else:
            self.breakers.record_completed(breaker)
        details: dict[str, object] = _search_details(tools)
        if transcript.failed:
            details["transcript"] = transcript.failed
        summary = summarize(verdict.text, request.max_summary_chars)
        outcome = self._finish(
            verdict.status,
            started,
            request.query_mode,
            switches,
            paths,
            model=request.model,
            summary=summary,
            reason=verdict.reason if verdict.status != "ok" else "",
            details=details,
        )
        if verdict.status == "ok":
            self.cache.put(
                cache_key, outcome, now=anyio.current_time(), ttl_s=am.cache_ttl_ms / 1000
            )
        if am.logging:
            _log(
                f"active-memory: done run={run_id} agent={request.agent} session={key.raw} "
                f"model={request.model} status={outcome.status} "
                f"elapsed={outcome.elapsed_ms:.0f}ms summary={len(summary)} chars "
                f"tools={len(tools.results)}",
                self._search,
            )
        return outcome

    async def _submit_and_wait(
        self,
        run_id: str,
        request: RecallRequest,
        finalize_deadline: float,
        model: RecallModel,
        tools: RecallTools,
        transcript: SubAgentTranscript,
    ) -> RunReport | None:
        """Hand the run to the pool; wait for its report until the finalize deadline.

        The caller waits on the report, never on the run: a run that ignores cancellation
        is left to the pool, and this returns None at the finalize deadline.
        """
        send, receive = anyio.create_memory_object_stream[RunReport](1)
        job = RunRecall(
            run_id=run_id,
            request=request,
            finalize_deadline=finalize_deadline,
            model=model,
            tools=tools,
            transcript=transcript,
            reply=send,
        )
        with receive, anyio.move_on_after(max(0.0, finalize_deadline - anyio.current_time())):
            try:
                self._pool.send_nowait(job)
            except anyio.WouldBlock:
                await self._pool.send(job)  # the pool is backed up: bounded by the deadline
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return None
            return await receive.receive()
        return None

    def _open_transcript(
        self, persist: bool, transcript_dir: str, run_id: str, request: RecallRequest
    ) -> SubAgentTranscript:
        path = None
        if persist:
            path = self._transcripts.kept_path(request.agent, transcript_dir, run_id)
        keep = path is not None
        if path is None:
            path = self._transcripts.temp_dir() / f"{run_id}.jsonl"
        transcript = SubAgentTranscript(path, keep=keep, started=anyio.current_time())
        if persist and not keep:
            transcript.failed = "transcriptDir leaves the sessions folder: transcript not kept"
        transcript.write(
            {
                "type": "prompt",
                "model": request.model,
                "prompt": request.prompt,
                "context": request.context,
                "search_query": request.search_query,
                "tools": list(request.tools),
            },
            at=anyio.current_time(),
        )
        return transcript

    def _run_tools(
        self,
        request: RecallRequest,
        key: SessionKey,
        transcript: SubAgentTranscript,
        transcripts: PrivateScope | None,
        config: Config,
    ) -> RecallTools:
        handlers: dict[str, ToolHandler] = {}
        core, agent = self._core, request.agent
        for name in request.tools:
            if name == "memory_search":

                async def search(args: Mapping[str, Any]) -> ToolResult:
                    return await core.search(agent, args, caller=key, transcripts=transcripts)

                handlers[name] = search
            elif name == "memory_get":

                async def get(args: Mapping[str, Any]) -> ToolResult:
                    return await core.get(agent, args, caller=key, transcripts=transcripts)

                handlers[name] = get
            elif name == "memory_recall" and name not in self._tools:
                handlers[name] = self._records_handler(key, request.agent, config)
            elif name in self._tools:
                handlers[name] = _host_handler(name, self._tools[name])
        schemas = {name: fn.schema for name, fn in self._tools.items() if hasattr(fn, "schema")}
        return RecallTools(
            handlers,
            schemas=schemas,
            transcript=lambda line: transcript.write(line, at=anyio.current_time()),
        )

    def _records_handler(self, key: SessionKey, agent: str, config: Config) -> ToolHandler:
        """memory_recall over the records store, scoped to this conversation's user.

        The user of a direct conversation is its identity (`Config.identity_of`: the peer of
        `agent:<a>:direct:<peer>` unless session.identityLinks links it, "main" for the main
        conversation unless ownerIdentity names the owner); a group, channel or explicit
        session names no user, so only records scoped to no user are searched there. The
        agent is exact; the session key is the thread, a boost rather than a filter.
        """
        user_id = config.identity_of(key) if key.chat_type == "direct" else None
        records, redactor = self._records, self._search.redactor

        async def recall(args: Mapping[str, Any]) -> ToolResult:
            return await recall_tool(
                records, args, user_id=user_id, agent_id=agent, thread_id=key.raw, redactor=redactor
            )

        return recall

    def _model(self, config: Config, ref: str) -> RecallModel | None:
        if ref in self._models:
            return self._models[ref]  # type: ignore[no-any-return]
        if ref == LOCAL_MODEL:
            return self._local
        provider_name, _, _ = ref.partition("/")
        provider = config.providers.get(provider_name)
        if provider is None or not provider.serves_recall:
            return None
        cache_key = (ref, provider.base_url, provider.api_key)
        model = self._provider_models.get(cache_key)
        if model is None:
            model = self._provider_models[cache_key] = model_from_config(ref, provider)
        return model

    async def aclose(self) -> None:
        """Close the provider models this coordinator built (their HTTP connections)."""
        models, self._provider_models = list(self._provider_models.values()), {}
        for model in models:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()

    def breaker_states(self) -> list[BreakerInfo]:
        """Every circuit breaker the coordinator knows, with its state now."""
        return self.breakers.info(anyio.current_time())

    async def plan(self, turn: Turn) -> RecallPlan:
        """The preflight alone: eligibility, model, tools and what the sub-agent would see."""
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turn: expected am.Turn, got {type(turn).__name__}")
        key = parse_session_key(turn.session_key, field="Turn.session_key")
        session, switches = await self._session_state(key)
        return await self._plan(self._get_config(), turn, key, session, switches)

    async def _session_state(self, key: SessionKey) -> tuple[SessionInfo | None, SessionSwitches]:
        """The stored session and its switches, in one read (one hop to the reader)."""
        store = await self._supervisor.agent(key.store_agent)
        return await store.read(lambda reader: (reader.session(key.raw), reader.switches(key.raw)))

    async def _plan(
        self,
        config: Config,
        turn: Turn,
        key: SessionKey,
        session: SessionInfo | None,
        switches: SessionSwitches,
    ) -> RecallPlan:
        verdict = decide(config, key, session, switches, trigger=turn.trigger, surface=turn.surface)
        if not verdict.eligible:
            return RecallPlan(request=None, status="skipped", reason=verdict.reason)
        model = self.resolve_model(config, key, turn.model)
        if model is None:
            return RecallPlan(
                request=None,
                status="skipped",
                reason="no recall model resolves",
                paths=verdict.paths,
            )
        tools = self.usable_tools(config)
        if not tools:
            return RecallPlan(
                request=None,
                status="unavailable",
                reason="no allowed memory tool is available",
                paths=verdict.paths,
                model=model,
            )
        am = config.active_memory
        style = resolve_prompt_style(am.query_mode, am.prompt_style)
        request = RecallRequest(
            session_key=key.raw,
            agent=key.agent or key.store_agent,
            model=model,
            prompt=system_prompt(
                style, prompt_append=am.prompt_append, prompt_override=am.prompt_override
            ),
            prompt_style=style,
            query_mode=am.query_mode,
            context=build_query_text(
                turn.messages,
                mode=am.query_mode,
                recent_user_turns=am.recent_user_turns,
                recent_assistant_turns=am.recent_assistant_turns,
                recent_user_chars=am.recent_user_chars,
                recent_assistant_chars=am.recent_assistant_chars,
            ),
            latest=latest_user_text(turn.messages),
            search_query=build_search_query(turn.messages),
            tools=tools,
            transcripts=verdict.transcripts and "memory_search" in tools,
            thinking=am.thinking,
            fast_mode=am.fast_mode,
            timeout_ms=am.timeout_ms,
            setup_grace_timeout_ms=am.setup_grace_timeout_ms,
            max_summary_chars=am.max_summary_chars,
        )
        return RecallPlan(request=request, paths=verdict.paths, model=model)

    def resolve_model(
        self, config: Config, key: SessionKey, session_model: str | None
    ) -> str | None:
        """The model chain of docs/design.md §4.6 for this agent."""
        agent = key.agent or key.store_agent
        return resolve_recall_model(
            config_model=config.active_memory.model,
            session_model=session_model,
            agent_model=agent_primary_model(config.agent_model(agent)),
            fallback=config.active_memory.model_fallback,
            is_available=lambda ref: self._model_available(config, ref),
        )

    def _model_available(self, config: Config, ref: str) -> bool:
        if ref == LOCAL_MODEL or ref in self._models:
            return True
        provider, _, model = ref.partition("/")
        settings = config.providers.get(provider)
        if settings is None or not settings.serves_recall:
            return False
        return not settings.models or any(m.id == model for m in settings.models)

    def usable_tools(self, config: Config) -> tuple[str, ...]:
        """`toolsAllow` (or the memory slot's default), kept to the tools that exist."""
        allowed = config.active_memory.tools_allow
        names = filter_tools_allow(allowed) if allowed is not None else config.default_tools()
        available = _SLOT_TOOLS.get(config.memory_slot, frozenset()) | set(self._tools)
        return tuple(name for name in names if name in available)

    def _finish(
        self,
        status: RecallStatus,
        started: float,
        query_mode: str,
        switches: SessionSwitches,
        paths: tuple[RecallPath, ...] = (),
        *,
        model: str | None = None,
        summary: str = "",
        reason: str = "",
        details: Mapping[str, object] | None = None,
        cached: bool = False,
        circuit_breaker: bool = False,
        elapsed_ms: float | None = None,
    ) -> RecallOutcome:
        if elapsed_ms is None:
            elapsed_ms = (anyio.current_time() - started) * 1000
        prefix = hidden_prefix(summary) if status in ("ok", "timeout_partial") else None
        line = status_line(
            status=status,
            elapsed_ms=elapsed_ms,
            query_mode=query_mode,
            summary_chars=len(summary),
            cached=cached,
            circuit_breaker=circuit_breaker,
        )
        shown = dict(details or {})
        if reason:
            shown["reason"] = reason
        debug = debug_line(summary=summary, status=status, details=shown or None)
        followups: list[str] = []
        if switches.verbose:
            followups.append(line)
        if switches.trace != "off":
            followups.append(debug)
        if switches.trace == "raw" and prefix is not None:
            followups.append(prefix)
        return RecallOutcome(
            status=status,
            summary=summary or None,
            elapsed_ms=elapsed_ms,
            prompt_prefix=prefix,
            status_line=line,
            debug_line=debug,
            followups=tuple(followups),
            cached=cached,
            query_mode=query_mode,
            model=model,
            paths=paths,
            reason=reason,
        )


def _host_handler(name: str, fn: Callable[[Mapping[str, Any]], Any]) -> ToolHandler:
    async def call(args: Mapping[str, Any]) -> ToolResult:
        return host_result(name, await fn(args))

    return call


def _search_details(tools: RecallTools) -> dict[str, object]:
    """The debug fields of the run's last memory_search (docs/design.md §4.7)."""
    details: dict[str, object] = {"tools": len(tools.results)}
    for result in reversed(tools.results):
        if result.name == "memory_search" and result.data is not None:
            for field in ("backend", "effectiveMode", "fallback", "searchMs", "hits"):
                if field in result.data:
                    details[field] = result.data[field]
            break
    return details


def _log(line: str, search: SessionSearch) -> None:
    """One structured, redacted, single-line log record, capped."""
    text = " ".join(search.redactor.redact(line).split())
    if len(text) > _LOG_LINE_CHARS:
        text = text[: _LOG_LINE_CHARS - 1] + "…"
    log.info(text)
