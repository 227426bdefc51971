"""The `activememory` command line. Human output by default, `--json` for programs."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar

import anyio
import msgspec

from .protocol.config import Config
from .protocol.content import Message
from .protocol.errors import ActiveMemoryError, InvalidInputError, SessionNotFoundError
from .protocol.recall import RecallOutcome, Sender, Turn
from .protocol.record_results import iso_timestamp
from .protocol.search import SEARCH_MODES, VISIBILITIES, SearchResult
from .protocol.session_key import CHAT_TYPES
from .protocol.transcript import Event, IndexStats, SessionInfo
from .protocol.userdata import ErasureSummary
from .simulations.bench import BENCHMARKS  # the registry alone: a benchmark loads when it runs
from .storage.fts_query import MATCH_MODES

# The parser needs none of the runtime (trio, the store, the records stack, httpx, numpy):
# a command imports it when it runs, so `--help` and `--version` stay quick
# (docs/design.md §9). The store is opened in one place, `open_store`.
if TYPE_CHECKING:
    from contextlib import AbstractAsyncContextManager

    from ._doctor import DoctorReport
    from ._importers import IdentityExport, LocomoSample, Transcript
    from ._memory import Memory

SAMPLES = ("sample-alice.jsonl", "sample-team.jsonl")
ARCHIVED = {"yes": True, "no": False, "all": None}  # `sessions --archived` -> the API's value
IMPORT_FORMATS = ("jsonl", "locomo")
T = TypeVar("T")
WAIT_FOR_INDEX_SECONDS = 60
ERASE_TIMEOUT_SECONDS = 60  # a running bot's erase: its VACUUM of every database


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `activememory` / `python -m activememory`."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
    except (BrokenPipeError, BaseExceptionGroup) as exc:
        if isinstance(exc, BaseExceptionGroup) and exc.split(BrokenPipeError)[1] is not None:
            raise
        # `activememory … | head`: the reader has all it wanted. Python docs, "Note on
        # SIGPIPE": point stdout at devnull so the exit's flush cannot fail again; exit 1.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return status


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except ActiveMemoryError as exc:
        print(f"activememory: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _version() -> str:
    import importlib.metadata  # only for --version: reading the metadata costs every call

    try:
        return importlib.metadata.version("activememory")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """`--version`: the installed version, looked up only when asked for."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> NoReturn:
        print(f"activememory {_version()}")  # on stdout, as argparse's own version action
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="activememory", description=__doc__)
    parser.add_argument("--version", action=_VersionAction)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="import the bundled sample and show what is stored")
    demo.add_argument("--state-dir", type=Path, help="keep the state here (default: a temp dir)")
    demo.set_defaults(run=_demo)

    from ._chat import add_chat_parser  # the chat command lives in its own module

    add_chat_parser(commands)

    imp = commands.add_parser(
        "import",
        help="import JSONL transcripts or LoCoMo conversations; a re-run skips what is there",
    )
    imp.add_argument("paths", type=Path, nargs="+")
    add_store_arguments(imp)
    imp.add_argument(
        "--format",
        choices=IMPORT_FORMATS,
        help="file format (default: locomo for a path ending in .json, else jsonl)",
    )
    imp.add_argument("--session-key", help="session key for JSONL files without a header line")
    imp.add_argument("--no-rebuild", action="store_true", help="leave the sessions dirty")
    imp.add_argument("--json", action="store_true")
    imp.set_defaults(run=_import)

    reindex = commands.add_parser(
        "reindex", help="rebuild the full-text index (every agent, one agent or one session)"
    )
    add_store_arguments(reindex)
    reindex.add_argument("--agent", help="only this agent's sessions")
    reindex.add_argument("--session", help="only this session (a session key)")
    reindex.add_argument("--json", action="store_true")
    reindex.set_defaults(run=_reindex)
    _add_userdata_parsers(commands)
    _add_mcp_parser(commands)
    from ._records_cli import add_records_parser  # records add|search|link|invalidate

    add_records_parser(commands)

    search = commands.add_parser("search", help="full-text search of stored conversations")
    search.add_argument("query")
    add_store_arguments(search)
    search.add_argument("--caller", required=True, help="session key of the one searching")
    search.add_argument("--session-key", help="search only this (visible) session")
    search.add_argument("--limit", type=int, default=10, help="1-25 (default 10)")
    search.add_argument("--match", choices=MATCH_MODES, default="phrase")
    search.add_argument(
        "--mode",
        choices=SEARCH_MODES,
        default="text",
        help="text (default), or hybrid: also by meaning, with the configured embedder",
    )
    search.add_argument(
        "--visibility", choices=VISIBILITIES, help="tools.sessions.visibility (default tree)"
    )
    search.add_argument(
        "--wait",
        action="store_true",
        help="let re-indexing finish before answering (opens the store for writing)",
    )
    search.add_argument("--json", action="store_true")
    search.set_defaults(run=_search)

    history = commands.add_parser("history", help="print a session's active branch")
    history.add_argument("session_key")
    add_store_arguments(history)
    history.add_argument("--limit", type=int)
    history.add_argument("--json", action="store_true")
    history.set_defaults(run=_history)

    stats = commands.add_parser("stats", help="index statistics of every agent database")
    add_store_arguments(stats)
    stats.add_argument("--json", action="store_true")
    stats.set_defaults(run=_stats)

    recall = commands.add_parser(
        "recall", help="run the recall step for one message and show what it found"
    )
    recall.add_argument("message")
    add_store_arguments(recall)
    recall.add_argument("--session", default="agent:main:main", help="session key of the turn")
    recall.add_argument("--config", type=Path, help="JSON5 config file")
    recall.add_argument("--json", action="store_true")
    recall.set_defaults(run=_recall)

    doctor = commands.add_parser("doctor", help="check the setup and the index's health")
    add_store_arguments(doctor)
    doctor.add_argument("--config", type=Path, help="JSON5 config file")
    doctor.add_argument("--json", action="store_true")
    doctor.set_defaults(run=_doctor)

    simulate = commands.add_parser(
        "simulate", help="run the deterministic timeout simulations (virtual time) and check them"
    )
    simulate.add_argument("--trace", action="store_true", help="print every scenario's trace")
    simulate.add_argument("--json", action="store_true")
    simulate.set_defaults(run=_simulate)

    bench = commands.add_parser("bench", help=f"run a benchmark ({', '.join(BENCHMARKS)})")
    what = "; ".join(f"{name}: {does}" for name, does in BENCHMARKS.items())
    bench.add_argument("name", choices=BENCHMARKS, help=what)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER, help="its options (NAME --help)")
    bench.set_defaults(run=_bench)

    _add_serve_parser(commands)
    _add_migrate_parser(commands)

    # Every argument goes to simulations/soak.py (`activememory soak --help` shows them):
    # `prefix_chars="+"` keeps argparse from reading `--sessions` etc. as options here.
    soak = commands.add_parser(
        "soak",
        help="run the load soak (appends and recalls under faults, then verify the store)",
        prefix_chars="+",
        add_help=False,
    )
    soak.add_argument("soak_args", nargs="*")
    soak.set_defaults(run=_soak)
    return parser


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """`--state-dir` and `--storage`: where a command's memory is (docs/design.md §11).
    Every command that opens a memory takes both; `open_store` hands them to `open_memory`."""
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument(
        "--storage",
        metavar="DSN",
        help="the memory is in this PostgreSQL store (postgresql://... or host=... dbname=...;"
        " \"sqlite\": the state directory's files); default: the config's storage section,"
        " else the state directory",
    )


def memory_config(
    args: argparse.Namespace, config: Config | dict[str, object] | Path | None, *, existing: bool
) -> Config:
    """The config a command opens its memory with, loaded once. With `existing` (a read
    command, or a write that must not make a store out of a typo) a memory in the state
    directory's files needs a state directory that holds one (`_existing_state_dir`); on
    PostgreSQL (`--storage`, else the config's `storage.backend`, as `open_memory` chooses)
    the server's store is what must exist, and `open_memory` checks that."""
    from ._config import load_config

    loaded = load_config(config if config is not None else {})
    storage = getattr(args, "storage", None)
    on_postgresql = (
        storage != "sqlite" if storage is not None else loaded.storage.backend != "sqlite"
    )
    if existing and not on_postgresql:
        _existing_state_dir(args.state_dir)
    return loaded


def open_store(
    args: argparse.Namespace,
    config: Config | dict[str, object] | Path | None = None,
    *,
    readonly: bool = False,
    existing: bool = False,
) -> AbstractAsyncContextManager[Memory]:
    """The one place a command opens its memory: `open_memory` with `--state-dir`,
    `--storage` and `config` (`memory_config`). `readonly` (the read commands): read beside
    a running bot without its writer (docs/design.md §1.6, §11 "Read-only"), from a store
    that must exist; `existing`: a write to a store that must exist."""
    from ._memory import open_memory

    loaded = memory_config(args, config, existing=readonly or existing)
    storage = getattr(args, "storage", None)
    return open_memory(args.state_dir, config=loaded, readonly=readonly, storage=storage)


def with_memory(
    args: argparse.Namespace,
    fetch: Callable[[Memory], Awaitable[T]],
    config: Config | dict[str, object] | Path | None = None,
    *,
    readonly: bool = False,
    existing: bool = False,
) -> T:
    """Open the command's memory (`open_store`), return `fetch(mem)`, close it."""
    import trio

    opened = open_store(args, config, readonly=readonly, existing=existing)

    async def run() -> T:
        async with opened as mem:
            return await fetch(mem)

    return trio.run(run)


def _recall(args: argparse.Namespace) -> int:
    # Read-only (docs/design.md §1.6): the run's transcript stays in a temporary folder.
    async def fetch(mem: Memory) -> RecallOutcome:
        try:
            history = await mem.sessions.history(args.session)
        except SessionNotFoundError:
            history = []
        messages = [e.message for e in history if e.message is not None]
        messages.append(Message(role="user", content=args.message))
        return await mem.recall(Turn(session_key=args.session, messages=messages))

    outcome = with_memory(args, fetch, args.config, readonly=True)
    if args.json:
        print(msgspec.json.encode(outcome).decode())
    else:
        print(outcome.status_line)
        print(outcome.debug_line)
        if outcome.prompt_prefix:
            print(outcome.prompt_prefix)
    return 0


def _doctor(args: argparse.Namespace) -> int:
    async def fetch(mem: Memory) -> DoctorReport:
        return await mem.doctor()

    report = with_memory(args, fetch, args.config, readonly=True)
    if args.json:
        print(json.dumps({"ok": report.ok, "checks": msgspec.to_builtins(report.checks)}))
    else:
        print(report.text())
    return 0 if report.ok else 1


def _simulate(args: argparse.Namespace) -> int:
    from .simulations.timeouts import run_all, table

    results = run_all()
    failed = [r for r in results if r.problems]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "scenario": r.scenario.name,
                        "what": r.scenario.what,
                        "ok": not r.problems,
                        "problems": r.problems,
                        "bound_s": r.bound_s,
                        "turns": [dataclasses.asdict(t) for t in r.results],
                        "trace": r.trace,
                    }
                    for r in results
                ],
                indent=2,
            )
        )
    else:
        print(table(results))
        if args.trace:
            for r in results:
                print("\n".join(["", *r.trace]))
        print(f"\n{len(results) - len(failed)} of {len(results)} scenarios as expected")
    return 1 if failed else 0


def _import_format(path: Path, chosen: str | None) -> str:
    return chosen or ("locomo" if path.suffix.lower() == ".json" else "jsonl")


async def _import_files(
    mem: Memory,
    paths: Sequence[Path],
    session_key: str | None,
    *,
    rebuild: bool,
    file_format: str | None = None,
) -> list[dict[str, object]]:
    """Import `paths`, skipping sessions a killed run already stored (docs/design.md §2.5)."""
    from ._importers import IdentityExport, read_locomo

    formats = [_import_format(path, file_format) for path in paths]
    if session_key is not None and "locomo" in formats:
        raise InvalidInputError("--session-key: LoCoMo files name their own sessions")
    tally = _ImportTally(files=len(paths))
    # Parse every file first: a bad file is reported before anything is written.
    parsed: list[IdentityExport | list[LocomoSample]] = []
    for path, kind in zip(paths, formats, strict=True):
        parsed.append(
            read_locomo(path) if kind == "locomo" else IdentityExport.read(path, session_key)
        )
        tally.show(f"import: read {len(parsed)}/{len(paths)} files")
    _check_one_file_per_session(paths, parsed)
    done: list[dict[str, object]] = []
    for path, item in zip(paths, parsed, strict=True):
        if isinstance(item, IdentityExport) and _plain(item):
            done.append(await _import_transcript(mem, path, item.transcripts[0], tally))
        elif isinstance(item, IdentityExport):
            done.append(await _import_jsonl(mem, path, item, tally))
        else:
            done.extend([await _import_locomo_sample(mem, path, s, tally) for s in item])
        tally.files_done += 1
    summary = tally.summary()
    if rebuild:
        summary += await _rebuild_imported(mem, tally, summary)
    if tally.progress.last:  # a live line was drawn: end it
        tally.progress.close()
    print(summary, file=sys.stderr)
    return done


def _check_one_file_per_session(
    paths: Sequence[Path], parsed: Sequence[IdentityExport | list[LocomoSample]]
) -> None:
    """Two files of one import must not fill the same session: the second would be refused
    after the first was written."""
    first: dict[str, Path] = {}
    for path, item in zip(paths, parsed, strict=True):
        samples = item if isinstance(item, list) else []
        keys = [] if isinstance(item, list) else [t.session_key for t in item.transcripts]
        keys += [session.session_key for sample in samples for session in sample.sessions]
        for key in keys:
            if first.setdefault(key, path) != path:
                raise InvalidInputError(
                    f"{path}: session {key!r} is also imported from {first[key]}"
                )


def _plain(found: IdentityExport) -> bool:
    """A file of one session and nothing an export adds: imported resumably (a re-run skips
    it); an export is imported whole by `mem.import_export` (docs/design.md §2.5, §2.6)."""
    from ._importers import Transcript

    if len(found.transcripts) != 1 or found.records or found.relations:
        return False
    t = found.transcripts[0]
    return t == Transcript(t.session_key, t.entries, t.leaf_id, t.persistent, t.interactive)


async def _import_jsonl(
    mem: Memory, path: Path, found: IdentityExport, tally: _ImportTally
) -> dict[str, object]:
    done = await mem.import_export(found)
    for t in found.transcripts:
        tally.count(t.session_key, len(t.entries), skipped=False)
    # An export (docs/design.md §2.6): several sessions, records and relations.
    out: dict[str, object] = {"path": str(path)}
    out.update(msgspec.to_builtins(done))
    return out


async def _rebuild_imported(mem: Memory, tally: _ImportTally, summary: str) -> str:
    """Index the dirty sessions of this import (a killed run's included), one transaction
    each: nothing else writes here, and it is twice as fast as the reconciler's chunks."""
    started, rows, sessions = time.monotonic(), 0, 0
    for key in tally.keys:
        if (await mem.sessions.info(key)).dirty:
            rows += (await mem.sessions.rebuild_index(key)).index_rows
            sessions += 1
            rate = rows / max(time.monotonic() - started, 1e-3)
            tally.show(f"{summary}; index: {sessions} sessions, {rows:,} messages ({rate:,.0f}/s)")
    return f"; {rows:,} messages indexed" if sessions else ""


class _ImportTally:
    """What an import has done so far, shown as a progress line (rows, sessions, files)."""

    def __init__(self, files: int) -> None:
        from .simulations.bench.runner import Progress

        self.files = files
        self.files_done = self.sessions = self.skipped = self.rows = 0
        self.keys: list[str] = []  # every session of the import, stored now or before
        self.started = time.monotonic()
        self.progress = Progress(enabled=True)

    def count(self, key: str, events: int, *, skipped: bool) -> None:
        self.keys.append(key)
        self.sessions += 1
        self.skipped += skipped
        self.rows += 0 if skipped else events
        self.show(self.summary())

    def summary(self) -> str:
        seconds = time.monotonic() - self.started
        skipped = f" ({self.skipped} already there)" if self.skipped else ""
        return (
            f"import: {self.files_done}/{self.files} files, {self.sessions} sessions{skipped},"
            f" {self.rows:,} rows in {seconds:.1f} s ({self.rows / max(seconds, 1e-3):,.0f} rows/s)"
        )

    def show(self, line: str) -> None:
        if self.progress.due(time.monotonic() - self.started):
            self.progress.write(line)


class _RowRate:
    """`reindex`'s progress line: an agent's messages indexed of all, and their rate."""

    def __init__(self) -> None:
        self.first: dict[str, tuple[float, int]] = {}  # agent -> its first (time, count)

    def line(self, stats: IndexStats) -> str:
        now = time.monotonic()
        since, base = self.first.setdefault(stats.agent, (now, stats.indexed_messages))
        rate = (stats.indexed_messages - base) / max(now - since, 1e-3)
        return (
            f"index {stats.agent}: {stats.indexed_messages:,}/{stats.active_messages:,} messages,"
            f" {stats.dirty_sessions} sessions left ({rate:,.0f} rows/s)"
        )


async def _import_transcript(
    mem: Memory, path: Path, transcript: Transcript, tally: _ImportTally
) -> dict[str, object]:
    count = await mem.sessions.import_transcript(
        transcript.session_key,
        transcript.entries,
        leaf_id=transcript.leaf_id,
        persistent=transcript.persistent,
        interactive=transcript.interactive,
        resume=True,
    )
    skipped = count == 0 and bool(transcript.entries)
    tally.count(transcript.session_key, len(transcript.entries), skipped=skipped)
    return {
        "path": str(path),
        "session_key": transcript.session_key,
        "events": len(transcript.entries),
        "skipped": skipped,
    }


async def _import_locomo_sample(
    mem: Memory, path: Path, sample: LocomoSample, tally: _ImportTally
) -> dict[str, object]:
    skipped = 0
    for session in sample.sessions:
        count = await mem.sessions.import_transcript(
            session.session_key, session.entries, resume=True
        )
        skipped += count == 0
        tally.count(session.session_key, len(session.entries), skipped=count == 0)
    return {
        "path": str(path),
        "sample_id": sample.sample_id,
        "agent": sample.agent,
        "sessions": len(sample.sessions),
        "skipped_sessions": skipped,
        "turns": sample.turns,
        "questions": len(sample.questions),
    }


def _run_and_show(
    args: argparse.Namespace,
    fetch: Callable[[Memory], Awaitable[T]],
    show: Callable[[T], None],
    config: dict[str, object] | None = None,
    *,
    readonly: bool = False,
    existing: bool = False,
) -> int:
    """Open the memory, fetch a result, print it for a person or (`--json`) a program."""
    result = with_memory(args, fetch, config, readonly=readonly, existing=existing)
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(result)).decode())
    else:
        show(result)
    return 0


def _import(args: argparse.Namespace) -> int:
    def show(done: list[dict[str, object]]) -> None:
        for item in done:
            if "agent" in item:
                skipped = f" ({item['skipped_sessions']} already there)"
                print(
                    f"imported LoCoMo sample {item['sample_id']} from {item['path']} into agent "
                    f"{item['agent']}: {item['sessions']} sessions, {item['turns']} turns"
                    + (skipped if item["skipped_sessions"] else "")
                )
            elif item.get("skipped"):
                print(
                    f"skipped {item['path']}: {item['session_key']} already holds its "
                    f"{item['events']} events"
                )
            elif "session_key" in item:
                print(
                    f"imported {item['events']} events from {item['path']} "
                    f"into {item['session_key']}"
                )
            else:
                print(
                    f"imported {item['sessions']} sessions ({item['events']} events), "
                    f"{item['records']} records and {item['relations']} relations "
                    f"from {item['path']}"
                )

    return _run_and_show(
        args,
        lambda mem: _import_files(
            mem,
            args.paths,
            args.session_key,
            rebuild=not args.no_rebuild,
            file_format=args.format,
        ),
        show,
    )


def _reindex(args: argparse.Namespace) -> int:
    from .simulations.bench.runner import Progress

    rows = _RowRate()
    progress = Progress(enabled=True)
    started = time.monotonic()

    def show(stats: IndexStats) -> None:
        line = rows.line(stats)  # every time: the rate counts from the first call
        if progress.due(time.monotonic() - started):
            progress.write(f"reindex: {line}")

    async def fetch(mem: Memory) -> list[IndexStats]:
        try:
            return await mem.sessions.reindex(args.session, agent=args.agent, progress=show)
        finally:
            if progress.last:
                progress.close()

    return _run_and_show(args, fetch, _print_stats)


def _search(args: argparse.Namespace) -> int:
    config: dict[str, object] | None = None
    if args.visibility:
        config = {"tools": {"sessions": {"visibility": args.visibility}}}

    async def fetch(mem: Memory) -> SearchResult:
        def ask() -> Awaitable[SearchResult]:
            return mem.sessions.search(
                args.query,
                caller=args.caller,
                session_key=args.session_key,
                limit=args.limit,
                match=args.match,
                mode=args.mode,
            )

        if args.wait and args.mode == "hybrid":  # vectors are made in the background
            with anyio.move_on_after(WAIT_FOR_INDEX_SECONDS):
                await mem.sessions.vectors_ready()
        result = await ask()
        if args.wait and result.indexing:
            with anyio.move_on_after(WAIT_FOR_INDEX_SECONDS):
                while result.indexing:
                    await anyio.sleep(0.05)
                    result = await ask()
        return result

    # --wait rebuilds the index itself, so it opens the store for writing (its reconciler
    # and embedder); otherwise search reads beside a running bot.
    return _run_and_show(
        args, fetch, _print_search, config, readonly=not args.wait, existing=args.wait
    )


def _print_search(result: SearchResult) -> None:
    if result.warning:
        print(f"warning: {result.warning}")
    if result.fallback:
        print(f"text only: {result.fallback}")
    if not result.results:
        print("no matches" + (" yet (still indexing)" if result.indexing else ""))
    for hit in result.results:
        when = iso_timestamp(hit.timestamp)  # never raises: see iso_timestamp
        print(f"{hit.score:9.3g}  {hit.session_key}  #{hit.message_id}  {when}  {hit.role}")
        print(f"           {hit.snippet}")
    if result.truncated:
        print("(more matches or longer text were cut; raise --limit or narrow the query)")


def _history(args: argparse.Namespace) -> int:
    async def fetch(mem: Memory) -> list[Event]:
        events = await mem.sessions.history(args.session_key, limit=args.limit)
        if (await mem.sessions.info(args.session_key)).dirty:
            print(f"note: {args.session_key} is being re-indexed; search shows it once "
                  "its writer has rebuilt it", file=sys.stderr)  # fmt: skip
        return events

    return _run_and_show(args, fetch, _print_history, readonly=True)


def _stats(args: argparse.Namespace) -> int:
    return _run_and_show(args, lambda mem: mem.sessions.stats(), _print_stats, readonly=True)


def _soak(args: argparse.Namespace) -> int:
    from .simulations import soak

    return soak.main(args.soak_args)


def _bench(args: argparse.Namespace) -> int:
    from .simulations import bench

    return bench.main(args.name, args.bench_args)


def _demo(args: argparse.Namespace) -> int:
    import trio

    if args.state_dir is not None:
        return trio.run(_run_demo, args.state_dir)
    with tempfile.TemporaryDirectory(prefix="activememory-demo-") as tmp:
        return trio.run(_run_demo, Path(tmp))


DEMO_NOTE = "# About the user\n\nI am allergic to peanuts, so no peanut snacks please.\n"
DEMO_PORTAL = "agent:main:explicit:portal-7"
# alice owns the assistant: her direct chats and its UI sessions recall each other.
DEMO_CONFIG = {"plugins": {"entries": {"active-memory": {"config": {"ownerIdentity": "alice"}}}}}
DEMO_TURNS: tuple[tuple[str, str], ...] = (
    (DEMO_PORTAL, "/verbose on"),
    (DEMO_PORTAL, "/trace on"),
    (DEMO_PORTAL, "Book me a seat on the Lisbon flight, please."),
    (DEMO_PORTAL, "Which snacks are safe for me?"),
    (DEMO_PORTAL, "thanks!"),
    ("agent:main:group:travel-club", "What time is the club meeting on Thursday?"),
    # The same memories asked in other words: text search alone does not find them.
    (DEMO_PORTAL, "Is there anything I must not eat?"),
    (DEMO_PORTAL, "Any seat preference for my flight?"),
)


async def _demo_respond(prefix: str | None, turn: Turn) -> str:
    """The demo's stand-in for a main model: says what memory it was handed."""
    if prefix is None:
        return "(main model, no memory handed over) Happy to help!"
    note = prefix.split("\n")[2]
    return f"(main model, told: {note}) Got it, I'll take that into account."


async def _run_demo(state_dir: Path) -> int:
    from ._importers import read_jsonl_transcript
    from ._memory import open_memory

    print(f"activememory demo: state in {state_dir}\n")
    samples = importlib.resources.files("activememory") / "data"
    async with open_memory(state_dir, config=DEMO_CONFIG) as mem:
        print("1. Import two conversations written before indexing existed:")
        for name in SAMPLES:
            with importlib.resources.as_file(samples / name) as path:
                transcript = read_jsonl_transcript(path)
            count = await mem.sessions.import_transcript(
                transcript.session_key, transcript.entries, leaf_id=transcript.leaf_id
            )
            info = await mem.sessions.info(transcript.session_key)
            print(f"   {transcript.session_key}: {count} events ({info.chat_type}, unindexed)")
        rebuilt = await mem.sessions.rebuild_index()
        print(f"   index rebuilt: {rebuilt.index_rows} user/assistant messages\n")

        workspace = mem.config.workspace("main", state_dir)
        workspace.mkdir(parents=True, exist_ok=True)
        (workspace / "MEMORY.md").write_text(DEMO_NOTE)
        print(f"2. A memory note in {workspace / 'MEMORY.md'}:")
        print("   " + DEMO_NOTE.strip().replace("\n", "\n   ") + "\n")
        await mem.notes.sync_notes("main")
        # Vectors are made in the background; a bot's users come back a moment later.
        with anyio.move_on_after(60):
            await mem.sessions.vectors_ready()

        print("3. Turns through the whole bot path (mem.reply): a new private chat of the")
        print("   same user, then the travel club group (groups are not allowed by default),")
        print("   then the private chat again, asking for the same memories in other words:\n")
        history: dict[str, list[Message]] = {}
        for key, text in DEMO_TURNS:
            print(f"   [{key}] user: {text}")
            if text.startswith("/"):
                answer = await mem.command(key, text, sender=Sender(owner=True))
                print(f"      -> {answer}\n")
                continue
            messages = [*history.get(key, []), Message(role="user", content=text)]
            reply = await mem.reply(Turn(session_key=key, messages=messages), _demo_respond)
            history[key] = [*messages, Message(role="assistant", content=reply.text)]
            print(f"      bot: {reply.text}")
            for line in reply.followups:
                print(f"      {line}")
            if not reply.followups:
                print(f"      (status {reply.outcome.status}: {reply.outcome.reason})")
            print()

        print("4. Health (mem.doctor()):")
        report = await mem.doctor()
        print("   " + report.text().replace("\n", "\n   "))
    return 0


def _print_history(events: Sequence[Event]) -> None:
    for event in events:
        message = event.message
        if message is None:
            continue
        when = iso_timestamp(event.timestamp)  # never raises: see iso_timestamp
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


# -- a user's data: sessions, export, erase (docs/design.md §2.6) ---------------------------


def _add_userdata_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sessions = commands.add_parser("sessions", help="list stored sessions, filtered")
    add_store_arguments(sessions)
    sessions.add_argument("--config", type=Path, help="JSON5 config file (session.identityLinks)")
    sessions.add_argument("--agent", help="only this agent's sessions")
    sessions.add_argument("--chat-type", choices=CHAT_TYPES)
    whose = sessions.add_mutually_exclusive_group()
    whose.add_argument("--identity", help="the sessions of this identity (and those they spawned)")
    whose.add_argument("--peer", help="direct chats with this peer id")
    sessions.add_argument(
        "--archived", choices=list(ARCHIVED), default="no", help="default: no (unarchived)"
    )
    sessions.add_argument("--json", action="store_true")
    sessions.set_defaults(run=_sessions)

    export = commands.add_parser(
        "export", help="write everything stored about one identity in the import format"
    )
    add_store_arguments(export)
    export.add_argument("--config", type=Path, help="JSON5 config file (session.identityLinks)")
    export.add_argument("--identity", required=True)
    export.add_argument("--agent", help="only this agent's sessions (and records it may see)")
    export.add_argument("-o", "--output", type=Path, help="write here (default: stdout)")
    export.set_defaults(run=_export)

    erase = commands.add_parser(
        "erase", help="erase everything stored about one identity (see --dry-run)"
    )
    add_store_arguments(erase)
    erase.add_argument("--config", type=Path, help="JSON5 config file (session.identityLinks)")
    erase.add_argument("--identity", required=True)
    erase.add_argument("--dry-run", action="store_true", help="only list what would go")
    erase.add_argument(
        "--timeout",
        type=float,
        default=ERASE_TIMEOUT_SECONDS,
        help="beside a running bot: seconds to wait for its answer (default %(default)g)",
    )
    erase.add_argument("--json", action="store_true")
    erase.set_defaults(run=_erase)


def _existing_state_dir(path: Path) -> Path:
    """A state directory that must already hold a store (never created by a typo)."""
    from .actors.supervisor import require_store

    require_store(path, "--state-dir")
    return path


def _sessions(args: argparse.Namespace) -> int:
    async def fetch(mem: Memory) -> list[SessionInfo]:
        return await mem.sessions.list(
            agent=args.agent,
            chat_type=args.chat_type,
            identity=args.identity,
            peer=args.peer,
            archived=ARCHIVED[args.archived],
        )

    found = with_memory(args, fetch, args.config, readonly=True)  # a read: beside a running bot
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(found)).decode())
        return 0
    for info in found:
        when = iso_timestamp(info.updated_at)
        flags = " archived" if info.archived else ""
        print(f"{info.key}  {info.chat_type}  updated {when}{flags}")
    print(f"{len(found)} sessions", file=sys.stderr)
    return 0


def _export(args: argparse.Namespace) -> int:
    async def fetch(mem: Memory) -> IdentityExport:
        return await mem.export_identity(args.identity, agent=args.agent)

    found = with_memory(args, fetch, args.config, readonly=True)  # a read: beside a running bot
    text = "".join(f"{line}\n" for line in found.lines())
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8")
    events = sum(len(t.entries) for t in found.transcripts)
    print(
        f"exported {len(found.transcripts)} sessions ({events} events), {len(found.records)} "
        f"records and {len(found.relations)} relations of {found.identity}; {found.not_covered}",
        file=sys.stderr,
    )
    return 0


def _erase(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        raise InvalidInputError(f"--timeout: expected seconds > 0, got {args.timeout:g}")
    import trio

    from ._control import bot_serves, erase_through_bot

    config = memory_config(args, args.config, existing=True)  # a dry run reads: beside a bot
    state_dir = args.state_dir

    async def run() -> ErasureSummary:
        if not args.dry_run and bot_serves(state_dir):
            # A bot holds the writers: it erases through them (docs/design.md §1.7).
            if args.config is not None:
                print("note: the running bot erases with its own config (its identityLinks);"
                      " --config is not used", file=sys.stderr)  # fmt: skip
            summary, pid = await erase_through_bot(state_dir, args.identity, within=args.timeout)
            print(f"erased by the running bot (pid {pid})", file=sys.stderr)
            return summary
        async with open_store(args, config, readonly=args.dry_run) as mem:
            return await mem.erase_identity(args.identity, dry_run=args.dry_run)

    summary = trio.run(run)
    if args.json:
        out = msgspec.to_builtins(summary) | {"purged": summary.purged}
        print(json.dumps(out, indent=2))
    else:
        verb = "would erase" if summary.dry_run else "erased"
        for a in summary.agents:
            print(
                f"agent {a.agent}: {verb} {len(a.session_keys)} sessions, {a.events} events, "
                f"{a.index_rows} index rows, {a.vectors} vectors, {a.cached_vectors} cached "
                f"vectors, {a.switches} switch rows"
            )
            for key in a.session_keys:
                print(f"  {key}")
        r = summary.records
        print(f"records: {verb} {r.records} records and {r.relations} relations")
        print(summary.not_covered)
        problems = [a.problem for a in summary.agents if a.problem] + (
            [r.problem] if r.problem else []
        )
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
    return 0 if summary.dry_run or summary.purged else 1


# -- the MCP server (docs/design.md §12.2) ----------------------------------------------------


def _add_mcp_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    mcp = commands.add_parser(
        "mcp", help="serve one conversation's memory tools over MCP (stdio or streamable HTTP)"
    )
    add_store_arguments(mcp)
    mcp.add_argument(
        "--session-key", required=True, help="the conversation every tool runs as (the caller)"
    )
    mcp.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="http: the address (default loopback)")
    mcp.add_argument("--port", type=int, default=8765, help="http: the port (0: any free one)")
    mcp.add_argument("--config", type=Path, help="JSON5 config file")
    mcp.add_argument(
        "--token", help="http: the bearer token, or ${NAME} to read it from the environment"
    )
    mcp.add_argument("--readonly", action="store_true", help="beside a running bot: no writes")
    mcp.set_defaults(run=_mcp)


def _mcp(args: argparse.Namespace) -> int:
    from .service.mcp import serve  # the `mcp` extra: imported only by this command

    memory_config(args, args.config, existing=args.readonly)  # the config's storage decides
    return serve(
        args.state_dir,
        session_key=args.session_key,
        transport=args.transport,
        host=args.host,
        port=args.port,
        config=args.config,
        token=args.token,
        readonly=args.readonly,
        storage=args.storage,
    )


def _add_serve_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`activememory serve` (docs/design.md §12.1): the HTTP/JSON API."""
    serve = commands.add_parser("serve", help="serve the HTTP/JSON API (and --ui, the inspector)")
    add_store_arguments(serve)
    serve.add_argument("--config", type=Path, help="JSON5 config file")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8787, help="port (default 8787; 0: any free)")
    serve.add_argument(
        "--token",
        help="bearer token clients must send; ${NAME} reads it from the environment "
        "(default: the config's serve.token, else $ACTIVEMEMORY_TOKEN); required off loopback",
    )
    serve.add_argument(
        "--caller-token",
        action="append",
        default=[],
        metavar="KEY=TOKEN",
        help="a token bound to one caller session key (repeatable)",
    )
    serve.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024)
    serve.add_argument(
        "--rate-limit",
        type=float,
        default=200.0,
        help="requests per second per client, bursts of twice that (0: off)",
    )
    serve.add_argument("--backend", choices=("trio", "asyncio"), default="trio")
    serve.add_argument("--ui", action="store_true", help="serve the inspector page under /ui")
    serve.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    import signal

    from .service import http
    from .service.auth import shown_url

    config = memory_config(args, args.config, existing=False)
    options = http.options_from(
        host=args.host,
        port=args.port,
        token=args.token,
        caller_tokens=args.caller_token,
        config_raw=config.raw,
        max_body_bytes=args.max_body_bytes,
        rate=args.rate_limit,
        burst=max(1, int(args.rate_limit * 2)),
    )
    inspector = http.load_inspector() if args.ui else None
    try:
        sock = http.bind_socket(options.host, options.port)
    except OSError as exc:
        raise InvalidInputError(
            f"--host/--port: cannot listen on {args.host}:{args.port}: {exc}"
        ) from None

    async def run() -> None:
        async with open_store(args, config) as mem:
            ui = inspector(mem) if inspector is not None else None
            app = http.build_app(mem, options, ui=ui)
            shutdown = anyio.Event()
            async with anyio.create_task_group() as tg:

                async def on_signal() -> None:
                    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                        async for _ in signals:
                            shutdown.set()
                            return

                tg.start_soon(on_signal)
                url = shown_url(sock, sock.getsockname()[0])
                print(f"activememory: serving {url}", file=sys.stderr, flush=True)
                await http.serve(app, sock, shutdown=shutdown)
                tg.cancel_scope.cancel()

    with sock:
        anyio.run(run, backend=args.backend)
    return 0


# --- `activememory migrate` (docs/design.md §11 "Migrate"): a thin call of `am.migrate` ----


def _add_migrate_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    migrate = commands.add_parser(
        "migrate",
        help="copy a store into an empty one, SQLite <-> PostgreSQL, and verify the copy",
        description="Copy every agent's sessions and every record from SRC into the empty DEST,"
        " then verify: per-session message counts and search answers on a sample of the"
        " source's words. SRC and DEST: a state directory or a postgresql://... DSN. A failed"
        " or mismatching migrate leaves DEST as it was; exit status 1 on a mismatch.",
    )
    migrate.add_argument("src", help="state directory or PostgreSQL DSN to copy from")
    migrate.add_argument("dest", help="empty (or missing) state directory, or an empty DSN")
    migrate.add_argument(
        "--verify-sample",
        type=int,
        default=50,
        help="words of the source searched on both stores (default 50; 0: counts only)",
    )
    migrate.add_argument("--json", action="store_true")
    migrate.set_defaults(run=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    import trio

    from ._migrate import migrate

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    report = trio.run(
        lambda: migrate(args.src, args.dest, verify_sample=args.verify_sample, progress=say)
    )
    if args.json:
        print(json.dumps({"ok": report.ok, **msgspec.to_builtins(report)}))
    else:
        print(report.text())
    return 0 if report.ok else 1
