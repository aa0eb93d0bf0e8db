"""OpenAI Realtime sessions kept briefed: the stand-in for the realtime service on 127.0.0.1
(``voice_context.testing.realtime_server``) plays a conversation the way server VAD orders it
(the user's audio committed, the response started at once unless ``create_response`` is off, the
transcript after), serves a call's sideband connection by ``call_id`` and expires sessions; a real
voice-context server remembers. Each reply is shown to carry the memory of the turn it answers,
and a fresh provider session starts with the handoff; plus ``session.handoff`` itself."""

from __future__ import annotations

import itertools
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import orjson
import pytest
from serving import TIMEOUT, running, settings, wire
from websockets.asyncio.server import ServerConnection, serve

from voice_context.client import Client
from voice_context.core.handoff import OPEN_QUESTIONS_HEADER, open_questions
from voice_context.core.turns import Turn
from voice_context.integrations.openai_realtime import (
    ROLLOVER_BEFORE,
    SESSION_LIMIT,
    RealtimeMemory,
    main,
    response_create,
    run,
    session_update,
    sideband_url,
)
from voice_context.server import Server
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.testing.clock import ManualClock
from voice_context.testing.realtime_server import (
    Pause,
    RealtimeSession,
    StandInRealtime,
    Step,
    User,
    committed,
    failed,
    heard,
    play_turn,
    send_event,
)

T0 = 1714572187.0
PROMPT = "You are Nova, a travel agent."


def turns(*said: tuple[str, str]) -> list[Turn]:
    return [Turn(speaker, "user", text, T0 + 10 * k) for k, (speaker, text) in enumerate(said)]


def test_a_question_is_open_until_someone_else_speaks() -> None:
    talk = turns(
        ("Alice", "Shall we book Lisbon?"),
        ("Nova", "Yes. How many people?"),
        ("Alice", "Two. Also, which flight leaves first?"),
        ("Alice", "And is breakfast included?"),
    )
    found = open_questions(talk, 40)
    assert [(q.index, q.text) for q in found] == [
        (42, "Also, which flight leaves first?"),
        (43, "And is breakfast included?"),
    ]
    assert open_questions(turns(("Alice", "Which one?"), ("Nova", "The first.")), 0) == []
    assert (
        open_questions(
            turns(
                ("Alice", "It leaves at nine."),
            ),
            0,
        )
        == []
    )


@asynccontextmanager
async def serving(realtime: StandInRealtime) -> AsyncIterator[tuple[Server, str]]:
    """A real voice-context server beside the stand-in realtime service, and the service's URL."""
    async with running(settings(), summarizer=DeterministicSummarizer()) as server, realtime:
        yield server, realtime.url


@pytest.mark.asyncio
async def test_with_server_vad_each_reply_carries_the_memory_of_the_turn_it_answers() -> None:
    call = [
        User("My booking code is QX7-ALPHA, keep it handy.", "Noted, QX7-ALPHA."),
        User("I want an aisle seat on the Porto flight.", "Aisle seat noted."),
        User("No checked bags, just a small backpack.", "Cabin bag only."),
        User("Vegetarian meal please, no mushrooms.", "Vegetarian, no mushrooms."),
        User("Can we leave after lunch instead of the morning?", "The 14:20 departure works."),
        User("And put Marta next to me, she flies too.", "Marta is beside you."),
        *[
            User(f"On day {d} we visit museum number {d} in the old town.", f"Day {d} planned.")
            for d in range(8)
        ],
    ]
    memory_server: list[Server] = []

    async def caught_up() -> None:
        """The caller takes a breath before the question, and the folds the call made due land
        meanwhile, as the seconds of a real call let them (the stand-in plays the call as fast
        as the bot answers; a context asked for while a fold runs leaves the next to its landing)."""
        (server,) = memory_server
        await server.manager.settled()

    question = User("What was my booking code again?", "It is QX7-ALPHA.")
    realtime = StandInRealtime([[*call, Pause(caught_up), question]], timeout=TIMEOUT)
    async with serving(realtime) as (server, service_url):
        memory_server.append(server)
        with anyio.fail_after(TIMEOUT * 4):
            memory = await run(
                f"{service_url}?model=gpt-realtime",
                server.url,
                "call-7",
                base_instructions="You are Nova, a travel agent.",
                limit_chars=900,
                provider_sessions=1,
            )
        async with Client(server.url) as client:
            state = await (await client.open("call-7")).state()
    (session,) = realtime.sessions
    # every response ran with a context that already held what the user had just said
    call.append(question)
    assert [said for said, _ in session.answered] == [turn.said for turn in call]
    for said_now, instructions in session.answered:
        assert f"user: {said_now}" in instructions, f"answered {said_now!r} with:\n{instructions}"
        assert len(instructions) <= 900
    # and recall looked for the newest turn: the question is answered with what it asks about
    _, instructions = session.answered[-1]
    assert "QX7-ALPHA" in instructions.split("Recalled from earlier in this session")[1]
    # for that, the briefing left the replies to the memory: server VAD, no automatic response
    assert session.received[0]["session"]["audio"]["input"]["turn_detection"] == {
        "type": "server_vad",
        "create_response": False,
    }
    assert session.errors == []
    assert memory is not None and (memory.replies, memory.fallbacks) == (len(call), 0)
    assert state["turns"] == 2 * len(call)


@pytest.mark.asyncio
async def test_a_webrtc_call_is_served_over_its_sideband_connection_by_call_id(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    realtime = StandInRealtime(timeout=TIMEOUT)
    call = realtime.call("rtc_u1_9c6574da", [User("Is my window seat still booked?", "Yes, 14A.")])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-server-key")
    async with serving(realtime) as (server, service_url):
        async with Client(server.url) as client:  # the caller's call of yesterday
            room = await client.open("caller-351")
            await room.append_turn("user", "user", "Book me window seat 14A to Lisbon.", at=T0)
            await room.append_turn("assistant", "assistant", "Done: 14A, Lisbon.", at=T0 + 5)
        argv = [
            "--realtime-url",
            f"{service_url}?model=gpt-realtime",
            "--voice-context",
            server.url,
            "--session",
            "caller-351",
            "--call-id",
            "rtc_u1_9c6574da",
            "--instructions",
            "You are Nova.",
        ]
        with anyio.fail_after(TIMEOUT * 4):  # the command returns when the call hangs up
            assert await anyio.to_thread.run_sync(main, argv, abandon_on_cancel=True) == 0
        async with Client(server.url) as client:
            state = await (await client.open("caller-351")).state()
    assert state["turns"] == 4

    assert realtime.sessions == [call]  # one connection: to the call, not to a fresh session
    assert call.path == "/v1/realtime?call_id=rtc_u1_9c6574da"
    assert call.headers["Authorization"] == "Bearer sk-server-key"
    assert call.errors == []
    briefing = call.received[0]["session"]
    assert "Book me window seat 14A" in briefing["instructions"]
    assert briefing["audio"]["input"]["turn_detection"]["create_response"] is False
    ((question, instructions),) = call.answered
    assert "Book me window seat 14A" in instructions and f"user: {question}" in instructions


@pytest.mark.asyncio
async def test_a_reply_never_waits_on_memory_that_will_not_come() -> None:
    sent: list[dict[str, Any]] = []
    replied = anyio.Condition()

    async def send(event: dict[str, Any]) -> None:
        sent.append(event)
        async with replied:
            replied.notify_all()

    async def next_reply() -> dict[str, Any]:
        async with replied:
            while not sent:
                await replied.wait()
        return sent.pop(0)

    async with (
        running(settings(), summarizer=DeterministicSummarizer()) as server,
        Client(server.url) as client,
    ):
        room = await client.open("call-9")
        with anyio.fail_after(TIMEOUT):
            async with RealtimeMemory(room, send, reply_within=TIMEOUT * 10) as memory:
                # the transcription failed: the reply goes out at once, with the session's instructions
                await memory.on_event(committed("a"))
                await memory.on_event(failed("a"))
                assert await next_reply() == {"type": "response.create"}
                # the user speaks on before the reply went out: the next commit's reply answers both
                await memory.on_event(committed("b"))
                await memory.on_event({"type": "input_audio_buffer.speech_started"})
                await memory.on_event(heard("Two tickets to Lisbon,", "b"))
                assert sent.pop(0)["type"] == "session.update"  # nothing waits for it: the session's
                await memory.on_event(committed("c"))
                await memory.on_event(heard("in May.", "c"))
                answer, update = await next_reply(), await next_reply()
                assert answer["type"] == "response.create" and update["type"] == "session.update"
                assert "user: Two tickets to Lisbon,\nuser: in May." in answer["response"]["instructions"]
                assert update["session"]["instructions"] == answer["response"]["instructions"]
                # no transcript within reply_within: the reply goes without it
                memory.reply_within = 0.01
                await memory.on_event(committed("d"))
                assert await next_reply() == {"type": "response.create"}
                # and the transcript that comes late is remembered for the next reply
                await memory.on_event(heard("Window seats.", "d"))
                assert "user: Window seats." in (await next_reply())["session"]["instructions"]
    assert (memory.replies, memory.fallbacks) == (3, 2)
    assert sent == []


@pytest.mark.asyncio
async def test_a_realtime_session_is_briefed_after_each_user_turn_and_the_next_one_gets_the_handoff() -> None:
    first: list[Step] = [
        User("Let's book Lisbon for May 3rd, flying out of Porto.", "Sure. For how many people?"),
        User("Two of us. Which flight leaves first?", None),
        {"type": "error", "error": {"type": "invalid_request_error", "code": "session_expired"}},
    ]
    realtime = StandInRealtime([first, []], timeout=TIMEOUT)
    async with serving(realtime) as (server, service_url):
        with anyio.fail_after(TIMEOUT * 4):
            await run(
                service_url,
                server.url,
                "call-7",
                base_instructions="You are Nova, a travel agent.",
                limit_chars=700,
                provider_sessions=2,
            )
        async with Client(server.url) as client:
            state = await (await client.open("call-7")).state()
    assert state["turns"] == 3

    one, two = realtime.sessions
    assert one.errors == two.errors == []
    briefing, *_ = one.received
    assert briefing["session"]["instructions"] == "You are Nova, a travel agent."
    answers = [instructions for _, instructions in one.answered]
    assert "Lisbon" in answers[0] and "Which flight" not in answers[0] and "Which flight" in answers[1]
    assert all(len(text) <= 700 for text in answers)
    # the fresh provider session starts where the old one stopped, the question still open
    (handoff,) = [event["session"]["instructions"] for event in two.received]
    assert len(handoff) <= 700
    assert "Let's book Lisbon" in handoff
    still_open = rf"{re.escape(OPEN_QUESTIONS_HEADER)}\n- \[[^]]+\] user: Which flight leaves first\?$"
    assert re.search(still_open, handoff)


@pytest.mark.asyncio
async def test_session_handoff_over_the_wire_fits_its_limit_and_names_what_is_open() -> None:
    async with running(settings(), summarizer=DeterministicSummarizer()) as server, wire(server) as bot:
        await bot.open("room-1")
        for k in range(70):
            await bot.append("room-1", k)
        await bot.request(
            "turn.append",
            session="room-1",
            turn={"speaker": "Alice", "role": "user", "text": "Where do we meet tomorrow?", "at": T0 + 700},
        )
        reply = await bot.request("session.handoff", session="room-1", limit_chars=900, last_turns=3)
        assert reply["type"] == "handoff"
        assert reply["chars"] == len(reply["instructions"]) <= reply["limit_chars"] == 900
        assert [t["index"] for t in reply["last_turns"]] == [68, 69, 70]
        assert reply["open_questions"] == [
            {"index": 70, "speaker": "Alice", "text": "Where do we meet tomorrow?", "at": T0 + 700}
        ]
        assert reply["instructions"].endswith("Alice: Where do we meet tomorrow?")
        bad = await bot.request("session.handoff", session="room-1", last_turns=99)
        assert (bad["type"], bad["code"]) == ("error", "bad_request")
        unknown = await bot.request("session.handoff", session="nobody")
        assert (unknown["type"], unknown["code"]) == ("error", "unknown_session")


def test_a_session_update_replaces_the_instructions_of_a_realtime_session() -> None:
    assert session_update("Be brief.") == {
        "type": "session.update",
        "session": {"type": "realtime", "instructions": "Be brief."},
    }
    assert session_update(None, {"type": "semantic_vad", "create_response": False}) == {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "audio": {"input": {"turn_detection": {"type": "semantic_vad", "create_response": False}}},
        },
    }
    assert response_create("Be brief.") == {
        "type": "response.create",
        "response": {"instructions": "Be brief."},
    }
    assert response_create() == {"type": "response.create"}


def test_a_sideband_url_addresses_the_call_and_not_a_model() -> None:
    assert (
        sideband_url("wss://api.openai.com/v1/realtime?model=gpt-realtime", "rtc_u1_9c65")
        == "wss://api.openai.com/v1/realtime?call_id=rtc_u1_9c65"
    )
    assert (
        sideband_url("ws://127.0.0.1:9/v1/realtime", "rtc_2") == "ws://127.0.0.1:9/v1/realtime?call_id=rtc_2"
    )


class RollingCall:
    """Stands in for the realtime service over one long call, on the test's clock: every
    connection is a fresh provider session, which the service expires an hour after it began
    (``session_expired``, then it closes it), and the caller speaks (:meth:`say`) into the newest
    session that was briefed."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sessions: list[RealtimeSession] = []
        self.active: tuple[RealtimeSession, ServerConnection] | None = None
        self.turns = itertools.count()
        self.briefed = [anyio.Event() for _ in range(8)]
        """``briefed[k]`` is set once the ``k+1``-th session was briefed."""

    async def handler(self, ws: ServerConnection) -> None:
        session = RealtimeSession([], began=self.clock.now())
        self.sessions.append(session)
        number = len(self.sessions)
        await send_event(ws, {"type": "session.created", "session": {"type": "realtime"}})
        try:
            async with session.responses, session.requested, anyio.create_task_group() as tg:
                tg.start_soon(self._expire, ws, session)
                async for raw in ws:
                    session.apply(orjson.loads(raw))
                    if session.briefed.is_set() and not self.briefed[number - 1].is_set():
                        self.active = (session, ws)
                        self.briefed[number - 1].set()
                tg.cancel_scope.cancel()
        finally:
            session.closed_at = self.clock.now()

    async def _expire(self, ws: ServerConnection, session: RealtimeSession) -> None:
        await self.clock.sleep_until(session.began + SESSION_LIMIT)
        session.expired = True
        expired = {"type": "invalid_request_error", "code": "session_expired"}
        await send_event(ws, {"type": "error", "error": expired})
        await ws.close()

    async def say(self, step: User) -> None:
        """The caller says ``step.said`` into the active session; returns once it is answered."""
        assert self.active is not None
        session, ws = self.active
        await play_turn(ws, session, f"item_{next(self.turns)}", step)

    async def hang_up(self) -> None:
        assert self.active is not None
        await self.active[1].close()


def utterance(k: int) -> str:
    """What the caller says in the call's ``k``-th half minute: the booking code first."""
    return "My booking code is QX7-ALPHA, keep it handy." if k == 0 else f"On stop {k} we see museum {k}."


@pytest.mark.asyncio
async def test_a_seventy_minute_call_rolls_over_to_a_fresh_session_before_the_hour_and_loses_no_turn() -> (
    None
):
    clock, store = ManualClock(T0), MemoryStore()
    call = RollingCall(clock)
    exchanges = [(utterance(k), f"Noted, stop {k}.") for k in range(140)]  # one every half minute
    async with (
        running(settings(), summarizer=DeterministicSummarizer(), store=store) as server,
        serve(call.handler, "127.0.0.1", 0) as service,
        anyio.create_task_group() as tg,
    ):
        url = f"ws://127.0.0.1:{service.sockets[0].getsockname()[1]}/v1/realtime?model=gpt-realtime"
        finished = anyio.Event()

        async def calling() -> None:
            await run(url, server.url, "call-7", base_instructions=PROMPT, provider_sessions=2, clock=clock)
            finished.set()

        tg.start_soon(calling)
        with anyio.fail_after(TIMEOUT):
            await call.briefed[0].wait()
        for k, (said_now, reply) in enumerate(exchanges):
            clock.advance_to(T0 + 15 + 30 * k)
            if clock.now() >= T0 + SESSION_LIMIT - ROLLOVER_BEFORE:
                with anyio.fail_after(TIMEOUT):  # the rollover is due: the caller goes on in the new one
                    await call.briefed[1].wait()
            with anyio.fail_after(TIMEOUT):
                await call.say(User(said_now, reply))
        await call.hang_up()
        with anyio.fail_after(TIMEOUT):
            await finished.wait()
        stored = await store.read_turns("call-7", 0, 1000)

    one, two = call.sessions
    # the fresh session began two minutes before the hour (at the first turn after), and the old one
    # was closed by the bot, not expired by the service
    assert T0 + SESSION_LIMIT - ROLLOVER_BEFORE <= two.began < T0 + SESSION_LIMIT - ROLLOVER_BEFORE + 30
    assert not one.expired and one.closed_at is not None and one.closed_at < T0 + SESSION_LIMIT
    assert one.errors == two.errors == []
    # every turn said, on either side of the rollover, is stored once, in order
    assert [said_now for said_now, _ in one.answered + two.answered] == [
        said_now for said_now, _ in exchanges
    ]
    assert [(t.role, t.text) for t in stored] == [
        turn for said_now, reply in exchanges for turn in (("user", said_now), ("assistant", reply))
    ]
    # the fresh session was briefed with the handoff, and every reply after the rollover was created
    # with instructions holding the booking code said seventy minutes before
    handoff = two.received[0]["session"]["instructions"]
    assert handoff.startswith(PROMPT) and "QX7-ALPHA" in handoff
    assert len(two.answered) == 24
    assert all("QX7-ALPHA" in instructions for _, instructions in two.answered)
