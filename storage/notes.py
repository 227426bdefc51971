"""Memory notes in an agent database (docs/design.md §4.7): chunking, the writer's half, search.

The workspace's `MEMORY.md` and `memory/*.md` are mirrored into three tables (schema v4):
`note_files` (path, stat, content digest: an unchanged file is never read again),
`note_chunks` (the text of each chunk and its 1-based lines) and `note_fts`, an FTS5 index
with the same tokenizer and columns as `message_fts` (storage/fts_query.py), so stemming,
diacritics and CJK bigrams work the same for notes as for transcripts. A chunk's `context`
column holds the headings above it, weighted like a message's context.

Only the indexer writes these tables (`apply_sync_notes`, from a `SyncNotes` command); the
memory core reads them on the reader connection. The chunk text stored is the text the
memory core hands over, which it has already redacted (activememory/_memory_core.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple, cast

import apsw

from ..protocol.indexer import IndexerAck, NoteChunk, NotesSynced, Rejected, SyncNotes
from .fts_query import MatchPlan, index_row
from .vectors import drop_note_vectors

MAX_CHUNK_CHARS = 700
"""A chunk's text is at most this long, unless one line alone is longer (then it is cut)."""

# An ATX heading: up to three spaces of indent, 1-6 `#`, then a space or the line's end.
_HEADING = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")
_FENCE = re.compile(r" {0,3}(```|~~~)")
_TRAIL_JOINER = " › "

_INSERT_CHUNK = (
    "INSERT INTO note_chunks(id, path, start_line, end_line, text) VALUES (?, ?, ?, ?, ?)"
)
_INSERT_FTS = "INSERT INTO note_fts(rowid, words, grams, context) VALUES (?, ?, ?, ?)"
_DROP_FTS = "DELETE FROM note_fts WHERE rowid IN (SELECT id FROM note_chunks WHERE path = ?)"
_UPSERT_FILE = (
    "INSERT INTO note_files(path, mtime_ns, size, digest) VALUES (?, ?, ?, ?)"
    " ON CONFLICT(path) DO UPDATE SET mtime_ns = excluded.mtime_ns, size = excluded.size,"
    " digest = excluded.digest"
)
# Best BM25 first (FTS5 `rank` is the configured bm25(); lower is better).
_SEARCH = (
    "SELECT c.id, m.r, c.path, c.start_line, c.end_line, c.text FROM"
    " (SELECT rowid, rank AS r FROM note_fts WHERE note_fts MATCH ? ORDER BY rank LIMIT ?) m"
    " JOIN note_chunks c ON c.id = m.rowid ORDER BY m.r, c.path, c.start_line"
)


def note_lines(text: str) -> list[str]:
    """The lines of a note as an editor numbers them (line 1 is `[0]`).

    Split at `\\n` only (`str.splitlines` also splits at form feeds and U+2028, which would
    shift every later line number); a `\\r` before the `\\n` is dropped.
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line starts no new one
    return [line.removesuffix("\r") for line in lines]


class _Block(NamedTuple):
    """A paragraph (non-blank lines) or a heading line; `trail`: the headings above it."""

    start: int  # 0-based, inclusive
    end: int  # 0-based, inclusive
    heading: bool  # the block is a heading line: it opens a new section (and chunk)
    trail: tuple[str, ...]


def _blocks(lines: Sequence[str]) -> list[_Block]:
    blocks: list[_Block] = []
    levels: list[tuple[int, str]] = []  # the open headings, outermost first
    start: int | None = None
    in_fence = False
    for i, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
        heading = None if in_fence else _HEADING.fullmatch(line)
        if heading is not None or not line.strip():
            if start is not None:
                blocks.append(_Block(start, i - 1, False, tuple(t for _, t in levels)))
                start = None
            if heading is not None:
                level = len(heading.group(1))
                title = (heading.group(2) or "").rstrip("#").strip()
                levels = [(lv, t) for lv, t in levels if lv < level]
                above = tuple(t for _, t in levels)
                levels.append((level, title))
                blocks.append(_Block(i, i, True, above))
        elif start is None:
            start = i
    if start is not None:
        blocks.append(_Block(start, len(lines) - 1, False, tuple(t for _, t in levels)))
    return blocks


def chunk_note(lines: Sequence[str], max_chars: int = MAX_CHUNK_CHARS) -> tuple[NoteChunk, ...]:
    """Cut a note into chunks of at most `max_chars` characters, at headings and blank lines.

    A heading always starts a chunk; paragraphs of the same section are packed together
    while they fit; a paragraph longer than `max_chars` is cut between lines, and a line
    longer than that alone is cut into pieces (each piece names that one line). Each chunk
    carries the headings above it (not its own first line) as `heading`.
    """
    # offsets[i]: where line i starts in "\n".join(lines), so any span's length is O(1).
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line) + 1)

    def span(first: int, last: int) -> int:
        return offsets[last + 1] - offsets[first] - 1

    chunks: list[NoteChunk] = []

    def emit(first: int, last: int, trail: tuple[str, ...]) -> None:
        context = _TRAIL_JOINER.join(t for t in trail if t) or None
        if span(first, last) <= max_chars:
            text = "\n".join(lines[first : last + 1])
            chunks.append(
                NoteChunk(start_line=first + 1, end_line=last + 1, text=text, heading=context)
            )
            return
        group = first
        for i in range(first, last + 1):
            if len(lines[i]) > max_chars:  # one line alone is too long: cut it
                if group < i:
                    emit(group, i - 1, trail)
                line = lines[i]
                for at in range(0, len(line), max_chars):
                    piece = line[at : at + max_chars]
                    chunks.append(
                        NoteChunk(start_line=i + 1, end_line=i + 1, text=piece, heading=context)
                    )
                group = i + 1
            elif span(group, i) > max_chars:
                emit(group, i - 1, trail)
                group = i
        if group <= last:
            emit(group, last, trail)

    current: _Block | None = None
    for block in _blocks(lines):
        if (
            current is not None
            and not block.heading
            and span(current.start, block.end) <= max_chars
        ):
            current = current._replace(end=block.end)
            continue
        if current is not None:
            emit(current.start, current.end, current.trail)
        current = block
    if current is not None:
        emit(current.start, current.end, current.trail)
    return tuple(chunks)


class NoteStat(NamedTuple):
    """What the index knows of a note file: the stat it was read at, its content digest."""

    mtime_ns: int
    size: int
    digest: str


def indexed_note_files(conn: apsw.Connection) -> dict[str, NoteStat]:
    """Every indexed note file by workspace-relative path."""
    rows = conn.execute("SELECT path, mtime_ns, size, digest FROM note_files")
    return {str(p): NoteStat(int(m), int(s), str(d)) for p, m, s, d in rows}


def apply_sync_notes(conn: apsw.Connection, cmd: SyncNotes) -> IndexerAck:
    """The indexer's handler of `SyncNotes`, inside the batch's transaction.

    Rejects (before writing anything) a stat-only update whose digest is not the indexed
    one: the content changed since it was read, so its chunks would be stale.
    """
    for i, note in enumerate(cmd.files):
        if note.chunks is None:
            row = conn.execute(
                "SELECT digest FROM note_files WHERE path = ?", (note.path,)
            ).fetchone()
            if row is None or row[0] != note.digest:
                return Rejected(
                    reason="invalid",
                    message=f"files[{i}].chunks: {note.path!r} changed; send its chunks",
                )
    (next_id,) = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM note_chunks").fetchone() or (1,)
    next_id = int(next_id)
    chunk_rows: list[tuple[int, str, int, int, str]] = []
    fts_rows: list[tuple[int, str, str | None, str | None]] = []
    for path in [n.path for n in cmd.files if n.chunks is not None] + list(cmd.removed):
        _drop_chunks(conn, path)
    for note in cmd.files:
        conn.execute(_UPSERT_FILE, (note.path, note.mtime_ns, note.size, note.digest))
        for chunk in note.chunks or ():
            chunk_rows.append((next_id, note.path, chunk.start_line, chunk.end_line, chunk.text))
            fts_rows.append(index_row(next_id, chunk.text, chunk.heading))
            next_id += 1
    for path in cmd.removed:
        conn.execute("DELETE FROM note_files WHERE path = ?", (path,))
    conn.executemany(_INSERT_CHUNK, chunk_rows)
    conn.executemany(_INSERT_FTS, fts_rows)
    return NotesSynced(files=len(cmd.files), removed=len(cmd.removed), chunks=len(chunk_rows))


def _drop_chunks(conn: apsw.Connection, path: str) -> None:
    # Only when the file has chunks: a contentless delete writes a tombstone even for a
    # rowid that is not there.
    if conn.execute("SELECT 1 FROM note_chunks WHERE path = ? LIMIT 1", (path,)).fetchone():
        drop_note_vectors(conn, path)
        conn.execute(_DROP_FTS, (path,))
        conn.execute("DELETE FROM note_chunks WHERE path = ?", (path,))


class NoteHit(NamedTuple):
    """One matching chunk; `score` is -BM25 (higher is better)."""

    chunk_id: int
    score: float
    path: str
    start_line: int
    end_line: int
    text: str


def search_notes(conn: apsw.Connection, plan: MatchPlan, keep: int) -> list[NoteHit]:
    """The `keep` best chunks for `plan` (from `plan_match`), best BM25 first.

    Every term is ranked: a workspace's notes are small, so the common-term pruning of the
    transcript search (storage/search.py) would save nothing here.
    """
    rows = conn.execute(_SEARCH, (plan.expression(), keep)).fetchall()
    return [
        NoteHit(int(cid), -float(rank), str(path), int(start), int(end), str(text))
        for cid, rank, path, start, end, text in cast(
            list[tuple[int, float, str, int, int, str]], rows
        )
    ]


def notes_integrity_ok(conn: apsw.Connection) -> bool:
    """FTS5's own integrity check of the note index (read-only, like `fts_integrity_ok`)."""
    return conn.execute("PRAGMA integrity_check(note_fts)").fetchall() == [("ok",)]
