"""The bot of the operator session (`examples/operator_session.sh`, README "Operating a live
bot"): `python examples/operator_bot.py STATE_DIR`.

It holds STATE_DIR for as long as it runs: it stores two users' chats and a record of
dana's, prints `ready`, then answers one chat line per stdin line (`peer: text`, a direct
chat with that peer) until stdin closes. Operators inspect, export and erase beside it.
"""

from __future__ import annotations

import sys

import trio

import activememory as am

CONFIG = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}  # starts fast


async def respond(prompt_prefix: str | None, turn: am.Turn) -> str:
    return f"Noted: {turn.messages[-1].content}"  # put your LLM call here


async def chat(mem: am.Memory, peer: str, text: str) -> None:
    key = f"agent:main:direct:{peer}"
    turn = am.Turn(session_key=key, messages=[am.Message(role="user", content=text)])
    reply = await mem.reply(turn, respond)
    print(f"[{key}] {text} -> {reply.text}", flush=True)


async def main(state_dir: str) -> None:
    async with am.open_memory(state_dir, config=CONFIG) as mem:
        await chat(mem, "dana", "My locker code is zebra-4471, keep it safe.")
        await chat(mem, "alice", "I keep bees on the roof.")
        await mem.records.add("dana's locker code: zebra-4471", user_id="dana")
        print("ready", flush=True)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            peer, _, text = line.strip().partition(": ")
            await chat(mem, peer, text)


if __name__ == "__main__":
    trio.run(main, sys.argv[1])
