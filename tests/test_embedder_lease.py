"""The embedder actor and its lease (docs/design.md §11 "One embedder per agent"), on
virtual time with a feed and a lease of the test's: a process without the lease embeds
nothing whatever pokes it, takes over at the claim that gets the lease, and stops within a
period and a batch when it loses it mid-backlog; the holder finds rows nobody poked it
about at its next claim; a failing holder hands the lease over; a batch that times out is
tried again smaller. (The PostgreSQL lease itself: tests/test_pg_embedder_lease.py.)"""

from __future__ import annotations

from collections.abc import Sequence

import numpy
import trio
import trio.testing

from activememory.actors.embedder import (
    ALWAYS_HELD,
    EMBED_TIMEOUT,
    EmbedderActor,
    FeedBatch,
    Lease,
    open_inbox,
)
from activememory.protocol.embedder import EmbedPoke
from activememory.protocol.errors import EmbeddingError
from activememory.protocol.indexer import VectorRow

from fake_embedder import FakeEmbedder

PERIOD = 1.0
EMBED_S = 0.3  # virtual seconds one embed call takes


class Rows:
    """A feed over a dict of rows lacking a vector; `stored` what the actor stored."""

    def __init__(self, count: int) -> None:
        self.missing = {i: f"text {i}" for i in range(count)}
        self.stored: list[int] = []

    def add(self, key: int) -> None:
        self.missing[key] = f"text {key}"

    async def pending(self, name: str, limit: int) -> FeedBatch:
        rows = sorted(self.missing.items())[:limit]
        return FeedBatch(rows, None)

    async def cached(self, name: str, digests: list[bytes]) -> dict[bytes, bytes]:
        return {}

    async def store(self, name: str, batch: FeedBatch, rows: list[VectorRow]) -> tuple[int, int]:
        for row in rows:
            del self.missing[row.id]
            self.stored.append(row.id)
        return len(rows), 0


class Claims:
    """A lease answering its claims from a script (the last answer repeats)."""

    period = PERIOD

    def __init__(self, *answers: bool) -> None:
        self.answers = list(answers)
        self.claims = 0

    async def claim(self) -> bool:
        self.claims += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class SlowEmbedder(FakeEmbedder):
    async def embed(self, texts: Sequence[str], *, deadline: float | None = None) -> numpy.ndarray:
        await trio.sleep(EMBED_S)
        return await super().embed(texts, deadline=deadline)


def run_actor(
    rows: Rows,
    lease: Lease,
    scenario: object,
    *,
    batch: int = 64,
    embedder: FakeEmbedder | None = None,
    timeout: float = EMBED_TIMEOUT,
) -> FakeEmbedder:
    """Run an actor over `rows` on virtual time until `scenario(actor, send)` returns."""
    embedder = SlowEmbedder() if embedder is None else embedder

    async def main() -> None:
        send, receive = open_inbox()
        actor = EmbedderActor(
            receive, embedder=embedder, feed=rows, lease=lease, batch=batch, timeout=timeout
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(actor.run)
            await scenario(actor, send)  # type: ignore[operator]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return embedder


def test_without_the_lease_pokes_embed_nothing_until_a_claim_takes_it() -> None:
    rows, lease = Rows(5), Claims(False, False, True)

    async def scenario(actor: EmbedderActor[Rows], send: trio.MemorySendChannel[EmbedPoke]) -> None:
        for _ in range(9):  # pokes between claims: no claim, no work
            send.send_nowait(EmbedPoke())
            await trio.sleep(0.1)
        assert (rows.stored, lease.claims, actor.holds_lease()) == ([], 1, False)
        await trio.sleep(PERIOD / 2)  # the second claim, a period after the first
        assert (rows.stored, lease.claims) == ([], 2)
        await trio.sleep(PERIOD)  # the third claim gets it: the backlog is embedded
        assert (lease.claims, actor.holds_lease()) == (3, True)
        assert sorted(rows.stored) == [0, 1, 2, 3, 4]

    run_actor(rows, lease, scenario)


def test_the_holder_finds_rows_nobody_poked_it_about_at_its_next_claim() -> None:
    rows, lease = Rows(2), Claims(True)

    async def scenario(actor: EmbedderActor[Rows], send: trio.MemorySendChannel[EmbedPoke]) -> None:
        await trio.sleep(PERIOD / 2)
        assert sorted(rows.stored) == [0, 1]
        rows.add(7)  # another process's write: no poke here
        await trio.sleep(PERIOD)
        assert sorted(rows.stored) == [0, 1, 7]

    run_actor(rows, lease, scenario)


def test_a_lease_lost_mid_backlog_stops_the_work_at_the_next_claim() -> None:
    rows, lease = Rows(40), Claims(True, False)

    async def scenario(actor: EmbedderActor[Rows], send: trio.MemorySendChannel[EmbedPoke]) -> None:
        await trio.sleep(10 * PERIOD)
        # Batches of 4 at 0.3 s each: 4 batches by the claim at 1 s, which finds it lost.
        assert len(rows.stored) == 16 and actor.holds_lease() is False
        assert not actor.busy

    embedder = run_actor(rows, lease, scenario, batch=4)
    assert embedder.calls == 4


def test_without_the_lease_a_poke_is_pending_until_a_claim_finds_the_holder_done() -> None:
    rows, lease = Rows(2), Claims(False)

    async def scenario(actor: EmbedderActor[Rows], send: trio.MemorySendChannel[EmbedPoke]) -> None:
        await trio.sleep(PERIOD / 2)  # the first claim found the lease taken; nobody poked
        assert not actor.working()
        send.send_nowait(EmbedPoke(reason="write"))  # this process wrote: a row waits
        await trio.sleep(0.1)
        assert actor.working()  # memory_search says vectorsPending here too
        await trio.sleep(PERIOD)  # the claim's check: the holder has not embedded them yet
        assert actor.working() and rows.stored == []
        rows.missing.clear()  # the holder (another process) stored both vectors
        await trio.sleep(PERIOD)
        assert not actor.working()
        assert lease.claims == 3 and rows.stored == []

    run_actor(rows, lease, scenario)


class Failing(SlowEmbedder):
    async def embed(self, texts: Sequence[str], *, deadline: float | None = None) -> numpy.ndarray:
        self.calls += 1
        await trio.sleep(EMBED_S)
        raise EmbeddingError("fake: down")


class Releases(Claims):
    """A lease that is free again once released, and counts releases."""

    def __init__(self) -> None:
        super().__init__(True)
        self.released: list[float] = []

    async def release(self) -> None:
        self.released.append(trio.current_time())


def test_a_holder_whose_embedder_keeps_failing_hands_the_lease_over() -> None:
    rows, lease = Rows(3), Releases()

    async def scenario(actor: EmbedderActor[Rows], send: trio.MemorySendChannel[EmbedPoke]) -> None:
        # Claims at 0, 1.3, 3.6 (a period passed, checked between tries); calls fail at
        # 0.3, 1.6 (after 1 s), 3.9 (after 2 s): the lease is handed over then, and the
        # next claim comes only after the pause it would have waited anyway (4 s).
        await trio.sleep(4.0)
        assert (embedder.calls, lease.released, lease.claims) == (3, [3.9], 3)
        assert actor.holds_lease() is False and actor.working()  # rows still wait
        await trio.sleep(3.7)  # 7.7: a poke claims nothing before the pause is over
        send.send_nowait(EmbedPoke(reason="write"))
        await trio.sleep(0.1)
        assert (embedder.calls, lease.claims) == (3, 3)
        await trio.sleep(0.2)  # 7.9: the claim (free again: this fake) and a new try
        assert (lease.claims, embedder.calls) == (4, 4)
        assert actor.last_error == "fake: down" and rows.stored == []

    embedder = Failing()
    run_actor(rows, lease, scenario, embedder=embedder)


class PerText(FakeEmbedder):
    """One virtual second a text, as a starved background thread might take."""

    async def embed(self, texts: Sequence[str], *, deadline: float | None = None) -> numpy.ndarray:
        self.tried = getattr(self, "tried", 0) + 1
        await trio.sleep(len(texts))
        return await super().embed(texts, deadline=deadline)


class TimedRows(Rows):
    """Rows that note when each batch was stored, and how many rows it held."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self.batches: list[tuple[float, int]] = []

    async def store(self, name: str, batch: FeedBatch, rows: list[VectorRow]) -> tuple[int, int]:
        self.batches.append((trio.current_time(), len(rows)))
        return await super().store(name, batch, rows)


def test_a_batch_that_times_out_is_tried_again_with_half_the_texts() -> None:
    rows = TimedRows(20)

    async def scenario(actor: EmbedderActor[Rows], send: trio.MemorySendChannel[EmbedPoke]) -> None:
        send.send_nowait(EmbedPoke())
        await trio.sleep(11.0)
        assert actor.batch_now == 8  # 16 texts timed out at 10 s: slow, not failing
        assert (actor.timeouts, actor.failures, actor.last_error) == (1, 0, None)
        await trio.sleep(30.0)
        # At once: 8 texts (10-18), 8 (18-26), the last 4 (26-30).
        assert rows.batches == [(18.0, 8), (26.0, 8), (30.0, 4)]
        assert (embedder.tried, embedder.calls, actor.failures) == (4, 3, 0)
        assert actor.batch_now == 16  # the backlog is done: full batches again

    embedder = PerText()
    run_actor(rows, ALWAYS_HELD, scenario, batch=16, embedder=embedder, timeout=10.0)


def test_one_text_past_the_deadline_is_a_failure() -> None:
    async def scenario(actor: EmbedderActor[Rows], send: trio.MemorySendChannel[EmbedPoke]) -> None:
        send.send_nowait(EmbedPoke())
        await trio.sleep(0.6)
        assert (actor.timeouts, actor.failures) == (0, 1)
        assert actor.last_error == "fake/bag-of-words: no answer within 0.5 s"

    run_actor(TimedRows(1), ALWAYS_HELD, scenario, batch=16, embedder=PerText(), timeout=0.5)
