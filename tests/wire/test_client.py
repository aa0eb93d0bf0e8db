"""The bot's client against a real server: replies, errors, pushed events, reconnect and resume,
rate limits, and a server that is down (the circuit breaker, in the client and a held session)."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import anyio
import orjson
import pytest
from helpers import ManualClock
from serving import T0, TIMEOUT, GatedStore, Hung, Proxy, running, settings, wait_until
from websockets.asyncio.server import ServerConnection, serve

import voice_context
from voice_context import codec, errors
from voice_context.client import Client, ClientError, ConnectionLost, SessionHandle
from voice_context.codec import (
    ContextGet,
    ContextReply,
    ErrorReply,
    SessionClose,
    SessionOpen,
    TurnAppend,
    TurnStored,
)
from voice_context.core.breaker import CircuitBreaker
from voice_context.core.turns import Turn
from voice_context.errors import RequestTimeout, VoiceContextError
from voice_context.integrations._held import HeldSession
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.deterministic import DeterministicSummarizer

#: A backoff no test outlives: only the test's clock ends it.
LONG = 1000.0


def fast(url: str, **kwargs: Any) -> Client:
    """A client whose reconnect backoff is short, and whose waits are bounded by the test timeout."""
    options: dict[str, Any] = {
        "open_timeout": TIMEOUT,
        "request_timeout": TIMEOUT,
        "backoff_base": 0.01,
        "backoff_max": 0.2,
        "reconnect_attempts": 20,
    }
    options.update(kwargs)
    return Client(url, **options)


@pytest.mark.asyncio
async def test_a_bot_appends_turns_and_notes_and_gets_its_context() -> None:
    async with running() as server, fast(server.url) as client:
        room = await client.open("room-1")
        assert room.resumed is False
        assert await room.append_turn("Alice", "user", "Can you find flights to Lisbon?", at=T0) == 0
        assert await room.append_turn("Nova", "assistant", "Sure, which dates?", at=T0 + 2, id="a1") == 1
        noted = await room.append_note("a flight search page", at=T0 + 3, speaker="Alice", source="browser")
        assert (noted["live"], noted["pending"]) == (1, 0)

        ctx = await room.context(
            format="instructions",
            budget_chars=5200,
            base_instructions="You are Nova.",
            facts=["Alice is vegan"],
        )
        assert ctx["instructions"].startswith("You are Nova.")
        for part in ("- Alice is vegan", "Alice's screen (browser): a flight search page", "Nova: Sure"):
            assert part in ctx["instructions"]
        assert (ctx["cursor"], ctx["in_flight"], ctx["chars"]) == (0, False, len(ctx["instructions"]))
        messages = (await room.context())["messages"]
        assert messages[-1] == {"role": "assistant", "content": "Sure, which dates?"}

        state = await room.state()
        assert (state["turns"], state["live_notes"]) == (2, 1)
        assert (await client.ping())["type"] == "pong"
        reply, sent = await client.exchange(ContextGet("room-1", "instructions", 5200))
        assert isinstance(reply, ContextReply), "the same reply, typed as the codec reads it"
        assert (reply.instructions, reply.turns_shown) == (sent["instructions"], sent["turns_shown"])
        assert reply.instructions.endswith("Nova: Sure, which dates?")
        await room.close()
        assert client.sessions == []


@pytest.mark.asyncio
async def test_a_session_opened_by_any_request_is_resumed_after_a_drop_until_it_is_closed() -> None:
    async with running() as server, Proxy(server.port) as proxy, fast(proxy.url) as client:
        opened = await client.request(SessionOpen("room-1", {"recent_window": 30}))
        assert (opened["type"], client.sessions) == ("session.opened", ["room-1"])
        proxy.cut()
        await wait_until(lambda: not client.connected)
        reply, _ = await client.exchange(TurnAppend("room-1", Turn("Alice", "user", "after", T0)))
        assert reply == TurnStored("room-1", 0, reply.id), (
            "reopened, as the client opened it, before the turn"
        )
        assert client.reconnects == 1
        refused, sent = await client.exchange(SessionClose("room-2"))
        assert isinstance(refused, ErrorReply) and sent["code"] == refused.code == "unknown_session"
        await client.request(SessionClose("room-1"))
        assert client.sessions == []


class Garbled:
    """A websocket server on 127.0.0.1 (port 0) that answers its first request with a reply
    the codec cannot read (a ``pong`` without its ``protocol``), and the next ones as a
    server does (a ``pong``)."""

    def __init__(self) -> None:
        self.url = ""
        self.answered = 0

    async def answer(self, ws: ServerConnection) -> None:
        async for frame in ws:
            request = orjson.loads(frame)
            self.answered += 1
            pong: dict[str, Any] = {"type": "pong", "id": request["id"]}
            if self.answered > 1:
                pong["protocol"] = 1
            await ws.send(orjson.dumps(pong).decode())


@pytest.mark.asyncio
async def test_a_reply_the_codec_cannot_read_fails_its_request_at_once_and_the_client_goes_on() -> None:
    garbled = Garbled()
    async with serve(garbled.answer, "127.0.0.1", 0) as listening:
        port = listening.sockets[0].getsockname()[1]
        async with fast(f"ws://127.0.0.1:{port}/v1", request_timeout=TIMEOUT * 10) as client:
            with anyio.fail_after(TIMEOUT), pytest.raises(ClientError) as unread:
                await client.ping()
            assert unread.value.code == "bad_reply"
            assert unread.value.message.endswith("pong: protocol is required")
            assert (await client.ping())["protocol"] == 1
            assert client.connected and garbled.answered == 2


@pytest.mark.asyncio
async def test_an_error_reply_raises_client_error_with_its_code() -> None:
    async with running(settings(max_text_chars=50)) as server, fast(server.url) as client:
        with pytest.raises(ClientError) as bad:
            await client.open("room-1", config={"colour": "blue"})
        assert bad.value.code == "bad_request"
        assert "colour" in bad.value.message
        room = await client.open("room-1")
        with pytest.raises(ClientError) as big:
            await room.append_turn("Alice", "user", "x" * 51, at=T0)
        assert big.value.code == "too_large"
        assert big.value.reply is not None and big.value.reply["session"] == "room-1"
        assert await room.append_turn("Alice", "user", "still here", at=T0) == 0


@pytest.mark.asyncio
async def test_a_wrong_token_is_refused_when_connecting() -> None:
    async with running(settings(auth_tokens=("right",))) as server:
        with pytest.raises(ClientError) as refused:
            async with fast(server.url, token="wrong"):
                pass
        assert refused.value.code == "unauthorized"
        async with fast(server.url, token="right") as client:
            assert (await client.open("room-1")).name == "room-1"


@pytest.mark.asyncio
async def test_compaction_events_reach_the_callback_and_the_event_stream() -> None:
    seen: list[dict[str, Any]] = []
    async with (
        running(summarizer=DeterministicSummarizer()) as server,
        fast(server.url, on_event=seen.append) as client,
    ):
        room = await client.open("room-1")
        for i in range(61):
            await room.append_turn(("Alice", "Bob")[i % 2], "user", f"turn {i}", at=T0 + i)
        first = await room.context()
        assert (first["cursor"], first["in_flight"]) == (0, True)
        with anyio.fail_after(TIMEOUT):
            event = await anext(aiter(client.events()))
        assert (event["type"], event["session"], event["cursor"]) == ("compaction.completed", "room-1", 10)
        assert seen == [event]
        after = await room.context()
        assert (after["cursor"], after["covered_through"]) == (10, 9)
        assert after["summary"]


@pytest.mark.asyncio
async def test_the_client_reconnects_and_resumes_after_the_server_restarts_on_the_same_port() -> None:
    store = MemoryStore()  # what a durable store keeps across the restart
    async with running(store=store) as first, fast(first.url) as client:
        room = await client.open("room-1", config={"recent_window": 30})
        for i in range(3):
            await room.append_turn("Alice", "user", f"turn {i}", at=T0 + i)
        await first.shutdown()
        await wait_until(lambda: not client.connected)

        async with running(settings(port=first.port), store=store):
            assert await room.append_turn("Alice", "user", "turn 3", at=T0 + 3) == 3
            assert client.reconnects == 1
            assert room.resumed is True, "the session was opened again before the turn"
            assert (await room.state())["turns"] == 4


@pytest.mark.asyncio
async def test_after_the_network_drops_the_next_call_reconnects_and_resumes_every_session() -> None:
    async with running() as server, Proxy(server.port) as proxy, fast(proxy.url) as client:
        rooms = [await client.open(name) for name in ("room-1", "room-2")]
        for room in rooms:
            await room.append_turn("Alice", "user", "before", at=T0)
        proxy.cut()
        await wait_until(lambda: not client.connected)
        assert await rooms[1].append_turn("Bob", "user", "after", at=T0 + 1) == 1
        assert await rooms[0].append_turn("Bob", "user", "after", at=T0 + 1) == 1
        assert client.reconnects == 1
        assert [r.resumed for r in rooms] == [True, True]


@pytest.mark.asyncio
async def test_a_turn_with_an_id_in_flight_when_the_network_drops_is_stored_exactly_once() -> None:
    store = GatedStore()
    store.gate.set()
    async with running(store=store) as server, Proxy(server.port) as proxy, fast(proxy.url) as client:
        room = await client.open("room-1")
        await room.append_turn("Alice", "user", "first", at=T0)
        store.close_gate()
        async with anyio.create_task_group() as tg:
            result: list[int] = []

            async def append() -> None:
                result.append(await room.append_turn("Alice", "user", "second", at=T0 + 1, id="utt-2"))

            tg.start_soon(append)
            with anyio.fail_after(TIMEOUT):
                await store.entered.wait()  # the server is writing the turn ...
            proxy.cut()  # ... when the connection drops
            store.gate.set()
        assert result == [1]
        assert client.reconnects == 1
        state = await room.state()
        assert state["turns"] == 2, "the retried turn was not stored twice"


@pytest.mark.asyncio
async def test_a_turn_without_an_id_in_flight_when_the_network_drops_raises_connection_lost() -> None:
    store = GatedStore()
    async with running(store=store) as server, Proxy(server.port) as proxy, fast(proxy.url) as client:
        room = await client.open("room-1")
        outcome: list[BaseException] = []

        async def append() -> None:
            try:
                await room.append_turn("Alice", "user", "no id", at=T0)
            except ConnectionLost as lost:
                outcome.append(lost)

        async with anyio.create_task_group() as tg:
            tg.start_soon(append)
            with anyio.fail_after(TIMEOUT):
                await store.entered.wait()
            proxy.cut()
        assert len(outcome) == 1, "not retried: it may or may not have been stored"
        store.gate.set()
        assert (await room.state())["turns"] == 1, "this time the server had stored it"


@pytest.mark.asyncio
async def test_without_reconnect_a_dropped_connection_stays_dropped() -> None:
    async with (
        running() as server,
        Proxy(server.port) as proxy,
        fast(proxy.url, reconnect=False) as client,
    ):
        room = await client.open("room-1")
        proxy.cut()
        await wait_until(lambda: not client.connected)
        with pytest.raises(ConnectionLost):
            await room.state()


@pytest.mark.asyncio
async def test_an_unreachable_server_fails_after_the_bounded_backoff() -> None:
    async with running() as server:
        url = server.url
    with pytest.raises(ConnectionLost) as lost:
        async with fast(url, reconnect_attempts=3):
            pass
    assert "after 3 attempts" in lost.value.message


@pytest.mark.asyncio
async def test_an_error_raised_in_the_block_comes_out_of_async_with_as_itself() -> None:
    async with running() as server:
        try:
            async with fast(server.url) as client:
                await client.open("room-1", config={"colour": "blue"})
        except ClientError as refused:  # not an ExceptionGroup around it
            assert refused.code == "bad_request"
        else:
            raise AssertionError("the bad config was accepted")
        with pytest.raises(KeyError):
            async with fast(server.url) as client:
                await client.open("room-1")
                raise KeyError("the bot's own error")


@pytest.mark.asyncio
async def test_a_rate_limited_turn_or_note_is_sent_again_after_the_wait_the_server_asks() -> None:
    # 5 turns and notes a second, no burst: each one after the first waits its turn
    async with running(settings(turns_per_second=5.0, turn_burst=1)) as server, fast(server.url) as client:
        room = await client.open("room-1")
        for i in range(3):  # no ids: a refused turn was not stored, so sending it again is safe
            assert await room.append_turn("Alice", "user", f"turn {i}", at=T0 + i) == i
        await room.append_note("a seat map of an A320", at=T0 + 3)
        assert client.rate_limit_waits >= 1
        state = await room.state()
        assert (state["turns"], state["live_notes"]) == (3, 1)

        client.rate_limit_wait = 0.0  # a bot that would rather not wait
        with pytest.raises(ClientError) as limited:
            for i in range(3, 6):
                await room.append_turn("Alice", "user", f"turn {i}", at=T0 + i)
        assert limited.value.code == "rate_limited"
        assert limited.value.reply is not None and limited.value.reply["retry_after"] > 0


@pytest.mark.asyncio
async def test_a_client_without_reconnect_tries_its_first_connect_once() -> None:
    async with running() as server, Proxy(server.port) as proxy:
        proxy.go_down()
        with pytest.raises(ConnectionLost) as lost:
            async with fast(proxy.url, reconnect=False):
                pass
        assert proxy.refused == 1, "one attempt, not reconnect_attempts of them"
    assert "after 1 attempt" in lost.value.message


def circuit(logs: list[MutableMapping[str, Any]]) -> list[str]:
    return [e["event"] for e in logs if str(e["event"]).startswith("voice_context_client_circuit_")]


@pytest.mark.asyncio
async def test_while_the_server_is_down_calls_fail_at_once_and_one_call_tries_again_after_each_backoff(
    clock: ManualClock, logs: list[MutableMapping[str, Any]]
) -> None:
    breaker = CircuitBreaker(base=LONG, cap=4 * LONG, jitter=0.0)
    async with (
        running() as server,
        Proxy(server.port) as proxy,
        fast(proxy.url, reconnect_attempts=1, breaker=breaker, clock=clock) as client,
    ):
        room = await client.open("room-1")
        await room.append_turn("Alice", "user", "before", at=T0)
        proxy.go_down()
        await wait_until(lambda: not client.connected)
        for _ in range(3):  # a bot's next three turns
            with pytest.raises(ConnectionLost):
                await room.state()
        assert proxy.refused == 1, "the first call tried; the next ones failed at once"
        assert "circuit open" in repr(client)

        clock.advance(LONG)
        with pytest.raises(ConnectionLost):
            await room.state()  # the backoff has passed: one call tries, and fails again
        assert proxy.refused == 2
        clock.advance(LONG)
        with pytest.raises(ConnectionLost):
            await room.state()  # the next backoff is twice as long
        assert proxy.refused == 2

        proxy.come_back()
        clock.advance(LONG)
        assert (await room.state())["turns"] == 1, "reconnected, and the session resumed"
        assert (client.reconnects, proxy.refused) == (1, 2)
    assert circuit(logs) == ["voice_context_client_circuit_opened", "voice_context_client_circuit_closed"]


async def turns_while_down(held: HeldSession, turns: int = 3) -> None:
    """A bot's next turns while its server is down: each one's call fails."""
    for _ in range(turns):
        with pytest.raises(ConnectionLost):
            await held.open()


@pytest.mark.asyncio
async def test_a_held_session_waits_for_a_down_server_once_then_fails_at_once_until_it_is_back(
    clock: ManualClock, logs: list[MutableMapping[str, Any]]
) -> None:
    """What the pipecat and LiveKit integrations hold: each call bounded by the bot's timeout."""
    breaker = CircuitBreaker(base=LONG, cap=LONG, jitter=0.0)
    async with running() as server, Proxy(server.port) as proxy:
        held = HeldSession(proxy.url, "call-7", breaker=breaker, clock=clock)
        proxy.go_down()  # down when the call starts
        await turns_while_down(held)
        assert proxy.refused == 1

        proxy.come_back()
        room = await after_the_probe(held, clock)
        await room.append_turn("Alice", "user", "Let's book Lisbon.", at=T0)

        proxy.go_down()  # and down again mid-call
        await wait_until(lambda: not room.client.connected)
        await turns_while_down(held)
        assert proxy.refused == 2

        proxy.come_back()
        room = await after_the_probe(held, clock)
        assert (await room.state())["turns"] == 1, "connected again, to the same session"
        await held.close()
    assert circuit(logs) == ["voice_context_client_circuit_opened", "voice_context_client_circuit_closed"] * 2


async def after_the_probe(held: HeldSession, clock: ManualClock) -> SessionHandle:
    """The session once the backoff has passed: the next call starts the probe and fails at
    once, without waiting for it; once the probe has opened the session, calls get it."""
    clock.advance(LONG)
    with pytest.raises(ConnectionLost, match="trying it in the background"):
        await held.open()
    await wait_until(lambda: held.connected)
    return await held.open()


@pytest.mark.asyncio
async def test_a_held_session_waits_for_a_hung_server_once_then_fails_at_once_while_it_hangs(
    clock: ManualClock, logs: list[MutableMapping[str, Any]]
) -> None:
    """A server that takes the connection and never answers: the first call waits its timeout
    and opens the circuit; the next calls fail at once, and try nothing new, until the probe
    goes (the connection the first call waited on is still being made: it is the probe)."""
    breaker = CircuitBreaker(base=LONG, cap=LONG, jitter=0.0)
    async with Hung() as hung:
        held = HeldSession(hung.url, "call-7", breaker=breaker, clock=clock)
        with pytest.raises(TimeoutError):
            async with held.within(0.2):
                pytest.fail("a hung server never opened the session")
        assert breaker.state == "open"
        for _ in range(3):
            with pytest.raises(ConnectionLost, match="trying it in the background"):
                async with held.within(TIMEOUT):
                    pytest.fail("the circuit is open")
        clock.advance(LONG)
        with pytest.raises(ConnectionLost, match="trying it in the background"):
            await held.open()  # the connection first tried is still being made: no second one
        assert hung.accepted == 1
        await held.close()
    assert circuit(logs) == ["voice_context_client_circuit_opened"]


@pytest.mark.asyncio
async def test_a_held_session_whose_server_stops_answering_lets_the_connection_go_and_probes_a_new_one(
    clock: ManualClock, logs: list[MutableMapping[str, Any]]
) -> None:
    breaker = CircuitBreaker(base=LONG, cap=LONG, jitter=0.0)
    async with running() as server, Proxy(server.port) as proxy:
        held = HeldSession(proxy.url, "call-7", breaker=breaker, clock=clock, close_timeout=TIMEOUT)
        async with held.within(TIMEOUT) as room:
            await room.append_turn("Alice", "user", "Let's book Lisbon.", at=T0)
        proxy.stall()  # connected, and no reply comes any more
        with pytest.raises(TimeoutError):
            async with held.within(0.2) as room:
                await room.context()
        assert (breaker.state, held.connected) == ("open", False), "that connection is let go"
        await turns_while_down(held)

        proxy.come_back()
        room = await after_the_probe(held, clock)
        assert (await room.state())["turns"] == 1, "a new connection, to the same session"
        await held.close()
    assert circuit(logs) == ["voice_context_client_circuit_opened", "voice_context_client_circuit_closed"]


@pytest.mark.asyncio
async def test_a_bot_cancelled_while_its_held_session_closes_stays_cancelled() -> None:
    """An integration closing in a task its framework cancels (a call hung up mid-close): the
    cancellation is the framework's, and the close must not swallow it."""
    async with running() as server, Proxy(server.port) as proxy:
        held = HeldSession(proxy.url, "call-7", close_timeout=TIMEOUT)
        await held.open()
        proxy.stall()  # the closing handshake will not be answered
        went_on = False
        with anyio.move_on_after(0.2) as scope:
            await held.close()
            went_on = True
        assert scope.cancelled_caught
        assert not went_on, "the code after close() ran in a cancelled task"


# -- the error tree, the client's own timeout -------------------------------------------------------


@pytest.mark.asyncio
async def test_a_request_without_a_reply_raises_the_clients_own_timeout_error() -> None:
    store = GatedStore()
    async with running(store=store) as server:
        client = Client(server.url, open_timeout=TIMEOUT, request_timeout=TIMEOUT / 20)
        async with client:
            room = await client.open("room-1")
            with pytest.raises(RequestTimeout) as waited:
                await room.append_turn("Alice", "user", "the store is slow today", at=T0)
            assert isinstance(waited.value, TimeoutError) and isinstance(waited.value, ClientError)
            assert isinstance(waited.value, VoiceContextError)
            assert waited.value.code == "timeout"
            store.gate.set()


def test_every_error_voice_context_raises_on_purpose_is_in_the_tree() -> None:
    documented = errors.__doc__ or ""
    for name in dir(errors):
        value = getattr(errors, name)
        if isinstance(value, type) and issubclass(value, errors.VoiceContextError):
            assert name in documented, name
            assert getattr(voice_context, name) is value, f"{name} is public"
    assert codec.DecodeError is errors.DecodeError
    assert issubclass(errors.TurnConflict, errors.StoreError)
