"""The PostgreSQL latency benchmark at a tiny size: it runs end to end, drops its database,
and reports every operation on both stores with the verdict it promises. Timings are not
checked (they are machine noise)."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from activememory._cli import main
from activememory.simulations.bench import pgsearch

from pg_server import ADMIN_DSN, pg_dsn

__all__ = ["pg_dsn"]  # the fixture (it skips without a server), imported for pytest

TINY = ["--messages", "300", "--vocab", "400", "--queries", "12", "--warmup", "2"]


def _bench_databases() -> set[str]:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'activememory_bench_%'"
        )
        return {str(row[0]) for row in rows}


def test_a_tiny_run_reports_every_operation_and_drops_its_database(
    pg_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _bench_databases()
    assert main(["bench", "pgsearch", *TINY, "--dsn", ADMIN_DSN, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert _bench_databases() <= before  # created, then dropped
    assert result["messages"] == 300 and result["sessions"] == 3
    ops = {op["name"]: op for op in result["operations"]}
    assert set(ops) == set(pgsearch.OPS)
    for name, op in ops.items():
        assert op["queries"] == 12
        assert set(op["sqlite_ms"]) >= {"p50", "p99"} and set(op["pg_ms"]) >= {"p50", "p99"}
        assert op["pass_pg_tail"] == (op["pg_ms"]["p99"] <= 3 * op["pg_ms"]["p50"])
        # The raw SQL floor: the ranking queries themselves, for search and records.
        assert bool(op["raw_ms"]) == (name in ("search agent", "records"))


def test_the_table_shows_the_verdicts(pg_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "pgsearch", *TINY, "--dsn", ADMIN_DSN]) == 0
    out = capsys.readouterr().out
    assert out.count("PostgreSQL p99 / p50") == len(pgsearch.OPS)
    assert "PostgreSQL raw SQL floor" in out and "(target <= 3)" in out


def test_both_sizes_at_once_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        pgsearch.parse_args(["--messages", "1000", "--scale", "1m"])
    assert "--messages and --scale: give one" in capsys.readouterr().err


def test_an_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    dsn = "postgresql://postgres@127.0.0.1:1/postgres"
    assert main(["bench", "pgsearch", *TINY, "--dsn", dsn]) == 1
    assert "--dsn:" in capsys.readouterr().err


def test_a_state_dir_keeps_both_stores_and_a_second_run_reuses_them(
    pg_dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _bench_databases()
    args = ["bench", "pgsearch", *TINY, "--dsn", ADMIN_DSN, "--json", "--state-dir"]
    try:
        assert main([*args, str(tmp_path)]) == 0
        first = json.loads(capsys.readouterr().out)
        kept = _bench_databases() - before
        assert kept == {first["database"]} and not first["reused"]
        assert main([*args, str(tmp_path)]) == 0
        second = json.loads(capsys.readouterr().out)
        assert second["reused"] and second["database"] == first["database"]
        assert second["load"] == first["load"]  # the first run's load, not another
        assert _bench_databases() - before == kept
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as conn:
            for name in _bench_databases() - before:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
