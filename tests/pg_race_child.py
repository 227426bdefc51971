"""One worker of tests/test_pg_race.py: appends to two shared sessions flat out.

Usage: python pg_race_child.py DSN AGENT NAME COUNT SEED. Prints `ready`, waits for a line
on stdin (so both workers start together), appends COUNT messages in batches of 1-3 to the
shared sessions and one of its own, in random order, and prints every acknowledgement as one JSON line.
"""

from __future__ import annotations

import json
import random
import sys
import time

from activememory.protocol.content import Message
from activememory.protocol.indexer import Appended, AppendMessage
from activememory.protocol.session_key import parse_session_key
from activememory.storage.pg.db import PgSettings, connect
from activememory.storage.pg.transcripts import PgTranscriptWriter

KEYS = [parse_session_key("agent:main:direct:shared"), parse_session_key("agent:main:group:g")]


def main() -> None:
    dsn, agent, name, count, seed = sys.argv[1:]
    writer = PgTranscriptWriter(connect(PgSettings(dsn=dsn)), agent)
    rng = random.Random(seed)
    # Its own session too: two workers creating different sessions at once race for the
    # same new session id (the loser retries its batch).
    keys = [*KEYS, parse_session_key(f"agent:main:direct:{name}")]
    print("ready", flush=True)
    sys.stdin.readline()
    acks = []
    sent = 0
    while sent < int(count):
        size = min(rng.randint(1, 3), int(count) - sent)
        batch = [
            AppendMessage(
                key=rng.choice(keys),
                message=Message(role="user", content=f"{name} says hello {sent + i}"),
                at=time.time(),
            )
            for i in range(size)
        ]
        for ack in writer.apply(batch):
            if not isinstance(ack, Appended):
                raise SystemExit(f"rejected: {ack}")
            event = ack.event
            acks.append(
                {"id": event.id, "key": event.session_key, "parent": event.parent_id,
                 "seq": event.seq, "text": event.message.content if event.message else None}
            )  # fmt: skip
        sent += size
    print(json.dumps(acks), flush=True)


if __name__ == "__main__":
    main()
