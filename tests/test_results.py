"""From a run's report to a status (docs/design.md §4.10): NONE, the evidence gate, partial answers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from activememory.protocol.recall_pool import RunReport
from activememory.recall.verdict import Verdict, is_none_answer, judge

NONE_ANSWERS = [
    "NONE", "none", "None.", " NONE ", "**NONE**", "`none`", '"NONE"', "NONE - nothing about seats",
    "No relevant memory.", "no relevant memories found", "No memory", "nothing", "Nothing relevant",
    "N/A", "n/a", "NA", "null", "nil", "[]", "{}", "()", "-", "no results", "No information available",
    "Timeout", "Recall timed out.", "the request timed out after 15000ms", "timed out",
    "I don't have any relevant memory.", "I could not find anything relevant", "Not found",
    "", "   ",
]  # fmt: skip
REAL_ANSWERS = [
    "The user prefers aisle seats.",
    "The user's sister Nora lives in Lisbon.",
    "Nonetheless, the user likes tea.",  # starts like "none" but is not
    "No-fuss breakfasts: the user eats oats daily.",
    "Timeouts annoy the user; they asked for shorter replies.",
    "N/A is how the user marks unknown fields.",
]


@pytest.mark.parametrize("text", NONE_ANSWERS)
def test_none_answers(text: str) -> None:
    assert is_none_answer(text)


@pytest.mark.parametrize("text", REAL_ANSWERS)
def test_real_answers_are_not_none(text: str) -> None:
    assert not is_none_answer(text)


@given(st.text(max_size=200))
def test_none_detection_never_raises(text: str) -> None:
    assert is_none_answer(text) in (True, False)


DEADLINE, FINAL = 10.0, 11.5


def report(**fields: object) -> RunReport:
    return RunReport(run_id="r", **fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("run", "verdict"),
    [
        (
            None,
            Verdict(
                "timeout",
                "",
                "no report by the finalize deadline: the run did not stop at its budget, or the full pool never started it",
            ),
        ),
        (
            report(answer="The user likes tea.", answer_at=3.0, evidence=True),
            Verdict("ok", "The user likes tea."),
        ),
        (
            report(answer="The user likes tea.", answer_at=3.0, evidence=False),
            Verdict("no_relevant_memory", "", "answer discarded: no memory tool returned evidence"),
        ),
        (
            report(answer="NONE", answer_at=3.0, evidence=True),
            Verdict("no_relevant_memory", "", "the model answered NONE"),
        ),
        (
            report(answer="  ", answer_at=3.0, evidence=True),
            Verdict("empty", "", "the model returned nothing"),
        ),
        (
            report(error="RuntimeError: boom", evidence=True),
            Verdict("failed", "", "RuntimeError: boom"),
        ),
        (
            report(cancelled=True, draft="The user likes tea.", draft_at=9.0, evidence=True),
            Verdict("timeout_partial", "The user likes tea.", "partial answer after the budget"),
        ),
        (
            report(answer="The user likes tea.", answer_at=10.4, evidence=True),
            Verdict("timeout_partial", "The user likes tea.", "partial answer after the budget"),
        ),
        (
            report(answer="The user likes tea.", answer_at=11.6, evidence=True),
            Verdict("timeout", "", "the recall budget ran out"),
        ),
        (
            report(cancelled=True, draft="The user likes tea.", draft_at=9.0, evidence=False),
            Verdict("timeout", "", "the recall budget ran out"),
        ),
        (
            report(cancelled=True, draft="NONE", draft_at=9.0, evidence=True),
            Verdict("timeout", "", "the recall budget ran out"),
        ),
        (
            report(cancelled=True, error="Cancelled", evidence=True),
            Verdict("timeout", "", "the recall budget ran out"),
        ),
    ],
    ids=[
        "abandoned",
        "ok",
        "ungrounded",
        "none",
        "empty",
        "failed",
        "draft-partial",
        "late-answer-partial",
        "after-finalize",
        "ungrounded-draft",
        "none-draft",
        "cancelled",
    ],
)
def test_judge(run: RunReport | None, verdict: Verdict) -> None:
    assert judge(run, deadline=DEADLINE, finalize_deadline=FINAL) == verdict


@given(
    answer=st.one_of(st.none(), st.text(max_size=50)),
    at=st.floats(0, 20),
    evidence=st.booleans(),
    cancelled=st.booleans(),
)
def test_never_ok_without_evidence(
    answer: str | None, at: float, evidence: bool, cancelled: bool
) -> None:
    got = judge(
        report(answer=answer, answer_at=at, evidence=evidence, cancelled=cancelled),
        deadline=DEADLINE,
        finalize_deadline=FINAL,
    )
    if got.status in ("ok", "timeout_partial"):
        assert evidence and got.text and not is_none_answer(got.text)
