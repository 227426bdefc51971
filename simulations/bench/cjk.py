"""What CJK bigrams and the context column cost: index size and write time (README "CJK").

Inserts the same synthetic messages into FTS5 tables that differ only in what is indexed:

- `unicode61` — one column, the text as is (the source's index: CJK runs are single tokens);
- `words+grams` — our `words` and `grams` columns (CJK runs as bigrams), no context;
- `words+grams+context` — the library's full row, with the previous message as context.

Each table is filled in one transaction on a fresh file; the report gives seconds, messages
per second and the database size, as ratios to `unicode61`, for a CJK corpus and for an
English one (where bigrams cost nothing but the regex scan).

    activememory bench cjk [--messages N] [--json]
"""

from __future__ import annotations

import argparse
import functools
import random
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import apsw

from ...storage.db import configure
from ...storage.fts_query import RANK, TOKENIZE, index_columns, index_row
from . import runner

Row = tuple[object, ...]


def cjk_corpus(n: int, rng: random.Random) -> list[str]:
    """Messages of Han, kana and Hangul runs with punctuation and a little Latin."""
    han = [chr(c) for c in range(0x4E00, 0x4E00 + 2500)]
    kana = [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x30A1, 0x30FB)]
    hangul = [chr(c) for c in range(0xAC00, 0xAC00 + 1200)]
    weights = [1.0 / (i + 1) ** 1.1 for i in range(len(han))]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 4)):
            script = rng.random()
            size = rng.randint(4, 30)
            if script < 0.6:
                parts.append("".join(rng.choices(han, weights, k=size)))
            elif script < 0.85:
                parts.append("".join(rng.choices(han + kana, k=size)))
            else:
                parts.append("".join(rng.choices(hangul, k=size)))
            parts.append(rng.choice(["。", "、", "！", " ", "？", " iPhone ", " 2024 "]))
        out.append("".join(parts))
    return out


def english_corpus(n: int, rng: random.Random) -> list[str]:
    vocab = [
        "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9)))
        for _ in range(20000)
    ]
    weights = [1.0 / (i + 1) ** 1.1 for i in range(len(vocab))]
    return [" ".join(rng.choices(vocab, weights, k=rng.randint(8, 40))) for _ in range(n)]


def unicode61_rows(texts: Sequence[str]) -> Iterable[Row]:
    return ((i, t) for i, t in enumerate(texts, start=1))


def grams_rows(texts: Sequence[str]) -> Iterable[Row]:
    return ((i, *index_columns(t)) for i, t in enumerate(texts, start=1))


def full_rows(texts: Sequence[str]) -> Iterable[Row]:
    previous: str | None = None
    for i, t in enumerate(texts, start=1):
        yield index_row(i, t, previous)
        previous = t


VARIANTS: dict[str, tuple[str, str, Callable[[Sequence[str]], Iterable[Row]]]] = {
    "unicode61": (
        "text, content='', contentless_delete=1, tokenize='unicode61 remove_diacritics 2'",
        "INSERT INTO t(rowid, text) VALUES (?, ?)",
        unicode61_rows,
    ),
    "words+grams": (
        f"words, grams, content='', contentless_delete=1, tokenize='{TOKENIZE}'",
        "INSERT INTO t(rowid, words, grams) VALUES (?, ?, ?)",
        grams_rows,
    ),
    "words+grams+context": (
        f"words, grams, context, content='', contentless_delete=1, tokenize='{TOKENIZE}'",
        "INSERT INTO t(rowid, words, grams, context) VALUES (?, ?, ?, ?)",
        full_rows,
    ),
}


def measure(path: Path, variant: str, texts: Sequence[str]) -> dict[str, float]:
    columns, insert, rows = VARIANTS[variant]
    conn = apsw.Connection(str(path))
    try:
        configure(conn)
        conn.execute(f"CREATE VIRTUAL TABLE t USING fts5({columns})")
        if "context" in columns:
            conn.execute(f"INSERT INTO t(t, rank) VALUES ('rank', '{RANK}')")
        start = time.perf_counter()
        with conn:
            conn.executemany(insert, rows(texts))  # building the rows is part of the cost
        seconds = time.perf_counter() - start
        conn.execute("INSERT INTO t(t) VALUES ('optimize')")
        conn.pragma("wal_checkpoint", "TRUNCATE")
        size = int(conn.pragma("page_count")) * int(conn.pragma("page_size"))
    finally:
        conn.close()
    return {"seconds": seconds, "msg_per_s": len(texts) / seconds, "bytes": size}


def run(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
    """Every variant on both corpora, in `run_dir`."""
    rng = random.Random(args.seed)
    messages = args.messages
    corpora = {"cjk": cjk_corpus(messages, rng), "english": english_corpus(messages, rng)}
    report: dict[str, Any] = {}
    for name, texts in corpora.items():
        report[name] = {}
        for variant in VARIANTS:
            report[name][variant] = measure(run_dir / f"{name}-{variant}.db", variant, texts)
        floor = report[name]["unicode61"]
        for result in report[name].values():
            result["time_ratio"] = result["seconds"] / floor["seconds"]
            result["size_ratio"] = result["bytes"] / floor["bytes"]
    return report


def format_table(report: dict[str, Any], messages: int) -> str:
    """The report for a person."""
    lines = [f"Index cost of CJK bigrams and the context column ({messages:,} messages each)"]
    for name, variants in report.items():
        lines.append(f"\n  {name} corpus               msg/s   time ×     size MB   size ×")
        for variant, r in variants.items():
            lines.append(
                f"  {variant:<22} {r['msg_per_s']:>9,.0f}  {r['time_ratio']:6.2f}"
                f"  {r['bytes'] / 1e6:10.1f}  {r['size_ratio']:6.2f}"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`)."""
    parser = runner.command("cjk", __doc__ or "", seed=3)
    parser.add_argument("--messages", type=runner.positive_int, default=50_000)
    args = parser.parse_args(argv)
    table = functools.partial(format_table, messages=args.messages)
    return runner.main("cjk", args, run, table)
