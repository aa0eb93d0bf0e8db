"""Durable sessions, told through the session manager on real stores.

Two ``SessionManager``\\s on one store stand for two replicas behind a load
balancer: a bot moves between them, they race for a compaction, one of them
stalls past its lease. Then the stores fail (Redis goes away, the SQLite
file is locked or full) and come back.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from voice_context.core.config import SessionConfig
from voice_context.core.turns import Note, Turn
from voice_context.errors import StoreError
from voice_context.manager import CompactionEvent, SessionManager
from voice_context.store.base import SessionRecord, Store
from voice_context.store.redis import RedisStore
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.fakes import ScriptedSummarizer, SlowSummarizer
from voice_context.testing.redis_server import RedisServer

#: Guards against a hang, never a measurement; slow machines raise the scale.
TIMEOUT = 10.0 * float(os.environ.get("VOICE_CONTEXT_TEST_TIMEOUT_SCALE", "1"))
T0 = 1714572187.0
#: Folds 2 turns once more than 6 lie at or after the cursor; retries at once after a failure.
SMALL = SessionConfig(recent_window=4, batch_size=2, retry_base_seconds=0.0, retry_max_seconds=0.0)


def turn(i: int) -> Turn:
    return Turn(("Alice", "Bob")[i % 2], "user", f"turn {i}", T0 + i, id=f"t{i}")


def note(i: int) -> Note:
    return Note(f"screen {i}", T0 + i, speaker="Alice", source="game")


async def wait_until(predicate: Callable[[], bool]) -> None:
    with anyio.fail_after(TIMEOUT):
        while not predicate():  # noqa: ASYNC110 - state owned by the code under test
            await anyio.sleep(0.002)


async def settle(manager: SessionManager) -> None:
    """Wait until every fold started on this replica so far has landed."""
    with anyio.fail_after(TIMEOUT):
        await manager.settled()


class Held:
    """A summarizer that answers ``words`` only once the test lets it."""

    def __init__(self, words: str) -> None:
        self.words = words
        self.started = 0
        self.release = anyio.Event()

    @property
    def model(self) -> str:
        return "held"

    async def summarize(self, request: SummaryRequest) -> str:
        self.started += 1
        await self.release.wait()
        return self.words


class ShortLeases:
    """A store whose compaction leases last ``ttl`` seconds, whatever the replica asks for:
    a replica that stalls longer than that has lost its lease, as a paused process would."""

    def __init__(self, inner: Store, ttl: float) -> None:
        self.inner = inner
        self.ttl = ttl

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        return await self.inner.acquire_lease(name, holder, self.ttl)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("redis")) as server:
        yield server


@dataclass
class Shared:
    """Makes stores that all see the same sessions: one SQLite file, or one Redis prefix."""

    kind: str
    path: Path
    url: str = ""
    prefix: str = ""

    def store(self) -> Store:
        if self.kind == "sqlite":
            return SQLiteStore(self.path)
        return RedisStore(self.url, prefix=self.prefix)


@pytest.fixture(params=["sqlite", "redis"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Shared:
    if request.param == "sqlite":
        return Shared("sqlite", tmp_path / "voice-context.db")
    server: RedisServer = request.getfixturevalue("redis_server")
    return Shared("redis", tmp_path, server.url, f"t{uuid.uuid4().hex[:8]}")


Replica = Callable[[Store, Summarizer, str], Awaitable[SessionManager]]


@contextlib.asynccontextmanager
async def running() -> AsyncIterator[Replica]:
    """``await replica(store, summarizer, name)`` starts a manager that runs until the block ends."""
    async with contextlib.AsyncExitStack() as stack:

        async def replica(store: Store, summarizer: Summarizer, name: str) -> SessionManager:
            stack.push_async_callback(store.aclose)
            return await stack.enter_async_context(
                SessionManager(summarizer, config=SMALL, store=store, replica=name, close_timeout=1)
            )

        yield replica


async def speak(manager: SessionManager, name: str, indices: range, *, owner: str | None = None) -> None:
    for i in indices:
        assert await manager.append_turn(name, turn(i), owner=owner) == i


# -- a bot moving between replicas ---------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_bot_moves_between_replicas_and_nothing_is_lost(shared: Shared) -> None:
    async with running() as replicas:
        a = await replicas(shared.store(), ScriptedSummarizer(["A folded 0-1."]), "replica-a")
        b = await replicas(shared.store(), ScriptedSummarizer(["B folded 0-3."]), "replica-b")

        opened = await a.open("room-1", {"live_note_entries": 2})
        assert not opened.resumed
        await speak(a, "room-1", range(7))
        await a.append_note("room-1", note(1))
        await a.context("room-1")
        await settle(a)
        assert a.state("room-1").cursor == 2

        # the load balancer sends the bot to replica B
        opened = await b.open("room-1")
        assert opened.resumed
        on_b = b.session("room-1")
        assert (on_b.total_turns, on_b.cursor, on_b.summary) == (7, 2, "A folded 0-1.")
        assert on_b.live_notes == (note(1),)
        assert on_b.config.live_note_entries == 2, "the session's own limits travel with it"
        await speak(b, "room-1", range(7, 9))
        await b.append_note("room-1", note(2))
        await b.append_note("room-1", note(3))
        await b.context("room-1")
        await settle(b)
        assert b.state("room-1").cursor == 4

        # and back to replica A, which still holds its old copy of the session
        opened = await a.open("room-1")
        assert opened.resumed
        on_a = a.session("room-1")
        assert (on_a.total_turns, on_a.cursor, on_a.summary) == (9, 4, "B folded 0-3.")
        assert on_a.live_notes == (note(2), note(3))
        assert on_a.pending_notes == (), "B folded the evicted note into its summary"
        await speak(a, "room-1", range(9, 10))

        transcript = await a.store.read_turns("room-1", 0, 100)
        assert transcript == [turn(i) for i in range(10)]


@pytest.mark.asyncio
async def test_a_replica_that_missed_turns_catches_up_and_appends_after_them(shared: Shared) -> None:
    async with running() as replicas:
        a = await replicas(shared.store(), ScriptedSummarizer(), "replica-a")
        b = await replicas(shared.store(), ScriptedSummarizer(), "replica-b")
        await a.open("room-1")
        await speak(a, "room-1", range(3))
        await b.open("room-1")
        await speak(b, "room-1", range(3, 5))  # replica A never heard about these

        carol = Turn("Carol", "user", "me too", T0 + 9)
        assert await a.append_turn("room-1", carol) == 5, "A took the store's view, then appended"

        assert a.state("room-1").turns == 6
        assert await a.store.read_turns("room-1", 0, 10) == [*(turn(i) for i in range(5)), carol]


# -- one compaction at a time across replicas ------------------------------------------------


@pytest.mark.asyncio
async def test_two_replicas_racing_for_one_compaction_land_it_once(shared: Shared) -> None:
    async with running() as replicas:
        held = Held("A's summary of 0-1.")
        slow = SlowSummarizer(held, delay=0.05)
        other = ScriptedSummarizer(["B's summary of 0-1."])
        a = await replicas(shared.store(), slow, "replica-a")
        b = await replicas(shared.store(), other, "replica-b")
        await a.open("room-1")
        await speak(a, "room-1", range(7))
        await b.open("room-1")

        await a.context("room-1")  # A takes the lease and starts summarizing...
        await wait_until(lambda: held.started == 1)
        await b.context("room-1")  # ...while B finds the same batch due
        await settle(b)
        assert other.requests == [], "B never called its summarizer: the lease was taken"
        held.release.set()
        await settle(a)

        record = await a.store.load("room-1")
        assert record is not None
        assert (record.cursor, record.summary, record.compactions) == (2, "A's summary of 0-1.", 1)
        assert a.counters["completed"] + b.counters["completed"] == 1

        # B's copy is behind; once its next attempt holds the lease it finds the batch folded,
        # and catches up instead of folding the same turns again
        events: list[CompactionEvent] = []
        b.add_listener(events.append)
        await b.context("room-1")
        await settle(b)
        assert (other.requests, events, b.counters["stale"]) == ([], [], 1)
        on_b = b.session("room-1")
        assert (on_b.cursor, on_b.summary) == (2, "A's summary of 0-1.")
        record = await b.store.load("room-1")
        assert record is not None and (record.cursor, record.summary) == (2, "A's summary of 0-1.")


@pytest.mark.asyncio
@pytest.mark.parametrize("stalled_returns", ["before", "after"])
async def test_a_replica_that_stalled_past_its_lease_cannot_overwrite_the_newer_summary(
    shared: Shared, stalled_returns: str
) -> None:
    async with running() as replicas:
        stalled, fresh = Held("stale words from A"), Held("fresh words from B")
        a = await replicas(ShortLeases(shared.store(), ttl=0.05), stalled, "replica-a")
        b = await replicas(ShortLeases(shared.store(), ttl=30), fresh, "replica-b")
        await a.open("room-1")
        await speak(a, "room-1", range(7))
        await b.open("room-1")
        await a.context("room-1")
        await wait_until(lambda: stalled.started == 1)

        # A's lease runs out while it is stuck; B takes the lease and summarizes too
        while fresh.started == 0:
            await b.context("room-1")
            await anyio.sleep(0.01)

        first, second = (stalled, fresh) if stalled_returns == "before" else (fresh, stalled)
        first.release.set()
        await settle(a if first is stalled else b)
        second.release.set()
        await settle(a)
        await settle(b)

        record = await a.store.load("room-1")
        assert record is not None
        assert (record.cursor, record.summary, record.compactions) == (2, "fresh words from B", 1)
        assert (a.counters["completed"], b.counters["completed"]) == (0, 1)
        assert b.session("room-1").summary == "fresh words from B"
        if stalled_returns == "after":
            assert a.session("room-1").summary == "fresh words from B", "A caught up when refused"
        await a.open("room-1")  # the bot comes back to A
        assert (a.state("room-1").cursor, a.session("room-1").summary) == (2, "fresh words from B")


# -- memory stays bounded -------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_live_session_keeps_only_the_turns_from_its_cursor(shared: Shared) -> None:
    async with running() as replicas:
        manager = await replicas(shared.store(), ScriptedSummarizer(), "replica-a")
        await manager.open("room-1")

        for i in range(60):
            await manager.append_turn("room-1", turn(i))
            await manager.context("room-1")
            await settle(manager)

        session = manager.session("room-1")
        assert session.stats().compactions >= 25
        assert session.cursor >= 54
        assert session.verbatim_turns == tuple(turn(i) for i in range(session.cursor, 60))
        assert len(session.verbatim_turns) <= SMALL.recent_window + SMALL.batch_size
        assert await manager.store.read_turns("room-1", 0, 60) == [turn(i) for i in range(60)]
        record = await manager.store.load("room-1")
        assert record is not None and record.turns == session.verbatim_turns and record.total_turns == 60


@pytest.mark.asyncio
async def test_a_replica_that_dies_without_closing_anything_is_resumed_from_the_store(shared: Shared) -> None:
    async with running() as replicas:
        store = shared.store()
        crashed = SessionManager(ScriptedSummarizer(["the first two turns"]), config=SMALL, store=store)
        async with crashed:
            await crashed.open("room-1", owner="bot-1")
            await speak(crashed, "room-1", range(8), owner="bot-1")
            await crashed.append_note("room-1", note(4), owner="bot-1")
            await crashed.context("room-1", owner="bot-1")
            await settle(crashed)
            # no close: the process is gone as far as the store can tell

        restarted = await replicas(shared.store(), ScriptedSummarizer(), "replica-b")
        opened = await restarted.open("room-1", owner="bot-1")

        assert opened.resumed
        session = restarted.session("room-1", owner="bot-1")
        assert (session.total_turns, session.cursor, session.summary) == (8, 2, "the first two turns")
        assert session.verbatim_turns == tuple(turn(i) for i in range(2, 8))
        assert session.live_notes == (note(4),)
        await store.aclose()


# -- the store fails, then comes back ----------------------------------------------------------


@pytest.mark.asyncio
async def test_redis_restarted_in_the_middle_of_a_session(tmp_path: Path) -> None:
    async with running() as replicas:
        with RedisServer(directory=tmp_path / "redis") as server:
            store = RedisStore(server.url, retries=1, backoff_base=0.01, backoff_cap=0.05)
            manager = await replicas(store, ScriptedSummarizer(), "replica-a")
            await manager.open("room-1")
            await speak(manager, "room-1", range(5))
            await manager.append_note("room-1", note(1))

            server.stop(kill=True)

            with pytest.raises(StoreError) as failed:
                await manager.append_turn("room-1", turn(5))
            assert failed.value.retryable
            with pytest.raises(StoreError):
                await manager.append_note("room-1", note(2))
            with pytest.raises(StoreError):
                await manager.open("room-2")
            state = manager.state("room-1")
            assert (state.turns, state.live_notes) == (5, 1), "nothing unacknowledged reached the session"
            await manager.context("room-1")  # a context needs no store

            server.start()

            await manager.append_turn("room-1", turn(5))  # the bot sends it again
            await speak(manager, "room-1", range(6, 8))
            await manager.context("room-1")
            await settle(manager)

            # and a Redis that restarts between two requests goes unnoticed
            server.restart(kill=True)
            await speak(manager, "room-1", range(8, 9))

            record = await store.load("room-1")
            assert record is not None
            assert record.total_turns == 9
            assert await store.read_turns("room-1", 0, 9) == [turn(i) for i in range(9)]
            assert record.live_notes == (note(1),)
            assert record.cursor == manager.state("room-1").cursor == 2
            assert store.errors >= 3


@pytest.mark.asyncio
async def test_a_compaction_that_meets_a_dead_redis_fails_cleanly_and_lands_later(tmp_path: Path) -> None:
    async with running() as replicas:
        with RedisServer(directory=tmp_path / "redis") as server:
            store = RedisStore(server.url, retries=0)
            held = Held("the first two turns")
            manager = await replicas(store, held, "replica-a")
            events: list[CompactionEvent] = []
            manager.add_listener(events.append)
            await manager.open("room-1")
            await speak(manager, "room-1", range(7))
            await manager.context("room-1")
            await wait_until(lambda: held.started == 1)

            server.stop(kill=True)
            held.release.set()
            await settle(manager)

            assert [(e.kind, e.error, e.retryable) for e in events] == [("failed", "store", True)]
            assert manager.state("room-1").cursor == 0, "the session did not move without the store"

            server.start()
            while manager.state("room-1").cursor == 0:
                await manager.context("room-1")
                await settle(manager)
            # read back through a store of its own: this one keeps no retries, and a connection
            # it pooled before the restart may still be the first it takes
            reader = RedisStore(server.url)
            record = await reader.load("room-1")
            await reader.aclose()
            assert record is not None and (record.cursor, record.summary) == (2, "the first two turns")


@pytest.mark.asyncio
async def test_a_locked_sqlite_file_refuses_the_turn_then_recovers(tmp_path: Path) -> None:
    async with running() as replicas:
        path = tmp_path / "voice-context.db"
        store = SQLiteStore(path, busy_timeout=0.05)
        manager = await replicas(store, ScriptedSummarizer(), "replica-a")
        await manager.open("room-1")
        await speak(manager, "room-1", range(3))

        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(StoreError, match="locked") as failed:
            await manager.append_turn("room-1", turn(3))
        assert failed.value.retryable
        assert manager.state("room-1").turns == 3
        reader = SQLiteStore(path)
        assert (await reader.read_turns("room-1", 0, 9)) == [turn(i) for i in range(3)], "readers go on"
        await reader.aclose()
        other.execute("ROLLBACK")
        other.close()

        await manager.append_turn("room-1", turn(3))
        assert await store.read_turns("room-1", 0, 9) == [turn(i) for i in range(4)]


@pytest.mark.asyncio
async def test_a_full_disk_refuses_the_turn_then_recovers(tmp_path: Path) -> None:
    async with running() as replicas:
        store = SQLiteStore(tmp_path / "voice-context.db")
        manager = await replicas(store, ScriptedSummarizer(), "replica-a")
        await manager.open("room-1")
        await speak(manager, "room-1", range(2))
        long = Turn("Alice", "user", "a long story " * 2000, T0 + 2)

        await store.db.run("squeeze", lambda c: c.execute("PRAGMA max_page_count = 1"))  # no room left
        with pytest.raises(StoreError, match="full") as failed:
            await manager.append_turn("room-1", long)
        assert failed.value.retryable
        assert manager.state("room-1").turns == 2

        await store.db.run("free", lambda c: c.execute("PRAGMA max_page_count = 1073741823"))
        assert await manager.append_turn("room-1", long) == 2
        assert await store.read_turns("room-1", 2, 3) == [long]


@pytest.mark.asyncio
async def test_a_session_created_elsewhere_keeps_its_owner(shared: Shared) -> None:
    store = shared.store()
    await store.create(SessionRecord("room-1", owner="bot-1"))
    async with SessionManager(ScriptedSummarizer(), config=SMALL, store=store) as manager:
        with pytest.raises(KeyError):
            await manager.open("room-1", owner="bot-2")
        assert (await manager.open("room-1", owner="bot-1")).resumed
    await store.aclose()
