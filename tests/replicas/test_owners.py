"""Who owns a session: decided once, by the store, however many replicas serve it.

Two real servers share one store (a real Redis, or one SQLite file through two
connections), as two replicas behind a load balancer do. Two bots with different
tokens open the same new names at the same moment, each through its own replica:
for every name exactly one of them gets it, and the other can never read it, write
it, or open it again, on either replica, not even after its owner closed it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers import TIMEOUT
from serving import Wire, running, serve_process, settings, wire
from websockets.asyncio.client import connect

from voice_context.core.turns import Turn
from voice_context.errors import UnknownSession
from voice_context.manager import SessionManager
from voice_context.server import Server, owner_of
from voice_context.store.base import Store
from voice_context.store.memory import MemoryStore
from voice_context.store.redis import RedisStore
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.fakes import ScriptedSummarizer
from voice_context.testing.redis_server import RedisServer

TOKENS = ("alpha-token", "beta-token")
#: names raced at once in one round: enough that the old check-then-create lost most of them
NAMES = 50
ROUNDS = 3


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(params=["redis", "sqlite"])
def shared(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], Store]:
    """Makes stores that see the same sessions: one Redis prefix, or one SQLite file (each
    store its own connections, as two processes on the file have)."""
    if request.param == "sqlite":
        path = tmp_path / "voice-context.db"
        return lambda: SQLiteStore(path)
    server: RedisServer = request.getfixturevalue("redis_server")
    prefix = f"t{uuid.uuid4().hex[:8]}"
    return lambda: RedisStore(server.url, prefix=prefix)


@contextlib.asynccontextmanager
async def two_replicas(shared: Callable[[], Store]) -> AsyncIterator[tuple[Server, Server, Store]]:
    """Two servers on one shared store, with tokens; and a third store to look into it."""
    config = settings(auth_tokens=TOKENS, max_sessions_per_connection=NAMES)
    stores = [shared(), shared(), shared()]
    try:
        async with (
            running(config, store=stores[0]) as east,
            running(config, store=stores[1]) as west,
        ):
            yield east, west, stores[2]
    finally:
        for store in stores:
            await store.aclose()


async def ask_all(bot: Wire, requests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Send every request at once (the server works on each session apart), then read every
    answer; the answers by session."""
    for request in requests:
        bot.ids += 1
        await bot.send({"id": bot.ids, **request})
    answers = [await bot.reply() for _ in requests]
    return {answer["session"]: answer for answer in answers}


async def open_at_once(bots: dict[str, Wire], names: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Every bot opens every name, all at the same time: the answers by token, then by name."""
    answers: dict[str, dict[str, dict[str, Any]]] = {}
    opens = [{"type": "session.open", "session": name} for name in names]

    async def race(token: str, bot: Wire) -> None:
        answers[token] = await ask_all(bot, opens)

    async with anyio.create_task_group() as tg:
        for token, bot in bots.items():
            tg.start_soon(race, token, bot)
    return answers


@pytest.mark.asyncio
async def test_two_tokens_racing_for_new_names_through_two_replicas_each_name_gets_one_owner(
    shared: Callable[[], Store],
) -> None:
    async with (
        two_replicas(shared) as (east, west, store),
        wire(east, token="alpha-token") as alpha,
        wire(west, token="beta-token") as beta,
        wire(east, token="beta-token") as beta_east,
        wire(west, token="alpha-token") as alpha_west,
    ):
        bots = {"alpha-token": alpha, "beta-token": beta}
        elsewhere = {"alpha-token": beta_east, "beta-token": alpha_west}  # the loser, on the other replica
        for round in range(ROUNDS):
            names = [f"room-{round}-{i}" for i in range(NAMES)]
            answers = await open_at_once(bots, names)  # alpha through east, beta through west

            winners: dict[str, str] = {}
            for name in names:
                got = {token: answers[token][name] for token in TOKENS}
                opened = [token for token in TOKENS if got[token]["type"] == "session.opened"]
                assert len(opened) == 1, (name, got)
                [winners[name]] = opened
                [loser] = [token for token in TOKENS if token != winners[name]]
                assert got[loser]["code"] == "unknown_session", (name, got)

            for name in names:  # the owner speaks; the other asks for everything, on both replicas
                owner = winners[name]
                loser = "beta-token" if owner == "alpha-token" else "alpha-token"
                said = await bots[owner].request(
                    "turn.append",
                    session=name,
                    turn={"speaker": "Alice", "role": "user", "text": f"secret of {owner}", "at": 1.0},
                )
                assert said["type"] == "turn.appended", said
                for bot in (bots[loser], elsewhere[owner]):
                    for asked in (
                        {"type": "context.get", "session": name},
                        {"type": "session.state", "session": name},
                        {"type": "turn.append", "session": name,
                         "turn": {"speaker": "Eve", "role": "user", "text": "mine now", "at": 2.0}},
                        {"type": "session.open", "session": name},
                    ):  # fmt: skip
                        answer = await bot.request(**asked)
                        assert answer.get("code") == "unknown_session", (name, asked, answer)

            # the owners close every name; the others open them again, on both replicas
            for token in TOKENS:
                mine = [name for name in names if winners[name] == token]
                closed = await ask_all(bots[token], [{"type": "session.close", "session": n} for n in mine])
                assert {a["type"] for a in closed.values()} <= {"session.closed"}
            for bot in (alpha, beta, alpha_west, beta_east):
                token = "alpha-token" if bot in (alpha, alpha_west) else "beta-token"
                theirs = [name for name in names if winners[name] != token]
                again = await ask_all(bot, [{"type": "session.open", "session": n} for n in theirs])
                for name in theirs:
                    assert again[name].get("code") == "unknown_session", (name, again[name])

            for name in names:
                record = await store.load(name)
                assert record is not None and record.owner == owner_of(winners[name]), name
                assert [t.text for t in record.turns] == [f"secret of {winners[name]}"], name


# -- a replica holding a copy of a session whose name another owner has taken since ----------------


@contextlib.asynccontextmanager
async def two_managers(shared: Callable[[], Store]) -> AsyncIterator[tuple[SessionManager, SessionManager]]:
    """Two replicas' session managers on one shared store."""
    async with contextlib.AsyncExitStack() as stack:
        managers = []
        for name in ("east", "west"):
            store = shared()
            stack.push_async_callback(store.aclose)
            manager = SessionManager(ScriptedSummarizer(), store=store, replica=name, close_timeout=1)
            managers.append(await stack.enter_async_context(manager))
        yield managers[0], managers[1]


def said(who: str, i: int) -> Turn:
    return Turn(who, "user", f"{who}'s secret {i}", float(i))


@pytest.mark.asyncio
async def test_a_copy_left_on_a_replica_after_its_session_was_deleted_never_serves_the_new_owners(
    shared: Callable[[], Store],
) -> None:
    async with two_managers(shared) as (east, west):
        await east.open("room-1", owner="alpha")  # an old connection of alpha's stays on east
        await west.open("room-1", owner="alpha")
        await west.append_turn("room-1", said("alpha", 0), owner="alpha")
        await west.delete("room-1", owner="alpha")
        await west.open("room-1", owner="beta")  # the name is free: beta takes it
        for i in range(2):
            await west.append_turn("room-1", said("beta", i), owner="beta")

        # east's copy is alpha's: its next append meets beta's turns in the store
        with pytest.raises(UnknownSession):
            await east.append_turn("room-1", said("alpha", 1), owner="alpha")
        with pytest.raises(UnknownSession):
            await east.context("room-1", owner="alpha")
        with pytest.raises(UnknownSession):
            await east.open("room-1", owner="alpha")
        assert "room-1" not in east.names()

        record = await west.store.load("room-1")
        assert record is not None and record.owner == "beta"
        assert [t.text for t in record.turns] == ["beta's secret 0", "beta's secret 1"]
        opened = await east.open("room-1", owner="beta")  # and beta may open it on east too
        assert (opened.resumed, opened.stats.turns) == (True, 2)


@pytest.mark.asyncio
async def test_a_stale_copy_neither_deletes_the_new_owners_session_nor_keeps_it_from_them(
    shared: Callable[[], Store],
) -> None:
    async with two_managers(shared) as (east, west):
        for manager in (east, west):
            await manager.open("room-1", owner="alpha")
        await west.delete("room-1", owner="alpha")
        await west.open("room-1", owner="beta")
        await west.append_turn("room-1", said("beta", 0), owner="beta")

        with pytest.raises(UnknownSession):
            await east.delete("room-1", owner="alpha")  # east's copy was alpha's
        record = await west.store.load("room-1")
        assert record is not None and record.owner == "beta" and record.total_turns == 1

        await east.open("room-2", owner="alpha")  # and the other way round
        await west.open("room-2", owner="alpha")
        await west.delete("room-2", owner="alpha")
        await west.open("room-2", owner="beta")
        opened = await east.open("room-2", owner="beta")  # east still holds alpha's copy of the name
        assert opened.resumed
        with pytest.raises(UnknownSession):
            east.state("room-2", owner="alpha")


# -- two `voice-context serve` processes on one SQLite file ---------------------------------------


@contextlib.asynccontextmanager
async def wire_to(url: str, token: str) -> AsyncIterator[Wire]:
    with anyio.fail_after(TIMEOUT):
        ws = await connect(url, additional_headers={"Authorization": f"Bearer {token}"}, open_timeout=TIMEOUT)
    async with ws:
        yield Wire(ws)


@pytest.mark.asyncio
async def test_two_serve_processes_on_one_sqlite_file_give_each_new_name_one_owner(tmp_path: Path) -> None:
    """The same race as above, between two real processes: SQLite's own lock, not one process's
    locks, decides which token's create makes the name."""
    store = f"sqlite:///{tmp_path / 'voice-context.db'}"
    env = {
        "VOICE_CONTEXT_SERVER_AUTH_TOKENS": ",".join(TOKENS),
        "VOICE_CONTEXT_SERVER_MAX_SESSIONS_PER_CONNECTION": str(NAMES),
    }
    args = ("--store", store, "--log-level", "warning")
    async with (
        serve_process(*args, env=env) as east,
        serve_process(*args, env=env) as west,
        wire_to(east.url, "alpha-token") as alpha,
        wire_to(west.url, "beta-token") as beta,
    ):
        bots = {"alpha-token": alpha, "beta-token": beta}
        names = [f"room-{i}" for i in range(NAMES)]
        answers = await open_at_once(bots, names)
        for name in names:
            got = {token: answers[token][name]["type"] for token in TOKENS}
            assert sorted(got.values()) == ["error", "session.opened"], (name, got)
            [loser] = [token for token in TOKENS if got[token] == "error"]
            refused = await bots[loser].request("context.get", session=name)
            assert refused.get("code") == "unknown_session", (name, refused)


# -- one session served by two servers at once -----------------------------------------------------


class GatedSummarizer(ScriptedSummarizer):
    """Answers from its script once the test opens the gate."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = anyio.Event()

    async def summarize(self, request: SummaryRequest) -> str:
        await self.gate.wait()
        return await super().summarize(request)


@pytest.mark.asyncio
async def test_a_turn_appended_after_another_replica_appended_lands_after_its_turns() -> None:
    shared = MemoryStore()  # one store, two server processes' worth of replicas
    async with (
        running(store=shared) as east,
        running(store=shared) as west,
        wire(east) as moving,
        wire(west) as other,
    ):
        await moving.open("room-1")
        assert (await moving.append("room-1", 0))["index"] == 0
        await other.open("room-1")
        assert (await other.append("room-1", 1))["index"] == 1
        assert (await other.append("room-1", 2))["index"] == 2
        appended = await moving.append("room-1", 3)  # east has not seen turns 1 and 2
        assert (appended["type"], appended["index"]) == ("turn.appended", 3), appended
        state = await moving.request("session.state", session="room-1")
        assert state["turns"] == 4
    assert [t.text for t in await shared.read_turns("room-1", 0, 10)] == [f"turn {i}" for i in range(4)]


@pytest.mark.asyncio
async def test_turns_appended_on_another_replica_do_not_cancel_a_fold_in_flight_here() -> None:
    shared = MemoryStore()
    slow = GatedSummarizer()
    async with (
        running(store=shared, summarizer=slow) as east,
        running(store=shared) as west,
        wire(east) as moving,
        wire(west) as other,
    ):
        await moving.open("room-1", config={"recent_window": 2, "batch_size": 1})
        for i in range(4):
            await moving.append("room-1", i)
        await moving.request("context.get", session="room-1")  # east folds turn 0, slowly
        await other.open("room-1")
        assert (await other.append("room-1", 4))["index"] == 4
        assert (await moving.append("room-1", 5))["index"] == 5  # east catches up meanwhile
        slow.gate.set()
        landed = await moving.push()
        assert (landed["type"], landed["cursor"]) == ("compaction.completed", 1), landed
    record = await shared.load("room-1")
    assert record is not None and (record.cursor, record.total_turns) == (1, 6)
