"""Replay `bench locomo --mode hybrid` offline, to score ranking variants in seconds.

    .venv/bin/python tools/locomo_replay.py capture [--data PATH] [--cache DIR]
    .venv/bin/python tools/locomo_replay.py score [--cache DIR] [--only NAME ...]

`capture` runs the benchmark's hybrid mode once through the library (the same import,
rebuild and `mem.sessions.search` calls as simulations/bench/locomo.py) and keeps, for
every question, the text side's candidates with their scores (the conversational rerank
included) and the query's vector, plus the library's own ranking; then it embeds, with the
shipped default model, every turn alone, every turn after its previous turn ("previous +
message"), and every sentence of a turn of two sentences or more. All of it goes to
`--cache` (default /tmp/locomo-replay). The text side is read by wrapping
`activememory._search._assemble_fused` for the run (its arguments are what it records), so
a change to that function's signature needs one here. From a git worktree the bench's
default data path (../shared next to the checkout) may not exist: give `--data`. About 30
minutes on two busy cores, most of it embedding 4,174 texts.

`score` rebuilds the hybrid ranking from the cache — the vector side's nearest `pool` rows
of the conversation (at least MIN_SIMILARITY), the union with the text side, the weighted
sum of recall/hybrid.py — for each variant in VARIANTS, and prints R@10 of categories 1-4
and its parts. The `base` variant must equal the captured run (it checks).
README "By meaning" holds the measured table; docs/design.md §4.7 the decision.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import trio

import activememory as am
from activememory import _search
from activememory._importers import read_locomo
from activememory.embed import shipped_embedder
from activememory.recall.hybrid import MIN_SIMILARITY
from activememory.simulations.bench import locomo

LIMIT = 20
POOL = LIMIT * 4  # candidateMultiplier's default
VECTOR_WEIGHT, TEXT_WEIGHT = 0.7, 0.3
# A sentence ends at . ! ? followed by a space (a turn's photo caption is its own piece).
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s+(?=\[shares a photo:)")


# -- capture ------------------------------------------------------------------------------


async def _capture_run(data: Path, state: Path) -> dict[str, Any]:
    samples = read_locomo(data)
    recorded: list[tuple[list[tuple[int, float]], list[float]]] = []
    original = _search._assemble_fused

    def recording(pages: Any, query: np.ndarray, weights: Any, limit: int) -> Any:
        page = pages[0].page
        recorded.append(([(c.event_id, c.score) for c in page.candidates], query.tolist()))
        return original(pages, query, weights, limit)

    _search._assemble_fused = recording  # type: ignore[assignment]
    out: dict[str, Any] = {"samples": []}
    config = locomo.merged_config({})
    async with am.open_memory(state, config=config, executor="thread") as mem:
        for sample in samples:
            for session in sample.sessions:
                await mem.sessions.import_transcript(session.session_key, session.entries)
        await mem.sessions.rebuild_index()
        began = time.perf_counter()
        if not await mem.sessions.vectors_ready():
            raise SystemExit("the embedder gave no vectors")
        out["vector_seconds"] = time.perf_counter() - began
        for sample in samples:
            dia_ids = await locomo._dia_ids_by_event(mem, sample)
            by_event = {event: dia for (_, event), dia in dia_ids.items()}
            turns = []
            for session in sample.sessions:
                for i, turn in enumerate(session.turns):
                    turns.append(
                        {
                            "dia_id": turn.dia_id,
                            "session": session.number,
                            "position": i,
                            "text": session.entries[i].message.content,
                        }
                    )
            questions = []
            for question in sample.questions:
                if not question.evidence:
                    continue
                recorded.clear()
                answer = await mem.sessions.search(
                    question.question,
                    caller=sample.sessions[0].session_key,
                    limit=LIMIT,
                    mode="hybrid",
                )
                [(text_side, query)] = recorded
                questions.append(
                    {
                        "question": question.question,
                        "category": question.category,
                        "gold": list(question.evidence),
                        "text": [[by_event[e], s] for e, s in text_side],
                        "query": query,
                        "ranked": [by_event[h.message_id] for h in answer.results],
                    }
                )
            out["samples"].append(
                {"sample_id": sample.sample_id, "turns": turns, "questions": questions}
            )
    _search._assemble_fused = original  # type: ignore[assignment]
    return out


def sentences(text: str) -> list[str]:
    """The pieces of a turn "Speaker: words [shares a photo: …]", each with the speaker."""
    speaker, _, words = text.partition(": ")
    pieces = [p.strip() for p in _SENTENCE_END.split(words) if p.strip()]
    return [f"{speaker}: {p}" for p in pieces]


async def _embed_all(captured: dict[str, Any]) -> dict[str, np.ndarray]:
    embedder = shipped_embedder()
    own: list[str] = []
    context: list[str] = []
    pieces: list[str] = []
    owners: list[int] = []
    for sample in captured["samples"]:
        previous = None
        for turn in sample["turns"]:
            text = turn["text"]
            if turn["position"] == 0:
                previous = None
            own.append(text)
            context.append(text if previous is None else f"{previous}\n{text}")
            parts = sentences(text)
            if len(parts) > 1:
                pieces += parts
                owners += [len(own) - 1] * len(parts)
            previous = text

    async def embed(texts: list[str]) -> np.ndarray:
        chunks = [await embedder.embed(texts[i : i + 64]) for i in range(0, len(texts), 64)]
        return np.concatenate(chunks)

    print(f"embedding {len(own)} turns, {len(context)} contexts, {len(pieces)} sentences")
    return {
        "own": await embed(own),
        "context": await embed(context),
        "sentences": await embed(pieces),
        "sentence_owner": np.asarray(owners, dtype=np.int64),
    }


def capture(data: Path, cache: Path) -> None:
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as state:
        captured = trio.run(_capture_run, data, Path(state))
    (cache / "run.json").write_text(json.dumps(captured))
    vectors = trio.run(_embed_all, captured)
    np.savez(cache / "vectors.npz", **vectors)
    print(f"captured into {cache} (vectors in {captured['vector_seconds']:.0f} s)")


# -- score --------------------------------------------------------------------------------


@dataclass
class Conversation:
    """One sample's turns and the vectors a variant may use, rows in turn order."""

    dia_ids: list[str]
    own: np.ndarray
    context: np.ndarray
    sentences: list[np.ndarray]  # per turn, (n, dim); empty for a one-sentence turn
    neighbours: list[list[int]]  # rows of the turns just before and after, same session


@dataclass
class Question:
    category: int
    gold: list[str]
    text: list[tuple[int, float]]  # rows, text score, best first
    query: np.ndarray
    ranked: list[str]


Similarity = Callable[[Conversation, np.ndarray], np.ndarray]  # the query's to every row


def load(cache: Path) -> list[tuple[Conversation, list[Question]]]:
    captured = json.loads((cache / "run.json").read_text())
    vectors = np.load(cache / "vectors.npz")
    owners = vectors["sentence_owner"]
    start = 0
    out = []
    for sample in captured["samples"]:
        turns = sample["turns"]
        rows = range(start, start + len(turns))
        pieces: list[list[np.ndarray]] = [[] for _ in turns]
        for i in np.flatnonzero((owners >= start) & (owners < start + len(turns))):
            pieces[owners[i] - start].append(vectors["sentences"][i])
        neighbours = []
        for i, turn in enumerate(turns):
            near = []
            for j in (i - 1, i + 1):
                if 0 <= j < len(turns) and turns[j]["session"] == turn["session"]:
                    near.append(j)
            neighbours.append(near)
        conversation = Conversation(
            [t["dia_id"] for t in turns],
            vectors["own"][rows.start : rows.stop],
            vectors["context"][rows.start : rows.stop],
            [np.stack(p) if p else np.zeros((0, vectors["own"].shape[1])) for p in pieces],
            neighbours,
        )
        row_of = {d: i for i, d in enumerate(conversation.dia_ids)}
        questions = [
            Question(
                q["category"],
                q["gold"],
                [(row_of[d], s) for d, s in q["text"]],
                np.asarray(q["query"], dtype=np.float32),
                q["ranked"],
            )
            for q in sample["questions"]
        ]
        out.append((conversation, questions))
        start += len(turns)
    return out


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def own(c: Conversation, q: np.ndarray) -> np.ndarray:
    return c.own @ q


def best_sentence(c: Conversation, q: np.ndarray) -> np.ndarray:
    whole = c.own @ q
    return np.array(
        [max(w, *(s @ q)) if len(s) else w for w, s in zip(whole, c.sentences, strict=True)]
    )


def blend(weight: float, base: Similarity = own) -> Similarity:
    """The unit blend of a row's own vector and its (previous + message) vector."""

    def similarity(c: Conversation, q: np.ndarray) -> np.ndarray:
        mixed = Conversation(
            c.dia_ids, _unit(weight * c.own + (1 - weight) * c.context), c.context,
            c.sentences, c.neighbours,
        )  # fmt: skip
        return base(mixed, q)

    return similarity


def mean_of(*parts: Similarity) -> Similarity:
    return lambda c, q: np.mean([p(c, q) for p in parts], axis=0)


def context_max(lam: float, base: Similarity = own) -> Similarity:
    """own + lam · max(0, cos(q, context) − own): a strong own vector keeps its score."""

    def similarity(c: Conversation, q: np.ndarray) -> np.ndarray:
        mine = base(c, q)
        return mine + lam * np.maximum(0.0, c.context @ q - mine)

    return similarity


def neighbour_bonus(weight: float, base: Similarity = own) -> Similarity:
    """similarity + weight × the better neighbour's (same session)."""

    def similarity(c: Conversation, q: np.ndarray) -> np.ndarray:
        mine = base(c, q)
        better = np.array([max((mine[j] for j in n), default=0.0) for n in c.neighbours])
        return mine + weight * np.clip(better, 0.0, 1.0)

    return similarity


def rank(
    c: Conversation,
    q: Question,
    similarity: Similarity,
    *,
    feedback: float = 0.0,
    feedback_from: int = 3,
    weights: tuple[float, float] = (VECTOR_WEIGHT, TEXT_WEIGHT),
) -> list[str]:
    """The fused top LIMIT, as recall/hybrid.py and storage/hybrid.fuse rank them."""
    sims = similarity(c, q.query)
    near = [int(i) for i in np.argsort(-sims, kind="stable")[:POOL] if sims[i] >= MIN_SIMILARITY]
    # _search._assemble_fused orders the text side by score, then the later event first.
    by_text = [r for r, _ in sorted(q.text, key=lambda t: (-t[1], -t[0]))]
    order = by_text + [r for r in near if r not in dict(q.text)]
    best = max((s for _, s in q.text), default=0.0)
    text = dict(q.text)

    def fused(sims: np.ndarray) -> list[int]:
        def score(r: int) -> float:
            t = max(0.0, text[r] / best) if r in text and best > 0 else 0.0
            return weights[1] * t + weights[0] * float(np.clip(sims[r], 0.0, 1.0))

        return sorted(order, key=lambda r: -score(r))

    ranked = fused(sims)
    if feedback:
        top = c.own[ranked[:feedback_from]].mean(axis=0)
        sims = similarity(c, _unit(q.query + feedback * top).astype(np.float32))
        ranked = fused(sims)
    return [c.dia_ids[r] for r in ranked[:LIMIT]]


def recall(gold: Sequence[str], ranked: Sequence[str], k: int) -> float:
    return sum(1 for g in gold if g in ranked[:k]) / len(gold)


VARIANTS: dict[str, dict[str, Any]] = {
    "base": {"similarity": own},
    "a: blend own 0.8": {"similarity": blend(0.8)},
    "b: mean(message, best sentence)": {"similarity": mean_of(own, best_sentence)},
    "a+b: mean(blend 0.8, best sentence)": {"similarity": mean_of(blend(0.8), best_sentence)},
    "a+b: blend 0.8 of mean(message, best sentence)": {
        "similarity": blend(0.8, mean_of(own, best_sentence))
    },
    "c: max(own, context)": {"similarity": context_max(1.0)},
    "c: own + 0.5 max(0, ctx - own)": {"similarity": context_max(0.5)},
    "c: own + 0.3 max(0, ctx - own)": {"similarity": context_max(0.3)},
    "c+b: mean(msg, best sent) + 0.5 max(0, ctx - it)": {
        "similarity": context_max(0.5, mean_of(own, best_sentence))
    },
    "d: feedback 0.2": {"similarity": own, "feedback": 0.2},
    "d: feedback 0.4": {"similarity": own, "feedback": 0.4},
    "e: neighbour 0.4": {"similarity": neighbour_bonus(0.4)},
    "e+a: neighbour 0.4 on blend 0.8": {"similarity": neighbour_bonus(0.4, blend(0.8))},
    "e+b: neighbour 0.4 on mean(msg, best sent)": {
        "similarity": neighbour_bonus(0.4, mean_of(own, best_sentence))
    },
}
# Second round: the best stackings of the first.
_AB = blend(0.8, mean_of(own, best_sentence))
_CB = context_max(0.5, mean_of(own, best_sentence))
VARIANTS.update(
    {
        "a+b+d: blend 0.8 of mean(msg, best sent), feedback 0.2": {
            "similarity": _AB,
            "feedback": 0.2,
        },
        "a+b+d: the same, feedback 0.1": {"similarity": _AB, "feedback": 0.1},
        "a+b+e: neighbour 0.2 on blend 0.8 of mean(msg, best)": {
            "similarity": neighbour_bonus(0.2, _AB)
        },
        "a+b+e: neighbour 0.4 on blend 0.8 of mean(msg, best)": {
            "similarity": neighbour_bonus(0.4, _AB)
        },
        "a+b+e+d: neighbour 0.4 on blend 0.8 of mean, feedback 0.2": {
            "similarity": neighbour_bonus(0.4, _AB),
            "feedback": 0.2,
        },
        "c+b+d: feedback 0.2": {"similarity": _CB, "feedback": 0.2},
        "c+b+e: neighbour 0.4": {"similarity": neighbour_bonus(0.4, _CB)},
        "a+d: blend 0.8, feedback 0.2": {"similarity": blend(0.8), "feedback": 0.2},
        "b+d: mean(msg, best sent), feedback 0.2": {
            "similarity": mean_of(own, best_sentence),
            "feedback": 0.2,
        },
        "e+d: neighbour 0.4, feedback 0.2": {"similarity": neighbour_bonus(0.4), "feedback": 0.2},
        "d: feedback 0.1": {"similarity": own, "feedback": 0.1},
        "d: feedback 0.3": {"similarity": own, "feedback": 0.3},
        "d: feedback 0.2 from top 5": {"similarity": own, "feedback": 0.2, "feedback_from": 5},
        "e+a+d: neighbour 0.4 on blend 0.8, feedback 0.2": {
            "similarity": neighbour_bonus(0.4, blend(0.8)),
            "feedback": 0.2,
        },
    }
)
# Third round: a small grid around the best stack (a+b+e+d).
for _blend in (0.7, 0.8):
    for _near in (0.3, 0.4):
        for _back in (0.2, 0.3):
            VARIANTS[f"grid: blend {_blend} of mean, neighbour {_near}, feedback {_back}"] = {
                "similarity": neighbour_bonus(_near, blend(_blend, mean_of(own, best_sentence))),
                "feedback": _back,
            }
VARIANTS["grid: own + 0.5 max(0, ctx - mean(msg, best)), neighbour 0.3, feedback 0.2"] = {
    "similarity": neighbour_bonus(0.3, _CB),
    "feedback": 0.2,
}
# Without the sentence vectors: the context vector only (two texts per message).
for _label, _similarity in (
    ("blend 0.7", blend(0.7)),
    ("blend 0.8", blend(0.8)),
    ("own + 0.5 max(0, ctx - own)", context_max(0.5)),
):
    for _back in (0.2, 0.3):
        VARIANTS[f"two texts: {_label}, neighbour 0.3, feedback {_back}"] = {
            "similarity": neighbour_bonus(0.3, _similarity),
            "feedback": _back,
        }
VARIANTS["free stack: neighbour 0.3, feedback 0.2 (no extra vector)"] = {
    "similarity": neighbour_bonus(0.3),
    "feedback": 0.2,
}


def score(cache: Path, only: Sequence[str]) -> None:
    """R@10 of categories 1-4 for each variant whose name contains one of `only` (all if
    none), with its parts by category and by conversation (a gain both conversations share
    is likelier to be one)."""
    data = load(cache)
    names = [n for n in VARIANTS if not only or any(o in n for o in only)]
    samples = " ".join(f"{'conv ' + str(i + 1):>7}" for i in range(len(data)))
    print(
        f"{'variant':<52} {'R@10':>6} {'multi':>6} {'temp':>6} {'open':>6} {'single':>6} {samples}"
    )
    for name in names:
        spec = dict(VARIANTS[name])
        similarity = spec.pop("similarity")
        by_category: dict[int, list[float]] = {}
        by_sample: list[list[float]] = []
        same = True
        for conversation, questions in data:
            by_sample.append([])
            for q in questions:
                ranked = rank(conversation, q, similarity, **spec)
                if name == "base" and ranked[:10] != q.ranked[:10]:
                    same = False
                by_category.setdefault(q.category, []).append(recall(q.gold, ranked, 10))
                if q.category in (1, 2, 3, 4):
                    by_sample[-1].append(recall(q.gold, ranked, 10))
        scored = [r for c in (1, 2, 3, 4) for r in by_category.get(c, [])]
        parts = [np.mean(by_category[c]) for c in (1, 2, 3, 4)] + [np.mean(s) for s in by_sample]
        flag = "" if name != "base" else ("  (= the captured run)" if same else "  (DIFFERS)")
        print(f"{name:<52} {np.mean(scored):6.3f} " + " ".join(f"{p:6.3f}" for p in parts) + flag)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="locomo_replay", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("capture", "score"))
    parser.add_argument("--data", type=Path, default=locomo.DEFAULT_DATA.resolve())
    parser.add_argument("--cache", type=Path, default=Path("/tmp/locomo-replay"))
    parser.add_argument("--only", nargs="*", default=(), help="variants whose name has one")
    args = parser.parse_args(argv)
    if args.command == "capture":
        capture(args.data, args.cache)
    else:
        score(args.cache, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
