"""WAL checkpoints run on a thread of their own, not in the writer's commits."""

from __future__ import annotations

import threading
from pathlib import Path

import anyio
import apsw
import pytest

import activememory as am
from activememory.storage import checkpoints
from activememory.storage.checkpoints import BEHIND, Checkpointer
from activememory.storage.db import configure

from index_probe import agent_db

pytestmark = pytest.mark.anyio

WORDS = [
    "harbour",
    "lantern",
    "orchard",
    "pebble",
    "quartz",
    "river",
    "saddle",
    "thistle",
    "umbrella",
    "violet",
]


def _message(n: int) -> dict[str, str]:
    return {"role": "user", "content": " ".join(WORDS[(n + i) % len(WORDS)] for i in range(60))}


def _threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.endswith("-checkpoints")]


async def test_a_writer_thread_leaves_checkpoints_to_its_checkpoint_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "PAGES", 16)
    state = tmp_path / "state"
    # Text only: the embedder's reads would hold snapshots that keep the WAL from restarting.
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(state, executor="thread", config=config) as mem:
        await mem.sessions.append("agent:main:direct:u0", _message(0))  # the writer is running
        indexer = (await mem._supervisor.agent("main")).writer()
        checkpointer = indexer.checkpointer
        assert checkpointer is not None and checkpointer.pages == 16
        assert _threads() == ["activememory-Indexer-checkpoints"]
        # SQLite's own autocheckpoint (the default hook) is off on the writer: PRAGMA
        # wal_autocheckpoint reads 0 while another WAL hook is installed.
        assert (
            await indexer.executor.run(lambda: indexer.writer.conn.pragma("wal_autocheckpoint"))
            == 0
        )
        for n in range(1, 400):
            await mem.sessions.append(f"agent:main:direct:u{n % 4}", _message(n))
        with anyio.fail_after(10):
            while checkpointer.checkpoints == 0:  # noqa: ASYNC110 - a thread, not a task
                await anyio.sleep(0.01)
        assert checkpointer.last_error is None
        # The writer's commits run on while the thread copies, so the WAL restarts only
        # after the writer copies the last frames itself, at BEHIND x PAGES: it stays short.
        assert 16 <= checkpointer.longest < (BEHIND + 2) * 16  # plus one commit at most
        assert len(await mem.sessions.history("agent:main:direct:u0")) == 100
    assert _threads() == []
    conn = apsw.Connection(str(agent_db(state)))
    assert conn.execute("SELECT count(*) FROM events").fetchone() == (400,)


async def test_the_inline_executor_keeps_sqlite_s_own_autocheckpoint(tmp_path: Path) -> None:
    # Virtual time runs no thread: SQLite checkpoints in the commit as it always does.
    async with am.open_memory(tmp_path / "state", executor="inline") as mem:
        indexer = (await mem._supervisor.agent("main")).writer()
        assert indexer.checkpointer is None and _threads() == []
        assert indexer.writer.conn.pragma("wal_autocheckpoint") == checkpoints.PAGES


@pytest.mark.parametrize(("durability", "synchronous"), [("crash", 1), ("power", 2)])
def test_a_checkpoint_syncs_as_the_writer_does(
    tmp_path: Path, durability: am.Durability, synchronous: int
) -> None:
    writer = apsw.Connection(str(tmp_path / "memory.db"))
    configure(writer, durability)
    checkpointer = Checkpointer("test-checkpoints")
    checkpointer.start(writer)
    try:
        assert checkpointer.running and checkpointer.synchronous == synchronous  # NORMAL, FULL
    finally:
        checkpointer.stop(writer)
        writer.close()
    assert _threads() == []


def test_the_writer_checkpoints_itself_when_the_thread_falls_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints, "PAGES", 4)
    writer = apsw.Connection(str(tmp_path / "memory.db"))
    configure(writer)
    checkpointer = Checkpointer("test-checkpoints")
    checkpointer.start(writer)
    # The thread is gone (as if it had died), its connection closed; the hook stays.
    checkpointer._stopping = True
    checkpointer._due.set()
    assert checkpointer._thread is not None
    checkpointer._thread.join()
    writer.execute("CREATE TABLE t(x)")
    for _ in range(200):
        with writer:
            writer.execute("INSERT INTO t VALUES (randomblob(3000))")
    assert checkpointer.checkpoints == 0 and checkpointer.inline > 0
    assert checkpointer.longest < (BEHIND + 2) * 4
    checkpointer.stop(writer)
    assert writer.pragma("wal_autocheckpoint") == checkpoints.PAGES and _threads() == []
    writer.close()


def test_no_checkpoint_thread_for_a_database_without_a_wal(tmp_path: Path) -> None:
    memory = apsw.Connection(":memory:")
    rollback = apsw.Connection(str(tmp_path / "rollback.db"))  # journal_mode=delete
    for conn in (memory, rollback, object()):  # object(): not SQLite's (a PostgreSQL writer)
        checkpointer = Checkpointer("test-checkpoints")
        checkpointer.start(conn)
        assert not checkpointer.running and checkpointer.last_error is None
        checkpointer.stop(conn)
    assert _threads() == []


def test_the_checkpoint_connection_is_open_before_the_first_commit(tmp_path: Path) -> None:
    """`start` opens (and configures) the thread's connection before it returns, on the
    writer's thread: configuring it reads the schema, which marks the WAL index (-shm).
    Done later by the thread, it touched the files of a store that had gone quiet (a read-only
    CLI beside a bot saw the bot's -shm change under it)."""
    path = tmp_path / "db.sqlite"
    writer = apsw.Connection(str(path))
    configure(writer)
    writer.execute("CREATE TABLE t(x)")
    writer.execute("INSERT INTO t VALUES (1)")
    shm = Path(f"{path}-shm")
    checkpointer = Checkpointer("test-checkpoints")
    open_before = len(apsw.connections())
    checkpointer.start(writer)
    try:
        assert len(apsw.connections()) == open_before + 1  # the thread's, already open
        assert checkpointer.alive and checkpointer.last_error is None
        marked = shm.read_bytes()
        threading.Event().wait(0.2)  # the thread waits for a commit; nothing reads
        assert shm.read_bytes() == marked
    finally:
        checkpointer.stop(writer)
        writer.close()
