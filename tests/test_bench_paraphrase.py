"""`activememory bench paraphrase`: the data set is well-formed and asks every fact in other
words; the judge; the run end to end through the CLI on a slice."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
import trio

from activememory._cli import main as cli
from activememory.simulations.bench import paraphrase
from activememory.simulations.bench.paraphrase import (
    Chat,
    ChatTurn,
    Fact,
    ParaphraseSet,
    Question,
    check,
    config_for,
    content_words,
    judge,
    load,
)

CATEGORIES = {
    "preferences",
    "diet",
    "family",
    "work",
    "home",
    "pets",
    "travel",
    "health",
    "schedule",
    "possessions",
    "dislikes",
}


@pytest.fixture(scope="module")
def data() -> ParaphraseSet:
    return load(paraphrase.data_file())


def test_the_data_set_is_big_enough_and_well_formed(data: ParaphraseSet) -> None:
    assert check(data) == []
    assert len(data.facts) >= 40
    assert data.distractor_turns() >= 300
    assert len(data.unrelated) >= 10
    assert {f.category for f in data.facts} == CATEGORIES
    # Every fact is asked, and only facts that exist are asked for.
    assert {q.fact for q in data.fact_questions} == {f.id for f in data.facts}
    # The facts are spread over several private chats of the user; other users' chats hold
    # near-misses that must never be recalled for her.
    assert len({f.chat for f in data.facts}) >= 3
    others = [c for c in data.chats if c.identity != data.user]
    assert len(others) >= 2 and all(c.turns for c in others)
    assert all(q.keywords == () for q in data.unrelated)


def test_no_question_shares_a_content_word_with_its_fact(data: ParaphraseSet) -> None:
    facts = {f.id: f.text for f in data.facts}
    shared = {
        q.id: content_words(q.text) & content_words(facts[q.fact])
        for q in data.fact_questions
        if q.fact is not None
    }
    assert {qid: words for qid, words in shared.items() if words} == {}


def test_content_words_are_stems_without_stopwords() -> None:
    assert content_words("I am allergic to peanuts, so no peanut snacks please.") == {
        "allerg",
        "peanut",
        "snack",
        "pleas",
    }
    assert content_words("Is there anything I must not eat?") == {"anyth", "must", "eat"}


def _set(questions: list[Question], *, fact_chat: str = "maya-tg") -> ParaphraseSet:
    return ParaphraseSet(
        name="t",
        version=1,
        about="a test set",
        agent="main",
        user="maya",
        identity_links={"maya": ("telegram:1",), "jonas": ("telegram:2",)},
        facts=(Fact(id="f1", category="diet", chat=fact_chat, text="I am allergic to peanuts."),),
        questions=tuple(questions),
        chats=(
            Chat(
                id="maya-tg",
                session_key="agent:main:direct:telegram:1",
                identity="maya",
                turns=(
                    ChatTurn(role="user", text="hi there"),
                    ChatTurn(fact="f1"),
                    ChatTurn(role="assistant", text="Noted."),
                ),
            ),
            Chat(
                id="jonas-tg",
                session_key="agent:main:direct:telegram:2",
                identity="jonas",
                turns=(
                    ChatTurn(role="user", text="I'm allergic to peanuts too."),
                    ChatTurn(role="user", text="My beagle Max howls at every siren."),
                ),
            ),
        ),
    )


def test_check_names_every_problem() -> None:
    broken = _set(
        [
            Question(id="q1", text="Am I allergic to anything?", fact="f1", keywords=("peanut",)),
            Question(id="q1", text="What must I avoid?", fact="f1", keywords=("shellfish",)),
            Question(id="q3", text="Which food is off limits?", fact="f9", keywords=("x",)),
            Question(id="q4", text="What must I avoid?", fact="f1"),
        ],
        fact_chat="jonas-tg",
    )
    assert check(broken) == [
        "question 'q1' appears 2 times",
        "fact 'f1': chat 'jonas-tg' is not 'maya''s",
        "chat 'maya-tg': says 'f1', not one of its facts",
        "question 'q1' shares allerg with fact 'f1'",
        "question 'q1': the keywords also match chat 'jonas-tg' turn 0",
        "question 'q1': keyword 'shellfish' is not in fact 'f1'",
        "question 'q3': no fact 'f9'",
        "question 'q4': no keywords",
    ]


def test_a_malformed_data_file_is_refused_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.json"
    question = Question(id="q1", text="Am I allergic to anything?", fact="f1", keywords=("pea",))
    bad.write_bytes(msgspec.json.encode(_set([question])))
    assert cli(["bench", "paraphrase", "--data", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"activememory bench paraphrase: {bad}: question 'q1': keyword 'pea' is not in fact "
        "'f1'; question 'q1' shares allerg with fact 'f1'\n"
    )
    bad.write_text('{"name": "t"}')
    assert cli(["bench", "paraphrase", "--data", str(bad)]) == 2
    assert "Object missing required field `version`" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fact", "note", "verdict"),
    [
        ("f1", None, "missed"),
        ("f1", "The user is allergic to peanuts.", "recalled"),
        ("f1", "The user is ALLERGIC to Peanuts, so no snacks.", "recalled"),
        ("f1", "The user's friend is allergic to shellfish.", "wrong"),
        ("f1", "The user is allergic to peanut butter.", "recalled"),
        ("f1", "The user said: grapeanuts", "wrong"),  # whole words, not any substring
        ("f1", "The user is allergic to peanutbutter.", "wrong"),
        (None, None, "quiet"),
        (None, "The user is allergic to peanuts.", "injected"),
    ],
)
def test_judge(fact: str | None, note: str | None, verdict: str) -> None:
    keywords = ("allergic", "peanut") if fact else ()
    question = Question(id="q", text="What must I avoid?", fact=fact, keywords=keywords)
    assert judge(question, note) == verdict


def test_the_owner_is_recalled_across_her_chats_and_another_user_never(tmp_path: Path) -> None:
    # Built in code, so a question may repeat its fact's words (today's text search finds it).
    data = _set(
        [
            Question(id="q1", text="Am I allergic to peanuts?", fact="f1", keywords=("peanut",)),
            Question(id="u1", text="Does my beagle Max howl at sirens?", fact=None),
        ]
    )
    config = config_for(data, {"tools": {"sessions": {"visibility": "agent"}}})
    assert config["session"]["identityLinks"] == data.identity_links
    assert config["plugins"]["entries"]["active-memory"]["config"] == {"ownerIdentity": "maya"}
    assert config["tools"] == {"sessions": {"visibility": "agent"}}
    asked, _ = trio.run(paraphrase.run_benchmark, tmp_path, data, config, data.questions)
    recalled, other = asked
    assert (recalled.judged, recalled.status, recalled.closest_identity) == (
        "recalled",
        "ok",
        "maya",
    )
    assert recalled.note == "The user is allergic to peanuts."  # hers, never "too"
    assert recalled.closest == "maya-tg: I am allergic to peanuts."
    assert (other.judged, other.status) == ("quiet", "no_relevant_memory")


SMALL = "all-MiniLM-L6-v2"  # shipped beside the default; the default's own run is the bench's


def test_the_cli_runs_a_slice_end_to_end_and_prints_its_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    small = tmp_path / "small.json5"  # the small shipped model: the corpus embeds quickly
    small.write_text(f"{{agents: {{defaults: {{memorySearch: {{model: {SMALL!r}}}}}}}}}")
    runs = tmp_path / "runs"
    argv = ["--limit", "3", "--state-dir", str(runs), "--config", str(small)]
    assert cli(["bench", "paraphrase", *argv]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Paraphrase recall: facts asked in other words")
    assert f"  config: {small} (+ the data set's identities)" in out
    for label, target in (
        ("recalled", "(target >= 80%)"),
        ("wrong notes", "(target <= 5%)"),
        ("unrelated injecting", "(target <= 10%)"),
    ):
        (line,) = [x for x in out.splitlines() if x.startswith(f"  {label} ") and target in x]
        assert line.endswith((": PASS", ": MISS"))
    assert "  category       facts  recalled  wrong" in out
    assert "  missed (question -> status):" in out
    assert "  wrong notes (question -> note):" in out
    # --state-dir keeps each run in a new directory of its own.
    (run,) = runs.iterdir()
    assert run.name.startswith("bench-paraphrase-") and (run / "agents" / "main").is_dir()


def test_json_and_a_config_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    off = tmp_path / "off.json5"
    off.write_text(
        '{plugins: {entries: {"active-memory": {config: {enabled: false}}}},'
        f" agents: {{defaults: {{memorySearch: {{model: {SMALL!r}}}}}}}}}"
    )
    assert cli(["bench", "paraphrase", "--limit", "2", "--config", str(off), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["config"] == str(off)
    assert result["asked"] == {"facts": 2, "unrelated": 2}
    assert result["statuses"] == {"skipped": 4}  # the file's config was used
    assert result["counts"]["missed"] == 2 and result["recalled"] == 0.0
    assert [r["question"] for r in result["results"]] == ["q01", "q02", "u01", "u02"]
    assert result["corpus"]["facts"] >= 40

    wrong = tmp_path / "wrong.json5"
    wrong.write_text('{plugins: {entries: {"active-memory": {config: {enabled: "yes"}}}}}')
    assert cli(["bench", "paraphrase", "--config", str(wrong)]) == 2
    assert "enabled" in capsys.readouterr().err
