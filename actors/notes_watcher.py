"""The notes watcher: keeps an agent's notes index following its workspace, off the recall
path (docs/design.md §4.7).

One per agent whose notes a search has read, started by the memory tools on that first
search (`memorySearch.sync.watch`, on by default) and run in the supervisor's task group.
No inbox: it polls. Every `POLL_S` it takes a stat listing of the workspace's note files
(no file is read); when the listing differs from the last one it waits until it has stayed
the same for `watchDebounceMs`, then syncs (the scan that hashes and chunks what changed,
and one `SyncNotes` to the indexer, docs/design.md §4.7). An editor that writes a file
twice within the debounce is synced once, with its final content. A sync that read a file
written in the last two seconds asks for another round after the debounce (and at least one
poll): a second edit within one filesystem timestamp tick that keeps the size leaves the
listing unchanged, and only hashing again catches it. A sync that failed (`StorageError`)
is retried the same way; its error is `last_error` until one succeeds (memory_search shows
it as `syncError`).

The first round syncs unconditionally: an edit between the first search's own scan and the
watcher's first listing is never missed.

Cancellation of `run`: stops between rounds or inside a sync (see `MemoryCore.sync_notes`:
the index is whole either way, and the next sync compares the files with what committed).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable

import anyio

from ..protocol.errors import MemoryClosedError, StorageError

POLL_S = 1.0
"""How often the workspace's note files are stat'ed (seconds): an edit is indexed within
`POLL_S` + `watchDebounceMs` (+ one more poll)."""

Listing = Callable[[], Awaitable[Hashable]]
# Syncs the notes index now; True: sync again after the debounce (a file was still racy).
Sync = Callable[[], Awaitable[bool]]


class NotesWatcher:
    """Owns the polling of one agent's workspace; `syncs` and `last_error` are for tests
    and diagnostics."""

    def __init__(self, agent: str, *, listing: Listing, sync: Sync, debounce_s: float) -> None:
        self.agent = agent
        self._listing = listing
        self._sync = sync
        self.debounce_s = debounce_s
        self.syncs = 0
        self.last_error: str | None = None

    async def run(self) -> None:
        """Poll until cancelled or the memory closes (a sync answered `MemoryClosedError`)."""
        last = await self._listing()
        due: float | None = anyio.current_time()  # when to sync next; the first round: now
        while True:
            if due is None or anyio.current_time() < due:
                await anyio.sleep(POLL_S)
                now = await self._listing()
                if now != last:  # changed since the last poll: the quiet time starts over
                    last, due = now, anyio.current_time() + self.debounce_s
                if due is None or anyio.current_time() < due:
                    continue
            due = None
            try:
                again = await self._sync()
                self.last_error = None
            except MemoryClosedError:
                return
            except StorageError as exc:  # the index stays as it was: retried later
                self.last_error, again = str(exc), True
            self.syncs += 1
            if again:  # at least one poll later: never a busy loop on a failing disk
                due = anyio.current_time() + max(self.debounce_s, POLL_S)
