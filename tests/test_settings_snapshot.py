"""A recall runs under the settings it started with (docs/design.md §4.9): a `reload_config`
in the middle of a run changes neither its redaction nor the workspace its tools read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import activememory as am

pytestmark = pytest.mark.anyio

DM = "agent:main:direct:alice"
NOTE = "My dog is called Pixel and my badge is ACME-123456.\n"


def config(**logging: Any) -> dict[str, Any]:
    active = {"model": "test/reloads", "allowedChatTypes": ["direct"]}
    return {"plugins": {"entries": {"active-memory": {"config": active}}}, "logging": logging}


class ReloadsMidRun:
    """Reloads the config (new redaction, another workspace), then uses both note tools."""

    def __init__(self, new_config: dict[str, Any]) -> None:
        self.new_config = new_config
        self.mem: am.Memory | None = None
        self.results: list[am.ToolResult] = []

    async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
        assert self.mem is not None
        self.mem.reload_config(self.new_config)
        self.results.append(await tools.call("memory_search", {"query": "Pixel badge"}))
        self.results.append(await tools.call("memory_get", {"path": "MEMORY.md"}))
        return "The dog is called Pixel."


async def test_a_reload_mid_recall_does_not_reach_its_tools(tmp_path: Path) -> None:
    state = tmp_path / "s"
    old_workspace = state / "agents" / "main" / "workspace"
    old_workspace.mkdir(parents=True)
    (old_workspace / "MEMORY.md").write_text(NOTE)
    (state / "elsewhere").mkdir()
    (state / "elsewhere" / "MEMORY.md").write_text("Nothing about dogs here.\n")
    new_config = config(redactPatterns=["Pixel"])
    new_config["agents"] = {"entries": {"main": {"workspace": "elsewhere"}}}
    model = ReloadsMidRun(new_config)
    async with am.open_memory(
        state, config=config(redactPatterns=[r"ACME-[0-9]{6}"]), models={"test/reloads": model}
    ) as mem:
        model.mem = mem
        turn = am.Turn(session_key=DM, messages=[am.Message(role="user", content="my dog?")])
        out = await mem.recall(turn)
        assert mem.config.workspace("main", state) == state / "elsewhere"  # the reload applied
    search, get = model.results
    assert out.status == "ok"
    # The old workspace and the old patterns: Pixel found and shown, the badge hidden.
    assert search.evidence and "Pixel" in search.content and "123456" not in search.content
    assert "Pixel" in get.content and "123456" not in get.content


class WidensScopeMidRun:
    """Reloads to `singleOwner: true` (every private chat one owner's), then searches."""

    def __init__(self) -> None:
        self.mem: am.Memory | None = None
        self.results: list[am.ToolResult] = []

    async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
        assert self.mem is not None
        widened = config()
        widened["plugins"]["entries"]["active-memory"]["config"]["singleOwner"] = True
        self.mem.reload_config(widened)
        self.results.append(await tools.call("memory_search", {"query": "cat name Whiskers"}))
        return "NONE"


async def test_a_reload_mid_recall_does_not_widen_its_privacy_scope(tmp_path: Path) -> None:
    model = WidensScopeMidRun()
    async with am.open_memory(tmp_path, config=config(), models={"test/reloads": model}) as mem:
        model.mem = mem
        dana = "My bank PIN hint is the name of my cat, Whiskers."
        await mem.sessions.append("agent:main:direct:dana", am.Message(role="user", content=dana))
        ask = am.Message(role="user", content="What is my cat's name?")
        await mem.recall(am.Turn(session_key="agent:main:direct:erin", messages=[ask]))
        (search,) = model.results
        assert "Whiskers" not in search.content  # this run keeps Erin's own scope
        # The next turn runs under the reload: a single owner's chats recall each other.
        model.results.clear()
        await mem.recall(am.Turn(session_key="agent:main:direct:erin", messages=[ask]))
        assert "Whiskers" in model.results[0].content
