"""Bad input gets a clear error naming the problem, and the database stays as it was."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import anyio
import pytest

import activememory as am

from index_probe import agent_db, indexed_tokens, tokenize

pytestmark = pytest.mark.anyio
KEY = "agent:main:direct:alice"


async def snapshot(mem: am.Memory) -> tuple[object, ...]:
    return (
        await mem.sessions.history(KEY),
        await mem.sessions.info(KEY),
        indexed_tokens(agent_db(mem.state_dir)),
    )


async def test_rejected_appends_change_nothing(mem: am.Memory) -> None:
    await mem.sessions.append(KEY, am.Message(role="user", content="before"))
    before = await snapshot(mem)
    cases = [
        (
            "agent:BAD:main",
            {"role": "user", "content": "x"},
            "session_key: 'agent:BAD:main' has agent id",
        ),
        (KEY, {"role": "system", "content": "x"}, "message: Message.role: 'system' is not one of"),
        (
            KEY,
            {"role": "user", "content": [{"type": "audio"}]},
            "message: Message.content[0].type: 'audio' is not",
        ),
        (KEY, {"role": "user", "content": "\ud800"}, "message: Message.content: lone surrogate"),
        (
            KEY,
            {"role": "user", "content": "x" * (am.MAX_CONTENT_BYTES + 1)},
            "message: Message.content: 1048577 bytes is over",
        ),
        (KEY, "just text", "message: expected am.Message, got str"),
    ]
    for key, message, error in cases:
        with pytest.raises(am.InvalidInputError) as info:
            await mem.sessions.append(key, message)  # type: ignore[arg-type]
        assert str(info.value).startswith(error), str(info.value)
    assert await snapshot(mem) == before


async def test_bad_arguments_name_the_parameter(mem: am.Memory) -> None:
    with pytest.raises(am.InvalidInputError, match="^limit: 0 is not a positive integer$"):
        await mem.sessions.history(KEY, limit=0)
    with pytest.raises(
        am.InvalidInputError, match="^sandboxed: expected true or false, got 'yes'$"
    ):
        await mem.sessions.create(KEY, sandboxed="yes")  # type: ignore[arg-type]
    with pytest.raises(am.InvalidInputError, match="^spawned_by: '' is empty$"):
        await mem.sessions.create(KEY, spawned_by="")


async def test_state_dir_that_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.write_text("not a directory")
    with pytest.raises(
        am.InvalidInputError, match=rf"^state_dir: '{path}' exists and is not a directory$"
    ):
        async with am.open_memory(path):
            pass
    assert path.read_text() == "not a directory"


async def test_unknown_executor(tmp_path: Path) -> None:
    with pytest.raises(
        am.InvalidInputError, match="^executor: 'process' is not one of 'thread', 'inline'$"
    ):
        async with am.open_memory(tmp_path, executor="process"):  # type: ignore[arg-type]
            pass


READ_ONLY_CHILD = textwrap.dedent(
    """
    import sys, trio, activememory as am
    async def main():
        try:
            async with am.open_memory(sys.argv[1]) as mem:
                await mem.sessions.append("agent:main:main", am.Message(role="user", content="x"))
        except am.StorageError as exc:
            print("StorageError:", exc)
    trio.run(main)
    """
)


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_read_only_state_dir(tmp_path: Path) -> None:
    # Root ignores permission bits; drop the capabilities that let it, for the child only.
    state = tmp_path / "state"
    state.mkdir(mode=0o555)
    with anyio.fail_after(60):
        result = await anyio.run_process(
            ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner",
             sys.executable, "-c", READ_ONLY_CHILD, str(state)],
            check=False,
        )  # fmt: skip
    expected = f"StorageError: cannot create {str(state / 'agents' / 'main')!r} (Permission denied)"
    assert result.stdout.decode().strip() == expected, result
    assert list(state.iterdir()) == []


async def writer_pragma(mem: am.Memory, agent: str, name: str, value: int | None = None) -> int:
    """Reach the indexer's connection (tests only): simulate a full disk with max_page_count."""
    store = await mem._supervisor.agent(agent)
    conn = store.actor.writer.conn
    return int(
        await store.actor.executor.run(
            lambda: conn.pragma(name, value) if value else conn.pragma(name)
        )
    )


async def test_full_disk_rejects_the_write_and_keeps_the_database(mem: am.Memory) -> None:
    await mem.sessions.append(KEY, am.Message(role="user", content="fits"))
    pages = await writer_pragma(mem, "main", "page_count")
    await writer_pragma(mem, "main", "max_page_count", pages + 2)
    before = await snapshot(mem)
    big = am.Message(role="user", content=" ".join(f"word{i}" for i in range(60_000)))
    with pytest.raises(am.StorageError, match="^disk full or database size limit reached$"):
        await mem.sessions.append(KEY, big)
    assert await snapshot(mem) == before
    stats = await mem.sessions.stats()
    assert stats[0].fts_integrity_ok


async def test_one_write_that_does_not_fit_does_not_sink_its_batch(mem: am.Memory) -> None:
    await mem.sessions.append(KEY, am.Message(role="user", content="fits"))
    pages = await writer_pragma(mem, "main", "page_count")
    await writer_pragma(mem, "main", "max_page_count", pages + 4)
    big = am.Message(role="user", content=" ".join(f"word{i}" for i in range(60_000)))
    outcomes: dict[str, object] = {}

    async def put(name: str, message: am.Message) -> None:
        try:
            outcomes[name] = await mem.sessions.append(KEY, message)
        except am.StorageError as exc:
            outcomes[name] = exc

    indexer = (await mem._supervisor.agent("main")).actor
    batches = indexer.batches
    async with anyio.create_task_group() as tg:  # queued together: one batch
        tg.start_soon(put, "small1", am.Message(role="user", content="small one"))
        tg.start_soon(put, "big", big)
        tg.start_soon(put, "small2", am.Message(role="assistant", content="small two"))
    assert isinstance(outcomes["big"], am.StorageError)
    assert isinstance(outcomes["small1"], am.Event) and isinstance(outcomes["small2"], am.Event)
    texts = [e.message.content for e in await mem.sessions.history(KEY) if e.message]
    assert indexer.batches == batches + 1
    assert texts[0] == "fits" and sorted(texts[1:]) == ["small one", "small two"]
    assert sorted(indexed_tokens(agent_db(mem.state_dir)).values()) == [
        tokenize("fits"),
        tokenize("small one"),
        tokenize("small two"),
    ]
