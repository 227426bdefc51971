"""`activememory bench search` at a tiny size: it runs, checks every answer against the raw
index (the pruned steps included), and reports the flat-tail target and both floors."""

from __future__ import annotations

import json

import pytest

from activememory.simulations.bench import search as bench_search
from activememory.storage import search as search_storage

TINY = ["--messages", "3000", "--sessions", "30", "--vocab", "2000", "--queries", "24"]
TINY += ["--warmup", "2", "--floor-every", "3", "--settings", "agent,tree+2", "--json"]


@pytest.mark.parametrize("budget", [1500, 40], ids=["budget-default", "budget-40"])
def test_pruned_search_answers_agree_with_the_raw_index(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    # Pruning, the rank budget, its window and "every term first" at a tiny size; the
    # benchmark raises (exit 1) on any answer the raw index contradicts.
    monkeypatch.setattr(search_storage, "MIN_ROWS_TO_PRUNE", 100)
    monkeypatch.setattr(search_storage, "COMMON_FRACTION", 0.05)
    monkeypatch.setattr(search_storage, "RANK_BUDGET", budget)
    assert bench_search.main(TINY) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["targets"]["tail_ratio_max"] == bench_search.TARGET_TAIL_RATIO
    assert result["queries"]["floor_every"] == 3
    for setting in result["settings"]:
        assert setting["queries"] == 24 and setting["mean_results"] > 0
        assert setting["raw_pruned_ms"]["p50"] > 0 and setting["raw_or_ms"]["p50"] > 0
        assert isinstance(setting["pass_tail_ratio"], bool)
        assert setting["tail_ratio"] > 0
        assert setting["core_cpu_ms"]["p50"] > 0 and setting["core_cpu_tail_ratio"] > 0
