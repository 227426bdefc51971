"""The public accessors the inspector page reads (docs/design.md §12.3): `mem.trace_recall`,
`mem.recall_cache_info` and `mem.records.linked`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import activememory as am

pytestmark = pytest.mark.anyio

DM = "agent:main:direct:alice"
SOURCE = "agent:main:dm:alice"
FACT = "I drink oolong tea every morning."
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


def config(**settings: Any) -> dict[str, Any]:
    plugin = {"config": {"model": "test/model", **settings}}
    return {**TEXT_ONLY, "plugins": {"entries": {"active-memory": plugin}}}


def turn(text: str = "what tea do I drink in the morning?") -> am.Turn:
    return am.Turn(session_key=DM, messages=[am.Message(role="user", content=text)])


class Searching:
    """Looks up `queries` in order, drafts, then answers."""

    def __init__(self, *queries: str) -> None:
        self.queries = queries

    async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
        for query in self.queries:
            await tools.call("memory_search", {"query": query})
        tools.draft("a draft")
        return "The user drinks oolong tea every morning."


async def test_trace_recall_gives_the_transcript_and_the_evidence(tmp_path: Path) -> None:
    model = Searching("zzqx nothing", "oolong tea")
    async with am.open_memory(tmp_path / "s", config=config(), models={"test/model": model}) as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        trace = await mem.trace_recall(turn())
        assert trace.outcome.status == "ok" and trace.outcome.prompt_prefix is not None
        assert trace.run_id is not None and trace.run_id.startswith("recall-")
        kinds = [line["type"] for line in trace.transcript]
        assert kinds == [
            "prompt", "tool_call", "tool_result", "tool_call", "tool_result", "draft", "end"
        ]  # fmt: skip
        assert trace.transcript[0]["search_query"] == "what tea do I drink in the morning?"
        assert [line["at"] >= 0 for line in trace.transcript] == [True] * 7
        assert [r.evidence for r in trace.tool_results] == [False, True]
        assert FACT in trace.tool_results[1].content
        assert trace.transcript[4]["evidence"] is True

        # The same turn again: the cache answers, no sub-agent runs.
        again = await mem.trace_recall(turn())
        assert again.outcome.cached and again.run_id is None
        assert again.transcript == () and again.tool_results == ()


async def test_a_skipped_turn_has_no_run(tmp_path: Path) -> None:
    async with am.open_memory(
        tmp_path / "s", config=config(enabled=False), models={"test/model": Searching()}
    ) as mem:
        trace = await mem.trace_recall(turn())
        assert trace.outcome.status == "skipped" and trace.run_id is None
        assert trace.transcript == ()


async def test_trace_recall_checks_its_turn(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s", config=TEXT_ONLY) as mem:
        with pytest.raises(am.InvalidInputError, match="turn: expected am.Turn, got str"):
            await mem.trace_recall("hello")  # type: ignore[arg-type]


async def test_recall_cache_info_counts_live_entries_and_clears(tmp_path: Path) -> None:
    async with am.open_memory(
        tmp_path / "s", config=config(cacheTtlMs=60_000), models={"test/model": Searching("tea")}
    ) as mem:
        assert mem.recall_cache_info() == am.RecallCacheInfo(
            entries=0, max_entries=1024, ttl_ms=60_000, clears=0
        )
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        assert (await mem.recall(turn())).status == "ok"
        assert mem.recall_cache_info().entries == 1
        await mem.erase_identity("someone-else")
        info = mem.recall_cache_info()
        assert (info.entries, info.clears) == (0, 1)


async def test_records_linked_gives_one_records_graph(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s", config=TEXT_ONLY) as mem:
        add = mem.records.add
        aisle = await add("prefers aisle seats", user_id="alice")
        trip = await add("flies to Lisbon in May", user_id="alice")
        note = await add("packing list", user_id="bob")  # another user: still linked
        far = await add("hotel near the river", user_id="alice")
        doc = await add("a travel document", user_id="alice", record_type="document")
        await mem.records.link(aisle, trip, relation="about")
        await mem.records.link(note, trip, relation="part_of")
        await mem.records.link(far, note, relation="mentions")
        await mem.records.link(aisle, doc, relation="cites")  # not a memory: never linked

        one = await mem.records.linked(aisle)
        assert one is not None and one.record.id == aisle and one.distance == 0.0
        assert [(rel.relation, r.record.id) for rel, r in one.linked_results] == [("about", trip)]
        assert one.linked_results[0][1].linked_results == []

        three = await mem.records.linked(aisle, num_hops=3)
        assert three is not None
        (_, hop1), = three.linked_results  # fmt: skip
        (rel2, hop2), = hop1.linked_results  # fmt: skip
        assert (rel2.source_id, rel2.relation, rel2.target_id) == (note, "part_of", trip)
        assert [r.record.id for _, r in hop2.linked_results] == [far]

        capped = await mem.records.linked(aisle, num_hops=3, max_linked_results=2)
        assert (
            capped is not None
            and capped.linked_results[0][1].linked_results[0][1].linked_results == []
        )
        alone = await mem.records.linked(aisle, num_hops=0)
        assert alone is not None and alone.linked_results == []
        assert await mem.records.linked("0" * 32) is None
        document = await mem.records.linked(doc)
        assert document is not None and document.linked_results == []

        with pytest.raises(am.InvalidInputError, match="num_hops"):
            await mem.records.linked(aisle, num_hops=6)
        with pytest.raises(am.InvalidInputError, match="max_linked_results"):
            await mem.records.linked(aisle, max_linked_results=-1)
        with pytest.raises(am.InvalidInputError, match="^id: "):
            await mem.records.linked("")
