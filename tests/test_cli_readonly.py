"""The CLI's read commands beside a running bot (docs/design.md §1.6), and a mistyped
`--state-dir`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_readonly import snapshot

from activememory._cli import main

ALICE = "agent:main:direct:alice"
# A bot holding the state directory: it stores alice's chat, says READY, and keeps the
# store open (its writer lock taken) until its stdin closes.
BOT = """
import sys, trio, activememory as am

async def run(state):
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(state, config=config) as mem:
        await mem.sessions.append(sys.argv[2], am.Message(role="user", content="I keep bees"))
        await mem.sessions.append(
            sys.argv[2], am.Message(role="assistant", content="Bees on a roof, noted.")
        )
        print("READY", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)

trio.run(run, sys.argv[1])
"""


@pytest.fixture
def bot(tmp_path: Path) -> Iterator[Path]:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", BOT, str(state), ALICE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "READY\n"
        yield state
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0


def test_read_commands_run_beside_a_running_bot(
    bot: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = snapshot(bot)  # the -shm too: this process only ever opens it read-only
    state = ["--state-dir", str(bot)]
    assert main(["search", "bees", *state, "--caller", ALICE, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert sorted(r["snippet"] for r in found["results"]) == [
        "Bees on a roof, noted.",
        "I keep bees",
    ]
    assert main(["history", ALICE, *state, "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2
    assert main(["stats", *state, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["indexed_messages"] == 2
    assert main(["doctor", *state]) == 0
    assert "index:main: 1 sessions, 2/2 messages indexed" in capsys.readouterr().out
    assert main(["recall", "what do I keep?", *state, "--session", ALICE]) == 0
    assert "status=" in capsys.readouterr().out
    assert main(["sessions", *state, "--json"]) == 0
    assert [s["key"] for s in json.loads(capsys.readouterr().out)] == [ALICE]
    assert main(["export", *state, "--identity", "alice"]) == 0
    assert "I keep bees" in capsys.readouterr().out
    assert main(["erase", *state, "--identity", "alice", "--dry-run", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["agents"][0]["session_keys"] == [ALICE]
    assert snapshot(bot) == before
    # Writing is still the bot's alone: the import (a writer) is refused while it runs.
    transcript = bot.parent / "t.jsonl"
    transcript.write_text(
        '{"type": "message", "id": "1", "timestamp": 5,'
        ' "message": {"role": "user", "content": "hi"}}\n'
    )
    assert main(["import", str(transcript), *state, "--session-key", "agent:main:main"]) == 2
    assert "already open for writing" in capsys.readouterr().err
    # An erase is no second writer: the bot runs it through its own (docs/design.md §1.7).
    assert main(["erase", *state, "--identity", "alice"]) == 0
    assert "erased by the running bot" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["search", "bees", "--caller", ALICE],
        ["search", "bees", "--caller", ALICE, "--wait"],
        ["history", ALICE],
        ["stats"],
        ["doctor"],
        ["recall", "hello"],
        ["sessions"],
        ["export", "--identity", "alice"],
        ["erase", "--identity", "alice"],
    ],
    ids=lambda command: " ".join(command[:1] + command[-1:]),
)
def test_a_mistyped_state_dir_is_an_error(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "typo"
    assert main([*command, "--state-dir", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"activememory: error: --state-dir: '{missing}' does not exist\n"
    )
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main([*command, "--state-dir", str(empty)]) == 2
    assert capsys.readouterr().err == (
        f"activememory: error: --state-dir: '{empty}' holds no activememory store "
        "(no records.db, no agents/*/memory.db)\n"
    )
    assert os.listdir(empty) == []


def test_history_says_when_the_session_is_being_reindexed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(
        '{"type": "message", "id": "1", "timestamp": 5,'
        ' "message": {"role": "user", "content": "hi"}}\n'
    )
    state = ["--state-dir", str(tmp_path / "s")]
    assert main(["import", str(transcript), *state, "--session-key", ALICE, "--no-rebuild"]) == 0
    capsys.readouterr()
    assert main(["history", ALICE, *state]) == 0
    assert capsys.readouterr().err == (
        f"note: {ALICE} is being re-indexed; search shows it once its writer has rebuilt it\n"
    )


def test_search_names_a_lone_surrogate(bot: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Bytes that are not UTF-8 on the command line reach Python as lone surrogates.
    command = ["search", "bees \udcff", "--state-dir", str(bot), "--caller", ALICE]
    assert main(command) == 2
    assert capsys.readouterr().err == (
        "activememory: error: query: lone surrogate '\\udcff' at index 5 "
        "(text must be valid Unicode)\n"
    )
