"""The deterministic timeout simulations (docs/design.md §7): exact virtual times, same trace twice."""

from __future__ import annotations

import pytest

from activememory.simulations.timeouts import run_scenario, scenarios

SCENARIOS = scenarios()


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario_meets_its_exact_times_and_states(scenario: object) -> None:
    result = run_scenario(scenario)  # type: ignore[arg-type]
    assert result.problems == []
    for turn in result.results:
        # The promise: back by timeoutMs + setupGraceTimeoutMs + 3000 ms, whatever the model.
        assert turn.returned_at - turn.at <= result.bound_s


def test_same_scenario_same_trace_byte_for_byte() -> None:
    for scenario in scenarios():
        first = run_scenario(scenario).trace
        second = run_scenario(scenario).trace
        assert first == second, scenario.name


def test_breaker_skip_is_visible_in_the_status_line() -> None:
    (scenario,) = [s for s in scenarios() if s.name == "circuit breaker"]
    result = run_scenario(scenario)
    skipped = result.results[3]
    assert skipped.status == "timeout" and skipped.elapsed_ms == 0.0
    assert skipped.status_line.endswith(" circuit-breaker")
    assert "circuit-breaker" not in result.results[2].status_line


def test_cached_turn_says_so_in_the_status_line() -> None:
    (scenario,) = [s for s in scenarios() if s.name == "cache"]
    result = run_scenario(scenario)
    assert result.results[1].status_line.endswith(" cached")
