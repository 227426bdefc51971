"""`mem.sessions.search` (docs/design.md §3): visibility, ranking, redaction, snippets, limits."""

from __future__ import annotations

import re
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from functools import partial
from typing import cast

import apsw
import msgspec
import numpy as np

from ._redaction import Redactor
from ._settings import Settings
from .actors.supervisor import AgentStore, Supervisor
from .protocol.config import HybridQuery, PrivateScope
from .protocol.content import check_choice, check_int
from .protocol.embeddings import Embedder
from .protocol.search import (
    DEFAULT_LIMIT,
    INDEXING_WARNING,
    MAX_ANSWER_BYTES,
    MAX_LIMIT,
    MAX_SNIPPET_CHARS,
    NO_EMBEDDER,
    SEARCH_MODES,
    SearchHit,
    SearchResult,
)
from .protocol.session_key import SessionKey, parse_session_key
from .recall.hybrid import MessageSide, QueryVector, embed_query, message_side, rank
from .recall.hybrid import candidates as _fuse_candidates
from .storage.fts_query import (
    MATCH_MODES,
    MatchPlan,
    check_query,
    index_tokens,
    is_cjk,
    plan_match,
    query_terms,
)
from .storage.hybrid import Candidate as FuseCandidate
from .storage.reads import TranscriptReads
from .storage.search import Candidate, DbScope, ScopePage, TermStats

_encode = msgspec.json.Encoder().encode
# How far before the first hit a snippet starts, so the hit has some context.
_LEAD_CHARS = 90
# How much of a long message the slow snippet path tokenizes looking for a hit.
FALLBACK_BYTES = 64 * 1024
_ELLIPSIS = "…"


class SessionSearch:
    """Runs searches for `Sessions.search`; each call brings the settings it runs under."""

    def __init__(
        self,
        supervisor: Supervisor,
        *,
        on_dirty: Callable[[AgentStore], None] = lambda store: None,
    ) -> None:
        self._supervisor = supervisor
        self._on_dirty = on_dirty
        # Per agent database; only ever used on that database's reader executor.
        self._term_stats: dict[str, TermStats] = {}
        # The query side of `mode="hybrid"`; the same embedder the embedder actor uses.
        self.embedder: Embedder | None = None

    async def search(
        self,
        query: object,
        *,
        settings: Settings,
        caller: object,
        session_key: object = None,
        limit: object = DEFAULT_LIMIT,
        match: object = "phrase",
        mode: object = "text",
    ) -> SearchResult:
        text = check_query(query)
        caller_key = parse_session_key(caller, field="caller")
        only = None if session_key is None else parse_session_key(session_key)
        limit = check_int("limit", limit, 1, MAX_LIMIT)
        plan = plan_match(text, check_choice("match", match, MATCH_MODES))
        hybrid = check_choice("mode", mode, SEARCH_MODES) == "hybrid"
        if plan is None:
            return SearchResult(results=())
        terms = query_terms(text)
        meaning, fallback = QueryVector(None, None, None), None
        if hybrid:
            meaning = await embed_query(self.embedder, text)
            fallback = NO_EMBEDDER if self.embedder is None else meaning.fallback
        weights = settings.config.memory_search.query.hybrid

        redactor, visibility = settings.redactor, settings.config.search
        own = await self._supervisor.agent(caller_key.store_agent)
        targets: list[tuple[AgentStore, DbScope]] = [(own, _own_scope(visibility.visibility))]
        if visibility.visibility == "all" and visibility.agent_to_agent:
            for agent in await self._supervisor.known_agents():
                if agent != own.agent:
                    targets.append((await self._supervisor.agent(agent), "all"))
        if only is not None:
            targets = [(s, sc) for s, sc in targets if s.agent == only.store_agent]

        pool = limit + 1  # one more than shown tells whether the limit cut anything
        if meaning.vector is not None:
            pool = max(pool, limit * weights.candidate_multiplier)  # from each side, to fuse
        clamp = visibility.sandbox_visibility == "spawned"
        pages: list[_AgentPage] = []
        for store, scope in targets:
            if store is not own and clamp and await self._caller_sandboxed(own, caller_key):
                continue  # a sandboxed caller is held to its own tree
            run = partial(
                _search_one,
                plan=plan,
                stats=self._term_stats.setdefault(store.agent, TermStats()),
                scope=scope,
                caller=caller_key.raw,
                clamp_sandboxed=clamp and store is own,
                session_key=None if only is None else only.raw,
                pool=pool,
                terms=terms,
                redactor=redactor,
                meaning=meaning,
            )
            found = await store.read(run)
            if found.page.any_dirty:
                self._on_dirty(store)
            pages.append(found)
        if meaning.vector is None:
            return _assemble(pages, limit, fallback)
        return _assemble_fused(pages, meaning.vector, weights, limit)

    def private_job(
        self,
        query: str,
        *,
        caller: SessionKey,
        scope: PrivateScope,
        redactor: Redactor,
        limit: int = DEFAULT_LIMIT,
    ) -> PrivateSearch | None:
        """Cross-conversation recall's transcript search (docs/design.md §4.2), as a job to run
        inside a reader call of the caller's own (memory_search pays one thread hop).

        Only the caller's agent database, scoped in SQL to that agent's other private
        conversations that `scope` admits (`storage.search._PRIVATE`);
        `tools.sessions.visibility` plays no part and is not widened. None when there is
        nothing to search: a caller that is not itself private gets nothing.
        """
        text = check_query(query)
        limit = check_int("limit", limit, 1, MAX_LIMIT)
        plan = plan_match(text, "phrase")
        if plan is None or not caller.is_private or caller.agent is None:
            return None
        run = partial(
            _search_one,
            plan=plan,
            stats=self._term_stats.setdefault(caller.agent, TermStats()),
            scope=scope,
            caller=caller.raw,
            clamp_sandboxed=False,
            session_key=None,
            pool=limit + 1,
            terms=query_terms(text),
            redactor=redactor,
        )
        return PrivateSearch(caller.agent, run, limit, self._on_dirty)

    async def _caller_sandboxed(self, own: AgentStore, caller: SessionKey) -> bool:
        info = await own.read(lambda reader: reader.session(caller.raw))
        return info is not None and info.sandboxed


def _own_scope(visibility: str) -> DbScope:
    return "all" if visibility in ("agent", "all") else visibility  # type: ignore[return-value]


def _search_one(
    reader: TranscriptReads,
    *,
    plan: MatchPlan,
    stats: TermStats,
    scope: DbScope,
    caller: str,
    clamp_sandboxed: bool,
    session_key: str | None,
    pool: int,
    terms: list[str],
    redactor: Redactor,
    meaning: QueryVector | None = None,
) -> _AgentPage:
    """Runs on the reader's executor: the SQL, then redaction and snippets of the pool.

    With a query vector (`mode="hybrid"`) also the vector side, over the sessions of the
    very scope the text side used (`scope_sql`: the clamp and `session_key` included).
    """
    if clamp_sandboxed and scope == "all" and reader.sandboxed(caller):
        scope = "tree"
    page = reader.search_page(
        plan, scope=scope, caller=caller, session_key=session_key, keep=pool, stats=stats
    )
    snippets = [make_snippet(redactor.redact(c.text), terms) for c in page.candidates]
    if meaning is None or meaning.vector is None:
        return _AgentPage(page, snippets)
    side = message_side(
        reader,
        meaning,
        pool=pool,
        text_messages=[c.event_id for c in page.candidates],
        scope=scope,
        caller=caller,
        session_key=session_key,
    )
    only = {i: make_snippet(redactor.redact(row.text), terms) for i, row in side.rows.items()}
    return _AgentPage(page, snippets, side, only)


@dataclass(frozen=True)
class PrivateSearch:
    """A prepared private search: `run` on the agent's reader, then `finish` on the loop."""

    agent: str
    run: Callable[[TranscriptReads], _AgentPage]
    limit: int
    on_dirty: Callable[[AgentStore], None]

    def finish(self, page: _AgentPage, store: AgentStore) -> SearchResult:
        if page.page.any_dirty:
            self.on_dirty(store)
        return _assemble([page], self.limit)


@dataclass(frozen=True)
class _AgentPage:
    """One database's best visible matches with their redacted snippets (snippet, cut)."""

    page: ScopePage
    snippets: list[tuple[str, bool]]
    side: MessageSide | None = None  # hybrid mode: the vector side of the same scope
    side_snippets: dict[int, tuple[str, bool]] | None = None  # of rows only it found


def _assemble(pages: list[_AgentPage], limit: int, fallback: str | None = None) -> SearchResult:
    ranked: list[tuple[float, int, int, Candidate, tuple[str, bool]]] = []
    visible_dirty = 0
    for order, found in enumerate(pages):
        visible_dirty += found.page.visible_dirty
        for candidate, snippet in zip(found.page.candidates, found.snippets, strict=True):
            ranked.append((-candidate.score, order, -candidate.event_id, candidate, snippet))
    ranked.sort(key=lambda r: r[:3])
    truncated = len(ranked) > limit
    hits: list[SearchHit] = []
    for _, _, _, c, (text, cut) in ranked[:limit]:
        truncated = truncated or cut
        hits.append(_hit(c, text))
    return _answer(hits, visible_dirty, truncated, fallback)


def _answer(
    hits: list[SearchHit], visible_dirty: int, truncated: bool, fallback: str | None = None
) -> SearchResult:
    """The answer, its results dropped from the end until it fits MAX_ANSWER_BYTES."""
    indexing = visible_dirty > 0
    warning = INDEXING_WARNING.format(n=visible_dirty) if indexing else None
    result = SearchResult(
        results=tuple(hits),
        indexing=indexing,
        warning=warning,
        truncated=truncated,
        fallback=fallback,
    )
    while len(_encode(result)) > MAX_ANSWER_BYTES:
        result = msgspec.structs.replace(result, results=result.results[:-1], truncated=True)
    return result


def _assemble_fused(
    pages: list[_AgentPage], query: np.ndarray, weights: HybridQuery, limit: int
) -> SearchResult:
    """`mode="hybrid"`: both sides of every database fused (docs/design.md §3, §4.7).

    The text scores of all databases form one source (as in text mode), divided by their
    best; every candidate is also scored by its stored vector. Keys are (page, event id):
    event ids are per database.
    """
    text_ranked: list[tuple[float, int, int]] = []
    near: list[tuple[float, int, int]] = []
    vectors: dict[Hashable, np.ndarray] = {}
    rows: dict[tuple[int, int], tuple[SearchHit, bool]] = {}
    visible_dirty = 0
    for order, found in enumerate(pages):
        visible_dirty += found.page.visible_dirty
        for c, (snippet, cut) in zip(found.page.candidates, found.snippets, strict=True):
            text_ranked.append((-c.score, order, -c.event_id))
            rows[order, c.event_id] = (_hit(c, snippet), cut)
        if found.side is None:
            continue
        vectors.update({(order, i): v for i, v in found.side.vectors.items()})
        near += [(-similarity, order, i) for i, similarity in found.side.near]
        for i, row in found.side.rows.items():
            snippet, cut = (found.side_snippets or {})[i]
            hit = SearchHit(
                session_key=row.session_key,
                session_id=row.session_id,
                message_id=i,
                timestamp=row.timestamp,
                role=row.role,  # type: ignore[arg-type]
                snippet=snippet,
                score=0.0,
            )
            rows[order, i] = (hit, cut)
    text_ranked.sort()
    near.sort(key=lambda n: (n[0], n[1], -n[2]))
    meta: dict[Hashable, tuple[float | None, bool]] = {
        key: (hit.timestamp, False) for key, (hit, _) in rows.items()
    }
    text_hits: list[tuple[Hashable, float]] = [
        ((order, -neg_id), -neg) for neg, order, neg_id in text_ranked
    ]
    found_all: list[FuseCandidate] = _fuse_candidates(
        [text_hits], [(order, i) for _, order, i in near], vectors, meta
    )
    fused = rank(found_all, query, weights, limit=limit)
    truncated = len(found_all) > limit
    hits: list[SearchHit] = []
    for f in fused[:limit]:
        hit, cut = rows[cast(tuple[int, int], f.key)]
        truncated = truncated or cut
        hits.append(msgspec.structs.replace(hit, score=f.score, similarity=f.similarity))
    return _answer(hits, visible_dirty, truncated)


def _hit(c: Candidate, snippet: str) -> SearchHit:
    return SearchHit(
        session_key=c.session_key,
        session_id=c.session_id,
        message_id=c.event_id,
        timestamp=c.timestamp,
        role=c.role,  # type: ignore[arg-type]
        snippet=snippet,
        score=c.score,
    )


def _first_hit(text: str, terms: list[str]) -> int:
    """The character offset of the first place in `text` where a term occurs, else 0.

    Fast path: a regular expression for each term's stem at a word start (the index's
    Porter stem, so "running" finds "runs") or a CJK substring. Only when that finds
    nothing (diacritics: "cafe" in "Café") is the text tokenized like the index does,
    up to FALLBACK_BYTES of it.
    """
    stems = [_stem(term) for term in terms if not is_cjk(term)]
    cjk = [re.escape(term) for term in terms if is_cjk(term)]
    alternatives = [rf"\b{re.escape(stem)}" for stem in stems if stem] + cjk
    if alternatives:
        found = re.search("|".join(alternatives), text, re.IGNORECASE)
        if found is not None:
            return found.start()
    data = text.encode("utf-8")[:FALLBACK_BYTES]
    wanted = set(stems)
    for start, _end, token in index_tokens(data):
        if token in wanted:
            return len(data[:start].decode("utf-8", "replace"))
    return 0


def _stem(term: str) -> str:
    stems = list(index_tokens(term.encode(), apsw.FTS5_TOKENIZE_QUERY))
    return stems[0][2] if stems else ""


def make_snippet(text: str, terms: list[str], size: int = MAX_SNIPPET_CHARS) -> tuple[str, bool]:
    """At most `size` characters of `text` around its first matching term; (snippet, cut).

    `text` must already be redacted: cutting first could leave half a secret that no
    longer looks like one.
    """
    if len(text) <= size:
        return text, False
    hit = _first_hit(text, terms)
    start = max(0, hit - _LEAD_CHARS)
    end = min(len(text), start + size)
    start = max(0, end - size)
    head = _ELLIPSIS if start > 0 else ""
    tail = _ELLIPSIS if end < len(text) else ""
    start += len(head)
    end -= len(tail)
    window = text[start:end]
    if head:  # begin at a word boundary when one is near
        space = window.find(" ", 0, 24)
        if space >= 0:
            window = window[space + 1 :]
    if tail:
        space = window.rfind(" ", max(0, len(window) - 24))
        if space > 0:
            window = window[:space]
    return head + window.strip() + tail, True
