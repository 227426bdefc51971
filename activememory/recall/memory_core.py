"""The memory-core memory tools: `memory_search` and `memory_get` (docs/design.md §4.7).

Memory notes are `MEMORY.md` and `memory/*.md` (one level, no hidden files) in the agent's
workspace (`Config.workspace`). A person edits them; the index follows. An agent's first
search scans the workspace (a `stat` per file) before it searches, so it sees every note
that existed then. After that, with `memorySearch.sync.watch` (the default), a notes
watcher per agent (actors/notes_watcher.py) polls the files' stats off the recall path and
reindexes `watchDebounceMs` after the last edit it saw: a search never scans again. With
`watch: false` a search rescans at most once per `RESCAN_S` seconds per agent, inside the
search. Either way only files whose mtime or size changed are read, hashed and chunked; the
changes go to the indexer as one `SyncNotes` command (storage/notes.py). A file edited twice
within one filesystem timestamp tick, the second time keeping its size, is caught too: a
file read less than two seconds after it was written is hashed again by the next scans
until it is older than that.

Notes are redacted before they are chunked, as whole files, so a secret spanning lines (a
PEM block) is masked even where chunks cut it; the masked lines keep their numbers. Every
snippet and every `memory_get` text is redacted again when shown (new `redactPatterns` apply
at once). Files over 1 MiB, unreadable files and symlinks leading out of the workspace are
not indexed; `memory_search` lists them under `ignored` in its debug fields.

Ranking across sources: notes (BM25 of `note_fts`) and the agent's other private
conversations (`SessionSearch.private_job`, BM25 with conversational reranking) score on
different scales, so each source's scores are divided by that source's best: the best hit
of each scores 1.0, and the rest keep their relative distance to it. Ties go to notes (a
person wrote them to be remembered). A conversation result's path is
`session:<session_key>#<message_id>` and its lines are those of its snippet.

Debug fields of `memory_search` beyond docs/design.md §4.7's (`backend`, `effectiveMode`, `fallback`,
`searchMs`, `hits`), each present only when it applies: `indexing` and `warning` (the
transcript index is being rebuilt: results may be incomplete), `vectorsPending` (the
embedder is still computing vectors of this agent's database: what was written last may be
found by its words only), `ignored` (notes not indexed, and why), `syncError` (the scan, or
the notes watcher's last sync, could not be written: the notes indexed before still answer;
said by every search until a scan succeeds — on PostgreSQL, where notes are not yet, that
they are not) and `truncated` (results dropped to keep the answer within 16 000 characters).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import os
import stat
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, cast

import anyio

from .._redaction import Redactor
from .._search import SessionSearch, make_snippet
from .._settings import Settings
from ..actors.notes_watcher import NotesWatcher
from ..actors.supervisor import AgentStore, Supervisor
from ..protocol.config import HybridQuery, PrivateScope
from ..protocol.embeddings import Embedder
from ..protocol.errors import InvalidInputError, MemoryClosedError, StorageError
from ..protocol.indexer import NOTE_PATH, NoteFile, Rejected, SyncNotes
from ..protocol.recall import ToolResult
from ..protocol.search import MAX_LIMIT, SearchHit
from ..protocol.session_key import AGENT_ID, SessionKey, parse_session_key
from ..protocol.tools import DEFAULT_RESULTS as DEFAULT_RESULTS  # the benchmarks' default
from ..protocol.tools import MemoryGetArgs, MemorySearchArgs
from ..storage.executor import make_executor
from ..storage.fts_query import plan_match, query_terms
from ..storage.notes import (
    MAX_CHUNK_CHARS,
    NoteHit,
    chunk_note,
    note_lines,
)
from ..storage.reads import TranscriptReads
from .hybrid import (
    QueryVector,
    VectorSide,
    candidates,
    embed_query,
    rank,
    vector_side,
    with_similarity,
)
from .tools import MAX_TOOL_CONTENT_CHARS, tool_arguments, tool_failure

RESCAN_S = 1.0
"""Without the notes watcher (`sync.watch: false`), a search rescans the workspace for
edited notes at most this often (seconds, per agent)."""

MAX_NOTE_BYTES = 1024 * 1024
"""Notes larger than this are not indexed nor served (listed under `ignored`)."""

MAX_SNIPPET_CHARS = MAX_CHUNK_CHARS
SESSION_PREFIX = "session:"

# A file read this soon after its mtime may change again within the same timestamp tick
# without its stat changing ("racy git"): it is hashed again until it is older.
_RACY_NS = 2_000_000_000
_NOT_AVAILABLE = (
    "path: {path!r} is not available (only the agent's other private conversations can be "
    "read, and only when cross-conversation recall is on)"
)


def _read_bytes(path: Path) -> bytes:
    """Read a note file (one place, so tests can count reads)."""
    return path.read_bytes()


@dataclasses.dataclass(frozen=True)
class _SyncPlan:
    """What one scan found: the files to (re)index, the paths to drop, what was skipped."""

    files: tuple[NoteFile, ...]
    removed: tuple[str, ...]
    changed: int  # files whose content changed, appeared or went away
    ignored: tuple[tuple[str, str], ...]  # (path, why)
    racy: frozenset[str]


class MemoryCore:
    """The `memory_search` and `memory_get` tools over memory notes and private transcripts.

    One per `Memory`; keeps, per agent, when the workspace was last scanned and which notes
    it had to skip. The index itself lives in the agent database and is written only by
    the indexer.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        search: SessionSearch,
        current: Callable[[], Settings],
    ) -> None:
        self._supervisor = supervisor
        self._search = search
        # Read once when a call starts without settings (`mem.notes`); a recall passes its own.
        self._current = current
        self._scanned_at: dict[str, float] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._ignored: dict[str, tuple[tuple[str, str], ...]] = {}
        # The last failed scan of each agent, said by every search until a scan succeeds.
        self._sync_errors: dict[str, str] = {}
        self._racy: dict[str, frozenset[str]] = {}
        # The notes watcher of each agent a search has read (docs/design.md §4.7).
        self.watchers: dict[str, NotesWatcher] = {}
        # The query side of recall by meaning; the same embedder the embedder actor uses.
        self.embedder: Embedder | None = None

    def workspace(self, agent: str) -> Path:
        """The workspace folder whose notes `agent`'s tools read (from the current config)."""
        return self._current().workspace(agent)

    async def sync_notes(self, agent: str, *, settings: Settings | None = None) -> int:
        """Bring the note index of `agent` up to date with its workspace, now.

        Returns how many note files changed (added, edited or removed). A missing workspace
        holds no notes. Raises `StorageError` if the index cannot be written, or naming
        readonly on a read-only memory (docs/design.md §1.6).

        Cancellation: if cancelled during the scan nothing was sent; if cancelled while the
        `SyncNotes` command is queued it may still commit. Either way the index is whole,
        and the next scan compares the files with what did commit.
        """
        store = await self._store(agent)
        store.writer()  # read-only: StorageError naming readonly, before any scan
        async with self._lock(agent):
            return await self._sync(store, settings or self._current())

    async def _refresh(self, store: AgentStore, settings: Settings) -> None:
        """Before a search: the agent's first search scans the workspace; later ones leave it
        to the notes watcher (started here), or, with `sync.watch: false`, rescan unless the
        workspace was scanned less than `RESCAN_S` ago. A read-only memory never scans (it
        searches the notes as the writer last indexed them)."""
        if store.readonly:
            return
        sync = settings.config.memory_search.sync
        if sync.watch and store.agent in self._scanned_at:
            self._watch(store, sync.watch_debounce_ms / 1000)
            return
        if not self._stale(store.agent):
            return
        async with self._lock(store.agent):
            if self._stale(store.agent):  # another search may have scanned while we waited
                await self._sync(store, settings)
        if sync.watch:
            self._watch(store, sync.watch_debounce_ms / 1000)

    def _watch(self, store: AgentStore, debounce_s: float) -> None:
        """Start the notes watcher of `store`'s agent unless it runs (docs/design.md §4.7)."""
        agent = store.agent
        if agent in self.watchers:
            return
        # Never a reader's: a listing never queues in front of a search.
        executor = make_executor(self._supervisor.executor_kind, "notes")

        async def listing() -> tuple[tuple[str, int, int, int], ...]:
            root = self._current().workspace(agent)
            return await executor.run(partial(_note_stats, root))

        async def sync() -> bool:
            async with self._lock(agent):
                await self._sync(store, self._current())
            return bool(self._racy.get(agent))

        watcher = NotesWatcher(agent, listing=listing, sync=sync, debounce_s=debounce_s)
        self.watchers[agent] = watcher
        self._supervisor.start_watcher(watcher)

    def _stale(self, agent: str) -> bool:
        last = self._scanned_at.get(agent)
        return last is None or anyio.current_time() - last >= RESCAN_S

    def _lock(self, agent: str) -> anyio.Lock:
        return self._locks.setdefault(agent, anyio.Lock())

    async def _sync(self, store: AgentStore, settings: Settings) -> int:
        agent = store.agent
        started = anyio.current_time()
        scan = partial(
            _plan_sync,
            root=settings.workspace(agent),
            racy=self._racy.get(agent, frozenset()),
            redactor=settings.redactor,
        )
        try:
            plan = await store.read(scan)
            if plan.files or plan.removed:
                command = SyncNotes(agent=agent, files=plan.files, removed=plan.removed)
                ack = await store.submit(command)
                if isinstance(ack, Rejected):
                    error = MemoryClosedError if ack.reason == "closed" else StorageError
                    raise error(f"memory notes of {agent!r}: {ack.message}")
        except StorageError as exc:
            self._scanned_at[agent] = started  # retried after RESCAN_S, not on every search
            self._sync_errors[agent] = str(exc)
            raise
        self._sync_errors.pop(agent, None)
        self._racy[agent] = plan.racy
        self._ignored[agent] = plan.ignored
        self._scanned_at[agent] = started
        return plan.changed

    async def _store(self, agent: str) -> AgentStore:
        if not isinstance(agent, str) or not AGENT_ID.fullmatch(agent):
            raise InvalidInputError(f"agent: {agent!r} is not an agent id")
        return await self._supervisor.agent(agent)

    async def search(
        self,
        agent: str,
        args: Mapping[str, Any],
        *,
        caller: SessionKey,
        transcripts: PrivateScope | None,
        settings: Settings | None = None,
    ) -> ToolResult:
        """The `memory_search` tool: the best note chunks and, if allowed, conversation excerpts.

        `args`: `query` (1 to 4096 characters) and `maxResults` (1 to 25, default 6); bad
        arguments raise `InvalidInputError` naming the argument. Conversation excerpts come
        only when `transcripts` is a scope (`Config.private_scope` of `caller`), and only from
        the other private conversations of `caller`'s agent that it admits (docs/design.md
        §4.2). Snippets are redacted and at most 700 characters.

        Cancellation: nothing is written by a search except a note rescan's `SyncNotes`
        (see `sync_notes`); reads already started finish on their worker.
        """
        parsed = tool_arguments(MemorySearchArgs, args)
        query, limit = parsed.query, parsed.max_results
        started = anyio.current_time()
        store = await self._store(agent)
        settings = settings or self._current()
        sync_error = None
        try:
            await self._refresh(store, settings)
        except StorageError as exc:  # the notes indexed before still answer
            sync_error = str(exc)
        redactor = settings.redactor
        plan = plan_match(query)
        hybrid = settings.config.memory_search.query.hybrid
        # With an embedder the text side fetches the hybrid pool while the query is embedded
        # (two threads at once): the embedding, not the sum, is what meaning adds.
        pool = limit * hybrid.candidate_multiplier if self.embedder is not None else limit
        private = None
        if transcripts is not None and caller.agent == agent:
            private = self._search.private_job(
                query,
                caller=caller,
                scope=transcripts,
                redactor=redactor,
                limit=min(pool, MAX_LIMIT),
            )

        def text_side(reader: TranscriptReads) -> tuple[list[NoteHit], Any]:
            # One hop to the reader thread for the notes and the conversations.
            notes = reader.search_notes(plan, pool) if plan is not None else []
            return notes, private.run(reader) if private is not None else None

        embedded: list[QueryVector] = []

        async def embed() -> None:
            embedded.append(await embed_query(self.embedder, query))

        async with anyio.create_task_group() as both:
            both.start_soon(embed)
            notes, page = await store.read(text_side)
        meaning = embedded[0]
        side: VectorSide | None = None
        if meaning.vector is not None:
            vector_query = meaning

            def vectors(reader: TranscriptReads) -> VectorSide:
                return vector_side(
                    reader,
                    vector_query,
                    pool=pool,
                    text_notes=[hit.chunk_id for hit in notes],
                    text_messages=[c.event_id for c in page.page.candidates] if page else [],
                    caller=caller.raw,
                    scope=transcripts if private is not None else None,
                )

            side = await store.read(vectors)
        sessions = private.finish(page, store) if private is not None else None
        terms = query_terms(query)
        if side is None or meaning.vector is None:
            found: list[tuple[float, dict[str, Any]]] = []
            for hit in notes[:limit]:
                snippet, _ = make_snippet(redactor.redact(hit.text), terms, MAX_SNIPPET_CHARS)
                found.append(
                    (hit.score, _result("memory", hit.path, hit.start_line, hit.end_line, snippet))
                )
            messages = (
                [(h.score, _session_result(h, redactor)) for h in sessions.results]
                if sessions
                else []
            )
            results = _merge([found, messages], limit)
        else:
            results = _fused_results(
                notes, page, side, meaning.vector, hybrid, redactor, terms, limit
            )
        data: dict[str, Any] = {
            "results": results,
            "backend": "builtin",
            "effectiveMode": "hybrid" if side is not None else "search",
            "fallback": meaning.fallback,
            "searchMs": 0.0,
            "hits": len(results),
        }
        if meaning.name is not None:
            data["embedder"] = meaning.name
        if sessions is not None and sessions.indexing:
            data["indexing"] = True
            data["warning"] = sessions.warning
        if store.vectors_pending():  # the embedder is behind: by meaning may miss new rows
            data["vectorsPending"] = True
        watcher = self.watchers.get(agent)
        if sync_error is None and watcher is not None:
            sync_error = watcher.last_error  # its last sync failed: retried after the debounce
        if sync_error is None:  # an earlier scan failed and none has succeeded since
            sync_error = self._sync_errors.get(agent)
        if sync_error is not None:
            data["syncError"] = sync_error
        if ignored := self._ignored.get(agent):
            data["ignored"] = [{"path": path, "reason": why} for path, why in ignored]
        data["searchMs"] = round((anyio.current_time() - started) * 1000, 1)
        content = _dumps(data)
        while len(content) > MAX_TOOL_CONTENT_CHARS and results:
            results.pop()  # the worst hit goes first
            data["hits"], data["truncated"] = len(results), True
            content = _dumps(data)
        return ToolResult(name="memory_search", content=content, data=data, evidence=bool(results))

    async def get(
        self,
        agent: str,
        args: Mapping[str, Any],
        *,
        caller: SessionKey,
        transcripts: PrivateScope | None,
        settings: Settings | None = None,
    ) -> ToolResult:
        """The `memory_get` tool: lines of a memory note, or one conversation message.

        `args`: `path` (`MEMORY.md`, `memory/<name>.md`, or `session:<session_key>#<id>`
        from a `memory_search` result), `from` (1-based first line, default 1) and `lines`
        (1 to 200, default 40). A note path that is malformed or leads out of the workspace
        raises `InvalidInputError` naming `path`. A message is served only when its session
        is one of the conversations `memory_search` with the same `transcripts` could read
        (checked again in SQL); otherwise the result is an error saying it is not available.
        The text is redacted.

        Cancellation: reads only; a read already started finishes on its worker.
        """
        parsed = tool_arguments(MemoryGetArgs, args)
        path, first, count = parsed.path, parsed.from_, parsed.lines
        store = await self._store(agent)
        settings = settings or self._current()
        if path.startswith(SESSION_PREFIX):
            return await self._get_message(store, path, first, count, caller, transcripts, settings)
        if NOTE_PATH.fullmatch(path) is None:
            raise InvalidInputError(
                f"path: {path!r} is not MEMORY.md, memory/<name>.md or "
                "session:<session_key>#<message_id>"
            )
        read = partial(_read_note, settings.workspace(agent), path, first, count, settings.redactor)
        return await store.read_executor.run(read)

    async def _get_message(
        self,
        store: AgentStore,
        path: str,
        first: int,
        count: int,
        caller: SessionKey,
        transcripts: PrivateScope | None,
        settings: Settings,
    ) -> ToolResult:
        key_text, sep, ident = path.removeprefix(SESSION_PREFIX).rpartition("#")
        if not sep or not ident.isascii() or not ident.isdigit() or not key_text:
            raise InvalidInputError(f"path: {path!r} is not session:<session_key>#<message_id>")
        key = parse_session_key(key_text, field="path")
        refused = tool_failure("memory_get", _NOT_AVAILABLE.format(path=path))
        if transcripts is None or not caller.is_private or caller.agent is None:
            return refused
        if key.agent != caller.agent or store.agent != caller.agent:
            return refused  # another agent's transcripts are never eligible
        scope = transcripts
        row = await store.read(
            lambda reader: reader.private_message(int(ident), key.raw, caller.raw, scope)
        )
        if row is None:
            return refused  # the same answer whether absent or forbidden: no oracle
        role, ts, text = row
        lines = redact_lines(settings.redactor, note_lines(str(text)))
        data: dict[str, Any] = {"path": path, "role": str(role), "timestamp": float(ts)}
        return _excerpt("memory_get", data, lines, first, count)


def _plan_sync(
    reader: TranscriptReads, *, root: Path, racy: frozenset[str], redactor: Redactor
) -> _SyncPlan:
    """Runs on the reader's executor: stat the workspace, read what changed, chunk it."""
    known = reader.note_files()
    found, ignored = _list_notes(root)
    files: list[NoteFile] = []
    kept: set[str] = set()
    still_racy: set[str] = set()
    changed = 0
    for rel, (path, mtime_ns, size) in found.items():
        old = known.get(rel)
        same_stat = old is not None and (old.mtime_ns, old.size) == (mtime_ns, size)
        if same_stat and rel not in racy:
            kept.add(rel)
            continue
        try:
            data = _read_bytes(path)
        except OSError as exc:
            ignored.append((rel, f"unreadable ({exc.strerror or exc})"))
            continue
        if len(data) > MAX_NOTE_BYTES:  # grew between stat and read
            ignored.append((rel, "larger than 1 MiB"))
            continue
        kept.add(rel)
        if time.time_ns() - mtime_ns < _RACY_NS:
            still_racy.add(rel)
        digest = hashlib.sha256(data).hexdigest()
        if old is not None and old.digest == digest:
            if not same_stat:  # touched, same content: only the stat moves
                files.append(NoteFile(path=rel, mtime_ns=mtime_ns, size=size, digest=digest))
            continue
        lines = redact_lines(redactor, note_lines(data.decode("utf-8-sig", errors="replace")))
        chunks = chunk_note(lines)
        files.append(NoteFile(path=rel, mtime_ns=mtime_ns, size=size, digest=digest, chunks=chunks))
        changed += 1
    removed = tuple(sorted(rel for rel in known if rel not in kept))
    return _SyncPlan(
        files=tuple(files),
        removed=removed,
        changed=changed + len(removed),
        ignored=tuple(sorted(ignored)),
        racy=frozenset(still_racy),
    )


def _list_notes(root: Path) -> tuple[dict[str, tuple[Path, int, int]], list[tuple[str, str]]]:
    """The workspace's note files as {relative path: (real path, mtime_ns, size)}, and
    those skipped with why. A missing workspace has none."""
    try:
        real_root = root.resolve(strict=True)
    except (OSError, RuntimeError):
        return {}, []
    if not real_root.is_dir():
        return {}, []
    found: dict[str, tuple[Path, int, int]] = {}
    ignored: list[tuple[str, str]] = []
    # (relative path, the path to stat when it is plainly inside, else None: resolve it)
    candidates: list[tuple[str, Path | None]] = [("MEMORY.md", None)]
    memory_dir = _inside(real_root, "memory")
    try:
        with os.scandir(real_root / "memory") as entries:
            listed = sorted(
                (entry.name, entry.is_symlink())
                for entry in entries
                if not entry.name.startswith(".")
            )
    except OSError:  # no memory/ folder (or not a folder)
        listed = []
    if listed and memory_dir is None:
        ignored.append(("memory", "a link leading outside the workspace"))
        listed = []
    for name, is_link in listed:
        rel = f"memory/{name}"
        if NOTE_PATH.fullmatch(rel):
            # A plain file in a folder inside the workspace is inside: no resolve() (about
            # nine lstat calls) per file on every rescan; only links are resolved.
            candidates.append((rel, None if is_link or memory_dir is None else memory_dir / name))
    for rel, plain in candidates:
        target = plain if plain is not None else _inside(real_root, rel)
        if target is None:
            ignored.append((rel, "a link leading outside the workspace"))
            continue
        try:
            st = target.stat()
        except OSError:
            continue  # MEMORY.md absent, or a dangling link
        if not stat.S_ISREG(st.st_mode):
            continue
        if st.st_size > MAX_NOTE_BYTES:
            ignored.append((rel, "larger than 1 MiB"))
            continue
        found[rel] = (target, st.st_mtime_ns, st.st_size)
    return found, ignored


def _note_stats(root: Path) -> tuple[tuple[str, int, int, int], ...]:
    """What the notes watcher compares between polls: (path, mtime_ns, size, inode) of
    `MEMORY.md`, of `memory/` and of each note name in it, links followed (a link that
    points elsewhere shows another inode). Plain `os` calls on strings, no path resolving:
    a poll runs every second, and the sync it triggers applies the rules (`_list_notes`).
    """
    base = os.fspath(root)
    found: list[tuple[str, int, int, int]] = []
    for rel in ("MEMORY.md", "memory"):
        try:
            st = os.stat(os.path.join(base, rel))
        except (OSError, ValueError):
            continue
        found.append((rel, st.st_mtime_ns, st.st_size, st.st_ino))
    try:
        with os.scandir(os.path.join(base, "memory")) as entries:
            for entry in entries:
                rel = f"memory/{entry.name}"
                if entry.name.startswith(".") or NOTE_PATH.fullmatch(rel) is None:
                    continue
                try:
                    st = entry.stat()
                except OSError:  # a dangling link: its presence is what counts
                    found.append((rel, -1, -1, -1))
                    continue
                found.append((rel, st.st_mtime_ns, st.st_size, st.st_ino))
    except (OSError, ValueError):  # no memory/ folder
        pass
    return tuple(sorted(found))


def _inside(real_root: Path, rel: str) -> Path | None:
    """`rel` resolved (links followed), or None if that leaves the workspace."""
    try:
        target = (real_root / rel).resolve()
    except (OSError, RuntimeError):  # a link loop
        return None
    return target if target.is_relative_to(real_root) else None


def _read_note(root: Path, rel: str, first: int, count: int, redactor: Redactor) -> ToolResult:
    """Runs on the reader's executor: lines `first`.. of one note, redacted."""
    try:
        real_root = root.resolve(strict=True)
    except (OSError, RuntimeError):
        return tool_failure("memory_get", f"path: no note {rel!r} (the workspace does not exist)")
    target = _inside(real_root, rel)
    if target is None:
        raise InvalidInputError(f"path: {rel!r} leads outside the workspace")
    try:
        st = target.stat()
        if not stat.S_ISREG(st.st_mode):
            return tool_failure("memory_get", f"path: {rel!r} is not a file")
        if st.st_size > MAX_NOTE_BYTES:
            return tool_failure("memory_get", f"path: {rel!r} is larger than 1 MiB; it is ignored")
        data = _read_bytes(target)
    except FileNotFoundError:
        return tool_failure("memory_get", f"path: no note {rel!r} in the workspace")
    except OSError as exc:
        return tool_failure("memory_get", f"path: cannot read {rel!r} ({exc.strerror or exc})")
    lines = redact_lines(redactor, note_lines(data.decode("utf-8-sig", errors="replace")))
    return _excerpt("memory_get", {"path": rel}, lines, first, count)


def redact_lines(redactor: Redactor, lines: Sequence[str]) -> list[str]:
    """`lines` redacted as one text, each redacted line kept at its original number.

    A secret spanning lines (a PEM block) is masked whole; the lines it covered beyond the
    mask come back empty. Nothing of the unredacted text is ever returned.
    """
    text = "\n".join(lines)
    redacted = redactor.redact(text)
    if redacted == text:
        return list(lines)
    out = redacted.split("\n")
    if len(out) == len(lines):
        return out
    # Align the redacted lines with the original ones; only redacted text is emitted.
    aligned: list[str] = []
    pending: list[str] = []  # redacted lines before the first original one
    matcher = difflib.SequenceMatcher(None, list(lines), out, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        span, got = i2 - i1, out[j1:j2]
        if span == 0:  # extra redacted lines: joined onto the line before
            if aligned:
                aligned[-1] = " ".join([aligned[-1], *got])
            else:
                pending += got
            continue
        if pending:
            got, pending = [" ".join([*pending, *got[:1]]), *got[1:]], []
        if tag == "equal" or len(got) == span:
            aligned += got
        elif len(got) < span:
            aligned += got + [""] * (span - len(got))
        else:
            aligned += [*got[: span - 1], " ".join(got[span - 1 :])]
    return aligned


def _excerpt(
    name: str, data: dict[str, Any], lines: Sequence[str], first: int, count: int
) -> ToolResult:
    """`count` lines from line `first` (1-based) as the tool result `data` plus the text."""
    chosen = lines[first - 1 : first - 1 + count]
    text = "\n".join(chosen)
    truncated = len(text) > MAX_TOOL_CONTENT_CHARS // 2
    if truncated:  # room for the JSON escaping around it
        text = text[: MAX_TOOL_CONTENT_CHARS // 2] + "…"
    data = {
        **data,
        "from": first,
        "to": first + len(chosen) - 1 if chosen else first - 1,
        "totalLines": len(lines),
        "text": text,
        "truncated": truncated,
    }
    return ToolResult(name=name, content=_dumps(data), data=data, evidence=bool(text.strip()))


def _result(source: str, path: str, start: int, end: int, snippet: str) -> dict[str, Any]:
    return {
        "source": source,
        "path": path,
        "startLine": start,
        "endLine": end,
        "score": 0.0,
        "snippet": snippet,
    }


def _session_result(hit: SearchHit, redactor: Redactor) -> dict[str, Any]:
    return _message_result(hit.session_key, hit.message_id, hit.role, hit.snippet, redactor)


def _message_result(
    key: str, message_id: int, role: str, snippet: str, redactor: Redactor
) -> dict[str, Any]:
    snippet = redactor.redact(snippet)  # already redacted; idempotent, and cheap
    path = f"{SESSION_PREFIX}{key}#{message_id}"
    return {**_result("sessions", path, 1, snippet.count("\n") + 1, snippet), "role": role}


def _fused_results(
    notes: Sequence[NoteHit],
    page: Any,
    side: VectorSide,
    query: Any,
    hybrid: HybridQuery,
    redactor: Redactor,
    terms: list[str],
    limit: int,
) -> list[dict[str, Any]]:
    """memory_search's results by meaning and words (recall/hybrid.py), best first."""
    by_note = {hit.chunk_id: hit for hit in notes}
    page_rows = list(zip(page.page.candidates, page.snippets, strict=True)) if page else []
    by_message = {c.event_id: (c, snippet) for c, (snippet, _) in page_rows}
    vectors: dict[Hashable, Any] = {("n", i): v for i, v in side.note_vectors.items()}
    vectors.update({("m", i): v for i, v in side.message_vectors.items()})
    meta: dict[Hashable, tuple[float | None, bool]] = {
        ("m", c.event_id): (c.timestamp, False) for c, _ in page_rows
    }
    meta.update({("m", i): (row.timestamp, False) for i, row in side.messages.items()})
    found = candidates(
        [
            [(("n", hit.chunk_id), hit.score) for hit in notes],
            [(("m", c.event_id), c.score) for c, _ in page_rows],
        ],
        [("n", i) for i, _ in side.near_notes] + [("m", i) for i, _ in side.near_messages],
        vectors,
        meta,
    )
    results = []
    for fused in rank(found, query, hybrid, limit=limit):
        kind, ident = cast(tuple[str, int], fused.key)
        if kind == "n":
            hit = by_note.get(ident)
            row = side.notes[ident] if hit is None else hit
            path, start, end, text = row.path, row.start_line, row.end_line, row.text
            snippet, _ = make_snippet(redactor.redact(text), terms, MAX_SNIPPET_CHARS)
            result = _result("memory", path, start, end, snippet)
        elif ident in by_message:
            c, snippet = by_message[ident]
            result = _message_result(c.session_key, ident, c.role, snippet, redactor)
        else:
            m = side.messages[ident]
            snippet, _ = make_snippet(redactor.redact(m.text), terms)
            result = _message_result(m.session_key, ident, m.role, snippet, redactor)
        results.append(with_similarity(result, fused))
    return results


def _merge(
    sources: Sequence[list[tuple[float, dict[str, Any]]]], limit: int
) -> list[dict[str, Any]]:
    """One list, best first: each source's scores divided by its best (see the module doc).

    A source whose best score is not positive (every term common: ranked by recency) is
    scored by position instead, 1/(1 + i).
    """
    merged: list[tuple[float, int, int, dict[str, Any]]] = []
    for order, hits in enumerate(sources):
        if not hits:
            continue
        best = max(score for score, _ in hits)
        for i, (score, result) in enumerate(hits):
            norm = score / best if best > 0 else 1.0 / (1 + i)
            merged.append((norm, order, i, result))
    merged.sort(key=lambda m: (-m[0], m[1], m[2]))
    results = []
    for norm, _, _, result in merged[:limit]:
        result["score"] = round(norm, 4)
        results.append(result)
    return results


def _dumps(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False)
