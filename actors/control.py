"""The control actor: serves other processes' control requests in the process holding the
writers (docs/design.md §1.7), so an operator can erase beside a running bot without a
second writer.

Inbox: the spool folder `state_dir/control/requests` (storage/control.py), looked at every
`POLL_SECONDS` — one `scandir` of an empty folder, off every reply's path. Loop: take each
waiting request (oldest first), decode it, run it through `handle` (which uses the memory's
own writers), write its `ControlResult`. A malformed request, or one that fails, is
answered with an error; it never stops the actor or the bot.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Awaitable, Callable

import anyio
import msgspec

from ..protocol.control import REQUEST_DECODER, ControlRequest, ControlResult
from ..protocol.errors import StorageError
from ..storage.control import MAX_REQUEST_BYTES, Spool

POLL_SECONDS = 0.5

Handle = Callable[[ControlRequest], Awaitable[ControlResult]]


class ControlActor:
    """Owns the serving side of one state directory's spool (its `serve.lock` is held)."""

    def __init__(self, spool: Spool, handle: Handle) -> None:
        self.spool = spool
        self.handle = handle

    async def run(self) -> None:
        """Serve requests until cancelled (the memory closes), then release the spool.

        Cancellation: a request being run gets an error result saying the bot closed
        (what its writers committed stays); waiting requests stay for the next bot.
        """
        try:
            while True:
                for request_id in self.spool.pending():
                    await self._serve(request_id)
                await anyio.sleep(POLL_SECONDS)
        finally:
            self.spool.close()

    async def _serve(self, request_id: str) -> None:
        data = self.spool.take(request_id)
        if data is None:
            return  # withdrawn, or not a file of this user
        result = _error("the bot closed while running the request; run it again to finish")
        try:
            result = await self._answer(data)
        finally:  # no await: a cancellation cannot stop the answer
            with contextlib.suppress(StorageError):  # the asker times out and says so
                self.spool.answer(request_id, msgspec.json.encode(result))

    async def _answer(self, data: bytes) -> ControlResult:
        if len(data) > MAX_REQUEST_BYTES:
            return _error(f"request: larger than {MAX_REQUEST_BYTES} bytes")
        try:
            request = REQUEST_DECODER.decode(data)
        except msgspec.DecodeError as exc:  # ValidationError included: it names the field
            return _error(f"request: {exc}")
        try:
            return await self.handle(request)
        except Exception as exc:  # an operator's request must never take the bot down
            return _error(str(exc) or type(exc).__name__)


def _error(text: str) -> ControlResult:
    return ControlResult(served_by=os.getpid(), error=text)
