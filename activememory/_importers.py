"""Reading transcripts written elsewhere, for `import_transcript`: JSONL, and LoCoMo below.

Format, one JSON object per line:

    {"type": "session", "key": "agent:main:direct:alice"}            optional header
    {"type": "message", "id": "m1", "parentId": null, "timestamp": 1700000000.0,
     "message": {"role": "user", "content": "..."}}
    {"type": "leaf", "id": "m1"}                                     optional: the active leaf

`parentId` omitted means "the previous message line"; `timestamp` is required, epoch
seconds or an ISO 8601 string. Ids are unique within a session; a `parentId` names an earlier
message line of its session, the leaf any message line of it. Unknown fields are errors;
every error names the file and line. A UTF-8 byte order mark at the start is skipped.

An export of a user's data (docs/design.md §2.6) is the same format with more in it: one
file may hold several sessions (each header line starts the next one), a header may carry
the session's metadata (`archived`, `sandboxed`, `spawnedBy`, `createdAt`, `updatedAt`,
`switches`, and `keepIds`: the message ids are event ids to keep), and two more line types
carry scoped memory records and their relations:

    {"type": "record", "id": "…", "content": "…", "userId": "dana", "timestamp": 1.7e9, …}
    {"type": "relation", "relation": "about", "sourceId": "…", "targetId": "…"}

Files without them read as before.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeAlias, TypeVar

import msgspec

from .protocol.content import Message, check_timestamp, message_from_mapping
from .protocol.errors import InvalidInputError
from .protocol.recall import SessionSwitches, TraceMode
from .protocol.records import Record, RecordRelation
from .protocol.session_key import AGENT_ID, parse_session_key
from .protocol.transcript import ImportEntry
from .protocol.userdata import NOT_COVERED

_UNSET: Any = msgspec.UNSET


class _Switches(msgspec.Struct, forbid_unknown_fields=True, rename="camel"):
    active_memory: bool = True
    verbose: bool = False
    trace: TraceMode = "off"


class _Header(
    msgspec.Struct, tag="session", tag_field="type", forbid_unknown_fields=True, rename="camel"
):
    key: str
    persistent: bool = True
    interactive: bool = True
    archived: bool = False
    sandboxed: bool = False
    spawned_by: str | None = None
    created_at: float | None = None
    updated_at: float | None = None
    keep_ids: bool = False
    switches: _Switches | None = None


class _MessageLine(msgspec.Struct, tag="message", tag_field="type", forbid_unknown_fields=True):
    id: str
    message: dict[str, Any]
    timestamp: float | str
    parentId: str | msgspec.UnsetType | None = _UNSET


class _LeafLine(msgspec.Struct, tag="leaf", tag_field="type", forbid_unknown_fields=True):
    id: str


class _RecordLine(
    msgspec.Struct, tag="record", tag_field="type", forbid_unknown_fields=True, rename="camel"
):
    id: str
    content: str
    timestamp: float
    record_type: str = "memory"
    user_id: str | None = None
    agent_id: str | None = None
    thread_id: str | None = None
    status: str = "valid"
    invalid_reason: str | None = None
    metadata: dict[str, Any] = {}
    expires_at: float | None = None
    role: str | None = None
    created_at: float | None = None
    invalidated_at: float | None = None


class _RelationLine(
    msgspec.Struct, tag="relation", tag_field="type", forbid_unknown_fields=True, rename="camel"
):
    relation: str
    source_id: str
    target_id: str
    created_at: float | None = None


_Line: TypeAlias = _Header | _MessageLine | _LeafLine | _RecordLine | _RelationLine
_decode_line = msgspec.json.Decoder(_Line).decode
_encode_line = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class Transcript:
    """A parsed JSONL transcript, ready for `mem.sessions.import_transcript`.

    The fields after `interactive` are an export's session metadata (docs/design.md §2.6);
    a plain transcript leaves them at their defaults (None: "when imported").
    """

    session_key: str
    entries: tuple[ImportEntry, ...]
    leaf_id: str | None
    persistent: bool
    interactive: bool
    archived: bool = False
    sandboxed: bool = False
    spawned_by: str | None = None
    created_at: float | None = None
    updated_at: float | None = None
    keep_ids: bool = False
    switches: SessionSwitches | None = None


@dataclass(frozen=True)
class RecordEntry:
    """A scoped memory record as exported: the record, when it was stored and invalidated."""

    record: Record
    created_at: float | None = None  # None: when imported
    invalidated_at: float | None = None


@dataclass(frozen=True)
class RelationEntry:
    """A relation between two exported records, and when it was stored."""

    relation: RecordRelation
    created_at: float | None = None  # None: when imported


@dataclass(frozen=True)
class IdentityExport:
    """Sessions and records in the import format (docs/design.md §2.6): what
    `mem.export_identity` returns and `mem.import_export` stores; `lines()` is the JSONL
    text and `IdentityExport.read(path)` parses a file of it (any JSONL transcript file).

    `identity` is the exported identity (None for a file read back); `not_covered` says
    what an export leaves out.
    """

    identity: str | None
    transcripts: tuple[Transcript, ...] = ()
    records: tuple[RecordEntry, ...] = ()
    relations: tuple[RelationEntry, ...] = ()
    not_covered: str = NOT_COVERED

    @classmethod
    def read(cls, path: Path, session_key: str | None = None) -> IdentityExport:
        """Parse a JSONL file; `session_key` stands in for a missing header (a file of one
        session only). Raises `InvalidInputError` naming the file and line. Not a blocking
        call in the async sense: it reads the file synchronously."""
        return read_jsonl(path, session_key)

    def lines(self) -> Iterator[str]:
        """The export as JSONL lines (without newlines), in the order `read` expects."""
        for t in self.transcripts:
            yield _encode_line(_header_of(t)).decode()
            for e in t.entries:
                line = _MessageLine(
                    id=e.id,
                    message={"role": e.message.role, "content": e.message.content},
                    timestamp=e.timestamp,
                    parentId=e.parent_id,
                )
                yield _encode_line(line).decode()
            if t.leaf_id is not None:
                yield _encode_line(_LeafLine(id=t.leaf_id)).decode()
        for r in self.records:
            yield _encode_line(_record_line(r)).decode()
        for rel in self.relations:
            edge = _RelationLine(
                relation=rel.relation.relation,
                source_id=rel.relation.source_id,
                target_id=rel.relation.target_id,
                created_at=rel.created_at,
            )
            yield _encode_line(edge).decode()


def _header_of(t: Transcript) -> _Header:
    switches = None
    if t.switches is not None:
        s = t.switches
        switches = _Switches(active_memory=s.active_memory, verbose=s.verbose, trace=s.trace)
    return _Header(
        key=t.session_key,
        persistent=t.persistent,
        interactive=t.interactive,
        archived=t.archived,
        sandboxed=t.sandboxed,
        spawned_by=t.spawned_by,
        created_at=t.created_at,
        updated_at=t.updated_at,
        keep_ids=t.keep_ids,
        switches=switches,
    )


def _record_line(entry: RecordEntry) -> _RecordLine:
    r = entry.record
    return _RecordLine(
        id=r.id,
        content=r.content,
        timestamp=r.timestamp,
        record_type=r.record_type.value,
        user_id=r.user_id,
        agent_id=r.agent_id,
        thread_id=r.thread_id,
        status=r.status.value,
        invalid_reason=r.invalid_reason,
        metadata=r.metadata,
        expires_at=r.expires_at,
        role=r.role,
        created_at=entry.created_at,
        invalidated_at=entry.invalidated_at,
    )


@dataclass
class _Session:
    """One session being read: its header (None: the file has none) and its lines."""

    header: _Header | None
    where: str
    entries: list[ImportEntry] = field(default_factory=list)
    leaf: str | None = None
    leaf_line: int = 0
    previous: str | None = None
    lines_of: dict[str, int] = field(default_factory=dict)  # entry id -> its line


def read_jsonl_transcript(path: Path, session_key: str | None = None) -> Transcript:
    """Parse `path`, a file of one session; `session_key` overrides (or stands in for)
    the header's key."""
    found = read_jsonl(path, session_key)
    if len(found.transcripts) != 1 or found.records or found.relations:
        raise InvalidInputError(
            f"{path}: holds {len(found.transcripts)} sessions and "
            f"{len(found.records)} records; expected one session"
        )
    return found.transcripts[0]


def read_jsonl(path: Path, session_key: str | None = None) -> IdentityExport:
    """Parse `path`: its sessions, records and relations (module docstring).

    `session_key` overrides (or stands in for) the header's key of a file of one session.
    Every error names the file and line. Each entry's `source` is its `path:line`, so the
    writer's errors name the line too.
    """
    sessions: list[_Session] = []
    records: list[RecordEntry] = []
    relations: list[RelationEntry] = []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    # Split bytes, not text: str.splitlines would also cut at U+2028 inside a JSON string.
    for number, line in enumerate(data.removeprefix(_BOM).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        item = _decode_jsonl_line(line, where)
        current = sessions[-1] if sessions else None
        match item:
            case _Header():
                if current is not None and current.header is None:
                    raise InvalidInputError(f"{where}: the session header must be the first line")
                sessions.append(_Session(item, where))
            case _LeafLine():
                if current is None:
                    sessions.append(current := _Session(None, where))
                current.leaf, current.leaf_line = item.id, number
            case _MessageLine():
                if current is None:
                    sessions.append(current := _Session(None, where))
                if item.id in current.lines_of:
                    first = current.lines_of[item.id]
                    raise InvalidInputError(
                        f"{where}: id {item.id!r} is repeated (first at line {first})"
                    )
                parent = current.previous if item.parentId is _UNSET else item.parentId
                if parent is not None and parent not in current.lines_of:
                    raise InvalidInputError(
                        f"{where}: parentId {parent!r} names no earlier message line"
                    )
                message = message_from_mapping(item.message, where=f"{where}: message")
                current.entries.append(
                    ImportEntry(
                        id=item.id,
                        parent_id=parent,
                        timestamp=_timestamp(item.timestamp, where),
                        message=message,
                        source=where,
                    )
                )
                current.lines_of[item.id] = number
                current.previous = item.id
            case _RecordLine():
                records.append(_record_entry(item, where))
            case _RelationLine():
                relations.append(_relation_entry(item, where))
    for s in sessions:
        if s.leaf is not None and s.leaf not in s.lines_of:
            raise InvalidInputError(
                f"{path}:{s.leaf_line}: leaf id {s.leaf!r} names no message line"
            )
    if session_key is not None and len(sessions) > 1:
        raise InvalidInputError(f"{path}: holds {len(sessions)} sessions; --session-key names one")
    if not sessions and not records and not relations:
        if session_key is None:  # an empty file: as before, a session needs a key
            raise InvalidInputError(f"{path}: no session header line and no session key given")
        sessions.append(_Session(None, str(path)))
    transcripts = tuple(_transcript(path, s, session_key) for s in sessions)
    return IdentityExport(
        identity=None, transcripts=transcripts, records=tuple(records), relations=tuple(relations)
    )


def _transcript(path: Path, s: _Session, session_key: str | None) -> Transcript:
    header = s.header
    key = session_key or (header.key if header else None)
    if key is None:
        raise InvalidInputError(f"{path}: no session header line and no session key given")
    parse_session_key(key, field=f"{s.where}: session key")
    if header is None:
        return Transcript(key, tuple(s.entries), s.leaf, persistent=True, interactive=True)
    if header.spawned_by is not None:
        parse_session_key(header.spawned_by, field=f"{s.where}: spawnedBy")
    switches = header.switches
    return Transcript(
        session_key=key,
        entries=tuple(s.entries),
        leaf_id=s.leaf,
        persistent=header.persistent,
        interactive=header.interactive,
        archived=header.archived,
        sandboxed=header.sandboxed,
        spawned_by=header.spawned_by,
        created_at=_finite(header.created_at, f"{s.where}: createdAt"),
        updated_at=_finite(header.updated_at, f"{s.where}: updatedAt"),
        keep_ids=header.keep_ids,
        switches=None
        if switches is None
        else SessionSwitches(
            active_memory=switches.active_memory, verbose=switches.verbose, trace=switches.trace
        ),
    )


def _record_entry(line: _RecordLine, where: str) -> RecordEntry:
    # The records' own checks; imported here so that reading transcripts loads no store.
    from ._records import checked_record

    try:
        record = checked_record(
            id=line.id,
            content=line.content,
            record_type=line.record_type,
            user_id=line.user_id,
            agent_id=line.agent_id,
            thread_id=line.thread_id,
            metadata=line.metadata,
            timestamp=line.timestamp,
            expires_at=line.expires_at,
            role=line.role,
            status=line.status,
            invalid_reason=line.invalid_reason,
        )
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None
    created = _finite(line.created_at, f"{where}: createdAt")
    invalidated = _finite(line.invalidated_at, f"{where}: invalidatedAt")
    return RecordEntry(record=record, created_at=created, invalidated_at=invalidated)


def _relation_entry(line: _RelationLine, where: str) -> RelationEntry:
    from ._records import checked_relation

    try:
        relation = checked_relation(line.source_id, line.target_id, line.relation)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None
    created = _finite(line.created_at, f"{where}: createdAt")
    return RelationEntry(relation=relation, created_at=created)


def _finite(value: float | None, where: str) -> float | None:
    if value is not None and not math.isfinite(value):
        raise InvalidInputError(f"{where}: expected a finite number of seconds, got {value!r}")
    return value


_BOM = b"\xef\xbb\xbf"


def _decode_jsonl_line(
    line: bytes, where: str
) -> _Header | _MessageLine | _LeafLine | _RecordLine | _RelationLine:
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(
            f"{where}: not UTF-8 text (byte 0x{line[exc.start]:02x} at byte {exc.start})"
        ) from None
    try:
        item = _decode_line(line)
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None
    return item


def _timestamp(value: float | str, where: str) -> float:
    if isinstance(value, int | float):
        return check_timestamp(f"{where}: timestamp", value)
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInputError(
            f"{where}: timestamp {value!r} is neither epoch seconds nor ISO 8601"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return check_timestamp(f"{where}: timestamp", parsed.timestamp())


# -- LoCoMo ---------------------------------------------------------------------------------
#
# LoCoMo ("Evaluating Very Long-Term Conversational Memory of LLM Agents", Maharana et al.,
# 2024) is a JSON list of samples: two speakers, numbered sessions of turns, and questions
# whose gold evidence names turns by `dia_id` ("D<session>:<turn>"). The layout and the
# evidence normalisation are those of the data set's own description (docs/design.md §7).
# Unknown fields of samples, turns and questions are ignored (the dataset carries derived
# summaries and image metadata we do not use); unknown keys of `conversation` are errors,
# since a misspelt session would silently shrink the corpus.

_SESSION_FIELD = re.compile(r"session_([1-9][0-9]*)(_date_time)?")
_LOCOMO_DATE = re.compile(
    r"\s*(?P<hour>[0-9]{1,2}):(?P<minute>[0-9]{2})\s*(?P<half>[ap])\.?m\.?\s+on\s+"
    r"(?P<day>[0-9]{1,2})\s+(?P<month>[A-Za-z]+)\.?,?\s+(?P<year>[0-9]{4})\s*",
    re.IGNORECASE,
)
_MONTHS = {
    name: number
    for number, full in enumerate(
        ("january", "february", "march", "april", "may", "june", "july", "august",
         "september", "october", "november", "december"),
        start=1,
    )
    for name in (full, full[:3], full[:4])
}  # fmt: skip
_EVIDENCE_SPLIT = re.compile(r"[;\s]+")
_EVIDENCE_ID = re.compile(r"D:?([0-9]+):0*([0-9]+)")
_AGENT_UNSAFE = re.compile(r"[^a-z0-9_-]")


@dataclass(frozen=True)
class LocomoTurn:
    """One turn of a LoCoMo session, as written in the file."""

    dia_id: str
    speaker: str
    text: str
    blip_caption: str | None = None  # an image shared in this turn, described in words


@dataclass(frozen=True)
class LocomoSession:
    """One `session_<N>`: its turns in order, and the entries that import them.

    `entries[i]` imports `turns[i]` with id `dia_ids[i]`; each entry's parent is the previous
    turn, so the active branch is the whole session and `history` returns it in this order.
    """

    number: int
    session_key: str
    started_at: float
    turns: tuple[LocomoTurn, ...]
    entries: tuple[ImportEntry, ...]

    @property
    def dia_ids(self) -> tuple[str, ...]:
        """The turns' `dia_id`s, in order."""
        return tuple(turn.dia_id for turn in self.turns)


@dataclass(frozen=True)
class LocomoQuestion:
    """A question about one sample and the turns that hold its answer.

    `evidence` is normalised: canonical `D<s>:<t>` ids of turns of this conversation, in
    their first order of appearance, without repeats (possibly empty). Category 5
    (adversarial) questions have no `answer`, an `adversarial_answer` instead.
    """

    question: str
    answer: str | None
    category: int
    evidence: tuple[str, ...]
    adversarial_answer: str | None = None


@dataclass(frozen=True)
class LocomoSample:
    """One LoCoMo conversation: its agent, sessions and questions."""

    sample_id: str
    agent: str
    speaker_a: str  # imported as role "user"
    speaker_b: str  # imported as role "assistant"
    sessions: tuple[LocomoSession, ...]
    questions: tuple[LocomoQuestion, ...]

    @property
    def turns(self) -> int:
        """How many turns, over all sessions."""
        return sum(len(session.turns) for session in self.sessions)


def locomo_turn_text(turn: LocomoTurn, speaker: str) -> str:
    """The message text a LoCoMo turn is imported as (so what search indexes and embeds).

    "Speaker: " and the turn's words, then the shared image's caption as
    "[shares a photo: …]". Two people talk in a LoCoMo conversation and the roles
    (user/assistant) do not say which: questions name them ("What did Caroline research?")
    where the turn says "I researched…".
    """
    # Dev split (`activememory bench locomo --turn-text`): the caption lifts R@10 by 0.02;
    # the name moves text search by a question either way (0.747 → 0.756 with both) and
    # search by meaning a lot (hybrid 0.724 → 0.776 with the shipped default embedder).
    if turn.blip_caption:
        return f"{speaker}: {turn.text} [shares a photo: {turn.blip_caption}]"
    return f"{speaker}: {turn.text}"


def locomo_agent(sample_id: str) -> str:
    """The agent id of a sample: lowercased, [a-z0-9_-] only, at most 64 characters."""
    return _AGENT_UNSAFE.sub("-", sample_id.lower())[:64]


def locomo_session_key(agent: str, number: int) -> str:
    """The explicit session a LoCoMo session is imported into."""
    return f"agent:{agent}:explicit:locomo-session-{number}"


def read_locomo(
    path: Path, *, turn_text: Callable[[LocomoTurn, str], str] = locomo_turn_text
) -> list[LocomoSample]:
    """Parse a LoCoMo JSON file; raise `InvalidInputError` naming the file and field.

    `turn_text(turn, speaker name)` builds each message's content (default
    `locomo_turn_text`). Sessions without turns are skipped.
    """
    try:
        data = msgspec.json.decode(path.read_bytes())
    except OSError as exc:
        raise InvalidInputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except msgspec.DecodeError as exc:
        raise InvalidInputError(f"{path}: {exc}") from None
    items = _expect(data, list, f"{path}: top level", "a list of samples")
    samples = [
        _locomo_sample(item, f"{path}: sample[{i}]", turn_text) for i, item in enumerate(items)
    ]
    agents: dict[str, int] = {}
    for i, sample in enumerate(samples):
        if sample.agent in agents:
            raise InvalidInputError(
                f"{path}: sample[{i}].sample_id: {sample.sample_id!r} gives agent "
                f"{sample.agent!r}, as sample[{agents[sample.agent]}] does"
            )
        agents[sample.agent] = i
    return samples


_T = TypeVar("_T")
_EXPECTED_NAMES = {str: "a string", list: "a list", dict: "an object", int: "an integer"}


def _expect(value: object, kind: type[_T], where: str, what: str | None = None) -> _T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        expected = what or _EXPECTED_NAMES.get(kind, kind.__name__)
        raise InvalidInputError(f"{where}: expected {expected}, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "a list"
        case dict():
            return "an object"
    return type(value).__name__


def _field(obj: dict[str, Any], name: str, kind: type[_T], where: str) -> _T:
    if name not in obj:
        raise InvalidInputError(f"{where}.{name}: missing")
    return _expect(obj[name], kind, f"{where}.{name}")


def _locomo_sample(
    item: object, where: str, turn_text: Callable[[LocomoTurn, str], str]
) -> LocomoSample:
    sample = _expect(item, dict, where)
    sample_id = _field(sample, "sample_id", str, where)
    agent = locomo_agent(sample_id)
    if not AGENT_ID.fullmatch(agent):
        raise InvalidInputError(
            f"{where}.sample_id: {sample_id!r} gives the agent id {agent!r}, which does not "
            "start with a letter or digit"
        )
    conversation = _field(sample, "conversation", dict, where)
    where_c = f"{where}.conversation"
    speakers: dict[str, Literal["user", "assistant"]] = {
        _field(conversation, "speaker_a", str, where_c): "user",
        _field(conversation, "speaker_b", str, where_c): "assistant",
    }
    if len(speakers) != 2:
        raise InvalidInputError(f"{where_c}: speaker_a and speaker_b are the same name")
    numbers = set()
    for name in conversation:
        match = _SESSION_FIELD.fullmatch(name)
        if match:
            # The dataset dates some sessions it never wrote: a date alone is no session.
            if not match.group(2):
                numbers.add(int(match.group(1)))
        elif name not in ("speaker_a", "speaker_b"):
            raise InvalidInputError(
                f"{where_c}.{name}: unknown field (expected speaker_a, speaker_b, session_<N> "
                "and session_<N>_date_time)"
            )
    sessions = []
    seen: dict[str, str] = {}
    for number in sorted(numbers):
        session = _locomo_session(conversation, number, agent, speakers, where_c, turn_text)
        for i, turn in enumerate(session.turns):
            if turn.dia_id in seen:
                raise InvalidInputError(
                    f"{where_c}.session_{number}[{i}].dia_id: {turn.dia_id!r} is repeated "
                    f"(also at {seen[turn.dia_id]})"
                )
            seen[turn.dia_id] = f"session_{number}[{i}]"
        if session.turns:
            sessions.append(session)
    qa = _field(sample, "qa", list, where) if "qa" in sample else []
    questions = tuple(
        _locomo_question(q, f"{where}.qa[{i}]", seen.keys()) for i, q in enumerate(qa)
    )
    speaker_a, speaker_b = speakers
    return LocomoSample(
        sample_id=sample_id,
        agent=agent,
        speaker_a=speaker_a,
        speaker_b=speaker_b,
        sessions=tuple(sessions),
        questions=questions,
    )


def _locomo_session(
    conversation: dict[str, Any],
    number: int,
    agent: str,
    roles: dict[str, Literal["user", "assistant"]],
    where: str,
    turn_text: Callable[[LocomoTurn, str], str],
) -> LocomoSession:
    name = f"session_{number}"
    turns_in = _field(conversation, name, list, where)
    started_at = parse_locomo_date(
        _field(conversation, f"{name}_date_time", str, where), f"{where}.{name}_date_time"
    )
    turns: list[LocomoTurn] = []
    entries: list[ImportEntry] = []
    for i, item in enumerate(turns_in):
        at = f"{where}.{name}[{i}]"
        raw = _expect(item, dict, at)
        caption = raw.get("blip_caption")
        turn = LocomoTurn(
            dia_id=_field(raw, "dia_id", str, at),
            speaker=_field(raw, "speaker", str, at),
            text=_field(raw, "text", str, at),
            blip_caption=None if caption is None else _expect(caption, str, f"{at}.blip_caption"),
        )
        role = roles.get(turn.speaker)
        if role is None:
            a, b = roles
            raise InvalidInputError(
                f"{at}.speaker: {turn.speaker!r} is neither speaker_a {a!r} nor speaker_b {b!r}"
            )
        try:
            message = Message(role=role, content=turn_text(turn, turn.speaker))
        except InvalidInputError as exc:
            raise InvalidInputError(f"{at}: {exc}") from None
        entries.append(
            ImportEntry(
                id=turn.dia_id,
                parent_id=turns[-1].dia_id if turns else None,
                timestamp=started_at + i,
                message=message,
            )
        )
        turns.append(turn)
    return LocomoSession(
        number=number,
        session_key=locomo_session_key(agent, number),
        started_at=started_at,
        turns=tuple(turns),
        entries=tuple(entries),
    )


def parse_locomo_date(text: str, where: str) -> float:
    """Epoch seconds (UTC) of a LoCoMo session date such as "1:56 pm on 8 May, 2023"."""
    match = _LOCOMO_DATE.fullmatch(text)
    month = _MONTHS.get(match.group("month").lower()) if match else None
    if match is None or month is None:
        raise InvalidInputError(f"{where}: {text!r} is not a date like '1:56 pm on 8 May, 2023'")
    hour, minute = int(match.group("hour")), int(match.group("minute"))
    if not 1 <= hour <= 12:
        raise InvalidInputError(f"{where}: {text!r} has the hour {hour} (expected 1 to 12)")
    hour = hour % 12 + (12 if match.group("half").lower() == "p" else 0)
    try:
        when = dt.datetime(
            int(match.group("year")), month, int(match.group("day")), hour, minute, tzinfo=dt.UTC
        )
    except ValueError as exc:
        raise InvalidInputError(f"{where}: {text!r} is not a valid date ({exc})") from None
    return when.timestamp()


def _locomo_question(item: object, where: str, turns: Collection[str]) -> LocomoQuestion:
    qa = _expect(item, dict, where)
    answer = qa.get("answer")
    if answer is not None:
        # A few gold answers are numbers (years, counts): keep them as text.
        if isinstance(answer, bool) or not isinstance(answer, str | int | float):
            raise InvalidInputError(
                f"{where}.answer: expected a string or a number, got {_json_type(answer)}"
            )
        answer = str(answer)
    adversarial = qa.get("adversarial_answer")
    if adversarial is not None:
        adversarial = _expect(adversarial, str, f"{where}.adversarial_answer")
    evidence = _field(qa, "evidence", list, where)
    return LocomoQuestion(
        question=_field(qa, "question", str, where),
        answer=answer,
        category=_field(qa, "category", int, where),
        evidence=normalise_locomo_evidence(
            [_expect(e, str, f"{where}.evidence[{i}]") for i, e in enumerate(evidence)], turns
        ),
        adversarial_answer=adversarial,
    )


def normalise_locomo_evidence(evidence: Iterable[str], turns: Collection[str]) -> tuple[str, ...]:
    """Gold `dia_id`s per the dataset README: split on `;`/whitespace, read `D:?<s>:0*<t>`
    as `D<s>:<t>`, drop ids that are not among `turns`; first occurrence order, no repeats."""
    gold: dict[str, None] = {}
    for text in evidence:
        for token in _EVIDENCE_SPLIT.split(text):
            match = _EVIDENCE_ID.fullmatch(token)
            if match is None:
                continue
            dia_id = f"D{match.group(1)}:{match.group(2)}"
            if dia_id in turns:
                gold[dia_id] = None
    return tuple(gold)
