"""One embedder per agent on PostgreSQL (docs/design.md §11 "One embedder per agent"): the
process holding the agent's lease embeds, the others do not; the holder finds rows other
processes wrote; a dead holder's lease is taken over; a lost lease connection is a lost
lease, taken again when free.

Real processes on a real server: tests/pg_lease_child.py is one worker, whose embedder
logs every text it embeds to a file (which survives its `kill -9`). The lease period is
made short (`lease.PERIOD`); the only waits are generous bounds on what must happen.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import psycopg
import pytest

import activememory as am
from activememory.actors import embedder as embedder_actor
from activememory.storage.pg import lease
from activememory.storage.pg.db import PgSettings
from activememory.storage.pg.lease import Leases
from activememory.storage.pg.store import RECORDS_TENANT

from pg_server import emptied_memory_dsn, pg_memory_dsn

__all__ = ["emptied_memory_dsn", "pg_memory_dsn"]

pytestmark = pytest.mark.anyio

CHILD = Path(__file__).with_name("pg_lease_child.py")
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
PERIOD = 0.1  # seconds: the lease period of these tests
WAIT = 60.0  # seconds: a generous bound on what must happen within a few periods


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture
def short_period(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lease, "PERIOD", PERIOD)


class Worker:
    """A running tests/pg_lease_child.py, and the file of the texts it embedded."""

    def __init__(self, state_dir: Path, dsn: str, name: str) -> None:
        self.name = name
        self.log = state_dir.parent / f"embedded-{name}.txt"
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.touch()
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD), str(state_dir), dsn, name, str(PERIOD), str(self.log)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.answer() == "ready"

    def answer(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self.answer()

    def append(self, count: int) -> None:
        assert self.ask(f"append {count}") == "appended"

    def stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = json.loads(self.ask("stats"))
        return stats

    def embedded(self) -> list[str]:
        return self.log.read_text(encoding="utf-8").splitlines()

    def quit(self) -> None:
        assert self.ask("quit") == "done"
        assert self.process.wait(timeout=WAIT) == 0


@contextmanager
def workers(tmp_path: Path, dsn: str, *names: str) -> Iterator[list[Worker]]:
    started: list[Worker] = []
    try:
        for name in names:  # one state directory each, as on separate hosts
            started.append(Worker(tmp_path / name / "state", dsn, name))
        yield started
    finally:
        for worker in started:
            if worker.process.poll() is None:
                worker.process.kill()
                worker.process.wait()


def with_vectors(dsn: str) -> set[str]:
    """The texts of agent main's messages that have a vector, read behind the library."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT convert_from(e.text, 'UTF8') FROM activememory.message_vectors v"
            " JOIN activememory.events e ON e.agent = v.agent AND e.id = v.event_id"
            " WHERE v.agent = 'main'"
        ).fetchall()
    return {str(r[0]) for r in rows}


def wait_for(what: str, check: Any) -> None:
    """Poll `check()` until it is true; fail after `WAIT` seconds saying `what`."""
    import time

    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT:g} s: {what}"
        time.sleep(PERIOD / 2)


def messages(name: str, start: int, stop: int) -> set[str]:
    return {f"{name} message {i}" for i in range(start, stop)}


def test_a_lease_has_one_holder_until_its_connection_closes(dsn: str) -> None:
    settings = PgSettings(dsn=dsn)
    first, second = Leases(settings), Leases(settings)
    agent, records = lease.lease_key("embedder", "main"), lease.lease_key("embedder", ":records")
    try:
        assert first.claim(agent) and first.claim(agent)  # taken, then checked
        assert not second.claim(agent)
        assert second.claim(records)  # another tenant's lease: its own key
        first.close()
        assert not first.claim(agent)  # closed: nothing reconnects
        # The server releases the lock once its backend sees the connection end.
        wait_for("the closed connection's lease is free", lambda: second.claim(agent))
    finally:
        first.close()
        second.close()


def test_one_process_embeds_each_row_once_and_another_takes_over_when_it_dies(
    tmp_path: Path, dsn: str
) -> None:
    with workers(tmp_path, dsn, "left", "right") as (left, right):
        left.append(20)
        right.append(20)
        # Every message gets its vector, those of the process without the lease too: the
        # holder finds them by its own claims (nothing pokes it for another's writes).
        written = messages("left", 0, 20) | messages("right", 0, 20)
        wait_for("every message has a vector", lambda: with_vectors(dsn) == written)
        # ... each embedded once, all by one process: the lease's holder.
        both = Counter(left.embedded() + right.embedded())
        assert set(both) == written and set(both.values()) == {1}
        holder, other = (left, right) if left.embedded() else (right, left)
        assert other.embedded() == []
        assert holder.stats()["embedder_lease"] is True
        assert other.stats() | {"embedder_lease": None} == holder.stats() | {"embedder_lease": None}
        assert other.stats()["embedder_lease"] is False
        assert other.stats()["vectors_pending"] == 0

        holder.process.send_signal(signal.SIGKILL)
        holder.process.wait()
        # The server released the dead holder's lease with its connection: the other
        # process takes it, and embeds what it writes now.
        other.append(10)
        later = messages(other.name, 20, 30)
        wait_for("the survivor embeds", lambda: with_vectors(dsn) == written | later)
        assert Counter(other.embedded()) == Counter(later)
        assert other.stats()["embedder_lease"] is True
        other.quit()


def take_lease(dsn: str, tenant: str) -> psycopg.Connection[Any]:
    """A connection of the test's holding `tenant`'s embedder lease, as another process
    would (it is free when the connection closes)."""
    conn = psycopg.connect(dsn, autocommit=True)
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (lease.lease_key("embedder", tenant),))
    assert (row.fetchone() or (False,))[0], f"{tenant}'s lease is held already"
    return conn


def lease_holder(dsn: str, tenant: str) -> int | None:
    """The server process id of the session holding `tenant`'s embedder lease in this
    database, if any."""
    key = lease.lease_key("embedder", tenant) & 0xFFFF_FFFF_FFFF_FFFF
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND objsubid = 1 AND classid::bigint = %s AND objid::bigint = %s"
            # Advisory locks are per database: other tests' stores have an agent "main" too.
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            (key >> 32, key & 0xFFFF_FFFF),
        ).fetchone()
    return None if row is None else int(row[0])


async def eventually(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll `check()` until it is true; fail after `WAIT` seconds."""
    with anyio.fail_after(WAIT):
        while True:
            if await check():
                return
            await anyio.sleep(PERIOD / 2)


async def stats_of(mem: am.Memory) -> am.IndexStats:
    (stats,) = [s for s in await mem.sessions.stats() if s.agent == "main"]
    return stats


async def check_of(mem: am.Memory, name: str) -> str:
    (check,) = [c for c in (await mem.doctor()).checks if c.name == name]
    return check.detail


async def say(mem: am.Memory, *texts: str) -> None:
    for text in texts:
        await mem.sessions.append("agent:main:direct:bob", am.Message(role="user", content=text))


async def test_a_holders_periodic_claim_is_not_vectors_pending(
    tmp_path: Path, dsn: str, short_period: None
) -> None:
    """Once every vector is stored, the holder's claim of the lease each period (and its
    look for rows other processes wrote, which finds none) is not "vectors pending":
    memory_search's `vectorsPending` must not flicker every period."""
    from fake_embedder import FakeEmbedder

    async with am.open_memory(
        tmp_path / "s", storage=dsn, embedder=FakeEmbedder(), config=TEXT_ONLY
    ) as mem:
        await say(mem, "hello 0", "hello 1")
        with anyio.fail_after(WAIT):
            assert await mem.sessions.vectors_ready()
        store = await mem._supervisor.agent("main")
        actor = store.embedder
        assert actor is not None and actor.holds_lease()
        claims, seen_pending = 0, 0
        last = actor.lease_held, actor._next_claim
        with anyio.move_on_after(12 * PERIOD):
            while True:  # sampled as memory_search reads it, at every turn of the loop
                seen_pending += store.vectors_pending()
                claims += (actor.lease_held, actor._next_claim) != last
                last = actor.lease_held, actor._next_claim
                await anyio.lowlevel.checkpoint()
        assert claims >= 5  # the periods did pass, each with its claim
        assert seen_pending == 0
        # A write is still pending until its vector is stored.
        await say(mem, "hello 2")
        assert store.vectors_pending()


async def test_without_the_lease_a_memory_counts_what_waits_and_takes_the_lease_when_free(
    tmp_path: Path, dsn: str, short_period: None
) -> None:
    from fake_embedder import FakeEmbedder

    embedder = FakeEmbedder()
    other = take_lease(dsn, "main")
    try:
        async with am.open_memory(
            tmp_path / "s", storage=dsn, embedder=embedder, config=TEXT_ONLY
        ) as mem:
            await say(mem, "hello 0", "hello 1", "hello 2")
            with anyio.move_on_after(20 * PERIOD):  # a score of claims, each refused
                await mem.sessions.vectors_ready()
            stats = await stats_of(mem)
            # Not embedding, it still reports what waits for a vector, and why it waits.
            assert (stats.vectors_pending, stats.embedder_lease, embedder.calls) == (3, False, 0)
            detail = await check_of(mem, "index:main")
            assert "3 waiting for a vector of fake/bag-of-words" in detail
            assert "embedded by another process" in detail
            # memory_search's `vectorsPending` says so here too (the holder is behind).
            store = await mem._supervisor.agent("main")
            assert store.vectors_pending()
            other.close()  # the holder goes: its lease with it
            with anyio.fail_after(WAIT):
                assert await mem.sessions.vectors_ready()
            stats = await stats_of(mem)
            assert (stats.vectors_pending, stats.embedder_lease) == (0, True)
            assert not store.vectors_pending()
            assert sorted(embedder.texts) == ["hello 0", "hello 1", "hello 2"]
            assert "embedded by this process" in await check_of(mem, "index:main")
    finally:
        other.close()


async def test_a_lost_lease_connection_is_a_lost_lease_taken_again_when_free(
    tmp_path: Path, dsn: str, short_period: None
) -> None:
    from fake_embedder import FakeEmbedder

    embedder = FakeEmbedder()
    async with am.open_memory(
        tmp_path / "s", storage=dsn, embedder=embedder, config=TEXT_ONLY
    ) as mem:
        await say(mem, "before")
        with anyio.fail_after(WAIT):
            assert await mem.sessions.vectors_ready()
        assert (await stats_of(mem)).embedder_lease is True
        holder = lease_holder(dsn, "main")
        assert holder is not None
        # Another session queues for the lease, then the memory's lease connection is
        # terminated: the server grants the lease to the one waiting.
        waiting = psycopg.connect(dsn, autocommit=True)
        try:
            key = lease.lease_key("embedder", "main")
            async with anyio.create_task_group() as tg:
                tg.start_soon(
                    anyio.to_thread.run_sync,
                    lambda: waiting.execute("SELECT pg_advisory_lock(%s)", (key,)),
                )
                with psycopg.connect(dsn, autocommit=True) as admin:

                    async def queued() -> bool:
                        row = admin.execute(
                            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)",
                            (waiting.info.backend_pid,),
                        ).fetchone()
                        return bool(row and row[0])

                    await eventually(queued)
                    admin.execute("SELECT pg_terminate_backend(%s)", (holder,))
            assert lease_holder(dsn, "main") == waiting.info.backend_pid

            async def lost() -> bool:  # its next claim finds the connection gone
                return (await stats_of(mem)).embedder_lease is False

            await eventually(lost)
            await say(mem, "while lost 0", "while lost 1")
            with anyio.move_on_after(20 * PERIOD):
                await mem.sessions.vectors_ready()
            assert (await stats_of(mem)).vectors_pending == 2
        finally:
            waiting.close()
        # Free again: the memory reconnects and takes it back.
        with anyio.fail_after(WAIT):
            assert await mem.sessions.vectors_ready()
        assert (await stats_of(mem)).embedder_lease is True
        assert sorted(embedder.texts) == ["before", "while lost 0", "while lost 1"]


async def test_the_records_embedder_has_a_lease_of_its_own(
    tmp_path: Path, dsn: str, short_period: None
) -> None:
    from fake_embedder import FakeEmbedder

    embedder = FakeEmbedder()
    other = take_lease(dsn, RECORDS_TENANT)
    try:
        async with am.open_memory(
            tmp_path / "s", storage=dsn, embedder=embedder, config=TEXT_ONLY
        ) as mem:
            await mem.records.add("the gate code is 4417", user_id="u1")
            await say(mem, "hello")  # the agent's lease is free: its vectors are made
            with anyio.move_on_after(20 * PERIOD):
                await mem.sessions.vectors_ready()
            assert (await stats_of(mem)).vectors_pending == 0
            assert embedder.texts == ["hello"]
            detail = await check_of(mem, "records:vectors")
            assert detail.startswith("1 waiting for a vector of fake/bag-of-words")
            assert "embedded by another process" in detail
            other.close()
            with anyio.fail_after(WAIT):
                assert await mem.sessions.vectors_ready()
            assert embedder.texts == ["hello", "the gate code is 4417"]
    finally:
        other.close()


async def test_a_holder_whose_embedder_keeps_failing_hands_the_lease_to_another(
    tmp_path: Path, dsn: str, short_period: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fake_embedder import FakeEmbedder

    monkeypatch.setattr(embedder_actor, "FIRST_BACKOFF", PERIOD / 2)
    broken, working = FakeEmbedder(), FakeEmbedder()
    broken.fail = True  # say, this worker's model failed to load
    async with am.open_memory(
        tmp_path / "a", storage=dsn, embedder=broken, config=TEXT_ONLY
    ) as first:
        await say(first, "hello 0")

        async def first_holds() -> bool:
            return (await stats_of(first)).embedder_lease is True

        await eventually(first_holds)
        async with am.open_memory(
            tmp_path / "b", storage=dsn, embedder=working, config=TEXT_ONLY
        ) as second:
            await say(first, "hello 1", "hello 2")
            with anyio.fail_after(WAIT):  # the second memory embeds, once the first gave up
                assert await second.sessions.vectors_ready()
            assert sorted(working.texts) == ["hello 0", "hello 1", "hello 2"]
            assert broken.calls >= embedder_actor.HAND_OVER_AFTER
            assert (
                (await stats_of(first)).embedder_lease,
                (await stats_of(second)).embedder_lease,
            ) == (False, True)
            assert "the model is unavailable" in await check_of(first, "index:main")
