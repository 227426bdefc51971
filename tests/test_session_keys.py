"""Session-key parsing follows the docs/design.md §2.1 table; malformed keys get a clear error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

import activememory as am


@pytest.mark.parametrize(
    ("raw", "agent", "chat_type", "conversation_id", "thread_id"),
    [
        ("agent:main:main", "main", "direct", None, None),
        ("agent:main:direct:alice", "main", "direct", "alice", None),
        ("agent:main:dm:telegram:42", "main", "direct", "telegram:42", None),
        ("agent:ops:group:G1", "ops", "group", "G1", None),
        ("agent:ops:group:G1:thread:7", "ops", "group", "G1", "7"),
        ("agent:ops:channel:C9:thread:a:b", "ops", "channel", "C9", "a:b"),
        ("agent:ops:channel:slack:C9:thread:t1", "ops", "channel", "slack:C9", "t1"),
        ("agent:main:explicit:portal-123", "main", "explicit", "portal-123", None),
        # a thread suffix only names a thread inside a group or channel
        ("agent:main:direct:bob:thread:1", "main", "direct", "bob:thread:1", None),
        # well-formed but in no shape of the table: unknown
        ("agent:main:cron:nightly", "main", "unknown", None, None),
        ("agent:main", "main", "unknown", None, None),
        ("agent:main:Group:x", "main", "unknown", None, None),
        ("legacy-session-17", None, "unknown", None, None),
        ("telegram:12345", None, "unknown", None, None),
    ],
)
def test_parses_every_shape_of_the_table(
    raw: str, agent: str | None, chat_type: str, conversation_id: str | None, thread_id: str | None
) -> None:
    key = am.parse_session_key(raw)
    assert (key.raw, key.agent, key.chat_type, key.conversation_id, key.thread_id) == (
        raw,
        agent,
        chat_type,
        conversation_id,
        thread_id,
    )


def test_keys_without_an_agent_are_stored_with_the_default_agent() -> None:
    assert am.parse_session_key("legacy-1").store_agent == "main"
    assert am.parse_session_key("agent:ops:main").store_agent == "ops"


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("", "session_key: '' is empty"),
        ("   ", "session_key: '   ' is empty"),
        (" agent:main:main", "session_key: ' agent:main:main' has leading or trailing whitespace"),
        (
            "agent:main:main\n",
            "session_key: 'agent:main:main\\n' has leading or trailing whitespace",
        ),
        (
            "agent:ma\x00in:main",
            "session_key: 'agent:ma\\x00in:main' contains the control character '\\x00'",
        ),
        ("agent:", "session_key: 'agent:' has no agent id after 'agent:'"),
        ("agent::main", "session_key: 'agent::main' has no agent id after 'agent:'"),
        (
            "agent:../etc:main",
            "session_key: 'agent:../etc:main' has agent id '../etc'; agent ids match [a-z0-9][a-z0-9_-]{0,63}",
        ),
        (
            "agent:Main:main",
            "session_key: 'agent:Main:main' has agent id 'Main'; agent ids match [a-z0-9][a-z0-9_-]{0,63}",
        ),
        (
            "agent:main:group:",
            "session_key: 'agent:main:group:' has no conversation id after ':group'",
        ),
        (
            "agent:main:direct",
            "session_key: 'agent:main:direct' has no conversation id after ':direct'",
        ),
        (
            "agent:main:group:g1:thread:",
            "session_key: 'agent:main:group:g1:thread:' has an empty thread id after ':thread:'",
        ),
        (
            "agent:main:dm:\ud800",
            "session_key: lone surrogate '\\ud800' at index 14 (text must be valid Unicode)",
        ),
        ("x" * 513, "session_key: '" + "x" * 77 + "...' is 513 characters long (at most 512)"),
    ],
)
def test_malformed_keys_name_the_problem(raw: str, error: str) -> None:
    with pytest.raises(am.InvalidInputError) as info:
        am.parse_session_key(raw)
    assert str(info.value) == error


def test_non_string_key() -> None:
    with pytest.raises(am.InvalidInputError, match="^session_key: expected a string, got int$"):
        am.parse_session_key(42)


@given(st.text(max_size=600))
def test_any_text_parses_or_is_rejected_cleanly(raw: str) -> None:
    try:
        key = am.parse_session_key(raw)
    except am.InvalidInputError as exc:
        assert str(exc).startswith("session_key: ")
    else:
        assert key.raw == raw
        assert key.chat_type in ("direct", "group", "channel", "explicit", "unknown")
        if key.agent is not None:
            assert "/" not in key.agent and ".." not in key.agent
