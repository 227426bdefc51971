"""A user's data (docs/design.md §2.6): list sessions, export an identity in the import
format, import such an export, erase an identity.

Whose data is whose is `Config.identity_of`, turned into a selector by
`Config.sessions_of` (direct chats of the identity's peers; the main and explicit sessions
if it is the owner) plus the sessions those spawned; its records are those whose `user_id`
is one of the identity's peer ids (the identity itself among them). Every write goes
through the databases' single writers: the indexer of each agent database and the records
keeper.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import msgspec

from ._importers import IdentityExport, RecordEntry, RelationEntry, Transcript
from .actors.supervisor import AgentStore, Supervisor
from .protocol.config import Config
from .protocol.content import check_bool, check_nonblank
from .protocol.errors import InvalidInputError, SessionNotFoundError, raise_rejected
from .protocol.indexer import (
    Archived,
    ArchiveSession,
    Created,
    CreateSession,
    Erased,
    EraseIdentity,
    Imported,
    ImportTranscript,
    IndexerAck,
    IndexerCommand,
    Rejected,
    SetSwitches,
    SwitchesSet,
)
from .protocol.records import (
    EraseUserRecords,
    LinkRecords,
    RecordAck,
    RecordAdded,
    RecordCommand,
    RecordRejected,
    RecordsErased,
    RecordsLinked,
    RestoreRecord,
)
from .protocol.session_key import CHAT_TYPES, ChatType, parse_session_key
from .protocol.transcript import ImportEntry, SessionInfo
from .protocol.userdata import AgentErasure, ErasureSummary, RecordErasure
from .storage.userdata import SessionTree

MAX_IDENTITY_CHARS = 256
A = TypeVar("A", bound=IndexerAck)
R = TypeVar("R", bound=RecordAck)


class ImportSummary(msgspec.Struct, frozen=True, kw_only=True):
    """What `mem.import_export` stored: sessions, their message events, records, relations."""

    sessions: int = 0
    events: int = 0
    records: int = 0
    relations: int = 0


def check_identity(identity: object, field: str = "identity") -> str:
    """An identity or peer id: 1 to 256 characters, not blank; `InvalidInputError` otherwise."""
    return check_nonblank(field, identity, MAX_IDENTITY_CHARS)


async def _agents(supervisor: Supervisor, agent: str | None) -> list[str]:
    """The agent databases to read or write: every one, or `agent` (which must exist: a
    mistyped agent is an error, never a new empty database)."""
    known = await supervisor.known_agents()
    if agent is None:
        return known
    if agent not in known:
        shown = ", ".join(known) or "none"
        raise InvalidInputError(f"agent: no database for agent {agent!r} (agents: {shown})")
    return [agent]


async def list_identity_sessions(
    supervisor: Supervisor,
    config: Config,
    *,
    agent: str | None,
    chat_type: ChatType | None,
    identity: str | None,
    peer: str | None,
    archived: bool | None,
) -> list[SessionInfo]:
    """`mem.sessions.list`: the sessions passing every filter, by agent, oldest first."""
    if chat_type is not None and chat_type not in CHAT_TYPES:
        raise InvalidInputError(f"chat_type: {chat_type!r} is not one of {', '.join(CHAT_TYPES)}")
    if identity is not None and peer is not None:
        raise InvalidInputError("peer: give an identity or a peer, not both")
    owner = None if identity is None else config.sessions_of(check_identity(identity))
    if peer is not None:
        check_identity(peer, "peer")
    if archived is not None:
        check_bool("archived", archived)
    found: list[SessionInfo] = []
    for name in await _agents(supervisor, agent):
        store = await supervisor.agent(name)
        found += await store.read(
            lambda reader: reader.list_sessions(
                chat_type=chat_type, peer=peer, owner=owner, archived=archived
            )
        )
    return found


def _user_ids(config: Config, identity: str) -> tuple[str, ...]:
    """The record `user_id`s of an identity: its peer ids (itself among them when it
    resolves to itself), as `memory_recall` names the user (docs/design.md §5)."""
    peers = config.sessions_of(identity).peers or ()
    return tuple(dict.fromkeys(peers))


async def export_identity(
    supervisor: Supervisor, config: Config, identity: str, *, agent: str | None
) -> IdentityExport:
    """`mem.export_identity`: every session (whole tree) and record of `identity`."""
    identity = check_identity(identity)
    scope = config.sessions_of(identity)
    transcripts: list[Transcript] = []
    for name in await _agents(supervisor, agent):
        store = await supervisor.agent(name)
        trees = await store.read(lambda reader: reader.session_trees(scope))
        transcripts += [transcript_of(tree) for tree in trees]
    records: tuple[RecordEntry, ...] = ()
    relations: tuple[RelationEntry, ...] = ()
    user_ids = _user_ids(config, identity)
    db = await supervisor.stored_records() if user_ids else None
    if db is not None:
        mine = await db.read(lambda reader: reader.records_of(user_ids, agent))
        records = tuple(RecordEntry(r.record, r.created_at, r.invalidated_at) for r in mine.records)
        relations = tuple(RelationEntry(e.relation, e.created_at) for e in mine.relations)
    return IdentityExport(
        identity=identity,
        transcripts=tuple(transcripts),
        records=records,
        relations=relations,
    )


def transcript_of(tree: SessionTree) -> Transcript:
    """A session as the import format holds it: its metadata, switches and whole tree,
    with its event ids to keep (`keep_ids`)."""
    info = tree.info
    entries = tuple(
        ImportEntry(
            id=str(e.id),
            parent_id=None if e.parent_id is None else str(e.parent_id),
            timestamp=e.timestamp,
            message=e.message,
        )
        for e in tree.events
        if e.message is not None
    )
    leaf = info.leaf_event_id
    return Transcript(
        session_key=info.key,
        entries=entries,
        leaf_id=None if leaf is None else str(leaf),
        persistent=info.persistent,
        interactive=info.interactive,
        archived=info.archived,
        sandboxed=info.sandboxed,
        spawned_by=info.spawned_by,
        created_at=info.created_at,
        updated_at=info.updated_at,
        keep_ids=True,
        switches=tree.switches,
    )


async def import_export(
    supervisor: Supervisor, clock: Callable[[], float], export: IdentityExport
) -> ImportSummary:
    """`mem.import_export`: store an export's sessions and records as they were."""
    if not isinstance(export, IdentityExport):
        raise InvalidInputError(f"export: expected an IdentityExport, got {type(export).__name__}")
    events = 0
    for t in export.transcripts:
        events += await _import_transcript(supervisor, clock, t)
    for r in export.records:
        now = clock()
        invalidated = r.invalidated_at
        if r.record.invalid_reason is not None and invalidated is None:
            invalidated = now
        command: RecordCommand = RestoreRecord(
            record=r.record,
            created_at=now if r.created_at is None else r.created_at,
            invalidated_at=invalidated,
        )
        await _submit_record(supervisor, command, RecordAdded)
    for rel in export.relations:
        at = clock() if rel.created_at is None else rel.created_at
        await _submit_record(supervisor, LinkRecords(relation=rel.relation, at=at), RecordsLinked)
    return ImportSummary(
        sessions=len(export.transcripts),
        events=events,
        records=len(export.records),
        relations=len(export.relations),
    )


async def _import_transcript(
    supervisor: Supervisor, clock: Callable[[], float], t: Transcript
) -> int:
    """One session: its metadata first (creation time, sandbox, parent), then its rows,
    then its archived flag and switches, each through the agent's indexer."""
    key = parse_session_key(t.session_key)
    store = await supervisor.agent(key.store_agent)
    now = clock()
    if t.created_at is not None or t.sandboxed or t.spawned_by is not None:
        spawned_by = None
        if t.spawned_by is not None:
            spawned_by = parse_session_key(t.spawned_by, field="spawned_by").raw
        create = CreateSession(
            key=key,
            persistent=t.persistent,
            interactive=t.interactive,
            sandboxed=t.sandboxed,
            spawned_by=spawned_by,
            at=now if t.created_at is None else t.created_at,
        )
        await _submit(store, create, Created)
    updated = now if t.updated_at is None else t.updated_at
    command = ImportTranscript(
        key=key,
        entries=t.entries,
        leaf_id=t.leaf_id,
        persistent=t.persistent,
        interactive=t.interactive,
        keep_ids=t.keep_ids,
        at=updated,
    )
    ack = await _submit(store, command, Imported)
    if t.archived:
        await _submit(store, ArchiveSession(key=key, archived=True, at=updated), Archived)
    if t.switches is not None:
        s = t.switches
        switches = SetSwitches(
            key=key, active_memory=s.active_memory, verbose=s.verbose, trace=s.trace
        )
        await _submit(store, switches, SwitchesSet)
    return ack.events


async def erase_identity(
    supervisor: Supervisor, config: Config, identity: str, *, dry_run: bool
) -> ErasureSummary:
    """`mem.erase_identity`: every agent database, then the records store."""
    identity = check_identity(identity)
    check_bool("dry_run", dry_run)
    scope = config.sessions_of(identity)
    agents: list[AgentErasure] = []
    for name in await supervisor.known_agents():
        store = await supervisor.agent(name)
        if dry_run:
            agents.append(await store.read(lambda reader: reader.plan_erasure(scope)))
        else:
            ack = await _submit(store, EraseIdentity(agent=name, sessions=scope), Erased)
            agents.append(ack.erasure)
    user_ids = _user_ids(config, identity)
    records = RecordErasure(user_ids=user_ids)
    db = await supervisor.stored_records() if user_ids else None
    if db is not None:
        if dry_run:
            records = await db.read(lambda reader: reader.plan_record_erasure(user_ids))
        else:
            erased = await _submit_record(
                supervisor, EraseUserRecords(user_ids=user_ids), RecordsErased
            )
            records = erased.erasure
    return ErasureSummary(identity=identity, dry_run=dry_run, agents=tuple(agents), records=records)


async def _submit(store: AgentStore, command: IndexerCommand, expect: type[A]) -> A:
    ack = await store.submit(command)
    if isinstance(ack, expect):
        return ack
    assert isinstance(ack, Rejected), ack
    raise_rejected(ack, SessionNotFoundError)


async def _submit_record(supervisor: Supervisor, command: RecordCommand, expect: type[R]) -> R:
    db = await supervisor.records()
    ack = await db.submit(command)
    if isinstance(ack, expect):
        return ack
    assert isinstance(ack, RecordRejected), ack
    raise_rejected(ack)
