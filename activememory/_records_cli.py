"""`activememory records add|search|link|invalidate`: the scoped records store (docs/design.md
§5) without writing Python. `search` opens the store read-only, so it runs beside a bot;
the others write, so they need the store's writer (a stopped bot, or inside the bot)."""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from ._cli import add_store_arguments, with_memory
from .protocol.errors import InvalidInputError
from .protocol.record_results import RecordSearchResult, iso_timestamp
from .protocol.records import NOT_SET, Record, RecordType

if TYPE_CHECKING:
    from ._memory import Memory

T = TypeVar("T")
LAYERS = ("client", "thread", "store")
# The API's field names, as the command line spells them (errors name the argument).
FLAGS = {
    "user_id": "--user",
    "agent_id": "--agent",
    "thread_id": "--thread",
    "exact_user_match": "--exact-user",
    "exact_agent_match": "--exact-agent",
    "exact_thread_match": "--exact-thread",
    "include_invalid_results": "--valid-only",
    "num_hops": "--hops",
    "max_linked_results": "--max-linked",
    "record_type": "--type",
    "record_types": "--type",
    "metadata": "--metadata",
    "metadata_filter": "--where",
    "relation": "--relation",
    "reason": "--reason",
    "source_id": "SOURCE",
    "target_id": "TARGET",
    "content": "CONTENT",
    "query": "QUERY",
    "id": "ID",
}
_FIELD = re.compile(r"^(\w+)(?=[:\[ ])")


def add_records_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The `records` command and its subcommands."""
    records = commands.add_parser(
        "records", help="add, search, link and invalidate scoped memory records"
    )
    verbs = records.add_subparsers(required=True, metavar="VERB")

    add = verbs.add_parser("add", help="store a record; prints its id")
    add.add_argument("content")
    _scope_arguments(add, "its scope (default: not scoped in that dimension)")
    add.add_argument("--type", choices=[t.value for t in RecordType], default="memory")
    add.add_argument("--metadata", help="a JSON object")
    add.add_argument("--role", help="for message records: who said it")
    _common(add, _add)

    search = verbs.add_parser(
        "search", help="full-text search at a scope layer (read-only: runs beside a bot)"
    )
    search.add_argument("query")
    search.add_argument(
        "--layer",
        choices=LAYERS,
        default="client",
        help="client (default: --user required, exact), thread (the thread of --user, "
        "--agent, --thread), store (an omitted dimension is not filtered)",
    )
    _scope_arguments(search, "an id to search (default: the layer's)")
    for dim in ("user", "agent", "thread"):
        search.add_argument(
            f"--exact-{dim}",
            action=argparse.BooleanOptionalAction,
            help=f"only records of exactly this {dim} (--no-exact-{dim}: rank them higher)",
        )
    search.add_argument("--valid-only", action="store_true", help="leave out invalidated records")
    search.add_argument("--type", action="append", help="only these record types (repeat)")
    search.add_argument("--hops", type=int, default=0, help="attach linked memories, 0-5")
    search.add_argument("--max-linked", type=int, default=100)
    search.add_argument("--where", help="metadata filter: a JSON object of key: value")
    _common(search, _search)

    link = verbs.add_parser("link", help="store the relation SOURCE -RELATION-> TARGET")
    link.add_argument("source")
    link.add_argument("target")
    link.add_argument("--relation", required=True, help='e.g. "about", "supersedes"')
    _common(link, _link)

    invalidate = verbs.add_parser("invalidate", help="mark a record invalid, with a reason")
    invalidate.add_argument("id")
    invalidate.add_argument("--reason", required=True)
    _common(invalidate, _invalidate)


def _scope_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    for dim in ("user", "agent", "thread"):
        group = parser.add_mutually_exclusive_group()
        group.add_argument(f"--{dim}", dest=f"{dim}_id", help=f"{dim} id: {what}")
        group.add_argument(
            f"--no-{dim}",
            dest=f"{dim}_id",
            action="store_const",
            const=None,
            help=f"explicitly no {dim} (records not scoped by {dim})",
        )
        parser.set_defaults(**{f"{dim}_id": NOT_SET})


def _common(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int]) -> None:
    add_store_arguments(parser)
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(run=run)


def _run(args: argparse.Namespace, readonly: bool, fn: Callable[[Memory], Awaitable[T]]) -> T:
    """Run `fn` on the store; an error names the command-line argument, not the API's."""
    try:
        return with_memory(args, fn, readonly=readonly)
    except InvalidInputError as exc:
        text = _FIELD.sub(lambda m: FLAGS.get(m[1], m[1]), str(exc))
        text = text.replace("mem.records.store.search()", "--layer store")
        raise InvalidInputError(text) from None


def _json_object(flag: str, text: str | None) -> dict[str, Any] | None:
    if text is None:
        return None
    try:
        found = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInputError(f"{flag}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(found, dict):
        raise InvalidInputError(f"{flag}: expected a JSON object, got {type(found).__name__}")
    return found


def _unscoped(value: object) -> str | None:
    """An omitted dimension of a record or thread: not scoped (None)."""
    return value if isinstance(value, str) else None


def _add(args: argparse.Namespace) -> int:
    metadata = _json_object("--metadata", args.metadata)

    async def add(mem: Memory) -> Record | None:
        record_id = await mem.records.add(
            args.content,
            user_id=_unscoped(args.user_id),
            agent_id=_unscoped(args.agent_id),
            thread_id=_unscoped(args.thread_id),
            record_type=args.type,
            metadata=metadata,
            role=args.role,
        )
        return await mem.records.get(record_id)

    record = _run(args, False, add)
    assert record is not None
    print(msgspec.json.encode(record).decode() if args.json else record.id)
    return 0


def _search(args: argparse.Namespace) -> int:
    where = _json_object("--where", args.where)

    async def search(mem: Memory) -> list[RecordSearchResult]:
        scope = {"user_id": args.user_id, "agent_id": args.agent_id, "thread_id": args.thread_id}
        layer: Any = mem.records
        if args.layer == "store":
            layer = mem.records.store
        elif args.layer == "thread":  # the thread is the scope; the flags still apply
            layer = mem.records.thread(**{k: _unscoped(v) for k, v in scope.items()})
            scope = {}
        flags = {
            f"exact_{dim}_match": NOT_SET if value is None else value
            for dim, value in (
                ("user", args.exact_user),
                ("agent", args.exact_agent),
                ("thread", args.exact_thread),
            )
        }
        return await layer.search(  # type: ignore[no-any-return]
            args.query,
            **scope,
            **flags,
            include_invalid_results=False if args.valid_only else NOT_SET,
            num_hops=args.hops,
            max_linked_results=args.max_linked,
            record_types=args.type,
            metadata_filter=where,
        )

    results = _run(args, True, search)
    if args.json:
        print(json.dumps([_result_json(r) for r in results], indent=2))
        return 0
    for result in results:
        _print_result(result, "")
    if not results:
        print("no matches")
    return 0


def _result_json(result: RecordSearchResult) -> dict[str, Any]:
    return {
        "distance": result.distance,
        "record": msgspec.to_builtins(result.record),
        "linked": [
            {"relation": msgspec.to_builtins(rel), "result": _result_json(child)}
            for rel, child in result.linked_results
        ],
    }


def _print_result(result: RecordSearchResult, indent: str) -> None:
    r = result.record
    distance = "" if result.distance is None else f"{result.distance:.3f}  "
    scope = " ".join(
        f"{dim}={value}"
        for dim, value in (("user", r.user_id), ("agent", r.agent_id), ("thread", r.thread_id))
        if value is not None
    )
    status = "" if r.invalid_reason is None else f"  INVALID: {r.invalid_reason}"
    print(f"{indent}{distance}{r.id}  {r.record_type}  {scope or 'unscoped'}{status}")
    print(f"{indent}    {r.content}  ({iso_timestamp(r.timestamp)})")
    for rel, child in result.linked_results:
        arrow = f"-{rel.relation}->" if rel.source_id == r.id else f"<-{rel.relation}-"
        print(f"{indent}  {arrow}")
        _print_result(child, indent + "    ")


def _link(args: argparse.Namespace) -> int:
    relation = _run(
        args,
        False,
        lambda mem: mem.records.link(args.source, args.target, relation=args.relation),
    )
    if args.json:
        print(msgspec.json.encode(relation).decode())
    else:
        print(f"{relation.source_id} -{relation.relation}-> {relation.target_id}")
    return 0


def _invalidate(args: argparse.Namespace) -> int:
    async def invalidate(mem: Memory) -> Record | None:
        await mem.records.invalidate(args.id, reason=args.reason)
        return await mem.records.get(args.id)

    record = _run(args, False, invalidate)
    assert record is not None
    if args.json:
        print(msgspec.json.encode(record).decode())
    else:
        print(f"{record.id} invalid: {record.invalid_reason}")
    return 0
