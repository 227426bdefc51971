"""The slash commands (docs/design.md §4.3): per-session switches, `--global`, `/verbose`, `/trace`."""

from __future__ import annotations

import re
from pathlib import Path

import json5
import pytest

import activememory as am
from activememory._commands import ACTIVE_MEMORY_USAGE, GLOBAL_REFUSED, TRACE_USAGE, VERBOSE_USAGE

pytestmark = pytest.mark.anyio

DM = "agent:main:direct:alice"
OTHER = "agent:main:direct:bob"
USER = am.Sender()
OWNER = am.Sender(owner=True)
ADMIN = am.Sender(scopes=("operator.admin",))
CONFIG_TEXT = """// the operator's file: comments and layout must survive a --global switch
{
  plugins: {
    entries: {
      "active-memory": {
        enabled: true,
        config: {
          agents: ["main"],
          timeoutMs: 15000, // tuned by hand
        },
      },
    },
  },
}
"""


def turn(key: str = DM, text: str = "hello there, what do you know?") -> am.Turn:
    return am.Turn(session_key=key, messages=[am.Message(role="user", content=text)])


async def test_session_switch_is_per_session_and_survives_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "s"
    async with am.open_memory(state) as mem:
        assert await mem.command(DM, "/active-memory status", sender=USER) == (
            "Active Memory: on for this session."
        )
        assert await mem.command(DM, "/active-memory off", sender=USER) == (
            "Active Memory: off for this session."
        )
        assert (await mem.recall(turn())).reason == "off for this session (/active-memory on)"
        assert (await mem.recall(turn(OTHER))).status != "skipped"
        assert mem.config.active_memory.enabled  # the config is not touched
    async with am.open_memory(state) as mem:
        assert await mem.command(DM, "/active-memory status", sender=USER) == (
            "Active Memory: off for this session."
        )
        assert await mem.command(DM, "/active-memory enable", sender=USER) == (
            "Active Memory: on for this session."
        )
        assert (await mem.recall(turn())).status != "skipped"


async def test_switch_set_before_the_first_message_applies(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s") as mem:
        await mem.command(DM, "/active-memory disable", sender=USER)
        await mem.sessions.append(DM, am.Message(role="user", content="first"))
        assert (await mem.recall(turn())).status == "skipped"


@pytest.mark.parametrize(
    "text",
    ["/active-memory off --global", "/active-memory on --global", "/active-memory status --global"],
)
async def test_global_needs_owner_or_admin(tmp_path: Path, text: str) -> None:
    path = tmp_path / "activememory.json5"
    path.write_text(CONFIG_TEXT)
    async with am.open_memory(tmp_path / "s", config=am.load_config(path)) as mem:
        assert await mem.command(DM, text, sender=USER) == GLOBAL_REFUSED
        assert await mem.command(DM, text, sender=am.Sender(scopes=("operator.read",))) == (
            GLOBAL_REFUSED
        )
        assert mem.config.active_memory.enabled
    assert path.read_text() == CONFIG_TEXT


@pytest.mark.parametrize("sender", [OWNER, ADMIN], ids=["owner", "operator.admin"])
async def test_global_off_writes_only_config_enabled(tmp_path: Path, sender: am.Sender) -> None:
    path = tmp_path / "activememory.json5"
    path.write_text(CONFIG_TEXT)
    state = tmp_path / "s"
    async with am.open_memory(state, config=am.load_config(path)) as mem:
        assert await mem.command(DM, "/active-memory off --global", sender=sender) == (
            "Active Memory: off globally."
        )
        assert not mem.config.active_memory.enabled
        assert mem.config.plugin_enabled  # kept on, so the command can turn it back on
        out = await mem.recall(turn())
        assert out.reason == "Active Memory is off globally (config.enabled)"
        assert await mem.command(DM, "/active-memory status", sender=USER) == (
            "Active Memory: on for this session. (It is off globally.)"
        )
    text = path.read_text()
    assert "// the operator's file" in text and "// tuned by hand" in text
    assert json5.loads(text)["plugins"]["entries"]["active-memory"]["config"]["enabled"] is False
    async with am.open_memory(state, config=am.load_config(path)) as mem:
        assert not mem.config.active_memory.enabled  # persisted to the file
        assert await mem.command(DM, "/active-memory on --global", sender=sender) == (
            "Active Memory: on globally."
        )
        assert (await mem.recall(turn())).status != "skipped"
    assert json5.loads(path.read_text())["plugins"]["entries"]["active-memory"]["config"]["enabled"]


async def test_global_on_re_enables_a_disabled_plugin_entry(tmp_path: Path) -> None:
    path = tmp_path / "c.json5"
    path.write_text('{plugins: {entries: {"active-memory": {enabled: false}}}}')
    async with am.open_memory(tmp_path / "s", config=am.load_config(path)) as mem:
        await mem.command(DM, "/active-memory on --global", sender=OWNER)
        assert mem.config.plugin_enabled and mem.config.active_memory.enabled
    entry = json5.loads(path.read_text())["plugins"]["entries"]["active-memory"]
    assert entry == {"enabled": True, "config": {"enabled": True}}


async def test_global_without_a_file_changes_the_running_config(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s") as mem:
        await mem.command(DM, "/active-memory off --global", sender=OWNER)
        assert not mem.config.active_memory.enabled
        assert (await mem.recall(turn())).status == "skipped"


async def test_verbose_and_trace_add_followups_after_the_reply(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s") as mem:
        await mem.sessions.append(  # alice's other chat: recall reads only her identity's
            "agent:main:dm:alice",
            am.Message(role="user", content="My sister Maya lives in Lisbon."),
        )
        question = turn(text="where does my sister Maya live?")
        assert (await mem.recall(question)).followups == ()
        assert await mem.command(DM, "/verbose on", sender=USER) == "Verbose: on for this session."
        out = await mem.recall(question)
        assert out.status == "ok"
        assert out.followups == (out.status_line,)
        chars = len(out.summary or "")
        assert re.fullmatch(
            rf"🧩 Active Memory: status=ok elapsed=\d+ms query=recent summary={chars} chars( cached)?",
            out.status_line,
        )
        assert await mem.command(DM, "/trace on", sender=USER) == "Trace: on for this session."
        out = await mem.recall(question)
        assert out.cached and out.status_line.endswith(" cached")  # same turn within the TTL
        assert out.followups == (out.status_line, out.debug_line)
        assert out.debug_line.startswith("🔎 Active Memory Debug: ")
        assert "Lisbon" in out.debug_line
        assert await mem.command(DM, "/trace raw", sender=USER) == "Trace: raw for this session."
        out = await mem.recall(question)
        assert out.followups == (out.status_line, out.debug_line, out.prompt_prefix)
        assert (
            await mem.command(DM, "/verbose off", sender=USER) == "Verbose: off for this session."
        )
        assert await mem.command(DM, "/trace off", sender=USER) == "Trace: off for this session."
        assert (await mem.recall(question)).followups == ()
        assert await mem.command(DM, "/verbose", sender=USER) == "Verbose: off for this session."
        assert await mem.command(DM, "/trace", sender=USER) == "Trace: off for this session."


@pytest.mark.parametrize(
    ("text", "reply"),
    [
        ("/active-memory maybe", ACTIVE_MEMORY_USAGE),
        ("/active-memory on off", ACTIVE_MEMORY_USAGE),
        ("/verbose loud", VERBOSE_USAGE),
        ("/trace everything", TRACE_USAGE),
        ("/ACTIVE-MEMORY OFF", "Active Memory: off for this session."),
        ("/help", None),
        ("just a message", None),
        ("   ", None),
    ],
)
async def test_command_parsing(tmp_path: Path, text: str, reply: str | None) -> None:
    async with am.open_memory(tmp_path / "s") as mem:
        assert await mem.command(DM, text, sender=USER) == reply


async def test_command_rejects_bad_arguments(tmp_path: Path) -> None:
    async with am.open_memory(tmp_path / "s") as mem:
        with pytest.raises(am.InvalidInputError, match="^sender: expected am.Sender, got dict$"):
            await mem.command(DM, "/verbose on", sender={"owner": True})  # type: ignore[arg-type]
        with pytest.raises(am.InvalidInputError, match="^session_key: "):
            await mem.command("", "/verbose on", sender=USER)
