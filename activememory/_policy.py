"""When recall runs (docs/design.md §4.2): the surfaces, the two activation paths, the chat lists.

`decide` is a pure function of the config, the session and its switches, so the whole rule
table is tested without a store. What recall may *see* once it runs is decided elsewhere,
in SQL (`storage.search._PRIVATE`, `Config.private_scope`).
"""

from __future__ import annotations

from typing import NamedTuple

from .protocol.config import Config
from .protocol.recall import RecallPath, SessionSwitches, Surface, Trigger
from .protocol.session_key import SessionKey
from .protocol.transcript import SessionInfo


class Eligibility(NamedTuple):
    """The activation paths that let this turn recall, or why none does."""

    paths: tuple[RecallPath, ...]
    reason: str = ""

    @property
    def eligible(self) -> bool:
        return bool(self.paths)

    @property
    def transcripts(self) -> bool:
        """May memory_search read the agent's other private conversations this turn?"""
        return "cross_conversation" in self.paths


def _skip(reason: str) -> Eligibility:
    return Eligibility((), reason)


def decide(
    config: Config,
    key: SessionKey,
    session: SessionInfo | None,
    switches: SessionSwitches,
    *,
    trigger: Trigger,
    surface: Surface,
) -> Eligibility:
    """Decide whether the turn of `key` may recall, and along which paths.

    `session` is the stored session (None before its first message: the defaults apply,
    persistent and interactive). The order of the checks fixes which reason is reported
    when several apply.
    """
    am = config.active_memory
    if not config.plugin_enabled:
        return _skip("the plugin is disabled (plugins.entries.active-memory.enabled)")
    if not am.enabled:
        return _skip("Active Memory is off globally (config.enabled)")
    if trigger != "user":
        return _skip(f"a {trigger} turn is not user-triggered")
    if surface != "interactive":
        return _skip(f"the {surface} surface is not interactive")
    if key.chat_type == "unknown" or key.agent is None:
        return _skip("the session key names no known conversation")
    if session is not None:
        if not (session.persistent and session.interactive):
            return _skip("the session is not persistent and interactive")
        if session.archived:
            return _skip("the session is archived")
        if session.spawned_by is not None:
            return _skip("the session is a sub-agent run")
    if not switches.active_memory:
        return _skip("off for this session (/active-memory on)")
    conversation = key.conversation_id.casefold() if key.conversation_id else None
    # The chat lists are the operator's "only here" and "never here": they stop both paths.
    if conversation is not None and conversation in _folded(am.denied_chat_ids):
        return _skip("the conversation is in deniedChatIds")
    if am.allowed_chat_ids and conversation is None:
        # Fails closed: with an allowlist, a conversation we cannot name is not guessed at.
        return _skip("allowedChatIds is set and the conversation id cannot be resolved")
    if am.allowed_chat_ids and conversation not in _folded(am.allowed_chat_ids):
        return _skip("the conversation is not in allowedChatIds")

    paths: list[RecallPath] = []
    cross_reason = ""
    if not config.remember_across_conversations(key.agent):
        cross_reason = f"rememberAcrossConversations is off for agent {key.agent}"
    elif not key.is_private:
        cross_reason = f"cross-conversation recall never runs in a {key.chat_type} conversation"
    else:
        paths.append("cross_conversation")

    advanced_reason = ""
    if key.agent not in config.recall_agents():
        advanced_reason = f"agent {key.agent} is not in config.agents"
    elif key.chat_type not in am.allowed_chat_types:
        advanced_reason = f"chat type {key.chat_type} is not in allowedChatTypes"
    else:
        paths.append("advanced")

    if paths:
        return Eligibility(tuple(paths))
    return _skip(f"{advanced_reason}; {cross_reason}")


def _folded(ids: tuple[str, ...]) -> frozenset[str]:
    return frozenset(i.casefold() for i in ids)
