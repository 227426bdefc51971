"""`activememory chat` (docs/design.md §4.3, §4.11, §6): scripted conversations through the command line.

Stdin is a StringIO (or a scripted reader that edits the config between turns); one test
runs the real process with a pipe and sends it Ctrl-C.
"""

from __future__ import annotations

import io
import json
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from activememory._chat import ChatOptions, _remembered, echo_model, run_chat
from activememory._cli import main
from activememory._output import hidden_prefix
from activememory.protocol.content import Message
from activememory.protocol.recall import Turn

FACT = "I drink oolong tea every morning."
QUESTION = "what tea do I drink in the morning?"
SUMMARY = "The user drinks oolong tea every morning."
REMEMBERING = f'bot> (remembering: {SUMMARY}) You said: "{QUESTION}"'
GROUP_SKIP = (
    "[recall skipped: chat type group is not in allowedChatTypes; "
    "cross-conversation recall never runs in a group conversation]"
)
CONFIG = '{plugins: {entries: {"active-memory": {config: {timeoutMs: 15000}}}}}\n'
WAIT_S = 5.0  # outer bound of every wait below: a hang fails instead of stalling
# The same for a whole chat run (in a child process or in-process): its start-up loads the
# default embedding model, which alone took seconds on a loaded machine.
PROCESS_WAIT_S = 60.0


def chat(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    lines: list[str],
) -> tuple[int, list[str], list[str]]:
    """Run `activememory chat ARGS` with LINES on stdin; (exit status, stdout, stderr lines)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("".join(f"{line}\n" for line in lines)))
    status = main(["chat", *args])
    out, err = capsys.readouterr()
    return status, out.splitlines(), err.splitlines()


class ScriptedStdin:
    """Stdin whose lines may be actions: an action runs (on the reader thread) when reached."""

    def __init__(self, script: list[str | Callable[[], None]]) -> None:
        self._script = list(script)

    def readline(self) -> str:
        while self._script:
            item = self._script.pop(0)
            if isinstance(item, str):
                return item + "\n"
            item()
        return ""


def wait_for(stream: io.StringIO, text: str, count: int = 1) -> Callable[[], None]:
    """An action: wait until `text` has appeared `count` times in `stream`."""

    def wait() -> None:
        deadline = time.monotonic() + WAIT_S
        while stream.getvalue().count(text) < count:
            assert time.monotonic() < deadline, f"no {text!r} x{count} in {stream.getvalue()!r}"
            time.sleep(0.01)

    return wait


def test_a_second_private_chat_recalls_the_first_and_a_group_is_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, err = chat(
        monkeypatch,
        capsys,
        ["--state-dir", str(tmp_path)],
        [
            FACT,
            "/session agent:main:dm:you",
            QUESTION,
            "/session agent:main:group:team",
            QUESTION,
            "/history",
        ],
    )
    assert status == 0
    assert out == [
        f'bot> You said: "{FACT}"',
        "[session agent:main:dm:you (direct)]",
        REMEMBERING,
        "[session agent:main:group:team (group)]",
        f'bot> You said: "{QUESTION}"',
        "agent:main:group:team: 2 messages",
        f"  user: {QUESTION}",
        f'  assistant: You said: "{QUESTION}"',
    ]
    assert err[0].startswith("[activememory chat: session agent:main:direct:you; ")
    assert [line.split()[:2] for line in err[1:3]] == [
        ["[recall", "no_relevant_memory"],
        ["[recall", "ok"],
    ]
    assert err[3:] == [GROUP_SKIP]


def test_verbose_and_trace_follow_the_reply(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = chat(
        monkeypatch,
        capsys,
        ["--state-dir", str(tmp_path), "--session", "agent:main:dm:you"],
        [
            *["/verbose on", "/trace on", "/session agent:main:direct:you", FACT],
            *["/session agent:main:dm:you", QUESTION, "/quit", "never read"],
        ],
    )
    assert status == 0
    assert out[:2] == ["Verbose: on for this session.", "Trace: on for this session."]
    reply, verbose, trace = out[-3:]
    assert reply == REMEMBERING
    assert verbose.startswith("🧩 Active Memory: status=ok elapsed=")
    assert verbose.endswith("ms query=recent summary=41 chars")
    assert trace.startswith(f"🔎 Active Memory Debug: {SUMMARY} [")
    # The session's switches persist: a later run in the same state directory sees them.
    status, out, _ = chat(
        monkeypatch,
        capsys,
        ["--state-dir", str(tmp_path), "--session", "agent:main:dm:you"],
        ["/status"],
    )
    assert status == 0
    assert out[2] == (
        "switches: Active Memory: on for this session. Verbose: on for this session. "
        "Trace: on for this session."
    )


def test_json_output_is_one_object_per_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _ = chat(
        monkeypatch,
        capsys,
        ["--state-dir", str(tmp_path), "--json"],
        [FACT, "/session agent:main:dm:you", "/verbose on", QUESTION, "/status", "/nope"],
    )
    assert status == 0
    objects = [json.loads(line) for line in out]
    assert [o["type"] for o in objects] == ["turn", "session", "command", "turn", "status", "help"]
    first, _, command, turn, state, help_ = objects
    assert first["status"] == "no_relevant_memory" and first["summary"] is None
    assert command == {
        "type": "command",
        "session": "agent:main:dm:you",
        "command": "/verbose on",
        "reply": "Verbose: on for this session.",
    }
    assert turn["text"] == REMEMBERING.removeprefix("bot> ")
    assert (turn["status"], turn["summary"], turn["cached"]) == ("ok", SUMMARY, False)
    assert isinstance(turn["elapsed_ms"], float) and turn["elapsed_ms"] >= 0
    assert len(turn["followups"]) == 1 and "status=ok" in turn["followups"][0]
    assert state["recall"] == {
        "status": None,
        "reason": "",
        "paths": ["cross_conversation", "advanced"],
        "model": "local/extractive",
    }
    assert state["breakers"] == [] and state["config"]["source"] is None
    assert help_["reply"].startswith("commands: /active-memory status|on|off [--global], ")


def test_config_is_reloaded_when_the_file_changes_and_a_bad_edit_keeps_the_old_one(
    tmp_path: Path,
) -> None:
    config = tmp_path / "activememory.json5"
    config.write_text(CONFIG)
    stdout, stderr = io.StringIO(), io.StringIO()

    def edit(text: str) -> Callable[[], None]:
        def write() -> None:
            config.write_text(text)  # in place, as many editors do: the watcher waits it out

        return write

    stdin = ScriptedStdin(
        [
            FACT,
            "/session agent:main:dm:you",
            QUESTION,
            # The chat reads ahead while a turn runs: wait for each turn before editing.
            wait_for(stderr, "[recall ok"),
            edit(CONFIG.replace("timeoutMs: 15000", "enabled: false")),
            wait_for(stderr, "[config reloaded]"),
            "why?",
            wait_for(stderr, "[recall skipped"),
            edit(CONFIG.replace("15000", "50")),
            wait_for(stderr, "[config not reloaded"),
            "/status",
            wait_for(stdout, "config: "),
            edit("{plugins: {"),
            wait_for(stderr, "[config not reloaded", 2),
            edit(CONFIG),
            wait_for(stderr, "[config reloaded]", 2),
            QUESTION,
        ]
    )
    options = ChatOptions(state_dir=tmp_path / "state", config=config, watch_interval=0.02)
    started = time.monotonic()
    assert run_chat(options, stdin=stdin, stdout=stdout, stderr=stderr) == 0
    assert time.monotonic() - started < PROCESS_WAIT_S
    notes = [line for line in stderr.getvalue().splitlines() if not line.startswith("[activ")]
    assert [n for n in notes if not n.startswith("[recall ok")] == [
        notes[0],  # the first turn: nothing to recall yet
        "[config reloaded]",
        "[recall skipped: Active Memory is off globally (config.enabled)]",
        "[config not reloaded: plugins.entries.active-memory.config.timeoutMs: "
        "50 is below the minimum 250]",
        "[config not reloaded: invalid JSON5 at line 1, column 12: unexpected end of input]",
        "[config reloaded]",
    ]
    assert sum(n.startswith("[recall ok") for n in notes) == 2
    status_line = next(line for line in stdout.getvalue().splitlines() if line.startswith("conf"))
    assert status_line == (
        f"config: {config}; Active Memory off globally; queryMode=recent promptStyle=balanced "
        "timeoutMs=15000 maxSummaryChars=220"
    )
    assert stdout.getvalue().splitlines()[-1] == REMEMBERING


def test_global_switch_needs_the_owner_and_is_written_to_the_config(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "activememory.json5"
    config.write_text(CONFIG)
    args = ["--state-dir", str(tmp_path / "state"), "--config", str(config)]
    status, out, _ = chat(monkeypatch, capsys, args, ["/active-memory off --global"])
    assert (status, out) == (
        0,
        [
            "Active Memory: only the owner or an operator.admin may use --global; nothing was changed."
        ],
    )
    assert config.read_text() == CONFIG
    status, out, err = chat(
        monkeypatch, capsys, [*args, "--owner"], ["/active-memory off --global", "hello"]
    )
    assert status == 0 and out[0] == "Active Memory: off globally."
    assert err[-1] == "[recall skipped: Active Memory is off globally (config.enabled)]"
    assert "enabled: false" in config.read_text()


def test_bad_config_and_bad_session_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "bad.json5"
    config.write_text(CONFIG.replace("15000", "50"))
    state = ["--state-dir", str(tmp_path / "state")]
    assert chat(monkeypatch, capsys, [*state, "--config", str(config)], ["hi"]) == (
        2,
        [],
        [
            f"activememory: error: bad config {config}:",
            "  plugins.entries.active-memory.config.timeoutMs: 50 is below the minimum 250",
        ],
    )
    missing = tmp_path / "missing.json5"
    assert chat(monkeypatch, capsys, [*state, "--config", str(missing)], [])[2] == [
        f"activememory: error: bad config {missing}:",
        "  cannot read the config file (No such file or directory)",
    ]
    assert chat(monkeypatch, capsys, [*state, "--session", "agent::x"], [])[::2] == (
        2,
        ["activememory: error: --session: 'agent::x' has no agent id after 'agent:'"],
    )
    # A bad key inside the chat is reported and the chat goes on in the same session.
    status, out, err = chat(monkeypatch, capsys, state, ["/session agent::x", "/session"])
    assert (status, out) == (0, ["[session agent:main:direct:you (direct)]"])
    assert err[-1] == "[error: /session: 'agent::x' has no agent id after 'agent:']"


def test_echo_model_says_what_the_hidden_block_held() -> None:
    import trio

    turn = Turn(session_key="agent:main:direct:you", messages=[Message(role="user", content="hi")])
    prefix = hidden_prefix("likes <b>tea</b> & &lt;cake&gt;")
    assert _remembered(prefix) == "likes <b>tea</b> & &lt;cake&gt;"
    assert trio.run(echo_model, None, turn) == 'You said: "hi"'
    assert trio.run(echo_model, prefix, turn) == (
        '(remembering: likes <b>tea</b> & &lt;cake&gt;) You said: "hi"'
    )


@pytest.mark.slow
def test_ctrl_c_ends_the_chat_cleanly_and_keeps_what_was_said(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "activememory", "chat", "--state-dir", str(tmp_path)]
    proc = subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    killer = threading.Timer(PROCESS_WAIT_S, proc.kill)  # a hang fails instead of stalling
    killer.start()
    try:
        proc.stdin.write(f"{FACT}\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == f'bot> You said: "{FACT}"\n'
        proc.send_signal(signal.SIGINT)  # stdin stays open: the chat is waiting for a line
        out, err = proc.communicate(timeout=PROCESS_WAIT_S)
    finally:
        killer.cancel()
    assert proc.returncode == 130, err
    assert out == "" and err.splitlines()[-1] == "[interrupted]"
    assert "Traceback" not in err
    result = subprocess.run(
        [*command, "--json"],
        input="/history\n",
        capture_output=True,
        text=True,
        timeout=PROCESS_WAIT_S,
    )
    assert json.loads(result.stdout)["messages"] == [
        {"role": "user", "text": FACT},
        {"role": "assistant", "text": f'You said: "{FACT}"'},
    ]


def test_a_deleted_config_file_is_said_once_and_the_last_good_config_kept(
    tmp_path: Path,
) -> None:
    config = tmp_path / "activememory.json5"
    config.write_text(CONFIG.replace("timeoutMs: 15000", "enabled: false"))
    stdout, stderr = io.StringIO(), io.StringIO()
    polls = 10  # the file stays gone for many polls: the notice must not repeat

    def wait_polls() -> None:
        time.sleep(polls * 0.02)

    stdin = ScriptedStdin(
        [
            config.unlink,
            wait_for(stderr, "[config file "),
            wait_polls,
            "hello",
            wait_for(stderr, "[recall skipped"),
            lambda: config.write_text(CONFIG),
            wait_for(stderr, "[config reloaded]"),
        ]
    )
    options = ChatOptions(state_dir=tmp_path / "state", config=config, watch_interval=0.02)
    assert run_chat(options, stdin=stdin, stdout=stdout, stderr=stderr) == 0
    notes = [line for line in stderr.getvalue().splitlines() if not line.startswith("[activ")]
    assert notes == [
        f"[config file {config} is gone: keeping the last config that loaded]",
        "[recall skipped: Active Memory is off globally (config.enabled)]",
        "[config reloaded]",
    ]


def test_a_conversation_that_cannot_be_stored_stops_with_a_failure_status(tmp_path: Path) -> None:
    # A real write failure: the chat process may not grow any file past 400 kB (RLIMIT_FSIZE,
    # with SIGXFSZ ignored, so a write past it fails with EFBIG as on a full disk).
    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (400_000, 400_000))

    config = tmp_path / "text-only.json5"
    config.write_text('{agents: {defaults: {memorySearch: {provider: "none"}}}}\n')
    big = "words " * 60_000  # 360 kB: its transaction cannot fit under the limit
    command = ["chat", "--state-dir", str(tmp_path / "s"), "--config", str(config)]
    done = subprocess.run(
        [sys.executable, "-m", "activememory", *command],
        input=f"hello\n{big}\nnever read\n",
        capture_output=True,
        text=True,
        preexec_fn=limit_file_size,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.count("bot> ") == 2  # hello, and the turn whose message was lost
    notes = done.stderr.splitlines()
    assert notes[-1].startswith(
        "[stopped: the conversation cannot be stored: persist user message: "
    )
    assert "never read" not in done.stdout
