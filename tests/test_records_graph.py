"""Graph expansion of records searches (docs/design.md §5.4): shortest-path trees of linked memories.

Tie-breaking, as documented in storage/records.py: a level's frontier is processed in the
order its vertices were discovered, each vertex's relations in insertion order (both
directions merged); a vertex hangs under the first parent that reaches it, and
`max_linked_results` stops the search after that many linked records.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import activememory as am
from activememory.protocol.record_results import RecordSearchResult
from activememory.protocol.records import (
    AddRecord,
    EraseUserRecords,
    InvalidateRecord,
    LinkRecords,
    Record,
    RecordRelation,
    RecordsErased,
    RecordType,
    SearchScope,
)
from activememory.storage.fts_query import plan_match
from activememory.storage.records import (
    LinkedNode,
    RecordHit,
    RecordQuery,
    RecordReader,
    RecordWriter,
    open_records_connection,
)

from pg_server import pg_memory_dsn, storage

pytestmark = pytest.mark.anyio
__all__ = ["pg_memory_dsn", "storage"]
NOW = 1_700_000_000.0


class Clock:
    now = NOW

    def __call__(self) -> float:
        return self.now


# Text only: these tests pin the full-text ranking and `distance`; by meaning is
# tests/test_records_hybrid.py.
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


@pytest.fixture
async def mem(tmp_path: Path, executor: str, storage: str | None) -> AsyncIterator[am.Memory]:
    async with am.open_memory(
        tmp_path / "state", executor=executor, clock=Clock(), config=TEXT_ONLY, storage=storage
    ) as memory:  # type: ignore[arg-type]
        yield memory


def tree(result: RecordSearchResult) -> list[Any]:
    """A result's linked tree as [(relation, source, target, child id, [...]), ...]."""
    return [
        (rel.relation, rel.source_id, rel.target_id, child.id, tree(child))
        for rel, child in result.linked_results
    ]


async def chain(mem: am.Memory, n: int, **kw: Any) -> list[str]:
    """n records r0 -next-> r1 -next-> ...; only r0 holds the word "anchor"."""
    ids = [await mem.records.add("anchor start", user_id="u1", **kw)]
    for i in range(1, n):
        ids.append(await mem.records.add(f"plain link {i}", user_id="u1", **kw))
        await mem.records.link(ids[i - 1], ids[i], relation="next")
    return ids


def trim(nodes: list[Any], levels: int) -> list[Any]:
    """A `tree` cut to its first `levels` levels."""
    if levels == 0:
        return []
    return [(a, b, c, d, trim(kids, levels - 1)) for a, b, c, d, kids in nodes]


async def test_hops_bound_the_depth_of_the_tree(mem: am.Memory) -> None:
    r = await chain(mem, 7)
    full: list[Any] = []
    for depth in range(6, 0, -1):  # the whole chain below r0, built from the bottom
        full = [("next", r[depth - 1], r[depth], r[depth], full)]
    for hops in range(6):
        [hit] = await mem.records.search("anchor", user_id="u1", num_hops=hops)
        assert tree(hit) == trim(full, hops)
        assert all(child.distance is None for _, child in hit.linked_results)


async def test_cycles_visit_each_vertex_once(mem: am.Memory) -> None:
    a = await mem.records.add("anchor a", user_id="u1")
    b = await mem.records.add("b", user_id="u1")
    c = await mem.records.add("c", user_id="u1")
    await mem.records.link(a, b, relation="x")
    await mem.records.link(b, c, relation="x")
    await mem.records.link(c, a, relation="x")
    await mem.records.link(b, a, relation="y")  # a second edge between a and b: not used
    [hit] = await mem.records.search("anchor", user_id="u1", num_hops=5)
    assert tree(hit) == [("x", a, b, b, []), ("x", c, a, c, [])]


async def test_stored_orientation_is_reported_both_ways(mem: am.Memory) -> None:
    person = await mem.records.add("Alice", user_id="u1")
    fact = await mem.records.add("anchor: likes tea", user_id="u1")
    await mem.records.link(person, fact, relation="states")  # person -states-> fact
    [hit] = await mem.records.search("anchor", user_id="u1", num_hops=1)
    [(relation, linked)] = hit.linked_results
    assert relation == RecordRelation(relation="states", source_id=person, target_id=fact)
    assert linked.id == person and linked.linked_results == []


async def test_max_linked_results_caps_across_hops_in_bfs_order(mem: am.Memory) -> None:
    a = await mem.records.add("anchor", user_id="u1")
    b, c, d, e = [await mem.records.add(n, user_id="u1") for n in "bcde"]
    for src, dst in ((a, b), (a, c), (b, d), (c, e)):
        await mem.records.link(src, dst, relation="r")
    [hit] = await mem.records.search("anchor", user_id="u1", num_hops=2, max_linked_results=3)
    assert tree(hit) == [("r", a, b, b, [("r", b, d, d, [])]), ("r", a, c, c, [])]
    [hit] = await mem.records.search("anchor", user_id="u1", num_hops=2, max_linked_results=0)
    assert hit.linked_results == []


async def test_filters_apply_to_every_linked_record(mem: am.Memory) -> None:
    clock = Clock()
    a = await mem.records.add("anchor", user_id="u1", agent_id="main", metadata={"k": 1})
    mine = await mem.records.add("mine", user_id="u1", agent_id="main", metadata={"k": 1})
    other_user = await mem.records.add("theirs", user_id="u2", agent_id="main", metadata={"k": 1})
    other_agent = await mem.records.add("agent", user_id="u1", agent_id="x", metadata={"k": 1})
    expired = await mem.records.add(
        "old", user_id="u1", agent_id="main", metadata={"k": 1}, expires_at=clock.now
    )
    no_meta = await mem.records.add("bare", user_id="u1", agent_id="main")
    beyond = await mem.records.add("beyond", user_id="u1", agent_id="main", metadata={"k": 1})
    for target in (mine, other_user, other_agent, expired, no_meta):
        await mem.records.link(a, target, relation="r")
    await mem.records.link(other_user, beyond, relation="r")  # only reachable through u2

    [hit] = await mem.records.search(
        "anchor", user_id="u1", agent_id="main", num_hops=3, metadata_filter={"k": 1}
    )
    assert tree(hit) == [("r", a, mine, mine, [])]
    # Without the metadata filter and with a non-exact agent, more records qualify.
    [hit] = await mem.records.search(
        "anchor", user_id="u1", agent_id="main", exact_agent_match=False, num_hops=3
    )
    assert {child.id for _, child in hit.linked_results} == {mine, other_agent, no_meta}
    # The store does not filter users: u2's record and what lies beyond it come back.
    [hit] = await mem.records.store.search("anchor", num_hops=3)
    assert tree(hit)[1] == ("r", a, other_user, other_user, [("r", other_user, beyond, beyond, [])])


async def test_only_memory_records_are_link_vertices(mem: am.Memory) -> None:
    a = await mem.records.add("anchor memory", user_id="u1")
    doc = await mem.records.add("anchor document", user_id="u1", record_type="document")
    img = await mem.records.add("photo", user_id="u1", record_type="image")
    behind = await mem.records.add("behind the document", user_id="u1")
    friend = await mem.records.add("friend", user_id="u1")
    await mem.records.link(a, doc, relation="cites")
    await mem.records.link(a, img, relation="shows")
    await mem.records.link(doc, behind, relation="mentions")
    await mem.records.link(doc, friend, relation="mentions")
    await mem.records.link(a, friend, relation="knows")
    hits = await mem.records.search("anchor", user_id="u1", num_hops=3)
    by_id = {h.id: h for h in hits}
    assert set(by_id) == {a, doc}
    # The document is a direct result but not expanded; the memory is not expanded through it.
    assert by_id[doc].linked_results == []
    assert tree(by_id[a]) == [("knows", a, friend, friend, [])]
    only_docs = await mem.records.search(
        "anchor", user_id="u1", num_hops=3, record_types=["document"]
    )
    assert [h.id for h in only_docs] == [doc] and only_docs[0].linked_results == []


async def test_invalid_linked_records_are_kept_whatever_include_invalid_results(
    mem: am.Memory,
) -> None:
    a = await mem.records.add("anchor", user_id="u1")
    b = await mem.records.add("stale", user_id="u1")
    c = await mem.records.add("beyond stale", user_id="u1")
    await mem.records.link(a, b, relation="r")
    await mem.records.link(b, c, relation="r")
    await mem.records.invalidate(b, reason="old")
    for include in (True, False):
        [hit] = await mem.records.search(
            "anchor", user_id="u1", num_hops=2, include_invalid_results=include
        )
        assert tree(hit) == [("r", a, b, b, [("r", b, c, c, [])])]
        assert hit.linked_results[0][1].record.invalid_reason == "old"
    await mem.records.invalidate(a, reason="old too")
    assert await mem.records.search("anchor", user_id="u1", include_invalid_results=False) == []


# -- the property: the tree is the reference BFS shortest-path tree --------------------------

KINDS = ("ok", "ok", "ok", "invalid", "document", "expired", "other_user")


@st.composite
def graphs(draw: st.DrawFn) -> tuple[list[str], list[tuple[int, int, str]], int, int]:
    n = draw(st.integers(2, 9))
    kinds = ["ok"] + [draw(st.sampled_from(KINDS)) for _ in range(n - 1)]
    pairs = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1), st.sampled_from("pq"))
    edges = [e for e in draw(st.lists(pairs, max_size=25)) if e[0] != e[1]]
    return kinds, edges, draw(st.integers(0, 5)), draw(st.integers(0, 8))


def reference_tree(
    kinds: list[str], edges: list[tuple[int, int, str]], hops: int, cap: int
) -> list[Any]:
    """Breadth-first from vertex 0 over eligible vertices, with the documented tie-break."""
    stored: list[tuple[int, int, str]] = []
    for edge in edges:  # INSERT OR IGNORE: a repeated relation is stored once
        if edge not in stored:
            stored.append(edge)
    eligible = {i for i, k in enumerate(kinds) if k in ("ok", "invalid")}
    children: dict[int, list[Any]] = {0: []}
    frontier, count = [0], 0
    for _ in range(hops):
        nxt = []
        for v in frontier:
            for s, t, name in stored:
                if v not in (s, t):
                    continue
                other = t if s == v else s
                if other not in eligible or other in children or count >= cap:
                    continue
                count += 1
                children[other] = []
                children[v].append((name, s, t, other, children[other]))
                nxt.append(other)
        frontier = nxt
    return children[0]


def distances(kinds: list[str], edges: list[tuple[int, int, str]]) -> dict[int, int]:
    eligible = {i for i, k in enumerate(kinds) if k in ("ok", "invalid")}
    dist, queue = {0: 0}, deque([0])
    while queue:
        v = queue.popleft()
        for s, t, _ in edges:
            if v in (s, t):
                other = t if s == v else s
                if other in eligible and other not in dist:
                    dist[other] = dist[v] + 1
                    queue.append(other)
    return dist


def graph_commands(kinds: list[str], edges: list[tuple[int, int, str]]) -> list[Any]:
    """The records and relations of a drawn graph as writer commands (vertex i is `v{i}`;
    0, the only "anchor", is the search's one direct match)."""
    commands: list[Any] = []
    for i, kind in enumerate(kinds):
        record = Record(
            id=f"v{i}",
            content="anchor" if i == 0 else f"vertex {i}",
            record_type=RecordType.DOCUMENT if kind == "document" else RecordType.MEMORY,
            user_id="u2" if kind == "other_user" else "u1",
            timestamp=NOW,
            expires_at=NOW if kind == "expired" else None,
        )
        commands.append(AddRecord(record=record, at=NOW))
    for s, t, name in edges:
        rel = RecordRelation(relation=name, source_id=f"v{s}", target_id=f"v{t}")
        commands.append(LinkRecords(relation=rel, at=NOW))
    commands += [
        InvalidateRecord(id=f"v{i}", reason="drawn", at=NOW)
        for i, kind in enumerate(kinds)
        if kind == "invalid"
    ]
    return commands


def graph_query(hops: int, cap: int) -> RecordQuery:
    scope = SearchScope(
        user_id="u1",
        agent_id=None,
        thread_id=None,
        exact_user_match=True,
        exact_agent_match=False,
        exact_thread_match=False,
    )
    return RecordQuery(scope=scope, now=NOW, limit=10, num_hops=hops, max_linked=cap)


def assert_shortest_path_tree(
    hit: RecordHit, kinds: list[str], edges: list[tuple[int, int, str]], hops: int, cap: int
) -> None:
    """The graph property, for any store: the reference tree, and independently of the
    tie-break every vertex at most once, at its true distance, as many as allowed."""

    def shape(nodes: list[LinkedNode]) -> list[Any]:
        return [
            (
                n.relation.relation,
                int(n.relation.source_id[1:]),
                int(n.relation.target_id[1:]),
                int(n.record.id[1:]),
                shape(n.children),
            )
            for n in nodes
        ]

    got = shape(hit.linked)
    assert got == reference_tree(kinds, edges, hops, cap)
    dist = distances(kinds, edges)
    seen: list[int] = []

    def walk(nodes: list[Any], depth: int) -> None:
        for _, _, _, v, kids in nodes:
            assert dist[v] == depth
            seen.append(v)
            walk(kids, depth + 1)

    walk(got, 1)
    assert len(seen) == len(set(seen)) and 0 not in seen
    assert len(seen) == min(cap, sum(1 for v, d in dist.items() if 0 < d <= hops))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs())
def test_expansion_is_the_reference_shortest_path_tree(
    graph: tuple[list[str], list[tuple[int, int, str]], int, int],
) -> None:
    kinds, edges, hops, cap = graph
    conn = open_records_connection(Path(":memory:"), writer=True)
    try:
        writer, reader = RecordWriter(conn), RecordReader(conn)
        writer.apply(graph_commands(kinds, edges))
        plan = plan_match("anchor")
        assert plan is not None
        [hit] = reader.search(plan, graph_query(hops, cap))
    finally:
        conn.close()
    assert_shortest_path_tree(hit, kinds, edges, hops, cap)


def test_a_mapped_reader_follows_the_file_as_it_grows_and_shrinks(tmp_path: Path) -> None:
    # The reader maps records.db (READER_MMAP_BYTES): what the writer commits later (the
    # file grown well past its size at the first search, then cut by an erase's VACUUM)
    # must read exactly as without the map.
    path = tmp_path / "records.db"
    writer_conn = open_records_connection(path, writer=True)
    reader_conn = open_records_connection(path, writer=False)
    try:
        writer, reader = RecordWriter(writer_conn), RecordReader(reader_conn)
        assert reader_conn.pragma("mmap_size") > 0

        def add(user: str, words: str, n: int) -> None:
            writer.apply(
                [
                    AddRecord(
                        record=Record(
                            id=f"{user}-{i}",
                            content=f"{words} {i} " + "padding " * 40,
                            user_id=user,
                            timestamp=NOW + i,
                        ),
                        at=NOW,
                    )
                    for i in range(n)
                ]
            )

        def found(query: str, user: str) -> list[str]:
            scope = SearchScope(
                user_id=user,
                agent_id=None,
                thread_id=None,
                exact_user_match=True,
                exact_agent_match=False,
                exact_thread_match=False,
            )
            plan = plan_match(query)
            assert plan is not None
            hits = reader.search(plan, RecordQuery(scope=scope, now=NOW, limit=3))
            return [hit.record.id for hit in hits]

        add("u1", "heron", 10)
        assert found("heron", "u1") == ["u1-9", "u1-8", "u1-7"]
        add("u2", "kestrel", 3000)  # the file grows many times over
        assert found("kestrel 2999", "u2")[0] == "u2-2999"
        [ack] = writer.apply([EraseUserRecords(user_ids=("u2",))])
        assert isinstance(ack, RecordsErased) and ack.erasure.purged  # rewritten, smaller
        assert found("kestrel", "u2") == []
        assert found("heron", "u1") == ["u1-9", "u1-8", "u1-7"]
    finally:
        reader_conn.close()
        writer_conn.close()
