"""The same bot on asyncio (most bot frameworks): `python examples/asyncio_bot.py [STATE_DIR]`."""

from __future__ import annotations

import asyncio
import sys
import tempfile

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
        await mem.sessions.append(
            "agent:main:direct:alice", am.Message(role="user", content="I drink oolong tea daily.")
        )
        turn = am.Turn(
            session_key="agent:main:direct:web",
            messages=[am.Message(role="user", content="Which tea do I drink daily?")],
        )
        reply = await mem.reply(turn, respond)
        print(reply.text)
        print(reply.outcome.status_line)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else tmp))
