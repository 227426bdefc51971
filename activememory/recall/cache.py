"""The recall cache and the circuit breaker (docs/design.md §4.10). Owned by the recall coordinator.

Both run on the event loop's clock (`anyio.current_time()`), so virtual-time simulations
see exact expiries, and both are bounded maps (least recently used out first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Literal

import msgspec

from ..protocol.recall import RecallOutcome

CACHE_ENTRIES = 1024
BREAKER_KEYS = 256

BreakerState = Literal["closed", "open", "half_open"]


class RecallCache:
    """Grounded `ok` outcomes by everything that changes what recall may see or who answers."""

    def __init__(self, max_entries: int = CACHE_ENTRIES) -> None:
        self._entries: OrderedDict[str, tuple[float, RecallOutcome]] = OrderedDict()
        self.max_entries = max_entries
        self.hits = 0

    @staticmethod
    def key(*parts: object) -> str:
        """A digest of the parts: agent, session, query text, model, tools, slot, scope..."""
        return hashlib.sha256(msgspec.json.encode(parts)).hexdigest()

    def get(self, key: str, now: float) -> RecallOutcome | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, outcome = found
        if now >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return outcome

    def put(self, key: str, outcome: RecallOutcome, *, now: float, ttl_s: float) -> None:
        self._entries[key] = (now + ttl_s, outcome)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


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
