"""The records store (docs/design.md §5.1, §5.3): lifecycle, expiry, persistence, bad input, types,
the writer dialog, and the `memory_recall` tool. The tests through `open_memory` run on both
stores (`storage`, tests/pg_server.py: SQLite, then PostgreSQL, docs/design.md §11)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

import activememory as am
from activememory._records import recall_tool
from activememory._redaction import Redactor
from activememory.protocol.records import (
    AddRecord,
    InvalidateRecord,
    LinkRecords,
    MemorySearchConfig,
    Record,
    RecordAck,
    RecordAdded,
    RecordCommand,
    RecordDeleted,
    RecordInvalidated,
    RecordRejected,
    RecordRelation,
    RecordsLinked,
    RecordStatus,
    RecordType,
    TopKMemorySearchConfig,
)
from activememory.recall.local_model import candidates_of
from activememory.storage.records import fts_integrity_ok

from pg_server import pg_memory_dsn, storage

pytestmark = pytest.mark.anyio
__all__ = ["pg_memory_dsn", "storage"]


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# Text only: these tests pin the full-text ranking and `distance`; by meaning is
# tests/test_records_hybrid.py.
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def mem(
    tmp_path: Path, executor: str, clock: Clock, storage: str | None
) -> AsyncIterator[am.Memory]:
    async with am.open_memory(
        tmp_path / "state", executor=executor, clock=clock, config=TEXT_ONLY, storage=storage
    ) as memory:  # type: ignore[arg-type]
        yield memory


async def ids(hits: Any) -> list[str]:
    return [h.id for h in hits]


async def test_add_get_and_search_return_the_record_with_its_fields(
    mem: am.Memory, clock: Clock
) -> None:
    rid = await mem.records.add(
        "Prefers aisle seats on long flights",
        user_id="u1",
        agent_id="main",
        thread_id="t1",
        metadata={"source": "chat", "n": 2},
    )
    record = await mem.records.get(rid)
    assert record == Record(
        id=rid,
        content="Prefers aisle seats on long flights",
        record_type=RecordType.MEMORY,
        user_id="u1",
        agent_id="main",
        thread_id="t1",
        metadata={"source": "chat", "n": 2},
        timestamp=clock.now,
    )
    [hit] = await mem.records.search("seat", user_id="u1")  # stemmed: seats ~ seat
    assert (hit.id, hit.content, hit.metadata, hit.timestamp) == (
        rid,
        record.content,
        record.metadata,
        clock.now,
    )
    assert hit.status is RecordStatus.VALID and hit.record == record
    assert hit.distance is not None and 0 < hit.distance <= 1
    assert hit.linked_results == []
    assert await mem.records.get("0" * 32) is None
    assert len(rid) == 32 and int(rid, 16) >= 0


async def test_invalidate_keeps_the_reason_and_include_invalid_results_filters(
    mem: am.Memory,
) -> None:
    old = await mem.records.add("lives in Paris", user_id="u1")
    new = await mem.records.add("lives in Berlin", user_id="u1")
    await mem.records.invalidate(old, reason="moved to Berlin")
    record = await mem.records.get(old)
    assert record is not None
    assert (record.status, record.invalid_reason) == (RecordStatus.INVALID, "moved to Berlin")
    # Omitted: valid and invalid both, in every layer.
    assert set(await ids(await mem.records.search("lives", user_id="u1"))) == {old, new}
    thread = mem.records.thread(user_id="u1", agent_id=None, thread_id="t")
    assert set(await ids(await thread.search("lives"))) == {old, new}
    assert set(await ids(await mem.records.store.search("lives"))) == {old, new}
    assert set(
        await ids(await mem.records.search("lives", user_id="u1", include_invalid_results=True))
    ) == {old, new}
    # False: only valid ones.
    for search in (
        mem.records.search("lives", user_id="u1", include_invalid_results=False),
        thread.search("lives", include_invalid_results=False),
        mem.records.store.search("lives", include_invalid_results=False),
    ):
        assert await ids(await search) == [new]
    await mem.records.invalidate(old, reason="again")  # a new reason replaces the old
    record = await mem.records.get(old)
    assert record is not None and record.invalid_reason == "again"


async def test_expired_records_are_never_returned(mem: am.Memory, clock: Clock) -> None:
    soon = await mem.records.add("gate B12", user_id="u1", expires_at=clock.now + 60)
    never = await mem.records.add("gate B13", user_id="u1")
    past = await mem.records.add("gate B14", user_id="u1", expires_at=clock.now - 1)
    assert set(await ids(await mem.records.store.search("gate"))) == {soon, never}
    assert await mem.records.get(past) is None
    clock.now += 60  # expires_at <= now: gone
    assert await ids(await mem.records.store.search("gate")) == [never]
    assert await mem.records.get(soon) is None


async def test_records_persist_across_reopen(
    tmp_path: Path, executor: str, storage: str | None
) -> None:
    state = tmp_path / "state"
    async with am.open_memory(state, executor=executor, storage=storage) as mem:  # type: ignore[arg-type]
        a = await mem.records.add("the cat is called Miso", user_id="u1", metadata={"k": "v"})
        b = await mem.records.add("Miso is a tabby", user_id="u1")
        await mem.records.link(a, b, relation="about")
        await mem.records.invalidate(b, reason="wrong cat")
    # On PostgreSQL the records are the server's: another state directory finds them.
    assert (state / "records.db").is_file() == (storage is None)
    if storage is not None:
        state = tmp_path / "another"
    async with am.open_memory(state, executor=executor, storage=storage) as mem:  # type: ignore[arg-type]
        [hit] = await mem.records.search("called", user_id="u1", num_hops=1)
        assert hit.id == a and hit.metadata == {"k": "v"}
        [(relation, linked)] = hit.linked_results
        assert relation == RecordRelation(relation="about", source_id=a, target_id=b)
        assert linked.status is RecordStatus.INVALID
        assert linked.record.invalid_reason == "wrong cat"
        await mem.records.delete(b)
        assert await mem.records.get(b) is None
        [hit] = await mem.records.search("called", user_id="u1", num_hops=1)
        assert hit.linked_results == []
        db = await mem._supervisor.records()
        if storage is None:
            assert await db.read(lambda reader: fts_integrity_ok(reader.conn))
        assert await db.read(lambda reader: reader.count()) == 1


async def test_image_records_are_found_by_their_description(mem: am.Memory) -> None:
    image = await mem.records.add(
        "Photo of a red bicycle leaning on a canal bridge",
        user_id="u1",
        record_type="image",
        metadata={"url": "https://example.org/bike.jpg"},
    )
    doc = await mem.records.add("Bicycle insurance policy", user_id="u1", record_type="document")
    hits = await mem.records.search("bicycle", user_id="u1")
    assert {h.id for h in hits} == {image, doc}
    only = await mem.records.search("bicycle", user_id="u1", record_types=["image"])
    assert [h.id for h in only] == [image] and only[0].record_type is RecordType.IMAGE
    msg = await mem.records.add(
        "book the bicycle tour", user_id="u1", record_type=RecordType.MESSAGE, role="user"
    )
    found = await mem.records.search("tour", user_id="u1", record_types=[RecordType.MESSAGE])
    assert [h.id for h in found] == [msg] and found[0].record.role == "user"


async def test_metadata_filter_matches_exact_scalar_values(mem: am.Memory) -> None:
    a = await mem.records.add("note one", user_id="u1", metadata={"src": "chat", "n": 1})
    b = await mem.records.add("note two", user_id="u1", metadata={"src": "mail", "n": 1.0})
    c = await mem.records.add("note three", user_id="u1", metadata={"src": "chat", "n": True})
    d = await mem.records.add("note four", user_id="u1", metadata={"src": None})

    async def found(**filters: Any) -> set[str]:
        return {
            h.id for h in await mem.records.search("note", user_id="u1", metadata_filter=filters)
        }

    assert await found(src="chat") == {a, c}
    assert await found(n=1) == {a, b}  # numbers compare as numbers; True is not 1
    assert await found(n=True) == {c}
    assert await found(src=None) == {d}
    assert await found(src="chat", n=1) == {a}
    assert await found(missing="x") == set()


async def test_cjk_and_query_syntax_are_safe(mem: am.Memory) -> None:
    rid = await mem.records.add("東京に行きました", user_id="u1")
    assert await ids(await mem.records.search("東京", user_id="u1")) == [rid]
    for query in ['"unbalanced', "NEAR(a b)", "a* OR -b", "col:term", "^x", "((("]:
        assert await mem.records.search(query, user_id="u1") == []
    assert await mem.records.search("!!!", user_id="u1") == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m: m.records.add("", user_id="u1"), r"^content: must not be blank$"),
        (lambda m: m.records.add(3, user_id="u1"), r"^content: expected a string, got int$"),
        (
            lambda m: m.records.add("x" * 100_001, user_id="u1"),
            r"^content: 100001 characters is over the maximum 100000$",
        ),
        (
            lambda m: m.records.add("x", user_id="u1", record_type="note"),
            r"^record_type: 'note' is not one of 'memory', 'message', 'document', "
            r"'actor_profile', 'image'$",
        ),
        (
            lambda m: m.records.add("x", user_id="u1", metadata={"a": {1, 2}}),
            r"^metadata\['a'\]: set is not JSON data \(str, int, float, bool, None, list, dict\)$",
        ),
        (
            lambda m: m.records.add("x", user_id="u1", metadata={"a": [1, float("nan")]}),
            r"^metadata\['a'\]\[1\]: nan is not a finite number \(not JSON\)$",
        ),
        (
            lambda m: m.records.add("x", user_id="u1", metadata={1: "a"}),
            r"^metadata: keys must be strings, got 1$",
        ),
        (
            lambda m: m.records.add("x", user_id="u1", metadata=["a"]),
            r"^metadata: expected a mapping, got list$",
        ),
        (
            lambda m: m.records.add("x", user_id="u1", role="user"),
            r"^role: only message records have a role$",
        ),
        (
            lambda m: m.records.add("x", user_id="u1", expires_at=float("inf")),
            r"^expires_at: expected a finite number of seconds since the epoch, got inf$",
        ),
        (
            lambda m: m.records.add("x", user_id="bad\nid"),
            r"^user_id: expected an id \(1 to 256 characters, no control characters\) or None, "
            r"got 'bad\\nid'$",
        ),
        (
            lambda m: m.records.link("a" * 32, "b" * 32, relation="not ok"),
            r"^relation: 'not ok' is not a relation name",
        ),
        (lambda m: m.records.link("a" * 32, "b" * 32, relation="about"), r"^source_id: no record"),
        (lambda m: m.records.link("a", "a", relation="about"), r"^target_id: a record cannot"),
        (lambda m: m.records.invalidate("nope", reason="x"), r"^id: no record 'nope'$"),
        (
            lambda m: m.records.invalidate("nope", reason=" "),
            r"^reason: expected a non-empty string, got ' '$",
        ),
        (lambda m: m.records.delete("nope"), r"^id: no record 'nope'$"),
        (lambda m: m.records.search(" ", user_id="u1"), r"^query: must not be blank$"),
        (
            lambda m: m.records.search("\ud800", user_id="u1"),
            r"^query: lone surrogate '\\ud800' at index 0 \(text must be valid Unicode\)$",
        ),
        (
            lambda m: m.records.search("x", user_id="u1", num_hops=6),
            r"^num_hops: 6 is not an integer from 0 to 5$",
        ),
        (
            lambda m: m.records.search("x", user_id="u1", max_linked_results=-1),
            r"^max_linked_results: -1 is not an integer from 0 to 10000$",
        ),
        (
            lambda m: m.records.search("x", user_id="u1", include_invalid_results="no"),
            r"^include_invalid_results: expected True or False, got 'no'$",
        ),
        (
            lambda m: m.records.search("x", user_id="u1", record_types=["memo"]),
            r"^record_types\[0\]: 'memo' is not one of",
        ),
        (
            lambda m: m.records.search("x", user_id="u1", record_types=[]),
            r"^record_types: must name at least one record type$",
        ),
        (
            lambda m: m.records.search("x", user_id="u1", metadata_filter={"a": [1]}),
            r"^metadata_filter\['a'\]: expected a str, finite number, bool or None, got \[1\]$",
        ),
        (
            lambda m: m.records.search("x", user_id="u1", config={"max_results": 3}),
            r"^config: expected a MemorySearchConfig, got dict$",
        ),
    ],
)
async def test_bad_input_names_the_field(mem: am.Memory, call: Any, message: str) -> None:
    with pytest.raises(am.InvalidInputError, match=message):
        await call(mem)
    assert await mem.records.store.search("x") == []  # nothing was written


async def test_link_of_a_missing_target_names_it(mem: am.Memory) -> None:
    a = await mem.records.add("x", user_id="u1")
    with pytest.raises(am.InvalidInputError, match=r"^target_id: no record 'zz'$"):
        await mem.records.link(a, "zz", relation="about")
    rel = await mem.records.link(a, await mem.records.add("y", user_id="u1"), relation="about")
    assert await mem.records.link(rel.source_id, rel.target_id, relation="about") == rel


async def test_concurrent_adds_share_one_commit(mem: am.Memory) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(40):
            tg.start_soon(lambda i=i: mem.records.add(f"item {i}", user_id="u1"))
    db = await mem._supervisor.records()
    assert db.actor.commands == 40 and db.actor.batches < 40
    assert len(await mem.records.store.search("item", config=MemorySearchConfig())) == 10


async def test_closed_memory_rejects_record_calls(tmp_path: Path, executor: str) -> None:
    async with am.open_memory(tmp_path / "s", executor=executor) as mem:  # type: ignore[arg-type]
        pass
    with pytest.raises(am.MemoryClosedError):
        await mem.records.add("x", user_id="u1")


def test_writer_dialog_round_trips() -> None:
    record = Record(id="r1", content="c", user_id="u", metadata={"a": [1]}, timestamp=1.0)
    commands: list[RecordCommand] = [
        AddRecord(record=record, at=2.0),
        LinkRecords(relation=RecordRelation(relation="about", source_id="a", target_id="b"), at=1),
        InvalidateRecord(id="r1", reason="old", at=3.0),
    ]
    acks: list[RecordAck] = [
        RecordAdded(id="r1"),
        RecordsLinked(
            relation=RecordRelation(relation="x", source_id="a", target_id="b"), created=True
        ),
        RecordInvalidated(id="r1", reason="old"),
        RecordDeleted(id="r1", relations=2),
        RecordRejected(reason="not_found", message="id: no record 'r1'"),
    ]
    for value, kind in [(c, RecordCommand) for c in commands] + [(a, RecordAck) for a in acks]:
        assert msgspec.json.decode(msgspec.json.encode(value), type=kind) == value


# -- memory_recall ------------------------------------------------------------------------


async def test_memory_recall_tool_shape(mem: am.Memory) -> None:
    seat = await mem.records.add(
        "Prefers aisle seats; api_key=sk-abcdefghijklmnopqrstuvwxyz123456",
        user_id="u1",
        agent_id="main",
        thread_id="t1",
        metadata={"password": "hunter2hunter2"},
    )
    other_thread = await mem.records.add("Aisle seat, window view", user_id="u1", agent_id="main")
    stale = await mem.records.add("Hates aisle seats", user_id="u1", agent_id="main")
    linked = await mem.records.add("Flies to Lisbon monthly", user_id="u1", agent_id="main")
    await mem.records.link(seat, linked, relation="about")
    await mem.records.invalidate(stale, reason="changed mind")
    await mem.records.add("aisle seat", user_id="u2", agent_id="main")  # another user
    await mem.records.add("aisle seat", user_id="u1", agent_id="other")  # another agent

    result = await recall_tool(
        mem.records, {"query": "aisle seat"}, user_id="u1", agent_id="main", thread_id="t1"
    )
    assert result.name == "memory_recall" and result.evidence and result.error is None
    assert result.data is not None
    assert result.data["hits"] == 2
    rows = result.data["results"]
    assert isinstance(rows, list)
    assert [r["id"] for r in rows] == [seat, other_thread]  # this thread's record first
    assert set(rows[0]) == {"id", "content", "distance", "record_type", "status"}
    assert rows[0]["record_type"] == "memory" and rows[0]["status"] == "valid"
    assert "sk-abcdefghij" not in rows[0]["content"] and "api_key=" in rows[0]["content"]
    root = ET.fromstring(result.content)
    assert root.tag == "memory_records"
    records = root.findall("record")
    assert [r.get("id") for r in records] == [seat, other_thread]
    [link] = records[0].findall("linked")
    assert (link.get("relation"), link.get("source"), link.get("target")) == (
        "about",
        seat,
        linked,
    )
    assert "sk-abcdefghij" not in result.content and "hunter2" not in result.content

    custom = await recall_tool(
        mem.records,
        {"query": "Lisbon", "maxResults": 1},
        user_id="u1",
        agent_id="main",
        thread_id="t1",
        redactor=Redactor([r"Lisbon"]),
    )
    assert custom.data is not None and custom.data["hits"] == 1
    assert "Lisbon" not in custom.content

    # The local recall model reads the structured results: the direct records' text.
    pieces = [c.text for c in candidates_of(result)]
    assert pieces[0].startswith("Prefers aisle seats") and "Aisle seat, window view" in pieces

    empty = await recall_tool(
        mem.records, {"query": "submarine"}, user_id="u1", agent_id="main", thread_id="t1"
    )
    assert empty.data is not None
    assert (empty.evidence, empty.content, empty.data["results"], empty.data["hits"]) == (
        False,
        "<memory_records/>",
        [],
        0,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, r'^missing required key "query"$'),
        ({"query": ""}, r'^query: expected a non-empty string, got ""$'),
        ({"query": "x", "maxResults": 26}, r"^maxResults: 26 is above the maximum 25$"),
        (
            {"query": "x", "limit": 2},
            r"^limit: unknown key; expected one of query, maxResults$",
        ),
    ],
)
async def test_memory_recall_rejects_bad_arguments(
    mem: am.Memory, args: dict[str, Any], message: str
) -> None:
    with pytest.raises(am.InvalidInputError, match=message):
        await recall_tool(mem.records, args, user_id="u1", agent_id="main", thread_id="t1")


async def test_top_k_config_caps_direct_results(mem: am.Memory) -> None:
    async with anyio.create_task_group() as tg:
        for i in range(15):
            tg.start_soon(lambda i=i: mem.records.add(f"seat {i}", user_id="u1"))
    assert len(await mem.records.search("seat", user_id="u1")) == 10
    top = await mem.records.search(
        "seat", user_id="u1", config=TopKMemorySearchConfig(max_results=12)
    )
    assert len(top) == 12


def test_the_blocking_facade_serves_records(tmp_path: Path, storage: str | None) -> None:
    with am.sync.open_memory(tmp_path / "state", storage=storage) as mem:
        rid = mem.records.add("likes aisle seats", user_id="u1", thread_id="t1")
        thread = mem.records.thread(user_id="u1", agent_id=None, thread_id="t1")
        assert [h.id for h in thread.search("seat")] == [rid]
        [hit] = mem.records.store.search("seat", thread_id="t1")
        assert hit.formatted_content.startswith(f'<record id="{rid}"')


@pytest.fixture
def small_rank_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Common above 30 records, at most 5 ranked rows per search (docs/design.md §5)."""
    from activememory.storage import records as records_storage
    from activememory.storage import search as search_storage
    from activememory.storage.pg import records as pg_records

    monkeypatch.setattr(records_storage, "COMMON_DOCS", 30)
    monkeypatch.setattr(search_storage, "RANK_BUDGET", 5)
    monkeypatch.setattr(pg_records, "COMMON_DOCS", 30)
    monkeypatch.setattr(pg_records, "RANK_BUDGET", 5)


async def test_over_the_rank_budget_a_record_holding_only_the_rarest_term_comes_first(
    mem: am.Memory, small_rank_budget: None
) -> None:
    for i in range(40):
        await mem.records.add(f"filler chatter {i}", user_id="u1")
    kestrel = [await mem.records.add("kestrel kestrel kestrel", user_id="u1") for _ in range(6)]
    kestrel += [await mem.records.add(f"kestrel seen {i}", user_id="u1") for i in range(6)]
    zephyr = [await mem.records.add(f"zephyr alone {i}", user_id="u1") for i in range(2)]
    # Over the budget with "zephyr", "kestrel" is answered by recency after the rarer term.
    config = TopKMemorySearchConfig(max_results=14)
    found = await ids(await mem.records.search("kestrel zephyr", user_id="u1", config=config))
    assert set(found[:2]) == set(zephyr)
    assert set(found[2:]) == set(kestrel)


async def test_a_rarest_term_over_the_budget_still_fills_the_limit_from_older_records(
    mem: am.Memory, small_rank_budget: None
) -> None:
    for i in range(40):
        await mem.records.add(f"filler chatter {i}", user_id="u1")
    strong = await mem.records.add("heron heron heron heron heron heron", user_id="u1")
    herons = [await mem.records.add(f"heron {i}", user_id="u2") for i in range(12)]
    # Ranked over its newest 5 matches (all of u2): the strongest, older, is not first ...
    found = await ids(await mem.records.store.search("heron"))
    assert found[0] != strong and found[0] in herons
    # ... yet an older match in scope still comes back when the window holds none.
    assert await ids(await mem.records.search("heron", user_id="u1")) == [strong]
