"""The blocking facade, for hosts with no event loop (docs/design.md §1.3, §6, §9).

`activememory.sync.open_memory(...)` runs the library on an event loop of its own in a
background thread (an anyio blocking portal, trio by default) and hands back the same
objects as the async API, with every coroutine method turned into a blocking call that
returns the same result:

    with am.sync.open_memory("state") as mem:
        mem.sessions.append("agent:main:direct:alice", am.Message(role="user", content="hi"))
        out = mem.recall(am.Turn(...))
        hits = mem.records.thread(user_id="u1", agent_id="main", thread_id="t1").search("seat")

Callables handed in (`models`, `tools`, the `respond` of `reply`) must still be async: they
run on the library's loop.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Iterator
from typing import Any

import anyio.from_thread
import sniffio

from . import _memory
from .protocol.errors import InvalidInputError

__all__ = ["SyncProxy", "open_memory"]


@contextlib.contextmanager
def open_memory(
    state_dir: str | os.PathLike[str], *, backend: str = "trio", **kwargs: Any
) -> Iterator[Any]:
    """Open the memory on a background event loop; yield a blocking proxy of `am.Memory`.

    Takes the keyword arguments of `am.open_memory` (`storage="postgresql://..."` among
    them) and `backend`: "trio" or "asyncio" for the background loop. On exit the memory closes as the async one does (queued commands
    committed first), then the loop stops.

    Cancellation: there is none in blocking code; a KeyboardInterrupt while a call waits
    leaves that call running to completion on the background loop before the memory closes.
    """
    with anyio.from_thread.start_blocking_portal(backend=backend) as portal:
        manager = portal.wrap_async_context_manager(_memory.open_memory(state_dir, **kwargs))
        with manager as memory:
            yield SyncProxy(portal, memory)


class SyncProxy:
    """A blocking view of an object of the async API: its coroutine methods block.

    Attributes that are themselves API objects (`mem.sessions`, `mem.records`,
    `mem.records.store`) and API objects returned by plain methods
    (`mem.records.thread(...)`) are proxied too; everything else is returned as it is.
    """

    def __init__(self, portal: anyio.from_thread.BlockingPortal, target: object) -> None:
        self._portal = portal
        self._target = target

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if inspect.iscoroutinefunction(value):

            @functools.wraps(value)
            def blocking(*args: Any, **kwargs: Any) -> Any:
                _refuse_inside_event_loop(name)
                return self._portal.call(functools.partial(value, *args, **kwargs))

            return blocking
        if callable(value) and not isinstance(value, type):

            @functools.wraps(value)
            def plain(*args: Any, **kwargs: Any) -> Any:
                # On the loop's thread too: plain methods may read the loop's clock.
                result = self._portal.call(functools.partial(value, *args, **kwargs))
                return self._wrap(result)

            return plain
        return self._wrap(value)

    def _wrap(self, value: object) -> Any:
        if _is_api_object(value):
            return SyncProxy(self._portal, value)
        return value

    def __repr__(self) -> str:
        return f"<sync {self._target!r}>"


def _refuse_inside_event_loop(name: str) -> None:
    """A blocking call from async code would freeze that loop (and deadlock with ours)."""
    try:
        library = sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return
    raise InvalidInputError(
        f"{name}: activememory.sync called from inside a running {library} event loop; "
        "use the async API (await mem...) there"
    )


def _is_api_object(value: object) -> bool:
    """An object of ours with async methods (a facade), as opposed to a result or a Struct."""
    cls = type(value)
    if not cls.__module__.startswith("activememory.") or isinstance(value, type):
        return False
    return any(
        inspect.iscoroutinefunction(getattr(cls, attr, None))
        for attr in dir(cls)
        if not attr.startswith("__")
    )
