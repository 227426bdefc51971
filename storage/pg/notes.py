"""Memory notes on PostgreSQL (docs/design.md §4.7, §11): the twin of storage/notes.py.

The workspace's notes are mirrored into `note_files(agent, path)` (stat and content digest:
an unchanged file is never read again) and `note_chunks(agent, id)` (each chunk's text and
lines, and its index row: `tokens` and `terms`, the SQLite index's own tokens as a tsvector
by `terms.index_terms`, with the headings above the chunk as the context column). The
chunking is storage/notes.py's; so is the change detection (`apply_sync_notes` rejects a
stat-only update whose digest is not the indexed one).

Ranking: FTS5's BM25 as storage/pg/search.py computes it for messages (`bm25_sql`, the body
of `activememory.bm25` written into the query; the same IDF), over the agent's chunks: N,
the average length and each query part's document frequency (counted up to where the IDF
stops changing) in one snapshot, every statement planned for its terms. Every term is
ranked, as on SQLite (a workspace's notes are small).

Two processes syncing one agent's notes at once take turns (a transaction-scoped advisory
lock per agent): chunk ids are one past the agent's largest, as SQLite's rowids.
"""

from __future__ import annotations

from ...protocol.indexer import IndexerAck, NotesSynced, Rejected, SyncNotes
from ..fts_query import MatchPlan
from ..notes import NoteHit, NoteStat
from .db import SCHEMA
from .search import _bm25_params, bm25_sql, capped_frequencies, execute_custom, idf_cap
from .terms import PgQuery, index_terms, pg_query
from .transcripts import Connection, _text

_S = SCHEMA
# The first key of the advisory lock a notes sync takes (the second: the agent's hash).
_NOTES_LOCK = 0x6E6F_7465  # "note"


def notes_ddl() -> str:
    """The notes tables (a schema step of storage/pg/db.py), keyed by agent first."""
    return f"""
CREATE TABLE {_S}.note_files(
    agent text NOT NULL,
    path text NOT NULL,
    mtime_ns bigint NOT NULL,
    size bigint NOT NULL,
    digest text NOT NULL,
    PRIMARY KEY (agent, path)
);
CREATE TABLE {_S}.note_chunks(
    agent text NOT NULL,
    id bigint NOT NULL,
    path text NOT NULL,
    start_line integer NOT NULL,
    end_line integer NOT NULL,
    -- bytea, as a message's text: text cannot hold NUL
    text bytea NOT NULL,
    tokens integer NOT NULL,
    terms tsvector NOT NULL,
    PRIMARY KEY (agent, id)
);
CREATE INDEX note_chunks_path ON {_S}.note_chunks(agent, path);
CREATE INDEX note_chunks_terms ON {_S}.note_chunks USING gin (agent, terms);
"""


def indexed_note_files(conn: Connection, agent: str) -> dict[str, NoteStat]:
    """Every indexed note file of `agent` by workspace-relative path."""
    rows = conn.execute(
        f"SELECT path, mtime_ns, size, digest FROM {_S}.note_files WHERE agent = %s", (agent,)
    ).fetchall()
    return {str(p): NoteStat(int(m), int(s), str(d)) for p, m, s, d in rows}


def apply_sync_notes(conn: Connection, agent: str, cmd: SyncNotes) -> IndexerAck:
    """The writer's handler of `SyncNotes`, inside the batch's transaction (storage/notes.py
    `apply_sync_notes`: the same acks and rejections). A chunk's vector goes with it (a
    foreign key, `ON DELETE CASCADE`: storage/pg/vectors.py)."""
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_NOTES_LOCK, agent))
    stale = [i for i, note in enumerate(cmd.files) if note.chunks is None]
    if stale:
        digests = dict(
            conn.execute(
                f"SELECT path, digest FROM {_S}.note_files WHERE agent = %s AND path = ANY(%s)",
                (agent, [cmd.files[i].path for i in stale]),
            ).fetchall()
        )
        for i in stale:
            note = cmd.files[i]
            if digests.get(note.path) != note.digest:
                return Rejected(
                    reason="invalid",
                    message=f"files[{i}].chunks: {note.path!r} changed; send its chunks",
                )
    # Read before the old chunks go, as on SQLite: ids are not reused within a sync.
    row = conn.execute(
        f"SELECT coalesce(max(id), 0) + 1 FROM {_S}.note_chunks WHERE agent = %s", (agent,)
    ).fetchone()
    next_id = int(row[0]) if row else 1
    replaced = [n.path for n in cmd.files if n.chunks is not None] + list(cmd.removed)
    if replaced:
        conn.execute(
            f"DELETE FROM {_S}.note_chunks WHERE agent = %s AND path = ANY(%s)", (agent, replaced)
        )
    chunk_rows: list[tuple[object, ...]] = []
    with conn.cursor() as cur:
        cur.executemany(
            f"INSERT INTO {_S}.note_files(agent, path, mtime_ns, size, digest)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (agent, path) DO UPDATE SET"
            " mtime_ns = excluded.mtime_ns, size = excluded.size, digest = excluded.digest",
            [(agent, n.path, n.mtime_ns, n.size, n.digest) for n in cmd.files],
        )
        for note in cmd.files:
            for chunk in note.chunks or ():
                terms = index_terms(chunk.text, chunk.heading)
                chunk_rows.append(
                    (
                        agent, next_id, note.path, chunk.start_line, chunk.end_line,
                        chunk.text.encode("utf-8"), terms.tokens, terms.terms,
                    )
                )  # fmt: skip
                next_id += 1
        if cmd.removed:
            cur.execute(
                f"DELETE FROM {_S}.note_files WHERE agent = %s AND path = ANY(%s)",
                (agent, list(cmd.removed)),
            )
        cur.executemany(
            f"INSERT INTO {_S}.note_chunks(agent, id, path, start_line, end_line, text, tokens,"
            " terms) VALUES (%s, %s, %s, %s, %s, %s, %s, %s::tsvector)",
            chunk_rows,
        )
    return NotesSynced(files=len(cmd.files), removed=len(cmd.removed), chunks=len(chunk_rows))


def _statistics(conn: Connection, agent: str, query: PgQuery) -> tuple[int, float, list[int]]:
    """(N, average tokens per chunk, each part's document frequency) of the agent's notes,
    in the search's snapshot. Each frequency is counted up to `idf_cap` (half the chunks):
    past it the IDF is at its floor, so the ranking is the exact counts' (docs/design.md
    §11 "Latency")."""
    row = execute_custom(
        conn,
        f"SELECT count(*), coalesce(sum(tokens), 0) FROM {_S}.note_chunks WHERE agent = %s",
        (agent,),
    ).fetchone()
    assert row is not None
    total, tokens = int(row[0]), int(row[1])
    df = capped_frequencies(conn, agent, query, idf_cap(total), table="note_chunks", phrase=True)
    return total, (tokens / total if total else 1.0), df


def search_notes(conn: Connection, agent: str, plan: MatchPlan, keep: int) -> list[NoteHit]:
    """The `keep` best chunks of `agent`'s notes for `plan`, best BM25 first (ties: path,
    then first line), in one snapshot; storage/notes.py `search_notes` on PostgreSQL. As
    the message search (storage/pg/search.py): statements planned for their terms each
    time (`execute_custom`), BM25 written into the query (`bm25_sql`)."""
    query = pg_query(plan)
    if query is None or keep <= 0:
        return []
    with conn.transaction():
        total, avgdl, df = _statistics(conn, agent, query)
        rows = execute_custom(
            conn,
            f"SELECT c.id, -{bm25_sql('c')} AS r, c.path, c.start_line, c.end_line, c.text"
            f" FROM {_S}.note_chunks c WHERE c.agent = %(agent)s"
            " AND c.terms @@ %(query)s::tsquery ORDER BY r, c.path, c.start_line LIMIT %(keep)s",
            _bm25_params(query, total, avgdl, df)
            | {"agent": agent, "query": query.match, "keep": keep},
        ).fetchall()
    return [
        NoteHit(int(cid), -float(rank), str(path), int(start), int(end), _text(text))
        for cid, rank, path, start, end, text in rows
    ]
