"""The built-in tools' arguments: one Struct each, its schema sent to the model, its errors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import anyio
import msgspec
import pytest
from chat_server import Answer, serve
from hypothesis import given, settings
from hypothesis import strategies as st

from activememory.protocol.errors import InvalidInputError
from activememory.protocol.recall import RecallRequest, ToolResult
from activememory.protocol.tools import (
    TOOL_ARGUMENTS,
    MemoryGetArgs,
    MemoryRecallArgs,
    MemorySearchArgs,
)
from activememory.recall.openai_model import OpenAICompatibleModel
from activememory.recall.tools import RecallTools, tool_arguments

NOT_BLANK = r"^[\s\S]*\S[\s\S]*$"
QUERY = {
    "description": "What to look for",
    "type": "string",
    "maxLength": 4096,
    "minLength": 1,
    "pattern": NOT_BLANK,
}
MAX_RESULTS = {
    "description": "How many results at most",
    "type": "integer",
    "minimum": 1,
    "maximum": 25,
    "default": 6,
}


def function(name: str, description: str, properties: dict[str, Any], required: str) -> Any:
    parameters = {
        "type": "object",
        "properties": properties,
        "required": [required],
        "additionalProperties": False,
    }
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


# What a model is told about each built-in tool, written out once more to pin it.
EXPECTED = [
    function(
        "memory_search",
        "Search the user's memory notes and, when allowed, the agent's other private "
        "conversations. Returns the best matching excerpts.",
        {"query": QUERY, "maxResults": MAX_RESULTS},
        "query",
    ),
    function(
        "memory_get",
        "Read lines of a memory note, or one message of a conversation, by the path a "
        "memory_search result gave.",
        {
            "path": {"description": "The path of a memory_search result", "type": "string"},
            "from": {
                "description": "The first line (1-based)",
                "type": "integer",
                "minimum": 1,
                "default": 1,
            },
            "lines": {
                "description": "How many lines at most",
                "type": "integer",
                "minimum": 1,
                "maximum": 200,
                "default": 40,
            },
        },
        "path",
    ),
    function(
        "memory_recall",
        "Search the scoped memory records of the user (this conversation's first). Returns "
        "the best matching records with their linked context, as XML.",
        {"query": QUERY, "maxResults": MAX_RESULTS},
        "query",
    ),
]


REQUEST = RecallRequest(
    session_key="agent:main:main",
    agent="main",
    model="test/chat-model",
    prompt="Recall.",
    prompt_style="balanced",
    query_mode="recent",
    context="Latest user message:\nhi",
    latest="hi",
    search_query="hi",
    tools=tuple(TOOL_ARGUMENTS),
    transcripts=False,
    timeout_ms=15000,
    max_summary_chars=220,
)


async def echo(args: Mapping[str, Any]) -> ToolResult:
    return ToolResult(name="echo", content=json.dumps(dict(args)), evidence=True)


def built_in_tools() -> RecallTools:
    return RecallTools(dict.fromkeys(TOOL_ARGUMENTS, echo))


def refs(node: object) -> list[str]:
    if isinstance(node, dict):
        return [key for key in node if key.startswith("$")] + [
            ref for value in node.values() for ref in refs(value)
        ]
    return [ref for item in node for ref in refs(item)] if isinstance(node, list) else []


@pytest.mark.anyio
async def test_the_openai_client_sends_each_struct_s_schema_inlined() -> None:
    tools = built_in_tools()
    assert tools.schemas() == EXPECTED
    with anyio.fail_after(10), serve([Answer(content="NONE")]) as server:
        async with OpenAICompatibleModel(REQUEST.model, base_url=server.base_url) as model:
            await model.recall(REQUEST, tools)
    (request,) = server.requests
    assert request.body["tools"] == EXPECTED
    assert refs(request.body["tools"]) == []  # no $ref, no $defs


@pytest.mark.parametrize("shape", [MemorySearchArgs, MemoryGetArgs, MemoryRecallArgs])
def test_each_schema_is_the_struct_s_own(shape: type[msgspec.Struct]) -> None:
    (name,) = [name for name, args in TOOL_ARGUMENTS.items() if args is shape]
    (sent,) = [s["function"] for s in built_in_tools().schemas() if s["function"]["name"] == name]
    own = msgspec.json.schema(shape)["$defs"][shape.__name__]
    assert sent["parameters"] == {k: v for k, v in own.items() if k not in ("title", "description")}
    assert sent["description"] == " ".join(own["description"].split())


@pytest.mark.parametrize(
    ("shape", "args", "message"),
    [
        (MemorySearchArgs, {}, 'missing required key "query"'),
        (MemorySearchArgs, {"query": " \n"}, r'query: " \n" is blank'),
        (MemorySearchArgs, {"query": "x", "maxResults": 0}, "maxResults: 0 is below the minimum 1"),
        (
            MemorySearchArgs,
            {"query": "x", "max_results": 3},
            'max_results: unknown key; did you mean "maxResults"?',
        ),
        (
            MemoryRecallArgs,
            {"query": "x", "maxResults": 2.0, "limit": 2},
            "maxResults: expected an integer, got 2.0\n"
            "limit: unknown key; expected one of query, maxResults",
        ),
        (MemoryGetArgs, [], "arguments: expected an object, got list"),
        # A key JSON can spell ("\ud800") but UTF-8 cannot: still a named problem.
        (
            MemorySearchArgs,
            {"query": "x", "a\ud800": 1},
            "a\ud800: unknown key; expected one of query, maxResults",
        ),
        # Strings are the model's, never expanded: no `${ENV}` as in a config file.
        (
            MemoryGetArgs,
            {"path": "${HOME}", "lines": 0},
            "lines: 0 is below the minimum 1",
        ),
    ],
)
def test_bad_arguments_name_the_field_and_what_is_allowed(
    shape: type[msgspec.Struct], args: Any, message: str
) -> None:
    with pytest.raises(InvalidInputError) as caught:
        tool_arguments(shape, args)
    assert str(caught.value) == message


def test_arguments_convert_to_the_struct_with_defaults() -> None:
    assert tool_arguments(MemorySearchArgs, {"query": "cat"}) == MemorySearchArgs(
        query="cat", max_results=6
    )
    assert tool_arguments(MemoryGetArgs, {"path": "${HOME}", "from": 3}) == MemoryGetArgs(
        path="${HOME}", from_=3, lines=40
    )


@pytest.mark.anyio
async def test_a_bad_argument_is_a_failed_tool_result_not_an_exception() -> None:
    async def search(args: Mapping[str, Any]) -> ToolResult:
        tool_arguments(MemorySearchArgs, args)
        raise AssertionError("not reached")

    tools = RecallTools({"memory_search": search})
    with anyio.fail_after(5):
        result = await tools.call("memory_search", {"query": "x", "maxResults": 26})
    assert (result.error, result.evidence) == ("maxResults: 26 is above the maximum 25", False)
    assert json.loads(result.content) == {"error": "maxResults: 26 is above the maximum 25"}


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
# Keys without control characters: a problem names its key as it is, one problem a line.
KEYS = st.text(st.characters(blacklist_categories=("Cc", "Zl", "Zp")), max_size=12)
NAMES = st.sampled_from(["query", "maxResults", "path", "from", "lines", ""]) | KEYS
VALUES = (
    st.integers(-3, 260)
    | st.sampled_from(["", " ", "\t\n", "x", "memory/a.md", "x" * 4096, "x" * 4097])
    | JSON
)


@settings(max_examples=300, deadline=None)
@given(
    shape=st.sampled_from([MemorySearchArgs, MemoryGetArgs, MemoryRecallArgs]),
    args=st.dictionaries(NAMES, VALUES, max_size=4),
)
def test_any_arguments_convert_or_fail_naming_a_field(
    shape: type[msgspec.Struct], args: dict[str, Any]
) -> None:
    fields = [field.encode_name for field in msgspec.structs.fields(shape)]
    named = {f"{name}: " for name in [*fields, *args] if name}
    named |= {f'missing required key "{field}"' for field in fields}
    named.add(f"unknown key; expected one of {', '.join(fields)}")  # the key "" has no name
    try:
        parsed = tool_arguments(shape, args)
    except InvalidInputError as exc:
        for problem in str(exc).split("\n"):  # values are shown JSON-escaped
            assert any(problem.startswith(start) for start in named), problem
        return
    assert set(args) <= set(fields)
    if isinstance(parsed, MemorySearchArgs | MemoryRecallArgs):
        assert parsed.query.strip() and len(parsed.query) <= 4096
        assert 1 <= parsed.max_results <= 25
    else:
        assert isinstance(parsed, MemoryGetArgs)
        assert isinstance(parsed.path, str) and parsed.from_ >= 1 and 1 <= parsed.lines <= 200
