"""`activememory records add|search|link|invalidate` (docs/design.md §5), through `main`; on
both stores (`storage`, tests/pg_server.py: `--storage DSN` for PostgreSQL)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from activememory._cli import main

from pg_server import pg_memory_dsn, storage

__all__ = ["pg_memory_dsn", "storage"]
STORAGE: list[str] = []
"""`--storage DSN` while a test runs on PostgreSQL (`on_store`), appended to every command."""


def on_store(monkeypatch: pytest.MonkeyPatch, storage: str | None) -> None:
    if storage is not None:
        monkeypatch.setattr(sys.modules[__name__], "STORAGE", ["--storage", storage])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, *STORAGE])
    out, err = capsys.readouterr()
    return code, out, err


def add(capsys: pytest.CaptureFixture[str], state: Path, content: str, *scope: str) -> str:
    code, out, err = run(capsys, "records", "add", content, *scope, "--state-dir", str(state))
    assert code == 0, err
    return out.strip()


def search(capsys: pytest.CaptureFixture[str], state: Path, *argv: str) -> list[dict[str, object]]:
    code, out, err = run(capsys, "records", "search", *argv, "--state-dir", str(state), "--json")
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


def contents(results: list[dict[str, object]]) -> list[str]:
    return sorted(r["record"]["content"] for r in results)  # type: ignore[index]


def test_records_at_each_scope_layer(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    storage: str | None,
) -> None:
    on_store(monkeypatch, storage)
    state = tmp_path / "s"
    seat = add(capsys, state, "dana likes aisle seats", "--user", "dana")
    trip = add(capsys, state, "dana flies to Lisbon", "--user", "dana", "--agent", "main",
               "--thread", "t1")  # fmt: skip
    add(capsys, state, "bo prefers window seats", "--user", "bo")
    code, out, _ = run(capsys, "records", "add", "seat map of the plane", "--no-user",
                       "--type", "document", "--metadata", '{"deck": "upper"}',
                       "--state-dir", str(state), "--json")  # fmt: skip
    assert code == 0
    assert json.loads(out)["record_type"] == "document"
    assert json.loads(out)["metadata"] == {"deck": "upper"}

    # client: one exact user; store: every user unless a dimension is named exactly.
    assert contents(search(capsys, state, "seats", "--user", "dana")) == ["dana likes aisle seats"]
    assert contents(search(capsys, state, "seats OR seat", "--layer", "store")) == [
        "bo prefers window seats",
        "dana likes aisle seats",
        "seat map of the plane",
    ]
    assert contents(search(capsys, state, "seat", "--layer", "store", "--no-user",
                           "--exact-user")) == ["seat map of the plane"]  # fmt: skip
    assert contents(search(capsys, state, "seat", "--layer", "store", "--type", "document")) == [
        "seat map of the plane"
    ]
    assert contents(search(capsys, state, "seat", "--layer", "store", "--where",
                           '{"deck": "upper"}')) == ["seat map of the plane"]  # fmt: skip
    # thread: exactly its user and agent; its own thread ranks first, others still found.
    thread = ["--layer", "thread", "--user", "dana", "--agent", "main", "--thread", "t1"]
    assert contents(search(capsys, state, "dana", *thread)) == ["dana flies to Lisbon"]
    assert contents(search(capsys, state, "dana", "--user", "dana")) == [
        "dana flies to Lisbon",
        "dana likes aisle seats",
    ]

    code, out, _ = run(capsys, "records", "link", trip, seat, "--relation", "about",
                       "--state-dir", str(state))  # fmt: skip
    assert (code, out) == (0, f"{trip} -about-> {seat}\n")
    (found,) = search(capsys, state, "Lisbon", "--user", "dana", "--hops", "1")
    assert found["linked"] == [
        {
            "relation": {"relation": "about", "source_id": trip, "target_id": seat},
            "result": {"distance": None, "record": found["linked"][0]["result"]["record"],  # type: ignore[index]
                       "linked": []},
        }
    ]  # fmt: skip
    code, out, _ = run(capsys, "records", "search", "Lisbon", "--user", "dana", "--hops", "1",
                       "--state-dir", str(state))  # fmt: skip
    assert code == 0 and "dana flies to Lisbon" in out and "-about->" in out

    code, out, _ = run(capsys, "records", "invalidate", trip, "--reason", "trip cancelled",
                       "--state-dir", str(state))  # fmt: skip
    assert (code, out) == (0, f"{trip} invalid: trip cancelled\n")
    (found,) = search(capsys, state, "Lisbon", "--user", "dana")
    assert found["record"]["status"] == "invalid"  # type: ignore[index]
    assert search(capsys, state, "Lisbon", "--user", "dana", "--valid-only") == []
    code, out, _ = run(capsys, "records", "search", "zebra", "--user", "dana",
                       "--state-dir", str(state))  # fmt: skip
    assert (code, out) == (0, "no matches\n")
    assert (state / "records.db").exists() == (storage is None)  # PostgreSQL: the server's


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["search", "x"], "--user: required; client searches need an exact user scope"
         " (use --layer store to search across users)"),
        (["search", "x", "--user", "d", "--hops", "9"], "--hops: 9 is not an integer from 0 to 5"),
        (["add", " ", "--user", "d"], "CONTENT: must not be blank"),
        (["add", "x", "--user", ""], "--user: expected an id (1 to 256 characters, no control"
         " characters) or None, got ''"),
        (["add", "x", "--metadata", "[1"], "--metadata: not JSON (Expecting ',' delimiter at"
         " column 3)"),
        (["add", "x", "--metadata", "[1]"], "--metadata: expected a JSON object, got list"),
        (["link", "abc", "def", "--relation", "about"], "SOURCE: no record 'abc'"),
        (["invalidate", "f" * 32, "--reason", "x"], "ID: no record '" + "f" * 32 + "'"),
    ],
)  # fmt: skip
def test_errors_name_the_argument(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    storage: str | None,
    argv: list[str],
    error: str,
) -> None:
    on_store(monkeypatch, storage)
    state = tmp_path / "s"
    add(capsys, state, "something", "--user", "d")
    code, _, err = run(capsys, "records", *argv, "--state-dir", str(state))
    assert (code, err) == (2, f"activememory: error: {error}\n")


def test_search_needs_an_existing_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "typo"
    code, _, err = run(capsys, "records", "search", "x", "--user", "d", "--state-dir", str(missing))
    assert (code, err) == (2, f"activememory: error: --state-dir: '{missing}' does not exist\n")
    assert not missing.exists()
