"""`mem.doctor()` (docs/design.md §4.11): what is set up, what cannot work, and the index's health."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Literal

import msgspec

from .protocol.config import PLUGIN_ID, SLOT_TOOLS, Config
from .protocol.session_key import parse_session_key
from .storage.checkpoints import BEHIND, Checkpointer
from .storage.footprint import DiskUsage, resident_bytes

if TYPE_CHECKING:
    from ._memory import Memory
    from .storage.reads import TranscriptReads

Level = Literal["ok", "warn", "error"]
AM_ENTRY = f"plugins.entries.{PLUGIN_ID}"


class DoctorCheck(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One finding: `level` ok / warn (works, but not as you may think) / error (broken).

    `fix`: for a warning or an error, the command to run or the change to make that
    clears it (None for ok findings).
    """

    name: str
    level: Level
    detail: str
    fix: str | None = None


class DoctorReport(msgspec.Struct, frozen=True, kw_only=True):
    """Every finding of `mem.doctor()`; `ok` is true when none is an error."""

    checks: tuple[DoctorCheck, ...]

    @property
    def ok(self) -> bool:
        return all(c.level != "error" for c in self.checks)

    def text(self) -> str:
        """One line per finding, for people; a finding with a `fix` adds a line saying it."""
        marks = {"ok": "ok  ", "warn": "WARN", "error": "FAIL"}
        lines = []
        for c in self.checks:
            lines.append(f"[{marks[c.level]}] {c.name}: {c.detail}")
            if c.fix:
                lines.append(f"       fix: {c.fix}")
        return "\n".join(lines)


async def diagnose(memory: Memory) -> DoctorReport:
    """Run every check against an open `am.Memory`."""
    config = memory.config
    checks = _config_checks(config)
    where = _config_file(config)
    state_dir = shlex.quote(str(memory.state_dir))
    set_model = (
        f"set {AM_ENTRY}.config.model to a model of models.providers (README"
        f' "Configuration") in {where}'
    )

    def add(name: str, level: Level, detail: str, fix: str | None = None) -> None:
        checks.append(_check(name, level, detail, None if level == "ok" else fix))

    recaller = memory._recaller
    for agent in await _agents_of_interest(config, memory):
        key = parse_session_key(f"agent:{agent}:main")
        model = recaller.models.resolve(config, key, None)
        wanted = config.active_memory.model
        if model is None:
            add(f"model:{agent}", "error", "no recall model resolves", set_model)
        elif wanted is not None and wanted != model:
            detail = f"config.model {wanted} does not resolve; using {model}"
            add(f"model:{agent}", "warn", detail, set_model)
        else:
            add(f"model:{agent}", "ok", model)
        tools = recaller.usable_tools(config)
        if not tools:
            add(
                f"tools:{agent}",
                "error",
                "no allowed memory tool is available: recall is 'unavailable'",
                f"unset {AM_ENTRY}.config.toolsAllow (the memory slot's tools) or list"
                f" available tools in it, in {where}",
            )
        elif config.remember_across_conversations(agent) and "memory_search" not in tools:
            add(
                f"tools:{agent}",
                "warn",
                "rememberAcrossConversations is on but memory_search is not allowed:"
                " transcript recall cannot run",
                f'add "memory_search" to {AM_ENTRY}.config.toolsAllow in {where}',
            )
        else:
            add(f"tools:{agent}", "ok", ", ".join(tools))
    for stats in await memory.sessions.stats(check_integrity=True):
        level: Level = "ok" if stats.fts_integrity_ok else "error"
        detail = (
            f"{stats.sessions} sessions, {stats.indexed_messages}/{stats.active_messages} "
            f"messages indexed, {stats.dirty_sessions} being re-indexed, FTS integrity "
            f"{'ok' if stats.fts_integrity_ok else 'FAILED'}"
        )
        # A damaged or unfinished index: rebuilt from the active branches (§2.4).
        fix = f"activememory reindex --state-dir {state_dir} --agent {stats.agent}"
        if level == "ok" and stats.dirty_sessions:
            level = "warn"
        if stats.embedder is not None:  # vectors (docs/design.md §2.3): lag and failures
            detail += f", {stats.vectors_pending} waiting for a vector of {stats.embedder}"
            detail += _lease_detail(stats.embedder_lease)
            if stats.embedder_error is not None:
                detail += f" (embedder failing: {stats.embedder_error})"
                if level == "ok":
                    level = "warn"
                    fix = f"check agents.defaults.memorySearch in {where}; the vectors follow"
        add(f"index:{stats.agent}", level, detail, fix)
        store = await memory._supervisor.agent(stats.agent)
        add(f"disk:{stats.agent}", "ok", _disk_detail(await store.read(_disk_usage)))
        if store.actor is not None and store.actor.checkpointer is not None:
            add(f"wal:{stats.agent}", *_wal_check(store.actor.checkpointer))
    stored = await memory._supervisor.stored_records()
    if stored is not None and stored.actor is not None and stored.actor.checkpointer is not None:
        add("wal:records", *_wal_check(stored.actor.checkpointer))
    records = await memory._supervisor.records_with_vectors()
    if records is not None and records.embedder is not None:  # docs/design.md §5.7
        pending, error = await records.vector_lag()
        detail = f"{pending} waiting for a vector of {records.embedder.name}"
        detail += _lease_detail(records.embedder.holds_lease())
        if error is None:
            add("records:vectors", "ok", detail)
        else:
            fix = f"check agents.defaults.memorySearch in {where}; the vectors follow"
            add("records:vectors", "warn", f"{detail} (embedder failing: {error})", fix)
    for info in memory.breaker_states():
        level = "ok" if info.state == "closed" else "warn"
        detail = f"{info.state}, {info.consecutive_timeouts} consecutive timeouts"
        if info.reopens_in_ms:
            detail += f", next probe in {info.reopens_in_ms / 1000:.1f}s"
        fix = (
            f"check the recall model {info.model} answers in time: activememory recall"
            f" 'hello' --state-dir {state_dir}{_config_option(config)}"
        )
        add(f"breaker:{info.agent}/{info.model}", level, detail, fix)
    stores = memory._supervisor.open_agents()
    vectors = sum(s.vector_index.nbytes() for s in stores if s.vector_index is not None)
    add(
        "memory",
        "ok",
        f"process resident {_mb(resident_bytes())}, {len(stores)} agent databases open,"
        f" of it the in-memory vector index {_mb(vectors)}",
    )
    abandoned = memory._supervisor.recall_pool.abandoned
    detail = f"runs that ignored cancellation and outlived their budget: {abandoned}"
    fix = "fix the recall model or tool that ignores cancellation; restart to free its tasks"
    add("recall-pool", "warn" if abandoned else "ok", detail, fix)
    return DoctorReport(checks=tuple(checks))


def _wal_check(checkpointer: Checkpointer) -> tuple[Level, str, str]:
    """A writer's WAL checkpoints (docs/design.md §1.3): the thread's counters; a warning
    when it failed or has ended while its writer runs (the writer then checkpoints alone,
    at `BEHIND` x `PAGES` frames, so the WAL stays bounded)."""
    c = checkpointer
    if not c.started:  # not an SQLite WAL writer, or hooking it failed
        detail = "SQLite's own autocheckpoint (no checkpoint thread)"
        if c.last_error is not None:
            return "warn", f"{detail}: {c.last_error}", _WAL_FIX
        return "ok", detail, _WAL_FIX
    detail = (
        f"{c.checkpoints} checkpoints on their thread, {c.inline} by the writer itself,"
        f" longest WAL {c.longest} pages (the writer steps in at {BEHIND * c.pages})"
    )
    if c.last_error is not None:
        return "warn", f"{detail}; last error: {c.last_error}", _WAL_FIX
    if c.running and not c.alive:
        return "warn", f"{detail}; the checkpoint thread has ended", _WAL_FIX
    return "ok", detail, _WAL_FIX


_WAL_FIX = (
    "check the disk and the permissions of the database's folder; the writer checkpoints"
    " alone meanwhile, so the WAL stays bounded"
)


def _disk_usage(reader: TranscriptReads) -> DiskUsage | None:
    return reader.disk_usage()


def _disk_detail(usage: DiskUsage | None) -> str:
    """On-disk bytes of an agent database: the index (FTS tables) against the content."""
    if usage is None:  # PostgreSQL: one server's files hold every agent (docs/design.md §11)
        return "not measured per agent on PostgreSQL (see the server's own statistics)"
    detail = f"{_mb(usage.total)} for {usage.messages} messages"
    if usage.index is None:  # no dbstat in this SQLite: the total alone
        return detail
    parts = []
    for name, size in (("index", usage.index), ("content", usage.content)):
        each = usage.per_message(size)
        per = "" if each is None else f", {each:,.0f} B/message"
        parts.append(f"{name} {_mb(size or 0)}{per}")
    parts += [f"vectors {_mb(usage.vectors or 0)}", f"other {_mb(usage.other or 0)}"]
    return f"{detail}: {'; '.join(parts)}"


def _mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def _config_file(config: Config) -> str:
    """How a fix names the config file: its path, or "the config" when it has none."""
    return str(config.source) if config.source else "the config"


def _config_option(config: Config) -> str:
    return f" --config {shlex.quote(str(config.source))}" if config.source else ""


async def _agents_of_interest(config: Config, memory: Memory) -> list[str]:
    agents = set(config.recall_agents()) | set(config.agents)
    agents |= set(await memory._supervisor.known_agents())
    return sorted(agents)


def _config_checks(config: Config) -> list[DoctorCheck]:
    am, slot = config.active_memory, config.memory_slot
    where = _config_file(config)
    if not config.plugin_enabled:
        plugin = _check(
            "plugin",
            "warn",
            f"{AM_ENTRY}.enabled is false: no recall runs",
            f"set {AM_ENTRY}.enabled to true in {where}",
        )
    elif not am.enabled:
        plugin = _check(
            "plugin",
            "warn",
            "config.enabled is false: no recall runs",
            f"set {AM_ENTRY}.config.enabled to true in {where}",
        )
    else:
        plugin = _check("plugin", "ok", f"enabled ({config.source or 'no config file'})")
    if slot not in SLOT_TOOLS:
        why = f"unsupported memory provider {slot!r}: use memory-core or memory-records"
        fix = f'set plugins.slots.memory to "memory-core" or "memory-records" in {where}'
        provider = _check("memory provider", "error", why, fix)
    else:
        provider = _check("memory provider", "ok", slot)
    if am.single_owner:
        whose = "singleOwner: every private chat of an agent recalls every other"
    else:  # not a problem, but the reason a main or UI session may not see a DM
        owner = f"owner {am.owner_identity}" if am.owner_identity else "no ownerIdentity"
        whose = f"recall reads only the caller's identity's chats; {owner}"
    return [
        plugin,
        provider,
        _check("privacy", "ok", whose),
        *(
            # A warning starts with the key path it is about (activememory/_config.py).
            _check("config", "warn", warning, f"remove {warning.split()[0]} from {where}")
            for warning in config.warnings
        ),
    ]


def _check(name: str, level: Level, detail: str, fix: str | None = None) -> DoctorCheck:
    return DoctorCheck(name=name, level=level, detail=detail, fix=fix)


def _lease_detail(held: bool | None) -> str:
    """Which process makes the vectors, on PostgreSQL (docs/design.md §11 "One embedder
    per agent"); nothing on SQLite, where it is always this one."""
    if held is None:
        return ""
    if held:
        return ", embedded by this process (it holds the lease)"
    return ", embedded by another process (the lease's holder)"
