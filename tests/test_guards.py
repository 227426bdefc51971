"""The recall cache and the circuit breaker (docs/design.md §4.10), on an explicit clock."""

from __future__ import annotations

from activememory.protocol.recall import RecallOutcome
from activememory.recall.breaker import CircuitBreakers
from activememory.recall.cache import RecallCache

KEY = ("main", "sim/model")


def trip(breakers: CircuitBreakers, at: float, n: int = 3) -> None:
    for i in range(n):
        assert breakers.allow(KEY, at + i)
        breakers.record_timeout(KEY, at + i, max_timeouts=3, cooldown_s=60)


def state(breakers: CircuitBreakers, now: float) -> tuple[str, int]:
    (info,) = breakers.info(now)
    return info.state, info.consecutive_timeouts


def test_trips_however_far_apart_the_timeouts_are() -> None:
    breakers = CircuitBreakers()
    for at in (0, 3600, 7200):  # an hour apart, far beyond the cooldown
        assert breakers.allow(KEY, at)
        breakers.record_timeout(KEY, at, max_timeouts=3, cooldown_s=60)
    assert state(breakers, 7200) == ("open", 3)
    assert not breakers.allow(KEY, 7259.9)
    assert breakers.trips == 1


def test_completed_run_resets_the_count() -> None:
    breakers = CircuitBreakers()
    trip(breakers, 0, n=2)
    breakers.record_completed(KEY)
    trip(breakers, 10, n=2)
    assert state(breakers, 12) == ("closed", 2)


def test_half_open_allows_exactly_one_probe() -> None:
    breakers = CircuitBreakers()
    trip(breakers, 0)
    assert state(breakers, 62) == ("half_open", 3)
    assert breakers.allow(KEY, 62)  # the probe
    assert not breakers.allow(KEY, 62.5)  # others wait for it
    breakers.record_completed(KEY)
    assert state(breakers, 63) == ("closed", 0)
    assert breakers.allow(KEY, 63)


def test_probe_that_times_out_reopens_for_a_cooldown() -> None:
    breakers = CircuitBreakers()
    trip(breakers, 0)
    assert breakers.allow(KEY, 100)
    breakers.record_timeout(KEY, 115, max_timeouts=3, cooldown_s=60)
    assert state(breakers, 115) == ("open", 4)
    assert not breakers.allow(KEY, 174.9)
    assert breakers.allow(KEY, 175)
    assert breakers.trips == 2


def test_probe_that_fails_lets_the_next_turn_probe() -> None:
    breakers = CircuitBreakers()
    trip(breakers, 0)
    assert breakers.allow(KEY, 100)
    breakers.record_failed(KEY)
    assert breakers.allow(KEY, 101)


def test_breaker_map_is_bounded() -> None:
    breakers = CircuitBreakers(max_keys=4)
    for i in range(10):
        breakers.record_timeout(("main", f"m/{i}"), 0, max_timeouts=3, cooldown_s=60)
    assert [i.model for i in breakers.info(0)] == ["m/6", "m/7", "m/8", "m/9"]


def test_cache_ttl_and_bound() -> None:
    cache = RecallCache(max_entries=2)
    outcome = RecallOutcome(status="ok", summary="s")
    cache.put("a", outcome, now=0, ttl_s=15)
    assert cache.get("a", 14.999) is outcome
    assert cache.get("a", 15.0) is None
    for key in ("x", "y", "z"):
        cache.put(key, outcome, now=0, ttl_s=15)
    assert len(cache) == 2 and cache.get("x", 1) is None and cache.get("z", 1) is outcome


def test_cache_key_changes_with_every_part() -> None:
    parts = ("main", "agent:main:direct:a", "ctx", "q", "local/extractive", ("memory_search",))
    base = RecallCache.key(*parts)
    for i in range(len(parts)):
        changed = list(parts)
        changed[i] = ("other",) if isinstance(parts[i], tuple) else f"{parts[i]}!"
        assert RecallCache.key(*changed) != base
