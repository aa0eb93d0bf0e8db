"""A pipecat frame processor: the conversation goes to voice-context, its context comes back.

Put the LLM service inside :meth:`VoiceContextProcessor.around`, after the user
context aggregator::

    llm = OpenAILLMService(settings=OpenAILLMService.Settings(system_instruction="You are Nova."))
    memory = VoiceContextProcessor("ws://127.0.0.1:8765/v1", session="call-7", budget_chars=8000)
    pipeline = Pipeline([
        transport.input(), stt, context_aggregator.user(),
        memory.around(llm),
        tts, transport.output(), context_aggregator.assistant(),
    ])

Every :class:`~pipecat.frames.frames.LLMContextFrame` on its way to the LLM is one
LLM run, and ``around`` puts the memory on both ways in: the user's turns come
down from the user aggregator, while the run after a tool result (and an
``LLMRunFrame`` or ``LLMMessagesUpdateFrame`` with ``run_llm``) comes up from the
assistant aggregator. At each run the processor stores the words the pipeline's
context gained (the user's finalized transcriptions and the bot's replies),
asks for the context (``messages``, within ``budget_chars``) and sends the LLM a
copy of the pipeline's context: the pipeline's own instructions first, then
voice-context's messages (the summary, recalled passages, screen notes, the
recent turns). The pipeline's own context object is never changed, so the rest
of the pipeline keeps its history as it was.

The bot's prompt belongs on the LLM service (``system_instruction`` in its
settings: pipecat deprecates a context that starts with a system message since
1.9), which puts it before the context. The copy makes no system message of its
own: voice-context's system messages (summary, recall, notes) go as developer
messages, pipecat's role for guidance that changes with each turn (its adapters
give them to an LLM without that role as user messages), and so do the system
and developer messages of the pipeline's context, in their order, before them.
Only a system message the pipeline's context starts with (a prompt kept in the
context, as before pipecat 1.9) stays first and a system message: the LLM gets it
once, before the memory, and pipecat warns about it as it would without the
memory.

What is stored is known by the messages themselves, not by where they sit: a
context that pipecat resets (``LLMMessagesUpdateFrame``, as pipecat-flows does)
or summarizes still has its new words stored. The messages the context held at
the last run are known; at the next run the messages after the newest known one
are new words, and a message put before known ones (pipecat's own summary) is
not. pipecat keeps a message's object when it summarizes or appends; a context
rebuilt from copies of its old messages is taken as new words.

Tool calls and their results are stored as tool turns when their frames pass
(``FunctionCallInProgressFrame``, then ``FunctionCallResultFrame`` or
``FunctionCallCancelFrame``), so later contexts show what a tool found; a
result is cut to :data:`RESULT_CHARS`. A speculative run (``speculation=True``,
a user turn not yet confirmed) gets the context with the words it guesses at
the end and stores nothing; the turn is stored once the pipeline's context has
it. The bot's last reply is stored when the pipeline ends (``cleanup``, after
the ``EndFrame`` or ``CancelFrame`` went through).

Screen or vision descriptions reach voice-context as notes: a
:class:`~pipecat.frames.frames.VisionTextFrame` passing downstream, or
:meth:`VoiceContextProcessor.note` from the bot's code.

Nothing waits long on voice-context. When it is slow or down, the run goes on
after ``timeout`` seconds with the pipeline's own context, unchanged, and a log
line says so (``voice_context_pipecat_fallback``). The turns not stored then
are stored, in order and exactly once (each carries an id), with the next run.
A refused connection and a call that timed out alike open a circuit breaker:
until a try in the background reaches voice-context again, every run goes on
at once, so a sidecar that is down or hung costs one ``timeout``, not one a run.

Needs the ``pipecat`` extra (``pip install 'voice-context[pipecat]'``).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import anyio
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    LLMContextAssistantTurnFrame,
    LLMContextFrame,
    LLMContextUserTurnFrame,
    VisionTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from voice_context.client import SessionHandle
from voice_context.codec import TurnAppend
from voice_context.core.breaker import CircuitBreaker
from voice_context.core.turns import Role, Turn
from voice_context.errors import ClientError, VoiceContextError
from voice_context.integrations._held import HeldSession
from voice_context.logs import get_logger

__all__ = ["RESULT_CHARS", "ContextLedger", "VoiceContextProcessor"]

log = get_logger("voice_context.integrations.pipecat")

INSTRUCTION_ROLES = frozenset({"system", "developer"})
WORD_ROLES = frozenset({"user", "assistant"})

RESULT_CHARS = 4000
"""A tool result longer than this is stored cut, with its size: a voice bot needs what a
tool found, not pages of it, and the server refuses a turn over its ``max_text_chars``."""

RECENT = 32
"""How many recent announcements and looked-at words the ledger keeps to match them up."""

REFUSED = frozenset({"bad_request", "too_large"})
"""Error codes that mean the server will never take this turn: it is dropped, not retried."""


def _text(message: Any) -> str:
    """The words of a context message: its content, or the text parts of it."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return " ".join(str(p.get("text", "")) for p in parts)
    return ""


def _role(message: Any) -> str | None:
    role = message.get("role") if isinstance(message, dict) else None
    return role if isinstance(role, str) else None


def as_developer(message: Any) -> Any:
    """A system message as a developer message (a copy); any other message as it is.

    pipecat deprecates a context that starts with a system message (the prompt is the LLM
    service's ``system_instruction``), and guidance that changes with each turn is a developer
    message to it."""
    return {**message, "role": "developer"} if _role(message) == "system" else message


def own_instructions(messages: Sequence[Any]) -> list[Any]:
    """The pipeline's own instructions, in their order: a system message the context starts
    with as it is, every other system or developer message as a developer message."""
    own = [m for m in messages if _role(m) in INSTRUCTION_ROLES]
    kept = 1 if own and own[0] is messages[0] and _role(own[0]) == "system" else 0
    return [*own[:kept], *(as_developer(m) for m in own[kept:])]


def result_text(result: Any) -> str:
    """A tool result as the LLM reads it (pipecat's own rendering), cut to ``RESULT_CHARS``."""
    if result is None:
        text = "COMPLETED"
    elif isinstance(result, str):
        text = result
    else:
        text = json.dumps(result, ensure_ascii=False, default=str)
    if len(text) > RESULT_CHARS:
        text = f"{text[:RESULT_CHARS]} [cut: {len(text)} chars]"
    return text or "COMPLETED"


class ContextLedger:
    """What of a pipecat conversation is stored, and what is still to send: the pure core of
    :class:`VoiceContextProcessor`, no I/O and no clock (``at`` comes in).

    Words come from two places, and each is planned once. :meth:`look` takes the pipeline
    context's messages (at a run, or when a turn lands) and plans a turn for each message
    that came after the newest one it knew. :meth:`heard` takes what pipecat announces as
    written to the context (``LLMContextUserTurnFrame``, ``LLMContextAssistantTurnFrame``):
    a turn a look planned already is not planned again, and one a look never saw (a reset
    dropped it first) is planned from the announcement. :meth:`call`, :meth:`result` and
    :meth:`cancel` plan tool turns.

    Planned turns wait in :attr:`outbox`, in order, each with its id and time, until the
    shell has sent them (:meth:`sent`); a turn sent again after a timeout is the same turn,
    which the server stores once.
    """

    def __init__(self, *, user: str = "user", bot: str = "assistant", prefix: str | None = None) -> None:
        self.user = user
        self.bot = bot
        self.prefix = prefix or f"pipecat-{uuid.uuid4().hex[:8]}"
        self.outbox: deque[Turn] = deque()
        self._known: dict[int, Any] = {}
        """The messages of the context at the last look, by identity; held, so that no new
        message can take the identity of one that is gone."""
        self._looked: deque[tuple[str, str]] = deque(maxlen=RECENT)
        """Words a look planned that no announcement has claimed yet."""
        self._announced: deque[tuple[str, str]] = deque(maxlen=RECENT)
        """Words planned from an announcement that no look has found yet."""
        self._heard: deque[int] = deque(maxlen=RECENT)
        self._calls: dict[str, str] = {}
        """Each tool call planned, and its function's name, until its result is planned."""
        self._settled: set[str] = set()
        self._count = 0

    def __repr__(self) -> str:
        return (
            f"<ContextLedger known={len(self._known)} outbox={len(self.outbox)} "
            f"open_calls={len(self._calls)} planned={self._count}>"
        )

    @property
    def planned(self) -> int:
        """How many turns were ever planned."""
        return self._count

    def fresh(self, messages: Sequence[Any]) -> list[Any]:
        """The messages after the newest known one: what the context gained since the last
        look. Messages put before a known one (a summary) are not among them."""
        newest = max((i for i, m in enumerate(messages) if id(m) in self._known), default=-1)
        return list(messages[newest + 1 :])

    def unseen_words(self, messages: Sequence[Any]) -> list[Any]:
        """The fresh messages that carry words (a user's or the bot's), changing nothing."""
        return [m for m in self.fresh(messages) if _role(m) in WORD_ROLES and _text(m).strip()]

    def look(self, messages: Sequence[Any], at: float) -> int:
        """Plan a turn for each fresh message with words; they are all known from now on.
        Returns how many turns it planned."""
        planned = 0
        for message in self.unseen_words(messages):
            words = (_role(message) or "", _text(message).strip())
            if words in self._announced:
                self._announced.remove(words)
            else:
                self._looked.append(words)
                self._plan_words(*words, at)
                planned += 1
        self._known = {id(m): m for m in messages}
        return planned

    def heard(self, announcement: int, role: str, text: str, at: float) -> bool:
        """pipecat announced that ``text`` was written to the context as ``role``'s turn
        (``announcement`` names the announcement, the same for both of its copies); plan it
        unless a look did. ``False`` if it was planned already."""
        words = (role, text.strip())
        if announcement in self._heard or role not in WORD_ROLES or not words[1]:
            return False
        self._heard.append(announcement)
        if words in self._looked:
            self._looked.remove(words)
            return False
        self._announced.append(words)
        self._plan_words(*words, at)
        return True

    def call(self, call_id: str, name: str, arguments: Any, at: float) -> bool:
        """Plan the bot's call of a tool; ``False`` if it is planned already."""
        if call_id in self._calls or call_id in self._settled:
            return False
        self._calls[call_id] = name
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        self._plan(self.bot, "assistant", "", at, tool_call_id=call_id, tool_name=name, tool_arguments=text)
        return True

    def result(self, call_id: str, name: str, arguments: Any, text: str, at: float) -> bool:
        """Plan a tool's result (its call first, if that was never planned); ``False`` if the
        call has its result already."""
        if call_id in self._settled:
            return False
        self.call(call_id, name, arguments, at)
        del self._calls[call_id]
        self._settled.add(call_id)
        self._plan(name, "tool", text, at, tool_call_id=call_id, tool_name=name)
        return True

    def cancel(self, call_id: str, at: float) -> bool:
        """Plan the result of a call that ended without one (pipecat's word for it: CANCELLED),
        so that no stored call waits for its result for ever."""
        name = self._calls.get(call_id)
        return name is not None and self.result(call_id, name, None, "CANCELLED", at)

    def cancel_open_calls(self, at: float) -> int:
        """Settle every call still waiting for its result (the pipeline is over)."""
        return sum(self.cancel(call_id, at) for call_id in list(self._calls))

    def sent(self, turn: Turn) -> None:
        """``turn`` is stored (or refused for good): it leaves the outbox."""
        if self.outbox and self.outbox[0] is turn:
            self.outbox.popleft()

    def _plan_words(self, role: str, text: str, at: float) -> None:
        if role == "user":
            self._plan(self.user, "user", text, at)
        else:
            self._plan(self.bot, "assistant", text, at)

    def _plan(self, speaker: str, role: Role, text: str, at: float, **tool: str) -> None:
        self._count += 1
        self.outbox.append(Turn(speaker, role, text, at, f"{self.prefix}-{self._count}", **tool))


class VoiceContextProcessor(FrameProcessor):
    """Feeds a pipecat conversation to a voice-context session and its context to the LLM.

    Place it with :meth:`around` (the LLM inside it). Placed on its own, before the LLM, it
    serves the runs that come down the pipeline only: the run after a tool result comes up
    from the assistant aggregator and misses it (a log line says so, once).

    ``breaker`` decides when a voice-context that did not answer is tried again (one may
    serve the processors of every call to one server), on ``clock``'s time.
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
        self.ledger = ContextLedger(user=user, bot=bot)
        self.replaced = 0
        self.fallbacks = 0
        self._context: LLMContext | None = None
        """The pipeline's own context, as the last confirmed run carried it."""
        self._way_back: _WayBack | None = None
        self._warned_unwrapped = False
        self._sending = anyio.Lock()
        self._held = HeldSession(
            url, session, token=token, close_timeout=timeout + 1, breaker=breaker, clock=clock
        )

    def around(self, llm: FrameProcessor) -> Pipeline:
        """``llm`` with this memory on both ways into it: put the result in the pipeline where
        the LLM service was. Every LLM run passes it, the ones that come down from the user
        aggregator and the ones that come up from the assistant aggregator (after a tool
        result)."""
        if self._way_back is not None:
            raise RuntimeError("this processor is around an LLM already")
        self._way_back = _WayBack(self)
        return Pipeline([self, llm, self._way_back])

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, VisionTextFrame) and direction == FrameDirection.DOWNSTREAM:
            await self.note(frame.text, source="vision")
        elif (
            isinstance(frame, FunctionCallResultFrame)
            and self._way_back is None
            and not self._warned_unwrapped
        ):
            self._warned_unwrapped = True
            log.warning(
                "voice_context_pipecat_unwrapped",
                session=self.session,
                note="the run after a tool result does not pass this processor; use around(llm)",
            )
        frame = await self._on_frame(frame, direction, toward_llm=FrameDirection.DOWNSTREAM)
        await self.push_frame(frame, direction)

    async def note(self, text: str, *, source: str = "screen", speaker: str | None = None) -> bool:
        """Tell voice-context what is on a screen (or in a camera's view); ``False`` when it
        did not take it within ``timeout``."""
        try:
            async with self._held.within(self.timeout) as room:
                await room.append_note(text, speaker=speaker, source=source)
        except (TimeoutError, OSError, VoiceContextError) as exc:
            log.warning("voice_context_pipecat_note_lost", session=self.session, error=repr(exc))
            return False
        return True

    async def cleanup(self) -> None:
        """Store what the call said last (the pipeline is over, so the context holds the bot's
        last reply), within ``timeout``, then close the connection."""
        await super().cleanup()  # type: ignore[no-untyped-call]
        now = time.time()
        self._look(now)
        self.ledger.cancel_open_calls(now)
        if self.ledger.outbox:
            await self._send_within_timeout()
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection to voice-context (pipecat's ``cleanup`` does)."""
        await self._held.close()

    async def _on_frame(
        self, frame: Frame, direction: FrameDirection, *, toward_llm: FrameDirection
    ) -> Frame:
        """What both ways into the LLM do with a frame; returns the frame to pass on."""
        if isinstance(frame, LLMContextFrame) and direction == toward_llm:
            return await self._with_memory(frame)
        now, planned = time.time(), self.ledger.planned
        if isinstance(frame, LLMContextUserTurnFrame | LLMContextAssistantTurnFrame):
            self._look(now)  # the turn is in the context now: see it before a reset can drop it
            role = "user" if isinstance(frame, LLMContextUserTurnFrame) else "assistant"
            self.ledger.heard(min(frame.id, frame.broadcast_sibling_id or frame.id), role, frame.text, now)
        elif isinstance(frame, FunctionCallInProgressFrame):
            self.ledger.call(frame.tool_call_id, frame.function_name, frame.arguments, now)
        elif isinstance(frame, FunctionCallResultFrame):
            if frame.properties is None or frame.properties.is_final:
                text = result_text(frame.result)
                self.ledger.result(frame.tool_call_id, frame.function_name, frame.arguments, text, now)
        elif isinstance(frame, FunctionCallCancelFrame):
            self.ledger.cancel(frame.tool_call_id, now)
        elif isinstance(frame, EndFrame | CancelFrame):
            self._look(now)
        if self.ledger.planned > planned:
            await self._send_within_timeout()
        return frame

    def _look(self, now: float) -> None:
        if self._context is not None:
            self.ledger.look(list(self._context.get_messages()), now)

    async def _with_memory(self, frame: LLMContextFrame) -> LLMContextFrame:
        messages = list(frame.context.get_messages())
        if frame.speculation:  # a guess at a turn not yet confirmed: shown, never stored
            guessed = self.ledger.unseen_words(messages)
        else:
            self._context, guessed = frame.context, []
            self.ledger.look(messages, time.time())
        try:
            async with self._held.within(self.timeout) as room:
                await self._send(room)
                reply = await room.context("messages", self.budget_chars)
        except (TimeoutError, OSError, VoiceContextError) as exc:
            self.fallbacks += 1
            log.warning(
                "voice_context_pipecat_fallback",
                session=self.session,
                error=repr(exc),
                unsent=len(self.ledger.outbox),
                note="the LLM gets the pipeline's own context this time",
            )
            return frame
        remembered: list[Any] = [as_developer(dict(m)) for m in reply["messages"]]
        context = LLMContext(
            messages=[*own_instructions(messages), *remembered, *guessed],
            tools=frame.context.tools,
            tool_choice=frame.context.tool_choice,
        )
        self.replaced += 1
        return LLMContextFrame(context=context, speculation=frame.speculation)

    async def _send_within_timeout(self) -> None:
        try:
            async with self._held.within(self.timeout) as room:
                await self._send(room)
        except (TimeoutError, OSError, VoiceContextError) as exc:
            log.warning(
                "voice_context_pipecat_unsent",
                session=self.session,
                error=repr(exc),
                unsent=len(self.ledger.outbox),
            )

    async def _send(self, room: SessionHandle) -> None:
        """Send the planned turns, oldest first; one at a time, so they are stored in order."""
        async with self._sending:
            while self.ledger.outbox:
                turn = self.ledger.outbox[0]
                try:
                    await room.client.request(TurnAppend(room.name, turn))
                except ClientError as exc:
                    if exc.code not in REFUSED:
                        raise
                    log.warning(
                        "voice_context_pipecat_turn_refused",
                        session=self.session,
                        turn=turn.id,
                        error=str(exc),
                    )
                self.ledger.sent(turn)


class _WayBack(FrameProcessor):
    """The memory on the LLM's downstream side: the runs that come up the pipeline (after a
    tool result, an ``LLMRunFrame``, a context update with ``run_llm``) pass it."""

    def __init__(self, memory: VoiceContextProcessor) -> None:
        super().__init__(name=f"{memory.name}::WayBack")
        self.memory = memory

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        frame = await self.memory._on_frame(frame, direction, toward_llm=FrameDirection.UPSTREAM)
        await self.push_frame(frame, direction)
