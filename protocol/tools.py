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

from .search import MAX_QUERY_CHARS

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


def function_schema(args: type[msgspec.Struct]) -> dict[str, Any]:
    """`args` as an OpenAI function's `description` and `parameters` (a JSON schema).

    Every `$ref` is inlined: many OpenAI-compatible servers reject them.
    """
    schema = msgspec.json.schema(args)
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(defs[node["$ref"].rpartition("/")[2]])
            return {key: inline(value) for key, value in node.items()}
        return [inline(item) for item in node] if isinstance(node, list) else node

    parameters = inline(schema)
    parameters.pop("title", None)
    description = " ".join(parameters.pop("description", "").split())
    return {"description": description, "parameters": parameters}
