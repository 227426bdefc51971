"""The SQLite index's terms as a PostgreSQL tsvector, and a `MatchPlan` as a tsquery.

Decision (docs/design.md §11): the terms are computed in Python by the very tokenizer the
SQLite index uses (`storage/fts_query.index_tokens`: unicode61, diacritics removed, Porter
stems; CJK runs as bigrams by `index_row`), not by a PostgreSQL text-search configuration.
The two stores then hold identical terms by construction: PostgreSQL's `english` snowball
stemmer and `unaccent` rules differ from FTS5's Porter and unicode61 in many small ways
(`unaccent` folds "ß" to "ss", snowball stems "news" to "news", Porter to "new").

Layout of one message's tsvector: the `words` column's tokens at positions 1.., then the
`grams` column's, then the `context` column's, each column one position after the last
(so no phrase spans two columns, as in FTS5); words and grams weighted A, context B.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import apsw

from ..fts_query import MatchPlan, _bigrams, index_row, index_tokens, is_cjk

# PostgreSQL's limits: a position is at most 16383 (larger ones are clamped), a lexeme has
# at most 256 positions and at most 2046 bytes, a tsvector's lexemes and positions at most
# 1 MiB (each lexeme 2-byte aligned, then a count and 2 bytes per position). A message
# near the 1 MiB content limit can hold more distinct words than that: its tsvector keeps
# one position per lexeme, then only the lexemes that fit (`_fit`).
MAX_POSITION = 16383
MAX_POSITIONS = 256
MAX_LEXEME_BYTES = 2046
MAX_TSVECTOR_BYTES = 1_000_000  # under PostgreSQL's 1,048,575, with room to spare


class IndexTerms(NamedTuple):
    """One message's index row: its token count (BM25's |D|) and its tsvector text."""

    tokens: int
    terms: str


def _lexeme(token: str) -> str:
    if len(token) * 4 <= MAX_LEXEME_BYTES:  # a character is at most 4 bytes of UTF-8
        return token
    data = token.encode("utf-8")
    if len(data) <= MAX_LEXEME_BYTES:
        return token
    return data[:MAX_LEXEME_BYTES].decode("utf-8", errors="ignore")


def quote(lexeme: str) -> str:
    """A lexeme as a quoted tsvector/tsquery literal: nothing in it is read as syntax."""
    return "'" + lexeme.replace("\\", "\\\\").replace("'", "''") + "'"


def _column_tokens(value: str | None) -> list[str]:
    if not value:
        return []
    found = index_tokens(value.encode("utf-8"), apsw.FTS5_TOKENIZE_DOCUMENT)
    return [_lexeme(token) for _start, _end, token in found]


def index_terms(text: str, previous: str | None) -> IndexTerms:
    """The index row of a message whose active-branch predecessor's text is `previous`
    (the same columns as the SQLite index's `index_row`)."""
    _rowid, words, grams, context = index_row(0, text, previous)
    positions: dict[str, list[str]] = {}
    tokens = 0
    position = 0
    for value, weight in ((words, "A"), (grams, "A"), (context, "B")):
        column = _column_tokens(value)
        tokens += len(column)
        for token in column:
            position += 1
            held = positions.setdefault(token, [])
            if len(held) < MAX_POSITIONS:
                held.append(f"{min(position, MAX_POSITION)}{weight}")
        position += 1  # a gap: no phrase crosses into the next column
    # A token of n characters costs at most 4n + 5 <= 9n stored bytes: short texts fit.
    chars = sum(len(value) for value in (words, grams, context) if value)
    if 9 * chars > MAX_TSVECTOR_BYTES:
        positions = _fit(positions)
    literal = " ".join(f"{quote(lexeme)}:{','.join(at)}" for lexeme, at in positions.items())
    return IndexTerms(tokens, literal)


def _stored_bytes(lexeme: str, positions: int) -> int:
    size = len(lexeme.encode("utf-8"))
    return size + (size & 1) + 2 + 2 * positions


def _fit(positions: dict[str, list[str]]) -> dict[str, list[str]]:
    """`positions` cut to what one tsvector can hold (`MAX_TSVECTOR_BYTES`): first every
    lexeme's positions but the first, then the lexemes past the limit, in text order."""
    total = sum(_stored_bytes(lexeme, len(at)) for lexeme, at in positions.items())
    if total <= MAX_TSVECTOR_BYTES:
        return positions
    kept: dict[str, list[str]] = {}
    total = 0
    for lexeme, at in positions.items():
        total += _stored_bytes(lexeme, 1)
        if total > MAX_TSVECTOR_BYTES:
            break
        kept[lexeme] = at[:1]
    return kept


class QueryPhrase(NamedTuple):
    """One OR-ed part of a query, as BM25 scores it: a lexeme (maybe a prefix), or a
    phrase of several (`phrase`, a tsquery; `words`, its lexemes in order) that counts once
    per place it occurs, as FTS5 counts a phrase."""

    lexeme: str | None
    prefix: bool
    phrase: str | None
    words: tuple[str, ...] = ()

    @property
    def tsquery(self) -> str:
        if self.phrase is not None:
            return self.phrase
        assert self.lexeme is not None
        return quote(self.lexeme) + (":*" if self.prefix else "")


class PgQuery(NamedTuple):
    """A `MatchPlan` for PostgreSQL: its parts, and the tsquery any of them matches."""

    parts: tuple[QueryPhrase, ...]
    has_phrase: bool  # parts[0] is the whole query as a phrase; the terms follow

    @property
    def match(self) -> str:
        return " | ".join(f"({part.tsquery})" for part in self.parts)


def _stems(text: str, *, prefix: bool) -> list[str]:
    flags = apsw.FTS5_TOKENIZE_QUERY | (apsw.FTS5_TOKENIZE_PREFIX if prefix else 0)
    return [_lexeme(token) for _s, _e, token in index_tokens(text.encode("utf-8"), flags)]


def _part(lexemes: list[str], *, prefix: bool) -> QueryPhrase | None:
    if not lexemes:
        return None
    if len(lexemes) == 1:
        return QueryPhrase(lexemes[0], prefix, None)
    quoted = [quote(lexeme) for lexeme in lexemes]
    if prefix:
        quoted[-1] += ":*"
    return QueryPhrase(None, prefix, " <-> ".join(quoted), tuple(lexemes))


def pg_query(plan: MatchPlan, keep: Iterable[bool] | None = None) -> PgQuery | None:
    """The PostgreSQL form of `plan` (storage/fts_query.plan_match): each term as FTS5
    reads its quoted expression (Porter stems; a CJK word as the phrase of its bigrams; a
    single CJK character as a prefix), and the whole-query phrase when every term is kept."""
    kept = list(keep) if keep is not None else [True] * len(plan.terms)
    parts: list[QueryPhrase] = []
    for term, expr, use in zip(plan.terms, plan.term_exprs, kept, strict=True):
        if not use:
            continue
        prefix = expr.endswith(" *")
        if is_cjk(term):
            lexemes = [term] if len(term) == 1 else _bigrams(term).split(" ")
            part = _part([_lexeme(lexeme) for lexeme in lexemes], prefix=prefix)
        else:
            part = _part(_stems(term, prefix=prefix), prefix=prefix)
        if part is not None:
            parts.append(part)
    has_phrase = False
    if plan.phrase is not None and all(kept):
        prefix = plan.phrase.endswith(" *")
        words = [s for term in plan.terms for s in _stems(term, prefix=False)]
        phrase = _part(words, prefix=prefix)
        if phrase is not None and phrase.phrase is not None:
            parts.insert(0, phrase)
            has_phrase = True
    return PgQuery(tuple(parts), has_phrase) if parts else None
