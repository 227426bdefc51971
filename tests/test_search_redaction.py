"""Redaction in search answers (docs/design.md §3): secrets never reach a snippet or the answer.

Each listed secret format sits inside a message that search finds; the snippet and the
whole serialized answer must not hold the secret's body. Redaction happens before the
snippet is cut, so a secret that straddles the snippet's edge cannot leak its first half.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

import activememory as am

from pg_server import pg_memory_dsn, storage

# Both stores (docs/design.md §11): redaction on SQLite's and PostgreSQL's answers.
__all__ = ["pg_memory_dsn", "storage"]

pytestmark = pytest.mark.anyio

KEY = "agent:main:direct:alice"

# (format, text holding the secret, the secret's body that must never be shown)
SECRETS = [
    ("openai", "use sk-proj-Zx8v2Qw9Lk3Jh5Gf7Ds1Pa4 for the beta", "Zx8v2Qw9Lk3Jh5Gf7Ds1"),
    ("github", "token ghp_16C7e42F292c6912E7710c838347Ae178B4a in ci", "16C7e42F292c6912E7710c83834"),
    ("github_pat", "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv", "11ABCDEFG0123456789_abcdefghijklmn"),
    ("slack", "bot xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOp set", "123456789012-1234567890123-AbCdEf"),
    ("google", "maps key AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW here", "SyA1b2C3d4E5f6G7h8I9j0KlMnOpQr"),
    ("npm", "publish with npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789", "AbCdEfGhIjKlMnOpQrStUvWxYz01234"),
    ("groq", "gsk_Q1w2E3r4T5y6U7i8O9p0AsDfGhJkLzXcVbNm1234567890QwErTyUiOp in env", "Q1w2E3r4T5y6U7i8O9p0AsDf"),
    ("bearer", "Authorization: Bearer abc123def456ghi789jkl012mno345", "def456ghi789jkl012"),
    ("jwt", "jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U ok", "eyJzdWIiOiIxMjM0NTY3ODkwIn0"),
    ("assignment", "export AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "XUtnFEMI/K7MDENG/bPxRfiCYEXAMPL"),
    ("password=", "DB_PASSWORD=hunter2hunter2 in prod", "hunter2hunter2"),
    ("json", '{"user": "bob", "password": "correct-horse-battery"}', "horse-battery"),
    ("flag", "run deploy --password s3cr3tP@ss now", "s3cr3tP@ss"),
    ("url", "clone https://bob:pa55w0rdXYZ@git.example.com/repo.git", "pa55w0rdXYZ"),
    ("pem", "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7bq98Qv3s\n-----END RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA7bq98Qv3s"),
]  # fmt: skip


@pytest.fixture
async def mem(tmp_path: Path, executor: str, storage: str | None) -> AsyncIterator[am.Memory]:
    config = {"logging": {"redactPatterns": [r"ACME-[0-9]{6}"]}}
    async with am.open_memory(
        tmp_path / "state",
        config=config,
        executor=executor,  # type: ignore[arg-type]
        storage=storage,
    ) as memory:
        yield memory


def assert_hidden(result: am.SearchResult, body: str) -> None:
    answer = msgspec.json.encode(result).decode()
    assert body not in answer
    for hit in result.results:
        assert body not in hit.snippet


@pytest.mark.parametrize(("kind", "text", "body"), SECRETS, ids=[s[0] for s in SECRETS])
async def test_secret_in_a_short_message(mem: am.Memory, kind: str, text: str, body: str) -> None:
    await mem.sessions.append(KEY, am.Message(role="user", content=f"zebra note: {text}"))
    result = await mem.sessions.search("zebra", caller=KEY)
    assert len(result.results) == 1
    assert_hidden(result, body)


@pytest.mark.sqlite_only(
    "the snippet is cut in Python from the stored text, the same code on both stores"
    " (every secret of the short-message cases runs on both)"
)
@pytest.mark.parametrize(("kind", "text", "body"), SECRETS, ids=[s[0] for s in SECRETS])
@pytest.mark.parametrize("lead", [150, 205, 240, 280, 330])
async def test_secret_across_the_snippet_edge(
    mem: am.Memory, kind: str, text: str, body: str, lead: int
) -> None:
    """The hit is near the start, the secret sits where the 300-character cut falls."""
    filler = ("lorem ipsum " * 40)[:lead].rstrip() + " "
    content = f"zebra {filler}{text} " + "tail words " * 60
    await mem.sessions.append(KEY, am.Message(role="user", content=content))
    result = await mem.sessions.search("zebra", caller=KEY)
    (hit,) = result.results
    assert len(hit.snippet) <= 300 and result.truncated
    assert_hidden(result, body)
    # No prefix of the body longer than what masking keeps (4 characters) shows either.
    for cut in range(9, len(body) + 1):
        assert body[:cut] not in hit.snippet


async def test_user_configured_pattern(mem: am.Memory) -> None:
    await mem.sessions.append(KEY, am.Message(role="user", content="zebra ticket ACME-123456"))
    result = await mem.sessions.search("zebra", caller=KEY)
    assert "123456" not in result.results[0].snippet


async def test_searching_for_a_secret_does_not_reveal_it(mem: am.Memory) -> None:
    await mem.sessions.append(
        KEY, am.Message(role="user", content="key sk-proj-Zx8v2Qw9Lk3Jh5Gf7Ds1Pa4 saved")
    )
    result = await mem.sessions.search("sk-proj-Zx8v2Qw9Lk3Jh5Gf7Ds1Pa4", caller=KEY)
    assert len(result.results) == 1
    assert_hidden(result, "Zx8v2Qw9Lk3Jh5Gf7Ds1")


async def test_a_bad_user_pattern_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(
        am.InvalidInputError, match=r"^logging\.redactPatterns\[0\]: '\(' is not a valid"
    ):
        async with am.open_memory(tmp_path / "s", config={"logging": {"redactPatterns": ["("]}}):
            pass
