"""LoCoMo import: parsed structure, normalised gold evidence, exact errors, CLI and benchmark.

The fixture is hand-written in the LoCoMo layout (the dataset itself may not be committed).
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
import trio

import activememory as am
from activememory._cli import main
from activememory._importers import LocomoTurn, locomo_turn_text, read_locomo
from activememory.simulations.bench import locomo as bench_locomo

PHOTO_CAPTION = "a photo of a small brown dog asleep on a sofa"
SAMPLE: dict[str, Any] = {
    "sample_id": "Conv 7/A",
    "conversation": {
        "speaker_a": "Ann",
        "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "Hi Bob! I adopted a puppy last week."},
            {"speaker": "Bob", "dia_id": "D1:2", "text": "Lovely! What did you call her?"},
            {
                "speaker": "Ann",
                "dia_id": "D1:3",
                "text": "Her name is Pixel, look at her.",
                "img_url": ["https://example.invalid/pixel.jpg"],
                "blip_caption": PHOTO_CAPTION,
                "query": "puppy sofa",
            },
        ],
        "session_2_date_time": "10:37 am on 27 June, 2023",
        "session_2": [
            {"speaker": "Bob", "dia_id": "D2:1", "text": "How is Pixel doing with training?"},
            {"speaker": "Ann", "dia_id": "D2:2", "text": "Great, Pixel learned to sit!"},
        ],
        # LoCoMo dates sessions it never wrote: a date alone is no session.
        "session_3_date_time": "4:10 pm on 26 October, 2023",
    },
    "qa": [
        {"question": "What is the name of Ann's puppy?", "answer": "Pixel",
         "evidence": ["D1:3"], "category": 4},
        {"question": "What did Pixel learn, and when was she adopted?", "answer": "to sit",
         "evidence": ["D1:3; D2:2"], "category": 1},
        {"question": "When did Ann adopt her puppy?", "answer": 2023,
         "evidence": ["D:1:01", "D2:02", "D1:1"], "category": 2},
        {"question": "Does Bob have a cat?", "answer": None,
         "evidence": ["D9:9", "D1:99", "session 1"], "category": 3},
        {"question": "What did Bob adopt?", "adversarial_answer": "a puppy",
         "evidence": ["D1:1"], "category": 5},
    ],
    "observation": {"session_1_observation": {"Ann": [["Ann adopted a puppy.", "D1:1"]]}},
    "session_summary": {"session_1_summary": "Ann tells Bob about her puppy."},
}  # fmt: skip
KEY_1 = "agent:conv-7-a:explicit:locomo-session-1"
KEY_2 = "agent:conv-7-a:explicit:locomo-session-2"
MAY_8 = dt.datetime(2023, 5, 8, 13, 56, tzinfo=dt.UTC).timestamp()
JUNE_27 = dt.datetime(2023, 6, 27, 10, 37, tzinfo=dt.UTC).timestamp()


def write(path: Path, samples: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps(samples), encoding="utf-8")
    return path


@pytest.fixture
def locomo(tmp_path: Path) -> Path:
    return write(tmp_path / "locomo.json", [SAMPLE])


def test_samples_sessions_and_turns(locomo: Path) -> None:
    (sample,) = read_locomo(locomo)
    assert (sample.sample_id, sample.agent, sample.speaker_a, sample.speaker_b) == (
        "Conv 7/A",
        "conv-7-a",
        "Ann",
        "Bob",
    )
    assert [(s.number, s.session_key, s.started_at, s.dia_ids) for s in sample.sessions] == [
        (1, KEY_1, MAY_8, ("D1:1", "D1:2", "D1:3")),
        (2, KEY_2, JUNE_27, ("D2:1", "D2:2")),
    ]
    assert sample.turns == 5
    assert sample.sessions[0].turns[2] == LocomoTurn(
        dia_id="D1:3",
        speaker="Ann",
        text="Her name is Pixel, look at her.",
        blip_caption=PHOTO_CAPTION,
    )
    one, two = sample.sessions
    assert [(e.id, e.parent_id, e.timestamp, e.message.role) for e in one.entries] == [
        ("D1:1", None, MAY_8, "user"),
        ("D1:2", "D1:1", MAY_8 + 1, "assistant"),
        ("D1:3", "D1:2", MAY_8 + 2, "user"),
    ]
    assert [(e.id, e.parent_id, e.timestamp, e.message.role) for e in two.entries] == [
        ("D2:1", None, JUNE_27, "assistant"),
        ("D2:2", "D2:1", JUNE_27 + 1, "user"),
    ]
    assert one.entries[2].message.content == locomo_turn_text(one.turns[2], "Ann")
    assert two.entries[1].message.content == locomo_turn_text(two.turns[1], "Ann")


def test_default_turn_text_describes_the_shared_photo() -> None:
    plain = LocomoTurn(dia_id="D1:1", speaker="Ann", text="Hi Bob!")
    photo = LocomoTurn(dia_id="D1:3", speaker="Ann", text="Look!", blip_caption=PHOTO_CAPTION)
    assert locomo_turn_text(plain, "Ann") == "Ann: Hi Bob!"
    assert locomo_turn_text(photo, "Ann") == f"Ann: Look! [shares a photo: {PHOTO_CAPTION}]"


def test_questions_and_normalised_evidence(locomo: Path) -> None:
    (sample,) = read_locomo(locomo)
    assert [(q.category, q.answer, q.adversarial_answer, q.evidence) for q in sample.questions] == [
        (4, "Pixel", None, ("D1:3",)),
        (1, "to sit", None, ("D1:3", "D2:2")),  # "D1:3; D2:2" is two ids
        (2, "2023", None, ("D1:1", "D2:2")),  # D:1:01 and D2:02 read as D1:1, D2:2; no repeats
        (3, None, None, ()),  # not turns of this conversation: dropped
        (5, None, "a puppy", ("D1:1",)),
    ]
    assert sample.questions[0].question == "What is the name of Ann's puppy?"


def test_a_custom_turn_text(locomo: Path) -> None:
    (sample,) = read_locomo(locomo, turn_text=lambda turn, speaker: f"{speaker} said {turn.text}")
    assert sample.sessions[1].entries[0].message.content == (
        "Bob said How is Pixel doing with training?"
    )


def broken(change: str, value: Any) -> list[dict[str, Any]]:
    sample = copy.deepcopy(SAMPLE)
    node: Any = sample
    *parents, last = change.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return [sample]


@pytest.mark.parametrize(
    ("change", "value", "error"),
    [
        ("conversation.session_2_date_time", "27/06/2023",
         "sample[0].conversation.session_2_date_time: '27/06/2023' is not a date like "
         "'1:56 pm on 8 May, 2023'"),
        ("conversation.session_1_date_time", "1:56 pm on 31 June, 2023",
         "sample[0].conversation.session_1_date_time: '1:56 pm on 31 June, 2023' is not a "
         "valid date (day is out of range for month)"),
        ("conversation.session_2.1.text", 5,
         "sample[0].conversation.session_2[1].text: expected a string, got a number"),
        ("conversation.session_1.0.speaker", "Cat",
         "sample[0].conversation.session_1[0].speaker: 'Cat' is neither speaker_a 'Ann' "
         "nor speaker_b 'Bob'"),
        ("conversation.session_2.0.dia_id", "D1:2",
         "sample[0].conversation.session_2[0].dia_id: 'D1:2' is repeated "
         "(also at session_1[1])"),
        ("conversation.sesion_4", [],
         "sample[0].conversation.sesion_4: unknown field (expected speaker_a, speaker_b, "
         "session_<N> and session_<N>_date_time)"),
        ("qa.1.evidence", "D1:3", "sample[0].qa[1].evidence: expected a list, got a string"),
        ("qa.0.category", "4", "sample[0].qa[0].category: expected an integer, got a string"),
        ("sample_id", "_x", "sample[0].sample_id: '_x' gives the agent id '_x', which does "
         "not start with a letter or digit"),
    ],
)  # fmt: skip
def test_errors_name_the_file_and_field(
    tmp_path: Path, change: str, value: Any, error: str
) -> None:
    path = write(tmp_path / "bad.json", broken(change, value))
    with pytest.raises(am.InvalidInputError) as raised:
        read_locomo(path)
    assert str(raised.value) == f"{path}: {error}"


def test_a_session_needs_its_date(tmp_path: Path) -> None:
    sample = copy.deepcopy(SAMPLE)
    del sample["conversation"]["session_2_date_time"]
    path = write(tmp_path / "bad.json", [sample])
    with pytest.raises(am.InvalidInputError) as raised:
        read_locomo(path)
    assert str(raised.value) == f"{path}: sample[0].conversation.session_2_date_time: missing"


def test_not_a_list_of_samples(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"sample_id": "x"}')
    with pytest.raises(am.InvalidInputError) as raised:
        read_locomo(path)
    assert str(raised.value) == f"{path}: top level: expected a list of samples, got an object"


@pytest.mark.anyio
async def test_history_lists_the_turns_in_dia_id_order(mem: am.Memory, locomo: Path) -> None:
    (sample,) = read_locomo(locomo)
    for session in sample.sessions:
        count = await mem.sessions.import_transcript(session.session_key, session.entries)
        assert count == len(session.turns)
    rebuilt = await mem.sessions.rebuild_index()
    assert (rebuilt.sessions, rebuilt.index_rows) == (2, 5)
    for session in sample.sessions:
        history = await mem.sessions.history(session.session_key)
        assert [e.message.content for e in history if e.message] == [
            e.message.content for e in session.entries
        ]
        assert [e.timestamp for e in history] == [e.timestamp for e in session.entries]
        info = await mem.sessions.info(session.session_key)
        assert (info.chat_type, info.conversation_id, info.dirty) == (
            "explicit",
            f"locomo-session-{session.number}",
            False,
        )


def test_cli_imports_and_rebuilds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, locomo: Path
) -> None:
    state = str(tmp_path / "state")
    assert main(["import", str(locomo), "--state-dir", state]) == 0
    assert capsys.readouterr().out == (
        f"imported LoCoMo sample Conv 7/A from {locomo} into agent conv-7-a: 2 sessions, 5 turns\n"
    )
    assert main(["history", KEY_1, "--state-dir", state, "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    assert [(e["message"]["role"], e["timestamp"]) for e in events] == [
        ("user", MAY_8),
        ("assistant", MAY_8 + 1),
        ("user", MAY_8 + 2),
    ]
    assert events[2]["message"]["content"].startswith("Ann: Her name is Pixel")
    assert main(["stats", "--state-dir", state, "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert [
        (s["agent"], s["sessions"], s["indexed_messages"], s["dirty_sessions"]) for s in stats
    ] == [("conv-7-a", 2, 5, 0)]


def test_cli_import_json_and_explicit_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, locomo: Path
) -> None:
    renamed = locomo.rename(tmp_path / "locomo.data")  # not .json: the format must be named
    state = str(tmp_path / "state")
    argv = ["import", str(renamed), "--state-dir", state, "--no-rebuild", "--json"]
    assert main([*argv, "--format", "locomo"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {
            "path": str(renamed),
            "sample_id": "Conv 7/A",
            "agent": "conv-7-a",
            "sessions": 2,
            "skipped_sessions": 0,
            "turns": 5,
            "questions": 5,
        }
    ]
    assert main(["stats", "--state-dir", state, "--json"]) == 0
    assert [s["dirty_sessions"] for s in json.loads(capsys.readouterr().out)] == [2]


def test_cli_import_reports_a_bad_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(tmp_path / "bad.json", broken("conversation.session_2.1.text", None))
    assert main(["import", str(path), "--state-dir", str(tmp_path / "state")]) == 2
    assert capsys.readouterr().err == (
        f"activememory: error: {path}: sample[0].conversation.session_2[1].text: "
        "expected a string, got null\n"
    )


def test_cli_import_refuses_a_session_key_for_locomo(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, locomo: Path
) -> None:
    argv = ["import", str(locomo), "--state-dir", str(tmp_path / "s"), "--session-key", "x"]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        "activememory: error: --session-key: LoCoMo files name their own sessions\n"
    )


def test_bench_skips_without_data(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = tmp_path / "nowhere" / "locomo-dev.json"
    monkeypatch.setenv("ACTIVEMEMORY_LOCOMO", str(missing))
    assert main(["bench", "locomo", "--json"]) == 0
    out, err = capsys.readouterr()
    reason = f"no LoCoMo data at {missing} (give --data or set $ACTIVEMEMORY_LOCOMO)"
    assert json.loads(out) == {"benchmark": "locomo", "skipped": True, "reason": reason}
    assert err == f"activememory bench locomo: {reason}; skipped\n"


def test_bench_default_data_is_next_to_the_repository() -> None:
    repo = Path(__file__).resolve().parents[1]
    assert bench_locomo.DEFAULT_DATA.resolve() == (
        repo.parent / "shared" / "data" / "locomo" / "locomo-dev.json"
    )


def test_bench_scores_the_fixture(capsys: pytest.CaptureFixture[str], locomo: Path) -> None:
    assert main(["bench", "locomo", "--data", str(locomo), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["corpus"] == {
        "samples": 1,
        "sessions": 2,
        "turns": 5,
        "questions": 5,
        "skipped_no_gold": 1,
    }
    # D2:2 ("Pixel learned to sit") shares no word with "When did Ann adopt her puppy?"
    # but its speaker's name, which the turn text carries ("Ann: …"): 3 / 3 questions.
    recall = result["categories_1_4"]["recall_at"]
    assert result["categories_1_4"]["questions"] == 3
    assert [recall["5"], recall["10"], recall["20"]] == [1.0, 1.0, 1.0]
    assert 0 <= recall["1"] <= recall["5"]
    assert result["category_5"] == {
        "questions": 1,
        "recall_at": {"1": 1.0, "5": 1.0, "10": 1.0, "20": 1.0},
    }
    assert (result["latency_ms"]["queries"], result["indexing_answers"]) == (4, 0)
    assert main(["bench", "locomo", "--data", str(locomo), "--limit", "5"]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0] == (
        "LoCoMo retrieval: recall@k of the gold evidence turns through sessions_search"
    )
    assert "  categories 1-4             3   " in table
    assert "R@10" not in table  # only k <= --limit


def test_a_re_run_imports_only_the_sessions_a_killed_run_did_not_store(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, locomo: Path
) -> None:
    state = tmp_path / "state"
    # A run killed between the sample's two sessions: one transaction each, so the first
    # is stored whole (and waits to be indexed) and the second not at all.
    [sample] = read_locomo(locomo)
    first = sample.sessions[0]

    async def store_first() -> None:
        async with am.open_memory(state) as mem:
            await mem.sessions.import_transcript(first.session_key, first.entries)

    trio.run(store_first)
    assert main(["import", str(locomo), "--state-dir", str(state)]) == 0
    assert capsys.readouterr().out == (
        f"imported LoCoMo sample Conv 7/A from {locomo} into agent conv-7-a: 2 sessions, 5 turns"
        " (1 already there)\n"
    )
    assert main(["stats", "--state-dir", str(state), "--json"]) == 0
    [stats] = json.loads(capsys.readouterr().out)
    assert (stats["sessions"], stats["indexed_messages"], stats["dirty_sessions"]) == (2, 5, 0)
