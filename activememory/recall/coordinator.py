"""`mem.recall(turn)`: the recall coordinator (docs/design.md §4.9-§4.11).

One recall: a preflight of at most 1500 ms (switches, eligibility, model and tools, what the
sub-agent sees); the cache and the circuit breaker; then the recall work, run by a
sub-agent in the supervisor's recall pool (`actors/recall_pool.py`) under a `RecallBudget`
(`budget.py`), the coordinator waiting for the run's report until the finalize deadline.
It never waits on the run itself, only on its report, so whatever the model, tools or disk
do, `recall` returns by `timeoutMs + setupGraceTimeoutMs + 3000` ms. The coordinator owns
the run's transcript: it opens it before the run and closes it when it stops waiting.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from .._output import clip, debug_line, hidden_prefix, one_line, status_line, summarize
from .._policy import decide
from .._records import Records
from .._redaction import Redactor
from .._settings import Settings
from ..actors.supervisor import Supervisor
from ..protocol.config import SLOT_TOOLS, ActiveMemoryConfig, Config
from ..protocol.errors import InvalidInputError
from ..protocol.recall import (
    RecallOutcome,
    RecallPath,
    RecallPlan,
    RecallRequest,
    RecallStatus,
    SessionSwitches,
    ToolResult,
    Turn,
)
from ..protocol.recall_pool import RunRecall, RunReport
from ..protocol.session_key import SessionKey, parse_session_key
from ..protocol.transcript import SessionInfo
from ..storage.run_transcripts import SubAgentTranscript, TranscriptPlace
from .breaker import CircuitBreakers
from .budget import PREFLIGHT_S, RecallBudget
from .cache import RecallCache
from .memory_core import MemoryCore
from .models import RecallModels
from .subagent_input import (
    build_query_text,
    build_search_query,
    filter_tools_allow,
    latest_user_text,
    resolve_prompt_style,
    system_prompt,
)
from .tools import RecallModel, RecallTools, run_tools
from .verdict import Verdict, judge

_LOG_LINE_CHARS = 500
log = logging.getLogger("activememory.recall")


class Findings(msgspec.Struct, frozen=True, kw_only=True):
    """What one recall learned; `_outcome` turns it and the plan into the `RecallOutcome`."""

    status: RecallStatus
    summary: str = ""
    reason: str = ""
    details: dict[str, object] = {}
    cached: bool = False
    circuit_breaker: bool = False
    elapsed_ms: float | None = None  # None: from the start of the recall to its outcome


@dataclass
class RunTrace:
    """Filled in by a recall that is asked for its trace (`mem.trace_recall`): the run's id,
    its transcript lines and its tool results; left empty when no sub-agent ran."""

    run_id: str | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)


class Recaller:
    """Runs `mem.recall`, each turn under the settings snapshot it is given."""

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        models: RecallModels,
        tools: Mapping[str, Any],
        pool: MemoryObjectSendStream[RunRecall],
        core: MemoryCore,
        transcripts: TranscriptPlace,
        records: Records,
    ) -> None:
        self._supervisor = supervisor
        self.models = models
        self._tools = tools
        self._pool = pool
        self._core = core
        self._records = records
        self._transcripts = transcripts
        self.cache: RecallCache[Findings] = RecallCache()
        self.breakers = CircuitBreakers()
        self._run_ids = itertools.count(1)

    async def recall(
        self, turn: Turn, settings: Settings, trace: RunTrace | None = None
    ) -> RecallOutcome:
        """The preflight, then (if the turn recalls) the run; one outcome either way.
        `trace`, if given, receives the run's transcript lines and tool results."""
        started = anyio.current_time()
        switches = SessionSwitches()
        plan: RecallPlan | None = None
        with anyio.move_on_after(PREFLIGHT_S):
            key, switches, plan = await self._preflight(turn, settings)
        if plan is None:  # the preflight ran out of time: no recall, and no recall time lost
            found = Findings(status="skipped", reason="preflight over 1500 ms")
        elif plan.request is None:
            assert plan.status is not None
            found = Findings(status=plan.status, reason=plan.reason)
        else:
            found = await self._run(settings, key, plan.request, plan.paths, started, trace)
        query_mode = settings.config.active_memory.query_mode
        return _outcome(found, plan, started, query_mode, switches)

    async def _run(
        self,
        settings: Settings,
        key: SessionKey,
        request: RecallRequest,
        paths: tuple[RecallPath, ...],
        started: float,
        trace: RunTrace | None = None,
    ) -> Findings:
        """The cache, the circuit breaker and the model, then the sub-agent run."""
        config = settings.config
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
        breaker = (request.agent, request.model)
        generation = self.cache.generation  # an erase during the run voids its findings
        cached = self.cache.get(cache_key, now)
        if cached is not None:
            return msgspec.structs.replace(cached, cached=True, details={"cached": "yes"})
        if not self.breakers.allow(breaker, now):
            return Findings(
                status="timeout",
                reason="circuit breaker open",
                circuit_breaker=True,
                elapsed_ms=0.0,
            )
        model = self.models.build(config, request.model)
        if model is None:
            self.breakers.record_failed(breaker)
            return Findings(status="failed", reason=f"recall model {request.model} cannot be built")
        budget = RecallBudget.after_preflight(
            now,
            timeout_ms=request.timeout_ms,
            setup_grace_timeout_ms=request.setup_grace_timeout_ms,
        )
        request = msgspec.structs.replace(request, deadline=budget.deadline)
        found = await self._run_subagent(settings, key, request, budget, model, started, trace)
        self.breakers.record(
            breaker,
            found.status,
            anyio.current_time(),
            max_timeouts=am.circuit_breaker_max_timeouts,
            cooldown_s=am.circuit_breaker_cooldown_ms / 1000,
        )
        if found.status == "ok":
            self.cache.put(
                cache_key,
                found,
                now=anyio.current_time(),
                ttl_s=am.cache_ttl_ms / 1000,
                generation=generation,
            )
        return found

    async def _run_subagent(
        self,
        settings: Settings,
        key: SessionKey,
        request: RecallRequest,
        budget: RecallBudget,
        model: RecallModel,
        started: float,
        trace: RunTrace | None = None,
    ) -> Findings:
        """Run the sub-agent in the pool and judge its report; its transcript ends here."""
        am = settings.config.active_memory
        run_id = f"recall-{next(self._run_ids):06d}"
        if am.logging:
            _log(
                f"active-memory: start run={run_id} agent={request.agent} session={key.raw} "
                f"model={request.model} query={request.query_mode} "
                f"chars={len(request.context)} tools={','.join(request.tools)}",
                settings.redactor,
            )
        transcript = self._open_transcript(am, run_id, request, trace)
        report: RunReport | str | None = None
        try:
            tools = run_tools(
                request,
                key,
                settings=settings,
                core=self._core,
                records=self._records,
                host_tools=self._tools,
                transcript=transcript,
            )
            if trace is not None:
                trace.results = tools.results  # the run's own list: calls still to come too
            report = await self._submit_and_wait(run_id, request, budget, model, tools)
        finally:  # however the wait ended: the pool never got the job, was full, or reported
            transcript.finish(
                report if isinstance(report, RunReport) else None, at=anyio.current_time()
            )
        if isinstance(report, str):  # it never reached the pool
            verdict = Verdict("failed", "", report)
        else:
            verdict = judge(
                report, deadline=budget.deadline, finalize_deadline=budget.finalize_deadline
            )
        details = _search_details(tools)
        if transcript.failed:
            details["transcript"] = transcript.failed
        summary = summarize(verdict.text, request.max_summary_chars)
        if am.logging:
            if verdict.status in ("timeout", "timeout_partial"):
                line = f"timeout after {budget.work_s * 1000:.0f}ms run={run_id}"
                _log(f"active-memory: {line}", settings.redactor)
            _log(
                f"active-memory: done run={run_id} agent={request.agent} session={key.raw} "
                f"model={request.model} status={verdict.status} "
                f"elapsed={(anyio.current_time() - started) * 1000:.0f}ms "
                f"summary={len(summary)} chars tools={len(tools.results)}",
                settings.redactor,
            )
        reason = verdict.reason if verdict.status != "ok" else ""
        return Findings(status=verdict.status, summary=summary, reason=reason, details=details)

    async def _submit_and_wait(
        self,
        run_id: str,
        request: RecallRequest,
        budget: RecallBudget,
        model: RecallModel,
        tools: RecallTools,
    ) -> RunReport | str | None:
        """Hand the run to the pool; wait for its report until the finalize deadline.

        The caller waits on the report, never on the run: a run that ignores cancellation
        (or one the full pool never started) is left to the pool, and this returns None at
        the finalize deadline. A pool that is closed takes nothing: the reason, at once.
        """
        send, receive = anyio.create_memory_object_stream[RunReport](1)
        job = RunRecall(
            run_id=run_id, request=request, budget=budget, model=model, tools=tools, reply=send
        )
        wait_s = max(0.0, budget.finalize_deadline - anyio.current_time())
        with receive, anyio.move_on_after(wait_s):
            try:
                self._pool.send_nowait(job)
            except anyio.WouldBlock:
                await self._pool.send(job)  # the pool is backed up: bounded by the deadline
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                return "the recall pool is closed: the memory is shutting down"
            return await receive.receive()
        return None

    def _open_transcript(
        self,
        am: ActiveMemoryConfig,
        run_id: str,
        request: RecallRequest,
        trace: RunTrace | None = None,
    ) -> SubAgentTranscript:
        persist, path = am.persist_transcripts and self._transcripts.keep, None
        if persist:
            path = self._transcripts.kept_path(request.agent, am.transcript_dir, run_id)
        # Temporary (not kept): in memory, a file only if something spills it (§4.11).
        transcript = SubAgentTranscript(
            path,
            keep=path is not None,
            started=anyio.current_time(),
            spill_dir=self._transcripts.temp_dir,
        )
        if trace is not None:
            trace.run_id, transcript.tap = run_id, trace.lines
        if persist and path is None:
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

    async def plan(self, turn: Turn, settings: Settings) -> RecallPlan:
        """The preflight alone: eligibility, model, tools and what the sub-agent would see."""
        return (await self._preflight(turn, settings))[2]

    async def _preflight(
        self, turn: Turn, settings: Settings
    ) -> tuple[SessionKey, SessionSwitches, RecallPlan]:
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turn: expected am.Turn, got {type(turn).__name__}")
        key = parse_session_key(turn.session_key, field="Turn.session_key")
        session, switches = await self._session_state(key)
        return key, switches, await self._plan(settings.config, turn, key, session, switches)

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
        model = self.models.resolve(config, key, turn.model)
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

    def usable_tools(self, config: Config) -> tuple[str, ...]:
        """`toolsAllow` (or the memory slot's default), kept to the tools that exist."""
        allowed = config.active_memory.tools_allow
        names = filter_tools_allow(allowed) if allowed is not None else config.default_tools()
        available = {*SLOT_TOOLS.get(config.memory_slot, ()), *self._tools}
        return tuple(name for name in names if name in available)


def _outcome(
    found: Findings,
    plan: RecallPlan | None,
    started: float,
    query_mode: str,
    switches: SessionSwitches,
) -> RecallOutcome:
    """The outcome of a recall: its lines, its hidden prefix, and the follow-ups to send."""
    status, summary, reason = found.status, found.summary, found.reason
    elapsed_ms = found.elapsed_ms
    if elapsed_ms is None:
        elapsed_ms = (anyio.current_time() - started) * 1000
    prefix = hidden_prefix(summary) if status in ("ok", "timeout_partial") else None
    line = status_line(
        status=status,
        elapsed_ms=elapsed_ms,
        query_mode=query_mode,
        summary_chars=len(summary),
        cached=found.cached,
        circuit_breaker=found.circuit_breaker,
    )
    shown = dict(found.details)
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
        cached=found.cached,
        query_mode=query_mode,
        model=plan.model if plan is not None else None,
        paths=plan.paths if plan is not None else (),
        reason=reason,
    )


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


def _log(line: str, redactor: Redactor) -> None:
    """One structured, redacted, single-line log record, capped."""
    log.info(clip(one_line(redactor.redact(line)), _LOG_LINE_CHARS))
