"""The privacy boundary of cross-conversation recall (docs/design.md §4.2), end to end and in SQL.

Every forbidden source holds the answer to the question, each with its own marker word:
a group, a channel, another agent, unknown-key sessions, archived, headless and spawned
helper sessions, and the current conversation itself. Recall from a private chat must
return none of them; recall from a group must never return private transcript text.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import activememory as am
from activememory.storage.fts_query import plan_match
from activememory.storage.search import TermStats, search_scope

pytestmark = pytest.mark.anyio

ASKER = "agent:main:direct:alice"
QUESTION = "what is the gate code for the warehouse?"
ANSWER = "The warehouse gate code is 4417, marker {marker}."
# marker -> (session key, create() keyword arguments, archive afterwards)
FORBIDDEN: dict[str, tuple[str, dict[str, Any], bool]] = {
    "mkcurrent": (ASKER, {}, False),
    "mkgroup": ("agent:main:group:team", {}, False),
    "mkthread": ("agent:main:group:team:thread:t1", {}, False),
    "mkchannel": ("agent:main:channel:news", {}, False),
    "mkotheragent": ("agent:ops:direct:alice", {}, False),
    "mklegacy": ("legacy-conversation-7", {}, False),
    "mkweird": ("agent:main:weird:x", {}, False),
    "mkarchived": ("agent:main:direct:old", {}, True),
    "mkheadless": ("agent:main:direct:cron", {"interactive": False}, False),
    "mkoneshot": ("agent:main:explicit:run-1", {"persistent": False}, False),
    "mkspawned": ("agent:main:explicit:helper", {"spawned_by": "agent:main:main"}, False),
    "mksandboxed": ("agent:main:direct:boxed", {"sandboxed": True}, False),
}
ALLOWED = {
    "mkportal": "agent:main:explicit:portal-9",
    "mkbob": "agent:main:direct:bob",
}


async def seed(mem: am.Memory, *, allowed: bool) -> None:
    for marker, (key, flags, archive) in FORBIDDEN.items():
        await mem.sessions.create(key, **flags)
        await mem.sessions.append(
            key, am.Message(role="user", content=ANSWER.format(marker=marker))
        )
        if archive:
            await mem.sessions.archive(key)
    if allowed:
        for marker, key in ALLOWED.items():
            await mem.sessions.append(
                key, am.Message(role="assistant", content=ANSWER.format(marker=marker))
            )


def turn(key: str) -> am.Turn:
    return am.Turn(session_key=key, messages=[am.Message(role="user", content=QUESTION)])


def leaked(out: am.RecallOutcome, markers: Iterable[str]) -> set[str]:
    shown = " ".join([out.summary or "", out.prompt_prefix or "", out.debug_line, *out.followups])
    return {m for m in markers if m in shown}


async def private_scope(mem: am.Memory, caller: str, keep: int = 25) -> list[str]:
    """The session keys of the best `keep` matches in the "private" SQL scope of `caller`."""
    store = await mem._supervisor.agent(am.parse_session_key(caller).store_agent)
    plan = plan_match("warehouse gate code", "phrase")
    assert plan is not None
    page = await store.read(
        lambda reader: search_scope(
            reader.conn,
            plan,
            scope="private",
            caller=caller,
            session_key=None,
            keep=keep,
            stats=TermStats(),
        )
    )
    return [c.session_key for c in page.candidates]


def config(am_config: dict[str, Any] | None = None) -> am.Config:
    return am.load_config({"plugins": {"entries": {"active-memory": {"config": am_config or {}}}}})


async def test_private_chat_recalls_nothing_from_forbidden_sources(tmp_path: Path) -> None:
    cfg = config({"allowedChatTypes": ["direct", "group", "channel", "explicit"]})
    async with am.open_memory(tmp_path / "s", config=cfg) as mem:
        await seed(mem, allowed=False)
        await mem.command(ASKER, "/trace raw", sender=am.Sender())
        out = await mem.recall(turn(ASKER))
    assert out.paths == ("cross_conversation", "advanced")
    assert out.status == "no_relevant_memory"
    assert out.prompt_prefix is None
    assert leaked(out, FORBIDDEN) == set()


async def test_private_chat_recalls_another_private_chat(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s", config=config()) as mem:
        await seed(mem, allowed=True)
        out = await mem.recall(turn(ASKER))
    assert out.status == "ok"
    assert out.summary is not None and "4417" in out.summary
    assert leaked(out, ALLOWED) and not leaked(out, FORBIDDEN)


async def test_group_never_recalls_private_transcripts(tmp_path: Path) -> None:
    cfg = config({"allowedChatTypes": ["direct", "group", "channel", "explicit"]})
    async with am.open_memory(tmp_path / "s", config=cfg) as mem:
        await seed(mem, allowed=True)
        for asker in ("agent:main:group:team", "agent:main:channel:news"):
            await mem.command(asker, "/trace raw", sender=am.Sender())
            out = await mem.recall(turn(asker))
            assert out.paths == ("advanced",)  # allowed there, but never transcript recall
            assert out.status == "no_relevant_memory"
            assert leaked(out, {**ALLOWED, **FORBIDDEN}) == set()


async def test_private_scope_is_in_the_sql_before_the_limit(tmp_path: Path) -> None:
    # 40 forbidden rows match the query better than the one allowed row; a filter applied
    # after LIMIT would return nothing, the scope in the SQL returns the allowed one.
    async with am.open_memory(tmp_path / "s") as mem:
        await seed(mem, allowed=False)
        for i in range(40):
            await mem.sessions.append(
                "agent:main:group:team",
                am.Message(role="user", content=f"warehouse gate code 4417 warehouse gate {i}"),
            )
        await mem.sessions.append(
            ALLOWED["mkbob"], am.Message(role="user", content="the gate, marker mkbob")
        )
        found = await private_scope(mem, ASKER, keep=1)
    assert found == [ALLOWED["mkbob"]]


@pytest.mark.parametrize(
    "caller",
    [
        "agent:main:group:team",
        "agent:main:channel:news",
        "legacy-conversation-7",
        "agent:main:weird:x",
    ],
)
async def test_a_non_private_caller_sees_no_transcript_at_all(tmp_path: Path, caller: str) -> None:
    async with am.open_memory(tmp_path / "s") as mem:
        await seed(mem, allowed=True)
        assert await private_scope(mem, caller) == []


async def test_private_scope_matches_the_rule_for_every_caller(tmp_path: Path) -> None:
    """For every stored session as caller: visible == the rule written in Python."""
    async with am.open_memory(tmp_path / "s") as mem:
        await seed(mem, allowed=True)
        infos = []
        for agent in ("main", "ops"):
            store = await mem._supervisor.agent(agent)
            infos += await store.read(lambda reader: reader.sessions())
        for caller in infos:
            key = am.parse_session_key(caller.key)
            expected = {
                s.key
                for s in infos
                if key.is_private
                and s.agent == key.agent
                and s.key != key.raw
                and s.chat_type in ("direct", "explicit")
                and s.persistent
                and s.interactive
                and not s.archived
                and not s.sandboxed
                and s.spawned_by is None
            }
            assert set(await private_scope(mem, caller.key)) == expected, caller.key
