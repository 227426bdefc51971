"""The composer: the bot path of one turn (docs/design.md §1.2, §6).

persist the user message → recall (bounded) → the host's `respond`, given the reply input
the recall built (`outcome.prompt_prefix`, the hidden prefix: `recall/coordinator.py`)
→ persist the assistant message → the reply and its follow-ups.

Decision: the composer runs in the caller's task rather than as a task of its own, so the
host's `respond` runs in the host's context (its context variables, its cancel scopes,
its backend), and cancelling `mem.reply` cancels the turn as the host expects. Everything
it waits on is bounded or the host's own: the recall by its budget, the writes by the
indexer's acks.

Memory fails open: a failed write or a failed recall becomes a `problem` of the reply and
the turn goes on without memory. The host's own `respond` failing is the host's error and
propagates.

What is wrong with the input is refused before anything is written: the turn, and whether
`respond` can be called as `respond(prompt_prefix, turn)`. What `respond` gives back can
only be seen after it ran, when the user message is already stored: a non-awaitable or a
non-string answer is an `InvalidInputError` that says so (the user message stored, with
its event id; no assistant message) (docs/design.md §6).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from ..protocol.content import Message
from ..protocol.errors import ActiveMemoryError, InvalidInputError
from ..protocol.recall import RecallOutcome, Reply, Turn
from ..protocol.transcript import Event

Respond = Callable[[str | None, Turn], Awaitable[str]]
Append = Callable[[str, Message], Awaitable[Event]]
Recall = Callable[[Turn], Awaitable[RecallOutcome]]


class Composer:
    """Runs `mem.reply`: holds how to append and how to recall, nothing else."""

    def __init__(self, append: Append, recall: Recall) -> None:
        self._append = append
        self._recall = recall

    async def reply(self, turn: Turn, respond: Respond) -> Reply:
        if not isinstance(turn, Turn):
            raise InvalidInputError(f"turn: expected am.Turn, got {type(turn).__name__}")
        _check_respond(respond, turn)
        problems: list[str] = []
        user_event = await self._persist(turn.session_key, turn.messages[-1], problems)
        try:
            outcome = await self._recall(turn)
        except InvalidInputError:
            raise
        except (ActiveMemoryError, OSError) as exc:  # fail open: reply without memory
            problems.append(f"recall: {exc}")
            outcome = RecallOutcome(status="failed", reason=str(exc))
        answer = respond(outcome.prompt_prefix, turn)
        if not inspect.isawaitable(answer):
            raise InvalidInputError(
                f"respond: returned {type(answer).__name__}, not an awaitable (pass an async "
                f"function); {_stored(turn.session_key, user_event)}"
            )
        text = await answer
        if not isinstance(text, str):
            raise InvalidInputError(
                f"respond: returned {type(text).__name__}, expected str; "
                f"{_stored(turn.session_key, user_event)}"
            )
        assistant_event = None
        if text.strip():
            assistant_event = await self._persist(
                turn.session_key, Message(role="assistant", content=text), problems
            )
        return Reply(
            text=text,
            outcome=outcome,
            followups=outcome.followups,
            user_event_id=user_event.id if user_event else None,
            assistant_event_id=assistant_event.id if assistant_event else None,
            problems=tuple(problems),
        )

    async def _persist(self, key: str, message: Message, problems: list[str]) -> Event | None:
        try:
            return await self._append(key, message)
        except InvalidInputError:
            raise
        except ActiveMemoryError as exc:  # storage trouble: the turn goes on
            problems.append(f"persist {message.role} message: {exc}")
            return None


def _check_respond(respond: object, turn: Turn) -> None:
    """`InvalidInputError` unless `respond(prompt_prefix, turn)` is a call it can take."""
    if not callable(respond):
        raise InvalidInputError(
            f"respond: expected an async function (prompt_prefix, turn) -> str, "
            f"got {type(respond).__name__}"
        )
    try:
        signature = inspect.signature(respond)
    except (TypeError, ValueError):
        return  # a builtin or extension callable without one: it is called as it is
    try:
        signature.bind(None, turn)
    except TypeError as exc:
        raise InvalidInputError(
            f"respond: cannot be called as respond(prompt_prefix, turn) ({exc})"
        ) from None


def _stored(key: str, user_event: Event | None) -> str:
    """What a reply wrote before `respond`'s answer turned out unusable."""
    if user_event is None:
        return "nothing was stored (the user message could not be)"
    return (
        f"the user message is stored (event {user_event.id} of {key!r}), no assistant message was"
    )
