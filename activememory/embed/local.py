"""The offline embedder: a sentence encoder run by onnxruntime on this machine (docs/design.md §4.7).

Two models ship with the package, in `models/<name>/` next to this file (built by
tools/export_embedder.py; see each NOTICE), int8 weight-only:

- all-mpnet-base-v2 (768 dimensions, 384 tokens) — the default: it tells paraphrases apart
  best (the README's "Embeddings" table);
- all-MiniLM-L6-v2 (384 dimensions, 256 tokens) — `memorySearch.model: "all-MiniLM-L6-v2"`:
  about a tenth of the query time and a fifth of the size, and less understanding.

`local.modelPath` points to another ONNX encoder instead: the encoder is fed only the
inputs its file declares (MPNet takes no token_type_ids), and an optional `embedder.json`
beside it sets how many tokens it reads and, for a model trained with task prefixes, what
goes before a search's query (`protocol.embeddings.QUERY`) and before a stored text. Vectors
are the mean of the token vectors over the attention mask, L2-normalised, as in
sentence-transformers.

One onnxruntime session per model file and process, created on first use and shared by
every embedder and thread (`InferenceSession.run` is thread-safe); each run uses one
intra-op thread, and runs happen on worker threads, never on the event loop. Nothing here
touches the network: the tokenizer is read with `Tokenizer.from_file`.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import math
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

import anyio
import anyio.to_thread
import numpy as np

from ..protocol.embeddings import BACKGROUND, QUERY, EmbeddingDeadlineError
from ..protocol.errors import EmbeddingError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["SHIPPED_MODEL", "SHIPPED_MODELS", "LocalEmbedder", "ShippedModel", "shipped_embedder"]

MAX_TOKENS: Final = 256  # without an `embedder.json`: MiniLM's max_seq_length


@dataclass(frozen=True)
class Prefixes:
    """What a model trained with task prefixes wants before a text (`embedder.json`): one for
    a search's query, one for a text that is stored (docs/design.md §4.7). Empty: none."""

    query: str = ""
    document: str = ""


@dataclass(frozen=True)
class ShippedModel:
    """A model shipped in `models/<name>/`: its size, and the sha256 of each file that
    holds its weights (as printed by tools/export_embedder.py), checked on load."""

    name: str
    dim: int
    max_tokens: int
    sha256: Mapping[str, str]

    @property
    def folder(self) -> Path:
        return Path(__file__).resolve().parent / "models" / self.name


SHIPPED_MODELS: Final[Mapping[str, ShippedModel]] = {
    m.name: m
    for m in (
        ShippedModel(
            "all-mpnet-base-v2",
            768,
            384,
            {
                "model.onnx": "79472b9c117b6b8d2e827ea2702a293ed2f4ab45db2809d6402975db6298dcbd",
                "model.onnx.data.1": (
                    "dafd075a9be83b0c7efb9b51dcc33123675fa7adca77c060d957776366312ef6"
                ),
                "model.onnx.data.2": (
                    "0e23ff4f354370f352b0667fe23b92db78c7f40eaf2f00b3d87c856fba8fa918"
                ),
            },
        ),
        ShippedModel(
            "all-MiniLM-L6-v2",
            384,
            256,
            {"model.onnx": "ed96ad0260ca013c0545fd70802d82380c2edc265d70410e13fe8eb020bdb181"},
        ),
    )
}
SHIPPED_MODEL: Final = "all-mpnet-base-v2"
"""The offline default (docs/design.md §4.7: chosen by measurement)."""
# Beside a `local.modelPath` model: {"max_tokens": N}, that model's max_seq_length (MPNet 384),
# and for a model trained with task prefixes "query_prefix" and "document_prefix".
SETTINGS_FILE: Final = "embedder.json"
SETTINGS_KEYS: Final = ("max_tokens", "query_prefix", "document_prefix")
MAX_TOKENS_LIMIT: Final = 8192
MAX_PREFIX_CHARS: Final = 200
# What the runtime can feed an encoder; token_type_ids only when the file declares it.
INPUTS: Final = frozenset({"input_ids", "attention_mask", "token_type_ids"})
BATCH: Final = 32  # texts per session run: the deadline is checked between runs


class _Model:
    """A loaded encoder: the onnxruntime session and its tokenizer. Thread-safe."""

    def __init__(
        self, onnx_path: Path, tokenizer_path: Path, sha256: Sha256s, max_tokens: int
    ) -> None:
        for path in (onnx_path, tokenizer_path, *(onnx_path.parent / f for f, _ in sha256)):
            if not path.is_file():
                raise EmbeddingError(f"embedding model file not found: {path}")
        for file, expected in sha256:
            if _sha256(onnx_path.parent / file) != expected:
                raise EmbeddingError(
                    f"embedding model {onnx_path.parent / file} is damaged: "
                    f"its sha256 is not {expected}"
                )
        try:  # imported here: `import activememory` stays fast when vectors are off
            import onnxruntime  # type: ignore[import-untyped]
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise EmbeddingError(f"the local embedder needs {exc.name}: {exc}") from exc
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
            # The shipped tokenizer.json pads and truncates to 128: truncate at the model's
            # limit instead, and pad here, to the batch's longest text, with the tokenizer's
            # own pad token (MPNet's is 1, not 0).
            padding = tokenizer.padding
            self._pad_id = int(padding["pad_id"]) if padding else 0
            tokenizer.enable_truncation(max_length=max_tokens)
            tokenizer.no_padding()
        except Exception as exc:
            raise EmbeddingError(f"cannot read the tokenizer {tokenizer_path}: {exc}") from exc
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # 2 threads are slower on a shared 2-core machine
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # Fold the int8 weights back to fp32 once, at load, instead of on every run.
        options.add_session_config_entry("session.disable_quant_qdq", "1")
        try:
            session = onnxruntime.InferenceSession(
                str(onnx_path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:
            raise EmbeddingError(f"cannot load the embedding model {onnx_path}: {exc}") from exc
        self._tokenizer = tokenizer
        self._session = session
        self._inputs = {i.name for i in session.get_inputs()}
        if not {"input_ids", "attention_mask"} <= self._inputs:
            raise EmbeddingError(
                f"embedding model {onnx_path} does not take input_ids and attention_mask"
            )
        if unknown := self._inputs - INPUTS:
            raise EmbeddingError(
                f"embedding model {onnx_path} asks for inputs {sorted(unknown)}: "
                f"only {sorted(INPUTS)} can be given"
            )
        self._output = session.get_outputs()[0].name
        last = session.get_outputs()[0].shape[-1]
        self.dim: int | None = last if isinstance(last, int) else None

    def embed(self, texts: Sequence[str], stop_at: float | None, stop: threading.Event) -> Any:
        """Unit vectors of `texts`, in batches; raises EmbeddingError once `time.monotonic()`
        passes `stop_at` before a batch starts, and returns None once `stop` is set."""
        # Shortest first: a batch pads to its longest text.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: npt.NDArray[np.float32] | None = None
        batches = math.ceil(len(texts) / BATCH)
        for n, start in enumerate(range(0, len(texts), BATCH)):
            if stop.is_set():
                return None
            if stop_at is not None and time.monotonic() >= stop_at:
                raise EmbeddingDeadlineError(
                    f"embedding deadline passed before batch {n + 1} of {batches}"
                )
            chunk = order[start : start + BATCH]
            vectors = self._run([texts[i] for i in chunk])
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[chunk] = vectors
        return out

    def _run(self, texts: list[str]) -> npt.NDArray[np.float32]:
        # One text at a time: `encode_batch` would start the tokenizer's own thread pool
        # (and its fork warning in the host), for ~0.1 ms of work per text.
        encodings = [self._tokenizer.encode(text) for text in texts]
        ids = np.full((len(texts), max(len(e.ids) for e in encodings)), self._pad_id, np.int64)
        mask = np.zeros_like(ids)
        for row, encoding in enumerate(encodings):
            ids[row, : len(encoding.ids)] = encoding.ids
            mask[row, : len(encoding.ids)] = encoding.attention_mask
        feed = {"input_ids": ids, "attention_mask": mask}  # only the inputs the file declares
        if "token_type_ids" in self._inputs:
            feed["token_type_ids"] = np.zeros_like(ids)
        try:
            (hidden,) = self._session.run([self._output], feed)
        except Exception as exc:
            raise EmbeddingError(f"the embedding model failed: {exc}") from exc
        hidden = np.asarray(hidden, dtype=np.float32)
        if hidden.ndim == 3:  # token vectors: mean over the real tokens
            weights = mask[..., None].astype(np.float32)
            hidden = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(hidden, axis=1, keepdims=True)
        unit: npt.NDArray[np.float32] = (hidden / np.clip(norms, 1e-12, None)).astype(np.float32)
        return unit


# (file name, sha256) of each weight file a shipped model is checked against; () for others.
Sha256s = tuple[tuple[str, str], ...]
_models: dict[tuple[Path, Sha256s, int], _Model] = {}
_models_lock = threading.Lock()

# Runs still on a worker thread (an abandoned one goes on after its caller is cancelled).
# The process must not end under them: onnxruntime aborts the whole process ("terminate
# called") when the interpreter is torn down while a session runs. At exit they are asked
# to stop after their batch, and waited for; a run that reaches its thread after that
# (queued on a worker while the interpreter began to exit) never starts the model.
_runs: set[threading.Event] = set()
_runs_done = threading.Condition()
_exiting = False
EXIT_WAIT_S = 5.0


T = TypeVar("T")

# How much lower a background run's CPU priority is than its caller's (a nice increment,
# Linux: per thread). At +10 a busy recall thread gets about nine tenths of a contended core.
BACKGROUND_NICE = 10


def _on_a_lower_priority_thread(fn: Callable[[], T]) -> T:
    """`fn()` on a new thread whose CPU priority is BACKGROUND_NICE below the caller's (where
    the OS sets a thread's own priority; elsewhere at the caller's). A new thread, not the
    caller's: worker threads are pooled, and a lowered priority cannot be raised back
    without privileges."""
    out: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            tid = threading.get_native_id()
            os.setpriority(
                os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + BACKGROUND_NICE
            )
        except (AttributeError, OSError):  # no per-thread priority here: run as it is
            pass
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    # Not "activememory-…": that prefix names the writer threads, which close must join.
    thread = threading.Thread(target=run, name="activememory embedder (background)", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return out[0]


@atexit.register
def _stop_runs_at_exit() -> None:
    global _exiting
    with _runs_done:
        _exiting = True
        for stop in _runs:
            stop.set()
        _runs_done.wait_for(lambda: not _runs, timeout=EXIT_WAIT_S)


def _load(onnx_path: Path, tokenizer_path: Path, sha256: Sha256s, max_tokens: int) -> _Model:
    """The process's one session for this model file, loading it on first use."""
    key = (onnx_path, sha256, max_tokens)
    with _models_lock:  # one load per file, even when several threads ask at once
        model = _models.get(key)
        if model is None:
            model = _models[key] = _Model(onnx_path, tokenizer_path, sha256, max_tokens)
        return model


def _read_settings(path: Path) -> tuple[int, Prefixes]:
    """The max_tokens and prefixes of `embedder.json` at `path`; (MAX_TOKENS, no prefixes)
    when there is no such file."""
    if not path.is_file():
        return MAX_TOKENS, Prefixes()
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EmbeddingError(f"local.modelPath: cannot read {path}: {exc}") from exc
    if not isinstance(settings, dict) or set(settings) - set(SETTINGS_KEYS):
        raise EmbeddingError(
            f"local.modelPath: {path} must be a JSON object with only "
            + ", ".join(f'"{key}"' for key in SETTINGS_KEYS)
        )
    max_tokens = settings.get("max_tokens", MAX_TOKENS)
    if type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise EmbeddingError(
            f"local.modelPath: {path}: max_tokens must be an integer from 1 to "
            f"{MAX_TOKENS_LIMIT}, not {max_tokens!r}"
        )
    prefixes = []
    for key in ("query_prefix", "document_prefix"):
        prefix = settings.get(key, "")
        if not isinstance(prefix, str) or len(prefix) > MAX_PREFIX_CHARS:
            raise EmbeddingError(
                f"local.modelPath: {path}: {key} must be a string of at most "
                f"{MAX_PREFIX_CHARS} characters, not {prefix!r}"
            )
        prefixes.append(prefix)
    return max_tokens, Prefixes(*prefixes)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class LocalEmbedder:
    """An `Embedder` run on this machine by onnxruntime (docs/design.md §4.7).

    Build it with `shipped_embedder()` or `LocalEmbedder.from_path(...)`; the model loads on
    the first `embed`, on a worker thread.
    """

    def __init__(
        self,
        *,
        name: str,
        onnx_path: Path,
        tokenizer_path: Path,
        sha256: Sha256s,
        dim: int | None,
        max_tokens: int = MAX_TOKENS,
        prefixes: Prefixes = Prefixes(),
    ) -> None:
        self._name = name
        self._onnx_path = onnx_path
        self._tokenizer_path = tokenizer_path
        self._sha256 = sha256
        self._dim = dim
        self._max_tokens = max_tokens
        self._prefixes = prefixes

    @classmethod
    def from_path(cls, model_path: str | Path, *, model: str | None = None) -> LocalEmbedder:
        """An encoder from `model_path`: a `.onnx` file with `tokenizer.json` beside it, or a
        folder holding `model.onnx` and `tokenizer.json`; an `embedder.json` beside them
        (`{"max_tokens": 384}`) sets how many tokens of a text it reads (else 256) and, for
        a model trained with task prefixes, what goes before a query and before a stored
        text (`"query_prefix"`, `"document_prefix"`). Its name is `local/<model>`, else
        `local/` and the file's (or folder's) name. Raises
        EmbeddingError when a file is missing or `embedder.json` is not as above; the model
        itself loads on the first `embed`. Returns at once (no cancellation point)."""
        path = Path(model_path).expanduser()
        onnx_path = path / "model.onnx" if path.is_dir() else path
        tokenizer_path = onnx_path.parent / "tokenizer.json"
        for file in (onnx_path, tokenizer_path):
            if not file.is_file():
                raise EmbeddingError(f"local.modelPath: {file} is not a file")
        max_tokens, prefixes = _read_settings(onnx_path.parent / SETTINGS_FILE)
        label = model or (path.name if path.is_dir() else onnx_path.stem)
        return cls(
            name=f"local/{label}",
            onnx_path=onnx_path,
            tokenizer_path=tokenizer_path,
            sha256=(),
            dim=None,
            max_tokens=max_tokens,
            prefixes=prefixes,
        )

    @property
    def name(self) -> str:
        """The vector space: `local/<model>`."""
        return self._name

    @property
    def dim(self) -> int:
        """Dimensions of each vector. For a `local.modelPath` model whose output size is not
        fixed in the file, known only after the first `embed` (EmbeddingError before)."""
        if self._dim is None:
            raise EmbeddingError(f"{self._name}: the vector size is known after the first embed")
        return self._dim

    async def embed(
        self, texts: Sequence[str], *, deadline: float | None = None
    ) -> npt.NDArray[np.float32]:
        """float32 unit vectors, shape (len(texts), dim), in the order of `texts`.

        The first call loads the model (about 0.2 s; shared by the whole process). The model
        runs on a worker thread, in batches of 32 texts; `deadline` (on `anyio.current_time()`)
        is checked before each batch, and past it EmbeddingError is raised. Raises
        EmbeddingError when the model cannot be loaded or fails.

        Cancellation: returns at once; the batch running on the worker thread finishes there,
        unobserved, and no further batch starts.
        """
        texts = list(texts)
        if any(not isinstance(t, str) for t in texts):
            raise EmbeddingError("texts: expected a sequence of strings")
        prefix = self._prefixes.query if QUERY.get() else self._prefixes.document
        if prefix:
            texts = [prefix + text for text in texts]
        stop_at = None
        if deadline is not None:
            left = deadline - anyio.current_time()
            if left <= 0:
                raise EmbeddingDeadlineError("embedding deadline passed before the model ran")
            stop_at = time.monotonic() + left
        stop = threading.Event()
        background = BACKGROUND.get()
        try:
            vectors = await anyio.to_thread.run_sync(
                self._embed_sync, texts, stop_at, stop, background, abandon_on_cancel=True
            )
        finally:
            stop.set()
        if vectors is None:  # only a stopped run has none, and its caller is gone
            raise EmbeddingError("the embedding run was stopped")
        return vectors

    def _embed_sync(
        self,
        texts: list[str],
        stop_at: float | None,
        stop: threading.Event,
        background: bool = False,
    ) -> npt.NDArray[np.float32] | None:
        with _runs_done:
            if _exiting:
                return None  # the interpreter is exiting: its caller is gone
            _runs.add(stop)
        try:
            if background:  # the embedder actor's backlog: recall's queries go first
                return _on_a_lower_priority_thread(
                    lambda: self._embed_tracked(texts, stop_at, stop)
                )
            return self._embed_tracked(texts, stop_at, stop)
        finally:
            with _runs_done:
                _runs.discard(stop)
                _runs_done.notify_all()

    def _embed_tracked(
        self, texts: list[str], stop_at: float | None, stop: threading.Event
    ) -> npt.NDArray[np.float32] | None:
        model = _load(self._onnx_path, self._tokenizer_path, self._sha256, self._max_tokens)
        if self._dim is None:
            self._dim = model.dim
        if not texts:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        vectors: npt.NDArray[np.float32] | None = model.embed(texts, stop_at, stop)
        if vectors is not None:
            if self._dim is None:
                self._dim = int(vectors.shape[1])
            elif vectors.shape[1] != self._dim:
                raise EmbeddingError(
                    f"{self._name}: the model gave {vectors.shape[1]} dimensions, not {self._dim}"
                )
        return vectors

    def __repr__(self) -> str:
        return f"LocalEmbedder(name={self._name!r}, model={str(self._onnx_path)!r})"


def shipped_embedder(model: str = SHIPPED_MODEL) -> LocalEmbedder:
    """A model shipped with activememory (`SHIPPED_MODELS`), named `local/<model>`: by
    default all-mpnet-base-v2 (768 dimensions). Its weight files are checked against fixed
    sha256 values on load. Raises EmbeddingError for a name that is not shipped. Returns at
    once (no cancellation point); the model loads on the first `embed`."""
    shipped = SHIPPED_MODELS.get(model)
    if shipped is None:
        raise EmbeddingError(
            f'model "{model}" is not shipped (shipped: {", ".join(SHIPPED_MODELS)}); '
            "set local.modelPath to its ONNX file"
        )
    return LocalEmbedder(
        name=f"local/{shipped.name}",
        onnx_path=shipped.folder / "model.onnx",
        tokenizer_path=shipped.folder / "tokenizer.json",
        sha256=tuple(sorted(shipped.sha256.items())),
        dim=shipped.dim,
        max_tokens=shipped.max_tokens,
    )
