"""The recall pool dialog (docs/design.md §1.2): run a recall sub-agent, and its report.

Sent by the recall coordinator (`activememory.recall.coordinator`), received by
`activememory.actors.recall_pool`. The coordinator never waits for a run to end: it waits
for a `RunReport` on the job's one-slot reply channel, until the finalize deadline, and
then stops waiting whatever the run is doing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from .recall import RecallRequest

if TYPE_CHECKING:  # the recall runtime imports this module; msgspec resolves these lazily
    from anyio.streams.memory import MemoryObjectSendStream

    from ..recall.budget import RecallBudget
    from ..recall.tools import RecallModel, RecallTools


class RunRecall(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="run"):
    """Coordinator → pool: run `model` on `request` with `tools`; report on `reply`.

    `budget.deadline` (also `request.deadline`) ends the recall work: the run is cancelled
    then, and its synchronous finalize sends the report; the coordinator waits for it until
    `budget.finalize_deadline`. In-process only: `model`, `tools` and `reply` (one slot) are
    live objects, never encoded.
    """

    run_id: str
    request: RecallRequest
    budget: RecallBudget
    model: RecallModel
    tools: RecallTools
    reply: MemoryObjectSendStream[RunReport]


class RunReport(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", tag="report"):
    """Pool → coordinator: how one run ended.

    `answer` is what the model returned (None if it raised or was cancelled), `answer_at`
    when; `error` what it raised; `cancelled` whether the work budget cancelled it;
    `draft`/`draft_at` the last draft it offered; `evidence` whether any tool call of the
    run returned recall evidence.
    """

    run_id: str
    answer: str | None = None
    answer_at: float | None = None
    error: str | None = None
    cancelled: bool = False
    draft: str | None = None
    draft_at: float | None = None
    evidence: bool = False
    tool_calls: int = 0
