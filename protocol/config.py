"""The configuration schema (docs/design.md §4.1): keys, types, ranges and defaults, in one place.

Two families of Structs live here:

- the **file shape** (`ConfigFile` and the sections under it): what the JSON5 file may say,
  with the file's camelCase key names. `activememory._config` walks a mapping against these
  types to report problems in its own words, then `msgspec.convert`s it.
- the **resolved view** (`Config`): what `am.load_config` returns and the pipeline reads.

Sections activememory owns (`plugins.entries.active-memory` and everything under it) forbid
unknown keys. The rest of the file belongs to the host that shares it: unknown keys there
pass through, and only the keys read here are typed.

Two `Meta(extra=...)` keys speak to the loader: `"invalid"` on a string pattern gives the
words used when the pattern does not match (`<path>: "<value>" <invalid>`); `"deprecated"` on
a field makes its presence a warning (`<path> <deprecated>`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Annotated, Any, Literal, TypeAlias

import msgspec

from .search import SandboxVisibility, SearchSettings, Visibility
from .session_key import AGENT_ID, SessionKey, parse_session_key

ChatKind: TypeAlias = Literal["direct", "group", "channel", "explicit"]
QueryMode: TypeAlias = Literal["message", "recent", "full"]
PromptStyle: TypeAlias = Literal[
    "balanced", "strict", "contextual", "recall-heavy", "precision-heavy", "preference-only"
]
Thinking: TypeAlias = Literal["off", "minimal", "low", "medium", "high", "xhigh", "adaptive", "max"]
QmdSearchMode: TypeAlias = Literal["inherit", "search", "vsearch", "query"]
DmScope: TypeAlias = Literal["main", "per-peer", "per-channel-peer", "per-account-channel-peer"]
# The wire protocol activememory speaks; providers with another `api` stay in the file (it
# is shared with the host) but cannot serve recall.
RECALL_API = "openai-completions"

PLUGIN_ID = "active-memory"
DEFAULT_MEMORY_SLOT = "memory-core"
DEFAULT_AGENT = "main"

# What each memory slot's plugin registers (docs/design.md §4.7); any other slot has no default tools.
SLOT_TOOLS: dict[str, tuple[str, ...]] = {
    "memory-core": ("memory_search", "memory_get"),
    "memory-records": ("memory_recall",),
    "memory-lancedb": ("memory_recall",),
}

STYLE_BY_QUERY_MODE: dict[QueryMode, PromptStyle] = {
    "message": "strict",
    "recent": "balanced",
    "full": "contextual",
}

# `\Z`, not `$`: `$` also matches before a trailing newline.
ModelRef: TypeAlias = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[^/\s]+/\S+\Z",
        extra={"invalid": "is not a model reference of the form provider/model"},
    ),
]
AgentId: TypeAlias = Annotated[
    str,
    msgspec.Meta(
        pattern=rf"^(?:{AGENT_ID.pattern})\Z",
        extra={
            "invalid": "is not an agent id (lowercase letters, digits, _ and -, "
            "starting with a letter or digit, at most 64 characters)"
        },
    ),
]
# Relative, inside the sessions folder: not empty, not absolute (also not `C:`), no `..`
# component, not the sessions folder itself (`.`), no backslash or control characters.
TranscriptDir: TypeAlias = Annotated[
    str,
    msgspec.Meta(
        pattern=(
            r"^(?![A-Za-z]:)(?!/)(?!(?:.*/)?\.\.(?:/|\Z))(?!(?:\.(?:/+|\Z))+\Z)"
            r"[^\x00-\x1f\x7f\\]+\Z"
        ),
        extra={
            "invalid": 'must be a relative path inside the sessions folder (no "..", not absolute)'
        },
    ),
]
NonEmptyStr: TypeAlias = Annotated[str, msgspec.Meta(min_length=1)]


class QmdConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """`plugins.entries.active-memory.config.qmd`: the QMD memory backend, for recall only."""

    search_mode: Annotated[
        QmdSearchMode,
        msgspec.Meta(
            description='QMD search mode the recall sub-agent uses; "inherit" follows the '
            "main memory backend setting"
        ),
    ] = "search"


class ActiveMemoryConfig(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """`plugins.entries.active-memory.config`: the Active Memory settings (docs/design.md §4.1)."""

    enabled: Annotated[
        bool,
        msgspec.Meta(
            description="Global switch of Active Memory (`/active-memory on|off --global` "
            "writes it)"
        ),
    ] = True
    agents: Annotated[
        tuple[AgentId, ...] | None,
        msgspec.Meta(
            description="Agent ids advanced Active Memory runs for; unset: every configured "
            'agent, else ["main"]'
        ),
    ] = None
    model: Annotated[
        ModelRef | None,
        msgspec.Meta(
            description="Recall model (provider/model); unset: inherit the session's model"
        ),
    ] = None
    model_fallback: Annotated[
        ModelRef | None,
        msgspec.Meta(
            description="Last link of the model chain, used only when nothing else resolves"
        ),
    ] = None
    model_fallback_policy: Annotated[
        object,
        msgspec.Meta(
            description="Deprecated: accepted and ignored, with one warning",
            extra={
                "deprecated": "is deprecated and ignored: modelFallback is only the last link "
                "of the model chain, never a failover when a model errors"
            },
        ),
    ] = None
    allowed_chat_types: Annotated[
        tuple[ChatKind, ...],
        msgspec.Meta(description="Conversation types advanced Active Memory may run in"),
    ] = ("direct",)
    allowed_chat_ids: Annotated[
        tuple[NonEmptyStr, ...],
        msgspec.Meta(
            description="Allowlist of conversation ids (case-insensitive); when non-empty, "
            "fails closed"
        ),
    ] = ()
    denied_chat_ids: Annotated[
        tuple[NonEmptyStr, ...],
        msgspec.Meta(description="Blocklist of conversation ids (case-insensitive); always wins"),
    ] = ()
    query_mode: Annotated[
        QueryMode,
        msgspec.Meta(description="How much of the conversation the recall sub-agent sees"),
    ] = "recent"
    prompt_style: Annotated[
        PromptStyle | None,
        msgspec.Meta(
            description="How eager recall is to return memory; unset: strict for message, "
            "balanced for recent, contextual for full"
        ),
    ] = None
    tools_allow: Annotated[
        tuple[NonEmptyStr, ...] | None,
        msgspec.Meta(
            description="Memory tools the recall sub-agent may call; unset: the memory slot's tools"
        ),
    ] = None
    thinking: Annotated[
        Thinking,
        msgspec.Meta(description="Thinking level of the recall model only"),
    ] = "off"
    fast_mode: Annotated[
        bool | Literal["auto"] | None,
        msgspec.Meta(description='Fast mode of the recall model only (true, false or "auto")'),
    ] = None
    prompt_append: Annotated[
        str | None,
        msgspec.Meta(description="Operator instructions added after the recall prompt"),
    ] = None
    prompt_override: Annotated[
        str | None,
        msgspec.Meta(description="Replaces the recall prompt (conversation context still follows)"),
    ] = None
    timeout_ms: Annotated[
        int,
        msgspec.Meta(ge=250, le=120_000, description="Hard budget of one recall, in ms"),
    ] = 15_000
    setup_grace_timeout_ms: Annotated[
        int,
        msgspec.Meta(
            ge=0, le=30_000, description="Extra cold-start budget added to timeoutMs, in ms"
        ),
    ] = 0
    max_summary_chars: Annotated[
        int,
        msgspec.Meta(ge=40, le=1000, description="Longest recall summary, in characters"),
    ] = 220
    recent_user_turns: Annotated[
        int,
        msgspec.Meta(ge=0, le=4, description="Earlier user turns the recent query mode includes"),
    ] = 2
    recent_assistant_turns: Annotated[
        int,
        msgspec.Meta(
            ge=0, le=3, description="Earlier assistant turns the recent query mode includes"
        ),
    ] = 1
    recent_user_chars: Annotated[
        int,
        msgspec.Meta(ge=40, le=1000, description="Cut of each recent user turn, in characters"),
    ] = 220
    recent_assistant_chars: Annotated[
        int,
        msgspec.Meta(
            ge=40, le=1000, description="Cut of each recent assistant turn, in characters"
        ),
    ] = 180
    cache_ttl_ms: Annotated[
        int,
        msgspec.Meta(
            ge=1000, le=120_000, description="How long an identical recall is reused, in ms"
        ),
    ] = 15_000
    circuit_breaker_max_timeouts: Annotated[
        int,
        msgspec.Meta(ge=1, le=20, description="Consecutive timeouts that open the circuit breaker"),
    ] = 3
    circuit_breaker_cooldown_ms: Annotated[
        int,
        msgspec.Meta(
            ge=5000, le=600_000, description="How long an open circuit breaker skips recall, in ms"
        ),
    ] = 60_000
    logging: Annotated[bool, msgspec.Meta(description="Log each recall's start and end")] = False
    persist_transcripts: Annotated[
        bool,
        msgspec.Meta(description="Keep the recall sub-agent's transcripts on disk"),
    ] = False
    transcript_dir: Annotated[
        TranscriptDir,
        msgspec.Meta(
            description="Folder of kept recall transcripts, relative to the agent's sessions folder"
        ),
    ] = "active-memory"
    qmd: Annotated[QmdConfig, msgspec.Meta(description="QMD backend settings for recall")] = (
        QmdConfig()
    )
    single_owner: Annotated[
        bool, msgspec.Meta(description="Every private chat is one owner's: recall reads them all")
    ] = False
    owner_identity: Annotated[
        NonEmptyStr | None,
        msgspec.Meta(description="Owner identity or peer id: its DMs join main and UI sessions"),
    ] = None

    @property
    def effective_prompt_style(self) -> PromptStyle:
        """`prompt_style` when set, else the style that goes with `query_mode` (docs/design.md §4.5)."""
        if self.prompt_style is not None:
            return self.prompt_style
        return STYLE_BY_QUERY_MODE[self.query_mode]


# --- The file shape of the sections Active Memory reads -------------------------------------


class ActiveMemoryEntry(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """`plugins.entries.active-memory`: the plugin's switch and its settings."""

    enabled: Annotated[
        bool,
        msgspec.Meta(
            description="Plugin switch; stays true when `--global` turns Active Memory off"
        ),
    ] = True
    config: Annotated[ActiveMemoryConfig, msgspec.Meta(description="Active Memory settings")] = (
        ActiveMemoryConfig()
    )


class PluginEntries(msgspec.Struct, frozen=True, kw_only=True, rename={"active_memory": PLUGIN_ID}):
    """`plugins.entries`: other plugins' entries belong to the host and pass through."""

    active_memory: Annotated[
        ActiveMemoryEntry, msgspec.Meta(description="The Active Memory plugin entry")
    ] = ActiveMemoryEntry()


class PluginSlots(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`plugins.slots`: only the memory slot is read."""

    memory: Annotated[
        str,
        msgspec.Meta(description="Memory plugin in use; decides the default memory tools"),
    ] = DEFAULT_MEMORY_SLOT


class PluginsSection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`plugins`."""

    slots: Annotated[PluginSlots, msgspec.Meta(description="Plugin slots")] = PluginSlots()
    entries: Annotated[PluginEntries, msgspec.Meta(description="Plugin entries")] = PluginEntries()


class AgentModelChoice(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.entries.<id>.model` in its object form; `fallbacks` and the rest pass through."""

    primary: Annotated[ModelRef | None, msgspec.Meta(description="The agent's primary model")] = (
        None
    )


class MemorySearchSection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.entries.<id>.memory.search`."""

    remember_across_conversations: Annotated[
        bool | None,
        msgspec.Meta(
            description="Cross-conversation recall for this agent; unset: on unless DMs "
            "are isolated"
        ),
    ] = None


class AgentMemorySection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.entries.<id>.memory`."""

    search: Annotated[MemorySearchSection, msgspec.Meta(description="Memory search settings")] = (
        MemorySearchSection()
    )


class AgentEntry(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.entries.<id>`."""

    model: Annotated[
        ModelRef | AgentModelChoice | None,
        msgspec.Meta(description="The agent's primary model (provider/model)"),
    ] = None
    workspace: Annotated[
        NonEmptyStr | None,
        msgspec.Meta(description="The agent's workspace folder; relative to the state folder"),
    ] = None
    memory: Annotated[AgentMemorySection, msgspec.Meta(description="Memory settings")] = (
        AgentMemorySection()
    )


# --- `agents.defaults.memorySearch`: embeddings and hybrid search (docs/design.md §4.7) ------
# The section is the host's too (it has more keys: sources, store, sync, ...): unknown keys
# pass through, and only the keys read here are typed.

EmbeddingProvider: TypeAlias = Literal["local", "openai", "ollama", "none"]
Weight: TypeAlias = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class MemorySearchLocal(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.memorySearch.local`: the offline embedder."""

    model_path: Annotated[
        NonEmptyStr | None,
        msgspec.Meta(
            description="An ONNX sentence encoder (a .onnx file with tokenizer.json beside it) "
            "instead of the shipped models"
        ),
    ] = None


class MemorySearchRemote(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.memorySearch.remote`: an OpenAI-compatible `/v1/embeddings` server."""

    base_url: Annotated[
        NonEmptyStr | None,
        msgspec.Meta(
            description="API base URL, e.g. https://host/v1; unset: the provider's default"
        ),
    ] = None
    api_key: Annotated[
        str | None,
        msgspec.Meta(description="API key; ${ENV} names an environment variable"),
    ] = None
    headers: Annotated[
        dict[NonEmptyStr, str], msgspec.Meta(description="Extra HTTP headers of each request")
    ] = {}


class HybridMmr(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.memorySearch.query.hybrid.mmr`: diversity re-ranking."""

    enabled: Annotated[
        bool, msgspec.Meta(description="Re-rank hits by maximal marginal relevance")
    ] = False
    lambda_: Annotated[
        Weight,
        msgspec.Meta(description="Relevance (1) against diversity (0) in the re-ranking"),
    ] = msgspec.field(default=0.7, name="lambda")


class HybridTemporalDecay(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.memorySearch.query.hybrid.temporalDecay`: older hits score less."""

    enabled: Annotated[bool, msgspec.Meta(description="Decay scores by the hit's age")] = False
    half_life_days: Annotated[
        float,
        msgspec.Meta(gt=0.0, le=36_500.0, description="Age at which a score is halved, in days"),
    ] = 30.0


class HybridQuery(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.memorySearch.query.hybrid`: text and vector hits fused."""

    enabled: Annotated[
        bool, msgspec.Meta(description="Fuse vector and full-text hits; off: vectors only")
    ] = True
    vector_weight: Annotated[
        Weight, msgspec.Meta(description="Weight of the vector score in the fused score")
    ] = 0.7
    text_weight: Annotated[
        Weight, msgspec.Meta(description="Weight of the full-text score in the fused score")
    ] = 0.3
    candidate_multiplier: Annotated[
        int,
        msgspec.Meta(
            ge=1, le=20, description="Candidates fetched from each side per result wanted"
        ),
    ] = 4
    mmr: Annotated[HybridMmr, msgspec.Meta(description="Diversity re-ranking")] = HybridMmr()
    temporal_decay: Annotated[
        HybridTemporalDecay, msgspec.Meta(description="Age decay of scores")
    ] = HybridTemporalDecay()


class MemorySearchQuery(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.memorySearch.query`."""

    hybrid: Annotated[HybridQuery, msgspec.Meta(description="Hybrid search")] = HybridQuery()


MAX_WATCH_DEBOUNCE_MS = 600_000


class MemorySearchSync(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.memorySearch.sync`: how the notes index follows the workspace
    (docs/design.md §4.7). The host's other sync keys pass through."""

    watch: Annotated[
        bool,
        msgspec.Meta(
            description="Watch the workspace's notes and reindex edits in the background; "
            "off: each search rescans (at most once a second)"
        ),
    ] = True
    watch_debounce_ms: Annotated[
        int,
        msgspec.Meta(
            ge=0,
            le=MAX_WATCH_DEBOUNCE_MS,
            description="Quiet time after the last edit seen before the notes are reindexed",
        ),
    ] = 1500


class MemorySearchDefaults(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.memorySearch`: how memory is embedded and searched (docs/design.md §4.7)."""

    enabled: Annotated[
        bool, msgspec.Meta(description="Vector search on; off: full-text search only")
    ] = True
    provider: Annotated[
        EmbeddingProvider | None,
        msgspec.Meta(
            description='Embedder: "local" (shipped, offline), "openai" or "ollama" '
            '(OpenAI-compatible server), "none" or null (text only)'
        ),
    ] = "local"
    model: Annotated[
        NonEmptyStr | None,
        msgspec.Meta(
            description="Embedding model; unset: all-mpnet-base-v2 (local; or all-MiniLM-L6-v2), "
            "text-embedding-3-small (openai), nomic-embed-text (ollama)"
        ),
    ] = None
    fallback: Annotated[
        EmbeddingProvider | None,
        msgspec.Meta(description="Embedder used when the provider cannot be built or fails"),
    ] = "none"
    local: Annotated[MemorySearchLocal, msgspec.Meta(description="Offline embedder")] = (
        MemorySearchLocal()
    )
    remote: Annotated[MemorySearchRemote, msgspec.Meta(description="Embeddings server")] = (
        MemorySearchRemote()
    )
    query: Annotated[MemorySearchQuery, msgspec.Meta(description="Query settings")] = (
        MemorySearchQuery()
    )
    sync: Annotated[MemorySearchSync, msgspec.Meta(description="Notes index sync")] = (
        MemorySearchSync()
    )


class SandboxSection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults.sandbox`: only what `sessions_search` reads; the rest is the host's."""

    session_tools_visibility: Annotated[
        SandboxVisibility,
        msgspec.Meta(description='What a sandboxed caller may search; "spawned": held to tree'),
    ] = "spawned"


class AgentDefaults(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents.defaults`: other host keys (compaction, ...) pass through."""

    memory_search: Annotated[
        MemorySearchDefaults, msgspec.Meta(description="Embeddings and hybrid search")
    ] = MemorySearchDefaults()
    sandbox: Annotated[SandboxSection, msgspec.Meta(description="Sandboxed callers")] = (
        SandboxSection()
    )


class AgentsSection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`agents`: other host keys pass through."""

    defaults: Annotated[AgentDefaults, msgspec.Meta(description="Settings of every agent")] = (
        AgentDefaults()
    )
    entries: Annotated[
        dict[AgentId, AgentEntry], msgspec.Meta(description="Per-agent settings by agent id")
    ] = {}


class SessionSection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`session` (also the shape of `bindings[].session`)."""

    dm_scope: Annotated[
        DmScope | None,
        msgspec.Meta(description='How direct messages are split into sessions; unset: "main"'),
    ] = None
    identity_links: Annotated[
        dict[NonEmptyStr, tuple[NonEmptyStr, ...]],
        msgspec.Meta(description="Each identity's peer ids across channels (one person's DMs)"),
    ] = {}


class BindingSession(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`bindings[].session`."""

    dm_scope: Annotated[
        str | None, msgspec.Meta(description="The binding's override of session.dmScope")
    ] = None


class BindingEntry(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`bindings[]`: `match` and the rest belong to the host."""

    agent_id: Annotated[
        str | None, msgspec.Meta(description="Agent the binding routes to; unset: any")
    ] = None
    session: Annotated[BindingSession, msgspec.Meta(description="Session overrides")] = (
        BindingSession()
    )


class ProviderModel(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`models.providers.<name>.models[]`: one model a provider serves."""

    id: Annotated[str, msgspec.Meta(description="Model id, the part after provider/")]
    name: Annotated[str | None, msgspec.Meta(description="Display name")] = None


class Provider(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`models.providers.<name>`: a model provider (recall uses the OpenAI-compatible ones)."""

    @property
    def serves_recall(self) -> bool:
        return self.api == RECALL_API and bool(self.base_url)

    base_url: Annotated[
        str | None, msgspec.Meta(description="API base URL, e.g. https://host/v1")
    ] = None
    api_key: Annotated[
        str | None, msgspec.Meta(description="API key; ${ENV} names an environment variable")
    ] = None
    api: Annotated[
        str, msgspec.Meta(description="Wire protocol; recall uses openai-completions providers")
    ] = RECALL_API
    models: Annotated[
        tuple[ProviderModel, ...], msgspec.Meta(description="Models this provider serves")
    ] = ()


class ModelsSection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`models`."""

    providers: Annotated[
        dict[str, Provider], msgspec.Meta(description="Model providers by name")
    ] = {}


# --- `tools` and `logging`: the `sessions_search` settings (docs/design.md §3) --------------
# Typed here like every other key read, so the walk reports their problems with the rest.


class ToolsSessions(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`tools.sessions`."""

    visibility: Annotated[
        Visibility, msgspec.Meta(description="Which sessions sessions_search may show a caller")
    ] = "tree"


class ToolsAgentToAgent(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`tools.agentToAgent`."""

    enabled: Annotated[
        bool, msgspec.Meta(description="Callers may search other agents' sessions")
    ] = False


class ToolsSection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`tools`: other host keys pass through."""

    sessions: Annotated[ToolsSessions, msgspec.Meta(description="Session tools")] = ToolsSessions()
    agent_to_agent: Annotated[ToolsAgentToAgent, msgspec.Meta(description="Cross-agent access")] = (
        ToolsAgentToAgent()
    )


class LoggingSection(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """`logging`: other host keys pass through."""

    redact_patterns: Annotated[
        tuple[str, ...],
        msgspec.Meta(description="Regular expressions redacted like built-in secrets"),
    ] = ()


class StorageSection(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """`storage`: where the transcripts are kept (docs/design.md §11)."""

    backend: Annotated[
        Literal["sqlite", "postgresql"],
        msgspec.Meta(description="sqlite: files in the state directory; postgresql: storage.dsn"),
    ] = "sqlite"
    dsn: Annotated[
        str | None,
        msgspec.Meta(description="PostgreSQL connection string (${ENV} for the password)"),
    ] = None
    pool_min: Annotated[
        int, msgspec.Meta(ge=1, le=256, description="Reader connections kept open")
    ] = 1
    pool_max: Annotated[
        int, msgspec.Meta(ge=1, le=256, description="Most reader connections at once")
    ] = 4
    pgvector: Annotated[
        Literal["auto", "on", "off"],
        msgspec.Meta(
            description="Vectors with the pgvector extension when a store is created"
            " (auto: if the server has it and lets the role create it)"
        ),
    ] = "auto"


class ConfigFile(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The whole config file, as far as activememory reads it; other keys are the host's."""

    plugins: Annotated[PluginsSection, msgspec.Meta(description="Plugins")] = PluginsSection()
    agents: Annotated[AgentsSection, msgspec.Meta(description="Agents")] = AgentsSection()
    session: Annotated[SessionSection, msgspec.Meta(description="Session routing")] = (
        SessionSection()
    )
    bindings: Annotated[
        tuple[BindingEntry, ...], msgspec.Meta(description="Channel-to-agent bindings")
    ] = ()
    models: Annotated[ModelsSection, msgspec.Meta(description="Model providers")] = ModelsSection()
    tools: Annotated[ToolsSection, msgspec.Meta(description="Tool settings")] = ToolsSection()
    logging: Annotated[LoggingSection, msgspec.Meta(description="Logging")] = LoggingSection()
    storage: Annotated[StorageSection, msgspec.Meta(description="Storage backend")] = (
        StorageSection()
    )


# --- The resolved view ---------------------------------------------------------------------

OWNER = "main"
"""The identity of the main and explicit sessions when `ownerIdentity` is unset."""


class PrivateScope(msgspec.Struct, frozen=True, kw_only=True):
    """Whose private sessions one caller's cross-conversation recall may read, on top of the
    boundary every caller has (docs/design.md §4.2); bound into the SQL of storage/search.py."""

    peers: tuple[str, ...] | None  # direct chats by conversation id; None: every peer
    owner: bool  # the main and explicit sessions

    def holds(self, key: SessionKey) -> bool:
        """Whether `key` is one of these sessions (the Python twin of the SQL condition in
        storage/search.py `_PRIVATE` and storage/userdata.py `_OWNED`)."""
        if key.chat_type == "direct" and key.conversation_id is not None:
            return self.peers is None or key.conversation_id in self.peers
        return key.is_private and self.owner


SINGLE_OWNER = PrivateScope(peers=None, owner=True)
_MAIN = parse_session_key("agent:main:main")


class AgentSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What the config says about one agent (`agents.entries.<id>`)."""

    model: Annotated[
        str | None, msgspec.Meta(description="Primary model (provider/model); None: unset")
    ] = None
    workspace: Annotated[
        str | None, msgspec.Meta(description="Workspace folder as written; None: the default")
    ] = None
    remember_across_conversations: Annotated[
        bool | None,
        msgspec.Meta(description="Explicit cross-conversation recall switch; None: unset"),
    ] = None


class Binding(msgspec.Struct, frozen=True, kw_only=True):
    """One `bindings[]` entry, as far as recall cares: whom it routes to, how it splits DMs."""

    agent_id: Annotated[
        str | None, msgspec.Meta(description="`agentId`; None applies to every agent")
    ] = None
    dm_scope: Annotated[
        str | None, msgspec.Meta(description="`session.dmScope`; None: no override")
    ] = None


class Config(msgspec.Struct, frozen=True, kw_only=True):
    """A loaded, validated configuration: what `am.load_config` returns.

    Immutable: a reload or `/active-memory ... --global` builds a new one, so a recall keeps
    the snapshot it started with. `raw` is the mapping as written (before `${ENV}`
    expansion), kept so a change can be written back without leaking secrets.
    """

    active_memory: Annotated[
        ActiveMemoryConfig,
        msgspec.Meta(description="`plugins.entries.active-memory.config`"),
    ] = ActiveMemoryConfig()
    plugin_enabled: Annotated[
        bool, msgspec.Meta(description="`plugins.entries.active-memory.enabled`")
    ] = True
    memory_slot: Annotated[str, msgspec.Meta(description="`plugins.slots.memory`")] = (
        DEFAULT_MEMORY_SLOT
    )
    agents: Annotated[
        dict[str, AgentSettings], msgspec.Meta(description="`agents.entries` by agent id")
    ] = {}
    dm_scope: Annotated[DmScope | None, msgspec.Meta(description="`session.dmScope`")] = None
    identity_links: Annotated[
        dict[str, tuple[str, ...]], msgspec.Meta(description="`session.identityLinks`")
    ] = {}
    bindings: Annotated[tuple[Binding, ...], msgspec.Meta(description="`bindings`")] = ()
    providers: Annotated[
        dict[str, Provider], msgspec.Meta(description="`models.providers` by name")
    ] = {}
    search: Annotated[
        SearchSettings, msgspec.Meta(description="`sessions_search` settings (docs/design.md §3)")
    ] = SearchSettings()
    memory_search: Annotated[
        MemorySearchDefaults,
        msgspec.Meta(description="`agents.defaults.memorySearch` (docs/design.md §4.7)"),
    ] = MemorySearchDefaults()
    storage: Annotated[
        StorageSection, msgspec.Meta(description="`storage` (docs/design.md §11)")
    ] = StorageSection()
    source: Annotated[
        str | None, msgspec.Meta(description="The file this was loaded from; None: a mapping")
    ] = None
    raw: Annotated[
        dict[str, Any], msgspec.Meta(description="The mapping as written, before ${ENV} expansion")
    ] = {}
    warnings: Annotated[
        tuple[str, ...], msgspec.Meta(description="Warnings issued while loading")
    ] = ()

    @property
    def enabled(self) -> bool:
        """Both switches are on: the plugin entry's `enabled` and `config.enabled` (docs/design.md §4.2)."""
        return self.plugin_enabled and self.active_memory.enabled

    def remember_across_conversations(self, agent: str) -> bool:
        """The effective `rememberAcrossConversations` of `agent` (docs/design.md §4.2).

        An explicit true/false in `agents.entries.<agent>.memory.search` wins. Otherwise it is
        on only while DMs are not isolated: `session.dmScope` unset or "main", and no binding
        that applies to this agent (its `agentId` is the agent or unset) sets another scope.
        """
        settings = self.agents.get(agent)
        if settings is not None and settings.remember_across_conversations is not None:
            return settings.remember_across_conversations
        if self.dm_scope not in (None, "main"):
            return False
        return not any(
            binding.dm_scope not in (None, "main")
            for binding in self.bindings
            if binding.agent_id is None or binding.agent_id == agent
        )

    def identity_of(self, key: SessionKey) -> str | None:
        """Whose conversation `key` is (docs/design.md §4.2); None for a group, channel or unknown.

        A direct peer is the identity that lists it in `session.identityLinks` (the first
        one), else itself; the main and explicit sessions are the owner's: `ownerIdentity`
        (an identity, or a peer and so its identity), else `OWNER`.
        """
        peer = key.conversation_id if key.chat_type == "direct" else None
        if peer is None and key.is_private:  # the main session or an explicit one
            peer = self.active_memory.owner_identity
            if peer is None or peer in self.identity_links:
                return peer or OWNER
        return self._linked(peer)

    def _linked(self, peer: str | None) -> str | None:
        return next((name for name, peers in self.identity_links.items() if peer in peers), peer)

    def private_scope(self, key: SessionKey) -> PrivateScope:
        """Which of its agent's private sessions `key`'s cross-conversation recall may read:
        its identity's direct chats, and the main and explicit sessions if it is the owner's
        (`identity_of`); with `singleOwner`, every one."""
        am, identity = self.active_memory, self.identity_of(key)
        if am.single_owner:
            return SINGLE_OWNER
        if identity is None:  # a group, channel or unknown key reads nothing anyway
            return PrivateScope(peers=(), owner=False)
        owners = key.chat_type == "explicit" or not key.conversation_id
        if am.owner_identity is not None:
            owners = owners or identity == self.identity_of(_MAIN)
        elif owners:
            return PrivateScope(peers=(), owner=True)  # no direct peer is the owner
        links = dict.fromkeys((identity, *self.identity_links.get(identity, ())))
        peers = tuple(p for p in links if self._linked(p) == identity)
        return PrivateScope(peers=peers, owner=owners)

    def sessions_of(self, identity: str) -> PrivateScope:
        """The sessions whose identity (`identity_of`) is `identity`, as a selector: the
        direct chats of the peers that resolve to it, and the main and explicit sessions
        if it is the owner's (docs/design.md §2.6: a user's data)."""
        links = dict.fromkeys((identity, *self.identity_links.get(identity, ())))
        peers = tuple(p for p in links if self._linked(p) == identity)
        return PrivateScope(peers=peers, owner=self.identity_of(_MAIN) == identity)

    def recall_agents(self) -> tuple[str, ...]:
        """The agents advanced Active Memory targets: `config.agents`, else every configured
        agent, else `("main",)`."""
        if self.active_memory.agents is not None:
            return self.active_memory.agents
        if self.agents:
            return tuple(self.agents)
        return (DEFAULT_AGENT,)

    def agent_model(self, agent: str) -> str | None:
        """The primary model configured for `agent`, or None."""
        settings = self.agents.get(agent)
        return None if settings is None else settings.model

    def workspace(self, agent: str, state_dir: Path) -> Path:
        """The workspace folder of `agent` (its `MEMORY.md` and `memory/*.md` live there).

        `agents.entries.<agent>.workspace` (a leading `~` is the home folder; a relative path
        is relative to `state_dir`), else `state_dir/agents/<agent>/workspace`.
        """
        settings = self.agents.get(agent)
        if settings is None or settings.workspace is None:
            return state_dir / "agents" / agent / "workspace"
        return state_dir / Path(settings.workspace).expanduser()

    def default_tools(self) -> tuple[str, ...]:
        """The memory tools recall may call when `toolsAllow` is unset, by memory slot."""
        return SLOT_TOOLS.get(self.memory_slot, ())

    def with_enabled(self, enabled: bool) -> Config:
        """This config with `config.enabled` set to `enabled` and the plugin entry enabled.

        `raw` is updated the same way (the rest of it is unchanged), so writing it back
        persists the switch; `source` stays the same.
        """
        raw = copy.deepcopy(self.raw)
        entry = raw.setdefault("plugins", {}).setdefault("entries", {}).setdefault(PLUGIN_ID, {})
        entry["enabled"] = True
        entry.setdefault("config", {})["enabled"] = enabled
        return msgspec.structs.replace(
            self,
            active_memory=msgspec.structs.replace(self.active_memory, enabled=enabled),
            plugin_enabled=True,
            raw=raw,
        )
