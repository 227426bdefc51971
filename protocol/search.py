"""What `sessions_search` answers (docs/design.md §3), and the settings that shape it."""

from __future__ import annotations

from typing import Literal, TypeAlias

import msgspec

Visibility: TypeAlias = Literal["self", "tree", "agent", "all"]
VISIBILITIES: tuple[Visibility, ...] = ("self", "tree", "agent", "all")
SandboxVisibility: TypeAlias = Literal["spawned", "all"]
SearchMode: TypeAlias = Literal["text", "hybrid"]
SEARCH_MODES: tuple[SearchMode, ...] = ("text", "hybrid")
# How the last query term matches (docs/design.md §3): as a word, or as a prefix too.
MatchMode: TypeAlias = Literal["phrase", "prefix"]
MATCH_MODES: tuple[MatchMode, ...] = ("phrase", "prefix")
NO_EMBEDDER = "no embedder is configured (agents.defaults.memorySearch)"

DEFAULT_LIMIT = 10
MAX_LIMIT = 25
MAX_QUERY_CHARS = 4096
MAX_SNIPPET_CHARS = 300
MAX_ANSWER_BYTES = 32 * 1024

INDEXING_WARNING = (
    "The search index is still being rebuilt for {n} conversation(s) you can see, so these "
    "results may be incomplete. Missing results do not mean there are no matches: retry "
    "shortly."
)


class SearchHit(msgspec.Struct, frozen=True, kw_only=True):
    """One matching message. `snippet` is redacted and at most 300 characters."""

    session_key: str
    session_id: int
    message_id: int
    timestamp: float
    role: Literal["user", "assistant"]
    snippet: str
    score: float  # higher is better; in hybrid mode the fused score (docs/design.md §3)
    similarity: float | None = None  # hybrid mode: cosine to the query, if the row has a vector


class SearchResult(msgspec.Struct, frozen=True, kw_only=True):
    """The answer of `mem.sessions.search`.

    `indexing` is true while a session the caller may see is being re-indexed; `warning`
    then says so in words a model reads correctly. `truncated` is true when more visible
    matches existed than `limit`, a snippet was shortened, or results were dropped to keep
    the serialized answer within 32 KiB. `fallback` is set when `mode="hybrid"` was asked
    but the answer is by words alone, and says why (no embedder, or it failed or was slow).
    """

    results: tuple[SearchHit, ...]
    indexing: bool = False
    warning: str | None = None
    truncated: bool = False
    fallback: str | None = None


class SearchSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The configuration `sessions_search` obeys.

    `visibility`: `tools.sessions.visibility`. `agent_to_agent`: `tools.agentToAgent.enabled`.
    `sandbox_visibility`: `agents.defaults.sandbox.sessionToolsVisibility`; with "spawned" a
    sandboxed caller is held to `tree`. `redact_patterns`: `logging.redactPatterns`, extra
    regular expressions whose matches are redacted like built-in secrets.
    """

    visibility: Visibility = "tree"
    agent_to_agent: bool = False
    sandbox_visibility: SandboxVisibility = "spawned"
    redact_patterns: tuple[str, ...] = ()
