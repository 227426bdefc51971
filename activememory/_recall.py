"""`mem.recall(turn)`: preflight, a recall step, and the outcome with its diagnostics.

The policy half of SPEC §4 lives here: eligibility, model and tool resolution, what the
recall step sees, and how the outcome is shown. The recall step itself is a stand-in until
the recall runtime lands (sub-agents, recall models, budget, cache, breaker): one
`memory_search` over the transcripts the privacy boundary allows, the best hit becoming the
note. Memory notes (`MEMORY.md`) are not searched yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import anyio

from ._commands import Commands
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
from ._search import SessionSearch
from .actors.supervisor import Supervisor
from .protocol.config import Config
from .protocol.errors import InvalidInputError
from .protocol.recall import (
    RecallOutcome,
    RecallPath,
    RecallPlan,
    RecallRequest,
    RecallStatus,
    SessionSwitches,
    Turn,
)
from .protocol.search import SearchHit
from .protocol.session_key import SessionKey, parse_session_key

PREFLIGHT_S = 1.5
# Tools that exist today per memory slot; memory_recall arrives with the records store.
_SLOT_TOOLS = {"memory-core": frozenset({"memory_search", "memory_get"})}
_SEARCH_HITS = 5


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
    ) -> None:
        self._supervisor = supervisor
        self._search = search
        self._commands = commands
        self._get_config = get_config
        self._models = models
        self._tools = tools

    async def recall(self, turn: Turn) -> RecallOutcome:
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turn: expected am.Turn, got {type(turn).__name__}")
        config = self._get_config()  # one snapshot: a reload applies from the next turn
        started = anyio.current_time()
        query_mode = config.active_memory.query_mode
        switches = SessionSwitches()
        with anyio.move_on_after(PREFLIGHT_S) as preflight:
            key = parse_session_key(turn.session_key, field="Turn.session_key")
            switches = await self._commands.switches(key)
            plan = await self._plan(config, turn, key, switches)
        if preflight.cancelled_caught:
            return self._finish(
                "skipped", started, query_mode, switches, reason="preflight over budget"
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
        budget = (request.timeout_ms + request.setup_grace_timeout_ms) / 1000
        details: dict[str, object] = {}
        summary = ""
        with anyio.move_on_after(budget) as work:
            summary = await self._stand_in(request, details)
        status: RecallStatus = "ok" if summary else "no_relevant_memory"
        if work.cancelled_caught:
            status, summary = "timeout", ""
        return self._finish(
            status,
            started,
            query_mode,
            switches,
            plan.paths,
            model=request.model,
            summary=summarize(summary, request.max_summary_chars),
            details=details,
        )

    async def plan(self, turn: Turn) -> RecallPlan:
        """The preflight alone: eligibility, model, tools and what the sub-agent would see."""
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turn: expected am.Turn, got {type(turn).__name__}")
        key = parse_session_key(turn.session_key, field="Turn.session_key")
        switches = await self._commands.switches(key)
        return await self._plan(self._get_config(), turn, key, switches)

    async def _plan(
        self, config: Config, turn: Turn, key: SessionKey, switches: SessionSwitches
    ) -> RecallPlan:
        store = await self._supervisor.agent(key.store_agent)
        session = await store.read(lambda reader: reader.session(key.raw))
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
        """The model chain of SPEC §4.6 for this agent."""
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

    async def _stand_in(self, request: RecallRequest, details: dict[str, object]) -> str:
        """The recall step until the runtime lands: one memory_search, the best hit."""
        if "memory_search" not in request.tools or not request.search_query:
            details["hits"] = 0
            return ""
        searched = anyio.current_time()
        hits: tuple[SearchHit, ...] = ()
        if request.transcripts:  # only the cross-conversation path may read transcripts
            key = parse_session_key(request.session_key)
            result = await self._search.search_private(
                request.search_query, caller=key, limit=_SEARCH_HITS
            )
            hits = result.results
        details["backend"] = "builtin"
        details["effectiveMode"] = "search"
        details["hits"] = len(hits)
        details["searchMs"] = round((anyio.current_time() - searched) * 1000)
        return hits[0].snippet if hits else ""

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
    ) -> RecallOutcome:
        elapsed_ms = (anyio.current_time() - started) * 1000
        prefix = hidden_prefix(summary) if status in ("ok", "timeout_partial") else None
        line = status_line(
            status=status,
            elapsed_ms=elapsed_ms,
            query_mode=query_mode,
            summary_chars=len(summary),
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
            query_mode=query_mode,
            model=model,
            paths=paths,
            reason=reason,
        )
