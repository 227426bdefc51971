"""The memory-records slot: recall through memory_recall never crosses users (docs/design.md §4.7, §5)."""

from __future__ import annotations

from pathlib import Path

import pytest

import activememory as am

from pg_server import pg_memory_dsn, storage

pytestmark = pytest.mark.anyio
__all__ = ["pg_memory_dsn", "storage"]

RECORDS_SLOT = {"plugins": {"slots": {"memory": "memory-records"}}}


def turn(key: str, text: str) -> am.Turn:
    return am.Turn(session_key=key, messages=[am.Message(role="user", content=text)])


async def test_memory_recall_is_scoped_to_the_conversations_user(
    tmp_path: Path, storage: str | None
) -> None:
    cfg = {**RECORDS_SLOT}
    cfg["plugins"] = {**RECORDS_SLOT["plugins"], "entries": {"active-memory": {"config": {
        "allowedChatTypes": ["direct", "group"]}}}}  # fmt: skip
    async with am.open_memory(tmp_path / "s", config=cfg, storage=storage) as mem:
        await mem.records.add("I always take the aisle seat", user_id="alice", agent_id="main")
        await mem.records.add("I always take the window seat", user_id="bob", agent_id="main")
        await mem.records.add(
            "Team seats are booked in row 12", user_id=None, agent_id="main", thread_id=None
        )
        plan = await mem.plan_recall(turn("agent:main:direct:alice", "which seat do I take?"))
        assert plan.request is not None and plan.request.tools == ("memory_recall",)
        alice = await mem.recall(turn("agent:main:direct:alice", "which seat do I always take?"))
        bob = await mem.recall(turn("agent:main:direct:bob", "which seat do I always take?"))
        group = await mem.recall(turn("agent:main:group:team", "which seats are booked?"))
    assert alice.status == "ok" and "aisle" in (alice.summary or "")
    assert bob.status == "ok" and "window" in (bob.summary or "")
    for out, foreign in ((alice, "window"), (bob, "aisle")):
        assert foreign not in (out.summary or "") + out.debug_line
    assert "row 12" in (group.summary or "")
    assert "aisle" not in (group.summary or "") and "window" not in (group.summary or "")


async def test_a_linked_peers_records_are_its_identitys(
    tmp_path: Path, storage: str | None
) -> None:
    # The records user of a direct chat is its identity, as for transcripts (Config.identity_of).
    cfg = {**RECORDS_SLOT, "session": {"identityLinks": {"dana": ["telegram:123"]}}}
    async with am.open_memory(tmp_path / "s", config=cfg, storage=storage) as mem:
        await mem.records.add("I always take the aisle seat", user_id="dana", agent_id="main")
        await mem.records.add("I always take the window seat", user_id="erin", agent_id="main")
        question = "which seat do I always take?"
        linked = await mem.recall(turn("agent:main:direct:telegram:123", question))
        erin = await mem.recall(turn("agent:main:direct:erin", question))
    assert linked.status == "ok" and "aisle" in (linked.summary or "")
    assert "window" not in (linked.summary or "") + linked.debug_line
    assert erin.status == "ok" and "window" in (erin.summary or "")
    assert "aisle" not in (erin.summary or "") + erin.debug_line
