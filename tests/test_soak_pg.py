"""The load soak on PostgreSQL: several worker processes sharing the sessions.

One 15-second soak with 3 workers (20 sessions, 20 appends/s, 5 recalls/s overall) with
faults on runs through the CLI in a database of this test session's server: the chaos
model, and kill -9 of a worker at random (restarted, the others running). Its report must
PASS (a)-(c) and (e). Then the verifier itself is checked on copies of that database, one
with an acknowledged message deleted, one with an index row changed: each must FAIL. The merge rule of several
workers' ack logs (`replay_merged`) is checked as a table; the command's refusals without
a server run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
import trio

from activememory.simulations import soak
from activememory.simulations.soak import Op, Snapshot, StoredEvent, replay_merged

from pg_server import ADMIN_DSN, dsn_of, scratch_database

WORKERS = 3
SOAK_ARGS = [
    "--sessions", "20", "--append-rate", "20", "--recall-rate", "5", "--duration", "15",
    "--kill-every", "3,6", "--steady", "5", "--seed", "7", "--faults", "--json",
    "--workers", str(WORKERS),
]  # fmt: skip
# The soak takes ~16 s plus its checks; this bounds a hang (the soak's own bounds failing).
WALL_BUDGET = 90.0
KEY = "agent:main:direct:u0001"


@pytest.fixture(scope="module")
def soaked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(state dir, DSN of the soak's database, report): a database named by the test is
    kept by the soak, for the verifier's tests."""
    state_dir = tmp_path_factory.mktemp("soak-pg") / "state"
    with scratch_database() as dsn:
        argv = [sys.executable, "-m", "activememory", "soak", *SOAK_ARGS]
        argv += ["--storage", dsn, "--state-dir", str(state_dir)]
        # Its own process group: on a hang, the workers go down with it.
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            out, err = proc.communicate(timeout=WALL_BUDGET)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            pytest.fail(f"the soak did not finish in {WALL_BUDGET:.0f} s")
        assert proc.returncode in (0, 1), err.decode()[-3000:]
        yield state_dir, dsn, json.loads(out)


@pytest.mark.slow
def test_multi_worker_soak_on_postgresql_passes(soaked: tuple[Path, str, dict[str, Any]]) -> None:
    state_dir, _, report = soaked
    checks = {c["name"]: c["result"] for c in report["checks"]}
    seen = {k: report[k] for k in ("checks", "run", "throughput")}
    assert [checks[n] for n in "abce"] == ["PASS"] * 4, seen
    assert checks.get("run") != "FAIL", seen
    assert report["soak"]["workers"] == WORKERS and report["soak"]["storage"] == "postgresql"
    # Every worker ran and wrote its own ack log; a worker was killed and restarted.
    assert all((state_dir / f"soak-acks-{w}.jsonl").exists() for w in range(WORKERS))
    assert report["run"]["kills"] >= 1, seen
    assert report["run"]["workload_runs"] >= WORKERS + report["run"]["kills"], seen
    # The workers shared the sessions: rewinds took acknowledged messages off the branch.
    assert report["throughput"]["messages_acked"] > 150, seen
    assert report["throughput"]["rewinds_acked"] >= 1, seen
    assert report["verify"]["rows_compared_after_rebuild"] > 100, report["verify"]
    assert report["environment"]["postgresql"]["database_kept"] is True
    assert report["ok"] is True


def verify_copy(
    dsn: str, state_dir: Path, plant: Sequence[str], params: Mapping[str, object]
) -> soak.Verification:
    """The verifier on a copy of the soak's database with the statements of `plant` run
    in it first."""
    source = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    copy = f"{source}_planted"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{copy}" TEMPLATE "{source}"')
        try:
            with psycopg.connect(dsn_of(copy)) as conn:
                for statement in plant:
                    conn.execute(statement, params)
            logs = [state_dir / f"soak-acks-{w}.jsonl" for w in range(WORKERS)]
            return trio.run(soak.verify, state_dir, soak.read_ack_logs(logs), dsn_of(copy))
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{copy}" WITH (FORCE)')


def acked_leaf(dsn: str, state_dir: Path) -> tuple[str, int]:
    """An acknowledged message (marker, event id) no other event hangs under."""
    acked = soak.read_ack_logs([state_dir / f"soak-acks-{w}.jsonl" for w in range(WORKERS)])
    ids = {
        op.event_id: op.marker
        for ops in acked.sessions.values()
        for op in ops
        if op.kind == "append" and op.state == "acked" and not op.by_reply
    }
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT e.id FROM activememory.events e WHERE e.kind = 'message' AND NOT EXISTS"
            " (SELECT 1 FROM activememory.events c WHERE c.agent = e.agent"
            "  AND c.parent_id = e.id) ORDER BY e.id"
        ).fetchall()
    event_id = next(int(r[0]) for r in rows if int(r[0]) in ids)
    marker = ids[event_id]
    assert marker is not None
    return marker, event_id


@pytest.mark.slow
def test_verifier_finds_an_acknowledged_message_deleted_on_postgresql(
    soaked: tuple[Path, str, dict[str, Any]],
) -> None:
    state_dir, dsn, _ = soaked
    marker, event_id = acked_leaf(dsn, state_dir)
    found = verify_copy(
        dsn,
        state_dir,
        [
            "DELETE FROM activememory.message_index WHERE event_id = %(id)s",
            "DELETE FROM activememory.active_branch WHERE event_id = %(id)s",
            "DELETE FROM activememory.events WHERE id = %(id)s",
        ],
        {"id": event_id},
    )
    assert any(
        f"acknowledged message {marker} (event {event_id}) is not in the store: LOST" in p
        for p in found.lost
    ), found.lost


@pytest.mark.slow
def test_verifier_finds_an_index_row_that_differs_on_postgresql(
    soaked: tuple[Path, str, dict[str, Any]],
) -> None:
    state_dir, dsn, _ = soaked
    with psycopg.connect(dsn) as conn:
        # A row of a clean session: rebuild_index() leaves it as it is.
        row = conn.execute(
            "SELECT max(i.event_id) FROM activememory.message_index i"
            " JOIN activememory.sessions s ON s.agent = i.agent AND s.id = i.session_id"
            " WHERE NOT s.dirty"
        ).fetchone()
    assert row is not None and row[0] is not None
    event_id = int(row[0])
    found = verify_copy(
        dsn,
        state_dir,
        ["UPDATE activememory.message_index SET terms = 'planted:1A' WHERE event_id = %(id)s"],
        {"id": event_id},
    )
    assert found.lost == []
    assert found.index and all(
        f"row {event_id} holds" in p and "'planted':1A" in p for p in found.index
    ), found.index


# -- the merge rule of several workers' ack logs (a table) ------------------------------------


def snapshot(*events: StoredEvent) -> Snapshot:
    return Snapshot(
        sessions={KEY: (1, False)},
        events={e.event_id: e for e in events},
        by_session={1: list(events)},
        fts={},
    )


def message(event_id: int, parent: int | None, seq: int) -> StoredEvent:
    return StoredEvent(event_id, 1, parent, seq, "message", f"mk0q{event_id}z", None, "t")


def rewind(event_id: int, to: int, seq: int) -> StoredEvent:
    return StoredEvent(event_id, 1, None, seq, "rewind", None, to, None)


def appended(event_id: int, parent: int | None, seq: int, state: str = "acked") -> Op:
    return Op(
        "append",
        state,
        f"mk0q{event_id}z",
        "t",
        event_id,
        parent,
        True,
        seq=seq,  # type: ignore[arg-type]
    )


def replay(ops: list[Op], *events: StoredEvent) -> tuple[list[int], list[str]]:
    problems: list[str] = []
    branch, _ = replay_merged(KEY, ops, list(events), snapshot(*events), problems)
    return branch, problems


def test_an_append_rewound_off_by_another_worker_is_not_lost() -> None:
    # Worker 0 appends 1 and 2; worker 1 rewinds to 1 and appends 4 (seq order = commit order).
    ops = [appended(1, None, 1), appended(2, 1, 2)]  # worker 0's log
    ops += [Op("rewind", "acked", to=1), appended(4, 1, 4)]  # worker 1's log
    events = (message(1, None, 1), message(2, 1, 2), rewind(3, 1, 3), message(4, 1, 4))
    assert replay(ops, *events) == ([1, 4], [])


def test_a_rewind_to_the_leaf_writes_nothing_and_is_not_lost() -> None:
    ops = [appended(1, None, 1), Op("rewind", "acked", to=1)]
    assert replay(ops, message(1, None, 1)) == ([1], [])


def test_an_acknowledged_rewind_missing_from_the_store_is_lost() -> None:
    ops = [appended(1, None, 1), appended(2, 1, 2), Op("rewind", "acked", to=3)]
    _, problems = replay(ops, message(1, None, 1), message(2, 1, 2))
    assert problems == [f"{KEY}: acknowledged rewind to 3 is not in the store: LOST"]


def test_an_acknowledged_append_under_another_leaf_than_acknowledged_fails() -> None:
    # Acknowledged under 1 at seq 2, but stored at seq 3 after a rewind: not as acknowledged.
    ops = [appended(1, None, 1), appended(2, 1, 2)]
    _, problems = replay(ops, message(1, None, 1), message(2, 1, 3))
    assert problems == [
        f"{KEY}: message mk0q2z acknowledged as event 2 (seq 2), stored as 2 (seq 3)"
    ]


def test_an_in_flight_append_may_be_stored_or_not_a_rejected_one_never() -> None:
    ops = [appended(1, None, 1), appended(2, 1, 2, "in_flight")]
    assert replay(ops, message(1, None, 1)) == ([1], [])
    assert replay(ops, message(1, None, 1), message(2, 1, 2)) == ([1, 2], [])
    ops = [appended(1, None, 1), appended(2, 1, 2, "rejected")]
    _, problems = replay(ops, message(1, None, 1), message(2, 1, 2))
    assert problems == [
        f"{KEY}: stored event 2 (seq 2, message mk0q2z) matches no operation of the ack logs"
    ]


# -- the command's refusals -------------------------------------------------------------------


def test_several_workers_need_postgresql() -> None:
    with pytest.raises(SystemExit) as exited:
        soak.parse_args(["--workers", "2"])
    assert exited.value.code == 2


def test_several_workers_error_names_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        soak.parse_args(["--workers", "4"])
    assert capsys.readouterr().err.splitlines()[-1] == (
        "activememory soak: error: --workers: 4 workers need --storage (a PostgreSQL "
        "connection string): SQLite has one writer process"
    )


def test_a_named_database_holding_a_store_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with scratch_database() as dsn:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA activememory")
        name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
        code = soak.main(["--storage", dsn, "--duration", "1", "--state-dir", str(tmp_path / "s")])
    assert code == 2
    assert (
        f"--storage: database {name!r} already holds a store (schema activememory); name an "
        "empty database, or none (the soak then creates its own)"
    ) in capsys.readouterr().err


def test_without_a_database_name_the_soak_makes_its_own_and_drops_it() -> None:
    server = psycopg.conninfo.make_conninfo(
        **{k: v for k, v in psycopg.conninfo.conninfo_to_dict(ADMIN_DSN).items() if k != "dbname"}
    )
    with soak.soak_database(server) as (dsn, name, kept):
        assert not kept and name.startswith("activememory_soak_")
        with psycopg.connect(dsn) as conn:
            assert conn.info.dbname == name
    with psycopg.connect(ADMIN_DSN) as admin:
        left = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    assert left is None


def test_workers_on_postgresql_embed_only_with_a_model_named() -> None:
    # N workers would each load and run the default model: text only unless --embedder.
    text_only = soak.soak_config(300, None, postgresql=True)
    assert text_only["agents"] == {"defaults": {"memorySearch": {"provider": "none"}}}
    named = soak.soak_config(300, "all-MiniLM-L6-v2", postgresql=True)
    assert named["agents"] == {"defaults": {"memorySearch": {"model": "all-MiniLM-L6-v2"}}}
    assert "agents" not in soak.soak_config(300)  # SQLite: the default model
    args = soak.parse_args(["--storage", "postgresql://x/y", "--embedder", "all-MiniLM-L6-v2"])
    assert args.embedder == "all-MiniLM-L6-v2"


def test_the_dsn_is_not_on_a_workers_command_line(tmp_path: Path) -> None:
    # `ps` shows command lines to every local user: the DSN (and its password) goes by
    # the environment.
    dsn = "postgresql://bot:s3cret@db/memory"
    args = soak.parse_args(["--storage", dsn, "--workers", "4"])
    argv = soak.child_argv(args, tmp_path, 5, 0.0, worker=2, storage=dsn)
    assert not any("s3cret" in arg for arg in argv)
    assert argv[argv.index("--ack-log") + 1] == "soak-acks-2.jsonl"
    assert "--storage-env" in argv
    assert argv[argv.index("--append-rate") + 1] == "12.5"  # a quarter of the default 50


def test_storage_sqlite_is_the_state_directory() -> None:
    assert soak.parse_args(["--storage", "sqlite"]).storage is None
    with pytest.raises(SystemExit):
        soak.parse_args(["--storage", "sqlite", "--workers", "2"])
