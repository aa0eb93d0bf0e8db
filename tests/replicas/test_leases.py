"""Compaction leases are short and renewed while the fold runs: on a real Redis, over real connections.

A fold slower than the lease keeps it (and lands once); a lease superseded under a
fold cancels it uncommitted; a replica killed with SIGKILL holds up the next fold by
no more than the lease's ttl.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import anyio
import pytest
from serving import TIMEOUT, running, settings, wire
from test_restart import SMALL as PROCESS_SMALL
from test_restart import Serve, bot, compacted, speak, start_together

from voice_context.store.redis import RedisStore
from voice_context.summarizers.fakes import ScriptedSummarizer, SlowSummarizer
from voice_context.testing.openai_server import OpenAIServer, Reply, Stall
from voice_context.testing.redis_server import RedisServer

SMALL = {"recent_window": 2, "batch_size": 1}
#: Short, yet three renewals a ttl leave a busy machine two thirds of it to spare.
LEASE_TTL = TIMEOUT / 5


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("redis")) as server:
        yield server


@asynccontextmanager
async def stores(redis_server: RedisServer, count: int) -> AsyncIterator[list[RedisStore]]:
    """``count`` clients of one Redis under one fresh prefix: the stores of as many replicas."""
    prefix = f"t{uuid.uuid4().hex[:8]}"
    made = [RedisStore(redis_server.url, prefix=prefix) for _ in range(count)]
    try:
        yield made
    finally:
        for store in made:
            await store.aclose()


@pytest.mark.asyncio
async def test_a_fold_slower_than_its_lease_keeps_it_and_no_other_replica_folds_that_batch(
    redis_server: RedisServer,
) -> None:
    slow = SlowSummarizer(ScriptedSummarizer(), delay=LEASE_TTL * 2)
    quick = ScriptedSummarizer()
    async with stores(redis_server, 2) as (east_store, west_store), AsyncExitStack() as stack:
        east = await stack.enter_async_context(
            running(settings(replica="east", lease_ttl=LEASE_TTL), summarizer=slow, store=east_store)
        )
        west = await stack.enter_async_context(
            running(settings(replica="west", lease_ttl=LEASE_TTL), summarizer=quick, store=west_store)
        )
        on_east = await stack.enter_async_context(wire(east))
        on_west = await stack.enter_async_context(wire(west))
        await on_east.open("room-1", config=SMALL)
        for i in range(4):
            await on_east.append("room-1", i)
        await on_east.request("context.get", session="room-1")  # east folds turn 0, for 2 ttls
        await on_west.open("room-1")

        asked = 0
        with anyio.fail_after(TIMEOUT):
            while slow.finished == 0:  # west finds the batch due all along, lease after lease
                await on_west.request("context.get", session="room-1")
                asked += 1
                await anyio.sleep(0.02)
        landed = await on_east.push()
        assert (landed["type"], landed["cursor"]) == ("compaction.completed", 1), landed
        for _ in range(10):  # and once it has landed: west catches up, and starts no fold
            await on_west.request("context.get", session="room-1")
            await west.manager.settled()
        state = await on_west.request("session.state", session="room-1")

        record = await east_store.load("room-1")
        assert record is not None and (record.cursor, record.compactions) == (1, 1)
        assert asked > 10
        assert (slow.started, quick.requests) == (1, []), "the batch was folded once, by east"
        assert state["cursor"] == 1, "west caught up with the store instead"


@pytest.mark.asyncio
async def test_a_lease_granted_to_another_replica_under_a_fold_cancels_it_uncommitted(
    redis_server: RedisServer,
) -> None:
    slow = SlowSummarizer(ScriptedSummarizer(), delay=TIMEOUT)
    async with (
        stores(redis_server, 2) as (store, intruder),
        running(settings(replica="east", lease_ttl=LEASE_TTL), summarizer=slow, store=store) as east,
        wire(east) as bot,
    ):
        await bot.open("room-1", config=SMALL)
        for i in range(4):
            await bot.append("room-1", i)
        await bot.request("context.get", session="room-1")
        with anyio.fail_after(TIMEOUT):
            while slow.started == 0:  # noqa: ASYNC110 - the fake's own counter
                await anyio.sleep(0.01)

        # the lease key is lost (a Redis failover that had not replicated it) and another
        # replica is granted the lease: east's next renewal finds its token superseded
        await store.client.delete(store.keys("room-1").lease)
        taken = await intruder.acquire_lease("room-1", "west", 30)
        assert taken is not None
        lost_at = time.monotonic()
        failed = await bot.push()
        noticed = time.monotonic() - lost_at

        assert (failed["type"], failed["error"], failed["cursor"]) == ("compaction.failed", "lease_lost", 0)
        assert noticed < LEASE_TTL + 0.5, "within a renewal interval, not when the fold ends"
        assert slow.finished == 0, "the summarizer call was cancelled"
        record = await store.load("room-1")
        assert record is not None and (record.cursor, record.summary, record.compactions) == (0, "", 0)


async def renewed(redis_server: RedisServer, name: str) -> None:
    """Returns once the lease on ``name`` has been renewed: its time to live went up in Redis."""
    watcher = RedisStore(redis_server.url)
    try:
        key = watcher.keys(name).lease
        last = await watcher.client.pttl(key)
        while (now := await watcher.client.pttl(key)) <= last:
            last = now
            await anyio.sleep(0.01)
    finally:
        await watcher.aclose()


@pytest.fixture
def servers() -> Iterator[list[Serve]]:
    made: list[Serve] = []
    yield made
    for server in made:
        server.close()


@pytest.mark.asyncio
async def test_a_replica_killed_during_a_fold_holds_up_the_next_one_on_another_replica_one_lease_ttl(
    tmp_path: Path, servers: list[Serve], redis_server: RedisServer
) -> None:
    ttl = LEASE_TTL
    async with OpenAIServer(default=Reply("Alice and Bob agreed to meet on day 1.")) as provider:
        provider.script(Stall())  # the fold under way when the process dies never returns
        east, west = (Serve(redis_server.url, tmp_path / n, tmp_path / f"{n}.log") for n in ("east", "west"))
        for name, serve in (("east", east), ("west", west)):
            serve.env = {
                "VOICE_CONTEXT_SUMMARIZER_KIND": "openai",
                "VOICE_CONTEXT_SUMMARIZER_FOLD": "paragraph",  # the summary is the provider's words
                "VOICE_CONTEXT_SUMMARIZER_BASE_URL": provider.base_url,
                "VOICE_CONTEXT_SUMMARIZER_MODEL": "scripted",
                "VOICE_CONTEXT_SUMMARIZER_MAX_RETRIES": "0",
                "VOICE_CONTEXT_SERVER_REPLICA": name,
                "VOICE_CONTEXT_SERVER_LEASE_TTL": str(ttl),
            }
            servers.append(serve)
        name = f"room-{uuid.uuid4().hex[:6]}"
        url_east, url_west = await start_together(east, west)
        async with bot(url_east) as client:
            room = await client.open(name, PROCESS_SMALL)
            await speak(room, range(8))
            assert (await room.context())["in_flight"] is True
            with anyio.fail_after(TIMEOUT):
                while not provider.completions:  # noqa: ASYNC110 - the provider's own record
                    await anyio.sleep(0.01)
                await renewed(redis_server, name)  # east renews its lease
            east.kill()  # holding it
            killed = time.monotonic()

        async with bot(url_west) as client:
            room = await client.open(name)
            ctx = await compacted(room, 2)
            waited = time.monotonic() - killed
        assert ctx["summary"] == "Alice and Bob agreed to meet on day 1."
        assert waited < ttl + 3.0, waited  # the lease used to run for 125 s
        assert len(provider.completions) == 2
        assert west.stop() == 0
