"""`am.migrate` / `activememory migrate SRC DEST`: copy a whole store between SQLite (a state
directory) and PostgreSQL (a DSN), either way, and verify the copy (docs/design.md §11
"Migrate").

The copy is the export format's: every agent's sessions are read as `session_trees`
(every session, not one identity's) and turned into `Transcript`s by `transcript_of`,
the records and relations by `records_of(None, None)` (every record), and the destination stores them with
`import_export`, the import's own writers (event ids kept: the destination is empty, so
they are free). Nothing here knows the tree rules or either store's tables.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

import anyio
import msgspec

from ._importers import IdentityExport, RecordEntry, RelationEntry, Transcript
from ._memory import Memory, open_memory
from ._userdata import transcript_of
from .protocol.content import check_int
from .protocol.errors import ActiveMemoryError, InvalidInputError, StorageError

DEFAULT_VERIFY_SAMPLE = 50
MAX_VERIFY_SAMPLE = 10_000
SEARCH_LIMIT = 10
# What both memories are opened with: no embedder (vectors are not copied; the
# destination computes its own), and search over every session of the caller's agent.
_CONFIG: dict[str, object] = {
    "agents": {"defaults": {"memorySearch": {"provider": "none"}}},
    "tools": {"sessions": {"visibility": "all"}},
}
# What a session's copy must keep besides its tree (`updated_at` is the import's time).
_COMPARED = (
    "persistent",
    "interactive",
    "archived",
    "sandboxed",
    "spawned_by",
    "created_at",
    "switches",
)
_WORD = re.compile(r"\w{3,}")
# libpq's two spellings: a URI, or key=value pairs (docs/design.md §11 "Wiring").
_DSN = re.compile(r"^(postgres(ql)?://|\s*[a-z_]+\s*=)", re.IGNORECASE)


class MigrationReport(msgspec.Struct, frozen=True, kw_only=True):
    """What `am.migrate` copied and what its verification found. `mismatches` empty: the
    destination holds the copy; otherwise the destination was left as it was."""

    source: str  # as given (a DSN with its password masked)
    destination: str
    agents: int  # with sessions
    sessions: int
    messages: int
    records: int
    relations: int
    queries: int  # sample words searched, each on every agent, on both stores
    mismatches: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """Every session's messages and every sampled search answer equal."""
        return not self.mismatches

    def text(self) -> str:
        """The report as `activememory migrate` prints it."""
        lines = [
            f"migrate: {self.source} -> {self.destination}",
            f"copied: {self.agents} agents, {self.sessions} sessions, {self.messages} messages,"
            f" {self.records} records, {self.relations} relations",
            f"verify: message counts of {self.sessions} sessions, {self.queries} search"
            f" queries on each of {self.agents} agents",
        ]
        lines += [f"mismatch: {m}" for m in self.mismatches[:20]]
        if len(self.mismatches) > 20:
            lines.append(f"... and {len(self.mismatches) - 20} more mismatches")
        lines.append(
            "OK" if self.ok else "FAILED: the destination was left as it was (nothing copied)"
        )
        return "\n".join(lines)


class _Side(msgspec.Struct, frozen=True):
    """One end of a migrate: a state directory, or a PostgreSQL DSN."""

    field: str  # "source" or "destination", for errors
    path: Path | None
    dsn: str | None

    @property
    def shown(self) -> str:
        if self.dsn is None:
            return str(self.path)
        from .storage.pg.db import masked

        return masked(self.dsn)


def _side(field: str, value: object) -> _Side:
    if isinstance(value, str) and _DSN.match(value):
        return _Side(field, None, value)
    if isinstance(value, str | os.PathLike):
        return _Side(field, Path(value), None)
    raise InvalidInputError(
        f"{field}: expected a state directory or a PostgreSQL connection string"
        f" (postgresql://...), got {type(value).__name__}"
    )


async def migrate(
    source: str | os.PathLike[str],
    destination: str | os.PathLike[str],
    *,
    verify_sample: int = DEFAULT_VERIFY_SAMPLE,
    progress: Callable[[str], object] | None = None,
) -> MigrationReport:
    """Copy the store at `source` into the empty store at `destination` and verify it.

    Each side is a state directory (the embedded SQLite store) or a PostgreSQL connection
    string (`postgresql://...` or `host=... dbname=...`). Copied: every agent's sessions —
    their whole event trees with their event ids, rewound branches, active leaf, switches,
    archived and sandboxed flags, parent (`spawned_by`) and times — and every scoped record
    (invalidated and expired ones too, with their times) and relation. Not copied: the
    memory-note index (notes are files in the config's workspaces; the destination indexes
    them when a memory opens on it), vectors (the destination's embedder computes them),
    switch rows of keys that have no session, kept recall transcripts (files).

    The destination must be empty: a state directory missing or empty, or a PostgreSQL
    store with no session and no record (`InvalidInputError` naming it otherwise). A SQLite
    destination is written in a new directory beside it and renamed into place once
    verified; a PostgreSQL one has every session and record the migrate wrote deleted
    again if anything fails. The source is opened for writing (a running bot's state
    directory is refused: stop it first; on PostgreSQL, stop the workers); its dirty
    sessions are re-indexed first, so both stores search the same rows.

    Verification: every session's message count and leaf, and the `sessions.search`
    answers (session keys and message ids, in order) of `verify_sample` words drawn from
    the source's own messages, asked on every agent of both stores, are equal. A mismatch
    is reported in `mismatches` and the destination is left as it was.

    Raises `InvalidInputError` for a bad argument, a source holding no store, the same
    store on both sides or a non-empty destination, and `StorageError` when a store
    cannot be opened (a bad DSN, an unreachable server: naming the side) or a write fails.

    Cancellation: not atomic while it runs, but the destination is put back: a SQLite
    destination's new directory is removed, a PostgreSQL one's written rows are deleted
    (shielded from the cancellation); the source is left as it was.
    """
    src, dest = _side("source", source), _side("destination", destination)
    samples = check_int("verify_sample", verify_sample, 0, MAX_VERIFY_SAMPLE)
    if src.path is not None:
        from .actors.supervisor import require_store

        require_store(src.path, "source")
    if (src.dsn is not None and src.dsn == dest.dsn) or (
        src.path is not None and dest.path is not None and src.path.resolve() == dest.path.resolve()
    ):
        raise InvalidInputError("destination: the same store as the source")
    if dest.path is not None:
        _check_empty_dir(dest.path)
    say = progress or (lambda _line: None)
    async with _opened(src) as src_mem, _destination(dest) as (dest_mem, commit):
        copied = await _copy(src_mem, dest_mem, dest, say)
        mismatches, queries = await _verify(src_mem, dest_mem, samples, say)
        report = MigrationReport(
            source=src.shown,
            destination=dest.shown,
            queries=queries,
            mismatches=tuple(mismatches),
            **copied,
        )
        if report.ok:
            commit()
    return report


def _check_empty_dir(path: Path) -> None:
    if not path.exists():
        return
    if not path.is_dir():
        raise InvalidInputError(f"destination: {str(path)!r} is not a directory")
    if any(path.iterdir()):
        raise InvalidInputError(
            f"destination: {str(path)!r} is not empty; migrate copies into a new store"
            " only (a missing or empty directory, or a PostgreSQL store with no sessions"
            " and no records)"
        )


@contextlib.asynccontextmanager
async def _opened(side: _Side, state_dir: Path | None = None) -> AsyncIterator[Memory]:
    """A memory on `side` (in `state_dir` if given); a PostgreSQL side keeps its unused
    state directory in a temporary folder. Errors opening it name the side."""
    async with contextlib.AsyncExitStack() as stack:
        if state_dir is None and side.path is not None:
            state_dir = side.path
        elif state_dir is None:
            state_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        try:
            mem = await stack.enter_async_context(
                open_memory(state_dir, config=_CONFIG, storage=side.dsn)
            )
        except ActiveMemoryError as exc:
            raise type(exc)(f"{side.field}: {exc}") from exc
        yield mem


@contextlib.asynccontextmanager
async def _destination(side: _Side) -> AsyncIterator[tuple[Memory, Callable[[], None]]]:
    """The destination memory and `commit()`: unless it is called before the block ends,
    the destination is put back as it was (docs/design.md §11 "Migrate")."""
    committed = False

    def commit() -> None:
        nonlocal committed
        committed = True

    if side.path is None:
        written = False
        try:
            async with _opened(side) as mem:
                await _require_empty(mem, side)
                written = True
                yield mem, commit
        finally:
            if written and not committed:
                # On a memory of its own: a cancellation has stopped the first one's actors.
                with anyio.CancelScope(shield=True):
                    async with _opened(side) as fresh:
                        await _undo(fresh, side)
        return
    # SQLite: a new directory beside the destination, renamed into place once verified.
    target = side.path
    staging = target.parent / f".{target.name}.migrating-{secrets.token_hex(4)}"
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        async with _opened(side, staging) as mem:
            yield mem, commit
        if committed:
            if target.exists():
                target.rmdir()  # empty (checked before), so the rename can take its place
            staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


async def _require_empty(mem: Memory, side: _Side) -> None:
    agents = await mem._supervisor.known_agents()
    records = await (await mem._supervisor.records()).read(lambda reader: reader.count())
    if agents or records:
        shown = ", ".join(agents) or "none"
        raise InvalidInputError(
            f"destination: {side.shown} is not empty ({records} records; agents with"
            f" sessions: {shown}); migrate copies into a new store only"
        )


async def _undo(mem: Memory, side: _Side) -> None:
    """Delete every session and record of the (empty before) PostgreSQL destination."""
    try:
        for agent in await mem._supervisor.known_agents():
            store = await mem._supervisor.agent(agent)
            for info in await store.read(lambda reader: reader.sessions()):
                await mem.sessions.delete(info.key)
        db = await mem._supervisor.records()
        every = await db.read(lambda reader: reader.records_of(None, None))
        for row in every.records:
            await mem.records.delete(row.record.id)
    except ActiveMemoryError as exc:
        raise StorageError(
            f"destination: {side.shown} holds part of a failed migrate and deleting it"
            f" failed ({exc}); delete its sessions and records (it had none before)"
        ) from exc


async def _copy(
    src: Memory, dest: Memory, side: _Side, say: Callable[[str], object]
) -> dict[str, int]:
    """Every agent's sessions, then the records and relations, through `import_export`."""
    await src.sessions.rebuild_index()  # dirty sessions: search both stores on the same rows
    agents = await src._supervisor.known_agents()
    sessions = messages = copied = 0
    for n, agent in enumerate(agents, 1):
        transcripts = await _transcripts(src, agent)
        copied += bool(transcripts)  # an agent database left without sessions is not one
        done = await dest.import_export(IdentityExport(None, transcripts=tuple(transcripts)))
        sessions += done.sessions
        messages += sum(len(t.entries) for t in transcripts)
        say(f"migrate: agent {agent} ({n}/{len(agents)}): {done.sessions} sessions copied")
    records, relations = await _every_record(src)
    if records or relations:
        await dest.import_export(
            IdentityExport(None, records=tuple(records), relations=tuple(relations))
        )
    say(f"migrate: {len(records)} records, {len(relations)} relations copied")
    started = time.monotonic()
    rebuilt = await dest.sessions.rebuild_index()
    say(f"migrate: {rebuilt.index_rows} messages indexed in {time.monotonic() - started:.1f} s")
    return {
        "agents": copied,
        "sessions": sessions,
        "messages": messages,
        "records": len(records),
        "relations": len(relations),
    }


async def _transcripts(mem: Memory, agent: str) -> list[Transcript]:
    store = await mem._supervisor.agent(agent)
    trees = await store.read(lambda reader: reader.session_trees(None))
    return [transcript_of(tree) for tree in trees]


async def _every_record(mem: Memory) -> tuple[list[RecordEntry], list[RelationEntry]]:
    db = await mem._supervisor.stored_records()  # never makes records.db to find it empty
    if db is None:
        return [], []
    every = await db.read(lambda reader: reader.records_of(None, None))
    records = [RecordEntry(r.record, r.created_at, r.invalidated_at) for r in every.records]
    return records, [RelationEntry(e.relation, e.created_at) for e in every.relations]


async def _verify(
    src: Memory, dest: Memory, samples: int, say: Callable[[str], object]
) -> tuple[list[str], int]:
    """What differs between the two stores: per session the message count, the leaf, the
    messages and the metadata, and the search answers of `samples` words of the source,
    on every agent."""
    mismatches: list[str] = []
    # Every agent of either side: one whose sessions were all deleted may have a database
    # on SQLite and nothing on PostgreSQL; a session on one side only is a mismatch below.
    agents = sorted(
        set(await src._supervisor.known_agents()) | set(await dest._supervisor.known_agents())
    )
    words: set[str] = set()
    for agent in agents:
        before = {t.session_key: t for t in await _transcripts(src, agent)}
        after = {t.session_key: t for t in await _transcripts(dest, agent)}
        for key in sorted(before.keys() | after.keys()):
            mismatches += _session_mismatches(key, before.get(key), after.get(key))
        for t in before.values():
            for entry in t.entries:
                words.update(w.lower() for w in _WORD.findall(entry.message.index_text or ""))
    chosen = random.Random(0).sample(sorted(words), min(samples, len(words)))
    for n, word in enumerate(chosen, 1):
        for agent in agents:
            a = await _answer(src, agent, word)
            b = await _answer(dest, agent, word)
            if a != b:
                mismatches.append(f"search {word!r} on agent {agent}: source {a}, destination {b}")
        if n % 10 == 0 or n == len(chosen):
            say(f"verify: {n}/{len(chosen)} queries compared")
    return mismatches, len(chosen)


def _session_mismatches(key: str, a: Transcript | None, b: Transcript | None) -> list[str]:
    if a is None or b is None:
        return [f"session {key}: only in the {'destination' if a is None else 'source'}"]
    if len(a.entries) != len(b.entries):
        return [f"session {key}: {len(a.entries)} messages, copied {len(b.entries)}"]
    if a.leaf_id != b.leaf_id:
        return [f"session {key}: leaf {a.leaf_id}, copied {b.leaf_id}"]
    if a.entries != b.entries:
        return [f"session {key}: the messages differ (ids, parents, times or content)"]
    return [
        f"session {key}: {name} {getattr(a, name)!r}, copied {getattr(b, name)!r}"
        for name in _COMPARED
        if getattr(a, name) != getattr(b, name)
    ]


async def _answer(mem: Memory, agent: str, word: str) -> Sequence[tuple[str, int]]:
    result = await mem.sessions.search(word, caller=f"agent:{agent}:main", limit=SEARCH_LIMIT)
    return [(hit.session_key, hit.message_id) for hit in result.results]
