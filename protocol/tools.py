"""The arguments of the built-in memory tools (docs/design.md §4.7), each declared once.

The recall model sends them as a tool call's JSON arguments; `MemoryCore.search`/`get` and
`recall_tool` read them with `msgspec.convert`, and `function_schema` turns the same Struct
into the `parameters` the OpenAI function-calling request declares. A Struct's docstring is
the tool's description the model reads.

Unknown arguments are rejected, not ignored: a stray `limit` meant as `maxResults` would
otherwise quietly run another search than asked, while the failure names the key and the
allowed ones, so the model can call again (the schema says `additionalProperties: false`).
"""

from __future__ import annotations

from typing import Annotated, Any, TypeAlias

import msgspec

from .records import RecordType
from .search import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    MAX_QUERY_CHARS,
    MatchMode,
    SearchMode,
)

DEFAULT_RESULTS = 6
MAX_RESULTS = 25
DEFAULT_GET_LINES = 40
MAX_GET_LINES = 200

# Read as "contains a non-space character" both as a JSON Schema pattern (a search) and by
# the grammar-constrained decoders of some servers (a full match).
_NOT_BLANK = r"^[\s\S]*\S[\s\S]*$"

Query: TypeAlias = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        max_length=MAX_QUERY_CHARS,
        pattern=_NOT_BLANK,
        description="What to look for",
        extra={"invalid": "is blank"},
    ),
]
MaxResults: TypeAlias = Annotated[
    int, msgspec.Meta(ge=1, le=MAX_RESULTS, description="How many results at most")
]


class MemorySearchArgs(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """Search the user's memory notes and, when allowed, the agent's other private
    conversations. Returns the best matching excerpts."""

    query: Query
    max_results: MaxResults = DEFAULT_RESULTS


class MemoryGetArgs(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """Read lines of a memory note, or one message of a conversation, by the path a
    memory_search result gave."""

    path: Annotated[str, msgspec.Meta(description="The path of a memory_search result")]
    from_: Annotated[int, msgspec.Meta(ge=1, description="The first line (1-based)")] = 1
    lines: Annotated[
        int, msgspec.Meta(ge=1, le=MAX_GET_LINES, description="How many lines at most")
    ] = DEFAULT_GET_LINES


class MemoryRecallArgs(
    msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"
):
    """Search the scoped memory records of the user (this conversation's first). Returns
    the best matching records with their linked context, as XML."""

    query: Query
    max_results: MaxResults = DEFAULT_RESULTS


TOOL_ARGUMENTS: dict[str, type[msgspec.Struct]] = {
    "memory_search": MemorySearchArgs,
    "memory_get": MemoryGetArgs,
    "memory_recall": MemoryRecallArgs,
}


# -- the tools of `activememory mcp` beyond the recall tools (docs/design.md §12.2) -------------
# Each is a thin call of the public API (`mem.sessions.search`, `mem.records.add`/`link`/
# `invalidate`), so its arguments keep that API's names: an error it raises names the
# argument as the model sent it. The caller and the record scope are never arguments: they
# come from the server's launch configuration.


class SessionsSearchArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Search the stored conversations this conversation may see (by default its own and
    those it spawned). Returns the best matching messages, best first."""

    query: Query
    limit: Annotated[
        int, msgspec.Meta(ge=1, le=MAX_LIMIT, description="How many results at most")
    ] = DEFAULT_LIMIT
    match: Annotated[
        MatchMode, msgspec.Meta(description="prefix: the last term also matches as a prefix")
    ] = "phrase"
    mode: Annotated[
        SearchMode, msgspec.Meta(description="hybrid: by meaning too, not only by words")
    ] = "text"
    session_key: Annotated[
        str | None, msgspec.Meta(description="Only this session (one that may be seen)")
    ] = None


_Id: TypeAlias = Annotated[str, msgspec.Meta(min_length=1, description="A record id")]


class RecordAddArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Remember something about the user of this conversation: store a memory record that
    memory_recall finds from now on. Returns the record's id."""

    content: Annotated[
        str,
        msgspec.Meta(
            min_length=1,
            pattern=_NOT_BLANK,
            description="What to remember",
            extra={"invalid": "is blank"},
        ),
    ]
    record_type: Annotated[RecordType, msgspec.Meta(description="What the record holds")] = (
        RecordType.MEMORY
    )
    metadata: Annotated[
        dict[str, Any] | None, msgspec.Meta(description="JSON data kept with the record")
    ] = None


class RecordLinkArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Link two records of this conversation's user: source -relation-> target (e.g.
    "about", "part_of", "supersedes"); memory_recall returns linked records together."""

    source_id: _Id
    target_id: _Id
    relation: Annotated[
        str, msgspec.Meta(min_length=1, description="A letter, then letters, digits, _ or -")
    ]


class RecordInvalidateArgs(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Mark a record of this conversation's user as no longer true, saying why;
    memory_recall stops returning it."""

    id: _Id
    reason: Annotated[str, msgspec.Meta(min_length=1, description="Why it is no longer true")]


def function_schema(args: type[msgspec.Struct]) -> dict[str, Any]:
    """`args` as an OpenAI function's `description` and `parameters` (a JSON schema).

    Every `$ref` is inlined: many OpenAI-compatible servers reject them.
    """
    schema = msgspec.json.schema(args)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:  # the field's own keys (its description) over the type's
                found = inline(defs[node["$ref"].rpartition("/")[2]])
                found.pop("title", None)
                return found | {k: inline(v) for k, v in node.items() if k != "$ref"}
            return {key: inline(value) for key, value in node.items()}
        return [inline(item) for item in node] if isinstance(node, list) else node

    parameters = inline(schema)
    parameters.pop("title", None)
    description = " ".join(parameters.pop("description", "").split())
    return {"description": description, "parameters": parameters}
