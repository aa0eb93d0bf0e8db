"""Hooks for LiveKit Agents: the session's words go to voice-context, its memory comes back.

Two documented extension points of an ``AgentSession`` carry it:

- the session's ``conversation_item_added`` event: every user and assistant message
  becomes a turn (:meth:`VoiceContextMemory.attach`);
- the agent's ``llm_node``: before each reply, :meth:`VoiceContextMemory.update`
  returns a copy of the chat context with what voice-context remembers (the summary,
  recalled passages, screen notes, landmarks: its system messages, within
  ``budget_chars``) placed after the agent's instructions. The recent turns are the
  session's own, so they are not added twice.

::

    memory = VoiceContextMemory("ws://127.0.0.1:8765/v1", session="call-7")

    class Assistant(Agent):
        async def llm_node(self, chat_ctx, tools, model_settings):
            chat_ctx = await memory.update(chat_ctx)
            return Agent.default.llm_node(self, chat_ctx, tools, model_settings)

    session = AgentSession(llm=...)
    memory.attach(session)
    await session.start(Assistant(instructions="You are Nova."))

When voice-context is slow or down the reply goes on after ``timeout`` seconds with
the session's own context and a log line says so (``voice_context_livekit_fallback``);
turns it could not store then are stored before the next reply.

Needs the ``livekit`` extra (``pip install 'voice-context[livekit]'``).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import anyio
import structlog
from livekit.agents import AgentSession, llm

from voice_context.client import SessionHandle
from voice_context.errors import VoiceContextError
from voice_context.integrations._held import HeldSession

__all__ = ["VoiceContextMemory"]

log = structlog.get_logger("voice_context.integrations.livekit")


class VoiceContextMemory:
    """A LiveKit agent session's long memory in a voice-context session."""

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
    ) -> None:
        self.url = url
        self.session = session
        self.budget_chars = budget_chars
        self.token = token
        self.timeout = timeout
        self.user = user
        self.bot = bot
        self.updates = 0
        self.fallbacks = 0
        self._waiting: list[tuple[str, str, str, str]] = []  # (speaker, role, text, id), oldest first
        self._held = HeldSession(url, session, token=token, close_timeout=timeout + 1)

    def __repr__(self) -> str:
        return f"<VoiceContextMemory {self.session!r} updates={self.updates} fallbacks={self.fallbacks}>"

    def attach(self, session: AgentSession[Any]) -> None:
        """Store every user and assistant message the agent session adds to its conversation."""
        session.on("conversation_item_added", self._added)

    def _added(self, event: Any) -> None:
        item = event.item
        role = getattr(item, "role", None)
        text = (getattr(item, "text_content", None) or "").strip()
        if role in ("user", "assistant") and text:
            speaker = self.user if role == "user" else self.bot
            self._waiting.append((speaker, role, text, f"livekit-{self.session}-{item.id}"))

    async def update(self, chat_ctx: llm.ChatContext) -> llm.ChatContext:
        """A copy of ``chat_ctx`` with voice-context's memory after the instructions (``chat_ctx``
        itself when voice-context does not answer within ``timeout``)."""
        try:
            with anyio.fail_after(self.timeout):
                room = await self._held.open()
                await self._flush(room)
                reply = await room.context("messages", self.budget_chars, query=_last_user_text(chat_ctx))
        except (TimeoutError, OSError, VoiceContextError) as exc:
            self.fallbacks += 1
            log.warning("voice_context_livekit_fallback", session=self.session, error=repr(exc))
            return chat_ctx
        remembered = [
            m["content"] for m in reply["messages"] if m.get("role") == "system" and m.get("content")
        ]
        updated = chat_ctx.copy()
        first = 0
        while first < len(updated.items) and getattr(updated.items[first], "role", None) in (
            "system",
            "developer",
        ):
            first += 1
        memory = [llm.ChatMessage(role="system", content=[text]) for text in remembered]
        updated.items[first:first] = memory
        self.updates += 1
        return updated

    async def _flush(self, room: SessionHandle) -> None:
        while self._waiting:
            speaker, role, text, turn_id = self._waiting[0]
            await room.append_turn(
                speaker, "user" if role == "user" else "assistant", text, at=time.time(), id=turn_id
            )
            self._waiting.pop(0)

    async def aclose(self) -> None:
        """Store the turns still waiting (within ``timeout``), then close the connection."""
        if self._waiting:
            lost = (TimeoutError, OSError, VoiceContextError)
            with contextlib.suppress(*lost), anyio.fail_after(self.timeout):
                await self._flush(await self._held.open())
        await self._held.close()


def _last_user_text(chat_ctx: llm.ChatContext) -> str | None:
    for item in reversed(chat_ctx.items):
        if getattr(item, "role", None) == "user":
            text = getattr(item, "text_content", None)
            return text or None
    return None
