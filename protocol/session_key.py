"""Session keys (docs/design.md §2.1): `agent:<agent>:<chat type marker>:<id>[:thread:<id>]`.

A key can be *malformed* (rejected with `InvalidInputError`: empty, too long, control
characters, a bad agent id, a missing id where the shape needs one) or merely *unknown*
(well-formed text in no shape of the table: chat type `unknown`, stored but never eligible
for recall).
"""

from __future__ import annotations

import functools
import re
from typing import Literal, TypeAlias

import msgspec

from .content import check_text
from .errors import InvalidInputError

ChatType: TypeAlias = Literal["direct", "group", "channel", "explicit", "unknown"]
CHAT_TYPES: tuple[ChatType, ...] = ("direct", "group", "channel", "explicit", "unknown")
MAX_KEY_CHARS = 512
AGENT_ID = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
# Where keys with no `agent:` prefix are stored: they still need a database.
DEFAULT_AGENT = "main"

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_MARKERS: dict[str, ChatType] = {
    "direct": "direct",
    "dm": "direct",
    "group": "group",
    "channel": "channel",
    "explicit": "explicit",
}
_THREAD = ":thread:"


class SessionKey(msgspec.Struct, frozen=True, kw_only=True):
    """A parsed session key.

    `agent` is None only for keys without an `agent:` prefix; those are stored in the
    `DEFAULT_AGENT` database with chat type `unknown`. `conversation_id` is the part after
    the chat-type marker without the thread suffix (None for `agent:<a>:main`).
    """

    raw: str
    agent: str | None
    chat_type: ChatType
    conversation_id: str | None = None
    thread_id: str | None = None

    @property
    def store_agent(self) -> str:
        """The agent whose database holds this session."""
        return self.agent or DEFAULT_AGENT

    @property
    def is_private(self) -> bool:
        """Direct and explicit conversations: the only ones cross-conversation recall sees."""
        return self.chat_type in ("direct", "explicit")


def parse_session_key(raw: object, *, field: str = "session_key") -> SessionKey:
    """Parse `raw` per the docs/design.md §2.1 table; raise `InvalidInputError` naming `field`."""
    if not isinstance(raw, str):
        raise InvalidInputError(f"{field}: expected a string, got {type(raw).__name__}")
    return _parse(raw, field)


@functools.lru_cache(maxsize=4096)
def _parse(raw: str, field: str) -> SessionKey:
    def bad(why: str) -> InvalidInputError:
        shown = raw if len(raw) <= 80 else raw[:77] + "..."
        return InvalidInputError(f"{field}: {shown!r} {why}")

    if not raw or raw.isspace():
        raise bad("is empty")
    if len(raw) > MAX_KEY_CHARS:
        raise bad(f"is {len(raw)} characters long (at most {MAX_KEY_CHARS})")
    if raw != raw.strip():
        raise bad("has leading or trailing whitespace")
    if control := _CONTROL.search(raw):
        raise bad(f"contains the control character {control.group()!r}")
    check_text(field, raw)

    parts = raw.split(":")
    if parts[0] != "agent":
        return SessionKey(raw=raw, agent=None, chat_type="unknown")
    if len(parts) < 2 or not parts[1]:
        raise bad("has no agent id after 'agent:'")
    agent = parts[1]
    if not AGENT_ID.fullmatch(agent):
        raise bad(f"has agent id {agent!r}; agent ids match [a-z0-9][a-z0-9_-]{{0,63}}")
    rest = parts[2:]
    if rest == ["main"]:
        return SessionKey(raw=raw, agent=agent, chat_type="direct")
    if len(rest) < 1 or rest[0] not in _MARKERS:
        return SessionKey(raw=raw, agent=agent, chat_type="unknown")
    chat_type = _MARKERS[rest[0]]
    ident = ":".join(rest[1:])
    thread_id = None
    if chat_type in ("group", "channel") and _THREAD in f":{ident}":
        head, _, thread_id = f":{ident}".rpartition(_THREAD)
        ident = head[1:]
        if not thread_id:
            raise bad("has an empty thread id after ':thread:'")
    if not ident:
        raise bad(f"has no conversation id after ':{rest[0]}'")
    return SessionKey(
        raw=raw, agent=agent, chat_type=chat_type, conversation_id=ident, thread_id=thread_id
    )
