"""One process of tests/test_pg_wiring.py's two-process test: appends through the public API.

Usage: python pg_wiring_child.py STATE_DIR DSN NAME COUNT. Opens
`activememory.sync.open_memory(STATE_DIR, storage=DSN)`, prints `ready`, waits for a line on
stdin (so both processes start together), then appends COUNT messages to the shared session,
printing each acknowledged event id on a line of its own, and `done`.
"""

from __future__ import annotations

import sys

import activememory as am
from activememory.sync import open_memory

SHARED = "agent:main:direct:shared"
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}


def main() -> None:
    state_dir, dsn, name, count = sys.argv[1:]
    with open_memory(state_dir, storage=dsn, config=TEXT_ONLY) as mem:
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range(int(count)):
            event = mem.sessions.append(
                SHARED, am.Message(role="user", content=f"{name} says hello {i}")
            )
            print(event.id, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
