"""Recall by meaning: facts asked later in other words (docs/design.md §4, §7).

The data set is our own (`data/paraphrase.json`, written for this project): facts one user,
the assistant's owner, told it in her private chats (four chats: three messaging channels
linked to her identity and one UI session), each asked later in other words — no question
shares a content word (Porter stem, stopwords out) with its fact; small talk, plans and
near-misses around them; the chats of three other users, which must never be recalled for
her; and unrelated turns whose answer is not in memory.

The chats are appended through `mem.sessions.append` into a fresh state directory, with the
data set's identities in the config (`session.identityLinks`, `ownerIdentity`). Each question
is then asked through the real recall path, `mem.recall(am.Turn(...))`, from a new UI session
of the owner (deleted after its recall, so no question becomes another's memory). Judged
mechanically: a fact question is **recalled** when the note (`ok` or `timeout_partial`)
contains all of its key words, **wrong** when a note comes without them, **missed** when no
note comes; an unrelated turn **injects** when any note comes. Targets: recalled >= 80%,
wrong <= 5%, unrelated turns injecting <= 1 in 10.

    activememory bench paraphrase [--config FILE] [--limit N] [--json] [--state-dir DIR]
"""

from __future__ import annotations

import argparse
import copy
import importlib.resources
import re
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import anyio
import msgspec
import trio

import activememory as am

from ...protocol.config import PLUGIN_ID
from ...storage.fts_query import STOPWORDS, index_tokens
from . import runner
from .runner import percentiles

NAME = "paraphrase"
RECALLED_TARGET = 0.80
WRONG_TARGET = 0.05
UNRELATED_TARGET = 0.10
NOTE_STATUSES = ("ok", "timeout_partial")  # the statuses whose note reaches the reply model
ASK_PREFIX = "ask-"  # the question's UI session: agent:<agent>:explicit:ask-<question id>


# -- the data set -----------------------------------------------------------------------


class Fact(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Something the user told the assistant: `text`, said in chat `chat`."""

    id: str
    category: str
    chat: str
    text: str


class Question(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A later turn: asks for fact `fact` in other words, or (`fact` None) for nothing in memory.

    A correct note contains every one of `keywords` (case-insensitive, whole words, plurals
    too); together they match the fact and no other line of the data set.
    """

    id: str
    text: str
    fact: str | None
    keywords: tuple[str, ...] = ()


class ChatTurn(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One message of a chat: `role` and `text`, or `fact`: the user says that fact here."""

    role: Literal["user", "assistant"] | None = None
    text: str | None = None
    fact: str | None = None


class Chat(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One private chat of `identity`, stored under `session_key`."""

    id: str
    session_key: str
    identity: str
    turns: tuple[ChatTurn, ...]


class ParaphraseSet(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The whole data set (`data/paraphrase.json`)."""

    name: str
    version: int
    about: str
    agent: str
    user: str
    identity_links: dict[str, tuple[str, ...]]
    facts: tuple[Fact, ...]
    questions: tuple[Question, ...]
    chats: tuple[Chat, ...]

    @property
    def fact_questions(self) -> list[Question]:
        """The questions that ask for a fact."""
        return [q for q in self.questions if q.fact is not None]

    @property
    def unrelated(self) -> list[Question]:
        """The questions whose answer is not in memory."""
        return [q for q in self.questions if q.fact is None]

    def distractor_turns(self) -> int:
        """Messages that are neither a fact nor the assistant's reply right after one."""
        count = 0
        for chat in self.chats:
            after_fact = False
            for turn in chat.turns:
                count += turn.fact is None and not after_fact
                after_fact = turn.fact is not None
        return count


Judged = Literal["recalled", "wrong", "missed", "injected", "quiet"]


class DataError(Exception):
    """The data file is not a well-formed paraphrase set; the message says where."""


def data_file() -> Path:
    """The packaged data set."""
    return Path(str(importlib.resources.files(__package__) / "data" / "paraphrase.json"))


def content_words(text: str) -> set[str]:
    """The text's words as the full-text index stems them (Porter), stopwords left out."""
    data = text.encode("utf-8")
    return {
        stem
        for start, end, stem in index_tokens(data)
        if data[start:end].decode("utf-8").casefold() not in STOPWORDS
    }


def load(path: Path) -> ParaphraseSet:
    """Read and check the data set at `path`.

    Raises `DataError` naming the item for an unreadable or malformed file, a duplicate id,
    a dangling reference, a fact said other than once in its own chat, a fact question
    without key words, whose key words its fact lacks or another line also has, or a
    question that shares a content word with its fact.
    """
    try:
        data = msgspec.json.decode(path.read_bytes(), type=ParaphraseSet)
    except OSError as exc:
        raise DataError(f"{path}: {exc.strerror}") from None
    except msgspec.ValidationError as exc:
        raise DataError(f"{path}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise DataError(f"{path}: {exc}") from None
    problems = check(data)
    if problems:
        raise DataError(f"{path}: " + "; ".join(problems))
    return data


def check(data: ParaphraseSet) -> list[str]:
    """Every problem of `data` as a sentence naming the item; [] if it is well-formed."""
    problems: list[str] = []
    facts = {f.id: f for f in data.facts}
    chats = {c.id: c for c in data.chats}
    for kind, ids in (
        ("fact", [f.id for f in data.facts]),
        ("question", [q.id for q in data.questions]),
        ("chat", [c.id for c in data.chats]),
        ("session_key", [c.session_key for c in data.chats]),
    ):
        for item, n in Counter(ids).items():
            if n > 1:
                problems.append(f"{kind} {item!r} appears {n} times")
    said: Counter[tuple[str, str]] = Counter()
    for chat in data.chats:
        if chat.identity not in data.identity_links:
            problems.append(f"chat {chat.id!r}: identity {chat.identity!r} has no identity_links")
        for i, turn in enumerate(chat.turns):
            if turn.fact is not None:
                if turn.role is not None or turn.text is not None:
                    problems.append(f"chat {chat.id!r} turn {i}: a fact turn has no role or text")
                said[turn.fact, chat.id] += 1
            elif turn.role is None or not turn.text:
                problems.append(f"chat {chat.id!r} turn {i}: expected role and text, or fact")
    for fact in data.facts:
        home = chats.get(fact.chat)
        if home is None:
            problems.append(f"fact {fact.id!r}: no chat {fact.chat!r}")
        elif home.identity != data.user:
            problems.append(f"fact {fact.id!r}: chat {fact.chat!r} is not {data.user!r}'s")
        elif said[fact.id, fact.chat] != 1:
            problems.append(f"fact {fact.id!r}: said {said[fact.id, fact.chat]} times in its chat")
    for fact_id, chat_id in said:
        if fact_id not in facts or facts[fact_id].chat != chat_id:
            problems.append(f"chat {chat_id!r}: says {fact_id!r}, not one of its facts")
    # Every chat line as stored; a note is judged by its keywords, so they must name one fact.
    lines = [
        (chat, i, facts[t.fact].text if t.fact in facts else t.text or "")
        for chat in data.chats
        for i, t in enumerate(chat.turns)
        if t.fact is None or t.fact in facts
    ]
    for q in data.questions:
        if q.fact is None:
            continue
        asked = facts.get(q.fact)
        if asked is None:
            problems.append(f"question {q.id!r}: no fact {q.fact!r}")
            continue
        if not q.keywords:
            problems.append(f"question {q.id!r}: no keywords")
        for word in q.keywords:
            if not contains(asked.text, word):
                problems.append(f"question {q.id!r}: keyword {word!r} is not in fact {q.fact!r}")
        if shared := sorted(content_words(q.text) & content_words(asked.text)):
            problems.append(f"question {q.id!r} shares {', '.join(shared)} with fact {q.fact!r}")
        if q.keywords:
            for chat, i, text in lines:
                said_here = chat.turns[i].fact == q.fact
                if not said_here and all(contains(text, w) for w in q.keywords):
                    problems.append(
                        f"question {q.id!r}: the keywords also match chat {chat.id!r} turn {i}"
                    )
    return problems


def contains(note: str, word: str) -> bool:
    """Whether `word` (or its plural) is a word of `note`, case-insensitively."""
    pattern = r"(?<!\w)" + re.escape(word.casefold()) + r"(?:s|es)?(?!\w)"
    return re.search(pattern, note.casefold()) is not None


# -- the run ----------------------------------------------------------------------------


class Asked(msgspec.Struct, frozen=True, kw_only=True):
    """One question's outcome and how it was judged."""

    question: str
    text: str
    fact: str | None
    category: str
    status: str
    note: str | None
    judged: Judged
    closest: str | None  # the chat line the note is closest to: "<chat id>: <text>"
    closest_identity: str | None
    seconds: float


def config_for(data: ParaphraseSet, base: Mapping[str, Any]) -> dict[str, Any]:
    """`base` (a config mapping) with the data set's identities: its identity links added
    and its user as the owner, so the owner's UI sessions recall her linked chats."""
    config = copy.deepcopy(dict(base))
    session = config.setdefault("session", {})
    session["identityLinks"] = {**session.get("identityLinks", {}), **data.identity_links}
    entry = config.setdefault("plugins", {}).setdefault("entries", {}).setdefault(PLUGIN_ID, {})
    entry.setdefault("config", {})["ownerIdentity"] = data.user
    return config


def judge(question: Question, note: str | None) -> Judged:
    """The verdict on one question's note (None: no note reached the reply model)."""
    if question.fact is None:
        return "quiet" if note is None else "injected"
    if note is None:
        return "missed"
    return "recalled" if all(contains(note, w) for w in question.keywords) else "wrong"


def closest_line(data: ParaphraseSet, note: str) -> tuple[str, str] | None:
    """The chat line sharing the most content words with `note` ("<chat>: <text>", its
    identity), the user's own lines first on a tie; None when no line shares any."""
    facts = {f.id: f.text for f in data.facts}
    words = content_words(note)
    best: tuple[int, bool, str, str] | None = None
    for chat in data.chats:
        for turn in chat.turns:
            text = facts[turn.fact] if turn.fact is not None else turn.text or ""
            score = (len(words & content_words(text)), chat.identity == data.user)
            if score[0] and (best is None or score > best[:2]):
                best = (*score, f"{chat.id}: {text}", chat.identity)
    return None if best is None else (best[2], best[3])


def selected(data: ParaphraseSet, limit: int | None) -> list[Question]:
    """The questions to ask: all, or the first `limit` of each kind (facts, unrelated)."""
    if limit is None:
        return list(data.questions)
    return data.fact_questions[:limit] + data.unrelated[:limit]


async def run_benchmark(
    state_dir: Path, data: ParaphraseSet, config: Mapping[str, Any], questions: Sequence[Question]
) -> tuple[list[Asked], float]:
    """Append the chats into a fresh memory in `state_dir`, then ask `questions`; the answers
    and the seconds the appends took.

    Cancellation: as for `mem.recall`; the memory closes (committing what was queued).
    """
    facts = {f.id: f for f in data.facts}
    asked: list[Asked] = []
    async with am.open_memory(state_dir, config=config, executor="thread") as mem:
        start = time.perf_counter()
        for chat in data.chats:
            for turn in chat.turns:
                if turn.fact is not None:
                    message = am.Message(role="user", content=facts[turn.fact].text)
                else:
                    message = am.Message(role=turn.role or "user", content=turn.text or "")
                await mem.sessions.append(chat.session_key, message)
        appended = time.perf_counter() - start
        with anyio.move_on_after(600):  # asked a moment later, as a user would
            await mem.sessions.vectors_ready()
        for question in questions:
            key = f"agent:{data.agent}:explicit:{ASK_PREFIX}{question.id}"
            message = am.Message(role="user", content=question.text)
            await mem.sessions.append(key, message)
            begin = time.perf_counter()
            outcome = await mem.recall(am.Turn(session_key=key, messages=[message]))
            seconds = time.perf_counter() - begin
            await mem.sessions.delete(key)
            note = outcome.summary if outcome.status in NOTE_STATUSES else None
            closest = None if note is None else closest_line(data, note)
            fact = facts.get(question.fact) if question.fact is not None else None
            asked.append(
                Asked(
                    question=question.id,
                    text=question.text,
                    fact=question.fact,
                    category=fact.category if fact is not None else "unrelated",
                    status=outcome.status,
                    note=note,
                    judged=judge(question, note),
                    closest=None if closest is None else closest[0],
                    closest_identity=None if closest is None else closest[1],
                    seconds=seconds,
                )
            )
    return asked, appended


# -- the report -------------------------------------------------------------------------


def _share(count: int, total: int) -> float | None:
    return None if total == 0 else round(count / total, 4)


def report(
    data: ParaphraseSet,
    path: Path,
    config_file: Path | None,
    asked: Sequence[Asked],
    appended: float,
    env: dict[str, Any],
) -> dict[str, Any]:
    """The one JSON object `--json` prints; the table is drawn from it too."""
    on_facts = [a for a in asked if a.fact is not None]
    unrelated = [a for a in asked if a.fact is None]
    verdicts = Counter(a.judged for a in asked)
    recalled = _share(verdicts["recalled"], len(on_facts))
    wrong = _share(verdicts["wrong"], len(on_facts))
    injecting = _share(verdicts["injected"], len(unrelated))
    categories: dict[str, dict[str, int]] = {}
    for a in on_facts:
        row = categories.setdefault(a.category, {"facts": 0, "recalled": 0, "wrong": 0})
        row["facts"] += 1
        row["recalled"] += a.judged == "recalled"
        row["wrong"] += a.judged == "wrong"
    return {
        "benchmark": NAME,
        "data": str(path),
        "data_version": data.version,
        "config": None if config_file is None else str(config_file),
        "corpus": {
            "facts": len(data.facts),
            "questions": len(data.fact_questions),
            "unrelated": len(data.unrelated),
            "chats": len(data.chats),
            "user_chats": sum(c.identity == data.user for c in data.chats),
            "other_users": sorted({c.identity for c in data.chats} - {data.user}),
            "turns": sum(len(c.turns) for c in data.chats),
            "distractor_turns": data.distractor_turns(),
        },
        "asked": {"facts": len(on_facts), "unrelated": len(unrelated)},
        "recalled": recalled,
        "wrong": wrong,
        "unrelated_injecting": injecting,
        "counts": {k: verdicts[k] for k in ("recalled", "wrong", "missed", "injected", "quiet")},
        "targets": {
            "recalled": {"min": RECALLED_TARGET, "pass": _at_least(recalled, RECALLED_TARGET)},
            "wrong": {"max": WRONG_TARGET, "pass": _at_most(wrong, WRONG_TARGET)},
            "unrelated_injecting": {
                "max": UNRELATED_TARGET,
                "pass": _at_most(injecting, UNRELATED_TARGET),
            },
        },
        "notes_closest_to_other_users": sum(
            a.closest_identity not in (None, data.user) for a in asked
        ),
        "by_category": dict(sorted(categories.items())),
        "statuses": dict(Counter(a.status for a in asked).most_common()),
        "recall_latency_ms": percentiles([a.seconds for a in asked]),
        "append_seconds": round(appended, 3),
        "results": [msgspec.to_builtins(a) for a in asked],
        "environment": env,
    }


def _at_least(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target


def _at_most(value: float | None, target: float) -> bool | None:
    return None if value is None else value <= target


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _verdict_line(
    label: str, count: int, total: int, value: float | None, op: str, target: float, ok: bool | None
) -> str:
    shown = f"{label:<22} {count:>3}/{total:<3} {_percent(value):>7}"
    if ok is None:
        return f"  {shown} (target {op} {target * 100:g}%): nothing asked"
    return "  " + runner.against(shown, op, f"{target * 100:g}%", ok)


def _quote(text: str | None, width: int = 90) -> str:
    shown = text or ""
    return repr(shown if len(shown) <= width else shown[: width - 1] + "…")


def _listed(title: str, rows: Iterable[dict[str, Any]], show: str) -> list[str]:
    lines = [f"  {row['question']} {_quote(row['text'], 60)} -> {_show(row, show)}" for row in rows]
    return ["", f"  {title}:", *(["    (none)"] if not lines else ["  " + x for x in lines])]


def _show(row: dict[str, Any], show: str) -> str:
    if show == "status":
        return f"{row['status']} (fact {row['fact']})"
    closest = f"; closest: {_quote(row['closest'], 70)}" if row["closest"] else ""
    return f"{_quote(row['note'])}{closest}"


def format_table(result: dict[str, Any]) -> str:
    """The report for a person: the three verdicts, the categories, every miss and wrong note."""
    corpus, asked, counts, targets = (
        result["corpus"],
        result["asked"],
        result["counts"],
        result["targets"],
    )
    latency = result["recall_latency_ms"]
    rows = result["results"]
    lines = [
        "Paraphrase recall: facts asked in other words from a new private chat of the same user",
        f"  data: {result['data']} (version {result['data_version']})",
        f"        {corpus['facts']} facts in {corpus['user_chats']} private chats of the user, "
        f"{corpus['distractor_turns']} distractor turns, {corpus['chats'] - corpus['user_chats']} "
        f"chats of other users ({', '.join(corpus['other_users'])}), "
        f"{corpus['unrelated']} unrelated turns",
        f"  config: {result['config'] or 'defaults'} (+ the data set's identities)",
        "",
        _verdict_line(
            "recalled",
            counts["recalled"],
            asked["facts"],
            result["recalled"],
            ">=",
            targets["recalled"]["min"],
            targets["recalled"]["pass"],
        ),
        _verdict_line(
            "wrong notes",
            counts["wrong"],
            asked["facts"],
            result["wrong"],
            "<=",
            targets["wrong"]["max"],
            targets["wrong"]["pass"],
        ),
        _verdict_line(
            "unrelated injecting",
            counts["injected"],
            asked["unrelated"],
            result["unrelated_injecting"],
            "<=",
            targets["unrelated_injecting"]["max"],
            targets["unrelated_injecting"]["pass"],
        ),
        f"  notes closest to another user's chat: {result['notes_closest_to_other_users']}",
        "",
        f"  {'category':<14} {'facts':>5} {'recalled':>9} {'wrong':>6}",
        *(
            f"  {name:<14} {row['facts']:>5} {row['recalled']:>9} {row['wrong']:>6}"
            for name, row in result["by_category"].items()
        ),
        "",
        "  statuses: " + ", ".join(f"{s} {n}" for s, n in result["statuses"].items()),
        (
            f"  recall latency: p50 {latency['p50']:.1f} ms, p90 {latency['p90']:.1f} ms, "
            f"max {latency['max']:.1f} ms over {len(rows)} recalls; "
            f"appends {result['append_seconds']:.2f} s"
            if latency
            else "  recall latency: (no recalls)"
        ),
        *_listed(
            "missed (question -> status)", (r for r in rows if r["judged"] == "missed"), "status"
        ),
        *_listed(
            "wrong notes (question -> note)", (r for r in rows if r["judged"] == "wrong"), "note"
        ),
        *_listed(
            "unrelated turns that injected a note (question -> note)",
            (r for r in rows if r["judged"] == "injected"),
            "note",
        ),
        *runner.environment_lines(result["environment"]),
    ]
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (`sys.argv[1:]` when `argv` is None)."""
    parser = runner.command(
        NAME,
        "Recall by meaning: facts a user told the bot, asked later in other words "
        "(recalled, wrong notes, unrelated turns injecting).",
        state_dir="keep each run's databases in a new directory here; "
        "default: a temporary directory, removed afterwards",
    )
    parser.add_argument(
        "--config", type=Path, help="a config file (JSON5) to run with; default: the defaults"
    )
    parser.add_argument(
        "--data", type=Path, help="the data set (default: the packaged data/paraphrase.json)"
    )
    parser.add_argument(
        "--limit",
        type=runner.positive_int,
        help="ask only the first N questions of each kind (facts, unrelated)",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`).

    Returns 0 (whatever the verdicts), 1 if the library raised, 2 if the data set or the
    config file is malformed.
    """
    args = parse_args(argv)
    path = args.data or data_file()
    try:
        data = load(path)
        base = {} if args.config is None else am.load_config(args.config).raw
        config = config_for(data, base)
        am.load_config(config)  # the data set's identities must fit the file's config
    except (DataError, am.ConfigError) as exc:
        return runner.fail(runner.prog(NAME), exc, 2)
    questions = selected(data, args.limit)

    def measure(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
        asked, appended = trio.run(run_benchmark, run_dir, data, config, questions)
        env = runner.environment(run_dir, kept=kept)
        return report(data, path, args.config, asked, appended, env)

    return runner.main(NAME, args, measure, format_table, fresh=True)
