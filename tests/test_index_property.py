"""For any mix of appends, rewinds, deletes, imports, resumed re-imports, rebuilds, reindexes
and re-appends, the index holds
exactly the user/assistant text of the active branches (clean sessions at once; dirty ones
after the rebuild). With an embedder: at every acknowledged point no vector belongs to a row
off an active branch or of a dirty session, and once the embedder actor is idle the vectors
are exactly those rows (docs/design.md §2.3)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import apsw
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import activememory as am

from fake_embedder import FakeEmbedder
from index_probe import agent_db, indexed_tokens, tokenize

KEYS = ["agent:main:direct:a", "agent:main:group:g", "agent:ops:main", "legacy-key"]
WORDS = ["alpha", "beta", "café", "İstanbul", "naïve", "zeta", "東京", "x1", "", "   "]

texts = st.lists(st.sampled_from(WORDS), min_size=0, max_size=4).map(" ".join)
roles = st.sampled_from(["user", "assistant", "tool"])
ops = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(KEYS), roles, texts),
    st.tuples(st.just("rewind"), st.sampled_from(KEYS), st.integers(0, 50)),
    st.tuples(st.just("delete"), st.sampled_from(KEYS)),
    st.tuples(st.just("import"), st.sampled_from(KEYS), st.lists(texts, min_size=1, max_size=4)),
    st.tuples(st.just("rebuild"), st.sampled_from(KEYS)),
    # `reindex` through the reconciler: one session, or its whole agent (§2.4).
    st.tuples(st.just("reindex"), st.sampled_from(KEYS), st.booleans()),
    # The same import again, resumed: a session that holds it is left as it is (§2.5).
    st.tuples(st.just("reimport"), st.sampled_from(KEYS)),
)
# With an embedder, also: let the embedder actor catch up before the next operation.
vector_ops = st.one_of(ops, st.tuples(st.just("settle"), st.sampled_from(KEYS)))


@dataclass
class ModelSession:
    parents: dict[int, int | None] = field(default_factory=dict)
    texts: dict[int, str | None] = field(default_factory=dict)
    leaf: int | None = None
    dirty: bool = False
    imported: list[am.ImportEntry] = field(default_factory=list)

    def branch(self) -> list[int]:
        out, node = [], self.leaf
        while node is not None:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def expected_index(self) -> dict[int, list[str]]:
        return {e: tokenize(t) for e in self.branch() if (t := self.texts[e]) is not None}


def message(role: str, text: str) -> am.Message:
    return am.Message(role=role, content=text)  # type: ignore[arg-type]


def stored_vectors(state: Path, agent: str) -> set[tuple[int, str]]:
    db = agent_db(state, agent)
    if not db.exists():
        return set()
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return {
            (int(e), str(n)) for e, n in conn.execute("SELECT event_id, name FROM message_vectors")
        }
    finally:
        conn.close()


def vector_rows(model: dict[str, ModelSession], agent: str, *, clean_only: bool) -> set[int]:
    """The active-branch user/assistant messages of `agent`'s (clean) sessions."""
    return {
        e
        for key, session in model.items()
        if am.parse_session_key(key).store_agent == agent and not (clean_only and session.dirty)
        for e in session.expected_index()
    }


async def settle(mem: am.Memory) -> None:
    def working() -> bool:
        return not all(
            s.embedder is None or s.embedder.idle() for s in mem._supervisor.open_agents()
        )

    with anyio.fail_after(30):
        while working():  # noqa: ASYNC110 - the state of several actors, no one event
            await anyio.sleep(0.001)


async def no_dirty_sessions(mem: am.Memory, agent: str) -> None:
    with anyio.fail_after(30):
        while any(  # noqa: ASYNC110 - a count in the database, no event to wait on
            s.agent == agent and s.dirty_sessions
            for s in await mem.sessions.stats(check_integrity=False)
        ):
            await anyio.sleep(0.001)


async def run_ops(
    state: Path, operations: list[tuple[object, ...]], embedder: FakeEmbedder | None = None
) -> None:
    model: dict[str, ModelSession] = {}
    async with am.open_memory(state, executor="inline", embedder=embedder) as mem:
        for op in operations:
            kind, key = op[0], str(op[1])
            session = model.get(key)
            if kind == "append":
                msg = message(str(op[2]), str(op[3]))
                event = await mem.sessions.append(key, msg)
                session = model.setdefault(key, ModelSession())
                assert event.parent_id == session.leaf
                session.parents[event.id] = session.leaf
                session.texts[event.id] = msg.index_text
                session.leaf = event.id
            elif kind == "rewind" and session and session.parents:
                targets = sorted(session.parents)
                target = targets[int(op[2]) % len(targets)]
                await mem.sessions.rewind(key, target)
                session.dirty = session.dirty or target != session.leaf
                session.leaf = target
            elif kind == "delete" and session:
                await mem.sessions.delete(key)
                del model[key]
            elif kind == "import" and session is None:
                items = [str(t) for t in op[2]]  # type: ignore[attr-defined]
                entries = [
                    am.ImportEntry(
                        id=str(i), parent_id=str(i - 1) if i else None, timestamp=float(i),
                        message=message("user" if i % 2 == 0 else "assistant", t),
                    )
                    for i, t in enumerate(items)
                ]  # fmt: skip
                await mem.sessions.import_transcript(key, entries)
                history = await mem.sessions.history(key)
                session = model[key] = ModelSession(dirty=True, imported=entries)
                for event, entry in zip(history, entries, strict=True):
                    session.parents[event.id] = event.parent_id
                    session.texts[event.id] = entry.message.index_text
                session.leaf = history[-1].id
            elif kind == "rebuild" and session:
                await mem.sessions.rebuild_index(key)
                session.dirty = False
            elif kind == "reindex" and session:
                agent = am.parse_session_key(key).store_agent
                if op[2]:
                    await mem.sessions.reindex(agent=agent)
                else:
                    await mem.sessions.reindex(key)
                    # The reconciler it poked rebuilds the agent's other dirty sessions too.
                    await no_dirty_sessions(mem, agent)
                for other, state_of in model.items():
                    if am.parse_session_key(other).store_agent == agent:
                        state_of.dirty = False
            elif kind == "reimport" and session and session.imported:
                assert await mem.sessions.import_transcript(key, session.imported, resume=True) == 0
            elif kind == "settle":
                await settle(mem)
            if embedder is not None:  # at every acknowledged point: nothing off-branch
                for agent in ("main", "ops"):
                    allowed = {
                        (e, embedder.name) for e in vector_rows(model, agent, clean_only=True)
                    }
                    assert stored_vectors(state, agent) <= allowed

        for key, session in model.items():
            history = await mem.sessions.history(key)
            assert [e.id for e in history] == session.branch()
            assert (await mem.sessions.info(key)).dirty == session.dirty

        def expected(agent: str, *, clean_only: bool) -> dict[int, list[str]]:
            out: dict[int, list[str]] = {}
            for key, session in model.items():
                if am.parse_session_key(key).store_agent == agent and not (
                    clean_only and session.dirty
                ):
                    out.update(session.expected_index())
            return out

        agents = ("main", "ops")
        for agent in agents:  # clean sessions are exact before any rebuild
            db = agent_db(state, agent)
            if db.exists():
                dirty_ids = {
                    e
                    for key, s in model.items()
                    if s.dirty and am.parse_session_key(key).store_agent == agent
                    for e in s.parents
                }  # event ids are per agent database
                actual = {k: v for k, v in indexed_tokens(db).items() if k not in dirty_ids}
                assert actual == expected(agent, clean_only=True)
        await mem.sessions.rebuild_index()
        for agent in agents:
            db = agent_db(state, agent)
            if db.exists():
                assert indexed_tokens(db) == expected(agent, clean_only=False)
        assert all(s.fts_integrity_ok and s.dirty_sessions == 0 for s in await mem.sessions.stats())
        if embedder is not None:  # once idle: exactly the active branches' messages
            await settle(mem)
            for agent in agents:
                wanted = {(e, embedder.name) for e in vector_rows(model, agent, clean_only=False)}
                assert stored_vectors(state, agent) == wanted
            assert all(s.vectors_pending == 0 for s in await mem.sessions.stats())


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=40))
def test_index_equals_active_branches(operations: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run_ops, Path(tmp), operations)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(vector_ops, min_size=1, max_size=40))
def test_vectors_equal_active_branches(operations: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(run_ops, Path(tmp), operations, FakeEmbedder())
