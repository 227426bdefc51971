"""The slash commands of docs/design.md §4.3: `/active-memory`, `/verbose`, `/trace`.

Session switches are written through the agent's indexer (the single writer), so they
persist across restarts. `--global` changes `config.enabled` and, when the config came from
a file, writes that one value into the file, leaving the rest of it byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio

from ._json5_edit import set_value, write_atomically
from .actors.supervisor import Supervisor
from .protocol.config import Config
from .protocol.errors import InvalidInputError
from .protocol.indexer import SetSwitches, SwitchesSet
from .protocol.recall import TRACE_MODES, Sender, SessionSwitches, TraceMode
from .protocol.session_key import SessionKey, parse_session_key
from .storage.db import readonly_error

_ENTRY = ("plugins", "entries", "active-memory")
_ON = {"on": True, "enable": True, "off": False, "disable": False}

ACTIVE_MEMORY_USAGE = "Usage: /active-memory status|on|off [--global]"
VERBOSE_USAGE = "Usage: /verbose on|off"
TRACE_USAGE = "Usage: /trace on|off|raw"
GLOBAL_REFUSED = (
    "Active Memory: only the owner or an operator.admin may use --global; nothing was changed."
)


class Commands:
    """Runs `mem.command`; holds nothing but how to reach the switches and swap the config.

    Each command gets the config snapshot `Memory` held when it started.
    """

    def __init__(self, supervisor: Supervisor, set_config: Callable[[Config], None]) -> None:
        self._supervisor = supervisor
        self._set_config = set_config

    async def run(
        self, session_key: str, text: str, *, sender: Sender, config: Config
    ) -> str | None:
        key = parse_session_key(session_key)
        if not isinstance(text, str):
            raise InvalidInputError(f"text: expected a string, got {type(text).__name__}")
        if not isinstance(sender, Sender):
            raise InvalidInputError(f"sender: expected am.Sender, got {type(sender).__name__}")
        words = text.split()
        if not words:
            return None
        name, args = words[0].casefold(), [w.casefold() for w in words[1:]]
        if name == "/active-memory":
            return await self._active_memory(key, args, sender, config)
        if name == "/verbose":
            return await self._verbose(key, args)
        if name == "/trace":
            return await self._trace(key, args)
        return None  # not ours: the host handles it

    async def switches(self, key: SessionKey) -> SessionSwitches:
        store = await self._supervisor.agent(key.store_agent)
        return await store.read(lambda reader: reader.switches(key.raw))

    async def _set(
        self,
        key: SessionKey,
        *,
        active_memory: bool | None = None,
        verbose: bool | None = None,
        trace: TraceMode | None = None,
    ) -> SessionSwitches:
        store = await self._supervisor.agent(key.store_agent)
        ack = await store.submit(
            SetSwitches(key=key, active_memory=active_memory, verbose=verbose, trace=trace)
        )
        if not isinstance(ack, SwitchesSet):
            raise InvalidInputError(f"session_key: could not change the switches ({ack})")
        return ack.switches

    async def _active_memory(
        self, key: SessionKey, args: list[str], sender: Sender, config: Config
    ) -> str:
        is_global = "--global" in args
        rest = [a for a in args if a != "--global"]
        if len(rest) > 1 or (rest and rest[0] != "status" and rest[0] not in _ON):
            return ACTIVE_MEMORY_USAGE
        action = rest[0] if rest else "status"
        if is_global:
            if not sender.is_admin:
                return GLOBAL_REFUSED
            if action != "status":
                config = await self._set_global(_ON[action], config)
            state = "on" if config.active_memory.enabled else "off"
            return f"Active Memory: {state} globally."
        if action == "status":
            switches = await self.switches(key)
        else:
            switches = await self._set(key, active_memory=_ON[action])
        state = "on" if switches.active_memory else "off"
        reply = f"Active Memory: {state} for this session."
        if not (config.active_memory.enabled and config.plugin_enabled):
            reply += " (It is off globally.)"
        return reply

    async def _set_global(self, enabled: bool, config: Config) -> Config:
        """Write `config.enabled` (and keep the plugin entry enabled), then swap the config in.

        The file is written first: if that fails, the error propagates and nothing changed.
        A read-only memory writes neither (docs/design.md §1.6).
        """
        if self._supervisor.readonly:
            raise readonly_error(self._supervisor.state_dir)
        updated = config.with_enabled(enabled)
        if config.source is not None:
            source = Path(config.source)
            await anyio.to_thread.run_sync(_write_enabled, source, enabled, config.plugin_enabled)
        self._set_config(updated)
        return updated

    async def _verbose(self, key: SessionKey, args: list[str]) -> str:
        if len(args) > 1 or (args and args[0] not in ("on", "off")):
            return VERBOSE_USAGE
        if args:
            switches = await self._set(key, verbose=args[0] == "on")
        else:
            switches = await self.switches(key)
        return f"Verbose: {'on' if switches.verbose else 'off'} for this session."

    async def _trace(self, key: SessionKey, args: list[str]) -> str:
        if len(args) > 1 or (args and args[0] not in TRACE_MODES):
            return TRACE_USAGE
        if args:
            switches = await self._set(key, trace=args[0])  # type: ignore[arg-type]
        else:
            switches = await self.switches(key)
        return f"Trace: {switches.trace} for this session."


def _write_enabled(path: Path, enabled: bool, plugin_enabled: bool) -> None:
    text = path.read_bytes().decode("utf-8")  # not read_text: it would turn CRLF into LF
    text = set_value(text, (*_ENTRY, "config", "enabled"), enabled)
    if not plugin_enabled:
        text = set_value(text, (*_ENTRY, "enabled"), True)
    write_atomically(path, text)
