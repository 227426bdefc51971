"""memory_search by meaning with the shipped offline embedder (docs/design.md §4.7): hybrid
results, the privacy boundary on the vector side, and text alone when the embedder fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_vectors import settle

import activememory as am
from activememory.protocol.session_key import parse_session_key

from fake_embedder import FakeEmbedder

pytestmark = pytest.mark.anyio

PEANUTS = "I am allergic to peanuts, so no peanut snacks please."
LISBON = "I moved to Lisbon last March for a job at a fintech startup."
CHATTER = [
    "The weather was lovely at the beach yesterday.",
    "We watched a documentary about whales last night.",
    "My sister lives in Porto and works at a bakery.",
    "The new phone has a much better camera.",
]


def config(**active: Any) -> dict[str, Any]:
    return {"plugins": {"entries": {"active-memory": {"config": active}}}}


async def tell(mem: am.Memory, key: str, *texts: str) -> None:
    for text in texts:
        await mem.sessions.append(key, am.Message(role="user", content=text))


async def search(mem: am.Memory, caller: str, query: str, *, scope: bool = True) -> dict[str, Any]:
    key = parse_session_key(caller)
    transcripts = mem.config.private_scope(key) if scope else None
    result = await mem.notes.search("main", {"query": query}, caller=key, transcripts=transcripts)
    assert result.data is not None and json.loads(result.content) == result.data
    return dict(result.data)


def texts(data: dict[str, Any]) -> list[str]:
    return [r["snippet"] for r in data["results"]]


async def test_a_fact_is_found_by_a_question_sharing_none_of_its_words(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path, config=config(singleOwner=True)) as mem:
        await tell(mem, "agent:main:direct:maya", PEANUTS, LISBON, *CHATTER)
        await settle(mem)
        allergy = await search(mem, "agent:main:explicit:ui", "Is there anything I must not eat?")
        city = await search(mem, "agent:main:explicit:ui", "Which city am I based in?")
    assert allergy["effectiveMode"] == "hybrid" and allergy["fallback"] is None
    assert allergy["embedder"] == "local/all-mpnet-base-v2"
    assert texts(allergy)[0] == PEANUTS
    assert texts(city)[0] == LISBON
    top = allergy["results"][0]
    assert top["role"] == "user" and 0.3 <= top["similarity"] <= 1.0


async def test_a_query_near_nothing_finds_nothing(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path, config=config(singleOwner=True)) as mem:
        await tell(mem, "agent:main:direct:maya", PEANUTS, *CHATTER)
        await settle(mem)
        found = await search(mem, "agent:main:explicit:ui", "quantum chromodynamics lecture")
    assert found["results"] == [] and found["effectiveMode"] == "hybrid"


async def test_meaning_never_crosses_the_privacy_boundary(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path) as mem:  # identities: Dana's chats are Dana's
        await tell(mem, "agent:main:direct:dana", PEANUTS, LISBON)
        await tell(mem, "agent:main:group:family", "Grandma is allergic to peanuts too.")
        await tell(mem, "agent:main:direct:erin", *CHATTER)
        await settle(mem)
        erin = await search(mem, "agent:main:direct:erin", "Is there anything I must not eat?")
        erin_city = await search(mem, "agent:main:direct:erin", "Which city am I based in?")
        dana = await search(mem, "agent:main:direct:dana", "What foods should I avoid?")
        no_scope = await search(mem, "agent:main:direct:erin", "peanuts allergy", scope=False)
    for found in (erin, erin_city):
        assert found["effectiveMode"] == "hybrid"
        assert all("dana" not in r["path"] and "family" not in r["path"] for r in found["results"])
        assert PEANUTS not in texts(found) and LISBON not in texts(found)
    assert dana["results"] == []  # the caller's own conversation is never a source
    assert no_scope["results"] == []  # without a scope, no conversation at all


async def test_a_failing_embedder_leaves_text_search_and_says_so(tmp_path: Path) -> None:
    broken = FakeEmbedder()
    async with am.open_memory(tmp_path, config=config(singleOwner=True), embedder=broken) as mem:
        await tell(mem, "agent:main:direct:maya", PEANUTS, *CHATTER)
        await settle(mem)
        broken.fail = True
        found = await search(mem, "agent:main:explicit:ui", "peanut snacks")
        out = await mem.recall(
            am.Turn(
                session_key="agent:main:explicit:ui",
                messages=[am.Message(role="user", content="Which peanut snacks are fine?")],
            )
        )
    assert found["effectiveMode"] == "search"
    assert found["fallback"].startswith("the embedder failed")
    assert texts(found)[0] == PEANUTS  # (the next message matches through its context column)
    assert out.status in ("ok", "no_relevant_memory")  # the turn goes on either way
    assert "fallback=the embedder failed" in out.debug_line
