"""The notes watcher (docs/design.md §4.7): edits reach the notes index off the recall path.

In virtual time (trio's MockClock, the inline executor), so the times are exact: the
watcher polls every `POLL_S` and syncs `watchDebounceMs` after the last change it saw.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NoReturn

import anyio
import apsw
import pytest
import trio.testing

import activememory as am
from activememory.actors.notes_watcher import POLL_S
from activememory.protocol.session_key import parse_session_key
from activememory.storage import transcripts

from pg_server import pg_memory_dsn, storage

__all__ = ["pg_memory_dsn", "storage"]
pytestmark = pytest.mark.anyio

CALLER = parse_session_key("agent:main:direct:alice")
PAST_S = 1_600_000_000  # 2020: no file is "just written" (no racy rehash rounds)
VIRTUAL = pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}))],
)


def watch(debounce_ms: int = 1500, **more: Any) -> dict[str, Any]:
    sync = {"watch": True, "watchDebounceMs": debounce_ms, **more}
    return {"agents": {"defaults": {"memorySearch": {"provider": "none", "sync": sync}}}}


def note(mem: am.Memory, text: str, *, at: int) -> None:
    path = mem.notes.workspace("main") / "MEMORY.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    os.utime(path, (PAST_S + at, PAST_S + at))


async def found(mem: am.Memory, query: str) -> list[str]:
    result = await mem.notes.search("main", {"query": query}, caller=CALLER, transcripts=None)
    assert result.data is not None
    return [r["path"] for r in result.data["results"]]


@VIRTUAL
async def test_two_edits_within_the_debounce_index_the_final_content(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with am.open_memory(tmp_path / "s", config=watch(1500), executor="inline") as mem:
            assert POLL_S == 1.0  # the times below
            start = anyio.current_time()
            note(mem, "The cat is Miso.\n", at=0)
            assert await found(mem, "Miso") == ["MEMORY.md"]  # the first search scans
            watcher = mem.notes.watchers["main"]
            await anyio.sleep(0.5)
            assert watcher.syncs == 1  # its first round syncs at once (nothing to miss)
            note(mem, "The cat is Tofu.\n", at=1)  # seen by the poll at 1.0
            await anyio.sleep(1.0)
            note(mem, "The cat is Kiwi, finally.\n", at=2)  # seen at 2.0: the wait restarts
            await anyio.sleep(1.9)
            assert anyio.current_time() - start == 3.4
            # No search rescans: the index still holds the first version.
            assert await found(mem, "Miso") == ["MEMORY.md"]
            assert await found(mem, "Kiwi") == []
            await anyio.sleep(0.7)  # the poll at 4.0: quiet for 2 s >= 1.5 s, synced
            assert await found(mem, "Kiwi") == ["MEMORY.md"]
            assert await found(mem, "Miso") == []
            assert await found(mem, "Tofu") == []
            assert watcher.syncs == 2  # the two edits: one sync, with the final content


@VIRTUAL
async def test_a_note_added_and_one_removed_are_followed(tmp_path: Path) -> None:
    with anyio.fail_after(60):
        async with am.open_memory(tmp_path / "s", config=watch(0), executor="inline") as mem:
            note(mem, "The cat is Miso.\n", at=0)
            assert await found(mem, "Miso") == ["MEMORY.md"]
            extra = mem.notes.workspace("main") / "memory" / "pets.md"
            extra.parent.mkdir()
            extra.write_text("The dog is Rex.\n")
            os.utime(extra, (PAST_S, PAST_S))
            (mem.notes.workspace("main") / "MEMORY.md").unlink()
            await anyio.sleep(POLL_S + 0.1)  # debounce 0: synced at the first poll
            assert await found(mem, "Rex") == ["memory/pets.md"]
            assert await found(mem, "Miso") == []


@VIRTUAL
async def test_without_watch_no_watcher_runs(tmp_path: Path) -> None:
    config = watch(watch=False)
    with anyio.fail_after(60):
        async with am.open_memory(tmp_path / "s", config=config, executor="inline") as mem:
            note(mem, "The cat is Miso.\n", at=0)
            assert await found(mem, "Miso") == ["MEMORY.md"]
            assert mem.notes.watchers == {}


async def test_the_watcher_stops_when_the_memory_closes(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with am.open_memory(tmp_path / "s", config=watch(0)) as mem:
            note(mem, "The cat is Miso.\n", at=0)
            assert await found(mem, "Miso") == ["MEMORY.md"]
            assert "main" in mem.notes.watchers
        # Closed: the watcher's task ended with the supervisor's (else the block would hang).


async def test_the_watcher_indexes_an_edit_on_either_store(
    tmp_path: Path, storage: str | None
) -> None:
    # In real time: the virtual-time tests above run on SQLite's inline executor only.
    with anyio.fail_after(30):
        async with am.open_memory(tmp_path / "s", config=watch(0), storage=storage) as mem:
            note(mem, "The cat is Miso.\n", at=0)
            assert await found(mem, "Miso") == ["MEMORY.md"]  # the first search scans
            note(mem, "The cat is Tofu now.\n", at=1)
            # Searches no longer scan (the watcher runs): only the watcher can index Tofu.
            for _ in range(600):
                if await found(mem, "Tofu") == ["MEMORY.md"]:
                    break
                await anyio.sleep(0.05)
            assert await found(mem, "Miso") == []
            assert await mem.notes.sync_notes("main") == 0  # the watcher left nothing to do


async def test_a_read_only_memory_starts_no_watcher(tmp_path: Path) -> None:
    with anyio.fail_after(30):
        async with am.open_memory(tmp_path / "s", config=watch()) as mem:
            note(mem, "The cat is Miso.\n", at=0)
            assert await found(mem, "Miso") == ["MEMORY.md"]
        async with am.open_memory(tmp_path / "s", config=watch(), readonly=True) as ro:
            assert await found(ro, "Miso") == ["MEMORY.md"]
            assert ro.notes.watchers == {}


@VIRTUAL
async def test_a_failed_sync_is_said_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(conn: object, cmd: object) -> NoReturn:
        raise apsw.FullError("database or disk is full")

    with anyio.fail_after(60):
        async with am.open_memory(tmp_path / "s", config=watch(0), executor="inline") as mem:
            note(mem, "The cat is Miso.\n", at=0)
            assert await found(mem, "Miso") == ["MEMORY.md"]
            with monkeypatch.context() as patched:
                patched.setattr(transcripts, "apply_sync_notes", full)
                note(mem, "The cat is Tofu.\n", at=1)
                await anyio.sleep(POLL_S + 0.1)
                result = await mem.notes.search(
                    "main", {"query": "Miso"}, caller=CALLER, transcripts=None
                )
                assert result.data is not None and result.data["hits"] == 1  # the old index
                assert result.data["syncError"] == (
                    "memory notes of 'main': disk full or database size limit reached"
                )
            await anyio.sleep(POLL_S)  # retried after the debounce (0), at the next poll
            result = await mem.notes.search(
                "main", {"query": "Tofu"}, caller=CALLER, transcripts=None
            )
            assert result.data is not None and result.data["hits"] == 1
            assert "syncError" not in result.data


def test_the_poll_listing_changes_with_every_change_a_sync_would_see(tmp_path: Path) -> None:
    from activememory.recall.memory_core import _note_stats

    root = tmp_path / "ws"
    (root / "memory").mkdir(parents=True)
    (root / "MEMORY.md").write_text("one\n")
    elsewhere = tmp_path / "elsewhere.md"
    elsewhere.write_text("outside\n")
    seen = [_note_stats(root)]

    def changed() -> bool:
        seen.append(_note_stats(root))
        return seen[-1] != seen[-2]

    os.utime(root / "MEMORY.md", (PAST_S, PAST_S))  # same size, other mtime
    assert changed()
    (root / "memory" / "a.md").write_text("a\n")
    assert changed()
    (root / "memory" / "notes.txt").write_text("not a note\n")
    (root / "memory" / ".hidden.md").write_text("hidden\n")
    os.utime(root / "memory", ns=(seen[-1][1][1], seen[-1][1][1]))  # the folder's mtime back
    assert not changed()
    (root / "memory" / "link.md").symlink_to(elsewhere)
    assert changed()
    (root / "memory" / "link.md").unlink()
    (root / "memory" / "link.md").symlink_to(root / "memory" / "a.md")  # retargeted
    os.utime(root / "memory", ns=(seen[-1][1][1], seen[-1][1][1]))
    assert changed()
    (root / "memory" / "a.md").unlink()  # the link now dangles, and a.md is gone
    assert changed()
