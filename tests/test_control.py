"""Erase beside a running bot (docs/design.md §1.7): the CLI in this process asks the bot
in another process, which erases through its own writers and keeps serving."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from activememory._cli import main
from activememory.protocol.control import RESULT_DECODER, ControlResult
from activememory.storage.control import Spool

DANA = "agent:main:direct:dana"
ALICE = "agent:main:direct:alice"
# A bot holding the state directory: it stores dana's and alice's chats and a record of
# dana's, says READY, then appends each line of its stdin to alice's chat ("APPENDED n")
# until its stdin closes.
BOT = """
import sys, trio, activememory as am

async def run(state):
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(state, config=config) as mem:
        for key, text in [(sys.argv[2], "my locker code is zebra-4471"),
                          (sys.argv[3], "I keep bees on the roof")]:
            await mem.sessions.append(key, am.Message(role="user", content=text))
        await mem.records.add("dana's locker: zebra-4471", user_id="dana")
        print("READY", flush=True)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            event = await mem.sessions.append(
                sys.argv[3], am.Message(role="user", content=line.strip())
            )
            print(f"APPENDED {event.id}", flush=True)

trio.run(run, sys.argv[1])
"""


class Bot:
    def __init__(self, proc: subprocess.Popen[str], state: Path) -> None:
        self.proc, self.state = proc, state

    def append(self, text: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()


@pytest.fixture
def bot(tmp_path: Path) -> Iterator[Bot]:
    state = tmp_path / "state"
    proc = subprocess.Popen(
        [sys.executable, "-c", BOT, str(state), DANA, ALICE],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "READY\n"
        yield Bot(proc, state)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0  # the bot ran to the end: nothing crashed it


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_erase_runs_in_the_running_bot_and_it_keeps_serving(
    bot: Bot, capsys: pytest.CaptureFixture[str]
) -> None:
    state = ["--state-dir", str(bot.state)]
    dana = ["records", "search", "zebra", "--user", "dana", *state]
    code, out, _ = run_cli(capsys, *dana)  # read-only: beside the bot
    assert code == 0 and "dana's locker: zebra-4471" in out
    code, _, err = run_cli(capsys, "records", "add", "x", "--user", "dana", *state)
    assert code == 2 and "already open for writing" in err  # a write: the bot's alone
    code, out, err = run_cli(capsys, "erase", "--identity", "dana", *state, "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert summary["purged"] is True
    assert summary["agents"][0]["session_keys"] == [DANA]
    assert summary["records"]["records"] == 1
    assert f"erased by the running bot (pid {bot.proc.pid})" in err

    # Read-only, beside the bot: nothing of dana is left.
    code, out, _ = run_cli(capsys, "search", "zebra", *state, "--caller", DANA, "--json")
    assert code == 0 and json.loads(out)["results"] == []
    code, out, err = run_cli(capsys, "export", "--identity", "dana", *state)
    assert code == 0 and out == "" and "exported 0 sessions" in err
    code, out, _ = run_cli(capsys, "sessions", *state)
    assert code == 0 and DANA not in out and ALICE in out
    assert run_cli(capsys, *dana)[:2] == (0, "no matches\n")
    # Not in the files either (the bot's VACUUM and truncated WAL).
    for path in bot.state.rglob("*"):
        if path.is_file():
            assert b"zebra" not in path.read_bytes(), path

    # The bot still serves: its writer appends after the erase.
    assert bot.append("the hive swarmed today").startswith("APPENDED ")
    code, out, _ = run_cli(capsys, "search", "swarmed", *state, "--caller", ALICE, "--json")
    assert [hit["session_key"] for hit in json.loads(out)["results"]] == [ALICE]
    # And a second erase is served too (nothing left to erase).
    code, out, _ = run_cli(capsys, "erase", "--identity", "dana", *state, "--json")
    assert code == 0 and json.loads(out)["agents"][0]["session_keys"] == []


MALFORMED = [
    (b"not json", "request: JSON is malformed"),
    (b'{"op": "erase"}', "request: Object missing required field `identity`"),
    (b'{"op": "erase", "identity": 7}', "request: Expected `str`, got `int` - at `$.identity`"),
    (b'{"op": "drop-tables"}', "request: Invalid value 'drop-tables' - at `$.op`"),
    (b'{"op": "erase", "identity": "dana", "all": 1}', "request: Object contains unknown"),
    (b'{"op": "erase", "identity": "  "}', "identity: "),
    (b"x" * (64 * 1024 + 1), "request: larger than 65536 bytes"),
]


def test_a_malformed_request_is_answered_with_an_error_and_the_bot_serves_on(bot: Bot) -> None:
    spool = Spool(bot.state)
    assert spool.served()
    # Not requests: a folder and a symlink are passed over (never followed, never answered).
    (spool.requests / "folder.json").mkdir()
    (spool.requests / "link.json").symlink_to(bot.state / "records.db")
    asked = [(spool.ask(request_bytes), error) for request_bytes, error in MALFORMED]
    for request_id, error in asked:
        result = trio.run(wait_for_result, spool, request_id)
        assert result.erasure is None and result.error is not None
        assert result.error.startswith(error), result.error
        assert result.served_by == bot.proc.pid
        assert bot.append("still here").startswith("APPENDED ")
    assert not (spool.requests / "link.json").exists()  # dropped unanswered
    assert (bot.state / "records.db").exists()


async def wait_for_result(spool: Spool, request_id: str) -> ControlResult:
    with trio.fail_after(30):
        while (data := spool.result(request_id)) is None:  # noqa: ASYNC110
            await trio.sleep(0.02)
    return RESULT_DECODER.decode(data)


def test_a_request_nobody_answers_is_withdrawn_after_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A store "served" by a process that never answers: this test holds serve.lock.
    state = tmp_path / "state"
    assert main(["import", str(sample()), "--state-dir", str(state)]) == 0
    capsys.readouterr()
    spool = Spool(state)
    assert spool.serve()
    try:
        code, _, err = run_cli(
            capsys, "erase", "--identity", "alice", "--state-dir", str(state), "--timeout", "0.2"
        )
    finally:
        spool.close()
    assert code == 2
    assert err == (
        "activememory: error: no bot answered within 0.2 s (is it stuck?); the request was "
        "withdrawn: nothing was erased\n"
    )
    assert spool.pending() == []
    # Nobody serves now: the CLI erases itself, as before.
    code, out, err = run_cli(capsys, "erase", "--identity", "alice", "--state-dir", str(state))
    assert code == 0 and "erased 1 sessions" in out and "running bot" not in err


def test_erase_timeout_must_be_positive(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(
        capsys, "erase", "--identity", "a", "--state-dir", str(tmp_path), "--timeout", "0"
    )
    assert code == 2 and err == "activememory: error: --timeout: expected seconds > 0, got 0\n"


def test_a_readonly_memory_never_serves(tmp_path: Path) -> None:
    import activememory as am

    state = tmp_path / "state"
    assert main(["import", str(sample()), "--state-dir", str(state)]) == 0

    async def run() -> bool:
        async with am.open_memory(state, readonly=True):
            return Spool(state).served()

    assert trio.run(run) is False


def sample() -> Path:
    import importlib.resources

    return Path(str(importlib.resources.files("activememory") / "data" / "sample-alice.jsonl"))
