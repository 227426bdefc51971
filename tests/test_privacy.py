"""The privacy boundary of cross-conversation recall (docs/design.md §4.2), end to end and in SQL.

Every forbidden source holds the answer to the question, each with its own marker word:
a group, a channel, another agent, unknown-key sessions, archived, headless and spawned
helper sessions, and the current conversation itself. Recall from a private chat must
return none of them; recall from a group must never return private transcript text.

Inside the boundary a caller reads only its own identity's conversations: two users (dana,
erin) never see each other, one person's linked peers do, the owner's DMs join the main and
explicit sessions only when `ownerIdentity` names them, and `singleOwner` reads them all.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

import activememory as am
from activememory.protocol.config import OWNER, SINGLE_OWNER, PrivateScope
from activememory.storage.fts_query import plan_match
from activememory.storage.search import TermStats

# Both stores: the same matrices on SQLite and on PostgreSQL (docs/design.md §11).
from pg_server import pg_memory_dsn, storage

__all__ = ["pg_memory_dsn", "storage"]

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
    if allowed:  # the assistant restating it to the user: what it says about the user counts
        for marker, key in ALLOWED.items():
            said = "Your w" + ANSWER.format(marker=marker)[5:]  # "Your warehouse gate code…"
            await mem.sessions.append(key, am.Message(role="assistant", content=said))


def turn(key: str) -> am.Turn:
    return am.Turn(session_key=key, messages=[am.Message(role="user", content=QUESTION)])


def leaked(out: am.RecallOutcome, markers: Iterable[str]) -> set[str]:
    shown = " ".join([out.summary or "", out.prompt_prefix or "", out.debug_line, *out.followups])
    return {m for m in markers if m in shown}


async def private_scope(
    mem: am.Memory,
    caller: str,
    keep: int = 25,
    *,
    scope: PrivateScope = SINGLE_OWNER,
    query: str = "warehouse gate code",
) -> list[str]:
    """The session keys of the best `keep` matches in the private SQL scope of `caller`."""
    store = await mem._supervisor.agent(am.parse_session_key(caller).store_agent)
    plan = plan_match(query, "phrase")
    assert plan is not None
    page = await store.read(
        lambda reader: reader.search_page(
            plan,
            scope=scope,
            caller=caller,
            session_key=None,
            keep=keep,
            stats=TermStats(),
        )
    )
    return [c.session_key for c in page.candidates]


def config(
    am_config: dict[str, Any] | None = None, links: dict[str, list[str]] | None = None
) -> am.Config:
    raw: dict[str, Any] = {"plugins": {"entries": {"active-memory": {"config": am_config or {}}}}}
    if links is not None:
        raw["session"] = {"identityLinks": links}
    return am.load_config(raw)


async def test_private_chat_recalls_nothing_from_forbidden_sources(
    tmp_path: Path, storage: str | None
) -> None:
    cfg = config({"allowedChatTypes": ["direct", "group", "channel", "explicit"]})
    async with am.open_memory(tmp_path / "s", storage=storage, config=cfg) as mem:
        await seed(mem, allowed=False)
        await mem.command(ASKER, "/trace raw", sender=am.Sender())
        out = await mem.recall(turn(ASKER))
    assert out.paths == ("cross_conversation", "advanced")
    assert out.status == "no_relevant_memory"
    assert out.prompt_prefix is None
    assert leaked(out, FORBIDDEN) == set()


async def test_a_single_owner_recalls_every_other_private_chat(
    tmp_path: Path, storage: str | None
) -> None:
    async with am.open_memory(
        tmp_path / "s", storage=storage, config=config({"singleOwner": True})
    ) as mem:
        await seed(mem, allowed=True)
        out = await mem.recall(turn(ASKER))
    assert out.status == "ok"
    assert out.summary is not None and "4417" in out.summary
    assert leaked(out, ALLOWED) and not leaked(out, FORBIDDEN)


async def test_group_never_recalls_private_transcripts(tmp_path: Path, storage: str | None) -> None:
    cfg = config({"allowedChatTypes": ["direct", "group", "channel", "explicit"]})
    async with am.open_memory(tmp_path / "s", storage=storage, config=cfg) as mem:
        await seed(mem, allowed=True)
        for asker in ("agent:main:group:team", "agent:main:channel:news"):
            await mem.command(asker, "/trace raw", sender=am.Sender())
            out = await mem.recall(turn(asker))
            assert out.paths == ("advanced",)  # allowed there, but never transcript recall
            assert out.status == "no_relevant_memory"
            assert leaked(out, {**ALLOWED, **FORBIDDEN}) == set()


async def test_private_scope_is_in_the_sql_before_the_limit(
    tmp_path: Path, storage: str | None
) -> None:
    # 40 forbidden rows match the query better than the one allowed row; a filter applied
    # after LIMIT would return nothing, the scope in the SQL returns the allowed one.
    async with am.open_memory(tmp_path / "s", storage=storage) as mem:
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
        # Another user's chat matches better still, and is not counted either.
        await mem.sessions.append(DANA, am.Message(role="user", content="warehouse gate code"))
        scope = config(links={"alice": ["bob"]}).private_scope(am.parse_session_key(ASKER))
        linked = await private_scope(mem, ASKER, keep=1, scope=scope)
    assert found == [ALLOWED["mkbob"]]
    assert linked == [ALLOWED["mkbob"]]


@pytest.mark.parametrize(
    "caller",
    [
        "agent:main:group:team",
        "agent:main:channel:news",
        "legacy-conversation-7",
        "agent:main:weird:x",
    ],
)
async def test_a_non_private_caller_sees_no_transcript_at_all(
    tmp_path: Path, storage: str | None, caller: str
) -> None:
    async with am.open_memory(tmp_path / "s", storage=storage) as mem:
        await seed(mem, allowed=True)
        assert await private_scope(mem, caller) == []


# --- whose conversations: identities ---------------------------------------------------

DANA = "agent:main:direct:dana"
ERIN = "agent:main:direct:erin"
MAIN = "agent:main:main"
PORTAL = "agent:main:explicit:portal-9"
PIN_HINT = "My bank PIN hint is the name of my cat, Whiskers."
CAT_QUESTION = "What is my cat's name?"


def ask(key: str, text: str) -> am.Turn:
    return am.Turn(session_key=key, messages=[am.Message(role="user", content=text)])


def shown(out: am.RecallOutcome) -> str:
    return " ".join([out.summary or "", out.prompt_prefix or "", out.debug_line, *out.followups])


async def test_one_users_memory_is_never_recalled_into_another_users_chat(
    tmp_path: Path, storage: str | None
) -> None:
    async with am.open_memory(tmp_path / "s", storage=storage, config=config()) as mem:
        await mem.sessions.append(DANA, am.Message(role="user", content=PIN_HINT))
        await mem.command(ERIN, "/trace raw", sender=am.Sender())
        out = await mem.recall(ask(ERIN, CAT_QUESTION))
    assert out.status == "no_relevant_memory"
    assert "Whiskers" not in shown(out)


LINKS = {"dana": ["telegram:123", "discord:dana#1"]}
TG, DC = "agent:main:direct:telegram:123", "agent:main:direct:discord:dana#1"
# (name, active-memory config, identityLinks, who wrote the fact, who asks, may it be seen)
MATRIX: list[tuple[str, dict[str, Any], dict[str, list[str]] | None, str, str, bool]] = [
    ("unlinked peers never see each other", {}, None, DANA, ERIN, False),
    ("nor the other way round", {}, None, ERIN, DANA, False),
    ("dm and direct markers are one peer", {}, None, DANA, "agent:main:dm:dana", True),
    ("linked peers see each other", {}, LINKS, TG, DC, True),
    ("the identity's own key is linked too", {}, LINKS, TG, DANA, True),
    ("links do not reach another user", {}, LINKS, TG, ERIN, False),
    ("main and explicit see each other", {}, None, MAIN, PORTAL, True),
    ("explicit and main see each other", {}, None, PORTAL, MAIN, True),
    ("no owner named: main never sees a DM", {}, None, DANA, MAIN, False),
    ("no owner named: a DM never sees main", {}, None, MAIN, DANA, False),
    ("no owner named: a DM never sees explicit", {}, None, PORTAL, DANA, False),
    ("the owner's DM sees main", {"ownerIdentity": "dana"}, None, MAIN, DANA, True),
    ("the owner's DM sees explicit", {"ownerIdentity": "dana"}, None, PORTAL, DANA, True),
    ("main sees the owner's DM", {"ownerIdentity": "dana"}, None, DANA, MAIN, True),
    ("explicit sees the owner's DM", {"ownerIdentity": "dana"}, None, DANA, PORTAL, True),
    ("a non-owner never sees main", {"ownerIdentity": "dana"}, None, MAIN, ERIN, False),
    ("a non-owner never sees explicit", {"ownerIdentity": "dana"}, None, PORTAL, ERIN, False),
    ("main never sees a non-owner", {"ownerIdentity": "dana"}, None, ERIN, MAIN, False),
    ("owner by identity: linked DMs", {"ownerIdentity": "dana"}, LINKS, TG, MAIN, True),
    ("owner by a linked peer id", {"ownerIdentity": "telegram:123"}, LINKS, MAIN, DC, True),
    ("singleOwner: dana and erin", {"singleOwner": True}, None, DANA, ERIN, True),
    ("singleOwner: main and a DM", {"singleOwner": True}, None, DANA, MAIN, True),
]


@pytest.mark.parametrize(
    ("am_config", "links", "writer", "asker", "visible"),
    [row[1:] for row in MATRIX],
    ids=[row[0] for row in MATRIX],
)
async def test_privacy_matrix(
    tmp_path: Path,
    storage: str | None,
    am_config: dict[str, Any],
    links: dict[str, list[str]] | None,
    writer: str,
    asker: str,
    visible: bool,
) -> None:
    cfg = config(am_config, links)
    async with am.open_memory(tmp_path / "s", storage=storage, config=cfg) as mem:
        await mem.sessions.append(writer, am.Message(role="user", content=PIN_HINT))
        await mem.command(asker, "/trace raw", sender=am.Sender())
        out = await mem.recall(ask(asker, CAT_QUESTION))
        scope = cfg.private_scope(am.parse_session_key(asker))
        found = await private_scope(mem, asker, scope=scope, query="cat name")
    assert out.paths[0] == "cross_conversation"
    assert (out.status, "Whiskers" in shown(out)) == (
        ("ok", True) if visible else ("no_relevant_memory", False)
    )
    assert found == ([writer] if visible else [])


async def test_memory_get_of_another_users_message_gets_nothing(
    tmp_path: Path, storage: str | None
) -> None:
    cfg = config()
    async with am.open_memory(tmp_path / "s", storage=storage, config=cfg) as mem:
        event = await mem.sessions.append(DANA, am.Message(role="user", content=PIN_HINT))
        args = {"path": f"session:{DANA}#{event.id}"}
        for asker, served in ((ERIN, False), ("agent:main:dm:dana", True)):
            key = am.parse_session_key(asker)
            got = await mem.notes.get("main", args, caller=key, transcripts=cfg.private_scope(key))
            assert ("Whiskers" in got.content, got.error is None) == (served, served), asker


async def test_a_cached_recall_never_crosses_identities(
    tmp_path: Path, storage: str | None
) -> None:
    # The cache key holds the caller's scope: a reload that narrows it is not served the
    # answer the wider scope found, though the session, question and model are the same.
    async with am.open_memory(
        tmp_path / "s", storage=storage, config=config({"singleOwner": True})
    ) as mem:
        await mem.sessions.append(DANA, am.Message(role="user", content=PIN_HINT))
        assert "Whiskers" in shown(await mem.recall(ask(ERIN, CAT_QUESTION)))
        assert (await mem.recall(ask(ERIN, CAT_QUESTION))).cached
        mem.reload_config(config())
        out = await mem.recall(ask(ERIN, CAT_QUESTION))
    assert (out.status, out.cached) == ("no_relevant_memory", False)
    assert "Whiskers" not in shown(out)


# --- the rule in Python against the SQL, for every stored session as caller ------------

PEERS = ("alice", "bob", "dana", "erin", "telegram:123", "discord:dana#1", "main")
PRIVATE_KEYS = [
    *(f"agent:main:direct:{p}" for p in PEERS),
    "agent:main:dm:dana",
    MAIN,
    PORTAL,
    "agent:main:explicit:ui-2",
]


def person(cfg: am.Config, key: am.SessionKey) -> object:
    """Whose conversation `key` is, written out from the config file's words."""
    links, am_cfg = cfg.identity_links, cfg.active_memory

    def of_peer(peer: str) -> str:
        return next((name for name, peers in links.items() if peer in peers), peer)

    if key.chat_type == "direct" and key.conversation_id is not None:
        return of_peer(key.conversation_id)
    owner = am_cfg.owner_identity
    if owner is None:
        return OWNER, "the unnamed owner"  # no peer is this one
    return owner if owner in links else of_peer(owner)


def random_config(rng: random.Random) -> am.Config:
    names = ["dana", "erin", "ops"]
    links = {
        name: rng.sample(PEERS, rng.randint(0, 3)) for name in rng.sample(names, rng.randint(0, 3))
    }
    am_cfg: dict[str, Any] = {}
    if rng.random() < 0.2:
        am_cfg["singleOwner"] = True
    if rng.random() < 0.6:
        am_cfg["ownerIdentity"] = rng.choice([*names, *PEERS])
    return config(am_cfg, links)


async def test_private_scope_matches_the_rule_for_every_caller(
    tmp_path: Path, storage: str | None
) -> None:
    """For every stored session as caller and random identities: visible == the rule."""
    rng = random.Random(20261201)
    async with am.open_memory(tmp_path / "s", storage=storage) as mem:
        await seed(mem, allowed=True)
        for key in PRIVATE_KEYS:
            await mem.sessions.append(key, am.Message(role="user", content=ANSWER.format(marker=0)))
        infos = []
        for agent in ("main", "ops"):
            store = await mem._supervisor.agent(agent)
            infos += await store.read(lambda reader: reader.sessions())
        for cfg in [config(), config({"singleOwner": True})] + [
            random_config(rng) for _ in range(60)
        ]:
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
                    and (
                        cfg.active_memory.single_owner
                        or person(cfg, am.parse_session_key(s.key)) == person(cfg, key)
                    )
                }
                scope = cfg.private_scope(key)
                found = await private_scope(mem, caller.key, 100, scope=scope)
                assert set(found) == expected, (caller.key, cfg.raw)


@pytest.mark.parametrize(
    ("am_config", "detail"),
    [
        ({}, "recall reads only the caller's identity's chats; no ownerIdentity"),
        ({"ownerIdentity": "dana"}, "recall reads only the caller's identity's chats; owner dana"),
        ({"singleOwner": True}, "singleOwner: every private chat of an agent recalls every other"),
    ],
)
async def test_doctor_says_whose_chats_recall_reads(
    tmp_path: Path, storage: str | None, am_config: dict[str, Any], detail: str
) -> None:
    async with am.open_memory(tmp_path / "s", storage=storage, config=config(am_config)) as mem:
        report = await mem.doctor()
    assert [c for c in report.checks if c.name == "privacy"] == [
        am.DoctorCheck(name="privacy", level="ok", detail=detail)
    ]
