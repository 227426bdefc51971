"""The scoped memory records store (docs/design.md §5): records, scopes, search configs, writer dialog.

A record has three independent scope fields (`user_id`, `agent_id`, `thread_id`; `None` =
not scoped in that dimension), a lifecycle status, metadata, a timestamp, an optional expiry
and typed, directed relations to other records. Searches name each scope field as omitted
(`NOT_SET`: the API layer's default), a concrete id, or `None`, each with an
`exact_<dim>_match` flag; `SearchScope` is the resolved form the store filters by.

The writer dialog (`RecordCommand` → `RecordAck`) is sent by the `mem.records` facade and
received by the records keeper (`activememory.actors.records`), the single writer of
`state_dir/records.db`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol, TypeAlias, runtime_checkable

import msgspec

from .content import check_bool, check_choice, check_int
from .errors import ActiveMemoryError, InvalidInputError
from .indexer import VectorRow
from .userdata import RecordErasure

if TYPE_CHECKING:
    from .record_results import RecordSearchResult


class NotSetType(enum.Enum):
    """The type of `NOT_SET`; it has exactly one value."""

    NOT_SET = "NOT_SET"

    def __repr__(self) -> str:
        return "NOT_SET"

    def __bool__(self) -> bool:
        # Falsy like None, but never equal to it: test with `is NOT_SET`, never by truth.
        return False


NOT_SET: Final = NotSetType.NOT_SET
"""The omitted marker of a search's scope fields and flags: "use this API layer's default".

Distinct from `None`, which means "not scoped in this dimension". A singleton (it survives
copy and pickle as itself), falsy, `repr` ``NOT_SET``; compare with `is`.
"""


class RankingError(ActiveMemoryError):
    """A reranker or pruning judge failed, or answered something unusable.

    The message names the component and what was wrong; the search returns nothing.
    """


class RecordType(enum.StrEnum):
    """What a record holds. Only `MEMORY` records are graph-expansion vertices (docs/design.md §5.4);
    an `IMAGE` is searched by its description (its content)."""

    MEMORY = "memory"
    MESSAGE = "message"
    DOCUMENT = "document"
    ACTOR_PROFILE = "actor_profile"
    IMAGE = "image"


class RecordStatus(enum.StrEnum):
    """A record's lifecycle status; an `INVALID` record keeps its invalidation reason."""

    VALID = "valid"
    INVALID = "invalid"


class Record(msgspec.Struct, frozen=True, kw_only=True):
    """One stored record, as the store returns it.

    `user_id`, `agent_id`, `thread_id`: a concrete id, or None (not scoped in that
    dimension). `timestamp` and `expires_at` are seconds since the epoch; a record whose
    `expires_at` is at or before now is never returned. `role` is set on message records
    only. `invalid_reason` is set when `status` is `INVALID`.
    """

    id: str
    content: str
    record_type: RecordType = RecordType.MEMORY
    user_id: str | None = None
    agent_id: str | None = None
    thread_id: str | None = None
    status: RecordStatus = RecordStatus.VALID
    invalid_reason: str | None = None
    metadata: dict[str, Any] = {}
    timestamp: float
    expires_at: float | None = None
    role: str | None = None


class RecordRelation(msgspec.Struct, frozen=True, kw_only=True):
    """A typed, directed relation as stored: `source_id` —`relation`→ `target_id`.

    Graph expansion walks relations in both directions but always reports this stored
    orientation, so a linked result reached "backwards" has itself as `source_id`.
    """

    relation: str
    source_id: str
    target_id: str


class SearchScope(msgspec.Struct, frozen=True, kw_only=True):
    """A search's resolved scope: each dimension's value and whether it must match exactly.

    `exact_<dim>_match=True`: only records whose field equals the value (None: only records
    not scoped in that dimension). False: the dimension is not filtered; when the value was
    given explicitly (or is a thread layer's own thread), records whose field equals it
    rank higher (docs/design.md §5.2), while an omitted dimension ranks nothing higher.
    """

    user_id: str | None
    agent_id: str | None
    thread_id: str | None
    exact_user_match: bool
    exact_agent_match: bool
    exact_thread_match: bool


# -- search configs (docs/design.md §5.5) ----------------------------------------------------------------


def _check_optional_int(name: str, value: object, low: int) -> None:
    if value is not None:
        check_int(name, value, low)


@runtime_checkable
class Reranker(Protocol):
    """Reorders the best direct results of a search.

    `rerank` gets the query and up to `reranker_max_candidates` results, best first, and
    returns them in its own order; it may leave some out (they are dropped). Returning a
    result it was not given raises `RankingError`.

    Cancellation: the search is cancelled with it; nothing was written.
    """

    async def rerank(
        self, query: str, results: Sequence[RecordSearchResult]
    ) -> Sequence[RecordSearchResult]: ...


@runtime_checkable
class Judge(Protocol):
    """Decides which direct results are relevant to a query (the pruning `llm`).

    `judge` returns one boolean per candidate, in order: True keeps it, False drops it.
    An answer of the wrong length raises `RankingError`.

    Cancellation: the search is cancelled with it; nothing was written.
    """

    async def judge(self, query: str, candidates: Sequence[RecordSearchResult]) -> list[bool]: ...


DEFAULT_MAX_RESULTS = 10
"""Direct results fetched by a search with no config or a plain `MemorySearchConfig`."""


class MemorySearchConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What happens after the store found its matches: token budgets (docs/design.md §5.5).

    Results are counted on their formatted text (`formatted_content`, linked context
    included) with `estimate_tokens` (ceil(characters / 4)) and are never split.

    - `soft_token_budget`: keep results in rank order up to and including the first one at
      which the running total reaches or exceeds it (so the first result always survives
      the soft budget).
    - `token_budget` (hard): keep results while the running total fits; if the first one
      does not fit, nothing is returned.

    Each rule keeps a prefix of the ranked results; with both set the shorter prefix wins
    (the same as applying the soft budget, then the hard one). With neither, all of the
    (at most `DEFAULT_MAX_RESULTS`) direct results are returned.

    Bad values raise `InvalidInputError` naming the field (budgets are integers ≥ 1).
    """

    token_budget: int | None = None
    soft_token_budget: int | None = None

    def __post_init__(self) -> None:
        _check_optional_int("token_budget", self.token_budget, 1)
        _check_optional_int("soft_token_budget", self.soft_token_budget, 1)

    @property
    def direct_limit(self) -> int:
        """How many direct results the store is asked for."""
        return DEFAULT_MAX_RESULTS


class TopKMemorySearchConfig(MemorySearchConfig, frozen=True, kw_only=True):
    """At most `max_results` direct results, fetched before reranking (docs/design.md §5.5).

    With a `reranker`, its order replaces the store's for the first
    `reranker_max_candidates` results; the rest keep their place after them. Then the
    budgets apply. `max_results` and `reranker_max_candidates` are integers ≥ 1.
    """

    max_results: int = DEFAULT_MAX_RESULTS
    reranker: Reranker | None = None
    reranker_max_candidates: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("max_results", self.max_results, 1)
        check_int("reranker_max_candidates", self.reranker_max_candidates, 1)
        _check_reranker(self.reranker)

    @property
    def direct_limit(self) -> int:
        return self.max_results


class PruningEvaluationMode(enum.StrEnum):
    """How much of the ranked results a pruning judge reads (`PruningMemorySearchConfig`)."""

    EXHAUSTIVE = "EXHAUSTIVE"
    """Judge every unprotected candidate: the most thorough, the most judge work."""
    EXTENDED = "EXTENDED"
    """Probe, then also judge every candidate where neighbouring probes disagree."""
    FAST = "FAST"
    """Probe only; unjudged candidates follow the nearest probe's verdict."""


DEFAULT_PROBE_POINTS: Final[dict[PruningEvaluationMode, int]] = {
    PruningEvaluationMode.FAST: 3,
    PruningEvaluationMode.EXTENDED: 5,
}


class PruningMemorySearchConfig(MemorySearchConfig, frozen=True, kw_only=True):
    """Removes less relevant direct results with a judge (docs/design.md §5.5).

    The store fetches `max_candidates` direct results; a `reranker` reorders the first
    `reranker_max_candidates`; the top `ceil(protected_fraction × n)` of the n candidates
    are protected (never judged, always kept); the judge (`llm`, a `Judge`; by default the
    local lexical `LocalJudge`) decides the rest; then the budgets apply. Survivors keep
    their rank order.

    The unprotected candidates U (m of them, best first) are judged according to
    `evaluation_mode`:

    - `EXHAUSTIVE`: every candidate of U is judged (one judge call); `num_probe_points`
      must not be given.
    - `FAST`: `p = num_probe_points` (default 3) probes at the evenly spaced positions
      `i × (m - 1) / (p - 1)` rounded half up, i = 0..p-1 (so the first and the last of U
      are probes), are judged in one call; evaluation stops there. Each other candidate takes
      the verdict of the nearer probe around it, the better-ranked one on a tie.
    - `EXTENDED`: the same probes (default 5) in a first call; then, in a second call, every
      candidate lying between two consecutive probes whose verdicts differ is judged itself.
      Candidates between agreeing probes take their verdict.

    With `p ≥ m` every candidate is a probe, i.e. the mode judges exhaustively. Probing
    rests on rank order: relevance mostly falls with rank, so where two probes agree the
    candidates between them are unlikely to differ.

    Bad values raise `InvalidInputError` naming the field: `max_candidates` and
    `reranker_max_candidates` ≥ 1, `num_probe_points` ≥ 2 (and absent for EXHAUSTIVE),
    `protected_fraction` from 0 to 1.
    """

    evaluation_mode: PruningEvaluationMode = PruningEvaluationMode.FAST
    num_probe_points: int | None = None
    protected_fraction: float = 0.1
    llm: Judge | None = None
    reranker: Reranker | None = None
    reranker_max_candidates: int = 20
    max_candidates: int = 20

    def __post_init__(self) -> None:
        super().__post_init__()
        modes = [m.value for m in PruningEvaluationMode]
        check_choice("evaluation_mode", self.evaluation_mode, modes)
        if self.num_probe_points is not None:
            if self.evaluation_mode == PruningEvaluationMode.EXHAUSTIVE:
                raise InvalidInputError(
                    "num_probe_points: not allowed with evaluation_mode EXHAUSTIVE "
                    "(it judges every candidate)"
                )
            check_int("num_probe_points", self.num_probe_points, 2)
        fraction = self.protected_fraction
        if (
            not isinstance(fraction, int | float)
            or isinstance(fraction, bool)
            or not 0 <= fraction <= 1
        ):
            raise InvalidInputError(f"protected_fraction: {fraction!r} is not a number from 0 to 1")
        if self.llm is not None and not isinstance(self.llm, Judge):
            raise InvalidInputError(
                f"llm: expected a Judge (an object with async judge(query, candidates)), "
                f"got {type(self.llm).__name__}"
            )
        _check_reranker(self.reranker)
        check_int("reranker_max_candidates", self.reranker_max_candidates, 1)
        check_int("max_candidates", self.max_candidates, 1)

    @property
    def direct_limit(self) -> int:
        return self.max_candidates

    @property
    def probe_points(self) -> int | None:
        """The number of probes of this mode; None for EXHAUSTIVE."""
        mode = PruningEvaluationMode(self.evaluation_mode)
        if mode == PruningEvaluationMode.EXHAUSTIVE:
            return None
        return self.num_probe_points or DEFAULT_PROBE_POINTS[mode]


def _check_reranker(reranker: object) -> None:
    if reranker is not None and not isinstance(reranker, Reranker):
        raise InvalidInputError(
            f"reranker: expected a Reranker (an object with async rerank(query, results)), "
            f"got {type(reranker).__name__}"
        )


# -- result formatting (docs/design.md §5.6) -------------------------------------------------------------


class SearchResultFormatConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Portable rendering options of search results.

    `include_invalid_results=False` omits invalid linked *branches* only (an invalid
    linked record none of whose descendants is valid); an invalid record on the path to a
    valid one keeps its status and link context but not its content. The result itself is
    always rendered.
    """

    include_invalid_results: bool = True

    def __post_init__(self) -> None:
        check_bool("include_invalid_results", self.include_invalid_results)


class RecordResultFormatConfig(SearchResultFormatConfig, frozen=True, kw_only=True):
    """Rendering options of records-store results: which record fields are shown.

    `show_metadata` renders the metadata (each key as an XML tag, values as strings) and
    the invalidation reason. Every flag is a bool.
    """

    show_thread_id: bool = False
    show_distance: bool = False
    show_timestamp: bool = True
    show_role: bool = True
    show_user_id: bool = False
    show_agent_id: bool = False
    show_status: bool = True
    show_metadata: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in self.__struct_fields__:
            check_bool(name, getattr(self, name))


# -- the writer dialog -------------------------------------------------------------------------


class _RecordCommand(msgspec.Struct, frozen=True, kw_only=True, tag_field="op"):
    pass


class AddRecord(_RecordCommand, tag="add", frozen=True, kw_only=True):
    """Facade → records keeper: store a new record (its id is fresh, its status valid)."""

    record: Record
    at: float


class LinkRecords(_RecordCommand, tag="link", frozen=True, kw_only=True):
    """Facade → records keeper: store a relation; both records must exist.

    Storing a relation that already exists changes nothing (`created` False in the ack).
    """

    relation: RecordRelation
    at: float


class InvalidateRecord(_RecordCommand, tag="invalidate", frozen=True, kw_only=True):
    """Facade → records keeper: mark a record invalid with a reason (again: new reason)."""

    id: str
    reason: str
    at: float


class DeleteRecord(_RecordCommand, tag="delete", frozen=True, kw_only=True):
    """Facade → records keeper: delete a record, its relations and its index row."""

    id: str


class RestoreRecord(_RecordCommand, tag="restore", frozen=True, kw_only=True):
    """Importer → records keeper: store an exported record as it was (docs/design.md §2.6):
    its id, status and times; rejected if the id exists."""

    record: Record
    created_at: float
    invalidated_at: float | None = None


class EraseUserRecords(_RecordCommand, tag="erase", frozen=True, kw_only=True):
    """Facade (`mem.erase_identity`) → records keeper: delete every record whose `user_id`
    is one of `user_ids`, its relations and index rows, in one transaction; the index is
    merged and, after the commit, the file rewritten and the WAL truncated."""

    user_ids: tuple[str, ...]


class StoreRecordVectors(_RecordCommand, tag="store_vectors", frozen=True, kw_only=True):
    """Records embedder actor → records keeper: store vectors of the embedder `name`
    (docs/design.md §5.7). Each row's `id` is the record's `seq`; a vector is stored only if,
    in the applying transaction, that record exists and its content still has `digest`;
    anything else changed meanwhile and is skipped."""

    name: str
    rows: tuple[VectorRow, ...]

    def __post_init__(self) -> None:
        sizes = {len(row.vector) for row in self.rows}
        if len(sizes) > 1 or any(size == 0 or size % 4 for size in sizes):
            raise ValueError("vectors: expected float32 vectors of one dimension")


RecordCommand: TypeAlias = (
    AddRecord
    | LinkRecords
    | InvalidateRecord
    | DeleteRecord
    | RestoreRecord
    | EraseUserRecords
    | StoreRecordVectors
)


class _RecordAck(msgspec.Struct, frozen=True, kw_only=True, tag_field="ack"):
    pass


class RecordAdded(_RecordAck, tag="added", frozen=True, kw_only=True):
    """Records keeper → facade: the record is committed and searchable."""

    id: str


class RecordsLinked(_RecordAck, tag="linked", frozen=True, kw_only=True):
    """Records keeper → facade: the relation is stored (`created` False: it already was)."""

    relation: RecordRelation
    created: bool


class RecordInvalidated(_RecordAck, tag="invalidated", frozen=True, kw_only=True):
    """Records keeper → facade: the record is invalid, with this reason."""

    id: str
    reason: str


class RecordDeleted(_RecordAck, tag="deleted", frozen=True, kw_only=True):
    """Records keeper → facade: the record and its `relations` relations are gone."""

    id: str
    relations: int


class RecordsErased(_RecordAck, tag="erased", frozen=True, kw_only=True):
    """Records keeper → facade: what the erase removed, and whether the purge finished."""

    erasure: RecordErasure


class RecordVectorsStored(_RecordAck, tag="vectors_stored", frozen=True, kw_only=True):
    """Records keeper → records embedder actor: `stored` vectors stored; `skipped` records
    had changed since they were read (deleted, or their seq reused by a new record)."""

    stored: int
    skipped: int


RecordRejectReason: TypeAlias = Literal["not_found", "invalid", "storage", "closed"]


class RecordRejected(_RecordAck, tag="rejected", frozen=True, kw_only=True):
    """Records keeper → facade: the command changed nothing; `message` says why."""

    reason: RecordRejectReason
    message: str


RecordAck: TypeAlias = (
    RecordAdded
    | RecordsLinked
    | RecordInvalidated
    | RecordDeleted
    | RecordsErased
    | RecordVectorsStored
    | RecordRejected
)


def is_finite_number(value: object) -> bool:
    """An int or float (not a bool) that is finite."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
