"""What a server lets go of comes back: its RSS before and after churn, over a real ``serve`` process.

``serve`` freezes what survived out of the garbage collector's reach; a reference cycle
frozen is never collected. Closed connections used to leave one each (asyncio's transport
held a bound method of itself), and at a freeze every 0.1 s, 600 clients left 30 MB behind.
What a churn leaves now is free memory that the C allocator keeps: 300 visits (each
sends a 50 KB frame) left 5-8 MB behind a server that thawed only once they had gone, with
as many Python objects alive as before them, until ``malloc_trim`` at that thaw handed it
all back."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from serving import TIMEOUT, Wire, serve_process
from websockets.asyncio.client import connect

FREEZE_SECONDS = 0.1
#: orjson gives up at 1,024 levels: a ``bad_request`` reply, and the connection stays open
DEEP = "[" * 50_000
CLIENTS = 300
AT_ONCE = 8
STAYING = 2
#: what may stay of the churn once no client is connected (freezes without the collections kept 30 MB)
TOLERANCE_MB = 4.0


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


async def visit(url: str, name: str) -> None:
    """A client that opens a session, sends a frame that is no message, and leaves."""
    async with connect(url, open_timeout=TIMEOUT) as ws:
        bot = Wire(ws)
        assert (await bot.open(name))["type"] == "session.opened"
        await bot.send(DEEP)
        assert (await bot.reply())["code"] == "bad_request"


async def stay_and_pester(url: str, done: anyio.Event) -> None:
    """A client that stays connected, sending frames too deep to read until the others are done."""
    async with connect(url, open_timeout=TIMEOUT) as ws:
        bot = Wire(ws)
        while not done.is_set():
            await bot.send(DEEP)
            assert (await bot.reply())["code"] == "bad_request"


async def churn(url: str, clients: int, tag: str) -> None:
    """``clients`` visits, ``AT_ONCE`` at a time, beside ``STAYING`` clients that stay connected."""
    done = anyio.Event()

    async def visits(first: int) -> None:
        for i in range(first, clients, AT_ONCE):
            await visit(url, f"{tag}-{i}")

    async with anyio.create_task_group() as tg:
        for _ in range(STAYING):
            tg.start_soon(stay_and_pester, url, done)
        async with anyio.create_task_group() as visitors:
            for first in range(AT_ONCE):
                visitors.start_soon(visits, first)
        done.set()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
@pytest.mark.asyncio
async def test_memory_churned_through_comes_back_once_the_clients_are_gone() -> None:
    env = {"VOICE_CONTEXT_SERVER_GC_FREEZE_SECONDS": str(FREEZE_SECONDS)}
    async with serve_process("--store", "memory", "--log-level", "warning", env=env) as running:
        pid = running.process.pid
        with anyio.fail_after(TIMEOUT * 10):
            await churn(running.url, CLIENTS // 4, "warm")  # the allocator's pools and the caches fill
            before = rss_mb(pid)
            await churn(running.url, CLIENTS, "churn")
        peak = after = rss_mb(pid)
        # the thaw runs at the first check that finds no client connected: wait for it
        with anyio.move_on_after(TIMEOUT):
            while after > before + TOLERANCE_MB:
                await anyio.sleep(FREEZE_SECONDS)
                after = rss_mb(pid)
        assert running.process.returncode is None
    assert after <= before + TOLERANCE_MB, f"RSS {before:.1f} MB, {peak:.1f} after churn, {after:.1f} at rest"
