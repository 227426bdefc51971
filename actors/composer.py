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
"""

from __future__ import annotations

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
        if not callable(respond):
            raise InvalidInputError(
                f"respond: expected an async function (prompt_prefix, turn) -> str, "
                f"got {type(respond).__name__}"
            )
        problems: list[str] = []
        user_event = await self._persist(turn.session_key, turn.messages[-1], problems)
        try:
            outcome = await self._recall(turn)
        except InvalidInputError:
            raise
        except (ActiveMemoryError, OSError) as exc:  # fail open: reply without memory
            problems.append(f"recall: {exc}")
            outcome = RecallOutcome(status="failed", reason=str(exc))
        text = await respond(outcome.prompt_prefix, turn)
        if not isinstance(text, str):
            raise InvalidInputError(f"respond: returned {type(text).__name__}, expected str")
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
