"""`am.migrate` / `activememory migrate` (docs/design.md §11 "Migrate"): a store copied from
SQLite to PostgreSQL and back is the same store — sessions with their trees, ids, leaves,
flags and switches, records with their relations and lifecycle — and searches the same; a
non-empty destination, a bad DSN and a failure midway leave the destination as it was."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_userdata import CONFIG, DANA_TG, GROUP, TOKEN, store_people, user

import activememory as am
from activememory._cli import main
from activememory._importers import Transcript
from activememory._migrate import _every_record, _transcripts

from pg_server import emptied_memory_dsn, empty_store, pg_memory_dsn

__all__ = ["emptied_memory_dsn", "pg_memory_dsn"]
pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


async def make_source(path: Path) -> None:
    """tests/test_userdata.py's people (a rewound branch, a sandboxed spawned session, an
    archived one in a second agent, switches, records with relations and an invalidated
    one), plus an unscoped record, a session without messages and a few more words."""
    async with am.open_memory(path, config=CONFIG) as mem:
        await store_people(mem)
        await mem.records.add("the office plant is a fern", user_id=None)
        await mem.sessions.create("agent:main:explicit:empty", persistent=False)
        await mem.sessions.append("agent:ghost:main", user("soon gone"))
        await mem.sessions.delete("agent:ghost:main")  # its database stays, empty
        for text in ("the ferry leaves at noon", "bring the red umbrella", "noon is lunch"):
            await mem.sessions.append(GROUP, user(text))


async def snapshot(path: Path, storage: str | None = None) -> dict[str, Any]:
    """Everything migrate copies, as the import format holds it, by agent."""
    async with am.open_memory(path, config=CONFIG, storage=storage) as mem:
        agents = await mem._supervisor.known_agents()
        sessions: dict[str, list[Transcript]] = {
            agent: [_comparable(t) for t in await _transcripts(mem, agent)] for agent in agents
        }
        sessions = {agent: found for agent, found in sessions.items() if found}
        # Renumbered by design: session ids, write counters (a rewind's own event is not an
        # entry of the import format, so later seqs close up), the import's update time.
        renumbered = {"session_id": 0, "updated_at": 0.0, "revision": 0, "indexed_seq": 0}
        infos = [
            msgspec.structs.replace(info, **renumbered)
            for info in await mem.sessions.list(archived=None)
        ]
        records, relations = await _every_record(mem)
        dana = await mem.export_identity("dana") if storage is None else None
        return {
            "infos": infos,
            "sessions": sessions,
            "records": records,
            "relations": relations,
            "dana": None if dana is None else list(dana.lines()),
        }


def _comparable(t: Transcript) -> Transcript:
    # The import stamps `updated_at` when it archives or sets switches: not compared.
    return Transcript(**{**t.__dict__, "updated_at": None})


async def test_sqlite_to_postgresql_and_back_is_the_same_store(tmp_path: Path, dsn: str) -> None:
    await make_source(tmp_path / "src")
    lines: list[str] = []
    there = await am.migrate(tmp_path / "src", dsn, verify_sample=20, progress=lines.append)
    assert there.ok, there.text()
    assert (there.agents, there.sessions, there.records, there.relations) == (2, 7, 4, 2)
    assert there.messages == 12  # the rewound-away reply included
    assert there.queries == 20
    assert any(line.startswith("verify: 20/20") for line in lines)
    back = await am.migrate(dsn, tmp_path / "back", verify_sample=30)
    assert back.ok, back.text()
    assert back.text().endswith("OK")
    before, after = await snapshot(tmp_path / "src"), await snapshot(tmp_path / "back")
    assert after == before
    # On PostgreSQL too, read through the store's own readers.
    on_pg = await snapshot(tmp_path / "pg-state", dsn)
    assert on_pg["sessions"] == before["sessions"]
    assert (on_pg["records"], on_pg["relations"]) == (before["records"], before["relations"])
    invalidated = [r for r in before["records"] if r.invalidated_at is not None]
    assert len(invalidated) == 1 and invalidated[0].record.invalid_reason == "moved to Bergen"
    # The copy searches as the source did, through the public API (default visibility).
    answers = []
    for place in (tmp_path / "src", tmp_path / "back"):
        async with am.open_memory(place, config=CONFIG) as mem:
            found = await mem.sessions.search(TOKEN, caller=DANA_TG)
            answers.append([(h.session_key, h.message_id, h.snippet) for h in found.results])
    assert answers[0] == answers[1] and len(answers[0]) == 3


def test_the_command_line_migrates_and_prints_the_verification(
    tmp_path: Path, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trio.run(make_source, tmp_path / "src")
    assert main(["migrate", str(tmp_path / "src"), dsn, "--verify-sample", "5"]) == 0
    out = capsys.readouterr().out
    assert "copied: 2 agents, 7 sessions, 12 messages, 4 records, 2 relations" in out
    assert out.rstrip().endswith("OK")


async def test_a_non_empty_destination_is_refused_and_left_alone(tmp_path: Path, dsn: str) -> None:
    await make_source(tmp_path / "src")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.md").write_text("mine")
    with pytest.raises(am.InvalidInputError, match=r"^destination: '.*occupied' is not empty;"):
        await am.migrate(tmp_path / "src", occupied)
    assert [p.name for p in occupied.iterdir()] == ["notes.md"]
    assert (await am.migrate(tmp_path / "src", dsn, verify_sample=0)).ok
    with pytest.raises(
        am.InvalidInputError,
        match=r"^destination: .* is not empty \(4 records; agents with sessions: main, other\)",
    ):
        await am.migrate(tmp_path / "src", dsn)
    with pytest.raises(am.InvalidInputError, match=r"^destination: the same store as the source"):
        await am.migrate(dsn, dsn)
    with pytest.raises(am.InvalidInputError, match=r"^source: '.*nowhere' does not exist"):
        await am.migrate(tmp_path / "nowhere", tmp_path / "new")
    assert not (tmp_path / "new").exists()


async def test_a_bad_dsn_is_a_clear_error_naming_the_side(tmp_path: Path) -> None:
    await make_source(tmp_path / "src")
    unreachable = "postgresql://postgres:hunter2@127.0.0.1:1/nothing"
    with pytest.raises(am.StorageError, match=r"^destination: storage\.dsn: ") as raised:
        await am.migrate(tmp_path / "src", unreachable)
    assert "hunter2" not in str(raised.value)
    with pytest.raises(am.InvalidInputError, match=r"^source: storage\.dsn: "):
        await am.migrate("postgresql://[nonsense", tmp_path / "new")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("how", ["error", "cancelled"])
@pytest.mark.parametrize("into", ["postgresql", "sqlite"])
async def test_a_migrate_failing_midway_leaves_the_destination_as_it_was(
    tmp_path: Path, dsn: str, into: str, how: str
) -> None:
    await make_source(tmp_path / "src")
    dest = dsn if into == "postgresql" else str(tmp_path / "dest")
    with anyio.CancelScope() as scope:

        def stop_after_the_sessions(line: str) -> None:
            if "records" not in line:
                return
            if how == "cancelled":
                scope.cancel()  # at its next checkpoint, inside the copy
            else:
                raise RuntimeError("the copy stops here")

        with (
            pytest.raises(RuntimeError, match="the copy stops here")
            if how == "error"
            else (contextlib.nullcontext())
        ):
            await am.migrate(tmp_path / "src", dest, progress=stop_after_the_sessions)
            pytest.fail("the migrate went on")
    assert scope.cancelled_caught == (how == "cancelled")
    if into == "sqlite":
        left = [p.name async for p in anyio.Path(tmp_path).iterdir()]
        assert left == ["src"]  # no staging directory
    else:
        empty = await snapshot(tmp_path / "pg-state", dsn)
        assert empty == {"infos": [], "sessions": {}, "records": [], "relations": [], "dana": None}
    assert (await am.migrate(tmp_path / "src", dest, verify_sample=5)).ok  # still empty


async def test_bad_arguments_name_the_field(tmp_path: Path) -> None:
    with pytest.raises(am.InvalidInputError, match=r"^verify_sample: "):
        await am.migrate(tmp_path / "a", tmp_path / "b", verify_sample=-1)
    with pytest.raises(am.InvalidInputError, match=r"^source: expected a state directory"):
        await am.migrate(3, tmp_path / "b")  # type: ignore[arg-type]


# -- any store: the round trip keeps it -----------------------------------------------------

WORDS = ["apple", "Bergen", "café", "naïve", "東京タワー", "ferry", "noon", "fern", "x"]
STORE_KEYS = [
    "agent:main:direct:ann",
    "agent:main:group:club",
    "agent:main:main",
    "agent:other:direct:ann",
]
texts = st.lists(st.sampled_from(WORDS), min_size=1, max_size=5).map(" ".join)
store_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("append"),
            st.sampled_from(STORE_KEYS),
            st.sampled_from(["user", "assistant"]),
            texts,
        ),
        st.tuples(st.just("rewind"), st.sampled_from(STORE_KEYS), st.integers(0, 30)),
        st.tuples(st.just("archive"), st.sampled_from(STORE_KEYS)),
        st.tuples(st.just("spawn"), st.sampled_from(STORE_KEYS[:1]), st.booleans()),
        st.tuples(st.just("record"), texts, st.sampled_from([None, "ann", "bo"])),
        st.tuples(st.just("link"), st.integers(0, 30), st.integers(0, 30)),
        st.tuples(st.just("invalidate"), st.integers(0, 30)),
    ),
    min_size=1,
    max_size=25,
)


async def make_random_source(path: Path, ops: list[tuple[Any, ...]]) -> None:
    async with am.open_memory(path, config=CONFIG) as mem:
        events: dict[str, list[int]] = {}
        records: list[str] = []
        spawned = 0
        for op in ops:
            match op:
                case ("append", key, role, text):
                    event = await mem.sessions.append(key, am.Message(role=role, content=text))
                    events.setdefault(key, []).append(event.id)
                case ("rewind", key, n) if events.get(key):
                    await mem.sessions.rewind(key, events[key][n % len(events[key])])
                case ("archive", key) if key in events:
                    await mem.sessions.archive(key)
                case ("spawn", parent, sandboxed) if parent in events:
                    spawned += 1
                    await mem.sessions.create(
                        f"agent:main:explicit:sub-{spawned}", spawned_by=parent, sandboxed=sandboxed
                    )
                case ("record", text, user_id):
                    records.append(await mem.records.add(text, user_id=user_id))
                case ("link", a, b) if len(records) > 1 and a % len(records) != b % len(records):
                    with contextlib.suppress(am.InvalidInputError):  # already linked
                        await mem.records.link(
                            records[a % len(records)], records[b % len(records)], relation="about"
                        )
                case ("invalidate", n) if records:
                    with contextlib.suppress(am.InvalidInputError):  # already invalid
                        await mem.records.invalidate(records[n % len(records)], reason="stale")
        if not events and not records:
            await mem.sessions.append(STORE_KEYS[0], user("hello"))


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=store_ops)
def test_any_store_survives_the_round_trip(
    tmp_path_factory: pytest.TempPathFactory, pg_memory_dsn: str, ops: list[tuple[Any, ...]]
) -> None:
    empty_store(pg_memory_dsn)
    root = tmp_path_factory.mktemp("round")

    async def run() -> None:
        await make_random_source(root / "src", ops)
        there = await am.migrate(root / "src", pg_memory_dsn, verify_sample=10)
        assert there.ok, there.text()
        back = await am.migrate(pg_memory_dsn, root / "back", verify_sample=10)
        assert back.ok, back.text()
        assert await snapshot(root / "back") == await snapshot(root / "src")

    trio.run(run)


def test_a_source_written_during_the_migrate_is_a_mismatch_and_nothing_is_copied(
    tmp_path: Path, dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    trio.run(make_source, tmp_path / "src")
    assert trio.run(lambda: am.migrate(tmp_path / "src", dsn, verify_sample=0)).ok
    # A worker still writing to the PostgreSQL source (there is no lock to keep it out),
    # between the copy of agent main and the verification.
    with am.sync.open_memory(tmp_path / "worker", config=CONFIG, storage=dsn) as worker:

        def write_meanwhile(line: str) -> None:
            if line.startswith("migrate: agent main"):
                # Blocking, from a thread of its own (the sync API refuses an event loop's).
                late = threading.Thread(
                    target=worker.sessions.append, args=(GROUP, user("a late message"))
                )
                late.start()
                late.join()

        report = trio.run(
            lambda: am.migrate(dsn, tmp_path / "back", verify_sample=5, progress=write_meanwhile)
        )
        assert not report.ok
        assert report.mismatches[0] == f"session {GROUP}: 5 messages, copied 4"
        assert report.text().endswith("FAILED: the destination was left as it was (nothing copied)")
        assert not (tmp_path / "back").exists()
        # Once the source is quiet, the command line copies it (`--json`: the report).
        assert main(["migrate", dsn, str(tmp_path / "back"), "--json", "--verify-sample", "0"]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["ok"] is True and out["sessions"] == 7 and out["messages"] == 13
