"""Child process of the crash-safety test (tests/test_crash_safety.py).

Usage: ``python tests/crash_child.py STATE_DIR SEED``

Opens the memory in STATE_DIR and runs concurrent appenders that never stop; the parent
kills the process with SIGKILL at a random moment. Protocol on stdout, one JSON object per
line, each written and flushed only *after* the operation was acknowledged:

* ``READY`` once the memory is open (before any write);
* ``{"key": ..., "id": ..., "text": ...}`` after an acknowledged append (`text` is the
  message's index text, or null);
* ``{"key": ..., "rewind": ...}`` after an acknowledged rewind to that event id.

Every session is written by one task only, so at most one unacknowledged operation per
session can have committed when the process dies.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import trio

import activememory as am

APPENDERS = 16
# Two sessions on a second agent, each written by its own appender.
OPS_SESSIONS = ("agent:ops:main", "agent:ops:direct:oncall")

WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
    "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango",
    "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "café", "naïve", "über", "straße",
    "東京", "emoji🙂",
)  # fmt: skip


def sessions_of(n: int) -> list[str]:
    """The session keys appender `n` owns (disjoint between appenders)."""
    keys = [f"agent:main:direct:peer{n}"]
    if n % 3 == 0:
        keys.append(f"agent:main:group:team{n}:thread:t{n}")
    if n < len(OPS_SESSIONS):
        keys.append(OPS_SESSIONS[n])
    return keys


def emit(obj: object) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def make_message(rng: random.Random, counter: int) -> am.Message:
    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k)) + f" n{counter}"

    kind = rng.randrange(6)
    content: Any
    if kind == 0:
        return am.Message(role="user", content=words(rng.randint(1, 12)))
    if kind == 1:
        return am.Message(role="assistant", content=words(rng.randint(1, 20)))
    if kind == 2:
        # Structured: text blocks are indexed, the thinking block never is.
        content = [
            {"type": "thinking", "thinking": "hidden " + words(5), "signature": "sig"},
            {"type": "text", "text": words(rng.randint(1, 8))},
            {"type": "output_text", "text": words(3)},
        ]
        return am.Message(role="assistant", content=content)
    if kind == 3:
        # Only a thinking block and blank text: nothing to index.
        content = [{"type": "thinking", "thinking": words(4)}, {"type": "text", "text": "  "}]
        return am.Message(role=rng.choice(("user", "assistant")), content=content)
    if kind == 4:
        content = [
            {"type": "tool_result", "tool_use_id": f"call{counter}", "content": words(4)},
        ]
        return am.Message(role="tool", content=content)
    return am.Message(role="tool", content=words(rng.randint(1, 6)))


async def appender(mem: am.Memory, n: int, seed: int) -> None:
    rng = random.Random(f"{seed}:{n}")
    keys = sessions_of(n)
    # Rewind candidates: messages already stored (from earlier runs) and appended now.
    known: dict[str, list[int]] = {}
    for key in keys:
        try:
            known[key] = [e.id for e in await mem.sessions.history(key)]
        except am.SessionNotFoundError:
            known[key] = []
    counter = 0
    while True:
        key = rng.choice(keys)
        ids = known[key]
        if ids and rng.random() < 0.04:
            target = rng.choice(ids[-30:]) if rng.random() < 0.8 else rng.choice(ids)
            await mem.sessions.rewind(key, target)
            emit({"key": key, "rewind": target})
            continue
        counter += 1
        message = make_message(rng, counter)
        event = await mem.sessions.append(key, message)
        assert event.message is not None
        emit({"key": key, "id": event.id, "text": event.message.index_text})
        ids.append(event.id)


async def main(state_dir: Path, seed: int) -> None:
    # With an embedder, so kills land in its vector writes too; the small shipped model,
    # so the child's CPU goes to appending, not to the default model's embedding.
    config = {"agents": {"defaults": {"memorySearch": {"model": "all-MiniLM-L6-v2"}}}}
    async with am.open_memory(state_dir, executor="thread", config=config) as mem:
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        async with trio.open_nursery() as nursery:
            for n in range(APPENDERS):
                nursery.start_soon(appender, mem, n, seed)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: crash_child.py STATE_DIR SEED")
    trio.run(main, Path(sys.argv[1]), int(sys.argv[2]))
