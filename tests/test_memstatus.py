"""SQLite's memory statistics are off in a process of ours unless that would touch a host's
connections (storage/memstatus.py). Each case runs in a fresh interpreter: the setting is
the process's, fixed before its first connection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from activememory.storage.memstatus import MEMSTATUS_ENV

PROBE = """
import json, sys, apsw, trio
import activememory as am
from activememory.storage.memstatus import sqlite_memory_statistics

host = apsw.Connection(":memory:") if sys.argv[2] == "host" else None
after_import = len(apsw.connections()) - (host is not None)

async def main():
    async with am.open_memory(sys.argv[1], config={"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}) as mem:
        await mem.sessions.append("agent:main:main", am.Message(role="user", content="hello there"))
        hits = await mem.sessions.search("hello", caller="agent:main:main")
        return len(hits.results)

found = trio.run(main)
if host is not None:
    host.execute("CREATE TABLE t(x)")  # the host's connection still works
print(json.dumps({"after_import": after_import, "found": found,
                  "statistics": sqlite_memory_statistics(), "used": apsw.memory_used()}))
"""


def _probe(tmp_path: Path, host: str = "none", env: str | None = None) -> dict[str, object]:
    environ = {k: v for k, v in os.environ.items() if k != MEMSTATUS_ENV}
    if env is not None:
        environ[MEMSTATUS_ENV] = env
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "state"), host],
        capture_output=True, text=True, env=environ, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_statistics_are_off_and_an_import_opens_no_connection(tmp_path: Path) -> None:
    probe = _probe(tmp_path)
    assert probe == {"after_import": 0, "found": 1, "statistics": False, "used": 0}


def test_a_host_connection_keeps_them_on(tmp_path: Path) -> None:
    probe = _probe(tmp_path, host="host")
    assert probe["statistics"] is True and probe["found"] == 1
    assert isinstance(probe["used"], int) and probe["used"] > 0


def test_the_environment_can_keep_them_on(tmp_path: Path) -> None:
    probe = _probe(tmp_path, env="on")
    assert probe["statistics"] is True and probe["found"] == 1


def test_a_bad_setting_names_the_variable(tmp_path: Path) -> None:
    environ = {**os.environ, MEMSTATUS_ENV: "sometimes"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path / "state"), "none"],
        capture_output=True, text=True, env=environ, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"{MEMSTATUS_ENV}: expected 'on' or 'off', got 'sometimes'" in done.stderr
