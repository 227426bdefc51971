"""The command line on PostgreSQL (docs/design.md §11): `--storage DSN`, or the config file's
`storage` section, on every command that opens a memory."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from activememory._cli import _parser, main

from pg_server import empty_store, pg_memory_dsn, scratch_database

__all__ = ["pg_memory_dsn"]
ALICE = "agent:main:direct:alice"
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
# Commands that open a memory but not through `open_store` (their own modules' options).
OWN_OPTIONS = {"demo"}  # its own fresh state directory, always SQLite


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, list[str]]:
    """Every (sub)command's option strings, by its name ("records add", ...)."""
    found: dict[str, list[str]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _commands(sub, f"{prefix}{name} ")
    if prefix:
        found[prefix.strip()] = [o for a in parser._actions for o in a.option_strings]
    return found


def test_every_command_with_a_state_dir_takes_storage() -> None:
    commands = _commands(_parser())
    opening = sorted(n for n, opts in commands.items() if "--state-dir" in opts)
    assert {"search", "history", "stats", "doctor", "recall", "sessions", "export", "erase",
            "import", "reindex", "serve", "records add", "records search"} <= set(opening)  # fmt: skip
    missing = [n for n in opening if "--storage" not in commands[n] and n not in OWN_OPTIONS]
    assert missing == []


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_commands_on_postgresql(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], pg_memory_dsn: str
) -> None:
    empty_store(pg_memory_dsn)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TEXT_ONLY))
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(
        '{"type": "message", "id": "1", "timestamp": 5,'
        ' "message": {"role": "user", "content": "I keep bees on the roof"}}\n'
    )
    # A state directory that never holds a store: everything is the server's.
    state = ["--state-dir", str(tmp_path / "s"), "--storage", pg_memory_dsn]
    code, out, err = run(capsys, "import", str(transcript), *state, "--session-key", ALICE)
    assert code == 0, err
    assert f"into {ALICE}" in out
    code, out, err = run(capsys, "records", "add", "alice keeps bees", "--user", "alice", *state)
    assert code == 0, err
    with_config = [*state, "--config", str(config)]
    code, out, err = run(capsys, "search", "bees", *state, "--caller", ALICE, "--json")
    assert code == 0, err
    assert [r["snippet"] for r in json.loads(out)["results"]] == ["I keep bees on the roof"]
    assert run(capsys, "history", ALICE, *state, "--json")[0] == 0
    assert run(capsys, "stats", *state, "--json")[1].count('"indexed_messages": 1') == 1
    code, out, err = run(capsys, "doctor", *with_config)
    assert "index:main: 1 sessions, 1/1 messages indexed" in out, err
    assert run(capsys, "recall", "what do I keep?", *with_config, "--session", ALICE)[0] == 0
    code, out, err = run(capsys, "sessions", *with_config, "--json")
    assert [s["key"] for s in json.loads(out)] == [ALICE], err
    code, out, err = run(capsys, "export", *with_config, "--identity", "alice")
    assert code == 0 and "I keep bees on the roof" in out and "alice keeps bees" in out, err
    code, out, err = run(capsys, "reindex", *state, "--json")
    assert code == 0, err
    code, out, err = run(capsys, "erase", *with_config, "--identity", "alice", "--dry-run")
    assert "records: would erase 1 records and 0 relations" in out, err
    code, out, err = run(capsys, "erase", *with_config, "--identity", "alice", "--json")
    assert code == 0 and json.loads(out)["records"]["records"] == 1, err
    # The writers made the state directory (for what it keeps beside the store), no store.
    assert not (tmp_path / "s/records.db").exists() and not (tmp_path / "s/agents").exists()


def test_the_config_files_storage_section_is_used(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.json"
    storage = {"backend": "postgresql", "dsn": "${AM_TEST_DSN}"}
    config.write_text(json.dumps({**TEXT_ONLY, "storage": storage}))
    state = ["--state-dir", str(tmp_path / "s"), "--config", str(config)]
    with scratch_database() as dsn:
        monkeypatch.setenv("AM_TEST_DSN", dsn)
        # No store on the server yet: a read command says so, naming the database.
        code, _, err = run(capsys, "sessions", *state)
        assert code == 2 and "holds no activememory store (no schema activememory)" in err
        on_server = ["--state-dir", str(tmp_path / "w"), "--storage", dsn]
        assert run(capsys, "records", "add", "bo likes tea", "--user", "bo", *on_server)[0] == 0
        code, out, err = run(capsys, "export", *state, "--identity", "bo")
        assert code == 0 and "bo likes tea" in out, err
        # `--storage sqlite` wins over the config: the state directory must hold a store.
        code, _, err = run(capsys, "sessions", *state, "--storage", "sqlite")
        assert code == 2 and err.startswith("activememory: error: --state-dir: ")
    assert not (tmp_path / "s").exists()


def test_a_chat_on_postgresql_is_stored_there(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    pg_memory_dsn: str,
) -> None:
    empty_store(pg_memory_dsn)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(TEXT_ONLY))
    state = ["--state-dir", str(tmp_path / "s"), "--storage", pg_memory_dsn]
    monkeypatch.setattr("sys.stdin", io.StringIO("I keep bees on the roof\n/quit\n"))
    code, _, err = run(capsys, "chat", *state, "--config", str(config), "--session", ALICE)
    assert code == 0, err
    code, out, err = run(capsys, "search", "bees", *state, "--caller", ALICE, "--json")
    found = {r["snippet"] for r in json.loads(out)["results"]}
    assert found == {"I keep bees on the roof", 'You said: "I keep bees on the roof"'}, err
    assert not (tmp_path / "s/agents").exists()  # nothing of it in the state directory
