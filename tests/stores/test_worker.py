"""The store's worker thread: calls run one after another in the thread, each caller gets its own
result, and the thread never waits for the event loop between two calls."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

import anyio
import pytest
from serving import TIMEOUT

from voice_context.worker import Worker

pytestmark = pytest.mark.asyncio


async def test_calls_run_in_order_in_one_thread_and_each_caller_gets_its_own_result_or_error() -> None:
    worker = Worker("test-worker")
    ran: list[tuple[int, str]] = []
    results: dict[int, object] = {}

    def work(k: int) -> int:
        ran.append((k, threading.current_thread().name))
        if k == 3:
            raise ValueError("three is refused")
        return k * 10

    async def ask(k: int) -> None:
        try:
            results[k] = await worker.run(lambda: work(k))
        except ValueError as exc:
            results[k] = str(exc)

    async with anyio.create_task_group() as tg:
        for k in range(6):
            tg.start_soon(ask, k)
            await anyio.lowlevel.checkpoint()  # (in this order)
    worker.stop()

    assert ran == [(k, "test-worker") for k in range(6)]
    assert results == {0: 0, 1: 10, 2: 20, 3: "three is refused", 4: 40, 5: 50}


async def test_the_thread_takes_the_next_call_while_the_event_loop_is_still_busy() -> None:
    """With a limiter of one around a thread pool, the second call would wait until the loop
    had resumed the first call's caller: here the loop is blocked until the second has run."""
    worker = Worker("test-worker")
    first_ran, second_ran = threading.Event(), threading.Event()

    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run, first_ran.set)
        tg.start_soon(worker.run, second_ran.set)
        await anyio.to_thread.run_sync(first_ran.wait, TIMEOUT)
        assert second_ran.wait(TIMEOUT), "the second call ran while the loop was blocked right here"
    worker.stop()


async def test_a_call_cancelled_before_it_starts_never_runs_one_cancelled_while_running_ends_first() -> None:
    worker = Worker("test-worker")
    running, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def slow() -> str:
        running.set()
        release.wait(TIMEOUT)
        ran.append("slow")
        return "slow done"

    told: list[object] = []

    async def call_slow() -> None:
        told.append(await worker.run(slow))

    with anyio.fail_after(TIMEOUT):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call_slow)
            await anyio.to_thread.run_sync(running.wait, TIMEOUT)
            with anyio.move_on_after(0):  # queued behind the slow call: given up before it starts
                await worker.run(lambda: ran.append("queued"))
            tg.cancel_scope.cancel()  # the slow call's caller is cancelled while it runs
            release.set()
        assert await worker.run(lambda: "after") == "after"
    worker.stop()

    assert ran == ["slow"], "the queued call never ran; the running one ran to its end"
    assert told == ["slow done"], "its caller was told what it did before the cancellation reached it"


async def test_the_results_of_calls_run_while_the_loop_is_busy_wake_it_once() -> None:
    """Each result used to wake the loop (a write to its self-pipe, an epoll wake-up): the
    thread now wakes it only when no wake-up is pending, and the loop settles them all."""
    worker = Worker("test-worker")
    loop = asyncio.get_running_loop()
    wakes: list[object] = []
    threadsafe = loop.call_soon_threadsafe

    def counted(callback: Callable[..., object], *args: Any, **kwargs: Any) -> asyncio.Handle:
        wakes.append(callback)
        return threadsafe(callback, *args, **kwargs)

    async def burst(n: int) -> list[int]:
        ran = [0]
        all_ran = threading.Event()

        def work(k: int) -> int:
            ran[0] += 1
            if ran[0] == n:
                all_ran.set()
            return k

        tasks = [asyncio.ensure_future(worker.run(partial(work, k))) for k in range(n)]
        await asyncio.sleep(0)  # every call is given to the thread
        assert all_ran.wait(TIMEOUT), "every call ran while the loop was blocked right here"
        return list(await asyncio.gather(*tasks))

    loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
    try:
        with anyio.fail_after(TIMEOUT):
            assert await burst(20) == list(range(20))
            assert len(wakes) == 1, "twenty results, one wake-up"
            assert await burst(5) == list(range(5))
            assert len(wakes) == 2, "settled, the loop is woken again for the next results"
    finally:
        del loop.call_soon_threadsafe
    worker.stop()


class Held:
    """A call that tells the test it is running, waits for the test to let it go, then ends as
    ``end`` does."""

    def __init__(self, end: Callable[[], object]) -> None:
        self.running, self.release = threading.Event(), threading.Event()
        self.end = end

    def __call__(self) -> object:
        self.running.set()
        self.release.wait(TIMEOUT)
        return self.end()


def refuse() -> object:
    raise ValueError("refused after all")


async def test_a_call_cancelled_while_running_that_fails_tells_its_caller_the_error() -> None:
    worker = Worker("test-worker")
    failing = Held(refuse)
    told: list[object] = []

    async def call_failing() -> None:
        try:
            told.append(await worker.run(failing))
        except ValueError as exc:
            told.append(str(exc))

    loop = asyncio.get_running_loop()
    unread: list[dict[str, Any]] = []  # futures whose exception nobody read, as the loop hears of them
    loop.set_exception_handler(lambda _, context: unread.append(context))
    try:
        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call_failing)
                await anyio.to_thread.run_sync(failing.running.wait, TIMEOUT)
                tg.cancel_scope.cancel()
                failing.release.set()
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    worker.stop()

    assert told == ["refused after all"]
    assert unread == [], "the error was read from the future it was set on"


async def test_a_call_whose_loop_closed_before_it_ended_is_dropped_and_the_thread_runs_on() -> None:
    worker = Worker("test-worker")
    slow = Held(lambda: "nobody hears this")

    def elsewhere() -> None:
        """Another thread's loop: the call's caller is given up there, and the loop closed."""

        async def main() -> None:
            task = asyncio.ensure_future(worker.run(slow))
            await asyncio.sleep(0)
            assert slow.running.wait(TIMEOUT)
            task.cancel()  # it runs: its caller waits for it, shielded...
            await asyncio.sleep(0)
            task.cancel()  # ...unless cancelled again outside any cancel scope
            with contextlib.suppress(asyncio.CancelledError):
                await task

        other = asyncio.new_event_loop()
        try:
            other.run_until_complete(main())
        finally:
            other.close()

    with anyio.fail_after(TIMEOUT):
        await anyio.to_thread.run_sync(elsewhere)
        slow.release.set()
        assert await worker.run(lambda: "next") == "next"
    worker.stop()
    assert not worker._ran, "nothing is kept for the closed loop"
