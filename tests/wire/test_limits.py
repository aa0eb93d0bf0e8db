"""The server's bounds, over real connections: what a client may change of a session's limits,
the rate limits of a session and of a token, its connections, and a client that does not read."""

from __future__ import annotations

import contextlib
from contextlib import AsyncExitStack
from typing import Any

import anyio
import anyio.lowlevel
import orjson
import pytest
from serving import T0, TIMEOUT, Wire, running, settings, wait_until, wire
from structlog.testing import capture_logs
from websockets.exceptions import ConnectionClosed, InvalidStatus

from voice_context.server import TokenBucket

SMALL = {"recent_window": 2, "batch_size": 1}


# -- limits ----------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_too_many_sessions_on_one_connection_is_rate_limited_until_one_closes() -> None:
    async with running(settings(max_sessions_per_connection=2)) as server, wire(server) as bot:
        await bot.open("a")
        await bot.open("b")
        assert (await bot.open("a"))["resumed"] is True, "opening again is not another session"
        refused = await bot.open("c")
        assert (refused["code"], refused["limit"]) == ("rate_limited", "sessions_per_connection")
        await bot.request("session.close", session="a")
        assert (await bot.open("c"))["type"] == "session.opened"


@pytest.mark.asyncio
async def test_turns_beyond_the_burst_are_rate_limited_per_session() -> None:
    slow_rate = settings(turns_per_second=0.001, turn_burst=3)
    async with running(slow_rate) as server, wire(server) as bot:
        await bot.open("busy")
        await bot.open("calm")
        for i in range(3):
            assert (await bot.append("busy", i))["index"] == i
        limited = await bot.append("busy", 3)
        assert (limited["code"], limited["limit"], limited["session"]) == (
            "rate_limited",
            "turns_per_second",
            "busy",
        )
        assert limited["retry_after"] > 0
        assert (await bot.append("calm", 0))["index"] == 0, "the limit is per session"


@pytest.mark.asyncio
async def test_a_retried_turn_with_the_same_id_is_not_appended_twice() -> None:
    async with running() as server, wire(server) as bot:
        await bot.open("room-1")
        first = await bot.append("room-1", 0, id="utt-1")
        again = await bot.append("room-1", 0, id="utt-1")
        assert (first["index"], again["index"], again["duplicate"]) == (0, 0, True)
        no_id = [await bot.append("room-1", 5), await bot.append("room-1", 5)]
        assert [r["index"] for r in no_id] == [1, 2], "without an id, a turn is never a duplicate"


# -- a client cannot lift the server's bounds -----------------------------------------


@pytest.mark.asyncio
async def test_a_client_may_change_only_some_session_limits_and_only_up_to_a_maximum() -> None:
    generous = settings().with_values("session", {"recent_window": 800})
    async with running(generous) as server, wire(server) as bot:
        for config, words in (
            ({"recent_window": 1e9}, "recent_window may be at most 800"),
            ({"live_note_entries": 10**9}, "live_note_entries may be at most 64"),
            ({"max_pending_notes": 1_000_000_000}, "max_pending_notes may be at most 256"),
            ({"retry_base_seconds": 0}, "cannot set retry_base_seconds; a client may set: recent_window"),
            ({"recent_windw": 20}, "cannot set recent_windw (did you mean 'recent_window'?); a client"),
        ):
            refused = await bot.open("room-1", config=config)
            assert (refused["type"], refused["code"]) == ("error", "bad_request"), refused
            assert words in refused["message"]
        assert (await bot.request("session.state", session="room-1"))["code"] == "unknown_session"
        opened = await bot.open("room-1", config={"recent_window": 800, "live_note_entries": 64})
        assert opened["type"] == "session.opened"
        assert server.manager.session("room-1").config.recent_window == 800


# -- a close and an open do not refill the rate limit; notes count too ---------------


@pytest.mark.asyncio
async def test_closing_and_reopening_a_session_does_not_refill_its_rate_limit() -> None:
    async with running(settings(turns_per_second=0.5, turn_burst=3)) as server, wire(server) as bot:
        await bot.open("room-1")
        for i in range(3):
            assert (await bot.append("room-1", i))["type"] == "turn.appended"
        for _ in range(3):
            assert (await bot.request("session.close", session="room-1"))["type"] == "session.closed"
            await bot.open("room-1")
            refused = await bot.append("room-1", 3)
            assert (refused["code"], refused["limit"]) == ("rate_limited", "turns_per_second"), refused
        async with wire(server) as other:  # nor does another connection
            await other.open("room-1")
            assert (await other.append("room-1", 3))["code"] == "rate_limited"


@pytest.mark.asyncio
async def test_notes_spend_the_same_rate_limit_as_turns() -> None:
    async with running(settings(turns_per_second=0.5, turn_burst=3)) as server, wire(server) as bot:
        await bot.open("room-1")
        for i in range(3):
            noted = await bot.request("note.append", session="room-1", note={"text": f"screen {i}", "at": T0})
            assert noted["type"] == "note.appended"
        refused = await bot.request("note.append", session="room-1", note={"text": "one more", "at": T0})
        assert (refused["code"], refused["limit"]) == ("rate_limited", "turns_per_second")
        assert (await bot.append("room-1", 0))["code"] == "rate_limited"


# -- one token cannot multiply its limits by opening many sessions and connections -----

OWNER_LIMITS = settings(
    auth_tokens=("alpha-token", "beta-token"),
    owner_turns_per_second=0.5,
    owner_turn_burst=10,
    max_connections_per_owner=3,
)


@pytest.mark.asyncio
async def test_a_token_holds_at_most_its_connections_and_the_next_handshake_gets_503() -> None:
    async with (
        running(OWNER_LIMITS) as server,
        wire(server, token="alpha-token"),
        wire(server, token="alpha-token"),
        wire(server, token="alpha-token") as third,
    ):
        with pytest.raises(InvalidStatus) as refused:
            async with wire(server, token="alpha-token"):
                pass
        assert refused.value.response.status_code == 503
        assert orjson.loads(refused.value.response.body) == {
            "type": "error",
            "code": "rate_limited",
            "message": "this token has 3 connections open (limit 3): close one first",
            "limit": "owner_connections",
        }
        async with wire(server, token="beta-token") as beta:  # another token is not held back
            assert (await beta.request("ping"))["type"] == "pong"
        await third.ws.close()
        await wait_until(lambda: server.connections == 2)
        async with wire(server, token="alpha-token") as again:
            assert (await again.request("ping"))["type"] == "pong"


@pytest.mark.asyncio
async def test_a_tokens_turns_across_many_sessions_and_connections_share_one_rate_limit() -> None:
    async with (
        running(OWNER_LIMITS) as server,
        wire(server, token="alpha-token") as a1,
        wire(server, token="alpha-token") as a2,
        wire(server, token="alpha-token") as a3,
        wire(server, token="beta-token") as beta,
    ):
        bots = [a1, a2, a3]
        for k, bot in enumerate(bots):
            for room in range(3):
                await bot.open(f"room-{k}-{room}")
        answers = []
        for n in range(30):  # each session's own bucket (burst 1000) would take all of them
            bot = bots[n % 3]
            answers.append(await bot.append(f"room-{n % 3}-{n // 3 % 3}", n // 9))
        accepted = [a for a in answers if a["type"] == "turn.appended"]
        refused = [a for a in answers if a["type"] == "error"]
        assert len(accepted) == 10, "the token's burst, whatever the sessions and connections"
        assert {(r["code"], r["limit"]) for r in refused} == {("rate_limited", "owner_turns_per_second")}
        assert all(0 < r["retry_after"] <= 2 for r in refused)
        note = {"text": "screen", "at": T0}
        assert (await a1.request("note.append", session="room-0-0", note=note))["code"] == "rate_limited"
        await beta.open("room-1")
        assert (await beta.append("room-1", 0))["type"] == "turn.appended", "beta has its own budget"
        state = await a1.request("session.state", session="room-0-0")
        assert state["turns"] == 2, "a refused turn is not stored"


def test_a_bucket_is_full_again_once_it_has_had_time_to_refill() -> None:
    bucket = TokenBucket(rate=2.0, burst=3, now=100.0)
    assert bucket.full(100.0)
    assert bucket.take(100.0) == 0.0
    assert not bucket.full(100.4)
    assert bucket.full(100.5)


# -- a client that does not read cannot exhaust memory --------------------------------


#: a client that stops reading after a frame, its replies uncompressed (so they fill the buffers)
NOT_READING: dict[str, Any] = {"max_queue": 1, "compression": None}


async def ask_without_reading(greedy: Wire, session: str) -> None:
    """Ask for 120 replies of 56,000 chars each and never read one (a bot whose reader died)."""
    big = "You are Nova. " * 4000
    with contextlib.suppress(ConnectionClosed):  # the server cuts it off while it asks
        for n in range(120):
            await greedy.send({"type": "context.get", "id": n, "session": session, "base_instructions": big})


@pytest.mark.asyncio
async def test_a_client_that_does_not_read_holds_at_most_its_outbox_limit_in_the_server() -> None:
    limit = 64 * 1024
    big = 56_000  # the chars of each reply

    async with (
        running(settings(max_outbox_chars=limit)) as server,
        wire(server, **NOT_READING) as greedy,
        anyio.create_task_group() as tg,
    ):
        await greedy.open("room-1")
        [conn] = server._connections
        tg.start_soon(ask_without_reading, greedy, "room-1")
        most = 0
        with anyio.move_on_after(0.5):
            while True:  # every turn of the event loop: the queue may fill and drain between two
                await anyio.lowlevel.checkpoint()
                most = max(most, conn.queued)
        assert limit <= most <= limit + big + 1000, most
        async with wire(server) as other:  # the server serves everyone else meanwhile
            assert (await other.request("ping"))["type"] == "pong"
        tg.cancel_scope.cancel()
        greedy.ws.transport.abort()  # it never reads: no closing handshake to wait for


@pytest.mark.asyncio
async def test_a_client_that_reads_again_after_a_pause_gets_every_reply() -> None:
    config = settings(max_outbox_chars=64 * 1024, send_timeout=TIMEOUT * 4)
    async with (
        running(config) as server,
        wire(server, **NOT_READING) as slow,
        anyio.create_task_group() as tg,
    ):
        await slow.open("room-1")
        [conn] = server._connections
        tg.start_soon(ask_without_reading, slow, "room-1")
        await wait_until(lambda: conn.queued >= conn.max_queued)  # reading and answering both wait
        for n in range(120):  # the server reads and answers again as the client catches up
            reply = await slow.reply()
            assert (reply["type"], reply["id"]) == ("context", n)


@pytest.mark.asyncio
async def test_clients_that_ask_without_reading_then_close_leave_no_connection_or_session_held() -> None:
    config = settings(max_outbox_chars=64 * 1024, max_connections=3, send_timeout=TIMEOUT * 4)
    async with running(config) as server:  # the send timeout is not what lets them go
        async with AsyncExitStack() as bots, anyio.create_task_group() as tg:
            greedy = [await bots.enter_async_context(wire(server, **NOT_READING)) for _ in range(3)]
            for n, bot in enumerate(greedy):
                await bot.open(f"room-{n}")
                tg.start_soon(ask_without_reading, bot, f"room-{n}")
            # each has more waiting for it than it may have, and reads none of it
            await wait_until(lambda: all(c.queued >= c.max_queued for c in server._connections))
            for bot in greedy:
                bot.ws.transport.abort()  # then its socket is closed, unread replies and all
        await wait_until(lambda: server.connections == 0)
        assert server.manager.sessions == 0, "their sessions are closed with them"
        async with wire(server) as a, wire(server) as b, wire(server) as c:
            for bot in (a, b, c):
                assert (await bot.request("ping"))["type"] == "pong"


@pytest.mark.asyncio
async def test_a_client_that_stops_reading_is_cut_off_after_the_send_timeout() -> None:
    config = settings(max_outbox_chars=64 * 1024, max_connections=1, send_timeout=TIMEOUT / 25)
    with capture_logs() as logs:
        async with running(config) as server, wire(server, **NOT_READING) as greedy:
            await greedy.open("room-1")
            await ask_without_reading(greedy, "room-1")  # its socket stays open, as a dead peer's does
            await wait_until(lambda: server.connections == 0)
            assert server.manager.sessions == 0, "its session is closed with it"
            async with wire(server) as next_bot:  # its place under max_connections is free
                assert (await next_bot.request("ping"))["type"] == "pong"
    [cut] = [e for e in logs if e["event"] == "voice_context_send_timed_out"]
    assert cut["queued_chars"] >= 64 * 1024


@pytest.mark.asyncio
async def test_past_max_connections_a_handshake_is_refused_with_503_and_a_reason() -> None:
    async with running(settings(max_connections=2)) as server, wire(server), wire(server) as second:
        with pytest.raises(InvalidStatus) as refused:
            async with wire(server):
                pass
        response = refused.value.response
        assert response.status_code == 503
        assert orjson.loads(response.body) == {
            "type": "error",
            "code": "rate_limited",
            "message": "the server serves 2 connections at most: try again later",
            "limit": "connections",
        }
        await second.ws.close()
        await wait_until(lambda: server.connections == 1)
        async with wire(server) as third:
            assert (await third.request("ping"))["type"] == "pong"
