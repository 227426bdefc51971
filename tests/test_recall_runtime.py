"""The recall runtime end to end (docs/design.md §4.7-§4.11): grounding, tools, transcripts, logs,
the OpenAI-compatible client against a real loopback server, memory notes, preflight."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest
import trio
import trio.testing
from chat_server import Answer, Call, serve

import activememory as am
from activememory.recall import coordinator
from activememory.recall.coordinator import Recaller
from activememory.storage.run_transcripts import SubAgentTranscript

pytestmark = pytest.mark.anyio

DM = "agent:main:direct:alice"
SOURCE = "agent:main:dm:alice"  # alice's other chat: recall reads only her own identity's
FACT = "I drink oolong tea every morning."
QUESTION = "what tea do I drink in the morning?"


def turn(text: str = QUESTION, key: str = DM) -> am.Turn:
    return am.Turn(session_key=key, messages=[am.Message(role="user", content=text)])


def config(**settings: Any) -> dict[str, Any]:
    return {"plugins": {"entries": {"active-memory": {"config": settings}}}}


class Fluent:
    """Answers confidently; `search` says whether it looks anything up first."""

    def __init__(self, *, search: str | None = None, tool: str = "memory_search") -> None:
        self.search = search
        self.tool = tool

    async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
        if self.search is not None:
            await tools.call(self.tool, {"query": self.search})
        return "The user is a huge jazz fan and plays the saxophone."


async def recall_with(tmp_path: Path, model: Any, **kwargs: Any) -> am.RecallOutcome:
    settings = {"model": "test/model", **kwargs.pop("settings", {})}
    async with am.open_memory(
        tmp_path / "s", config=config(**settings), models={"test/model": model}, **kwargs
    ) as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        return await mem.recall(turn())


@pytest.mark.parametrize(
    "model",
    [Fluent(), Fluent(search="saxophone jazz"), Fluent(search="zzqx unknownword")],
    ids=["no-tool-call", "search-without-hits", "search-no-match"],
)
async def test_fluent_answer_without_grounded_hit_is_never_injected(
    tmp_path: Path, model: Fluent
) -> None:
    out = await recall_with(tmp_path, model)
    assert out.status == "no_relevant_memory"
    assert out.prompt_prefix is None and out.summary is None
    assert out.reason == "answer discarded: no memory tool returned evidence"


async def test_grounded_answer_is_injected(tmp_path: Path) -> None:
    out = await recall_with(tmp_path, Fluent(search="oolong tea"))
    assert out.status == "ok" and out.prompt_prefix is not None
    assert "hits=1" in out.debug_line and "backend=builtin" in out.debug_line


@pytest.mark.parametrize(
    ("returned", "status"),
    [
        ({"results": []}, "no_relevant_memory"),
        ({"error": "backend down"}, "no_relevant_memory"),
        ({"status": "empty"}, "no_relevant_memory"),
        ("", "no_relevant_memory"),
        ({"results": [{"text": "jazz fan"}]}, "ok"),
        ("the user mentioned jazz once", "ok"),
    ],
)
async def test_host_tool_evidence_rule(tmp_path: Path, returned: object, status: str) -> None:
    async def lcm_grep(args: Any) -> object:
        return returned

    out = await recall_with(
        tmp_path,
        Fluent(search="jazz", tool="lcm_grep"),
        tools={"lcm_grep": lcm_grep},
        settings={"toolsAllow": ["lcm_grep"]},
    )
    assert out.status == status


async def test_a_raising_model_fails_open(tmp_path: Path) -> None:
    class Broken:
        async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
            raise ValueError("bad weights")

    out = await recall_with(tmp_path, Broken())
    assert (out.status, out.reason, out.prompt_prefix) == (
        "failed",
        "ValueError: bad weights",
        None,
    )


async def test_transcript_is_temporary_by_default(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s", config=config()) as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        out = await mem.recall(turn())
        temp = mem._transcripts.temp_dir()
        assert out.status == "ok"
        assert list(temp.iterdir()) == []  # written during the run, deleted at its end
        assert not (tmp_path / "s" / "agents" / "main" / "sessions").exists()
    assert not temp.exists()


async def test_a_temporary_transcript_is_written_lazily(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing reads a temporary transcript: its lines stay in memory, no file is made on the
    recall path; `spill` writes what it holds so far and the rest follows; the end deletes."""
    opened: list[SubAgentTranscript] = []

    class Recorded(SubAgentTranscript):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(coordinator, "SubAgentTranscript", Recorded)
    during: list[Any] = []

    class Spills:
        async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
            (transcript,) = opened
            during.append([json.loads(line)["type"] for line in transcript.lines])
            await tools.call("memory_search", {"query": "oolong tea"})
            during.append(transcript.lines[-1:])  # the search's result, in memory
            during.append(list(temp.iterdir()))  # no file yet
            path = transcript.spill("run.jsonl")
            assert path is not None
            await tools.call("memory_search", {"query": "morning"})
            during.append([json.loads(line)["type"] for line in path.read_text().splitlines()])
            return "The user drinks oolong tea every morning."

    async with am.open_memory(
        tmp_path / "s", config=config(model="test/spill"), models={"test/spill": Spills()}
    ) as mem:
        temp = mem._transcripts.temp_dir()
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        out = await mem.recall(turn())
        assert out.status == "ok"
        assert list(temp.iterdir()) == []  # spilled, then deleted at the run's end
    prompt, last, files, spilled = during
    assert prompt == ["prompt"] and len(last) == 1 and files == []
    assert spilled == ["prompt", "tool_call", "tool_result", "tool_call", "tool_result"]
    assert opened[0].lines == [] and opened[0].spill("again.jsonl") is None  # ended


async def test_persisted_transcript_is_private_and_complete(tmp_path: Path) -> None:
    settings = {"persistTranscripts": True, "transcriptDir": "am-runs"}
    async with am.open_memory(tmp_path / "s", config=config(**settings)) as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        assert (await mem.recall(turn())).status == "ok"
    folder = tmp_path / "s" / "agents" / "main" / "sessions" / "am-runs"
    (path,) = folder.iterdir()
    assert path.name == "recall-000001.jsonl"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["type"] for line in lines] == [
        "prompt",
        "tool_call",
        "tool_result",
        "draft",
        "end",
    ]
    assert lines[0]["search_query"] == QUESTION.rstrip("?") or lines[0]["search_query"]
    assert lines[2]["evidence"] is True and "oolong" in lines[2]["content"]
    assert lines[-1]["report"]["evidence"] is True


async def test_transcript_dir_symlinked_outside_is_never_written(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    sessions = tmp_path / "s" / "agents" / "main" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "escape").symlink_to(outside)
    settings = {"persistTranscripts": True, "transcriptDir": "escape"}
    async with am.open_memory(tmp_path / "s", config=config(**settings)) as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        out = await mem.recall(turn())
    assert out.status == "ok"
    assert list(outside.iterdir()) == []
    assert "transcriptDir leaves the sessions folder" in out.debug_line


async def test_logs_are_single_line_redacted_and_name_the_timeout(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Slow:
        async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
            await tools.call("memory_search", {"query": "oolong"})
            await anyio.sleep(5)
            return "late"

    secret_key = "agent:main:direct:sk-abcdefghijklmnopqrstuvwxyz123456"
    caplog.set_level(logging.INFO, logger="activememory.recall")
    settings = {"model": "test/slow", "logging": True, "timeoutMs": 250}
    async with am.open_memory(
        tmp_path / "s", config=config(**settings), models={"test/slow": Slow()}
    ) as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
        out = await mem.recall(turn(key=secret_key))
    assert out.status == "timeout"
    messages = [r.getMessage() for r in caplog.records if r.name == "activememory.recall"]
    assert [m.split(" ")[1] for m in messages] == ["start", "timeout", "done"]
    assert messages[1].startswith("active-memory: timeout after 250ms")
    for message in messages:
        assert "\n" not in message and len(message) <= 500
        assert "abcdefghijklmnopqrstuvwxyz" not in message  # the secret is redacted


async def test_no_logs_unless_enabled(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="activememory.recall")
    async with am.open_memory(tmp_path / "s") as mem:
        await mem.recall(turn())
    assert not [r for r in caplog.records if r.name == "activememory.recall"]


async def test_openai_compatible_model_end_to_end(tmp_path: Path) -> None:
    script = [
        Answer(tool_calls=[Call("c1", "memory_search", '{"query": "oolong tea morning"}')]),
        Answer(content="The user drinks oolong tea every morning."),
    ]
    with anyio.fail_after(20), serve(script) as server:
        cfg = {
            **config(model="local-llm/recall-1", thinking="low", fastMode=True),
            "models": {
                "providers": {
                    "local-llm": {
                        "baseUrl": server.base_url,
                        "apiKey": "${AM_TEST_KEY}",
                        "api": "openai-completions",
                        "models": [{"id": "recall-1"}],
                    }
                }
            },
        }
        os.environ["AM_TEST_KEY"] = "test-key-123"
        try:
            loaded = am.load_config(cfg)
        finally:
            del os.environ["AM_TEST_KEY"]
        async with am.open_memory(tmp_path / "s", config=loaded) as mem:
            await mem.sessions.append(SOURCE, am.Message(role="user", content=FACT))
            out = await mem.recall(turn())
    assert (out.status, out.model) == ("ok", "local-llm/recall-1")
    assert out.summary == "The user drinks oolong tea every morning."
    first, second = server.bodies
    assert first["model"] == "recall-1"
    assert first["reasoning_effort"] == "low" and first["service_tier"] == "priority"
    assert [t["function"]["name"] for t in first["tools"]] == ["memory_search", "memory_get"]
    tool_message = second["messages"][-1]
    assert tool_message["role"] == "tool" and "oolong" in tool_message["content"]
    assert server.requests[0].headers["authorization"] == "Bearer test-key-123"


async def test_memory_notes_are_recalled_in_private_and_group_chats(tmp_path: Path) -> None:
    workspace = tmp_path / "s" / "agents" / "main" / "workspace"
    (workspace / "memory").mkdir(parents=True)
    (workspace / "MEMORY.md").write_text("# About the user\n\nMy dog is called Pixel.\n")
    (workspace / "memory" / "food.md").write_text("I am allergic to peanuts.\n")
    cfg = config(allowedChatTypes=["direct", "group"])
    async with am.open_memory(tmp_path / "s", config=cfg) as mem:
        await mem.sessions.append(SOURCE, am.Message(role="user", content="My dog hates rain"))
        dm = await mem.recall(turn("what is my dog called?"))
        group = await mem.recall(turn("what is my dog called?", key="agent:main:group:park"))
    assert dm.status == "ok" and "Pixel" in (dm.summary or "")
    assert group.status == "ok" and "Pixel" in (group.summary or "")
    assert "rain" not in (group.summary or "") + group.debug_line  # notes only, never transcripts


def test_preflight_is_bounded_and_never_eats_recall_time(tmp_path: Path) -> None:
    original = Recaller._session_state

    async def slow_session_state(self: Recaller, key: Any) -> Any:
        await trio.sleep(10)
        return await original(self, key)

    async def main() -> am.RecallOutcome:
        async with am.open_memory(tmp_path / "s", executor="inline") as mem:
            start = trio.current_time()
            Recaller._session_state = slow_session_state  # type: ignore[method-assign]
            try:
                out = await mem.recall(turn())
            finally:
                Recaller._session_state = original  # type: ignore[method-assign]
            assert trio.current_time() - start == 1.5
            return out

    out = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert (out.status, out.reason) == ("skipped", "preflight over 1500 ms")


@pytest.mark.parametrize("path", ["pool-full", "never-queued"])
def test_a_run_that_never_starts_leaves_no_transcript(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    opened: list[SubAgentTranscript] = []

    class Recorded(SubAgentTranscript):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            opened.append(self)

    monkeypatch.setattr(coordinator, "SubAgentTranscript", Recorded)

    async def main() -> am.RecallOutcome:
        async with am.open_memory(tmp_path / "s", executor="inline") as mem:
            pool = mem._supervisor.recall_pool
            if path == "pool-full":
                pool.limiter.total_tokens = 1
                await pool.limiter.acquire_on_behalf_of(pool)  # every slot taken
            else:
                mem._supervisor.recall_inbox.close()  # nothing can be queued
            out = await mem.recall(turn())
            temp = mem._transcripts.temp_dir()
            assert list(temp.iterdir()) == []  # deleted when `recall` returns, not at exit
            assert [t._file for t in opened] == [None]  # and its file closed
            if path == "pool-full":
                pool.limiter.release_on_behalf_of(pool)
            return out

    out = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    if path == "pool-full":  # queued, never started: the budget (15 s) ran out waiting
        assert (out.status, out.elapsed_ms) == ("timeout", 15000.0)
    else:  # nothing could be queued: said at once, not after the budget
        assert (out.status, out.elapsed_ms) == ("failed", 0.0)
        assert out.reason == "the recall pool is closed: the memory is shutting down"
