"""The store's worker thread: calls run one after another in the thread, each caller gets its own
result, and the thread never waits for the event loop between two calls."""

from __future__ import annotations

import threading

import anyio
import pytest
from serving import TIMEOUT

from voice_context.store.worker import Worker

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
