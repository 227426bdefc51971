"""`activememory chat`: an interactive bot on the embedded default.

Each line read from stdin is one user turn through `mem.reply`: recall runs on the built-in
`local/extractive` model (no network) and the reply comes from `echo_model`, a deterministic
stand-in for a main model that repeats what it was told and says what it was reminded of.
Slash commands switch Active Memory, `/verbose` and `/trace` per session, move between
conversations and show state; `--config` is watched and reloaded while the chat runs.

Output: replies, follow-up lines and command replies on stdout (one JSON object per line with
`--json`); the live status of each turn and config reloads on stderr, as `[...]` lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TextIO

import anyio
import msgspec

from ._output import PREFIX_CLOSE, PREFIX_OPEN, unescape_xml
from .protocol.config import Config
from .protocol.content import Message
from .protocol.errors import (
    ActiveMemoryError,
    InvalidInputError,
    MemoryClosedError,
    SessionNotFoundError,
    StorageError,
)
from .protocol.recall import Reply, Sender, Turn
from .protocol.session_key import parse_session_key

# `activememory --help` imports this module for its parser: the runtime (trio, the config
# loader, the store) is imported when a chat starts (docs/design.md §9).
if TYPE_CHECKING:
    from ._memory import Memory

DEFAULT_SESSION = "agent:main:direct:you"
WATCH_INTERVAL_S = 0.5
# The turn carries at most this many earlier events: every query mode reads only a tail,
# and `full` bounds itself, so a long chat must not cost a whole-history read per turn.
HISTORY_LIMIT = 200
PROMPT = "you> "
BOT = "bot> "
MEMORY_COMMANDS = ("/active-memory", "/verbose", "/trace")
HELP = (
    "commands: /active-memory status|on|off [--global], /verbose on|off, /trace on|off|raw, "
    "/session [KEY], /history, /status, /help, /quit"
)
EXIT_OK = 0
EXIT_FAILED = 1  # the conversation could not be stored: the chat stopped
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # the shell's convention for a SIGINT


def add_chat_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the `chat` subcommand to the `activememory` command line."""
    chat = commands.add_parser(
        "chat",
        help="talk to an offline bot with Active Memory (slash commands: /help)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from ._cli import add_store_arguments

    add_store_arguments(chat)
    chat.add_argument("--config", type=Path, help="JSON5 config file; reloaded when it changes")
    chat.add_argument(
        "--session",
        default=DEFAULT_SESSION,
        help=f"session key to start in (default {DEFAULT_SESSION})",
    )
    chat.add_argument(
        "--owner", action="store_true", help="speak as the owner (needed for --global)"
    )
    chat.add_argument("--json", action="store_true", help="one JSON object per line on stdout")
    # Hidden: tests shorten the config poll; people have no reason to change it.
    chat.add_argument(
        "--watch-interval", type=float, default=WATCH_INTERVAL_S, help=argparse.SUPPRESS
    )
    chat.set_defaults(run=_run_from_args)


class LineSource(Protocol):
    """Where the chat reads its lines: a text stream (`sys.stdin`, a pipe, a StringIO).

    `readline` returns "" at the end; an `isatty()` that answers True turns the prompt on.
    """

    def readline(self) -> str: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatOptions:
    """What `activememory chat` was asked to do (its command-line options)."""

    state_dir: Path
    storage: str | None = None  # the PostgreSQL store (`--storage`); None: the config's
    config: Path | None = None
    session: str = DEFAULT_SESSION
    owner: bool = False
    json: bool = False
    watch_interval: float = WATCH_INTERVAL_S


def _run_from_args(args: argparse.Namespace) -> int:
    fields = dataclasses.fields(ChatOptions)  # each one is a command-line option
    return run_chat(ChatOptions(**{field.name: getattr(args, field.name) for field in fields}))


def run_chat(
    options: ChatOptions,
    *,
    stdin: LineSource | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Run the chat until `/quit`, end of input or Ctrl-C; return the exit status.

    0 at the end of the conversation, 1 when the conversation could not be stored (a
    message not written, the memory closed: the chat stops at once, the error on stderr),
    2 for a bad config, session key or state directory (the error on stderr, nothing
    started), 130 after Ctrl-C. The streams default to the process's own, looked up at
    call time.

    Cancellation: Ctrl-C (SIGINT, when run on the main thread) cancels the turn in flight
    (its user message may already be stored, see `Memory.reply`), then the memory closes
    as usual: every acknowledged write is committed. A blocked read of stdin is abandoned.
    """
    import trio

    from ._config import ConfigError

    out = stdout or sys.stdout
    err = stderr or sys.stderr
    try:
        if options.watch_interval <= 0:
            raise InvalidInputError(
                f"--watch-interval: {options.watch_interval} is not a positive number of seconds"
            )
        parse_session_key(options.session, field="--session")
        config: Config | None = None
        watched: _Watched | None = None
        if options.config is not None:
            # The signature is taken before the read, so an edit made meanwhile is not missed.
            watched = _Watched(options.config, _signature(options.config))
            config = _load_quietly(options.config)
        chat = _Chat(options, stdin or sys.stdin, out, err)
        return trio.run(chat.run, config, watched)
    except ConfigError as exc:
        print(f"activememory: error: bad config {options.config}:", file=err)
        for line in _config_errors(exc, options.config):
            print(f"  {line}", file=err)
        return EXIT_USAGE
    except ActiveMemoryError as exc:
        print(f"activememory: error: {exc}", file=err)
        return EXIT_USAGE


async def echo_model(prompt_prefix: str | None, turn: Turn) -> str:
    """The built-in stand-in for a main model: repeat what the user said.

    When the hidden prefix carries an Active Memory note, the reply starts with
    `(remembering: <note>)`, so what recall handed the model is visible. Deterministic and
    offline; a real host passes its own model as `respond` to `mem.reply`.

    Cancellation: it never waits, so there is nothing to cancel.
    """
    said = _text(turn.messages[-1])
    reply = f'You said: "{said}"'
    remembered = _remembered(prompt_prefix)
    return f"(remembering: {remembered}) {reply}" if remembered else reply


def _remembered(prompt_prefix: str | None) -> str | None:
    """The note inside the hidden block, unescaped; None when there is none."""
    if not prompt_prefix:
        return None
    lines = prompt_prefix.splitlines()
    try:
        start, end = lines.index(PREFIX_OPEN), lines.index(PREFIX_CLOSE)
    except ValueError:
        return None
    return unescape_xml(" ".join(lines[start + 1 : end]).strip()) or None


def _text(message: Message) -> str:
    text = message.index_text
    if text is not None:
        return text
    return message.content if isinstance(message.content, str) else f"[{message.role} blocks]"


@dataclasses.dataclass(frozen=True)
class _Watched:
    path: Path
    signature: tuple[int, int, int] | None


def _config_errors(exc: ActiveMemoryError, path: Path | None) -> list[str]:
    """The problems of a config that did not load, without repeating the file's name."""
    from ._config import ConfigError

    errors = exc.errors if isinstance(exc, ConfigError) else (str(exc),)
    named = f"{path}: "
    return [e.removeprefix(named) for e in errors]


def _signature(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is edited or replaced; None when it cannot be read."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _load_quietly(path: Path) -> Config:
    # Deprecation warnings are shown as chat notices (`Config.warnings`), not as Python
    # warnings with a source line.
    from ._config import ConfigWarning, load_config

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(path)


class _Chat:
    """One chat: the memory, the current session, and where its output goes."""

    def __init__(
        self, options: ChatOptions, stdin: LineSource, stdout: TextIO, stderr: TextIO
    ) -> None:
        self.options = options
        self.session = options.session
        self.sender = Sender(owner=options.owner)
        self._stdin = stdin
        self._stdout = stdout
        self._stderr = stderr
        self._tty = _isatty(stdin)
        self._at_prompt = False
        self.interrupted = False
        self.fatal: str | None = None  # why the chat stopped early, if it did

    async def run(self, config: Config | None, watched: _Watched | None) -> int:
        from ._memory import open_memory

        async with open_memory(
            self.options.state_dir, config=config, storage=self.options.storage
        ) as mem:
            self._banner(mem)
            for warning in mem.config.warnings:
                self._status(f"[config warning: {warning}]")
            async with anyio.create_task_group() as tasks:
                if watched is not None:
                    tasks.start_soon(self._watch_config, mem, watched)
                if threading.current_thread() is threading.main_thread():
                    tasks.start_soon(self._watch_interrupts, tasks.cancel_scope)
                await self._converse(mem)
                tasks.cancel_scope.cancel()
        if self.interrupted:
            if self._tty:
                self._write(self._stdout, "")  # off the line the terminal echoed ^C on
            self._status("[interrupted]")
            return EXIT_INTERRUPTED
        if self.fatal is not None:
            self._status(f"[stopped: the conversation cannot be stored: {self.fatal}]")
            return EXIT_FAILED
        return EXIT_OK

    # -- the conversation -------------------------------------------------------------------

    async def _converse(self, mem: Memory) -> None:
        while True:
            line = await self._read_line()
            if line is None:
                return
            text = line.strip()
            if not text:
                continue
            try:
                if text.startswith("/"):
                    if not await self._command(mem, text):
                        return
                else:
                    await self._turn(mem, text)
            except (StorageError, MemoryClosedError) as exc:
                # The store is unusable: going on would pretend to remember (docs/design.md §6).
                self._emit({"type": "error", "session": self.session, "error": str(exc)})
                self.fatal = str(exc)
            except ActiveMemoryError as exc:
                # Bad input or an unknown session ends the line, not the chat.
                self._status(f"[error: {exc}]")
                self._emit({"type": "error", "session": self.session, "error": str(exc)})
            if self.fatal is not None:
                return

    async def _read_line(self) -> str | None:
        if self._tty:
            self._write(self._stdout, PROMPT, end="")
        self._at_prompt = True
        try:
            # A thread, since stdin may be a pipe, a terminal or a StringIO; abandoned on
            # Ctrl-C rather than waited for (trio's worker threads are daemons).
            line = await anyio.to_thread.run_sync(self._stdin.readline, abandon_on_cancel=True)
        finally:
            self._at_prompt = False
        if not line:
            if self._tty:
                self._write(self._stdout, "")
            return None
        return line

    async def _turn(self, mem: Memory, text: str) -> None:
        history = await self._history(mem)
        turn = Turn(
            session_key=self.session,
            messages=[*history, Message(role="user", content=text)],
        )
        reply = await mem.reply(turn, echo_model)
        self._status(_status_note(reply))
        for problem in reply.problems:
            self._status(f"[memory problem: {problem}]")
        if reply.user_event_id is None or (reply.text.strip() and reply.assistant_event_id is None):
            self.fatal = next((p for p in reply.problems if p.startswith("persist ")), "not stored")
        outcome = reply.outcome
        self._emit(
            {
                "type": "turn",
                "session": self.session,
                "text": reply.text,
                "status": outcome.status,
                "summary": outcome.summary,
                "elapsed_ms": outcome.elapsed_ms,
                "cached": outcome.cached,
                "reason": outcome.reason,
                "followups": list(reply.followups),
                "problems": list(reply.problems),
            },
            [BOT + reply.text, *reply.followups],
        )

    async def _history(self, mem: Memory) -> list[Message]:
        try:
            events = await mem.sessions.history(self.session, limit=HISTORY_LIMIT)
        except SessionNotFoundError:
            return []  # a new conversation: the first append creates it
        return [event.message for event in events if event.message is not None]

    async def _command(self, mem: Memory, text: str) -> bool:
        """Run one slash command; False when the chat should end."""
        words = text.split()
        name, args = words[0].casefold(), words[1:]
        if name in ("/quit", "/exit"):
            return False
        if name in MEMORY_COMMANDS:
            answer = await mem.command(self.session, text, sender=self.sender)
            self._emit(
                {"type": "command", "session": self.session, "command": text, "reply": answer},
                [answer or HELP],
            )
        elif name == "/session":
            self._switch(args)
        elif name == "/history":
            await self._show_history(mem)
        elif name == "/status":
            await self._show_status(mem)
        else:
            self._emit({"type": "help", "command": text, "reply": HELP}, [HELP])
        return True

    def _switch(self, args: Sequence[str]) -> None:
        if len(args) > 1:
            raise InvalidInputError("/session: expected one session key")
        if args:
            self.session = parse_session_key(args[0], field="/session").raw
        key = parse_session_key(self.session)
        self._emit(
            {"type": "session", "session": self.session, "chat_type": key.chat_type},
            [f"[session {self.session} ({key.chat_type})]"],
        )

    async def _show_history(self, mem: Memory) -> None:
        messages = await self._history(mem)
        self._emit(
            {
                "type": "history",
                "session": self.session,
                "messages": [{"role": m.role, "text": _text(m)} for m in messages],
            },
            [f"{self.session}: {len(messages)} messages"]
            + [f"  {m.role}: {_text(m)}" for m in messages],
        )

    async def _show_status(self, mem: Memory) -> None:
        config = mem.config
        settings = config.active_memory
        # Each memory command without arguments answers its status for this session.
        switches = [
            await mem.command(self.session, name, sender=self.sender) for name in MEMORY_COMMANDS
        ]
        # A stand-in message: the preflight needs a turn, and it neither runs nor writes.
        plan = await mem.plan_recall(
            Turn(session_key=self.session, messages=[Message(role="user", content="status")])
        )
        breakers = mem.breaker_states()
        if plan.request is not None:
            recall = f"would run ({', '.join(plan.paths)}) with {plan.request.model}"
        else:
            recall = f"{plan.status}: {plan.reason}"
        if breakers:
            tripped = "; ".join(
                f"{b.agent}/{b.model} {b.state} ({b.consecutive_timeouts} timeouts)"
                for b in breakers
            )
        else:
            tripped = "none yet"
        key = parse_session_key(self.session)
        self._emit(
            {
                "type": "status",
                "session": self.session,
                "chat_type": key.chat_type,
                "config": {
                    "source": config.source,
                    "enabled": config.enabled,
                    "query_mode": settings.query_mode,
                    "prompt_style": settings.effective_prompt_style,
                    "timeout_ms": settings.timeout_ms,
                    "max_summary_chars": settings.max_summary_chars,
                },
                "switches": switches,
                "recall": {
                    "status": plan.status,
                    "reason": plan.reason,
                    "paths": list(plan.paths),
                    "model": plan.request.model if plan.request is not None else None,
                },
                "breakers": msgspec.to_builtins(breakers),
            },
            [
                f"session: {self.session} ({key.chat_type})",
                f"config: {config.source or 'built-in defaults'}; Active Memory "
                f"{'on' if config.enabled else 'off'} globally; "
                f"queryMode={settings.query_mode} "
                f"promptStyle={settings.effective_prompt_style} "
                f"timeoutMs={settings.timeout_ms} maxSummaryChars={settings.max_summary_chars}",
                "switches: " + " ".join(s or "" for s in switches),
                f"recall here: {recall}",
                f"breakers: {tripped}",
            ],
        )

    # -- background tasks -------------------------------------------------------------------

    async def _watch_config(self, mem: Memory, watched: _Watched) -> None:
        """Poll the config file; on a change, reload it (a bad edit or a deleted file keeps the
        old config, said once)."""
        loaded_from = polled = watched.signature
        while True:
            await anyio.sleep(self.options.watch_interval)
            previous, polled = polled, _signature(watched.path)
            # Reload once a change has held still for one poll, so an editor caught
            # halfway through writing the file does not produce a spurious error.
            if polled == loaded_from or polled != previous:
                continue
            if polled is not None and polled[1] == 0:
                continue  # an empty file is a write in progress (truncate, then write)
            loaded_from = polled
            if polled is None and not watched.path.exists():
                # Said once: the signature stays None until the file comes back.
                self._status(
                    f"[config file {watched.path} is gone: keeping the last config that loaded]"
                )
                self._emit({"type": "config", "reloaded": False, "errors": ["the file is gone"]})
                continue
            try:
                # Loaded on the event loop, like `mem.reload_config`: a config file is small.
                loaded = _load_quietly(watched.path)
                mem.reload_config(loaded)
            except ActiveMemoryError as exc:
                errors = _config_errors(exc, watched.path)
                self._status(f"[config not reloaded: {'; '.join(errors)}]")
                self._emit({"type": "config", "reloaded": False, "errors": list(errors)})
                continue
            self._status("[config reloaded]")
            for warning in loaded.warnings:
                self._status(f"[config warning: {warning}]")
            self._emit({"type": "config", "reloaded": True, "warnings": list(loaded.warnings)})

    async def _watch_interrupts(self, scope: anyio.CancelScope) -> None:
        # Ctrl-C as a cancellation of the chat, never a KeyboardInterrupt raised inside
        # whatever task happens to run: the memory then closes the ordinary way.
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            async for _ in signals:
                self.interrupted = True
                scope.cancel()
                return

    # -- output -----------------------------------------------------------------------------

    def _banner(self, mem: Memory) -> None:
        source = mem.config.source or "built-in defaults"
        self._status(
            f"[activememory chat: session {self.session}; config {source}; "
            "replies from the built-in echo stand-in, not a real model; /help for commands]"
        )

    def _status(self, line: str) -> None:
        """A live status line on stderr (always, `--json` or not)."""
        self._write(self._stderr, line)

    def _emit(self, obj: dict[str, Any], human: Sequence[str] = ()) -> None:
        """A result: one JSON object with `--json`, else the human lines (maybe none)."""
        if self.options.json:
            self._write(self._stdout, json.dumps(obj, ensure_ascii=False))
        else:
            for line in human:
                self._write(self._stdout, line)

    def _write(self, stream: TextIO, text: str, *, end: str = "\n") -> None:
        # A background notice while the person is typing at the prompt: start a fresh line,
        # then put the prompt back.
        interrupting = self._tty and self._at_prompt
        if interrupting:
            self._stdout.write("\n")
            self._stdout.flush()
        stream.write(text + end)
        stream.flush()  # live output through pipes, for scripts reading line by line
        if interrupting:
            self._stdout.write(PROMPT)
            self._stdout.flush()


def _status_note(reply: Reply) -> str:
    """The live status of one turn, e.g. `[recall ok 12ms]`, `[recall skipped: <reason>]`."""
    outcome = reply.outcome
    if outcome.reason and outcome.status in ("skipped", "unavailable", "failed"):
        return f"[recall {outcome.status}: {outcome.reason}]"
    note = f"[recall {outcome.status} {round(outcome.elapsed_ms)}ms"
    if outcome.cached:
        note += " cached"
    if outcome.status_line.endswith(" circuit-breaker"):
        note += " circuit-breaker"
    return note + "]"


def _isatty(stream: LineSource) -> bool:
    try:
        return bool(stream.isatty())  # type: ignore[attr-defined]
    except (AttributeError, ValueError, OSError):  # no such method, or a closed stream
        return False
