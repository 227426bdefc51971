"""What the recall sub-agent is given (docs/design.md §4.4-§4.7), through `mem.plan_recall`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import activememory as am
from activememory._output import debug_line, hidden_prefix, status_line
from activememory.recall.subagent_input import BASE_PROMPT, STYLE_PROMPTS

pytestmark = pytest.mark.anyio

DM = "agent:main:direct:alice"


def config(am_config: dict[str, Any] | None = None, **top: Any) -> am.Config:
    return am.load_config(
        {"plugins": {"entries": {"active-memory": {"config": am_config or {}}}}, **top}
    )


def m(role: str, text: str) -> am.Message:
    return am.Message(role=role, content=text)  # type: ignore[arg-type]


INJECTED = (
    hidden_prefix("The user likes oolong tea.")
    + "\n"
    + status_line(status="ok", elapsed_ms=12, query_mode="recent", summary_chars=26)
    + "\n"
    + debug_line(summary="The user likes oolong tea.", status="ok")
)
CONVERSATION = [
    m("user", "first   question\nabout trains"),
    m("assistant", "an answer"),
    m("user", "second question"),
    m("tool", "a tool result"),
    m("assistant", f"{INJECTED}\nSure, the 9:40 to Porto."),
    m("user", "  and the   return?  "),
]


async def plan(
    tmp: Path, cfg: am.Config, messages: list[am.Message], key: str = DM
) -> am.RecallPlan:
    async with am.open_memory(tmp / "s", config=cfg) as mem:
        return await mem.plan_recall(am.Turn(session_key=key, messages=messages))


async def test_recent_mode_request_byte_for_byte(tmp_path: Path) -> None:
    got = await plan(tmp_path, config(), CONVERSATION)
    request = got.request
    assert request is not None
    assert request.context == (
        "Recent conversation tail:\n"
        "user: first question about trains\n"
        "user: second question\n"
        "assistant: Sure, the 9:40 to Porto.\n"
        "\n"
        "Latest user message:\n"
        "and the   return?"
    )
    # A tiny follow-up borrows the end of the previous user turn for its search query.
    assert request.search_query == "second question and the return?"
    assert (request.query_mode, request.prompt_style) == ("recent", "balanced")
    assert request.prompt == BASE_PROMPT.rstrip() + "\n\n" + STYLE_PROMPTS["balanced"].rstrip()
    assert request.tools == ("memory_search", "memory_get")
    assert request.transcripts and request.model == "local/extractive"
    assert (request.timeout_ms, request.setup_grace_timeout_ms) == (15000, 0)
    assert (request.thinking, request.fast_mode, request.max_summary_chars) == ("off", None, 220)


async def test_message_and_full_modes_and_their_default_styles(tmp_path: Path) -> None:
    got = await plan(tmp_path, config({"queryMode": "message"}), CONVERSATION)
    assert got.request is not None
    assert got.request.context == "Latest user message:\nand the   return?"
    assert got.request.prompt_style == "strict"
    got = await plan(
        tmp_path / "2", config({"queryMode": "full", "promptStyle": "recall-heavy"}), CONVERSATION
    )
    assert got.request is not None
    assert got.request.context == (
        "Full conversation context:\n"
        "user: first question about trains\n"
        "assistant: an answer\n"
        "user: second question\n"
        "assistant: Sure, the 9:40 to Porto.\n"
        "\n"
        "Latest user message:\n"
        "and the   return?"
    )
    assert got.request.prompt_style == "recall-heavy"  # explicit style wins over the mapping


async def test_prompt_append_override_thinking_fast_mode_are_forwarded(tmp_path: Path) -> None:
    got = await plan(
        tmp_path,
        config(
            {
                "promptOverride": "Return NONE or one short user fact.",
                "promptAppend": "Prefer stable preferences.",
                "thinking": "medium",
                "fastMode": "auto",
                "timeoutMs": 3000,
                "setupGraceTimeoutMs": 30000,
            }
        ),
        CONVERSATION,
    )
    request = got.request
    assert request is not None
    assert request.prompt == "Return NONE or one short user fact.\n\nPrefer stable preferences."
    assert (request.thinking, request.fast_mode) == ("medium", "auto")
    assert (request.timeout_ms, request.setup_grace_timeout_ms) == (3000, 30000)


async def test_tools_allow_keeps_only_memory_tools(tmp_path: Path) -> None:
    cfg = config({"toolsAllow": ["*", "read", "memory_get", "group:memory", "sessions_search"]})
    got = await plan(tmp_path, cfg, CONVERSATION)
    assert got.request is not None
    assert got.request.tools == ("memory_get",)
    assert not got.request.transcripts  # transcript recall needs memory_search


async def test_group_request_never_reads_transcripts(tmp_path: Path) -> None:
    cfg = config({"allowedChatTypes": ["group"]})
    got = await plan(tmp_path, cfg, [m("user", "hi all")], key="agent:main:group:team")
    assert got.request is not None and got.paths == ("advanced",)
    assert not got.request.transcripts


async def test_skipped_plan_says_why(tmp_path: Path) -> None:
    got = await plan(tmp_path, config({"enabled": False}), CONVERSATION)
    assert (got.request, got.status, got.reason) == (
        None,
        "skipped",
        "Active Memory is off globally (config.enabled)",
    )
