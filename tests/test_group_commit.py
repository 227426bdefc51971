"""Group commit: concurrent appends share transactions, and each caller gets its own ack."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.lowlevel
import apsw
import pytest

import activememory as am
from activememory.actors.group_commit import CLOSED, GroupCommit
from activememory.storage.executor import make_executor

from index_probe import agent_db, indexed_tokens

pytestmark = pytest.mark.anyio


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


async def test_the_group_commit_rejects_what_it_never_applied(executor: str) -> None:
    writer = _Tenfold()
    actor = _TenfoldWriter(writer, make_executor(executor))
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
