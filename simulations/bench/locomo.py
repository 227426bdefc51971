"""Retrieval quality of `sessions_search` on LoCoMo: recall@k of the gold evidence turns (docs/design.md §7).

LoCoMo (Maharana et al., 2024) is a public benchmark of long two-person conversations with
questions whose gold evidence names the turns that hold the answer. Its dev split (two
conversations) lives in `../shared/data/locomo/` next to the repository; its licence
(CC BY-NC 4.0) forbids committing it, so the benchmark skips (exit 0) when it is absent.

Each sample is imported as its own agent, one explicit session per LoCoMo session and one
message per turn (`activememory._importers.read_locomo`), the index is rebuilt, and every
question is asked through `mem.sessions.search` from one of the sample's sessions with
visibility `agent`, so it searches that conversation only: by words (`--mode text`, the
default), by words and meaning (`--mode hybrid`: the shipped embedder, or the one `--config`
names, after every turn has its vector), or both in one run (`--mode both`). `--config FILE`
(JSON5) is merged under the benchmark's visibility, e.g. to try other fusion weights
(`agents.defaults.memorySearch.query.hybrid`). Scoring follows the dataset
README: recall@k = |gold ∩ top k| / |gold|, averaged over the questions of categories 1-4
(category 5, adversarial, reported apart); questions left without gold are skipped.

    activememory bench locomo [--data PATH] [--mode text|hybrid|both] [--config FILE]
                              [--json] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw
import msgspec
import trio

import activememory as am

from ..._importers import LocomoSample, LocomoTurn, locomo_turn_text, read_locomo
from . import runner
from .runner import BenchmarkError, percentile

ENV_DATA = "ACTIVEMEMORY_LOCOMO"
# ../shared/data/locomo/ relative to the repository root (this file is simulations/bench/<name>).
DEFAULT_DATA = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "locomo" / "locomo-dev.json"
)
KS = (1, 5, 10, 20)
MAX_LIMIT = 25  # the search's own cap (docs/design.md §3)
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
SCORED = (1, 2, 3, 4)
CONFIG = {"tools": {"sessions": {"visibility": "agent"}}}
MODES = {"text": ("text",), "hybrid": ("hybrid",), "both": ("text", "hybrid")}
VECTORS_WAIT_S = 1800.0
# The README's floor: plain FTS5 (porter unicode61), non-stopword terms OR-ed, bm25.
REFERENCE = {"1": 0.333, "5": 0.532, "10": 0.607, "20": 0.688}


def _plain(turn: LocomoTurn, speaker: str) -> str:
    return turn.text


def _speaker(turn: LocomoTurn, speaker: str) -> str:
    return f"{speaker}: {turn.text}"


def _photo(turn: LocomoTurn, speaker: str) -> str:
    if turn.blip_caption:
        return f"{turn.text} [shares a photo: {turn.blip_caption}]"
    return turn.text


# Ways of writing a turn as a message, compared when tuning `locomo_turn_text`.
TURN_TEXTS: dict[str, Callable[[LocomoTurn, str], str]] = {
    "default": locomo_turn_text,  # speaker + photo
    "plain": _plain,
    "speaker": _speaker,
    "photo": _photo,
}


@dataclass(frozen=True)
class Asked:
    """One question's outcome: its gold turns and the turns the search ranked, best first."""

    sample_id: str
    category: int
    gold: tuple[str, ...]
    ranked: tuple[str, ...]
    seconds: float

    def recall(self, k: int) -> float:
        """|gold ∩ top k| / |gold|."""
        top = set(self.ranked[:k])
        return sum(1 for dia_id in self.gold if dia_id in top) / len(self.gold)


@dataclass(frozen=True)
class ModeRun:
    """The questions asked in one mode, and how the answers were flagged."""

    asked: list[Asked]
    indexing_answers: int
    truncated_answers: int
    fallback_answers: int  # hybrid asked, text answered (the embedder failed or was slow)


@dataclass(frozen=True)
class Run:
    """Everything one benchmark run measured."""

    samples: list[LocomoSample]
    modes: dict[str, ModeRun]
    skipped_no_gold: int
    import_seconds: float
    rebuild_seconds: float
    vector_seconds: float | None  # waiting for every turn's vector (hybrid only)


def merged_config(base: dict[str, Any]) -> dict[str, Any]:
    """`base` (a config mapping, e.g. `--config`) with the benchmark's visibility on top."""
    config: dict[str, Any] = json.loads(json.dumps(base))
    config.setdefault("tools", {}).setdefault("sessions", {})["visibility"] = "agent"
    return config


async def run_benchmark(
    state_dir: Path,
    samples: list[LocomoSample],
    limit: int,
    modes: Sequence[str] = ("text",),
    config: dict[str, Any] | None = None,
) -> Run:
    """Import `samples` into a fresh memory in `state_dir`, then ask every question in each
    of `modes` ("text", "hybrid").

    Cancellation: as for `Sessions.search`; the memory closes (committing what was queued).
    """
    config = merged_config(config or {})
    async with am.open_memory(state_dir, config=config, executor="thread") as mem:
        start = time.perf_counter()
        for sample in samples:
            for session in sample.sessions:
                await mem.sessions.import_transcript(session.session_key, session.entries)
        imported = time.perf_counter()
        await mem.sessions.rebuild_index()
        rebuilt = time.perf_counter()
        vector_seconds = None
        if "hybrid" in modes:
            ready = False
            with trio.move_on_after(VECTORS_WAIT_S):
                ready = await mem.sessions.vectors_ready()
            if not ready:
                raise BenchmarkError("the embedder failed or did not catch up: no vectors")
            vector_seconds = time.perf_counter() - rebuilt
        done: dict[str, ModeRun] = {}
        for mode in modes:
            done[mode] = await _ask_all(mem, samples, limit, mode)
        skipped = sum(1 for s in samples for q in s.questions if not q.evidence)
    return Run(
        samples=samples,
        modes=done,
        skipped_no_gold=skipped,
        import_seconds=imported - start,
        rebuild_seconds=rebuilt - imported,
        vector_seconds=vector_seconds,
    )


async def _ask_all(mem: am.Memory, samples: list[LocomoSample], limit: int, mode: str) -> ModeRun:
    """Every question with gold evidence, through `mem.sessions.search(..., mode=mode)`."""
    asked: list[Asked] = []
    indexing = truncated = fallback = 0
    for sample in samples:
        dia_ids = await _dia_ids_by_event(mem, sample)
        caller = sample.sessions[0].session_key
        for question in sample.questions:
            if not question.evidence:
                continue
            begin = time.perf_counter()
            answer = await mem.sessions.search(
                question.question,
                caller=caller,
                limit=limit,
                mode=mode,  # type: ignore[arg-type]
            )
            seconds = time.perf_counter() - begin
            indexing += bool(answer.indexing)
            truncated += bool(answer.truncated)
            fallback += answer.fallback is not None
            ranked = []
            for hit in answer.results:
                dia_id = dia_ids.get((hit.session_key, hit.message_id))
                if dia_id is None:
                    raise BenchmarkError(
                        f"{sample.sample_id}: {question.question!r} found message "
                        f"{hit.message_id!r} of {hit.session_key!r}, not a turn of this sample"
                    )
                ranked.append(dia_id)
            asked.append(
                Asked(
                    sample_id=sample.sample_id,
                    category=question.category,
                    gold=question.evidence,
                    ranked=tuple(ranked),
                    seconds=seconds,
                )
            )
    return ModeRun(asked, indexing, truncated, fallback)


async def _dia_ids_by_event(mem: am.Memory, sample: LocomoSample) -> dict[tuple[str, Any], str]:
    """(session key, event id) -> dia_id: `history` lists the imported turns in order."""
    out: dict[tuple[str, Any], str] = {}
    for session in sample.sessions:
        events = await mem.sessions.history(session.session_key)
        if len(events) != len(session.dia_ids):
            raise BenchmarkError(
                f"{session.session_key}: history has {len(events)} events, "
                f"the file {len(session.dia_ids)} turns"
            )
        for event, dia_id in zip(events, session.dia_ids, strict=True):
            out[session.session_key, event.id] = dia_id
    return out


# -- the report -------------------------------------------------------------------------


def _recall(asked: Sequence[Asked], ks: Sequence[int]) -> dict[str, Any]:
    if not asked:
        return {"questions": 0, "recall_at": {str(k): None for k in ks}}
    return {
        "questions": len(asked),
        "recall_at": {str(k): round(sum(a.recall(k) for a in asked) / len(asked), 4) for k in ks},
    }


def _section(asked: ModeRun, samples: Sequence[LocomoSample], ks: Sequence[int]) -> dict[str, Any]:
    """One mode's recall, latency and flagged answers."""
    scored = [a for a in asked.asked if a.category in SCORED]
    seconds = [a.seconds for a in asked.asked]
    return {
        "categories_1_4": _recall(scored, ks),
        "category_5": _recall([a for a in asked.asked if a.category == 5], ks),
        "by_category": {
            str(c): {"name": name, **_recall([a for a in asked.asked if a.category == c], ks)}
            for c, name in CATEGORIES.items()
        },
        "by_sample": {
            s.sample_id: _recall([a for a in scored if a.sample_id == s.sample_id], ks)
            for s in samples
        },
        "latency_ms": {
            "queries": len(seconds),
            "p50": round(percentile(seconds, 50) * 1000, 3) if seconds else None,
            "p99": round(percentile(seconds, 99) * 1000, 3) if seconds else None,
        },
        "indexing_answers": asked.indexing_answers,
        "truncated_answers": asked.truncated_answers,
        "fallback_answers": asked.fallback_answers,
    }


def report(
    args: argparse.Namespace, data: Path, run: Run, hybrid: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The one JSON object `--json` prints; the table is drawn from it too. The top level
    holds the first mode's figures (text, with `--mode both`); `modes` holds each mode's.
    `hybrid`: the fusion settings in force (`agents.defaults.memorySearch.query.hybrid`)."""
    ks = [k for k in KS if k <= args.limit]
    sections = {mode: _section(asked, run.samples, ks) for mode, asked in run.modes.items()}
    first = next(iter(sections.values()))
    return {
        "benchmark": "locomo",
        "data": str(data),
        "mode": args.mode,
        "config": None if args.config is None else str(args.config),
        "hybrid": hybrid if "hybrid" in run.modes else None,
        "turn_text": args.turn_text,
        "limit": args.limit,
        "corpus": {
            "samples": len(run.samples),
            "sessions": sum(len(s.sessions) for s in run.samples),
            "turns": sum(s.turns for s in run.samples),
            "questions": sum(len(s.questions) for s in run.samples),
            "skipped_no_gold": run.skipped_no_gold,
        },
        **first,
        "modes": sections,
        "import_seconds": round(run.import_seconds, 4),
        "rebuild_seconds": round(run.rebuild_seconds, 4),
        "vector_seconds": None if run.vector_seconds is None else round(run.vector_seconds, 4),
        "reference_fts5_bm25_categories_1_4": {k: v for k, v in REFERENCE.items() if int(k) in ks},
        "environment": {
            "python": platform.python_version(),
            "sqlite": apsw.sqlite_lib_version(),
            "executor": "thread",
        },
    }


def format_table(result: dict[str, Any]) -> str:
    """The report for a person."""
    corpus = result["corpus"]
    ks = list(result["categories_1_4"]["recall_at"])

    def line(label: str, part: dict[str, Any]) -> str:
        cells = "".join(
            f" {'-' if v is None else f'{v:.3f}':>7}" for v in part["recall_at"].values()
        )
        return f"  {label:<22} {part['questions']:>5}{cells}"

    reference = result["reference_fts5_bm25_categories_1_4"]
    hybrid = result.get("hybrid")
    lines = [
        "LoCoMo retrieval: recall@k of the gold evidence turns through sessions_search",
        f"  data: {result['data']}",
        f"        {corpus['samples']} samples, {corpus['sessions']} sessions, "
        f"{corpus['turns']} turns; {corpus['questions']} questions "
        f"({corpus['skipped_no_gold']} without gold, skipped)",
        f"  turn text: {result['turn_text']}; search limit {result['limit']}",
    ]
    if hybrid:
        lines.append(
            f"  hybrid: vectorWeight {hybrid['vectorWeight']}, textWeight "
            f"{hybrid['textWeight']}, candidateMultiplier {hybrid['candidateMultiplier']}"
            f" (config: {result.get('config') or 'defaults'})"
        )
    for mode, part in result["modes"].items():
        latency = part["latency_ms"]
        lines += [
            "",
            f"  mode {mode:<17} {'n':>5}" + "".join(f" {'R@' + k:>7}" for k in ks),
            line("categories 1-4", part["categories_1_4"]),
            *(
                line(f"  {c} {sub['name']}", sub)
                for c, sub in part["by_category"].items()
                if c != "5"
            ),
            *(line(f"  sample {sample}", sub) for sample, sub in part["by_sample"].items()),
            line("5 adversarial", part["category_5"]),
            f"  query latency: p50 {latency['p50']} ms, p99 {latency['p99']} ms over "
            f"{latency['queries']} queries ({result['environment']['executor']} executor); "
            f"answers flagged indexing: {part['indexing_answers']}, truncated: "
            f"{part['truncated_answers']}, text only (fallback): {part['fallback_answers']}",
        ]
    vectors = result.get("vector_seconds")
    lines += [
        "",
        f"  {'reference: FTS5 bm25':<22} {'':>5}"
        + "".join(f" {reference[k]:>7.3f}" if k in reference else f" {'':>7}" for k in ks),
        f"  import {result['import_seconds']:.3f} s, index rebuild "
        f"{result['rebuild_seconds']:.3f} s"
        + ("" if vectors is None else f", every turn's vector {vectors:.3f} s"),
    ]
    return "\n".join(lines)


# -- the command ------------------------------------------------------------------------


def _limit(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if not 1 <= number <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"expected an integer from 1 to {MAX_LIMIT}, got {value!r}"
        )
    return number


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (`sys.argv[1:]` when `argv` is None)."""
    parser = runner.command("locomo", "Retrieval quality of sessions_search on LoCoMo (recall@k).")
    parser.add_argument(
        "--data",
        type=Path,
        help=f"the LoCoMo JSON file (default: ${ENV_DATA}, else {DEFAULT_DATA})",
    )
    parser.add_argument("--limit", type=_limit, default=20, help="results per search (1-25)")
    parser.add_argument(
        "--mode",
        choices=MODES,
        default="text",
        help="search by words (text, the default), words and meaning (hybrid), or both",
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="a config file (JSON5) to run with, e.g. other fusion weights; default: defaults",
    )
    parser.add_argument(
        "--turn-text",
        choices=TURN_TEXTS,
        default="default",
        help="how a turn is written as a message (default: locomo_turn_text)",
    )
    return parser.parse_args(argv)


def data_path(given: Path | None) -> Path:
    """`--data`, else `$ACTIVEMEMORY_LOCOMO`, else the dev split next to the repository."""
    if given is not None:
        return given
    env = os.environ.get(ENV_DATA)
    return Path(env) if env else DEFAULT_DATA.resolve()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print a table (or `--json`).

    Returns 0 (also when the data is absent: the benchmark is skipped), 1 if the search
    answered something the import cannot account for or the embedder gave no vectors (hybrid),
    2 if the data file or `--config` is malformed.
    """
    args = parse_args(argv)
    data = data_path(args.data)
    if not data.is_file():
        reason = f"no LoCoMo data at {data} (give --data or set ${ENV_DATA})"
        if args.json:
            print(json.dumps({"benchmark": "locomo", "skipped": True, "reason": reason}))
        return runner.fail(runner.prog("locomo"), f"{reason}; skipped", 0)
    try:
        samples = read_locomo(data, turn_text=TURN_TEXTS[args.turn_text])
        base = {} if args.config is None else dict(am.load_config(args.config).raw)
        loaded = am.load_config(merged_config(base))
    except am.InvalidInputError as exc:
        return runner.fail(runner.prog("locomo"), exc, 2)
    hybrid = msgspec.to_builtins(loaded.memory_search.query.hybrid)

    def measure(args: argparse.Namespace, run_dir: Path, kept: bool) -> dict[str, Any]:
        run = trio.run(run_benchmark, run_dir, samples, args.limit, MODES[args.mode], base)
        return report(args, data, run, hybrid)

    return runner.main("locomo", args, measure, format_table)
