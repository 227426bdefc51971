"""The benchmarks, run as `activememory bench NAME` (docs/design.md §7)."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

# name -> what it measures; the module of the same name runs it (imported only then).
BENCHMARKS = {
    "indexing": "append throughput against raw apsw at the same batches; memory and disk cost",
    "locomo": "retrieval quality (recall@k) on LoCoMo",
    "search": "sessions_search latency against a raw FTS5 query",
    "cjk": "index size and write time of CJK bigrams and the context column",
    "recall": "recall overhead and real-clock budget overshoot",
    "records": "records search with graph expansion against a raw FTS5 query",
    "pgsearch": "search, recall and records latency on PostgreSQL against SQLite and raw SQL",
    "paraphrase": "recall by meaning: facts asked later in other words",
    "vectors": "nearest-neighbour latency: numpy over the vector table against sqlite-vec",
    "startup": "import, --help and simulate times against the interpreter and msgspec",
    "http": "recall over HTTP (activememory serve) against in process, at c=1 and c=64",
    "pgingest": "PostgreSQL ingest by 1, 2 and 4 worker processes against raw psycopg",
}


def main(name: str, argv: Sequence[str]) -> int:
    """Run benchmark `name` with its own command line `argv`; its exit code."""
    module = importlib.import_module(f"{__name__}.{name}")
    code: int = module.main(list(argv))
    return code
