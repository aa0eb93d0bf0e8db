"""Hooks for LiveKit Agents: the session's words go to voice-context, its memory comes back.

Two documented extension points of an ``AgentSession`` carry it:

- the session's events: every user and assistant message it commits
  (``conversation_item_added``) becomes a turn, every tool call and its output
  (``function_tools_executed``) a tool turn, each once, by the item's id
  (:meth:`VoiceContextMemory.attach`);
- the agent's ``llm_node``: before each LLM run, :meth:`VoiceContextMemory.update`
  builds the context the LLM gets, in three parts: the agent's instructions (the chat
  context's leading system messages); voice-context's context (the summary, recalled
  passages, screen notes, landmarks and the recent turns verbatim, tool calls in the
  OpenAI shape); then, as they are, the chat context's items voice-context does not hold
  yet: the user's newest words before the session commits them, what
  ``on_user_turn_completed`` added for this turn, and the tool calls and outputs of the
  run in progress (stored once the user speaks again, so that the run after a tool gets
  its output whole). The last two parts together stay within ``budget_chars``:
  voice-context is asked for what the third leaves (the third is never cut).

The chat context's own history is not sent: voice-context holds every turn the session
committed, so whatever the agent drops from its chat context (``truncate``,
``update_chat_ctx``) is still in the summary or the recent turns, never in neither, and
nothing is sent twice. Truncating the chat context before ``update`` only drops items of
the third part; do not truncate what ``update`` returns (it is bounded already, and
cutting it would cut the summary off). History loaded into the agent's chat context by
hand was never committed by the session, so it would be sent every run: give it to
voice-context instead (``SessionHandle.append_turn``).

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
turns it could not store then are stored before the next reply. A refused connection
and a call that timed out alike open a circuit breaker: until a try in the background
reaches voice-context again, every reply goes on at once, so a sidecar that is down or
hung costs one ``timeout``, not one a reply.

Needs the ``livekit`` extra (``pip install 'voice-context[livekit]'``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import anyio
from livekit.agents import AgentSession, llm

from voice_context.client import SessionHandle
from voice_context.codec import TurnAppend
from voice_context.core.breaker import CircuitBreaker
from voice_context.core.turns import Turn
from voice_context.errors import ClientError, VoiceContextError
from voice_context.integrations._held import HeldSession
from voice_context.logs import get_logger

__all__ = ["VoiceContextMemory"]

log = get_logger("voice_context.integrations.livekit")

#: How much of a turn longer than the server takes is stored (its head, and how long it was).
CUT_CHARS = 2000

#: The chat items that are conversation (the others, handoffs and config updates, are not sent).
CONVERSATION = ("message", "function_call", "function_call_output")


class VoiceContextMemory:
    """A LiveKit agent session's long memory in a voice-context session.

    ``user`` and ``bot`` are the speakers the turns are stored under (voice-context shows a
    user turn as ``user: words``: give the caller's name). ``last_context`` is voice-context's
    reply to the last context request (its ``cursor``, ``first_turn``, ``chars``, ``dropped``,
    ``recalled``): why the LLM got what it got. ``breaker`` decides when a voice-context that
    did not answer is tried again (one may serve the memories of every call to one server),
    on ``clock``'s time.
    """

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
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.monotonic,
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
        self.last_context: Mapping[str, Any] | None = None
        # committed by the session, not stored yet, oldest first: (item id, turn or None when
        # the item has nothing to store, such as a message without text)
        self._waiting: list[tuple[str, Turn | None]] = []
        self._stored: set[str] = set()  # ids of the chat items voice-context holds
        self._lock = anyio.Lock()  # one store-and-ask at a time (a preemptive run may overlap)
        self._held = HeldSession(
            url, session, token=token, close_timeout=timeout + 1, breaker=breaker, clock=clock
        )

    def __repr__(self) -> str:
        return (
            f"<VoiceContextMemory {self.session!r} updates={self.updates} fallbacks={self.fallbacks}"
            f" stored={len(self._stored)} waiting={len(self._waiting)}>"
        )

    def attach(self, session: AgentSession[Any]) -> None:
        """Store every message, tool call and tool output the agent session commits."""
        session.on("conversation_item_added", self._added)
        session.on("function_tools_executed", self._tools_executed)

    def _added(self, event: Any) -> None:
        item = event.item
        if not isinstance(item, llm.ChatMessage):
            return  # an agent handoff: nothing was said
        text = (item.text_content or "").strip()
        turn = None
        if item.role in ("user", "assistant") and text:
            speaker = self.user if item.role == "user" else self.bot
            turn = Turn(speaker, item.role, text, item.created_at, self._turn_id(item.id))
        self._waiting.append((item.id, turn))

    def _tools_executed(self, event: Any) -> None:
        for call in event.function_calls:
            turn = Turn(
                self.bot,
                "assistant",
                "",
                call.created_at,
                self._turn_id(call.id),
                tool_call_id=call.call_id,
                tool_name=call.name,
                tool_arguments=call.arguments,
            )
            self._waiting.append((call.id, turn))
        for output in event.function_call_outputs:
            turn = Turn(
                output.name or "tool",
                "tool",
                output.output or "(no output)",
                output.created_at,
                self._turn_id(output.id),
                tool_call_id=output.call_id,
                tool_name=output.name or None,
            )
            self._waiting.append((output.id, turn))

    def _turn_id(self, item_id: str) -> str:
        return f"livekit-{self.session}-{item_id}"

    async def update(self, chat_ctx: llm.ChatContext) -> llm.ChatContext:
        """The context for this LLM run: the instructions, voice-context's context, then what
        the session has not committed yet (``chat_ctx`` itself when voice-context does not
        answer within ``timeout``)."""
        try:
            async with self._held.within(self.timeout) as room, self._lock:
                await self._flush(room)
                instructions, pending = _split(chat_ctx, self._stored)
                budget = self.budget_chars
                if budget is not None:
                    budget = max(0, budget - sum(map(_item_chars, pending)))
                reply = await room.context("messages", budget, query=_last_user_text(chat_ctx))
        except (TimeoutError, OSError, VoiceContextError) as exc:
            self.fallbacks += 1
            log.warning("voice_context_livekit_fallback", session=self.session, error=repr(exc))
            return chat_ctx
        self.last_context = reply
        self.updates += 1
        return llm.ChatContext([*instructions, *_chat_items(reply["messages"]), *pending])

    async def _flush(self, room: SessionHandle, *, run_in_progress: bool = False) -> None:
        """Store what is waiting, oldest first, up to the run in progress (or all of it)."""
        for _ in range(len(self._waiting) if run_in_progress else _storable(self._waiting)):
            item_id, turn = self._waiting[0]
            if turn is not None:
                await self._append(room, turn)
            self._stored.add(item_id)
            self._waiting.pop(0)

    async def _append(self, room: SessionHandle, turn: Turn) -> None:
        try:
            await room.client.request(TurnAppend(room.name, turn))
        except ClientError as exc:
            if exc.code != "too_large":
                raise
            # a tool's output can be longer than the server takes (max_text_chars): its head is
            # stored, so that the call keeps its result and the turns after it are stored
            log.warning(
                "voice_context_livekit_turn_cut", session=self.session, id=turn.id, chars=len(turn.text)
            )
            head = f"{turn.text[:CUT_CHARS]}… [cut: {len(turn.text)} chars in all]"
            await room.client.request(TurnAppend(room.name, replace(turn, text=head)))

    async def aclose(self) -> None:
        """Store the turns still waiting (within ``timeout``), then close the connection."""
        if self._waiting:
            lost = (TimeoutError, OSError, VoiceContextError)
            with contextlib.suppress(*lost):
                async with self._held.within(self.timeout) as room:
                    await self._flush(room, run_in_progress=True)
        await self._held.close()


def _storable(waiting: Sequence[tuple[str, Turn | None]]) -> int:
    """How many of the waiting items may be stored now: those before the run in progress, which
    starts at the first tool call after the newest user turn waiting. Until the session commits
    the user's next words the LLM gets that run's tool calls and outputs whole from the session's own context
    (voice-context would show a long output clipped to ``max_turn_chars``), not twice."""
    last_user = max((k for k, (_, turn) in enumerate(waiting) if turn and turn.role == "user"), default=-1)
    for k in range(last_user + 1, len(waiting)):
        turn = waiting[k][1]
        if turn is not None and turn.tool_call_id is not None:
            return k
    return len(waiting)


def _split(chat_ctx: llm.ChatContext, stored: set[str]) -> tuple[list[llm.ChatItem], list[llm.ChatItem]]:
    """The agent's instructions (the system messages before the conversation) and the
    conversation items voice-context does not hold, in their order."""
    instructions: list[llm.ChatItem] = []
    pending: list[llm.ChatItem] = []
    began = False
    for item in chat_ctx.items:
        if item.type not in CONVERSATION:
            continue
        if not began and isinstance(item, llm.ChatMessage) and item.role in ("system", "developer"):
            instructions.append(item)
            continue
        began = True
        if item.id not in stored:
            pending.append(item)
    return instructions, pending


def _item_chars(item: llm.ChatItem) -> int:
    """What an item adds to the LLM's context, counted as voice-context counts a message."""
    if isinstance(item, llm.ChatMessage):
        return len(item.raw_text_content or "")
    if isinstance(item, llm.FunctionCall):
        return len(item.name) + len(item.arguments)
    if isinstance(item, llm.FunctionCallOutput):
        return len(item.output)
    return 0


def _chat_items(messages: Sequence[Mapping[str, Any]]) -> Iterable[llm.ChatItem]:
    """voice-context's ``messages`` as chat items: a message with ``tool_calls`` becomes its
    words and a function call for each (one group), a ``tool`` message a call's output."""
    names: dict[str, str] = {}
    for k, message in enumerate(messages):
        key = f"voice-context-{k}"
        role, content = message.get("role"), message.get("content") or ""
        calls = message.get("tool_calls") or ()
        if role == "tool":
            call_id = message["tool_call_id"]
            yield llm.FunctionCallOutput(
                id=key, call_id=call_id, name=names.get(call_id, ""), output=content, is_error=False
            )
            continue
        if role in ("system", "user", "assistant") and content:
            yield llm.ChatMessage(id=key, role=role, content=[content])
        for call in calls:
            names[call["id"]] = call["function"]["name"]
            yield llm.FunctionCall(
                id=f"{key}/{call['id']}",
                group_id=key,
                call_id=call["id"],
                name=call["function"]["name"],
                arguments=call["function"]["arguments"],
            )


def _last_user_text(chat_ctx: llm.ChatContext) -> str | None:
    for item in reversed(chat_ctx.items):
        if isinstance(item, llm.ChatMessage) and item.role == "user":
            return item.text_content or None
    return None
