"""`mem.doctor()` and `activememory doctor` (docs/design.md §4.11): the recall pool's line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import pytest
import trio
import trio.testing

import activememory as am
from activememory._cli import main


class Stubborn:
    """Ignores cancellation: its run outlives the finalize deadline, unawaited."""

    async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(30)
        return "too late"


def test_doctor_counts_the_runs_abandoned_by_the_pool(tmp_path: Path) -> None:
    config = {"plugins": {"entries": {"active-memory": {"config": {"model": "test/stubborn"}}}}}

    async def main_() -> tuple[am.DoctorReport, am.DoctorReport]:
        async with am.open_memory(
            tmp_path / "s", config=config, models={"test/stubborn": Stubborn()}, executor="inline"
        ) as mem:
            before = await mem.doctor()
            turn = am.Turn(
                session_key="agent:main:direct:alice",
                messages=[am.Message(role="user", content="what do I drink?")],
            )
            assert (await mem.recall(turn)).status == "timeout"
            await trio.sleep(60)  # the run ends, long after its finalize deadline
            return before, await mem.doctor()

    before, after = trio.run(main_, clock=trio.testing.MockClock(autojump_threshold=0))
    pool = {c.name: c for c in before.checks}["recall-pool"]
    assert (pool.level, pool.detail) == (
        "ok",
        "runs that ignored cancellation and outlived their budget: 0",
    )
    pool = {c.name: c for c in after.checks}["recall-pool"]
    assert (pool.level, pool.detail) == (
        "warn",
        "runs that ignored cancellation and outlived their budget: 1",
    )


def test_the_cli_doctor_shows_the_recall_pool(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    async def store() -> None:  # doctor reads a store; an empty directory is an error
        async with am.open_memory(
            tmp_path, config={"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
        ) as mem:
            await mem.sessions.append("agent:main:main", am.Message(role="user", content="hi"))

    trio.run(store)
    assert main(["doctor", "--state-dir", str(tmp_path)]) == 0
    assert "[ok  ] recall-pool: runs that ignored cancellation and outlived their budget: 0" in (
        capsys.readouterr().out.splitlines()
    )
    assert main(["doctor", "--state-dir", str(tmp_path), "--json"]) == 0
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert checks[-1] == {
        "name": "recall-pool",
        "level": "ok",
        "detail": "runs that ignored cancellation and outlived their budget: 0",
    }


@pytest.mark.anyio
async def test_doctor_states_the_disk_and_memory_cost(tmp_path: Path) -> None:
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(tmp_path / "s", config=config, executor="inline") as mem:
        for n in range(4):
            await mem.sessions.append("agent:main:main", am.Message(role="user", content=f"m{n}"))
        checks = {c.name: c for c in (await mem.doctor()).checks}
    disk = checks["disk:main"].detail
    assert " MB for 4 messages: index " in disk and " B/message; content " in disk
    assert "; vectors 0.0 MB; other " in disk
    assert checks["memory"].detail.startswith("process resident ")
    assert checks["memory"].detail.endswith(
        " MB, 1 agent databases open, of it the in-memory vector index 0.0 MB"
    )


@pytest.mark.anyio
async def test_doctor_shows_the_wal_checkpoints(tmp_path: Path) -> None:
    """A thread executor's writers checkpoint their WAL on a thread (docs/design.md §1.3):
    doctor counts them; a thread that has ended while its writer runs is a warning."""
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(tmp_path / "s", config=config, executor="thread") as mem:
        # ~6 MB of messages: the WAL passes 1,000 pages (4 MB) at least once.
        for n in range(60):
            text = f"message {n} " + "word " * 20_000
            await mem.sessions.append("agent:main:main", am.Message(role="user", content=text))
        await mem.records.add("a record", user_id="u1")
        checks = {c.name: c for c in (await mem.doctor()).checks}
        wal = checks["wal:main"]
        assert wal.level == "ok" and wal.fix is None
        found = re.match(r"(\d+) checkpoints on their thread, (\d+) by the writer", wal.detail)
        assert found is not None and int(found[1]) + int(found[2]) >= 1
        assert wal.detail.endswith(" pages (the writer steps in at 4000)")
        assert checks["wal:records"].level == "ok"
        # The thread ends as if its connection had failed; the writer goes on alone.
        checkpointer = (await mem._supervisor.agent("main")).actor.checkpointer
        assert checkpointer is not None and checkpointer.alive
        checkpointer._stopping = True
        checkpointer._due.set()
        with anyio.fail_after(10):
            while checkpointer.alive:  # noqa: ASYNC110 - a thread's state, no event to await
                await anyio.sleep(0.01)
        wal = {c.name: c for c in (await mem.doctor()).checks}["wal:main"]
        assert wal.level == "warn" and wal.detail.endswith("; the checkpoint thread has ended")
        assert wal.fix is not None and "permissions" in wal.fix


@pytest.mark.anyio
async def test_doctor_says_when_sqlite_checkpoints_itself(tmp_path: Path) -> None:
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(tmp_path / "s", config=config, executor="inline") as mem:
        await mem.sessions.append("agent:main:main", am.Message(role="user", content="hi"))
        checks = {c.name: c for c in (await mem.doctor()).checks}
    assert "wal:main" not in checks  # the inline executor keeps SQLite's autocheckpoint
