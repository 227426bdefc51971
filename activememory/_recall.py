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
from ._policy import Eligibility, decide
from ._query import (
    LOCAL_MODEL,
    agent_primary_model,
    build_search_query,
    filter_tools_allow,
    resolve_recall_model,
)
from ._search import SessionSearch
from .actors.supervisor import Supervisor
from .protocol.config import Config
from .protocol.errors import InvalidInputError
from .protocol.recall import RecallOutcome, RecallPath, RecallStatus, SessionSwitches, Turn
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
        key = parse_session_key(turn.session_key, field="Turn.session_key")
        started = anyio.current_time()
        am = config.active_memory
        query_mode = am.query_mode
        with anyio.move_on_after(PREFLIGHT_S) as preflight:
            store = await self._supervisor.agent(key.store_agent)
            session = await store.read(lambda reader: reader.session(key.raw))
            switches = await self._commands.switches(key)
        if preflight.cancelled_caught:
            return self._finish(
                "skipped", started, query_mode, SessionSwitches(), reason="preflight over budget"
            )
        verdict = decide(config, key, session, switches, trigger=turn.trigger, surface=turn.surface)
        if not verdict.eligible:
            return self._finish("skipped", started, query_mode, switches, reason=verdict.reason)
        model = self.resolve_model(config, key, turn.model)
        if model is None:
            return self._finish(
                "skipped", started, query_mode, switches, verdict, reason="no recall model resolves"
            )
        tools = self.usable_tools(config)
        if not tools:
            return self._finish(
                "unavailable",
                started,
                query_mode,
                switches,
                verdict,
                model=model,
                reason="no allowed memory tool is available",
            )
        search_query = build_search_query(turn.messages)
        budget = (am.timeout_ms + am.setup_grace_timeout_ms) / 1000
        details: dict[str, object] = {}
        summary = ""
        with anyio.move_on_after(budget) as work:
            summary = await self._stand_in(key, verdict, tools, search_query, details)
        if work.cancelled_caught:
            return self._finish(
                "timeout", started, query_mode, switches, verdict, model=model, details=details
            )
        if not summary:
            return self._finish(
                "no_relevant_memory",
                started,
                query_mode,
                switches,
                verdict,
                model=model,
                details=details,
            )
        return self._finish(
            "ok",
            started,
            query_mode,
            switches,
            verdict,
            model=model,
            summary=summarize(summary, am.max_summary_chars),
            details=details,
        )

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

    async def _stand_in(
        self,
        key: SessionKey,
        verdict: Eligibility,
        tools: tuple[str, ...],
        query: str,
        details: dict[str, object],
    ) -> str:
        """The recall step until the runtime lands: one memory_search, the best hit."""
        if "memory_search" not in tools or not query:
            details["hits"] = 0
            return ""
        searched = anyio.current_time()
        hits: tuple[SearchHit, ...] = ()
        if verdict.transcripts:  # only the cross-conversation path may read transcripts
            result = await self._search.search_private(query, caller=key, limit=_SEARCH_HITS)
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
        verdict: Eligibility | None = None,
        *,
        model: str | None = None,
        summary: str = "",
        reason: str = "",
        details: Mapping[str, object] | None = None,
    ) -> RecallOutcome:
        elapsed_ms = (anyio.current_time() - started) * 1000
        paths: tuple[RecallPath, ...] = verdict.paths if verdict else ()
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
