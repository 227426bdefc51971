"""Loading the configuration (docs/design.md §4.1): JSON5 files, `${ENV}` expansion, clear errors.

The schema is `protocol.config`: this module walks a mapping against the type information
of those Structs (`msgspec.inspect`), so keys, types, ranges and defaults are written down
once. The walk reports every problem in words a person reads (the key path, the value, what
is allowed) before `msgspec.convert` builds the Structs, so msgspec's own messages never
reach a user.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import typing
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import json5
import json5.parser
import msgspec
import msgspec.inspect as mi

from ._output import clip
from ._redaction import Redactor
from .protocol.config import (
    AgentModelChoice,
    AgentSettings,
    Binding,
    Config,
    ConfigFile,
)
from .protocol.errors import InvalidInputError
from .protocol.search import SearchSettings

__all__ = ["ConfigError", "ConfigWarning", "load_config"]

# `${NAME}` is replaced by the environment variable; `$${NAME}` is a literal `${NAME}`.
_ENV_REF = re.compile(r"\$(\$?)\{([A-Za-z_][A-Za-z0-9_]*)\}")
_SHOWN_CHARS = 60
_FILE_TYPE = mi.type_info(ConfigFile)


class ConfigError(InvalidInputError):
    """The configuration is invalid. Nothing was loaded, and nothing changed.

    `errors` lists every problem found, in document order, each naming the key path (e.g.
    `plugins.entries.active-memory.config.timeoutMs: 50 is below the minimum 250`); the
    message is those lines joined. `source` is the file, when there is one.
    """

    def __init__(self, errors: str | Iterable[str], *, source: str | None = None) -> None:
        self.errors: tuple[str, ...] = (errors,) if isinstance(errors, str) else tuple(errors)
        self.source = source
        super().__init__("\n".join(self.errors))

    def __reduce__(self) -> tuple[Any, ...]:
        # The default would rebuild from the joined message and lose the list.
        return (type(self), (self.errors,), {"source": self.source})


class ConfigWarning(UserWarning):
    """A configuration that loads but says something worth knowing (a deprecated key)."""


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | Config,
    *,
    env: Mapping[str, str] | None = None,
) -> Config:
    """Load and validate a configuration (docs/design.md §4.1).

    `source` is a JSON5 file path, a mapping of the same shape, or an `am.Config` (returned
    as it is). `${NAME}` in any string value is replaced by the environment variable `NAME`
    (from `env`, default `os.environ`, read now); `$${NAME}` stands for a literal `${NAME}`.
    Keys of other plugins and of the host pass through; keys activememory owns are checked
    strictly. A deprecated key issues one `ConfigWarning` (also kept in `Config.warnings`).

    Raises `ConfigError` listing every problem (unreadable file, JSON5 syntax with line and
    column, unknown keys, wrong types, out-of-range values, unset variables).

    Cancellation: not an async call; it reads the file synchronously, and nothing is left
    behind whether it returns or raises.
    """
    if isinstance(source, Config):
        return source
    if isinstance(source, Mapping):
        data: object = source
        name: str | None = None
    elif isinstance(source, str | os.PathLike):
        shown = os.fspath(source)  # errors name the file as the caller did
        name = os.path.abspath(shown)  # a later chdir must not lose the file to write back
        data = _read_json5(shown, name)
        if not isinstance(data, Mapping):
            raise ConfigError(
                f"{shown}: expected an object at the top level, got {_show(data)}", source=name
            )
    else:
        raise ConfigError(
            f"config: expected a file path, a mapping or an am.Config, got {type(source).__name__}"
        )

    walker = _Walker(os.environ if env is None else env)
    try:
        expanded = walker.walk(_FILE_TYPE, data, "")
    except RecursionError:
        raise ConfigError("config: nested too deeply", source=name) from None
    errors = list(walker.errors)
    patterns = _redact_patterns(expanded)
    if patterns is not None:
        try:
            Redactor(patterns)  # a pattern that does not compile is bad config
        except InvalidInputError as exc:
            errors.append(f"logging.{exc}")
    if errors:
        raise ConfigError(dict.fromkeys(errors), source=name)  # fromkeys: drop repeats, keep order
    try:
        shape = msgspec.convert(expanded, ConfigFile)
    except msgspec.ValidationError as exc:  # only if the walk missed a rule: still no traceback
        raise ConfigError(f"config: {exc}", source=name) from None

    for text in walker.warnings:
        warnings.warn(text, ConfigWarning, stacklevel=2)
    return _resolve(
        shape,
        source=name,
        raw=_plain(data),
        warnings=tuple(walker.warnings),
    )


def _read_json5(path: str, source: str) -> object:
    """The parsed file at `path` (`source` is its absolute form, for `ConfigError.source`)."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # -sig: tolerate a BOM
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot read the config file ({exc.strerror or exc})", source=source
        ) from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start} cannot be decoded)", source=source
        ) from None
    if not text.strip():
        raise ConfigError(
            f"{path}: invalid JSON5 at line 1, column 1: the file is empty", source=source
        )
    try:
        return json5.loads(text)
    except ValueError as exc:
        where = _where(_located(text) or str(exc), text)
        raise ConfigError(f"{path}: invalid JSON5{where}", source=source) from None
    except RecursionError:
        raise ConfigError(f"{path}: invalid JSON5: nested too deeply", source=source) from None


# json5's syntax errors: `<string>:3 Unexpected "}" at column 5` (or `end of input`).
_JSON5_SYNTAX = re.compile(r'<string>:(\d+) Unexpected (end of input|"(.)") at column (\d+)', re.S)


_Json5Parser: Any = json5.parser.Parser  # generated code without type hints


class _ErrorLocator(_Json5Parser):  # type: ignore[misc]
    """json5's own parser, used only to place an error: its identifier and whitespace rules
    read a character and then test its Unicode class, so a refused character was reported
    one place late (`{abc}` at the end, not at `}`). Here the test gives the character back
    before the rule fails; any rule that fails rewinds anyway, so only the place changes."""

    def _is_unicat(self, var: str, cat: str) -> bool:
        ok = bool(super()._is_unicat(var, cat))
        if not ok:
            self.pos -= 1
        return ok


def _located(text: str) -> str | None:
    """json5's error message for `text`, placed by `_ErrorLocator`; None if it finds none."""
    try:
        _, error, _ = _ErrorLocator(text, "<string>").parse(
            global_vars={"_strict": True, "_consume_trailing": True}
        )
    except Exception:  # another json5 release: fall back to the message json5.loads gave
        return None
    return error if isinstance(error, str) else None


# json5 stops where a misspelt keyword stops matching (`tru}` fails at the `}`): the word
# that holds that point is what to show.
_KEYWORDS = ("true", "false", "null", "Infinity", "NaN")
_WORD = re.compile(r"[A-Za-z0-9_$]*")


def _where(message: str, text: str) -> str:
    """json5's error as ` at line L, column C: unexpected "x"` (the character JSON-escaped,
    so a newline cannot split the error line); a misspelt keyword is shown whole, from its
    first character."""
    match = _JSON5_SYNTAX.fullmatch(message)
    if match is None:
        return f": {message}"
    line, what, char, column = match.groups()
    if char is not None:
        what = json.dumps(char, ensure_ascii=False)
        row = text.splitlines()[int(line) - 1] if text else ""
        at = int(column) - 1
        start = at
        while start > 0 and _WORD.fullmatch(row[start - 1]):
            start -= 1
        head = row[start:at]
        if head and any(k.startswith(head) for k in _KEYWORDS) and not _in_string(row[:start]):
            word = _WORD.match(row, start)
            assert word is not None  # it matches at least `head`
            what = json.dumps(word.group(), ensure_ascii=False)
            column = str(start + 1)
    return f" at line {line}, column {column}: unexpected {what}"


def _in_string(prefix: str) -> bool:
    """Whether a line that starts with `prefix` is inside a string after it (a JSON5 string
    cannot span lines unescaped, so the line alone decides)."""
    quote: str | None = None
    escaped = False
    for char in prefix:
        if escaped:
            escaped = False
        elif quote is not None and char == "\\":
            escaped = True
        elif char == quote:
            quote = None
        elif quote is None and char in "\"'":
            quote = char
    return quote is not None


def _redact_patterns(expanded: object) -> list[str] | None:
    """`logging.redactPatterns` when it is a list of strings (the walk judged its shape)."""
    logging = expanded.get("logging") if isinstance(expanded, Mapping) else None
    patterns = logging.get("redactPatterns") if isinstance(logging, Mapping) else None
    if isinstance(patterns, list) and all(isinstance(p, str) for p in patterns):
        return patterns
    return None


def _resolve(
    shape: ConfigFile,
    *,
    source: str | None,
    raw: Any,
    warnings: tuple[str, ...],
) -> Config:
    """The resolved view of a validated file shape."""
    agents: dict[str, AgentSettings] = {}
    for agent, entry in shape.agents.entries.items():
        model = entry.model.primary if isinstance(entry.model, AgentModelChoice) else entry.model
        agents[agent] = AgentSettings(
            model=model,
            workspace=entry.workspace,
            remember_across_conversations=entry.memory.search.remember_across_conversations,
        )
    plugin = shape.plugins.entries.active_memory
    return Config(
        active_memory=plugin.config,
        plugin_enabled=plugin.enabled,
        memory_slot=shape.plugins.slots.memory,
        agents=agents,
        dm_scope=shape.session.dm_scope,
        identity_links=dict(shape.session.identity_links),
        bindings=tuple(
            Binding(agent_id=b.agent_id, dm_scope=b.session.dm_scope) for b in shape.bindings
        ),
        providers=dict(shape.models.providers),
        search=SearchSettings(
            visibility=shape.tools.sessions.visibility,
            agent_to_agent=shape.tools.agent_to_agent.enabled,
            sandbox_visibility=shape.agents.defaults.sandbox.session_tools_visibility,
            redact_patterns=shape.logging.redact_patterns,
        ),
        memory_search=shape.agents.defaults.memory_search,
        storage=shape.storage,
        source=source,
        raw=raw,
        warnings=warnings,
    )


def _plain(value: object) -> Any:
    """A deep copy in JSON shapes (dicts and lists), so `raw` can be written back as JSON5."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _show(value: object) -> str:
    """A value as the file would spell it (JSON), cut to 60 characters."""
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):  # unhashable keys, cycles: fall back to Python's view
        text = repr(value)
    return clip(text, _SHOWN_CHARS)


@functools.cache
def _declared_literals(cls: type) -> dict[frozenset[object], tuple[object, ...]]:
    """The `Literal[...]` values in a Struct's annotations, in the order they are written.

    `msgspec.inspect` sorts literal values; an error lists them as the schema does.
    """
    found: dict[frozenset[object], tuple[object, ...]] = {}

    def visit(annotation: object) -> None:
        if typing.get_origin(annotation) is Literal:
            values = typing.get_args(annotation)
            found.setdefault(frozenset(values), values)
            return
        for arg in typing.get_args(annotation):
            visit(arg)

    for annotation in typing.get_type_hints(cls, include_extras=True).values():
        visit(annotation)
    return found


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _unwrap(t: mi.Type) -> tuple[mi.Type, dict[str, Any]]:
    """The type under any `Annotated[..., Meta(...)]` layers, and their merged `extra`."""
    extra: dict[str, Any] = {}
    while isinstance(t, mi.Metadata):
        extra = {**(t.extra or {}), **extra}  # the innermost layer wins
        t = t.type
    return t, extra


def _is_list(t: mi.Type) -> bool:
    return isinstance(t, mi.VarTupleType | mi.ListType | mi.SetType | mi.FrozenSetType)


def _kind_ok(t: mi.Type, value: object) -> bool:
    """Whether `value` has the JSON kind `t` takes (not yet whether its value is allowed)."""
    t, _ = _unwrap(t)
    if isinstance(t, mi.AnyType | mi.CustomType):
        return True
    if isinstance(t, mi.NoneType):
        return value is None
    if isinstance(t, mi.BoolType):
        return isinstance(value, bool)
    if isinstance(t, mi.IntType):  # bool is an int in Python, not in a config file
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(t, mi.FloatType):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if isinstance(t, mi.StrType):
        return isinstance(value, str)
    if isinstance(t, mi.LiteralType):
        return any(type(v) is type(value) and v == value for v in t.values)
    if isinstance(t, mi.EnumType):
        return any(type(m.value) is type(value) and m.value == value for m in t.cls)
    if isinstance(t, mi.StructType | mi.DictType):
        return isinstance(value, Mapping)
    if _is_list(t):
        return isinstance(value, list | tuple)
    if isinstance(t, mi.UnionType):
        return any(_kind_ok(member, value) for member in t.types)
    return False


def _describe(t: mi.Type) -> str:
    """What a value of type `t` is, in words: "an integer", "a list of strings"..."""
    t, _ = _unwrap(t)
    if isinstance(t, mi.BoolType):
        return "true or false"
    if isinstance(t, mi.IntType):
        return "an integer"
    if isinstance(t, mi.FloatType):
        return "a number"
    if isinstance(t, mi.StrType):
        return "a non-empty string" if (t.min_length or 0) > 0 else "a string"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(_show(v) for v in t.values)
    if isinstance(t, mi.EnumType):
        return "one of " + ", ".join(_show(m.value) for m in t.cls)
    if isinstance(t, mi.StructType | mi.DictType):
        return "an object"
    if isinstance(t, mi.VarTupleType | mi.ListType | mi.SetType | mi.FrozenSetType):
        return f"a list of {_plural(t.item_type)}"
    if isinstance(t, mi.NoneType):
        return "null"
    if isinstance(t, mi.UnionType):
        return " or ".join(_describe(m) for m in t.types if not isinstance(m, mi.NoneType))
    return "a value"


def _plural(t: mi.Type) -> str:
    t, _ = _unwrap(t)
    if isinstance(t, mi.StrType | mi.LiteralType):
        return "strings"
    if isinstance(t, mi.IntType):
        return "integers"
    if isinstance(t, mi.BoolType):
        return "booleans"
    if isinstance(t, mi.StructType | mi.DictType):
        return "objects"
    return "values"


def _literal_values(t: mi.LiteralType, owner: type | None) -> tuple[object, ...]:
    if owner is None:
        return tuple(t.values)
    return _declared_literals(owner).get(frozenset(t.values), tuple(t.values))


def _choices(t: mi.Type, owner: type | None) -> list[str] | None:
    """The allowed values of a closed choice (literals, maybe with true/false), else None.

    `owner` is the Struct whose field holds the choice, for the declared order of values.
    """
    t, _ = _unwrap(t)
    if isinstance(t, mi.LiteralType):
        return [_show(v) for v in _literal_values(t, owner)]
    if not isinstance(t, mi.UnionType):
        return None
    members = [_unwrap(m)[0] for m in t.types if not isinstance(_unwrap(m)[0], mi.NoneType)]
    if not any(isinstance(m, mi.LiteralType) for m in members):
        return None  # a plain bool says "expected true or false" instead
    shown: list[str] = []
    for member in members:
        if isinstance(member, mi.BoolType):
            shown += ["true", "false"]
        elif isinstance(member, mi.LiteralType):
            shown += [_show(v) for v in _literal_values(member, owner)]
        else:
            return None
    return shown


def problems(shape: type, value: object) -> list[str]:
    """What is wrong with `value` as a `shape` Struct, one line per problem in the loader's
    words (`maxResults: 0 is below the minimum 1`). Strings are taken as they are: no `${ENV}`."""
    walker = _Walker(None)
    walker.walk(mi.type_info(shape), value, "")
    return walker.errors


class _Walker:
    """One walk of a config mapping: expands `${ENV}` (unless `env` is None), collects errors
    in document order."""

    def __init__(self, env: Mapping[str, str] | None) -> None:
        self._env = env
        self.errors: list[str] = []
        self.warnings: list[str] = []
        self._owner: type | None = None  # the Struct whose fields are being walked

    def _error(self, path: str, text: str) -> None:
        self.errors.append(f"{path}: {text}" if path else text)

    def _expand(self, path: str, text: str) -> str:
        env = self._env
        if env is None:
            return text

        def replace(match: re.Match[str]) -> str:
            if match.group(1):
                return match.group(0)[1:]
            name = match.group(2)
            value = env.get(name)
            if value is None:
                self._error(path, f"environment variable {name} is not set")
                return match.group(0)
            return value

        return _ENV_REF.sub(replace, text)

    def walk(self, t: mi.Type, value: object, path: str) -> object:
        """Check `value` against `t`; return it with `${ENV}` expanded."""
        if isinstance(value, str):
            known = len(self.errors)
            value = self._expand(path, value)  # once, here: `$${X}` must not expand twice
            if len(self.errors) > known:  # an unset variable: its value is unknown, not wrong
                return value
        return self._check(t, value, path)

    def _check(self, t: mi.Type, value: object, path: str) -> object:
        t, extra = _unwrap(t)
        if "deprecated" in extra:
            self.warnings.append(f"{path} {extra['deprecated']}")
        if isinstance(t, mi.AnyType | mi.CustomType):
            # A string was expanded by walk(); expanding it again would undo `$${X}`.
            return value if isinstance(value, str) else self._pass_through(value, path)
        if isinstance(t, mi.UnionType):
            for member in t.types:
                if _kind_ok(member, value):
                    return self._check(member, value, path)
            self._wrong(t, value, path)
            return value
        if not _kind_ok(t, value):
            self._wrong(t, value, path)
            return value
        if isinstance(t, mi.IntType | mi.FloatType):
            self._check_number(t, value, path)
        elif isinstance(t, mi.StrType):
            self._check_str(t, extra, value, path)
        elif isinstance(t, mi.StructType):
            return self._check_struct(t, value, path)
        elif isinstance(t, mi.DictType):
            assert isinstance(value, Mapping)
            out = {}
            for key, item in value.items():
                if self._key_ok(key, path):
                    self._check(t.key_type, key, _join(path, key))  # keys are never expanded
                    out[key] = self.walk(t.value_type, item, _join(path, key))
            return out
        elif isinstance(t, mi.VarTupleType | mi.ListType | mi.SetType | mi.FrozenSetType):
            assert isinstance(value, list | tuple)
            return [self.walk(t.item_type, item, f"{path}[{i}]") for i, item in enumerate(value)]
        return value

    def _wrong(self, t: mi.Type, value: object, path: str) -> None:
        choices = _choices(t, self._owner)
        if choices is not None:
            self._error(path, f"{_show(value)} is not one of {', '.join(choices)}")
        else:
            self._error(path, f"expected {_describe(t)}, got {_show(value)}")

    def _check_number(self, t: mi.IntType | mi.FloatType, value: Any, path: str) -> None:
        if t.ge is not None and value < t.ge:
            self._error(path, f"{value} is below the minimum {t.ge}")
        elif t.gt is not None and value <= t.gt:
            self._error(path, f"{value} must be above {t.gt}")
        elif t.le is not None and value > t.le:
            self._error(path, f"{value} is above the maximum {t.le}")
        elif t.lt is not None and value >= t.lt:
            self._error(path, f"{value} must be below {t.lt}")

    def _check_str(self, t: mi.StrType, extra: dict[str, Any], value: Any, path: str) -> None:
        if t.min_length is not None and len(value) < t.min_length:
            self._error(path, f"expected {_describe(t)}, got {_show(value)}")
        elif t.max_length is not None and len(value) > t.max_length:
            self._error(path, f"{_show(value)} is longer than {t.max_length} characters")
        elif t.pattern is not None and not re.search(t.pattern, value):
            # The same test msgspec applies (search, not match): the patterns anchor themselves.
            invalid = extra.get("invalid", f"does not match the pattern {t.pattern}")
            self._error(path, f"{_show(value)} {invalid}")

    def _check_struct(self, t: mi.StructType, value: Any, path: str) -> dict[str, object]:
        fields = {field.encode_name: field for field in t.fields}
        out: dict[str, object] = {}
        outer, self._owner = self._owner, t.cls
        try:
            for key, item in value.items():
                if not self._key_ok(key, path):
                    continue
                field = fields.get(key)
                if field is not None:
                    out[key] = self.walk(field.type, item, _join(path, key))
                elif t.forbid_unknown_fields:
                    self._error(_join(path, key), _unknown_key(key, list(fields)))
                else:  # the host's key: not ours to judge, but `${ENV}` applies everywhere
                    out[key] = self._pass_through(item, _join(path, key))
        finally:
            self._owner = outer
        for name, field in fields.items():
            if field.required and name not in value:
                self._error(path, f'missing required key "{name}"')
        return out

    def _key_ok(self, key: object, path: str) -> bool:
        # Only a Python mapping can have these; a JSON5 file's keys are always strings.
        if isinstance(key, str):
            return True
        self._error(path, f"keys must be strings, got {_show(key)}")
        return False

    def _pass_through(self, value: object, path: str) -> object:
        if isinstance(value, str):
            return self._expand(path, value)
        if isinstance(value, Mapping):
            return {
                key: self._pass_through(item, _join(path, key))
                for key, item in value.items()
                if self._key_ok(key, path)
            }
        if isinstance(value, list | tuple):
            return [self._pass_through(item, f"{path}[{i}]") for i, item in enumerate(value)]
        return value


def _unknown_key(key: str, valid: list[str]) -> str:
    lowered = {name.lower(): name for name in valid}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=1)
    if close:
        return f'unknown key; did you mean "{lowered[close[0]]}"?'
    return f"unknown key; expected one of {', '.join(valid)}"
