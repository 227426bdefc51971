"""What goes into the full-text index, and how user text becomes an FTS5 query.

Both halves live here because they must agree. The index has three columns:

- `words`: the message text with every CJK run blanked out, tokenized by unicode61 with
  diacritics removed (docs/design.md §2.3) and Porter-stemmed;
- `grams`: every CJK run as overlapping character bigrams ("東京都" -> "東京 京都"); a one-character
  run is kept as is. A CJK word of n ≥ 2 characters is then found as the phrase of its
  bigrams, which matches exactly where the word occurs as a substring;
- `context`: both of the above for the end of the previous message on the active branch,
  weighted 0.4 in BM25, so an answer is found by the words of its question.

unicode61 alone keeps a run of CJK characters as one token, so "東京" would never find
"東京に行きました" (the silent zero-hit search the source's users report). Bigrams keep the C
tokenizer on the write path (no Python callback per token) and cost one extra token per CJK
character; text without CJK pays one regex scan.

Query semantics (`build_match`): the query is cut into terms by the same unicode61 rules as
the index; every character that is FTS5 syntax elsewhere (quotes, `*`, `:`, `^`, parentheses,
`NEAR`, `AND`/`OR`/`NOT`) is only ever a separator or a plain word. A message matches if it
holds *any* term; BM25 ranks messages holding more and rarer terms first. With more than one
term, the whole query as a phrase is added to the OR, so messages holding it verbatim rank
above messages holding the same words scattered. English function words ("the", "what",
"did") are dropped when at least one other term remains. `match="prefix"` lets the last term
(and the phrase's last word) match as a prefix.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import apsw

from ..protocol.content import check_nonblank
from ..protocol.search import MATCH_MODES as MATCH_MODES
from ..protocol.search import MAX_QUERY_CHARS
from ..protocol.search import MatchMode as MatchMode
from .memstatus import sqlite_memory_statistics

# One constant for the schema, the query side and the tests' index probe.
TOKENIZER_ARGS = ("unicode61", "remove_diacritics", "2")
TOKENIZE = "porter " + " ".join(TOKENIZER_ARGS)
# BM25 column weights: words, grams, context. Context words count for less than the
# message's own (0.3-0.5 all score within 0.01 R@10 on the LoCoMo dev split).
RANK = "bm25(1.0, 1.0, 0.4)"
# How much of the previous message goes into `context`: its end, where a question is.
CONTEXT_CHARS = 300


# Han (+ extensions and compatibility), kana, Hangul (syllables and jamo), bopomofo.
_CJK = (
    "\u1100-\u11ff\u2e80-\u2fdf\u3005-\u3007\u3021-\u3029\u3031-\u3035\u3038-\u303c"
    "\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31a0-\u31bf\u31f0-\u31ff\u3400-\u4dbf"
    "\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7af\ud7b0-\ud7ff\uf900-\ufaff\uff66-\uff9f"
    "\U00020000-\U0003134f"
)
_CJK_RUN = re.compile(f"[{_CJK}]+")

# Dropped from a query when another term remains; kept when the query is only these.
STOPWORDS = frozenset(
    [
        "a",
        "about",
        "after",
        "again",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "being",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "done",
        "during",
        "each",
        "few",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "ourselves",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "themselves",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
        "yourselves",
    ]
)

MAX_QUERY_TERMS = 32


def index_row(
    event_id: int, text: str, previous: str | None
) -> tuple[int, str, str | None, str | None]:
    """The index row of a message: (rowid, words, grams, context).

    `previous` is the text of the message before it on the active branch: a reply such
    as "yes, last Tuesday" is then found by the words of the question it answers.
    """
    context = None
    if previous is not None:
        context = " ".join(c for c in index_columns(previous[-CONTEXT_CHARS:]) if c)
    return (event_id, *index_columns(text), context)


def index_columns(text: str) -> tuple[str, str | None]:
    """The (`words`, `grams`) column values the index stores for one message text."""
    if _CJK_RUN.search(text) is None:
        return text, None
    runs = _CJK_RUN.findall(text)
    grams = " ".join(_bigrams(run) for run in runs)
    return _CJK_RUN.sub(" ", text), grams


def _bigrams(run: str) -> str:
    if len(run) == 1:
        return run
    return " ".join(run[i : i + 2] for i in range(len(run) - 1))


class _Tokenizers(threading.local):
    """The index's tokenizers, one pair per thread: apsw tokenizers hang off a connection
    (apsw.fts5 has no connection-free one)."""

    def __init__(self) -> None:
        sqlite_memory_statistics()  # before this process's first connection of ours
        self.conn = apsw.Connection(":memory:")
        self.unicode61 = self.conn.fts5_tokenizer(TOKENIZER_ARGS[0], list(TOKENIZER_ARGS[1:]))
        name, *args = TOKENIZE.split()
        self.index = self.conn.fts5_tokenizer(name, args)  # Porter stems, as the index holds


@functools.cache
def _thread_tokenizers() -> _Tokenizers:
    # Made at first use, not at import: an import opens no connection (storage/memstatus.py).
    return _Tokenizers()


def tokens(
    tokenizer: apsw.FTS5Tokenizer, data: bytes, reason: int
) -> Iterator[tuple[int, int, str]]:
    """(start byte, end byte, token) for each token `tokenizer` finds in `data`."""
    for item in tokenizer(data, reason, None):
        if not isinstance(item, str):  # offsets are on by default; a bare str has none
            start, end, *forms = item
            yield int(start), int(end), str(forms[0])


def index_tokens(
    data: bytes, reason: int = apsw.FTS5_TOKENIZE_DOCUMENT
) -> Iterator[tuple[int, int, str]]:
    """(start byte, end byte, stem) for each token of `data` as the index (`TOKENIZE`) has it."""
    return tokens(_thread_tokenizers().index, data, reason)


def check_query(query: object) -> str:
    """`query`, if it can be searched: a string, not blank, at most `MAX_QUERY_CHARS`
    characters, valid Unicode; else `InvalidInputError` naming `query`."""
    return check_nonblank("query", query, MAX_QUERY_CHARS)


def query_terms(query: str) -> list[str]:
    """The query's words as the index sees them (case folded, diacritics removed), in order.

    CJK runs come back as separate terms; duplicates are dropped.
    """
    found = tokens(_thread_tokenizers().unicode61, query.encode("utf-8"), apsw.FTS5_TOKENIZE_QUERY)
    terms: list[str] = []
    seen: set[str] = set()
    for _start, _end, token in found:
        parts = _split_cjk(token) if _CJK_RUN.search(token) else [token]
        for part in parts:
            if part not in seen:
                seen.add(part)
                terms.append(part)
    return terms[:MAX_QUERY_TERMS]


def _split_cjk(token: str) -> list[str]:
    parts: list[str] = []
    last = 0
    for run in _CJK_RUN.finditer(token):
        if run.start() > last:
            parts.append(token[last : run.start()])
        parts.append(run.group())
        last = run.end()
    if last < len(token):
        parts.append(token[last:])
    return parts


def is_cjk(term: str) -> bool:
    return _CJK_RUN.fullmatch(term) is not None


class MatchPlan(NamedTuple):
    """A query as FTS5 expressions: one per term, and the whole-query phrase (if any).

    The search may leave out terms too common to rank by (storage/search.py); `expression`
    joins what is kept.
    """

    terms: tuple[str, ...]  # the index's form of each term, for the commonness probe
    term_exprs: tuple[str, ...]  # one quoted FTS5 expression per term
    phrase: str | None  # the whole query as a phrase, or None

    def expression(self, keep: Sequence[bool] | None = None, *, joiner: str = " OR ") -> str:
        kept = [e for i, e in enumerate(self.term_exprs) if keep is None or keep[i]]
        if self.phrase is not None and (keep is None or all(keep)) and joiner == " OR ":
            kept.insert(0, self.phrase)
        return joiner.join(kept)


def plan_match(query: str, match: MatchMode = "phrase") -> MatchPlan | None:
    """The `MatchPlan` of `query`, or None when it holds no searchable word.

    Every term is emitted as a double-quoted FTS5 string, so nothing the user typed is
    ever read as FTS5 syntax.
    """
    terms = query_terms(query)
    content = [t for t in terms if t not in STOPWORDS]
    if content:
        terms = content
    if not terms:
        return None
    prefix = match == "prefix"
    exprs = [_term_expr(t, prefix=prefix and i == len(terms) - 1) for i, t in enumerate(terms)]
    phrase = None
    if len(terms) > 1 and not any(is_cjk(t) for t in terms):
        phrase = _quote(" ".join(terms)) + (" *" if prefix else "")
    return MatchPlan(tuple(terms), tuple(exprs), phrase)


def build_match(query: str, match: MatchMode = "phrase") -> str | None:
    """The full FTS5 MATCH expression for `query` (every term and the phrase), or None."""
    plan = plan_match(query, match)
    return None if plan is None else plan.expression()


def _term_expr(term: str, *, prefix: bool) -> str:
    if is_cjk(term):
        if len(term) == 1:
            # Bigrams starting with it, or a one-character run; misses it at a run's end.
            return _quote(term) + " *"
        return _quote(_bigrams(term)) + (" *" if prefix else "")
    return _quote(term) + (" *" if prefix else "")


def _quote(text: str) -> str:
    return '"' + text.replace('"', '""') + '"'
