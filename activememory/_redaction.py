"""Redaction of secrets in text, before it is truncated or shown anywhere (docs/design.md §3).

What is redacted:

- API keys and tokens with a known prefix: OpenAI/Anthropic `sk-…` (`sk-proj-…`,
  `sk-ant-…`), GitHub `ghp_…`/`gho_…`/`ghu_…`/`ghs_…`/`ghr_…` and `github_pat_…`, Slack
  `xox?-…`, Google `AIza…`, npm `npm_…`, Groq `gsk_…`;
- bearer tokens (`Authorization: Bearer <tok>`, also `Basic`/`Token`; a bare `Bearer <tok>`
  needs a token of 8+ characters with a digit, or of 20+ characters) and JWTs (`eyJ….eyJ….sig`);
- the value of `KEY=…`-style assignments and of JSON/dict fields whose name ends in key, token,
  secret, password, passwd or pwd (`API_KEY=…`, `DB_PASSWORD: …`, `"apiKey": "…"`,
  `'client_secret': '…'`); the name, the separator and the quotes are kept. A bare `key` or
  `token` only counts with `=` (or as a quoted JSON key, for `token`), because "key: …" and
  "token: …" are common in prose and in non-secret YAML;
- the value of long CLI flags named like that (`--password hunter2`, `--api-key=…`);
- the password in a URL (`https://user:pass@host` keeps the user and the host);
- PEM private key blocks, replaced whole by a marker that keeps the key type; a block without
  its END line is redacted to the end of the text;
- whatever the user's extra patterns match (the whole match is the secret).

Masking rule (`mask_secret`): a secret shorter than `LONG_SECRET_MIN_CHARS` (18) characters
becomes `***`; a longer one keeps its first and last `KEPT_CHARS` (4) characters around an
ellipsis (`sk-abcdefghijklmnopqrstuvwxyz` -> `sk-a…wxyz`), so at most 8 characters of a secret
survive. The ellipsis is not a token character, so a masked token cannot match again, and a
value that already is a mask is left alone. `Redactor.redact` repeats its rules until the text
stops changing, which makes it idempotent: `redact(redact(x)) == redact(x)`.

Known limits: a flag named like a secret also takes the next word in prose (`use --token to
log in` -> `use --token *** log in`); a secret written right after another secret's name
(`token= API_KEY = "…"`) can lose the context that marks it; a URL password must be
percent-encoded to be found whole when it contains `@`, `/`, `?` or `#`.

Cancellation: pure, synchronous: nothing to cancel.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .protocol.errors import InvalidInputError

LONG_SECRET_MIN_CHARS = 18
"""Secrets at least this long keep a few characters at each end; shorter ones become `***`."""

KEPT_CHARS = 4
"""How many leading and trailing characters a long secret keeps."""

_SHORT_MASK = "***"
_ELLIPSIS = "…"

# Each pass applies every rule once; a pass that changes nothing ends `redact`. Two passes are
# the rule (the second confirms); the bound only guards against a pathological user pattern.
_MAX_PASSES = 8


def mask_secret(secret: str) -> str:
    """`***` for a secret shorter than 18 characters, else its first 4 and last 4 around `…`.

    An empty value, or one that already is a mask, is returned unchanged.
    """
    if _is_masked(secret):
        return secret
    if len(secret) < LONG_SECRET_MIN_CHARS:
        return _SHORT_MASK
    return f"{secret[:KEPT_CHARS]}{_ELLIPSIS}{secret[-KEPT_CHARS:]}"


def _is_masked(value: str) -> bool:
    # "" and "***"-like values have nothing left to hide; "abcd…wxyz" is a long-secret mask.
    return not value.strip("*") or (
        len(value) == 2 * KEPT_CHARS + 1 and value[KEPT_CHARS] == _ELLIPSIS
    )


def _mask_whole(match: re.Match[str]) -> str:
    return mask_secret(match.group())


def _mask_secret_group(match: re.Match[str]) -> str:
    """Mask the `secret` group of the match and keep the rest (a name, quotes, a URL...)."""
    start, end = match.span("secret")
    offset = match.start()
    whole = match.group()
    return (
        whole[: start - offset]
        + mask_secret(whole[start - offset : end - offset])
        + whole[end - offset :]
    )


def _pem_marker(match: re.Match[str]) -> str:
    kind = f"{match.group('kind')}PRIVATE KEY{match.group('block') or ''}"
    return f"-----BEGIN {kind}-----{_SHORT_MASK}-----END {kind}-----"


@dataclass(frozen=True, slots=True)
class _Rule:
    """One secret format: its regex, how a match is masked, and where it can be.

    `re` finds a regex that starts with a literal with a fast scan, and tries any other one at
    every position, which is ten times slower on prose. So rules start with a literal, or give
    `starts(text)`: every position where a match can start, ascending, found by a cheap scan.
    A rule with a `needle` (a character every match contains) is skipped when the text lacks it.
    """

    pattern: re.Pattern[str]
    mask: Callable[[re.Match[str]], str]
    starts: Callable[[str], list[int]] | None = None
    needle: str = ""

    def apply(self, text: str) -> str:
        if self.needle not in text:
            return text
        if self.starts is None:
            return self.pattern.sub(self.mask, text)
        pieces: list[str] = []
        done = 0
        for start in self.starts(text):
            match = self.pattern.match(text, start) if start >= done else None
            if match is not None:
                pieces += (text[done:start], self.mask(match))
                done = match.end()
        return "".join((*pieces, text[done:])) if pieces else text


def _at_word_start(literal: str) -> str:
    """`literal` not preceded by a letter or digit.

    The check is a lookbehind placed after the literal, so the regex still starts with a
    literal, which `re` finds with a fast scan instead of trying every position.
    """
    escaped = re.escape(literal)
    return rf"{escaped}(?<![A-Za-z0-9]{escaped})"


# A value: quoted (the secret is what is inside the quotes; backslash escapes allowed) or a run
# of characters up to a space, a quote or a list separator. A quote may itself be escaped
# (`\"`), as in JSON that was serialized into a JSON string. A run that ends in `=` or `:` may
# be the name of a nested assignment (`--password API_KEY="…"`): masking only the name would
# leave the secret after it without context, so the run takes that secret too.
_UNQUOTED = r"""[^\s"'`,;&<>][^\s"`,;&<>]*"""
_VALUE = rf"""
    (?P<quote>\\?["'`])?
    (?P<secret>(?(quote)
        (?:(?!(?P=quote))(?:\\.|[^\\\n]))*
      | (?>{_UNQUOTED})
        (?: (?<=[=:])[ \t]*(?:"[^"\n]*"|'[^'\n]*')  # API_KEY="…"
          | (?<=:)[ \t]+{_UNQUOTED}                  # API_KEY: …
        )?
    ))
    (?(quote)(?P=quote))
"""

# Names of secret-holding fields, case-insensitive in ASCII only (the Kelvin sign is no "k").
_KEYWORD = r"(?ai:key|token|secret|passw(?:or)?d|pwd)"
_STRONG_NAME = rf"""(?:
      [A-Za-z0-9_][A-Za-z0-9_.-]*[_.-]{_KEYWORD}                # api_key, DB_PASSWORD, x-api-key
    | [A-Za-z0-9]*[a-z0-9](?:Key|Token|Secret|Passw(?:or)?d|Pwd)  # apiKey, accessToken
    | [A-Z0-9]+(?:KEY|TOKEN|SECRET|PASSW(?:OR)?D|PWD)             # APIKEY
    | (?ai:(?:api|access|auth|client|private|refresh|session|secret|app|master|admin|root|db|user)
           (?:key|token|secret|passw(?:or)?d|pwd))              # apikey, authtoken
    | (?ai:secret|passw(?:or)?d|pwd)
)"""
# The rules' regexes are sources here and compile on first use (`_builtin_rules`): compiling
# them all at import made `import activememory` pay for redaction it may never run.
_ASSIGNMENT = rf"""
    (?<![A-Za-z0-9_.-])
    (?:
        {_STRONG_NAME} \\?["']? [ \t]* (?: := | => | =(?!=) | :(?!:) )
      | (?ai:key|token) [ \t]* (?: := | =(?![=>]) )
      | (?<=["']) (?ai:token) \\?["'] [ \t]* :(?!:)             # "token": "…"
    )
    [ \t]*
    {_VALUE}
"""

# Where an assignment can start: at the name before a separator. In the reversed text the
# separator comes first, so one regex that starts with a literal finds "separator, blanks,
# optional quote, name" with a fast scan; no lookbehind could, the blanks have no fixed width.
_REVERSED_NAME = r"""[ \t]*["']?\\?(?ai:yek|nekot|terces|drowssap|dwssap|dwp)[A-Za-z0-9_.-]*"""
_SEPARATORS = (":", "=")


def _assignment_starts(reversed_names: Sequence[re.Pattern[str]], text: str) -> list[int]:
    """`reversed_names`: `_REVERSED_NAME` after each of `_SEPARATORS`, compiled."""
    backwards = text[::-1] if ":" in text or "=" in text else ""
    ends = [
        match.end()
        for separator, reversed_name in zip(_SEPARATORS, reversed_names, strict=True)
        if separator in text
        for match in reversed_name.finditer(backwards)
    ]
    return sorted(len(text) - end for end in ends)


_CLI_FLAG = rf"""
    {_at_word_start("--")}
    (?:[A-Za-z0-9]+[-_])*(?:api)?{_KEYWORD}
    (?: = | [ \t]+ (?!-) )
    {_VALUE}
"""

_URL_PASSWORD = r"""://[^\s:/?#@"'<>]*:(?P<secret>[^\s/?#@"'<>]+)@"""

_AUTHORIZATION_HEADER = r"""
    uthorization(?<=\b[Aa]uthorization)  # "[Aa]uthorization", starting with a literal
    ["']?[ \t]*[:=][ \t]*["']?
    (?ai:bearer|basic|token)[ \t]+
    (?P<secret>[^\s"'`,;]+)
"""

# Outside an Authorization header "Bearer" also starts ordinary sentences, so the token must
# look like one: 8+ token characters with a digit, or 20+.
_TOKEN68 = r"[A-Za-z0-9._~+/=-]"
_BEARER = rf"""
    earer(?<=\b[Bb]earer)[ \t]+  # "[Bb]earer", starting with a literal
    (?P<secret>(?={_TOKEN68}*[0-9]|{_TOKEN68}{{20}}){_TOKEN68}{{8,}})
"""

_PEM_PRIVATE_KEY = r"""
    -----BEGIN[ ](?P<kind>[A-Z0-9 ]*?)PRIVATE[ ]KEY(?P<block>[ ]BLOCK)?-----
    (?s: .*?-----END[ ][A-Z0-9 ]*?PRIVATE[ ]KEY(?:[ ]BLOCK)?----- | .* )
"""

_JWT = _at_word_start("eyJ") + r"[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*"

# (prefix, body, needle): the bodies' minimum lengths are below the real ones, and long enough
# that no hyphenated word or identifier reaches them. "_" is rare in prose, and looking for it
# is much cheaper than scanning for "gh" (common in English) or a longer prefix.
_PREFIXED_TOKENS: tuple[tuple[str, str, str], ...] = (
    ("sk-", r"[A-Za-z0-9_-]{20,}", ""),  # OpenAI sk-, sk-proj-; Anthropic sk-ant-
    ("gh", r"[pousr]_[A-Za-z0-9]{30,}", "_"),  # GitHub ghp_, gho_, ghu_, ghs_, ghr_
    ("github_pat_", r"[A-Za-z0-9_]{30,}", "_"),  # GitHub fine-grained
    ("xox", r"[a-z]-[A-Za-z0-9-]{10,}", ""),  # Slack xoxb-, xoxp-, xoxa-, xoxr-, xoxs-
    ("AIza", r"[A-Za-z0-9_-]{30,}", ""),  # Google
    ("npm_", r"[A-Za-z0-9]{30,}", "_"),  # npm
    ("gsk_", r"[A-Za-z0-9]{30,}", "_"),  # Groq
)


# The order matters where formats nest. A PEM block is replaced whole before anything inside it
# is looked at. A rule whose value can be any word runs after the rules whose context that word
# could be (`auth_token: Bearer x`, `Authorization: Bearer --password x`): masking the word
# "Bearer" or "--password" first would leave the secret after it without its context. Context
# rules mask a token before the token rules would; those leave a value that is a mask alone.
@functools.cache
def _builtin_rules() -> tuple[_Rule, ...]:
    """The built-in rules, in order, compiled once on the first redaction."""
    verbose = functools.partial(re.compile, flags=re.VERBOSE)
    reversed_names = [re.compile(separator + _REVERSED_NAME) for separator in _SEPARATORS]
    return (
        _Rule(verbose(_PEM_PRIVATE_KEY), _pem_marker),
        _Rule(re.compile(_URL_PASSWORD), _mask_secret_group, needle="@"),
        _Rule(verbose(_BEARER), _mask_secret_group),
        _Rule(verbose(_CLI_FLAG), _mask_secret_group),
        _Rule(
            verbose(_ASSIGNMENT),
            _mask_secret_group,
            functools.partial(_assignment_starts, reversed_names),
        ),
        _Rule(verbose(_AUTHORIZATION_HEADER), _mask_secret_group),
        *(
            _Rule(re.compile(_at_word_start(prefix) + body), _mask_whole, needle=needle)
            for prefix, body, needle in _PREFIXED_TOKENS
        ),
        _Rule(re.compile(_JWT), _mask_whole),
    )


def _compile_extra_patterns(extra_patterns: Sequence[str]) -> tuple[_Rule, ...]:
    if isinstance(extra_patterns, str):
        raise InvalidInputError("redactPatterns: expected a list of strings, got str")
    rules = []
    for index, source in enumerate(extra_patterns):
        where = f"redactPatterns[{index}]"
        if not isinstance(source, str):
            raise InvalidInputError(f"{where}: expected a string, got {type(source).__name__}")
        try:
            pattern = re.compile(source)
        except re.error as error:
            raise InvalidInputError(
                f"{where}: {source!r} is not a valid regular expression ({error})"
            ) from None
        rules.append(_Rule(pattern, _mask_whole))
    return tuple(rules)


class Redactor:
    """Replaces secrets in text by masks (see the module docstring for formats and the rule).

    `extra_patterns` are Python regular expressions from the user's `redactPatterns`; each
    whole match is masked like any secret. They are compiled here, once; an invalid one raises
    `InvalidInputError` naming its index. The built-in rules compile on the first `redact` of
    any redactor, once per process.
    """

    __slots__ = ("_extra",)

    def __init__(self, extra_patterns: Sequence[str] = ()) -> None:
        self._extra = _compile_extra_patterns(extra_patterns)

    def redact(self, text: str) -> str:
        """Return `text` with every secret masked; idempotent, and `text` itself if none."""
        for _ in range(_MAX_PASSES):
            redacted = self._redact_once(text)
            if redacted == text:
                return text
            text = redacted
        return text

    def traceback(self, exc: BaseException) -> str:
        """`exc`'s formatted traceback with every secret masked: what a server logs of a
        failure it does not show its client (docs/design.md §12)."""
        import traceback

        return self.redact("".join(traceback.format_exception(exc)))

    def _redact_once(self, text: str) -> str:
        for rules in (_builtin_rules(), self._extra):
            for rule in rules:
                text = rule.apply(text)
        return text


DEFAULT_REDACTOR = Redactor()
"""A `Redactor` with the built-in formats only."""


def redact(text: str) -> str:
    """`DEFAULT_REDACTOR.redact(text)`: `text` with every built-in secret format masked."""
    return DEFAULT_REDACTOR.redact(text)
