"""`activememory serve` as a process: a bot turn from plain HTTP requests, the refusals at
start-up, and a schemathesis fuzz of the served /openapi.json (docs/design.md §12.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import hypothesis
import pytest
import schemathesis

TOKEN = "cli-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TEXT_ONLY = {"agents": {"defaults": {"memorySearch": {"provider": "none"}}}}
FUZZ_EXAMPLES = 6  # per operation: 13 operations, 10-20 s in all


def _start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "activememory", "serve", *args]
    return subprocess.Popen(
        command, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`activememory serve` on 127.0.0.1:<free port> with a token (from the environment);
    its base URL."""
    where = tmp_path_factory.mktemp("serve")
    config = where / "config.json5"
    config.write_text(json.dumps({**TEXT_ONLY, "serve": {"token": "${AM_TEST_TOKEN}"}}))
    process = _start(
        ["--state-dir", str(where / "state"), "--config", str(config), "--port", "0",
         "--rate-limit", "0", "--ui"],
        env={"AM_TEST_TOKEN": TOKEN},
    )  # fmt: skip
    assert process.stderr is not None
    line = process.stderr.readline()
    assert line.startswith("activememory: serving http://127.0.0.1:"), line
    try:
        yield line.split()[-1]
    finally:
        process.terminate()  # SIGTERM: a graceful stop, the store closed
        _, err = process.communicate(timeout=30)
        assert process.returncode == 0, err


def test_a_bot_turn_through_the_serve_command(server: str) -> None:
    with httpx.Client(base_url=server, headers=AUTH, timeout=30) as client:
        fact = {"role": "user", "content": "My sister Ana lives in Porto."}
        r = client.post(
            "/v1/sessions/append", json={"session_key": "agent:main:dm:carol", "message": fact}
        )
        assert r.status_code == 200, r.text
        question = {"role": "user", "content": "where does my sister Ana live?"}
        turn = {"session_key": "agent:main:direct:carol", "messages": [question]}
        prefix = client.post("/v1/turns/prefix", json=turn).json()
        assert prefix["outcome"]["status"] == "ok" and "Porto" in prefix["prompt_prefix"]
        answer = {"role": "assistant", "content": "In Porto."}
        r = client.post(
            "/v1/sessions/append", json={"session_key": turn["session_key"], "message": answer}
        )
        history = client.post("/v1/sessions/history", json={"session_key": turn["session_key"]})
        assert [e["message"]["content"] for e in history.json()["events"]] == [
            question["content"],
            "In Porto.",
        ]
        assert httpx.get(f"{server}/v1/stats").status_code == 401  # no token


def test_the_fuzzed_schema_finds_no_server_error(server: str) -> None:
    schema = schemathesis.openapi.from_url(f"{server}/openapi.json", headers=AUTH)
    seen: dict[str, set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()

        @hypothesis.settings(
            max_examples=FUZZ_EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(hypothesis.HealthCheck),
            phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
        )
        @hypothesis.given(case=operation.as_strategy())
        def check(case: schemathesis.Case) -> None:
            response = case.call(base_url=server, headers=AUTH, timeout=30)
            seen.setdefault(case.operation.label, set()).add(response.status_code)
            assert response.status_code < 500, (case.body, response.text)

        check()
    assert len(seen) == 13
    assert any(200 in codes for codes in seen.values())


def test_a_non_loopback_bind_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    env = {"ACTIVEMEMORY_TOKEN": ""}
    process = _start(["--state-dir", str(tmp_path / "s"), "--host", "0.0.0.0"], env=env)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert "'0.0.0.0' is not a loopback address, and no token is set" in err
    assert not (tmp_path / "s").exists()  # refused before the store was opened


def test_the_inspector_is_served_under_ui_behind_the_same_token(server: str) -> None:
    page = httpx.get(f"{server}/ui/", headers=AUTH, timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<html" in page.text.lower()
    refused = httpx.get(f"{server}/ui/", timeout=30)
    assert refused.status_code == 401 and refused.content == b""
