"""Two OS processes appending to the same PostgreSQL sessions keep one consistent tree
(docs/design.md §11): every event's parent is the session's leaf at its append, seq grows
by one, ids grow with seq, nothing acknowledged is lost, the index holds every message."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

from activememory.storage.pg.db import SCHEMA, PgSettings, connect
from activememory.storage.pg.transcripts import PgTranscriptReader

from pg_server import fresh_agent, pg_dsn

__all__ = ["pg_dsn"]

CHILD = Path(__file__).with_name("pg_race_child.py")
PER_WORKER = 150


def test_two_processes_appending_to_one_session_keep_one_tree(pg_dsn: str) -> None:
    agent = fresh_agent("race")
    workers = [
        subprocess.Popen(
            [sys.executable, str(CHILD), pg_dsn, agent, name, str(PER_WORKER), name],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for name in ("w1", "w2")
    ]
    try:
        for worker in workers:  # both connected and waiting: then both start at once
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write("go\n")
            worker.stdin.flush()
        outputs = [worker.communicate(timeout=120)[0] for worker in workers]
    finally:
        for worker in workers:
            worker.kill()
    assert [w.returncode for w in workers] == [0, 0]
    acked = [ack for out in outputs for line in out.splitlines() for ack in json.loads(line)]
    assert len(acked) == 2 * PER_WORKER

    conn = connect(PgSettings(dsn=pg_dsn))
    reader = PgTranscriptReader(conn, agent)
    switches = 0
    keys = ("agent:main:direct:shared", "agent:main:group:g", "agent:main:direct:w1")
    for key in (*keys, "agent:main:direct:w2"):
        rows = conn.execute(
            f"SELECT e.id, e.parent_id, e.seq FROM {SCHEMA}.events e JOIN {SCHEMA}.sessions s"
            " ON s.agent = e.agent AND s.id = e.session_id"
            " WHERE e.agent = %s AND s.key = %s ORDER BY e.seq",
            (agent, key),
        ).fetchall()
        mine = sorted((a for a in acked if a["key"] == key), key=lambda a: a["seq"])
        # Nothing lost, nothing extra: the stored events are exactly the acknowledged ones.
        assert [(a["id"], a["parent"], a["seq"]) for a in mine] == [tuple(r) for r in rows]
        assert [r[2] for r in rows] == list(range(1, len(rows) + 1))  # seq: 1, 2, 3, ...
        assert [r[1] for r in rows] == [None] + [r[0] for r in rows[:-1]]  # parent = leaf
        assert all(a[0] < b[0] for a, b in itertools.pairwise(rows))  # ids grow
        history = reader.history(key)
        assert history is not None and [e.id for e in history] == [r[0] for r in rows]
        authors = [str(a["text"]).split()[0] for a in mine]
        switches += sum(a != b for a, b in itertools.pairwise(authors))
    sessions = reader.sessions()
    assert sorted(s.key for s in sessions) == sorted([*keys, "agent:main:direct:w2"])
    assert sorted(s.session_id for s in sessions) == [1, 2, 3, 4]
    stats = reader.stats()
    assert (stats.events, stats.indexed_messages, stats.dirty_sessions) == (2 * PER_WORKER,) * 2 + (
        0,
    )
    assert stats.fts_integrity_ok
    # The workers really interleaved in the sessions (else this proved nothing).
    assert switches > 0
    conn.close()
