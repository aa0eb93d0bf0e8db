"""An OpenAI Realtime session kept briefed: a local stand-in for the realtime websocket on 127.0.0.1
sends what the provider sends (transcripts, then ``session_expired``), a real voice-context server
remembers, and a fresh provider session starts with the handoff; plus ``session.handoff`` itself."""

from __future__ import annotations

import re
from typing import Any

import anyio
import orjson
import pytest
from serving import TIMEOUT, running, settings, wire
from websockets.asyncio.server import ServerConnection, serve

from voice_context.client import Client
from voice_context.core.handoff import OPEN_QUESTIONS_HEADER, open_questions
from voice_context.core.turns import Turn
from voice_context.integrations.openai_realtime import run, session_update
from voice_context.summarizers.deterministic import DeterministicSummarizer

T0 = 1714572187.0


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


class FakeRealtime:
    """Stands in for the realtime websocket: each connection is a provider session that waits
    for its briefing, then sends its script of server events, waiting for the client's
    ``session.update`` after each user transcript, and records what the client sent."""

    def __init__(self, scripts: list[list[dict[str, Any]]]) -> None:
        self.scripts = scripts
        self.received: list[list[dict[str, Any]]] = []

    async def handler(self, ws: ServerConnection) -> None:
        got: list[dict[str, Any]] = []
        self.received.append(got)
        script = self.scripts[len(self.received) - 1]
        await ws.send(orjson.dumps({"type": "session.created", "session": {"type": "realtime"}}).decode())
        got.append(orjson.loads(await ws.recv()))  # the briefing
        for event in script:
            await ws.send(orjson.dumps(event).decode())
            if event["type"] == "conversation.item.input_audio_transcription.completed":
                got.append(orjson.loads(await ws.recv()))  # the update after a user turn
        await ws.close()


def heard(text: str) -> dict[str, Any]:
    return {"type": "conversation.item.input_audio_transcription.completed", "transcript": text}


def said(text: str) -> dict[str, Any]:
    return {"type": "response.output_audio_transcript.done", "transcript": text}


@pytest.mark.asyncio
async def test_a_realtime_session_is_briefed_after_each_user_turn_and_the_next_one_gets_the_handoff() -> None:
    first = [
        heard("Let's book Lisbon for May 3rd, flying out of Porto."),
        said("Sure. For how many people?"),
        heard("Two of us. Which flight leaves first?"),
        {"type": "error", "error": {"type": "invalid_request_error", "code": "session_expired"}},
    ]
    fake = FakeRealtime([first, []])
    async with (
        running(settings(), summarizer=DeterministicSummarizer()) as server,
        serve(fake.handler, "127.0.0.1", 0) as realtime,
    ):
        port = realtime.sockets[0].getsockname()[1]
        with anyio.fail_after(TIMEOUT * 4):
            await run(
                f"ws://127.0.0.1:{port}",
                server.url,
                "call-7",
                base_instructions="You are Nova, a travel agent.",
                limit_chars=700,
                provider_sessions=2,
            )
        async with Client(server.url) as client:
            room = await client.open("call-7")
            state = await room.state()
    assert state["turns"] == 3

    one, two = fake.received
    assert all(event["type"] == "session.update" for event in one + two)
    assert all(event["session"]["type"] == "realtime" for event in one + two)
    updates = [event["session"]["instructions"] for event in one]
    # the briefing, then one update after each user turn (the model's own words need none)
    assert len(updates) == 3
    assert updates[0] == "You are Nova, a travel agent."
    assert "Alice" not in updates[0] and "Lisbon" in updates[1] and "Which flight" in updates[2]
    assert all(len(text) <= 700 for text in updates)
    # the fresh provider session starts where the old one stopped, the question still open
    (handoff,) = [event["session"]["instructions"] for event in two]
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
