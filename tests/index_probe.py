"""Reads an agent database behind the library's back, to check what the index really holds."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import apsw

from activememory.storage.fts_query import index_columns, index_tokens


def agent_db(state_dir: Path, agent: str = "main") -> Path:
    return state_dir / "agents" / agent / "memory.db"


def connect(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
    conn.set_busy_timeout(5000)
    return conn


def indexed_tokens(path: Path, column: str | None = None) -> dict[int, list[str]]:
    """rowid -> the tokens the FTS index holds for it, in document order.

    By default the message's own columns (`words`, then `grams`); `column="context"` gives
    the tokens it holds of the previous message instead.
    """
    wanted = {"words", "grams"} if column is None else {column}
    conn = connect(path)
    try:
        conn.execute(
            "CREATE VIRTUAL TABLE temp.vocab USING fts5vocab('main', 'message_fts', 'instance')"
        )
        docs: dict[int, list[tuple[str, int, str]]] = defaultdict(list)
        for term, doc, col, offset in conn.execute("SELECT term, doc, col, offset FROM temp.vocab"):
            if col in wanted:
                docs[int(doc)].append((str(col)[::-1], int(offset), str(term)))  # words first
        rowids = [int(r) for (r,) in conn.execute("SELECT rowid FROM message_fts")]
        return {rowid: [t for _, _, t in sorted(docs.get(rowid, []))] for rowid in rowids}
    finally:
        conn.close()


def tokenize(text: str) -> list[str]:
    """The tokens the index holds for a message `text`: its `words` column, then `grams`."""
    columns = [column for column in index_columns(text) if column is not None]
    return [token for column in columns for _, _, token in index_tokens(column.encode("utf-8"))]


def match(path: Path, query: str) -> list[int]:
    """Raw FTS5 MATCH against the index: rowids, in rowid order."""
    conn = connect(path)
    try:
        rows = conn.execute("SELECT rowid FROM message_fts WHERE message_fts MATCH ?", (query,))
        return sorted(int(r) for (r,) in rows)
    finally:
        conn.close()
