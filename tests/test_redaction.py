"""Redaction (docs/design.md §3): every secret format is masked, prose is left alone, and redaction is
idempotent and never lets the body of a long secret through."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from activememory._redaction import (
    DEFAULT_REDACTOR,
    KEPT_CHARS,
    LONG_SECRET_MIN_CHARS,
    Redactor,
    mask_secret,
    redact,
)
from activememory.protocol.errors import InvalidInputError

# fmt: off
FORMATS = [
    # API keys and tokens with a known prefix
    ("sk", "my OpenAI key is sk-abc123DEF456ghi789JKL012mno345pqrWXYZ, keep it safe",
           "my OpenAI key is sk-a…WXYZ, keep it safe"),
    ("sk-proj", "set it to sk-proj-Xy9_Zw8-Vu7Ts6Rq5Po4Nm3Lk2Ji1Hg0Fe7Dc6 please",
                "set it to sk-p…7Dc6 please"),
    ("sk-ant", "Anthropic: sk-ant-api03-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_Qw8e works",
               "Anthropic: sk-a…Qw8e works"),
    ("ghp", "push with ghp_16C7e42F292c6912E7710c838347Ae178B4a then",
            "push with ghp_…8B4a then"),
    ("gho", "the OAuth token gho_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0eF3hJ6 expired",
            "the OAuth token gho_…3hJ6 expired"),
    ("ghs", "CI uses ghs_Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp9Oo8Nn7 today",
            "CI uses ghs_…8Nn7 today"),
    ("github_pat",
     "github_pat_11ABCDEFG0aBcDeFgHiJkLm_NoPqRsTuVwXyZ0123456789aBcDeFgHiJkLmNoPqRsTuVwXyZ01234567 is mine",
     "gith…4567 is mine"),
    ("xoxb", "bot token xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx here",
             "bot token xoxb…UvWx here"),
    ("xoxp", "user token xoxp-2345678901-98765-abcdef here", "user token xoxp…cdef here"),
    ("AIza", "maps key AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe in the app",
             "maps key AIza…ewQe in the app"),
    ("npm", "publish with npm_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789A ok",
            "publish with npm_…789A ok"),
    ("gsk", "Groq says gsk_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789aBcDeFgHiJkLmNoPqRsTu ok",
            "Groq says gsk_…RsTu ok"),
    # bearer tokens and JWTs
    ("auth-header", "curl -H 'Authorization: Bearer abc.DEF-ghi_123' https://api.example.com",
                    "curl -H 'Authorization: Bearer ***' https://api.example.com"),
    ("auth-header-json",
     'headers = {"Authorization": "Bearer 0123456789abcdefghijklmnopqrstuvwxyz"}',
     'headers = {"Authorization": "Bearer 0123…wxyz"}'),
    ("auth-basic", "Authorization: Basic dXNlcjpwYXNzd29yZA==", "Authorization: Basic dXNl…ZA=="),
    ("bearer", "send Bearer mF_9.B5f-4.1JqM in the header", "send Bearer *** in the header"),
    ("jwt",
     "the cookie was eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0"
     ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c yesterday",
     "the cookie was eyJh…sw5c yesterday"),
    # assignments: the value is masked, the name kept
    ("KEY=", "run KEY=abc123 make", "run KEY=*** make"),
    ("TOKEN=", 'export TOKEN="t0k3n-v@lue" first', 'export TOKEN="***" first'),
    ("SECRET=", "SECRET=s3cr3t in .env", "SECRET=*** in .env"),
    ("PASSWORD=", "PASSWORD=hunter2", "PASSWORD=***"),
    ("API_KEY=", "export API_KEY=0123456789abcdefghijKLMN and go",
                 "export API_KEY=0123…KLMN and go"),
    ("AWS_SECRET_ACCESS_KEY=", "AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
                               "AWS_SECRET_ACCESS_KEY=wJal…EKEY"),
    ("DB_PASSWORD:", "DB_PASSWORD: correct-horse\nDB_USER: app", "DB_PASSWORD: ***\nDB_USER: app"),
    ("password =", "password = 'correct horse battery staple'", "password = 'corr…aple'"),
    ("apiKey:", "apiKey: AbCdEf123456, region: eu", "apiKey: ***, region: eu"),
    ("x-api-key:", "x-api-key: 0123456789abcdefghijKLMN", "x-api-key: 0123…KLMN"),
    ("dotted", "spring.datasource.password=Pa55w0rd", "spring.datasource.password=***"),
    ("query", "GET https://api.example.com/v1?api_key=abc123&q=cats",
              "GET https://api.example.com/v1?api_key=***&q=cats"),
    # JSON (and Python dict) fields: the value string is masked, key and quotes kept
    ("json-password", '{"user": "bob", "password": "hunter2"}', '{"user": "bob", "password": "***"}'),
    ("json-api_key", '{"api_key": "0123456789abcdefghijKLMN"}', '{"api_key": "0123…KLMN"}'),
    ("json-apiKey", '{"apiKey":"abc123"}', '{"apiKey":"***"}'),
    ("json-accessToken", '{"accessToken": "ya29.a0AfH6SMBx-long-access-token-value"}',
                         '{"accessToken": "ya29…alue"}'),
    ("json-client_secret", '{"client_secret": "GOCSPX-abcdef"}', '{"client_secret": "***"}'),
    ("json-token", '{"token": "t0k3n"}', '{"token": "***"}'),
    ("json-secret", "{'secret': 'shh'}", "{'secret': '***'}"),
    ("json-escaped", r'{\"password\": \"hunter2\"}', r'{\"password\": \"***\"}'),
    # long CLI flags
    ("cli-space", "mysql --password hunter2 -h db", "mysql --password *** -h db"),
    ("cli-equals", "mysql --password=hunter2 -h db", "mysql --password=*** -h db"),
    ("cli-token", "gh auth login --token 0123456789abcdefghijKLMN",
                  "gh auth login --token 0123…KLMN"),
    ("cli-api-key", "tool --api-key 'my key' --verbose", "tool --api-key '***' --verbose"),
    # passwords in URLs
    ("url", "connect to postgres://admin:S3cr3t!@db.example.com:5432/app now",
            "connect to postgres://admin:***@db.example.com:5432/app now"),
    ("url-long", "clone https://bob:0123456789abcdefghijKLMN@git.example.com/repo.git",
                 "clone https://bob:0123…KLMN@git.example.com/repo.git"),
    # PEM private keys
    ("pem",
     "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn\nabcDEF==\n"
     "-----END RSA PRIVATE KEY-----\nthanks",
     "key:\n-----BEGIN RSA PRIVATE KEY-----***-----END RSA PRIVATE KEY-----\nthanks"),
    ("pem-unterminated", "oops -----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nmore",
     "oops -----BEGIN OPENSSH PRIVATE KEY-----***-----END OPENSSH PRIVATE KEY-----"),
]
# fmt: on


@pytest.mark.parametrize(
    ("text", "expected"), [f[1:] for f in FORMATS], ids=[f[0] for f in FORMATS]
)
def test_every_format_is_masked(text: str, expected: str) -> None:
    assert redact(text) == expected
    assert redact(expected) == expected


def test_short_secrets_become_stars_and_long_ones_keep_four_characters_each_side() -> None:
    assert (LONG_SECRET_MIN_CHARS, KEPT_CHARS) == (18, 4)
    assert mask_secret("a" * 17) == "***"
    assert mask_secret("abcdefghijklmnopqr") == "abcd…opqr"
    assert mask_secret("x") == "***"
    assert redact("PASSWORD=abcdefghijklmnopq") == "PASSWORD=***"
    assert redact("PASSWORD=abcdefghijklmnopqr") == "PASSWORD=abcd…opqr"


def test_a_mask_is_not_masked_again() -> None:
    assert mask_secret("***") == "***"
    assert mask_secret("sk-a…WXYZ") == "sk-a…WXYZ"
    assert mask_secret("") == ""
    assert redact("API_KEY=sk-abc123DEF456ghi789JKL012mno345pqrWXYZ") == "API_KEY=sk-a…WXYZ"


def test_a_secret_after_another_secret_name_is_masked_first() -> None:
    # "Bearer" is the value of auth_token; masking it before the token would orphan the token.
    assert redact("auth_token: Bearer abcd1234efgh") == "auth_token: *** ***"
    assert redact("--password API_KEY='abcdefghijklmnopqrstuvwxyz'") == "--password API_…xyz'"


def test_user_patterns_mask_their_whole_match() -> None:
    redactor = Redactor(["ACME-[0-9]{6}", r"(?i)order-key-\d{20}"])
    assert redactor.redact("ticket ACME-123456 shipped") == "ticket *** shipped"
    assert (
        redactor.redact("use ORDER-KEY-01234567890123456789 now, PASSWORD=x")
        == "use ORDE…6789 now, PASSWORD=***"
    )
    assert DEFAULT_REDACTOR.redact("ticket ACME-123456 shipped") == "ticket ACME-123456 shipped"


@pytest.mark.parametrize(
    ("patterns", "error"),
    [
        (
            ["ok", "x+", "("],
            "redactPatterns[2]: '(' is not a valid regular expression "
            "(missing ), unterminated subpattern at position 0)",
        ),
        (
            ["a{2,1}"],
            "redactPatterns[0]: 'a{2,1}' is not a valid regular expression "
            "(min repeat greater than max repeat at position 2)",
        ),
        ([3], "redactPatterns[0]: expected a string, got int"),
        (["ok", None], "redactPatterns[1]: expected a string, got NoneType"),
        ("ACME-[0-9]+", "redactPatterns: expected a list of strings, got str"),
    ],
)
def test_invalid_user_patterns_are_rejected_with_their_index(
    patterns: list[object], error: str
) -> None:
    with pytest.raises(InvalidInputError) as raised:
        Redactor(patterns)  # type: ignore[arg-type]
    assert str(raised.value) == error


def test_builtin_rules_compile_on_the_first_redaction_and_user_patterns_at_once() -> None:
    """Importing redaction (every config load does) compiles none of the built-in rules; a
    bad user pattern is still refused when the redactor is made, before any redaction."""
    code = (
        "from activememory import _redaction as r\n"
        "assert r._builtin_rules.cache_info().currsize == 0\n"
        "custom = r.Redactor(['ACME-[0-9]{6}'])\n"
        "assert r._builtin_rules.cache_info().currsize == 0\n"
        "try:\n"
        "    r.Redactor(['('])\n"
        "except r.InvalidInputError:\n"
        "    pass\n"
        "else:\n"
        "    raise AssertionError('accepted')\n"
        "assert custom.redact('ACME-123456 sk-abc123DEF456ghi789JKL012mno') == '*** sk-a…2mno'\n"
        "assert r._builtin_rules.cache_info().currsize == 1\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


PROSE = (
    "The skeleton crew met the task-force at noon; the risk-adjusted-returns-analysis-framework "
    "was approved. The key is under the mat, and the primary key: id. Password reset link sent "
    "to alice@example.com, see https://example.com/help?topic=login#reset or "
    "http://docs.example.org:8080/a/b. Commit 9fceb02d0ae598e95dc970b74767f19372d61af8 fixed it "
    "-- as always -- at 10:45, ratio 3:2. The bearer of bad news said: tokens are cheap, "
    "secrets are not, and passwords: never reuse them. Bearer bonds, the monkey: 3, a turkey, "
    "a key-value store, x == y, and --verbose output. The token: a unit of text."
)


def test_ordinary_prose_is_left_alone() -> None:
    assert redact(PROSE) == PROSE


ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
URLSAFE = ALNUM + "_-"


def chars(alphabet: str, min_size: int = 24, max_size: int = 48) -> st.SearchStrategy[str]:
    """A secret-like run that starts with a letter or digit."""
    return st.builds(
        str.__add__, st.sampled_from(ALNUM), st.text(alphabet, min_size=min_size, max_size=max_size)
    )


def whole(prefix: str, alphabet: str, min_size: int = 30) -> st.SearchStrategy[tuple[str, str]]:
    return chars(alphabet, min_size=min_size).map(lambda body: (prefix + body,) * 2)


def around(
    template: st.SearchStrategy[str], alphabet: str = URLSAFE
) -> st.SearchStrategy[tuple[str, str]]:
    """(snippet, secret): the secret put into a template with one `{}`."""
    return st.tuples(template, chars(alphabet)).map(lambda ts: (ts[0].replace("{}", ts[1]), ts[1]))


STRONG_NAMES = ["API_KEY", "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "password", "clientSecret"]
SECRETS: dict[str, st.SearchStrategy[tuple[str, str]]] = {
    "sk": whole("sk-", URLSAFE),
    "sk-proj": whole("sk-proj-", URLSAFE),
    "sk-ant": whole("sk-ant-api03-", URLSAFE),
    "github": st.sampled_from("pousr").flatmap(lambda c: whole(f"gh{c}_", ALNUM)),
    "github_pat": whole("github_pat_", ALNUM + "_"),
    "slack": st.sampled_from("bpars").flatmap(lambda c: whole(f"xox{c}-", ALNUM + "-")),
    "google": whole("AIza", URLSAFE),
    "npm": whole("npm_", ALNUM),
    "groq": whole("gsk_", ALNUM),
    "bearer": around(st.just("Bearer {}")),
    "authorization": around(st.just("Authorization: Bearer {}")),
    "jwt": st.tuples(chars(URLSAFE), chars(URLSAFE), chars(URLSAFE)).map(
        lambda p: ("eyJ{}.eyJ{}.{}".format(*p),) * 2
    ),
    "assignment": around(
        st.tuples(
            st.sampled_from(STRONG_NAMES),
            st.sampled_from(["=", ": ", " = "]),
            st.sampled_from("\"'"),
        ).map(lambda t: f"{t[0]}{t[1]}{t[2]}{{}}{t[2]}")
        | st.sampled_from(["KEY={}", "TOKEN={}", "export TOKEN='{}'"]),
        URLSAFE + "./+=!@#$%",
    ),
    "json": around(
        st.sampled_from(
            ["password", "api_key", "apiKey", "accessToken", "client_secret", "token", "secret"]
        ).map(lambda key: f'{{"{key}": "{{}}"}}'),
        URLSAFE + " ./+=:",
    ),
    "cli": around(
        st.tuples(
            st.sampled_from(["--password", "--token", "--api-key", "--client-secret"]),
            st.sampled_from([" ", "="]),
        ).map(lambda t: f"{t[0]}{t[1]}{{}}")
    ),
    "url": around(st.sampled_from(["https://bob:{}@db.example.com/x", "redis://:{}@cache:6379"])),
    "pem": st.lists(chars(ALNUM + "+/", 16, 64), min_size=1, max_size=4)
    .map("\n".join)
    .map(
        lambda body: (
            f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----",
            body,
        )
    ),
}


@pytest.mark.parametrize("kind", list(SECRETS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), before=st.text(max_size=30), after=st.text(max_size=30))
def test_the_body_of_a_secret_never_gets_through(
    kind: str, data: st.DataObject, before: str, after: str
) -> None:
    snippet, secret = data.draw(SECRETS[kind])
    body = secret[2 * KEPT_CHARS : -KEPT_CHARS]
    assume(body not in before and body not in after)
    assert body not in redact(f"{before} {snippet} {after}")


SOME_SECRET = st.one_of(*SECRETS.values()).map(lambda pair: pair[0])


@settings(max_examples=300, deadline=None)
@given(st.text() | st.lists(st.text(max_size=12) | SOME_SECRET, max_size=6).map("".join))
def test_redaction_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once
