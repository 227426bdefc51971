"""`mem.records`: the scoped memory records store (docs/design.md §5), and the `memory_recall` tool.

Three API layers search the same store and differ only in how an omitted scope field is
resolved (docs/design.md §5.2; each layer's class docstring says how): `mem.records.thread(...)`
(`RecordThread`), `mem.records` (`Records`, the client) and `mem.records.store` (`RecordStore`).

In every layer an explicit id with exact=True matches exactly that id, an explicit None with
exact=True only records not scoped in that dimension, and an explicit value (or None) with
exact=False does not filter but ranks records holding that value higher. When a value is
given and its exact flag is omitted, the flag is True; when a flag is given and its value
is omitted, the value is the layer's default (the thread's id for a thread, else None).

Writes go to the records keeper (the single writer) and return once committed; searches
run on the store's reader connection and see every acknowledged write.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Final, Literal, NamedTuple, TypeAlias, TypeVar

import msgspec

from ._record_search import refine
from ._redaction import DEFAULT_REDACTOR, Redactor
from .actors.supervisor import Supervisor
from .protocol.config import HybridQuery
from .protocol.content import check_bool, check_choice, check_int, check_nonblank, check_text
from .protocol.embeddings import Embedder
from .protocol.errors import InvalidInputError, raise_rejected
from .protocol.recall import ToolResult
from .protocol.record_results import RecordSearchResult
from .protocol.records import (
    NOT_SET,
    AddRecord,
    DeleteRecord,
    InvalidateRecord,
    LinkRecords,
    MemorySearchConfig,
    NotSetType,
    Record,
    RecordAck,
    RecordAdded,
    RecordCommand,
    RecordDeleted,
    RecordInvalidated,
    RecordRejected,
    RecordRelation,
    RecordResultFormatConfig,
    RecordsLinked,
    RecordStatus,
    RecordType,
    SearchResultFormatConfig,
    SearchScope,
    TopKMemorySearchConfig,
    is_finite_number,
)
from .protocol.tools import MemoryRecallArgs
from .recall.hybrid import MIN_SIMILARITY, embed_query, weights_of
from .recall.tools import MAX_TOOL_CONTENT_CHARS, tool_arguments
from .storage.fts_query import check_query as _query
from .storage.fts_query import plan_match
from .storage.records import LinkedNode, RecordHit, RecordMeaning, RecordQuery

MAX_CONTENT_CHARS: Final = 100_000
"""The longest record content accepted."""
MAX_ID_CHARS: Final = 256
"""The longest scope id (user, agent, thread) or record id accepted."""
MAX_METADATA_BYTES: Final = 64 * 1024
"""The largest metadata accepted, as JSON."""
MAX_REASON_CHARS: Final = 2000
"""The longest invalidation reason accepted."""
MAX_HOPS: Final = 5
MAX_LINKED_RESULTS: Final = 10_000
RELATION_NAME: Final = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
"""A relation name: a letter, then letters, digits, `_` or `-`; at most 64 characters."""
_MAX_METADATA_DEPTH = 32
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_TYPES = tuple(t.value for t in RecordType)
_STATUSES = tuple(s.value for s in RecordStatus)

# The two rejected cells of the docs/design.md §5.2 table.
USER_REQUIRED: Final = (
    "user_id: required; client searches need an exact user scope "
    "(use mem.records.store.search() to search across users)"
)
USER_MUST_BE_EXACT: Final = (
    "exact_user_match: must be True for client searches "
    "(use mem.records.store.search() to search across users)"
)

Layer: TypeAlias = Literal["thread", "client", "store"]
ScopeValue: TypeAlias = str | NotSetType | None
ExactFlag: TypeAlias = bool | NotSetType
A = TypeVar("A", bound=RecordAck)


def _format_config(given: object) -> SearchResultFormatConfig:
    """`format_config` as a search or `linked` takes it: None is the records' default."""
    if given is None:
        return RecordResultFormatConfig()
    if not isinstance(given, SearchResultFormatConfig):
        raise InvalidInputError(
            f"format_config: expected a SearchResultFormatConfig, got {type(given).__name__}"
        )
    return given


class SearchInfo(NamedTuple):
    """How a records search ran (docs/design.md §5.7), for `memory_recall`'s data: `mode`
    "hybrid" (text and vectors fused) or "text"; `fallback` why it is text only although
    an embedder is configured; `vectors_pending` whether the records embedder is at work
    (new records may not be found by meaning yet); `embedder` the vector space's name."""

    mode: Literal["hybrid", "text"] = "text"
    fallback: str | None = None
    vectors_pending: bool = False
    embedder: str | None = None


class _Layer:
    """What the three layers share (docs/design.md §5.2): one `search`, whose omitted scope
    fields each layer resolves its own way."""

    _layer: ClassVar[Layer]
    _records: Records

    async def search(
        self,
        query: str,
        *,
        user_id: ScopeValue = NOT_SET,
        agent_id: ScopeValue = NOT_SET,
        thread_id: ScopeValue = NOT_SET,
        exact_user_match: ExactFlag = NOT_SET,
        exact_agent_match: ExactFlag = NOT_SET,
        exact_thread_match: ExactFlag = NOT_SET,
        include_invalid_results: ExactFlag = NOT_SET,
        num_hops: int = 0,
        max_linked_results: int = 100,
        record_types: Iterable[RecordType | str] | None = None,
        metadata_filter: Mapping[str, Any] | None = None,
        config: MemorySearchConfig | None = None,
        format_config: SearchResultFormatConfig | None = None,
    ) -> list[RecordSearchResult]:
        """Full-text search of the records in scope, best first (smallest `distance`).

        Query terms work as in `sessions_search` (any term matches, BM25 ranks, stemming,
        CJK). Scope: the layer's rules (its class docstring) and the module docstring.
        `include_invalid_results`: omitted or True returns valid and invalid matches, False
        only valid ones (linked records are never dropped for being invalid). `num_hops` (0-5) attaches linked memory records to each
        direct memory result, as a shortest-path tree, at most `max_linked_results` (0 to
        10000, default 100) per result across all hops. `record_types` keeps only those
        types (direct and linked). `metadata_filter` keeps records whose metadata holds
        every given top-level key with an equal scalar value (str, int/float, bool, None;
        True is not 1). Scope, expiry, type and metadata filters apply to linked records
        too. `config` sets the direct result count, reranking, pruning and token budgets
        (`MemorySearchConfig` and subclasses; default: at most 10 results). `format_config`
        becomes each result's `format_config`, which budgets count with.

        By meaning too (docs/design.md §5.7): when the memory has an embedder, records are
        found by their vectors as well (the same scope and filters, in SQL), fused with the
        text matches under `agents.defaults.memorySearch.query.hybrid`; a result's
        `distance` is then 1 - the cosine similarity of the record's vector to the query's
        (Oracle's COSINE distance, 0 to 2), and stays `1 / (1 + BM25 relevance)` for a
        record without a vector yet. An embedder that fails or is slow means text alone.

        Raises `InvalidInputError` naming the argument for bad input, `RankingError` when a
        reranker or judge fails.

        Cancellation: nothing is written; a read that has started finishes on its worker,
        and a query embedding, reranker or judge call is cancelled with the search.
        """
        results, _ = await self._search(
            query,
            user_id=user_id,
            agent_id=agent_id,
            thread_id=thread_id,
            exact_user_match=exact_user_match,
            exact_agent_match=exact_agent_match,
            exact_thread_match=exact_thread_match,
            include_invalid_results=include_invalid_results,
            num_hops=num_hops,
            max_linked_results=max_linked_results,
            record_types=record_types,
            metadata_filter=metadata_filter,
            config=config,
            format_config=format_config,
        )
        return results

    async def _search(
        self,
        query: str,
        *,
        user_id: ScopeValue = NOT_SET,
        agent_id: ScopeValue = NOT_SET,
        thread_id: ScopeValue = NOT_SET,
        exact_user_match: ExactFlag = NOT_SET,
        exact_agent_match: ExactFlag = NOT_SET,
        exact_thread_match: ExactFlag = NOT_SET,
        include_invalid_results: ExactFlag = NOT_SET,
        num_hops: int = 0,
        max_linked_results: int = 100,
        record_types: Iterable[RecordType | str] | None = None,
        metadata_filter: Mapping[str, Any] | None = None,
        config: MemorySearchConfig | None = None,
        format_config: SearchResultFormatConfig | None = None,
    ) -> tuple[list[RecordSearchResult], SearchInfo]:
        """`search`, and how it ran."""
        _query(query)
        records, thread = self._records, self if isinstance(self, RecordThread) else None
        flags = (exact_user_match, exact_agent_match, exact_thread_match)
        scope, boosts = resolve_scope(self._layer, (user_id, agent_id, thread_id), flags, thread)
        include_invalid = include_invalid_results is NOT_SET or check_bool(
            "include_invalid_results", include_invalid_results
        )
        check_int("num_hops", num_hops, 0, MAX_HOPS)
        check_int("max_linked_results", max_linked_results, 0, MAX_LINKED_RESULTS)
        if config is not None and not isinstance(config, MemorySearchConfig):
            raise InvalidInputError(
                f"config: expected a MemorySearchConfig, got {type(config).__name__}"
            )
        format_config = _format_config(format_config)
        request = RecordQuery(
            scope=scope,
            boosts=boosts,
            now=records._clock(),
            limit=(config or MemorySearchConfig()).direct_limit,
            include_invalid=include_invalid,
            record_types=_record_types(record_types),
            metadata=_metadata_filter(metadata_filter),
            num_hops=num_hops,
            max_linked=max_linked_results,
        )
        plan = plan_match(query)
        if plan is None:
            return [], SearchInfo()  # nothing searchable in the query (only punctuation, say)
        db = await records._supervisor.records()
        meaning, info = await records._meaning(query)
        info = info._replace(vectors_pending=db.vectors_pending())
        hits = await db.read(lambda reader: reader.search(plan, request, meaning))
        results = [_result(hit, format_config) for hit in hits]
        return await refine(query, results, config), info


class Records(_Layer):
    """The records store client (docs/design.md §5): `mem.records`.

    Add, link, invalidate, delete and get records; search with the client's scope rules:
    `user_id` is required and exact (an omitted `user_id`, or `exact_user_match=False`,
    raises `InvalidInputError`); omitted `agent_id`/`thread_id` are not filtered.
    `thread(...)` and `store` search with theirs.
    """

    _layer = "client"

    def __init__(
        self,
        supervisor: Supervisor,
        clock: Callable[[], float],
        hybrid: Callable[[], HybridQuery] = HybridQuery,
    ) -> None:
        self._supervisor = supervisor
        self._clock = clock
        self._hybrid = hybrid  # read once per search: the current config's fusion settings
        self._records = self
        self._store = RecordStore(self)
        # The query side of the hybrid search; the embedder the embedder actors use.
        self.embedder: Embedder | None = None

    async def _meaning(self, query: str) -> tuple[RecordMeaning | None, SearchInfo]:
        """The vector side of a search (docs/design.md §5.7): the query's vector within its
        deadline (`recall.hybrid.embed_query`), or why the search is text only."""
        found = await embed_query(self.embedder, query)
        if found.vector is None or found.name is None:
            return None, SearchInfo(fallback=found.fallback)
        hybrid = self._hybrid()
        meaning = RecordMeaning(
            vector=found.vector,
            name=found.name,
            weights=weights_of(hybrid),
            multiplier=hybrid.candidate_multiplier,
            min_similarity=MIN_SIMILARITY,
        )
        return meaning, SearchInfo(mode="hybrid", embedder=found.name)

    @property
    def store(self) -> RecordStore:
        """The store layer: searches where an omitted scope field is not filtered."""
        return self._store

    def thread(
        self, *, user_id: str | None, agent_id: str | None, thread_id: str | None
    ) -> RecordThread:
        """The thread layer for this user, agent and thread (each an id, or None).

        Raises `InvalidInputError` naming a malformed id. Not a blocking call.
        """
        return RecordThread(
            self,
            user_id=_scope_id("user_id", user_id),
            agent_id=_scope_id("agent_id", agent_id),
            thread_id=_scope_id("thread_id", thread_id),
        )

    async def add(
        self,
        content: str,
        *,
        user_id: str | None,
        agent_id: str | None = None,
        thread_id: str | None = None,
        record_type: RecordType | str = RecordType.MEMORY,
        metadata: Mapping[str, Any] | None = None,
        timestamp: float | None = None,
        expires_at: float | None = None,
        role: str | None = None,
    ) -> str:
        """Store a record and return its id (32 hex digits); it is searchable on return.

        `user_id`, `agent_id`, `thread_id`: an id, or None for "not scoped in this
        dimension". `record_type`: memory (default), message, document, actor_profile or
        image (whose content is its searchable description). `metadata`: a JSON-able
        mapping (string keys; at most 64 KiB as JSON). `timestamp` defaults to now;
        `expires_at` (seconds since the epoch) hides the record from then on. `role`: for
        message records only. Raises `InvalidInputError` naming the field for bad input
        (empty or over-long content, bad type, metadata that is not JSON data, ...).

        Cancellation: if cancelled while waiting for room in the writer's inbox, nothing is
        stored; once queued, the record may still be stored (its id is then lost to this
        caller).
        """
        now = self._clock()
        record = checked_record(
            id=uuid.uuid4().hex,
            content=content,
            record_type=record_type,
            user_id=user_id,
            agent_id=agent_id,
            thread_id=thread_id,
            metadata=metadata,
            timestamp=now if timestamp is None else timestamp,
            expires_at=expires_at,
            role=role,
        )
        ack = await self._submit(AddRecord(record=record, at=now), RecordAdded)
        return ack.id

    async def link(self, source_id: str, target_id: str, *, relation: str) -> RecordRelation:
        """Store the typed, directed relation `source_id` —`relation`→ `target_id`.

        Both records must exist (`InvalidInputError` naming `source_id` or `target_id`
        otherwise); a record cannot be linked to itself. `relation` matches
        `RELATION_NAME` (e.g. "about", "part_of", "supersedes"). Linking twice is harmless.
        Returns the stored relation.

        Cancellation: as for `add`.
        """
        rel = checked_relation(source_id, target_id, relation)
        ack = await self._submit(LinkRecords(relation=rel, at=self._clock()), RecordsLinked)
        return ack.relation

    async def invalidate(self, id: str, *, reason: str) -> None:
        """Mark the record `id` invalid, with `reason` (1 to 2000 characters).

        An invalid record is still returned unless a search passes
        `include_invalid_results=False`; linked invalid records always are. Invalidating
        again replaces the reason. `InvalidInputError` if there is no such record.

        Cancellation: as for `add`.
        """
        record_id = _record_id("id", id)
        command = InvalidateRecord(id=record_id, reason=_reason(reason), at=self._clock())
        await self._submit(command, RecordInvalidated)

    async def delete(self, id: str) -> None:
        """Delete the record `id`, its relations and its index row, in one transaction.

        `InvalidInputError` if there is no such record.

        Cancellation: as for `add`.
        """
        await self._submit(DeleteRecord(id=_record_id("id", id)), RecordDeleted)

    async def get(self, id: str) -> Record | None:
        """The record `id`, or None if there is none or it has expired.

        Cancellation: a read that has started finishes on its worker; nothing is left
        behind.
        """
        record_id = _record_id("id", id)
        now = self._clock()
        db = await self._supervisor.records()
        return await db.read(lambda reader: reader.get(record_id, now))

    async def linked(
        self,
        id: str,
        *,
        num_hops: int = 1,
        max_linked_results: int = 100,
        format_config: SearchResultFormatConfig | None = None,
    ) -> RecordSearchResult | None:
        """The record `id` with its linked context, as a search that found it would attach
        it (`num_hops` 0-5, at most `max_linked_results` linked records; only a memory
        record has linked context, and only memory records are linked), across every scope;
        `distance` 0. None if there is no such record or it has expired. For an inspector
        that opens one record's graph (docs/design.md §12.3).

        Cancellation: as for `get`.
        """
        record_id = _record_id("id", id)
        check_int("num_hops", num_hops, 0, MAX_HOPS)
        check_int("max_linked_results", max_linked_results, 0, MAX_LINKED_RESULTS)
        format_config = _format_config(format_config)
        anywhere = SearchScope(
            user_id=None,
            agent_id=None,
            thread_id=None,
            exact_user_match=False,
            exact_agent_match=False,
            exact_thread_match=False,
        )
        query = RecordQuery(
            scope=anywhere,
            now=self._clock(),
            limit=1,
            num_hops=num_hops,
            max_linked=max_linked_results,
        )
        db = await self._supervisor.records()
        hit = await db.read(lambda reader: reader.linked(record_id, query))
        return None if hit is None else _result(hit, format_config)

    # -- internals ------------------------------------------------------------------------

    async def _submit(self, command: RecordCommand, expect: type[A]) -> A:
        db = await self._supervisor.records()
        ack = await db.submit(command)
        if isinstance(ack, expect):
            return ack
        assert isinstance(ack, RecordRejected), ack
        raise_rejected(ack)


class RecordThread(_Layer):
    """The thread layer (docs/design.md §5.2): searches default to one user, agent and thread.

    Made by `mem.records.thread(user_id=..., agent_id=..., thread_id=...)`. Omitted fields:
    exactly this thread's user and agent; this thread's records rank higher, but other
    threads' records of that user and agent come back too (`exact_thread_match=True` keeps
    only this thread's).
    """

    _layer = "thread"

    def __init__(
        self, records: Records, *, user_id: str | None, agent_id: str | None, thread_id: str | None
    ) -> None:
        self._records = records
        self.user_id = user_id
        self.agent_id = agent_id
        self.thread_id = thread_id

    def __repr__(self) -> str:
        return (
            f"RecordThread(user_id={self.user_id!r}, agent_id={self.agent_id!r},"
            f" thread_id={self.thread_id!r})"
        )


class RecordStore(_Layer):
    """The store layer (docs/design.md §5.2): `mem.records.store`; omitted scope fields are not
    filtered."""

    _layer = "store"

    def __init__(self, records: Records) -> None:
        self._records = records


_DIMENSIONS = (("user_id", "exact_user_match"), ("agent_id", "exact_agent_match"),
               ("thread_id", "exact_thread_match"))  # fmt: skip


def resolve_scope(
    layer: Layer,
    values: tuple[ScopeValue, ScopeValue, ScopeValue],
    flags: tuple[ExactFlag, ExactFlag, ExactFlag],
    thread: RecordThread | None = None,
) -> tuple[SearchScope, frozenset[str]]:
    """The docs/design.md §5.2 table: a layer's scope arguments → the scope the store filters by, and
    the dimensions whose value boosts the ranking.

    A dimension boosts when it is not exact and its value was given explicitly, or is the
    thread layer's own thread; an omitted dimension of the client or store is neither
    filtered nor boosted.
    """
    resolved: list[tuple[str | None, bool]] = []
    boosts: set[str] = set()
    for (dim, flag_name), value, exact in zip(_DIMENSIONS, values, flags, strict=True):
        if value is not NOT_SET:
            value = _scope_id(dim, value)
        if exact is not NOT_SET:
            check_bool(flag_name, exact)
        if layer == "client" and dim == "user_id":
            if value is NOT_SET:
                raise InvalidInputError(USER_REQUIRED)
            if exact is False:
                raise InvalidInputError(USER_MUST_BE_EXACT)
            resolved.append((value, True))
            continue
        if value is NOT_SET:
            if layer == "thread":
                assert thread is not None
                own = {"user_id": thread.user_id, "agent_id": thread.agent_id}
                default, default_exact = own.get(dim, thread.thread_id), dim != "thread_id"
            else:
                default, default_exact = None, False
            is_exact = default_exact if exact is NOT_SET else exact
            if not is_exact and layer == "thread":
                boosts.add(dim)
            resolved.append((default, is_exact))
        else:
            is_exact = True if exact is NOT_SET else exact
            if not is_exact:
                boosts.add(dim)
            resolved.append((value, is_exact))
    (user, exact_user), (agent, exact_agent), (thread_id, exact_thread) = resolved
    scope = SearchScope(
        user_id=user,
        agent_id=agent,
        thread_id=thread_id,
        exact_user_match=exact_user,
        exact_agent_match=exact_agent,
        exact_thread_match=exact_thread,
    )
    return scope, frozenset(boosts)


def _result(hit: RecordHit, format_config: SearchResultFormatConfig) -> RecordSearchResult:
    return RecordSearchResult(
        record=hit.record,
        distance=hit.distance,
        linked_results=[_linked(node, format_config) for node in hit.linked],
        format_config=format_config,
    )


def _linked(
    node: LinkedNode, format_config: SearchResultFormatConfig
) -> tuple[RecordRelation, RecordSearchResult]:
    result = RecordSearchResult(
        record=node.record,
        linked_results=[_linked(child, format_config) for child in node.children],
        format_config=format_config,
    )
    return node.relation, result


# -- input checks: each error names the field -----------------------------------------------


def checked_record(
    *,
    id: object,
    content: object,
    record_type: object,
    user_id: object,
    agent_id: object,
    thread_id: object,
    metadata: object,
    timestamp: object,
    expires_at: object,
    role: object,
    status: object = RecordStatus.VALID,
    invalid_reason: object = None,
) -> Record:
    """A `Record` from fields given by a caller or a file; `InvalidInputError` names the
    first bad one (`mem.records.add`, and an import's record lines)."""
    rtype = _record_type("record_type", record_type)
    record_status = RecordStatus(check_choice("status", status, _STATUSES))
    reason = None
    if record_status == RecordStatus.INVALID:
        reason = _reason(invalid_reason)
    elif invalid_reason is not None:
        raise InvalidInputError("invalid_reason: only an invalid record has one")
    return Record(
        id=_record_id("id", id),
        content=check_nonblank("content", content, MAX_CONTENT_CHARS),
        record_type=rtype,
        user_id=_scope_id("user_id", user_id),
        agent_id=_scope_id("agent_id", agent_id),
        thread_id=_scope_id("thread_id", thread_id),
        status=record_status,
        invalid_reason=reason,
        metadata=_metadata(metadata),
        timestamp=_seconds("timestamp", timestamp),
        expires_at=None if expires_at is None else _seconds("expires_at", expires_at),
        role=_role(role, rtype),
    )


def checked_relation(source_id: object, target_id: object, relation: object) -> RecordRelation:
    """A `RecordRelation` from caller input; `InvalidInputError` names the bad field."""
    rel = RecordRelation(
        relation=_relation(relation),
        source_id=_record_id("source_id", source_id),
        target_id=_record_id("target_id", target_id),
    )
    if rel.source_id == rel.target_id:
        raise InvalidInputError("target_id: a record cannot be linked to itself")
    return rel


def _reason(reason: object) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInputError(f"reason: expected a non-empty string, got {reason!r}")
    if len(reason) > MAX_REASON_CHARS:
        raise InvalidInputError(
            f"reason: {len(reason)} characters is over the maximum {MAX_REASON_CHARS}"
        )
    return check_text("reason", reason)


def _scope_id(name: str, value: object) -> str | None:
    if value is None:
        return None
    return _record_id(name, value)


def _record_id(name: str, value: object) -> str:
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > MAX_ID_CHARS
        or _CONTROL.search(value)
    ):
        raise InvalidInputError(
            f"{name}: expected an id (1 to {MAX_ID_CHARS} characters, no control characters)"
            f"{' or None' if name in ('user_id', 'agent_id', 'thread_id') else ''}, "
            f"got {value!r}"
        )
    return check_text(name, value)


def _record_type(name: str, value: object) -> RecordType:
    return RecordType(check_choice(name, value, _TYPES))


def _record_types(value: Iterable[RecordType | str] | None) -> tuple[RecordType, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | RecordType) or not isinstance(value, Iterable):
        raise InvalidInputError(
            f"record_types: expected a list of record types, got {type(value).__name__}"
        )
    found = tuple(_record_type(f"record_types[{i}]", t) for i, t in enumerate(value))
    if not found:
        raise InvalidInputError("record_types: must name at least one record type")
    return found


def _role(role: object, record_type: object) -> str | None:
    if role is None:
        return None
    if not isinstance(role, str) or not role.strip() or len(role) > 64 or _CONTROL.search(role):
        raise InvalidInputError(f"role: expected a role name (1 to 64 characters), got {role!r}")
    if record_type != RecordType.MESSAGE:
        raise InvalidInputError("role: only message records have a role")
    return check_text("role", role)


def _relation(relation: object) -> str:
    if not isinstance(relation, str) or RELATION_NAME.fullmatch(relation) is None:
        raise InvalidInputError(
            f"relation: {relation!r} is not a relation name (a letter, then letters, digits,"
            " '_' or '-'; at most 64 characters)"
        )
    return relation


def _seconds(name: str, value: object) -> float:
    if not is_finite_number(value):
        raise InvalidInputError(
            f"{name}: expected a finite number of seconds since the epoch, got {value!r}"
        )
    return float(value)  # type: ignore[arg-type]


def _metadata(metadata: object) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidInputError(f"metadata: expected a mapping, got {type(metadata).__name__}")
    _check_json("metadata", metadata, 0)
    encoded = msgspec.json.encode(metadata)
    if len(encoded) > MAX_METADATA_BYTES:
        raise InvalidInputError(
            f"metadata: {len(encoded)} bytes as JSON is over the maximum {MAX_METADATA_BYTES}"
        )
    # A snapshot as the store keeps it: the caller's mapping may change after the call.
    snapshot: dict[str, Any] = msgspec.json.decode(encoded)
    return snapshot


def _check_json(path: str, value: object, depth: int) -> None:
    if depth > _MAX_METADATA_DEPTH:
        raise InvalidInputError(f"{path}: nested deeper than {_MAX_METADATA_DEPTH} levels")
    if isinstance(value, str):
        check_text(path, value)
        return
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidInputError(f"{path}: {value!r} is not a finite number (not JSON)")
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidInputError(f"{path}: keys must be strings, got {key!r}")
            check_text(f"{path} key", key)
            _check_json(f"{path}[{key!r}]", item, depth + 1)
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json(f"{path}[{i}]", item, depth + 1)
        return
    raise InvalidInputError(
        f"{path}: {type(value).__name__} is not JSON data (str, int, float, bool, None, list, dict)"
    )


def _metadata_filter(value: object) -> tuple[tuple[str, object], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidInputError(f"metadata_filter: expected a mapping, got {type(value).__name__}")
    pairs = []
    for key, item in value.items():
        if not isinstance(key, str):
            raise InvalidInputError(f"metadata_filter: keys must be strings, got {key!r}")
        check_text("metadata_filter key", key)
        if isinstance(item, str):
            check_text(f"metadata_filter[{key!r}]", item)
        scalar = item is None or isinstance(item, str | bool | int) or is_finite_number(item)
        if not scalar:
            raise InvalidInputError(
                f"metadata_filter[{key!r}]: expected a str, finite number, bool or None, "
                f"got {item!r}"
            )
        pairs.append((key, item))
    return tuple(pairs)


# -- the memory_recall tool (docs/design.md §4.7, memory-records slot) --------------------------------

_RECALL_FORMAT = RecordResultFormatConfig(include_invalid_results=False)


async def recall_tool(
    records: Records,
    args: Mapping[str, Any],
    *,
    user_id: str | None,
    agent_id: str | None,
    thread_id: str | None,
    redactor: Redactor | None = None,
) -> ToolResult:
    """The `memory_recall` tool: the user's records that match a query, as XML.

    `args`: `query` (1 to 4096 characters) and `maxResults` (1 to 25, default 6); bad
    arguments raise `InvalidInputError` naming the argument. Searches as
    `records.thread(user_id=..., agent_id=..., thread_id=...).search(query,
    include_invalid_results=False, num_hops=1)`. Content, metadata and invalidation reasons
    are redacted (`redactor`, default: the built-in formats); invalid linked branches are
    left out of the text. `content` is `<memory_records>` holding each result's
    `<record>`, at most 16 000 characters (the worst results go first); `data` has
    `results` (id, content, distance, record_type, status of each direct result), `hits`,
    `effectiveMode` ("hybrid" or "text"), `fallback` (why text only, or None), and
    `embedder`/`vectorsPending` as memory_search has them (docs/design.md §5.7); evidence
    when there is at least one hit.

    Cancellation: nothing is written; a read that has started finishes on its worker.
    """
    parsed = tool_arguments(MemoryRecallArgs, args)
    thread = records.thread(user_id=user_id, agent_id=agent_id, thread_id=thread_id)
    found, info = await thread._search(
        parsed.query,
        include_invalid_results=False,
        num_hops=1,
        config=TopKMemorySearchConfig(max_results=parsed.max_results),
        format_config=_RECALL_FORMAT,
    )
    scrub = (redactor or DEFAULT_REDACTOR).redact
    results = [_redacted(result, scrub) for result in found]
    while True:
        body = "\n".join(result.formatted_content for result in results)
        content = f"<memory_records>\n{body}\n</memory_records>" if results else "<memory_records/>"
        if len(content) <= MAX_TOOL_CONTENT_CHARS or not results:
            break
        results.pop()
    data: dict[str, object] = {
        "results": [
            {
                "id": r.id,
                "content": r.content,
                "distance": r.distance,
                "record_type": r.record_type.value,
                "status": r.status.value,
            }
            for r in results
        ],
        "hits": len(results),
        "effectiveMode": info.mode,
        "fallback": info.fallback,
    }
    if info.embedder is not None:
        data["embedder"] = info.embedder
    if info.vectors_pending:  # the embedder is behind: by meaning may miss new records
        data["vectorsPending"] = True
    if len(results) < len(found):
        data["truncated"] = True
    return ToolResult(name="memory_recall", content=content, data=data, evidence=bool(results))


def _redacted(result: RecordSearchResult, scrub: Callable[[str], str]) -> RecordSearchResult:
    record = result.record
    reason = None if record.invalid_reason is None else scrub(record.invalid_reason)
    clean = msgspec.structs.replace(
        record,
        content=scrub(record.content),
        metadata=_redacted_metadata(record.metadata, scrub),
        invalid_reason=reason,
    )
    return msgspec.structs.replace(
        result,
        record=clean,
        linked_results=[(rel, _redacted(child, scrub)) for rel, child in result.linked_results],
    )


def _redacted_metadata(metadata: dict[str, Any], scrub: Callable[[str], str]) -> dict[str, Any]:
    if not metadata:
        return metadata
    # Redacted as JSON text, so `"password": "..."`-style fields are found by their name.
    text = json.dumps(metadata, ensure_ascii=False)
    try:
        cleaned = json.loads(scrub(text))
    except ValueError:
        cleaned = None  # a user pattern cut through the JSON syntax: redact value by value
    if isinstance(cleaned, dict):
        return cleaned
    return {key: _scrub_values(value, scrub) for key, value in metadata.items()}


def _scrub_values(value: object, scrub: Callable[[str], str]) -> object:
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, list):
        return [_scrub_values(item, scrub) for item in value]
    if isinstance(value, dict):
        return {key: _scrub_values(item, scrub) for key, item in value.items()}
    return value
