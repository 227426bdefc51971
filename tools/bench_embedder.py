"""Measure the shipped offline embedder (docs/design.md §4.7); the README's "Embeddings" table.

    .venv/bin/python tools/bench_embedder.py [--runs 200] [--model-path DIR]

`--model-path` measures a `local.modelPath` model instead (a folder or `.onnx` file, as
`LocalEmbedder.from_path` takes it), e.g. all-mpnet-base-v2 built by tools/export_embedder.py.

Cold start is a fresh interpreter: spawn → first vector (imports, sha256 check, session,
first run). Query latency is one short query through `LocalEmbedder.embed` under trio (the
worker-thread hop included), 1 intra-op thread. Batch time is 32 sentences of ~23 tokens in
one call. RSS is the peak of the measuring process. Install size adds up the folders of the
packages the embedder brought in.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from activememory.embed.local import SHIPPED_MODEL

COLD = """
import sys, time
t0 = time.perf_counter()
import anyio
from activememory.embed import LocalEmbedder, shipped_embedder
t1 = time.perf_counter()
embedder = LocalEmbedder.from_path(sys.argv[1]) if len(sys.argv) > 1 else shipped_embedder()
vectors = anyio.run(embedder.embed, ["Which city am I based in?"])
t2 = time.perf_counter()
print(f"{(t1 - t0) * 1000:.0f} {(t2 - t1) * 1000:.0f}")
"""
# onnxruntime and its own dependencies; tokenizers and huggingface-hub (a dependency of
# tokenizers that the embedder never imports) with what it pulls in.
# The default model's folder (what `shipped_embedder()` loads): its files are the sizes printed.
SHIPPED = Path(__file__).resolve().parent.parent / "activememory/embed/models" / SHIPPED_MODEL
NEW_PACKAGES = [
    "onnxruntime",
    "flatbuffers",
    "protobuf",
    "tokenizers",
    "huggingface-hub",
    "hf-xet",
    "fsspec",
    "pyyaml",
    "tqdm",
    "filelock",
    "click",
    "httpx2",
    "httpcore2",
]


def cold_start(runs: int, model_path: Path | None) -> tuple[float, float, float]:
    walls, imports, firsts = [], [], []
    path_arg = [] if model_path is None else [str(model_path)]
    for _ in range(runs):
        start = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", COLD, *path_arg], capture_output=True, text=True, check=True
        ).stdout.split()
        walls.append((time.perf_counter() - start) * 1000)
        imports.append(float(out[0]))
        firsts.append(float(out[1]))
    return statistics.median(walls), statistics.median(imports), statistics.median(firsts)


def warm(runs: int, model_path: Path | None) -> tuple[float, float, float, float]:
    import trio

    from activememory.embed import LocalEmbedder, shipped_embedder

    embedder = shipped_embedder() if model_path is None else LocalEmbedder.from_path(model_path)
    batch = [
        f"Note {i}: I told the assistant that my favourite colour is blue and I live near "
        f"the river {i}."
        for i in range(32)
    ]

    async def main() -> tuple[list[float], list[float]]:
        await embedder.embed(["warm up"])
        queries = []
        for _ in range(runs):
            t = time.perf_counter()
            await embedder.embed(["Which city am I based in?"])
            queries.append((time.perf_counter() - t) * 1000)
        batches = []
        for _ in range(max(5, runs // 20)):
            t = time.perf_counter()
            await embedder.embed(batch)
            batches.append((time.perf_counter() - t) * 1000 / 32)
        return queries, batches

    queries, batches = trio.run(main)
    queries.sort()
    return (
        statistics.median(queries),
        queries[int(len(queries) * 0.9)],
        queries[0],
        statistics.median(batches),
    )


def install_size() -> dict[str, float]:
    sizes = {}
    for name in NEW_PACKAGES:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        total = 0
        for file in dist.files or []:
            path = Path(str(dist.locate_file(file)))
            if path.is_file():
                total += path.stat().st_size
        sizes[name] = total / 1e6
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--cold-runs", type=int, default=5)
    parser.add_argument("--model-path", type=Path, help="a local.modelPath model to measure")
    args = parser.parse_args()
    wall, imports, first = cold_start(args.cold_runs, args.model_path)
    p50, p90, best, per_sentence = warm(args.runs, args.model_path)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"load average: {os.getloadavg()[0]:.2f}")
    print(f"cold start (spawn → first vector): {wall:.0f} ms")
    print(f"  of which imports {imports:.0f} ms, load + first vector {first:.0f} ms")
    print(f"query p50 / p90 / min: {p50:.2f} / {p90:.2f} / {best:.2f} ms")
    print(f"batch of 32: {per_sentence:.2f} ms per sentence")
    print(f"peak RSS: {rss:.0f} MB")
    sizes = install_size()
    shown = ", ".join(f"{k} {v:.1f}" for k, v in sizes.items())
    print(f"installed: {sum(sizes.values()):.1f} MB ({shown})")
    model = args.model_path or SHIPPED
    folder = model if model.is_dir() else model.parent
    files = sum(p.stat().st_size for p in folder.iterdir() if p.is_file()) / 1e6
    onnx_file = model / "model.onnx" if model.is_dir() else model
    print(f"model: {model}")
    print(f"model files: {files:.1f} MB (model.onnx {onnx_file.stat().st_size / 1e6:.1f} MB)")


if __name__ == "__main__":
    main()
