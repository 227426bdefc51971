"""`activememory serve` in process: a real hypercorn server on 127.0.0.1 (an ephemeral port),
plain httpx requests (docs/design.md §12.1)."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

import activememory as am
from activememory.protocol.service import Ok
from activememory.service import http

pytestmark = pytest.mark.anyio

TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
ALICE = "agent:main:direct:alice"
ALICE_ELSEWHERE = "agent:main:dm:alice"  # alice's other private chat: recall may read it
BOB = "agent:main:direct:bob"
HOST_TOKEN = "host-token-0123456789abcdef"
ALICE_TOKEN = "alice-token-0123456789abcdef"
FACT = "I drink oolong tea every morning."


@contextlib.asynccontextmanager
async def served(
    tmp_path: Path,
    options: http.ServeOptions | None = None,
    *,
    config: Any = None,
    models: dict[str, Any] | None = None,
    endpoints: Sequence[http.Endpoint] = http.ENDPOINTS,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[tuple[httpx.AsyncClient, am.Memory]]:
    """An open memory served on 127.0.0.1:<free port>, and a client for it."""
    config = TEXT_ONLY if config is None else config
    async with am.open_memory(tmp_path / "state", config=config, models=models) as mem:
        app = http.build_app(mem, options or http.ServeOptions(), endpoints=endpoints)
        shutdown = anyio.Event()
        with http.bind_socket("127.0.0.1", 0) as sock:
            async with anyio.create_task_group() as tg:
                tg.start_soon(functools.partial(http.serve, app, sock, shutdown=shutdown))
                url = f"http://127.0.0.1:{sock.getsockname()[1]}"
                async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
                    yield client, mem
                shutdown.set()


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


async def test_a_whole_bot_turn_over_http(tmp_path: Path) -> None:
    async with served(tmp_path) as (client, mem):
        r = await client.post(
            "/v1/sessions/append", json={"session_key": ALICE_ELSEWHERE, "message": user(FACT)}
        )
        assert r.status_code == 200 and r.json()["id"] == 1
        turn = {"session_key": ALICE, "messages": [user("what tea do I drink in the morning?")]}
        r = await client.post("/v1/turns/prefix", json=turn)
        assert r.status_code == 200, r.text
        prefix = r.json()
        assert prefix["outcome"]["status"] == "ok", prefix["outcome"]
        assert "oolong" in prefix["prompt_prefix"]
        assert prefix["outcome"]["status_line"].startswith("🧩 Active Memory: status=ok")
        # The host calls its own model with the prefix, then stores the answer.
        answer = {"role": "assistant", "content": "Oolong, as every morning."}
        r = await client.post("/v1/sessions/append", json={"session_key": ALICE, "message": answer})
        assert r.status_code == 200
        r = await client.post("/v1/sessions/history", json={"session_key": ALICE})
        events = r.json()["events"]
        assert [e["message"]["role"] for e in events] == ["user", "assistant"]
        assert events[0]["id"] == prefix["user_event_id"]
        # The same store, through the library: one implementation.
        assert [e.id for e in await mem.sessions.history(ALICE)] == [e["id"] for e in events]
        r = await client.post("/v1/recall", json=turn)
        assert r.json()["status"] == "ok" and r.json()["debug_line"]
        r = await client.post(
            "/v1/commands", json={"session_key": ALICE, "text": "/active-memory status"}
        )
        assert r.status_code == 200 and "Active Memory" in r.json()["reply"]
        r = await client.post(
            "/v1/sessions/search", json={"query": "oolong", "caller": ALICE_ELSEWHERE}
        )
        assert [h["message_id"] for h in r.json()["results"]] == [1]
        r = await client.post("/v1/sessions/rewind", json={"session_key": ALICE, "to_event_id": 2})
        assert r.json() == {"ok": True}
        assert (await client.get("/v1/stats")).json()["agents"][0]["sessions"] == 2
        assert (await client.get("/v1/doctor")).json()["ok"] is True


async def test_records_at_each_scope_layer(tmp_path: Path) -> None:
    async with served(tmp_path) as (client, _):
        add = {"content": "prefers aisle seats", "user_id": "alice", "agent_id": "main"}
        first = (await client.post("/v1/records/add", json=add)).json()["id"]
        add = {"content": "flies to Lisbon", "user_id": "alice", "thread_id": "t1"}
        second = (await client.post("/v1/records/add", json=add)).json()["id"]
        r = await client.post(
            "/v1/records/link",
            json={"source_id": second, "target_id": first, "relation": "about"},
        )
        assert r.json() == {"relation": "about", "source_id": second, "target_id": first}
        search = {"query": "seats Lisbon", "user_id": "alice", "num_hops": 1}
        found = (await client.post("/v1/records/search", json=search)).json()
        assert {r["record"]["id"] for r in found["results"]} == {first, second}
        assert all(f.startswith("<record") for f in found["formatted"])
        # The client layer needs an exact user; the store layer does not.
        r = await client.post("/v1/records/search", json={"query": "seats"})
        assert r.status_code == 422 and r.json()["error"].startswith("user_id: required")
        r = await client.post("/v1/records/search", json={"query": "seats", "layer": "store"})
        assert [x["record"]["id"] for x in r.json()["results"]] == [first]
        thread = {"user_id": "alice", "agent_id": None, "thread_id": "t1"}
        r = await client.post(
            "/v1/records/search", json={"query": "Lisbon", "layer": "thread", "thread": thread}
        )
        assert [x["record"]["id"] for x in r.json()["results"]] == [second]
        r = await client.post("/v1/records/invalidate", json={"id": first, "reason": "moved"})
        assert r.json() == {"ok": True}
        search = {"query": "seats", "user_id": "alice", "include_invalid_results": False}
        assert (await client.post("/v1/records/search", json=search)).json()["results"] == []


async def test_bad_input_names_the_field_and_what_is_allowed_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as (client, mem):
        await mem.sessions.append(ALICE, am.Message(role="user", content="hello"))
        bad = [
            ({"session_key": ALICE, "message": {"role": "bot", "content": "x"}},
             "$.message.role", "'user', 'assistant', 'tool'"),
            ({"session_key": ALICE, "message": {"role": "user", "content": [{"type": "txt"}]}},
             "$.message.content[0].type", "'text', 'input_text'"),
            ({"session_key": ALICE, "message": user("x"), "sesion_key": 1},
             "$", "sesion_key"),
            ({"session_key": ALICE, "message": {"role": "user", "content": "x", "timestamp": -1}},
             None, "message.timestamp: -1.0 is out of range"),  # the library's check
        ]  # fmt: skip
        for body, field, allowed in bad:
            r = await client.post("/v1/sessions/append", json=body)
            assert r.status_code == 422, r.text
            assert r.json()["field"] == field and allowed in r.json()["error"], r.json()
        r = await client.post(
            "/v1/sessions/append", json={"session_key": "agent:", "message": user("x")}
        )
        assert r.status_code == 422 and r.json()["error"].startswith("session_key:")
        r = await client.post("/v1/sessions/append", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"].startswith("body: not a JSON object")
        r = await client.post(
            "/v1/sessions/search",
            json={"query": "hello", "caller": ALICE, "visibility": "all"},
        )
        assert r.status_code == 422 and "cannot widen" in r.json()["error"]
        r = await client.post("/v1/sessions/history", json={"session_key": BOB})
        assert r.status_code == 404 and "no session" in r.json()["error"]
        assert [e.id for e in await mem.sessions.history(ALICE)] == [1]
        assert (await mem.sessions.stats())[0].events == 1


async def test_tokens_wrong_or_missing_is_401_with_no_detail(tmp_path: Path) -> None:
    options = http.ServeOptions(tokens={HOST_TOKEN: None})
    async with served(tmp_path, options) as (client, _):
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": HOST_TOKEN},
                        {"Authorization": f"Basic {HOST_TOKEN}"}):  # fmt: skip
            r = await client.get("/v1/stats", headers=headers)
            assert (r.status_code, r.content) == (401, b""), headers
            assert r.headers["www-authenticate"] == "Bearer"
        r = await client.get("/openapi.json")
        assert r.status_code == 401
        r = await client.get("/v1/stats", headers={"Authorization": f"Bearer {HOST_TOKEN}"})
        assert r.status_code == 200


async def test_a_caller_cannot_reach_another_callers_session(tmp_path: Path) -> None:
    options = http.ServeOptions(tokens={HOST_TOKEN: None, ALICE_TOKEN: ALICE})
    host = {"Authorization": f"Bearer {HOST_TOKEN}"}
    alice = {"Authorization": f"Bearer {ALICE_TOKEN}"}
    async with served(tmp_path, options) as (client, mem):
        await mem.sessions.append(BOB, am.Message(role="user", content="my secret plan"))
        await mem.sessions.append(ALICE, am.Message(role="user", content="my plan"))
        # The host's token may say any caller; the library decides what that caller sees.
        r = await client.post(
            "/v1/sessions/search",
            json={"query": "secret plan", "caller": ALICE, "session_key": BOB},
            headers=host,
        )
        assert r.status_code == 200 and r.json()["results"] == []
        # Alice's own token: her session only, as herself only.
        r = await client.post(
            "/v1/sessions/search",
            json={"query": "plan", "caller": ALICE, "session_key": BOB},
            headers=alice,
        )
        assert r.status_code == 200 and r.json()["results"] == []
        r = await client.post(
            "/v1/sessions/search", json={"query": "plan", "caller": ALICE}, headers=alice
        )
        assert [h["session_key"] for h in r.json()["results"]] == [ALICE]
        refused = [
            ("/v1/sessions/history", {"session_key": BOB}),
            ("/v1/sessions/search", {"query": "plan", "caller": BOB}),
            ("/v1/sessions/append", {"session_key": BOB, "message": user("hi")}),
            ("/v1/recall", {"session_key": BOB, "messages": [user("plan?")]}),
            ("/v1/turns/prefix", {"session_key": BOB, "messages": [user("plan?")]}),
            ("/v1/commands", {"session_key": BOB, "text": "/active-memory off"}),
            ("/v1/records/search", {"query": "plan", "layer": "store"}),
        ]
        for path, body in refused:
            r = await client.post(path, json=body, headers=alice)
            assert (r.status_code, r.content) == (403, b""), path
        assert (await client.get("/v1/stats", headers=alice)).status_code == 403
        # A command from alice's client is never the owner's, whatever it claims.
        r = await client.post(
            "/v1/commands",
            json={"session_key": ALICE, "text": "/active-memory off --global",
                  "sender": {"owner": True}},
            headers=alice,
        )  # fmt: skip
        assert r.status_code == 200 and mem.config.active_memory.enabled
        assert len(await mem.sessions.history(BOB)) == 1


async def test_an_oversized_body_is_413(tmp_path: Path) -> None:
    options = http.ServeOptions(max_body_bytes=64 * 1024)
    async with served(tmp_path, options) as (client, mem):
        big = {"session_key": ALICE, "message": user("x" * 70_000)}
        r = await client.post("/v1/sessions/append", json=big)
        assert r.status_code == 413 and "65536 bytes" in r.json()["error"]

        async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted as it comes
            yield b'{"session_key": "agent:main:direct:alice", "message": {"role": "user", '
            for _ in range(20):
                yield b'"content": "' + b"y" * 4000 + b'", '
            yield b'"timestamp": 1}}'

        r = await client.post("/v1/sessions/append", content=chunks())
        assert r.status_code == 413
        assert await mem.sessions.stats() == []  # nothing was stored, no database made


async def test_the_rate_limit_is_429_with_retry_after(tmp_path: Path) -> None:
    async with served(tmp_path, http.ServeOptions(rate=0.5, burst=2)) as (client, _):
        codes = [(await client.get("/v1/stats")).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        r = await client.get("/v1/stats")
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"].startswith("rate limit")


async def test_a_failure_is_a_fixed_500_and_logged_redacted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def broken(mem: am.Memory, body: None, who: http.Principal) -> Ok:
        raise RuntimeError("upstream said api_key=sk-abcdefghijklmnopqrstuvwxyz0123")

    endpoint = http.Endpoint("GET", "/v1/broken", None, Ok, broken, "always fails")
    caplog.set_level(logging.ERROR, logger="activememory.serve")
    async with served(tmp_path, endpoints=[*http.ENDPOINTS, endpoint]) as (client, _):
        r = await client.get("/v1/broken")
    assert r.status_code == 500
    assert r.json() == {"error": http.INTERNAL_ERROR, "field": None}
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "RuntimeError" in logged and "GET /v1/broken" in logged
    assert "abcdefghijklmnopqrstuvwxyz" not in logged


class Slow:
    """A recall model that never answers within the budget; says when it was cancelled."""

    def __init__(self) -> None:
        self.cancelled = anyio.Event()

    async def recall(self, request: am.RecallRequest, tools: am.RecallTools) -> str:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            self.cancelled.set()
            raise
        return "late"


async def test_a_recall_that_times_out_is_a_200_with_its_status(tmp_path: Path) -> None:
    settings = {"model": "test/slow", "timeoutMs": 250}
    config = {**TEXT_ONLY, "plugins": {"entries": {"active-memory": {"config": settings}}}}
    async with served(tmp_path, config=config, models={"test/slow": Slow()}) as (client, _):
        turn = {"session_key": ALICE, "messages": [user("what tea do I drink?")]}
        r = await client.post("/v1/recall", json=turn)
        assert r.status_code == 200 and r.json()["status"] == "timeout"
        r = await client.post("/v1/turns/prefix", json=turn)
        assert r.status_code == 200 and r.json()["prompt_prefix"] is None


async def test_openapi_is_generated_from_the_structs(tmp_path: Path) -> None:
    async with served(tmp_path) as (client, _):
        doc = (await client.get("/openapi.json")).json()
    assert doc["openapi"] == "3.1.0"
    assert {e.path for e in http.ENDPOINTS} == set(doc["paths"])
    append = doc["paths"]["/v1/sessions/append"]["post"]
    assert append["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/AppendBody"
    }
    role = doc["components"]["schemas"]["Message"]["properties"]["role"]
    assert sorted(role["enum"]) == ["assistant", "tool", "user"]


def test_a_non_loopback_bind_needs_a_token() -> None:
    with pytest.raises(am.InvalidInputError, match="not a loopback address, and no token"):
        http.check_bind(http.ServeOptions(host="0.0.0.0"))
    http.check_bind(http.ServeOptions(host="0.0.0.0", tokens={HOST_TOKEN: None}))
    for host in ("127.0.0.1", "::1", "[::1]", "localhost", "127.8.0.1"):
        http.check_bind(http.ServeOptions(host=host))


async def test_a_client_disconnect_cancels_its_call(tmp_path: Path) -> None:
    cancelled = anyio.Event()

    async def waits(mem: am.Memory, body: None, who: http.Principal) -> Ok:
        try:
            await anyio.sleep(30)
        except anyio.get_cancelled_exc_class():
            cancelled.set()
            raise
        return Ok()

    endpoint = http.Endpoint("GET", "/v1/waits", None, Ok, waits, "waits")
    async with served(tmp_path, endpoints=[*http.ENDPOINTS, endpoint]) as (client, _):
        with pytest.raises(httpx.ReadTimeout):
            await client.get("/v1/waits", timeout=0.3)
        with anyio.fail_after(5):
            await cancelled.wait()
        assert (await client.get("/v1/stats")).status_code == 200  # the server goes on


def test_where_the_tokens_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    def options(token: str | None = None, callers: Sequence[str] = (), raw: Any = None) -> Any:
        return http.options_from(
            host="127.0.0.1", port=0, token=token, caller_tokens=callers,
            config_raw=raw or {}, max_body_bytes=4096, rate=1, burst=2,
        ).tokens  # fmt: skip

    monkeypatch.setenv("AM_T", HOST_TOKEN)
    monkeypatch.setenv(http.TOKEN_ENV, "from-the-environment-0123")
    assert options("${AM_T}") == {HOST_TOKEN: None}  # --token first, ${ENV} expanded
    assert options(raw={"serve": {"token": "${AM_T}"}}) == {HOST_TOKEN: None}  # the config
    assert options() == {"from-the-environment-0123": None}  # else $ACTIVEMEMORY_TOKEN
    assert options("${AM_T}", [f"{ALICE}={ALICE_TOKEN}"]) == {
        HOST_TOKEN: None,
        ALICE_TOKEN: ALICE,
    }
    with pytest.raises(am.InvalidInputError, match="environment variable NOPE is not set"):
        options("${NOPE}")
    with pytest.raises(am.InvalidInputError, match="at least 16 characters"):
        options("short")
    with pytest.raises(am.InvalidInputError, match="is not KEY=TOKEN"):
        options(callers=["just-a-token-0123456789"])
    with pytest.raises(am.InvalidInputError, match="--caller-token: 'agent:' has no agent id"):
        options(callers=[f"agent:={ALICE_TOKEN}"])
