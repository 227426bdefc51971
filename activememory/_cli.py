"""The `activememory` command line (SPEC §6). Human output by default, `--json` for programs."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.resources
import sys
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import msgspec
import trio

from ._importers import read_jsonl_transcript
from ._memory import Memory, open_memory
from .protocol.content import Message
from .protocol.errors import ActiveMemoryError
from .protocol.transcript import Event, IndexStats

SAMPLES = ("sample-alice.jsonl", "sample-team.jsonl")
T = TypeVar("T")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `activememory` / `python -m activememory`."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ActiveMemoryError as exc:
        print(f"activememory: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="activememory", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="import the bundled sample and show what is stored")
    demo.add_argument("--state-dir", type=Path, help="keep the state here (default: a temp dir)")
    demo.set_defaults(run=_demo)

    imp = commands.add_parser("import", help="import JSONL transcripts (stored unindexed)")
    imp.add_argument("paths", type=Path, nargs="+")
    imp.add_argument("--state-dir", type=Path, required=True)
    imp.add_argument("--session-key", help="session key for files without a header line")
    imp.add_argument("--no-rebuild", action="store_true", help="leave the sessions dirty")
    imp.add_argument("--json", action="store_true")
    imp.set_defaults(run=_import)

    history = commands.add_parser("history", help="print a session's active branch")
    history.add_argument("session_key")
    history.add_argument("--state-dir", type=Path, required=True)
    history.add_argument("--limit", type=int)
    history.add_argument("--json", action="store_true")
    history.set_defaults(run=_history)

    stats = commands.add_parser("stats", help="index statistics of every agent database")
    stats.add_argument("--state-dir", type=Path, required=True)
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(run=_stats)

    bench = commands.add_parser("bench", help="run a benchmark (indexing)")
    bench.add_argument("name", choices=["indexing"])
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=_bench)
    return parser


async def _import_files(
    mem: Memory, paths: Sequence[Path], session_key: str | None, *, rebuild: bool
) -> list[dict[str, object]]:
    done = []
    for path in paths:
        transcript = read_jsonl_transcript(path, session_key)
        count = await mem.sessions.import_transcript(
            transcript.session_key,
            transcript.entries,
            leaf_id=transcript.leaf_id,
            persistent=transcript.persistent,
            interactive=transcript.interactive,
        )
        done.append({"path": str(path), "session_key": transcript.session_key, "events": count})
    if rebuild:
        await mem.sessions.rebuild_index()
    return done


def _run_and_show(
    args: argparse.Namespace,
    fetch: Callable[[Memory], Awaitable[T]],
    show: Callable[[T], None],
) -> int:
    """Open the state dir, fetch a result, print it for a person or (`--json`) a program."""

    async def run() -> T:
        async with open_memory(args.state_dir) as mem:
            return await fetch(mem)

    result = trio.run(run)
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(result)).decode())
    else:
        show(result)
    return 0


def _import(args: argparse.Namespace) -> int:
    def show(done: list[dict[str, object]]) -> None:
        for item in done:
            print(
                f"imported {item['events']} events from {item['path']} into {item['session_key']}"
            )

    return _run_and_show(
        args,
        lambda mem: _import_files(mem, args.paths, args.session_key, rebuild=not args.no_rebuild),
        show,
    )


def _history(args: argparse.Namespace) -> int:
    return _run_and_show(
        args, lambda mem: mem.sessions.history(args.session_key, limit=args.limit), _print_history
    )


def _stats(args: argparse.Namespace) -> int:
    return _run_and_show(args, lambda mem: mem.sessions.stats(), _print_stats)


def _bench(args: argparse.Namespace) -> int:
    from .simulations import bench_indexing

    return bench_indexing.main(args.bench_args)


def _demo(args: argparse.Namespace) -> int:
    if args.state_dir is not None:
        return trio.run(_run_demo, args.state_dir)
    with tempfile.TemporaryDirectory(prefix="activememory-demo-") as tmp:
        return trio.run(_run_demo, Path(tmp))


async def _run_demo(state_dir: Path) -> int:
    print(f"activememory demo: state in {state_dir}\n")
    samples = importlib.resources.files("activememory") / "data"
    keys = []
    async with open_memory(state_dir) as mem:
        for name in SAMPLES:
            with importlib.resources.as_file(samples / name) as path:
                transcript = read_jsonl_transcript(path)
            count = await mem.sessions.import_transcript(
                transcript.session_key, transcript.entries, leaf_id=transcript.leaf_id
            )
            keys.append(transcript.session_key)
            info = await mem.sessions.info(transcript.session_key)
            print(
                f"imported {count} events into {transcript.session_key} "
                f"({info.chat_type}; stored unindexed, dirty={info.dirty})"
            )
        rebuilt = await mem.sessions.rebuild_index()
        print(
            f"rebuilt the index of {rebuilt.sessions} dirty sessions: "
            f"{rebuilt.index_rows} user/assistant messages indexed\n"
        )
        key = keys[0]
        event = await mem.sessions.append(
            key,
            Message(
                role="user", content="Also, I'm vegetarian. Any tips for dinner in Bairro Alto?"
            ),
        )
        info = await mem.sessions.info(key)
        print(
            f"appended event {event.id} live: committed and indexed in one transaction "
            f"(index watermark seq {info.indexed_seq}, dirty={info.dirty})\n"
        )
        for key in keys:
            print(f"history of {key} (active branch):")
            _print_history(await mem.sessions.history(key))
            print()
        _print_stats(await mem.sessions.stats())
    return 0


def _print_history(events: Sequence[Event]) -> None:
    for event in events:
        message = event.message
        if message is None:
            continue
        when = dt.datetime.fromtimestamp(event.timestamp, dt.UTC).strftime("%Y-%m-%d %H:%M")
        print(f"  #{event.id:<4} {when}  {message.role:<9}  {_describe(message.content)}")


def _describe(content: object) -> str:
    if isinstance(content, str):
        text = content
    else:
        parts = []
        for block in content:  # type: ignore[attr-defined]
            kind = getattr(block, "text", None)
            parts.append(kind if isinstance(kind, str) and kind else f"[{type(block).__name__}]")
        text = " ".join(parts)
    return text if len(text) <= 90 else text[:89] + "…"


def _print_stats(stats: Sequence[IndexStats]) -> None:
    print("index statistics:")
    header = ("agent", "sessions", "events", "active msgs", "indexed", "dirty", "fts check", "size")
    rows = [
        (
            s.agent, str(s.sessions), str(s.events), str(s.active_messages),
            str(s.indexed_messages), str(s.dirty_sessions),
            "ok" if s.fts_integrity_ok else "FAILED", f"{s.db_bytes / 1024:.0f} KiB",
        )
        for s in stats
    ]  # fmt: skip
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))
