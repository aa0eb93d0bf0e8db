"""Keep an OpenAI Realtime session's memory current from voice-context, in time for each reply.

A realtime model hears the conversation itself, but forgets what falls out of
its window, and a provider session ends after a while (a ``session_expired``
error): the next one starts empty. :class:`RealtimeMemory` sits beside the
realtime websocket, the bot's own or the sideband of a WebRTC or SIP call:

- every finalized transcript the realtime session reports becomes a turn in
  voice-context: the user's (``conversation.item.input_audio_transcription.completed``)
  and the model's (``response.output_audio_transcript.done``, or the text and
  beta names of the same events);
- each reply waits for its memory. With server VAD the service commits the
  user's audio (``input_audio_buffer.committed``) and, left to itself, starts
  the response at once, while the transcript of that audio completes later: a
  context fetched for it would reach only the reply after. So the briefing
  turns the automatic response off (``turn_detection.create_response: false``),
  and for each committed user turn :class:`RealtimeMemory` stores the
  transcript, asks voice-context for the context in the realtime
  ``instructions`` format (recall looking for what the user just said) and
  sends ``response.create`` with it as that response's ``instructions``, then
  the same as a ``session.update`` for responses created elsewhere (a tool
  call's follow-up, an idle timeout);
- with ``respond=False`` the session's turn detection keeps creating the
  responses, and the context follows each user turn as a ``session.update``:
  under server VAD it reaches the reply after the one it was fetched for;
- when a fresh provider session takes over, :meth:`RealtimeMemory.handoff`
  briefs it: the ``session.handoff`` instructions (the context ending with the
  questions still open) and, when it creates the replies, the turn detection;
- a provider session lasts an hour (``session_limit``): :func:`run` rolls
  over to a fresh one ``rollover_before`` (two minutes) before, at a turn
  boundary (:meth:`RealtimeMemory.until_idle`), rather than wait for the
  ``session_expired`` that ends it. The old session is closed once the new one
  is briefed and the old one has finished the exchange it was in, so no
  transcript is lost across the rollover.

A reply never waits on memory for long: when the transcript, the turn or the
context is not in within ``reply_within`` seconds of the commit (or the
transcription failed), a plain ``response.create`` goes out and the session
answers with the instructions it had; each voice-context request gives up after
``timeout`` seconds, and a turn that could not be stored is logged and dropped
from memory, never retried in the audio path.

The realtime websocket itself is the caller's (``send`` is its send of one
JSON event); :func:`run` is the whole loop against a realtime URL, or against a
call's sideband (``wss://api.openai.com/v1/realtime?call_id=...``) with
``call_id`` (``python -m voice_context.integrations.openai_realtime --session
ID [--call-id CALL]``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import anyio
import anyio.abc

from voice_context.client import SessionHandle
from voice_context.errors import VoiceContextError
from voice_context.integrations.clock import Clock, WallClock
from voice_context.logs import get_logger

__all__ = [
    "BOT_EVENTS",
    "ROLLOVER_BEFORE",
    "SERVER_VAD",
    "SESSION_LIMIT",
    "USER_EVENTS",
    "RealtimeMemory",
    "response_create",
    "session_update",
    "sideband_url",
]

log = get_logger("voice_context.integrations.openai_realtime")

USER_EVENTS = frozenset({"conversation.item.input_audio_transcription.completed"})
"""Server events carrying a finalized transcript of what the user said (``transcript``)."""
BOT_EVENTS: Mapping[str, str] = {
    "response.output_audio_transcript.done": "transcript",
    "response.audio_transcript.done": "transcript",  # the beta interface's name
    "response.output_text.done": "text",
    "response.text.done": "text",
}
"""Server events carrying what the model said, and the field that holds it."""
COMMITTED = "input_audio_buffer.committed"
"""The user's audio became a conversation item (``item_id``): a turn to answer."""
TRANSCRIPTION_FAILED = "conversation.item.input_audio_transcription.failed"
SPEECH_STARTED = "input_audio_buffer.speech_started"
RESPONSE_CREATED = "response.created"
RESPONSE_DONE = "response.done"

SESSION_LIMIT = 3600.0
"""Seconds a realtime provider session lasts: the service then ends it (``session_expired``)."""
ROLLOVER_BEFORE = 120.0
"""Seconds before ``SESSION_LIMIT`` that :func:`run` moves the call to a fresh provider session."""

SERVER_VAD: Mapping[str, Any] = {"type": "server_vad"}
"""The turn detection a briefing sets by default when :class:`RealtimeMemory` creates the replies
(with ``create_response`` turned off)."""


def session_update(
    instructions: str | None, turn_detection: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The client event that replaces a realtime session's instructions and, when given, its turn
    detection."""
    session: dict[str, Any] = {"type": "realtime"}
    if instructions is not None:
        session["instructions"] = instructions
    if turn_detection is not None:
        session["audio"] = {"input": {"turn_detection": dict(turn_detection)}}
    return {"type": "session.update", "session": session}


def response_create(instructions: str | None = None) -> dict[str, Any]:
    """The client event that starts a response: with ``instructions``, they are that response's
    (the session's stay as they were); without, the session's own."""
    if instructions is None:
        return {"type": "response.create"}
    return {"type": "response.create", "response": {"instructions": instructions}}


def sideband_url(realtime_url: str, call_id: str) -> str:
    """The sideband websocket of a WebRTC or SIP call: ``realtime_url`` addressed by ``call_id``
    (any ``model`` dropped: the call's session has its own)."""
    parts = urlsplit(realtime_url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k not in ("model", "call_id")]
    return urlunsplit(parts._replace(query=urlencode([*query, ("call_id", call_id)])))


@dataclass(eq=False)
class _Reply:
    """A committed user turn waiting for its memory: ``ready`` once ``instructions`` are in, or
    once it is known they will not come (``None``)."""

    item: str
    ready: anyio.Event = field(default_factory=anyio.Event)
    instructions: str | None = None


class RealtimeMemory:
    """Feeds a realtime session's transcripts to voice-context and its context back, in time for
    the reply that answers each user turn.

    With ``respond`` (the default) it creates the replies: use it as ``async with`` (the replies
    wait in its task group), brief the session with :meth:`handoff` (which sets
    ``turn_detection``, server VAD by default, with ``create_response: false``; ``None`` leaves
    the session's own, for a session created so or a push-to-talk one), and let nothing else send
    ``response.create`` for the user's turns. The session must transcribe the user's audio
    (``audio.input.transcription``): a reply waits for its transcript at most ``reply_within``
    seconds. ``timeout`` bounds each request to voice-context; ``limit_chars`` the instructions
    (the session's ``instructions_budget_chars`` by default), which start with
    ``base_instructions``."""

    def __init__(
        self,
        room: SessionHandle,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        *,
        base_instructions: str = "",
        limit_chars: int | None = None,
        user: str = "user",
        bot: str = "assistant",
        timeout: float = 0.5,
        respond: bool = True,
        turn_detection: Mapping[str, Any] | None = SERVER_VAD,
        reply_within: float = 1.0,
    ) -> None:
        self.room = room
        self.send = send
        self.base_instructions = base_instructions
        self.limit_chars = limit_chars
        self.user = user
        self.bot = bot
        self.timeout = timeout
        self.respond = respond
        self.turn_detection = turn_detection
        self.reply_within = reply_within
        self.updates = 0
        self.skipped = 0
        self.replies = 0
        self.fallbacks = 0
        self._waiting: dict[str, _Reply] = {}
        self._speaking = False
        self._responding = False
        self._changed = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack: AsyncExitStack | None = None

    def __repr__(self) -> str:
        return (
            f"<RealtimeMemory {self.room.name!r} updates={self.updates} skipped={self.skipped} "
            f"replies={self.replies} fallbacks={self.fallbacks} waiting={len(self._waiting)}>"
        )

    async def __aenter__(self) -> Self:
        async with AsyncExitStack() as stack:
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(self._stop_waiting)  # on the way out, before the task group ends
            self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None, "the memory was not entered"
        return await stack.__aexit__(kind, exc, tb)

    def _stop_waiting(self) -> None:
        """The realtime socket is done with: a reply still waiting has no one to answer, and
        no reply waits from now on."""
        self._tg = None
        for reply in self._waiting.values():
            reply.ready.set()
        self._waiting.clear()

    @property
    def idle(self) -> bool:
        """Between exchanges: the user is not speaking, no reply waits for its memory, and no
        response is in progress."""
        return not (self._speaking or self._responding or self._waiting)

    async def until_idle(self) -> None:
        """Return once the session is :attr:`idle` (at once if it is)."""
        while not self.idle:
            await self._changed.wait()

    def _touch(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def on_event(self, event: Mapping[str, Any]) -> None:
        """Take one server event of the realtime session (the others are ignored)."""
        try:
            await self._on_event(event)
        finally:
            self._touch()

    async def _on_event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == RESPONSE_CREATED:
            self._responding = True
        elif kind == RESPONSE_DONE:
            self._responding = False
        elif kind == COMMITTED:
            self._speaking = False
        item = event.get("item_id")
        if kind in USER_EVENTS:
            said = event.get("transcript")
            if isinstance(said, str) and said.strip():
                await self._heard(said, item if isinstance(item, str) else None)
            else:
                self._give_up(item, "empty_transcript")
        elif isinstance(kind, str) and kind in BOT_EVENTS:
            said = event.get(BOT_EVENTS[kind])
            if isinstance(said, str) and said.strip():
                await self._append(self.bot, "assistant", said)
        elif kind == COMMITTED and self.respond and isinstance(item, str):
            self._wait_for_memory(item)
        elif kind == TRANSCRIPTION_FAILED:
            self._give_up(item, "transcription_failed")
        elif kind == SPEECH_STARTED:
            self._speaking = True
            # The user speaks again before the reply went out: the next commit's reply answers both,
            # as the session's own turn detection would have interrupted this one.
            for reply in self._waiting.values():
                log.info("realtime_reply_superseded", session=self.room.name, item=reply.item)
                reply.ready.set()
            self._waiting.clear()

    async def refresh(self) -> bool:
        """Send the session the current context as its instructions; ``False`` when voice-context
        did not answer within ``timeout`` (the session keeps the instructions it had)."""
        instructions = await self._context()
        if instructions is None:
            return False
        await self.send(session_update(instructions))
        self.updates += 1
        return True

    async def handoff(self) -> dict[str, Any] | None:
        """Brief a fresh provider session: one ``session.update`` with the handoff instructions
        (the context, then the questions still open) and, when this memory creates the replies,
        the turn detection with ``create_response`` off. Returns the ``handoff`` reply, or
        ``None`` when voice-context did not answer in time (the turn detection is set all the
        same, and the session keeps the instructions it had)."""
        reply = await self._ask(lambda: self.room.handoff(self.limit_chars, self.base_instructions))
        detection = None
        if self.respond and self.turn_detection is not None:
            detection = {**self.turn_detection, "create_response": False}
        if reply is None and detection is None:
            return None
        await self.send(session_update(None if reply is None else str(reply["instructions"]), detection))
        if reply is not None:
            self.updates += 1
        return reply

    def _wait_for_memory(self, item: str) -> None:
        if self._tg is None:
            raise RuntimeError("RealtimeMemory creates replies inside `async with memory:`")
        reply = self._waiting[item] = _Reply(item)
        self._tg.start_soon(self._answer, reply)

    async def _answer(self, reply: _Reply) -> None:
        """Create the response to one committed user turn once its memory is in, or without it
        after ``reply_within`` seconds."""
        with anyio.move_on_after(self.reply_within):
            await reply.ready.wait()
        # Decided here, after the last wait: a reply superseded or closed is no longer ours to send.
        if self._waiting.pop(reply.item, None) is not reply:
            return
        self._responding = True  # asked for: the exchange goes on until its response.done
        await self.send(response_create(reply.instructions))
        self.replies += 1
        if reply.instructions is None:
            self.fallbacks += 1
            log.warning("realtime_reply_without_memory", session=self.room.name, item=reply.item)
            return
        await self.send(session_update(reply.instructions))
        self.updates += 1

    def _give_up(self, item: object, why: str) -> None:
        """A committed turn whose memory will not come: its reply goes out now, plainly."""
        reply = self._waiting.get(item) if isinstance(item, str) else None
        if reply is not None:
            log.info("realtime_reply_not_waiting", session=self.room.name, item=item, reason=why)
            reply.ready.set()

    async def _heard(self, said: str, item: str | None) -> None:
        """The user's transcript: store it, fetch the context for it, and hand that to the reply
        waiting for it (or, with none waiting, to the session's instructions)."""
        # Stored here, in event order, so that turns reach voice-context in the order said.
        instructions = await self._context() if await self._append(self.user, "user", said) else None
        reply = self._waiting.get(item) if item is not None else None
        if reply is not None:
            reply.instructions = instructions
            reply.ready.set()
        elif instructions is not None:
            await self.send(session_update(instructions))
            self.updates += 1

    async def _context(self) -> str | None:
        reply = await self._ask(
            lambda: self.room.context("instructions", self.limit_chars, self.base_instructions)
        )
        return None if reply is None else str(reply["instructions"])

    async def _append(self, speaker: str, role: str, text: str) -> bool:
        try:
            with anyio.fail_after(self.timeout):
                await self.room.append_turn(speaker, "user" if role == "user" else "assistant", text)
        except (TimeoutError, VoiceContextError) as exc:
            self.skipped += 1
            log.warning("realtime_turn_not_stored", session=self.room.name, role=role, error=repr(exc))
            return False
        return True

    async def _ask(self, request: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any] | None:
        try:
            with anyio.fail_after(self.timeout):
                return await request()
        except (TimeoutError, VoiceContextError) as exc:
            self.skipped += 1
            log.warning("realtime_update_skipped", session=self.room.name, error=repr(exc))
            return None


def _expired(event: Mapping[str, Any]) -> bool:
    """Whether a server event says the provider ended the session for its age."""
    error = event.get("error")
    return event.get("type") == "error" and isinstance(error, dict) and error.get("code") == "session_expired"


async def _relay(ws: Any, memory: RealtimeMemory, provider_session: int) -> None:
    """Feed one realtime connection's server events to ``memory`` until the provider expires the
    session or closes the connection."""
    import orjson
    from websockets.exceptions import ConnectionClosed

    name = memory.room.name
    try:
        async for raw in ws:
            event = orjson.loads(raw)
            if not isinstance(event, dict):
                continue
            if _expired(event):
                log.info("realtime_session_expired", session=name, provider_session=provider_session)
                return
            await memory.on_event(event)
    except ConnectionClosed:
        log.info("realtime_session_closed", session=name, provider_session=provider_session)


@dataclass(eq=False)
class _Provider:
    """One provider session of :func:`run`: its memory, when it began, and its end."""

    number: int
    began: float
    memory: RealtimeMemory
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    ended: anyio.Event = field(default_factory=anyio.Event)


async def _provide(
    url: str,
    headers: Mapping[str, str],
    memory_for: Callable[[Callable[[dict[str, Any]], Awaitable[None]]], RealtimeMemory],
    number: int,
    clock: Clock,
    *,
    task_status: anyio.abc.TaskStatus[_Provider] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """One provider session: connected, briefed with the handoff (then it is started), its
    events relayed until it ends or its ``scope`` is cancelled, then closed."""
    import orjson
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    provider: _Provider | None = None
    try:
        async with connect(url, additional_headers=dict(headers)) as ws:

            async def send(event: dict[str, Any]) -> None:
                try:
                    await ws.send(orjson.dumps(event).decode())
                except ConnectionClosed:
                    log.info("realtime_event_not_sent", provider_session=number, event=event["type"])

            memory = memory_for(send)
            async with memory:
                provider = _Provider(number, clock.now(), memory)
                await memory.handoff()
                task_status.started(provider)
                with provider.scope:
                    await _relay(ws, memory, number)
    finally:
        if provider is not None:
            provider.ended.set()


async def _first(clock: Clock, deadline: float, *waits: Callable[[], Awaitable[None]]) -> None:
    """Return when the first of ``waits`` returns, or when ``clock`` reaches ``deadline``."""
    async with anyio.create_task_group() as tg:

        async def then_stop(wait: Callable[[], Awaitable[None]]) -> None:
            await wait()
            tg.cancel_scope.cancel()

        for wait in (lambda: clock.sleep_until(deadline), *waits):
            tg.start_soon(then_stop, wait)


async def _retire(old: _Provider, clock: Clock, session_limit: float) -> None:
    """Close a provider session that a fresh one took over, once it has finished the exchange
    it was in (at the latest when its time is up)."""
    await _first(clock, old.began + session_limit, old.memory.until_idle, old.ended.wait)
    old.scope.cancel()
    await old.ended.wait()
    log.info("realtime_session_retired", session=old.memory.room.name, provider_session=old.number)


async def run(
    realtime_url: str,
    voice_context_url: str,
    session: str,
    *,
    headers: Mapping[str, str] | None = None,
    token: str | None = None,
    base_instructions: str = "",
    limit_chars: int | None = None,
    provider_sessions: int | None = None,
    call_id: str | None = None,
    respond: bool = True,
    turn_detection: Mapping[str, Any] | None = SERVER_VAD,
    reply_within: float = 1.0,
    session_limit: float = SESSION_LIMIT,
    rollover_before: float = ROLLOVER_BEFORE,
    clock: Clock | None = None,
) -> RealtimeMemory | None:
    """Keep realtime sessions at ``realtime_url`` briefed from the voice-context ``session``, one
    provider session after another: each starts with the handoff, every user turn is answered with
    its memory (see :class:`RealtimeMemory` for ``respond``, ``turn_detection`` and
    ``reply_within``). ``rollover_before`` seconds before a session's ``session_limit`` (on
    ``clock``), once it is between exchanges, a fresh one is opened and briefed, and the old one
    closed once it has finished the exchange it may be in; a session the provider expires
    (``session_expired``) or closes sooner is followed by a fresh one at once. Stops after
    ``provider_sessions`` sessions (never, by default): the last one is kept until it ends.

    With ``call_id`` it serves that one WebRTC or SIP call instead, over the call's sideband
    connection (``realtime_url`` addressed by ``?call_id=``, see :func:`sideband_url`), and returns
    when the call ends: a call's session cannot be handed to another. Returns the last session's
    :class:`RealtimeMemory`."""
    from voice_context.client import Client

    clock = clock if clock is not None else WallClock()
    url = realtime_url if call_id is None else sideband_url(realtime_url, call_id)
    memory: RealtimeMemory | None = None
    async with Client(voice_context_url, token=token) as client, anyio.create_task_group() as tg:
        room = await client.open(session)

        def memory_for(send: Callable[[dict[str, Any]], Awaitable[None]]) -> RealtimeMemory:
            return RealtimeMemory(
                room,
                send,
                base_instructions=base_instructions,
                limit_chars=limit_chars,
                respond=respond,
                turn_detection=turn_detection,
                reply_within=reply_within,
            )

        old: _Provider | None = None
        started = 0
        while provider_sessions is None or started < provider_sessions:
            started += 1
            current: _Provider = await tg.start(_provide, url, headers or {}, memory_for, started, clock)
            memory = current.memory
            if old is not None:
                tg.start_soon(_retire, old, clock, session_limit)
            old = None
            if call_id is not None or started == provider_sessions:
                await current.ended.wait()
                break
            due = current.began + session_limit - rollover_before
            await _first(clock, due, current.ended.wait)
            if current.ended.is_set():
                continue
            # due: roll over at the next turn boundary, or when the session's time is up
            await _first(clock, current.began + session_limit, current.memory.until_idle, current.ended.wait)
            if current.ended.is_set():
                continue
            log.info("realtime_session_rollover", session=session, provider_session=started)
            old = current
        if call_id is not None:
            log.info("realtime_call_ended", session=session, call_id=call_id)
    return memory


def main(argv: list[str] | None = None) -> int:
    """``python -m voice_context.integrations.openai_realtime``: see :func:`run`."""
    import argparse
    import json
    import os

    parser = argparse.ArgumentParser(
        prog="python -m voice_context.integrations.openai_realtime",
        description="Keep OpenAI Realtime sessions briefed from a voice-context session.",
    )
    parser.add_argument("--realtime-url", default="wss://api.openai.com/v1/realtime?model=gpt-realtime")
    parser.add_argument("--voice-context", default="ws://127.0.0.1:8765/v1", help="the voice-context server")
    parser.add_argument("--session", required=True, help="the voice-context session of this conversation")
    parser.add_argument(
        "--call-id", default=None, help="serve this WebRTC or SIP call over its sideband connection"
    )
    parser.add_argument("--instructions", default="", help="the bot's own base instructions")
    parser.add_argument("--limit-chars", type=int, default=None, help="the instructions' size limit")
    parser.add_argument("--provider-sessions", type=int, default=None, help="stop after this many")
    parser.add_argument(
        "--respond",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="create each reply once its memory is in (default); --no-respond leaves replies to the "
        "session's turn detection and its memory arrives a turn late",
    )
    parser.add_argument(
        "--turn-detection",
        default=json.dumps(SERVER_VAD),
        help="the session's turn detection as JSON, set with create_response false; "
        "'none' leaves the session's own",
    )
    parser.add_argument(
        "--reply-within", type=float, default=1.0, help="seconds a reply waits for its memory"
    )
    parser.add_argument(
        "--session-limit", type=float, default=SESSION_LIMIT, help="seconds a provider session lasts"
    )
    parser.add_argument(
        "--rollover-before",
        type=float,
        default=ROLLOVER_BEFORE,
        help="seconds before the session limit that a fresh provider session takes over",
    )
    args = parser.parse_args(argv)
    detection = None if args.turn_detection == "none" else json.loads(args.turn_detection)
    if detection is not None and not isinstance(detection, dict):
        parser.error("--turn-detection: a JSON object or 'none'")
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    anyio.run(
        lambda: run(
            args.realtime_url,
            args.voice_context,
            args.session,
            headers=headers,
            token=os.environ.get("VOICE_CONTEXT_TOKEN"),
            base_instructions=args.instructions,
            limit_chars=args.limit_chars,
            provider_sessions=args.provider_sessions,
            call_id=args.call_id,
            respond=args.respond,
            turn_detection=detection,
            reply_within=args.reply_within,
            session_limit=args.session_limit,
            rollover_before=args.rollover_before,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
