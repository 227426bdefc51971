"""Change one value in a hand-written JSON5 document, keeping every other byte as it was.

`set_value` finds the value at a path of object keys with a small position-tracking
scanner (strings with escapes and line continuations, ``//`` and ``/* */`` comments,
identifiers, numbers, punctuation) and splices new text into the original: it replaces
just the value's span, or inserts the missing keys as one nested object literal into the
deepest object that exists. Comments, trailing commas, quoting and indentation elsewhere
are left alone. The document is validated with the ``json5`` package first, and the
result is parsed again and compared with the expected mapping before it is returned, so
a bug here raises instead of producing a config file that means something else.

`write_atomically` replaces a file through a temporary sibling, fsync and ``os.replace``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import secrets
import stat
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import json5

__all__ = ["set_value", "write_atomically"]

Scalar = bool | int | float | str | None

_LINE_TERMINATORS = "\n\r\u2028\u2029"
_WHITESPACE = " \t\v\f\u00a0\ufeff" + _LINE_TERMINATORS
_PUNCTUATION = "{}[]:,"
_ID_START_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl"})
_ID_PART_CATEGORIES = _ID_START_CATEGORIES | {"Mn", "Mc", "Nd", "Pc"}
_NUMBER = re.compile(
    r"[+-]?(?:Infinity|NaN|0[xX][0-9A-Fa-f]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
)
_HEX = re.compile(r"[0-9A-Fa-f]+")
_ESCAPE_EXTRA = re.compile("[\ud800-\udfff\u2028\u2029]")
_SIMPLE_ESCAPES = {
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "'": "'",
    '"': '"',
    "\\": "\\",
}


# --- scanner ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # one of "{}[]:," or "string", "ident", "number"
    start: int
    end: int
    value: str = ""  # decoded text of a string or identifier


def _is_whitespace(ch: str) -> bool:
    return ch in _WHITESPACE or unicodedata.category(ch) == "Zs"


def _is_id_start(ch: str) -> bool:
    return (
        ch in "$_"
        or ("a" <= ch <= "z")
        or ("A" <= ch <= "Z")
        or (ch >= "\x80" and unicodedata.category(ch) in _ID_START_CATEGORIES)
    )


def _is_id_part(ch: str) -> bool:
    return (
        _is_id_start(ch)
        or "0" <= ch <= "9"
        or ch in "\u200c\u200d"
        or (ch >= "\x80" and unicodedata.category(ch) in _ID_PART_CATEGORIES)
    )


def _is_identifier_name(key: str) -> bool:
    """Whether `key` can be written unquoted (an ES5 IdentifierName, as json5 reads it)."""
    return bool(key) and _is_id_start(key[0]) and all(_is_id_part(ch) for ch in key[1:])


class _Scanner:
    """Splits a JSON5 document into tokens with their offsets; skips whitespace and comments."""

    def __init__(self, text: str) -> None:
        self.text = text

    def error(self, pos: int, what: str) -> ValueError:
        line = self.text.count("\n", 0, pos) + 1
        column = pos - (self.text.rfind("\n", 0, pos) + 1) + 1
        return ValueError(f"{what} at line {line}, column {column}")

    def tokens(self) -> list[_Token]:
        text, i, n = self.text, 0, len(self.text)
        out: list[_Token] = []
        while i < n:
            ch = text[i]
            if _is_whitespace(ch):
                i += 1
            elif text.startswith("//", i):
                i = _line_comment_end(text, i)
            elif text.startswith("/*", i):
                end = text.find("*/", i + 2)
                if end < 0:
                    raise self.error(i, "unterminated comment")
                i = end + 2
            elif ch in _PUNCTUATION:
                out.append(_Token(ch, i, i + 1))
                i += 1
            elif ch in "'\"":
                token = self.string(i)
                out.append(token)
                i = token.end
            elif ch in "+-.0123456789":
                match = _NUMBER.match(text, i)
                if match is None:
                    raise self.error(i, f"unexpected {ch!r}")
                out.append(_Token("number", i, match.end()))
                i = match.end()
            elif ch == "\\" or _is_id_start(ch):
                token = self.identifier(i)
                out.append(token)
                i = token.end
            else:
                raise self.error(i, f"unexpected {ch!r}")
        return out

    def string(self, start: int) -> _Token:
        text, quote, i = self.text, self.text[start], start + 1
        parts: list[str] = []
        while i < len(text):
            ch = text[i]
            if ch == quote:
                return _Token("string", start, i + 1, "".join(parts))
            if ch == "\\":
                decoded, i = self.escape(i + 1)
                parts.append(decoded)
            else:
                parts.append(ch)
                i += 1
        raise self.error(start, "unterminated string")

    def escape(self, i: int) -> tuple[str, int]:
        """Decode the escape after a backslash at ``i - 1``; return (text, next offset)."""
        text = self.text
        if i >= len(text):
            raise self.error(i - 1, "unterminated string")
        ch = text[i]
        if ch in _LINE_TERMINATORS:  # line continuation
            return "", i + (2 if text.startswith("\r\n", i) else 1)
        if ch in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[ch], i + 1
        if ch == "0" and not ("0" <= text[i + 1 : i + 2] <= "9"):
            return "\0", i + 1
        if ch in "xu":
            width = 2 if ch == "x" else 4
            digits = text[i + 1 : i + 1 + width]
            if len(digits) != width or not _HEX.fullmatch(digits):
                raise self.error(i - 1, f"bad \\{ch} escape")
            return chr(int(digits, 16)), i + 1 + width
        if "0" <= ch <= "9":
            raise self.error(i - 1, "digit escape")
        return ch, i + 1

    def identifier(self, start: int) -> _Token:
        text, i = self.text, start
        parts: list[str] = []
        while i < len(text):
            ch = text[i]
            if ch == "\\":
                if not text.startswith("u", i + 1):
                    raise self.error(i, "bad escape in identifier")
                decoded, i = self.escape(i + 1)
                parts.append(decoded)
            elif _is_id_part(ch) if i > start else _is_id_start(ch):
                parts.append(ch)
                i += 1
            else:
                break
        return _Token("ident", start, i, "".join(parts))


def _line_comment_end(text: str, i: int) -> int:
    """Offset of the line terminator ending the ``//`` comment at `i` (or the text's end)."""
    ends = [p for p in (text.find(t, i) for t in _LINE_TERMINATORS) if p >= 0]
    return min(ends, default=len(text))


# --- structure --------------------------------------------------------------------------


@dataclass(slots=True)
class _Member:
    key: str
    key_token: _Token
    value: _Node


@dataclass(slots=True)
class _Node:
    first: _Token  # "{" for an object, "[" for an array, else the scalar's token
    start: int
    end: int = 0  # exclusive
    members: list[_Member] = field(default_factory=list)

    @property
    def is_object(self) -> bool:
        return self.first.kind == "{"

    def describe(self) -> str:
        kind = self.first.kind
        if kind == "[":
            return "an array"
        if kind == "string":
            return "a string"
        if kind == "ident" and self.first.value in ("true", "false"):
            return "a boolean"
        if kind == "ident" and self.first.value == "null":
            return "null"
        return "a number"

    def find(self, key: str) -> _Member | None:
        """The member with this decoded key; the last one wins, as in json5.loads."""
        for member in reversed(self.members):
            if member.key == key:
                return member
        return None


class _Parser:
    """Builds the span tree of a document that json5 has already accepted."""

    def __init__(self, scanner: _Scanner) -> None:
        self.scanner = scanner
        self.tokens = scanner.tokens()
        self.i = 0

    def parse(self) -> _Node:
        if not self.tokens:
            raise ValueError("the document is empty")
        node = self.value()
        if self.i != len(self.tokens):
            raise self.scanner.error(self.tokens[self.i].start, "unexpected text after the value")
        return node

    def take(self, *kinds: str) -> _Token:
        if self.i >= len(self.tokens):
            raise self.scanner.error(len(self.scanner.text), "unexpected end of document")
        token = self.tokens[self.i]
        if kinds and token.kind not in kinds:
            raise self.scanner.error(token.start, f"expected {' or '.join(kinds)}")
        self.i += 1
        return token

    def peek(self) -> str:
        return self.tokens[self.i].kind if self.i < len(self.tokens) else ""

    def value(self) -> _Node:
        token = self.take("{", "[", "string", "ident", "number")
        node = _Node(token, token.start, token.end)
        if token.kind == "{":
            while self.peek() != "}":
                key = self.take("string", "ident")
                self.take(":")
                node.members.append(_Member(key.value, key, self.value()))
                if self.peek() != "}":
                    self.take(",")
            node.end = self.take("}").end
        elif token.kind == "[":
            while self.peek() != "]":
                self.value()
                if self.peek() != "]":
                    self.take(",")
            node.end = self.take("]").end
        return node


# --- rendering --------------------------------------------------------------------------


def _format_string(text: str) -> str:
    """A double-quoted JSON string that json5 reads back as `text`.

    Characters outside ASCII are written as themselves: json5 does not join an escaped
    surrogate pair, so an astral character must not be escaped. Surrogates (which cannot
    be encoded) and the U+2028/U+2029 line separators are escaped.
    """
    return _ESCAPE_EXTRA.sub(lambda m: f"\\u{ord(m[0]):04x}", json.dumps(text, ensure_ascii=False))


def _format_key(key: str, quote_all: bool) -> str:
    if not quote_all and _is_identifier_name(key):
        return key
    return _format_string(key)


def _plain(value: Scalar) -> Scalar:
    """The value as its plain type (an IntEnum becomes an int, a str subclass a str)."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def _format_value(value: Scalar) -> str:
    if isinstance(value, str):
        return _format_string(value)
    if value is None or isinstance(value, bool | int | float):
        return json.dumps(value)  # NaN and ±Infinity come out as JSON5 literals
    raise TypeError(
        f"cannot write a {type(value).__name__} value; expected bool, int, float, str or None"
    )


def _display_path(path: Sequence[str]) -> str:
    """``plugins.entries["active-memory"].config`` style."""
    out = []
    for i, key in enumerate(path):
        if _is_identifier_name(key):
            out.append(key if i == 0 else "." + key)
        else:
            out.append(f"[{_format_string(key)}]")
    return "".join(out)


def _line_start(text: str, pos: int) -> int:
    return max(text.rfind("\n", 0, pos), text.rfind("\r", 0, pos)) + 1


def _indent_of_line(text: str, pos: int) -> str:
    start = end = _line_start(text, pos)
    while end < len(text) and text[end] in " \t":
        end += 1
    return text[start:end]


def _has_line_break(text: str, start: int, end: int) -> bool:
    return any(t in text[start:end] for t in _LINE_TERMINATORS)


def _newline(text: str) -> str:
    if "\r\n" in text:
        return "\r\n"
    if "\r" in text and "\n" not in text:
        return "\r"
    return "\n"


def _end_of_open_line(text: str, after_brace: int) -> int:
    """Where a new member line goes: after the ``{`` and anything that shares its line.

    That is the line break ending the ``{`` line when only whitespace and comments follow
    the brace there (so a ``{ // note`` keeps its note), else right after the brace.
    """
    i = after_brace
    while i < len(text):
        ch = text[i]
        if ch in _LINE_TERMINATORS:
            return i
        if _is_whitespace(ch):
            i += 1
        elif text.startswith("//", i):
            return _line_comment_end(text, i)
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2) + 2
            if _has_line_break(text, i, end):
                break
            i = end
        else:
            break
    return after_brace


def _indent_unit(text: str, ancestors: Sequence[_Node]) -> str:
    """The document's indentation step, from the nearest multi-line ancestor; else 2 spaces."""
    for node in reversed(ancestors):
        if not node.members:
            continue
        key_start = node.members[0].key_token.start
        if not _has_line_break(text, node.start, key_start):
            continue
        outer, inner = _indent_of_line(text, node.start), _indent_of_line(text, key_start)
        if len(inner) > len(outer) and inner.startswith(outer):
            return inner[len(outer) :]
    return "  "


def _insert(text: str, ancestors: Sequence[_Node], member: str) -> str:
    """Insert the member text as the first member of the last node in `ancestors`."""
    node = ancestors[-1]
    brace, close = node.start, node.end - 1
    nl = _newline(text)
    if not node.members:
        indent = _indent_of_line(text, brace)
        inner = indent + _indent_unit(text, ancestors)
        gap = text[brace + 1 : close]
        if all(_is_whitespace(ch) for ch in gap):
            return f"{text[: brace + 1]}{nl}{inner}{member}{nl}{indent}{text[close:]}"
        at = _end_of_open_line(text, brace + 1)
        return f"{text[:at]}{nl}{inner}{member}{text[at:]}"
    first_key = node.members[0].key_token.start
    if _has_line_break(text, brace, first_key):
        at = _end_of_open_line(text, brace + 1)
        inner = _indent_of_line(text, first_key)
        return f"{text[:at]}{nl}{inner}{member},{text[at:]}"
    # The object is written inline ({ a: 1, b: 2 }): keep it on its line.
    at = brace + 1
    if _is_whitespace(text[at]):
        return f"{text[:at]} {member},{text[at:]}"
    return f"{text[:at]}{member}, {text[at:]}"


# --- public API -------------------------------------------------------------------------


def set_value(text: str, path: Sequence[str], value: Scalar) -> str:
    """Return `text` with the value at `path` (a sequence of object keys) set to `value`.

    If the last key exists, only its value's span is replaced. Otherwise the missing keys
    are inserted as one nested literal (``config: { enabled: false }``) on a new first line
    of the deepest existing object, indented like its members (or one step deeper than the
    object's line), with a comma when the object has other members; an object written on
    one line gets the new member inline instead. Keys are written bare when they are
    identifier names, else double-quoted (always double-quoted when every key in the
    document is, so a plain JSON file stays JSON); values are written as JSON. Keys in
    the document match by their decoded value; with duplicate keys the last one counts,
    as in ``json5.loads``.

    Raises ValueError when the document is empty, cannot be parsed (with json5's message),
    has no object at the top level, or holds something other than an object on the path.
    Raises TypeError for a value that is not bool, int, float, str or None.
    """
    if isinstance(path, str):
        raise TypeError("the path must be a sequence of keys, not a string")
    keys = list(path)
    if not keys:
        raise ValueError("the path is empty")
    if not all(isinstance(key, str) for key in keys):
        raise TypeError(f"the path's keys must be strings: {keys!r}")
    value = _plain(value)
    new_value = _format_value(value)
    if not text.strip(_WHITESPACE):
        raise ValueError("the document is empty")
    try:
        original = json5.loads(text)
    except ValueError as exc:
        raise ValueError(f"the document is not valid JSON5: {exc}") from exc
    except RecursionError:  # json5's parser recurses deeply: ~50 levels of nesting at most
        raise ValueError("the document is nested too deeply to parse") from None
    if not isinstance(original, dict):
        raise ValueError(
            f"the top level of the document is {_describe_python(original)}, not an object"
        )
    root = _Parser(_Scanner(text)).parse()
    if not root.is_object:  # json5 said it was; the scanner disagrees
        raise RuntimeError("internal error: the scanner did not find the top-level object")

    ancestors = [root]
    result = None
    for depth, key in enumerate(keys):
        node = ancestors[-1]
        member = node.find(key)
        if member is None:
            quote_all = _all_keys_double_quoted(text, root)
            literal = new_value
            for missing in reversed(keys[depth + 1 :]):
                literal = f"{{ {_format_key(missing, quote_all)}: {literal} }}"
            result = _insert(text, ancestors, f"{_format_key(key, quote_all)}: {literal}")
            break
        if depth == len(keys) - 1:
            span = member.value
            result = text[: span.start] + new_value + text[span.end :]
            break
        if not member.value.is_object:
            raise ValueError(
                f"cannot set {_display_path(keys)}: {_display_path(keys[: depth + 1])} "
                f"is {member.value.describe()}, not an object"
            )
        ancestors.append(member.value)
    assert result is not None
    _check(result, original, keys, value)
    return result


def _all_keys_double_quoted(text: str, root: _Node) -> bool:
    """Whether the document looks like plain JSON: it has keys, all of them double-quoted."""
    keys: list[_Token] = []
    stack = [root]
    while stack:
        node = stack.pop()
        for member in node.members:
            keys.append(member.key_token)
            stack.append(member.value)
    return bool(keys) and all(text[t.start] == '"' for t in keys)


def _describe_python(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _same(a: object, b: object) -> bool:
    """Structural equality that tells True from 1 and takes NaN as equal to NaN."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _check(result: str, original: dict[str, Any], keys: Sequence[str], value: Scalar) -> None:
    """Parse the edited text again; it must be the original mapping with the value set."""
    expected = copy.deepcopy(original)
    target = expected
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value
    try:
        reparsed = json5.loads(result)
    except ValueError as exc:
        raise RuntimeError(f"internal error: the edited document does not parse: {exc}") from exc
    if not _same(reparsed, expected):
        raise RuntimeError("internal error: the edited document does not hold the expected data")


def write_atomically(path: Path, text: str) -> None:
    """Replace the file at `path` with `text` (UTF-8, newlines as given) all at once.

    The text goes to a temporary file in the same directory, is fsynced, gets the
    original file's permission bits (a new file gets 0o666 less the umask), and is moved
    over the original with ``os.replace``; then the directory is fsynced. A symlink is
    followed, so the file it points to is replaced and the link stays. On any failure the
    original is untouched and the temporary file is removed.
    """
    target = Path(os.path.realpath(path))
    data = text.encode("utf-8")
    try:
        mode: int | None = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = None
    # An existing file's contents never sit in a file more open than 0o600 (its mode may be
    # stricter than the umask allows); a new file is created with the usual umask'd mode.
    fd, temp = _create_temporary(target, 0o600 if mode is not None else 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            if mode is not None:
                os.chmod(temp, mode)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _fsync_directory(target.parent)


def _create_temporary(target: Path, mode: int) -> tuple[int, str]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(100):
        temp = str(target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp"))
        try:
            return os.open(temp, flags, mode), temp
        except FileExistsError:
            continue
    raise FileExistsError(f"could not create a temporary file next to {target}")


def _fsync_directory(directory: Path) -> None:
    if not hasattr(os, "O_DIRECTORY"):  # Windows cannot open a directory to fsync it
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
