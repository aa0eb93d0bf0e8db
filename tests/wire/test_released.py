"""A closed connection is freed by reference count: nothing of it waits for the garbage collector.

``serve`` keeps the cyclic collector off the live sessions by freezing what survived, so a
cycle that dies frozen waits for a thaw, a full collection that stops every reply. CPython
3.11's socket transport is such a cycle (it holds a bound method of itself); the server's
connections break it once they are lost, and so do :class:`voice_context.client.Client`'s, in
the bot's own process. The server here is real, on 127.0.0.1, and so are its clients.
"""

from __future__ import annotations

import asyncio.selector_events
import gc
from collections.abc import Iterator

import anyio.lowlevel
import pytest
from serving import T0, running, wait_until, wire

from voice_context.client import Client


@pytest.fixture
def cycles_kept() -> Iterator[list[object]]:
    """What the collections within the test find unreachable, kept for the test to look at."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield gc.garbage
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def unlost(port: int) -> list[asyncio.BaseTransport]:
    """This process's socket transports to or from ``port`` whose connection is not lost yet."""
    kind = asyncio.selector_events._SelectorSocketTransport
    return [
        o
        for o in gc.get_objects()
        if type(o) is kind  # (type, not isinstance: gc also lists dead weak proxies)
        and o._sock is not None  # (set to None once the connection is lost)
        and port in (o.get_extra_info("sockname")[1], o.get_extra_info("peername")[1])
    ]


async def every_connection_lost(port: int) -> None:
    """Wait until every connection to ``port`` is lost, on both sides, and so released."""
    await wait_until(lambda: not unlost(port))
    await anyio.lowlevel.checkpoint()  # a lost transport is released by the callback after


@pytest.mark.asyncio
async def test_a_closed_connection_leaves_no_transport_for_the_collector(cycles_kept: list[object]) -> None:
    async with running() as server:
        for n in range(10):
            async with wire(server) as bot:
                await bot.open(f"call-{n}")
                assert (await bot.append(f"call-{n}", 0))["type"] == "turn.appended"
        await every_connection_lost(server.port)
        gc.collect()
        kind = asyncio.selector_events._SelectorSocketTransport
        transports = [o for o in cycles_kept if isinstance(o, kind)]
        ends = [t.get_extra_info("sockname")[1] for t in transports]
        # (this process's clients are the other ends: their transports, not the server's, stay cycles)
        assert server.port not in ends, f"{ends.count(server.port)} of the server's transports left in cycles"


@pytest.mark.asyncio
async def test_the_client_leaves_no_transport_for_the_collector_either(cycles_kept: list[object]) -> None:
    """A bot that reconnects (a call, a restart of the sidecar) makes a connection each time: its
    own process's collector need not walk what each one left."""
    async with running() as server:
        for n in range(10):
            async with Client(server.url) as client:
                call = await client.open(f"call-{n}")
                await call.append_turn("Ann", "user", "Hello?", at=T0 + n)
        await every_connection_lost(server.port)
        gc.collect()
        kind = asyncio.selector_events._SelectorSocketTransport
        transports = [o for o in cycles_kept if isinstance(o, kind)]
        assert not transports, f"{len(transports)} transports left in cycles"
