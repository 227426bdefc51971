"""The recall pool: runs recall sub-agents under their budget (docs/design.md §1.2, §4.9).

Inbox: `RunRecall` jobs (protocol/recall_pool.py). Each job becomes a sub-agent task in the
pool's own task group, owned by the supervisor and not by the caller, so a caller can stop
waiting for a run without waiting for it to die. At most `max_runs` run at once; a job that
cannot start before its deadline is reported as cancelled without running.

A run: the model works inside a cancel scope ending at `budget.deadline`; then the
finalize (synchronous: it cannot be cut short or hang) sends the report, which the
coordinator waits for until `budget.finalize_deadline`. The coordinator owns the run's
transcript (the tools write its lines) and closes it. A model that ignores cancellation (or
a tool stuck in a thread) keeps its task alive past the deadline, but nobody waits for it:
the coordinator has stopped listening, the late report is dropped, and `abandoned` counts it.
"""

from __future__ import annotations

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ..protocol.recall_pool import RunRecall, RunReport

MAX_RUNS = 64
INBOX = 64


def open_inbox() -> tuple[MemoryObjectSendStream[RunRecall], MemoryObjectReceiveStream[RunRecall]]:
    return anyio.create_memory_object_stream[RunRecall](INBOX)


class RecallPool:
    """Owns the sub-agent tasks of every recall of one `open_memory()`."""

    def __init__(self, inbox: MemoryObjectReceiveStream[RunRecall], *, max_runs: int = MAX_RUNS):
        self.inbox = inbox
        self.limiter = anyio.CapacityLimiter(max_runs)
        self.abandoned = 0  # runs still alive after their finalize deadline (ignored cancel)

    async def run(self) -> None:
        """Start a sub-agent task per job until the inbox closes, then cancel what is left."""
        async with anyio.create_task_group() as tg:
            async with self.inbox:
                async for job in self.inbox:
                    tg.start_soon(self._run_one, job, name=f"recall:{job.run_id}")
            tg.cancel_scope.cancel()  # closing: runs still going end now (or when they can)

    async def _run_one(self, job: RunRecall) -> None:
        with anyio.move_on_after(max(0.0, job.budget.deadline - anyio.current_time())) as queued:
            await self.limiter.acquire()
        if queued.cancelled_caught:
            _send(job, RunReport(run_id=job.run_id, cancelled=True, error="the pool was full"))
            return
        try:
            await self._work(job)
        finally:
            self.limiter.release()

    async def _work(self, job: RunRecall) -> None:
        request, tools = job.request, job.tools
        answer: str | None = None
        answer_at: float | None = None
        error: str | None = None
        work = anyio.CancelScope(deadline=job.budget.deadline)
        try:
            with work:
                try:
                    returned = await job.model.recall(request, tools)
                    answer = returned if isinstance(returned, str) else str(returned)
                    answer_at = anyio.current_time()
                except Exception as exc:  # a model's failure is a status, never a crash
                    error = f"{type(exc).__name__}: {exc}"
        finally:  # also when the pool itself is closing
            if anyio.current_time() > job.budget.finalize_deadline:
                self.abandoned += 1  # it ignored cancellation; nobody is listening any more
            # The finalize is synchronous (no await), so cancellation cannot cut it short
            # and it cannot wait on anything; the coordinator's wait for this report is what
            # the finalize deadline bounds.
            report = RunReport(
                run_id=job.run_id,
                answer=answer,
                answer_at=answer_at,
                error=error,
                cancelled=work.cancelled_caught or work.cancel_called,
                draft=tools.draft_text,
                draft_at=tools.draft_at,
                evidence=tools.evidence,
                tool_calls=len(tools.results),
            )
            _send(job, report)


def _send(job: RunRecall, report: RunReport) -> None:
    """Hand the report over without waiting; a caller who stopped listening loses nothing."""
    try:
        job.reply.send_nowait(report)
    except (anyio.WouldBlock, anyio.ClosedResourceError, anyio.BrokenResourceError):
        pass
    finally:
        job.reply.close()
