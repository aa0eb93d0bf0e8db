"""An async client for bots, with reconnect-and-resume::

    async with Client("ws://127.0.0.1:8765/v1", token="...") as client:
        room = await client.open("room-1")
        await room.append_turn("Alice", "user", "Let's book Lisbon for May 3rd.", id="utt-41")
        ctx = await room.context(format="instructions", budget_chars=5200)
        realtime_session.update(instructions=ctx["instructions"])

Every frame the server sends is read by the codec (:func:`voice_context.codec.parse_reply`):
the client goes by the typed message. The replies its methods return are the dicts the
server sent, as ``docs/protocol.md`` shows them (fields a newer server adds included);
:meth:`Client.exchange` gives a reply typed too, as the codec reads it. An ``error`` reply
raises :class:`ClientError` with its ``code``; a reply the codec cannot read raises one
with code ``bad_reply``. Whatever is raised
in the ``async with`` block, or by the client as it closes, comes out as itself (not
wrapped in an ``ExceptionGroup``), so ``except ClientError`` around the block catches it.

Compaction events pushed by the server reach ``on_event`` (a plain function
called with each event dict) and :meth:`Client.events` (an async iterator).
A session is the client's from the ``session.open`` the server answered (with
:meth:`Client.open`, or any ``session.open`` sent through :meth:`Client.request`)
until the ``session.close`` or ``session.delete`` it answered.

**Rate limits.** A server takes at most ``turns_per_second`` turns and notes a
second for one session (20 by default, in bursts of ``turn_burst``, 40), and
``owner_turns_per_second`` (100) for all the sessions of one token; over it, the
turn or note is refused, not stored, with a ``rate_limited`` error that says
``retry_after`` (seconds). The client waits that long and sends it again, for as
long as ``rate_limit_wait`` (10 s) allows in all for one request; past it, or with
``rate_limit_wait=0``, the ``rate_limited`` :class:`ClientError` is raised (its
``reply`` has ``retry_after``). ``rate_limit_waits`` counts the waits.

**Reconnect and resume.** When the connection drops, nothing happens until the
next call: it reconnects (up to ``reconnect_attempts`` tries, the waits between
them growing from ``backoff_base`` to ``backoff_max``), re-sends ``session.open``
for every session this client has open (with the config it was opened with),
then goes on. A request that was in flight when the connection dropped is
retried once after the resume when that is safe: ``session.open``,
``context.get``, ``session.state``, ``session.close``, ``ping``, and
``turn.append`` of a turn that carries an ``id`` (the server answers a repeated
turn with the index of the first copy, so it is stored exactly once). Anything
else in flight (``turn.append`` without an ``id``, ``note.append``) raises
:class:`ConnectionLost`, because it may or may not have been applied. Pushed
events sent while the client was disconnected are not replayed.
``Client(reconnect=False)`` makes one attempt to connect, and none after a drop.

**When the server is down** (a circuit breaker,
:class:`~voice_context.core.breaker.CircuitBreaker`): after a try to connect
fails, every call raises :class:`ConnectionLost` at once, without trying,
until the backoff has passed (from ``backoff_base``, doubling with each failure
in a row up to ``backoff_max``, jittered); then one call tries again while the
others are still refused. The call that is reconnecting sleeps the backoff
between its own tries; a call cancelled while connecting (a bot's own timeout)
counts as a failed try. A bot that wraps each call in a short timeout thus waits
for a server that is down once, not at every turn. The circuit's opening and
closing are logged once each (``voice_context_client_circuit_opened`` /
``_closed``), not every refused call. Clients of one server may share one
breaker (``breaker=``), as the pipecat and LiveKit integrations do across the
clients they make.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Self

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from voice_context import codec
from voice_context.codec import (
    RATE_LIMITED,
    ClientMessage,
    Compacted,
    CompactionFailure,
    ContextGet,
    ContextOverflow,
    DecodeError,
    ErrorReply,
    LandmarkPin,
    LandmarkUnpin,
    NoteAppend,
    Ping,
    Reply,
    SessionClose,
    SessionDelete,
    SessionHandoff,
    SessionOpen,
    SessionStateGet,
    TurnAppend,
    TurnStored,
)
from voice_context.core.breaker import CircuitBreaker
from voice_context.core.budget import Format
from voice_context.core.handoff import LAST_TURNS
from voice_context.core.turns import Note, Role, Turn
from voice_context.errors import ClientError, ConnectionLost, RequestTimeout
from voice_context.logs import get_logger
from voice_context.released import ReleasedClientConnection

log = get_logger("voice_context.client")

EVENT_BUFFER = 256
MAX_REPLY_BYTES = 16 * 1024 * 1024
#: Seconds one request may wait out ``rate_limited`` replies in all, by default.
RATE_LIMIT_WAIT = 10.0
Event = dict[str, Any]
"""A reply or a pushed event as the server sent it: the JSON object of its frame."""
EventCallback = Callable[[Event], None]
Received = tuple[Reply, Event]
"""A reply typed (as the codec reads it) and as the server sent it."""


@dataclass(eq=False)
class _Waiter:
    done: anyio.Event = field(default_factory=anyio.Event)
    reply: Received | None = None
    error: ClientError | None = None


@dataclass(eq=False)
class _Link:
    """One websocket connection and the requests waiting on it."""

    ws: ClientConnection
    pending: dict[int, _Waiter] = field(default_factory=dict)
    alive: bool = True

    def fail_all(self, reason: str) -> None:
        self.alive = False
        for waiter in self.pending.values():
            if not waiter.done.is_set():
                waiter.error = ConnectionLost(reason)
                waiter.done.set()


class Client:
    """A connection to a voice-context server for any number of sessions. See the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        open_timeout: float = 10.0,
        request_timeout: float = 30.0,
        reconnect: bool = True,
        reconnect_attempts: int = 8,
        backoff_base: float = 0.05,
        backoff_max: float = 2.0,
        rate_limit_wait: float = RATE_LIMIT_WAIT,
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_event: EventCallback | None = None,
    ) -> None:
        self.url = url
        self._token = token
        self.open_timeout = open_timeout
        self.request_timeout = request_timeout
        self.reconnect = reconnect
        self.reconnect_attempts = max(1, reconnect_attempts)
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.rate_limit_wait = rate_limit_wait
        self.breaker = breaker if breaker is not None else CircuitBreaker(base=backoff_base, cap=backoff_max)
        self.clock = clock
        """The breaker's time (any monotonic clock in seconds)."""
        self.on_event = on_event
        self.reconnects = 0
        self.rate_limit_waits = 0
        self.events_dropped = 0
        self._sessions: dict[str, SessionHandle] = {}
        self._link: _Link | None = None
        self._tg: TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._lock = anyio.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        self._events_in: MemoryObjectSendStream[Event] | None = None
        self._events_out: MemoryObjectReceiveStream[Event] | None = None

    def __repr__(self) -> str:
        state = "connected" if self.connected else f"disconnected, circuit {self.breaker.state}"
        return f"<Client {self.url} {state} sessions={len(self._sessions)}>"

    @property
    def connected(self) -> bool:
        return self._link is not None and self._link.alive

    @property
    def sessions(self) -> list[str]:
        return list(self._sessions)

    # -- lifetime --------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        with _as_itself(None):
            async with AsyncExitStack() as stack:
                await stack.enter_async_context(self._lifetime())
                self._stack = stack.pop_all()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None, "the client was not entered"
        with _as_itself(exc):
            return await stack.__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        """The event stream and the task group the connection's reader runs in, with the first
        connection made; on the way out the connection closes (shielded, within
        ``open_timeout``), then the reader ends and the event stream with it."""
        self._events_in, self._events_out = anyio.create_memory_object_stream[Event](EVENT_BUFFER)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                try:
                    await self._ensure_link()
                    try:
                        yield
                    finally:
                        self._closed = True
                        await self._hang_up()
                finally:
                    tg.cancel_scope.cancel()  # the reader, whose connection is closed
        finally:
            self._tg = None
            self._close_events()

    async def _hang_up(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            await self._let_go(link)
            link.fail_all("the client is closed")

    def _close_events(self) -> None:
        # iterators hold clones of the receiving end: they end after what is buffered
        for stream in (self._events_in, self._events_out):
            if stream is not None:
                stream.close()

    # -- the API ---------------------------------------------------------------------

    async def open(self, name: str, config: Mapping[str, Any] | None = None) -> SessionHandle:
        """Open (or resume) a session; reopened automatically after a reconnect."""
        await self.request(SessionOpen(name, dict(config) if config is not None else None))
        return self._sessions[name]

    async def ping(self) -> Event:
        return await self.request(Ping())

    async def events(self) -> AsyncIterator[Event]:
        """Pushed compaction events, in arrival order, until the client is closed."""
        if self._events_out is None:
            raise ClientError("closed", "use 'async with Client(...)' before asking for events")
        with self._events_out.clone() as events:
            async for event in events:
                yield event

    async def request(self, message: ClientMessage) -> Event:
        """Send one message and return its reply as the server sent it; raises ``ClientError``
        for an ``error`` reply (see :meth:`exchange`)."""
        reply, sent = await self.exchange(message)
        if isinstance(reply, ErrorReply):
            raise ClientError(reply.code, reply.message, reply=sent)
        return sent

    async def exchange(self, message: ClientMessage) -> Received:
        """Send one message and return its reply, typed and as the server sent it; an ``error``
        reply is returned, not raised.

        A ``rate_limited`` reply with a ``retry_after`` is waited out and the message sent
        again (the server stored nothing), within ``rate_limit_wait`` seconds in all; a
        request in flight when the connection dropped is sent again once when that is
        safe (see the module docstring). Raises ``ClientError`` when no reply could be had:
        the connection (``ConnectionLost``), the time (``RequestTimeout``), or a reply the
        codec cannot read (``bad_reply``)."""
        retry_safe = _retry_safe(message)
        resent = False
        waited = 0.0
        while True:
            link = await self._ensure_link()
            try:
                reply = await self._roundtrip(link, message)
            except ConnectionLost:
                if not resent and retry_safe and self.reconnect and not self._closed:
                    resent = True
                    log.info("voice_context_client_retrying", type=message.type, session=message.session)
                    continue
                raise
            delay = _retry_after(reply[0])
            if delay is not None and waited + delay <= self.rate_limit_wait:
                waited += delay
                self.rate_limit_waits += 1
                await anyio.sleep(delay)
                continue
            self._follow(message, reply)
            return reply

    def _follow(self, message: ClientMessage, received: Received) -> None:
        """Keep the sessions the server opened for this client, with the config they were
        opened with (what a reconnect opens again); let go of those it closed or deleted."""
        reply, sent = received
        if isinstance(reply, ErrorReply):
            return
        if isinstance(message, SessionOpen):
            handle = self._sessions.get(message.session)
            if handle is None:
                self._sessions[message.session] = SessionHandle(self, message.session, message.config, sent)
            else:
                handle.config, handle.opened = message.config, sent
        elif isinstance(message, SessionClose | SessionDelete):
            self._sessions.pop(message.session, None)

    # -- internals -------------------------------------------------------------------

    async def _ensure_link(self) -> _Link:
        link = self._link
        if link is not None and link.alive:
            return link
        if self._closed:
            raise ClientError("closed", "the client is closed")
        # refused before queueing behind the call that is connecting: no wait while the circuit is open
        self._refuse_while_open()
        async with self._lock:
            if self._link is not None and self._link.alive:
                return self._link
            if self._closed:
                raise ClientError("closed", "the client is closed")
            first = self._link is None and self.reconnects == 0
            if not first and not self.reconnect:
                raise ConnectionLost("the connection dropped and reconnecting is turned off")
            self._link = await self._connect_and_resume(first)
            if not first:
                self.reconnects += 1
            return self._link

    def _refuse_while_open(self) -> None:
        wait = self.breaker.wait(self.clock())
        if wait == math.inf:
            raise ConnectionLost(f"{self.url} did not answer; another call is trying it again")
        if wait > 0:
            raise ConnectionLost(f"{self.url} did not answer; the next try is in {wait:.2f}s")

    async def _connect_and_resume(self, first: bool) -> _Link:
        attempts = self.reconnect_attempts if self.reconnect else 1
        last: Exception | None = None
        for attempt in range(attempts):
            if (
                attempt
            ):  # this call failed to connect: it sleeps the breaker's backoff, the others are refused
                wait = self.breaker.wait(self.clock())
                if wait == math.inf:
                    break  # a client sharing the breaker is probing
                await anyio.sleep(wait)
            else:
                self._refuse_while_open()
            self.breaker.attempt(self.clock())
            link: _Link | None = None
            try:
                link = await self._connect()
                assert self._tg is not None
                await self._tg.start(self._read, link)  # reading before the first request goes out
                await self._resume(link)
            except (ConnectionLost, OSError, TimeoutError, InvalidHandshake) as exc:
                last = exc  # refused, unreachable, or dropped (or silent) before the sessions were open again
                self._unreachable(repr(exc))
                await self._let_go(link)
                continue
            except ClientError:
                self._reached()  # the server answered, and refused: it is not down
                await self._let_go(link)
                raise
            except BaseException:
                self._unreachable("cancelled before the server answered")
                await self._let_go(link)
                raise
            self._reached()
            if not first:
                log.info("voice_context_client_resumed", sessions=len(self._sessions))
            return link
        tries = f"{attempts} attempts" if attempts > 1 else "1 attempt"
        raise ConnectionLost(f"cannot reach {self.url} after {tries}: {last}")

    async def _let_go(self, link: _Link | None) -> None:
        if link is not None:
            with anyio.move_on_after(self.open_timeout, shield=True):
                await link.ws.close()

    def _unreachable(self, error: str) -> None:
        now = self.clock()
        if self.breaker.failed(now):
            log.warning(
                "voice_context_client_circuit_opened",
                url=self.url,
                error=error,
                retry_in=round(self.breaker.retry_at - now, 3),
            )

    def _reached(self) -> None:
        failures = self.breaker.failures
        down = self.breaker.succeeded(self.clock())
        if down is not None:
            log.info(
                "voice_context_client_circuit_closed",
                url=self.url,
                down_seconds=round(down, 3),
                failures=failures,
            )

    async def _connect(self) -> _Link:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
        try:
            ws = await connect(
                self.url,
                additional_headers=headers,
                open_timeout=self.open_timeout,
                max_size=MAX_REPLY_BYTES,
                create_connection=ReleasedClientConnection,
            )
        except InvalidURI as exc:
            raise ClientError("bad_url", str(exc)) from None
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status == 401:
                raise ClientError("unauthorized", "the server refused the token") from None
            if status == 404:
                raise ClientError("not_found", f"no voice-context endpoint at {self.url}") from None
            raise
        return _Link(ws)

    async def _resume(self, link: _Link) -> None:
        for handle in list(self._sessions.values()):
            reply, sent = await self._roundtrip(link, SessionOpen(handle.name, handle.config))
            if isinstance(reply, ErrorReply):
                raise ClientError(reply.code, reply.message, reply=sent)
            handle.opened = sent

    async def _roundtrip(self, link: _Link, message: ClientMessage) -> Received:
        msg_id = next(self._ids)
        waiter = _Waiter()
        link.pending[msg_id] = waiter
        try:
            try:
                await link.ws.send(codec.encode(replace(message, id=msg_id)))
            except ConnectionClosed:
                link.fail_all("the connection dropped")
            with anyio.move_on_after(self.request_timeout):
                await waiter.done.wait()
            if not waiter.done.is_set():
                raise RequestTimeout(f"no reply to {message.type} in {self.request_timeout:g}s")
        finally:
            link.pending.pop(msg_id, None)
        if waiter.error is not None:
            raise waiter.error
        assert waiter.reply is not None
        return waiter.reply

    async def _read(self, link: _Link, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        reason = "the connection dropped"
        task_status.started()
        try:
            async for frame in link.ws:
                try:
                    message, sent = codec.parse_reply(frame)
                except DecodeError as exc:
                    self._unreadable(link, exc)
                    continue
                if isinstance(message, Compacted | CompactionFailure):
                    self._deliver(sent)
                    continue
                waiter = link.pending.get(message.id) if isinstance(message.id, int) else None
                if waiter is not None and not waiter.done.is_set():
                    waiter.reply = (message, sent)
                    waiter.done.set()
                elif isinstance(message, ErrorReply):
                    log.warning("voice_context_client_error", code=message.code, id=message.id)
        except ConnectionClosed:
            pass
        finally:
            code = link.ws.close_code
            if code is not None:
                detail = f" {link.ws.close_reason}" if link.ws.close_reason else ""
                reason = f"the connection closed ({code}{detail})"
            link.fail_all(reason)

    @staticmethod
    def _unreadable(link: _Link, exc: DecodeError) -> None:
        """A frame the codec cannot read: the request it answers, when it says which, fails."""
        log.warning("voice_context_client_bad_frame", code=exc.code, error=exc.message[:200], id=exc.id)
        waiter = link.pending.get(exc.id) if isinstance(exc.id, int) else None
        if waiter is not None and not waiter.done.is_set():
            waiter.error = ClientError("bad_reply", f"the server's reply cannot be read: {exc.message}")
            waiter.done.set()

    def _deliver(self, event: Event) -> None:
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("voice_context_client_callback_failed")
        if self._events_in is None:
            return
        try:
            self._events_in.send_nowait(event)
        except anyio.WouldBlock:
            self.events_dropped += 1
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass


class SessionHandle:
    """One open session on a :class:`Client`. ``opened`` is the last ``session.opened`` reply."""

    def __init__(self, client: Client, name: str, config: Mapping[str, Any] | None, opened: Event) -> None:
        self.client = client
        self.name = name
        self.config = config
        self.opened = opened

    def __repr__(self) -> str:
        return f"<SessionHandle {self.name!r}>"

    @property
    def resumed(self) -> bool:
        return bool(self.opened.get("resumed"))

    async def append_turn(
        self,
        speaker: str,
        role: Role,
        text: str,
        at: float | None = None,
        id: str | None = None,
    ) -> int:
        """Append a finalized turn; returns its index. Give ``id`` to make retries exactly-once."""
        when = time.time() if at is None else at
        reply, sent = await self.client.exchange(TurnAppend(self.name, Turn(speaker, role, text, when, id)))
        if isinstance(reply, ErrorReply):
            raise ClientError(reply.code, reply.message, reply=sent)
        if not isinstance(reply, TurnStored):
            raise ClientError("bad_reply", f"turn.append was answered with {reply.type}", reply=sent)
        return reply.index

    async def append_note(
        self, text: str, at: float | None = None, speaker: str | None = None, source: str | None = None
    ) -> Event:
        """Append a screen-watch note; the reply says how many notes are live and pending."""
        when = time.time() if at is None else at
        return await self.client.request(NoteAppend(self.name, Note(text, when, speaker, source)))

    async def context(
        self,
        format: Format = "messages",
        budget_chars: int | None = None,
        base_instructions: str | None = None,
        facts: Sequence[str] | None = None,
        query: str | None = None,
        *,
        budget_tokens: int | None = None,
    ) -> Event:
        """The context for the next reply: ``messages`` or ``instructions``, plus the summary and cursor.
        ``query`` is what recall looks for (by default the newest user turn); ``budget_tokens``
        bounds it in the session's tokenizer's count, beside or instead of ``budget_chars``."""
        message = ContextGet(
            self.name,
            format,
            budget_chars,
            base_instructions or "",
            tuple(facts or ()),
            query=query,
            budget_tokens=budget_tokens,
        )
        return await self.client.request(message)

    async def overflow(
        self,
        limit_tokens: int | None = None,
        format: Format = "messages",
        budget_chars: int | None = None,
        base_instructions: str | None = None,
        facts: Sequence[str] | None = None,
        query: str | None = None,
    ) -> Event:
        """The bot's model refused its context as too long: compact at once and get a context
        within ``limit_tokens``. When even the base instructions and the turns that must stay
        do not fit, raises :class:`ClientError` with code ``too_large`` (its ``reply`` has
        ``"limit": "limit_tokens"`` and ``needed``, the tokens they take)."""
        message = ContextOverflow(
            self.name, limit_tokens, format, budget_chars, base_instructions or "", tuple(facts or ()), query
        )
        return await self.client.request(message)

    async def handoff(
        self,
        limit_chars: int | None = None,
        base_instructions: str | None = None,
        facts: Sequence[str] | None = None,
        query: str | None = None,
        last_turns: int = LAST_TURNS,
    ) -> Event:
        """What a fresh provider session needs to go on: ``instructions`` within ``limit_chars``
        (ending with the questions still open), the newest ``last_turns`` turns, ``open_questions``."""
        message = SessionHandoff(
            self.name, limit_chars, base_instructions or "", tuple(facts or ()), query, last_turns
        )
        return await self.client.request(message)

    async def state(self) -> Event:
        return await self.client.request(SessionStateGet(self.name))

    async def pin(self, index: int, kind: str = "other", reason: str = "", source: str = "manual") -> Event:
        """Pin the turn at ``index`` as a landmark: never paraphrased, shown whole in later contexts."""
        return await self.client.request(LandmarkPin(self.name, index, kind, reason, source))

    async def unpin(self, index: int) -> Event:
        """Unpin the landmark at ``index``; the reply's ``removed`` says whether there was one."""
        return await self.client.request(LandmarkUnpin(self.name, index))

    async def close(self) -> None:
        """Stop using the session on this client (its state stays on the server's store)."""
        await self.client.request(SessionClose(self.name))

    async def delete(self) -> None:
        """Forget the session on the server: its turns, summary, notes and recording."""
        await self.client.request(SessionDelete(self.name))


def _retry_safe(message: ClientMessage) -> bool:
    if isinstance(message, TurnAppend):
        return message.turn.id is not None
    return not isinstance(message, NoteAppend)


def _retry_after(reply: Reply) -> float | None:
    """The seconds a ``rate_limited`` reply asks to wait before sending again, if it says."""
    if not isinstance(reply, ErrorReply) or reply.code != RATE_LIMITED:
        return None
    delay = reply.retry_after
    if delay is None or not 0 <= delay < math.inf:
        return None
    return delay


@contextmanager
def _as_itself(raised: BaseException | None) -> Iterator[None]:
    """Hand out the error a task group collected as itself (see :func:`_unwrap`)."""
    try:
        yield
    except BaseExceptionGroup as group:
        error = _unwrap(group, raised)
        raise error from error.__cause__


def _unwrap(group: BaseExceptionGroup[BaseException], raised: BaseException | None) -> BaseException:
    """The error to raise for what a task group collected: the block's own error, or the one error."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        error = pending.pop()
        if isinstance(error, BaseExceptionGroup):
            pending.extend(reversed(error.exceptions))
        else:
            leaves.append(error)
    if raised is not None and any(leaf is raised for leaf in leaves):
        return raised
    return leaves[0] if len(leaves) == 1 else group


__all__ = [
    "Client",
    "ClientError",
    "ConnectionLost",
    "Event",
    "EventCallback",
    "Received",
    "RequestTimeout",
    "SessionHandle",
]
