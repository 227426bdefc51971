"""The background reconciler (docs/design.md §2.4): dirty sessions are rebuilt, fenced, and announced.

A search that sees a dirty session pokes the reconciler; until the rebuild is published the
session is hidden and the answer says `indexing: true`. A session changed while it is being
rebuilt is started over, never published stale.
"""

from __future__ import annotations

import random
from pathlib import Path

import anyio
import apsw
import pytest

import activememory as am
from activememory.protocol.indexer import AppendMessage, ReindexChunk, Reindexed
from activememory.protocol.session_key import parse_session_key
from activememory.storage.db import MIGRATIONS, migrate, open_connection
from activememory.storage.transcripts import TranscriptWriter

from index_probe import agent_db, indexed_tokens, tokenize

pytestmark = [pytest.mark.anyio, pytest.mark.full_matrix]  # about executors and loops

KEY = "agent:main:direct:alice"


def user(text: str) -> am.Message:
    return am.Message(role="user", content=text)


def entries(n: int, word: str = "imported") -> list[am.ImportEntry]:
    return [
        am.ImportEntry(
            id=str(i),
            parent_id=str(i - 1) if i else None,
            timestamp=float(i),
            message=user(f"{word} message {i}"),
        )
        for i in range(n)
    ]


async def wait_clean(mem: am.Memory, key: str, *, within: float = 10.0) -> None:
    with anyio.fail_after(within):
        while (await mem.sessions.info(key)).dirty:  # noqa: ASYNC110 (database state: no event)
            await anyio.sleep(0.01)


def expected_index(db: Path) -> dict[int, list[str]]:
    """What the index must hold: the text of every active-branch message of every session."""
    conn = apsw.Connection(str(db), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT e.id, e.text FROM active_branch a JOIN events e ON e.id = a.event_id"
            " WHERE e.text IS NOT NULL"
        ).fetchall()
    finally:
        conn.close()
    return {int(i): tokenize(str(t)) for i, t in rows}


async def test_search_starts_the_rebuild_and_says_indexing_meanwhile(mem: am.Memory) -> None:
    await mem.sessions.import_transcript(KEY, entries(600))
    first = await mem.sessions.search("imported", caller=KEY)
    # The only session is dirty: hidden, and the answer says why it may look empty.
    assert first.results == () and first.indexing
    assert first.warning is not None and "retry" in first.warning
    await wait_clean(mem, KEY)
    after = await mem.sessions.search("imported", caller=KEY)
    assert len(after.results) == 10 and not after.indexing and after.warning is None
    db = agent_db(mem.state_dir)
    assert indexed_tokens(db) == expected_index(db)


async def test_no_search_no_rebuild(mem: am.Memory) -> None:
    await mem.sessions.import_transcript(KEY, entries(3))
    await anyio.sleep(0.05)
    assert (await mem.sessions.info(KEY)).dirty


async def test_rewound_session_is_rebuilt_to_its_new_branch(mem: am.Memory) -> None:
    keep = await mem.sessions.append(KEY, user("kept apple"))
    await mem.sessions.append(KEY, user("dropped banana"))
    await mem.sessions.rewind(KEY, keep.id)
    res = await mem.sessions.search("banana apple", caller=KEY)
    assert res.indexing and res.results == ()
    await wait_clean(mem, KEY)
    res = await mem.sessions.search("banana apple", caller=KEY)
    assert [h.message_id for h in res.results] == [keep.id] and not res.indexing


async def test_reconciliation_under_concurrent_appends_ends_clean_and_exact(
    tmp_path: Path, anyio_backend: str
) -> None:
    """Appends keep landing on sessions being rebuilt; every acknowledged message is then
    found by its unique word, or the answer says `indexing` (never a silent miss)."""
    rng = random.Random(7)
    keys = [f"agent:main:direct:peer{i}" for i in range(4)]
    async with am.open_memory(tmp_path / "state") as mem:
        for key in keys:
            await mem.sessions.import_transcript(key, entries(700))
        silent_misses = 0
        indexing_seen = 0

        async def appender(key: str, n: int) -> None:
            nonlocal silent_misses, indexing_seen
            for i in range(n):
                word = f"w{abs(hash((key, i))) % 10**8}x{i}"
                await mem.sessions.append(key, user(f"fresh {word}"))
                res = await mem.sessions.search(word, caller=key)
                found = any(word in h.snippet for h in res.results)
                indexing_seen += res.indexing
                silent_misses += not found and not res.indexing
                if rng.random() < 0.05:  # a rewind makes the session dirty again
                    history = await mem.sessions.history(key, limit=3)
                    await mem.sessions.rewind(key, history[0].id)

        async with anyio.create_task_group() as tg:
            for key in keys:
                tg.start_soon(appender, key, 60)
        assert silent_misses == 0
        assert indexing_seen > 0
        for key in keys:
            await mem.sessions.search("fresh", caller=key)  # poke
            await wait_clean(mem, key)
        res = await mem.sessions.search("fresh", caller=keys[0])
        assert not res.indexing
        stats = (await mem.sessions.stats())[0]
        assert stats.dirty_sessions == 0 and stats.fts_integrity_ok
        assert stats.indexed_messages == stats.active_messages
        db = agent_db(mem.state_dir)
        assert indexed_tokens(db) == expected_index(db)


def test_the_revision_fence_refuses_a_stale_chunk_and_never_publishes_it(
    tmp_path: Path,
) -> None:
    path = tmp_path / "memory.db"
    writer = TranscriptWriter(open_connection(path, writer=True))
    key = parse_session_key(KEY)
    writer.apply(
        [
            am_import(key, 10),
        ]
    )
    revision = writer.conn.execute("SELECT revision FROM sessions").fetchone()[0]
    (first,) = writer.apply([ReindexChunk(key=key, revision=revision, after_depth=0, max_rows=4)])
    assert first == Reindexed(rows=4, next_depth=4)
    # An append lands between two chunks: the session changed, the fence holds.
    writer.apply([AppendMessage(key=key, message=user("late arrival"), at=99.0)])
    (stale,) = writer.apply([ReindexChunk(key=key, revision=revision, after_depth=4, max_rows=4)])
    assert stale == Reindexed(stale=True)
    assert writer.conn.execute("SELECT dirty FROM sessions").fetchone()[0] == 1
    # Started over with the new revision, it covers the late message too.
    revision = writer.conn.execute("SELECT revision FROM sessions").fetchone()[0]
    after = 0
    while True:
        (ack,) = writer.apply(
            [ReindexChunk(key=key, revision=revision, after_depth=after, max_rows=4)]
        )
        assert isinstance(ack, Reindexed) and not ack.stale
        after = ack.next_depth
        if ack.clean:
            break
    assert after == 11
    assert writer.conn.execute("SELECT dirty, indexed_seq FROM sessions").fetchone() == (0, 11)
    writer.conn.close()
    assert indexed_tokens(path.parent / "memory.db") == expected_index(path)


def am_import(key: am.SessionKey, n: int) -> object:
    from activememory.protocol.indexer import ImportTranscript

    return ImportTranscript(key=key, entries=tuple(entries(n)), at=0.0)


async def test_an_index_of_schema_1_is_migrated_and_rebuilt_on_first_search(
    tmp_path: Path, anyio_backend: str
) -> None:
    db = agent_db(tmp_path / "state")
    db.parent.mkdir(parents=True)
    conn = apsw.Connection(str(db))
    migrate(conn, MIGRATIONS[:1])
    conn.execute(
        "INSERT INTO sessions(id, key, agent, chat_type, created_at, updated_at, leaf_event_id,"
        " leaf_depth, next_seq, revision) VALUES (1, ?, 'main', 'direct', 0, 0, 1, 1, 2, 1);"
        "INSERT INTO events(id, session_id, parent_id, seq, depth, ts, kind, role, content, text)"
        " VALUES (1, 1, NULL, 1, 1, 0, 'message', 'user', CAST(? AS BLOB),"
        " '東京タワー was tall');"
        "INSERT INTO active_branch VALUES (1, 1, 1);"
        "INSERT INTO message_fts(rowid, text) VALUES (1, '東京タワー was tall');",
        (KEY, '"東京タワー was tall"'),
    )
    conn.close()
    async with am.open_memory(tmp_path / "state") as mem:
        assert (await mem.sessions.info(KEY)).dirty
        assert (await mem.sessions.search("東京", caller=KEY)).indexing
        await wait_clean(mem, KEY)
        res = await mem.sessions.search("東京", caller=KEY)
        assert [h.message_id for h in res.results] == [1]
    assert indexed_tokens(db) == {1: tokenize("東京タワー was tall")}
