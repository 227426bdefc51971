"""The one JSON round trip the HTTP clients share (the recall model, the judge, the
embeddings client): POST, a capped read, the status, the JSON. Each client words the
failures its own way, from `HttpFailure.kind` and `detail`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Literal

# httpx is imported when a client is made (its owner imports it), never at start-up: a bot
# on local models never loads it (docs/design.md §9).
if TYPE_CHECKING:
    import httpx

ERROR_BODY_CHARS: Final = 200
"""How much of an error answer's body a failure quotes."""

FailureKind = Literal["timeout", "network", "too_large", "status", "json"]


class HttpFailure(Exception):
    """Why a round trip gave no JSON answer. `detail`: for "network" the exception
    (`Type: message`), for "status" the status and the start of the body, for "json" the
    decoder's message; empty otherwise."""

    def __init__(self, kind: FailureKind, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind: FailureKind = kind
        self.detail = detail


async def post_json(
    client: httpx.AsyncClient,
    url: str,
    body: object,
    *,
    headers: Mapping[str, str],
    seconds: float,
    max_bytes: int,
) -> Any:
    """POST `body` as JSON and decode the answer; raises `HttpFailure`.

    `seconds` is the request's whole timeout. A body over `max_bytes` is read in chunks and
    dropped past the cap, so a runaway or hostile server cannot fill memory.

    Cancellation: the request is abandoned; its connection is dropped, not reused.
    """
    import httpx  # loaded already: `client` is one

    try:
        async with client.stream(
            "POST", url, json=body, headers=dict(headers), timeout=httpx.Timeout(seconds)
        ) as response:
            raw = await _read_capped(response, max_bytes)
    except httpx.TimeoutException:
        raise HttpFailure("timeout") from None
    except httpx.HTTPError as exc:
        raise HttpFailure("network", f"{type(exc).__name__}: {exc}") from exc
    if raw is None:
        raise HttpFailure("too_large")
    if not response.is_success:
        said = " ".join(raw.decode("utf-8", "replace")[:ERROR_BODY_CHARS].split())
        status = f"{response.status_code} {response.reason_phrase}".strip()
        raise HttpFailure("status", status + (f": {said}" if said else ""))
    try:
        return json.loads(raw)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise HttpFailure("json", str(exc)) from None


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
