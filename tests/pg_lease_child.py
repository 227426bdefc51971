"""One worker process of tests/test_pg_embedder_lease.py: an open memory on PostgreSQL with
a fake embedder that writes every text it embeds to a file, driven line by line.

Usage: python pg_lease_child.py STATE_DIR DSN NAME PERIOD LOG. Sets the lease period to
PERIOD seconds, opens `open_memory(STATE_DIR, storage=DSN)` with the embedder, prints
`ready`, then reads commands from stdin:

- `append N`: appends N messages (`NAME message i`, i counting on across commands) to
  `agent:main:direct:NAME`, then prints `appended`;
- `stats`: prints agent main's `IndexStats` as JSON on one line;
- `quit`: closes the memory and prints `done`.

Every text the embedder is given is appended to LOG (one line each, flushed at once), so
what a process embedded survives its `kill -9`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import msgspec
import numpy
import trio

import activememory as am
from activememory.storage.pg import lease

from fake_embedder import FakeEmbedder  # the script's own directory is on sys.path

TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


class LoggingEmbedder(FakeEmbedder):
    """A `FakeEmbedder` that writes each text it embeds to `log`."""

    def __init__(self, log: Path) -> None:
        super().__init__()
        self._log = log.open("a", encoding="utf-8")

    async def embed(self, texts: Sequence[str], *, deadline: float | None = None) -> numpy.ndarray:
        for text in texts:
            self._log.write(text + "\n")
        self._log.flush()
        return await super().embed(texts, deadline=deadline)


async def main() -> None:
    state_dir, dsn, name, period, log = sys.argv[1:]
    lease.PERIOD = float(period)
    key = f"agent:main:direct:{name}"
    count = 0
    async with am.open_memory(
        state_dir, storage=dsn, embedder=LoggingEmbedder(Path(log)), config=TEXT_ONLY
    ) as mem:
        print("ready", flush=True)
        stdin = trio.wrap_file(sys.stdin)
        while line := (await stdin.readline()).split():
            match line:
                case ["append", n]:
                    for _ in range(int(n)):
                        message = am.Message(role="user", content=f"{name} message {count}")
                        await mem.sessions.append(key, message)
                        count += 1
                    print("appended", flush=True)
                case ["stats"]:
                    (stats,) = [s for s in await mem.sessions.stats() if s.agent == "main"]
                    print(msgspec.json.encode(stats).decode(), flush=True)
                case _:
                    break
    print("done", flush=True)


if __name__ == "__main__":
    trio.run(main)
