"""The JSON5 value editor: one value changes, every other byte of the hand-written file stays."""

from __future__ import annotations

import copy
import enum
import json
import math
import os
import random
import re
import stat
from pathlib import Path
from typing import Any

import json5
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from activememory import _json5_edit
from activememory._json5_edit import set_value, write_atomically

ENABLED = ("plugins", "entries", "active-memory", "config", "enabled")


def with_value(doc: dict[str, Any], path: tuple[str, ...], value: object) -> dict[str, Any]:
    expected = copy.deepcopy(doc)
    target = expected
    for key in path[:-1]:
        target = target.setdefault(key, {})
    target[path[-1]] = value
    return expected


def written(value: object) -> str:
    """How set_value writes a value: JSON, non-ASCII as is, but line separators escaped."""
    text = json.dumps(value, ensure_ascii=False)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def same(a: object, b: object) -> bool:
    """Equality that tells True from 1 (and NaN from nothing else)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        assert isinstance(b, list)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


# --- replacing an existing value --------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param("{enabled: true}", "{enabled: false}", id="identifier key"),
        pytest.param('{"enabled": true}', '{"enabled": false}', id="double-quoted key"),
        pytest.param("{'enabled': true}", "{'enabled': false}", id="single-quoted key"),
        pytest.param("{'en\\x61bled': true}", "{'en\\x61bled': false}", id="escaped key"),
        pytest.param("{en\\u0061bled: true}", "{en\\u0061bled: false}", id="escaped identifier"),
        pytest.param("{'ena\\\nbled': true}", "{'ena\\\nbled': false}", id="line continuation"),
        pytest.param(
            "{\n  enabled: true // on\n}", "{\n  enabled: false // on\n}", id="line comment after"
        ),
        pytest.param(
            "{enabled: true/* on */, b: 1}",
            "{enabled: false/* on */, b: 1}",
            id="block comment after",
        ),
        pytest.param("{a: 1, enabled: true}", "{a: 1, enabled: false}", id="last, no comma"),
        pytest.param(
            "{a: 1,\n  enabled: true,\n}", "{a: 1,\n  enabled: false,\n}", id="last, trailing comma"
        ),
        pytest.param("{enabled: {x: [1, {}]}, b: 2}", "{enabled: false, b: 2}", id="object value"),
        pytest.param("{enabled: 'yes'}", "{enabled: false}", id="string value"),
        pytest.param("{enabled: -Infinity}", "{enabled: false}", id="signed literal"),
        pytest.param("{enabled: 0x1F}", "{enabled: false}", id="hex value"),
        pytest.param("{enabled: .5e+3}", "{enabled: false}", id="leading dot"),
        pytest.param("{enabled: 5.}", "{enabled: false}", id="trailing dot"),
        pytest.param("{enabled: 1, enabled: 2}", "{enabled: 1, enabled: false}", id="last dup"),
    ],
)
def test_replaces_only_the_value(before: str, after: str) -> None:
    assert set_value(before, ("enabled",), False) == after


def test_replaces_deep_value_in_a_commented_document() -> None:
    before = """\
// Settings for the bot. Note: { "enabled": true } is an example, not a key.
{
  /* plugins: { entries: {} } */
  plugins: {
    entries: {
      'active-memory': {
        enabled: true,  // the plugin itself
        "config": {
          note: "config: { enabled: true } }}}",
          'enabled': true, // keep me
        },
      },
    },
  },
}
"""
    assert set_value(before, ENABLED, False) == before.replace(
        "'enabled': true, // keep me", "'enabled': false, // keep me"
    )


def test_keys_are_matched_by_their_decoded_value() -> None:
    before = "{'active\\u002dmemory': {x: 1}, \"active-memor\\\ny\": {x: 2}}"
    after = set_value(before, ("active-memory", "x"), 3)
    assert after == "{'active\\u002dmemory': {x: 1}, \"active-memor\\\ny\": {x: 3}}"


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (0, "0"),
        (-12, "-12"),
        (1.5, "1.5"),
        (1e100, "1e+100"),
        (math.inf, "Infinity"),
        (-math.inf, "-Infinity"),
        ('it\'s "quoted" \\ {}\n', '"it\'s \\"quoted\\" \\\\ {}\\n"'),
        ("é \U0001f600", '"é \U0001f600"'),
        ("\u2028\ud800", '"\\u2028\\ud800"'),
    ],
)
def test_values_are_written_as_json(value: object, written: str) -> None:
    assert set_value("{a: 0}", ("a",), value) == f"{{a: {written}}}"  # type: ignore[arg-type]


def test_nan_is_written_as_a_json5_literal() -> None:
    after = set_value("{a: 0}", ("a",), math.nan)
    assert after == "{a: NaN}"
    assert math.isnan(json5.loads(after)["a"])


def test_other_value_types_are_refused() -> None:
    with pytest.raises(TypeError, match="cannot write a list value"):
        set_value("{a: 0}", ("a",), [1])  # type: ignore[arg-type]


# --- inserting missing keys -------------------------------------------------------------


def test_inserts_into_an_empty_object() -> None:
    before = """\
{
  plugins: {
    entries: {
      "active-memory": {},
    },
  },
}
"""
    assert set_value(before, ENABLED, False) == before.replace(
        '"active-memory": {},',
        '"active-memory": {\n        config: { enabled: false }\n      },',
    )


def test_inserts_first_into_an_object_with_members() -> None:
    before = """\
{
  plugins: {
    entries: {
      "active-memory": {
        enabled: true, // the plugin
        "other": 1
      },
    },
  },
}
"""
    assert set_value(before, ENABLED, False) == before.replace(
        '"active-memory": {\n',
        '"active-memory": {\n        config: { enabled: false },\n',
    )


@pytest.mark.parametrize(
    ("entries", "inserted"),
    [
        pytest.param(
            '      "active-memory": { enabled: true },',
            '      "active-memory": { config: { enabled: false }, enabled: true },',
            id="1 level, inline object",
        ),
        pytest.param(
            '      "active-memory": {\n        enabled: true,\n      },',
            '      "active-memory": {\n        config: { enabled: false },\n'
            "        enabled: true,\n      },",
            id="1 level",
        ),
        pytest.param(
            "      other: {},",
            '      "active-memory": { config: { enabled: false } },\n      other: {},',
            id="2 levels",
        ),
    ],
)
def test_creates_missing_levels(entries: str, inserted: str) -> None:
    template = "{\n  plugins: {\n    entries: {\n%s\n    },\n  },\n}\n"
    assert set_value(template % entries, ENABLED, False) == template % inserted


def test_creates_three_missing_levels() -> None:
    before = "{\n  plugins: {\n    version: 2,\n  },\n}\n"
    assert set_value(before, ENABLED, False) == (
        "{\n  plugins: {\n"
        '    entries: { "active-memory": { config: { enabled: false } } },\n'
        "    version: 2,\n  },\n}\n"
    )


def test_creates_the_whole_path_in_an_empty_document_object() -> None:
    assert set_value("{}\n", ENABLED, False) == (
        '{\n  plugins: { entries: { "active-memory": { config: { enabled: false } } } }\n}\n'
    )


def test_insertion_keeps_a_comment_on_the_brace_line() -> None:
    before = "{\n  plugins: { // mine\n    other: 1,\n  },\n}"
    assert set_value(before, ("plugins", "x"), 1) == (
        "{\n  plugins: { // mine\n    x: 1,\n    other: 1,\n  },\n}"
    )


def test_insertion_into_an_empty_object_holding_a_comment() -> None:
    before = "{\n  plugins: { // nothing yet\n  },\n}"
    assert set_value(before, ("plugins", "x"), 1) == (
        "{\n  plugins: { // nothing yet\n    x: 1\n  },\n}"
    )


def test_insertion_follows_the_documents_indentation() -> None:
    tabs = "{\n\tplugins: {\n\t\tentries: {},\n\t},\n}"
    assert set_value(tabs, ("plugins", "entries", "x"), 1) == (
        "{\n\tplugins: {\n\t\tentries: {\n\t\t\tx: 1\n\t\t},\n\t},\n}"
    )
    four = "{\n    plugins: {}\n}"
    assert set_value(four, ("plugins", "x"), 1) == "{\n    plugins: {\n        x: 1\n    }\n}"


def test_insertion_keeps_crlf_line_endings() -> None:
    before = "{\r\n  plugins: {\r\n    a: 1,\r\n  },\r\n}\r\n"
    assert set_value(before, ("plugins", "x"), 1) == (
        "{\r\n  plugins: {\r\n    x: 1,\r\n    a: 1,\r\n  },\r\n}\r\n"
    )


def test_plain_json_documents_get_quoted_keys() -> None:
    before = '{\n  "plugins": {\n    "entries": {}\n  }\n}\n'
    assert set_value(before, ENABLED, False) == (
        '{\n  "plugins": {\n    "entries": {\n'
        '      "active-memory": { "config": { "enabled": false } }\n    }\n  }\n}\n'
    )
    assert json.loads(set_value(before, ENABLED, False))  # still JSON


def test_keys_that_are_not_identifiers_are_quoted() -> None:
    after = set_value("{a: 1}", ("$ok_1", "not ok", "0no", "", "é"), 2)
    assert after == '{$ok_1: { "not ok": { "0no": { "": { é: 2 } } } }, a: 1}'


def test_lookalikes_in_strings_and_comments_are_not_keys() -> None:
    before = """\
{
  // plugins: { entries: { "active-memory": { config: { enabled: true } } } }
  note: "plugins: { entries: {",
  'other': '} } config: { enabled: true',
  /* plugins: {
       entries: {} */
  plugins: { "entries": { /* { */ } },
}
"""
    after = set_value(before, ENABLED, False)
    assert after == before.replace(
        '{ "entries": { /* { */ } }',
        '{ "entries": {\n    "active-memory": { config: { enabled: false } } /* { */ } }',
    )
    assert json5.loads(after)["note"] == "plugins: { entries: {"


# --- errors -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "what"),
    [
        ("{plugins: 3}", "plugins is a number"),
        ("{plugins: {entries: [{}]}}", "plugins.entries is an array"),
        (
            "{plugins: {entries: {'active-memory': 'x'}}}",
            'plugins.entries["active-memory"] is a string',
        ),
        (
            "{plugins: {entries: {'active-memory': {config: true}}}}",
            'plugins.entries["active-memory"].config is a boolean',
        ),
        (
            "{plugins: {entries: {'active-memory': {config: null}}}}",
            'plugins.entries["active-memory"].config is null',
        ),
        (
            "{plugins: {entries: {'active-memory': {config: NaN}}}}",
            'plugins.entries["active-memory"].config is a number',
        ),
    ],
)
def test_a_non_object_on_the_path_is_an_error(doc: str, what: str) -> None:
    message = f'cannot set plugins.entries["active-memory"].config.enabled: {what}'
    with pytest.raises(ValueError, match=re.escape(message)):
        set_value(doc, ENABLED, False)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("", "the document is empty"),
        (" \n\t", "the document is empty"),
        ("[]", "the top level of the document is an array, not an object"),
        ("'x'", "the top level of the document is a string, not an object"),
        ("3", "the top level of the document is a number, not an object"),
        ("null", "the top level of the document is null, not an object"),
        ("{a:1,,}", 'the document is not valid JSON5: <string>:1 Unexpected "}" at column 7'),
        ("{a: 'x}", "the document is not valid JSON5: <string>:1 Unexpected end of input"),
        ("{a: 1} /* x", "the document is not valid JSON5: "),
    ],
)
def test_bad_documents_are_errors(doc: str, message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        set_value(doc, ("a",), 1)


def test_bad_paths_are_errors() -> None:
    with pytest.raises(ValueError, match="the path is empty"):
        set_value("{}", (), 1)
    with pytest.raises(TypeError, match="not a string"):
        set_value("{}", "plugins", 1)
    with pytest.raises(TypeError, match="keys must be strings"):
        set_value("{}", ("a", 1), 1)  # type: ignore[arg-type]


def test_too_deep_a_document_is_an_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        set_value("{a:" * 200 + "1" + "}" * 200, ("a",), 1)


def test_subclassed_values_are_written_as_their_plain_type() -> None:
    class Level(enum.IntEnum):
        HIGH = 3

    assert set_value("{a: 0}", ("a",), Level.HIGH) == "{a: 3}"


def test_an_edit_that_would_change_other_data_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_json5_edit, "_format_value", lambda value: "1")
    with pytest.raises(RuntimeError, match="internal error"):
        set_value("{a: 0}", ("a",), True)


# --- property: random documents in random styles ----------------------------------------

KEY_ALPHABET = "ab_$Z09 -.{}[]:,'\"\\/*\né\u2028\t"
keys = st.text(alphabet=KEY_ALPHABET, max_size=5)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, width=32),
    st.text(alphabet=KEY_ALPHABET, max_size=6),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(keys, inner, max_size=4)),
    max_leaves=10,
)
documents = st.dictionaries(keys, values, max_size=5)
new_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=4)
)

GAPS = [
    "",
    " ",
    "\n",
    "\n    ",
    "\t",
    "\r\n  ",
    "\u00a0",
    "\u2003",
    " /* { } \"a\": 1, 'b' // */ ",
    " // } { \"a\": 1, 'b' /*\n",
]
IDENTIFIER = re.compile(r"[A-Za-z_$é][A-Za-z0-9_$é]*")


class Renderer:
    """Writes a value as JSON5 in a random style, recording each member value's span."""

    def __init__(self, rnd: random.Random) -> None:
        self.rnd = rnd
        self.parts: list[str] = []
        self.pos = 0
        self.spans: dict[tuple[str, ...], tuple[int, int]] = {}

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def emit(self, text: str) -> None:
        self.parts.append(text)
        self.pos += len(text)

    def gap(self) -> None:
        self.emit(self.rnd.choice(GAPS))

    def document(self, doc: dict[str, Any]) -> None:
        self.gap()
        self.value(doc, ())
        self.gap()

    def value(self, value: object, path: tuple[str, ...]) -> None:
        start = self.pos
        if isinstance(value, dict):
            self.emit("{")
            for i, (key, item) in enumerate(value.items()):
                self.gap()
                self.key(key)
                self.gap()
                self.emit(":")
                self.gap()
                self.value(item, (*path, key))
                self.gap()
                if i < len(value) - 1 or self.rnd.random() < 0.5:
                    self.emit(",")
                    self.gap()
            self.emit("}")
        elif isinstance(value, list):
            self.emit("[")
            for item in value:
                self.gap()
                self.value(item, path)
                self.gap()
                self.emit(",")
            self.emit("]")
        elif isinstance(value, str):
            self.emit(self.string(value))
        elif isinstance(value, bool) or value is None:
            self.emit(json.dumps(value))
        elif isinstance(value, int):
            self.emit(self.rnd.choice([str(value), f"{value:+d}", hex(value)]))
        else:
            assert isinstance(value, float)
            text = json.dumps(value)
            if text.startswith("0."):
                text = self.rnd.choice([text, text[1:]])
            elif value.is_integer() and "e" not in text:
                text = self.rnd.choice([text, text.removesuffix("0")])
            self.emit(text)
        self.spans[path] = (start, self.pos)

    def key(self, key: str) -> None:
        if IDENTIFIER.fullmatch(key) and self.rnd.random() < 0.6:
            self.emit("".join(f"\\u{ord(c):04x}" if self.rnd.random() < 0.2 else c for c in key))
        else:
            self.emit(self.string(key))

    def string(self, text: str) -> str:
        quote = self.rnd.choice("'\"")
        out = [quote]
        for ch in text:
            if self.rnd.random() < 0.1:
                out.append("\\\n" if self.rnd.random() < 0.5 else "\\\r\n")  # continuation
            if ch in (quote, "\\") or (ch in "'\"" and self.rnd.random() < 0.5):
                out.append("\\" + ch)
            elif ch in "\n\r\u2028\u2029" or self.rnd.random() < 0.2:
                out.append(
                    f"\\x{ord(ch):02x}"
                    if ord(ch) < 256 and self.rnd.random() < 0.5
                    else f"\\u{ord(ch):04x}"
                )
            else:
                out.append(ch)
        out.append(quote)
        return "".join(out)


def pick_existing(data: st.DataObject, doc: dict[str, Any]) -> tuple[str, ...]:
    """A path to a member that exists, through objects only."""
    path: tuple[str, ...] = ()
    node = doc
    while True:
        key = data.draw(st.sampled_from(sorted(node)))
        path = (*path, key)
        child = node[key]
        if not (isinstance(child, dict) and child and data.draw(st.booleans())):
            return path
        node = child


@settings(max_examples=150, deadline=None)
@given(data=st.data(), doc=documents, value=new_values)
def test_replacing_changes_only_the_value_span(
    data: st.DataObject, doc: dict[str, Any], value: Any
) -> None:
    if not doc:
        doc = {"only": 1}
    renderer = Renderer(data.draw(st.randoms(use_true_random=False)))
    renderer.document(doc)
    text = renderer.text
    assert same(json5.loads(text), doc)  # the renderer writes what it was given
    path = pick_existing(data, doc)
    start, end = renderer.spans[path]
    after = set_value(text, path, value)
    assert after == text[:start] + written(value) + text[end:]
    assert same(json5.loads(after), with_value(doc, path, value))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), doc=documents, value=new_values)
def test_inserting_adds_only_the_new_members(
    data: st.DataObject, doc: dict[str, Any], value: Any
) -> None:
    renderer = Renderer(data.draw(st.randoms(use_true_random=False)))
    renderer.document(doc)
    text = renderer.text
    prefix = pick_existing(data, doc) if doc and data.draw(st.booleans()) else ()
    parent: Any = doc
    for key in prefix:
        parent = parent[key]
    if not isinstance(parent, dict):
        prefix, parent = (), doc
    first = data.draw(keys.filter(lambda k: k not in parent))
    path = (*prefix, first, *data.draw(st.lists(keys, max_size=2)))
    after = set_value(text, path, value)
    assert same(json5.loads(after), with_value(doc, path, value))
    # Outside the parent object's braces nothing moved; inside, at most whitespace went.
    common = 0
    while common < min(len(text), len(after)) and text[common] == after[common]:
        common += 1
    tail = 0
    while tail < min(len(text), len(after)) - common and text[-1 - tail] == after[-1 - tail]:
        tail += 1
    start, end = renderer.spans[prefix]
    assert start < common <= len(text) - tail < end
    assert text[common : len(text) - tail].strip(" \t\r\n\u00a0\u2003") == ""


# --- write_atomically -------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_write_atomically_replaces_the_file_and_keeps_its_mode(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "openclaw.json5"
    path.write_text("{a: 1}\n")
    path.chmod(mode)
    write_atomically(path, "{\r\n  a: 2, // é\r\n}\r\n")
    assert path.read_bytes() == "{\r\n  a: 2, // é\r\n}\r\n".encode()
    assert stat.S_IMODE(path.stat().st_mode) == mode
    assert os.listdir(tmp_path) == ["openclaw.json5"]


def test_write_atomically_creates_a_missing_file_with_the_umask(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        write_atomically(tmp_path / "new.json5", "{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "new.json5").read_text() == "{}"
    assert stat.S_IMODE((tmp_path / "new.json5").stat().st_mode) == 0o644


def test_write_atomically_follows_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "config.json5"
    target.write_text("{a: 1}")
    link = tmp_path / "config.json5"
    link.symlink_to(target)
    write_atomically(link, "{a: 2}")
    assert link.is_symlink()
    assert target.read_text() == "{a: 2}"
    assert sorted(os.listdir(tmp_path / "real")) == ["config.json5"]


def test_a_failed_write_leaves_the_original_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "openclaw.json5"
    path.write_text("{a: 1}\n")
    path.chmod(0o640)

    def fail(src: object, dst: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        write_atomically(path, "{a: 2}\n")
    assert path.read_text() == "{a: 1}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert os.listdir(tmp_path) == ["openclaw.json5"]


def test_text_that_cannot_be_encoded_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "openclaw.json5"
    path.write_text("{a: 1}\n")
    with pytest.raises(UnicodeEncodeError):
        write_atomically(path, "{a: '\ud800'}")
    assert path.read_text() == "{a: 1}\n"
    assert os.listdir(tmp_path) == ["openclaw.json5"]


def test_set_value_and_write_atomically_together(tmp_path: Path) -> None:
    path = tmp_path / "openclaw.json5"
    original = '{\n  // hand-written\n  plugins: { entries: { "active-memory": {} } },\n}\n'
    path.write_text(original)
    write_atomically(path, set_value(path.read_text(), ENABLED, False))
    assert json5.loads(path.read_text())["plugins"]["entries"]["active-memory"] == {
        "config": {"enabled": False}
    }
    assert path.read_text().startswith("{\n  // hand-written\n")
