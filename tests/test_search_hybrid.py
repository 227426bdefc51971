"""`mem.sessions.search(..., mode="hybrid")` (docs/design.md §3): a paraphrase found by
meaning with the shipped embedder, the fallback to text, the mode's validation, redaction
of what only the vector side found, and `activememory search --mode hybrid`."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from test_visibility_hybrid import NeedleEmbedder

import activememory as am
from activememory._cli import main

from fake_embedder import FakeEmbedder

pytestmark = pytest.mark.anyio

KEY = "agent:main:direct:alice"
FACTS = [
    ("user", "I am allergic to peanuts, they make me really sick."),
    ("user", "My favourite colour is green."),
    ("assistant", "Noted. The weather looks nice today."),
]
QUESTION = "which foods should I avoid eating?"


async def store_facts(mem: am.Memory) -> None:
    for role, text in FACTS:
        await mem.sessions.append(KEY, am.Message(role=role, content=text))  # type: ignore[arg-type]


async def test_a_paraphrase_is_found_only_by_meaning(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "state") as mem:  # default config: the shipped model
        await store_facts(mem)
        assert await mem.sessions.vectors_ready()
        text = await mem.sessions.search(QUESTION, caller=KEY)
        assert text.results == () and text.fallback is None
        res = await mem.sessions.search(QUESTION, caller=KEY, mode="hybrid")
        assert res.fallback is None
        assert [h.snippet for h in res.results] == [FACTS[0][1]]  # the others are too far
        hit = res.results[0]
        assert hit.session_key == KEY and hit.role == "user"
        assert hit.similarity is not None and 0.3 <= hit.similarity <= 1.0
        assert hit.score == pytest.approx(0.7 * hit.similarity)  # default weights, no words


async def test_words_and_meaning_are_fused(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "state") as mem:
        await store_facts(mem)
        assert await mem.sessions.vectors_ready()
        res = await mem.sessions.search("peanuts allergy", caller=KEY, mode="hybrid")
        top = res.results[0]
        assert top.snippet == FACTS[0][1] and top.similarity is not None
        assert top.score == pytest.approx(0.3 * 1.0 + 0.7 * top.similarity)  # best text: 1
        plain = await mem.sessions.search("peanuts allergy", caller=KEY)
        assert plain.results[0].similarity is None  # text mode: unchanged


async def test_a_failing_embedder_means_text_only_and_says_so(tmp_path: Path) -> None:
    embedder = FakeEmbedder()
    async with am.open_memory(tmp_path / "state", executor="inline", embedder=embedder) as mem:
        await store_facts(mem)
        assert await mem.sessions.vectors_ready()
        embedder.fail = True
        res = await mem.sessions.search("green colour", caller=KEY, mode="hybrid")
        text = await mem.sessions.search("green colour", caller=KEY)
        assert res.fallback is not None and "the embedder failed" in res.fallback
        assert res.results == text.results and text.fallback is None


async def test_a_hanging_embedder_is_given_up_on(tmp_path: Path) -> None:
    embedder = FakeEmbedder()
    async with am.open_memory(tmp_path / "state", executor="inline", embedder=embedder) as mem:
        await store_facts(mem)
        assert await mem.sessions.vectors_ready()
        embedder.hang = True
        res = await mem.sessions.search("green colour", caller=KEY, mode="hybrid")
        assert res.fallback == "the embedder took over 1 s"
        embedder.hang = False
        assert res.results == (await mem.sessions.search("green colour", caller=KEY)).results


async def test_no_embedder_means_text_only_and_says_so(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "state", executor="inline") as mem:  # no embedder
        await store_facts(mem)
        res = await mem.sessions.search("green colour", caller=KEY, mode="hybrid")
        assert res.fallback is not None and "no embedder" in res.fallback
        assert res.results == (await mem.sessions.search("green colour", caller=KEY)).results


@pytest.mark.parametrize("mode", ["vector", "Hybrid", "", None, 1])
async def test_a_bad_mode_is_named(tmp_path: Path, mode: object) -> None:
    async with am.open_memory(tmp_path / "state", executor="inline") as mem:
        with pytest.raises(am.InvalidInputError, match=r"^mode: .* is not one of 'text', 'hybrid'"):
            await mem.sessions.search("tea", caller=KEY, mode=mode)  # type: ignore[arg-type]


async def test_what_only_meaning_found_is_redacted(tmp_path: Path) -> None:
    secret = "sk-abcdefghijklmnopqrstuvwx"
    async with am.open_memory(
        tmp_path / "state", executor="inline", embedder=NeedleEmbedder()
    ) as mem:
        await mem.sessions.append(
            KEY, am.Message(role="user", content=f"the needle opens with {secret} today")
        )
        assert await mem.sessions.vectors_ready()
        assert (await mem.sessions.search("haystack", caller=KEY)).results == ()
        res = await mem.sessions.search("haystack", caller=KEY, mode="hybrid")
        assert len(res.results) == 1  # found by meaning only
        assert "needle opens with" in res.results[0].snippet
        assert secret not in json.dumps(msgspec.to_builtins(res))


def test_cli_search_mode_hybrid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    transcript = tmp_path / "t.jsonl"
    lines = ['{"type": "session", "key": "agent:main:direct:alice"}']
    for i, (role, text) in enumerate(FACTS, start=1):
        message = {"role": role, "content": text}
        lines.append(
            json.dumps({"type": "message", "id": str(i), "timestamp": i, "message": message})
        )
    transcript.write_text("\n".join(lines) + "\n")
    state = str(tmp_path / "state")
    assert main(["import", str(transcript), "--state-dir", state]) == 0
    capsys.readouterr()
    args = ["search", QUESTION, "--state-dir", state, "--caller", KEY, "--wait"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == []
    assert main([*args, "--json", "--mode", "hybrid"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert [r["snippet"] for r in answer["results"]] == [FACTS[0][1]]
    assert answer["results"][0]["similarity"] > 0.3 and answer["fallback"] is None
    with pytest.raises(SystemExit):
        main([*args, "--mode", "vector"])
    assert "--mode: invalid choice: 'vector'" in capsys.readouterr().err
