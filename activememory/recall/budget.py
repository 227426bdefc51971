"""`RecallBudget`: the deadlines of one recall run (docs/design.md §4.9).

A preflight of at most `PREFLIGHT_S`; then the work, `timeoutMs + setupGraceTimeoutMs`
from the end of the preflight (the run is cancelled at `deadline`); then the finalize
window of `FINALIZE_S` in which the coordinator still waits for the run's report. Times are
absolute, on the event loop's clock (`anyio.current_time()`).
"""

from __future__ import annotations

import msgspec

PREFLIGHT_S = 1.5
FINALIZE_S = 1.5


class RecallBudget(msgspec.Struct, frozen=True, kw_only=True):
    """When one run's work ends (`deadline`) and when its report is no longer awaited."""

    work_s: float
    deadline: float
    finalize_deadline: float

    @classmethod
    def after_preflight(
        cls, now: float, *, timeout_ms: int, setup_grace_timeout_ms: int
    ) -> RecallBudget:
        """The budget of a run whose preflight ended at `now`."""
        work_s = (timeout_ms + setup_grace_timeout_ms) / 1000
        return cls(
            work_s=work_s, deadline=now + work_s, finalize_deadline=now + work_s + FINALIZE_S
        )
