"""Inspecting a live bot (docs/design.md §1.6): `open_memory(readonly=True)` beside a writer,
on a read-only copy, and every write refused; on both stores (docs/design.md §11
"Read-only"), where the files are not SQLite's."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import sys
import tempfile
import urllib.parse
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import apsw
import pytest

import activememory as am
from activememory.storage.db import MIGRATIONS, SCHEMA_VERSION, migrate, readonly_uri

from pg_server import empty_store, pg_memory_dsn, scratch_database, storage

__all__ = ["pg_memory_dsn", "storage"]
pytestmark = pytest.mark.anyio

TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
ALICE = "agent:main:direct:alice"
BOB = "agent:main:direct:bob"
READONLY = "readonly: "


def snapshot(root: Path, *, shm: bool = True) -> dict[str, tuple[str, int, int]]:
    """Every file under `root`: its digest, size and mtime (what "nothing changed" means);
    `shm=False` leaves out SQLite's shared-memory index (`-shm`), which every connection of
    the process that holds it open for writing updates, readers included."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and (shm or not path.name.endswith("-shm")):
            st = path.stat()
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            out[str(path.relative_to(root))] = (digest, st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture
def read_only_tree() -> Iterator[list[Path]]:
    """Directories the test made read-only (chmod a-w); made writable again afterwards."""
    made: list[Path] = []
    yield made
    for root in made:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def chmod_read_only(root: Path) -> None:
    for path in [*root.rglob("*"), root]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def store_snapshot(mem: am.Memory, storage: str | None) -> dict[str, object]:
    """What "nothing changed" means on either store: every file of the state directory
    (SQLite's `-shm` left out: `snapshot`), and on PostgreSQL every row of every table of
    the store and every sequence's position, read behind the library's back."""
    found: dict[str, object] = dict(snapshot(mem.state_dir, shm=False))
    if storage is None:
        return found
    import psycopg

    with psycopg.connect(storage) as conn:
        relations = conn.execute(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = 'activememory'"
            " AND c.relkind IN ('r', 'S') ORDER BY c.relname"
        ).fetchall()
        for name, kind in relations:
            if kind == "S":
                sql = f"SELECT last_value, is_called FROM activememory.{name}"
            else:
                sql = "SELECT count(*), md5(string_agg(t::text, '|' ORDER BY t::text))"
                sql += f" FROM activememory.{name} t"
            found[f"pg:{name}"] = conn.execute(sql).fetchone()
    return found


@pytest.fixture
async def writer(tmp_path: Path, storage: str | None) -> AsyncIterator[am.Memory]:
    """A bot holding the state directory (or the PostgreSQL store): alice's chat indexed, a
    record, bob's chat dirty."""
    async with am.open_memory(tmp_path / "state", config=TEXT_ONLY, storage=storage) as mem:
        await mem.sessions.append(ALICE, am.Message(role="user", content="I keep bees on the roof"))
        await mem.records.add(content="alice keeps bees", user_id="alice")
        yield mem


async def test_reads_beside_a_live_writer_and_sees_its_commits(
    writer: am.Memory, storage: str | None
) -> None:
    async with am.open_memory(
        writer.state_dir, config=TEXT_ONLY, readonly=True, storage=storage
    ) as ro:
        assert ro.readonly
        found = await ro.sessions.search("bees", caller=ALICE)
        assert [h.snippet for h in found.results] == ["I keep bees on the roof"]
        # WAL: what the writer commits while the reader is open is seen at its next read.
        await writer.sessions.append(ALICE, am.Message(role="assistant", content="honey then"))
        history = await ro.sessions.history(ALICE)
        assert [e.message.content for e in history if e.message] == [
            "I keep bees on the roof",
            "honey then",
        ]
        records = await ro.records.search("bees", user_id="alice")
        assert [r.record.content for r in records] == ["alice keeps bees"]
        (stats,) = await ro.sessions.stats()
        assert (stats.sessions, stats.indexed_messages, stats.fts_integrity_ok) == (1, 2, True)
        assert (await ro.doctor()).ok
    # The writer still writes: the reader took no lock and left nothing in its way.
    await writer.sessions.append(ALICE, am.Message(role="user", content="and wasps"))


async def test_writes_nothing_beside_a_live_writer(writer: am.Memory, storage: str | None) -> None:
    # The writer is in this process, so the reader shares its writable -shm mapping (SQLite
    # keeps one per process); tests/test_cli.py checks the -shm too with a writer process.
    before = store_snapshot(writer, storage)
    async with am.open_memory(
        writer.state_dir, config=TEXT_ONLY, readonly=True, storage=storage
    ) as ro:
        await ro.sessions.search("bees", caller=ALICE)
        await ro.sessions.history(ALICE)
        await ro.sessions.stats()
        await ro.records.search("bees", user_id="alice")
        await ro.doctor()
    # Not a byte, not an mtime, not a new file; not a row, not a sequence's value.
    assert store_snapshot(writer, storage) == before


async def test_says_when_a_session_is_mid_rebuild(writer: am.Memory, storage: str | None) -> None:
    entries = [
        am.ImportEntry(
            id="1",
            parent_id=None,
            timestamp=5.0,
            message=am.Message(role="user", content="bees again"),
        )
    ]
    await writer.sessions.import_transcript(BOB, entries)  # stored unindexed: dirty
    config = {**TEXT_ONLY, "tools": {"sessions": {"visibility": "agent"}}}
    async with am.open_memory(
        writer.state_dir, config=config, readonly=True, storage=storage
    ) as ro:
        found = await ro.sessions.search("bees", caller=ALICE)
        assert found.indexing and found.warning is not None
        assert (await ro.sessions.info(BOB)).dirty
        assert not (await ro.sessions.info(ALICE)).dirty
        (stats,) = await ro.sessions.stats()
        assert stats.dirty_sessions == 1
        # Nothing rebuilds it from here: the reader started no reconciler.
        assert (await ro.sessions.search("bees", caller=ALICE)).indexing
    assert (await writer.sessions.info(BOB)).dirty


async def test_every_write_names_readonly(writer: am.Memory, storage: str | None) -> None:
    async def respond(prefix: str | None, turn: am.Turn) -> str:
        raise AssertionError("a read-only reply must not reach the model")

    async with am.open_memory(
        writer.state_dir, config=TEXT_ONLY, readonly=True, storage=storage
    ) as ro:
        message = am.Message(role="user", content="hi")
        turn = am.Turn(session_key=ALICE, messages=[message])
        writes = [
            ro.sessions.append(ALICE, message),
            ro.sessions.create(BOB),
            ro.sessions.delete(ALICE),
            ro.sessions.archive(ALICE),
            ro.sessions.rewind(ALICE, 1),
            ro.sessions.rebuild_index(ALICE),
            ro.records.add(content="x", user_id="alice"),
            ro.notes.sync_notes("main"),
            ro.command(ALICE, "/verbose on", sender=am.Sender()),
            ro.command(ALICE, "/active-memory off --global", sender=am.Sender(owner=True)),
            ro.reply(turn, respond),
            ro.erase_identity("alice"),
            ro.sessions.reindex(),
        ]
        for write in writes:
            with pytest.raises(am.StorageError, match=READONLY) as caught:
                await write
            assert "readonly=True" in str(caught.value)
        # Reads still answer: a switch's status, an export, an erase's dry run.
        assert await ro.command(ALICE, "/active-memory status", sender=am.Sender())
        export = await ro.export_identity("alice")
        assert [t.session_key for t in export.transcripts] == [ALICE]
        with pytest.raises(am.StorageError, match=READONLY):
            await ro.import_export(export)
        planned = await ro.erase_identity("alice", dry_run=True)
        assert planned.agents[0].session_keys == (ALICE,)
        assert (planned.records.records, len(export.records)) == (1, 1)
    assert len(await writer.sessions.history(ALICE)) == 1


@pytest.mark.sqlite_only("a copy of the state directory's database files")
async def test_works_on_a_read_only_copy_and_changes_no_file(
    writer: am.Memory, tmp_path: Path, read_only_tree: list[Path]
) -> None:
    # A copy taken while the bot runs: the last commits are in its -wal, with its -shm.
    live_copy = tmp_path / "live-copy"
    shutil.copytree(writer.state_dir, live_copy)
    assert (live_copy / "agents/main/memory.db-wal").stat().st_size > 0
    # A copy of a stopped store: no -wal, no -shm.
    stopped = tmp_path / "stopped"
    async with am.open_memory(stopped, config=TEXT_ONLY) as mem:
        await mem.sessions.append(ALICE, am.Message(role="user", content="I keep bees"))
    assert not (stopped / "agents/main/memory.db-wal").exists()
    for copy in (live_copy, stopped):
        chmod_read_only(copy)
        read_only_tree.append(copy)
        before = snapshot(copy)
        async with am.open_memory(copy, config=TEXT_ONLY, readonly=True) as ro:
            found = await ro.sessions.search("bees", caller=ALICE)
            assert len(found.results) == 1, copy
            await ro.sessions.stats()
            await ro.records.search("bees", user_id="alice")
            await ro.sessions.search("bees", caller="agent:other:main")  # no such agent
        # As root chmod stops nothing: the proof is that no file changed and none appeared.
        assert snapshot(copy) == before, copy
        assert sorted(os.listdir(copy)) == sorted(before_names(before)), copy


def before_names(snap: dict[str, tuple[str, int, int]]) -> set[str]:
    return {name.split("/")[0] for name in snap}


async def test_takes_no_writer_lock(tmp_path: Path) -> None:
    state = tmp_path / "state"
    async with am.open_memory(state, config=TEXT_ONLY) as mem:
        await mem.sessions.append(ALICE, am.Message(role="user", content="hi"))
    async with am.open_memory(state, config=TEXT_ONLY, readonly=True) as ro:
        await ro.sessions.history(ALICE)
        # A writer opens beside it, and a second writer is still refused.
        async with am.open_memory(state, config=TEXT_ONLY) as mem:
            await mem.sessions.append(ALICE, am.Message(role="user", content="again"))
            with pytest.raises(am.StorageError, match="already open for writing"):
                async with am.open_memory(state, config=TEXT_ONLY) as second:
                    await second.sessions.history(ALICE)
        assert len(await ro.sessions.history(ALICE)) == 2


@pytest.mark.parametrize(
    ("version", "message"),
    [
        (3, f"schema version 3 is older than this activememory's ({SCHEMA_VERSION}) and "
         "readonly=True never migrates; open it once without readonly (or with the "
         "activememory that wrote it)"),
        (99, f"schema version 99 is newer than this activememory understands ({SCHEMA_VERSION}); "
         "upgrade activememory"),
    ],
)  # fmt: skip
async def test_a_schema_not_this_codes_is_a_clear_error(
    tmp_path: Path, version: int, message: str
) -> None:
    path = tmp_path / "agents" / "main" / "memory.db"
    path.parent.mkdir(parents=True)
    conn = apsw.Connection(str(path))
    migrate(conn, MIGRATIONS[: min(version, len(MIGRATIONS))])
    conn.pragma("user_version", version)
    conn.close()
    before = snapshot(tmp_path)
    async with am.open_memory(tmp_path, config=TEXT_ONLY, readonly=True) as ro:
        with pytest.raises(am.StorageError) as caught:
            await ro.sessions.history(ALICE)
    assert message in str(caught.value)
    assert snapshot(tmp_path) == before  # not migrated


async def test_a_missing_or_empty_state_dir_is_an_error(tmp_path: Path) -> None:
    missing = tmp_path / "typo"
    with pytest.raises(am.InvalidInputError, match=r"state_dir: '.*typo' does not exist"):
        async with am.open_memory(missing, config=TEXT_ONLY, readonly=True):
            pass
    assert not missing.exists()
    with pytest.raises(am.InvalidInputError, match="holds no activememory store"):
        async with am.open_memory(tmp_path, config=TEXT_ONLY, readonly=True):
            pass
    assert os.listdir(tmp_path) == []


async def test_recall_keeps_no_transcript_in_the_store(
    writer: am.Memory, storage: str | None
) -> None:
    config = {
        **TEXT_ONLY,
        "plugins": {
            "entries": {
                "active-memory": {"config": {"persistTranscripts": True, "ownerIdentity": "alice"}}
            }
        },
    }
    before = store_snapshot(writer, storage)
    async with am.open_memory(
        writer.state_dir, config=config, readonly=True, storage=storage
    ) as ro:
        turn = am.Turn(
            session_key="agent:main:main",
            messages=[am.Message(role="user", content="what do I keep on the roof?")],
        )
        outcome = await ro.recall(turn)
    assert outcome.status == "ok", outcome
    assert store_snapshot(writer, storage) == before
    assert not (writer.state_dir / "agents/main/sessions").exists()


@pytest.mark.parametrize(
    ("files", "writable", "params"),
    [
        ({"-wal": b"x", "-shm": b"x"}, True, "mode=ro&readonly_shm=1"),
        ({"-wal": b"x", "-shm": b"x"}, False, "mode=ro&readonly_shm=1"),
        ({"-shm": b"x"}, False, "mode=ro&readonly_shm=1"),
        ({}, True, "mode=ro"),
        ({"-wal": b"x"}, True, "mode=ro"),
        ({}, False, "immutable=1"),
        ({"-wal": b""}, False, "immutable=1"),
        ({"-wal": b"x"}, False, None),
    ],
)
def test_how_a_database_is_opened_read_only(
    tmp_path: Path,
    read_only_tree: list[Path],
    files: dict[str, bytes],
    writable: bool,
    params: str | None,
) -> None:
    folder = tmp_path / "a b?#%"  # quoted into the URI
    folder.mkdir()
    db = folder / "memory.db"
    db.write_bytes(b"")
    for suffix, data in files.items():
        (folder / f"memory.db{suffix}").write_bytes(data)
    if not writable:
        chmod_read_only(folder)
        read_only_tree.append(folder)
    if params is None:
        with pytest.raises(am.StorageError, match="its write-ahead log has no 'memory.db-shm'"):
            readonly_uri(db)
        return
    uri = readonly_uri(db)
    assert uri == f"file:{urllib.parse.quote(str(db.resolve()))}?{params}"
    assert "%3F" in uri and "%23" in uri and "%25" in uri


# Opens a state directory read-only and prints what a search finds, as a user who cannot
# write it (the test below runs it as `nobody` when the tests run as root).
READER = """
import sys, trio, activememory as am

async def run(state, caller):
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(state, config=config, readonly=True) as mem:
        found = await mem.sessions.search("bees", caller=caller)
        print(len(found.results), (await mem.sessions.stats())[0].sessions)

trio.run(run, sys.argv[1], sys.argv[2])
"""


@pytest.fixture
def public_dir() -> Iterator[Path]:
    """A folder outside pytest's private temp folder, so that another user can reach it."""
    root = Path(tempfile.mkdtemp(prefix="activememory-ro-"))
    root.chmod(0o755)
    yield root
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755)
    shutil.rmtree(root)


def chmod_public_read_only(root: Path) -> None:
    """Everyone may read `root`, nobody may write it (the copy's 0700 folders included)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)


@pytest.mark.parametrize("anyio_backend", ["trio"])  # two processes each: once is enough
@pytest.mark.sqlite_only("file permissions of a copy of the state directory")
async def test_an_unprivileged_reader_opens_a_read_only_copy(
    writer: am.Memory, public_dir: Path
) -> None:
    as_nobody: list[str] = []
    if os.geteuid() == 0:  # chmod stops no root: read as a user it does stop
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv to drop root")
        as_nobody = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
        # The virtual environment must be readable by that user (not so in a clone under a
        # private temp folder): without it this test cannot run, not fail.
        probe = await anyio.run_process(
            [*as_nobody, sys.executable, "-c", "import activememory"], check=False
        )
        if probe.returncode != 0:
            pytest.skip("the Python environment is not readable by an unprivileged user")
    live, stopped = public_dir / "live", public_dir / "stopped"
    shutil.copytree(writer.state_dir, live)  # with its -wal and -shm
    async with am.open_memory(stopped, config=TEXT_ONLY) as mem:
        await mem.sessions.append(ALICE, am.Message(role="user", content="I keep bees"))
    for copy in (live, stopped):
        chmod_public_read_only(copy)
        before = snapshot(copy)
        done = await anyio.run_process(
            [*as_nobody, sys.executable, "-c", READER, str(copy), ALICE], check=False
        )
        assert (done.returncode, done.stdout) == (0, b"1 1\n"), done.stderr.decode()
        assert snapshot(copy) == before


# -- PostgreSQL: the server keeps the connections read-only ---------------------------------


@pytest.mark.parametrize("anyio_backend", ["trio"])  # PostgreSQL runs once (pg_server.py)
async def test_on_postgresql_no_writer_runs_and_the_server_refuses_a_write(
    tmp_path: Path, pg_memory_dsn: str
) -> None:
    empty_store(pg_memory_dsn)
    dsn = pg_memory_dsn
    async with am.open_memory(tmp_path / "w", config=TEXT_ONLY, storage=dsn) as mem:
        await mem.sessions.append(ALICE, am.Message(role="user", content="I keep bees"))
    async with am.open_memory(tmp_path / "r", config=TEXT_ONLY, readonly=True, storage=dsn) as ro:
        agent = await ro._supervisor.agent("main")
        records = await ro._supervisor.records()
        assert agent.actor is None and agent.reconciler is None and records.actor is None
        # A write that got past `readonly_error` (a bug) still changes nothing: the server
        # runs every transaction of these connections read-only.
        sql = "UPDATE activememory.sessions SET archived = true"
        with pytest.raises(am.StorageError, match="cannot execute UPDATE in a read-only"):
            await agent.read(lambda reader: reader.conn.execute(sql))
        with pytest.raises(am.StorageError, match="cannot execute UPDATE in a read-only"):
            await records.read(lambda reader: reader.conn.execute(sql))
        assert not (await ro.sessions.info(ALICE)).archived
    assert not (tmp_path / "r").exists()  # the state directory is not needed


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_on_postgresql_a_store_missing_or_not_this_codes_is_a_clear_error(
    tmp_path: Path,
) -> None:
    import psycopg

    from activememory.storage.pg.db import SCHEMA_VERSION as PG_VERSION

    async def open_read_only(dsn: str) -> str:
        with pytest.raises(am.StorageError) as caught:
            async with am.open_memory(tmp_path / "r", config=TEXT_ONLY, readonly=True, storage=dsn):
                pass
        return str(caught.value)

    version = "SELECT value FROM activememory.activememory_meta WHERE key = 'schema_version'"
    with scratch_database() as dsn, psycopg.connect(dsn, autocommit=True) as admin:
        database = admin.info.dbname
        assert await open_read_only(dsn) == (
            f"storage.dsn: database {database!r} holds no activememory store (no schema "
            "activememory) and readonly=True never creates one; open it once without readonly"
        )
        exists = "SELECT to_regnamespace('activememory') IS NOT NULL"
        assert admin.execute(exists).fetchone() == (False,)  # nothing created
        async with am.open_memory(tmp_path / "w", config=TEXT_ONLY, storage=dsn):
            pass  # a writer makes the store
        for stored, message in [
            (1, f"storage.dsn: schema version 1 of database {database!r} is older than this "
             f"activememory's ({PG_VERSION}) and readonly=True never migrates; open it once "
             "without readonly (or with the activememory that wrote it)"),
            (99, "storage.dsn: schema version 99 is newer than this activememory understands "
             f"({PG_VERSION}); upgrade activememory"),
        ]:  # fmt: skip
            admin.execute(
                "UPDATE activememory.activememory_meta SET value = %s WHERE key = 'schema_version'",
                (str(stored),),
            )
            assert await open_read_only(dsn) == message
            assert admin.execute(version).fetchone() == (str(stored),)  # not migrated
    assert not (tmp_path / "r").exists()


def test_a_read_only_dsn_keeps_its_own_options() -> None:
    from activememory.storage.pg.db import PgSettings, connection_options

    given = "postgresql://u@h/db?options=-c%20statement_timeout%3D5000"
    assert connection_options(PgSettings(dsn=given, readonly=True)) == {
        "connect_timeout": 5,
        "options": "-c statement_timeout=5000 -c default_transaction_read_only=on",
    }
    assert connection_options(PgSettings(dsn=given)) == {"connect_timeout": 5}
