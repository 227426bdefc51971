"""The transcript store: events, the active branch, and an index that never lags.

Every test runs on trio and asyncio, with the thread and the inline executor.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import activememory as am

from index_probe import agent_db, connect, indexed_tokens, tokenize
from pg_server import pg_memory_dsn, sqlite_only, storage, store_index, store_match

# Both stores (docs/design.md §11): the tests through `mem` run on SQLite and PostgreSQL.
__all__ = ["pg_memory_dsn", "storage"]

pytestmark = pytest.mark.anyio

KEY = "agent:main:direct:alice"


def user(text: str) -> am.Message:
    return am.Message(role="user", content=text)


def assistant(text: str) -> am.Message:
    return am.Message(role="assistant", content=text)


async def test_history_is_the_active_branch_in_order(mem: am.Memory) -> None:
    e1 = await mem.sessions.append(KEY, user("one"))
    e2 = await mem.sessions.append(KEY, assistant("two"))
    e3 = await mem.sessions.append(KEY, user("three"))
    assert (e1.parent_id, e2.parent_id, e3.parent_id) == (None, e1.id, e2.id)
    assert [e.seq for e in (e1, e2, e3)] == [1, 2, 3]
    history = await mem.sessions.history(KEY)
    assert [e.id for e in history] == [e1.id, e2.id, e3.id]
    assert [e.message.content for e in history if e.message] == ["one", "two", "three"]
    assert history[0] == e1
    assert [e.id for e in await mem.sessions.history(KEY, limit=2)] == [e2.id, e3.id]


async def test_an_acknowledged_message_is_already_indexed(
    mem: am.Memory, storage: str | None
) -> None:
    event = await mem.sessions.append(KEY, user("the quick brown fox"))
    # A separate connection, opened after the ack: the commit held the index row too.
    assert store_match(mem.state_dir, storage, "fox") == [event.id]
    info = await mem.sessions.info(KEY)
    assert (info.dirty, info.indexed_seq, info.leaf_event_id) == (False, 1, event.id)


async def test_diacritics_are_folded(mem: am.Memory, storage: str | None) -> None:
    event = await mem.sessions.append(KEY, user("Kaffee im Café in İstanbul, naïve Übung"))
    for query in ("cafe", "CAFÉ", "istanbul", "İSTANBUL", "naive", "ubung"):
        assert store_match(mem.state_dir, storage, query) == [event.id], query


async def test_only_user_and_assistant_text_reaches_the_index(
    mem: am.Memory, storage: str | None
) -> None:
    shown = await mem.sessions.append(
        KEY,
        am.Message(
            role="assistant",
            content=[
                {"type": "thinking", "thinking": "zebrathought"},
                {"type": "reasoning", "text": "zebrareason"},
                {"type": "tool_use", "id": "t1", "name": "lookup", "input": {"q": "zebracall"}},
                {"type": "image", "url": "u", "description": "zebrapicture"},
                {"type": "text", "text": "visible answer"},
            ],
        ),
    )
    tool = await mem.sessions.append(
        KEY,
        am.Message(
            role="tool",
            content=[{"type": "tool_result", "tool_use_id": "t1", "content": "zebraresult"}],
        ),
    )
    image_only = await mem.sessions.append(
        KEY, am.Message(role="user", content=[{"type": "image", "url": "u"}])
    )
    assert store_index(mem.state_dir, storage) == {shown.id}
    assert store_match(mem.state_dir, storage, "zebrathought") == []
    if storage is None:  # the tokens themselves (tests/test_pg_store.py compares both stores')
        tokens = indexed_tokens(agent_db(mem.state_dir))
        assert tokens == {shown.id: tokenize("visible answer")}
    # ... and all of it is stored.
    history = await mem.sessions.history(KEY)
    assert [e.id for e in history] == [shown.id, tool.id, image_only.id]
    assert history[1].message is not None and history[1].role == "tool"


async def test_rewind_branches_and_marks_the_session_dirty(
    mem: am.Memory, storage: str | None
) -> None:
    e1 = await mem.sessions.append(KEY, user("first question"))
    await mem.sessions.append(KEY, assistant("old answer"))
    await mem.sessions.rewind(KEY, e1.id)
    info = await mem.sessions.info(KEY)
    assert info.dirty and info.leaf_event_id == e1.id
    e3 = await mem.sessions.append(KEY, assistant("new answer"))
    assert e3.parent_id == e1.id
    assert [e.id for e in await mem.sessions.history(KEY)] == [e1.id, e3.id]
    # Dirty: the new message waits for the rebuild, the old one is still in the index.
    assert store_match(mem.state_dir, storage, "new") == []
    rebuilt = await mem.sessions.rebuild_index()
    assert (rebuilt.sessions, rebuilt.index_rows) == (1, 2)
    assert store_index(mem.state_dir, storage) == {e1.id, e3.id}
    assert store_match(mem.state_dir, storage, "new") == [e3.id]
    assert not (await mem.sessions.info(KEY)).dirty


async def test_rewind_can_switch_to_another_branch(mem: am.Memory, storage: str | None) -> None:
    root = await mem.sessions.append(KEY, user("root"))
    a1 = await mem.sessions.append(KEY, assistant("branch a one"))
    a2 = await mem.sessions.append(KEY, user("branch a two"))
    await mem.sessions.rewind(KEY, root.id)
    b1 = await mem.sessions.append(KEY, assistant("branch b one"))
    await mem.sessions.rewind(KEY, a2.id)  # back onto branch a, deep in it
    assert [e.id for e in await mem.sessions.history(KEY)] == [root.id, a1.id, a2.id]
    await mem.sessions.rewind(KEY, b1.id)
    assert [e.id for e in await mem.sessions.history(KEY)] == [root.id, b1.id]
    await mem.sessions.rebuild_index(KEY)
    assert store_index(mem.state_dir, storage) == {root.id, b1.id}


async def test_rewind_to_a_foreign_or_missing_event_is_refused(mem: am.Memory) -> None:
    mine = await mem.sessions.append(KEY, user("mine"))
    other = await mem.sessions.append("agent:main:direct:bob", user("theirs"))
    with pytest.raises(
        am.SessionNotFoundError, match=rf"^to_event_id: {other.id} is not a message of session"
    ):
        await mem.sessions.rewind(KEY, other.id)
    with pytest.raises(
        am.SessionNotFoundError, match="^session_key: no session 'agent:main:direct:nobody'$"
    ):
        await mem.sessions.rewind("agent:main:direct:nobody", mine.id)
    with pytest.raises(am.InvalidInputError, match="^to_event_id: 0 is not a positive integer$"):
        await mem.sessions.rewind(KEY, 0)
    assert not (await mem.sessions.info(KEY)).dirty


async def test_delete_removes_events_and_index_rows_together(
    mem: am.Memory, storage: str | None
) -> None:
    keep = await mem.sessions.append("agent:main:direct:bob", user("keep this"))
    await mem.sessions.append(KEY, user("drop this"))
    await mem.sessions.append(KEY, assistant("drop that"))
    await mem.sessions.delete(KEY)
    assert store_index(mem.state_dir, storage) == {keep.id}
    with pytest.raises(am.SessionNotFoundError):
        await mem.sessions.history(KEY)
    with pytest.raises(am.SessionNotFoundError):
        await mem.sessions.delete(KEY)


async def test_archive_and_metadata(mem: am.Memory) -> None:
    info = await mem.sessions.create(
        "agent:main:explicit:portal-1",
        interactive=False,
        sandboxed=True,
        spawned_by="agent:main:main",
    )
    assert (
        info.chat_type,
        info.conversation_id,
        info.interactive,
        info.sandboxed,
        info.spawned_by,
    ) == (
        "explicit",
        "portal-1",
        False,
        True,
        "agent:main:main",
    )
    await mem.sessions.archive("agent:main:explicit:portal-1")
    assert (await mem.sessions.info("agent:main:explicit:portal-1")).archived
    await mem.sessions.archive("agent:main:explicit:portal-1", archived=False)
    assert not (await mem.sessions.info("agent:main:explicit:portal-1")).archived


async def test_each_agent_has_its_own_database(mem: am.Memory, storage: str | None) -> None:
    ops = await mem.sessions.append("agent:ops:group:g1:thread:9", user("deploy friday"))
    legacy = await mem.sessions.append("old-session-7", user("legacy words"))
    assert store_match(mem.state_dir, storage, "deploy", "ops") == [ops.id]
    assert store_match(mem.state_dir, storage, "legacy", "main") == [legacy.id]
    assert store_match(mem.state_dir, storage, "deploy", "main") == []
    info = await mem.sessions.info("agent:ops:group:g1:thread:9")
    assert (info.agent, info.chat_type, info.conversation_id, info.thread_id) == (
        "ops",
        "group",
        "g1",
        "9",
    )
    assert (await mem.sessions.info("old-session-7")).unknown


async def test_import_is_stored_unindexed_until_rebuilt(
    mem: am.Memory, storage: str | None
) -> None:
    entries = [
        am.ImportEntry(id="a", parent_id=None, timestamp=1.0, message=user("imported hello")),
        am.ImportEntry(id="b", parent_id="a", timestamp=2.0, message=assistant("discarded branch")),
        am.ImportEntry(id="c", parent_id="a", timestamp=3.0, message=assistant("kept branch")),
    ]
    assert await mem.sessions.import_transcript(KEY, entries) == 3
    info = await mem.sessions.info(KEY)
    assert info.dirty
    history = await mem.sessions.history(KEY)
    assert [e.message.content for e in history if e.message] == ["imported hello", "kept branch"]
    assert [e.timestamp for e in history] == [1.0, 3.0]
    assert store_index(mem.state_dir, storage) == set()
    await mem.sessions.rebuild_index()
    assert store_index(mem.state_dir, storage) == {e.id for e in history}


async def test_import_rejects_bad_trees_and_writes_nothing(mem: am.Memory) -> None:
    orphan = [am.ImportEntry(id="a", parent_id="zz", timestamp=1.0, message=user("x"))]
    with pytest.raises(
        am.InvalidInputError, match="^entries\\[0\\].parent_id: 'zz' names no earlier entry$"
    ):
        await mem.sessions.import_transcript(KEY, orphan)
    repeated = [am.ImportEntry(id="a", parent_id=None, timestamp=1.0, message=user("x"))] * 2
    with pytest.raises(am.InvalidInputError, match="^entries\\[1\\].id: 'a' is repeated$"):
        await mem.sessions.import_transcript(KEY, repeated)
    with pytest.raises(am.SessionNotFoundError):
        await mem.sessions.info(KEY)
    await mem.sessions.append(KEY, user("live"))
    with pytest.raises(am.InvalidInputError, match="already has messages"):
        await mem.sessions.import_transcript(
            KEY, [am.ImportEntry(id="a", parent_id=None, timestamp=1.0, message=user("x"))]
        )


async def test_everything_survives_reopening(tmp_path: Path, executor: str) -> None:
    state = tmp_path / "state"
    async with am.open_memory(state, executor=executor) as mem:  # type: ignore[arg-type]
        e1 = await mem.sessions.append(KEY, user("persisted words"))
        await mem.sessions.create("agent:main:direct:carol", sandboxed=True)
    async with am.open_memory(state, executor=executor) as mem:  # type: ignore[arg-type]
        e2 = await mem.sessions.append(KEY, assistant("more words"))
        assert e2.parent_id == e1.id and e2.id > e1.id
        assert (await mem.sessions.info("agent:main:direct:carol")).sandboxed
        stats = await mem.sessions.stats()
    assert [
        (s.agent, s.sessions, s.active_messages, s.indexed_messages, s.fts_integrity_ok)
        for s in stats
    ] == [("main", 2, 2, 2, True)]


async def test_one_writer_per_state_directory(tmp_path: Path, executor: str) -> None:
    async with am.open_memory(tmp_path, executor=executor) as first:  # type: ignore[arg-type]
        await first.sessions.append(KEY, user("hi"))
        async with am.open_memory(tmp_path, executor=executor) as second:  # type: ignore[arg-type]
            with pytest.raises(
                am.StorageError, match="already open for writing by another open_memory"
            ):
                await second.sessions.append(KEY, user("again"))


async def test_stats_notice_a_corrupted_index(mem: am.Memory, storage: str | None) -> None:
    sqlite_only(storage, "corrupts FTS5's own segments (PostgreSQL's check: test_pg_crash.py)")
    for i in range(30):
        await mem.sessions.append(KEY, user(f"message number {i} about topic{i}"))
    assert (await mem.sessions.stats())[0].fts_integrity_ok
    conn = connect(agent_db(mem.state_dir))
    with conn:  # drop some index segments behind the library's back
        conn.execute(
            "DELETE FROM message_fts_data WHERE id = (SELECT max(id) FROM message_fts_data)"
        )
    conn.close()
    assert not (await mem.sessions.stats())[0].fts_integrity_ok


async def test_every_foreign_key_has_an_index_on_its_child_columns(tmp_path: Path) -> None:
    # SQLite checks a foreign key on every delete of a parent row by looking the child
    # column up: unindexed, that is a scan of the child table per deleted row (deleting a
    # session of 100 events took 1.5-2.3 s at 100k events).
    import apsw

    text_only = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(tmp_path / "s", config=text_only) as mem:
        await mem.sessions.append("agent:main:direct:alice", user("hi"))
        await mem.records.add("I keep bees", user_id="alice")
    databases = sorted((tmp_path / "s").rglob("*.db"))
    assert len(databases) >= 2  # an agent database and records.db
    unindexed = []
    for path in databases:
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        tables = [t for (t,) in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        for table in tables:
            keys = [r[1] for r in conn.execute(f"PRAGMA table_info('{table}')") if r[5] == 1]
            leading = {
                conn.execute(f"PRAGMA index_info('{index[1]}')").fetchone()[2]
                for index in conn.execute(f"PRAGMA index_list('{table}')")
            }
            for fk in conn.execute(f"PRAGMA foreign_key_list('{table}')"):
                child = fk[3]
                if child not in leading and keys[:1] != [child]:
                    unindexed.append(f"{path.name}: {table}.{child} -> {fk[2]}")
        conn.close()
    assert unindexed == []
