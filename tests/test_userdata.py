"""A user's data (docs/design.md §2.6): list sessions, export an identity losslessly, erase it
so that nothing surfaces again and the files no longer hold its text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import apsw
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_records_hybrid import stored_vectors

import activememory as am
from activememory._cli import main
from activememory._records import recall_tool
from activememory.protocol.config import Config
from activememory.protocol.indexer import CreateSession, StoreVectors, VectorRow, VectorsStored
from activememory.storage.db import open_connection
from activememory.storage.transcripts import TranscriptWriter
from activememory.storage.userdata import list_sessions
from activememory.storage.vectors import text_digest

from fake_embedder import FakeEmbedder
from pg_server import pg_memory_dsn, storage

# Sessions and records on both stores; vectors are SQLite's (docs/design.md §11).
__all__ = ["pg_memory_dsn", "storage"]
pytestmark = pytest.mark.anyio

TOKEN = "zyxwquartz"  # distinctive: its own stem, in no other text
BOB_TOKEN = "plumbloom"
CONFIG: dict[str, Any] = {
    "session": {"identityLinks": {"dana": ["dana-tg", "dana-sl"]}},
    "agents": {"defaults": {"memorySearch": {"provider": "none"}}},
}
DANA_TG = "agent:main:direct:dana-tg"
DANA_SL = "agent:main:direct:dana-sl"
DANA_OTHER = "agent:other:direct:dana"
SPAWNED = "agent:main:explicit:sub-1"
BOB = "agent:main:direct:bob"
GROUP = "agent:main:group:club"


def user(text: str) -> am.Message:
    return am.Message(role="user", content=text)


def bot(text: str) -> am.Message:
    return am.Message(role="assistant", content=text)


async def store_people(mem: am.Memory, *, records: bool = True) -> dict[str, str]:
    """Dana across two peers, two agents and a spawned session, with a rewound branch,
    switches and (with `records`) records; Bob and a group beside her. Returns record ids
    by name."""
    first = await mem.sessions.append(DANA_TG, user(f"my secret word is {TOKEN}"))
    await mem.sessions.append(DANA_TG, bot(f"Noted: {TOKEN}."))
    await mem.sessions.rewind(DANA_TG, first.id)  # the reply above stays, off the branch
    await mem.sessions.append(DANA_TG, bot("Got it, I will remember."))
    await mem.sessions.append(
        DANA_TG,
        am.Message(
            role="tool", content=[{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]
        ),
    )
    await mem.sessions.append(DANA_SL, user("I live in Bergen"))
    await mem.command(DANA_SL, "/verbose on", sender=am.Sender(owner=True))
    await mem.sessions.create(SPAWNED, spawned_by=DANA_TG, sandboxed=True)
    await mem.sessions.append(SPAWNED, user(f"sub-agent notes on {TOKEN}"))
    await mem.sessions.append(DANA_OTHER, user(f"hello {TOKEN} from the other agent"))
    await mem.sessions.archive(DANA_OTHER)
    await mem.command("agent:main:direct:dana", "/trace on", sender=am.Sender(owner=True))
    await mem.sessions.append(BOB, user(f"my secret word is {BOB_TOKEN}"))
    await mem.sessions.append(GROUP, user("club meets on Thursday"))
    if not records:
        return {}
    ids = {
        "dana": await mem.records.add(f"Dana's word is {TOKEN}", user_id="dana", agent_id="main"),
        "dana_tg": await mem.records.add(
            "Dana lives in Oslo", user_id="dana-tg", metadata={"source": "chat", "n": 2}
        ),
        "bob": await mem.records.add(f"Bob's word is {BOB_TOKEN}", user_id="bob"),
    }
    await mem.records.link(ids["dana"], ids["dana_tg"], relation="about")
    await mem.records.link(ids["dana"], ids["bob"], relation="knows")
    await mem.records.invalidate(ids["dana_tg"], reason="moved to Bergen")
    return ids


async def test_sessions_list_filters_by_agent_chat_type_identity_peer_and_archived(
    tmp_path: Path, storage: str | None
) -> None:
    async with am.open_memory(tmp_path / "s", config=CONFIG, storage=storage) as mem:
        await store_people(mem)

        async def keys(**filters: Any) -> list[str]:
            return [s.key for s in await mem.sessions.list(**filters)]

        assert await keys() == [DANA_TG, DANA_SL, SPAWNED, BOB, GROUP]  # archived hidden
        assert await keys(archived=None) == [DANA_TG, DANA_SL, SPAWNED, BOB, GROUP, DANA_OTHER]
        assert await keys(archived=True) == [DANA_OTHER]
        assert await keys(agent="other", archived=None) == [DANA_OTHER]
        assert await keys(chat_type="group") == [GROUP]
        assert await keys(identity="dana", archived=None) == [
            DANA_TG, DANA_SL, SPAWNED, DANA_OTHER,
        ]  # fmt: skip
        assert await keys(identity="dana-tg") == []  # a linked peer is dana's, not its own
        assert await keys(peer="dana-tg") == [DANA_TG]
        assert await keys(identity="bob") == [BOB]
        with pytest.raises(am.InvalidInputError, match=r"^agent: no database for agent 'nope'"):
            await mem.sessions.list(agent="nope")
        with pytest.raises(am.InvalidInputError, match=r"^chat_type: 'dm' is not one of"):
            await mem.sessions.list(chat_type="dm")  # type: ignore[arg-type]
        with pytest.raises(am.InvalidInputError, match=r"^peer: give an identity or a peer"):
            await mem.sessions.list(identity="dana", peer="dana-tg")
        with pytest.raises(am.InvalidInputError, match=r"^identity: must not be blank$"):
            await mem.erase_identity(" ")


# A session key of each shape, over a few peer ids: who owns it must be `identity_of`.
PEERS = st.sampled_from(["ann", "bo", "cy", "main"])
KEYS = st.one_of(
    PEERS.map(lambda p: f"agent:main:direct:{p}"),
    st.just("agent:main:main"),
    st.just("agent:main:explicit:ui"),
    st.just("agent:main:group:g1"),
    st.just("oddkey"),
)


@settings(max_examples=60, deadline=None)
@given(
    links=st.dictionaries(st.sampled_from(["ann", "dana", "zed"]), st.lists(PEERS, max_size=3)),
    owner=st.one_of(st.none(), PEERS, st.just("dana")),
    keys=st.lists(KEYS, min_size=1, max_size=8, unique=True),
)
def test_an_identitys_sessions_are_exactly_those_identity_of_names(
    links: dict[str, list[str]], owner: str | None, keys: list[str]
) -> None:
    config = am.load_config({
        "session": {"identityLinks": links},
        "plugins": {"entries": {"active-memory": {"config": {"ownerIdentity": owner}}}},
    })  # fmt: skip
    conn = open_connection(Path(":memory:"), writer=True)
    writer = TranscriptWriter(conn)
    writer.apply([CreateSession(key=am.parse_session_key(k), at=1.0) for k in keys])
    for identity in ["ann", "bo", "cy", "main", "dana", "zed"]:
        scope = config.sessions_of(identity)
        expected = [k for k in keys if config.identity_of(am.parse_session_key(k)) == identity]
        # The Python rule (switch rows) and the SQL rule (sessions) agree with identity_of.
        assert [k for k in keys if scope.holds(am.parse_session_key(k))] == expected
        assert [s.key for s in list_sessions(conn, owner=scope)] == expected
    conn.close()


def _stored(info: am.SessionInfo) -> tuple[object, ...]:
    return (
        info.key, info.chat_type, info.persistent, info.interactive, info.archived,
        info.sandboxed, info.spawned_by, info.created_at, info.updated_at, info.leaf_event_id,
    )  # fmt: skip


async def _snapshot(mem: am.Memory, ids: list[str]) -> dict[str, object]:
    """What is stored of dana, read through the ordinary API (not through the export)."""
    sessions = await mem.sessions.list(identity="dana", archived=None)
    found: dict[str, object] = {"sessions": [_stored(s) for s in sessions]}
    for s in sessions:
        found[s.key] = [
            (e.id, e.parent_id, e.timestamp, e.message) for e in await mem.sessions.history(s.key)
        ]
    if not ids:
        return found
    found["records"] = [await mem.records.get(i) for i in ids]
    hits = await mem.records.store.search(TOKEN, num_hops=1)
    # Bob's record is not dana's: the relation to it is not hers to export.
    found["links"] = [
        (h.id, [(rel, r.id) for rel, r in h.linked_results if r.id in ids]) for h in hits
    ]
    return found


async def test_export_then_import_into_an_empty_state_dir_is_lossless(
    tmp_path: Path, storage: str | None
) -> None:
    async with am.open_memory(tmp_path / "a", config=CONFIG, storage=storage) as mem:
        ids = await store_people(mem)
        mine = [ids["dana"], ids["dana_tg"]]
        export = await mem.export_identity("dana")
        before = await _snapshot(mem, mine)
        # Emptied of dana, so that the import below can restore her ids on either store.
        await mem.erase_identity("dana")
        assert await mem.sessions.list(identity="dana", archived=None) == []
    lines = list(export.lines())
    (tmp_path / "dana.jsonl").write_text("\n".join(lines) + "\n")
    # The whole tree: the rewound reply is in the export though not on the branch.
    assert sum(f"Noted: {TOKEN}." in line for line in lines) == 1
    assert not any(BOB_TOKEN in line or "club" in line for line in lines)
    assert [t.session_key for t in export.transcripts] == [DANA_TG, DANA_SL, SPAWNED, DANA_OTHER]
    assert len(export.records) == 2 and len(export.relations) == 1  # not the link to bob's
    assert "memory notes" in export.not_covered

    # SQLite: a new state directory; PostgreSQL: the same database, dana erased.
    async with am.open_memory(tmp_path / "b", config=CONFIG, storage=storage) as mem:
        done = await mem.import_export(am.IdentityExport.read(tmp_path / "dana.jsonl"))
        assert done == am.ImportSummary(sessions=4, events=7, records=2, relations=1)
        await mem.sessions.rebuild_index()
        again = await mem.export_identity("dana")
        after = await _snapshot(mem, mine)
        switches = await mem.command(DANA_SL, "/verbose", sender=am.Sender(owner=True))
    assert list(again.lines()) == lines  # ids, timestamps, trees, metadata, records
    assert after == before
    assert switches is not None and "on" in switches


def test_export_and_import_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json5"
    config.write_text(json.dumps(CONFIG))

    async def fill() -> None:
        async with am.open_memory(tmp_path / "a", config=CONFIG) as mem:
            await store_people(mem)

    import trio

    trio.run(fill)
    common = ["--config", str(config), "--identity", "dana"]
    assert main(["export", "--state-dir", str(tmp_path / "a"), *common]) == 0
    out, err = capsys.readouterr()
    assert "exported 4 sessions (7 events), 2 records and 1 relations of dana" in err
    assert "not covered: the memory notes" in err
    (tmp_path / "dana.jsonl").write_text(out)
    assert main(["import", str(tmp_path / "dana.jsonl"), "--state-dir", str(tmp_path / "b")]) == 0
    assert "imported 4 sessions (7 events), 2 records and 1 relations" in capsys.readouterr().out
    export_b = [
        "export",
        "--state-dir",
        str(tmp_path / "b"),
        *common,
        "-o",
        str(tmp_path / "b.jsonl"),
    ]
    assert main(export_b) == 0
    assert (tmp_path / "b.jsonl").read_text() == out
    capsys.readouterr()
    listed = ["sessions", "--state-dir", str(tmp_path / "b"), "--config", str(config), "--json"]
    assert main([*listed, "--identity", "dana", "--archived", "all"]) == 0
    keys = [s["key"] for s in json.loads(capsys.readouterr().out)]
    assert keys == [DANA_TG, DANA_SL, SPAWNED, DANA_OTHER]
    assert main(["sessions", "--state-dir", str(tmp_path / "nowhere")]) == 2
    assert "--state-dir: " in capsys.readouterr().err


def _files_holding(root: Path, token: str) -> list[str]:
    return sorted(
        str(p.relative_to(root))
        for p in root.rglob("*")
        if p.is_file() and token.encode() in p.read_bytes()
    )


async def _every_path(mem: am.Memory, cfg: Config, dana_id: str, event_id: int) -> dict[str, bool]:
    """Whether each way back to stored text finds TOKEN."""
    text = await mem.sessions.search(TOKEN, caller=BOB)
    hybrid = await mem.sessions.search(TOKEN, caller=BOB, mode="hybrid")
    caller = am.parse_session_key("agent:main:direct:dana")
    scope = cfg.private_scope(caller)
    found = await mem.notes.search("main", {"query": TOKEN}, caller=caller, transcripts=scope)
    got = await mem.notes.get(
        "main", {"path": f"session:{DANA_TG}#{event_id}"}, caller=caller, transcripts=scope
    )
    recalled = await recall_tool(
        mem.records, {"query": TOKEN}, user_id="dana", agent_id="main", thread_id=caller.raw
    )
    records = await mem.records.store.search(TOKEN)
    return {
        "search": bool(text.results),
        "hybrid": any(h.similarity is not None for h in hybrid.results),
        "memory_search": TOKEN in found.content,
        "memory_get": TOKEN in got.content,
        "memory_recall": TOKEN in recalled.content,
        "records": bool(records),
        "record_get": await mem.records.get(dana_id) is not None,
    }


async def test_after_an_erase_nothing_surfaces_and_no_file_holds_the_text(
    tmp_path: Path,
) -> None:
    state = tmp_path / "s"
    cfg = {**CONFIG, "tools": {"sessions": {"visibility": "all"}}}
    # The recall model reads the whole store; hybrid search needs vectors.
    async with am.open_memory(state, config=cfg, embedder=FakeEmbedder()) as mem:
        ids = await store_people(mem)
        first = (await mem.sessions.history(DANA_TG))[0]
        await mem.sessions.rebuild_index()
        assert await mem.sessions.vectors_ready()
        turn = am.Turn(
            session_key="agent:main:direct:dana", messages=[user("what is my secret word?")]
        )
        await mem.sessions.append(turn.session_key, user("hi"))
        out = await mem.recall(turn)
        assert out.status == "ok" and TOKEN in (out.summary or "")
        assert (await mem.recall(turn)).cached  # the cache would answer the next time

        assert all((await _every_path(mem, mem.config, ids["dana"], first.id)).values())
        dry = await mem.erase_identity("dana", dry_run=True)
        assert _files_holding(state, TOKEN)  # a dry run changes nothing
        [main_db, other_db] = dry.agents
        assert main_db.session_keys == (DANA_TG, DANA_SL, SPAWNED, "agent:main:direct:dana")
        assert (main_db.events, main_db.switches) == (8, 2)  # 8: the rewind is an event
        assert main_db.vectors > 0 and main_db.cached_vectors > 0 and main_db.index_rows > 0
        assert other_db.session_keys == (DANA_OTHER,)
        assert (dry.records.records, dry.records.relations) == (2, 2)
        assert set(stored_vectors(state)) == set(ids.values())  # records have vectors too

        summary = await mem.erase_identity("dana")
        assert msgspec_counts(summary) == msgspec_counts(dry)
        assert set(stored_vectors(state)) == {ids["bob"]}  # dana's went with her records
        assert summary.purged and not summary.dry_run
        # Read while the memory is open: the WAL and the files as the bot leaves them.
        assert _files_holding(state, TOKEN) == []
        assert not any((await _every_path(mem, mem.config, ids["dana"], first.id)).values())
        await mem.sessions.append(turn.session_key, user("hi again"))  # dana comes back
        out = await mem.recall(turn)
        assert not out.cached and TOKEN not in (out.summary or "") + out.debug_line
        # Bob and the group are untouched.
        assert (await mem.sessions.search(BOB_TOKEN, caller=BOB)).results
        assert await mem.records.get(ids["bob"]) is not None
        assert [s.key for s in await mem.sessions.list(agent="main")] == [
            BOB,
            GROUP,
            turn.session_key,
        ]
    assert _files_holding(state, TOKEN) == []


def _rows_holding(storage: str, token: str) -> list[str]:
    """The PostgreSQL store's tables with a row holding `token` (texts, contents, terms)."""
    import psycopg

    found = []
    with psycopg.connect(storage) as conn:
        for table, column in [
            ("events", "text"),
            ("events", "content"),
            ("message_index", "terms::text::bytea"),
            ("session_switches", "key::bytea"),
            ("records", "content"),
            ("records", "terms::text::bytea"),
            ("records", "user_id::bytea"),
        ]:
            row = conn.execute(
                f"SELECT count(*) FROM activememory.{table}"
                f" WHERE position(%s::bytea IN {column}) > 0",
                (token.encode(),),
            ).fetchone()
            if row != (0,):
                found.append(f"{table}.{column}")
    return found


def _stored_records(
    state: Path, storage: str | None, user_ids: list[str], seqs: list[int]
) -> tuple[list[int], int]:
    """Read behind the library's back, on either store: the seqs of the records of
    `user_ids`, and how many relations touch those or the records `seqs`."""
    if storage is None:
        conn = apsw.Connection(str(state / "records.db"), flags=apsw.SQLITE_OPEN_READONLY)
        users = json.dumps(user_ids)
        found = [
            int(seq)
            for (seq,) in conn.execute(
                "SELECT seq FROM records WHERE user_id IN (SELECT value FROM json_each(?))"
                " ORDER BY seq",
                (users,),
            )
        ]
        every = json.dumps(sorted({*found, *seqs}))
        (relations,) = conn.execute(
            "SELECT count(*) FROM relations WHERE source IN (SELECT value FROM json_each(?1))"
            " OR target IN (SELECT value FROM json_each(?1))",
            (every,),
        ).fetchone() or (0,)
        conn.close()
        return found, int(relations)
    import psycopg

    with psycopg.connect(storage) as pg:
        found = [
            int(row[0])
            for row in pg.execute(
                "SELECT seq FROM activememory.records WHERE user_id = ANY(%s) ORDER BY seq",
                (user_ids,),
            )
        ]
        row = pg.execute(
            "SELECT count(*) FROM activememory.record_relations"
            " WHERE source = ANY(%(s)s) OR target = ANY(%(s)s)",
            {"s": sorted({*found, *seqs})},
        ).fetchone()
        return found, int(row[0]) if row else 0


async def test_an_erase_and_its_dry_run_on_either_store(
    tmp_path: Path, storage: str | None
) -> None:
    # Sessions and records (no vectors): an erase as it runs on both stores.
    state = tmp_path / "s"
    cfg = {**CONFIG, "tools": {"sessions": {"visibility": "all"}}}
    danas = ["dana", "dana-tg", "dana-sl"]

    def holding(token: str) -> list[str]:
        return _files_holding(state, token) if storage is None else _rows_holding(storage, token)

    async with am.open_memory(state, config=cfg, storage=storage) as mem:
        ids = await store_people(mem)
        first = (await mem.sessions.history(DANA_TG))[0]
        await mem.sessions.rebuild_index()  # the rewind left DANA_TG dirty: hidden till then
        caller = am.parse_session_key("agent:main:direct:dana")
        scope = mem.config.private_scope(caller)

        async def surfaces() -> dict[str, bool]:
            found = await mem.notes.search(
                "main", {"query": TOKEN}, caller=caller, transcripts=scope
            )
            got = await mem.notes.get(
                "main", {"path": f"session:{DANA_TG}#{first.id}"}, caller=caller, transcripts=scope
            )
            text = await mem.sessions.search(TOKEN, caller=BOB)
            return {
                "search": bool(text.results),
                "memory_search": TOKEN in found.content,
                "memory_get": TOKEN in got.content,
            }

        assert all((await surfaces()).values())
        dry = await mem.erase_identity("dana", dry_run=True)
        assert all((await surfaces()).values()) and holding(TOKEN)  # a dry run changes nothing
        [main_db, other_db] = dry.agents
        assert main_db.session_keys == (DANA_TG, DANA_SL, SPAWNED)
        assert (main_db.events, main_db.switches, main_db.vectors) == (7, 2, 0)  # 7: a rewind
        assert main_db.index_rows > 0 and other_db.session_keys == (DANA_OTHER,)
        assert dry.records.user_ids == tuple(danas)
        assert (dry.records.records, dry.records.relations) == (2, 2)  # "knows" bob's too
        seqs, relations = _stored_records(state, storage, danas, [])
        assert (len(seqs), relations) == (2, 2)

        summary = await mem.erase_identity("dana")
        assert msgspec_counts(summary) == msgspec_counts(dry)
        assert summary.purged and summary.records.purged and not summary.dry_run
        assert not any((await surfaces()).values())
        assert await mem.records.get(ids["dana"]) is None
        assert _stored_records(state, storage, danas, seqs) == ([], 0)
        assert holding(TOKEN) == []
        assert holding("dana") == []  # the switch row of a key with no session went too
        assert await mem.records.get(ids["bob"]) is not None
        assert (await mem.sessions.search(BOB_TOKEN, caller=BOB)).results
        assert [s.key for s in await mem.sessions.list(archived=None)] == [BOB, GROUP]


def msgspec_counts(summary: am.ErasureSummary) -> list[object]:
    rows: list[object] = [
        (a.agent, a.session_keys, a.events, a.index_rows, a.vectors, a.cached_vectors, a.switches)
        for a in summary.agents
    ]
    return [*rows, (summary.records.records, summary.records.relations)]


@pytest.mark.parametrize("shared", ["good morning", "good\x00morning", "morning \x00", "\x00"])
async def test_a_vector_shared_with_a_remaining_message_stays_cached(
    tmp_path: Path, shared: str
) -> None:
    """Also when the text holds NUL, where SQLite's `length()` stops: the texts kept are
    found by their byte length (the stores counted differently: test_pg_erase's
    differential test)."""
    async with am.open_memory(tmp_path / "s", config=CONFIG, embedder=FakeEmbedder()) as mem:
        await mem.sessions.append(DANA_TG, user(shared))
        await mem.sessions.append(DANA_TG, user(f"only dana says {TOKEN}"))
        await mem.sessions.append(BOB, user(shared))
        assert await mem.sessions.vectors_ready()
        summary = await mem.erase_identity("dana")
        [agent] = summary.agents
        assert (agent.vectors, agent.cached_vectors) == (2, 1)
        db = agent_db(tmp_path / "s")
        assert db.execute("SELECT count(*) FROM vector_cache").fetchone() == (1,)


def agent_db(state: Path) -> apsw.Connection:
    return apsw.Connection(
        str(state / "agents" / "main" / "memory.db"), flags=apsw.SQLITE_OPEN_READONLY
    )


def test_erase_through_the_cli_lists_then_erases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json5"
    config.write_text(json.dumps(CONFIG))
    import trio

    async def fill() -> None:
        async with am.open_memory(tmp_path / "s", config=CONFIG) as mem:
            await store_people(mem)

    trio.run(fill)
    args = [
        "erase",
        "--state-dir",
        str(tmp_path / "s"),
        "--config",
        str(config),
        "--identity",
        "dana",
    ]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "agent main: would erase 3 sessions, 7 events" in out
    assert f"  {DANA_TG}\n" in out and "records: would erase 2 records and 2 relations" in out
    assert "not covered: the memory notes" in out
    assert _files_holding(tmp_path / "s", TOKEN)
    assert main([*args, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["purged"] is True and done["dry_run"] is False
    assert [a["session_keys"] for a in done["agents"]] == [
        [DANA_TG, DANA_SL, SPAWNED],
        [DANA_OTHER],
    ]
    assert _files_holding(tmp_path / "s", TOKEN) == []


async def test_a_vector_embedded_before_an_erase_and_stored_after_is_not_cached(
    tmp_path: Path,
) -> None:
    # The embedder actor reads a batch, embeds it off the loop, and stores it through the
    # indexer: an erase can fall in between. Its vectors must not come back as cache rows.
    async with am.open_memory(tmp_path / "s", config=CONFIG) as mem:
        event = await mem.sessions.append(DANA_TG, user(f"only dana says {TOKEN}"))
        text = f"only dana says {TOKEN}"
        await mem.erase_identity("dana")
        store = await mem._supervisor.agent("main")
        late = StoreVectors(
            agent="main",
            name="fake/bag-of-words",
            messages=(VectorRow(id=event.id, digest=text_digest(text), vector=b"\0" * 128),),
        )
        ack = await store.submit(late)
        assert ack == VectorsStored(messages=0, notes=0, skipped=1)
    assert agent_db(tmp_path / "s").execute("SELECT count(*) FROM vector_cache").fetchone() == (0,)


async def test_the_cli_erases_through_a_running_bot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The bot holds the writers: the CLI asks it, and it erases through them with its own
    # config (its identity links make `dana-tg` dana's; docs/design.md §1.7).
    state = tmp_path / "s"
    async with am.open_memory(state, config=CONFIG) as mem:
        await mem.sessions.append(DANA_TG, user(f"my secret word is {TOKEN}"))
        args = ["erase", "--state-dir", str(state), "--identity", "dana"]
        assert await anyio.to_thread.run_sync(main, args) == 0
        assert "erased by the running bot" in capsys.readouterr().err
        assert [s.key for s in await mem.sessions.list()] == []


async def test_bad_record_lines_are_errors_naming_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = {"type": "record", "id": "r1", "content": "x", "timestamp": 1.0}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "recordType": "note"}) + "\n")
    with pytest.raises(am.InvalidInputError, match=rf"^{path}:2: record_type: 'note' is not one"):
        am.IdentityExport.read(path)
    path.write_text(json.dumps({**good, "status": "invalid"}) + "\n")
    with pytest.raises(am.InvalidInputError, match=rf"^{path}:1: reason: expected a non-empty"):
        am.IdentityExport.read(path)
    path.write_text(json.dumps({**good, "userID": "x"}) + "\n")
    with pytest.raises(am.InvalidInputError, match=rf"^{path}:1: Object contains unknown field"):
        am.IdentityExport.read(path)
    edge = {"type": "relation", "relation": "about", "sourceId": "r1", "targetId": "r2"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(edge) + "\n")
    async with am.open_memory(tmp_path / "s", config=CONFIG) as mem:
        with pytest.raises(am.InvalidInputError, match=r"^target_id: no record 'r2'$"):
            await mem.import_export(am.IdentityExport.read(path))
        record = await mem.records.get("r1")
    assert record is not None and record.content == "x"  # each record is its own write
