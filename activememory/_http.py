"""What the HTTP clients (the recall model, the judge, the embeddings client) share."""

from __future__ import annotations

import httpx


async def read_capped(response: httpx.Response, max_bytes: int) -> bytes | None:
    """The body, or None when it is larger than `max_bytes` (a runaway or hostile server
    cannot fill memory: the body is read in chunks and dropped past the cap)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
