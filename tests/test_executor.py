"""The thread executor: one connection's calls in order on a thread of its own, fed by a queue
(storage/executor.py, docs/design.md §1.3)."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import anyio.lowlevel
import pytest

from activememory.storage.executor import ThreadExecutor

pytestmark = pytest.mark.anyio

TIMEOUT_S = 10


async def _started(
    tg: anyio.abc.TaskGroup, fn: Callable[..., Awaitable[object]], *args: object
) -> None:
    """Start `fn(*args)` in `tg` and let it run up to where it waits (a call it makes is
    then queued, in the order the tasks were started)."""
    tg.start_soon(fn, *args)
    for _ in range(10):
        await anyio.lowlevel.checkpoint()


def _held(gate: threading.Event, ran: list[str], label: str) -> Callable[[], None]:
    """A call that waits on the thread until `gate` is set, then records `label`."""

    def call() -> None:
        gate.wait(TIMEOUT_S)
        ran.append(label)

    return call


def _wait_until(condition: object, timeout: float = TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.005)
    return False


async def test_the_next_queued_call_starts_without_the_event_loop() -> None:
    """A connection goes from one call to the next on its thread: a busy loop that has not
    yet run the first caller again does not hold the connection idle (with a thread-pool
    hop per call, the next call waited for the loop to release the connection)."""
    executor = ThreadExecutor()
    ran: list[str] = []
    gate, second_ran = threading.Event(), threading.Event()

    def second() -> None:
        ran.append("second")
        second_ran.set()

    with anyio.fail_after(TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            await _started(tg, executor.run, _held(gate, ran, "first"))
            await _started(tg, executor.run, second)
            # The loop is held from here, never awaiting: the thread must go on by itself.
            gate.set()
            assert second_ran.wait(2)
        await executor.aclose()
    assert ran == ["first", "second"] and not executor.running


async def test_calls_run_in_order_on_one_thread_with_the_callers_context() -> None:
    executor = ThreadExecutor()
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("the caller's")
    seen: list[tuple[int, str, str]] = []

    def call(n: int) -> int:
        seen.append((n, threading.current_thread().name, var.get()))
        return n * 10

    with anyio.fail_after(TIMEOUT_S):
        results = [await executor.run(lambda n=n: call(n)) for n in range(5)]
        await executor.aclose()
    assert results == [0, 10, 20, 30, 40]
    assert seen == [(n, "activememory-connection", "the caller's") for n in range(5)]


async def test_a_call_raises_in_its_caller_and_the_thread_serves_on() -> None:
    executor = ThreadExecutor()

    def fail() -> None:
        raise ValueError("in the call")

    with anyio.fail_after(TIMEOUT_S):
        with pytest.raises(ValueError, match="in the call"):
            await executor.run(fail)
        assert await executor.run(lambda: 7) == 7
        await executor.aclose()


async def test_an_idle_thread_ends_and_the_next_call_starts_another() -> None:
    executor = ThreadExecutor(idle_s=0.05)
    with anyio.fail_after(TIMEOUT_S):
        first = await executor.run(threading.current_thread)
        assert executor.running
        assert _wait_until(lambda: not executor.running and not first.is_alive())
        second = await executor.run(threading.current_thread)
        assert second is not first and second.is_alive()
        await executor.aclose()
    assert not executor.running and not second.is_alive()


async def test_calls_queued_after_a_close_are_served() -> None:
    """`aclose` ends the thread once what was queued before it is done; a call queued after
    it is run all the same (by the same thread), and `aclose` does not wait for that."""
    executor = ThreadExecutor(idle_s=0.05)
    gate = threading.Event()
    ran: list[str] = []
    with anyio.fail_after(TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            await _started(tg, executor.run, _held(gate, ran, "before"))
            await _started(tg, executor.aclose)
            await _started(tg, executor.run, lambda: ran.append("after"))
            gate.set()
        assert ran == ["before", "after"]
        assert _wait_until(lambda: not executor.running)  # ended when idle
        assert await executor.run(lambda: "again") == "again"
        await executor.aclose()


async def test_a_cancelled_caller_of_a_queued_call_drops_it() -> None:
    executor = ThreadExecutor()
    gate = threading.Event()
    ran: list[str] = []
    with anyio.fail_after(TIMEOUT_S):
        async with anyio.create_task_group() as tg:
            await _started(tg, executor.run, _held(gate, ran, "first"))
            with anyio.move_on_after(0.01):
                await executor.run(lambda: ran.append("dropped"))
            gate.set()
        assert await executor.run(lambda: ran.append("last")) is None
        await executor.aclose()
    assert ran == ["first", "last"]
