"""`Settings`: one immutable snapshot of the configuration and what is compiled from it.

`Memory` holds the current one and swaps it in one assignment on `reload_config`; a search
or a recall takes the snapshot current when it starts and passes it down, so a reload never
changes the redaction or the workspace of work already running (docs/design.md §4.1).
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from ._redaction import Redactor
from .protocol.config import Config
from .protocol.errors import InvalidInputError


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """The `Config` with its compiled redactor, and the state folder workspaces resolve in."""

    config: Config
    redactor: Redactor
    state_dir: Path

    @classmethod
    def compile(cls, config: Config, state_dir: Path) -> Settings:
        """Compile `config`; an invalid redaction pattern raises `InvalidInputError`."""
        try:
            redactor = Redactor(config.search.redact_patterns)
        except InvalidInputError as exc:  # name the key as it is spelled in the config
            raise InvalidInputError(f"logging.{exc}") from None
        return cls(config=config, redactor=redactor, state_dir=state_dir)

    def workspace(self, agent: str) -> Path:
        """The workspace folder whose notes `agent`'s tools read."""
        return self.config.workspace(agent, self.state_dir)
