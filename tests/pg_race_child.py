"""One worker of tests/test_pg_race.py and tests/test_pg_crash.py: appends flat out.

Usage: python pg_race_child.py DSN AGENT NAME COUNT SEED [REWIND_EVERY]. Prints `ready`,
waits for a line on stdin (so the workers start together), then appends COUNT messages
(0: until killed) in batches of 1-3 to two shared sessions and one of its own, in random
order. Each batch's acknowledgements are printed as one JSON line once `apply` has
returned, i.e. after the commit: a line printed is a batch stored. With REWIND_EVERY = n,
about one batch in n instead rewinds a session to one of this worker's acknowledged
messages and rebuilds its index, in one transaction.
"""

from __future__ import annotations

import json
import random
import sys
import time

from activememory.protocol.content import Message
from activememory.protocol.indexer import (
    Appended,
    AppendMessage,
    IndexerCommand,
    RebuildIndex,
    Rebuilt,
    RewindSession,
    Rewound,
)
from activememory.protocol.session_key import parse_session_key
from activememory.storage.pg.db import PgSettings, connect
from activememory.storage.pg.transcripts import PgTranscriptWriter

KEYS = [parse_session_key("agent:main:direct:shared"), parse_session_key("agent:main:group:g")]


def main() -> None:
    dsn, agent, name, count, seed, *rest = sys.argv[1:]
    rewind_every = int(rest[0]) if rest else 0
    writer = PgTranscriptWriter(connect(PgSettings(dsn=dsn)), agent)
    rng = random.Random(seed)
    # Its own session too: two workers creating different sessions at once race for the
    # same new session id (the loser retries its batch).
    keys = [*KEYS, parse_session_key(f"agent:main:direct:{name}")]
    mine: dict[str, list[int]] = {key.raw: [] for key in keys}  # acknowledged event ids
    print("ready", flush=True)
    sys.stdin.readline()
    sent = 0
    batches = 0
    while sent < int(count) or int(count) == 0:
        batches += 1
        key = rng.choice(keys)
        batch: list[IndexerCommand]
        if rewind_every and mine[key.raw] and rng.randrange(rewind_every) == 0:
            target = rng.choice(mine[key.raw])
            batch = [
                RewindSession(key=key, to_event_id=target, at=time.time()),
                RebuildIndex(key=key),
            ]
        else:
            size = (
                rng.randint(1, 3) if int(count) == 0 else min(rng.randint(1, 3), int(count) - sent)
            )
            batch = [
                AppendMessage(
                    key=rng.choice(keys),
                    message=Message(
                        role="user", content=f"{name} says hello {sent + i} b{batches}"
                    ),
                    at=time.time(),
                )
                for i in range(size)
            ]
            sent += size
        acks = []
        for ack in writer.apply(batch):
            match ack:
                case Appended(event=event):
                    mine[event.session_key].append(event.id)
                    acks.append(
                        {"id": event.id, "key": event.session_key, "parent": event.parent_id,
                         "seq": event.seq, "text": event.message.content if event.message else None}
                    )  # fmt: skip
                case Rewound(leaf_event_id=leaf):
                    acks.append({"rewound": key.raw, "leaf": leaf})
                case Rebuilt():
                    pass
                case _:
                    raise SystemExit(f"rejected: {ack}")
        print(json.dumps(acks), flush=True)


if __name__ == "__main__":
    main()
