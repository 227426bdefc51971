"""The recall circuit breaker (docs/design.md §4.10), owned by the recall coordinator.

It runs on the event loop's clock (`anyio.current_time()`), so virtual-time simulations see
exact cooldowns, and it is a bounded map (least recently used out first).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Literal

import msgspec

BREAKER_KEYS = 256

BreakerState = Literal["closed", "open", "half_open"]


class BreakerInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One breaker's visible state (for the status line, `doctor`, tests)."""

    agent: str
    model: str
    state: BreakerState
    consecutive_timeouts: int
    reopens_in_ms: float | None  # open: time until the next probe is allowed


class _Breaker:
    __slots__ = ("consecutive", "open_until", "probing")

    def __init__(self) -> None:
        self.consecutive = 0
        self.open_until: float | None = None
        self.probing = False


class CircuitBreakers:
    """Per agent + recall model: after N consecutive budget timeouts, skip recall.

    Decisions (README "Circuit breaker"):
    - Timeouts count as consecutive however far apart the turns are: only a completed run
      resets the count, so a model that always times out trips at normal turn spacing.
    - Open: every recall is skipped until the cooldown has passed.
    - Half-open after the cooldown: exactly one recall runs as a probe (others are skipped
      while it runs); it completing closes the breaker, it timing out opens it again for
      another cooldown. A probe that fails (an error, not a timeout) lets the next turn
      probe again.
    """

    def __init__(self, max_keys: int = BREAKER_KEYS) -> None:
        self._states: OrderedDict[tuple[str, str], _Breaker] = OrderedDict()
        self.max_keys = max_keys
        self.trips = 0

    def _get(self, key: tuple[str, str]) -> _Breaker:
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = _Breaker()
            while len(self._states) > self.max_keys:
                self._states.popitem(last=False)
        self._states.move_to_end(key)
        return state

    def allow(self, key: tuple[str, str], now: float) -> bool:
        """May a recall run now? Marks the probe when half-open."""
        state = self._states.get(key)
        if state is None or state.open_until is None:
            return True
        if now < state.open_until or state.probing:
            return False
        state.probing = True
        return True

    def record(
        self, key: tuple[str, str], status: str, now: float, *, max_timeouts: int, cooldown_s: float
    ) -> None:
        """Count a run that ran: a timeout (partial or not), a failure, or a completed run."""
        if status in ("timeout", "timeout_partial"):
            self.record_timeout(key, now, max_timeouts=max_timeouts, cooldown_s=cooldown_s)
        elif status == "failed":
            self.record_failed(key)
        else:
            self.record_completed(key)

    def record_timeout(
        self, key: tuple[str, str], now: float, *, max_timeouts: int, cooldown_s: float
    ) -> None:
        state = self._get(key)
        state.consecutive += 1
        if state.probing or state.consecutive >= max_timeouts:
            if state.open_until is None or state.probing:
                self.trips += 1
            state.open_until = now + cooldown_s
            state.probing = False

    def record_completed(self, key: tuple[str, str]) -> None:
        state = self._states.get(key)
        if state is not None:
            state.consecutive = 0
            state.open_until = None
            state.probing = False

    def record_failed(self, key: tuple[str, str]) -> None:
        state = self._states.get(key)
        if state is not None:
            state.probing = False

    def info(self, now: float) -> list[BreakerInfo]:
        out = []
        for (agent, model), state in self._states.items():
            if state.open_until is None:
                kind: BreakerState = "closed"
                left = None
            elif now < state.open_until:
                kind, left = "open", (state.open_until - now) * 1000
            else:
                kind, left = "half_open", 0.0
            out.append(
                BreakerInfo(
                    agent=agent,
                    model=model,
                    state=kind,
                    consecutive_timeouts=state.consecutive,
                    reopens_in_ms=left,
                )
            )
        return out
