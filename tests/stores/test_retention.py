"""Retention: a session idle past ``[store] session_ttl`` is forgotten, with its recording; one
that is open is never forgotten under its client. On a real SQLite file and a real Redis."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from helpers import ManualClock, turn
from serving import TIMEOUT, running, settings, wire

from voice_context.config import Settings
from voice_context.core.landmarks import Landmark
from voice_context.core.tiers import TierSummary
from voice_context.core.turns import Note
from voice_context.errors import ConfigError
from voice_context.recall.index import indexed, note_passage, turn_passage
from voice_context.server import recording_name
from voice_context.store.base import SessionRecord, Store
from voice_context.store.redis import RedisStore
from voice_context.store.sqlite import SQLiteStore
from voice_context.testing.redis_server import RedisServer

#: Short, yet ten sweeps a ttl leave a busy machine most of it to spare (slow machines raise the scale).
TTL = TIMEOUT / 5


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("redis")) as server:
        yield server


@asynccontextmanager
async def a_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """A real store of ``kind`` whose sessions are forgotten after ``TTL`` seconds idle."""
    store: Store
    if kind == "sqlite":
        store = SQLiteStore(tmp_path / "voice-context.db", session_ttl=TTL)
    else:
        url = request.getfixturevalue("redis_server").url
        store = RedisStore(url, prefix=f"t{uuid.uuid4().hex[:8]}", session_ttl=TTL)
    try:
        yield store
    finally:
        await store.aclose()


# -- the stores --------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_sqlite_forgets_a_session_idle_past_its_ttl_and_keeps_one_touched_meanwhile(
    tmp_path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(tmp_path / "voice-context.db", clock=clock, session_ttl=3600)
    try:
        for name in ("busy", "open", "idle"):
            await store.create(SessionRecord(name))
            await store.append_turn(name, 0, turn(0))
        clock.advance(3000)
        await store.append_turn("busy", 1, turn(1))  # every write is activity
        await store.touch(["open"])  # a server still serves it
        clock.advance(1000)  # "idle" has been idle 4,000 s

        assert await store.expire() == ["idle"]
        assert await store.load("idle") is None
        assert await store.read_turns("busy", 0, 10) == [turn(0), turn(1)]
        clock.advance(2599)
        assert await store.expire() == []
        clock.advance(2)
        assert sorted(await store.expire()) == ["busy", "open"]
    finally:
        await store.aclose()


@pytest.mark.asyncio
async def test_sqlite_forgets_any_number_of_sessions_a_batch_at_a_time(
    tmp_path: Path, clock: ManualClock
) -> None:
    store = SQLiteStore(tmp_path / "voice-context.db", clock=clock, session_ttl=10)
    try:
        for i in range(250):
            await store.create(SessionRecord(f"room-{i}"))
        clock.advance(11)
        assert len(await store.expire()) == 250
        assert await store.load("room-249") is None
    finally:
        await store.aclose()


@pytest.mark.asyncio
async def test_redis_sets_every_key_of_a_session_to_expire_together_on_each_write(
    redis_server: RedisServer,
) -> None:
    store = RedisStore(redis_server.url, prefix=f"t{uuid.uuid4().hex[:8]}", session_ttl=TTL)
    try:
        await store.create(SessionRecord("room-1"))
        await store.append_turn("room-1", 0, turn(0))
        await store.index_turns("room-1", 0, [indexed(turn_passage(0, turn(0)))])
        await store.index_note("room-1", indexed(note_passage(Note("a map", 0.0, "Ann", "game"))))
        await store.save_vectors("room-1", {0: b"v"})
        await store.save_landmark("room-1", Landmark(0, turn(0), "decision", "", "manual", 0.0))
        await store.save_notes("room-1", [], [])
        await store.save_tier("room-1", TierSummary("session", 0.0, 1.0, 0, 1, "Ann: a map.", 0.0))
        keys = store.keys("room-1")
        assert await store.client.exists(*keys.kept) == len(keys.kept), "every key is there"
        for key in keys.kept:
            assert 0 < await store.client.pttl(key) <= TTL * 1000
        await anyio.sleep(TTL * 0.5)
        await store.touch(["room-1"])
        await anyio.sleep(TTL * 0.6)  # 1.1 ttl after the writes, 0.6 after the touch
        assert await store.read_turns("room-1", 0, 10) == [turn(0)]
        await anyio.sleep(TTL * 0.5)  # 1.1 ttl after the touch
        assert await store.load("room-1") is None
        assert await store.client.exists(*keys.kept) == 0, "the recall index went with it"
        assert await store.expire() == []

        await store.create(SessionRecord("room-1"))  # the name is free for a new session
        await store.append_turn("room-1", 0, turn(7))
        assert await store.read_turns("room-1", 0, 10) == [turn(7)]
        stats, _, _ = await store.recall_postings("room-1", ["map"])
        assert (stats.turns, stats.notes) == (0, 0), "a new session starts with an empty index"
    finally:
        await store.aclose()


def test_a_ttl_is_optional_and_the_sweep_must_come_often_enough_to_keep_open_sessions() -> None:
    assert Settings().store.session_ttl is None, "kept forever unless configured"
    assert Settings().store.retention_interval is None
    assert Settings().with_values("store", {"session_ttl": "86400"}).store.retention_interval == 60
    assert Settings().with_values("store", {"session_ttl": 8}).store.retention_interval == 2
    with pytest.raises(ConfigError, match="at most half"):
        Settings().with_values("store", {"session_ttl": 8, "sweep_interval": 5})
    with pytest.raises(ConfigError, match="positive"):
        Settings().with_values("store", {"session_ttl": 0})


# -- over the wire ------------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["sqlite", "redis"])
async def test_an_idle_closed_session_and_its_recording_are_forgotten_an_open_one_never(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    record_dir = tmp_path / "rec"
    config = settings(record_dir=str(record_dir)).with_values(
        "store", {"session_ttl": TTL, "sweep_interval": TTL / 10}
    )
    async with a_store(kind, tmp_path, request) as store, running(config, store=store) as server:
        async with wire(server) as bot:
            for name in ("left", "open"):
                await bot.open(name)
                await bot.append(name, 0)
            quiet_since = anyio.current_time()  # the bot keeps "open" open, and says nothing
            await bot.request("session.close", session="left")
            left = record_dir / recording_name("left")
            assert left.exists()

            with anyio.fail_after(TIMEOUT):  # "left" goes, recording and all, once a ttl idle
                while await store.load("left") is not None or left.exists():  # noqa: ASYNC110
                    await anyio.sleep(TTL / 10)
            # and "open", as idle, would have gone by a sweep later
            await anyio.sleep(quiet_since + TTL * 1.3 - anyio.current_time())
            assert await store.load("open") is not None, "never forgotten under its client"
            assert (record_dir / recording_name("open")).exists()
            appended = await bot.append("open", 1)
            assert (appended["type"], appended["index"]) == ("turn.appended", 1)

            reopened = await bot.open("left")
            assert (reopened["resumed"], reopened["turns"]) == (False, 0), "a new, empty session"
            await bot.request("session.close", session="open")

        recording = record_dir / recording_name("open")
        with anyio.fail_after(TIMEOUT):  # closed, it goes the same way, recording and all
            while await store.load("open") is not None or recording.exists():  # noqa: ASYNC110
                await anyio.sleep(TTL / 10)
