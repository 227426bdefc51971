"""Scope resolution of records searches (docs/design.md §5.2), every cell of the table.

The store holds one record for every combination of user (None, u1, u2), agent (None, a1,
a2) and thread (None, t1, t2), all with the same content, so BM25 ties and only the scope
boosts order them. The thread layer searches as thread(u1, a1, t1); the client's base call
names user u1 (except in the user cells).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

import activememory as am
from activememory._records import USER_MUST_BE_EXACT, USER_REQUIRED
from activememory.protocol.records import NOT_SET, TopKMemorySearchConfig

from pg_server import pg_memory_dsn, storage

pytestmark = pytest.mark.anyio
__all__ = ["pg_memory_dsn", "storage"]

Key = tuple[str | None, str | None, str | None]
DIMS = ("user_id", "agent_id", "thread_id")
FLAGS = {"user_id": "exact_user_match", "agent_id": "exact_agent_match",
         "thread_id": "exact_thread_match"}  # fmt: skip
OTHER = {"user_id": "u2", "agent_id": "a2", "thread_id": "t2"}
ALL = TopKMemorySearchConfig(max_results=100)


# Text only: these tests pin the full-text ranking and `distance`; by meaning is
# tests/test_records_hybrid.py.
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


@pytest.fixture
async def grid(
    tmp_path: Path, executor: str, storage: str | None
) -> AsyncIterator[tuple[am.Memory, dict[Key, str]]]:
    async with am.open_memory(
        tmp_path / "state", executor=executor, config=TEXT_ONLY, storage=storage
    ) as mem:  # type: ignore[arg-type]
        ids: dict[Key, str] = {}

        async def put(key: Key) -> None:
            user, agent, thread = key
            ids[key] = await mem.records.add(
                "window seat preference", user_id=user, agent_id=agent, thread_id=thread
            )

        async with anyio.create_task_group() as tg:  # one group commit
            for key in itertools.product(
                [None, "u1", "u2"], [None, "a1", "a2"], [None, "t1", "t2"]
            ):
                tg.start_soon(put, key)
        yield mem, ids


# The docs/design.md §5.2 table as data: what each layer does with an omitted field, as
# (value, exact, boosted); "rejected" for the client's omitted user.
DEFAULTS: dict[str, dict[str, Any]] = {
    "thread": {"user_id": ("u1", True, False), "agent_id": ("a1", True, False),
               "thread_id": ("t1", False, True)},
    "client": {"user_id": "rejected", "agent_id": (None, False, False),
               "thread_id": (None, False, False)},
    "store": {"user_id": (None, False, False), "agent_id": (None, False, False),
              "thread_id": (None, False, False)},
}  # fmt: skip
ROWS = ("omitted", "explicit_not_exact", "id_exact", "none_exact")
CELLS = [
    pytest.param(layer, row, dim, id=f"{layer}-{row}-{dim}")
    for layer in DEFAULTS
    for row in ROWS
    for dim in DIMS
]


def expected(layer: str, row: str, dim: str, value: str | None) -> Any:
    """(value, exact, boosted) of `dim` for this cell, or the error text."""
    if row == "omitted":
        default = DEFAULTS[layer][dim]
        return USER_REQUIRED if default == "rejected" else default
    if row == "explicit_not_exact":
        if layer == "client" and dim == "user_id":
            return USER_MUST_BE_EXACT
        return (value, False, True)
    if row == "id_exact":
        return (OTHER[dim], True, False)
    return (None, True, False)


def call_args(layer: str, row: str, dim: str, value: str | None) -> dict[str, Any]:
    args: dict[str, Any] = {}
    if layer == "client" and dim != "user_id":
        args["user_id"] = "u1"  # the client's base call: user u1, exact by default
    if row == "explicit_not_exact":
        args |= {dim: value, FLAGS[dim]: False}
    elif row == "id_exact":
        args |= {dim: OTHER[dim], FLAGS[dim]: True}
    elif row == "none_exact":
        args |= {dim: None, FLAGS[dim]: True}
    return args


@pytest.mark.parametrize(("layer", "row", "dim"), CELLS)
async def test_scope_table(
    grid: tuple[am.Memory, dict[Key, str]], layer: str, row: str, dim: str
) -> None:
    mem, ids = grid
    searchers = {
        "thread": mem.records.thread(user_id="u1", agent_id="a1", thread_id="t1"),
        "client": mem.records,
        "store": mem.records.store,
    }
    # The not-exact row holds for a concrete value and for an explicit None alike.
    values: list[str | None] = [OTHER[dim], None] if row == "explicit_not_exact" else [None]
    for value in values:
        args = call_args(layer, row, dim, value)
        rule = expected(layer, row, dim, value)
        if isinstance(rule, str):
            with pytest.raises(am.InvalidInputError) as caught:
                await searchers[layer].search("seat", config=ALL, **args)
            assert str(caught.value) == rule
            continue
        # The whole resolved scope: this cell's dimension, the layer's defaults elsewhere
        # (the client's base user u1 is explicit and exact).
        resolved = {}
        for d in DIMS:
            if d == dim:
                resolved[d] = rule
            elif layer == "client" and d == "user_id":
                resolved[d] = ("u1", True, False)
            else:
                resolved[d] = DEFAULTS[layer][d]
        hits = await searchers[layer].search("seat", config=ALL, **args)
        got = [h.id for h in hits]
        want = {
            rid
            for key, rid in ids.items()
            if all(not resolved[d][1] or key[i] == resolved[d][0] for i, d in enumerate(DIMS))
        }
        assert set(got) == want and len(got) == len(want)
        for h in hits:  # the records carry their scope
            assert ids[(h.record.user_id, h.record.agent_id, h.record.thread_id)] == h.id
        # Boosted dimensions: records holding more of the boosted values rank first.
        key_of = {rid: key for key, rid in ids.items()}
        boosted = [(i, resolved[d][0]) for i, d in enumerate(DIMS) if resolved[d][2]]
        matches = [sum(key_of[rid][i] == v for i, v in boosted) for rid in got]
        assert matches == sorted(matches, reverse=True)
        if rule[2]:  # this cell boosts: its value's records come before the others
            i = DIMS.index(dim)
            holders = [key_of[rid][i] == rule[0] for rid in got]
            assert any(holders) and not all(holders)
            assert holders[0] and hits[0].distance is not None
            assert hits[0].distance < hits[-1].distance  # type: ignore[operator]
            if len(boosted) == 1:
                assert holders == sorted(holders, reverse=True)


async def test_limit_counts_only_records_in_scope(
    tmp_path: Path, executor: str, storage: str | None
) -> None:
    async with am.open_memory(
        tmp_path / "state", executor=executor, config=TEXT_ONLY, storage=storage
    ) as mem:  # type: ignore[arg-type]
        async with anyio.create_task_group() as tg:
            for i in range(60):  # far better matches, all out of scope
                tg.start_soon(
                    lambda i=i: mem.records.add(
                        "seat seat seat seat", user_id="u2" if i % 2 else None, agent_id="a1"
                    )
                )
        mine = {
            await mem.records.add(
                f"a long note that mentions the seat once, number {i}", user_id="u1"
            )
            for i in range(3)
        }
        hits = await mem.records.search(
            "seat", user_id="u1", config=TopKMemorySearchConfig(max_results=3)
        )
        assert {h.id for h in hits} == mine
        # An exact agent on top: none of the user's records have it, and no other user's leak.
        assert await mem.records.search("seat", user_id="u1", agent_id="a1") == []
        # Not exact: every record comes back; the store's boost puts a1 first.
        store = await mem.records.store.search(
            "seat",
            agent_id="a1",
            exact_agent_match=False,
            config=TopKMemorySearchConfig(max_results=5),
        )
        assert len(store) == 5 and all(h.record.agent_id == "a1" for h in store)


async def test_scope_arguments_are_checked(
    tmp_path: Path, executor: str, storage: str | None
) -> None:
    async with am.open_memory(
        tmp_path / "state", executor=executor, config=TEXT_ONLY, storage=storage
    ) as mem:  # type: ignore[arg-type]
        with pytest.raises(
            am.InvalidInputError, match=r"^exact_agent_match: expected True or False, got 'yes'$"
        ):
            await mem.records.store.search("x", exact_agent_match="yes")  # type: ignore[arg-type]
        with pytest.raises(am.InvalidInputError, match=r"^thread_id: expected an id .* got ''$"):
            await mem.records.store.search("x", thread_id="")
        with pytest.raises(am.InvalidInputError, match=r"^user_id: expected an id .* got 3$"):
            mem.records.thread(user_id=3, agent_id=None, thread_id="t")  # type: ignore[arg-type]


def test_not_set_marker() -> None:
    import copy
    import pickle

    assert repr(NOT_SET) == "NOT_SET"
    assert not NOT_SET and NOT_SET is not None
    assert copy.deepcopy(NOT_SET) is NOT_SET
    assert pickle.loads(pickle.dumps(NOT_SET)) is NOT_SET
