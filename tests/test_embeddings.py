"""Embedders (docs/design.md §4.7): the shipped offline model, the OpenAI-compatible client
against a real loopback server, the fallback chain and the `memorySearch` config."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import numpy as np
import pytest
from chat_server import Embeddings, Hang, Malformed, Status, serve, vector_for
from test_openai_model import closed_port

import activememory as am
from activememory.embed import (
    FallbackEmbedder,
    LocalEmbedder,
    OpenAIEmbedder,
    embedder_from_config,
    shipped_embedder,
)
from activememory.embed.local import SHIPPED_MODELS
from activememory.protocol.embeddings import EmbeddingDeadlineError
from activememory.recall.hybrid import embed_query

pytestmark = pytest.mark.anyio

MEMORIES = [
    "I am allergic to peanuts, so no peanut snacks please.",
    "I moved to Lisbon last March for a job at a fintech startup.",
    "My sister lives in Porto.",
    "I work as a backend engineer on payment systems.",
    "My car is an old blue Renault Clio.",
    "I play the cello in a community orchestra on Thursdays.",
]
PEANUTS, LISBON, PORTO, ENGINEER, CAR, CELLO = range(6)


@pytest.fixture(scope="module", params=list(SHIPPED_MODELS))
def local(request: pytest.FixtureRequest) -> Iterator[LocalEmbedder]:
    """Each shipped embedder, loaded once for the module (the session is per process)."""
    embedder = shipped_embedder(request.param)
    anyio.run(embedder.embed, ["warm up"])
    yield embedder


# What the model computes does not depend on the loop: these run on one (the wrapper's own
# behaviour, concurrency, deadlines and cancellation, runs on both).
MODEL_ONLY = pytest.mark.parametrize("anyio_backend", ["trio"])


async def ranking(embedder: am.Embedder, question: str) -> list[int]:
    vectors = await embedder.embed([question, *MEMORIES])
    scores = vectors[1:] @ vectors[0]
    return [int(i) for i in np.argsort(-scores)]


# --- The shipped model -----------------------------------------------------------------------


def test_the_shipped_model_embeds_offline_without_the_model_hub() -> None:
    # A fresh process with sockets disabled: the model, the tokenizer and the first vector
    # need no network, and huggingface_hub is never imported.
    code = """
import socket, sys
def no_network(*args, **kwargs):
    raise OSError("network used")
socket.socket.connect = no_network
socket.create_connection = no_network
import anyio
from activememory.embed import embedder_from_config
from activememory.protocol.config import MemorySearchDefaults
embedder = embedder_from_config(MemorySearchDefaults())
vectors = anyio.run(embedder.embed, ["Which city am I based in?"])
print(embedder.name, vectors.shape, "huggingface_hub" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0] == "local/all-mpnet-base-v2 (1, 768) False"


def test_importing_the_library_loads_no_model_runtime() -> None:
    code = (
        "import sys, activememory, activememory.embed; "
        "print(sorted(m for m in ('onnxruntime', 'tokenizers') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


@MODEL_ONLY
async def test_a_shipped_model_gives_unit_float32_rows_of_its_size(local: LocalEmbedder) -> None:
    assert isinstance(local, am.Embedder)
    shipped = SHIPPED_MODELS[local.name.removeprefix("local/")]
    assert (
        local.dim
        == shipped.dim
        == {"all-mpnet-base-v2": 768, "all-MiniLM-L6-v2": 384}[shipped.name]
    )
    vectors = await local.embed(["Do I have any allergies?", "", "ok", "word " * 1000])
    assert vectors.dtype == np.float32
    assert vectors.shape == (4, local.dim)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@MODEL_ONLY
async def test_no_texts_give_no_rows(local: LocalEmbedder) -> None:
    assert (await local.embed([])).shape == (0, local.dim)


@MODEL_ONLY
async def test_the_vectors_are_deterministic_and_do_not_depend_on_the_batch(
    local: LocalEmbedder,
) -> None:
    alone = await local.embed([MEMORIES[LISBON]])
    again = await local.embed([MEMORIES[LISBON]])
    assert np.array_equal(alone, again)
    # In a batch, with padding and texts sorted by length: the same vector, same order.
    many = await local.embed([*MEMORIES, *MEMORIES] * 3)
    assert many.shape == (36, local.dim)
    assert np.allclose(many[LISBON], alone[0], atol=1e-5)
    assert np.allclose(many[6 + LISBON], alone[0], atol=1e-5)


@MODEL_ONLY
async def test_texts_are_read_up_to_the_models_tokens_not_the_files_128(
    local: LocalEmbedder,
) -> None:
    max_tokens = SHIPPED_MODELS[local.name.removeprefix("local/")].max_tokens  # 384 or 256
    filler = "I like tea. " * (max_tokens * 5 // 8 // 4)  # 4 tokens each: 160 or 240 tokens
    vectors = await local.embed([filler, filler + MEMORIES[CAR], filler * 2 + MEMORIES[CAR]])
    assert float(vectors[0] @ vectors[1]) < 0.999  # the tokens after 128 count
    assert np.allclose(vectors[2], (await local.embed([filler * 2]))[0], atol=1e-5)  # cut there


@MODEL_ONLY
async def test_paraphrases_find_their_memory(local: LocalEmbedder) -> None:
    allergies = await ranking(local, "Do I have any allergies?")
    assert allergies[0] == PEANUTS
    assert allergies.index(PEANUTS) < allergies.index(PORTO)
    assert (await ranking(local, "Which city am I based in?"))[0] == LISBON
    assert (await ranking(local, "What do I do for a living?"))[0] == ENGINEER
    assert (await ranking(local, "What vehicle do I drive?"))[0] == CAR
    assert (await ranking(local, "What instrument do I play?"))[0] == CELLO


async def test_concurrent_calls_share_the_session(local: LocalEmbedder) -> None:
    expected = await local.embed(MEMORIES)
    results: list[np.ndarray] = [np.zeros(0)] * 4

    async def one(i: int) -> None:
        results[i] = await local.embed(MEMORIES)

    async with anyio.create_task_group() as tg:
        for i in range(4):
            tg.start_soon(one, i)
    for got in results:
        assert np.array_equal(got, expected)


MINILM = SHIPPED_MODELS["all-MiniLM-L6-v2"]  # the small one: quick to copy and load


def copy_model(tmp_path: Path, folder: str = "my-encoder") -> Path:
    target = tmp_path / folder
    target.mkdir()
    for name in ("model.onnx", "tokenizer.json"):
        shutil.copyfile(MINILM.folder / name, target / name)
    return target


async def test_a_damaged_model_file_is_refused_by_its_sha256(tmp_path: Path) -> None:
    folder = copy_model(tmp_path)
    data = bytearray((folder / "model.onnx").read_bytes())
    data[-100] ^= 0xFF
    (folder / "model.onnx").write_bytes(bytes(data))
    damaged = LocalEmbedder(
        name="local/all-MiniLM-L6-v2",
        onnx_path=folder / "model.onnx",
        tokenizer_path=folder / "tokenizer.json",
        sha256=tuple(MINILM.sha256.items()),
        dim=384,
    )
    with pytest.raises(am.EmbeddingError) as caught:
        await damaged.embed(["hello"])
    expected = MINILM.sha256["model.onnx"]
    assert str(caught.value) == (
        f"embedding model {folder / 'model.onnx'} is damaged: its sha256 is not {expected}"
    )


@pytest.mark.parametrize("name", list(SHIPPED_MODELS))
async def test_the_shipped_model_files_match_their_sha256(name: str) -> None:
    import hashlib

    shipped = SHIPPED_MODELS[name]
    assert "model.onnx" in shipped.sha256
    for file, expected in shipped.sha256.items():
        assert hashlib.sha256((shipped.folder / file).read_bytes()).hexdigest() == expected
        assert (shipped.folder / file).stat().st_size < 100_000_000  # GitHub's file limit
    for file in ("tokenizer.json", "LICENSE", "NOTICE"):
        assert (shipped.folder / file).is_file()
    assert "Apache License" in (shipped.folder / "LICENSE").read_text()
    assert f"sentence-transformers/{name}" in (shipped.folder / "NOTICE").read_text()


async def test_a_deadline_already_past_runs_nothing(local: LocalEmbedder) -> None:
    with pytest.raises(EmbeddingDeadlineError) as caught:
        await local.embed(["hello"], deadline=anyio.current_time() - 0.001)
    assert str(caught.value) == "embedding deadline passed before the model ran"
    assert isinstance(caught.value, am.EmbeddingError)


async def test_a_deadline_is_checked_before_each_batch(local: LocalEmbedder) -> None:
    texts = [f"{MEMORIES[i % 6]} ({i})" for i in range(32 * 4)]
    with pytest.raises(
        EmbeddingDeadlineError, match=r"^embedding deadline passed before batch [1-4] of 4$"
    ):
        await local.embed(texts, deadline=anyio.current_time() + 0.001)


async def test_a_cancelled_call_returns_at_once_and_the_next_works(local: LocalEmbedder) -> None:
    texts = [f"{MEMORIES[i % 6]} ({i})" for i in range(32 * 20)]
    with anyio.fail_after(10):
        with anyio.move_on_after(0.005) as scope:
            await local.embed(texts)
        assert scope.cancelled_caught
        assert (await local.embed(["hello"])).shape == (1, local.dim)


async def test_a_model_path_folder_is_another_vector_space(tmp_path: Path) -> None:
    folder = copy_model(tmp_path)
    embedder = LocalEmbedder.from_path(folder)
    assert embedder.name == "local/my-encoder"
    assert LocalEmbedder.from_path(folder / "model.onnx", model="mini").name == "local/mini"
    assert (await embedder.embed(["hello"])).shape == (1, 384)
    assert embedder.dim == 384


def test_a_model_path_without_its_files_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(am.EmbeddingError) as caught:
        LocalEmbedder.from_path(tmp_path / "nothing.onnx")
    assert str(caught.value) == f"local.modelPath: {tmp_path / 'nothing.onnx'} is not a file"
    (tmp_path / "m.onnx").write_bytes(b"x")
    with pytest.raises(am.EmbeddingError) as caught:
        LocalEmbedder.from_path(tmp_path / "m.onnx")
    assert str(caught.value) == f"local.modelPath: {tmp_path / 'tokenizer.json'} is not a file"


async def test_a_model_path_that_is_not_a_model_fails_on_embed(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"not onnx")
    shutil.copyfile(MINILM.folder / "tokenizer.json", tmp_path / "tokenizer.json")
    embedder = LocalEmbedder.from_path(tmp_path)
    with pytest.raises(am.EmbeddingError, match="^cannot load the embedding model "):
        await embedder.embed(["hello"])
    with pytest.raises(am.EmbeddingError, match="the vector size is known after the first embed"):
        _ = embedder.dim


# --- Encoders other than the shipped one (local.modelPath, embedder.json) ---------------------

TINY_DIM = 8


def tiny_encoder(
    folder: Path, *, inputs: tuple[str, ...] = ("input_ids", "attention_mask"), pooled: bool = False
) -> np.ndarray:
    """A real ONNX encoder in `folder` with the shipped tokenizer: each token's vector is a row of
    a random table. It declares exactly `inputs` (onnxruntime refuses any other); `pooled`: it
    sums the rows itself, pads included, and gives one vector per text. Returns the table."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(exist_ok=True)
    shutil.copyfile(MINILM.folder / "tokenizer.json", folder / "tokenizer.json")
    table = np.random.default_rng(0).normal(size=(30522, TINY_DIM)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["table", "input_ids"], ["rows"])]
    if pooled:
        nodes.append(helper.make_node("ReduceSum", ["rows", "axis"], ["out"], keepdims=0))
    else:
        nodes.append(helper.make_node("Identity", ["rows"], ["out"]))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(name, TensorProto.INT64, ["b", "s"]) for name in inputs],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([1]), "axis")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(folder / "model.onnx"))
    return table


async def test_a_model_without_token_type_ids_is_fed_only_what_it_declares(tmp_path: Path) -> None:
    table = tiny_encoder(tmp_path / "mpnet-like")
    embedder = LocalEmbedder.from_path(tmp_path / "mpnet-like")
    (vector,) = await embedder.embed(["hello"])
    ids = [101, 7592, 102]  # [CLS] hello [SEP]
    mean = table[ids].mean(axis=0)
    assert np.allclose(vector, mean / np.linalg.norm(mean), atol=1e-6)
    assert embedder.dim == TINY_DIM


async def test_embedder_json_sets_how_many_tokens_a_model_reads(tmp_path: Path) -> None:
    tiny_encoder(tmp_path / "short")
    (tmp_path / "short" / "embedder.json").write_text('{"max_tokens": 4}')
    embedder = LocalEmbedder.from_path(tmp_path / "short")
    long, prefix, other = await embedder.embed(["alpha beta gamma delta", "alpha beta", "alpha"])
    assert np.allclose(long, prefix, atol=1e-6)  # [CLS] alpha beta [SEP]
    assert not np.allclose(prefix, other, atol=1e-3)
    unlimited = LocalEmbedder.from_path(tmp_path / "short" / "model.onnx", model="x")
    (tmp_path / "short" / "embedder.json").unlink()  # read by from_path, not on embed
    assert np.allclose((await unlimited.embed(["alpha beta gamma delta"]))[0], long, atol=1e-6)
    default = LocalEmbedder.from_path(tmp_path / "short", model="default")
    assert not np.allclose((await default.embed(["alpha beta gamma delta"]))[0], long, atol=1e-3)


async def test_embedder_json_prefixes_go_before_a_query_and_before_a_stored_text(
    tmp_path: Path,
) -> None:
    """A model trained with task prefixes (nomic-embed-text: "search_query: ") gets the query
    one only for a search's query (`recall.hybrid.embed_query`), the other for all else."""
    tiny_encoder(tmp_path / "plain")
    shutil.copytree(tmp_path / "plain", tmp_path / "prefixed")
    (tmp_path / "prefixed" / "embedder.json").write_text(
        '{"query_prefix": "search_query: ", "document_prefix": "search_document: "}'
    )
    plain = LocalEmbedder.from_path(tmp_path / "plain")
    prefixed = LocalEmbedder.from_path(tmp_path / "prefixed")
    as_query, as_document = await plain.embed(
        ["search_query: hello world", "search_document: hello world"]
    )
    (stored,) = await prefixed.embed(["hello world"])
    assert np.allclose(stored, as_document, atol=1e-6)
    asked = await embed_query(prefixed, "hello world")
    assert asked.vector is not None and np.allclose(asked.vector, as_query, atol=1e-6)
    assert not np.allclose(as_query, as_document, atol=1e-3)
    # Without prefixes a query is embedded as it is.
    asked = await embed_query(plain, "hello world")
    assert asked.vector is not None
    assert np.allclose(asked.vector, (await plain.embed(["hello world"]))[0], atol=1e-6)


async def test_a_batch_is_padded_with_the_tokenizers_own_pad_token(tmp_path: Path) -> None:
    """A model that pools by itself sees the pad tokens: they must be the tokenizer's, whose
    row here is zero, so a text's vector does not depend on the batch it is in."""
    folder = tmp_path / "pads"
    table = tiny_encoder(folder, pooled=True)
    settings = json.loads((folder / "tokenizer.json").read_text())
    settings["padding"]["pad_id"] = 1  # "[unused0]", as MPNet's <pad> is 1
    (folder / "tokenizer.json").write_text(json.dumps(settings))
    table[1] = 0.0
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(folder / "model.onnx"))
    model.graph.initializer[0].CopyFrom(numpy_helper.from_array(table, "table"))
    onnx.save(model, str(folder / "model.onnx"))
    embedder = LocalEmbedder.from_path(folder)
    (alone,) = await embedder.embed(["hi"])
    batched, _ = await embedder.embed(["hi", "a much longer text than hi"])
    assert np.allclose(alone, batched, atol=1e-6)


async def test_a_model_asking_for_other_inputs_is_refused_by_name(tmp_path: Path) -> None:
    tiny_encoder(tmp_path / "odd", inputs=("input_ids", "attention_mask", "position_ids"))
    embedder = LocalEmbedder.from_path(tmp_path / "odd")
    with pytest.raises(am.EmbeddingError, match=r"asks for inputs \['position_ids'\]"):
        await embedder.embed(["hello"])


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('{"max_tokens": 0}', "max_tokens must be an integer from 1 to 8192, not 0"),
        ('{"max_tokens": "384"}', "max_tokens must be an integer from 1 to 8192, not '384'"),
        ('{"max_tokens": true}', "max_tokens must be an integer from 1 to 8192, not True"),
        ('{"maxTokens": 384}', 'must be a JSON object with only "max_tokens", "query_prefix"'),
        ("[384]", 'must be a JSON object with only "max_tokens", "query_prefix"'),
        ('{"query_prefix": 1}', "query_prefix must be a string of at most 200 characters, not 1"),
        (
            '{"document_prefix": "' + "x" * 201 + '"}',
            "document_prefix must be a string of at most 200 characters",
        ),
        ("{max_tokens: 384", "cannot read"),
    ],
)
def test_a_bad_embedder_json_is_an_error_naming_the_field(
    tmp_path: Path, text: str, error: str
) -> None:
    folder = copy_model(tmp_path)
    (folder / "embedder.json").write_text(text)
    with pytest.raises(am.EmbeddingError, match="^local.modelPath: ") as caught:
        LocalEmbedder.from_path(folder)
    assert error in str(caught.value)


async def test_the_mpnet_folder_built_by_the_export_tool_loads_and_finds_paraphrases() -> None:
    # The shipped folder, loaded as any `local.modelPath` folder (split weights, embedder.json).
    embedder = LocalEmbedder.from_path(SHIPPED_MODELS["all-mpnet-base-v2"].folder)
    assert embedder.name == "local/all-mpnet-base-v2"
    assert (await embedder.embed(["hello"])).shape == (1, 768)
    assert (await ranking(embedder, "Which city am I based in?"))[0] == LISBON
    assert (await ranking(embedder, "Do I have any allergies?"))[0] == PEANUTS


# --- The OpenAI-compatible client against a loopback server ----------------------------------


def unit(vector: list[float]) -> np.ndarray:
    v = np.array(vector, dtype=np.float32)
    return v / np.linalg.norm(v)


async def test_the_client_posts_the_texts_and_sorts_the_answer_by_index() -> None:
    with anyio.fail_after(10), serve([Embeddings(dim=8, reverse=True)]) as server:
        embedder = OpenAIEmbedder(
            provider="openai",
            base_url=server.base_url + "/",
            model="my-model",
            api_key="sk-1",
            headers={"X-Team": "a"},
        )
        vectors = await embedder.embed(["alpha", "beta", "gamma"])
        await embedder.aclose()
    assert isinstance(embedder, am.Embedder)
    assert (embedder.name, embedder.dim) == ("openai/my-model", 8)
    assert vectors.dtype == np.float32
    for row, text in zip(vectors, ["alpha", "beta", "gamma"], strict=True):
        assert np.allclose(row, unit(vector_for(text, 8)), atol=1e-6)
    (request,) = server.requests
    assert request.path == "/v1/embeddings"
    assert request.body == {"model": "my-model", "input": ["alpha", "beta", "gamma"]}
    assert request.headers["authorization"] == "Bearer sk-1"
    assert request.headers["x-team"] == "a"


async def test_the_client_sends_batches_of_64() -> None:
    texts = [f"text {i}" for i in range(130)]
    with anyio.fail_after(10), serve([Embeddings()] * 3) as server:
        embedder = OpenAIEmbedder(provider="ollama", base_url=server.base_url, model="m")
        vectors = await embedder.embed(texts)
        await embedder.aclose()
    assert [len(body["input"]) for body in server.bodies] == [64, 64, 2]
    assert vectors.shape == (130, 8)
    assert np.allclose(vectors[129], unit(vector_for("text 129", 8)), atol=1e-6)
    assert "authorization" not in server.requests[0].headers


def remote(base_url: str, model: str = "m") -> OpenAIEmbedder:
    return OpenAIEmbedder(provider="openai", base_url=base_url, model=model)


async def test_an_error_status_is_an_embedding_error() -> None:
    with (
        anyio.fail_after(10),
        serve([Status(500)]) as server,
        pytest.raises(am.EmbeddingError) as caught,
    ):
        await remote(server.base_url).embed(["a"])
    assert str(caught.value) == (
        'openai/m: the server answered 500 Internal Server Error: {"error": {"message": '
        '"try again later"}}'
    )


async def test_an_answer_that_is_not_json_is_an_embedding_error() -> None:
    with (
        anyio.fail_after(10),
        serve([Malformed()]) as server,
        pytest.raises(am.EmbeddingError, match=r"^openai/m: the answer is not valid JSON \("),
    ):
        await remote(server.base_url).embed(["a"])


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b'{"data": []}', "openai/m: expected 1 embeddings in data[], got 0"),
        (b'{"object": "list"}', "openai/m: expected 1 embeddings in data[], got no"),
        (b'{"data": [{"index": 3, "embedding": [1]}]}', "openai/m: data[0].index is not valid"),
        (
            b'{"data": [{"index": 0, "embedding": ["x"]}]}',
            "openai/m: data[0].embedding is not a list of numbers",
        ),
        (
            b'{"data": [{"index": 0, "embedding": [0, 0]}]}',
            "openai/m: the server sent a zero vector",
        ),
    ],
)
async def test_an_answer_in_the_wrong_shape_is_an_embedding_error(body: bytes, error: str) -> None:
    with (
        anyio.fail_after(10),
        serve([Malformed(body=body)]) as server,
        pytest.raises(am.EmbeddingError) as caught,
    ):
        await remote(server.base_url).embed(["a"])
    assert str(caught.value) == error


async def test_vectors_of_the_wrong_size_are_an_embedding_error() -> None:
    with (
        anyio.fail_after(10),
        serve([Embeddings(dim=8), Embeddings(dim=8), Embeddings(dim=4)]) as server,
    ):
        known = remote(server.base_url, model="text-embedding-3-small")
        assert known.dim == 1536
        with pytest.raises(am.EmbeddingError) as caught:
            await known.embed(["a"])
        assert str(caught.value) == (
            "openai/text-embedding-3-small: expected vectors of 1536 dimensions, got 8"
        )
        learned = remote(server.base_url)  # an unknown model: the first answer sets the size
        with pytest.raises(am.EmbeddingError, match="known after the first embed"):
            _ = learned.dim
        assert (await learned.embed(["a"])).shape == (1, 8)
        assert learned.dim == 8
        with pytest.raises(am.EmbeddingError) as caught:
            await learned.embed(["a"])
        assert str(caught.value) == "openai/m: expected vectors of 8 dimensions, got 4"


async def test_a_server_that_hangs_ends_at_the_deadline() -> None:
    with anyio.fail_after(10), serve([Hang()]) as server:
        start = anyio.current_time()
        with pytest.raises(
            EmbeddingDeadlineError, match=r"^openai/m: no answer from .* within 0\.\d\d s$"
        ):
            await remote(server.base_url).embed(["a"], deadline=start + 0.3)
        assert 0.25 < anyio.current_time() - start < 2.0


async def test_a_server_that_hangs_without_a_deadline_has_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("activememory.embed.openai.NO_DEADLINE_SECONDS", 0.2)
    with (
        anyio.fail_after(10),
        serve([Hang()]) as server,
        pytest.raises(am.EmbeddingError) as caught,
    ):
        await remote(server.base_url).embed(["a"])
    assert not isinstance(caught.value, EmbeddingDeadlineError)  # a fallback may take over
    assert str(caught.value).startswith("openai/m: no answer from ")


async def test_a_past_deadline_sends_nothing() -> None:
    with (
        anyio.fail_after(10),
        serve([]) as server,
        pytest.raises(EmbeddingDeadlineError, match="^openai/m: the embedding deadline passed$"),
    ):
        await remote(server.base_url).embed(["a"], deadline=anyio.current_time())
    assert server.requests == []


async def test_a_network_error_is_an_embedding_error() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with anyio.fail_after(10), pytest.raises(am.EmbeddingError) as caught:
        await remote(url).embed(["a"])
    assert str(caught.value).startswith(
        f"openai/m: the request to {url}/embeddings failed (Connect"
    )


# --- The config and the fallback chain -------------------------------------------------------


def search_config(**memory_search: object) -> am.Config:
    return am.load_config({"agents": {"defaults": {"memorySearch": memory_search}}})


def test_the_default_is_the_shipped_model() -> None:
    embedder = embedder_from_config(am.load_config({}))
    assert isinstance(embedder, LocalEmbedder)
    assert embedder.name == "local/all-mpnet-base-v2"


@pytest.mark.parametrize(
    "settings",
    [{"provider": "none"}, {"provider": None}, {"enabled": False}],
    ids=["none", "null", "disabled"],
)
def test_vectors_can_be_turned_off(settings: dict[str, object]) -> None:
    assert embedder_from_config(search_config(**settings)) is None


def test_ollama_is_the_openai_client_with_ollamas_address() -> None:
    embedder = embedder_from_config(search_config(provider="ollama"))
    assert isinstance(embedder, OpenAIEmbedder)
    assert embedder.name == "ollama/nomic-embed-text"
    assert embedder.url == "http://127.0.0.1:11434/v1/embeddings"
    assert embedder.dim == 768


def test_openai_without_a_key_falls_back() -> None:
    assert embedder_from_config(search_config(provider="openai")) is None
    embedder = embedder_from_config(search_config(provider="openai", fallback="local"))
    assert isinstance(embedder, LocalEmbedder)


def test_a_local_model_that_is_not_shipped_falls_back() -> None:
    assert embedder_from_config(search_config(model="bge-small-en")) is None
    missing = search_config(local={"modelPath": "/nonexistent/model.onnx"}, fallback="ollama")
    assert isinstance(embedder_from_config(missing), OpenAIEmbedder)


def test_the_host_providers_give_the_key_and_address() -> None:
    config = am.load_config(
        {
            "agents": {"defaults": {"memorySearch": {"provider": "openai"}}},
            "models": {"providers": {"openai": {"baseUrl": "http://10.0.0.1/v1", "apiKey": "k"}}},
        }
    )
    embedder = embedder_from_config(config)
    assert isinstance(embedder, OpenAIEmbedder)
    assert embedder.url == "http://10.0.0.1/v1/embeddings"
    assert embedder.name == "openai/text-embedding-3-small"


async def test_the_api_key_comes_from_the_environment() -> None:
    with anyio.fail_after(10), serve([Embeddings()]) as server:
        config = am.load_config(
            {
                "agents": {
                    "defaults": {
                        "memorySearch": {
                            "provider": "openai",
                            "model": "m",
                            "remote": {"baseUrl": server.base_url, "apiKey": "${EMBED_KEY}"},
                        }
                    }
                }
            },
            env={"EMBED_KEY": "sk-env"},
        )
        embedder = embedder_from_config(config)
        assert embedder is not None
        await embedder.embed(["a"])
    assert server.requests[0].headers["authorization"] == "Bearer sk-env"


async def test_the_fallback_takes_over_when_the_provider_fails() -> None:
    with anyio.fail_after(20), serve([Hang(), Status(503)]) as server:
        embedder = embedder_from_config(
            search_config(
                provider="ollama", model="m", fallback="local", remote={"baseUrl": server.base_url}
            )
        )
        assert isinstance(embedder, FallbackEmbedder)
        assert embedder.name == "ollama/m"
        # A missed deadline says nothing about the server: no switch.
        with pytest.raises(EmbeddingDeadlineError):
            await embedder.embed(["a"], deadline=anyio.current_time() + 0.2)
        assert embedder.name == "ollama/m"
        with pytest.raises(am.EmbeddingError) as caught:
            await embedder.embed(["a"])
        assert str(caught.value) == (
            'ollama/m: the server answered 503 Service Unavailable: {"error": {"message": '
            '"try again later"}}; local/all-mpnet-base-v2 takes over'
        )
        assert (embedder.name, embedder.dim) == ("local/all-mpnet-base-v2", 768)
        assert (await embedder.embed(["a"])).shape == (1, 768)
    assert len(server.requests) == 2


def test_the_readme_lists_every_memory_search_key() -> None:
    import msgspec.inspect as mi

    from activememory.protocol.config import MemorySearchDefaults

    def keys(t: mi.Type, prefix: str) -> list[str]:
        while isinstance(t, mi.Metadata):
            t = t.type
        if not isinstance(t, mi.StructType) or t.cls.__name__ == "dict":
            return [prefix]
        found: list[str] = []
        for field in t.fields:
            found += keys(field.type, f"{prefix}.{field.encode_name}".lstrip("."))
        return found

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### Embeddings", 1)[1].split("\n### ", 1)[0]
    for key in keys(mi.type_info(MemorySearchDefaults), ""):
        assert f"| `{key}` |" in section, key


def test_at_exit_running_embeds_are_stopped_and_waited_for(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # onnxruntime aborts the process when the interpreter is torn down under a running
    # session (seen as "terminate called" after a benchmark closed its memory mid-batch):
    # the exit hook asks abandoned runs to stop after their batch and waits for them.
    from activememory.embed import local as module

    texts = [f"sentence {i} about a long and quiet afternoon" for i in range(3000)]
    done: list[object] = []

    async def embed() -> None:
        done.append(await local.embed(texts))

    async def abandon() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(embed)
            with anyio.fail_after(30):  # until its worker thread has started the run
                while not module._runs:  # noqa: ASYNC110 - the state of a worker thread
                    await anyio.sleep(0.001)
            tg.cancel_scope.cancel()

    anyio.run(abandon)
    assert done == [] and module._runs  # cancelled, but its thread is still embedding
    monkeypatch.setattr(module, "_exiting", False)  # restored after: the process goes on
    module._stop_runs_at_exit()
    assert not module._runs  # stopped after its batch, long before 3000 texts were done


def test_after_the_exit_hook_a_queued_run_never_starts_the_model(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run still queued for a worker thread when the exit hook ran reached the model after
    # the hook had waited, and onnxruntime aborted the process at teardown (seen once in a
    # few runs of a test file whose memories closed mid-batch): it must not start.
    import threading

    from activememory.embed import local as module

    monkeypatch.setattr(module, "_exiting", False)
    module._stop_runs_at_exit()
    assert local._embed_sync(["a late sentence"], None, threading.Event()) is None
    assert not module._runs


@pytest.mark.skipif(sys.platform != "linux", reason="per-thread CPU priority is Linux's")
def test_background_work_runs_at_a_lower_cpu_priority_and_a_query_does_not(
    local: LocalEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The embedder actor's backlog must not take the CPU a recall's query needs: on two
    # cores, the default model at 67 appends/s kept the breaker open for most recalls.
    import os
    import threading

    from activememory.embed import local as module
    from activememory.protocol.embeddings import BACKGROUND

    seen: list[tuple[int, str]] = []
    real = module._Model.embed

    def recording(self, texts, stop_at, stop):  # type: ignore[no-untyped-def]
        tid = threading.get_native_id()
        seen.append((os.getpriority(os.PRIO_PROCESS, tid), threading.current_thread().name))
        return real(self, texts, stop_at, stop)

    monkeypatch.setattr(module._Model, "embed", recording)

    async def both() -> None:
        await local.embed(["a query"])
        token = BACKGROUND.set(True)
        try:
            await local.embed(["a stored message"])
        finally:
            BACKGROUND.reset(token)
        await local.embed(["a query again"])

    base = os.getpriority(os.PRIO_PROCESS, 0)
    anyio.run(both)
    query, background, query_again = seen
    assert query[0] == base and query_again[0] == base
    assert background == (
        min(19, base + module.BACKGROUND_NICE),
        "activememory embedder (background)",
    )
