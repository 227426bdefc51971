"""Records search configs (docs/design.md §5.5): token budgets, top-k and reranking, pruning, judges."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest
from chat_server import Answer, Malformed, Status, serve

import activememory as am
from activememory._record_search import (
    LocalJudge,
    OpenAIJudge,
    apply_budgets,
    probe_positions,
    protected_count,
    verdicts,
)
from activememory.protocol.record_results import RecordSearchResult, estimate_tokens
from activememory.protocol.records import (
    MemorySearchConfig,
    PruningEvaluationMode,
    PruningMemorySearchConfig,
    RankingError,
    Record,
    RecordResultFormatConfig,
    TopKMemorySearchConfig,
)

from pg_server import pg_memory_dsn, storage

pytestmark = pytest.mark.anyio
__all__ = ["pg_memory_dsn", "storage"]


# Text only: these tests pin the full-text ranking and `distance`; by meaning is
# tests/test_records_hybrid.py.
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


@pytest.fixture
async def mem(tmp_path: Path, executor: str, storage: str | None) -> AsyncIterator[am.Memory]:
    async with am.open_memory(
        tmp_path / "state", executor=executor, config=TEXT_ONLY, storage=storage
    ) as memory:  # type: ignore[arg-type]
        yield memory


def result(i: int, chars: int = 0) -> RecordSearchResult:
    record = Record(id=f"r{i}", content="x" * chars or f"record {i}", timestamp=0.0)
    return RecordSearchResult(record=record, distance=i / 100)


def sized(*token_counts: int) -> list[RecordSearchResult]:
    """Results whose formatted text is exactly these many tokens each."""
    out = []
    for i, tokens in enumerate(token_counts):
        base = len(result(i, 1).formatted_content) - 1
        out.append(result(i, tokens * 4 - base))
        assert estimate_tokens(out[-1].formatted_content) == tokens
    return out


def test_token_estimate_is_characters_over_four_rounded_up() -> None:
    assert [estimate_tokens("x" * n) for n in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_soft_budget_keeps_up_to_the_first_result_that_reaches_it() -> None:
    rs = sized(100, 50, 50, 50)
    assert apply_budgets(rs, None, 10) == rs[:1]  # the first is larger: still kept
    assert apply_budgets(rs, None, 100) == rs[:1]  # reached exactly
    assert apply_budgets(rs, None, 101) == rs[:2]
    assert apply_budgets(rs, None, 150) == rs[:2]
    assert apply_budgets(rs, None, 1000) == rs


def test_hard_budget_keeps_results_while_they_fit() -> None:
    rs = sized(100, 50, 50, 50)
    assert apply_budgets(rs, 99, None) == []  # the first does not fit: nothing
    assert apply_budgets(rs, 100, None) == rs[:1]
    assert apply_budgets(rs, 199, None) == rs[:2]
    assert apply_budgets(rs, 250, None) == rs
    assert apply_budgets([], 1, 1) == []


def test_both_budgets_keep_the_shorter_prefix() -> None:
    rs = sized(100, 50, 50, 50)
    assert apply_budgets(rs, 199, 1000) == rs[:2]  # hard is stricter
    assert apply_budgets(rs, 1000, 120) == rs[:2]  # soft is stricter
    assert apply_budgets(rs, 99, 10) == []  # the hard budget forbids even the first
    assert apply_budgets(rs, 150, 150) == rs[:2]  # reaching both at once: kept


async def test_budgets_count_the_formatted_text_with_its_linked_context(mem: am.Memory) -> None:
    a = await mem.records.add("seat one " + "word " * 40, user_id="u1")
    b = await mem.records.add("seat two", user_id="u1")
    await mem.records.link(a, b, relation="r")
    flat = await mem.records.search("seat", user_id="u1", num_hops=0)
    assert {h.id for h in flat} == {a, b}
    both = sum(estimate_tokens(h.formatted_content) for h in flat)
    hard = MemorySearchConfig(token_budget=both)
    assert len(await mem.records.search("seat", user_id="u1", config=hard)) == 2
    # With its linked record each result's text is longer: the same budget holds fewer.
    assert len(await mem.records.search("seat", user_id="u1", num_hops=1, config=hard)) < 2
    full = await mem.records.search("seat", user_id="u1", num_hops=1)
    first = estimate_tokens(full[0].formatted_content)
    assert first > estimate_tokens(next(h for h in flat if h.id == full[0].id).formatted_content)
    exact = MemorySearchConfig(token_budget=first)
    linked = await mem.records.search("seat", user_id="u1", num_hops=1, config=exact)
    assert [h.id for h in linked] == [full[0].id] and linked[0].linked_results
    # Budgets count with the search's format_config: showing more costs more.
    more = RecordResultFormatConfig(show_user_id=True, show_distance=True)
    counted = await mem.records.search("seat", user_id="u1", config=hard, format_config=more)
    assert len(counted) == 1 and 'user_id="u1"' in counted[0].formatted_content


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: MemorySearchConfig(token_budget=0), r"^token_budget: 0 is not an integer of at least 1$"),
        (lambda: MemorySearchConfig(soft_token_budget=-3), r"^soft_token_budget: -3 is not an integer"),
        (lambda: TopKMemorySearchConfig(max_results=0), r"^max_results: 0 is not an integer of at least 1$"),
        (lambda: TopKMemorySearchConfig(reranker_max_candidates=0), r"^reranker_max_candidates: 0 "),
        (lambda: TopKMemorySearchConfig(reranker=object()), r"^reranker: expected a Reranker"),
        (
            lambda: PruningMemorySearchConfig(
                evaluation_mode=PruningEvaluationMode.EXHAUSTIVE, num_probe_points=4
            ),
            r"^num_probe_points: not allowed with evaluation_mode EXHAUSTIVE "
            r"\(it judges every candidate\)$",
        ),
        (lambda: PruningMemorySearchConfig(num_probe_points=1), r"^num_probe_points: 1 is not an integer of at least 2$"),
        (lambda: PruningMemorySearchConfig(protected_fraction=1.5), r"^protected_fraction: 1.5 is not a number from 0 to 1$"),
        (lambda: PruningMemorySearchConfig(evaluation_mode="slow"), r"^evaluation_mode: 'slow' is not one of 'EXHAUSTIVE', 'EXTENDED', 'FAST'$"),
        (lambda: PruningMemorySearchConfig(llm="gpt"), r"^llm: expected a Judge"),
        (lambda: RecordResultFormatConfig(show_role="yes"), r"^show_role: expected True or False, got 'yes'$"),
    ],
)  # fmt: skip
def test_bad_config_values_name_the_field(make: Any, message: str) -> None:
    with pytest.raises(am.InvalidInputError, match=message):
        make()


# -- top-k and reranking --------------------------------------------------------------------


class Reverse:
    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    async def rerank(
        self, query: str, results: Sequence[RecordSearchResult]
    ) -> Sequence[RecordSearchResult]:
        self.seen.append([r.id for r in results])
        return list(reversed(results))


async def ranked(mem: am.Memory, n: int) -> list[str]:
    """n records whose store order is known: more "seat"s rank higher."""
    for i in range(n):
        await mem.records.add(" ".join(["seat"] * (n - i) + ["filler"] * 5), user_id="u1")
    hits = await mem.records.search(
        "seat", user_id="u1", config=TopKMemorySearchConfig(max_results=n)
    )
    return [h.id for h in hits]


async def test_top_k_reranks_only_the_first_candidates(mem: am.Memory) -> None:
    order = await ranked(mem, 6)
    reverse = Reverse()
    config = TopKMemorySearchConfig(max_results=5, reranker=reverse, reranker_max_candidates=3)
    hits = await mem.records.search("seat", user_id="u1", config=config)
    assert reverse.seen == [order[:3]]
    assert [h.id for h in hits] == [order[2], order[1], order[0], order[3], order[4]]


async def test_a_reranker_that_invents_results_fails_the_search(mem: am.Memory) -> None:
    await ranked(mem, 2)

    class Liar:
        async def rerank(self, query: str, results: Sequence[RecordSearchResult]) -> list[Any]:
            return [result(99)]

    # Users catch it by its public name (`am.RankingError`), like every error they can meet.
    with pytest.raises(am.RankingError, match=r"^reranker: returned a result it was not given"):
        await mem.records.search(
            "seat", user_id="u1", config=TopKMemorySearchConfig(reranker=Liar())
        )
    assert am.RankingError is RankingError


# -- pruning --------------------------------------------------------------------------------


class Threshold:
    """Keeps candidates whose index (in `r<i>`) is below `keep_below`; records its calls."""

    def __init__(self, keep_below: int) -> None:
        self.keep_below = keep_below
        self.calls: list[list[int]] = []

    async def judge(self, query: str, candidates: Sequence[RecordSearchResult]) -> list[bool]:
        idx = [int(c.id[1:]) for c in candidates]
        self.calls.append(idx)
        return [i < self.keep_below for i in idx]


def test_probe_positions_are_evenly_spaced_with_both_ends() -> None:
    assert probe_positions(10, 3) == [0, 5, 9]
    assert probe_positions(10, 5) == [0, 2, 5, 7, 9]
    assert probe_positions(3, 5) == [0, 1, 2]
    assert protected_count(0.1, 10) == 1 and protected_count(0.7, 10) == 7
    assert protected_count(0.15, 10) == 2 and protected_count(0.0, 10) == 0


async def test_fast_judges_the_probes_once_and_follows_the_nearer_one() -> None:
    cands = [result(i) for i in range(10)]
    judge = Threshold(keep_below=4)
    got = await verdicts("q", cands, judge, PruningEvaluationMode.FAST, 3)
    assert judge.calls == [[0, 5, 9]]
    # 1, 2 are nearer probe 0 (keep); 3 and 4 nearer probe 5 (drop).
    assert got == [True, True, True] + [False] * 7


async def test_extended_also_judges_where_probes_disagree() -> None:
    cands = [result(i) for i in range(10)]
    judge = Threshold(keep_below=4)
    got = await verdicts("q", cands, judge, PruningEvaluationMode.EXTENDED, 5)
    assert judge.calls == [[0, 2, 5, 7, 9], [3, 4]]
    assert got == [True] * 4 + [False] * 6


async def test_exhaustive_judges_every_candidate() -> None:
    cands = [result(i) for i in range(6)]
    judge = Threshold(keep_below=2)
    got = await verdicts("q", cands, judge, PruningEvaluationMode.EXHAUSTIVE, None)
    assert judge.calls == [[0, 1, 2, 3, 4, 5]] and got == [True, True] + [False] * 4


async def test_protected_fraction_keeps_the_top_share_unjudged(mem: am.Memory) -> None:
    order = await ranked(mem, 10)

    class DropAll:
        def __init__(self) -> None:
            self.judged: list[str] = []

        async def judge(self, query: str, candidates: Sequence[RecordSearchResult]) -> list[bool]:
            self.judged += [c.id for c in candidates]
            return [False] * len(candidates)

    judge = DropAll()
    config = PruningMemorySearchConfig(
        evaluation_mode=PruningEvaluationMode.EXHAUSTIVE, protected_fraction=0.25, llm=judge
    )
    hits = await mem.records.search("seat", user_id="u1", config=config)
    assert [h.id for h in hits] == order[:3]  # ceil(0.25 x 10) = 3
    assert judge.judged == order[3:]


async def test_pruning_search_with_the_default_local_judge(mem: am.Memory) -> None:
    three = await mem.records.add("window seat on the train", user_id="u1")
    two = await mem.records.add("a window seat", user_id="u1")
    await mem.records.add("seat belt sign", user_id="u1")  # 1 of 3 terms: below 0.5
    config = PruningMemorySearchConfig(protected_fraction=0.0)
    hits = await mem.records.search("window seat train", user_id="u1", config=config)
    assert [h.id for h in hits] == [three, two]
    strict = PruningMemorySearchConfig(protected_fraction=0.0, llm=LocalJudge(min_overlap=1.0))
    hits = await mem.records.search("window seat train", user_id="u1", config=strict)
    assert [h.id for h in hits] == [three]


async def test_a_judge_with_the_wrong_number_of_verdicts_fails() -> None:
    class Short:
        async def judge(self, query: str, candidates: Sequence[RecordSearchResult]) -> list[bool]:
            return [True]

    with pytest.raises(RankingError, match=r"^judge: answered 1 verdicts for 3 candidates$"):
        await verdicts("q", [result(i) for i in range(3)], Short(), PruningEvaluationMode.FAST, 3)


# -- the OpenAI-compatible judge -------------------------------------------------------------


async def test_openai_judge_asks_the_endpoint_and_reads_its_verdicts() -> None:
    cands = [result(0), result(1), result(2)]
    secret = RecordSearchResult(
        record=Record(id="s", content="token=abcd1234efgh5678ijkl", timestamp=0.0)
    )
    with serve(
        [
            Answer(content='{"keep": [true, false, true]}'),
            Answer(content='```json\n["keep", "drop"]\n```'),
        ]
    ) as server:
        async with OpenAIJudge("judge-model", base_url=server.base_url, api_key="k-1") as judge:
            assert await judge.judge("which records?", cands) == [True, False, True]
            assert await judge.judge("q", [cands[0], secret]) == [True, False]
            assert await judge.judge("q", []) == []
    first, second = server.requests
    assert first.path == "/v1/chat/completions"
    assert first.headers["authorization"] == "Bearer k-1"
    body = first.body
    assert body["model"] == "judge-model" and body["messages"][0]["role"] == "system"
    assert '"query": "which records?"' in body["messages"][1]["content"]
    assert '"text": "record 1"' in body["messages"][1]["content"]
    assert "abcd1234efgh5678ijkl" not in second.body["messages"][1]["content"]


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (
            Status(500),
            r"^judge judge-model: the provider answered 500 Internal Server Error: "
            r'\{"error": \{"message": "try again later"\}\}$',
        ),
        (Malformed(), r"^judge judge-model: the answer is not valid JSON \(Expecting value"),
        (Answer(content="maybe"), r"^judge judge-model: the verdicts are not JSON: 'maybe'$"),
        (Answer(content='{"keep": [true]}'), r"^judge judge-model: answered 1 verdicts for 2 "),
        (
            Answer(content='{"keep": [1, 0]}'),
            r"^judge judge-model: verdict 1 is not true or false$",
        ),
        (Answer(content="{}"), r'^judge judge-model: the verdicts are not \{"keep": \[...\]\}$'),
    ],
)
async def test_openai_judge_failures_are_ranking_errors(step: Any, message: str) -> None:
    with serve([step]) as server:
        async with OpenAIJudge("judge-model", base_url=server.base_url) as judge:
            with pytest.raises(RankingError, match=message):
                await judge.judge("q", [result(0), result(1)])


async def test_openai_judge_prunes_a_search(mem: am.Memory) -> None:
    order = await ranked(mem, 4)
    with serve([Answer(content='{"keep": [false, true, false]}')]) as server:
        async with OpenAIJudge("m", base_url=server.base_url) as judge:
            config = PruningMemorySearchConfig(
                evaluation_mode=PruningEvaluationMode.EXHAUSTIVE, llm=judge, protected_fraction=0.2
            )
            hits = await mem.records.search("seat", user_id="u1", config=config)
    assert [h.id for h in hits] == [order[0], order[2]]


async def test_openai_judge_times_out_as_a_ranking_error() -> None:
    from chat_server import Hang

    with serve([Hang()]) as server:
        async with OpenAIJudge("m", base_url=server.base_url, timeout=0.2) as judge:
            with anyio.fail_after(5), pytest.raises(RankingError, match=r"no answer within 0.2 s$"):
                await judge.judge("q", [result(0)])
