"""The recall cache (docs/design.md §4.10), owned by the recall coordinator.

It runs on the event loop's clock (`anyio.current_time()`), so virtual-time simulations see
exact expiries, and it is a bounded map (least recently used out first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Generic, TypeVar

import msgspec

CACHE_ENTRIES = 1024
T = TypeVar("T")


class RecallCache(Generic[T]):
    """Grounded `ok` results by everything that changes what recall may see or who answers."""

    def __init__(self, max_entries: int = CACHE_ENTRIES) -> None:
        self._entries: OrderedDict[str, tuple[float, T]] = OrderedDict()
        self.max_entries = max_entries
        # Bumped by `clear`: a run that started before it must not put what it found.
        self.generation = 0

    def clear(self) -> None:
        """Forget every entry, and refuse `put`s of runs that started before (an erase:
        nothing found before it may be served after it, docs/design.md §2.6)."""
        self._entries.clear()
        self.generation += 1

    @staticmethod
    def key(*parts: object) -> str:
        """A digest of the parts: agent, session, query text, model, tools, slot, scope..."""
        return hashlib.sha256(msgspec.json.encode(parts)).hexdigest()

    def get(self, key: str, now: float) -> T | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, outcome = found
        if now >= expires:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return outcome

    def put(
        self, key: str, outcome: T, *, now: float, ttl_s: float, generation: int | None = None
    ) -> None:
        """Keep `outcome` for `ttl_s`, unless the cache was cleared since `generation` (the
        `generation` read when the run started)."""
        if generation is not None and generation != self.generation:
            return
        self._entries[key] = (now + ttl_s, outcome)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def live(self, now: float) -> int:
        """How many entries have not expired at `now`."""
        return sum(1 for expires, _ in self._entries.values() if now < expires)

    def __len__(self) -> int:
        return len(self._entries)
