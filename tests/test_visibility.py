"""Who sees what in sessions_search (docs/design.md §3): the visibility matrix.

caller kind × session kind × agent × sandboxed × visibility setting × agentToAgent ×
sandbox clamp. Every session holds one "needle" message; a caller must get exactly the
needles of the sessions it may see, and hidden matches must never change what comes back.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

import activememory as am

from pg_server import pg_memory_dsn, storage

# Both stores (docs/design.md §11): visibility in SQL before LIMIT on SQLite and PostgreSQL.
__all__ = ["pg_memory_dsn", "storage"]

pytestmark = pytest.mark.anyio

# name -> (session key, spawned_by name, sandboxed)
SESSIONS: dict[str, tuple[str, str | None, bool]] = {
    "root": ("agent:main:direct:root", None, False),
    "child": ("agent:main:explicit:child", "root", False),
    "grandchild": ("agent:main:group:team:thread:t1", "child", False),
    "sibling": ("agent:main:direct:sibling", None, False),
    "channel": ("agent:main:channel:news", None, False),
    "legacy": ("legacy-session-without-agent", None, False),  # unknown, main's database
    "boxed": ("agent:main:explicit:boxed", None, True),
    "boxed_child": ("agent:main:explicit:boxed-child", "boxed", False),
    "ops": ("agent:ops:direct:root", None, False),
    "ops_child": ("agent:ops:explicit:child", "ops", False),
}
AGENT = {name: ("ops" if name.startswith("ops") else "main") for name in SESSIONS}
TREES = {
    "root": {"root", "child", "grandchild"},
    "child": {"child", "grandchild"},
    "sibling": {"sibling"},
    "legacy": {"legacy"},
    "boxed": {"boxed", "boxed_child"},
    "boxed_child": {"boxed_child"},
    "ops": {"ops", "ops_child"},
    "ghost": set(),
}
CALLERS = [*TREES]
KEYS = {name: key for name, (key, _, _) in SESSIONS.items()} | {
    "ghost": "agent:main:direct:ghost"  # no such session
}


def expected(caller: str, visibility: str, a2a: bool, sandbox: str) -> set[str]:
    """The docs/design.md §3 rules, spelled out independently of the implementation."""
    sandboxed = caller in SESSIONS and SESSIONS[caller][2]
    if sandboxed and sandbox == "spawned" and visibility in ("agent", "all"):
        visibility = "tree"
    agent = "ops" if caller.startswith("ops") else "main"
    own = {n for n in SESSIONS if AGENT[n] == agent}
    match visibility:
        case "self":
            return {caller} & set(SESSIONS)
        case "tree":
            return TREES[caller]
        case "agent":
            return own
        case _:
            return set(SESSIONS) if a2a else own


async def populate(mem: am.Memory, *, hidden_extra: set[str] | None = None) -> dict[int, str]:
    """One needle per session; returns message id -> session name."""
    owner: dict[int, str] = {}
    for name, (key, parent, sandboxed) in SESSIONS.items():
        spawned_by = SESSIONS[parent][0] if parent else None
        await mem.sessions.create(key, sandboxed=sandboxed, spawned_by=spawned_by)
        await mem.sessions.append(key, am.Message(role="user", content=f"filler words {name}"))
        event = await mem.sessions.append(
            key, am.Message(role="assistant", content=f"the needle is in {name}")
        )
        owner[event.id] = name
    return owner


def config(visibility: str, a2a: bool, sandbox: str) -> dict[str, object]:
    return {
        "tools": {"sessions": {"visibility": visibility}, "agentToAgent": {"enabled": a2a}},
        "agents": {"defaults": {"sandbox": {"sessionToolsVisibility": sandbox}}},
    }


SETTINGS = list(
    itertools.product(["self", "tree", "agent", "all"], [False, True], ["spawned", "all"])
)


@pytest.mark.parametrize(("visibility", "a2a", "sandbox"), SETTINGS)
async def test_visibility_matrix(
    tmp_path: Path, executor: str, storage: str | None, visibility: str, a2a: bool, sandbox: str
) -> None:
    async with am.open_memory(
        tmp_path / "state",
        config=config(visibility, a2a, sandbox),
        executor=executor,  # type: ignore[arg-type]
        storage=storage,
    ) as mem:
        await populate(mem)
        for caller in CALLERS:
            want = expected(caller, visibility, a2a, sandbox)
            res = await mem.sessions.search("needle", caller=KEYS[caller], limit=25)
            got = {hit.session_key for hit in res.results}
            assert got == {KEYS[n] for n in want}, (caller, visibility, a2a, sandbox)
            assert len(res.results) == len(want)
            assert not res.truncated and not res.indexing
            # Narrowing to one session never reaches past the visible set.
            for name in SESSIONS:
                one = await mem.sessions.search(
                    "needle", caller=KEYS[caller], session_key=KEYS[name], limit=25
                )
                assert {h.session_key for h in one.results} == (
                    {KEYS[name]} if name in want else set()
                ), (caller, name)


@pytest.mark.parametrize(
    ("visibility", "a2a", "sandbox"),
    [("tree", False, "spawned"), ("agent", False, "spawned"), ("all", True, "all")],
)
async def test_hidden_matches_never_change_the_visible_top_k(
    tmp_path: Path, storage: str | None, visibility: str, a2a: bool, sandbox: str
) -> None:
    async with am.open_memory(
        tmp_path / "state",
        config=config(visibility, a2a, sandbox),
        executor="thread" if storage else "inline",
        storage=storage,
    ) as mem:
        await populate(mem)
        for caller in CALLERS:
            before = await mem.sessions.search("needle", caller=KEYS[caller], limit=2)
            shown = {h.session_key for h in before.results}
            want = expected(caller, visibility, a2a, sandbox)
            hidden = [n for n in SESSIONS if n not in want]
            # Many strong matches where the caller cannot look.
            for name in hidden:
                for _ in range(5):
                    await mem.sessions.append(
                        SESSIONS[name][0], am.Message(role="user", content="needle needle")
                    )
            after = await mem.sessions.search("needle", caller=KEYS[caller], limit=2)
            assert [h.message_id for h in after.results] == [h.message_id for h in before.results]
            assert (after.truncated, after.indexing) == (before.truncated, before.indexing)
            assert {h.session_key for h in after.results} == shown


async def test_dirty_hidden_sessions_do_not_raise_the_indexing_flag(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "state", executor="inline") as mem:
        owner = await populate(mem)
        sibling_needle = next(i for i, n in owner.items() if n == "sibling")
        await mem.sessions.rewind(SESSIONS["sibling"][0], sibling_needle)  # sibling is dirty
        res = await mem.sessions.search("needle", caller=KEYS["root"])
        assert not res.indexing and res.warning is None
        res = await mem.sessions.search("needle", caller=KEYS["sibling"])
        # The reconciler may already have finished; if not, the caller is told.
        assert res.indexing == (res.warning is not None)
