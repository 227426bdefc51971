"""`local/extractive`: the embedded recall model (docs/design.md §4.8). No network, no clock, no randomness.

One recall is one memory-tool call and a pure function of what it returned:

1. **Search.** `memory_search` if allowed (with `maxResults` `SEARCH_RESULTS`), else
   `memory_recall`, else the first allowed tool, with `{"query": request.search_query}`.
   An empty search query gives NONE without a call.
2. **Candidates.** Every result's text (`snippet`, `content` or `text`; a host tool's plain
   content line by line) is cut into lines and sentences; each piece keeps the search rank
   `r` (0 = best) of the result it came from. A failed or empty result gives no candidate.
3. **Score.** Terms are the index's own: the Porter stems of the unicode61 tokens (CJK runs
   as bigrams, `storage/fts_query.py`), without English function words (`STOPWORDS`),
   conversational filler ("lol", "thanks", "remind", …) and contraction fragments. With `n`
   candidates, `df(t)` of them holding term `t`, a term weighs

       w(t) = (1 + ln((n + 1) / (df(t) + 1))) · (½ for a weak word)

   so a word every candidate has counts least, and a word of the message no candidate has
   counts most (it is what the evidence fails to cover). Weak words are everyday words
   that name no topic ("like", "get", "good", …: `WEAK_WORD_WEIGHT`). For the latest
   message's terms `L` (a leading greeting dropped) and a candidate's terms `T`:

       coverage = Σ w(L ∩ T) / Σ w'(L)

   where w'(t) = w(t), except ½ w(t) (`UNSEEN_WEIGHT`) for a term no candidate holds: such
   words are mostly the task at hand ("pick", "flight"), not evidence against a memory.
       score    = 0.9 · coverage + 0.1 / (1 + r)      (0 when L ∩ T is empty)

   `contextual` also reads the conversation tail (`request.context` before the latest
   message, its last `CONTEXT_TAIL_CHARS`): its other terms `K` count at `CONTEXT_WEIGHT`
   (0.5), only when matched, so context can lift a candidate but never sink one, and a
   candidate must still share a term with the latest message (a topic shift follows the
   new topic):

       coverage = (Σ w(L ∩ T) + ½ Σ w(K ∩ T)) / (Σ w(L) + ½ Σ w(K ∩ T))

   `recall-heavy` scores the best candidate with the union of the two best candidates'
   terms (evidence split over two notes still counts), and writes the note from the best.
   Sums use `math.fsum`, so the score does not depend on set order. Ties go to the
   candidate sharing more of the conversation tail (`balanced`, `contextual`), then the
   better search rank.
   Questions, bare greetings and thanks, and the assistant's own acknowledgements ("Got
   it, I'll remember that") are not memories and are never candidates (`is_memory`): an
   earlier "What is my cat's name?" must not come back as a note.
4. **Gate.** The best score must reach `STYLE_THRESHOLDS[style]`. With similarities from
   search, meaning is weighed too (`_by_meaning`, `_choose`; docs/design.md §4.8): the
   closest memory may answer without a shared word, and a near tie writes both sentences. `preference-only` keeps
   only candidates stating a preference, habit or recurring personal fact and none naming a
   one-off event (`is_preference`). `strict` also needs the latest message to ask for memory
   (`asks_for_memory`: a question, a mention of the user, or of the past).
5. **Note.** One line from the best candidate's own words: a first-person user statement
   becomes third person ("I like X" → "The user likes X") where its grammar is certain, else
   it is quoted (`recall/third_person.py`); anything else is "Noted: …"; cut to `max_summary_chars`
   at a word boundary. It is offered with `tools.draft` and returned.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from .._output import ELLIPSIS, one_line, summarize
from ..protocol.recall import RecallRequest, ToolResult
from ..storage.fts_query import STOPWORDS, index_columns, index_tokens
from .subagent_input import FULL_HEADING, LATEST_HEADING, RECENT_HEADING, STYLE_THRESHOLDS
from .third_person import HABIT_CUES, third_person, word_set
from .tools import RecallTools

NONE = "NONE"
"""What the model answers when no evidence passes its style's gate."""

SEARCH_RESULTS = 20
"""Results asked of `memory_search`: wider than a host's default, because most hits are not
memories (questions, the assistant's replies, greetings) and are dropped here."""
MEANING_THRESHOLDS = {
    "precision-heavy": 0.46,
    "strict": 0.42,
    "balanced": 0.36,
    "preference-only": 0.36,
    "contextual": 0.34,
    "recall-heavy": 0.31,
}
"""How close in meaning (cosine, the shipped embedder) the user's own statement must be to
the question when no shared word carries it (docs/design.md §4.8). Set on the paraphrase
set (`activememory bench paraphrase`) with all-MiniLM-L6-v2, before the clear-lone and
near-tie rules: balanced 0.40 recalled 17/48 with 6 wrong notes, 0.36 20/48 with 7, 0.33
22/48 with 9 — a wrong note costs more than a missed one. With every rule and the default
all-mpnet-base-v2: 42/48 recalled, 2 wrong (MiniLM: 37/48, 6)."""
WORDS_MIN_SIMILARITY = 0.2
"""A candidate chosen by shared words must still be at least this close in meaning, when
search measured it: a sentence that shares one word but is about something else is not."""
MEANING_MARGIN = 0.05
"""How much closer in meaning a candidate must be to win over the one chosen by words."""
MEANING_FLOORS = {
    "precision-heavy": 0.46,
    "strict": 0.42,
    "balanced": 0.3,
    "preference-only": 0.3,
    "contextual": 0.28,
    "recall-heavy": 0.26,
}
"""Below its style's threshold, the closest memory still answers from this close when it
stands clear of the rest… (the careful styles take no such exception)"""
MEANING_CLEAR = 0.05
"""…by at least this much cosine over the next memory."""
MEANING_TIE = 0.06
"""Two memories this close in meaning to each other's similarity are both written into the
note (when both fit): the embedder cannot tell which one answers."""
CONTEXT_WEIGHT = 0.5
"""How much a conversation-tail term counts against a latest-message term (`contextual`)."""
RANK_WEIGHT = 0.1
"""The share of the score that the search rank gives: `RANK_WEIGHT / (1 + rank)`."""
CONTEXT_TAIL_CHARS = 600
"""How much of the conversation before the latest message `contextual` reads, from its end."""
WEAK_WORD_WEIGHT = 0.5
UNSEEN_WEIGHT = 0.5
"""What a weak word ("like", "get", "good", …: everyday words that name no topic) weighs,
relative to its rarity weight."""
MAX_CANDIDATES = 400
"""Pieces of evidence scored per recall, so a huge tool answer cannot eat the budget…"""
MAX_EVIDENCE_CHARS = 64_000
"""…and characters of evidence, whatever a host tool puts in its structured fields."""

# The tools tried first, in order; else the first allowed tool.
_SEARCH_TOOLS = ("memory_search", "memory_recall")
_RESULT_FIELDS = ("results", "items", "memories", "hits")
_TEXT_FIELDS = ("snippet", "content", "text")


# Words a chat message carries that say nothing a memory could match.
_FILLER = word_set(
    """
    ok okay k lol lmao haha hahaha hehe hmm hm um uh oh ah yes yeah yep yup nope nah sure
    thanks thank thx ty please pls cool nice great awesome wow hi hello hey bye
    remind remember recall tell know think kind sort thing things something anything
    really actually maybe just also anyway user assistant don doesn didn isn aren wasn
    weren won wouldn couldn shouldn haven hasn hadn cannot
    """
)

# Everyday words that name no topic: "what's the weather like" is not about what anyone likes.
_WEAK_WORDS = "like get go make take good new want need use time day way lot"

_CUE_DAYS = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
_MONTHS = (
    r"(?:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?"
    r"|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)"
)
_PREFERENCE_CUES = re.compile(
    r"\b(?:"
    r"likes?|loves?|enjoys?|prefers?|preferred|favou?rites?|hates?|dislikes?|"
    + HABIT_CUES
    + r"|can['’]?t stand|cannot stand|allergic|intolerant|vegetarian|vegan|go-to|routine|"
    r"habits?|tends? to|each (?:day|morning|evening|night|week|month)|"
    r"every (?:day|morning|evening|night|week|weekend|month|year|"
    + _CUE_DAYS
    + r")|on "
    + _CUE_DAYS
    + r"s|on weekends|weekdays|fan of|into (?:\w+ )?(?:music|food|books|films|movies)"
    r")\b",
    re.IGNORECASE,
)
_EVENT_CUES = re.compile(
    r"\b(?:"
    r"yesterday|today|tonight|tomorrow|this (?:morning|afternoon|evening|weekend)|"
    r"last (?:night|week|weekend|month|year|time|"
    + _CUE_DAYS
    + r")|next (?:week|weekend|month|year|time|"
    + _CUE_DAYS
    + r")|on "
    + _CUE_DAYS
    + r"(?!s)|on (?:the )?\d{1,2}(?:st|nd|rd|th)?\b|on "
    + _MONTHS
    + r"\.? \d{1,2}|"
    + _MONTHS
    + r"\.? \d{1,2}(?:st|nd|rd|th)?,? \d{4}|\d{4}-\d{2}-\d{2}|\d{1,2}/\d{1,2}(?:/\d{2,4})?|"
    r"once|ago|booked|bought|ordered|reserved|scheduled|cancell?ed|happened|"
    r"just (?:got|did|had|finished)"
    r")\b",
    re.IGNORECASE,
)

# `strict`: a message asks for memory when it is a question, names the user, or the past.
_QUESTION_WORDS = word_set(
    """
    what which who whom whose where when why how do does did is are am was were can could
    should would will shall have has had any remind remember recall tell
    """
)
_ASKS_FOR_MEMORY = re.compile(
    r"\?|\b(?:i|me|my|mine|myself|we|us|our|ours)\b|\bi(?:'|’)(?:m|ve|d|ll)\b|"
    r"\b(?:remember|remind|recall|last time|before|earlier|again|usual|usually|always|ago)\b",
    re.IGNORECASE,
)
# A greeting at the start of a message is not a topic: "good morning!" is not about mornings.
_GREETING = re.compile(
    r"^\W*(?:good (?:morning|afternoon|evening|night)|(?:hi|hello|hey|howdy)(?: there)?)\b\W*",
    re.IGNORECASE,
)
_FIRST_WORD = re.compile(r"[^\W\d_]+")

# Markdown list markers, headings, quotes and checkboxes at the start of a memory line.
_LINE_MARKER = re.compile(r"^(?:[#>*+\-•]+|\d+[.)]|\[[ xX]\])\s+")
_ROLE_PREFIX = re.compile(r"^(user|assistant|human|ai|bot)\s*:\s*", re.IGNORECASE)
# A sentence ends at . ! ? before a capital, but not after an initial ("Ursula K. Le Guin")
# or a title ("Dr. Patel").
# A question asks; it states nothing about the user (docs/design.md §4.8).
_QUESTION = re.compile(
    r"\?[\W]*$"
    r"|^\W*(?:what|who|whom|whose|where|when|why|which|how)\s+(?:is|are|was|were|do|does|did|can|could|would|will|should|am|'s)\b"
    r"|^\W*(?:do|does|did|can|could|would|will|should|is|are|am|have|has|shall)\s+(?:you|i|we|they|he|she|it|there|my|your|anyone)\b",
    re.IGNORECASE,
)
# The assistant's own acknowledgements: they repeat or promise, they hold no memory.
_ASSISTANT_FILLER = re.compile(
    r"^\W*(?:got it|sure|of course|noted|ok(?:ay)?|alright|all right|great|sounds (?:good|great|like)"
    r"|happy to help|glad to help|you'?re welcome|no problem|will do|absolutely|certainly"
    r"|understood|i understand|thanks|thank you|i'?ll (?:remember|keep|take|note|make a note)"
    r"|i will (?:remember|keep|take|note)|let me know|anything else)\b",
    re.IGNORECASE,
)
# A request to the assistant asks for work; it states nothing about the user.
_REQUEST = re.compile(
    r"^\W*(?:please\s+)?(?:make|help|write|give|tell|find|book|remind|show|suggest|explain"
    r"|translate|summari[sz]e|list|plan|draft|create|recommend|let'?s|let us)\b",
    re.IGNORECASE,
)
_SECOND_PERSON = re.compile(r"\b(?:you|your|yours|yourself|you're|you've|you'll)\b", re.I)
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself|we|our|us)\b", re.I)
# A sentence whose subject is a friend, colleague or relative outside the household.
_ABOUT_OTHERS = re.compile(
    r"(?:my|our)\s+(?:(?:best|old|close|new)\s+)?"
    r"(friend|colleague|coworker|co-worker|cousin|neighbou?r|classmate|roommate|flatmate)"
    r"(?:'s|s)?\b(?:\s+((?-i:[A-Z])[\w-]*))?",
    re.I,
)
_SENTENCE_END = re.compile(
    r"(?<=[.!?])(?<!\b[A-Z]\.)(?<!\b(?:Mr|Dr|Ms|St)\.)(?<!\bMrs\.)\s+(?=[\"'“‘(]?[A-Z0-9])"
)


class Candidate(NamedTuple):
    """One piece of evidence: a line or sentence of a tool result, with its search rank."""

    text: str
    rank: int  # position of its result in the tool's answer, 0 = best
    role: str | None = None  # "user" or "assistant" when the result or a prefix says so
    similarity: float | None = None  # its result's cosine to the query, when search had vectors


class LocalExtractiveModel:
    """`local/extractive`: the embedded default `RecallModel` (docs/design.md §4.8).

    It searches memory once with the request's search query, scores every piece of
    evidence against the latest user message (the formula is in the module docstring),
    applies the prompt style's threshold and gates, and answers one third-person note built
    from the best piece, or "NONE". Same request and tool answers, same result.

    Cancellation: the only wait is the memory-tool call; cancelled there, nothing is left
    behind and no draft is offered. Everything after it is synchronous, bounded work
    (at most `MAX_CANDIDATES` pieces, `MAX_EVIDENCE_CHARS` characters; milliseconds), so a
    cancellation arriving then takes effect at the caller's next await, and the draft,
    if any, is the returned note.
    """

    async def recall(self, request: RecallRequest, tools: RecallTools) -> str:
        """Search, score, gate and answer: one note grounded in a tool result, or "NONE"."""
        if not request.search_query.strip():
            return NONE
        name = search_tool(tools.names)
        if name is None:
            return NONE
        args: dict[str, object] = {"query": request.search_query}
        if name == "memory_search":
            args["maxResults"] = SEARCH_RESULTS
        result = await tools.call(name, args)
        note = extract_note(request, candidates_of(result))
        if note is None:
            return NONE
        tools.draft(note)
        return note


def search_tool(names: Sequence[str]) -> str | None:
    """The tool the model searches with: `memory_search`, `memory_recall`, else the first."""
    for name in _SEARCH_TOOLS:
        if name in names:
            return name
    return names[0] if names else None


def candidates_of(result: ToolResult) -> list[Candidate]:
    """The pieces of evidence in one tool result, best search rank first.

    Structured results are read from `data["results"]` (or `items`/`memories`/`hits`); each
    entry's `snippet`, `content` or `text` is cut into lines and sentences. Without such a
    list, the plain content is read line by line, each line its own rank. A result with an
    `error`, or that is not recall evidence, gives none.
    """
    if result.error is not None or not result.evidence:
        return []
    entries = _entries(result.data)
    if entries is None:
        lines = [line for line in result.content.splitlines() if line.strip()]
        entries = [(line, None, None) for line in lines]
    found: list[Candidate] = []
    room = MAX_EVIDENCE_CHARS
    for rank, (text, role, similarity) in enumerate(entries):
        for piece, piece_role in _pieces(text[:room]):
            found.append(Candidate(piece, rank, piece_role or role, similarity))
            if len(found) >= MAX_CANDIDATES:
                return found
        room -= len(text)
        if room <= 0:
            break
    return found


def _entries(
    data: Mapping[str, object] | None,
) -> list[tuple[str, str | None, float | None]] | None:
    if data is None:
        return None
    for field in _RESULT_FIELDS:
        listed = data.get(field)
        if isinstance(listed, list):
            return [entry for item in listed if (entry := _entry(item)) is not None]
    return None


def _entry(item: object) -> tuple[str, str | None, float | None] | None:
    if isinstance(item, str):
        return item, None, None
    if not isinstance(item, Mapping) or item.get("status") == "invalid":
        return None
    role = item.get("role")
    similarity = item.get("similarity")
    for field in _TEXT_FIELDS:
        text = item.get(field)
        if isinstance(text, str) and text.strip():
            return (
                text,
                role if isinstance(role, str) else None,
                float(similarity) if isinstance(similarity, int | float) else None,
            )
    record = item.get("record")  # a records-store result nests its record
    return _entry(record) if isinstance(record, Mapping) else None


def _pieces(text: str) -> Iterable[tuple[str, str | None]]:
    """Lines, then sentences, without list markers, snippet ellipses or role prefixes."""
    for line in text.splitlines():
        line = line.strip().strip(ELLIPSIS).strip()
        while (marker := _LINE_MARKER.match(line)) is not None:
            line = line[marker.end() :]
        role = None
        if (prefix := _ROLE_PREFIX.match(line)) is not None:
            role = "user" if prefix.group(1).lower() in ("user", "human") else "assistant"
            line = line[prefix.end() :]
        for sentence in _SENTENCE_END.split(line):
            sentence = sentence.strip()
            if sentence and any(ch.isalnum() for ch in sentence):
                yield sentence, role


def is_memory(candidate: Candidate) -> bool:
    """Whether a piece of evidence can be a note at all: not a question, not a request to
    the assistant, not a greeting or a thanks with nothing else in it, not the assistant's
    own acknowledgement (a line of unknown role is held to the same rule: users rarely open
    a fact with "Got it"), and — from the assistant — only what it says about the user
    ("your flight leaves at 9"), never its general knowledge or advice."""
    text = candidate.text
    if _QUESTION.search(text) or _REQUEST.match(text) or not terms(_GREETING.sub("", text)):
        return False
    if candidate.role == "assistant" and not _SECOND_PERSON.search(text):
        return False
    return candidate.role == "user" or not _ASSISTANT_FILLER.match(text)


def about_others(text: str, asked: str) -> bool:
    """Whether `text` tells of someone outside the user's household — "My friend Marta just
    adopted a kitten", "My colleague's sister lives in Porto" — and `asked` does not name
    them (by relation or name). Such a sentence is not a fact about the user: "my kitty"
    is not the friend's kitten, "my boss" not the friend's boss."""
    found = _ABOUT_OTHERS.match(text.strip())
    if found is None:
        return False
    named = terms(" ".join(part for part in found.groups() if part))  # relation and name
    return named.isdisjoint(terms(asked))


def terms(text: str) -> frozenset[str]:
    """The content terms of `text` as the index stems them (CJK runs as bigrams), without
    function words, chat filler and contraction fragments."""
    words, grams = index_columns(text)
    data = words.encode("utf-8")
    found: set[str] = set()
    for start, end, stem in index_tokens(data):
        word = data[start:end].decode("utf-8", "replace").casefold()
        if word in STOPWORDS or word in _FILLER or (len(word) == 1 and not word.isdigit()):
            continue
        found.add(stem)
    if grams:
        found.update(grams.split())
    return frozenset(found)


_WEAK_STEMS = terms(_WEAK_WORDS)


def is_preference(text: str) -> bool:
    """Whether `text` states a preference, habit, routine, taste or recurring personal fact
    (a cue such as "prefer", "always", "every Sunday", "allergic") and names no one-off
    event ("yesterday", "last week", "on Friday", "booked", "once", a date, …)."""
    return _PREFERENCE_CUES.search(text) is not None and _EVENT_CUES.search(text) is None


def asks_for_memory(text: str) -> bool:
    """Whether a message calls for memory (`strict`): it has a `?` or starts with a question
    word ("what", "do", "remind", …), names the user ("I", "my", "we", …), or the past or a
    habit ("remember", "last time", "before", "usually", …)."""
    first = _FIRST_WORD.search(text)
    if first is not None and first.group().casefold() in _QUESTION_WORDS:
        return True
    return _ASKS_FOR_MEMORY.search(text) is not None


def conversation_tail(context: str, latest: str) -> str:
    """The conversation before the latest message in a `request.context`, its last
    `CONTEXT_TAIL_CHARS`, without the layout's headings."""
    cut = context.rfind(LATEST_HEADING)
    if cut >= 0:
        context = context[:cut]
    elif latest and context.rstrip().endswith(latest.strip()):
        context = context.rstrip()[: -len(latest.strip())]
    lines = [
        line for line in context.splitlines() if line.strip() not in (RECENT_HEADING, FULL_HEADING)
    ]
    tail = " ".join(" ".join(lines).split())
    return tail[-CONTEXT_TAIL_CHARS:]


class _Scored(NamedTuple):
    score: float
    context: float
    candidate: Candidate
    terms: frozenset[str]


def extract_note(request: RecallRequest, candidates: Sequence[Candidate]) -> str | None:
    """The note for `request` from `candidates`, or None when nothing passes the style.

    Pure and deterministic: the whole of `LocalExtractiveModel` after its tool call. An
    unknown style is held to the `balanced` threshold. Without `request.latest`, the
    search query stands in for the latest message.
    """
    style = request.prompt_style
    threshold = STYLE_THRESHOLDS.get(style, STYLE_THRESHOLDS["balanced"])
    latest = request.latest.strip() or request.search_query.strip()
    if style == "strict" and not asks_for_memory(latest):
        return None
    candidates = [c for c in candidates if is_memory(c) and not about_others(c.text, latest)]
    if style == "preference-only":
        candidates = [c for c in candidates if is_preference(c.text)]
    asked = terms(_GREETING.sub("", latest))
    if not asked or not candidates:
        return None
    uses_context = style in ("balanced", "contextual")
    context = terms(conversation_tail(request.context, latest)) - asked if uses_context else None
    held = [terms(c.text) for c in candidates]
    weight = _Idf(held)
    ranked = _rank(asked, context, candidates, held, weight, lift=style == "contextual")
    by_words = _by_words(ranked, asked, weight, style, threshold)
    chosen = _choose(by_words, _by_meaning(candidates, held, asked, style))
    if not chosen:
        return None
    cap = max(1, request.max_summary_chars)
    note = third_person(chosen[0].text, chosen[0].role)
    if len(chosen) > 1:  # the runner-up joins only whole
        both = f"{note} {third_person(chosen[1].text, chosen[1].role)}"
        note = both if len(one_line(both)) <= cap else note
    return summarize(note, cap)


def _choose(by_words: Candidate | None, by_meaning: Sequence[Candidate]) -> list[Candidate]:
    """The evidence the note is written from, best first: the choice by words, unless the
    best by meaning is clearly closer in meaning (`MEANING_MARGIN`); and the other one too
    when neither is clearly closer (`MEANING_TIE`), so a near tie is not settled by a
    guess. A choice not embedded yet has no similarity: its words decide alone."""
    if by_words is None:
        return list(by_meaning)
    best = by_meaning[0] if by_meaning else None
    if best is None or best.similarity is None or by_words.similarity is None:
        return [by_words]
    if best.text == by_words.text or best.similarity > by_words.similarity + MEANING_MARGIN:
        return list(by_meaning)
    if abs(best.similarity - by_words.similarity) <= MEANING_TIE:
        return sorted([by_words, best], key=lambda c: -(c.similarity or 0.0))
    return [by_words]


def _by_words(
    ranked: Sequence[_Scored],
    asked: frozenset[str],
    weight: _Idf,
    style: str,
    threshold: float,
) -> Candidate | None:
    """The best candidate by shared words, if it clears the style's threshold — and, when
    search measured its meaning, is not far from the question (one shared word is not
    evidence when the sentence is about something else)."""
    for best in ranked[:1]:
        score = best.score
        if style == "recall-heavy" and len(ranked) > 1:
            union = best.terms | ranked[1].terms
            score = max(score, _score(asked, frozenset(), union, best.candidate.rank, weight))
        similarity = best.candidate.similarity
        if score >= threshold and (similarity is None or similarity >= WORDS_MIN_SIMILARITY):
            return best.candidate
    return None


def _by_meaning(
    candidates: Sequence[Candidate],
    held: Sequence[frozenset[str]],
    asked: frozenset[str],
    style: str,
) -> list[Candidate]:
    """The memories closest in meaning to the question — notes, or the user's own
    first-person statements — best first: none, the best, or the best and the runner-up.

    The best answers if it is close enough for the style (`MEANING_THRESHOLDS`), or if it is
    at least its style's `MEANING_FLOORS` close and stands clear of every other memory
    (`MEANING_CLEAR`): a lone close statement answers, one of several alike does not. The
    runner-up joins when it is within `MEANING_TIE` of the best and close enough itself.
    Nothing without vectors. Sentences of one result share its similarity: among them,
    the one sharing most words with the question speaks for it."""
    needed = MEANING_THRESHOLDS.get(style, MEANING_THRESHOLDS["balanced"])
    floor = MEANING_FLOORS.get(style, MEANING_FLOORS["balanced"])
    ranked: list[tuple[float, int, Candidate]] = []
    seen: set[str] = set()
    for candidate, its_terms in zip(candidates, held, strict=True):
        similarity = candidate.similarity
        if similarity is None or candidate.role == "assistant" or candidate.text in seen:
            continue
        if candidate.role == "user" and not _FIRST_PERSON.search(candidate.text):
            continue  # about someone else: the user says a fact about themselves in the first person
        seen.add(candidate.text)
        ranked.append((similarity, len(asked & its_terms), candidate))
    ranked.sort(key=lambda r: (-r[0], -r[1]))  # stable: equal keys keep the search order
    if not ranked or ranked[0][0] < floor:
        return []
    best = ranked[0][0]
    runner_up = ranked[1][0] if len(ranked) > 1 else 0.0
    if best < needed and best - runner_up < MEANING_CLEAR:
        return []
    chosen = [ranked[0][2]]
    if len(ranked) > 1 and runner_up >= max(floor, best - MEANING_TIE):
        chosen.append(ranked[1][2])
    return chosen


def _rank(
    asked: frozenset[str],
    context: frozenset[str] | None,
    candidates: Sequence[Candidate],
    held: Sequence[frozenset[str]],
    weight: _Idf,
    *,
    lift: bool,
) -> list[_Scored]:
    """The candidates sharing a term with the latest message, best first."""
    shown = context or frozenset()
    scored = []
    for candidate, its_terms in zip(candidates, held, strict=True):
        if asked.isdisjoint(its_terms):
            continue
        score = _score(asked, shown if lift else frozenset(), its_terms, candidate.rank, weight)
        overlap = math.fsum(weight[t] for t in shown & its_terms)
        scored.append(_Scored(score, overlap, candidate, its_terms))
    # Stable sort: equal keys keep the tool's order.
    scored.sort(key=lambda s: (-s.score, -s.context, s.candidate.rank))
    return scored


class _Idf(dict[str, float]):
    """w(t) = (1 + ln((n + 1) / (df(t) + 1))) · (WEAK_WORD_WEIGHT for a weak word) over the
    candidate set; a term no candidate holds has df 0."""

    def __init__(self, term_sets: Sequence[frozenset[str]]) -> None:
        super().__init__()
        self._n = len(term_sets)
        self._df = Counter(t for held in term_sets for t in held)

    def answerable(self, term: str) -> float:
        """A term's weight in the denominator: UNSEEN_WEIGHT when no candidate holds it.

        Words of the message that no memory holds are mostly the task at hand ("pick",
        "flight", "ideas"), not evidence against a memory that answers its topic.
        """
        return self[term] if self._df[term] else UNSEEN_WEIGHT * self[term]

    def __missing__(self, term: str) -> float:
        value = 1.0 + math.log((self._n + 1) / (self._df[term] + 1))
        if term in _WEAK_STEMS:
            value *= WEAK_WORD_WEIGHT
        self[term] = value
        return value


def _score(
    asked: frozenset[str],
    context: frozenset[str],
    held: frozenset[str],
    rank: int,
    weight: _Idf,
) -> float:
    if asked.isdisjoint(held):
        return 0.0
    lifted = CONTEXT_WEIGHT * math.fsum(weight[t] for t in context & held)
    matched = math.fsum(weight[t] for t in asked & held) + lifted
    total = math.fsum(weight.answerable(t) for t in asked) + lifted
    coverage = matched / total
    return (1.0 - RANK_WEIGHT) * coverage + RANK_WEIGHT / (1 + rank)
