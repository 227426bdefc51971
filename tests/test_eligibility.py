"""When recall runs (docs/design.md §4.2): one row per rule.

Each row is a config, a session, its switches, and where the turn comes from; the expected
activation paths, or the reason the turn is skipped. `decide` is pure, so the table runs
without a store; `test_recall_skips_*` below check the same reasons end to end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import activememory as am
from activememory._policy import decide
from activememory.protocol.recall import SessionSwitches
from activememory.protocol.transcript import SessionInfo

CROSS = "cross_conversation"
ADV = "advanced"
DM = "agent:main:direct:alice"


def config(
    *,
    am_config: dict[str, Any] | None = None,
    plugin_enabled: bool | None = None,
    remember: bool | None = None,
    dm_scope: str | None = None,
    bindings: list[dict[str, Any]] | None = None,
    agents: dict[str, Any] | None = None,
) -> am.Config:
    entry: dict[str, Any] = {"config": am_config or {}}
    if plugin_enabled is not None:
        entry["enabled"] = plugin_enabled
    raw: dict[str, Any] = {"plugins": {"entries": {"active-memory": entry}}}
    agent_entries = dict(agents or {})
    if remember is not None:
        agent_entries.setdefault("main", {})["memory"] = {
            "search": {"rememberAcrossConversations": remember}
        }
    if agent_entries:
        raw["agents"] = {"entries": agent_entries}
    if dm_scope is not None:
        raw["session"] = {"dmScope": dm_scope}
    if bindings is not None:
        raw["bindings"] = bindings
    return am.load_config(raw)


@dataclass
class Row:
    name: str
    key: str = DM
    cfg: dict[str, Any] = field(default_factory=dict)
    session: dict[str, Any] = field(default_factory=dict)
    switch_on: bool = True
    trigger: str = "user"
    surface: str = "interactive"
    paths: tuple[str, ...] = ()
    reason: str = ""


GROUPS = {"allowedChatTypes": ["direct", "group"]}
ROWS = [
    # --- both paths on the defaults -------------------------------------------------------
    Row("direct DM, defaults: both paths", paths=(CROSS, ADV)),
    Row("the agent's main DM: both paths", key="agent:main:main", paths=(CROSS, ADV)),
    Row("dm marker is direct", key="agent:main:dm:alice", paths=(CROSS, ADV)),
    Row("no session stored yet: defaults apply", session={"missing": True}, paths=(CROSS, ADV)),
    # --- surfaces and triggers ------------------------------------------------------------
    *[
        Row(f"trigger {t}", trigger=t, reason=f"a {t} turn is not user-triggered")
        for t in ("heartbeat", "system", "inter_session")
    ],
    *[
        Row(f"surface {s}", surface=s, reason=f"the {s} surface is not interactive")
        for s in ("headless", "background", "agent_command", "subagent")
    ],
    # --- both paths need the plugin enabled -----------------------------------------------
    Row(
        "plugin entry disabled",
        cfg={"plugin_enabled": False},
        reason="the plugin is disabled (plugins.entries.active-memory.enabled)",
    ),
    Row(
        "config.enabled false",
        cfg={"am_config": {"enabled": False}},
        reason="Active Memory is off globally (config.enabled)",
    ),
    # --- the session must be known, persistent, interactive, a user conversation ----------
    Row(
        "key without agent prefix",
        key="legacy-session-1",
        reason="the session key names no known conversation",
    ),
    Row(
        "unknown chat type marker",
        key="agent:main:weird:x",
        reason="the session key names no known conversation",
    ),
    Row(
        "not persistent",
        session={"persistent": False},
        reason="the session is not persistent and interactive",
    ),
    Row(
        "not interactive",
        session={"interactive": False},
        reason="the session is not persistent and interactive",
    ),
    Row("archived", session={"archived": True}, reason="the session is archived"),
    Row(
        "spawned helper session",
        session={"spawned_by": "agent:main:main"},
        reason="the session is a sub-agent run",
    ),
    # --- the per-session switch pauses both paths -----------------------------------------
    Row(
        "/active-memory off for this session",
        switch_on=False,
        reason="off for this session (/active-memory on)",
    ),
    # --- cross-conversation: private only, effective rememberAcrossConversations ----------
    Row(
        "explicit UI session: cross only (explicit not in allowedChatTypes)",
        key="agent:main:explicit:portal-123",
        paths=(CROSS,),
    ),
    Row(
        "explicit allowed too: both",
        key="agent:main:explicit:portal-123",
        cfg={"am_config": {"allowedChatTypes": ["direct", "explicit"]}},
        paths=(CROSS, ADV),
    ),
    Row(
        "group, defaults: skipped",
        key="agent:main:group:team",
        reason="chat type group is not in allowedChatTypes; "
        "cross-conversation recall never runs in a group conversation",
    ),
    Row(
        "group allowed: advanced only, never cross",
        key="agent:main:group:team",
        cfg={"am_config": GROUPS},
        paths=(ADV,),
    ),
    Row(
        "channel allowed: advanced only",
        key="agent:main:channel:news",
        cfg={"am_config": {"allowedChatTypes": ["channel"]}},
        paths=(ADV,),
    ),
    Row("explicit false wins", cfg={"remember": False}, paths=(ADV,)),
    Row(
        "explicit true wins over DM isolation",
        cfg={"remember": True, "dm_scope": "per-peer"},
        paths=(CROSS, ADV),
    ),
    Row("dmScope main keeps it on", cfg={"dm_scope": "main"}, paths=(CROSS, ADV)),
    *[
        Row(f"dmScope {scope} turns it off", cfg={"dm_scope": scope}, paths=(ADV,))
        for scope in ("per-peer", "per-channel-peer", "per-account-channel-peer")
    ],
    Row(
        "a binding of this agent isolating DMs turns it off",
        cfg={"bindings": [{"agentId": "main", "session": {"dmScope": "per-peer"}}]},
        paths=(ADV,),
    ),
    Row(
        "a binding with no agent isolating DMs turns it off",
        cfg={"bindings": [{"session": {"dmScope": "per-channel-peer"}}]},
        paths=(ADV,),
    ),
    Row(
        "a binding of another agent leaves it on",
        cfg={"bindings": [{"agentId": "ops", "session": {"dmScope": "per-peer"}}]},
        paths=(CROSS, ADV),
    ),
    Row(
        "a binding that keeps dmScope main leaves it on",
        cfg={"bindings": [{"agentId": "main", "session": {"dmScope": "main"}}]},
        paths=(CROSS, ADV),
    ),
    Row(
        "remember off and a group: both reasons",
        key="agent:main:group:team",
        cfg={"remember": False},
        reason="chat type group is not in allowedChatTypes; "
        "rememberAcrossConversations is off for agent main",
    ),
    # --- advanced: config.agents --------------------------------------------------------
    Row(
        "agent not in config.agents: cross only",
        cfg={"am_config": {"agents": ["ops"]}},
        paths=(CROSS,),
    ),
    Row(
        "config.agents unset: the configured agents (main is not one)",
        cfg={"agents": {"personal": {}}},
        paths=(CROSS,),
    ),
    Row(
        "config.agents unset, no agents configured: main",
        paths=(CROSS, ADV),
    ),
    Row(
        "neither path: agent not listed and remember off",
        cfg={"am_config": {"agents": ["ops"]}, "remember": False},
        reason="agent main is not in config.agents; "
        "rememberAcrossConversations is off for agent main",
    ),
    # --- allowedChatIds narrows both paths, every type, and fails closed -------------------
    Row(
        "allowlist names the DM peer, any case",
        cfg={"am_config": {"allowedChatIds": ["ALICE"]}, "remember": False},
        paths=(ADV,),
    ),
    Row(
        "allowlist names the DM peer: both paths",
        cfg={"am_config": {"allowedChatIds": ["alice"]}},
        paths=(CROSS, ADV),
    ),
    Row(
        "allowlist narrows DMs too",
        cfg={"am_config": {"allowedChatIds": ["bob"]}, "remember": False},
        reason="the conversation is not in allowedChatIds",
    ),
    Row(
        "allowlist narrows cross-conversation recall too",
        cfg={"am_config": {"allowedChatIds": ["bob"]}},
        reason="the conversation is not in allowedChatIds",
    ),
    Row(
        "allowlist fails closed when the id cannot be resolved",
        key="agent:main:main",
        cfg={"am_config": {"allowedChatIds": ["main"]}, "remember": False},
        reason="allowedChatIds is set and the conversation id cannot be resolved",
    ),
    Row(
        "allowlist fails closed for cross-conversation recall too",
        key="agent:main:main",
        cfg={"am_config": {"allowedChatIds": ["main"]}},
        reason="allowedChatIds is set and the conversation id cannot be resolved",
    ),
    Row(
        "allowlist narrows explicit UI sessions too",
        key="agent:main:explicit:portal-123",
        cfg={"am_config": {"allowedChatIds": ["alice"]}},
        reason="the conversation is not in allowedChatIds",
    ),
    Row(
        "allowlist matches a group without its thread suffix",
        key="agent:main:group:Ops-Small:thread:t9",
        cfg={"am_config": {**GROUPS, "allowedChatIds": ["ops-small"]}},
        paths=(ADV,),
    ),
    Row(
        "allowlist does not widen chat types",
        key="agent:main:channel:ops-small",
        cfg={"am_config": {**GROUPS, "allowedChatIds": ["ops-small"]}},
        reason="chat type channel is not in allowedChatTypes; "
        "cross-conversation recall never runs in a channel conversation",
    ),
    # --- deniedChatIds always wins ------------------------------------------------------
    Row(
        "denied group",
        key="agent:main:group:big",
        cfg={"am_config": {**GROUPS, "deniedChatIds": ["BIG"]}},
        reason="the conversation is in deniedChatIds",
    ),
    Row(
        "denied wins over allowed",
        key="agent:main:group:big",
        cfg={"am_config": {**GROUPS, "allowedChatIds": ["big"], "deniedChatIds": ["big"]}},
        reason="the conversation is in deniedChatIds",
    ),
    Row(
        "denied stops cross-conversation recall too",
        cfg={"am_config": {"deniedChatIds": ["alice"]}},
        reason="the conversation is in deniedChatIds",
    ),
    Row(
        "the seed's rollout example: listed group",
        key="agent:main:group:oc_small_ops_group",
        cfg={
            "am_config": {
                "allowedChatTypes": ["direct", "group"],
                "allowedChatIds": ["ou_operator_open_id", "oc_small_ops_group"],
                "deniedChatIds": ["oc_large_public_group"],
            }
        },
        paths=(ADV,),
    ),
    Row(
        "the seed's rollout example: denied group",
        key="agent:main:group:oc_large_public_group",
        cfg={
            "am_config": {
                "allowedChatTypes": ["direct", "group"],
                "allowedChatIds": ["ou_operator_open_id", "oc_small_ops_group"],
                "deniedChatIds": ["oc_large_public_group"],
            }
        },
        reason="the conversation is in deniedChatIds",
    ),
]


def session_info(key: am.SessionKey, overrides: dict[str, Any]) -> SessionInfo | None:
    if overrides.get("missing"):
        return None
    values: dict[str, Any] = {
        "key": key.raw,
        "session_id": 1,
        "leaf_event_id": None,
        "revision": 0,
        "dirty": False,
        "indexed_seq": 0,
        "agent": key.agent,
        "chat_type": key.chat_type,
        "conversation_id": key.conversation_id,
        "thread_id": key.thread_id,
        "persistent": True,
        "interactive": True,
        "archived": False,
        "sandboxed": False,
        "spawned_by": None,
        "created_at": 0.0,
        "updated_at": 0.0,
    }
    values.update(overrides)
    return SessionInfo(**values)


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_eligibility_rule(row: Row) -> None:
    key = am.parse_session_key(row.key)
    verdict = decide(
        config(**row.cfg),
        key,
        session_info(key, row.session),
        SessionSwitches(active_memory=row.switch_on),
        trigger=row.trigger,  # type: ignore[arg-type]
        surface=row.surface,  # type: ignore[arg-type]
    )
    assert (verdict.paths, verdict.reason) == (row.paths, row.reason)


def test_every_row_name_is_unique() -> None:
    assert len({r.name for r in ROWS}) == len(ROWS)


@pytest.mark.anyio
async def test_recall_reports_the_skip_reason(tmp_path: Path) -> None:
    cfg = config(am_config={"agents": ["ops"]}, remember=False)
    async with am.open_memory(tmp_path / "s", config=cfg) as mem:
        await mem.sessions.append(DM, am.Message(role="user", content="hello"))
        turn = am.Turn(session_key=DM, messages=[am.Message(role="user", content="hello")])
        out = await mem.recall(turn)
    assert out.status == "skipped"
    assert out.reason == (
        "agent main is not in config.agents; rememberAcrossConversations is off for agent main"
    )
    assert out.prompt_prefix is None


@pytest.mark.anyio
async def test_recall_honours_stored_session_metadata(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s") as mem:
        await mem.sessions.create(DM, interactive=False)
        out = await mem.recall(
            am.Turn(session_key=DM, messages=[am.Message(role="user", content="hi")])
        )
        assert (out.status, out.reason) == (
            "skipped",
            "the session is not persistent and interactive",
        )
        await mem.sessions.create("agent:main:direct:bob")
        await mem.sessions.archive("agent:main:direct:bob")
        out = await mem.recall(
            am.Turn(
                session_key="agent:main:direct:bob",
                messages=[am.Message(role="user", content="hi")],
            )
        )
        assert (out.status, out.reason) == ("skipped", "the session is archived")
