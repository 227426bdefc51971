"""Group commit: concurrent appends share transactions, and each caller gets its own ack."""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path

import anyio
import anyio.abc
import anyio.lowlevel
import apsw
import pytest
import trio.lowlevel

import activememory as am
from activememory.actors.group_commit import CLOSED, GroupCommit
from activememory.storage.executor import ThreadExecutor, dedicated, make_executor

from index_probe import agent_db, indexed_tokens

pytestmark = [pytest.mark.anyio, pytest.mark.full_matrix]  # about executors and loops


async def test_concurrent_appenders_share_transactions(mem: am.Memory) -> None:
    acked: dict[str, list[int]] = {}

    async def appender(n: int) -> None:
        key = f"agent:main:direct:u{n}"
        for i in range(5):
            event = await mem.sessions.append(
                key, am.Message(role="user", content=f"user {n} line {i}")
            )
            acked.setdefault(key, []).append(event.id)

    indexer = (await mem._supervisor.agent("main")).actor
    batches, commands = indexer.batches, indexer.commands
    async with anyio.create_task_group() as tg:
        for n in range(64):
            tg.start_soon(appender, n)
    assert indexer.commands - commands == 320
    assert indexer.batches - batches < 320 // 4  # most commits carried many appends
    for key, ids in acked.items():
        assert [e.id for e in await mem.sessions.history(key)] == ids
    assert len(indexed_tokens(agent_db(mem.state_dir))) == 320


async def test_closing_commits_what_was_queued(tmp_path: Path) -> None:
    state = tmp_path / "state"
    outcomes: list[am.Event | am.MemoryClosedError] = []

    async def append(mem: am.Memory, n: int) -> None:
        try:
            message = am.Message(role="user", content=f"m{n}")
            outcomes.append(await mem.sessions.append(f"agent:main:direct:c{n}", message))
        except am.MemoryClosedError as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as tg, am.open_memory(state) as mem:
        await mem.sessions.create("agent:main:main")  # the agent database is open
        for n in range(40):
            tg.start_soon(append, mem, n)
        await anyio.lowlevel.checkpoint()  # some appends are queued, some not yet sent, as we close
    acked = [o for o in outcomes if isinstance(o, am.Event)]
    assert len(outcomes) == 40 and acked
    async with am.open_memory(state) as mem:
        stats = await mem.sessions.stats()
        for event in acked:
            assert [e.id for e in await mem.sessions.history(event.session_key)] == [event.id]
    assert stats[0].indexed_messages == len(acked)


async def test_closed_means_not_written_even_when_the_host_is_cancelled(tmp_path: Path) -> None:
    state = tmp_path / "state"
    acked: dict[str, list[int]] = {}
    refused: list[str] = []

    async def appender(mem: am.Memory, n: int) -> None:
        key = f"agent:main:direct:k{n}"
        acked[key] = []
        for i in range(1000):  # until the memory closes under us
            try:
                event = await mem.sessions.append(key, am.Message(role="user", content=f"m{i}"))
            except am.MemoryClosedError:
                refused.append(key)
                return
            acked[key].append(event.id)

    async with anyio.create_task_group() as callers:  # outside the scope the host cancels
        with anyio.CancelScope() as host:
            async with am.open_memory(state) as mem:
                await mem.sessions.create("agent:main:main")
                for n in range(50):
                    callers.start_soon(appender, mem, n)
                with anyio.fail_after(30):  # until appends are flowing (not a fixed time:
                    while sum(map(len, acked.values())) <= 50:  # noqa: ASYNC110 - a loaded machine is slower)
                        await anyio.sleep(0.005)
                host.cancel()  # the host gives up while appends are queued and committing
                await anyio.sleep_forever()
    assert sorted(refused) == sorted(acked) and sum(map(len, acked.values())) > 50
    async with am.open_memory(state) as mem:
        for key, ids in acked.items():  # acked: present; refused: absent
            assert [e.id for e in await mem.sessions.history(key)] == ids


class _Tenfold:
    """A storage writer for the bare group commit: acks each int command with ten times it."""

    def __init__(self) -> None:
        self.conn = apsw.Connection(":memory:")
        self.batches: list[list[int]] = []

    def apply(self, commands: Sequence[int]) -> list[int]:
        self.batches.append(list(commands))
        return [command * 10 for command in commands]


class _TenfoldWriter(GroupCommit[int, int]):
    def rejected(self, message: str) -> int:
        assert message == CLOSED
        return -1


async def test_the_group_commit_acks_each_call_after_its_batch(executor: str) -> None:
    writer = _Tenfold()
    actor = _TenfoldWriter(writer, make_executor(executor), max_batch=3)
    acks: dict[int, int] = {}

    async def submit(n: int) -> None:
        acks[n] = await actor.submit(n)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            async with anyio.create_task_group() as callers:
                for n in range(7):
                    callers.start_soon(submit, n)
            await actor.close_inbox()
    assert acks == {n: n * 10 for n in range(7)}
    assert sorted(n for batch in writer.batches for n in batch) == list(range(7))
    assert max(map(len, writer.batches)) == 3 and actor.batches == len(writer.batches) < 7
    with pytest.raises(am.MemoryClosedError, match="^the memory is closed$"):
        await actor.submit(8)


class _Wakes:
    """A trio instrument: how many times each task was scheduled to run."""

    def __init__(self) -> None:
        self.by_task: dict[object, int] = {}

    def task_scheduled(self, task: object) -> None:
        self.by_task[task] = self.by_task.get(task, 0) + 1


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_a_caller_queued_behind_full_batches_wakes_only_for_its_own(executor: str) -> None:
    # Queued behind `max_batch` others, a caller would wake (and wait again) at every
    # commit before its own on the shared event: 50 calls in batches of 5 made the last
    # one run 10 times and the whole loop quadratic in what is queued.
    actor = _TenfoldWriter(_Tenfold(), make_executor(executor), max_batch=5)
    wakes = _Wakes()
    callers: dict[int, object] = {}
    acks: dict[int, int] = {}

    async def submit(n: int) -> None:
        callers[n] = trio.lowlevel.current_task()
        acks[n] = await actor.submit(n)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            trio.lowlevel.add_instrument(wakes)
            try:
                async with anyio.create_task_group() as submitters:
                    for n in range(50):
                        submitters.start_soon(submit, n)
            finally:
                trio.lowlevel.remove_instrument(wakes)
            await actor.close_inbox()
    assert acks == {n: n * 10 for n in range(50)} and actor.batches >= 10
    # started, woken once to take its ack (with a thread executor maybe once more, at
    # the send's checkpoint): never once a commit
    assert max(wakes.by_task[task] for task in callers.values()) <= 3


@pytest.mark.parametrize("max_batch", [512, 2])  # 2: three calls wait on events of their own
async def test_the_group_commit_rejects_what_it_never_applied(
    executor: str, max_batch: int
) -> None:
    writer = _Tenfold()
    actor = _TenfoldWriter(writer, make_executor(executor), max_batch=max_batch)
    acks: dict[int, int] = {}

    async def submit(n: int) -> None:
        acks[n] = await actor.submit(n)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for n in range(5):
                tg.start_soon(submit, n)
            await anyio.wait_all_tasks_blocked()  # all five queued, none applied
            with anyio.CancelScope() as scope:
                scope.cancel()
                await actor.run()
    assert acks == {n: -1 for n in range(5)} and writer.batches == []


class _Ledger:
    """A storage writer over a real table: acks each command with ten times it, only once
    its transaction has committed; a negative command raises after the ones before it in
    its batch were written (the transaction then rolls back). With `gate`, the first batch
    waits on the writer thread until the test opens it."""

    def __init__(self, gate: threading.Event | None = None) -> None:
        self.conn = apsw.Connection(":memory:")
        self.conn.execute("CREATE TABLE ledger(n INTEGER)")
        self.gate = gate
        self.batches: list[list[int]] = []
        self.committed: set[int] = set()

    def apply(self, commands: Sequence[int]) -> list[int]:
        self.batches.append(list(commands))
        if self.gate is not None and len(self.batches) == 1:
            assert self.gate.wait(10)
        with self.conn:
            for n in commands:
                if n < 0:
                    raise RuntimeError(f"command {n} failed")
                self.conn.execute("INSERT INTO ledger VALUES (?)", (n,))
        self.committed.update(commands)
        return [n * 10 for n in commands]

    def rows(self) -> list[int]:
        return sorted(n for (n,) in self.conn.execute("SELECT n FROM ledger"))


class _LedgerWriter(GroupCommit[int, int]):
    def rejected(self, message: str) -> int:
        assert message == CLOSED
        return -1


# The threads of connections that are not a writer's (storage/executor.make_executor roles):
# another test's may still be ending (a thread left idle ends after IDLE_S).
_OTHER_ROLES = {
    f"activememory-{role}"
    for role in ("connection", "reader", "embedder-reader", "notes", "leases", "writer")
}


def _writer_threads() -> list[str]:
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith("activememory-") and t.name not in _OTHER_ROLES
    ]


async def test_an_ack_comes_only_after_the_commit_that_holds_it(executor: str) -> None:
    writer = _Ledger()
    actor = _LedgerWriter(writer, make_executor(executor), max_batch=5)

    async def submit(n: int) -> None:
        ack = await actor.submit(n)
        assert ack == n * 10 and n in writer.committed  # never ahead of its commit

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(actor.run)
            async with anyio.create_task_group() as callers:
                for n in range(40):
                    callers.start_soon(submit, n)
            await actor.close_inbox()
    assert writer.rows() == list(range(40)) and actor.commands == 40


async def test_a_batch_that_fails_midway_acks_nothing_as_written(executor: str) -> None:
    writer = _Ledger()
    actor = _LedgerWriter(writer, make_executor(executor))
    outcomes: dict[int, int] = {}

    async def submit(n: int) -> None:
        outcomes[n] = await actor.submit(n)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for n in (1, 2, -3, 4):
                tg.start_soon(submit, n)
            await anyio.wait_all_tasks_blocked()  # all four queued: one batch
            with pytest.raises(RuntimeError, match="^command -3 failed$"):
                await actor.run()
    assert outcomes == {1: -1, 2: -1, -3: -1, 4: -1}  # "closed": not written
    assert writer.rows() == [] and writer.committed == set() and actor.commands == 0
    with pytest.raises(am.MemoryClosedError, match="^the memory is closed$"):
        await actor.submit(5)  # the writer has stopped: nothing more is taken


async def _open_when_the_thread_holds_the_first_batch(
    writer: _Ledger, gate: threading.Event, cancel: anyio.CancelScope | None = None
) -> None:
    while not writer.batches:  # noqa: ASYNC110 - the writer thread is not a task to wait on
        await anyio.sleep(0.001)
    await anyio.wait_all_tasks_blocked()  # the writer has handed over what it could
    if cancel is not None:
        cancel.cancel()
    gate.set()


async def _queue_in_order(
    tg: anyio.abc.TaskGroup, submit: Callable[[int], Awaitable[None]], commands: Iterable[int]
) -> None:
    for n in commands:  # one at a time: the scheduler may start tasks in any order
        tg.start_soon(submit, n)
        await anyio.wait_all_tasks_blocked()


async def test_after_a_failed_batch_the_one_queued_behind_it_is_not_applied() -> None:
    # Thread executor only: its writer thread holds two batches, one applying and one
    # queued; the queued one must not commit after the one before it failed.
    gate = threading.Event()
    writer = _Ledger(gate)
    actor = _LedgerWriter(writer, make_executor("thread"), max_batch=2)
    outcomes: dict[int, int] = {}

    async def submit(n: int) -> None:
        outcomes[n] = await actor.submit(n)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await _queue_in_order(tg, submit, (1, -2, 3, 4, 5))
            tg.start_soon(_open_when_the_thread_holds_the_first_batch, writer, gate)
            with pytest.raises(RuntimeError, match="^command -2 failed$"):
                await actor.run()
    assert outcomes == {n: -1 for n in (1, -2, 3, 4, 5)}
    assert writer.batches == [[1, -2]] and writer.rows() == [] and _writer_threads() == []


async def test_cancelling_the_writer_commits_what_it_handed_over_and_rejects_the_rest() -> None:
    gate = threading.Event()
    writer = _Ledger(gate)
    actor = _LedgerWriter(writer, make_executor("thread"), max_batch=2)
    outcomes: dict[int, int] = {}

    async def submit(n: int) -> None:
        outcomes[n] = await actor.submit(n)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            await _queue_in_order(tg, submit, range(1, 8))
            with anyio.CancelScope() as scope:
                # Cancelled with two batches handed over and three commands still queued.
                tg.start_soon(_open_when_the_thread_holds_the_first_batch, writer, gate, scope)
                await actor.run()
    written = [n for batch in writer.batches for n in batch]
    assert written == [1, 2, 3, 4] and writer.rows() == written
    assert outcomes == {n: n * 10 if n in written else -1 for n in range(1, 8)}
    assert _writer_threads() == []


async def test_closing_the_memory_leaves_no_connection_thread(tmp_path: Path) -> None:
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    before = set(threading.enumerate())
    async with am.open_memory(tmp_path / "state", executor="thread", config=config) as mem:
        await mem.sessions.append("agent:main:main", am.Message(role="user", content="hi"))
        await mem.records.add("a record", user_id="u1")
        await mem.sessions.search("hi", caller="agent:main:main")
        assert "activememory-reader" in [t.name for t in threading.enumerate()]
        assert sorted(_writer_threads()) == [
            "activememory-Indexer",
            "activememory-Indexer-checkpoints",  # storage/checkpoints.py
            "activememory-RecordKeeper",
            "activememory-RecordKeeper-checkpoints",
        ]
    assert [t.name for t in threading.enumerate() if t not in before] == []


async def test_the_writer_thread_drops_a_queued_call_and_finishes_a_started_one() -> None:
    started, gate = threading.Event(), threading.Event()
    ran: list[str] = []
    returned: list[str] = []

    def first() -> str:
        started.set()
        assert gate.wait(10)
        ran.append("first")
        return "first"

    async def call_first(scope: anyio.CancelScope) -> None:
        with scope:
            returned.append(await thread.run(first))

    with anyio.fail_after(10):
        async with (
            dedicated(ThreadExecutor(), "activememory-test") as thread,
            anyio.create_task_group() as tg,
        ):
            first_caller = anyio.CancelScope()
            tg.start_soon(call_first, first_caller)
            while not started.is_set():  # noqa: ASYNC110 - set on the writer thread
                await anyio.sleep(0.001)
            with anyio.CancelScope() as queued:
                queued.cancel()
                await thread.run(lambda: ran.append("second"))  # queued: dropped
            first_caller.cancel()  # started: it runs to the end, the caller hears Cancelled
            await anyio.sleep(0.01)
            assert ran == []
            gate.set()
    assert ran == ["first"] and returned == [] and _writer_threads() == []
