"""sessions_search (docs/design.md §3): terms, ranking, snippets, limits, CJK, errors.

Every test runs on trio and asyncio, with the thread and the inline executor. Messages
whose ranking is compared go to sessions of their own (`put`), since a message's index also
holds the words of the one before it (its context).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

import activememory as am
from activememory.protocol.search import MAX_ANSWER_BYTES

from index_probe import agent_db, connect, indexed_tokens, tokenize
from pg_server import pg_memory_dsn, sqlite_only, storage

# Both stores (docs/design.md §11): the same searches on SQLite and on PostgreSQL.
__all__ = ["pg_memory_dsn", "storage"]

pytestmark = pytest.mark.anyio

KEY = "agent:main:direct:alice"


@pytest.fixture
async def mem(tmp_path: Path, executor: str, storage: str | None) -> AsyncIterator[am.Memory]:
    config = {"tools": {"sessions": {"visibility": "agent"}}}
    async with am.open_memory(
        tmp_path / "state",
        config=config,
        executor=executor,  # type: ignore[arg-type]
        storage=storage,
    ) as memory:
        yield memory


_count = itertools.count()


async def put(mem: am.Memory, message: am.Message) -> am.Event:
    """Append `message` as the only message of a new session."""
    return await mem.sessions.append(f"agent:main:direct:s{next(_count)}", message)


def user(text: str) -> am.Message:
    return am.Message(role="user", content=text)


def assistant(text: str) -> am.Message:
    return am.Message(role="assistant", content=text)


async def search(mem: am.Memory, query: str, **kw: object) -> list[int]:
    res = await mem.sessions.search(query, caller=KEY, **kw)  # type: ignore[arg-type]
    return [hit.message_id for hit in res.results]


async def test_finds_user_and_assistant_messages_with_their_fields(mem: am.Memory) -> None:
    q = await mem.sessions.append(KEY, user("Where did we park the blue van?"))
    a = await mem.sessions.append(KEY, assistant("The blue van is on level three."))
    await mem.sessions.append(KEY, am.Message(role="tool", content="van log: blue"))
    res = await mem.sessions.search("blue van", caller=KEY)
    assert {h.message_id for h in res.results} == {q.id, a.id}
    hit = next(h for h in res.results if h.message_id == a.id)
    assert hit.session_key == KEY and hit.role == "assistant"
    assert hit.snippet == "The blue van is on level three."
    assert hit.timestamp == a.timestamp and hit.score > 0
    info = await mem.sessions.info(KEY)
    assert hit.session_id == info.session_id
    assert (res.indexing, res.warning, res.truncated) == (False, None, False)


async def test_one_absent_word_still_finds_the_others_best_first(mem: am.Memory) -> None:
    both = await put(mem, user("my sister adopted a grey cat"))
    one = await put(mem, user("the cat sleeps all day"))
    await put(mem, user("nothing relevant here"))
    assert await search(mem, "did my sister adopt a grey cat or a zebra") == [both.id, one.id]


async def test_the_verbatim_phrase_ranks_above_scattered_words(mem: am.Memory) -> None:
    scattered = await put(mem, user("the party was red hot and the wine good"))
    verbatim = await put(mem, user("the party was good and the wine red hot"))
    assert await search(mem, "wine red hot") == [verbatim.id, scattered.id]


@pytest.mark.parametrize(
    "query",
    [
        '"alpha unbalanced',
        "NEAR(alpha beta)",
        "alpha AND OR NOT beta",
        "words:alpha",
        "alpha*",
        "^alpha",
        "(alpha",
        "alpha) OR (",
        "-alpha +beta",
        "{words grams}: alpha",
    ],
)
async def test_fts5_syntax_in_queries_is_plain_words(mem: am.Memory, query: str) -> None:
    hit = await put(mem, user("alpha and beta walked in"))
    assert await search(mem, query) == [hit.id]


async def test_operators_are_searchable_words(mem: am.Memory) -> None:
    near = await put(mem, user("the station is near the river"))
    await put(mem, user("a river runs through"))
    assert (await search(mem, "NEAR"))[0] == near.id


async def test_a_query_without_words_finds_nothing(mem: am.Memory) -> None:
    await mem.sessions.append(KEY, user("anything at all"))
    res = await mem.sessions.search("*** ::: ()", caller=KEY)
    assert res.results == () and not res.truncated


async def test_only_stopwords_are_still_searched(mem: am.Memory) -> None:
    hit = await put(mem, user("to be or not to be"))
    await put(mem, user("something else entirely"))
    assert await search(mem, "to be") == [hit.id]


async def test_prefix_match_applies_to_the_last_term(mem: am.Memory) -> None:
    hit = await put(mem, user("we booked the restaurant downtown"))
    word = await put(mem, user("restau is not a word"))
    assert await search(mem, "restau") == [word.id]
    assert set(await search(mem, "restau", match="prefix")) == {word.id, hit.id}
    assert await search(mem, "downt") == []
    assert await search(mem, "downt", match="prefix") == [hit.id]
    assert await search(mem, "book", match="prefix") == [hit.id]


async def test_diacritics_case_and_stemming(mem: am.Memory) -> None:
    cafe = await put(mem, user("Meet me at the Café in İstanbul"))
    runs = await put(mem, user("She was running marathons"))
    assert await search(mem, "cafe istanbul") == [cafe.id]
    assert await search(mem, "CAFÉ") == [cafe.id]
    assert await search(mem, "run marathon") == [runs.id]


@pytest.mark.parametrize(
    ("text", "query"),
    [
        ("我们明天去北京大学参观", "北京"),
        ("我们明天去北京大学参观", "北京大学"),
        ("来週東京に行きました", "東京"),
        ("来週東京に行きました", "行きました"),
        ("カタカナのテキストです", "テキスト"),
        ("서울에서 친구를 만났어요", "서울"),
        ("서울에서 친구를 만났어요", "친구"),
        ("新しいiPhone専用ケースを買った", "専用"),
        ("新しいiPhone専用ケースを買った", "iphone"),
    ],
)
async def test_cjk_words_of_two_or_more_characters_are_found(
    mem: am.Memory, text: str, query: str
) -> None:
    hit = await put(mem, user(text))
    await put(mem, user("東西南北 and unrelated words"))
    assert await search(mem, query) == [hit.id]


async def test_cjk_substring_not_in_the_text_is_not_found(mem: am.Memory) -> None:
    await put(mem, user("我们明天去北京大学参观"))
    # Both characters occur, but never next to each other.
    assert await search(mem, "北学") == []


async def test_limit_and_truncated(mem: am.Memory) -> None:
    ids = [(await put(mem, user(f"needle number {i}"))).id for i in range(30)]
    res = await mem.sessions.search("needle", caller=KEY, limit=5)
    assert len(res.results) == 5 and res.truncated
    # Equal scores: newest first, the deterministic tiebreak.
    assert [h.message_id for h in res.results] == ids[::-1][:5]
    res = await mem.sessions.search("needle", caller=KEY, limit=25)
    assert len(res.results) == 25 and res.truncated
    res = await mem.sessions.search("number 7", caller=KEY, limit=25)
    assert res.results[0].message_id == ids[7]
    one = await mem.sessions.search("needle", caller=KEY, session_key=res.results[3].session_key)
    assert [h.message_id for h in one.results] == [res.results[3].message_id]
    assert not one.truncated


async def test_not_truncated_when_everything_fits(mem: am.Memory) -> None:
    for i in range(3):
        await mem.sessions.append(KEY, user(f"needle {i}"))
    res = await mem.sessions.search("needle", caller=KEY, limit=3)
    assert len(res.results) == 3 and not res.truncated


async def test_long_messages_are_cut_around_the_first_hit(mem: am.Memory) -> None:
    filler = " ".join(f"word{i}" for i in range(200))
    await mem.sessions.append(KEY, user(f"{filler} the hidden treasure is buried here {filler}"))
    res = await mem.sessions.search("treasure", caller=KEY)
    (hit,) = res.results
    assert len(hit.snippet) <= 300
    assert "treasure" in hit.snippet
    assert hit.snippet.startswith("…") and hit.snippet.endswith("…")
    assert res.truncated


async def test_answer_stays_within_32_kib(mem: am.Memory) -> None:
    # 300 characters of 4-byte emoji and control characters JSON escapes to six bytes each.
    for i in range(25):
        await mem.sessions.append(KEY, user(f"needle{i} " + "\x01" * 280 + f" needle {i}"))
    res = await mem.sessions.search("needle", caller=KEY, limit=25)
    assert len(msgspec.json.encode(res)) <= MAX_ANSWER_BYTES
    assert 0 < len(res.results) < 25 and res.truncated


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"query": ""}, "query: must not be blank"),
        ({"query": "   \n"}, "query: must not be blank"),
        ({"query": "x" * 4097}, "query: 4097 characters is over the maximum 4096"),
        ({"query": 42}, "query: expected a string, got int"),
        (
            {"query": "cat \ud800"},
            "query: lone surrogate '\\ud800' at index 4 (text must be valid Unicode)",
        ),
        ({"limit": 0}, "limit: 0 is not an integer from 1 to 25"),
        ({"limit": 26}, "limit: 26 is not an integer from 1 to 25"),
        ({"limit": True}, "limit: True is not an integer from 1 to 25"),
        ({"match": "fuzzy"}, "match: 'fuzzy' is not one of 'phrase', 'prefix'"),
        ({"caller": None}, "caller: expected a string, got NoneType"),
        ({"caller": "agent:BAD:main"}, "caller: 'agent:BAD:main'"),
        ({"session_key": 3}, "session_key: expected a string, got int"),
    ],
)
async def test_bad_arguments_are_clear_errors(
    mem: am.Memory, kw: dict[str, object], error: str
) -> None:
    args: dict[str, object] = {"query": "hello", "caller": KEY} | kw
    query = args.pop("query")
    with pytest.raises(am.InvalidInputError) as info:
        await mem.sessions.search(query, **args)  # type: ignore[arg-type]
    assert str(info.value).startswith(error)


async def test_query_of_exactly_4096_characters_is_accepted(mem: am.Memory) -> None:
    res = await mem.sessions.search("a" * 4096, caller=KEY)
    assert res.results == ()


async def test_a_reply_is_found_by_the_words_of_the_message_before_it(
    mem: am.Memory, storage: str | None
) -> None:
    sqlite_only(storage, "reads the context column of the SQLite index's own tables")
    await mem.sessions.append(KEY, user("Which museum did you visit in Lisbon?"))
    reply = await mem.sessions.append(KEY, assistant("The tile one, it was wonderful."))
    other = await put(mem, assistant("A wonderful day, truly."))
    found = await search(mem, "museum Lisbon wonderful")
    assert found.index(reply.id) < found.index(other.id)
    db_tokens = indexed_tokens(agent_db(mem.state_dir), column="context")
    assert db_tokens[reply.id] == tokenize("Which museum did you visit in Lisbon?")
    assert db_tokens[reply.id - 1] == []  # the first message has no context


@pytest.fixture
def small_prune_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prune common terms in a tiny index, so the rule is testable without 20k rows."""
    from activememory.storage import search as storage_search

    monkeypatch.setattr(storage_search, "MIN_ROWS_TO_PRUNE", 10)
    monkeypatch.setattr(storage_search, "COMMON_FRACTION", 0.3)


async def test_common_terms_are_left_out_when_rarer_ones_exist(
    mem: am.Memory, small_prune_threshold: None
) -> None:
    plain = [(await put(mem, user(f"common chatter {i}"))).id for i in range(30)]
    rare = [(await put(mem, user(f"common zephyr {i}"))).id for i in range(3)]
    # "common" is in every message: "zephyr" ranks first; the common term alone then fills
    # the rest, newest first (terms are OR-ed: a query whose rare word matches little or
    # nothing still finds the others).
    found = await search(mem, "common zephyr", limit=25)
    assert set(found[:3]) == set(rare)
    assert found[3:] == plain[::-1][:22]
    # Only common terms: newest first (BM25 could not tell them apart anyway).
    newest = await search(mem, "common", limit=5)
    assert newest == (plain + rare)[::-1][:5]


async def test_a_rare_word_found_nowhere_does_not_hide_the_common_ones(
    mem: am.Memory, small_prune_threshold: None
) -> None:
    # Found by the load soak: pruning left only the rare term, which matched nothing.
    plain = [(await put(mem, user(f"coffee hiking {i}"))).id for i in range(30)]
    assert await search(mem, "coffee hiking zyxwv", limit=5) == plain[::-1][:5]


async def test_only_common_terms_put_messages_holding_all_of_them_first(
    mem: am.Memory, small_prune_threshold: None
) -> None:
    both = [(await put(mem, user(f"alpha beta {i}"))).id for i in range(15)]
    alpha = [(await put(mem, user(f"alpha only {i}"))).id for i in range(15)]
    beta = [(await put(mem, user(f"beta only {i}"))).id for i in range(15)]
    found = await search(mem, "alpha beta", limit=25)
    assert found[:15] == both[::-1]
    assert set(found[15:]) <= set(alpha + beta)


@pytest.fixture
def small_rank_budget(monkeypatch: pytest.MonkeyPatch, small_prune_threshold: None) -> None:
    """An agent-wide search ranks at most 5 rows; "every term first" looks at the newest 20."""
    from activememory.storage import search as storage_search
    from activememory.storage.pg import search as pg_search

    monkeypatch.setattr(storage_search, "RANK_BUDGET", 5)
    # PostgreSQL's own budget is a share of it (storage/pg/search.py): the same 5 rows here.
    monkeypatch.setattr(pg_search, "RANK_BUDGET_DIVISOR", 1)
    monkeypatch.setattr(storage_search, "RECENCY_WIDE", 20)


async def test_over_the_rank_budget_a_message_holding_only_the_rarest_term_comes_first(
    mem: am.Memory, small_rank_budget: None
) -> None:
    for i in range(40):
        await put(mem, user(f"filler chatter {i}"))
    # "kestrel" (12 rows) is not common, but with "zephyr" it is over the budget: only the
    # rarer term is ranked, and the kestrel messages follow newest first, whatever BM25
    # would say of the older ones that repeat it.
    kestrel = [(await put(mem, user("kestrel kestrel kestrel"))).id for _ in range(6)]
    kestrel += [(await put(mem, user(f"kestrel seen {i}"))).id for i in range(6)]
    zephyr = [(await put(mem, user(f"zephyr alone {i}"))).id for i in range(2)]
    found = await search(mem, "kestrel zephyr", limit=14)
    assert set(found[:2]) == set(zephyr)
    assert found[2:] == kestrel[::-1]


async def test_a_rarest_term_over_the_budget_is_ranked_over_its_newest_matches(
    mem: am.Memory, small_rank_budget: None
) -> None:
    for i in range(60):
        await put(mem, user(f"other chatter {i}"))
    strong = await mem.sessions.append(KEY, user("heron heron heron heron heron heron"))
    for i in range(10):
        await mem.sessions.append(KEY, user(f"heron {i}"))
        await mem.sessions.append(KEY, user(f"filler {i}"))
    # Agent-wide: BM25 among the newest 5 rows holding "heron" (the budget), then the rest
    # newest first; the oldest, strongest match is not among the first five.
    assert strong.id not in await search(mem, "heron", limit=5)
    # A small scope reads only its own rows: ranked in full, the strongest first.
    assert (await search(mem, "heron", limit=5, session_key=KEY))[0] == strong.id


async def test_over_the_budget_messages_holding_every_term_come_first_among_the_newest(
    mem: am.Memory, small_rank_budget: None
) -> None:
    alpha = [(await put(mem, user(f"alpha only {i}"))).id for i in range(20)]
    beta = [(await put(mem, user(f"beta only {i}"))).id for i in range(20)]
    recent = [(await put(mem, user(text))).id for text in ("alpha x", "alpha beta 1", "beta y")]
    both = [(await put(mem, user("alpha beta 2"))).id, recent[1]]
    found = await search(mem, "alpha beta", limit=6)
    # Every term first (newest first), then the newest holding any.
    assert found == [*both, recent[2], recent[0], beta[-1], beta[-2]]
    assert alpha  # older than the newest 20: never looked at for "every term"


async def test_indexed_rows_reads_the_index_totals(mem: am.Memory, storage: str | None) -> None:
    sqlite_only(storage, "reads FTS5's totals from the SQLite file")
    from activememory.storage.search import indexed_rows

    for i in range(300):
        await mem.sessions.append(KEY, user(f"message {i}"))
    await mem.sessions.append(KEY, am.Message(role="tool", content="not indexed"))
    conn = connect(agent_db(mem.state_dir))
    try:
        assert indexed_rows(conn) == 300
    finally:
        conn.close()
