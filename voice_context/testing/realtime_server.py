"""A stand-in for the OpenAI Realtime service: a real websocket server on 127.0.0.1 that plays a
call the way server VAD orders it, for tests and for running a realtime bot offline.

    call = [User("My booking code is QX7-ALPHA."), User("What was my booking code again?", answer)]
    async with StandInRealtime([call]) as realtime:
        ...  # connect the bot to f"{realtime.url}?model=gpt-realtime"
    (session,) = realtime.sessions
    session.answered  # each user turn, with the instructions its response ran with

A connection to ``/v1/realtime?model=...`` is a fresh session playing the next of ``scripts``;
one to ``/v1/realtime?call_id=ID`` is the sideband of the WebRTC or SIP call ``ID`` (made with
:meth:`StandInRealtime.call`). A session waits for the client's briefing (its first
``session.update``), then plays its script: for each :class:`User`, speech started and
stopped, the audio committed, the response started at once unless the briefing turned
``create_response`` off, the transcript completed, then (with ``create_response`` off) the
response the client asks for with ``response.create``; the model's words close the turn. A
script's dicts are sent as they are (an ``error`` that expires the session, say), and a
:class:`Pause` waits for what it names before the call goes on (a caller who lets the memory
catch up before asking, say). When the script is played the connection is closed, as a call
that hangs up.

The model's words are the script's (``User.reply``), or computed from the instructions the
response ran with (a callable, such as :func:`voice_context.testing.answers.answer`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import anyio
import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers

__all__ = [
    "Pause",
    "RealtimeSession",
    "StandInRealtime",
    "Step",
    "User",
    "committed",
    "failed",
    "heard",
    "play_turn",
    "said",
    "send_event",
]

Words = str | Callable[[str, str], str] | None
"""What the model says to a user turn: fixed words, words made from (the instructions the
response ran with, what the user said), or ``None``: the session ends before the model's words."""


@dataclass(frozen=True)
class User:
    """One user turn on the call: ``said`` (the transcript server VAD's audio gets), then the
    model's ``reply`` (see :data:`Words`)."""

    said: str
    reply: Words = "Sure."


@dataclass(frozen=True)
class Pause:
    """A pause in the call: the stand-in goes on once ``until()`` returns (within its timeout),
    as a caller who takes a breath before the next thing they say."""

    until: Callable[[], Awaitable[None]]


Step = User | Pause | dict[str, Any]
"""One step of a call's script: a user turn, a pause, or a server event sent as it is."""


@dataclass
class RealtimeSession:
    """One realtime session as the stand-in service holds it: its instructions and turn detection
    as the client's events left them, what the client sent, and, for each user turn, the
    instructions the response that answered it ran with."""

    script: list[Step]
    instructions: str = ""
    create_response: bool = True  # server VAD's default
    received: list[dict[str, Any]] = field(default_factory=list)
    answered: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    path: str = ""
    headers: Headers = field(default_factory=Headers)
    briefed: anyio.Event = field(default_factory=anyio.Event)
    began: float = 0.0
    """When the session began, on the clock of whoever serves it (a test's own)."""
    closed_at: float | None = None
    expired: bool = False

    def __post_init__(self) -> None:
        self.responses, self.requested = anyio.create_memory_object_stream[str](16)

    def apply(self, event: dict[str, Any]) -> None:
        """A client event, as the service takes it: a ``session.update`` changes the session,
        a ``response.create`` asks for a response with its own instructions or the session's."""
        self.received.append(event)
        if event.get("type") == "session.update":
            update = event["session"]
            if update.get("type") != "realtime":
                self.errors.append(f"session.update without type realtime: {update}")
            if "instructions" in update:
                self.instructions = update["instructions"]
            detection = update.get("audio", {}).get("input", {}).get("turn_detection")
            if detection is not None:
                self.create_response = detection.get("create_response", True)
            self.briefed.set()
        elif event.get("type") == "response.create":
            instructions = event.get("response", {}).get("instructions", self.instructions)
            self.responses.send_nowait(instructions)
        else:
            self.errors.append(f"unexpected client event: {event}")


class StandInRealtime:
    """Stands in for the OpenAI Realtime service (see the module's docstring). Use it with
    ``async with`` (it listens on 127.0.0.1, at :attr:`url`), or serve :meth:`handler` with
    websockets yourself. ``timeout`` bounds each wait for the client: for its briefing, and for
    the ``response.create`` of a turn."""

    def __init__(self, scripts: Sequence[list[Step]] = (), *, timeout: float = 5.0) -> None:
        self.scripts = list(scripts)
        self.timeout = timeout
        self.sessions: list[RealtimeSession] = []
        self.calls: dict[str, RealtimeSession] = {}
        self._server: Server | None = None

    @property
    def url(self) -> str:
        """The service's realtime URL, ``ws://127.0.0.1:PORT/v1/realtime`` (add ``?model=``)."""
        if self._server is None:
            raise RuntimeError("the stand-in is not listening: use it with `async with`")
        return f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1/realtime"

    async def __aenter__(self) -> Self:
        self._server = await serve(self.handler, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    def call(self, call_id: str, script: list[Step]) -> RealtimeSession:
        """A call a WebRTC client (or a SIP trunk) started, waiting for its sideband."""
        session = self.calls[call_id] = RealtimeSession(script)
        return session

    async def handler(self, ws: ServerConnection) -> None:
        """Serve one connection: a fresh session, or a call's sideband."""
        assert ws.request is not None
        call_id = parse_qs(urlsplit(ws.request.path).query).get("call_id", [None])[0]
        if call_id is not None:
            session = self.calls[call_id]
        else:
            session = RealtimeSession(self.scripts.pop(0))
            await send_event(ws, {"type": "session.created", "session": {"type": "realtime"}})
        session.path, session.headers = ws.request.path, ws.request.headers
        self.sessions.append(session)
        async with session.responses, session.requested, anyio.create_task_group() as tg:
            tg.start_soon(self._listen, ws, session)
            with anyio.fail_after(self.timeout):
                await session.briefed.wait()
            await self._play(ws, session)
            await ws.close()
            tg.cancel_scope.cancel()

    async def _listen(self, ws: ServerConnection, session: RealtimeSession) -> None:
        async for raw in ws:
            session.apply(orjson.loads(raw))

    async def _play(self, ws: ServerConnection, session: RealtimeSession) -> None:
        for k, step in enumerate(session.script):
            if isinstance(step, dict):
                await send_event(ws, step)
            elif isinstance(step, Pause):
                with anyio.fail_after(self.timeout):
                    await step.until()
            else:
                await play_turn(ws, session, f"item_{k}", step, self.timeout)


async def play_turn(
    ws: ServerConnection, session: RealtimeSession, item: str, step: User, wait: float = 5.0
) -> None:
    """One user turn as server VAD orders it (see the module's docstring): speech started and
    stopped, the audio committed as ``item``, the response, the model's words. ``wait`` bounds
    the wait for the client's ``response.create``."""
    await send_event(ws, {"type": "input_audio_buffer.speech_started", "item_id": item})
    await send_event(ws, {"type": "input_audio_buffer.speech_stopped", "item_id": item})
    await send_event(ws, committed(item))
    if session.create_response:  # the response starts now, before the transcript is done
        instructions = session.instructions
        await send_event(ws, {"type": "response.created"})
    await send_event(ws, heard(step.said, item))
    if not session.create_response:
        with anyio.fail_after(wait):
            instructions = await session.requested.receive()
        await send_event(ws, {"type": "response.created"})
    session.answered.append((step.said, instructions))
    if step.reply is not None:
        words = step.reply if isinstance(step.reply, str) else step.reply(instructions, step.said)
        await send_event(ws, said(words))
        await send_event(ws, {"type": "response.done"})


async def send_event(ws: ServerConnection, event: dict[str, Any]) -> None:
    """Send one server event."""
    await ws.send(orjson.dumps(event).decode())


def heard(text: str, item: str) -> dict[str, Any]:
    """The server event of a finished transcript of the user's audio item ``item``."""
    return {
        "type": "conversation.item.input_audio_transcription.completed",
        "item_id": item,
        "transcript": text,
    }


def committed(item: str) -> dict[str, Any]:
    """The server event of the user's audio committed as the item ``item``."""
    return {"type": "input_audio_buffer.committed", "item_id": item}


def failed(item: str) -> dict[str, Any]:
    """The server event of a transcription of ``item`` that failed."""
    return {"type": "conversation.item.input_audio_transcription.failed", "item_id": item}


def said(text: str) -> dict[str, Any]:
    """The server event of the model's finished words (its audio's transcript)."""
    return {"type": "response.output_audio_transcript.done", "transcript": text}
