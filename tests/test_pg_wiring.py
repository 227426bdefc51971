"""`open_memory(storage=...)` on PostgreSQL (docs/design.md §11 "Wiring"): selecting the
store, its errors, several processes on one store, and the parts not on PostgreSQL yet.

The public-API suites that run on both stores import `storage` from tests/pg_server.py
(test_privacy.py, test_search.py, test_search_redaction.py, test_transcripts.py,
test_visibility.py); this module holds what only PostgreSQL has.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import anyio
import psycopg
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import activememory as am

from pg_server import emptied_memory_dsn, empty_store, pg_memory_dsn, scratch_database

__all__ = ["emptied_memory_dsn", "pg_memory_dsn"]

pytestmark = pytest.mark.anyio

TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
KEY = "agent:main:direct:alice"
CHILD = Path(__file__).with_name("pg_wiring_child.py")


def hello(text: str = "hello from the store") -> am.Message:
    return am.Message(role="user", content=text)


@pytest.fixture
def anyio_backend() -> str:
    """trio: the store runs on executor threads, the same under either loop (the suites
    that run on both stores use both loops; the sharing test below does too)."""
    return "trio"


@pytest.mark.parametrize("anyio_backend", ["trio", "asyncio"])
async def test_two_memories_share_one_store_without_a_writer_lock(tmp_path: Path, dsn: str) -> None:
    # The same state directory twice (SQLite refuses the second: one writer per directory),
    # and a second directory: all three read and write the same sessions.
    async with (
        am.open_memory(tmp_path / "a", storage=dsn, config=TEXT_ONLY) as first,
        am.open_memory(tmp_path / "a", storage=dsn, config=TEXT_ONLY) as second,
        am.open_memory(tmp_path / "b", storage=dsn, config=TEXT_ONLY) as third,
    ):
        one = await first.sessions.append(KEY, hello("the ferry leaves at noon"))
        two = await second.sessions.append(KEY, hello("the ferry is late"))
        assert two.parent_id == one.id
        assert [e.id for e in await third.sessions.history(KEY)] == [one.id, two.id]
        found = await third.sessions.search("ferry", caller=KEY)
        assert {h.message_id for h in found.results} == {one.id, two.id}
        assert [s.key for s in await third.sessions.list()] == [KEY]
    assert not (tmp_path / "a" / "agents").exists()  # no SQLite database was made


async def test_the_config_selects_postgresql_with_its_dsn_from_the_environment(
    tmp_path: Path, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AM_TEST_STORE_DSN", dsn)
    config = {
        **TEXT_ONLY,
        "storage": {"backend": "postgresql", "dsn": "${AM_TEST_STORE_DSN}", "poolMax": 2},
    }
    async with am.open_memory(tmp_path / "s", config=config) as mem:
        event = await mem.sessions.append(KEY, hello())
        assert mem.config.raw["storage"]["dsn"] == "${AM_TEST_STORE_DSN}"  # kept unexpanded
    async with am.open_memory(tmp_path / "t", storage=dsn, config=TEXT_ONLY) as mem:
        assert [e.id for e in await mem.sessions.history(KEY)] == [event.id]
    # `storage="sqlite"` overrides the config: a store of files, empty.
    async with am.open_memory(tmp_path / "u", storage="sqlite", config=config) as mem:
        assert await mem.sessions.list() == []
        assert await mem.sessions.append(KEY, hello())
    assert (tmp_path / "u" / "agents" / "main" / "memory.db").exists()


@pytest.mark.parametrize(
    ("storage", "config", "error", "match"),
    [
        (
            None,
            {"storage": {"backend": "postgresql"}},
            am.InvalidInputError,
            "^storage.dsn: required",
        ),
        (None, {"storage": {"backend": "mysql"}}, am.InvalidInputError, "storage.backend"),
        (None, {"storage": {"poolMax": 0}}, am.InvalidInputError, "storage.poolMax"),
        (None, {"storage": {"pgvector": "yes"}}, am.InvalidInputError, "storage.pgvector"),
        (None, {"storage": {"dsn": "${AM_TEST_UNSET_DSN}"}}, am.InvalidInputError, "AM_TEST_UNSET"),
        (42, {}, am.InvalidInputError, '^storage: expected "sqlite" or a PostgreSQL'),
        ("", {}, am.InvalidInputError, "^storage.dsn: expected a PostgreSQL connection string"),
        ("mysql://x", {}, am.InvalidInputError, "^storage.dsn: expected postgresql://"),
        (
            "postgresql://postgres:hunter2@127.0.0.1:1/none",
            {},
            am.StorageError,
            r"^storage.dsn: cannot connect to 'postgresql://postgres:\*\*\*@127.0.0.1:1/none'",
        ),
        (
            "postgresql://postgres@127.0.0.1:5432/activememory_no_such_database",
            {},
            am.StorageError,
            'database "activememory_no_such_database" does not exist',
        ),
    ],
)
async def test_bad_storage_settings_are_clear_errors_and_create_nothing(
    tmp_path: Path, storage: object, config: dict[str, object], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as raised:
        async with am.open_memory(tmp_path / "s", storage=storage, config=config):  # type: ignore[arg-type]
            pass
    assert "hunter2" not in str(raised.value)
    assert not (tmp_path / "s").exists()  # the server is reached before anything is made


async def test_a_schema_newer_than_the_code_is_refused(tmp_path: Path) -> None:
    with scratch_database() as fresh:
        async with am.open_memory(tmp_path / "s", storage=fresh, config=TEXT_ONLY):
            pass
        with psycopg.connect(fresh, autocommit=True) as conn:
            conn.execute(
                "UPDATE activememory.activememory_meta SET value = '999'"
                " WHERE key = 'schema_version'"
            )
        with pytest.raises(am.StorageError, match="^storage.dsn: schema version 999 is newer"):
            async with am.open_memory(tmp_path / "s", storage=fresh, config=TEXT_ONLY):
                pass


async def test_vectors_are_made_and_searched_on_postgresql(tmp_path: Path, dsn: str) -> None:
    from fake_embedder import FakeEmbedder

    async with am.open_memory(
        tmp_path / "s", storage=dsn, embedder=FakeEmbedder(), config=TEXT_ONLY
    ) as mem:
        event = await mem.sessions.append(KEY, hello("the gate code is 4417"))
        await mem.sessions.append(KEY, hello("lunch was fine"))
        assert await mem.sessions.vectors_ready()
        (stats,) = await mem.sessions.stats()
        assert (stats.embedder, stats.vectors_pending) == ("fake/bag-of-words", 0)
        found = await mem.sessions.search("4417 gate", caller=KEY, mode="hybrid")
        assert found.fallback is None
        assert found.results[0].message_id == event.id
        assert found.results[0].similarity is not None and found.results[0].similarity > 0.5
        caller = am.parse_session_key("agent:main:main")
        single = am.load_config(
            {
                **TEXT_ONLY,
                "plugins": {"entries": {"active-memory": {"config": {"singleOwner": True}}}},
            }
        )
        got = await mem.notes.search(
            "main",
            {"query": "gate code"},
            caller=caller,
            transcripts=single.private_scope(caller),
        )
        assert got.data["effectiveMode"] == "hybrid" and got.data["fallback"] is None
        assert got.data["results"][0]["path"] == f"session:{KEY}#{event.id}"
    with psycopg.connect(dsn) as conn:  # the vectors are the server's rows
        (count,) = conn.execute(
            "SELECT count(*) FROM activememory.message_vectors WHERE name = 'fake/bag-of-words'"
        ).fetchone() or (0,)
    assert count == 2


async def test_memory_search_on_postgresql(tmp_path: Path, dsn: str) -> None:
    async with am.open_memory(tmp_path / "s", storage=dsn, config=TEXT_ONLY) as mem:
        event = await mem.sessions.append(KEY, hello("the gate code is 4417"))
        await mem.sessions.append("agent:main:main", hello("what is the gate code?"))
        # Notes, export and erase are (tests/test_memory_notes.py, test_userdata.py).
        assert await mem.notes.sync_notes("main") == 0  # no workspace: no notes
        # memory_search: outside the private scope the conversations do not answer.
        caller = am.parse_session_key("agent:main:main")
        scope = mem.config.private_scope(caller)
        got = await mem.notes.search(
            "main", {"query": "gate code"}, caller=caller, transcripts=None
        )
        assert got.data["results"] == [] and "syncError" not in got.data
        single = am.load_config(
            {
                **TEXT_ONLY,
                "plugins": {"entries": {"active-memory": {"config": {"singleOwner": True}}}},
            }
        )
        scope = single.private_scope(caller)
        got = await mem.notes.search(
            "main", {"query": "gate code"}, caller=caller, transcripts=scope
        )
        assert [r["path"] for r in got.data["results"]] == [f"session:{KEY}#{event.id}"]
        report = await mem.doctor()
        disk = [c for c in report.checks if c.name == "disk:main"]
        assert disk and "not measured per agent on PostgreSQL" in disk[0].detail


def test_two_processes_appending_to_one_session_keep_one_tree(tmp_path: Path, dsn: str) -> None:
    per_worker = 40
    workers = [
        subprocess.Popen(
            [sys.executable, str(CHILD), str(tmp_path / "s"), dsn, name, str(per_worker)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("left", "right")
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        acked: set[int] = set()
        for worker in workers:
            out, _ = worker.communicate(timeout=60)
            lines = out.split()
            assert lines[-1] == "done" and worker.returncode == 0
            acked |= {int(line) for line in lines[:-1]}
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    assert len(acked) == 2 * per_worker

    async def check() -> None:
        async with am.open_memory(tmp_path / "check", storage=dsn, config=TEXT_ONLY) as mem:
            history = await mem.sessions.history("agent:main:direct:shared")
            info = await mem.sessions.info("agent:main:direct:shared")
            stats = await mem.sessions.stats()
        # One chain: every acknowledged message, each the child of the one before it.
        assert {e.id for e in history} == acked
        assert [e.seq for e in history] == list(range(1, 2 * per_worker + 1))
        assert [e.parent_id for e in history] == [None, *(e.id for e in history[:-1])]
        assert info.leaf_event_id == history[-1].id and not info.dirty
        # Every message indexed in the transaction that stored it, the index consistent.
        assert [(s.indexed_messages, s.fts_integrity_ok) for s in stats] == [(2 * per_worker, True)]

    anyio.run(check)


async def test_the_reconciler_rebuilds_dirty_sessions_behind_the_fence(
    tmp_path: Path, dsn: str
) -> None:
    async with am.open_memory(tmp_path / "s", storage=dsn, config=TEXT_ONLY) as mem:
        first = await mem.sessions.append(KEY, hello("which ferry do we take"))
        await mem.sessions.append(KEY, hello("the old ferry answer"))
        await mem.sessions.rewind(KEY, first.id)
        new = await mem.sessions.append(KEY, hello("the new ferry answer"))
        # Dirty: hidden and said; the search pokes the reconciler, which rebuilds it.
        hidden = await mem.sessions.search("ferry", caller=KEY)
        assert (hidden.results, hidden.indexing) == ((), True)
        with anyio.fail_after(10):
            while (await mem.sessions.info(KEY)).dirty:  # noqa: ASYNC110 (rows: no event)
                await anyio.sleep(0.01)
        found = await mem.sessions.search("ferry", caller=KEY)
        assert {h.message_id for h in found.results} == {first.id, new.id}
        # An agent-wide reindex marks, rebuilds and checks the index.
        stats = await mem.sessions.reindex(agent="main")
        assert [(s.indexed_messages, s.dirty_sessions, s.fts_integrity_ok) for s in stats] == [
            (2, 0, True)
        ]
        # Switches are rows of the store: another memory on it reads them.
        await mem.command(KEY, "/verbose on", sender=am.Sender())
        async with am.open_memory(tmp_path / "t", storage=dsn, config=TEXT_ONLY) as other:
            said = await other.command(KEY, "/verbose", sender=am.Sender())
            assert said == "Verbose: on for this session."
        assert (await mem.sessions.info(KEY)).leaf_event_id == new.id
        await mem.sessions.delete(KEY)
        assert await mem.sessions.list() == []


VECTOR_KEYS = ["agent:main:direct:alice", "agent:main:direct:bob", "agent:main:explicit:notes"]
WORDS = ["ferry", "noon", "gate", "code", "lunch", "tea"]
vector_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(VECTOR_KEYS), st.sampled_from(WORDS)),
        st.tuples(st.just("append"), st.sampled_from(VECTOR_KEYS), st.sampled_from(WORDS)),
        st.tuples(st.just("rewind"), st.sampled_from(VECTOR_KEYS), st.integers(0, 3)),
        st.tuples(st.just("delete"), st.sampled_from(VECTOR_KEYS)),
        st.tuples(st.just("rebuild")),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(operations=vector_ops)
def test_vectors_follow_the_active_branches_through_open_memory(
    tmp_path_factory: pytest.TempPathFactory,
    pg_memory_dsn: str,
    operations: list[tuple[object, ...]],
) -> None:
    """docs/design.md §2.3 on PostgreSQL, through the public API: with the embedder actor
    at rest, a vector exists for exactly the messages on the active branches."""
    from fake_embedder import FakeEmbedder

    empty_store(pg_memory_dsn)
    state = tmp_path_factory.mktemp("s")

    async def run() -> None:
        async with am.open_memory(
            state, storage=pg_memory_dsn, embedder=FakeEmbedder(), config=TEXT_ONLY
        ) as mem:
            for op in operations:
                match op:
                    case ("append", key, word):
                        await mem.sessions.append(str(key), hello(f"the {word} again"))
                    case ("rewind", key, back):
                        try:
                            branch = await mem.sessions.history(str(key))
                        except am.SessionNotFoundError:
                            continue
                        if len(branch) > int(back):  # type: ignore[call-overload]
                            await mem.sessions.rewind(str(key), branch[-1 - int(back)].id)  # type: ignore[call-overload]
                    case ("delete", key):
                        with contextlib.suppress(am.SessionNotFoundError):
                            await mem.sessions.delete(str(key))
                    case ("rebuild",):
                        await mem.sessions.rebuild_index()
            await mem.sessions.rebuild_index()
            assert await mem.sessions.vectors_ready()
            wanted: set[int] = set()
            for key in VECTOR_KEYS:
                with contextlib.suppress(am.SessionNotFoundError):
                    wanted |= {e.id for e in await mem.sessions.history(key)}
            with psycopg.connect(pg_memory_dsn) as conn:
                stored = {
                    int(r[0])
                    for r in conn.execute(
                        "SELECT event_id FROM activememory.message_vectors WHERE agent = 'main'"
                    )
                }
            assert stored == wanted
            assert all(s.vectors_pending == 0 for s in await mem.sessions.stats())

    trio.run(run)
