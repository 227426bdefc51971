"""The loop every poke-driven background actor shares (the reconciler, the embedder): wait
for a poke, work until there is nothing left, wait again (docs/design.md §1.2). Pokes are
one-slot and mean "there may be work": several pokes while working are one more round."""

from __future__ import annotations

from typing import Any

from anyio.streams.memory import MemoryObjectReceiveStream

from ..protocol.errors import MemoryClosedError


class PokedActor:
    """A subclass sets `inbox` and implements `_work`; `busy` is true while it works."""

    inbox: MemoryObjectReceiveStream[Any]
    busy: bool = False

    async def _work(self) -> None:
        raise NotImplementedError

    async def run(self) -> None:
        """Serve pokes until the inbox closes or the writer it uses has closed.

        Cancellation: see the subclass; the loop itself holds nothing.
        """
        async with self.inbox:
            async for _poke in self.inbox:
                if not await self._round():
                    return

    async def _round(self) -> bool:
        """One round of work, `busy` while it runs; False once the writer it uses closed."""
        self.busy = True
        try:
            await self._work()
        except MemoryClosedError:
            return False
        finally:
            self.busy = False
        return True
