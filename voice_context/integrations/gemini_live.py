"""A Gemini Live call that outlives its connections, with its long memory in voice-context.

A Live API connection lasts about ten minutes and ends with a ``goAway`` (its
``timeLeft``, about a minute's warning); an audio session without context
window compression lasts fifteen. :class:`GeminiLive` holds one call across as
many connections as it takes, on google-genai's own Live client
(``client.aio.live.connect``)::

    client = genai.Client(api_key=...)
    async with GeminiLive(client, model=MODEL, url="ws://127.0.0.1:8765/v1", session="call-7",
                          base_instructions="You are Nova.") as live:
        await live.send_realtime_input(audio=types.Blob(data=pcm, mime_type="audio/pcm;rate=16000"))
        async for message in live.receive():      # every connection's messages, in order
            play(message)

- Every connection it opens transcribes both ways (``input_audio_transcription``,
  ``output_audio_transcription``), asks for session resumption and, unless told
  otherwise, compresses its context window with a sliding window. The streamed
  transcription chunks become turns in voice-context: the user's words of an
  exchange one user turn, the model's one assistant turn, each stored once (each
  turn carries an id), in order, after the exchange ends (``turnComplete``, or
  ``interrupted``: the words the model said before it). Text the bot sends as
  the user (``send_realtime_input(text=...)``, ``send_client_content`` of a user
  turn) is a user turn too.
- Every connection starts with the memory in its ``system_instruction``:
  ``base_instructions``, then voice-context's context (``instructions`` format,
  within ``budget_chars``). A fresh provider session (the first, or one that
  could not resume) gets the handoff, which ends with the questions still open.
- On ``goAway`` the next connection is opened before the old one drops: once
  the old one is between exchanges and has sent a resumption handle since (or
  ``switch_margin`` seconds before its time is up, whichever comes first),
  the turns so far are stored, the memory fetched, and a connection resumes the
  session with the latest resumable handle. Then the old one is closed (at
  once when it is between exchanges, else once it has said all it had to say)
  and input goes to the new one, what the bot sent meanwhile first, in order. A server may refuse a
  resumption while the connection it resumes is still open: then the old
  connection is closed first and the resumption tried again. When resumption
  is refused, or no handle was resumable yet, a fresh session starts with the
  handoff. A connection that drops without warning is replaced the same way, at
  once.

Nothing waits long on voice-context: storing turns happens beside the call, and
each request gives up after ``timeout`` seconds; while voice-context is down
(a circuit breaker, as in the pipecat and LiveKit adapters) a new connection
starts with the memory it had last, and the turns not stored wait, in order,
for the next try (the next exchange or connection).

Needs the ``gemini`` extra (``pip install 'voice-context[gemini]'``).
"""

from __future__ import annotations

import itertools
import re
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, Self

import anyio
import anyio.abc
import websockets
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from google.genai.live import AsyncSession

from voice_context.client import _as_itself
from voice_context.codec import TurnAppend
from voice_context.core.turns import Turn
from voice_context.errors import ClientError, VoiceContextError
from voice_context.integrations._held import HeldSession
from voice_context.integrations.clock import Clock, WallClock
from voice_context.logs import get_logger

__all__ = ["SLIDING_WINDOW", "GeminiLive", "Said", "Transcript", "parse_duration"]

log = get_logger("voice_context.integrations.gemini_live")

SLIDING_WINDOW = types.ContextWindowCompressionConfig(sliding_window=types.SlidingWindow())
"""The context window compression a connection asks for by default: the server's sliding
window, at its own trigger (without compression an audio session ends after 15 minutes)."""

MESSAGE_BUFFER = 1024
"""Server messages held for :meth:`GeminiLive.receive` before reading a connection waits."""
MAX_HELD_SENDS = 2000
"""Sends held while no connection takes them (during a switch); past this the oldest go."""
REFUSED = frozenset({"bad_request", "too_large"})
"""voice-context's error codes for a turn it will never take: dropped, not tried again."""
CONNECTION_ENDED = (genai_errors.APIError, websockets.ConnectionClosed)
"""What google-genai raises when a Live connection closes (older versions let the websocket's
own error through)."""
NOT_CONNECTED = (*CONNECTION_ENDED, websockets.InvalidHandshake, OSError, TimeoutError)
"""What a connection that could not be opened raises: a refused resumption among them."""

_DURATION = re.compile(r"^\s*(-?\d+(?:\.\d*)?|-?\.\d+)s\s*$")


def parse_duration(text: object) -> float | None:
    """A protobuf ``Duration`` in its JSON form (``"50s"``, ``"1.5s"``) in seconds; ``None``
    for anything else."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    return max(0.0, float(match.group(1))) if match else None


@dataclass(frozen=True, slots=True)
class Said:
    """A finalized turn of a connection's transcript."""

    role: Literal["user", "assistant"]
    text: str


def _join(chunks: list[str]) -> str:
    # Chunks carry their own spaces (" Hello", " there."), or none between words of a language
    # written without them: joined as they came, with runs of whitespace made one.
    return " ".join("".join(chunks).split())


class Transcript:
    """One connection's streamed transcription as finalized turns: the pure core of
    :class:`GeminiLive` (no I/O, no clock).

    The Live API streams the user's words (``inputTranscription``) and the model's
    (``outputTranscription``, or text parts of ``modelTurn``) in chunks, and says that the
    two streams keep no order between them: the tail of the user's words may come after the
    model began. So an exchange is finalized when it ends: at ``turnComplete`` the user's
    words (all of them) become one user turn, then the model's one assistant turn. At
    ``interrupted`` the model's words so far are its turn, and the user's words heard after
    it began are the start of the next exchange (the speech that interrupted it).
    """

    def __init__(self) -> None:
        self._user: list[str] = []
        self._late: list[str] = []
        """The user's words heard after the model began: the end of this exchange's user turn,
        or, once the model is interrupted, the start of the next one."""
        self._said: list[str] = []
        self._wrote: list[str] = []
        self._interrupted = False
        self._active = False

    def __repr__(self) -> str:
        return (
            f"<Transcript user={len(self._user)}+{len(self._late)} said={len(self._said)} "
            f"wrote={len(self._wrote)} {'idle' if self.idle else 'in an exchange'}>"
        )

    @property
    def idle(self) -> bool:
        """Between exchanges: nothing heard or said since the last ``turnComplete``."""
        return not (self._active or self._user or self._late or self._said or self._wrote)

    def heard(self, text: str) -> list[Said]:
        """A chunk of the user's words."""
        self._active = True
        if self._interrupted or self._said or self._wrote:
            self._late.append(text)
        else:
            self._user.append(text)
        return []

    def said(self, text: str) -> list[Said]:
        """A chunk of the model's spoken words (its output transcription)."""
        self._active = True
        self._said.append(text)
        return []

    def wrote(self, text: str) -> list[Said]:
        """A text part of the model's turn: its words when it speaks none (a text modality)."""
        self._active = True
        self._wrote.append(text)
        return []

    def began(self) -> None:
        """The model's turn carries something without words (audio): an exchange is on."""
        self._active = True

    def typed(self, text: str) -> list[Said]:
        """The bot sent ``text`` as the user: the user's words heard before it, then it."""
        self._active = True
        return [*self._end_user(), Said("user", text)] if text.strip() else self._end_user()

    def interrupted(self) -> list[Said]:
        """The user spoke over the model: the exchange so far is done."""
        self._interrupted = True
        return [*self._end_user(), *self._end_model()]

    def turn_complete(self) -> list[Said]:
        """The model's turn is over: every word of the exchange is in."""
        if self._interrupted:
            done = self._end_model()  # anything it said after the interruption
            self._user, self._late, self._interrupted = self._late, [], False
        else:
            self._user, self._late = [*self._user, *self._late], []
            done = [*self._end_user(), *self._end_model()]
        self._active = bool(self._user)
        return done

    def flush(self) -> list[Said]:
        """The connection ended: whatever was heard or said is a turn."""
        self._user, self._late, self._interrupted = [*self._user, *self._late], [], False
        done = [*self._end_user(), *self._end_model()]
        self._active = False
        return done

    def _end_user(self) -> list[Said]:
        text, self._user = _join(self._user), []
        return [Said("user", text)] if text else []

    def _end_model(self) -> list[Said]:
        text = _join(self._said) or _join(self._wrote)
        self._said, self._wrote = [], []
        return [Said("assistant", text)] if text else []

    def take(self, content: types.LiveServerContent) -> list[Said]:
        """One ``serverContent`` message: the turns it finalized."""
        done: list[Said] = []
        if content.input_transcription is not None and content.input_transcription.text:
            done += self.heard(content.input_transcription.text)
        if content.output_transcription is not None and content.output_transcription.text:
            done += self.said(content.output_transcription.text)
        if content.model_turn is not None:
            self.began()
            for part in content.model_turn.parts or ():
                if part.text and not part.thought:
                    done += self.wrote(part.text)
        if content.interrupted:
            done += self.interrupted()
        if content.turn_complete:
            done += self.turn_complete()
        return done


def _typed(turns: Any, turn_complete: bool) -> str:
    """The user's words in what ``send_client_content`` sends, when it ends the user's turn."""
    if not turns or not turn_complete:
        return ""
    words: list[str] = []
    for item in turns if isinstance(turns, list) else [turns]:
        content = item if isinstance(item, types.Content) else types.Content.model_validate(item)
        if content.role in (None, "user"):
            words += [part.text for part in content.parts or () if part.text and not part.thought]
    return " ".join(words)


Send = Callable[[AsyncSession], Awaitable[None]]


@dataclass(eq=False)
class _Outgoing:
    """Something the bot sends, and the user's words it carries (``typed``)."""

    send: Send
    typed: str = ""


@dataclass(eq=False)
class _Link:
    """One Live API connection of the call."""

    number: int
    resumed: bool
    instructions: str
    session: AsyncSession | None = None
    transcript: Transcript = field(default_factory=Transcript)
    handle_since_idle: bool = False
    """A resumable handle came since the last exchange ended: resuming it loses nothing."""
    deadline: float | None = None
    closed: bool = False
    stopping: bool = False
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    done: anyio.Event = field(default_factory=anyio.Event)
    changed: anyio.Event = field(default_factory=anyio.Event)

    def touch(self) -> None:
        """Wake whoever waits for this connection's state to change."""
        self.changed.set()
        self.changed = anyio.Event()

    @property
    def settled(self) -> bool:
        return self.transcript.idle and self.handle_since_idle


class GeminiLive:
    """One Gemini Live call over as many connections as it takes; see the module docstring.

    ``client`` is a ``google.genai.Client``; ``model`` the Live model; ``config`` the
    connection's ``LiveConnectConfig`` (voice, modality, tools), without a
    ``system_instruction``: the bot's prompt is ``base_instructions``, which every
    connection's system instruction starts with, before the memory. ``compression`` is the
    context window compression asked for when ``config`` has none (``None``: none). ``url``
    and ``session`` name the voice-context session; ``timeout`` bounds each request to it.
    Use it as ``async with``: entering opens the first connection (raises what google-genai
    raises when that fails); leaving stores what is left, within ``timeout``, and closes the
    connections. Raises ``ValueError`` for a ``config`` with a system instruction.
    """

    def __init__(
        self,
        client: genai.Client,
        *,
        model: str,
        url: str,
        session: str,
        config: types.LiveConnectConfig | None = None,
        base_instructions: str = "",
        budget_chars: int | None = None,
        compression: types.ContextWindowCompressionConfig | None = SLIDING_WINDOW,
        token: str | None = None,
        timeout: float = 0.5,
        switch_margin: float = 5.0,
        clock: Clock | None = None,
        user: str = "user",
        bot: str = "assistant",
    ) -> None:
        if config is not None and config.system_instruction is not None:
            raise ValueError(
                "give the bot's prompt as base_instructions: each connection's system_instruction "
                "is made of it and the memory"
            )
        self.client = client
        self.model = model
        self.config = config if config is not None else types.LiveConnectConfig()
        self.base_instructions = base_instructions
        self.budget_chars = budget_chars
        self.compression = compression
        self.session = session
        self.timeout = timeout
        self.switch_margin = switch_margin
        self.clock: Clock = clock if clock is not None else WallClock()
        self.user = user
        self.bot = bot
        # the circuit breaker's backoff is counted on the call's clock too
        self.held = HeldSession(url, session, token=token, close_timeout=timeout + 1, clock=self.clock.now)
        self.connections = 0
        self.go_aways = 0
        self.resumptions = 0
        self.refusals = 0
        self.handoffs = 0
        self.said = 0
        """Turns finalized (the user's and the model's)."""
        self.stored = 0
        self.memory_skipped = 0
        self.handle: str | None = None
        """The latest resumable session resumption handle."""
        self._instructions: str | None = None
        self._prefix = f"gemini-{uuid.uuid4().hex[:8]}"
        self._ids = itertools.count(1)
        self._outbox: deque[Turn] = deque()
        self._wake = anyio.Event()
        self._storing = anyio.Lock()
        self._sending = anyio.Lock()
        self._held_sends: deque[_Outgoing] = deque(maxlen=MAX_HELD_SENDS)
        self._holding = False
        self._current: _Link | None = None
        self._links: set[_Link] = set()
        self._rolling = False
        self._closing = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._messages_in: MemoryObjectSendStream[types.LiveServerMessage] | None = None
        self._messages_out: MemoryObjectReceiveStream[types.LiveServerMessage] | None = None

    def __repr__(self) -> str:
        current = f"#{self._current.number}" if self._current is not None else "none"
        return (
            f"<GeminiLive {self.session!r} connection={current} connections={self.connections} "
            f"go_aways={self.go_aways} resumptions={self.resumptions} refusals={self.refusals} "
            f"handoffs={self.handoffs} said={self.said} stored={self.stored} unsent={len(self._outbox)}>"
        )

    @property
    def unsent(self) -> int:
        """Turns finalized and not stored yet."""
        return len(self._outbox)

    # -- lifetime --------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        with _as_itself(None):
            async with AsyncExitStack() as stack:
                stack.push_async_callback(self.held.close)
                self._messages_in, self._messages_out = anyio.create_memory_object_stream[
                    types.LiveServerMessage
                ](MESSAGE_BUFFER)
                stack.callback(self._messages_in.close)
                stack.callback(self._messages_out.close)
                self._tg = await stack.enter_async_context(anyio.create_task_group())
                stack.push_async_callback(self._wind_down)
                self._tg.start_soon(self._store_loop)
                await self._switch_to(await self._fresh())
                self._replace_if_gone()
                self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None, "the call was not entered"
        with _as_itself(exc):
            return await stack.__aexit__(kind, exc, tb)

    async def _wind_down(self) -> None:
        """The call is over: every connection closed (what it said stored), then the task group."""
        self._closing = True
        for link in list(self._links):
            await self._stop(link)
        await self._store_within_timeout()
        assert self._tg is not None
        self._tg.cancel_scope.cancel()

    # -- the bot's side --------------------------------------------------------------

    async def receive(self) -> AsyncGenerator[types.LiveServerMessage]:
        """The server messages of every connection of the call, in the order they came,
        until the call ends. Read it all along: a connection's messages wait for it."""
        if self._messages_out is None:
            raise RuntimeError("use 'async with GeminiLive(...)' before receiving")
        with self._messages_out.clone() as messages:
            async for message in messages:
                yield message

    async def send_realtime_input(self, **kwargs: Any) -> None:
        """``AsyncSession.send_realtime_input`` on the current connection (during a switch, on
        the next one, in order); ``text=`` is stored as the user's words."""
        typed = kwargs.get("text")
        await self._deliver(
            _Outgoing(lambda s: s.send_realtime_input(**kwargs), typed if isinstance(typed, str) else "")
        )

    async def send_client_content(self, *, turns: Any = None, turn_complete: bool = True) -> None:
        """``AsyncSession.send_client_content`` on the current connection; the user's text in
        ``turns`` that ends the user's turn is stored as the user's words."""
        await self._deliver(
            _Outgoing(
                lambda s: s.send_client_content(turns=turns, turn_complete=turn_complete),
                _typed(turns, turn_complete),
            )
        )

    async def send_tool_response(self, *, function_responses: Any) -> None:
        """``AsyncSession.send_tool_response`` on the current connection."""
        await self._deliver(_Outgoing(lambda s: s.send_tool_response(function_responses=function_responses)))

    async def _deliver(self, outgoing: _Outgoing) -> None:
        async with self._sending:
            link = self._current
            if self._holding or link is None or link.closed or link.session is None:
                self._held_sends.append(outgoing)
                return
            await self._send_on(link, outgoing)

    async def _send_on(self, link: _Link, outgoing: _Outgoing) -> bool:
        assert link.session is not None
        try:
            await outgoing.send(link.session)
        except CONNECTION_ENDED:
            self._held_sends.appendleft(outgoing)  # the connection is going: the next one takes it
            return False
        if outgoing.typed:
            self._plan(link.transcript.typed(outgoing.typed))
            link.touch()
        return True

    # -- connections -----------------------------------------------------------------

    def _config(self, instructions: str, handle: str | None) -> types.LiveConnectConfig:
        """A connection's config: the bot's, with the memory, transcription both ways,
        resumption (from ``handle``) and compression. A copy each time: google-genai changes
        the config it is given."""
        update: dict[str, Any] = {
            "system_instruction": instructions or None,
            "session_resumption": types.SessionResumptionConfig(handle=handle),
        }
        if self.config.input_audio_transcription is None:
            update["input_audio_transcription"] = types.AudioTranscriptionConfig()
        if self.config.output_audio_transcription is None:
            update["output_audio_transcription"] = types.AudioTranscriptionConfig()
        if self.config.context_window_compression is None and self.compression is not None:
            update["context_window_compression"] = self.compression
        return self.config.model_copy(deep=True, update=update)

    async def _open(self, instructions: str, handle: str | None) -> _Link:
        """A new connection, set up (``setupComplete`` in) and read in the task group; raises
        what google-genai raises when it cannot be (a refused resumption among them)."""
        assert self._tg is not None
        link = _Link(self.connections + 1, handle is not None, instructions)
        await self._tg.start(self._hold, link, self._config(instructions, handle))
        self.connections += 1
        log.info(
            "gemini_live_connected",
            session=self.session,
            connection=link.number,
            resumed=link.resumed,
            instructions_chars=len(instructions),
        )
        return link

    async def _hold(
        self,
        link: _Link,
        config: types.LiveConnectConfig,
        *,
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """One connection's lifetime: connect, read until it closes or is stopped, close."""
        started = False
        try:
            async with self.client.aio.live.connect(model=self.model, config=config) as session:
                link.session = session
                self._links.add(link)
                started = True
                task_status.started()
                with link.scope:
                    await self._read(link)
        except CONNECTION_ENDED as exc:
            if not started:
                raise
            log.info("gemini_live_closed", session=self.session, connection=link.number, error=repr(exc))
        finally:
            link.closed = True
            self._links.discard(link)
            if started:
                self._plan(link.transcript.flush())
            link.done.set()
            link.touch()
            if started and link is self._current and not link.stopping and not self._closing:
                log.warning("gemini_live_dropped", session=self.session, connection=link.number)
                self._roll_over_soon(link, None)

    async def _read(self, link: _Link) -> None:
        assert link.session is not None and self._messages_in is not None
        try:
            while True:
                async for message in link.session.receive():
                    self._take(link, message)
                    await self._messages_in.send(message)
        except CONNECTION_ENDED as exc:
            log.info("gemini_live_closed", session=self.session, connection=link.number, error=repr(exc))

    def _take(self, link: _Link, message: types.LiveServerMessage) -> None:
        """What the call keeps of a server message: the turns, the handle, the goAway."""
        if message.server_content is not None:
            self._plan(link.transcript.take(message.server_content))
            if not link.transcript.idle:
                link.handle_since_idle = False
        update = message.session_resumption_update
        if update is not None and update.resumable and update.new_handle:
            self.handle = update.new_handle
            link.handle_since_idle = link.transcript.idle
        if message.go_away is not None:
            self.go_aways += 1
            left = parse_duration(message.go_away.time_left)
            link.deadline = self.clock.now() + (left if left is not None else 0.0)
            log.info(
                "gemini_live_go_away",
                session=self.session,
                connection=link.number,
                time_left=left,
                resumable=self.handle is not None,
            )
            if link is self._current:
                self._roll_over_soon(link, link.deadline)
        link.touch()

    async def _stop(self, link: _Link) -> None:
        """Close a connection and wait until it is closed."""
        link.stopping = True
        link.scope.cancel()
        await link.done.wait()

    async def _until(self, link: _Link, ready: Callable[[_Link], bool], deadline: float | None) -> None:
        """Wait until ``ready(link)``, the connection closes, or the clock reaches ``deadline``."""
        async with anyio.create_task_group() as tg:
            if deadline is not None:

                async def time_up() -> None:
                    await self.clock.sleep_until(deadline)
                    tg.cancel_scope.cancel()

                tg.start_soon(time_up)
            while not ready(link) and not link.closed and (deadline is None or self.clock.now() < deadline):
                await link.changed.wait()
            tg.cancel_scope.cancel()

    # -- switching over --------------------------------------------------------------

    def _roll_over_soon(self, old: _Link, deadline: float | None) -> None:
        if self._rolling or self._closing or self._tg is None:
            return
        self._rolling = True
        self._tg.start_soon(self._roll_over, old, deadline)

    async def _roll_over(self, old: _Link, deadline: float | None) -> None:
        """Replace ``old`` (its time ends at ``deadline``; ``None``: it is gone) with a new
        connection, resumed when the server lets it, fresh with the handoff when not."""
        try:
            switch_at = None if deadline is None else deadline - self.switch_margin
            await self._until(old, lambda link: link.settled, switch_at)
            if self._closing:
                return
            self._holding = True  # from here on what the bot sends waits for the next connection
            await self._store_within_timeout()
            new = await self._resume(old)
            if new is None:
                new = await self._fresh()
            if self._closing:
                await self._stop(new)
                return
            if old.transcript.idle and not old.closed:
                await self._stop(old)  # it has nothing more to say: closed before the input moves on
            await self._switch_to(new)
        finally:
            self._rolling = False
        self._replace_if_gone()
        if not old.closed:
            await self._until(old, lambda link: link.transcript.idle, old.deadline)
            await self._stop(old)

    def _replace_if_gone(self) -> None:
        """A connection that closed before it became the current one is replaced at once."""
        current = self._current
        if current is not None and current.closed and not current.stopping:
            self._roll_over_soon(current, None)

    async def _resume(self, old: _Link) -> _Link | None:
        """A connection that resumes the session, or ``None`` when there is no resumable
        handle or the server refuses it (twice: while ``old`` is open, then after it closed)."""
        handle = self.handle
        if handle is None:
            log.info("gemini_live_not_resumable", session=self.session, connection=old.number)
            return None
        instructions = await self._memory(handoff=False)
        for attempt in (1, 2):
            try:
                link = await self._open(instructions, handle)
            except NOT_CONNECTED as exc:
                self.refusals += 1
                log.warning(
                    "gemini_live_resumption_refused",
                    session=self.session,
                    attempt=attempt,
                    old_open=not old.closed,
                    error=repr(exc),
                )
                if old.closed:
                    return None
                await self._stop(old)  # some servers resume a session only once its last connection is gone
                continue
            self.resumptions += 1
            return link
        return None

    async def _fresh(self) -> _Link:
        """A new provider session, briefed with the handoff."""
        link = await self._open(await self._memory(handoff=True), None)
        self.handoffs += 1
        return link

    async def _switch_to(self, new: _Link) -> None:
        """Make ``new`` the connection the bot's input goes to, after what waited for it."""
        async with self._sending:
            self._current = new
            while self._held_sends:
                if not await self._send_on(new, self._held_sends.popleft()):
                    break
            self._holding = False

    # -- voice-context ---------------------------------------------------------------

    async def _memory(self, *, handoff: bool) -> str:
        """The system instruction of a new connection: the handoff for a fresh session, the
        context for a resumed one; the last one fetched when voice-context does not answer
        within ``timeout`` (``base_instructions`` before any)."""
        try:
            with anyio.fail_after(self.timeout):
                room = await self.held.open()
                if handoff:
                    reply = await room.handoff(self.budget_chars, self.base_instructions)
                else:
                    reply = await room.context("instructions", self.budget_chars, self.base_instructions)
        except (TimeoutError, OSError, VoiceContextError) as exc:
            self.memory_skipped += 1
            log.warning(
                "gemini_live_memory_skipped",
                session=self.session,
                error=repr(exc),
                note="the connection starts with the memory it had last",
            )
            return self._instructions if self._instructions is not None else self.base_instructions
        self._instructions = str(reply["instructions"])
        return self._instructions

    def _plan(self, done: Iterable[Said]) -> None:
        at = self.clock.now()
        planned = False
        for said in done:
            speaker = self.user if said.role == "user" else self.bot
            self._outbox.append(Turn(speaker, said.role, said.text, at, f"{self._prefix}-{next(self._ids)}"))
            self.said += 1
            planned = True
        if planned:
            self._wake.set()

    async def _store_loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            await self._store_within_timeout()

    async def _store_within_timeout(self) -> bool:
        """Store the finalized turns, oldest first, one at a time (each once: it carries an
        id); ``False`` when voice-context did not take them all within ``timeout``."""
        if not self._outbox:
            return True
        try:
            with anyio.fail_after(self.timeout):
                async with self._storing:
                    room = await self.held.open()
                    while self._outbox:
                        turn = self._outbox[0]
                        try:
                            await room.client.request(TurnAppend(room.name, turn))
                        except ClientError as exc:
                            if exc.code not in REFUSED:
                                raise
                            log.warning(
                                "gemini_live_turn_refused", session=self.session, turn=turn.id, error=str(exc)
                            )
                        else:
                            self.stored += 1
                        self._outbox.popleft()
        except (TimeoutError, OSError, VoiceContextError) as exc:
            log.warning(
                "gemini_live_turns_unsent", session=self.session, unsent=len(self._outbox), error=repr(exc)
            )
            return False
        return True
