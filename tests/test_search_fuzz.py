"""Query fuzz (hypothesis): any text is a valid query, and no query reaches a hidden row.

The memory is opened once behind a blocking portal (as `activememory.sync` would), and
every example searches it as a caller that may see only its own tree.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio.from_thread
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import activememory as am

VISIBLE = ["agent:main:direct:me", "agent:main:explicit:my-child"]
HIDDEN = ["agent:main:direct:other", "agent:main:group:team", "legacy-key", "agent:ops:direct:x"]
WORDS = [
    "alpha", "beta", "NEAR", "AND", "OR", "NOT", "café", "İstanbul", "東京タワー", "서울에서",
    "straße", "emoji🙂", "a*b", "col:val", '"quoted"', "(paren)", "^caret", "x-y", "_under_",
]  # fmt: skip
SYNTAX = ['"', "*", ":", "(", ")", "^", "-", "+", "{", "}", " AND ", " OR ", " NOT ", " NEAR/2 "]


@pytest.fixture(scope="module")
def portal_mem(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, am.Memory]]:
    state = Path(tmp_path_factory.mktemp("fuzz")) / "state"
    config = {"tools": {"sessions": {"visibility": "tree"}}}
    with (
        anyio.from_thread.start_blocking_portal("trio") as portal,
        portal.wrap_async_context_manager(am.open_memory(state, config=config)) as mem,
    ):

        async def fill() -> None:
            await mem.sessions.create(VISIBLE[1], spawned_by=VISIBLE[0])
            for i, key in enumerate(VISIBLE + HIDDEN):
                for j, word in enumerate(WORDS):
                    text = f"{word} {WORDS[(i + j) % len(WORDS)]} {key} filler {j}"
                    await mem.sessions.append(key, am.Message(role="user", content=text))

        portal.call(fill)
        yield portal, mem


def search(portal_mem: tuple[object, am.Memory], query: str, match: str) -> am.SearchResult:
    portal, mem = portal_mem

    async def run() -> am.SearchResult:
        return await mem.sessions.search(query, caller=VISIBLE[0], limit=25, match=match)  # type: ignore[arg-type]

    return portal.call(run)  # type: ignore[attr-defined, no-any-return]


def check(result: am.SearchResult, allowed: set[str]) -> None:
    for hit in result.results:
        assert hit.session_key in allowed
        assert len(hit.snippet) <= 300
        assert hit.role in ("user", "assistant")


queries = st.one_of(
    st.text(min_size=1, max_size=200),
    st.lists(st.sampled_from(WORDS + SYNTAX), min_size=1, max_size=12).map("".join),
    st.lists(st.sampled_from(WORDS + SYNTAX), min_size=1, max_size=12).map(" ".join),
)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=queries, match=st.sampled_from(["phrase", "prefix"]))
def test_any_text_is_a_query_and_never_reaches_a_hidden_session(
    portal_mem: tuple[object, am.Memory], query: str, match: str
) -> None:
    if not query.strip():
        with pytest.raises(am.InvalidInputError, match="^query: must not be blank$"):
            search(portal_mem, query, match)
        return
    result = search(portal_mem, query, match)
    check(result, set(VISIBLE))
