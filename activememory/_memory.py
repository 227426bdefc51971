"""`open_memory()` and the facade objects users hold (docs/design.md §9)."""

from __future__ import annotations

import builtins  # `Sessions.list` shadows `list` inside the class
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import anyio

from ._commands import Commands
from ._config import load_config
from ._control import serve_request
from ._doctor import DoctorReport, diagnose
from ._importers import IdentityExport
from ._records import Records
from ._search import SessionSearch
from ._settings import Settings
from ._userdata import (
    ImportSummary,
    erase_identity,
    export_identity,
    import_export,
    list_identity_sessions,
)
from .actors.composer import Composer, Respond
from .actors.supervisor import AgentStore, Supervisor, open_supervisor
from .embed import embedder_from_config
from .protocol.config import Config
from .protocol.content import (
    Message,
    check_bool,
    check_choice,
    check_timestamp,
    message_from_mapping,
)
from .protocol.embeddings import Embedder
from .protocol.errors import InvalidInputError, SessionNotFoundError, StorageError, raise_rejected
from .protocol.indexer import (
    Appended,
    AppendMessage,
    Archived,
    ArchiveSession,
    Created,
    CreateSession,
    Deleted,
    DeleteSession,
    Imported,
    ImportTranscript,
    IndexerAck,
    IndexerCommand,
    MarkDirty,
    MarkedDirty,
    RebuildIndex,
    Rebuilt,
    Rejected,
    RewindSession,
    Rewound,
)
from .protocol.recall import (
    RecallCacheInfo,
    RecallOutcome,
    RecallPlan,
    RecallTrace,
    Reply,
    Sender,
    Turn,
)
from .protocol.search import DEFAULT_LIMIT, SearchMode, SearchResult
from .protocol.session_key import ChatType, SessionKey, parse_session_key
from .protocol.transcript import Event, ImportEntry, IndexStats, SessionInfo
from .protocol.userdata import ErasureSummary
from .recall.breaker import BreakerInfo
from .recall.coordinator import Recaller, RunTrace
from .recall.memory_core import MemoryCore
from .recall.models import RecallModels
from .storage.db import DURABILITY_LEVELS, Durability, readonly_error
from .storage.executor import EXECUTOR_KINDS, ExecutorKind
from .storage.fts_query import MatchMode
from .storage.run_transcripts import TranscriptPlace

if TYPE_CHECKING:
    from .storage.pg.db import PgSettings

_log = logging.getLogger("activememory")

A = TypeVar("A", bound=IndexerAck)


class Sessions:
    """Transcripts of every agent (docs/design.md §2): `mem.sessions`.

    Writes go to the agent's indexer (the single writer) and return once committed; reads
    run on the agent's reader connection and see every acknowledged write.
    """

    def __init__(
        self,
        supervisor: Supervisor,
        clock: Callable[[], float],
        search: SessionSearch,
        current: Callable[[], Settings],
    ) -> None:
        self._supervisor = supervisor
        self._clock = clock
        self._search = search
        self._current = current  # read once per search: the settings it runs under

    async def _store(self, key: SessionKey) -> AgentStore:
        return await self._supervisor.agent(key.store_agent)

    async def _submit(self, key: SessionKey, command: IndexerCommand, expect: type[A]) -> A:
        return await _submit_to(await self._store(key), command, expect)

    async def create(
        self,
        session_key: str,
        *,
        persistent: bool = True,
        interactive: bool = True,
        sandboxed: bool = False,
        spawned_by: str | None = None,
    ) -> SessionInfo:
        """Create a session with its metadata, or update the metadata of an existing one.

        Optional: `append` creates a session with the defaults on first use.

        Cancellation: if cancelled before the command is queued nothing changes; after
        that the session may still be created.
        """
        key = parse_session_key(session_key)
        if spawned_by is not None:
            spawned_by = parse_session_key(spawned_by, field="spawned_by").raw
        _check_bool("persistent", persistent)
        _check_bool("interactive", interactive)
        _check_bool("sandboxed", sandboxed)
        command = CreateSession(
            key=key,
            persistent=persistent,
            interactive=interactive,
            sandboxed=sandboxed,
            spawned_by=spawned_by,
            at=self._clock(),
        )
        await self._submit(key, command, Created)
        return await self.info(session_key)

    async def append(self, session_key: str, message: Message | Mapping[str, Any]) -> Event:
        """Append `message` at the session's leaf and return the stored event.

        Returns once the message is committed; a user or assistant message on a clean
        session is in the full-text index in that same transaction. The message's
        `timestamp` (default: now) must be epoch seconds from 0 to below 253402300800 (year
        10000), else `InvalidInputError`.

        Cancellation: if cancelled while waiting for room in the writer's inbox, nothing is
        written; if cancelled after the message was queued, it may still be committed (the
        event id is then lost to this caller; `history` shows it).
        """
        key = parse_session_key(session_key)
        if not isinstance(message, Message):
            message = _to_message(message)
        elif message.timestamp is not None:  # a mapping's is checked by message_from_mapping
            check_timestamp("message.timestamp", message.timestamp)
        command = AppendMessage(key=key, message=message, at=self._clock())
        # The hot path of every bot turn, flattened (docs/design.md §1.2): one await each for
        # the store and the ack, not `_submit` → `_store` → `_submit_to`; the same errors.
        store = await self._supervisor.agent(key.store_agent)
        ack = await store.submit(command)
        if isinstance(ack, Appended):
            return ack.event
        return _refused(ack)

    async def rewind(self, session_key: str, to_event_id: int) -> None:
        """Move the session's leaf back to `to_event_id` (an earlier message, on any branch).

        The next append branches from there. The session is dirty (hidden from search)
        until its index is rebuilt.

        Cancellation: as for `append`.
        """
        key = parse_session_key(session_key)
        _check_positive_int("to_event_id", to_event_id)
        command = RewindSession(key=key, to_event_id=to_event_id, at=self._clock())
        await self._submit(key, command, Rewound)

    async def delete(self, session_key: str) -> None:
        """Delete the session, its events and its index rows in one transaction.

        Raises `SessionNotFoundError` if there is no such session.

        Cancellation: as for `append`.
        """
        key = parse_session_key(session_key)
        await self._submit(key, DeleteSession(key=key), Deleted)

    async def archive(self, session_key: str, *, archived: bool = True) -> None:
        """Mark the session archived (or not, with `archived=False`).

        Cancellation: as for `append`.
        """
        key = parse_session_key(session_key)
        _check_bool("archived", archived)
        await self._submit(
            key, ArchiveSession(key=key, archived=archived, at=self._clock()), Archived
        )

    async def history(self, session_key: str, *, limit: int | None = None) -> list[Event]:
        """The session's active branch, oldest first (only the last `limit` if given).

        A session being re-indexed shows here whole; `info(key).dirty` says it is, and
        search hides it until the rebuild is done. Raises `SessionNotFoundError` if there is
        no such session.

        Cancellation: a read that has started finishes on its worker thread; nothing is
        left behind.
        """
        key = parse_session_key(session_key)
        if limit is not None:
            _check_positive_int("limit", limit)
        store = await self._store(key)
        events = await store.read(lambda reader: reader.history(key.raw, limit))
        if events is None:
            raise SessionNotFoundError(f"session_key: no session {key.raw!r}")
        return events

    async def info(self, session_key: str) -> SessionInfo:
        """The session's metadata and index state; `SessionNotFoundError` if missing.

        Cancellation: as for `history`.
        """
        key = parse_session_key(session_key)
        store = await self._store(key)
        info = await store.read(lambda reader: reader.session(key.raw))
        if info is None:
            raise SessionNotFoundError(f"session_key: no session {key.raw!r}")
        return info

    async def import_transcript(
        self,
        session_key: str,
        entries: Iterable[ImportEntry],
        *,
        leaf_id: str | None = None,
        persistent: bool = True,
        interactive: bool = True,
        resume: bool = False,
    ) -> int:
        """Store a transcript written before indexing existed; return the event count.

        The rows are stored unindexed and the session is dirty until its index is rebuilt
        (docs/design.md §2.3). Entries are a tree: each names its parent by an id of an earlier entry;
        the leaf is `leaf_id` or the last entry. The session must be new or empty.

        `resume=True` makes a repeated import harmless (docs/design.md §2.5): a session
        that already holds these entries first (same tree, timestamps, roles and content)
        is left as it is and 0 is returned; one that holds other messages is an
        `InvalidInputError` naming the first entry that differs (its `source`, if set).

        Cancellation: as for `append`; an import is one transaction, all or nothing.
        """
        key = parse_session_key(session_key)
        entries = tuple(entries)
        for i, entry in enumerate(entries):
            if not isinstance(entry, ImportEntry):
                raise InvalidInputError(f"entries[{i}]: expected an ImportEntry")
        _check_bool("resume", resume)
        command = ImportTranscript(
            key=key,
            entries=entries,
            leaf_id=leaf_id,
            persistent=persistent,
            interactive=interactive,
            resume=resume,
            at=self._clock(),
        )
        ack = await self._submit(key, command, Imported)
        return ack.events

    async def rebuild_index(self, session_key: str | None = None) -> Rebuilt:
        """Rebuild the index of dirty sessions (one session, or all of every open agent).

        Synchronous with respect to the caller: when it returns, those sessions are clean.

        Cancellation: as for `append`.
        """
        if session_key is not None:
            key = parse_session_key(session_key)
            return await self._submit(key, RebuildIndex(key=key), Rebuilt)
        sessions = index_rows = 0
        for agent in await self._supervisor.known_agents():
            ack = await _submit_to(await self._supervisor.agent(agent), RebuildIndex(), Rebuilt)
            sessions += ack.sessions
            index_rows += ack.index_rows
        return Rebuilt(sessions=sessions, index_rows=index_rows)

    async def reindex(
        self,
        session_key: str | None = None,
        *,
        agent: str | None = None,
        progress: Callable[[IndexStats], object] | None = None,
    ) -> list[IndexStats]:
        """Rebuild the full-text index from the active branches and wait until it is done.

        One session (`session_key`), every session of one `agent`, or (neither) of every
        agent in the state directory. The sessions are marked dirty (hidden from search;
        their vectors dropped, made again from the content-hash cache once clean) and the
        reconciler rebuilds them in short chunks beside other writes (docs/design.md §2.4).
        An agent-wide reindex first empties that agent's index, so it also repairs an
        index that fails its integrity check. The reconciler also rebuilds the agent's
        other dirty sessions, if any, in the same run. (`rebuild_index` rebuilds sessions
        already dirty in one transaction each: faster, for a store no bot is using.)

        `progress` is called with each agent's `IndexStats` (`indexed_messages` of
        `active_messages`, `dirty_sessions` left) at least twice a second while it waits.
        Returns each agent's `IndexStats` when done (FTS integrity checked).
        Raises `SessionNotFoundError` for a missing session, `InvalidInputError` for an
        agent without a database, `StorageError` if the rebuild is refused by storage.

        Cancellation: marking is one transaction (done or not); cancelling the wait leaves
        the rest dirty, and the reconciler finishes them in the background (or, after a
        restart, on the next search or reindex).
        """
        key = None if session_key is None else parse_session_key(session_key)
        known = await self._supervisor.known_agents()
        if agent is not None:
            if agent not in known:
                raise InvalidInputError(
                    f"agent: {agent!r} has no database here (agents: {', '.join(known) or 'none'})"
                )
            if key is not None and key.store_agent != agent:
                raise InvalidInputError(
                    f"session_key: {key.raw!r} is not a session of agent {agent!r}"
                )
        if key is not None and key.store_agent not in known:  # not even its database
            raise SessionNotFoundError(f"session_key: no session {key.raw!r}")
        agents = [key.store_agent] if key is not None else [agent] if agent else known
        stores = [await self._supervisor.agent(name) for name in agents]
        for store in stores:
            await _submit_to(store, MarkDirty(agent=store.agent, key=key), MarkedDirty)
        done = []
        for store in stores:
            await _wait_rebuilt(store, key, progress)
            done.append(await store.read(lambda reader: reader.stats(check_integrity=True)))
        return done

    async def search(
        self,
        query: str,
        *,
        caller: str,
        session_key: str | None = None,
        limit: int = DEFAULT_LIMIT,
        match: MatchMode = "phrase",
        mode: SearchMode = "text",
    ) -> SearchResult:
        """Full-text search of the user and assistant messages `caller` may see (docs/design.md §3).

        `caller` is the session key of the conversation asking; `tools.sessions.visibility`
        decides which sessions it sees (`tree` by default: its own and those it spawned).
        `session_key` narrows the search to one visible session. Terms: see README
        "Search terms"; `match="prefix"` lets the last term match as a prefix. Results are
        best first (BM25), at most `limit` (1-25), snippets redacted and at most 300
        characters, the serialized answer at most 32 KiB. While a visible session is being
        re-indexed, `indexing` is true and `warning` says the results may be incomplete.

        `mode="hybrid"` also searches by meaning: the messages nearest the query's vector in
        the same visible sessions (the same SQL scope, before any limit), fused with the
        text matches (`agents.defaults.memorySearch.query.hybrid`); `score` is then the
        fused score and `similarity` the cosine. Without a working embedder (none
        configured, failing, or slower than 1 s) the answer is the text mode's, with
        `fallback` saying why.

        Raises `InvalidInputError` for a blank or over-long query, a bad key, limit, match
        or mode.

        Cancellation: a read that has started finishes on its worker thread; nothing is
        written, nothing is left behind.
        """
        return await self._search.search(
            query,
            settings=self._current(),
            caller=caller,
            session_key=session_key,
            limit=limit,
            match=match,
            mode=mode,
        )

    async def list(
        self,
        *,
        agent: str | None = None,
        chat_type: ChatType | None = None,
        identity: str | None = None,
        peer: str | None = None,
        archived: bool | None = False,
    ) -> builtins.list[SessionInfo]:
        """The stored sessions that pass every filter given, by agent, oldest first
        (docs/design.md §2.6).

        `agent`: only that agent's database (`InvalidInputError` if it has none);
        `chat_type`: direct, group, channel, explicit or unknown; `identity`: the sessions
        of that identity (`session.identityLinks`, as recall decides whose a conversation
        is: the direct chats of its peers, the main and explicit sessions if it is the
        owner) and the sessions they spawned; `peer`: direct chats with that peer id (not
        with `identity`); `archived`: False (default) only unarchived sessions, True only
        archived ones, None both.

        Cancellation: as for `history`.
        """
        return await list_identity_sessions(
            self._supervisor,
            self._current().config,
            agent=agent,
            chat_type=chat_type,
            identity=identity,
            peer=peer,
            archived=archived,
        )

    async def stats(self, *, check_integrity: bool = True) -> builtins.list[IndexStats]:
        """Index statistics of every agent database in the state directory.

        Cancellation: as for `history`.
        """
        out = []
        for agent in await self._supervisor.known_agents():
            store = await self._supervisor.agent(agent)
            out.append(await store.index_stats(check_integrity=check_integrity))
        return out

    async def vectors_ready(self) -> bool:
        """Wait until the embedder has caught up: every indexed message and note chunk of
        every agent database, and every record of `records.db` (if it exists), has its
        vector (docs/design.md §2.3, §5.7), and no embedder is at work (so memory_search
        does not say `vectorsPending`). True when it has; False
        as soon as an embedder is failing (recall then falls back to text). At once True
        without an embedder. Bound the wait with a cancel scope (`anyio.move_on_after`).

        Vectors are made in the background after each write; a host rarely needs this —
        an importer or a test that asks about what it just stored does.

        Cancellation: nothing is written; cancelling only stops the waiting.
        """
        while True:
            stats = await self.stats(check_integrity=False)
            if any(s.embedder_error for s in stats):
                return False
            # Records too (docs/design.md §5.7), when records.db exists.
            records = await self._supervisor.records_with_vectors()
            lag, error = (0, None) if records is None else await records.vector_lag()
            if error is not None:
                return False
            # No row waits, and the embedder is not at work either: its first scan after a
            # store opens (or a write's poke) is what memory_search reports as vectorsPending.
            if lag == 0 and all(s.vectors_pending == 0 for s in stats):
                stores = [await self._supervisor.agent(s.agent) for s in stats]
                busy = records is not None and records.vectors_pending()
                if not busy and not any(store.vectors_pending() for store in stores):
                    return True
            await anyio.sleep(0.05)


class Memory:
    """An open active memory: what `open_memory()` yields.

    `sessions` holds the transcripts and their index; `recall`, `command` and
    `reload_config` are Active Memory (docs/design.md §4).
    """

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        config: Config,
        models: Mapping[str, Any] | None,
        tools: Mapping[str, Any] | None,
        clock: Callable[[], float],
        transcripts: TranscriptPlace | None = None,
    ) -> None:
        self._supervisor = supervisor
        self.state_dir = supervisor.state_dir
        self.executor: ExecutorKind = supervisor.executor_kind
        self.readonly = supervisor.readonly  # docs/design.md §1.6
        # One snapshot, swapped in one assignment: work reads it once, when it starts.
        self._settings = Settings.compile(config, supervisor.state_dir)
        self.models = dict(models or {})
        self.tools = dict(tools or {})
        search = SessionSearch(supervisor, on_dirty=AgentStore.poke)
        self._search = search
        self.sessions = Sessions(supervisor, clock, search, lambda: self._settings)
        self._commands = Commands(supervisor, self._swap_config)
        self.notes = MemoryCore(supervisor, search, lambda: self._settings)
        self.records = Records(
            supervisor, clock, lambda: self._settings.config.memory_search.query.hybrid
        )
        self._composer = Composer(self.sessions.append, self.recall)
        self._transcripts = transcripts or TranscriptPlace(supervisor.state_dir)
        self._recaller = Recaller(
            supervisor,
            models=RecallModels(self.models),
            tools=self.tools,
            pool=supervisor.recall_inbox,
            core=self.notes,
            transcripts=self._transcripts,
            records=self.records,
        )

    @property
    def config(self) -> Config:
        """The configuration the next turn uses."""
        return self._settings.config

    def _swap_config(self, config: Config) -> None:
        self._settings = Settings.compile(config, self.state_dir)

    def reload_config(
        self, config: str | os.PathLike[str] | Mapping[str, Any] | Config | None = None
    ) -> Config:
        """Replace the configuration; the next turn uses it, nothing restarts.

        `config` is a path, a mapping or an `am.Config`; None re-reads the file the current
        config came from. Recalls already running finish under the values they started
        with: their searches, redaction and workspace. Raises `am.ConfigError` for bad
        config, and then nothing changes.

        Cancellation: not a blocking call; it reads the file synchronously.
        """
        if config is None:
            if self.config.source is None:
                raise InvalidInputError("config: there is no config file to reload")
            config = self.config.source
        loaded = load_config(config)
        self._swap_config(loaded)
        return loaded

    async def recall(self, turn: Turn) -> RecallOutcome:
        """Run the recall step for `turn` and say what it found (docs/design.md §4).

        Never raises for storage or model trouble: the outcome's status says what happened
        (`skipped` with a `reason` when the turn is not eligible). Raises
        `InvalidInputError` only for a malformed `turn`.

        Cancellation: a recall writes only the note index (a notes rescan sends `SyncNotes`
        to the indexer, which may commit after a cancel) and its temporary transcript,
        closed and deleted on the way out; reads already started finish on their worker
        thread; a run already handed to the pool goes on, unawaited, until its budget ends.
        """
        return await self._recaller.recall(turn, self._settings)

    async def trace_recall(self, turn: Turn) -> RecallTrace:
        """`recall`, and what its sub-agent did: an `am.RecallTrace` with the outcome, the
        run's transcript lines and every tool result with its `evidence` flag (for an
        inspector; docs/design.md §12.3). It is a recall: the same cache, breaker, budget
        and writes. A cached answer or a skipped turn ran no sub-agent: `run_id` is None
        and the transcript is empty.

        Cancellation: as for `recall`.
        """
        trace = RunTrace()
        outcome = await self._recaller.recall(turn, self._settings, trace)
        return RecallTrace(
            outcome=outcome,
            run_id=trace.run_id,
            transcript=tuple(trace.lines),
            tool_results=tuple(trace.results),
        )

    def recall_cache_info(self) -> RecallCacheInfo:
        """The recall cache now: live entries, its bound, the TTL and how often it was
        emptied (docs/design.md §4.10).

        Cancellation: not a blocking call.
        """
        cache = self._recaller.cache
        return RecallCacheInfo(
            entries=cache.live(anyio.current_time()),
            max_entries=cache.max_entries,
            ttl_ms=self.config.active_memory.cache_ttl_ms,
            clears=cache.generation,
        )

    async def reply(self, turn: Turn, respond: Respond) -> Reply:
        """The whole bot path of one turn (docs/design.md §6).

        Persists the latest user message, recalls under the budget, calls
        `await respond(prompt_prefix, turn)` (your main model: `prompt_prefix` is the hidden
        block or None), persists the assistant's text, and returns an `am.Reply` with the
        text, the recall outcome and the follow-up lines to send after the reply. Memory
        fails open: a failed write or recall is listed in `reply.problems` and the turn goes
        on. An exception from `respond` propagates.

        Raises `InvalidInputError` before anything is written for a bad `turn` or a
        `respond` that cannot be called as `respond(prompt_prefix, turn)`; on a read-only
        memory, `StorageError`. What `respond` returns can only be checked after it ran: a
        non-awaitable or a non-string answer raises `InvalidInputError` when the user
        message is already stored (the message gives its event id) and no assistant message
        is.

        Cancellation: runs in the caller's task. Cancelled before `respond` returns, the
        user message may be stored and nothing else; after, the assistant message may be
        stored too. A recall in flight is abandoned, never awaited past its bound.
        """
        if self.readonly:  # a reply stores two messages: refuse before anything runs
            raise readonly_error(self.state_dir)
        return await self._composer.reply(turn, respond)

    async def plan_recall(self, turn: Turn) -> RecallPlan:
        """The preflight of `recall` alone: would this turn recall, and with what request?

        Returns an `am.RecallPlan`: its `request` (an `am.RecallRequest`: model, prompt,
        conversation context, search query, tools) or the `status` and `reason` the turn
        would end with. Nothing is run and nothing is written.

        Cancellation: as for `recall`.
        """
        return await self._recaller.plan(turn, self._settings)

    async def export_identity(self, identity: str, *, agent: str | None = None) -> IdentityExport:
        """Everything stored about `identity`, in the import format (docs/design.md §2.6).

        Its sessions (as `mem.sessions.list(identity=..., archived=None)` finds them) with
        their metadata, switches and whole trees — rewound branches, event ids and
        timestamps included — and its records (`user_id` one of its peer ids) with the
        relations among them; with `agent`, that agent's sessions and the records scoped to
        it or to no agent. `export.lines()` is the JSONL; `mem.import_export` stores it
        again as it was. Not covered (`export.not_covered`): the memory notes that mention
        the identity, group and channel conversations, kept recall transcripts.

        Cancellation: read-only; each database is read in one snapshot; nothing is left
        behind.
        """
        return await export_identity(self._supervisor, self.config, identity, agent=agent)

    async def import_export(self, export: IdentityExport) -> ImportSummary:
        """Store an export (`mem.export_identity`, or `am.IdentityExport.read(path)` of any
        JSONL transcript file): its sessions with their metadata and, when the file says
        `keepIds` and they are free, their event ids; its records with their ids, status
        and times, and their relations. Sessions are stored unindexed (dirty) until
        rebuilt (`mem.sessions.rebuild_index()`), as any import. Raises
        `InvalidInputError` if a session already has messages or a record id exists.

        Cancellation: each session and each record is its own write: cancelled midway,
        the ones already acknowledged stay; the one in flight may still commit.
        """
        return await import_export(self._supervisor, self.sessions._clock, export)

    async def erase_identity(self, identity: str, *, dry_run: bool = False) -> ErasureSummary:
        """Erase everything stored about `identity` (docs/design.md §2.6): its sessions
        (events, index rows, vectors, switches) in every agent database, the cached
        vectors of their texts that nothing else uses, and its records with their
        relations. Each database is erased in one transaction by its writer, then purged
        (`VACUUM`, the WAL truncated) so the text is gone from the files too; the recall
        cache is emptied. `dry_run=True` only counts what would go. Returns an
        `am.ErasureSummary`. Not covered (`summary.not_covered`): memory notes, group and
        channel conversations, kept recall transcripts.

        Cancellation: each database's erase is one command: cancelled before it is
        queued nothing changes; after, it commits whole (and is purged). The databases
        are erased one after another, so a cancelled erase may have erased some of them:
        run it again to finish.
        """
        summary = await erase_identity(self._supervisor, self.config, identity, dry_run=dry_run)
        if not dry_run:
            self._recaller.cache.clear()
        return summary

    async def doctor(self) -> DoctorReport:
        """Check the setup (docs/design.md §4.11): plugin and config state, the memory provider,
        memory_search where cross-conversation recall needs it, model resolution per agent,
        index health (re-indexing sessions, FTS integrity), circuit breakers.

        Cancellation: read-only; cancelling leaves nothing behind.
        """
        return await diagnose(self)

    def breaker_states(self) -> list[BreakerInfo]:
        """The recall circuit breakers (per agent + recall model) and their state now.

        Cancellation: not a blocking call.
        """
        return self._recaller.breakers.info(anyio.current_time())

    async def command(self, session_key: str, text: str, *, sender: Sender) -> str | None:
        """Handle `/active-memory`, `/verbose` or `/trace` (docs/design.md §4.3); None for other text.

        Returns the reply to show. Session switches persist across restarts; `--global`
        needs `sender.owner` or the `operator.admin` scope, and otherwise changes nothing.

        Cancellation: if cancelled before a switch is queued nothing changes; after that it
        may still be committed. A `--global` file write is atomic: old or new file.
        """
        return await self._commands.run(
            session_key, text, sender=sender, config=self._settings.config
        )


@contextlib.asynccontextmanager
async def open_memory(
    state_dir: str | os.PathLike[str],
    *,
    config: Config | Mapping[str, Any] | str | os.PathLike[str] | None = None,
    models: Mapping[str, Any] | None = None,
    tools: Mapping[str, Any] | None = None,
    executor: ExecutorKind = "thread",
    durability: Durability = "crash",
    clock: Callable[[], float] = time.time,
    embedder: Embedder | None = None,
    readonly: bool = False,
    storage: str | None = None,
) -> AsyncIterator[Memory]:
    """Open the active memory kept in `state_dir` (created if missing, unless `readonly`)
    and start its actors.

    `storage`: where the transcripts are kept (docs/design.md §11). None (default): as the
    config says (`storage.backend`, "sqlite" unless set; "postgresql" connects to
    `storage.dsn`); "sqlite": files in `state_dir`; a PostgreSQL connection string
    (`postgresql://...` or `host=... dbname=...`, its errors naming `storage.dsn`):
    that PostgreSQL store, which several processes (hosts) may open at once — `state_dir`
    then keeps the config's workspaces and the control spool. The server is reached, and
    the schema made or checked, before `open_memory` returns: a bad DSN, an unreachable
    server or a schema newer than this code is a `StorageError` naming `storage.dsn`.
    Everything below works there too, but the in-memory vector index (vectors are scored
    exactly; docs/design.md §11).

    `executor="thread"` runs SQLite on worker threads (production); `"inline"` runs it on the
    event-loop thread, for deterministic virtual-time simulations. `durability="crash"`
    (default): an acknowledged write survives the process being killed at any moment;
    `"power"`: it also survives power loss or an OS crash, at the price of an fsync per
    commit. `clock` stamps stored events (wall-clock seconds). `embedder` turns texts into
    vectors for recall by meaning (docs/design.md §4.7); None (default): the one the config
    names (`agents.defaults.memorySearch`: the shipped offline model unless it says
    otherwise), chosen once when the memory opens. Vectors are computed in the background,
    never on an append's path (docs/design.md §2.3). With `executor="inline"` the config's
    embedder is not used (its model runs on a worker thread, which virtual time cannot
    follow): pass one explicitly to have vectors there.

    `readonly=True` inspects a store, even one a running bot holds (docs/design.md §1.6):
    it takes no writer lock, starts no actor that writes (indexer, reconciler, records
    keeper, embedder, notes rescan), opens every database read-only and never migrates
    it, and reads what the writer has committed. `state_dir` must exist and hold a store;
    a schema older or newer than this code is a `StorageError`. Every call that would write
    (`append`, `reply`, `records.add`, `sync_notes`, a switch, ...) raises `StorageError`
    naming readonly. Sessions the writer is re-indexing stay hidden from search, which says
    `indexing`; `sessions.info(key).dirty` and `stats` show them. Recall works: its
    sub-agent transcript goes to a private temporary folder, never into the store
    (`persistTranscripts` is ignored). On PostgreSQL (`storage`) the database must hold the
    store's schema at this code's version instead (`state_dir` need not exist), and every
    connection is opened read-only, so the server itself refuses a write
    (docs/design.md §11 "Read-only").

    A writer open with the thread executor also serves other processes' control requests
    (docs/design.md §1.7): `activememory erase` beside the running bot asks it, and the
    erase runs through this memory's writers, with this memory's config. It creates
    `state_dir/control/` (mode 0700) for them; a read-only open never serves.

    Raises `InvalidInputError` if `state_dir` is a file (or, read-only, missing or holding
    no store) or `executor` is unknown, and `StorageError` if the directory cannot be
    created or is open in another process.

    Cancellation: on exit (normal, error or cancellation) the actors first commit and
    acknowledge every command already queued, shielded from cancellation, then the
    databases close.
    """
    check_choice("executor", executor, EXECUTOR_KINDS)
    check_choice("durability", durability, DURABILITY_LEVELS)
    check_bool("readonly", readonly)
    if embedder is not None and not isinstance(embedder, Embedder):
        raise InvalidInputError(
            f"embedder: expected an Embedder (name, dim, embed), got {type(embedder).__name__}"
        )
    if not isinstance(state_dir, str | os.PathLike):
        raise InvalidInputError(f"state_dir: expected a path, got {type(state_dir).__name__}")
    loaded = load_config(config if config is not None else {})
    pg = _postgresql(storage, loaded, readonly=readonly)
    if embedder is None and executor == "thread":
        embedder = embedder_from_config(loaded)
    transcripts = TranscriptPlace(Path(state_dir), keep=not readonly)
    memory: Memory | None = None
    try:
        async with open_supervisor(
            Path(state_dir),
            executor,
            durability=durability,
            embedder=embedder,
            readonly=readonly,
            pg=pg,
        ) as supervisor:
            memory = Memory(
                supervisor,
                config=loaded,
                models=models,
                tools=tools,
                clock=clock,
                transcripts=transcripts,
            )
            memory.notes.embedder = embedder
            memory._search.embedder = embedder
            memory.records.embedder = embedder
            # Other processes' erase requests run through this memory's writers (§1.7).
            supervisor.serve_control(functools.partial(serve_request, memory))
            yield memory
    finally:
        # After the recall pool has stopped: no run uses a model or writes a transcript.
        transcripts.close()
        if memory is not None:
            with anyio.CancelScope(shield=True):
                await memory._recaller.models.aclose()


async def _submit_to(store: AgentStore, command: IndexerCommand, expect: type[A]) -> A:
    ack = await store.submit(command)
    if isinstance(ack, expect):
        return ack
    return _refused(ack)


def _refused(ack: IndexerAck) -> NoReturn:
    """Raise what an ack other than the one expected means (`raise_rejected`)."""
    assert isinstance(ack, Rejected), ack
    raise_rejected(ack, SessionNotFoundError)


REINDEX_POLL_SECONDS = 0.5  # at most: each poll counts the agent's rows


async def _wait_rebuilt(
    store: AgentStore, key: SessionKey | None, progress: Callable[[IndexStats], object] | None
) -> None:
    """Wait until the reconciler has rebuilt the agent's dirty sessions (or `key`'s).

    Polls the reader, first often (a small rebuild ends in milliseconds), then every
    `REINDEX_POLL_SECONDS`.
    """
    pause = 0.005
    while True:
        store.poke("dirty")  # again each round: a poke is dropped while one waits
        stats = await store.read(lambda reader: reader.stats(check_integrity=False))
        if progress is not None:
            progress(stats)
        if key is None:
            if stats.dirty_sessions == 0:
                return
        else:
            info = await store.read(lambda reader: reader.session(key.raw))
            if info is None or not info.dirty:
                return
        failure = None if store.reconciler is None else store.reconciler.failure
        if failure is not None:  # (read-only has no reconciler: its reindex was refused)
            raise StorageError(f"reindex of agent {store.agent!r}: {failure}")
        await anyio.sleep(pause)
        pause = min(pause * 2, REINDEX_POLL_SECONDS)


def _to_message(value: object) -> Message:
    if isinstance(value, Mapping):
        return message_from_mapping(value)
    raise InvalidInputError(f"message: expected am.Message, got {type(value).__name__}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidInputError(f"{name}: expected true or false, got {value!r}")


def _check_positive_int(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidInputError(f"{name}: {value!r} is not a positive integer")


def _postgresql(storage: object, config: Config, *, readonly: bool) -> PgSettings | None:
    """The PostgreSQL store `open_memory` is asked for (its `storage` argument, else the
    config's `storage` section), opened read-only with `readonly`; None for SQLite. Bad
    values are `InvalidInputError` naming `storage` or the config key."""
    section = config.storage
    if storage is None:
        if section.backend == "sqlite":
            return None
        if section.dsn is None:
            raise InvalidInputError('storage.dsn: required when storage.backend is "postgresql"')
        dsn = section.dsn
    elif storage == "sqlite":
        return None
    elif isinstance(storage, str):  # a DSN: checked by libpq's parser (PgSettings)
        dsn = storage
    else:
        raise InvalidInputError(
            'storage: expected "sqlite" or a PostgreSQL connection string'
            f" (postgresql://... or host=... dbname=...), got {type(storage).__name__}"
        )
    try:
        from .storage.pg.db import PgSettings
    except ImportError as exc:  # pragma: no cover - the extra is part of the test install
        raise StorageError(
            f"storage: PostgreSQL needs the postgres extra (pip install 'activememory[postgres]'):"
            f" {exc}"
        ) from None
    return PgSettings(
        dsn=dsn,
        pool_min=section.pool_min,
        pool_max=section.pool_max,
        readonly=readonly,
        pgvector=section.pgvector,
    )
