"""Message times (docs/design.md §2.2): epoch seconds from 0 to below year 10000, refused
where they come in (append, import); a store written before the check never crashes a read."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import apsw
import pytest
from hypothesis import given
from hypothesis import strategies as st

import activememory as am
from activememory._cli import main
from activememory.protocol.content import MAX_TIMESTAMP, check_timestamp

pytestmark = pytest.mark.anyio

TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
KEY = "agent:main:direct:alice"
RANGE = "epoch seconds from 0 (1970-01-01) to below 253402300800 (year 10000)"
OUT_OF_RANGE = [1e300, float("nan"), float("inf"), float("-inf"), -1.0, 253402300800, 10**20]


@pytest.mark.parametrize("value", OUT_OF_RANGE, ids=repr)
async def test_append_refuses_a_time_out_of_range(tmp_path: Path, value: float) -> None:
    async with am.open_memory(tmp_path / "s", config=TEXT_ONLY) as mem:
        with pytest.raises(am.InvalidInputError) as caught:
            await mem.sessions.append(KEY, am.Message(role="user", content="x", timestamp=value))
        assert str(caught.value) == f"message.timestamp: {value!r} is out of range ({RANGE})"
        with pytest.raises(am.InvalidInputError) as caught:
            await mem.sessions.append(KEY, {"role": "user", "content": "x", "timestamp": value})
        assert str(caught.value) == f"message.timestamp: {value!r} is out of range ({RANGE})"
        with pytest.raises(am.InvalidInputError, match=r"^ImportEntry\.timestamp: .* out of range"):
            am.ImportEntry(
                id="1",
                parent_id=None,
                timestamp=value,
                message=am.Message(role="user", content="x"),
            )
        with pytest.raises(am.SessionNotFoundError):  # nothing half-written
            await mem.sessions.history(KEY)


@pytest.mark.parametrize(
    ("timestamp", "shown"),
    [("1e300", "1e+300"), ('"0001-01-01T00:00:00"', "-62135596800.0"), ("-5", "-5.0")],
)
def test_import_refuses_a_time_out_of_range_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], timestamp: str, shown: str
) -> None:
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(
        '{"type": "message", "id": "1", "timestamp": 5, "message": {"role": "user", "content": "a"}}\n'
        f'{{"type": "message", "id": "2", "timestamp": {timestamp},'
        ' "message": {"role": "user", "content": "b"}}\n'
    )
    state = tmp_path / "s"
    assert main(["import", str(transcript), "--state-dir", str(state), "--session-key", KEY]) == 2
    assert capsys.readouterr().err == (
        f"activememory: error: {transcript}:2: timestamp: {shown} is out of range ({RANGE})\n"
    )


def test_reads_of_a_time_stored_before_the_check_never_overflow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "s"
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(
        '{"type": "message", "id": "1", "timestamp": 5, "message": {"role": "user", "content": "bees"}}\n'
    )
    assert main(["import", str(transcript), "--state-dir", str(state), "--session-key", KEY]) == 0
    conn = apsw.Connection(str(state / "agents" / "main" / "memory.db"))
    conn.execute("UPDATE events SET ts = 1e300")  # what an import before the check stored
    conn.close()
    capsys.readouterr()
    assert main(["history", KEY, "--state-dir", str(state)]) == 0
    assert "1e+300" in capsys.readouterr().out
    assert main(["search", "bees", "--state-dir", str(state), "--caller", KEY]) == 0
    assert "1e+300" in capsys.readouterr().out
    assert main(["history", KEY, "--state-dir", str(state), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["timestamp"] == 1e300


@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers()))
def test_every_accepted_time_is_a_date(value: float) -> None:
    try:
        seconds = check_timestamp("t", value)
    except am.InvalidInputError as exc:
        assert str(exc) == f"t: {value!r} is out of range ({RANGE})"
        return
    assert 0 <= seconds < MAX_TIMESTAMP
    assert dt.datetime.fromtimestamp(seconds, dt.UTC).year < 10000
