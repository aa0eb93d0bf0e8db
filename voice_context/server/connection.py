"""One websocket connection: its outbox and the scheduler that answers its requests.

A connection's requests for one session are answered one at a time, in the order they
arrived; requests for different sessions run side by side, so a turn waiting for its commit
(see group commit in :mod:`voice_context.store`) holds up neither the other sessions' turns,
which join its group, nor their contexts. A ``ping`` is answered once everything read before
it is. A connection has at most ``REQUESTS_IN_PROGRESS`` requests (1 MiB of them) read and
not yet answered, answered by at most ``WORKERS`` tasks that live as long as the connection
(a task per request would cost more than many requests do). Compaction events for the
sessions a connection opened go into the same outbox, never blocking the manager: when a
connection's outbox is full, the event is dropped and counted.

A reply goes to the connection at once when nothing is queued ahead of it and the socket's
buffer has room for it (the common case: no task switch); otherwise it waits in the outbox, whose
frames a send loop hands over in order. A frame that cannot be handed to the connection within
``send_timeout`` (a client that reads nothing, or a peer gone without a word, has filled the
socket's buffers) ends the connection at once: the transport is aborted, without a closing
handshake that would wait on the same full buffers. Once a reply cannot be delivered (that,
or the connection closed), the requests not yet started are dropped, the ones in progress
finish, and the connection's sessions are let go (by the :class:`Dispatcher`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio
from anyio.abc import TaskGroup, TaskStatus
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from voice_context import codec
from voice_context.codec import (
    INTERNAL,
    ClientMessage,
    Compacted,
    CompactionFailure,
    DecodeError,
    ErrorReply,
    Pushed,
)
from voice_context.config import ServerSettings
from voice_context.logs import get_logger
from voice_context.manager import CompactionEvent
from voice_context.server.metrics import Metrics

log = get_logger("voice_context.server")


OUTBOX_FRAMES = 256
#: Requests of one connection read and not yet answered, at most (past it, reading waits).
REQUESTS_IN_PROGRESS = 256
#: Tasks answering one connection's requests, at most (each works on one session at a time).
WORKERS = 64
#: Seconds a closing handshake, or the release of a session at the end, may take.
SHUTDOWN_GRACE = 5.0
#: The most a websocket frame's header adds to its payload (a server's frames are not masked).
FRAME_HEADER_BYTES = 10

Close = tuple[int, str]


def pushed(event: CompactionEvent) -> Pushed:
    """A compaction event of the manager's as the message pushed to the sessions' connections."""
    latency = round(event.latency, 6)
    if event.kind == "completed":
        return Compacted(
            event.session,
            event.cursor,
            event.covered_through,
            event.summary_chars,
            latency,
            event.old_cursor,
            event.trigger,
        )
    return CompactionFailure(
        event.session,
        event.cursor,
        event.covered_through,
        event.summary_chars,
        latency,
        event.error,
        event.retryable,
        event.failures,
        event.retry_at,
    )


class Dispatcher(Protocol):
    """What answers a connection's requests (see :mod:`voice_context.server.handlers`)."""

    async def dispatch(self, conn: Connection, message: ClientMessage, sent: dict[str, Any]) -> None:
        """Answer one request on ``conn`` (its reply, or an ``error``)."""

    async def reject(self, conn: Connection, error: ErrorReply) -> None:
        """Answer with an ``error`` a frame that is no request."""

    async def release(self, conn: Connection) -> None:
        """The connection has ended: let go of the sessions it holds."""


@dataclass(eq=False)
class Connection:
    """One client's connection: its outbox, the sessions it holds, and its requests in progress."""

    id: str
    ws: ServerConnection
    owner: str | None
    settings: ServerSettings
    metrics: Metrics
    sessions: set[str] = field(default_factory=set)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    #: characters queued and not yet sent (past ``settings.max_outbox_chars``, reading stops)
    queued: int = 0
    #: each session's requests read and not yet answered, in order (the first is being answered)
    queues: dict[str, deque[tuple[ClientMessage, dict[str, Any], int]]] = field(default_factory=dict)
    #: requests read and not yet answered (and their characters); past either limit, reading waits
    working: int = 0
    working_chars: int = 0
    max_working: int = REQUESTS_IN_PROGRESS
    max_working_chars: int = 1 << 20
    #: sessions with requests waiting and no worker on them; the workers, and a wake-up for each
    #: idle one (a session ready wakes one of them, not all)
    ready: deque[str] = field(default_factory=deque)
    workers: int = 0
    idle: deque[anyio.Event] = field(default_factory=deque)
    #: no reply can reach the client any more: what is left unstarted is dropped
    lost: bool = False
    _recv_scope: anyio.CancelScope | None = None
    _waiting: bool = False  # the read loop waits for room or for the next frame
    _drained: anyio.Event = field(default_factory=anyio.Event)
    _idle: anyio.Event = field(default_factory=anyio.Event)
    _reading_done: bool = False

    def __post_init__(self) -> None:
        self.outbox: MemoryObjectSendStream[str]
        self.inbox: MemoryObjectReceiveStream[str]
        self.outbox, self.inbox = anyio.create_memory_object_stream[str](OUTBOX_FRAMES)
        self._low_water, self._high_water = self.ws.transport.get_write_buffer_limits()

    def __repr__(self) -> str:
        return (
            f"<Connection {self.id} sessions={len(self.sessions)} working={self.working}"
            f" queued={self.queued}{' lost' if self.lost else ''}>"
        )

    @property
    def max_queued(self) -> int:
        return self.settings.max_outbox_chars

    # -- the outbox ---------------------------------------------------------------

    def push(self, event: CompactionEvent) -> None:
        """A manager listener: queue the event, never wait."""
        if event.session not in self.sessions:
            return
        frame = codec.encode_event(pushed(event))
        try:
            if self.queued + len(frame) > self.max_queued:
                raise anyio.WouldBlock
            self.outbox.send_nowait(frame)
            self.queued += len(frame)
        except anyio.WouldBlock:
            self.metrics.pushes_dropped.inc()
            log.warning("voice_context_push_dropped", connection=self.id, session=event.session)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def reply(self, frame: str) -> None:
        """Send a reply, before any event it causes: at once when nothing is queued ahead of it
        and the connection can take it without waiting; otherwise through the outbox."""
        if self._takes_at_once(frame):
            try:
                await self.ws.send(frame)  # no checkpoint: the transport takes it whole (see below)
            except ConnectionClosed:  # the reader sees it too
                self._lose()
            return
        self.queued += len(frame)
        try:
            self.outbox.send_nowait(frame)  # no checkpoint: queued before any event it caused
        except anyio.WouldBlock:
            try:
                await self.outbox.send(frame)
            except BaseException:  # never queued
                self.queued -= len(frame)
                raise

    def _takes_at_once(self, frame: str) -> bool:
        """Whether ``frame`` can go to the connection now, in order, without a wait: nothing is
        queued or being handed over ahead of it (``queued`` counts a frame until the send loop
        has handed it over), and the transport's buffer is at or under its low-water mark (so
        not paused) and stays under its high-water mark with the frame in it, so the send
        returns without waiting for the client (no ``send_timeout`` to watch)."""
        if self.queued or self.lost:
            return False
        buffered = self.ws.transport.get_write_buffer_size()
        size = len(frame) if frame.isascii() else 4 * len(frame)
        return buffered <= self._low_water and buffered + size + FRAME_HEADER_BYTES <= self._high_water

    def _sent(self, frame: str) -> None:
        self.queued -= len(frame)
        self._drained.set()

    def _lose(self) -> None:
        """No reply can reach the client any more: nobody waits for room to reply."""
        self.lost = True
        self._drained.set()

    async def _room_to_reply(self) -> None:
        """Wait until what is queued for this client is under the limit: a client that does
        not read its replies gets its requests read no faster than it reads."""
        while self.queued >= self.max_queued and not self.lost:
            # the read loop and every worker may wait here together: an event is replaced
            # only once set, so each waits on the one the next send sets
            if self._drained.is_set():
                self._drained = anyio.Event()
            await self._drained.wait()

    # -- requests in progress -----------------------------------------------------------

    def _finished(self, chars: int) -> None:
        self.working -= 1
        self.working_chars -= chars
        self._idle.set()

    async def _all_answered(self) -> None:
        while self.working:
            await self._next_finished()

    async def _room_to_work(self) -> None:
        """Wait until this connection's requests in progress are under both limits."""
        while self.working >= self.max_working or self.working_chars >= self.max_working_chars:
            await self._next_finished()

    async def _next_finished(self) -> None:
        if self._idle.is_set():
            self._idle = anyio.Event()
        await self._idle.wait()

    def stop_reading(self) -> None:
        """Read no more requests (a shutdown): those read are answered, then the connection closes."""
        if self._recv_scope is not None and self._waiting:
            self._recv_scope.cancel()

    # -- the loops ------------------------------------------------------------------------

    async def serve(self, dispatcher: Dispatcher, stopping: Callable[[], bool]) -> None:
        """Read, answer and send until the client or a shutdown ends the connection; then
        close it with the code that says why and let its sessions go."""
        close: Close | None = None
        try:
            with self.scope:
                async with anyio.create_task_group() as tg:
                    await tg.start(self._send_loop)
                    try:
                        close = await self._read_loop(dispatcher, stopping)
                    finally:
                        self.outbox.close()  # the send loop drains what is queued, then ends
            if self.scope.cancelled_caught:  # a shutdown that could not wait any longer
                close = (CloseCode.GOING_AWAY, "server shutting down")
            if close is not None:
                with anyio.move_on_after(SHUTDOWN_GRACE):
                    await self.ws.close(*close)
            log.info("voice_context_connection_closed", code=self.ws.close_code, sessions=len(self.sessions))
        finally:
            self.outbox.close()
            self.inbox.close()
            await dispatcher.release(self)

    async def _send_loop(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Hand each queued frame to the connection, each within ``send_timeout``; past it,
        or once the connection is closed, drain the outbox without sending."""
        timeout = self.settings.send_timeout
        async with self.inbox:
            task_status.started()
            async for frame in self.inbox:
                if not self.lost:
                    with anyio.move_on_after(timeout) as waited:
                        try:
                            await self.ws.send(frame)
                        except ConnectionClosed:  # the reader sees it too
                            self._lose()
                    if waited.cancelled_caught:
                        self._cut_off()
                self._sent(frame)

    def _cut_off(self) -> None:
        """End a connection whose client has not taken a frame in ``send_timeout``: abort
        the transport (a closing handshake would wait on the same full buffers)."""
        log.warning(
            "voice_context_send_timed_out", timeout=self.settings.send_timeout, queued_chars=self.queued
        )
        self.metrics.errors.labels(code="send_timeout").inc()
        self._lose()
        self.ws.transport.abort()  # the reader's recv ends with ConnectionClosed

    async def _read_loop(self, dispatcher: Dispatcher, stopping: Callable[[], bool]) -> Close | None:
        """Read frames and hand each to its session's queue; returns the close code to send, if any.

        The block ends only once every request read has been answered.
        """
        close: Close | None = None
        async with anyio.create_task_group() as work:
            try:
                close = await self._read_frames(dispatcher, stopping, work)
            finally:
                self._reading_done = True  # idle workers leave; busy ones finish their sessions first
                while self.idle:
                    self.idle.popleft().set()
        return close

    async def _read_frames(
        self, dispatcher: Dispatcher, stopping: Callable[[], bool], work: TaskGroup
    ) -> Close | None:
        # one scope for the whole loop (a scope per frame costs more than a small request does):
        # `stop_reading` cancels it only while the loop waits for room or for the next frame, never
        # while a frame read is routed (the loop then sees `stopping()` and ends)
        with anyio.CancelScope() as scope:
            self._recv_scope = scope
            try:
                while not stopping():
                    self._waiting = True
                    try:
                        await self._room_to_reply()
                        await self._room_to_work()
                        frame = await self.ws.recv()
                    except ConnectionClosed:
                        return None
                    finally:
                        self._waiting = False
                    if not isinstance(frame, str):
                        log.info("voice_context_binary_frame", size=len(frame))
                        self.metrics.errors.labels(code="binary_frame").inc()
                        return CloseCode.UNSUPPORTED_DATA, "binary frames are not accepted: send JSON text"
                    await self._route(dispatcher, frame, work)
            finally:
                self._recv_scope = None
        return CloseCode.GOING_AWAY, "server shutting down"

    async def _route(self, dispatcher: Dispatcher, frame: str, work: TaskGroup) -> None:
        """Parse a frame and queue it behind the requests of its session on this connection."""
        try:
            message, sent = codec.parse(frame, max_text_chars=self.settings.max_text_chars)
        except DecodeError as exc:
            await dispatcher.reject(self, ErrorReply(exc.code, exc.message, exc.id, exc.session))
            return
        except Exception:  # the last guard: a bug answers `internal` and the connection carries on
            log.exception("voice_context_request_failed", type=None)
            await dispatcher.reject(self, ErrorReply(INTERNAL, "internal error", retryable=False))
            return
        if message.session is None:  # ping: a barrier, answered once all read before it are
            await self._all_answered()
            await dispatcher.dispatch(self, message, sent)
            return
        queue = self.queues.get(message.session)
        self.working += 1
        self.working_chars += len(frame)
        if queue is not None:
            queue.append((message, sent, len(frame)))
            return
        self.queues[message.session] = deque([(message, sent, len(frame))])
        self.ready.append(message.session)
        if self.idle:  # one idle worker for each session ready
            self.idle.popleft().set()
        elif self.workers < WORKERS:
            self.workers += 1  # workers live as long as the connection: no task per request
            work.start_soon(self._worker, dispatcher)

    async def _worker(self, dispatcher: Dispatcher) -> None:
        """Take a session with requests waiting, answer them in order until none is left; repeat."""
        while True:
            while not self.ready:
                if self._reading_done:
                    return
                wake = anyio.Event()
                self.idle.append(wake)
                try:
                    await wake.wait()
                finally:
                    if not wake.is_set():  # cancelled while idle
                        self.idle.remove(wake)
            name = self.ready.popleft()
            queue = self.queues[name]
            try:
                while queue:
                    message, sent, size = queue[0]
                    try:
                        await self._room_to_reply()  # a client that does not read gets no more answers
                        if not self.lost:  # a reply nobody can receive is not worth working out
                            await dispatcher.dispatch(self, message, sent)
                    finally:
                        queue.popleft()
                        self._finished(size)
            finally:
                del self.queues[name]
