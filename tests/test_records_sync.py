"""`activememory.sync` answers record searches exactly as the async API does (docs/design.md §5)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

import activememory as am
import activememory.sync as ams


def shape(results: list[am.RecordSearchResult]) -> list[tuple[object, ...]]:
    return [(r.id, r.distance, r.formatted_content, len(r.linked_results or [])) for r in results]


# Text only: these tests pin the full-text ranking and `distance`; by meaning is
# tests/test_records_hybrid.py.
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_sync_and_async_give_identical_results(tmp_path: Path, backend: str) -> None:
    state = tmp_path / "s"
    with ams.open_memory(state, backend=backend, config=TEXT_ONLY) as mem:
        a = mem.records.add("likes aisle seats on long flights", user_id="u1", agent_id="main")
        b = mem.records.add(
            "flies to Lisbon every March", user_id="u1", agent_id="main", thread_id="t1"
        )
        c = mem.records.add("shared seat map for the team", user_id=None, agent_id=None)
        mem.records.link(a, b, relation="about")
        mem.records.invalidate(c, reason="superseded")
        blocking = [
            mem.records.search("seat flights", user_id="u1", num_hops=1),
            mem.records.thread(user_id="u1", agent_id="main", thread_id="t1").search("Lisbon seat"),
            mem.records.store.search("seat", agent_id=None, exact_agent_match=True),
        ]

    async def searches() -> list[list[am.RecordSearchResult]]:
        async with am.open_memory(state, config=TEXT_ONLY) as amem:
            thread = amem.records.thread(user_id="u1", agent_id="main", thread_id="t1")
            return [
                await amem.records.search("seat flights", user_id="u1", num_hops=1),
                await thread.search("Lisbon seat"),
                await amem.records.store.search("seat", agent_id=None, exact_agent_match=True),
            ]

    awaited = anyio.run(searches, backend=backend)
    assert [shape(r) for r in blocking] == [shape(r) for r in awaited]
    assert [r.id for r in blocking[0]][:1] == [a]
    linked = blocking[0][0].linked_results
    assert linked and linked[0][1].id == b
    assert [r.id for r in blocking[2]] == [c]
