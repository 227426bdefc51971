"""The memory-core tools over memory notes (docs/design.md §4.7): `memory_search` and `memory_get`.

Notes are `MEMORY.md` and `memory/*.md` in the agent workspace; a person edits them and the
index follows. Every storage test runs on trio and asyncio, with the thread and the inline
executor. Each test body is bounded (`bounded`) so a hang fails instead of stalling.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, ParamSpec

import anyio
import apsw
import msgspec
import pytest
import trio.testing

import activememory as am
from activememory._redaction import Redactor
from activememory.protocol.config import SINGLE_OWNER, PrivateScope
from activememory.protocol.indexer import NoteChunk, NoteFile, SyncNotes
from activememory.protocol.recall import ToolResult
from activememory.protocol.session_key import parse_session_key
from activememory.recall import memory_core as _memory_core
from activememory.recall.memory_core import MemoryCore, redact_lines
from activememory.recall.tools import RecallTools
from activememory.storage import transcripts
from activememory.storage.notes import chunk_note, note_lines, notes_integrity_ok

from pg_server import pg_memory_dsn, sqlite_only, storage

__all__ = ["pg_memory_dsn", "storage"]  # both stores: the memory-notes tools are the API's
pytestmark = pytest.mark.anyio

P = ParamSpec("P")
CALLER = parse_session_key("agent:main:direct:alice")
KEY = "sk-abc123DEF456ghi789JKL012mno345pqrWXYZ"
PAST_NS = 1_600_000_000 * 10**9  # 2020: no file written by a test is "just written"
# These tests edit and search at once: each search rescans (`RESCAN_S` 0, below) instead of
# the notes watcher's debounce (tests/test_notes_watcher.py).
NO_WATCH = {"agents": {"defaults": {"memorySearch": {"sync": {"watch": False}}}}}


def bounded(test: Callable[P, Awaitable[None]]) -> Callable[P, Awaitable[None]]:
    """Fail a test that runs longer than 30 s (of the loop's clock) instead of hanging."""

    @functools.wraps(test)
    async def run(*args: P.args, **kwargs: P.kwargs) -> None:
        with anyio.fail_after(30):
            await test(*args, **kwargs)

    return run


@pytest.fixture
async def mem(tmp_path: Path, executor: str, storage: str | None) -> AsyncIterator[am.Memory]:
    async with am.open_memory(
        tmp_path / "state",
        config=NO_WATCH,
        executor=executor,  # type: ignore[arg-type]
        storage=storage,
    ) as memory:
        yield memory


@pytest.fixture
def core(mem: am.Memory) -> MemoryCore:
    return MemoryCore(mem._supervisor, mem.sessions._search, lambda: mem._settings)


@pytest.fixture(autouse=True)
def always_rescan(monkeypatch: pytest.MonkeyPatch) -> None:
    # Most tests edit and search at once; the throttle has tests of its own below.
    monkeypatch.setattr(_memory_core, "RESCAN_S", 0.0)


def workspace(mem: am.Memory, agent: str = "main") -> Path:
    return mem.state_dir / "agents" / agent / "workspace"


def write(mem: am.Memory, rel: str, text: str, *, past: bool = False) -> Path:
    path = workspace(mem) / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    if past:
        os.utime(path, ns=(PAST_NS, PAST_NS))
    return path


def scope(transcripts: bool) -> PrivateScope | None:
    # These tests are about the boundary every caller has; whose sessions: tests/test_privacy.py.
    return SINGLE_OWNER if transcripts else None


async def search(
    core: MemoryCore, query: str, *, transcripts: bool = False, **args: Any
) -> dict[str, Any]:
    result = await core.search(
        "main", {"query": query, **args}, caller=CALLER, transcripts=scope(transcripts)
    )
    assert result.data is not None
    assert json.loads(result.content) == result.data
    data: dict[str, Any] = dict(result.data)
    assert result.evidence == (data["hits"] > 0)
    return data


async def paths(core: MemoryCore, query: str, **kw: Any) -> list[str]:
    return [r["path"] for r in (await search(core, query, **kw))["results"]]


async def get(
    core: MemoryCore,
    path: str,
    args: dict[str, Any] | None = None,
    *,
    transcripts: bool = False,
) -> ToolResult:
    return await core.get(
        "main", {"path": path, **(args or {})}, caller=CALLER, transcripts=scope(transcripts)
    )


async def indexed_chunks(mem: am.Memory, storage: str | None) -> dict[str, int]:
    """The agent's indexed note chunks by path, read behind the library's back, after
    checking the index is whole: on SQLite FTS5's own check, on PostgreSQL every chunk
    belongs to an indexed file (storage/pg/notes.py)."""
    if storage is None:
        store = await mem._supervisor.agent("main")
        assert await store.read(lambda r: notes_integrity_ok(r.conn))
        sql = "SELECT path, count(*) FROM note_chunks GROUP BY path"
        return dict(await store.read(lambda r: r.conn.execute(sql).fetchall()))
    import psycopg

    with psycopg.connect(storage) as conn:
        orphans = conn.execute(
            "SELECT count(*) FROM activememory.note_chunks c WHERE c.agent = 'main' AND NOT"
            " EXISTS (SELECT 1 FROM activememory.note_files f WHERE f.agent = c.agent"
            " AND f.path = c.path)"
        ).fetchone()
        assert orphans == (0,)
        rows = conn.execute(
            "SELECT path, count(*) FROM activememory.note_chunks WHERE agent = 'main' GROUP BY path"
        ).fetchall()
    return {str(path): int(n) for path, n in rows}


def count_reads(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every note file read from now on."""
    reads: list[Path] = []
    real = _memory_core._read_bytes

    def counting(path: Path) -> bytes:
        reads.append(path)
        return real(path)

    monkeypatch.setattr(_memory_core, "_read_bytes", counting)
    return reads


# -- finding notes -----------------------------------------------------------------------


@bounded
async def test_notes_are_found_by_their_words_with_lines_and_debug_fields(
    mem: am.Memory, core: MemoryCore
) -> None:
    write(mem, "MEMORY.md", "# About the user\n\nPrefers tea over coffee.\n")
    write(mem, "memory/pets.md", "# Pets\n\nThe cat is called Miso.\nMiso likes tuna.\n")
    data = await search(core, "what is the cat called")
    assert data["results"] == [
        {
            "source": "memory",
            "path": "memory/pets.md",
            "startLine": 1,
            "endLine": 4,
            "score": 1.0,
            "snippet": "# Pets\n\nThe cat is called Miso.\nMiso likes tuna.",
        }
    ]
    assert (data["backend"], data["effectiveMode"], data["fallback"], data["hits"]) == (
        "builtin",
        "search",
        None,
        1,
    )
    assert isinstance(data["searchMs"], float)
    assert "indexing" not in data and "ignored" not in data
    assert await paths(core, "tea") == ["MEMORY.md"]
    assert await paths(core, "zebra") == []


@bounded
async def test_stemming_and_diacritics_work_as_for_transcripts(
    mem: am.Memory, core: MemoryCore
) -> None:
    write(mem, "memory/sport.md", "She was running two marathons in Zürich.\n")
    assert await paths(core, "run marathon") == ["memory/sport.md"]
    assert await paths(core, "zurich") == ["memory/sport.md"]


@bounded
async def test_cjk_words_are_found_inside_longer_runs(mem: am.Memory, core: MemoryCore) -> None:
    write(mem, "memory/trip.md", "去年東京に行きました。\n\n서울에서 김치찌개를 먹었다\n")
    for query in ("東京", "行き", "김치찌개"):
        assert await paths(core, query) == ["memory/trip.md"], query
    assert await paths(core, "大阪") == []


@bounded
async def test_max_results_and_best_first(mem: am.Memory, core: MemoryCore) -> None:
    for i in range(9):
        write(mem, f"memory/n{i}.md", "apple " * (1 + i % 3) + f"filler words {i}\n")
    data = await search(core, "apple", maxResults=4)
    assert data["hits"] == 4
    scores = [r["score"] for r in data["results"]]
    assert scores == sorted(scores, reverse=True) and scores[0] == 1.0
    assert (await search(core, "apple"))["hits"] == 6  # the default


# -- chunking ----------------------------------------------------------------------------


def test_chunks_split_at_headings_and_blank_lines_with_right_line_numbers() -> None:
    para = "\n".join(f"line {i} " + "x" * 60 for i in range(12))  # 12 lines, ~800 chars
    text = (
        "# Title\n"  # 1
        "intro\n"  # 2
        "\n"  # 3
        "## Pets\n"  # 4
        "Miso the cat.\n"  # 5
        "\n"  # 6
        "Rex the dog.\n"  # 7
        "\n"  # 8
        f"{para}\n"  # 9-20
        "\n" + "y" * 1500 + "\n"  # 21  # 22
        "```\n# not a heading\n```\n"  # 23-25
    )
    chunks = chunk_note(note_lines(text))
    got = [(c.start_line, c.end_line, c.heading) for c in chunks]
    assert got == [
        (1, 2, None),
        (4, 7, "Title"),
        (9, 18, "Title › Pets"),
        (19, 20, "Title › Pets"),
        (22, 22, "Title › Pets"),
        (22, 22, "Title › Pets"),
        (22, 22, "Title › Pets"),
        (23, 25, "Title › Pets"),
    ]
    assert chunks[1].text == "## Pets\nMiso the cat.\n\nRex the dog."
    assert all(len(c.text) <= 700 for c in chunks)
    assert "".join(c.text for c in chunks[4:7]) == "y" * 1500  # a long line cut, not lost
    lines = note_lines(text)
    for c in chunks:
        if c.start_line != 22:
            assert c.text == "\n".join(lines[c.start_line - 1 : c.end_line])


def test_line_numbers_follow_newlines_only() -> None:
    assert note_lines("a\r\nb\x0cc\u2028d\n\ne\n") == ["a", "b\x0cc\u2028d", "", "e"]
    assert note_lines("") == [] and note_lines("\n") == [""]


@bounded
async def test_search_gives_the_lines_of_a_chunk_deep_in_a_file(
    mem: am.Memory, core: MemoryCore
) -> None:
    body = "\n\n".join(f"## Day {i}\nNothing special happened." for i in range(1, 30))
    write(mem, "MEMORY.md", f"{body}\n\n## Day 30\nAdopted a ferret named Pip.\n")
    (hit,) = (await search(core, "ferret"))["results"]
    assert (hit["startLine"], hit["endLine"]) == (88, 89)
    got = await get(core, "MEMORY.md", {"from": 88, "lines": 2})
    assert got.data is not None and got.data["text"] == "## Day 30\nAdopted a ferret named Pip."


# -- the index follows the files -------------------------------------------------------


@bounded
async def test_edit_delete_and_add_are_followed(
    mem: am.Memory, core: MemoryCore, storage: str | None
) -> None:
    note = write(mem, "memory/pets.md", "The cat is called Miso.\n")
    assert await paths(core, "Miso") == ["memory/pets.md"]
    note.write_text("The cat is called Tofu now, after a long discussion.\n")
    assert await paths(core, "Miso") == []
    assert await paths(core, "Tofu") == ["memory/pets.md"]
    write(mem, "memory/garden.md", "Tomatoes and basil.\n")
    assert await paths(core, "basil") == ["memory/garden.md"]
    note.unlink()
    assert await paths(core, "Tofu") == []
    assert await core.sync_notes("main") == 0
    assert await indexed_chunks(mem, storage) == {"memory/garden.md": 1}


@bounded
async def test_same_size_edit_in_the_same_tick_is_caught(mem: am.Memory, core: MemoryCore) -> None:
    note = write(mem, "MEMORY.md", "colour: green\n")
    assert await paths(core, "green") == ["MEMORY.md"]
    stat = note.stat()
    note.write_text("colour: azure\n")  # same size; force the same mtime as well
    os.utime(note, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert await paths(core, "azure") == ["MEMORY.md"]
    assert await paths(core, "green") == []


@bounded
async def test_sync_notes_counts_changed_files_and_skips_touched_ones(
    mem: am.Memory, core: MemoryCore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(mem, "MEMORY.md", "one\n", past=True)
    write(mem, "memory/a.md", "two\n", past=True)
    assert await core.sync_notes("main") == 2
    assert await core.sync_notes("main") == 0
    reads = count_reads(monkeypatch)
    os.utime(workspace(mem) / "MEMORY.md", ns=(PAST_NS + 10**9, PAST_NS + 10**9))  # touch
    assert await core.sync_notes("main") == 0  # same content: only the stat is updated
    assert [p.name for p in reads] == ["MEMORY.md"]
    assert await core.sync_notes("main") == 0
    assert [p.name for p in reads] == ["MEMORY.md"]  # not read again
    (workspace(mem) / "memory" / "a.md").unlink()
    assert await core.sync_notes("main") == 1


@bounded
async def test_only_memory_md_and_memory_star_md_are_notes(
    mem: am.Memory, core: MemoryCore, tmp_path: Path
) -> None:
    for rel in (
        "memory/sub/deep.md",
        "other.txt",
        "other.md",
        "memory/notes.txt",
        "memory/.hidden.md",
        "memory.md",
    ):
        write(mem, rel, "kumquat\n")
    outside = tmp_path / "outside.md"
    outside.write_text("kumquat\n")
    (workspace(mem) / "memory" / "link.md").symlink_to(outside)
    (workspace(mem) / "memory" / "dir.md").mkdir()
    write(mem, "memory/real.md", "kumquat\n")
    data = await search(core, "kumquat")
    assert [r["path"] for r in data["results"]] == ["memory/real.md"]
    assert data["ignored"] == [
        {"path": "memory/link.md", "reason": "a link leading outside the workspace"}
    ]


@bounded
async def test_large_and_undecodable_files(mem: am.Memory, core: MemoryCore) -> None:
    write(mem, "memory/big.md", "kumquat " * (1024 * 1024 // 8 + 1))
    path = workspace(mem) / "memory" / "latin1.md"
    path.write_bytes("café kumquat \xff\n".encode("latin-1"))
    data = await search(core, "kumquat")
    assert [r["path"] for r in data["results"]] == ["memory/latin1.md"]
    assert data["results"][0]["snippet"] == "caf\ufffd kumquat \ufffd"
    assert data["ignored"] == [{"path": "memory/big.md", "reason": "larger than 1 MiB"}]
    got = await get(core, "memory/big.md")
    assert got.error == "path: 'memory/big.md' is larger than 1 MiB; it is ignored"


@bounded
async def test_missing_or_empty_workspace_has_no_notes(mem: am.Memory, core: MemoryCore) -> None:
    assert not workspace(mem).exists()
    assert await core.sync_notes("main") == 0
    result = await core.search("main", {"query": "anything"}, caller=CALLER, transcripts=None)
    assert result.evidence is False and result.data is not None
    assert (result.data["results"], result.data["hits"]) == ([], 0)
    workspace(mem).mkdir(parents=True)
    assert await paths(core, "anything") == []
    got = await get(core, "MEMORY.md")
    assert got.error == "path: no note 'MEMORY.md' in the workspace" and not got.evidence


@bounded
async def test_a_configured_workspace_is_used(tmp_path: Path, executor: str) -> None:
    config = {"agents": {"entries": {"main": {"workspace": "ws"}}}}
    async with am.open_memory(tmp_path / "s", config=config, executor=executor) as mem:  # type: ignore[arg-type]
        core = MemoryCore(mem._supervisor, mem.sessions._search, lambda: mem._settings)
        (tmp_path / "s" / "ws").mkdir()
        (tmp_path / "s" / "ws" / "MEMORY.md").write_text("kumquat\n")
        assert await paths(core, "kumquat") == ["MEMORY.md"]


# -- the rescan throttle, in virtual time ------------------------------------------------


@pytest.mark.parametrize(
    "anyio_backend",
    [pytest.param(("trio", {"clock": trio.testing.MockClock(autojump_threshold=0)}))],
)
async def test_without_the_watcher_edits_show_up_within_rescan_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_memory_core, "RESCAN_S", 1.0)
    with anyio.fail_after(30):
        async with am.open_memory(tmp_path / "s", config=NO_WATCH, executor="inline") as mem:
            core = MemoryCore(mem._supervisor, mem.sessions._search, lambda: mem._settings)
            start = anyio.current_time()
            note = write(mem, "MEMORY.md", "The cat is Miso.\n")
            assert await paths(core, "Miso") == ["MEMORY.md"]  # the first search scans
            note.write_text("The cat is Tofu, renamed.\n")
            await anyio.sleep(0.5)
            assert await paths(core, "Tofu") == []  # within RESCAN_S: no rescan yet
            await anyio.sleep(0.5)
            assert anyio.current_time() - start == 1.0
            assert await paths(core, "Tofu") == ["MEMORY.md"]
            assert await core.sync_notes("main") == 0  # an explicit sync always scans


# -- transcripts and the privacy boundary ------------------------------------------------


async def seed_conversations(mem: am.Memory) -> dict[str, int]:
    """The gate code in a note and in every kind of conversation; message ids by marker."""
    write(mem, "MEMORY.md", "# Work\n\nThe warehouse gate code changes monthly.\n")
    ids = {}
    for marker, key in {
        "mkbob": "agent:main:direct:bob",
        "mkportal": "agent:main:explicit:portal-9",
        "mkgroup": "agent:main:group:team",
        "mkcurrent": CALLER.raw,
        "mkother": "agent:ops:direct:alice",
    }.items():
        event = await mem.sessions.append(
            key, am.Message(role="user", content=f"The warehouse gate code is 4417, {marker}.")
        )
        ids[marker] = event.id
    return ids


@bounded
async def test_transcripts_are_merged_inside_the_private_scope(
    mem: am.Memory, core: MemoryCore
) -> None:
    ids = await seed_conversations(mem)
    data = await search(core, "warehouse gate code", transcripts=True)
    got = {r["path"]: r for r in data["results"]}
    assert set(got) == {
        "MEMORY.md",
        f"session:agent:main:direct:bob#{ids['mkbob']}",
        f"session:agent:main:explicit:portal-9#{ids['mkportal']}",
    }
    assert got["MEMORY.md"]["source"] == "memory"
    bob = got[f"session:agent:main:direct:bob#{ids['mkbob']}"]
    assert bob["source"] == "sessions" and (bob["startLine"], bob["endLine"]) == (1, 1)
    assert bob["snippet"] == "The warehouse gate code is 4417, mkbob."
    assert max(r["score"] for r in data["results"] if r["source"] == "memory") == 1.0
    assert max(r["score"] for r in data["results"] if r["source"] == "sessions") == 1.0
    shown = json.dumps(data)
    assert not any(m in shown for m in ("mkgroup", "mkcurrent", "mkother"))


@bounded
async def test_without_transcripts_no_session_is_searched(mem: am.Memory, core: MemoryCore) -> None:
    await seed_conversations(mem)
    data = await search(core, "warehouse gate code 4417")
    assert [r["source"] for r in data["results"]] == ["memory"]
    assert await paths(core, "4417") == []


@bounded
async def test_a_group_caller_gets_no_transcripts(mem: am.Memory, core: MemoryCore) -> None:
    await seed_conversations(mem)
    group = parse_session_key("agent:main:group:team")
    result = await core.search("main", {"query": "4417"}, caller=group, transcripts=SINGLE_OWNER)
    assert result.data is not None and result.data["results"] == []


@bounded
async def test_memory_get_serves_only_messages_in_the_private_scope(
    mem: am.Memory, core: MemoryCore
) -> None:
    ids = await seed_conversations(mem)
    bob = f"session:agent:main:direct:bob#{ids['mkbob']}"
    got = await get(core, bob, transcripts=True)
    assert got.evidence and got.data is not None
    assert got.data["text"] == "The warehouse gate code is 4417, mkbob."
    assert (got.data["role"], got.data["from"], got.data["to"]) == ("user", 1, 1)
    forbidden = [
        bob.replace("bob#", "bob#9"),  # no such message
        f"session:agent:main:group:team#{ids['mkgroup']}",
        f"session:agent:main:direct:alice#{ids['mkcurrent']}",  # the caller's own
        f"session:agent:ops:direct:alice#{ids['mkother']}",  # another agent
        f"session:agent:main:direct:bob#{ids['mkgroup']}",  # a group message by bob's key
    ]
    for path in forbidden:
        refused = await get(core, path, transcripts=True)
        assert refused.error is not None and refused.error.startswith(
            f"path: {path!r} is not available"
        )
        assert not refused.evidence and "4417" not in refused.content
    refused = await get(core, bob, transcripts=False)
    assert refused.error is not None and "not available" in refused.error


# -- memory_get --------------------------------------------------------------------------


@bounded
async def test_memory_get_reads_lines_of_a_note(mem: am.Memory, core: MemoryCore) -> None:
    write(mem, "memory/list.md", "".join(f"item {i}\n" for i in range(1, 101)))
    got = await get(core, "memory/list.md", {"from": 3, "lines": 2})
    assert got.data == {
        "path": "memory/list.md",
        "from": 3,
        "to": 4,
        "totalLines": 100,
        "text": "item 3\nitem 4",
        "truncated": False,
    }
    assert got.evidence and json.loads(got.content) == got.data
    default = await get(core, "memory/list.md")
    assert default.data is not None and default.data["to"] == 40
    past = await get(core, "memory/list.md", {"from": 101})
    assert past.data is not None and past.data["text"] == "" and not past.evidence


@bounded
async def test_memory_get_rejects_paths_leaving_the_notes(
    mem: am.Memory, core: MemoryCore, tmp_path: Path
) -> None:
    write(mem, "memory/ok.md", "fine\n")
    write(mem, "secret.txt", "no\n")
    (tmp_path / "outside.md").write_text("outside\n")
    (workspace(mem) / "memory" / "escape.md").symlink_to(tmp_path / "outside.md")
    for path in (
        "../memory.db",
        "/etc/passwd",
        "memory/../secret.txt",
        "memory/../MEMORY.md",
        "memory/sub/x.md",
        "memory/.hidden.md",
        "secret.txt",
        "./MEMORY.md",
        "memory\\ok.md",
        "",
    ):
        with pytest.raises(am.InvalidInputError, match=r"^path: "):
            await get(core, path)
    with pytest.raises(am.InvalidInputError, match=r"^path: 'memory/escape.md' leads outside"):
        await get(core, "memory/escape.md")
    tools = RecallTools(
        {"memory_get": lambda args: core.get("main", args, caller=CALLER, transcripts=None)}
    )
    result = await tools.call("memory_get", {"path": "../memory.db"})
    assert result.error is not None and result.error.startswith("path: '../memory.db' is not")


@bounded
async def test_bad_arguments_name_the_argument(mem: am.Memory, core: MemoryCore) -> None:
    cases: list[tuple[Callable[[], Awaitable[object]], str]] = [
        (
            lambda: core.search("main", {}, caller=CALLER, transcripts=None),
            'missing required key "query"',
        ),
        (
            lambda: search(core, "\udc00"),
            "query: lone surrogate '\\udc00' at index 0 (text must be valid Unicode)",
        ),
        (lambda: search(core, " "), 'query: " " is blank'),
        (lambda: search(core, "x" * 4097), f'query: "{"x" * 58}… is longer than 4096 characters'),
        (
            lambda: core.search("main", {"query": 3}, caller=CALLER, transcripts=None),
            "query: expected a non-empty string, got 3",
        ),
        (lambda: search(core, "x", maxResults=0), "maxResults: 0 is below the minimum 1"),
        (
            lambda: search(core, "x", maxResults=True),
            "maxResults: expected an integer, got true",
        ),
        (
            lambda: search(core, "x", limit=3),
            "limit: unknown key; expected one of query, maxResults",
        ),
        (
            lambda: get(core, "MEMORY.md", {"lines": 201}),
            "lines: 201 is above the maximum 200",
        ),
        (lambda: get(core, "MEMORY.md", {"from": 0}), "from: 0 is below the minimum 1"),
        (
            lambda: core.get("main", {"path": 1}, caller=CALLER, transcripts=None),
            "path: expected a string, got 1",
        ),
        (
            lambda: get(core, "session:agent:main:direct:bob"),
            "path: 'session:agent:main:direct:bob' is not session:<session_key>#<message_id>",
        ),
    ]
    for call, message in cases:
        with pytest.raises(am.InvalidInputError) as caught:
            await call()
        assert str(caught.value) == message


# -- redaction ---------------------------------------------------------------------------


PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\n"
    + "\n".join("QUJD" * 16 for _ in range(30))
    + "\n-----END RSA PRIVATE KEY-----"
)


@bounded
async def test_secrets_in_notes_are_redacted(mem: am.Memory, core: MemoryCore) -> None:
    write(mem, "MEMORY.md", f"# Keys\n\nThe OpenAI key is {KEY} for the bot.\n\n{PEM}\n\ntail\n")
    data = await search(core, "OpenAI key bot")
    (hit,) = [r for r in data["results"] if "OpenAI" in r["snippet"]]
    marker = "-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----"
    assert hit["snippet"].startswith(
        f"# Keys\n\nThe OpenAI key is sk-a…WXYZ for the bot.\n\n{marker}"
    )
    assert KEY not in hit["snippet"] and "QUJD" not in hit["snippet"]
    assert (await search(core, "QUJDQUJD"))["results"] == []  # key material is not indexed
    got = await get(core, "MEMORY.md", {"lines": 200})
    assert got.data is not None
    text = str(got.data["text"])
    assert KEY not in text and "QUJD" not in text and "sk-a…WXYZ" in text
    lines = text.split("\n")
    assert got.data["totalLines"] == len(lines) == 38  # the PEM's lines keep their numbers
    assert lines[-1] == "tail"
    middle = await get(core, "MEMORY.md", {"from": 10, "lines": 5})  # inside the PEM block
    assert middle.data is not None and "QUJD" not in str(middle.data["text"])


def test_redact_lines_keeps_line_numbers() -> None:
    redactor = Redactor()
    lines = ["a", *PEM.split("\n"), "b", f"x {KEY}"]
    out = redact_lines(redactor, lines)
    assert len(out) == len(lines)
    assert out[0] == "a" and out[-2] == "b" and out[-1] == "x sk-a…WXYZ"
    assert "QUJD" not in "".join(out)
    assert redact_lines(redactor, ["plain", "text"]) == ["plain", "text"]


# -- durability and integrity ------------------------------------------------------------


@bounded
async def test_reopening_needs_no_reindex(
    tmp_path: Path, executor: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "s"
    async with am.open_memory(state, executor=executor) as mem:  # type: ignore[arg-type]
        core = MemoryCore(mem._supervisor, mem.sessions._search, lambda: mem._settings)
        write(mem, "MEMORY.md", "Prefers tea.\n", past=True)
        write(mem, "memory/pets.md", "The cat is Miso.\n", past=True)
        assert await core.sync_notes("main") == 2
    reads = count_reads(monkeypatch)
    async with am.open_memory(state, executor=executor) as mem:  # type: ignore[arg-type]
        core = MemoryCore(mem._supervisor, mem.sessions._search, lambda: mem._settings)
        assert await paths(core, "Miso") == ["memory/pets.md"]
        assert reads == []
        store = await mem._supervisor.agent("main")
        assert await store.read(lambda r: notes_integrity_ok(r.conn))
        stats = await mem.sessions.stats()
        assert all(s.fts_integrity_ok for s in stats)


@bounded
async def test_many_syncs_keep_the_index_whole(
    mem: am.Memory, core: MemoryCore, storage: str | None
) -> None:
    note = write(mem, "MEMORY.md", "start\n")
    for i in range(12):
        note.write_text("".join(f"r{i}w{j}\n\n" for j in range(i * 40)))
        write(mem, f"memory/n{i % 3}.md", f"version {i}\n" * (i + 1))
        await core.sync_notes("main")
    assert await indexed_chunks(mem, storage) == {
        "MEMORY.md": 6,
        "memory/n0.md": 1,
        "memory/n1.md": 1,
        "memory/n2.md": 1,
    }
    assert await paths(core, "r11w439") == ["MEMORY.md"]
    assert await paths(core, "r10w0") == []
    assert await paths(core, "version") == ["memory/n2.md", "memory/n1.md", "memory/n0.md"]


def test_sync_notes_round_trips_and_checks_paths() -> None:
    cmd = SyncNotes(
        agent="main",
        files=(
            NoteFile(
                path="memory/a.md",
                mtime_ns=1,
                size=2,
                digest="d",
                chunks=(NoteChunk(start_line=1, end_line=2, text="t", heading="H"),),
            ),
        ),
        removed=("MEMORY.md",),
    )
    decoded = msgspec.json.decode(msgspec.json.encode(cmd), type=SyncNotes)
    assert decoded == cmd
    with pytest.raises(ValueError, match="is not MEMORY.md or memory/<name>.md"):
        NoteFile(path="memory/../x.md", mtime_ns=1, size=1, digest="d")
    with pytest.raises(ValueError, match="appears twice"):
        SyncNotes(agent="main", files=(decoded.files[0],), removed=("memory/a.md",))
    with pytest.raises(ValueError, match="not 1-based"):
        NoteChunk(start_line=0, end_line=1, text="t")


@bounded
async def test_a_failed_rescan_still_answers_from_the_index(
    mem: am.Memory, core: MemoryCore, monkeypatch: pytest.MonkeyPatch, storage: str | None
) -> None:
    sqlite_only(storage, "the fault injected is apsw's (the server's: tests/test_pg_crash.py)")
    note = write(mem, "MEMORY.md", "The cat is Miso.\n")
    assert await paths(core, "Miso") == ["MEMORY.md"]

    def full(conn: object, cmd: object) -> NoReturn:
        raise apsw.FullError("database or disk is full")

    with monkeypatch.context() as patched:
        patched.setattr(transcripts, "apply_sync_notes", full)
        note.write_text("The cat is Tofu now.\n")
        data = await search(core, "Miso")
        assert [r["path"] for r in data["results"]] == ["MEMORY.md"]
        assert data["syncError"] == (
            "memory notes of 'main': disk full or database size limit reached"
        )
        with pytest.raises(am.StorageError, match="disk full"):
            await core.sync_notes("main")
    assert await paths(core, "Tofu") == ["MEMORY.md"]
