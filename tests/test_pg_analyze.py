"""PostgreSQL statistics after bulk writes (docs/design.md §11 "Statistics"): a bulk import,
an index rebuild and a restore of records ANALYZE the tables they grew, so the planner
knows how many rows there are even where autovacuum is slow or off.

Each test has a database of its own: a table's estimate (`pg_class.reltuples`) is -1
until something ANALYZEs (or VACUUMs) it, and the local server runs with autovacuum off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

import activememory as am
from activememory._importers import IdentityExport, RecordEntry
from activememory.storage.pg import transcripts as pg_transcripts

from pg_server import scratch_database

pytestmark = pytest.mark.anyio

MESSAGES = 30  # per session
SESSIONS = 4


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture
def dsn(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A database of its own, whose writers ANALYZE after 50 bulk rows."""
    monkeypatch.setattr(pg_transcripts, "ANALYZE_MIN_ROWS", 50)
    with scratch_database() as found:
        yield found


@pytest.fixture
async def mem(tmp_path: Path, dsn: str) -> AsyncIterator[am.Memory]:
    config = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
    async with am.open_memory(tmp_path / "state", config=config, storage=dsn) as memory:
        yield memory


def estimates(dsn: str) -> dict[str, float]:
    """Each table of the store's schema: its planner estimate of rows (-1: never analyzed)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, c.reltuples FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE n.nspname = 'activememory' AND c.relkind = 'r'"
        ).fetchall()
    return {str(name): float(estimate) for name, estimate in rows}


def entries(session: int) -> list[am.ImportEntry]:
    return [
        am.ImportEntry(
            id=f"m{i}",
            parent_id=f"m{i - 1}" if i else None,
            timestamp=1_700_000_000.0 + session * 1000 + i,
            message=am.Message(role="user", content=f"message {i} of session {session}"),
        )
        for i in range(MESSAGES)
    ]


async def test_a_bulk_import_and_its_index_rebuild_leave_the_tables_analyzed(
    mem: am.Memory, dsn: str
) -> None:
    assert estimates(dsn)["message_index"] == -1  # a new store: never analyzed
    for session in range(SESSIONS):
        await mem.sessions.import_transcript(f"agent:main:direct:u{session}", entries(session))
    imported = estimates(dsn)
    # ANALYZEd as the rows grew past the threshold (50, then 20% more): not one behind.
    assert MESSAGES * (SESSIONS - 1) <= imported["events"] <= MESSAGES * SESSIONS
    assert imported["message_index"] == -1  # nothing indexed yet: the sessions are dirty
    await mem.sessions.rebuild_index()
    rebuilt = estimates(dsn)
    assert rebuilt["message_index"] == MESSAGES * SESSIONS  # a small table: counted exactly
    # And the search planned with them finds what it should.
    found = await mem.sessions.search("session", caller="agent:main:direct:u0", limit=3)
    assert len(found.results) == 3


async def test_a_few_imported_rows_leave_the_statistics_to_autovacuum(
    mem: am.Memory, dsn: str
) -> None:
    await mem.sessions.import_transcript("agent:main:direct:u0", entries(0))  # 30 < 50
    await mem.sessions.rebuild_index()
    assert estimates(dsn)["message_index"] == -1
    assert estimates(dsn)["events"] == -1


async def test_restored_records_leave_the_records_table_analyzed(mem: am.Memory, dsn: str) -> None:
    assert estimates(dsn)["records"] == -1
    restored = tuple(
        RecordEntry(
            am.Record(id=f"r{i}", content=f"fact {i}", user_id="dana", timestamp=1.7e9),
            created_at=1.7e9,
            invalidated_at=None,
        )
        for i in range(60)
    )
    await mem.import_export(IdentityExport(None, records=restored))
    assert 50 <= estimates(dsn)["records"] <= 60  # ANALYZEd at 50, the rest too few
