"""Control requests (docs/design.md §1.7): what a bot's control actor runs for another
process, and the asking side the CLI uses when the store is held by a bot."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec

from ._userdata import check_identity
from .protocol.control import RESULT_DECODER, ControlRequest, ControlResult, EraseRequest
from .protocol.errors import StorageError
from .protocol.userdata import ErasureSummary
from .storage.control import Spool

if TYPE_CHECKING:
    from ._memory import Memory

RESULT_POLL_SECONDS = 0.05


async def serve_request(memory: Memory, request: ControlRequest) -> ControlResult:
    """Run one control request through `memory`'s own writers (the bot's side)."""
    match request:
        case EraseRequest(identity=identity):
            erasure = await memory.erase_identity(identity)
            return ControlResult(served_by=os.getpid(), erasure=erasure)


def bot_serves(state_dir: Path) -> bool:
    """Whether a running bot serves `state_dir`'s control requests now."""
    return Spool(state_dir).served()


async def erase_through_bot(
    state_dir: Path, identity: str, *, within: float
) -> tuple[ErasureSummary, int]:
    """Ask the bot serving `state_dir` to erase `identity`; its summary and pid.

    Raises `StorageError` when no answer comes within `within` seconds (saying whether the
    request was withdrawn, so nothing happened, or the bot is still running it), and
    `InvalidInputError`/`StorageError` with the bot's words when it refused.

    Cancellation: as a timeout; a request the bot has taken is finished by the bot.
    """
    identity = check_identity(identity)  # refused here, before the bot sees it
    spool = Spool(state_dir)
    request_id = spool.ask(msgspec.json.encode(EraseRequest(identity=identity)))
    data: bytes | None = None
    try:
        with anyio.move_on_after(within):
            # Another process writes the result: a file to look for, no event to wait on.
            while (data := spool.result(request_id)) is None:  # noqa: ASYNC110
                await anyio.sleep(RESULT_POLL_SECONDS)
    finally:
        withdrawn = data is None and spool.withdraw(request_id)  # also when cancelled
    if data is None and withdrawn:
        raise StorageError(
            f"no bot answered within {within:g} s (is it stuck?); the request was "
            "withdrawn: nothing was erased"
        )
    if data is None:
        raise StorageError(
            f"the bot took the request but has not answered within {within:g} s; it "
            "finishes it on its own: check with `activememory erase --dry-run`"
        )
    result = RESULT_DECODER.decode(data)
    if result.error is not None or result.erasure is None:
        raise StorageError(f"the running bot (pid {result.served_by}) refused: {result.error}")
    return result.erasure, result.served_by
