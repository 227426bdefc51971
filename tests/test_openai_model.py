"""The OpenAI-compatible recall model against a real chat-completions server on loopback."""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Mapping
from typing import Any

import anyio
import httpx
import pytest
from chat_server import Answer, Call, Hang, Malformed, Status, Step, serve

from activememory.protocol.config import Provider
from activememory.protocol.recall import RecallRequest, ToolResult
from activememory.recall.openai_model import (
    OpenAICompatibleModel,
    RecallModelError,
    model_from_config,
)
from activememory.recall.tools import RecallTools

pytestmark = pytest.mark.anyio

REF = "test/chat-model"
PROMPT = "You recall memories. Answer NONE when nothing is relevant."
CONTEXT = "Latest user message:\nwhat's my cat called?"
QUERY = "cat name"
HIT = {"results": [{"path": "memory/pets.md", "text": "The cat is called Miso."}], "hits": 1}


def make_request(deadline: float = math.inf, **changes: Any) -> RecallRequest:
    fields: dict[str, Any] = {
        "session_key": "agent:main:main",
        "agent": "main",
        "model": REF,
        "prompt": PROMPT,
        "prompt_style": "balanced",
        "query_mode": "recent",
        "context": CONTEXT,
        "latest": "what's my cat called?",
        "search_query": QUERY,
        "tools": ("memory_search",),
        "transcripts": False,
        "timeout_ms": 15000,
        "max_summary_chars": 220,
        "deadline": deadline,
    }
    fields.update(changes)
    return RecallRequest(**fields)


class Tools:
    """A `RecallTools` with a memory_search handler that records what it was asked."""

    def __init__(self) -> None:
        self.asked: list[dict[str, Any]] = []
        self.tools = RecallTools({"memory_search": self.search})

    async def search(self, args: Mapping[str, Any]) -> ToolResult:
        self.asked.append(dict(args))
        return ToolResult(
            name="memory_search", content=json.dumps(HIT), data=dict(HIT), evidence=True
        )


@pytest.fixture
def tools() -> Tools:
    return Tools()


def first_messages() -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": PROMPT},
        {"role": "user", "content": CONTEXT + "\n\nSearch query: " + QUERY},
    ]


def schemas() -> list[dict[str, Any]]:
    return RecallTools({"memory_search": Tools().search}).schemas()


def assistant_calls(content: str | None, *calls: Call) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in calls
        ],
    }


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def test_a_plain_answer_is_returned(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Answer(content="The user's cat is Miso.")]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url + "/") as model:
            answer = await model.recall(make_request(), tools.tools)
    assert answer == "The user's cat is Miso."
    assert server.bodies == [
        {
            "model": "chat-model",
            "messages": first_messages(),
            "tools": schemas(),
            "tool_choice": "auto",
        }
    ]
    assert server.requests[0].path == "/v1/chat/completions"
    assert "authorization" not in server.requests[0].headers
    assert tools.asked == []


async def test_the_api_key_is_sent_as_a_bearer_token(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Answer(content="NONE")]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url, api_key="sk-1") as model:
            assert await model.recall(make_request(), tools.tools) == "NONE"
    assert server.requests[0].headers["authorization"] == "Bearer sk-1"


async def test_no_tools_sends_no_tools_field() -> None:
    with anyio.fail_after(10), serve([Answer(content="NONE")]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            assert await model.recall(make_request(tools=()), RecallTools({})) == "NONE"
    assert server.bodies == [{"model": "chat-model", "messages": first_messages()}]


async def test_two_tool_rounds_then_an_answer(tools: Tools) -> None:
    first = Call("call_1", "memory_search", '{"query": "cat name"}')
    second = Call("call_2", "memory_search", '{"query": "pet", "maxResults": 3}')
    script = [
        Answer(content="Looking it up.", tool_calls=[first]),
        Answer(tool_calls=[second]),
        Answer(content="The user's cat is called Miso."),
    ]
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            answer = await model.recall(make_request(), tools.tools)
    assert answer == "The user's cat is called Miso."
    assert tools.asked == [{"query": "cat name"}, {"query": "pet", "maxResults": 3}]
    assert tools.tools.evidence
    assert tools.tools.draft_text == "Looking it up."
    hit = json.dumps(HIT)
    round_1 = [
        *first_messages(),
        assistant_calls("Looking it up.", first),
        {"role": "tool", "tool_call_id": "call_1", "content": hit},
    ]
    round_2 = [
        *round_1,
        assistant_calls(None, second),
        {"role": "tool", "tool_call_id": "call_2", "content": hit},
    ]
    base = {"model": "chat-model", "tools": schemas(), "tool_choice": "auto"}
    assert server.bodies == [
        {**base, "messages": first_messages()},
        {**base, "messages": round_1},
        {**base, "messages": round_2},
    ]
    assert len({r.peer for r in server.requests}) == 1  # one connection, reused


async def test_several_calls_in_one_round_each_get_a_tool_message(tools: Tools) -> None:
    calls = [
        Call("a", "memory_search", '{"query": "cat"}'),
        Call("b", "memory_get", '{"path": "memory/pets.md"}'),  # not allowed in this run
    ]
    script = [Answer(tool_calls=calls), Answer(content="Miso.")]
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            assert await model.recall(make_request(), tools.tools) == "Miso."
    replies = server.bodies[1]["messages"][3:]
    assert [r["tool_call_id"] for r in replies] == ["a", "b"]
    assert replies[0]["content"] == json.dumps(HIT)
    assert json.loads(replies[1]["content"]) == {
        "error": "memory_get is not an allowed memory tool (allowed: memory_search)"
    }


@pytest.mark.parametrize(
    ("thinking", "fast_mode", "expected"),
    [
        ("off", None, {}),
        ("minimal", True, {"reasoning_effort": "minimal", "service_tier": "priority"}),
        ("low", False, {"reasoning_effort": "low", "service_tier": "default"}),
        ("medium", "auto", {"reasoning_effort": "medium", "service_tier": "auto"}),
        ("high", None, {"reasoning_effort": "high"}),
        ("xhigh", None, {"reasoning_effort": "high"}),
        ("max", None, {"reasoning_effort": "high"}),
        ("adaptive", None, {"reasoning_effort": "medium"}),
        ("off", True, {"service_tier": "priority"}),
    ],
)
async def test_thinking_and_fast_mode_are_forwarded(
    tools: Tools, thinking: str, fast_mode: bool | str | None, expected: dict[str, str]
) -> None:
    request = make_request(thinking=thinking, fast_mode=fast_mode)
    with anyio.fail_after(10), serve([Answer(content="NONE")]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            await model.recall(request, tools.tools)
    body = server.bodies[0]
    assert {k: body[k] for k in ("reasoning_effort", "service_tier") if k in body} == expected


@pytest.mark.parametrize("arguments", ["{not json", "[1, 2]", '"query"', ""])
async def test_malformed_tool_arguments_are_answered_without_calling_the_tool(
    tools: Tools, arguments: str
) -> None:
    script = [Answer(tool_calls=[Call("c1", "memory_search", arguments)]), Answer(content="NONE")]
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            assert await model.recall(make_request(), tools.tools) == "NONE"
    assert tools.asked == []
    assert tools.tools.results == []
    assert server.bodies[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "c1",
        "content": '{"error": "arguments are not a JSON object"}',
    }


async def test_max_rounds_exhausted_returns_the_last_draft(tools: Tools) -> None:
    script = [
        Answer(content="Maybe Miso.", tool_calls=[Call("c1", "memory_search", '{"query": "a"}')]),
        Answer(
            content="Miso, I think.", tool_calls=[Call("c2", "memory_search", '{"query": "b"}')]
        ),
        Answer(tool_calls=[Call("c3", "memory_search", '{"query": "c"}')]),
    ]
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url, max_rounds=2) as model:
            answer = await model.recall(make_request(), tools.tools)
    assert answer == "Miso, I think."
    assert len(server.requests) == 3  # max_rounds tool rounds, then one last ask
    assert tools.asked == [{"query": "a"}, {"query": "b"}]  # the third call is never run


async def test_max_rounds_exhausted_without_a_draft_returns_empty(tools: Tools) -> None:
    script = [Answer(tool_calls=[Call("c1", "memory_search", '{"query": "a"}')])] * 2
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url, max_rounds=1) as model:
            assert await model.recall(make_request(), tools.tools) == ""
    assert len(server.requests) == 2


async def test_missing_content_is_an_empty_answer(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Answer(content=None)]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            assert await model.recall(make_request(), tools.tools) == ""


async def test_a_slow_answer_within_the_deadline_succeeds(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Answer(content="Miso.", delay=0.2)]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            request = make_request(deadline=anyio.current_time() + 2)
            assert await model.recall(request, tools.tools) == "Miso."


@pytest.mark.parametrize("step", [Answer(content="too late", delay=3), Hang()])
async def test_past_the_deadline_fails_promptly(tools: Tools, step: Answer | Hang) -> None:
    with anyio.fail_after(10), serve([step]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            deadline = anyio.current_time() + 0.3
            started = time.monotonic()
            with pytest.raises(RecallModelError) as caught:
                await model.recall(make_request(deadline=deadline), tools.tools)
            late = anyio.current_time() - deadline
            assert str(caught.value) == f"{REF}: no answer within the budget"
    # Promptly: well before the 3 s answer (or never, for the hang). The slack is wide
    # because a loaded 2-core machine delays the wake-up itself, not the deadline.
    assert -0.005 <= late < 0.5
    assert time.monotonic() - started < 0.3 + 0.5  # real time, not only the loop's clock
    assert len(server.requests) == 1


async def test_a_deadline_already_past_fails_at_once(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Answer(content="Miso.")]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            with pytest.raises(RecallModelError, match="no answer within the budget$"):
                await model.recall(make_request(deadline=anyio.current_time()), tools.tools)


async def test_a_deadline_during_a_tool_call_fails_promptly() -> None:
    async def stuck(args: Mapping[str, Any]) -> ToolResult:
        await anyio.sleep_forever()
        raise AssertionError

    tools = RecallTools({"memory_search": stuck})
    script = [Answer(tool_calls=[Call("c1", "memory_search", '{"query": "a"}')])]
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            deadline = anyio.current_time() + 0.3
            with pytest.raises(RecallModelError, match="no answer within the budget$"):
                await model.recall(make_request(deadline=deadline), tools)
            assert anyio.current_time() - deadline < 0.05


async def test_a_body_that_is_not_json_fails(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Malformed()]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            with pytest.raises(RecallModelError) as caught:
                await model.recall(make_request(), tools.tools)
    assert str(caught.value).startswith(f"{REF}: the answer is not valid JSON (Expecting value")
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"object": "chat.completion", "choices": []}', "the answer has no choices[0].message"),
        (b'[{"message": {"content": "x"}}]', "the answer has no choices[0].message"),
        (b'{"choices": [{"text": "legacy"}]}', "the answer has no choices[0].message"),
        (
            b'{"error": {"message": "model not loaded"}}',
            "the provider answered an error: {'message': 'model not loaded'}",
        ),
    ],
)
async def test_json_that_is_not_a_chat_completion_fails(
    tools: Tools, body: bytes, message: str
) -> None:
    with anyio.fail_after(10), serve([Malformed(body)]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            with pytest.raises(RecallModelError) as caught:
                await model.recall(make_request(), tools.tools)
    assert str(caught.value) == f"{REF}: {message}"


async def test_429_fails_at_once_without_a_retry(tools: Tools) -> None:
    script: list[Step] = [Status(429, headers={"Retry-After": "1"}), Answer(content="Miso.")]
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            started = time.monotonic()
            with pytest.raises(RecallModelError) as caught:
                await model.recall(make_request(), tools.tools)
            assert time.monotonic() - started < 0.5  # Retry-After is not honoured
    assert str(caught.value) == (
        f"{REF}: the provider answered 429 Too Many Requests: "
        '{"error": {"message": "try again later"}}'
    )
    assert len(server.requests) == 1


async def test_500_fails_at_once_without_a_retry(tools: Tools) -> None:
    script: list[Step] = [
        Status(500, body="upstream exploded\n" + "x" * 300),
        Answer(content="Miso."),
    ]
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            with pytest.raises(RecallModelError) as caught:
                await model.recall(make_request(), tools.tools)
    said = "upstream exploded " + "x" * (200 - len("upstream exploded\n"))
    assert str(caught.value) == f"{REF}: the provider answered 500 Internal Server Error: {said}"
    assert len(server.requests) == 1


async def test_an_error_in_a_later_round_fails_the_call(tools: Tools) -> None:
    script: list[Step] = [
        Answer(tool_calls=[Call("c1", "memory_search", '{"query": "a"}')]),
        Status(503),
    ]
    with anyio.fail_after(10), serve(script) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            with pytest.raises(RecallModelError, match=r": the provider answered 503 "):
                await model.recall(make_request(), tools.tools)
    assert len(server.requests) == 2
    assert tools.tools.evidence  # what the tools returned stays recorded


async def test_connection_refused_fails(tools: Tools) -> None:
    with anyio.fail_after(10):
        base_url = f"http://127.0.0.1:{closed_port()}/v1"
        async with OpenAICompatibleModel(REF, base_url=base_url) as model:
            with pytest.raises(RecallModelError) as caught:
                await model.recall(make_request(), tools.tools)
    assert str(caught.value).startswith(f"{REF}: the request failed (ConnectError: ")


async def test_outside_cancellation_propagates_as_cancellation(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Hang()]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            request = make_request(deadline=anyio.current_time() + 5)
            started = time.monotonic()
            with anyio.move_on_after(0.2) as scope:
                await model.recall(request, tools.tools)
            elapsed = time.monotonic() - started
    assert scope.cancelled_caught
    assert elapsed < 0.2 + 0.1


async def test_outside_cancellation_without_a_deadline(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Hang(), Answer(content="Miso.")]) as server:
        async with OpenAICompatibleModel(REF, base_url=server.base_url) as model:
            with anyio.move_on_after(0.1) as scope:
                await model.recall(make_request(), tools.tools)
            assert scope.cancelled_caught
            # the model object stays usable after a cancelled call
            assert await model.recall(make_request(), tools.tools) == "Miso."


async def test_a_client_passed_in_is_used_and_left_open(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Answer(content="Miso.")]) as server:
        async with httpx.AsyncClient() as client:
            model = OpenAICompatibleModel(REF, base_url=server.base_url, client=client)
            assert await model.recall(make_request(), tools.tools) == "Miso."
            await model.aclose()
            assert not client.is_closed


def test_model_from_config() -> None:
    provider = Provider(base_url="http://127.0.0.1:11434/v1/", api_key="sk-x")
    model = model_from_config("ollama/qwen3:8b", provider)
    assert model.ref == "ollama/qwen3:8b"
    assert model.model_id == "qwen3:8b"
    assert model.url == "http://127.0.0.1:11434/v1/chat/completions"


async def test_model_from_config_speaks_to_the_provider(tools: Tools) -> None:
    with anyio.fail_after(10), serve([Answer(content="Miso.")]) as server:
        provider = Provider(base_url=server.base_url, api_key="sk-y")
        async with model_from_config("local-vllm/org/model-7b", provider) as model:
            assert await model.recall(make_request(), tools.tools) == "Miso."
    assert server.bodies[0]["model"] == "org/model-7b"
    assert server.requests[0].headers["authorization"] == "Bearer sk-y"


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        (
            Provider(base_url="https://api.example/v1", api="anthropic-messages"),
            "x/y: the provider cannot serve recall: its api is 'anthropic-messages', "
            "not 'openai-completions'",
        ),
        (Provider(), "x/y: the provider cannot serve recall: it has no baseUrl"),
    ],
)
def test_model_from_config_refuses_a_provider_that_cannot_serve_recall(
    provider: Provider, message: str
) -> None:
    with pytest.raises(ValueError) as caught:
        model_from_config("x/y", provider)
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("ref", "kwargs", "message"),
    [
        ("no-slash", {}, "model 'no-slash': expected provider/model"),
        ("p/", {}, "model 'p/': expected provider/model"),
        ("p/m", {"base_url": "ftp://x"}, "p/m: base URL 'ftp://x' is not an http(s) URL"),
        ("p/m", {"max_rounds": -1}, "p/m: max_rounds must be an int >= 0, got -1"),
    ],
)
def test_bad_construction_is_a_value_error(ref: str, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        OpenAICompatibleModel(ref, **{"base_url": "http://127.0.0.1/v1", **kwargs})
    assert str(caught.value) == message
