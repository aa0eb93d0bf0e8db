"""A pipecat frame processor: the conversation goes to voice-context, its context comes back.

Put :class:`VoiceContextProcessor` between the user context aggregator and the
LLM service of a pipecat pipeline::

    pipeline = Pipeline([
        transport.input(), stt, context_aggregator.user(),
        VoiceContextProcessor("ws://127.0.0.1:8765/v1", session="call-7", budget_chars=8000),
        llm, tts, transport.output(), context_aggregator.assistant(),
    ])

Every :class:`~pipecat.frames.frames.LLMContextFrame` on its way to the LLM is one
LLM run. The processor reads the pipeline's context for the messages it has not
seen yet: the user's finalized transcriptions and the bot's spoken replies. It
appends them to the voice-context session as turns, with ids, so a retry never
stores one twice. It then asks for the context (``messages``, within
``budget_chars``) and sends the LLM a copy of the pipeline's context: the
pipeline's own system messages first, then voice-context's messages (the
summary, recalled passages, screen notes, the recent turns). The pipeline's own
context object is never changed, so the rest of the pipeline keeps its history
as it was.

Screen or vision descriptions reach voice-context as notes: a
:class:`~pipecat.frames.frames.VisionTextFrame` passing downstream, or
:meth:`VoiceContextProcessor.note` from the bot's code.

Nothing waits long on voice-context. When it is slow or down, the run goes on
after ``timeout`` seconds with the pipeline's own context, unchanged, and a log
line says so (``voice_context_pipecat_fallback``). The messages not stored
then are stored with the next run.

Needs the ``pipecat`` extra (``pip install 'voice-context[pipecat]'``).
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import structlog
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    LLMContextFrame,
    StartFrame,
    VisionTextFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from voice_context.client import SessionHandle
from voice_context.errors import VoiceContextError
from voice_context.integrations._held import HeldSession

__all__ = ["VoiceContextProcessor"]

log = structlog.get_logger("voice_context.integrations.pipecat")

SYSTEM_ROLES = frozenset({"system", "developer"})


def _text(message: Any) -> str:
    """The words of a context message: its content, or the text parts of it."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return " ".join(str(p.get("text", "")) for p in parts)
    return ""


class VoiceContextProcessor(FrameProcessor):
    """Feeds a pipecat conversation to a voice-context session and its context to the LLM."""

    def __init__(
        self,
        url: str,
        *,
        session: str,
        budget_chars: int | None = 8000,
        token: str | None = None,
        timeout: float = 0.3,
        user: str = "user",
        bot: str = "assistant",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.url = url
        self.session = session
        self.budget_chars = budget_chars
        self.token = token
        self.timeout = timeout
        self.user = user
        self.bot = bot
        self.seen = 0
        """How many of the pipeline context's messages are stored as turns."""
        self.replaced = 0
        self.fallbacks = 0
        self._held = HeldSession(url, session, token=token, close_timeout=timeout + 1)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame) and direction == FrameDirection.DOWNSTREAM:
            frame = await self._with_memory(frame)
        elif isinstance(frame, VisionTextFrame) and direction == FrameDirection.DOWNSTREAM:
            await self.note(frame.text, source="vision")
        elif isinstance(frame, EndFrame | CancelFrame):
            await self.aclose()
        elif isinstance(frame, StartFrame):
            pass
        await self.push_frame(frame, direction)

    async def note(self, text: str, *, source: str = "screen", speaker: str | None = None) -> bool:
        """Tell voice-context what is on a screen (or in a camera's view); ``False`` when it
        did not take it within ``timeout``."""
        try:
            with anyio.fail_after(self.timeout):
                room = await self._held.open()
                await room.append_note(text, speaker=speaker, source=source)
        except (TimeoutError, OSError, VoiceContextError) as exc:
            log.warning("voice_context_pipecat_note_lost", session=self.session, error=repr(exc))
            return False
        return True

    async def cleanup(self) -> None:
        await super().cleanup()  # type: ignore[no-untyped-call]
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection to voice-context (pipecat's ``cleanup`` and an ``EndFrame`` do)."""
        await self._held.close()

    async def _with_memory(self, frame: LLMContextFrame) -> LLMContextFrame:
        messages = list(frame.context.get_messages())
        try:
            with anyio.fail_after(self.timeout):
                room = await self._held.open()
                await self._store(room, messages)
                reply = await room.context("messages", self.budget_chars)
        except (TimeoutError, OSError, VoiceContextError) as exc:
            self.fallbacks += 1
            log.warning(
                "voice_context_pipecat_fallback",
                session=self.session,
                error=repr(exc),
                note="the LLM gets the pipeline's own context this time",
            )
            return frame
        system = [m for m in messages if isinstance(m, dict) and m.get("role") in SYSTEM_ROLES]
        remembered: list[Any] = [dict(m) for m in reply["messages"]]
        context = LLMContext(
            messages=[*system, *remembered], tools=frame.context.tools, tool_choice=frame.context.tool_choice
        )
        self.replaced += 1
        return LLMContextFrame(context=context)

    async def _store(self, room: SessionHandle, messages: list[Any]) -> None:
        """Append the messages not stored yet (user and assistant words only), with ids."""
        for index in range(self.seen, len(messages)):
            message = messages[index]
            role = message.get("role") if isinstance(message, dict) else None
            text = _text(message).strip()
            if role in ("user", "assistant") and text:
                speaker = self.user if role == "user" else self.bot
                turn_id = f"pipecat-{self.session}-{index}"  # a retry of a stored message is a no-op
                await room.append_turn(speaker, role, text, at=time.time(), id=turn_id)
            self.seen = index + 1
