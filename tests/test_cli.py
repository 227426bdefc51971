"""The command line: the README's demo, JSONL import with line-numbered errors, --json output."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from activememory._cli import _parser, main
from activememory.simulations.bench import BENCHMARKS


def test_demo_runs_the_bot_path_offline(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["demo", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "agent:main:direct:alice: 7 events (direct, unindexed)" in out
    assert "index rebuilt: 7 user/assistant messages" in out
    # Recalled from the other private chat, and from the memory note:
    assert "told: The user always books an aisle seat" in out
    assert "told: The user is allergic to peanuts" in out
    assert "🧩 Active Memory: status=ok" in out and "🔎 Active Memory Debug:" in out
    assert "🧩 Active Memory: status=no_relevant_memory" in out  # "thanks!"
    assert "status skipped: chat type group is not in allowedChatTypes" in out
    # The same memories asked in other words: recalled by meaning (the shipped embedder).
    asked = out.split("What time is the club meeting on Thursday?")[1]
    eat, seat = asked.split("Any seat preference for my flight?")
    assert "[agent:main:explicit:portal-7] user: Is there anything I must not eat?" in eat
    assert "told: The user is allergic to peanuts, so no peanut snacks please." in eat
    assert "told: The user always books an aisle seat, by the way." in seat
    assert asked.count("🧩 Active Memory: status=ok") == 2
    assert "[FAIL]" not in out
    assert main(["stats", "--state-dir", str(tmp_path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert [
        (
            s["agent"],
            s["sessions"],
            s["indexed_messages"],
            s["dirty_sessions"],
            s["fts_integrity_ok"],
        )
        for s in stats
    ] == [("main", 3, 19, 0, True)]


def test_import_then_history(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(
        '{"type": "message", "id": "1", "timestamp": 5, "message": {"role": "user", "content": "hello there"}}\n'
        '{"type": "message", "id": "2", "timestamp": "2026-01-01T00:00:00", "message": {"role": "assistant", "content": "hi"}}\n'
    )
    state = str(tmp_path / "state")
    assert (
        main(
            [
                "import",
                str(transcript),
                "--state-dir",
                state,
                "--session-key",
                "agent:main:direct:z",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out) == [
        {
            "path": str(transcript),
            "session_key": "agent:main:direct:z",
            "events": 2,
            "skipped": False,
        }
    ]
    assert main(["history", "agent:main:direct:z", "--state-dir", state, "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    assert [(e["message"]["role"], e["message"]["content"], e["timestamp"]) for e in events] == [
        ("user", "hello there", 5.0),
        ("assistant", "hi", 1767225600.0),
    ]


@pytest.mark.parametrize(
    ("line", "error"),
    [
        ('{"type": "message", "id": "1", "timestamp": 1, "message": {"role": "bot", "content": "x"}}',
         "t.jsonl:2: message: Message.role: 'bot' is not one of 'user', 'assistant', 'tool'"),
        ('{"type": "message", "id": "1", "timestamp": "yesterday", "message": {"role": "user", "content": "x"}}',
         "t.jsonl:2: timestamp 'yesterday' is neither epoch seconds nor ISO 8601"),
        ('{"type": "message", "id": "1", "ts": 1, "message": {"role": "user", "content": "x"}}',
         "t.jsonl:2: Object contains unknown field `ts`"),
        ('{"type": "note"}', "t.jsonl:2: Invalid value 'note' - at `$.type`"),
        ("{not json", "t.jsonl:2: JSON is malformed: object keys must be strings (byte 1)"),
    ],
)  # fmt: skip
def test_import_errors_name_file_and_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, line: str, error: str
) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text('{"type": "session", "key": "agent:main:main"}\n' + line + "\n")
    assert main(["import", str(transcript), "--state-dir", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == f"activememory: error: {tmp_path}/{error}\n"


def test_search_human_and_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(
        '{"type": "session", "key": "agent:main:direct:z"}\n'
        '{"type": "message", "id": "1", "timestamp": 5, "message": {"role": "user", "content": "my token is sk-abcdefghijklmnopqrstuvwx and I like tea"}}\n'
        '{"type": "message", "id": "2", "timestamp": 6, "message": {"role": "assistant", "content": "Noted: tea."}}\n'
    )
    state = str(tmp_path / "state")
    # Imported without an index: the search says so, and --wait lets the rebuild finish.
    assert main(["import", str(transcript), "--state-dir", state, "--no-rebuild"]) == 0
    capsys.readouterr()
    args = ["search", "tea", "--state-dir", state, "--caller", "agent:main:direct:z"]
    assert main([*args, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["results"] == [] and first["indexing"] and "retry" in first["warning"]
    assert main([*args, "--json", "--wait"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [r["message_id"] for r in answer["results"]] == [2, 1]
    assert not answer["indexing"] and answer["warning"] is None
    assert "sk-abcdefghijklmnopqrstuvwx" not in json.dumps(answer)
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "agent:main:direct:z  #2" in out and "Noted: tea." in out
    assert "sk-abcdefghijklmnopqrstuvwx" not in out
    assert main([*args, "--limit", "26"]) == 2
    assert "limit: 26 is not an integer from 1 to 25" in capsys.readouterr().err


COMMANDS = next(
    action.choices
    for action in _parser()._actions
    if isinstance(action, argparse._SubParsersAction)
)


@pytest.mark.parametrize(
    "command",
    [[], *[[name] for name in COMMANDS], *[["bench", name] for name in BENCHMARKS]],
    ids=lambda command: " ".join(command) or "activememory",
)
def test_help_reads_without_a_document_outside_the_package(
    command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # A user of the installed package has neither the design document nor any other: help
    # must stand on its own (no section numbers, no outside spec).
    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: activememory")
    assert "§" not in text and "SPEC" not in text and "design.md" not in text


def run_into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run `activememory ARGS` with stdout a pipe whose reader is already gone (`| head`)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "activememory", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)


def test_a_closed_pipe_ends_quietly(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(
        '{"type": "message", "id": "1", "timestamp": 5, "message": {"role": "user", "content": "hello"}}\n'
    )
    state = str(tmp_path / "state")
    key = "agent:main:direct:z"
    assert main(["import", str(transcript), "--state-dir", state, "--session-key", key]) == 0
    capsys.readouterr()
    done = run_into_a_closed_pipe("history", key, "--state-dir", state)
    assert (done.returncode, done.stderr) == (1, "")  # no traceback; 1 is Python's EPIPE status


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"activememory {importlib.metadata.version('activememory')}\n"
