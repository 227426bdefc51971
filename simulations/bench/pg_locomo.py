"""LoCoMo dev recall@k of the text search on PostgreSQL against SQLite (docs/design.md §11).

At the storage level, where the two stores differ: each sample's sessions are imported into
a SQLite agent database (`TranscriptWriter`) and into PostgreSQL (`PgTranscriptWriter`, a
database the benchmark creates and drops), indexed, and every question of categories 1-4
with gold evidence is asked of both through `search_scope` with the `agent` visibility that
`activememory bench locomo` uses; PostgreSQL is asked twice, ranked by BM25 from term
statistics (the store's ranking) and by `ts_rank` (PostgreSQL's own, for comparison).
Scoring as `bench locomo`: recall@k = |gold ∩ top k| / |gold|, averaged.

    python -m activememory.simulations.bench.pg_locomo [--data PATH] [--dsn ADMIN_DSN]

PASS when BM25 on PostgreSQL is within 0.03 R@10 of SQLite (issue 16's target).
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ..._importers import LocomoSample, read_locomo
from ...protocol.indexer import ImportTranscript, RebuildIndex
from ...protocol.session_key import parse_session_key
from ...storage.db import open_connection
from ...storage.fts_query import plan_match
from ...storage.search import ScopePage, TermStats, search_scope
from ...storage.transcripts import TranscriptReader, TranscriptWriter
from . import locomo

if TYPE_CHECKING:
    from ...storage.pg.transcripts import PgTranscriptReader

KS = (1, 5, 10, 20)
TARGET_GAP = 0.03
KEEP = 25


def _recall(ranked: Sequence[int], gold: Sequence[str], dia: dict[int, str], k: int) -> float:
    top = {dia[event_id] for event_id in ranked[:k]}
    return sum(1 for g in gold if g in top) / len(gold)


def measure(samples: list[LocomoSample], admin_dsn: str) -> dict[str, dict[int, float]]:
    """recall@k per ranking: "sqlite", "pg-bm25", "pg-ts_rank"."""
    import psycopg
    import psycopg.conninfo

    from ...storage.pg.db import PgSettings, connect
    from ...storage.pg.transcripts import PgTranscriptReader, PgTranscriptWriter

    name = f"activememory_bench_{secrets.token_hex(4)}"
    admin = psycopg.connect(admin_dsn, autocommit=True)
    admin.execute(f'CREATE DATABASE "{name}"')
    sums: dict[str, dict[int, float]] = {r: dict.fromkeys(KS, 0.0) for r in _RANKINGS}
    asked = 0
    try:
        settings = PgSettings(dsn=psycopg.conninfo.make_conninfo(admin_dsn, dbname=name))
        with tempfile.TemporaryDirectory() as directory:
            for sample in samples:
                path = Path(directory) / f"{sample.agent}.db"
                lite_writer = TranscriptWriter(open_connection(path, writer=True))
                lite = TranscriptReader(open_connection(path, writer=False), sample.agent)
                pg_writer = PgTranscriptWriter(connect(settings), sample.agent)
                pg = PgTranscriptReader(connect(settings), sample.agent)
                # Event ids differ (PostgreSQL's sequence is shared by every agent).
                dia: dict[str, dict[int, str]] = {"sqlite": {}, "pg": {}}
                for session in sample.sessions:
                    key = parse_session_key(session.session_key)
                    command = ImportTranscript(key=key, entries=session.entries, at=0.0)
                    lite_writer.apply([command])
                    pg_writer.apply([command])
                lite_writer.apply([RebuildIndex()])
                pg_writer.apply([RebuildIndex()])
                for session in sample.sessions:
                    for store, reader in (("sqlite", lite), ("pg", pg)):
                        events = reader.history(session.session_key) or []
                        ids = (e.id for e in events)
                        dia[store].update(zip(ids, session.dia_ids, strict=True))
                caller = sample.sessions[0].session_key
                for question in sample.questions:
                    if question.category not in locomo.SCORED or not question.evidence:
                        continue
                    if plan_match(question.question) is None:
                        continue
                    asked += 1
                    for ranking in _RANKINGS:
                        ranked = _ask(ranking, question.question, lite, pg, sample.agent, caller)
                        for k in KS:
                            by_id = dia["sqlite" if ranking == "sqlite" else "pg"]
                            sums[ranking][k] += _recall(ranked, question.evidence, by_id, k)
                for conn in (lite_writer.conn, lite.conn, pg_writer.conn, pg.conn):
                    conn.close()
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    print(f"{len(samples)} conversations, {asked} questions (categories 1-4 with gold)")
    return {r: {k: v / max(asked, 1) for k, v in by_k.items()} for r, by_k in sums.items()}


_RANKINGS = ("sqlite", "pg-bm25", "pg-ts_rank")


def _ask(
    ranking: str,
    query: str,
    lite: TranscriptReader,
    pg: PgTranscriptReader,
    agent: str,
    caller: str,
) -> list[int]:
    """The event ids `ranking` finds for `query`, best first."""
    from ...storage.pg import search as pg_search

    plan = plan_match(query)
    assert plan is not None
    if ranking == "sqlite":
        page = search_scope(
            lite.conn, plan, scope="all", caller=caller, session_key=None, keep=KEEP,
            stats=TermStats(),
        )  # fmt: skip
    else:

        def run() -> ScopePage:
            return pg_search.search_scope(
                pg.conn, agent, plan, scope="all", caller=caller, session_key=None, keep=KEEP
            )

        page = run() if ranking == "pg-bm25" else _with_ts_rank(run)
    return [c.event_id for c in page.candidates]


def _with_ts_rank(run: Callable[[], ScopePage]) -> ScopePage:
    """`run` with PostgreSQL's `ts_rank` (weights D 0.1, C 0.2, B 0.4, A 1.0) for BM25."""
    from ...storage.pg import search as pg_search

    saved = dict(pg_search._BY_RANK)
    pg_search._BY_RANK["rank"] = "-ts_rank(i.terms, %(query)s::tsquery)"
    try:
        return run()
    finally:
        pg_search._BY_RANK.update(saved)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pg_locomo", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=None, help="locomo-dev.json")
    parser.add_argument(
        "--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres",
        help="a server and a user that may create databases",
    )  # fmt: skip
    args = parser.parse_args(argv)
    path = locomo.data_path(args.data)
    if not path.exists():
        print(f"skipped: no LoCoMo data at {path}")
        return 0
    result = measure(read_locomo(path), args.dsn)
    print(f"{'ranking':<12}" + "".join(f"{'R@' + str(k):>8}" for k in KS))
    for ranking, by_k in result.items():
        print(f"{ranking:<12}" + "".join(f"{by_k[k]:>8.3f}" for k in KS))
    gap = result["sqlite"][10] - result["pg-bm25"][10]
    verdict = "PASS" if gap <= TARGET_GAP else "MISS"
    print(f"R@10 gap SQLite - PostgreSQL BM25: {gap:+.3f} (target <= {TARGET_GAP}) {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
