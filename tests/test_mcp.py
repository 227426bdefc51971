"""`activememory mcp` (docs/design.md §12.2), driven by the MCP SDK's own client over its
real transports: `activememory mcp` launched as a subprocess over stdio, and over
streamable HTTP on loopback. One test body checks both: initialise, list the tools (their
schemas are the argument Structs'), call each tool, forged arguments that cannot widen
what the caller sees, bad arguments that name the field and write nothing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx
import pytest
import trio
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

import activememory as am
from activememory._cli import _mcp, _parser, main
from activememory.protocol.session_key import parse_session_key
from activememory.protocol.tools import function_schema
from activememory.service.mcp import TOOLS, WRITE_TOOLS, MemoryTools, make_server, serve_http

pytestmark = pytest.mark.anyio

ALICE = "agent:main:direct:alice"
ALICE_TELEGRAM = "agent:main:direct:telegram:123"  # alice's too (session.identityLinks)
BOB = "agent:main:direct:bob"
CONFIG = """{
  agents: { defaults: { memorySearch: { provider: "none" } } },  // text only: fast
  session: { identityLinks: { alice: ["telegram:123", "alice"] } },
}
"""
TOKEN = "s3cret-token-for-tests-0123456789"
TEST_S = 120  # an outer bound: importing the SDK alone takes seconds on a loaded machine


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the client side only: the server is a subprocess either way


class Seeded(NamedTuple):
    state: Path
    config: Path
    bob_record: str


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    """Alice's chat, her linked telegram chat, Bob's chat and record, a memory note."""
    state, config = tmp_path / "state", tmp_path / "config.json5"
    config.write_text(CONFIG)

    async def seed() -> str:
        async with am.open_memory(state, config=config) as mem:
            for key, text in [
                (ALICE, "I like aisle seats"),
                (ALICE_TELEGRAM, "my cat is called Miso"),
                (BOB, "my locker code is 4411 and my cat is Rex"),
            ]:
                await mem.sessions.append(key, am.Message(role="user", content=text))
            return await mem.records.add(
                "Bob is vegetarian and allergic to peanuts",
                user_id="bob",
                agent_id="main",
                thread_id=BOB,
            )

    bob_record = trio.run(seed)
    workspace = state / "agents/main/workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    (workspace / "MEMORY.md").write_text("# Travel\nAlice prefers aisle seats on long flights.\n")
    return Seeded(state, config, bob_record)


def launch_args(seeded: Seeded, *extra: str) -> list[str]:
    return ["-m", "activememory", "mcp", "--state-dir", str(seeded.state), "--session-key", ALICE,
            "--config", str(seeded.config), *extra]  # fmt: skip


@contextmanager
def http_server(seeded: Seeded, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`activememory mcp --transport http --port 0` as a subprocess; yields its URL, then
    stops it with SIGTERM and checks it closed cleanly (exit status 0)."""
    args = launch_args(seeded, "--transport", "http", "--port", "0", *extra)
    proc = subprocess.Popen(
        [sys.executable, *args],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("activememory mcp: serving http://127.0.0.1:"), line
        yield line.split("serving ", 1)[1].strip()
    finally:
        proc.terminate()
        status = proc.wait(timeout=30)
    assert status == 0, proc.stderr.read()


@asynccontextmanager
async def connected(transport: str, seeded: Seeded) -> AsyncIterator[Client]:
    if transport == "stdio":
        params = StdioServerParameters(command=sys.executable, args=launch_args(seeded))
        async with Client(params) as client:
            yield client
        return
    with http_server(seeded) as url:
        async with Client(url) as client:
            yield client


async def call(client: Client, name: str, arguments: dict[str, Any]) -> Any:
    """A tool call that must succeed; its structured content."""
    with anyio.fail_after(30):
        result = await client.call_tool(name, arguments)
    assert not result.is_error, result.content
    return result.structured_content


async def error(client: Client, name: str, arguments: dict[str, Any]) -> str:
    """A tool call that must fail as an MCP tool error; its text."""
    with anyio.fail_after(30):
        result = await client.call_tool(name, arguments)
    assert result.is_error, result.content
    assert result.structured_content is None
    [content] = result.content
    assert content.type == "text"
    return content.text


def records_in(state: Path) -> list[tuple[str, str | None, str]]:
    """(content, user_id, status) of every stored record, read straight from the file."""
    with sqlite3.connect(f"file:{state / 'records.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT content, user_id, status FROM records ORDER BY content")
        return [(str(c), u, str(s)) for c, u, s in rows]


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_every_tool_over_a_real_transport(transport: str, seeded: Seeded) -> None:
    with anyio.fail_after(TEST_S):
        async with connected(transport, seeded) as client:
            alice_ids = await check_every_tool(client, seeded.bob_record)
    # After the server closed: only alice's two records were written; bob's is untouched.
    assert records_in(seeded.state) == [
        ("Alice cooks lentil soup", "alice", "valid"),
        ("Alice is vegetarian", "alice", "invalid"),
        ("Bob is vegetarian and allergic to peanuts", "bob", "valid"),
    ]
    assert len(alice_ids) == 2


async def check_every_tool(client: Client, bob_record: str) -> list[str]:
    # The schemas the model is shown are the argument Structs', as the recall model's are.
    listed = (await client.list_tools()).tools
    assert [tool.name for tool in listed] == list(TOOLS)
    for tool in listed:
        schema = function_schema(TOOLS[tool.name])
        assert (tool.description, tool.input_schema) == (
            schema["description"],
            schema["parameters"],
        )
        assert tool.input_schema["additionalProperties"] is False
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (tool.name not in WRITE_TOOLS)

    # sessions_search: the caller is the launch's session key, never an argument.
    found = await call(client, "sessions_search", {"query": "aisle seat"})
    assert [hit["session_key"] for hit in found["results"]] == [ALICE]
    assert await error(client, "sessions_search", {"query": "locker", "caller": BOB}) == (
        "caller: unknown key; expected one of query, limit, match, mode, session_key"
    )
    named = await call(client, "sessions_search", {"query": "locker", "session_key": BOB})
    assert named["results"] == []  # bob's session, named outright: still not alice's to see

    # memory_search / memory_get: notes, and alice's other private chat, never bob's.
    cats = await call(client, "memory_search", {"query": "cat"})
    assert [r["path"].rpartition("#")[0] for r in cats["results"]] == [f"session:{ALICE_TELEGRAM}"]
    notes = await call(client, "memory_search", {"query": "aisle seats", "maxResults": 3})
    assert "MEMORY.md" in [r["path"] for r in notes["results"]]
    note = await call(client, "memory_get", {"path": "MEMORY.md"})
    assert "aisle seats on long flights" in note["text"]
    message = await call(client, "memory_get", {"path": cats["results"][0]["path"]})
    assert "Miso" in message["text"]
    assert (await error(client, "memory_get", {"path": f"session:{BOB}#3"})).startswith(
        f"path: 'session:{BOB}#3' is not available"
    )

    # The record tools: written to alice (the launch's identity), recalled for her alone.
    assert await error(client, "records_add", {"content": "x", "user_id": "bob"}) == (
        "user_id: unknown key; expected one of content, record_type, metadata"
    )
    vegetarian = (await call(client, "records_add", {"content": "Alice is vegetarian"}))["id"]
    soup = await call(
        client, "records_add", {"content": "Alice cooks lentil soup", "metadata": {"via": "mcp"}}
    )
    linked = await call(
        client,
        "records_link",
        {"source_id": soup["id"], "target_id": vegetarian, "relation": "about"},
    )
    assert linked["relation"] == {
        "relation": "about",
        "source_id": soup["id"],
        "target_id": vegetarian,
    }
    recalled = await call(client, "memory_recall", {"query": "vegetarian peanuts"})
    assert [r["id"] for r in recalled["results"]] == [vegetarian]  # never bob's record

    # Bob's record cannot be touched, and says no more than an id that does not exist.
    for record_id in (bob_record, "f" * 32):
        assert await error(client, "records_invalidate", {"id": record_id, "reason": "forged"}) == (
            f"id: no record {record_id!r} in this memory"
        )
        assert await error(
            client,
            "records_link",
            {"source_id": vegetarian, "target_id": record_id, "relation": "about"},
        ) == (f"target_id: no record {record_id!r} in this memory")

    await call(client, "records_invalidate", {"id": vegetarian, "reason": "eats fish now"})
    recalled = await call(client, "memory_recall", {"query": "vegetarian"})
    assert recalled["results"] == []

    # Bad arguments: a tool error naming the field and what is allowed; nothing written.
    bad = [
        ("memory_search", {"query": "cat", "maxResults": 0}, "maxResults: 0 is below the minimum 1"),
        ("memory_search", {}, 'missing required key "query"'),
        ("sessions_search", {"query": "x", "mode": "fuzzy"}, 'mode: "fuzzy" is not one of "text", "hybrid"'),
        ("sessions_search", {"query": "x", "limit": 26}, "limit: 26 is above the maximum 25"),
        ("records_add", {"content": "   "}, 'content: "   " is blank'),
        (
            "records_add",
            {"content": "x", "record_type": "poem"},
            'record_type: expected one of "memory", "message", "document", "actor_profile", '
            '"image", got "poem"',
        ),
        ("records_add", {"content": "x", "metadata": [1]}, "metadata: expected an object, got [1]"),
        (
            "records_link",
            {"source_id": vegetarian, "target_id": soup["id"], "relation": "is about"},
            "relation: 'is about' is not a relation name (a letter, then letters, digits, '_' "
            "or '-'; at most 64 characters)",
        ),
        ("records_invalidate", {"id": soup["id"]}, 'missing required key "reason"'),
        (
            "memory_forget",
            {},
            "memory_forget: no such tool (tools: sessions_search, memory_search, memory_get, "
            "memory_recall, records_add, records_link, records_invalidate)",
        ),
    ]  # fmt: skip
    for name, arguments, message in bad:
        assert await error(client, name, arguments) == message, (name, arguments)
    return [vegetarian, soup["id"]]


async def test_a_token_guards_the_http_transport(seeded: Seeded) -> None:
    # In this process (the launch's token handling is test_a_bad_launch_refuses_to_start's):
    # the same server and HTTP stack as `activememory mcp --transport http --token ...`.
    key = parse_session_key(ALICE)
    with anyio.fail_after(TEST_S):
        async with (
            am.open_memory(seeded.state, config=seeded.config) as mem,
            anyio.create_task_group() as tasks,
        ):
            server = make_server(MemoryTools(mem, key))
            url = await tasks.start(
                partial(serve_http, server, host="127.0.0.1", port=0, token=TOKEN)
            )
            async with httpx.AsyncClient(timeout=30) as http:
                body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
                wrong = ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN})
                for headers in wrong:
                    refused = await http.post(url, json=body, headers=headers)
                    assert (refused.status_code, refused.content) == (401, b"")
                    assert refused.headers["www-authenticate"] == "Bearer"
                # The token is not all: on loopback a page of another site cannot call in
                # (DNS rebinding: its Host or Origin is not ours).
                authorized = {"Authorization": f"Bearer {TOKEN}"}
                for foreign in ({"Host": "evil.example"}, {"Origin": "http://evil.example"}):
                    refused = await http.post(url, json=body, headers=authorized | foreign)
                    assert refused.status_code in (403, 421), foreign
            auth = httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
            async with auth, Client(streamable_http_client(url, http_client=auth)) as client:
                listed = (await client.list_tools()).tools
                assert [tool.name for tool in listed] == list(TOOLS)
                found = await call(client, "sessions_search", {"query": "aisle"})
                assert [hit["session_key"] for hit in found["results"]] == [ALICE]
            tasks.cancel_scope.cancel()


def test_a_bad_launch_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    monkeypatch.delenv("ACTIVEMEMORY_MCP_TOKEN", raising=False)
    monkeypatch.delenv("AM_UNSET_TOKEN", raising=False)
    launch = ["mcp", "--state-dir", str(state), "--session-key", ALICE, "--transport", "http"]
    cases = [
        (
            ["--host", "0.0.0.0"],
            "--host: 0.0.0.0 is not a loopback address; serving it needs a bearer token "
            "(--token '${NAME}' or $ACTIVEMEMORY_MCP_TOKEN)",
        ),
        (["--host", "0.0.0.0", "--token", "short"], "--token: expected at least 16 characters"),
        (
            ["--token", "${AM_UNSET_TOKEN}"],
            "--token: environment variable AM_UNSET_TOKEN is not set",
        ),
        (["--port", "70000"], "--port: expected 0 to 65535, got 70000"),
    ]
    for extra, message in cases:
        assert main([*launch, *extra]) == 2
        assert capsys.readouterr().err == f"activememory: error: {message}\n"
    assert main(["mcp", "--state-dir", str(state), "--session-key", "agent:main:direct:"]) == 2
    assert "--session-key" in capsys.readouterr().err
    assert not state.exists()  # nothing was opened, let alone created


async def test_a_readonly_memory_offers_no_write_tool(seeded: Seeded) -> None:
    async with am.open_memory(seeded.state, config=seeded.config, readonly=True) as mem:
        tools = MemoryTools(mem, parse_session_key(ALICE))
        assert tools.names() == tuple(name for name in TOOLS if name not in WRITE_TOOLS)
        with pytest.raises(am.InvalidInputError, match="^records_add: no such tool"):
            await tools.call("records_add", {"content": "x"})
        found = await tools.call("sessions_search", {"query": "aisle"})
        assert found.evidence


def test_the_readme_launches_are_this_cli() -> None:
    # The README's client configuration and shell lines, parsed by the CLI's own parser.
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n### MCP server\n", 1)[1].split("\n### ", 1)[0]
    [config] = re.findall(r"^```json\n(.*?)^```", section, re.S | re.M)
    server = json.loads(config)["mcpServers"]["activememory"]
    assert server["command"] == "activememory"
    launches = [server["args"]]
    [shell] = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    for line in shell.replace("\\\n", " ").splitlines():
        if not line.startswith("#"):
            words = shlex.split(line, comments=True)
            launches.append(words[words.index("activememory") + 1 :])
    assert len(launches) == 3
    for argv in launches:
        args = _parser().parse_args(argv)
        assert (args.run, args.session_key) == (_mcp, ALICE), argv


async def test_a_failing_tool_tells_the_client_nothing_of_its_insides(
    seeded: Seeded, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The SDK's client connected in process to the same server object the CLI serves.
    async with am.open_memory(seeded.state, config=seeded.config) as mem:

        async def broken(*args: object, **kwargs: object) -> None:
            raise RuntimeError(
                "boom at /srv/secret/path, api_key=sk-abcdefghijklmnopqrstuvwxyz0123"
            )

        monkeypatch.setattr(mem.sessions, "search", broken)
        async with Client(make_server(MemoryTools(mem, parse_session_key(ALICE)))) as client:
            text = await error(client, "sessions_search", {"query": "aisle"})
            assert text == "sessions_search failed inside the server (see its log)"
            recalled = await call(client, "memory_recall", {"query": "peanuts"})
            assert recalled["results"] == []  # the server goes on; bob's record stays his
    assert "boom at /srv/secret/path" in caplog.text  # the operator's log has it
    assert "RuntimeError" in caplog.text and "Traceback" in caplog.text
    assert "abcdefghijklmnopqrstuvwxyz" not in caplog.text  # ... with its secrets masked


def test_a_record_type_is_described_by_the_field_not_the_enum() -> None:
    # `function_schema` inlines a `$ref`, keeping the field's own keys over the type's.
    schema = function_schema(TOOLS["records_add"])["parameters"]["properties"]["record_type"]
    assert schema == {
        "description": "What the record holds",
        "enum": ["actor_profile", "document", "image", "memory", "message"],
        "default": "memory",
    }
