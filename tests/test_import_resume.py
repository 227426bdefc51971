"""`activememory import` survives interruption (docs/design.md §2.5), names the file and line
of every bad input, and `reindex` rebuilds the index through the reconciler (§2.4).

The crash test runs the real command in a child process, kills it with SIGKILL while it
imports and again while it rebuilds, re-runs it, and compares the state directory with
one an uninterrupted import made.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import apsw
import pytest

import activememory as am
from activememory._cli import main
from activememory._importers import read_jsonl_transcript

from fake_embedder import FakeEmbedder
from index_probe import agent_db, connect, indexed_tokens, tokenize

FILES = 6
ROWS = 800  # per file: each session's import is a transaction long enough to kill in between
KILL_TIMEOUT = 30.0


def message_line(i: int, text: str, **extra: object) -> str:
    role = "user" if i % 2 == 0 else "assistant"
    line = {"type": "message", "id": f"m{i}", "timestamp": 1_700_000_000 + i}
    return json.dumps({**line, **extra, "message": {"role": role, "content": text}})


def write_transcript(path: Path, key: str, rows: int, word: str = "tea") -> Path:
    lines = [json.dumps({"type": "session", "key": key})]
    lines += [message_line(i, f"{word} {key} message {i}") for i in range(rows)]
    # A second branch from the first message; the leaf stays on the main line.
    lines.append(message_line(rows, f"{word} side branch", parentId="m0"))
    lines.append(json.dumps({"type": "leaf", "id": f"m{rows - 1}"}))
    path.write_text("\n".join(lines) + "\n")
    return path


def transcripts(folder: Path, files: int = FILES, rows: int = ROWS) -> list[Path]:
    folder.mkdir()
    return [
        write_transcript(folder / f"peer{n}.jsonl", f"agent:main:direct:peer{n}", rows)
        for n in range(files)
    ]


def dump(state: Path) -> dict[str, object]:
    """What a state directory holds, by session key and seq (ids and revisions aside)."""
    conn = connect(agent_db(state))
    try:
        sessions = {int(sid): str(key) for sid, key in conn.execute("SELECT id, key FROM sessions")}
        seq_of = {
            int(eid): (sessions[int(sid)], int(seq))
            for eid, sid, seq in conn.execute("SELECT id, session_id, seq FROM events")
        }
        out: dict[str, object] = {
            "sessions": sorted(
                (sessions[int(row[0])], *row[1:])
                for row in conn.execute(
                    "SELECT id, persistent, interactive, archived, dirty, leaf_depth, next_seq,"
                    " indexed_seq FROM sessions"
                )
            ),
            "events": sorted(
                (*seq_of[int(eid)], None if parent is None else seq_of[int(parent)], *rest)
                for eid, parent, *rest in conn.execute(
                    "SELECT id, parent_id, depth, ts, kind, role, content, text FROM events"
                )
            ),
            "branches": sorted(
                (sessions[int(sid)], int(depth), seq_of[int(eid)])
                for sid, depth, eid in conn.execute("SELECT * FROM active_branch")
            ),
            "leaves": sorted(
                (str(key), seq_of[int(leaf)])
                for key, leaf in conn.execute("SELECT key, leaf_event_id FROM sessions")
            ),
        }
    finally:
        conn.close()
    out["index"] = sorted(
        (seq_of[rowid], tuple(tokens)) for rowid, tokens in indexed_tokens(agent_db(state)).items()
    )
    return out


def stored(state: Path) -> tuple[int, int]:
    """(sessions with messages, of them dirty), read beside the writer; (0, 0) before it starts."""
    try:
        conn = apsw.Connection(str(agent_db(state)), flags=apsw.SQLITE_OPEN_READONLY)
    except apsw.CantOpenError:
        return 0, 0
    try:
        conn.set_busy_timeout(1000)
        row = conn.execute(
            "SELECT count(*), coalesce(sum(dirty), 0) FROM sessions WHERE leaf_event_id IS NOT NULL"
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)
    except apsw.SQLError:  # the schema is not there yet
        return 0, 0
    finally:
        conn.close()


def import_killed_when(argv: list[str], state: Path, ready: object) -> int:
    """Run `activememory import` in a child; SIGKILL it once `ready(stored(state))` holds.

    Returns the child's return code (-SIGKILL if the kill landed, 0 if it finished first).
    """
    child = subprocess.Popen(
        [sys.executable, "-m", "activememory", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + KILL_TIMEOUT
    try:
        while child.poll() is None and time.monotonic() < deadline:
            if ready(stored(state)):  # type: ignore[operator]
                child.send_signal(signal.SIGKILL)
                break
            time.sleep(0.001)
        child.wait(timeout=KILL_TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.stderr is not None
    err = child.stderr.read().decode()
    child.stderr.close()
    assert child.returncode in (0, -signal.SIGKILL), err
    return child.returncode


@pytest.mark.slow
def test_an_import_killed_midway_resumes_to_what_an_uninterrupted_one_stores(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [str(path) for path in transcripts(tmp_path / "files")]
    reference, state = tmp_path / "reference", tmp_path / "state"
    assert main(["import", *files, "--state-dir", str(reference)]) == 0
    capsys.readouterr()
    argv = ["import", *files, "--state-dir", str(state)]

    # Killed while importing: some sessions are stored (dirty), the rest are not.
    code = import_killed_when(argv, state, lambda s: s[0] >= 1)
    sessions, dirty = stored(state)
    assert code == -signal.SIGKILL and 1 <= sessions < FILES and dirty == sessions
    # The index holds nothing of them; a search pokes the reconciler, which rebuilds them.
    assert indexed_tokens(agent_db(state)) == {}
    search = ["search", "tea", "--state-dir", str(state), "--caller", "agent:main:direct:peer0"]
    assert main([*search, "--json", "--wait"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["results"] and not found["indexing"]

    # Killed again, this time while it rebuilds (if it gets there first, it finished).
    import_killed_when(argv, state, lambda s: s == (FILES, s[1]) and 0 < s[1] < FILES)

    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == FILES and all(line.startswith("skipped ") for line in out[:sessions])
    assert dump(state) == dump(reference)


def test_a_re_run_skips_what_it_imported_and_names_the_line_that_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_transcript(tmp_path / "a.jsonl", "agent:main:direct:a", 3)
    b = write_transcript(tmp_path / "b.jsonl", "agent:main:direct:b", 3)
    state = str(tmp_path / "state")
    assert main(["import", str(a), str(b), "--state-dir", state]) == 0
    first = capsys.readouterr()
    assert first.out.splitlines() == [
        f"imported 4 events from {a} into agent:main:direct:a",
        f"imported 4 events from {b} into agent:main:direct:b",
    ]
    # Not a terminal: no live progress, one summary line.
    assert len(first.err.splitlines()) == 1
    assert first.err.startswith("import: 2/2 files, 2 sessions, 8 rows in ")
    assert first.err.endswith(" rows/s); 6 messages indexed\n")

    assert main(["import", str(a), str(b), "--state-dir", state, "--json"]) == 0
    again = capsys.readouterr()
    assert [(item["session_key"], item["skipped"]) for item in json.loads(again.out)] == [
        ("agent:main:direct:a", True),
        ("agent:main:direct:b", True),
    ]
    assert again.err.startswith("import: 2/2 files, 2 sessions (2 already there), 0 rows in ")
    assert again.err.endswith(" rows/s)\n")  # nothing left to index

    lines = b.read_text().splitlines()
    lines[2] = lines[2].replace("message 1", "message one")  # line 3: the second message
    b.write_text("\n".join(lines) + "\n")
    assert main(["import", str(a), str(b), "--state-dir", state]) == 2
    assert capsys.readouterr().err == (
        f"activememory: error: {b}:3: session 'agent:main:direct:b' already holds other messages"
        " (stored event #6 differs in its content); import into a new session\n"
    )


@pytest.mark.anyio
async def test_resume_skips_a_session_that_went_on_and_refuses_one_that_differs(
    tmp_path: Path,
) -> None:
    key = "agent:main:direct:alice"
    path = write_transcript(tmp_path / "t.jsonl", key, 4)
    transcript = read_jsonl_transcript(path)
    async with am.open_memory(tmp_path / "s") as mem:
        imported = await mem.sessions.import_transcript(
            key, transcript.entries, leaf_id=transcript.leaf_id, resume=True
        )
        assert imported == 5
        # The bot went on after the import: the file's messages are still its first ones.
        await mem.sessions.append(key, am.Message(role="user", content="later"))
        again = await mem.sessions.import_transcript(
            key, transcript.entries, leaf_id=transcript.leaf_id, resume=True
        )
        assert again == 0
        with pytest.raises(am.InvalidInputError, match="already has messages"):
            await mem.sessions.import_transcript(key, transcript.entries)
        # The same messages with another leaf, into a session holding just them.
        other = "agent:main:direct:bob"
        await mem.sessions.import_transcript(other, transcript.entries, leaf_id="m3")
        with pytest.raises(am.InvalidInputError) as leaf:
            await mem.sessions.import_transcript(other, transcript.entries, resume=True)
        assert str(leaf.value).startswith(
            f"leaf_id: session {other!r} holds these messages but its leaf is event #"
        )
        # A longer file than what is stored: the first line it lacks is named.
        longer = write_transcript(tmp_path / "longer.jsonl", key, 6)
        entries = read_jsonl_transcript(longer).entries
        with pytest.raises(am.InvalidInputError) as short:
            await mem.sessions.import_transcript(key, entries, resume=True)
        assert str(short.value) == (
            f"{longer}:6: session {key!r} already holds other messages (stored event #5"
            " differs in its place in the tree); import into a new session"
        )
        # Timestamps count: a file stamped otherwise is not the stored one.
        moved = [
            am.ImportEntry(
                id=e.id, parent_id=e.parent_id, timestamp=e.timestamp + 1, message=e.message
            )
            for e in transcript.entries
        ]
        with pytest.raises(am.InvalidInputError, match=r"^entries\[0\]: .* its timestamp\)"):
            await mem.sessions.import_transcript(key, moved, resume=True)


HEADER = '{"type": "session", "key": "agent:main:main"}'


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (f'{message_line(0, "x")}\n{message_line(0, "y")}',
         "t.jsonl:3: id 'm0' is repeated (first at line 2)"),
        (message_line(0, "x", parentId="m9"),
         "t.jsonl:2: parentId 'm9' names no earlier message line"),
        (f'{message_line(0, "x")}\n\n{{"type": "leaf", "id": "m7"}}',
         "t.jsonl:4: leaf id 'm7' names no message line"),
        (message_line(0, "x") + '\n{"type": "message", "id": "m1", "message": {"role": "user", "content": "y"}}',
         "t.jsonl:3: Object missing required field `timestamp`"),
    ],
)  # fmt: skip
def test_tree_errors_name_the_file_and_line_before_anything_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, body: str, error: str
) -> None:
    (tmp_path / "t.jsonl").write_text(f"{HEADER}\n{body}\n")
    state = tmp_path / "s"
    assert main(["import", str(tmp_path / "t.jsonl"), "--state-dir", str(state)]) == 2
    assert capsys.readouterr().err == f"activememory: error: {tmp_path}/{error}\n"
    assert stored(state) == (0, 0)


def test_binary_garbage_names_the_line_and_the_byte(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(f"{HEADER}\n{message_line(0, 'x')}\n".encode() + b'{"t\xff\xfe\x00garbage\n')
    assert main(["import", str(path), "--state-dir", str(tmp_path / "s")]) == 2
    assert capsys.readouterr().err == (
        f"activememory: error: {path}:3: not UTF-8 text (byte 0xff at byte 3)\n"
    )


def test_a_byte_order_mark_is_accepted_and_a_line_separator_is_not_a_line_break(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "t.jsonl"
    text = "one\u2028two"  # JSON may hold U+2028 unescaped; it is no line break in JSONL
    path.write_bytes(b"\xef\xbb\xbf" + f"{HEADER}\n{message_line(0, 'x')}\n".encode()
                     + json.dumps({"type": "message", "id": "m1", "timestamp": 2,
                                   "message": {"role": "user", "content": text}},
                                  ensure_ascii=False).encode() + b"\n")  # fmt: skip
    state = str(tmp_path / "s")
    assert main(["import", str(path), "--state-dir", state]) == 0
    assert capsys.readouterr().out == f"imported 2 events from {path} into agent:main:main\n"
    assert main(["history", "agent:main:main", "--state-dir", state, "--json"]) == 0
    history = json.loads(capsys.readouterr().out)
    assert [e["message"]["content"] for e in history] == ["x", text]


# -- reindex ----------------------------------------------------------------------------


def expected_index(db: Path) -> dict[int, list[str]]:
    conn = connect(db)
    try:
        rows = conn.execute(
            "SELECT e.id, e.text FROM active_branch a JOIN events e ON e.id = a.event_id"
            " WHERE e.text IS NOT NULL"
        ).fetchall()
    finally:
        conn.close()
    return {int(i): tokenize(str(t)) for i, t in rows}


def damage_index(db: Path) -> None:
    """Lose one message's index row and add one for no message, behind the library's back."""
    conn = connect(db)
    try:
        (first,) = conn.execute("SELECT min(rowid) FROM message_fts").fetchone() or (0,)
        conn.execute("DELETE FROM message_fts WHERE rowid = ?", (first,))
        conn.execute(
            "INSERT INTO message_fts(rowid, words, grams, context) VALUES (999999, 'ghost', '', '')"
        )
    finally:
        conn.close()


def test_reindex_rebuilds_a_damaged_index_and_names_what_it_cannot_find(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = transcripts(tmp_path / "files", files=3, rows=300)
    state = tmp_path / "state"
    assert main(["import", *map(str, files), "--state-dir", str(state)]) == 0
    db = agent_db(state)
    good = indexed_tokens(db)
    assert good == expected_index(db)
    damage_index(db)
    assert indexed_tokens(db) != good

    capsys.readouterr()
    assert main(["reindex", "--state-dir", str(state), "--json"]) == 0
    [stats] = json.loads(capsys.readouterr().out)
    assert (stats["agent"], stats["indexed_messages"], stats["dirty_sessions"]) == ("main", 900, 0)
    assert stats["fts_integrity_ok"] and indexed_tokens(db) == good

    # One session: only it is marked and rebuilt.
    assert main(["reindex", "--state-dir", str(state), "--session", "agent:main:direct:peer1"]) == 0
    assert "main   3         " in capsys.readouterr().out
    assert indexed_tokens(db) == good

    assert main(["reindex", "--state-dir", str(state), "--agent", "ops"]) == 2
    assert capsys.readouterr().err == (
        "activememory: error: agent: 'ops' has no database here (agents: main)\n"
    )
    missing = ["reindex", "--state-dir", str(state), "--session", "agent:main:direct:nobody"]
    assert main(missing) == 2
    assert capsys.readouterr().err == (
        "activememory: error: session_key: no session 'agent:main:direct:nobody'\n"
    )


@pytest.mark.anyio
async def test_reindex_keeps_vectors_in_step_and_reports_progress(tmp_path: Path) -> None:
    from test_vectors import expected, settle, vectors

    embedder = FakeEmbedder()
    state = tmp_path / "s"
    key = "agent:main:direct:alice"
    async with am.open_memory(state, embedder=embedder) as mem:
        for i in range(40):
            await mem.sessions.append(key, am.Message(role="user", content=f"tea number {i}"))
        await mem.sessions.append("agent:main:main", am.Message(role="user", content="coffee"))
        await settle(mem)
        before = vectors(state)
        calls = embedder.calls
        seen: list[am.IndexStats] = []
        with anyio.fail_after(30):
            [stats] = await mem.sessions.reindex(agent="main", progress=seen.append)
        assert stats.dirty_sessions == 0 and stats.indexed_messages == 41
        assert seen and seen[-1].dirty_sessions == 0 and seen[0].agent == "main"
        await settle(mem)
        # Every indexed message has its vector again, from the content-hash cache.
        assert vectors(state) == before == expected(state, embedder.name)
        assert embedder.calls == calls
        with pytest.raises(am.SessionNotFoundError):
            await mem.sessions.reindex("agent:main:direct:nobody")
        with pytest.raises(am.SessionNotFoundError):  # and no database is made for it
            await mem.sessions.reindex("agent:ops:main")
        assert not (state / "agents" / "ops").exists()
        with pytest.raises(am.InvalidInputError, match="^agent: 'ops' has no database here"):
            await mem.sessions.reindex(key, agent="ops")
