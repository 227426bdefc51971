"""Crash safety and faults on the PostgreSQL store (docs/design.md §11 "Crash safety and
faults").

* `kill -9` of a worker process appending flat out (tests/pg_race_child.py, rewinding now
  and then) to two shared sessions and its own, round after round, while a second worker
  appends the whole time: every acknowledged message is stored as acknowledged, every
  session is one tree whose active branch is its leaf's path, and the index holds exactly
  the active branches' messages. `ACTIVEMEMORY_PG_CRASH_ROUNDS` makes the run longer.
* Backends terminated (`pg_terminate_backend`): a batch or read that finds its connection
  gone runs once more on a new one (`reopen`); a batch whose connection goes during its
  commit is rejected with the server's answer and not retried; nothing unacknowledged is
  reported written, also under a writer appending flat out.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import psycopg
import psycopg.conninfo
import pytest

import activememory as am
from activememory.protocol.errors import StorageError
from activememory.protocol.indexer import Appended, AppendMessage, IndexerAck, Rejected
from activememory.storage.pg import db as pg_db
from activememory.storage.pg.db import SCHEMA, PgSettings, connect
from activememory.storage.pg.transcripts import (
    PgTranscriptReader,
    PgTranscriptWriter,
    index_integrity_ok,
)

from pg_server import fresh_agent, pg_dsn

__all__ = ["pg_dsn"]

CHILD = Path(__file__).with_name("pg_race_child.py")
ROUNDS = int(os.environ.get("ACTIVEMEMORY_PG_CRASH_ROUNDS", "10"))
REWIND_EVERY = 15
_S = SCHEMA


# -- the checks -----------------------------------------------------------------------------

# Each query counts violations of one invariant for one agent (every one must be 0).
TREE_CHECKS = {
    # seq numbers each session's events 1, 2, 3 ... (a killed transaction leaves no gap)
    "seq": f"SELECT count(*) FROM (SELECT session_id, count(*) AS n, max(seq) AS top"
    f" FROM {_S}.events WHERE agent = %(agent)s GROUP BY session_id) s WHERE n <> top",
    # a message's parent is a message of its session one level up
    "parent": f"SELECT count(*) FROM {_S}.events e LEFT JOIN {_S}.events p"
    " ON p.agent = e.agent AND p.id = e.parent_id WHERE e.agent = %(agent)s"
    " AND e.kind = 'message' AND CASE WHEN e.parent_id IS NULL THEN e.depth <> 1"
    " ELSE p.id IS NULL OR p.session_id <> e.session_id OR p.depth <> e.depth - 1"
    " OR p.kind <> 'message' END",
    # the active branch is the leaf's path: depths 1..leaf_depth, each the next one's parent
    "branch": f"SELECT count(*) FROM {_S}.active_branch a JOIN {_S}.events e"
    " ON e.agent = a.agent AND e.id = a.event_id WHERE a.agent = %(agent)s"
    " AND (e.session_id <> a.session_id OR e.depth <> a.depth OR (a.depth > 1 AND NOT EXISTS"
    f" (SELECT 1 FROM {_S}.active_branch p WHERE p.agent = a.agent"
    " AND p.session_id = a.session_id AND p.depth = a.depth - 1 AND p.event_id = e.parent_id)))",
    "leaf": f"SELECT count(*) FROM {_S}.sessions s WHERE s.agent = %(agent)s AND"
    f" ((SELECT count(*) FROM {_S}.active_branch a WHERE a.agent = s.agent"
    "  AND a.session_id = s.id) <> s.leaf_depth"
    f" OR s.leaf_event_id IS DISTINCT FROM (SELECT a.event_id FROM {_S}.active_branch a"
    "  WHERE a.agent = s.agent AND a.session_id = s.id AND a.depth = s.leaf_depth))",
    # clean sessions: every active-branch message with text indexed once, at its place...
    "unindexed": f"SELECT count(*) FROM {_S}.active_branch a JOIN {_S}.events e"
    " ON e.agent = a.agent AND e.id = a.event_id"
    f" JOIN {_S}.sessions s ON s.agent = a.agent AND s.id = a.session_id"
    " WHERE a.agent = %(agent)s AND NOT s.dirty AND e.text IS NOT NULL AND NOT EXISTS"
    f" (SELECT 1 FROM {_S}.message_index i WHERE i.agent = a.agent AND i.event_id = a.event_id"
    " AND i.session_id = a.session_id AND i.depth = a.depth)",
    # ... and nothing off it
    "off_branch": f"SELECT count(*) FROM {_S}.message_index i"
    f" JOIN {_S}.sessions s ON s.agent = i.agent AND s.id = i.session_id"
    " WHERE i.agent = %(agent)s AND NOT s.dirty AND NOT EXISTS"
    f" (SELECT 1 FROM {_S}.active_branch a WHERE a.agent = i.agent"
    " AND a.session_id = i.session_id AND a.depth = i.depth AND a.event_id = i.event_id)",
}


def violations(conn: psycopg.Connection[Any], agent: str) -> dict[str, int]:
    """The invariants of TREE_CHECKS that do not hold, with their counts."""
    found = {
        name: int(conn.execute(sql, {"agent": agent}).fetchone()[0])  # type: ignore[index]
        for name, sql in TREE_CHECKS.items()
    }
    if not index_integrity_ok(conn, agent):
        found["index_counters"] = 1
    return {name: n for name, n in found.items() if n}


def check_acked_are_stored(
    conn: psycopg.Connection[Any], agent: str, acked: list[dict[str, Any]]
) -> None:
    stored = {
        int(row[0]): (str(row[1]), row[2], int(row[3]), bytes(row[4]).decode())
        for row in conn.execute(
            f"SELECT e.id, s.key, e.parent_id, e.seq, e.text FROM {_S}.events e"
            f" JOIN {_S}.sessions s ON s.agent = e.agent AND s.id = e.session_id"
            " WHERE e.agent = %s AND e.kind = 'message'",
            (agent,),
        ).fetchall()
    }
    missing = [
        a for a in acked if stored.get(a["id"]) != (a["key"], a["parent"], a["seq"], a["text"])
    ]
    assert missing == [], f"{len(missing)} acknowledged messages not stored as acked: {missing[:3]}"


# -- kill -9 ----------------------------------------------------------------------------------


class Worker:
    """A child appending flat out; its acknowledgements go to a file, a line per batch."""

    def __init__(self, dsn: str, agent: str, name: str, seed: str, acks: Path) -> None:
        self.acks = acks
        self._out: IO[str] = acks.open("a")
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD), dsn, agent, name, "0", seed, str(REWIND_EVERY)],
            stdin=subprocess.PIPE,
            stdout=self._out,
            text=True,
        )

    def start(self) -> None:
        # `ready` went to the file; the child waits for a line before its first batch
        deadline = time.monotonic() + 60
        while "ready" not in self.acks.read_text():
            assert self.process.poll() is None, "the worker died before it was ready"
            assert time.monotonic() < deadline, "the worker never got ready"
            time.sleep(0.02)
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def batches(self) -> int:
        return self.acks.read_text().count("\n") - 1

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        self._out.close()


def acknowledged(files: list[Path]) -> tuple[list[dict[str, Any]], int]:
    """The appends acknowledged in the ack files, and how many rewinds."""
    appends: list[dict[str, Any]] = []
    rewinds = 0
    for path in files:
        for line in path.read_text().splitlines(keepends=True):
            if not line.endswith("\n") or line.strip() == "ready":
                continue  # a line cut by the kill was never a whole acknowledgement
            for ack in json.loads(line):
                if "rewound" in ack:
                    rewinds += 1
                else:
                    appends.append(ack)
    return appends, rewinds


def test_kill_9_of_a_worker_loses_nothing_acknowledged(pg_dsn: str, tmp_path: Path) -> None:
    agent = fresh_agent("crash")
    rng = random.Random(20261201)
    survivor = Worker(pg_dsn, agent, "steady", "steady", tmp_path / "steady.jsonl")
    files = [survivor.acks]
    victims: list[Worker] = []
    try:
        survivor.start()
        for round_ in range(ROUNDS):
            # the same name each round: a restarted worker goes on with its own session
            victim = Worker(pg_dsn, agent, "victim", f"v{round_}", tmp_path / f"v{round_}.jsonl")
            victims.append(victim)
            files.append(victim.acks)
            victim.start()
            deadline = time.monotonic() + 30
            while victim.batches() < 3:  # it is appending: kill it somewhere in the flow
                assert victim.process.poll() is None and time.monotonic() < deadline
                time.sleep(0.005)
            time.sleep(rng.uniform(0.0, 0.4))
            victim.kill()
            assert survivor.process.poll() is None, "the second worker stopped"
        before = survivor.batches()
        time.sleep(0.2)
        assert survivor.batches() > before, "the second worker no longer appends"
    finally:
        survivor.kill()
        for victim in victims:
            if victim.process.poll() is None:
                victim.kill()

    acked, rewinds = acknowledged(files)
    conn = connect(PgSettings(dsn=pg_dsn))
    conn.autocommit = True
    check_acked_are_stored(conn, agent, acked)
    assert violations(conn, agent) == {}
    stats = PgTranscriptReader(conn, agent).stats()
    assert stats.dirty_sessions == 0 and stats.fts_integrity_ok
    # Every victim acknowledged something, and rewinds happened (else the index check
    # proved less than it says).
    per_victim = [acknowledged([v.acks])[0] for v in victims]
    assert all(per_victim) and rewinds > 0
    print(
        f"{ROUNDS} kill -9 rounds: {len(acked)} acknowledged appends and {rewinds} rewinds, all stored"
    )
    conn.close()


# -- pg_terminate_backend ---------------------------------------------------------------------

KEY = am.parse_session_key("agent:main:direct:alice")


def _append(writer: PgTranscriptWriter, *texts: str) -> list[IndexerAck]:
    return writer.apply(
        [AppendMessage(key=KEY, message=am.Message(role="user", content=t), at=1.0) for t in texts]
    )


def _terminate(admin: psycopg.Connection[Any], pid: int) -> None:
    admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
def admin(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    conn = psycopg.connect(pg_dsn, autocommit=True)
    yield conn
    conn.close()


Opener = Callable[[PgSettings], tuple[psycopg.Connection[Any], pg_db.Reopen, Callable[[], None]]]


def _by_connecting(
    settings: PgSettings,
) -> tuple[psycopg.Connection[Any], pg_db.Reopen, Callable[[], None]]:
    return connect(settings), pg_db.reopen_connection(settings), lambda: None


def _from_a_pool(
    settings: PgSettings,
) -> tuple[psycopg.Connection[Any], pg_db.Reopen, Callable[[], None]]:
    pool = pg_db.open_pool(settings)
    return pool.getconn(), pg_db.reopen_from_pool(pool), pool.close


@pytest.mark.parametrize("opener", [_by_connecting, _from_a_pool], ids=["connect", "pool"])
def test_a_batch_that_finds_its_connection_terminated_runs_on_a_new_one(
    pg_dsn: str, admin: psycopg.Connection[Any], opener: Opener
) -> None:
    # The backend went while the writer was idle: the batch fails before COMMIT is sent,
    # so the server rolled it back and the writer may safely run it once more.
    settings = PgSettings(dsn=pg_dsn)
    conn, reopen, close = opener(settings)
    writer = PgTranscriptWriter(conn, fresh_agent(), reopen=reopen)
    assert all(isinstance(ack, Appended) for ack in _append(writer, "kept"))
    lost = writer.conn.info.backend_pid
    _terminate(admin, lost)
    # The same writer, a new connection: no new writer was made, nothing rejected.
    assert all(isinstance(ack, Appended) for ack in _append(writer, "after 1", "after 2"))
    assert writer.conn.info.backend_pid != lost
    reader = PgTranscriptReader(connect(settings), writer.agent)
    history = reader.history(KEY.raw)
    assert history is not None
    assert [e.message.content for e in history] == ["kept", "after 1", "after 2"]  # type: ignore[union-attr]
    assert violations(reader.conn, writer.agent) == {}
    reader.conn.close()
    writer.conn.close()
    close()


@pytest.mark.parametrize("opener", [_by_connecting, _from_a_pool], ids=["connect", "pool"])
def test_a_batch_whose_connection_goes_during_commit_is_rejected_not_retried(
    pg_dsn: str, admin: psycopg.Connection[Any], opener: Opener
) -> None:
    # A deferred trigger runs at COMMIT and ends its own backend when it sees the marked
    # message: the client cannot know whether the server committed, so the batch is
    # rejected and never run again (a retry could store it twice); the next one reconnects.
    marker = "die at commit"
    settings = PgSettings(dsn=pg_dsn)
    conn, reopen, close = opener(settings)  # makes the schema
    admin.execute(
        f"""CREATE SEQUENCE IF NOT EXISTS {_S}.commit_kills;
        CREATE OR REPLACE FUNCTION {_S}.kill_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.text = convert_to('{marker}', 'UTF8') THEN
                PERFORM nextval('{_S}.commit_kills');
                PERFORM pg_terminate_backend(pg_backend_pid());
                PERFORM pg_sleep(5);
            END IF;
            RETURN NULL;
        END $$;
        DROP TRIGGER IF EXISTS kill_at_commit ON {_S}.events;
        CREATE CONSTRAINT TRIGGER kill_at_commit AFTER INSERT ON {_S}.events
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {_S}.kill_at_commit();"""
    )
    try:
        writer = PgTranscriptWriter(conn, fresh_agent(), reopen=reopen)
        assert all(isinstance(ack, Appended) for ack in _append(writer, "kept"))
        acks = _append(writer, "with it", marker)
        assert [type(ack) for ack in acks] == [Rejected, Rejected]
        assert all(a.reason == "storage" and "terminat" in a.message for a in acks)  # type: ignore[union-attr]
        kills = admin.execute(f"SELECT last_value FROM {_S}.commit_kills").fetchone()
        assert kills == (1,)  # run once: not retried on the new connection
        assert all(isinstance(ack, Appended) for ack in _append(writer, "after"))
        reader = PgTranscriptReader(connect(settings), writer.agent)
        history = reader.history(KEY.raw)
        assert history is not None
        assert [e.message.content for e in history] == ["kept", "after"]  # type: ignore[union-attr]
        assert violations(reader.conn, writer.agent) == {}
        reader.conn.close()
        writer.conn.close()
        close()
    finally:
        admin.execute(
            f"DROP TRIGGER kill_at_commit ON {_S}.events; DROP SEQUENCE {_S}.commit_kills"
        )


def test_without_reopen_a_lost_connection_stays_lost(
    pg_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    writer = PgTranscriptWriter(connect(PgSettings(dsn=pg_dsn)), fresh_agent())
    _terminate(admin, writer.conn.info.backend_pid)
    for _ in range(2):
        (ack,) = _append(writer, "lost")
        assert isinstance(ack, Rejected) and ack.reason == "storage"


@pytest.mark.parametrize("opener", [_by_connecting, _from_a_pool], ids=["connect", "pool"])
def test_a_read_that_finds_its_connection_terminated_runs_on_a_new_one(
    pg_dsn: str, admin: psycopg.Connection[Any], opener: Opener
) -> None:
    settings = PgSettings(dsn=pg_dsn)
    writer = PgTranscriptWriter(connect(settings), fresh_agent())
    _append(writer, "hello")
    conn, reopen, close = opener(settings)
    reader = PgTranscriptReader(conn, writer.agent, reopen=reopen)
    assert len(reader.sessions()) == 1
    lost = reader.conn.info.backend_pid
    _terminate(admin, lost)
    history = reader.history(KEY.raw)  # on a new connection: a read changes nothing
    assert reader.conn.info.backend_pid != lost
    assert history is not None and len(history) == 1
    assert reader.stats().events == 1
    reader.conn.close()
    writer.conn.close()
    close()


def test_a_writer_appending_flat_out_survives_terminated_backends(
    pg_dsn: str, admin: psycopg.Connection[Any]
) -> None:
    agent = fresh_agent("fault")
    name = f"am_fault_{agent}"
    settings = PgSettings(dsn=psycopg.conninfo.make_conninfo(pg_dsn, application_name=name))
    writer = PgTranscriptWriter(connect(settings), agent, reopen=pg_db.reopen_connection(settings))
    keys = [am.parse_session_key(f"agent:main:direct:u{i}") for i in range(3)]
    results: list[tuple[list[str], list[IndexerAck]]] = []
    stop = threading.Event()

    def append_flat_out() -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            texts = [f"message {n} {i}" for i in range(1 + n % 3)]
            batch = [
                AppendMessage(
                    key=keys[(n + i) % 3], message=am.Message(role="user", content=t), at=1.0
                )
                for i, t in enumerate(texts)
            ]
            results.append((texts, writer.apply(batch)))

    thread = threading.Thread(target=append_flat_out)
    thread.start()
    terminated = 0
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            time.sleep(random.uniform(0.05, 0.15))
            terminated += admin.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = %s",
                (name,),
            ).fetchone()[0]  # type: ignore[index]
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    # With the faults over, the same writer appends again (its connection may have gone
    # after the loop's last batch: this one then runs on a new one).
    last = [AppendMessage(key=keys[0], message=am.Message(role="user", content="after"), at=1.0)]
    results.append((["after"], writer.apply(last)))

    acked = [
        {"id": a.event.id, "key": a.event.session_key, "parent": a.event.parent_id,
         "seq": a.event.seq, "text": text}
        for texts, acks in results for text, a in zip(texts, acks, strict=True)
        if isinstance(a, Appended)
    ]  # fmt: skip
    rejected = [a for _, acks in results for a in acks if isinstance(a, Rejected)]
    assert terminated > 5, terminated
    assert all(a.reason == "storage" for a in rejected)
    # Every batch is all appended or all rejected; appends resumed after each fault.
    assert all(len({type(a) for a in acks}) == 1 for _, acks in results)
    assert isinstance(results[-1][1][0], Appended)
    conn = connect(PgSettings(dsn=pg_dsn))
    check_acked_are_stored(conn, agent, acked)
    assert violations(conn, agent) == {}
    conn.close()
    writer.conn.close()


def test_the_checks_see_a_broken_tree_and_index(pg_dsn: str) -> None:
    # The checker must fail on what it is meant to catch, else the tests above prove nothing.
    writer = PgTranscriptWriter(connect(PgSettings(dsn=pg_dsn)), fresh_agent())
    _append(writer, "one", "two", "three")
    conn = connect(PgSettings(dsn=pg_dsn))
    conn.autocommit = True
    assert violations(conn, writer.agent) == {}
    breakages = {
        "unindexed": f"DELETE FROM {_S}.message_index WHERE agent = %(agent)s AND depth = 2",
        "off_branch": f"DELETE FROM {_S}.active_branch WHERE agent = %(agent)s AND depth = 3",
        "seq": f"UPDATE {_S}.events SET seq = seq + 10 WHERE agent = %(agent)s AND depth = 3",
    }
    for name, sql in breakages.items():
        with conn.transaction():
            conn.execute(sql, {"agent": writer.agent})
            assert name in violations(conn, writer.agent)
            raise psycopg.Rollback()  # the next breakage starts from the sound store
    assert violations(conn, writer.agent) == {}
    conn.close()
    writer.conn.close()


# -- a stopped server: on a private cluster, never the shared one ---------------------------

PG_BIN = Path(os.environ.get("ACTIVEMEMORY_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


def _listenable_port() -> int:
    """A port nothing listens on, below the kernel's ephemeral range: an outgoing connection
    (another test's, to the shared server) never takes it, not even between the cluster's
    stop and start. (55000 + pid once met such a connection: "could not bind".)"""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    candidates = list(range(20000, max(20001, min(low, 32768))))
    random.Random(os.getpid()).shuffle(candidates)
    for port in candidates[:200]:
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range for a private cluster")


class PrivateCluster:
    """A throw-away cluster in a temporary directory on its own port, which a test may stop
    and start (the shared server stays up for the other test files)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = _listenable_port()
        self.dsn = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        # initdb refuses to run as root: then the cluster is the postgres user's
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(root, user="postgres")

    def _run(self, *args: str) -> None:
        subprocess.run([*self._as, *args], check=True, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(str(PG_BIN / "initdb"), "-D", str(self.root / "data"), "-A", "trust",
                  "-U", "postgres", "-E", "UTF8", "--no-sync")  # fmt: skip

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.root / "data"), "-o", options,
                  "-l", str(self.root / "log"), "-w", "start")  # fmt: skip

    def stop(self) -> None:
        # immediate: the server dies as in a crash, and recovers from its log at start
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.root / "data"), "-m", "immediate",
                  "-w", "stop")  # fmt: skip


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"no PostgreSQL binaries in {PG_BIN} for a private cluster")
    # Not under pytest's tmp_path: the postgres user must be able to reach the directory.
    root = Path(tempfile.mkdtemp(prefix="activememory_cluster_"))
    try:
        made = PrivateCluster(root)
        made.init()
        made.start()
        try:
            yield made
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                made.stop()  # unless the test left it stopped
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("pooled", [False, True], ids=["connect", "pool"])
def test_a_stopped_server_rejects_then_the_same_writer_and_reader_recover(
    cluster: PrivateCluster, pooled: bool
) -> None:
    settings = PgSettings(dsn=cluster.dsn)
    pool = pg_db.open_pool(settings) if pooled else None
    if pool is None:
        reopen = pg_db.reopen_connection(settings)
        conns = connect(settings), connect(settings)
    else:
        reopen = pg_db.reopen_from_pool(pool, timeout=0.5)
        conns = pool.getconn(), pool.getconn()
    writer = PgTranscriptWriter(conns[0], fresh_agent(), reopen=reopen)
    reader = PgTranscriptReader(conns[1], writer.agent, reopen=reopen)
    assert all(isinstance(ack, Appended) for ack in _append(writer, "kept"))
    cluster.stop()
    # The lost connection, then no server to reconnect to: both rejected, saying why.
    lost = [ack for text in ("lost 1", "lost 2") for ack in _append(writer, text)]
    assert [(type(a), getattr(a, "reason", None)) for a in lost] == [(Rejected, "storage")] * 2
    why = "no live connection from the pool" if pooled else "Connection refused"
    assert why in str(lost[1])
    for _ in range(2):
        with pytest.raises(StorageError):
            reader.sessions()
    cluster.start()
    if pool is not None:
        pool.wait(timeout=30)  # the pool reconnects on its own schedule (back-off)
    assert all(isinstance(ack, Appended) for ack in _append(writer, "after"))
    history = reader.history(KEY.raw)
    assert history is not None
    assert [e.message.content for e in history] == ["kept", "after"]  # type: ignore[union-attr]
    assert violations(reader.conn, writer.agent) == {}
    if pool is None:
        writer.conn.close()
        reader.conn.close()
    else:
        pool.close()
