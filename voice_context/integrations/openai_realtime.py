"""Keep an OpenAI Realtime session's ``instructions`` current from voice-context.

A realtime model hears the conversation itself, but forgets what falls out of
its window, and a provider session ends after a while (a ``session_expired``
error): the next one starts empty. :class:`RealtimeMemory` sits beside the
realtime websocket:

- every finalized transcript the realtime session reports becomes a turn in
  voice-context: the user's (``conversation.item.input_audio_transcription.completed``)
  and the model's (``response.output_audio_transcript.done``, or the text and
  beta names of the same events);
- after each user turn it asks voice-context for the context in the realtime
  ``instructions`` format, within ``limit_chars``, and sends it as one
  ``session.update``: ``{"type": "session.update", "session": {"type":
  "realtime", "instructions": ...}}``;
- when a fresh provider session takes over, :meth:`RealtimeMemory.handoff`
  sends it the ``session.handoff`` instructions: the same context ending with
  the questions still open.

Nothing here waits on the realtime model: when voice-context is slow or down,
the update is skipped after ``timeout`` seconds and logged (the realtime
session keeps the instructions it had), and a turn that could not be stored is
logged and dropped from memory, never retried in the audio path.

The realtime websocket itself is the caller's (``send`` is its send of one
JSON event); :func:`run` is the whole loop against a realtime URL (``python -m
voice_context.integrations.openai_realtime --session ID``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import structlog

from voice_context.client import SessionHandle
from voice_context.errors import VoiceContextError

__all__ = ["BOT_EVENTS", "USER_EVENTS", "RealtimeMemory", "session_update"]

log = structlog.get_logger("voice_context.integrations.openai_realtime")

USER_EVENTS = frozenset({"conversation.item.input_audio_transcription.completed"})
"""Server events carrying a finalized transcript of what the user said (``transcript``)."""
BOT_EVENTS: Mapping[str, str] = {
    "response.output_audio_transcript.done": "transcript",
    "response.audio_transcript.done": "transcript",  # the beta interface's name
    "response.output_text.done": "text",
    "response.text.done": "text",
}
"""Server events carrying what the model said, and the field that holds it."""


def session_update(instructions: str) -> dict[str, Any]:
    """The client event that replaces a realtime session's instructions."""
    return {"type": "session.update", "session": {"type": "realtime", "instructions": instructions}}


class RealtimeMemory:
    """Feeds a realtime session's transcripts to voice-context and its context back as instructions."""

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
    ) -> None:
        self.room = room
        self.send = send
        self.base_instructions = base_instructions
        self.limit_chars = limit_chars
        self.user = user
        self.bot = bot
        self.timeout = timeout
        self.updates = 0
        self.skipped = 0

    def __repr__(self) -> str:
        return f"<RealtimeMemory {self.room.name!r} updates={self.updates} skipped={self.skipped}>"

    async def on_event(self, event: Mapping[str, Any]) -> None:
        """Take one server event of the realtime session (the others are ignored)."""
        kind = event.get("type")
        if kind in USER_EVENTS:
            said = event.get("transcript")
            if isinstance(said, str) and said.strip() and await self._append(self.user, "user", said):
                await self.refresh()
        elif isinstance(kind, str) and kind in BOT_EVENTS:
            said = event.get(BOT_EVENTS[kind])
            if isinstance(said, str) and said.strip():
                await self._append(self.bot, "assistant", said)

    async def refresh(self) -> bool:
        """Send the session the current context as its instructions; ``False`` when voice-context
        did not answer within ``timeout`` (the session keeps the instructions it had)."""
        reply = await self._ask(
            lambda: self.room.context("instructions", self.limit_chars, self.base_instructions)
        )
        if reply is None:
            return False
        await self.send(session_update(str(reply["instructions"])))
        self.updates += 1
        return True

    async def handoff(self) -> dict[str, Any] | None:
        """Brief a fresh provider session: one ``session.update`` with the handoff instructions
        (the context, then the questions still open). Returns the ``handoff`` reply, or ``None``
        when voice-context did not answer in time."""
        reply = await self._ask(lambda: self.room.handoff(self.limit_chars, self.base_instructions))
        if reply is None:
            return None
        await self.send(session_update(str(reply["instructions"])))
        self.updates += 1
        return reply

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
) -> RealtimeMemory | None:
    """Keep realtime sessions at ``realtime_url`` briefed from the voice-context ``session``, one
    provider session after another: each starts with the handoff instructions, every user turn
    refreshes them, and when the provider expires a session (an ``error`` with the code
    ``session_expired``) or closes it, a fresh one takes over. Stops after ``provider_sessions``
    sessions (never, by default). Returns the last session's :class:`RealtimeMemory`."""
    import orjson
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    from voice_context.client import Client

    memory: RealtimeMemory | None = None
    async with Client(voice_context_url, token=token) as client:
        room = await client.open(session)
        started = 0
        while provider_sessions is None or started < provider_sessions:
            started += 1
            async with connect(realtime_url, additional_headers=dict(headers or {})) as ws:

                async def send(event: dict[str, Any], ws: Any = ws) -> None:
                    await ws.send(orjson.dumps(event).decode())

                memory = RealtimeMemory(
                    room, send, base_instructions=base_instructions, limit_chars=limit_chars
                )
                await memory.handoff()
                try:
                    async for raw in ws:
                        event = orjson.loads(raw)
                        if not isinstance(event, dict):
                            continue
                        if _expired(event):
                            log.info("realtime_session_expired", session=session, provider_session=started)
                            break
                        await memory.on_event(event)
                except ConnectionClosed:
                    log.info("realtime_session_closed", session=session, provider_session=started)
    return memory


def main(argv: list[str] | None = None) -> int:
    """``python -m voice_context.integrations.openai_realtime``: see :func:`run`."""
    import argparse
    import os

    parser = argparse.ArgumentParser(
        prog="python -m voice_context.integrations.openai_realtime",
        description="Keep OpenAI Realtime sessions briefed from a voice-context session.",
    )
    parser.add_argument("--realtime-url", default="wss://api.openai.com/v1/realtime?model=gpt-realtime")
    parser.add_argument("--voice-context", default="ws://127.0.0.1:8765/v1", help="the voice-context server")
    parser.add_argument("--session", required=True, help="the voice-context session of this conversation")
    parser.add_argument("--instructions", default="", help="the bot's own base instructions")
    parser.add_argument("--limit-chars", type=int, default=None, help="the instructions' size limit")
    parser.add_argument("--provider-sessions", type=int, default=None, help="stop after this many")
    args = parser.parse_args(argv)
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
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
