"""A minimal trio bot with active memory, offline: `python examples/trio_bot.py [STATE_DIR]`.

The "main model" is a stand-in that shows what memory it was handed; put your LLM call in
`respond`.
"""

from __future__ import annotations

import sys
import tempfile

import trio

import activememory as am

# One person's bot: every private chat is the owner's, so any of them may recall another.
SINGLE_OWNER = {"plugins": {"entries": {"active-memory": {"config": {"singleOwner": True}}}}}


async def respond(prompt_prefix: str | None, turn: am.Turn) -> str:
    latest = turn.messages[-1].content
    if prompt_prefix is None:
        return f"(no memory) You said: {latest}"
    return f"(with memory: {prompt_prefix.splitlines()[2]}) You said: {latest}"


async def main(state_dir: str) -> None:
    async with am.open_memory(state_dir, config=SINGLE_OWNER) as mem:
        history: dict[str, list[am.Message]] = {}
        for key, text in [
            ("agent:main:direct:alice", "I always book an aisle seat."),
            ("agent:main:explicit:web-1", "Book me a seat on the Lisbon flight."),
        ]:
            messages = [*history.get(key, []), am.Message(role="user", content=text)]
            reply = await mem.reply(am.Turn(session_key=key, messages=messages), respond)
            history[key] = [*messages, am.Message(role="assistant", content=reply.text)]
            print(f"[{key}] {text}\n  -> {reply.text}\n  ({reply.outcome.status_line})")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, sys.argv[1] if len(sys.argv) > 1 else tmp)
