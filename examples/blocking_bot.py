"""A bot with no event loop, through `activememory.sync`: `python examples/blocking_bot.py`.

`respond` is still async: it runs on the library's background loop.
"""

from __future__ import annotations

import sys
import tempfile

import activememory as am
import activememory.sync

# One person's bot: every private chat is the owner's, so any of them may recall another.
SINGLE_OWNER = {"plugins": {"entries": {"active-memory": {"config": {"singleOwner": True}}}}}


async def respond(prompt_prefix: str | None, turn: am.Turn) -> str:
    latest = turn.messages[-1].content
    if prompt_prefix is None:
        return f"(no memory) You said: {latest}"
    return f"(with memory: {prompt_prefix.splitlines()[2]}) You said: {latest}"


def main(state_dir: str) -> None:
    with activememory.sync.open_memory(state_dir, config=SINGLE_OWNER) as mem:
        mem.sessions.append(
            "agent:main:direct:alice", am.Message(role="user", content="My dog is called Pixel.")
        )
        turn = am.Turn(
            session_key="agent:main:direct:web",
            messages=[am.Message(role="user", content="What is my dog called?")],
        )
        reply = mem.reply(turn, respond)
        print(reply.text)
        print(reply.outcome.status_line)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        main(sys.argv[1] if len(sys.argv) > 1 else tmp)
