"""The planner's statistics: none for FTS5's shadow tables, whoever analysed them and when.

Analysed just after the schema was made, `message_fts_data` counted 2 rows; the planner
trusted that for the life of the process and every commit's FTS merge cost 40% more CPU
(docs/design.md §1.3).
"""

from __future__ import annotations

from pathlib import Path

import apsw

from activememory.storage.db import open_connection
from activememory.storage.records import open_records_connection

FTS_SHADOW = ("_fts_data", "_fts_idx", "_fts_config", "_fts_docsize")


def statistics(conn: apsw.Connection) -> dict[str, str]:
    return {tbl: stat for tbl, _, stat in conn.execute("SELECT * FROM sqlite_stat1")}


def test_a_new_database_keeps_no_statistics_of_fts_shadow_tables(tmp_path: Path) -> None:
    for path, connect in (
        (tmp_path / "memory.db", open_connection),
        (tmp_path / "records.db", open_records_connection),
    ):
        writer = connect(path, writer=True)  # creates the schema
        reader = connect(path, writer=False)  # analyses what the schema just made
        try:
            stats = statistics(writer)
            assert not [t for t in stats if t.endswith(FTS_SHADOW)], stats
            if path.name == "memory.db":  # the analysis ran, and kept the other tables'
                assert "vector_epoch" in stats, stats
        finally:
            reader.close()
            writer.close()


def test_statistics_an_older_version_left_are_dropped_at_open(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    open_connection(path, writer=True).close()
    old = apsw.Connection(str(path))
    old.execute("ANALYZE sqlite_schema")  # makes sqlite_stat1
    with old:
        old.execute("DELETE FROM sqlite_stat1")
        old.execute("INSERT INTO sqlite_stat1 VALUES ('message_fts_data', NULL, '2')")
        old.execute("INSERT INTO sqlite_stat1 VALUES ('events', NULL, '5')")
    old.close()
    writer = open_connection(path, writer=True)
    try:
        stats = statistics(writer)
        assert stats["events"] == "5" and "message_fts_data" not in stats, stats
    finally:
        writer.close()
