"""The load soak (docs/design.md §7): sessions appending and recalling at set rates, under faults.

Three kinds of process:

- the **workload** (a child, `--child`): opens the state directory, appends to many private
  direct sessions of agent `main` (and a few groups) at `--append-rate`, occasionally
  rewinds one, and runs `--recall-rate` recalls per second, each a real `mem.recall` or
  `mem.reply` on a random private session. Operations are started on a clock schedule
  (never sleeps that drift); operations on one session run one at a time, so the order of
  the ack log is each session's commit order. Every operation is written to an append-only
  **ack log** before it starts (an *intent*) and after the library answers (an *ack*, or a
  *rejection* with its error): the ack log is the ground truth the parent checks the store
  against. Recall latencies, statuses, breaker trips and RSS samples go to the parent as
  JSON lines on stdout.
- the **busy writer** (`--busy-writer`, with `--faults`): every 0.5-2 s it opens the agent's
  `memory.db` with apsw and holds a write transaction for 100-300 ms (BEGIN IMMEDIATE, sleep,
  COMMIT), so the library's writer meets SQLITE_BUSY. Appends must still be acknowledged
  or fail with a clear `StorageError` (counted as rejected, never as lost).
- the **parent** (this command): starts the busy writer and the workload, kills the
  workload with SIGKILL at random moments (`--kill-every`, with `--faults`) and restarts it
  on the same state directory (never in the last `--steady` seconds), shows progress
  (`--progress`), and at the end verifies:

  (a) nothing acknowledged was lost: each session's stored operations (events by sequence
      number) are exactly its acknowledged operations, in order, plus only operations that
      were in flight when the workload was killed; no rejected message was stored; each
      session's active branch (`history`) is the branch those operations produce, so an
      acknowledged message is on it unless a later rewind took it off;
  (b) the FTS index equals the active branches: the tokens indexed for each row (`words`,
      `grams`, `context`) are the tokenizer's tokens of the active-branch text, for clean
      sessions as the workload left them and for every session after `rebuild_index()`,
      with no stray rows, and FTS5's integrity check passes;
  (c) every recall returned (none raised) within `timeoutMs + setupGraceTimeoutMs + 3000`
      ms: wall time around `mem.recall`, and the recall step of each `mem.reply`;
  (d) RSS growth after warm-up, less the in-memory vector index, is at most 10%: in the
      last workload run, the median of the first 20% of its samples after `--warmup` against
      the median of the last 20%. The vector index holds a vector per message by design
      (docs/design.md §2.3), so it grows with the data; it is sampled with RSS
      (`VectorIndexes.nbytes`) and taken out, and both figures are printed. A kill
      starts a fresh process and resets RSS, so kills happen only before the last `--steady`
      seconds (default half the run): the last run lives long enough to show a leak;
  (e) no group message ever reached a recall (the privacy boundary, docs/design.md §4.2).

On PostgreSQL (`--storage DSN --workers N`, docs/design.md §7) N workload processes (the
**workers**) share the session keys, each with its share of the rates and its own ack log
(`soak-acks-<n>.jsonl`); a kill takes one running worker at random, and the next waits until
it is READY again. No busy writer (the workers contend for the sessions' row locks) and no
embedder. The soak's database is its own (created and dropped) unless the DSN names one,
which must hold no store (`soak_database`). Check (a) merges the ack logs in each session's
commit order, the store's `seq` (`replay_merged`); (b) compares the `message_index` rows
with `storage/pg/terms.index_terms` of the active branches (`expected_pg_index`).

The workload opens the memory with the default `memorySearch` (the shipped embedder on), so
the soak also measures the **embedder's background rate and lag** (docs/design.md §2.3): the
vectors it stored per second, the rows waiting for a vector (sampled each second from
`stats`), and how long each acknowledged append waited for its vector (from its ack until
the embedder actor's watermark passed its event id, polled every 50 ms), with what still
waited when the run ended. Reported, not checked: vectors are an optimisation with no
bound of their own.

It prints throughput, latency percentiles, statuses, timeouts, breaker trips, rejected
appends, kills, RSS over time, the embedder's rate and lag and a PASS/FAIL line per check (`--json`: one JSON object).
Exit status 1 if any check fails.

    python -m activememory.simulations.soak [--sessions 200] [--append-rate 50]
        [--recall-rate 20] [--duration 600] [--faults] [--progress] [--json]
        [--storage postgresql://... --workers 4]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import itertools
import json
import os
import platform
import random
import re
import resource
import secrets
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal

import apsw
import trio

import activememory as am
from activememory.embed import SHIPPED_MODELS
from activememory.storage.fts_query import index_row, index_tokens
from activememory.storage.memstatus import MEMSTATUS_ENV
from activememory.storage.transcripts import agent_db_path

from .adversaries import Grounded, HangForever, IgnoresCancellation, LateAnswer, Raises
from .bench import runner
from .bench.runner import percentile, positive_int

AGENT = "main"
MODEL = "soak/chaos"
ACK_LOG = "soak-acks.jsonl"
CHILD_ERR = "soak-child.err"
BUSY_ERR = "soak-busy-writer.err"
PREFLIGHT_AND_FINALIZE_MS = 3000
COOLDOWN_MS = 5000
REWIND_SHARE = 0.03  # of the append schedule's operations
REPLY_SHARE = 0.5  # of the recall schedule's operations: mem.reply, the rest mem.recall
MAX_IN_FLIGHT = 512  # operations in flight in the workload; the schedule waits beyond
LATE_S = 0.25  # an operation started this much after its slot counts as late
RSS_EVERY_S = 1.0
TICK_EVERY_S = 0.5
BREAKER_POLL_S = 0.05
EMBED_POLL_S = 0.05  # how often the workload reads the embedder actor's watermark
EMBED_EVERY_S = 1.0  # how often it reports the embedder's counters to the parent
READY_TIMEOUT_S = 60.0
MAX_FAILED_STARTS = 20
KILL_MARGIN_S = 3.0  # no kill this close to the end: the last workload run stops cleanly
BRANCH_KEPT = 64  # the workload remembers this much of each branch (rewind targets)
DRAIN_TIMEOUT_S = 60.0  # the workload's own stop after its deadline, bounded
RSS_GROWTH_MAX = 0.10
RSS_MIN_SAMPLES = 10  # fewer samples after warm-up: the RSS check is skipped
GROUP_TOKEN = "teamonly"  # only group messages carry it: it must never reach a recall
MARKER = re.compile(r"mk(\d+)q(\d+)z")
# The workers get the DSN here, not on their command line (which `ps` shows, password and all).
STORAGE_ENV = "ACTIVEMEMORY_SOAK_STORAGE"

Status = Literal["PASS", "FAIL", "SKIP"]

VOCAB = (
    "oolong", "tea", "coffee", "espresso", "hiking", "alps", "lisbon", "porto", "tram",
    "bicycle", "garden", "tomato", "basil", "sourdough", "bread", "piano", "violin", "jazz",
    "concert", "museum", "painting", "novel", "poetry", "chess", "marathon", "running",
    "swimming", "ocean", "sailing", "kayak", "mountain", "camping", "tent", "lantern",
    "birthday", "anniversary", "sister", "brother", "daughter", "grandmother", "puppy",
    "kitten", "parrot", "aquarium", "vegetarian", "allergy", "peanuts", "gluten", "dentist",
    "meeting", "deadline", "project", "budget", "invoice", "passport", "visa", "airport",
    "train", "ticket", "hotel", "balcony", "sunrise", "winter", "summer", "autumn", "spring",
    "umbrella", "raincoat", "scarf", "guitar", "drums", "podcast", "recipe", "curry",
    "noodles", "dumplings", "seaweed", "mango", "lemon", "café", "naïve", "über", "straße",
    "İstanbul", "東京", "咖啡", "旅行", "한국어", "ラーメン",
)  # fmt: skip


# -- the workload (child process) ---------------------------------------------------------


def soak_config(
    timeout_ms: int, embedder: str | None = None, *, postgresql: bool = False
) -> dict[str, Any]:
    """The plugin config of the soak: the chaos model, a short budget, a visible breaker;
    the shipped `embedder` model named, else the default `memorySearch` — on PostgreSQL
    none (text only): N workers would each load and run the default model."""
    settings = {
        "model": MODEL,
        "timeoutMs": timeout_ms,
        "setupGraceTimeoutMs": 0,
        "circuitBreakerMaxTimeouts": 3,
        "circuitBreakerCooldownMs": COOLDOWN_MS,
    }
    config: dict[str, Any] = {"plugins": {"entries": {"active-memory": {"config": settings}}}}
    if embedder is not None:
        config["agents"] = {"defaults": {"memorySearch": {"model": embedder}}}
    elif postgresql:
        config["agents"] = {"defaults": {"memorySearch": {"provider": "none"}}}
    return config


def session_keys(sessions: int) -> tuple[list[str], list[str]]:
    """(private direct sessions, group sessions) of agent main."""
    private = [f"agent:{AGENT}:direct:u{i:04d}" for i in range(sessions)]
    groups = [f"agent:{AGENT}:group:g{j:02d}" for j in range(max(2, sessions // 40))]
    return private, groups


class ChaosModel:
    """A recall model that, at random (seeded), behaves well or misbehaves.

    Most runs search and answer at once; some answer well after their search (inside or
    past the budget), hang, raise, or shield themselves from cancellation for a while. Every
    run's tool results are scanned for the group-only token (privacy).
    """

    def __init__(self, seed: str, timeout_s: float, *, faults: bool) -> None:
        self.rng = random.Random(seed)
        self.timeout_s = timeout_s
        self.faults = faults
        self.behaviours: Counter[str] = Counter()
        self.leaks = 0

    def _pick(self) -> tuple[str, am.RecallModel]:
        roll = self.rng.random()
        t = self.timeout_s
        if not self.faults or roll < 0.74:
            return "quick", Grounded(think_s=self.rng.uniform(0.0, 0.02))
        if roll < 0.84:
            return "slow", Grounded(think_s=self.rng.uniform(0.4, 0.9) * t)
        if roll < 0.88:
            late = LateAnswer(self.rng.uniform(0.05, 1.0), shielded=self.rng.random() < 0.5)
            return "late", late
        if roll < 0.93:
            return "hang", HangForever()
        if roll < 0.99:
            return "raise", Raises(after_s=self.rng.uniform(0.0, 0.1))
        return "ignore_cancel", IgnoresCancellation(hold_s=self.rng.uniform(2.0, 4.0))

    async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
        """Delegate to the picked behaviour (simulations/adversaries.py)."""
        name, model = self._pick()
        self.behaviours[name] += 1
        try:
            return await model.recall(request, tools)
        finally:
            if any(GROUP_TOKEN in result.content for result in tools.results):
                self.leaks += 1


class AckLog:
    """The append-only ground truth: one JSON line per write, each in one `write(2)`.

    A line cut by SIGKILL is ignored by the reader (the next run starts with a newline).
    """

    def __init__(self, path: Path, *, fsync: bool) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._fsync = fsync
        os.write(self._fd, b"\n")

    def write(self, record: Mapping[str, Any]) -> None:
        os.write(self._fd, (json.dumps(record, ensure_ascii=False) + "\n").encode())
        if self._fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


def emit(record: Mapping[str, Any]) -> None:
    """One JSON line to the parent."""
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def rss_kib() -> int:
    """This process's resident set size in KiB (from /proc when there is one)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@dataclass(frozen=True)
class AppendPlan:
    """What one slot of the append schedule does, drawn when the slot comes."""

    key: str
    rewind: bool
    pick: float  # which rewind target, or which message kind
    words: tuple[str, ...]


class Workload:
    """One workload run (one incarnation of the child process)."""

    def __init__(
        self, mem: am.Memory, args: argparse.Namespace, acks: AckLog, model: ChaosModel
    ) -> None:
        self.mem = mem
        self.args = args
        self.acks = acks
        self.model = model
        self.inc: int = args.incarnation
        self.private, self.groups = session_keys(args.sessions)
        self.locks = {key: trio.Lock() for key in self.private + self.groups}
        self.branches: dict[str, list[int]] = {}  # known active branch, loaded on first use
        self.markers = itertools.count(1)
        self.slots = trio.Semaphore(MAX_IN_FLIGHT)
        self.counts: Counter[str] = Counter()
        self.breakers: dict[tuple[str, str], str] = {}
        # Acknowledged appends of indexed text waiting for their vector: (event id, ack time).
        self.awaiting: list[tuple[int, float]] = []
        self.waits: list[float] = []  # seconds each waited, since the last report

    def marker(self) -> str:
        """A unique marker for the next message (run and counter)."""
        return f"mk{self.inc}q{next(self.markers)}z"

    async def branch(self, key: str) -> list[int]:
        """The tail of the session's active branch as this run knows it (with several
        workers only its own view: a rewind target the others took off the branch is still a
        message of the session, which a rewind accepts)."""
        found = self.branches.get(key)
        if found is None:
            try:
                found = [e.id for e in await self.mem.sessions.history(key)][-BRANCH_KEPT:]
            except am.SessionNotFoundError:
                found = []
            self.branches[key] = found
        return found

    def reject(self, key: str, what: str, exc: BaseException) -> None:
        """Log that the library refused an operation (not written)."""
        self.counts["rejected"] += 1
        self.acks.write({"k": "x", "s": key, "what": what, "e": f"{type(exc).__name__}: {exc}"})

    # -- operations ---------------------------------------------------------------------

    async def append_or_rewind(self, plan: AppendPlan) -> None:
        """One slot of the append schedule: an append, or now and then a rewind."""
        key = plan.key
        async with self.locks[key]:
            branch = await self.branch(key)
            if plan.rewind and len(branch) >= 2:
                candidates = branch[-11:-1]
                target = candidates[int(plan.pick * len(candidates))]
                self.acks.write({"k": "i", "s": key, "op": "w", "to": target})
                try:
                    await self.mem.sessions.rewind(key, target)
                except am.ActiveMemoryError as exc:
                    self.reject(key, f"rewind {target}", exc)
                    return
                self.acks.write({"k": "w", "s": key, "to": target})
                del branch[branch.index(target) + 1 :]
                self.counts["rewinds"] += 1
                return
            marker = self.marker()
            message, text = build_message(plan, marker, group=key in self.groups)
            self.acks.write({"k": "i", "s": key, "op": "a", "m": marker, "x": text})
            try:
                event = await self.mem.sessions.append(key, message)
            except am.ActiveMemoryError as exc:
                self.reject(key, marker, exc)
                return
            self.acks.write(
                {
                    "k": "a",
                    "s": key,
                    "m": marker,
                    "id": event.id,
                    "p": event.parent_id,
                    "q": event.seq,
                }
            )
            if text is not None:
                heapq.heappush(self.awaiting, (event.id, time.monotonic()))
            branch.append(event.id)
            del branch[:-BRANCH_KEPT]  # bounded: the soak's own state must not look like a leak
            self.counts["acked"] += 1

    async def recall(self, key: str, question: str) -> None:
        """A `mem.recall` on a private session, timed with the wall clock."""
        turn = am.Turn(session_key=key, messages=[am.Message(role="user", content=question)])
        started = time.monotonic()
        try:
            outcome = await self.mem.recall(turn)
        except Exception as exc:  # a recall must never raise: reported, and check (c) fails
            self.report_recall("recall", started, None, error=exc)
            return
        self.report_recall("recall", started, outcome)

    async def reply(self, key: str, question: str) -> None:
        """The whole bot path: `mem.reply` persists both messages and recalls."""
        async with self.locks[key]:
            branch = await self.branch(key)
            user_marker, bot_marker = self.marker(), self.marker()
            user_text = f"{question} ({user_marker})"
            bot_text = f"Noted, thanks ({bot_marker})."
            self.acks.write(
                {
                    "k": "i",
                    "s": key,
                    "op": "r",
                    "m": [user_marker, bot_marker],
                    "x": [user_text, bot_text],
                }
            )
            turn = am.Turn(session_key=key, messages=[am.Message(role="user", content=user_text)])
            started = time.monotonic()

            async def respond(prefix: str | None, turn: am.Turn) -> str:
                return bot_text

            try:
                reply = await self.mem.reply(turn, respond)
            except Exception as exc:  # fail open means this never happens
                self.reject(key, "reply", exc)
                self.counts["rejected"] += 1  # two messages
                self.report_recall("reply", started, None, error=exc)
                return
            self.acks.write(
                {
                    "k": "r",
                    "s": key,
                    "u": reply.user_event_id,
                    "a": reply.assistant_event_id,
                    "e": list(reply.problems),
                }
            )
            for event_id in (reply.user_event_id, reply.assistant_event_id):
                if event_id is not None:
                    branch.append(event_id)
                    del branch[:-BRANCH_KEPT]
                    self.counts["acked"] += 1
                    self.counts["reply_messages"] += 1
                else:
                    self.counts["rejected"] += 1
            self.report_recall("reply", started, reply.outcome)

    def report_recall(
        self,
        op: str,
        started: float,
        outcome: am.RecallOutcome | None,
        *,
        error: BaseException | None = None,
    ) -> None:
        wall_ms = (time.monotonic() - started) * 1000
        self.counts["recalls"] += 1
        if outcome is None:
            emit({"t": "rc", "op": op, "wall": wall_ms, "st": f"raised {type(error).__name__}"})
            return
        self.observe_breakers()
        emit(
            {
                "t": "rc",
                "op": op,
                "wall": wall_ms,
                "el": outcome.elapsed_ms,
                "st": outcome.status,
                "cb": " circuit-breaker" in outcome.status_line,
                "cached": outcome.cached,
                "why": outcome.reason[:200],
            }
        )

    def observe_breakers(self) -> None:
        """Count a trip whenever a breaker is seen going open."""
        for info in self.mem.breaker_states():
            key = (info.agent, info.model)
            if info.state == "open" and self.breakers.get(key) != "open":
                emit({"t": "trip", "model": info.model})
            self.breakers[key] = info.state

    # -- schedules ----------------------------------------------------------------------

    async def schedule(
        self, nursery: trio.Nursery, rate: float, deadline: float, stream: str
    ) -> None:
        """Start operations at `rate` per second on the clock until `deadline`."""
        if rate <= 0:
            return
        rng = random.Random(f"{self.args.seed}:{self.inc}:{stream}")
        start = trio.current_time()
        for i in itertools.count():
            slot = start + i / rate
            if slot >= deadline:
                return
            await trio.sleep_until(slot)
            await self.slots.acquire()
            if trio.current_time() - slot > LATE_S:
                self.counts["late"] += 1
            if stream == "append":
                key = rng.choice(self.private + self.groups)
                plan = AppendPlan(
                    key=key,
                    rewind=rng.random() < REWIND_SHARE,
                    pick=rng.random(),
                    words=tuple(rng.choice(VOCAB) for _ in range(rng.randint(3, 14))),
                )
                nursery.start_soon(self.run_slot, self.append_or_rewind, plan)
            else:
                key = rng.choice(self.private)
                question = f"what did I say about {rng.choice(VOCAB)} and {rng.choice(VOCAB)}?"
                op = self.reply if rng.random() < REPLY_SHARE else self.recall
                nursery.start_soon(self.run_slot, op, key, question)

    async def run_slot(self, op: Any, *args: Any) -> None:
        """Run one scheduled operation and give its slot back."""
        try:
            await op(*args)
        except am.ActiveMemoryError as exc:  # a read the operation needed failed: reported
            emit({"t": "error", "e": f"{type(exc).__name__}: {exc}"})
        finally:
            self.slots.release()

    async def ticker(self) -> None:
        """Send the counters to the parent twice a second; stop at once if it died."""
        parent = os.getppid()
        while True:
            if os.getppid() != parent:
                os._exit(3)  # orphaned: end like a kill -9, which the store survives
            self.tick()
            await trio.sleep(TICK_EVERY_S)

    def tick(self) -> None:
        """Send the counters to the parent."""
        emit(
            {
                "t": "tick",
                **self.counts,
                "inflight": MAX_IN_FLIGHT - self.slots.value,
                "leaks": self.model.leaks,
                "behaviours": dict(self.model.behaviours),
            }
        )

    async def sample_rss(self) -> None:
        """Send RSS, SQLite's heap and the vector index's bytes to the parent every second."""
        started = time.monotonic()
        store = await self.mem._supervisor.agent(AGENT)
        index = getattr(store, "vector_index", None)
        while True:
            age = time.monotonic() - started
            vix = 0 if index is None else index.nbytes() // 1024
            emit(
                {
                    "t": "rss",
                    "kib": rss_kib(),
                    "sqlite": apsw.memory_used() // 1024,
                    "vix": vix,
                    "age": age,
                }
            )
            await trio.sleep(RSS_EVERY_S)

    async def watch_embedder(self) -> None:
        """Time each acknowledged append until the embedder's watermark passes it, and
        report the embedder's counters and the rows waiting for a vector every second."""
        store = await self.mem._supervisor.agent(AGENT)
        embedder = store.embedder
        if embedder is None:
            emit({"t": "emb", "on": False})
            return
        last = time.monotonic()
        while True:
            await trio.sleep(EMBED_POLL_S)
            after, _epoch = embedder.watermark()
            now = time.monotonic()
            if embedder.holds_lease() is False:
                # Another worker embeds (docs/design.md §11 "One embedder per agent"): this
                # one's watermark stays, so its appends' waits cannot be timed here.
                self.awaiting.clear()
            while self.awaiting and self.awaiting[0][0] <= after:
                _, acked = heapq.heappop(self.awaiting)
                self.waits.append(now - acked)
            if now - last >= EMBED_EVERY_S:
                last = now
                await self.report_embedder(store)

    async def report_embedder(self, store: Any) -> None:
        """One report: vectors stored by this run, rows waiting, waits since the last."""
        embedder = store.embedder
        (stats,) = [
            s for s in await self.mem.sessions.stats(check_integrity=False) if s.agent == AGENT
        ]
        now = time.monotonic()
        oldest = now - min(t for _, t in self.awaiting) if self.awaiting else 0.0
        emit(
            {
                "t": "emb",
                "on": True,
                "name": embedder.name,
                "stored": embedder.stored,
                "computed": embedder.texts_embedded,
                "skipped": embedder.skipped,
                "pending": stats.vectors_pending,
                "waits": [round(w, 4) for w in self.waits],
                "waiting": len(self.awaiting),
                "oldest": round(oldest, 3),
                "error": embedder.last_error,
            }
        )
        self.waits = []

    async def watch_breakers(self) -> None:
        """Poll the breakers, so a trip between two recalls is seen too."""
        while True:
            self.observe_breakers()
            await trio.sleep(BREAKER_POLL_S)


def build_message(plan: AppendPlan, marker: str, *, group: bool) -> tuple[am.Message, str | None]:
    """A message of a random kind carrying `marker`, and the index text it must get."""
    words = " ".join(plan.words)
    if group:
        words = f"{GROUP_TOKEN} {words}"
    text = f"{words} ({marker})"
    if plan.pick < 0.45:
        return am.Message(role="user", content=text), text
    if plan.pick < 0.80:
        return am.Message(role="assistant", content=text), text
    if plan.pick < 0.92:
        # Structured: the text block is indexed, the thinking block never is.
        content: list[am.Block] = [
            am.ThinkingBlock(thinking=f"hidden {words}", signature="sig"),
            am.TextBlock(text=text),
        ]
        return am.Message(role="assistant", content=content), text
    return am.Message(role="tool", content=text), None  # stored, never indexed


async def run_child(args: argparse.Namespace) -> int:
    """The workload: run until `--until` (seconds since the epoch), then stop cleanly."""
    state_dir: Path = args.state_dir
    timeout_s = args.timeout_ms / 1000
    model = ChaosModel(f"{args.seed}:{args.incarnation}:model", timeout_s, faults=args.faults)
    acks = AckLog(state_dir / args.ack_log, fsync=args.fsync_acks)
    try:
        async with am.open_memory(
            state_dir,
            config=soak_config(args.timeout_ms, args.embedder, postgresql=args.storage_env),
            models={MODEL: model},
            storage=os.environ[STORAGE_ENV] if args.storage_env else None,
        ) as mem:
            workload = Workload(mem, args, acks, model)
            # Open the agent database (and recover it after a kill) before saying READY.
            with contextlib.suppress(am.SessionNotFoundError):
                await mem.sessions.history(workload.private[0])
            acks.write({"k": "start", "inc": args.incarnation})
            emit({"t": "ready", "inc": args.incarnation, "pid": os.getpid()})
            deadline = trio.current_time() + max(0.0, args.until - time.time())
            async with trio.open_nursery() as background:
                background.start_soon(workload.ticker)
                background.start_soon(workload.sample_rss)
                background.start_soon(workload.watch_breakers)
                background.start_soon(workload.watch_embedder)
                async with trio.open_nursery() as ops:
                    ops.start_soon(workload.schedule, ops, args.append_rate, deadline, "append")
                    ops.start_soon(workload.schedule, ops, args.recall_rate, deadline, "recall")
                background.cancel_scope.cancel()
            workload.tick()
            if (store := await mem._supervisor.agent(AGENT)).embedder is not None:
                await workload.report_embedder(store)
    finally:
        acks.close()
    emit({"t": "done", "inc": args.incarnation})
    return 0


# -- the busy writer ----------------------------------------------------------------------


def run_busy_writer(args: argparse.Namespace) -> int:
    """Hold the agent database's write lock for 100-300 ms every 0.5-2 s, forever."""
    rng = random.Random(f"{args.seed}:busy")
    path = agent_db_path(args.state_dir, AGENT)
    parent = os.getppid()
    while not path.exists() and os.getppid() == parent:
        time.sleep(0.1)
    while os.getppid() == parent:  # the soak died (say, a test's timeout): stop too
        time.sleep(rng.uniform(0.5, 2.0))
        hold = rng.uniform(0.1, 0.3)
        conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
        try:
            conn.set_busy_timeout(2000)
            asked = time.monotonic()
            try:
                conn.execute("BEGIN IMMEDIATE")
            except apsw.BusyError:
                emit({"t": "busy_miss"})
                continue
            got = time.monotonic()
            time.sleep(hold)
            conn.execute("COMMIT")
            emit({"t": "hold", "ms": (time.monotonic() - got) * 1000, "wait": got - asked})
        finally:
            conn.close()
    return 0


# -- the parent ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RssSample:
    """One memory sample of a workload run."""

    run: int
    age_s: float  # since the run started
    at_s: float  # since the soak started
    kib: int
    sqlite_kib: int  # SQLite's own heap (apsw.memory_used), part of `kib`
    vector_kib: int = 0  # the in-memory vector index (VectorIndexes.nbytes), part of `kib`


@dataclass
class Live:
    """What the workload and the busy writer report, as the reader threads receive it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    recalls: list[dict[str, Any]] = field(default_factory=list)
    rss: list[RssSample] = field(default_factory=list)
    ticks: dict[int, dict[str, Any]] = field(default_factory=dict)  # last tick per run
    trips: int = 0
    done: set[int] = field(default_factory=set)
    bad_lines: int = 0
    holds: list[float] = field(default_factory=list)
    busy_misses: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    embedder: dict[int, dict[str, Any]] = field(default_factory=dict)  # last report per run
    vector_waits: list[float] = field(default_factory=list)  # seconds, every run
    vectors_pending: list[int] = field(default_factory=list)  # sampled each second

    def handle(self, inc: int, msg: dict[str, Any]) -> None:
        """Take one JSON line from workload run `inc` (or the busy writer, -1)."""
        kind = msg.get("t")
        with self.lock:
            if kind == "rc":
                msg["inc"] = inc
                msg["at"] = time.monotonic() - self.started
                self.recalls.append(msg)
            elif kind == "rss":
                at = time.monotonic() - self.started
                sample = RssSample(
                    inc,
                    float(msg["age"]),
                    at,
                    int(msg["kib"]),
                    int(msg["sqlite"]),
                    int(msg.get("vix", 0)),
                )
                self.rss.append(sample)
            elif kind == "tick":
                self.ticks[inc] = msg
            elif kind == "trip":
                self.trips += 1
            elif kind == "done":
                self.done.add(inc)
            elif kind == "hold":
                self.holds.append(float(msg["ms"]))
            elif kind == "busy_miss":
                self.busy_misses += 1
            elif kind == "error":
                self.errors[_error_reason(str(msg["e"]))] += 1
            elif kind == "emb":
                self.embedder[inc] = msg
                self.vector_waits += [float(w) for w in msg.get("waits", ())]
                if "pending" in msg:
                    self.vectors_pending.append(int(msg["pending"]))

    def total(self, name: str) -> int:
        """A counter summed over every workload run's last tick."""
        with self.lock:
            return sum(int(tick.get(name, 0)) for tick in self.ticks.values())


def pump(stream: IO[bytes], inc: int, live: Live, ready: threading.Event) -> None:
    """Read a child's JSON lines until it exits (a line cut by SIGKILL is dropped)."""
    for raw in iter(stream.readline, b""):
        if not raw.endswith(b"\n"):
            break
        try:
            msg = json.loads(raw)
        except ValueError:
            with live.lock:
                live.bad_lines += 1
            continue
        live.handle(inc, msg)
        if msg.get("t") == "ready":
            ready.set()


class Process:
    """A child process of the soak and the thread reading its stdout."""

    def __init__(
        self,
        argv: list[str],
        inc: int,
        live: Live,
        stderr_path: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.inc = inc
        self.stderr_path = stderr_path
        with stderr_path.open("ab") as err:
            err.write(f"--- run {inc}: {' '.join(argv[3:])}\n".encode())
            err.flush()
            self.stderr_from = err.tell()
            self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
        assert self.proc.stdout is not None
        self.ready = threading.Event()
        self.reader = threading.Thread(
            target=pump, args=(self.proc.stdout, inc, live, self.ready), daemon=True
        )
        self.reader.start()

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the process says READY; False if it exits first or takes too long."""
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                return self.ready.is_set()
        return True

    def last_error(self) -> str:
        """The last line this process wrote to stderr (its exception, when it crashed)."""
        with self.stderr_path.open("rb") as err:
            err.seek(self.stderr_from)
            lines = [line.strip() for line in err.read().decode(errors="replace").splitlines()]
        return next((line for line in reversed(lines) if line), "nothing on stderr")

    def kill(self) -> None:
        """SIGKILL the process if it still runs, reap it, close its stdout."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.reader.join(timeout=10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


@dataclass
class RunLog:
    """What happened to the workload processes."""

    runs: int = 0
    kills: list[float] = field(default_factory=list)  # seconds into the soak
    downtime_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    failed_starts: list[str] = field(default_factory=list)  # exited before READY
    work_s: float = 0.0


def ack_log_name(worker: int, workers: int) -> str:
    """The file name of worker `worker`'s ack log (one worker: `ACK_LOG`)."""
    return ACK_LOG if workers == 1 else f"soak-acks-{worker}.jsonl"


def child_err_name(worker: int, workers: int) -> str:
    """The file name of worker `worker`'s stderr (one worker: `CHILD_ERR`)."""
    return CHILD_ERR if workers == 1 else f"soak-child-{worker}.err"


def child_argv(
    args: argparse.Namespace,
    state_dir: Path,
    inc: int,
    until: float,
    *,
    worker: int = 0,
    storage: str | None = None,
) -> list[str]:
    """The command line of workload run `inc` (worker `worker` of `--workers`; each runs
    its share of the rates)."""
    share = args.workers
    argv = [sys.executable, "-m", "activememory.simulations.soak", "--child"]
    argv += ["--state-dir", str(state_dir), "--incarnation", str(inc), "--until", repr(until)]
    argv += ["--sessions", str(args.sessions), "--append-rate", str(args.append_rate / share)]
    argv += ["--recall-rate", str(args.recall_rate / share), "--seed", str(args.seed)]
    argv += ["--timeout-ms", str(args.timeout_ms), "--faults" if args.faults else "--no-faults"]
    argv += ["--embedder", args.embedder] if args.embedder else []
    if share > 1:
        argv += ["--ack-log", ack_log_name(worker, share)]
    argv += ["--storage-env"] if storage is not None else []
    return argv + (["--fsync-acks"] if args.fsync_acks else [])


class Progress(runner.Progress):
    """The soak's live line: acknowledgements, recalls, faults and memory so far."""

    def __init__(self, enabled: bool, duration: float, bound_ms: float) -> None:
        super().__init__(enabled)
        self.duration = duration
        self.bound_ms = bound_ms

    def show(self, live: Live, runs: RunLog, *, force: bool = False) -> None:
        """Print the line if it is time to (or `force`)."""
        now = time.monotonic() - live.started
        if not self.due(now, force=force):
            return
        with live.lock:
            walls = sorted(float(r["wall"]) for r in live.recalls if r["op"] == "recall")
            timeouts = sum(1 for r in live.recalls if r["st"] == "timeout" and not r.get("cb"))
            rss = live.rss[-1].kib / 1024 if live.rss else 0.0
            trips = live.trips
        acked = live.total("acked")
        p99 = percentile(walls, 99)
        line = (
            f"soak {now:5.0f}/{self.duration:.0f}s  acked {acked} ({acked / max(now, 1e-9):.1f}/s)"
            f"  recalls {live.total('recalls')}  p99 {p99:.0f}ms (bound {self.bound_ms:.0f})"
            f"  timeouts {timeouts}  trips {trips}  kills {len(runs.kills)}"
            f"  rejected {live.total('rejected')}  RSS {rss:.0f} MiB"
        )
        self.write(line)


@dataclass
class Worker:
    """One worker's place in the soak: its current run, and since when it is down."""

    index: int
    child: Process | None = None
    runs: int = 0
    down_since: float | None = None  # killed, not READY again yet
    finished: bool = False

    def running(self) -> bool:
        """Whether its current run is still going."""
        return not self.finished and self.child is not None and self.child.proc.poll() is None


def drive(
    args: argparse.Namespace, state_dir: Path, live: Live, storage: str | None = None
) -> RunLog:
    """Run the workers (killing one at random now and then and restarting it) and, on
    SQLite, the busy writer until the end. A killed worker is READY again before the next
    kill, so with several workers the others run through every kill."""
    rng = random.Random(f"{args.seed}:kills")
    victims = random.Random(f"{args.seed}:victims")
    log = RunLog()
    bound_ms = args.timeout_ms + PREFLIGHT_AND_FINALIZE_MS
    progress = Progress(args.progress, args.duration, bound_ms)
    begin = time.monotonic()
    until = time.time() + args.duration
    kill_low, kill_high = args.kill_every
    next_kill = begin + rng.uniform(kill_low, kill_high) if args.faults else float("inf")
    busy: Process | None = None
    workers = [Worker(index) for index in range(args.workers)]
    # The workers keep SQLite's memory statistics (off by default, storage/memstatus.py):
    # the soak reports SQLite's own heap beside the resident size, to tell a leak's home.
    env = {**os.environ, MEMSTATUS_ENV: "on"}
    if storage is not None:
        env[STORAGE_ENV] = storage

    def launch(worker: Worker) -> None:
        """Start the worker's next run."""
        inc = log.runs
        argv = child_argv(args, state_dir, inc, until, worker=worker.index, storage=storage)
        err = state_dir / child_err_name(worker.index, args.workers)
        worker.child = Process(argv, inc, live, err, env)
        log.runs += 1
        worker.runs += 1

    def start(worker: Worker, *, launched: bool = False) -> bool:
        """Start the worker's next run (unless `launched`) and wait until it is READY;
        False: stop the soak."""
        while True:
            if not launched:
                if worker.runs > 0 and time.time() >= until - 0.5:
                    worker.finished = True  # no time left for another run
                    return True
                launch(worker)
            launched = False
            child = worker.child
            assert child is not None
            if child.wait_ready(READY_TIMEOUT_S):
                if worker.down_since is not None:
                    log.downtime_s += time.monotonic() - worker.down_since
                    worker.down_since = None
                return True
            child.kill()
            if child.proc.returncode == -signal.SIGKILL:  # still starting: hung
                log.problems.append(
                    f"workload run {child.inc} not ready in {READY_TIMEOUT_S:.0f} s"
                )
                return False
            log.failed_starts.append(f"run {child.inc}: {child.last_error()}")
            if len(log.failed_starts) >= MAX_FAILED_STARTS:
                log.problems.append(f"{MAX_FAILED_STARTS} workload runs failed to start")
                return False
            # start it again, as a host's supervisor would

    def reap(worker: Worker) -> bool:
        """The worker's run ended by itself: restart it after a failure; False: stop."""
        assert worker.child is not None
        child = worker.child
        child.kill()  # reaps it and joins its reader
        code = child.proc.returncode
        if code != 0:
            log.problems.append(
                f"workload run {child.inc} exited with status {code}: {child.last_error()}"
            )
            return start(worker)  # restart it, as after a kill
        if child.inc not in live.done:
            log.problems.append(f"workload run {child.inc} exited without finishing")
        worker.finished = True
        return True

    try:
        if args.faults and storage is None:
            argv = [sys.executable, "-m", "activememory.simulations.soak", "--busy-writer"]
            argv += ["--state-dir", str(state_dir), "--seed", str(args.seed)]
            busy = Process(argv, -1, live, state_dir / BUSY_ERR)
        for worker in workers:  # all at once: each takes seconds to import and open
            launch(worker)
        going = all(start(worker, launched=True) for worker in workers)
        while going and not all(worker.finished for worker in workers):
            now = time.monotonic()
            running = [worker for worker in workers if worker.running()]
            if (
                running
                and now >= next_kill
                and time.time() < until - max(args.steady, KILL_MARGIN_S)
            ):
                victim = running[0] if len(running) == 1 else victims.choice(running)
                assert victim.child is not None
                victim.child.kill()
                victim.down_since = time.monotonic()
                log.kills.append(victim.down_since - begin)
                next_kill = victim.down_since + rng.uniform(kill_low, kill_high)
                going = start(victim)
                continue
            for worker in workers:
                if going and not worker.finished and not worker.running():
                    going = reap(worker)
            if going and time.time() > until + DRAIN_TIMEOUT_S:
                for worker in workers:
                    if worker.running():
                        assert worker.child is not None
                        log.problems.append(
                            f"workload run {worker.child.inc} still running "
                            f"{DRAIN_TIMEOUT_S:.0f} s after the end"
                        )
                        worker.child.kill()
                        worker.finished = True
            progress.show(live, log)
            time.sleep(0.05)
        log.work_s = time.monotonic() - begin
    finally:
        for worker in workers:
            if worker.child is not None:
                worker.child.kill()
        if busy is not None:
            busy.kill()
        progress.show(live, log, force=True)
        progress.close()
    return log


# -- verification -------------------------------------------------------------------------


@dataclass
class Op:
    """One operation of a session, as the ack log tells it."""

    kind: Literal["append", "rewind"]
    state: Literal["acked", "rejected", "in_flight"]
    marker: str | None = None
    text: str | None = None  # the index text the message must get
    event_id: int | None = None
    parent: int | None = None
    check_parent: bool = False
    to: int | None = None
    by_reply: bool = False
    seq: int | None = None  # the session's seq the store returned (its commit order)


@dataclass
class AckedOps:
    """The ack log read back: each session's operations, in order."""

    sessions: dict[str, list[Op]] = field(default_factory=lambda: defaultdict(list))
    rejected_markers: dict[str, str] = field(default_factory=dict)  # marker -> session
    bad_lines: int = 0
    runs: int = 0
    unresolved_at_clean_exit: int = 0
    rejections: Counter[str] = field(default_factory=Counter)

    def replies_acked(self) -> int:
        """Messages `mem.reply` stored and acknowledged."""
        return sum(
            1 for ops in self.sessions.values() for op in ops if op.by_reply and op.state == "acked"
        )

    def count(self, kind: str, state: str) -> int:
        """Operations of `kind` in `state`, over every session."""
        return sum(
            1
            for ops in self.sessions.values()
            for op in ops
            if (op.kind, op.state) == (kind, state)
        )


def read_ack_log(path: Path) -> AckedOps:
    """Parse the ack log; an intent with no answer before the next run was in flight."""
    out = AckedOps()
    pending: dict[str, dict[str, Any]] = {}

    def settle_in_flight() -> None:
        for key, intent in pending.items():
            for marker, text in _intent_messages(intent):
                out.sessions[key].append(Op("append", "in_flight", marker=marker, text=text))
            if intent["op"] == "w":
                out.sessions[key].append(Op("rewind", "in_flight", to=int(intent["to"])))
        pending.clear()

    with path.open("rb") as lines:
        for raw in lines:
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except ValueError:
                out.bad_lines += 1
                continue
            kind, key = rec["k"], rec.get("s", "")
            if kind == "start":
                settle_in_flight()
                out.runs += 1
            elif kind == "i":
                if key in pending:  # cannot happen: one operation per session at a time
                    settle_in_flight()
                pending[key] = rec
            elif kind == "x":
                intent = pending.pop(key)
                error = str(rec["e"])
                out.rejections[error.split(":")[0] + ": " + _error_reason(error)] += 1
                for marker, text in _intent_messages(intent):
                    out.sessions[key].append(Op("append", "rejected", marker=marker, text=text))
                    out.rejected_markers[marker] = key
                if intent["op"] == "w":
                    out.sessions[key].append(Op("rewind", "rejected", to=int(intent["to"])))
            elif kind == "a":
                intent = pending.pop(key)
                out.sessions[key].append(
                    Op(
                        "append",
                        "acked",
                        marker=rec["m"],
                        text=intent["x"],
                        event_id=int(rec["id"]),
                        parent=rec["p"],
                        check_parent=True,
                        seq=rec.get("q"),
                    )
                )
            elif kind == "w":
                pending.pop(key)
                out.sessions[key].append(Op("rewind", "acked", to=int(rec["to"])))
            elif kind == "r":
                intent = pending.pop(key)
                for event_id, marker, text in zip(
                    (rec["u"], rec["a"]), intent["m"], intent["x"], strict=True
                ):
                    state: Literal["acked", "rejected"] = (
                        "rejected" if event_id is None else "acked"
                    )
                    out.sessions[key].append(
                        Op("append", state, marker, text, event_id=event_id, by_reply=True)
                    )
                    if event_id is None:
                        out.rejected_markers[marker] = key
                for problem in rec["e"]:
                    out.rejections[f"reply: {_error_reason(str(problem))}"] += 1
    out.unresolved_at_clean_exit = len(pending)
    settle_in_flight()
    return out


def read_ack_logs(paths: Sequence[Path]) -> AckedOps:
    """Every worker's ack log read (`read_ack_log`) and merged: each session's operations
    from all of them (in no order across workers: `replay_merged` orders them)."""
    if len(paths) == 1:
        return read_ack_log(paths[0])
    merged = AckedOps()
    for path in paths:
        one = read_ack_log(path)
        for key, ops in one.sessions.items():
            merged.sessions[key] += ops
        merged.rejected_markers.update(one.rejected_markers)
        merged.bad_lines += one.bad_lines
        merged.runs += one.runs
        merged.unresolved_at_clean_exit += one.unresolved_at_clean_exit
        merged.rejections.update(one.rejections)
    return merged


def _intent_messages(intent: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    if intent["op"] == "a":
        return [(intent["m"], intent["x"])]
    if intent["op"] == "r":
        return list(zip(intent["m"], intent["x"], strict=True))
    return []


def _error_reason(error: str) -> str:
    # Paths and ids vary; the reason after the last ": " is what to group by.
    return error.rsplit(": ", 1)[-1][:120]


@dataclass(frozen=True)
class StoredEvent:
    event_id: int
    session_id: int
    parent_id: int | None
    seq: int
    kind: str
    marker: str | None
    to: int | None
    text: str | None


@dataclass
class Snapshot:
    """One read of the agent database behind the library's back."""

    sessions: dict[str, tuple[int, bool]]  # key -> (id, dirty)
    events: dict[int, StoredEvent]
    by_session: dict[int, list[StoredEvent]]
    # rowid -> its index row: SQLite, column -> tokens in document order; PostgreSQL, the
    # row's session, depth, token count and terms (`read_pg_snapshot`)
    fts: dict[int, dict[str, Any]]


def read_snapshot(path: Path) -> Snapshot:
    """Sessions, events and indexed tokens of an agent database, in one read."""
    conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READWRITE)
    try:
        conn.set_busy_timeout(5000)
        with conn:  # one read transaction
            sessions = {
                str(key): (int(sid), bool(dirty))
                for key, sid, dirty in conn.execute("SELECT key, id, dirty FROM sessions")
            }
            events: dict[int, StoredEvent] = {}
            by_session: dict[int, list[StoredEvent]] = defaultdict(list)
            rows = conn.execute(
                "SELECT id, session_id, parent_id, seq, kind, content, text FROM events"
                " ORDER BY session_id, seq"
            )
            for event_id, sid, parent, seq, kind, content, text in rows:
                raw = bytes(content or b"").decode()
                marker = to = None
                if kind == "rewind":
                    to = int(json.loads(raw))
                elif found := MARKER.search(raw):
                    marker = found.group(0)
                event = StoredEvent(event_id, sid, parent, seq, kind, marker, to, text)
                events[event_id] = event
                by_session[sid].append(event)
            fts = indexed_tokens(conn)
    finally:
        conn.close()
    return Snapshot(sessions=sessions, events=events, by_session=by_session, fts=fts)


def indexed_tokens(conn: apsw.Connection) -> dict[int, dict[str, list[str]]]:
    """rowid -> column -> the tokens the FTS index holds, in document order."""
    conn.execute(
        "CREATE VIRTUAL TABLE IF NOT EXISTS temp.soak_vocab"
        " USING fts5vocab('main', 'message_fts', 'instance')"
    )
    found: dict[int, dict[str, list[tuple[int, str]]]] = defaultdict(lambda: defaultdict(list))
    for term, doc, col, offset in conn.execute(
        "SELECT term, doc, col, offset FROM temp.soak_vocab"
    ):
        found[int(doc)][str(col)].append((int(offset), str(term)))
    rowids = [int(r) for (r,) in conn.execute("SELECT rowid FROM message_fts")]
    return {
        rowid: {col: [t for _, t in sorted(terms)] for col, terms in found.get(rowid, {}).items()}
        for rowid in rowids
    }


def row_tokens(event_id: int, text: str, previous: str | None) -> dict[str, list[str]]:
    """column -> the tokens the index holds for a message's row (`previous`: the text before)."""
    _, words, grams, context = index_row(event_id, text, previous)
    columns = {"words": words, "grams": grams, "context": context}
    found = {col: [t for _, _, t in index_tokens(v.encode())] for col, v in columns.items() if v}
    return {col: tokens for col, tokens in found.items() if tokens}


def expected_index(
    branches: Mapping[str, list[int]], snap: Snapshot
) -> dict[str, dict[int, dict[str, Any]]]:
    """Per session: rowid -> column -> tokens, for the active-branch messages with text."""
    return {
        key: {
            event_id: row_tokens(event_id, text, previous)
            for event_id, _depth, text, previous in branch_texts(branch, snap)
        }
        for key, branch in branches.items()
    }


def branch_texts(
    branch: Sequence[int], snap: Snapshot
) -> Iterable[tuple[int, int, str, str | None]]:
    """(event id, depth, text, the text before it) of a branch's messages with text."""
    previous: str | None = None
    for depth, event_id in enumerate(branch, start=1):
        text = snap.events[event_id].text
        if text is not None:
            yield event_id, depth, text, previous
            previous = text


def compare_index(
    snap: Snapshot,
    expected: Mapping[str, dict[int, dict[str, Any]]],
    *,
    clean_only: bool,
) -> tuple[list[str], int]:
    """Differences between the index and the expected rows; and how many rows were compared."""
    problems: list[str] = []
    compared = 0
    owner = {e.event_id: e.session_id for e in snap.events.values()}
    for rowid in snap.fts:
        if rowid not in owner:
            problems.append(f"index row {rowid} has no event")
    for key, rows in expected.items():
        sid, dirty = snap.sessions[key]
        if clean_only and dirty:
            continue
        held = {r for r in snap.fts if owner.get(r) == sid}
        for rowid in sorted(held - rows.keys())[:3]:
            problems.append(f"{key}: index row {rowid} is not an active-branch message")
        for rowid in sorted(rows.keys() - held)[:3]:
            problems.append(f"{key}: active-branch message {rowid} is not indexed")
        for rowid in sorted(rows.keys() & held):
            compared += 1
            if snap.fts[rowid] != rows[rowid]:
                problems.append(
                    f"{key}: row {rowid} holds {snap.fts[rowid]}, expected {rows[rowid]}"
                )
    return problems, compared


# -- the same, on PostgreSQL (storage/pg: the index layout of storage/pg/terms.py) ---------


def read_pg_snapshot(dsn: str) -> Snapshot:
    """Sessions, events and index rows of agent main on PostgreSQL, in one snapshot."""
    import psycopg

    from activememory.storage.pg.db import SCHEMA

    with psycopg.connect(dsn) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with conn.transaction():
            sessions = {
                str(key): (int(sid), bool(dirty))
                for key, sid, dirty in conn.execute(
                    f"SELECT key, id, dirty FROM {SCHEMA}.sessions WHERE agent = %s", (AGENT,)
                )
            }
            events: dict[int, StoredEvent] = {}
            by_session: dict[int, list[StoredEvent]] = defaultdict(list)
            rows = conn.execute(
                f"SELECT id, session_id, parent_id, seq, kind, content, text FROM {SCHEMA}.events"
                " WHERE agent = %s ORDER BY session_id, seq",
                (AGENT,),
            )
            for event_id, sid, parent, seq, kind, content, text in rows:
                raw = bytes(content or b"").decode()
                marker = to = None
                if kind == "rewind":
                    to = int(json.loads(raw))
                elif found := MARKER.search(raw):
                    marker = found.group(0)
                decoded = None if text is None else bytes(text).decode()
                event = StoredEvent(
                    int(event_id), int(sid), parent, int(seq), kind, marker, to, decoded
                )
                events[event.event_id] = event
                by_session[event.session_id].append(event)
            fts = {
                int(event_id): {
                    "session_id": int(sid),
                    "depth": int(depth),
                    "tokens": int(tokens),
                    "terms": str(terms),
                }
                for event_id, sid, depth, tokens, terms in conn.execute(
                    f"SELECT event_id, session_id, depth, tokens, terms::text"
                    f" FROM {SCHEMA}.message_index WHERE agent = %s",
                    (AGENT,),
                )
            }
    return Snapshot(sessions=sessions, events=events, by_session=by_session, fts=fts)


def expected_pg_index(
    dsn: str, branches: Mapping[str, list[int]], snap: Snapshot
) -> dict[str, dict[int, dict[str, Any]]]:
    """Per session: event id -> the index row the PostgreSQL writer must have made for it
    (`index_terms`, the writer's own function), its terms as the server prints them."""
    import psycopg

    from activememory.storage.pg.terms import index_terms

    out: dict[str, dict[int, dict[str, Any]]] = {}
    literals: list[str] = []
    for key, branch in branches.items():
        sid, _ = snap.sessions[key]
        rows: dict[int, dict[str, Any]] = {}
        for event_id, depth, text, previous in branch_texts(branch, snap):
            terms = index_terms(text, previous)
            rows[event_id] = {"session_id": sid, "depth": depth, "tokens": terms.tokens}
            literals.append(terms.terms)
        out[key] = rows
    with psycopg.connect(dsn) as conn:  # the server's own form of each tsvector
        printed = conn.execute(
            "SELECT t::tsvector::text FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, n)"
            " ORDER BY n",
            (literals,),
        ).fetchall()
    rows_in_order = (row for rows in out.values() for row in rows.values())
    for row, (terms,) in zip(rows_in_order, printed, strict=True):
        row["terms"] = str(terms)
    return out


def path_to(snap: Snapshot, event_id: int) -> list[int]:
    """The branch from the session's first message down to `event_id` (cut short at an
    event the store no longer holds: the branch then differs from `history()`)."""
    path: list[int] = []
    at: int | None = event_id
    while at is not None and at in snap.events:
        path.append(at)
        at = snap.events[at].parent_id
    return path[::-1]


def replay_merged(
    key: str, ops: list[Op], events: list[StoredEvent], snap: Snapshot, problems: list[str]
) -> tuple[list[int], Counter[str]]:
    """Several workers on one session (docs/design.md §7): the store's events in seq order
    are the session's commit order (each transaction holds the session's row lock), so the
    ack logs are merged by walking them: each stored event must be an operation some worker
    logged on this session (acknowledged, or in flight when its worker was killed; never
    rejected), used once; an acknowledged append must be stored as acknowledged (event id,
    seq, parent) under the leaf the events before it made; a rewind makes its target's path
    the branch. Whatever a later rewind by any worker took off the branch stays stored.
    An acknowledged rewind with no stored event must have targeted a leaf the session had
    (a rewind to the leaf writes nothing). Returns the branch the events make."""
    counts: Counter[str] = Counter()
    appends = {op.marker: op for op in ops if op.kind == "append" and op.state != "rejected"}
    rewinds = Counter(op.to for op in ops if op.kind == "rewind" and op.state != "rejected")
    acked_rewinds = Counter(op.to for op in ops if op.kind == "rewind" and op.state == "acked")
    used: set[str] = set()
    branch: list[int] = []
    leaves: set[int | None] = {None}
    for event in events:
        if event.kind == "rewind":
            assert event.to is not None
            if rewinds[event.to] == 0:
                problems.append(
                    f"{key}: stored rewind {event.event_id} (seq {event.seq}) to {event.to}"
                    " matches no rewind of the ack logs"
                )
                return branch, counts
            rewinds[event.to] -= 1
            acked = acked_rewinds[event.to] > 0
            acked_rewinds[event.to] -= acked
            counts["acked" if acked else "unacked_commits"] += 1
            branch = path_to(snap, event.to)
            leaves.add(event.to)
            continue
        op = appends.get(event.marker) if event.marker is not None else None
        if op is None or op.marker in used:
            problems.append(
                f"{key}: stored event {event.event_id} (seq {event.seq}, message "
                f"{event.marker}) matches no operation of the ack logs"
            )
            return branch, counts
        assert op.marker is not None
        used.add(op.marker)
        counts["acked" if op.state == "acked" else "unacked_commits"] += 1
        if op.state == "acked" and (op.event_id, op.seq or event.seq) != (
            event.event_id,
            event.seq,
        ):
            problems.append(
                f"{key}: message {op.marker} acknowledged as event {op.event_id} (seq {op.seq}), "
                f"stored as {event.event_id} (seq {event.seq})"
            )
        problems += stored_append_problems(key, op, event, branch)
        branch.append(event.event_id)
        leaves.add(event.event_id)
    for op in appends.values():
        if op.state == "acked" and op.marker not in used:
            problems.append(
                f"{key}: acknowledged message {op.marker} (event {op.event_id}) is not in the "
                "store: LOST"
            )
    for to, unmatched in acked_rewinds.items():
        if unmatched > 0 and to not in leaves:
            problems.append(f"{key}: acknowledged rewind to {to} is not in the store: LOST")
    return branch, counts


@dataclass(frozen=True)
class Probe:
    """How the verifier reads one store behind the library's back."""

    storage: str | None  # None: SQLite in the state directory
    index_name: str  # what the integrity check checks, for the report
    snapshot: Callable[[], Snapshot]
    expected: Callable[[Mapping[str, list[int]], Snapshot], dict[str, dict[int, dict[str, Any]]]]
    replay: Callable[
        [str, list[Op], list[StoredEvent], Snapshot, list[str]], tuple[list[int], Counter[str]]
    ]  # replay_session (one worker, its log's order) or replay_merged (several: seq order)


def probe(state_dir: Path, storage: str | None) -> Probe:
    """The verifier's reads of the SQLite agent database, or of PostgreSQL at `storage`."""
    if storage is None:
        path = agent_db_path(state_dir, AGENT)
        return Probe(None, "FTS5", lambda: read_snapshot(path), expected_index, replay_session)
    return Probe(
        storage,
        "index",
        lambda: read_pg_snapshot(storage),
        functools.partial(expected_pg_index, storage),
        replay_merged,
    )


@dataclass
class Verification:
    """The outcome of the end-of-run checks (a) and (b), with what they counted."""

    lost: list[str] = field(default_factory=list)  # check (a)
    index: list[str] = field(default_factory=list)  # check (b)
    counts: dict[str, int] = field(default_factory=dict)


def stored_append_problems(key: str, op: Op, event: StoredEvent, branch: list[int]) -> list[str]:
    """What is wrong with `event`, stored for the append `op` with `branch` before it: its
    index text, and its parent (the branch's leaf, and the parent acknowledged)."""
    problems: list[str] = []
    if event.text != op.text:
        problems.append(
            f"{key}: event {event.event_id} has index text {event.text!r}, expected {op.text!r}"
        )
    leaf = branch[-1] if branch else None
    if event.parent_id != leaf or (op.check_parent and op.parent != leaf):
        problems.append(
            f"{key}: event {event.event_id} appended under {event.parent_id} "
            f"(acknowledged under {op.parent}), the leaf was {leaf}"
        )
    return problems


def replay_session(
    key: str, ops: list[Op], events: list[StoredEvent], snap: Snapshot, problems: list[str]
) -> tuple[list[int], Counter[str]]:
    """Match the session's stored operations with its logged ones; return the branch."""
    counts: Counter[str] = Counter()
    branch: list[int] = []
    j = 0

    def matches(op: Op, event: StoredEvent) -> bool:
        if op.kind == "append":
            return event.kind == "message" and event.marker == op.marker
        return event.kind == "rewind" and event.to == op.to

    for event in events:
        while j < len(ops):
            op = ops[j]
            if op.state == "rejected":
                j += 1
                continue
            if matches(op, event):
                j += 1
                counts["acked" if op.state == "acked" else "unacked_commits"] += 1
                if op.kind == "append":
                    if op.state == "acked" and op.event_id != event.event_id:
                        problems.append(
                            f"{key}: message {op.marker} acknowledged as event {op.event_id}, "
                            f"stored as {event.event_id}"
                        )
                    problems += stored_append_problems(key, op, event, branch)
                    branch.append(event.event_id)
                else:
                    assert event.to is not None
                    branch = path_to(snap, event.to)
                break
            if op.state == "in_flight":  # it did not commit
                j += 1
                continue
            if op.kind == "rewind" and branch and branch[-1] == op.to:
                j += 1  # a rewind to the leaf writes nothing
                continue
            problems.append(
                f"{key}: stored event {event.event_id} (seq {event.seq}, {event.kind} "
                f"{event.marker or event.to}) where the acknowledged {op.kind} "
                f"{op.marker or op.to} was expected"
            )
            return branch, counts
        else:
            problems.append(
                f"{key}: stored event {event.event_id} ({event.kind} {event.marker or event.to})"
                " matches no operation of the ack log"
            )
            return branch, counts
    for op in ops[j:]:
        if op.state != "acked":
            continue
        if op.kind == "rewind" and branch and branch[-1] == op.to:
            continue
        what = f"message {op.marker} (event {op.event_id})" if op.kind == "append" else "rewind"
        problems.append(f"{key}: acknowledged {what} is not in the store: LOST")
    return branch, counts


async def verify(state_dir: Path, acked: AckedOps, storage: str | None = None) -> Verification:
    """Checks (a) and (b): open the store (the state directory, or PostgreSQL at
    `storage`) and compare it with the ack log(s)."""
    result = Verification()
    store = probe(state_dir, storage)
    counts: Counter[str] = Counter()
    async with am.open_memory(state_dir, storage=storage) as mem:
        for stats in await mem.sessions.stats():
            if not stats.fts_integrity_ok:
                result.index.append(
                    f"{stats.agent}: {store.index_name} integrity check failed on reopening"
                )
        snap = store.snapshot()
        histories = {key: [e.id for e in await mem.sessions.history(key)] for key in snap.sessions}
        # (a) every session's stored operations against the ack log.
        markers: dict[str, int] = {}
        for event in snap.events.values():
            if event.marker is not None:
                if event.marker in markers:
                    result.lost.append(
                        f"message {event.marker} stored twice: events {markers[event.marker]} "
                        f"and {event.event_id}"
                    )
                markers[event.marker] = event.event_id
        for marker, key in acked.rejected_markers.items():
            if marker in markers:
                result.lost.append(
                    f"{key}: message {marker} was rejected but is stored (event {markers[marker]})"
                )
        branches: dict[str, list[int]] = {}
        for key in sorted(set(snap.sessions) | set(acked.sessions)):
            ops = acked.sessions.get(key, [])
            if key not in snap.sessions:
                if any(op.state == "acked" for op in ops):
                    result.lost.append(f"{key}: acknowledged session is not in the store: LOST")
                continue
            sid, _ = snap.sessions[key]
            branch, session_counts = store.replay(
                key, ops, snap.by_session.get(sid, []), snap, result.lost
            )
            counts.update(session_counts)
            branches[key] = branch
            if histories[key] != branch:
                result.lost.append(
                    f"{key}: history() is {histories[key][-5:]} (last 5), the operations give "
                    f"{branch[-5:]}"
                )
            on_branch = set(branch)
            for op in ops:
                if op.state == "acked" and op.kind == "append":
                    counts[
                        "acked_on_branch" if op.event_id in on_branch else "acked_rewound_off"
                    ] += 1
        counts["dirty_before_rebuild"] = sum(dirty for _, dirty in snap.sessions.values())
        # (b) the index as the workload left it: clean sessions must be exact.
        expected = store.expected(branches, snap)
        problems, compared = compare_index(snap, expected, clean_only=True)
        result.index += [f"as left: {p}" for p in problems]
        counts["rows_compared_as_left"] = compared
        # ... and after rebuild_index(), every session, with nothing else in the index.
        await mem.sessions.rebuild_index()
        for stats in await mem.sessions.stats():
            if not stats.fts_integrity_ok:
                result.index.append(
                    f"{stats.agent}: {store.index_name} integrity check failed after rebuild"
                )
            if stats.dirty_sessions or stats.indexed_messages != stats.active_messages:
                result.index.append(f"{stats.agent}: after rebuild_index(): {stats}")
    after = store.snapshot()  # the memory is closed: a fresh connection
    if {e: (ev.text, ev.parent_id) for e, ev in after.events.items()} != {
        e: (ev.text, ev.parent_id) for e, ev in snap.events.items()
    }:
        result.index.append("rebuild_index() changed stored events")
    problems, compared = compare_index(after, expected, clean_only=False)
    result.index += [f"after rebuild: {p}" for p in problems]
    counts["rows_compared_after_rebuild"] = compared
    counts["index_rows"] = len(after.fts)
    counts["sessions"] = len(after.sessions)
    counts["events"] = len(after.events)
    counts["active_messages"] = sum(len(b) for b in branches.values())
    result.counts = dict(counts)
    return result


# -- the report ---------------------------------------------------------------------------


def latency(values: Sequence[float]) -> dict[str, float]:
    """count, p50, p99 and max of `values`."""
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50": round(percentile(ordered, 50), 1),
        "p99": round(percentile(ordered, 99), 1),
        "max": round(ordered[-1], 1) if ordered else 0.0,
    }


def growth(samples: Sequence[int]) -> float | None:
    """Median of the last 20% over the median of the first 20%, minus one."""
    if len(samples) < RSS_MIN_SAMPLES:
        return None
    fifth = max(1, len(samples) // 5)
    first, last = statistics.median(samples[:fifth]), statistics.median(samples[-fifth:])
    return round(last / first - 1, 4)


def rss_report(rss: Sequence[RssSample], warmup_s: float) -> dict[str, Any]:
    """RSS over the soak, and its growth in the last (kill-free) run after its warm-up.

    A kill starts a fresh process and so resets RSS: only a run that lives well past its
    warm-up (bounded caches filling: SQLite page caches, the recall cache) can show a leak.
    """
    ordered = sorted(rss, key=lambda sample: sample.at_s)
    last_run = max((sample.run for sample in ordered), default=0)
    final = [sample for sample in ordered if sample.run == last_run]
    warm = [sample for sample in final if sample.age_s >= warmup_s]
    fifth = max(1, len(warm) // 5)

    def median_mib(values: Iterable[int]) -> float | None:
        found = list(values)
        return _mib(statistics.median(found)) if found else None

    picks = [ordered[round(i * (len(ordered) - 1) / 11)] for i in range(12)] if ordered else []
    return {
        "warmup_s": warmup_s,
        "samples": len(ordered),
        "final_run": last_run,
        "final_run_s": round(final[-1].age_s, 1) if final else 0.0,
        "judged_samples": len(warm),
        "growth": growth([sample.kib for sample in warm]),
        # What the check judges: RSS less the vector index, which holds a vector per
        # message by design (docs/design.md §2.3) and so grows with the data, not a leak.
        "net_growth": growth([sample.kib - sample.vector_kib for sample in warm]),
        "vector_first_mib": median_mib(x.vector_kib for x in warm[:fifth]),
        "vector_last_mib": median_mib(x.vector_kib for x in warm[-fifth:]),
        "first_mib": median_mib(x.kib for x in warm[:fifth]),
        "last_mib": median_mib(x.kib for x in warm[-fifth:]),
        "sqlite_first_mib": median_mib(x.sqlite_kib for x in warm[:fifth]),
        "sqlite_last_mib": median_mib(x.sqlite_kib for x in warm[-fifth:]),
        "over_time": [
            {
                "t_s": round(x.at_s, 1),
                "run": x.run,
                "age_s": round(x.age_s, 1),
                "mib": _mib(x.kib),
                "sqlite_mib": _mib(x.sqlite_kib),
                "vector_mib": _mib(x.vector_kib),
            }
            for x in picks
        ],
        "peak_mib": _mib(max((x.kib for x in ordered), default=0)),
    }


def _mib(kib: float) -> float:
    return round(kib / 1024, 1)


def reasons(recalls: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, int]]:
    """Per status other than ok: the most common reasons the outcomes gave."""
    found: dict[str, Counter[str]] = defaultdict(Counter)
    for r in recalls:
        if r["st"] != "ok":
            found[str(r["st"])][str(r.get("why") or "-")] += 1
    return {status: dict(why.most_common(3)) for status, why in found.items()}


def by_run(recalls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per workload run: when it started, its recalls, and how many were not ok."""
    runs: dict[int, dict[str, Any]] = {}
    for r in recalls:
        run = runs.setdefault(int(r["inc"]), {"run": int(r["inc"]), "from_s": r["at"]})
        run["recalls"] = run.get("recalls", 0) + 1
        if r["st"] != "ok":
            run[str(r["st"])] = run.get(str(r["st"]), 0) + 1
    return [{**run, "from_s": round(run["from_s"])} for _, run in sorted(runs.items())]


def check(name: str, title: str, status: Status, detail: str) -> dict[str, str]:
    """One PASS/FAIL/SKIP line of the report."""
    return {"name": name, "title": title, "result": status, "detail": detail}


def build_report(
    args: argparse.Namespace,
    state_dir: Path,
    live: Live,
    runs: RunLog,
    acked: AckedOps,
    verified: Verification,
    *,
    kept: bool,
) -> dict[str, Any]:
    """Everything measured and the verdict of each check."""
    bound_ms = args.timeout_ms + PREFLIGHT_AND_FINALIZE_MS
    recalls = list(live.recalls)
    plain = [r for r in recalls if r["op"] == "recall"]
    replies = [r for r in recalls if r["op"] == "reply"]
    statuses = Counter(str(r["st"]) + (" (breaker open)" if r.get("cb") else "") for r in recalls)
    raised = [r for r in recalls if str(r["st"]).startswith("raised")]
    over = [r for r in plain if float(r["wall"]) > bound_ms]
    over += [r for r in replies if "el" in r and float(r["el"]) > bound_ms]
    work_s = max(runs.work_s, 1e-9)
    appends = acked.count("append", "acked")
    behaviours: Counter[str] = Counter()
    for tick in live.ticks.values():
        behaviours.update(tick.get("behaviours", {}))
    leaks = live.total("leaks")
    rss = rss_report(live.rss, args.warmup)
    checks = []
    order = "in order" if args.storage is None else "in each session's commit order (seq)"
    a_detail = (
        f"{appends} acknowledged messages and {acked.count('rewind', 'acked')} rewinds all "
        f"stored {order}; {verified.counts.get('acked_on_branch', 0)} on the active branch, "
        f"{verified.counts.get('acked_rewound_off', 0)} rewound off; "
        f"{verified.counts.get('unacked_commits', 0)} in-flight operations committed unacked"
    )
    checks.append(
        check(
            "a",
            "nothing acknowledged lost; active branches as the operations made them",
            "FAIL" if verified.lost else "PASS",
            "; ".join(verified.lost[:8]) if verified.lost else a_detail,
        )
    )
    b_detail = (
        f"{verified.counts.get('rows_compared_as_left', 0)} rows exact as left "
        f"({verified.counts.get('dirty_before_rebuild', 0)} dirty sessions skipped), "
        f"{verified.counts.get('rows_compared_after_rebuild', 0)} rows exact after "
        f"rebuild_index(), no stray rows, integrity-check ok"
    )
    checks.append(
        check(
            "b",
            "FTS index equals the active branches"
            if args.storage is None
            else "index (message_index) equals the active branches",
            "FAIL" if verified.index else "PASS",
            "; ".join(verified.index[:8]) if verified.index else b_detail,
        )
    )
    worst = max([float(r["wall"]) for r in plain] + [float(r.get("el", 0)) for r in replies] + [0])
    c_fail = bool(over or raised)
    c_detail = (
        f"{len(over)} over the bound, {len(raised)} raised"
        if c_fail
        else f"all {len(recalls)} within {bound_ms} ms (worst {worst:.0f} ms), none raised"
    )
    checks.append(
        check(
            "c",
            f"every recall within timeoutMs + 3000 = {bound_ms} ms",
            "FAIL" if c_fail else "PASS",
            c_detail,
        )
    )
    g = rss["net_growth"]
    if g is None:
        d_status: Status = "SKIP"
        d_detail = (
            f"the last run lived {rss['final_run_s']:.0f} s: {rss['judged_samples']} samples "
            f"after its {rss['warmup_s']:g} s warm-up (need {RSS_MIN_SAMPLES})"
        )
    else:
        d_status = "FAIL" if g > RSS_GROWTH_MAX else "PASS"
        d_detail = (
            f"last run ({rss['final_run_s']:.0f} s, no kills), after its {rss['warmup_s']:g} s "
            f"warm-up: median {rss['first_mib']} -> {rss['last_mib']} MiB "
            f"({rss['growth']:+.1%}), of it the vector index {rss['vector_first_mib']} -> "
            f"{rss['vector_last_mib']} MiB; without it {g:+.1%}; "
            f"SQLite heap {rss['sqlite_first_mib']} -> {rss['sqlite_last_mib']} MiB"
        )
    checks.append(
        check(
            "d",
            f"RSS growth after warm-up, beyond the vector index, <= {RSS_GROWTH_MAX:.0%}",
            d_status,
            d_detail,
        )
    )
    checks.append(
        check(
            "e",
            "no group message reached a recall",
            "FAIL" if leaks else "PASS",
            f"{leaks} recall runs saw group text"
            if leaks
            else f"{sum(behaviours.values())} recall runs scanned",
        )
    )
    if (
        runs.problems
        or runs.failed_starts
        or acked.bad_lines > len(runs.kills)
        or acked.unresolved_at_clean_exit
        or live.errors
    ):
        problems = list(runs.problems)
        problems += [f"{n} operations failed: {why}" for why, n in live.errors.items()]
        problems += [f"failed to start: {why}" for why in runs.failed_starts]
        if acked.bad_lines > len(runs.kills):
            problems.append(f"{acked.bad_lines} unreadable ack-log lines, {len(runs.kills)} kills")
        if acked.unresolved_at_clean_exit:
            problems.append(f"{acked.unresolved_at_clean_exit} operations unanswered at clean exit")
        checks.append(check("run", "the workload ran as planned", "FAIL", "; ".join(problems)))
    rejected = sum(acked.rejections.values())
    return {
        "soak": {
            "sessions": args.sessions,
            "groups": len(session_keys(args.sessions)[1]),
            "append_rate": args.append_rate,
            "recall_rate": args.recall_rate,
            "duration_s": args.duration,
            "faults": args.faults,
            "seed": args.seed,
            "timeout_ms": args.timeout_ms,
            "bound_ms": bound_ms,
            "kill_every_s": list(args.kill_every) if args.faults else None,
            "steady_s": args.steady,
            "warmup_s": args.warmup,
            "workers": args.workers,
            "storage": "sqlite" if args.storage is None else "postgresql",
        },
        "run": {
            "wall_s": round(runs.work_s, 1),
            "workload_runs": runs.runs,
            "kills": len(runs.kills),
            "kill_times_s": [round(t, 1) for t in runs.kills],
            "restarts": max(0, runs.runs - args.workers),
            "failed_starts": runs.failed_starts,
            "downtime_s": round(runs.downtime_s, 1),
            "late_starts": live.total("late"),
            "problems": runs.problems,
        },
        "throughput": {
            "messages_acked": appends,
            "messages_acked_per_s": round(appends / work_s, 1),
            "reply_messages_acked": acked.replies_acked(),
            "rewinds_acked": acked.count("rewind", "acked"),
            "rejected": rejected,
            "rejected_reasons": dict(acked.rejections.most_common(5)),
            "recalls": len(recalls),
            "recalls_per_s": round(len(recalls) / work_s, 1),
        },
        "recall": {
            "recall_wall_ms": latency([float(r["wall"]) for r in plain]),
            "reply_recall_step_ms": latency([float(r["el"]) for r in replies if "el" in r]),
            "reply_wall_ms": latency([float(r["wall"]) for r in replies]),
            "statuses": dict(statuses.most_common()),
            "reasons": reasons(recalls),
            "by_run": by_run(recalls),
            "timeouts": sum(
                1 for r in recalls if r["st"] in ("timeout", "timeout_partial") and not r.get("cb")
            ),
            "breaker_skips": sum(1 for r in recalls if r.get("cb")),
            "breaker_trips": live.trips,
            "cached": sum(1 for r in recalls if r.get("cached")),
            "model_behaviours": dict(behaviours.most_common()),
        },
        "faults": {
            "kills": len(runs.kills),
            "busy_writer_holds": len(live.holds),
            "busy_writer_held_s": round(sum(live.holds) / 1000, 1),
            "busy_writer_missed": live.busy_misses,
        },
        "rss": rss,
        "embedder": embedder_report(live, work_s),
        "verify": verified.counts,
        "checks": checks,
        "ok": all(c["result"] != "FAIL" for c in checks),
        "environment": {
            "python": platform.python_version(),
            "sqlite": apsw.sqlite_lib_version(),
            "cpus": os.cpu_count(),
            "state_dir": str(state_dir),
            "state_dir_kept": kept,
        },
    }


def embedder_report(live: Live, work_s: float) -> dict[str, Any]:
    """The embedder's background rate and lag under the soak's load (not a check)."""
    with live.lock:
        reports = list(live.embedder.values())
        waits = [w * 1000 for w in live.vector_waits]
        pending = list(live.vectors_pending)
    on = [r for r in reports if r.get("on")]
    if not on:
        return {"on": False}
    stored = sum(int(r["stored"]) for r in on)
    computed = sum(int(r.get("computed", 0)) for r in on)
    skipped = sum(int(r.get("skipped", 0)) for r in on)
    ordered = sorted(pending)
    last = on[-1]
    return {
        "on": True,
        "name": last["name"],
        "vectors_stored": stored,
        "texts_embedded": computed,
        "vectors_skipped": skipped,
        "vectors_per_s": round(stored / work_s, 1),
        "wait_ms": latency(waits),
        "pending_rows": {
            "samples": len(ordered),
            "p50": int(percentile(ordered, 50)) if ordered else 0,
            "max": ordered[-1] if ordered else 0,
            "last": pending[-1] if pending else 0,
        },
        "waiting_at_end": int(last["waiting"]),
        "oldest_waiting_at_end_s": float(last["oldest"]),
        "error": last["error"],
    }


def format_report(report: dict[str, Any]) -> str:
    """The report for a person."""
    s, r, t, rc, f, rss = (
        report[k] for k in ("soak", "run", "throughput", "recall", "faults", "rss")
    )

    def lat(name: str, p: dict[str, float]) -> str:
        return f"    {name:<26} {p['p50']:>8.1f} {p['p99']:>8.1f} {p['max']:>8.1f}   ({p['count']} runs)"

    lines = [
        f"Load soak: {s['sessions']} private sessions + {s['groups']} groups, "
        f"{s['append_rate']:g} appends/s, {s['recall_rate']:g} recalls/s, {s['duration_s']:g} s, "
        f"faults {'on' if s['faults'] else 'off'}, seed {s['seed']}"
        + (
            f"; PostgreSQL, {s['workers']} workers sharing the sessions"
            if s.get("storage") == "postgresql"
            else ""
        ),
        f"  run: {r['wall_s']:.1f} s wall, {r['workload_runs']} workload runs, {r['kills']} kill -9 "
        f"({r['restarts']} restarts, {len(r['failed_starts'])} of them failed to start, "
        f"{r['downtime_s']:.1f} s down), {r['late_starts']} late starts",
        f"  throughput: {t['messages_acked']} messages acked ({t['messages_acked_per_s']:.1f}/s, "
        f"{t['reply_messages_acked']} of them by mem.reply), {t['rewinds_acked']} rewinds, "
        f"{t['recalls']} recalls ({t['recalls_per_s']:.1f}/s)",
        f"  rejected appends: {t['rejected']}"
        + "".join(f"\n    {n} x {why}" for why, n in t["rejected_reasons"].items()),
        f"  recall latency (ms; bound {s['bound_ms']})     p50      p99      max",
        lat("mem.recall (wall)", rc["recall_wall_ms"]),
        lat("mem.reply recall step", rc["reply_recall_step_ms"]),
        lat("mem.reply whole (wall)", rc["reply_wall_ms"]),
        "  statuses: " + ", ".join(f"{k} {v}" for k, v in rc["statuses"].items()),
        *(
            f"    {status}: " + "; ".join(f"{n} x {why}" for why, n in why_counts.items())
            for status, why_counts in rc["reasons"].items()
        ),
        "  per run (from s: recalls, no_relevant_memory): "
        + ", ".join(
            f"{x['run']} ({x['from_s']} s: {x['recalls']}, {x.get('no_relevant_memory', 0)})"
            for x in rc["by_run"]
        ),
        f"  budget timeouts (timeout + timeout_partial) {rc['timeouts']}, breaker trips {rc['breaker_trips']}, "
        f"skipped by the open breaker {rc['breaker_skips']}, cached {rc['cached']}",
        "  model behaviours: " + ", ".join(f"{k} {v}" for k, v in rc["model_behaviours"].items()),
        f"  faults: {f['kills']} kill -9, busy writer held the write lock {f['busy_writer_holds']} "
        f"times ({f['busy_writer_held_s']:.1f} s), {f['busy_writer_missed']} times it could not get it"
        if s.get("storage") != "postgresql"
        else f"  faults: {f['kills']} kill -9 of a worker (the others running); no busy writer "
        "(the workers contend for the sessions' row locks)",
        f"  RSS: peak {rss['peak_mib']} MiB; over time (soak s / run / MiB, SQLite heap MiB, "
        "vector index MiB): "
        + ", ".join(
            f"{p['t_s']:.0f}/{p['run']}/{p['mib']} ({p['sqlite_mib']}, {p['vector_mib']})"
            for p in rss["over_time"]
        ),
        *_embedder_lines(report["embedder"]),
        "  store: " + ", ".join(f"{k} {v}" for k, v in report["verify"].items()),
        "",
    ]
    for c in report["checks"]:
        lines.append(f"  {c['result']} ({c['name']}) {c['title']}: {c['detail']}")
    env = report["environment"]
    lines += [
        "",
        f"  environment: Python {env['python']}, SQLite {env['sqlite']}, {env['cpus']} CPUs; "
        f"state dir {env['state_dir']}"
        + ("" if env["state_dir_kept"] else " (temporary, removed)")
        + (
            f"; PostgreSQL {pg['server']}, database {pg['database']}"
            + ("" if pg["database_kept"] else " (created and dropped)")
            if (pg := env.get("postgresql"))
            else ""
        ),
        "  result: " + ("PASS" if report["ok"] else "FAIL"),
    ]
    return "\n".join(lines)


def _embedder_lines(e: dict[str, Any]) -> list[str]:
    if not e.get("on"):
        return ["  embedder: off (no vectors)"]
    w, p = e["wait_ms"], e["pending_rows"]
    return [
        f"  embedder {e['name']}: {e['vectors_stored']} vectors stored, "
        f"{e['vectors_skipped']} skipped (changed before stored), "
        f"{e['texts_embedded']} texts embedded "
        f"({e['vectors_per_s']:.1f}/s); rows waiting for a vector (each second) p50 {p['p50']}, "
        f"max {p['max']}, last {p['last']}; "
        f"error {e['error'] or 'none'}",
        f"    ack -> vector (ms): p50 {w['p50']:.1f}, p99 {w['p99']:.1f}, max {w['max']:.1f} "
        f"({w['count']} appends); {e['waiting_at_end']} still waiting at the end "
        f"(oldest {e['oldest_waiting_at_end_s']:.1f} s)",
    ]


# -- the command --------------------------------------------------------------------------


def _rate(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}") from None
    if not number >= 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value!r}")
    return number


def _seconds(value: str) -> float:
    number = _rate(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {value!r}")
    return number


def _interval(value: str) -> tuple[float, float]:
    low, sep, high = value.partition(",")
    try:
        pair = (float(low), float(high if sep else low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, got {value!r}") from None
    if not 0 < pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"expected 0 < MIN <= MAX seconds, got {value!r}")
    return pair


def _timeout_ms(value: str) -> int:
    number = positive_int(value)
    if not 250 <= number <= 120000:
        raise argparse.ArgumentTypeError(f"expected 250-120000 (timeoutMs), got {value!r}")
    return number


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (`sys.argv[1:]` when `argv` is None)."""
    parser = argparse.ArgumentParser(
        prog="activememory soak",
        description="The load soak: appends and recalls at set rates under faults "
        "(kill -9 and restart, a busy second writer, misbehaving recall models), then checks "
        "that nothing acknowledged was lost and the index equals the active branches.",
    )
    parser.add_argument("--sessions", type=positive_int, default=200, help="private sessions")
    parser.add_argument("--append-rate", type=_rate, default=50.0, help="messages/s overall")
    parser.add_argument("--recall-rate", type=_rate, default=20.0, help="recalls/s overall")
    parser.add_argument("--duration", type=_seconds, default=600.0, help="seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="misbehaving recall model, busy second writer, kill -9 of the workload (default on)",
    )
    parser.add_argument(
        "--kill-every",
        type=_interval,
        default=(20.0, 60.0),
        metavar="MIN,MAX",
        help="seconds between kills, drawn uniformly (default 20,60)",
    )
    parser.add_argument("--timeout-ms", type=_timeout_ms, default=300, help="recall timeoutMs")
    parser.add_argument(
        "--steady",
        type=_rate,
        help="the last SECONDS run without kills, for the RSS check (default: half of --duration)",
    )
    parser.add_argument(
        "--warmup",
        type=_rate,
        default=120.0,
        help="seconds of the last run left out of the RSS check (default 120)",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        help="keep the state here (default: a temporary directory, removed afterwards)",
    )
    parser.add_argument("--fsync-acks", action="store_true", help="fsync each ack-log line")
    parser.add_argument(
        "--embedder",
        choices=list(SHIPPED_MODELS),
        help="the shipped embedding model (default: the config's default; with --storage,"
        " none: text only)",
    )
    parser.add_argument(
        "--storage",
        metavar="DSN",
        help="run on PostgreSQL: a connection string. Naming a database (dbname): it must hold "
        "no store yet and is kept; naming none: the soak creates its own on that server and "
        'drops it afterwards. "sqlite": the state directory\'s files (the default)',
    )
    parser.add_argument(
        "--workers",
        type=positive_int,
        default=1,
        help="workload processes sharing the sessions (more than 1 needs --storage)",
    )
    parser.add_argument("--progress", action="store_true", help="a live progress line on stderr")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    # The soak's own processes.
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--busy-writer", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--incarnation", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--until", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--ack-log", default=ACK_LOG, help=argparse.SUPPRESS)
    parser.add_argument("--storage-env", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.storage == "sqlite":  # as every command's --storage says it
        args.storage = None
    if args.workers > 1 and args.storage is None:
        parser.error(
            f"--workers: {args.workers} workers need --storage (a PostgreSQL connection string): "
            "SQLite has one writer process"
        )
    if args.steady is None:
        args.steady = args.duration / 2
    return args


@contextlib.contextmanager
def soak_database(dsn: str) -> Iterator[tuple[str, str, bool]]:
    """(DSN, database name, kept) of the PostgreSQL database the soak runs in: the one `dsn`
    names, which must hold no store yet (kept afterwards, like `--state-dir`); or, when
    `dsn` names none, `activememory_soak_<random>`, created on that server and dropped on
    exit (also with connections still open)."""
    import psycopg
    import psycopg.conninfo

    from activememory.storage.pg.db import SCHEMA

    try:
        named = psycopg.conninfo.conninfo_to_dict(dsn).get("dbname")
    except psycopg.ProgrammingError as exc:
        raise am.InvalidInputError(
            f"--storage: not a PostgreSQL connection string: {exc}"
        ) from None
    try:
        admin = psycopg.connect(
            dsn if named else psycopg.conninfo.make_conninfo(dsn, dbname="postgres"),
            autocommit=True,
            connect_timeout=10,
        )
    except psycopg.OperationalError as exc:
        raise am.InvalidInputError(f"--storage: {str(exc).strip()}") from None
    if named:
        with admin:
            held = admin.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (SCHEMA,)
            ).fetchone()
        if held:
            raise am.InvalidInputError(
                f"--storage: database {named!r} already holds a store (schema {SCHEMA}); "
                "name an empty database, or none (the soak then creates its own)"
            )
        yield dsn, str(named), True
        return
    name = f"activememory_soak_{secrets.token_hex(4)}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield psycopg.conninfo.make_conninfo(dsn, dbname=name), name, False
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run(args: argparse.Namespace, state_dir: Path, kept: bool) -> dict[str, Any]:
    """Run the soak in `state_dir` (and on PostgreSQL with `--storage`) and verify it;
    return the report."""
    logs = [state_dir / ack_log_name(w, args.workers) for w in range(args.workers)]
    if any(path.exists() for path in logs) or agent_db_path(state_dir, AGENT).exists():
        raise am.InvalidInputError(
            f"--state-dir: {str(state_dir)!r} already holds a soak or a memory; use an empty one"
        )
    if args.storage is None:
        live = Live()
        runs = drive(args, state_dir, live)
        acked = read_ack_log(state_dir / ACK_LOG)
        verified = trio.run(verify, state_dir, acked)
        return build_report(args, state_dir, live, runs, acked, verified, kept=kept)
    with soak_database(args.storage) as (dsn, database, database_kept):
        live = Live()
        runs = drive(args, state_dir, live, dsn)
        acked = read_ack_logs(logs)
        verified = trio.run(verify, state_dir, acked, dsn)
        report = build_report(args, state_dir, live, runs, acked, verified, kept=kept)
        report["environment"]["postgresql"] = {
            "server": _pg_server_version(dsn),
            "database": database,
            "database_kept": database_kept,
        }
    return report


def _pg_server_version(dsn: str) -> str:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else "?"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the soak and print its report (or `--json`).

    Returns 0 when every check passes, 1 when one fails, 2 for an unusable `--state-dir`.
    """
    args = parse_args(argv)
    if args.child:
        return trio.run(run_child, args)
    if args.busy_writer:
        return run_busy_writer(args)
    try:
        measure = functools.partial(run, args)
        report = runner.in_state_dir(args.state_dir, "activememory-soak-", measure)
    except (runner.StateDirError, am.InvalidInputError) as exc:
        return runner.fail("soak", exc, 2)
    runner.emit(report, format_report, as_json=args.json)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
