"""Reads an agent database behind the library's back, to check what the index really holds."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import apsw


def agent_db(state_dir: Path, agent: str = "main") -> Path:
    return state_dir / "agents" / agent / "memory.db"


def connect(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
    conn.set_busy_timeout(5000)
    return conn


def indexed_tokens(path: Path) -> dict[int, list[str]]:
    """rowid -> the tokens the FTS index holds for it, in document order."""
    conn = connect(path)
    try:
        conn.execute(
            "CREATE VIRTUAL TABLE temp.vocab USING fts5vocab('main', 'message_fts', 'instance')"
        )
        docs: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for term, doc, offset in conn.execute("SELECT term, doc, offset FROM temp.vocab"):
            docs[int(doc)].append((int(offset), str(term)))
        rowids = [int(r) for (r,) in conn.execute("SELECT rowid FROM message_fts")]
        return {rowid: [t for _, t in sorted(docs.get(rowid, []))] for rowid in rowids}
    finally:
        conn.close()


def tokenize(text: str) -> list[str]:
    """What the index's tokenizer (unicode61, diacritics removed) makes of `text`."""
    conn = apsw.Connection(":memory:")
    tokenizer = conn.fts5_tokenizer("unicode61", ["remove_diacritics", "2"])
    return [tok[2] for tok in tokenizer(text.encode("utf-8"), apsw.FTS5_TOKENIZE_DOCUMENT, None)]


def match(path: Path, query: str) -> list[int]:
    """Raw FTS5 MATCH against the index: rowids, in rowid order."""
    conn = connect(path)
    try:
        rows = conn.execute("SELECT rowid FROM message_fts WHERE message_fts MATCH ?", (query,))
        return sorted(int(r) for (r,) in rows)
    finally:
        conn.close()
