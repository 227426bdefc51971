"""Messages validate on construction and know exactly which text is indexable."""

from __future__ import annotations

import msgspec
import pytest

import activememory as am


def test_string_content_of_user_and_assistant_is_indexed() -> None:
    assert am.Message(role="user", content="hello").index_text == "hello"
    assert am.Message(role="assistant", content="hi there").index_text == "hi there"


def test_only_text_blocks_are_indexed() -> None:
    message = am.Message(
        role="assistant",
        content=[
            {"type": "thinking", "thinking": "private reasoning"},
            {"type": "reasoning", "text": "more reasoning"},
            {"type": "text", "text": "first"},
            {"type": "tool_use", "id": "t1", "name": "memory_search", "input": {"q": "x"}},
            {"type": "input_text", "text": "second"},
            {"type": "image", "url": "https://example.invalid/cat.png", "description": "a cat"},
            {"type": "output_text", "text": "third"},
        ],
    )
    assert message.index_text == "first\nsecond\nthird"
    assert isinstance(message.content, list)
    assert isinstance(message.content[0], am.ThinkingBlock)


def test_tool_messages_and_blank_text_are_not_indexed() -> None:
    tool = am.Message(
        role="tool", content=[{"type": "tool_result", "tool_use_id": "t1", "content": "42"}]
    )
    assert tool.index_text is None
    assert am.Message(role="user", content="   ").index_text is None
    assert am.Message(role="user", content=[{"type": "image", "url": "u"}]).index_text is None


def test_block_structs_and_mappings_are_equivalent() -> None:
    as_dicts = am.Message(role="user", content=[{"type": "text", "text": "x"}])
    as_structs = am.Message(role="user", content=[am.TextBlock(text="x")])
    assert as_dicts == as_structs


def test_messages_round_trip_through_json() -> None:
    message = am.Message(
        role="assistant",
        content=[
            {"type": "text", "text": "ok"},
            {"type": "tool_use", "id": "1", "name": "n", "input": {"a": [1]}},
        ],
        timestamp=12.5,
    )
    assert msgspec.json.decode(msgspec.json.encode(message), type=am.Message) == message


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        (
            {"role": "bot", "content": "x"},
            "Message.role: 'bot' is not one of 'user', 'assistant', 'tool'",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "text", "text": "ok"}, {"type": "video", "url": "v"}],
            },
            "Message.content[1].type: 'video' is not a known block type (allowed: text, input_text, "
            "output_text, thinking, reasoning, image, tool_use, tool_result)",
        ),
        (
            {"role": "user", "content": [{"text": "no type"}]},
            "Message.content[0]: block has no `type` (allowed: text, input_text, output_text, "
            "thinking, reasoning, image, tool_use, tool_result)",
        ),
        (
            {"role": "user", "content": [{"type": "text", "text": 5}]},
            "Message.content[0].text: Expected `str`, got `int`",
        ),
        (
            {"role": "user", "content": [{"type": "text", "text": "x", "color": "red"}]},
            "Message.content[0]: Object contains unknown field `color`",
        ),
        (
            {"role": "user", "content": 5},
            "Message.content: expected a string or a list of blocks, got int",
        ),
        (
            {"role": "user", "content": "ok \ud83d then"},
            "Message.content: lone surrogate '\\ud83d' at index 3 (text must be valid Unicode)",
        ),
        (
            {
                "role": "user",
                "content": [{"type": "text", "text": "fine"}, {"type": "text", "text": "\udc00"}],
            },
            "Message.content[1].text: lone surrogate '\\udc00' at index 0 (text must be valid Unicode)",
        ),
        (
            {"role": "user", "content": "x" * (am.MAX_CONTENT_BYTES + 1)},
            f"Message.content: {am.MAX_CONTENT_BYTES + 1} bytes is over the limit of "
            f"{am.MAX_CONTENT_BYTES} bytes",
        ),
    ],
)
def test_bad_messages_name_the_field(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(am.InvalidInputError) as info:
        am.Message(**kwargs)  # type: ignore[arg-type]
    assert str(info.value) == error


def test_content_at_the_limit_is_accepted() -> None:
    # The limit counts the content, not its JSON encoding: no quotes, no escapes.
    am.Message(role="user", content="x" * am.MAX_CONTENT_BYTES)
    am.Message(role="user", content='"' * am.MAX_CONTENT_BYTES)
    am.Message(role="user", content="é" * (am.MAX_CONTENT_BYTES // 2))  # two UTF-8 bytes each


def test_content_limit_counts_utf8_bytes() -> None:
    with pytest.raises(am.InvalidInputError) as info:
        am.Message(role="user", content="é" * (am.MAX_CONTENT_BYTES // 2) + "x")
    assert str(info.value) == (
        f"Message.content: {am.MAX_CONTENT_BYTES + 1} bytes is over the limit of "
        f"{am.MAX_CONTENT_BYTES} bytes"
    )
