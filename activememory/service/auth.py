"""What the HTTP API and the MCP server share at their door (docs/design.md §12): which
binds need a token, where a token comes from, how it is compared, the bare 401, and the
listening socket. One rule for both faces, so they cannot drift apart."""

from __future__ import annotations

import hmac
import ipaddress
import os
import socket
from collections.abc import Iterable
from typing import Any, Final, TypeVar

from .._config import _ENV_REF
from ..protocol.errors import InvalidInputError

MIN_TOKEN_CHARS: Final = 16
T = TypeVar("T")


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or "localhost") binds to the loopback interface only:
    the only binds served without a token."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def expand_env(where: str, value: str) -> str:
    """`value` with `${NAME}` replaced by the environment variable (`$${NAME}` is literal),
    as the config file does; `InvalidInputError` naming `where` if a variable is unset."""

    def replace(match: Any) -> str:
        if match.group(1):
            return str(match.group(0))[1:]
        found = os.environ.get(match.group(2))
        if found is None:
            raise InvalidInputError(f"{where}: environment variable {match.group(2)} is not set")
        return found

    return _ENV_REF.sub(replace, value)


def check_token(where: str, token: str) -> str:
    """`token`, or `InvalidInputError` naming `where` when it is too short to guess-proof."""
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidInputError(f"{where}: expected at least {MIN_TOKEN_CHARS} characters")
    return token


def bearer_match(authorization: bytes, tokens: Iterable[tuple[bytes, T]]) -> T | None:
    """What the token given as `Authorization: Bearer <token>` stands for, or None. Every
    token is compared in constant time (`hmac.compare_digest`), whatever matched first, so
    the time taken says neither which token nor how much of one matched."""
    scheme, _, given = authorization.partition(b" ")
    given = given.strip()
    found: T | None = None
    for token, meaning in tokens:
        if hmac.compare_digest(given, token) and scheme.lower() == b"bearer":
            found = meaning
    return found


async def refuse_unauthenticated(send: Any) -> None:
    """The 401 of a missing or wrong token: no body, nothing for a prober to learn."""
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [(b"www-authenticate", b"Bearer"), (b"content-length", b"0")],
        }
    )
    await send({"type": "http.response.body", "body": b""})


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host:port` (port 0: any free one). Bound by us, not the
    ASGI server, so the printed address is exact and a client may connect at once (the
    kernel queues it until the server runs)."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host.strip("[]"), port))
        sock.listen(1024)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def shown_url(sock: socket.socket, host: str, path: str = "") -> str:
    """The URL a client uses for the listening `sock` (IPv6 hosts in brackets)."""
    bare = host.strip("[]")
    shown = f"[{bare}]" if ":" in bare else bare
    return f"http://{shown}:{sock.getsockname()[1]}{path}"
