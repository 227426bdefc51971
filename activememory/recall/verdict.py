"""From a run's report to a recall status (docs/design.md §4.10): the evidence gate and NONE.

Pure functions: the coordinator hands in the report and the deadlines, and gets back the
status, the text to summarise, and a reason for the debug line.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..protocol.recall import RecallStatus
from ..protocol.recall_pool import RunReport

# The usual "nothing" answers, after lower-casing and trimming quotes, markdown and
# punctuation. A leading NONE followed by an explanation ("NONE - nothing about seats")
# counts too: the model said NONE first.
_NONE = re.compile(
    r"^(?:none\b.*|null|nil|n/?a|nothing(?: relevant| found| to add| useful)?"
    r"|no(?:\s+relevant|\s+useful|\s+matching)?\s+(?:memory|memories|information|info|"
    r"results?|context|matches|notes?)(?:\s+(?:found|available|recalled|matched))?"
    r"|\[\]|\{\}|\(\)|-+|not found|no match(?:es)?"
    r"|(?:the\s+)?(?:recall|request|search|memory search|operation)?\s*(?:timed out|timeout)"
    r"(?:\s+after\s+\d+\s*m?s)?"
    r"|i (?:don't|do not|couldn't|could not) (?:have|find|recall) any(?:thing)?(?: relevant)?.*)$"
)
_TRIM = re.compile(r"^[\s\"'`*_#>.:;!,\-–—()\[\]]+|[\s\"'`*_.:;!,]+$")


def is_none_answer(text: str) -> bool:
    """Whether a model's answer means "no memory" (case-insensitive, docs/design.md §4.10)."""
    core = " ".join(text.split()).casefold()
    if core in ("[]", "{}", "()"):
        return True
    core = _TRIM.sub("", core)
    return not core or bool(_NONE.match(core))


class Verdict(NamedTuple):
    status: RecallStatus
    text: str  # what becomes the summary ("" unless ok / timeout_partial)
    reason: str = ""


def judge(report: RunReport | None, *, deadline: float, finalize_deadline: float) -> Verdict:
    """The status of a run, given its report (None: it did not report in time).

    `ok` needs a non-NONE answer that arrived within the budget and evidence from this run's
    tools; an answer without evidence is discarded. After the budget, an answer or draft
    that is non-empty, non-NONE, grounded and in before the finalize deadline is
    `timeout_partial`; anything else is `timeout`.
    """
    if report is None:
        return Verdict(
            "timeout",
            "",
            "no report by the finalize deadline: the run did not stop at its budget, or the full pool never started it",
        )
    on_time = report.answer is not None and (report.answer_at or 0.0) <= deadline
    if on_time and not report.cancelled:
        answer = (report.answer or "").strip()
        if not answer:
            return Verdict("empty", "", "the model returned nothing")
        if is_none_answer(answer):
            return Verdict("no_relevant_memory", "", "the model answered NONE")
        if not report.evidence:
            return Verdict(
                "no_relevant_memory", "", "answer discarded: no memory tool returned evidence"
            )
        return Verdict("ok", answer)
    if report.error is not None and not report.cancelled:
        return Verdict("failed", "", report.error)
    # Past the budget: a late answer or the last draft, if grounded and in time.
    for text, at in ((report.answer, report.answer_at), (report.draft, report.draft_at)):
        in_time = at is not None and at <= finalize_deadline
        if text and text.strip() and in_time and not is_none_answer(text) and report.evidence:
            return Verdict("timeout_partial", text.strip(), "partial answer after the budget")
    return Verdict("timeout", "", "the recall budget ran out")
