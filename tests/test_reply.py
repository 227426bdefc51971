"""The bot path (docs/design.md §6): `mem.reply` on trio and asyncio hosts, and the blocking facade."""

from __future__ import annotations

from pathlib import Path

import pytest

import activememory as am
import activememory.sync as ams
from activememory.protocol.errors import StorageError
from activememory.sync import _refuse_inside_event_loop

pytestmark = pytest.mark.anyio

DM = "agent:main:direct:alice"
SOURCE = "agent:main:dm:alice"  # alice's other chat: recall reads only her own identity's
FACT = "I drink oolong tea every morning."
QUESTION = "what tea do I drink in the morning?"


def turn(text: str = QUESTION, key: str = DM) -> am.Turn:
    return am.Turn(session_key=key, messages=[am.Message(role="user", content=text)])


async def test_reply_runs_the_whole_bot_path(tmp_path: Path) -> None:
    seen: list[tuple[str | None, am.Turn]] = []

    async def respond(prefix: str | None, t: am.Turn) -> str:
        seen.append((prefix, t))
        return "You drink oolong, I believe."

    async with am.open_memory(tmp_path / "s") as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        await mem.command(DM, "/verbose on", sender=am.Sender())
        reply = await mem.reply(turn(), respond)
        history = await mem.sessions.history(DM)
    assert reply.text == "You drink oolong, I believe."
    assert reply.outcome.status == "ok" and reply.problems == ()
    ((prefix, passed),) = seen
    assert prefix == reply.outcome.prompt_prefix and prefix is not None and "oolong" in prefix
    assert passed.session_key == DM
    assert [(e.role, e.message.content) for e in history] == [
        ("user", QUESTION),
        ("assistant", "You drink oolong, I believe."),
    ]
    assert (reply.user_event_id, reply.assistant_event_id) == (history[0].id, history[1].id)
    assert reply.followups == (reply.outcome.status_line,)


async def test_skipped_turn_gets_no_prefix(tmp_path: Path) -> None:
    prefixes: list[str | None] = []

    async def respond(prefix: str | None, t: am.Turn) -> str:
        prefixes.append(prefix)
        return "hi all"

    async with am.open_memory(tmp_path / "s") as mem:
        reply = await mem.reply(turn("hello team", key="agent:main:group:team"), respond)
    assert prefixes == [None] and reply.outcome.status == "skipped"


async def test_memory_fails_open_and_the_reply_goes_on(tmp_path: Path) -> None:
    async def respond(prefix: str | None, t: am.Turn) -> str:
        return "answer without memory"

    async with am.open_memory(tmp_path / "s") as mem:

        async def broken_recall(t: am.Turn) -> am.RecallOutcome:
            raise StorageError("disk I/O error")

        async def broken_append(key: str, message: am.Message) -> am.Event:
            raise StorageError("database or disk is full")

        mem._composer._recall = broken_recall  # type: ignore[method-assign]
        mem._composer._append = broken_append  # type: ignore[method-assign]
        reply = await mem.reply(turn(), respond)
    assert reply.text == "answer without memory"
    assert reply.outcome.status == "failed" and reply.outcome.prompt_prefix is None
    assert reply.problems == (
        "persist user message: database or disk is full",
        "recall: disk I/O error",
        "persist assistant message: database or disk is full",
    )


async def test_host_errors_propagate_and_bad_replies_are_named(tmp_path: Path) -> None:
    async def raising(prefix: str | None, t: am.Turn) -> str:
        raise RuntimeError("main model down")

    async def wrong(prefix: str | None, t: am.Turn) -> str:
        return 42  # type: ignore[return-value]

    async with am.open_memory(tmp_path / "s") as mem:
        with pytest.raises(RuntimeError, match="main model down"):
            await mem.reply(turn(), raising)
        with pytest.raises(am.InvalidInputError, match="^respond: returned int, expected str; "):
            await mem.reply(turn(), wrong)
        with pytest.raises(am.InvalidInputError, match="^turn: expected am.Turn, got str$"):
            await mem.reply("hello", wrong)  # type: ignore[arg-type]


async def test_a_respond_that_cannot_take_the_call_is_refused_before_anything_is_written(
    tmp_path: Path,
) -> None:
    async def one_argument(prefix: str | None) -> str:
        return "hi"

    async with am.open_memory(tmp_path / "s") as mem:
        for respond, why in [
            (one_argument, "too many positional arguments"),
            (lambda: "hi", "too many positional arguments"),
            ("not a function", None),
        ]:
            with pytest.raises(am.InvalidInputError, match="^respond: ") as caught:
                await mem.reply(turn(), respond)  # type: ignore[arg-type]
            if why is not None:
                assert str(caught.value) == (
                    f"respond: cannot be called as respond(prompt_prefix, turn) ({why})"
                )
        with pytest.raises(am.SessionNotFoundError):
            await mem.sessions.history(DM)  # nothing was written


async def test_an_unusable_answer_says_exactly_what_was_stored(tmp_path: Path) -> None:
    # What `respond` returns is only known after it ran, when the user message is stored.
    async def returns_none(prefix: str | None, t: am.Turn) -> str:
        return None  # type: ignore[return-value]

    def not_async(prefix: str | None, t: am.Turn) -> str:
        return "hi"

    async with am.open_memory(tmp_path / "s") as mem:
        with pytest.raises(am.InvalidInputError) as caught:
            await mem.reply(turn(), returns_none)
        assert str(caught.value) == (
            "respond: returned NoneType, expected str; the user message is stored "
            f"(event 1 of {DM!r}), no assistant message was"
        )
        with pytest.raises(am.InvalidInputError) as caught:
            await mem.reply(turn(), not_async)  # type: ignore[arg-type]
        assert str(caught.value) == (
            "respond: returned str, not an awaitable (pass an async function); the user "
            f"message is stored (event 2 of {DM!r}), no assistant message was"
        )
        history = await mem.sessions.history(DM)
    assert [(e.id, e.message.role) for e in history if e.message] == [(1, "user"), (2, "user")]


@pytest.mark.parametrize("backend", ["trio", "asyncio"])
def test_blocking_facade_gives_the_same_answers(tmp_path: Path, backend: str) -> None:
    async def respond(prefix: str | None, t: am.Turn) -> str:
        return "blocking reply"

    with ams.open_memory(tmp_path / "s", backend=backend) as mem:
        mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        hits = mem.sessions.search("oolong", caller=SOURCE)
        out = mem.recall(turn())
        reply = mem.reply(turn("and what else?"), respond)
        states = mem.breaker_states()
        text = mem.command(DM, "/trace on", sender=am.Sender())
    assert hits.results[0].snippet == FACT
    assert out.status == "ok" and "oolong" in (out.summary or "")
    assert reply.text == "blocking reply" and states == []
    assert text == "Trace: on for this session."


async def test_blocking_facade_refuses_calls_from_inside_an_event_loop() -> None:
    # A blocking call from async code would freeze this loop while it waits on the library's.
    with pytest.raises(am.InvalidInputError, match="^history: activememory.sync called from"):
        _refuse_inside_event_loop("history")
