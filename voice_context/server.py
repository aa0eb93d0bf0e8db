"""The websocket service: protocol v1 at ``/v1``, ``/healthz`` and ``/metrics`` on the same port.

A thin shell around :class:`~voice_context.manager.SessionManager`. Frames
become typed messages in :mod:`voice_context.codec`; the decisions that are
not the manager's (rate limits, duplicate turns, file names for recordings)
are small pure functions and classes here, fed the time as plain data.

Lifetimes are lexical::

    async with Server(settings) as server:
        print(server.url)            # ws://127.0.0.1:8765/v1 (port 0 picks a free one)
        await server.serve_forever() # until server.request_shutdown() or cancellation

Leaving the block shuts down gracefully: stop accepting, let each request in
progress finish and its reply go out, close every connection with 1001, then
let the session manager land (or give up on) the compactions in flight, and
close the store if the server opened it.

A connection's requests for one session are answered one at a time, in the
order they arrived; requests for different sessions run side by side, so a
turn waiting for its commit (see group commit in :mod:`voice_context.store`)
holds up neither the other sessions' turns, which join its group, nor their
contexts. A ``ping`` is answered once everything read before it is. A
connection has at most ``REQUESTS_IN_PROGRESS`` requests (1 MiB of them) read
and not yet answered, answered by at most ``WORKERS`` tasks that live as long as
the connection (a task per request would cost more than many requests do).
Compaction events for the sessions a connection opened go into the same outbox,
never blocking the manager: when a connection's outbox is full, the event is
dropped and counted.

A frame that cannot be handed to the connection within ``send_timeout`` (a client
that reads nothing, or a peer gone without a word, has filled the socket's
buffers) ends the connection at once: the transport is aborted, without a closing
handshake that would wait on the same full buffers. Once a reply cannot be
delivered (that, or the connection closed), the requests not yet started are
dropped, the ones in progress finish, and the connection's sessions and its place
under ``max_connections`` are let go. Keepalive pings find a peer that vanished
from an idle connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import itertools
import math
import socket
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs, quote, unquote, urlsplit

import anyio
import anyio.to_thread
import orjson
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from websockets.asyncio.server import Server as WebsocketServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode
from websockets.http11 import Request, Response

from voice_context import codec, inspector
from voice_context.codec import (
    BAD_REQUEST,
    INTERNAL,
    RATE_LIMITED,
    UNAUTHORIZED,
    UNKNOWN_SESSION,
    ClientMessage,
    ContextGet,
    DecodeError,
    LandmarkPin,
    LandmarkUnpin,
    MessageId,
    NoteAppend,
    Ping,
    SessionClose,
    SessionDelete,
    SessionOpen,
    SessionStateGet,
    TurnAppend,
)
from voice_context.collector import Load
from voice_context.config import Settings, make_summarizer
from voice_context.core.config import check_client_overrides
from voice_context.core.session import Session
from voice_context.core.turns import Turn
from voice_context.descriptors import DescriptorGuard, refusal_body
from voice_context.errors import (
    ConfigError,
    ContextOverflow,
    RateLimited,
    SessionClosed,
    StoreError,
    UnknownSession,
)
from voice_context.manager import CompactionEvent, SessionManager
from voice_context.metrics import CONTENT_TYPE, Metrics
from voice_context.recall.embedding import load_embedder
from voice_context.sources import HTTPSource, with_sources
from voice_context.store import open_store
from voice_context.store.base import Store
from voice_context.summarizers.base import Summarizer

log = structlog.get_logger("voice_context.server")

PATH = "/v1"
OUTBOX_FRAMES = 256
#: Requests of one connection read and not yet answered, at most (past it, reading waits).
REQUESTS_IN_PROGRESS = 256
#: Tasks answering one connection's requests, at most (each works on one session at a time).
WORKERS = 64
DUPLICATE_LOOKBACK = 32
SHUTDOWN_GRACE = 5.0
#: Past this many remembered rate limits, those of idle sessions whose buckets are full are forgotten.
LIMITS_KEPT = 4096
TICK_SECONDS = 15.0
"""How often the server starts the tier rolls the time of day made due (see ``SessionManager.tick``)."""


# -- pure decisions ----------------------------------------------------------------


class TokenBucket:
    """Turns per second for one session: ``rate`` tokens a second, at most ``burst`` saved.

    ``take(now)`` spends a token and returns 0.0, or returns how many seconds
    until one is available (and spends nothing). ``now`` is any monotonic time.
    """

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.updated = now

    def wait(self, now: float) -> float:
        """Seconds until a token is available at ``now`` (0.0 if one is), spending nothing."""
        tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def full(self, now: float) -> bool:
        """Whether the bucket has refilled to ``burst`` by ``now``: then it remembers nothing."""
        return self.tokens + max(0.0, now - self.updated) * self.rate >= self.burst

    def take(self, now: float) -> float:
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = max(self.updated, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


def find_duplicate(session: Session, turn: Turn, lookback: int = DUPLICATE_LOOKBACK) -> int | None:
    """The index of a recent turn identical to ``turn`` (same ``id`` and content), if any.

    Only turns that carry an ``id`` are ever duplicates: a bot that retries a
    turn with the same ``id`` gets the first index back instead of a second copy.
    """
    if turn.id is None:
        return None
    held = session.verbatim_turns
    first = session.total_turns - len(held)
    for offset in range(len(held) - 1, max(-1, len(held) - 1 - lookback), -1):
        if held[offset] == turn:
            return first + offset
    return None


def recording_name(session: str) -> str:
    """A file name for a session's recording, safe for any session name.

    Percent-encoding of the name (a leading dot too), with ``.jsonl``; names
    whose encoding is long are cut and given a hash suffix so they stay unique.
    """
    safe = quote(session, safe="-_.")
    if safe.startswith("."):
        safe = "%2E" + safe[1:]
    if len(safe) > 160:
        digest = hashlib.sha256(session.encode()).hexdigest()[:16]
        safe = f"{safe[:140].rstrip('%')}~{digest}"
    return safe + ".jsonl"


def replica_name(configured: str | None, port: int) -> str | None:
    """Who this server is to the store's leases: the configured name, else ``host:port``
    when the port is fixed (so a restart is the same replica), else ``None`` (random)."""
    if configured:
        return configured
    return f"{socket.gethostname()}:{port}" if port else None


def bearer_token(headers: Headers) -> str | None:
    value = headers.get("Authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def token_matches(token: str | None, tokens: tuple[str, ...]) -> bool:
    if token is None:
        return False
    matched = False
    for candidate in tokens:  # compare against all of them, in constant time each
        matched |= hmac.compare_digest(token.encode(), candidate.encode())
    return matched


def owner_of(token: str | None) -> str | None:
    """Who owns the sessions opened under a token: a digest of it (tokens are never stored)."""
    if token is None:
        return None
    return "token:" + hashlib.sha256(token.encode()).hexdigest()[:32]


# -- the shell -----------------------------------------------------------------------


class _Reject(Exception):
    """A request refused by the server (not the manager): becomes an ``error`` reply."""

    def __init__(self, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.extra = extra


@dataclass(eq=False)
class _SessionLimits:
    bucket: TokenBucket
    lock: anyio.Lock = field(default_factory=anyio.Lock)


@dataclass(eq=False)
class _OwnerLimits:
    """What one token spends across all its connections and sessions on this replica."""

    bucket: TokenBucket
    connections: int = 0


@dataclass(eq=False)
class _Connection:
    id: str
    ws: ServerConnection
    owner: str | None
    outbox: MemoryObjectSendStream[str]
    inbox: MemoryObjectReceiveStream[str]
    sessions: set[str] = field(default_factory=set)
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    recv_scope: anyio.CancelScope | None = None
    on_drop: Callable[[], None] = lambda: None
    #: characters queued and not yet sent, and the most allowed before reading stops
    queued: int = 0
    max_queued: int = 1 << 20
    drained: anyio.Event = field(default_factory=anyio.Event)
    #: each session's requests read and not yet answered, in order (the first is being answered)
    queues: dict[str, deque[tuple[ClientMessage, dict[str, Any], int]]] = field(default_factory=dict)
    #: requests read and not yet answered (and their characters); past either limit, reading waits
    working: int = 0
    working_chars: int = 0
    max_working: int = REQUESTS_IN_PROGRESS
    max_working_chars: int = 1 << 20
    #: sessions with requests waiting and no worker on them; the workers, and those waiting for work
    ready: deque[str] = field(default_factory=deque)
    workers: int = 0
    idle_workers: int = 0
    wake: anyio.Event = field(default_factory=anyio.Event)
    reading_done: bool = False
    idle: anyio.Event = field(default_factory=anyio.Event)
    #: no reply can reach the client any more: what is left unstarted is dropped
    lost: bool = False

    def push(self, event: CompactionEvent) -> None:
        """A manager listener: queue the event, never wait."""
        if event.session not in self.sessions:
            return
        frame = codec.encode_event(event)
        try:
            if self.queued + len(frame) > self.max_queued:
                raise anyio.WouldBlock
            self.outbox.send_nowait(frame)
            self.queued += len(frame)
        except anyio.WouldBlock:
            self.on_drop()
            log.warning("voice_context_push_dropped", connection=self.id, session=event.session)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass

    async def reply(self, frame: str) -> None:
        self.queued += len(frame)
        try:
            self.outbox.send_nowait(frame)  # no checkpoint: queued before any event it caused
        except anyio.WouldBlock:
            await self.outbox.send(frame)

    def sent(self, frame: str) -> None:
        self.queued -= len(frame)
        self.drained.set()

    def lose(self) -> None:
        """No reply can reach the client any more: nobody waits for room to reply."""
        self.lost = True
        self.drained.set()

    async def room_to_reply(self) -> None:
        """Wait until what is queued for this client is under the limit: a client that does
        not read its replies gets its requests read no faster than it reads."""
        while self.queued >= self.max_queued and not self.lost:
            # the read loop and every worker may wait here together: an event is replaced
            # only once set, so each waits on the one the next send sets
            if self.drained.is_set():
                self.drained = anyio.Event()
            await self.drained.wait()

    def finished(self, chars: int) -> None:
        self.working -= 1
        self.working_chars -= chars
        self.idle.set()

    async def all_answered(self) -> None:
        while self.working:
            await self._next_finished()

    async def room_to_work(self) -> None:
        """Wait until this connection's requests in progress are under both limits."""
        while self.working >= self.max_working or self.working_chars >= self.max_working_chars:
            await self._next_finished()

    async def _next_finished(self) -> None:
        if self.idle.is_set():
            self.idle = anyio.Event()
        await self.idle.wait()

    def stop_reading(self) -> None:
        if self.recv_scope is not None:
            self.recv_scope.cancel()


class Server:
    """The voice-context websocket server. See the module docstring."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        summarizer: Summarizer | None = None,
        store: Store | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or Settings()
        self._owns_summarizer = summarizer is None
        self.summarizer = summarizer if summarizer is not None else make_summarizer(self.settings.summarizer)
        if self.settings.sources:
            configured = self.settings.sources
            self.summarizer = with_sources(
                self.summarizer,
                [HTTPSource(c.name, c.url, prompt=c.prompt, timeout=c.timeout) for c in configured],
                close_inner=self._owns_summarizer,
            )
            self._owns_summarizer = True  # its sources' connections are this server's to close
        self._owns_store = store is None
        self._store = store
        self._monotonic = monotonic
        self.metrics = Metrics()
        self._journal = inspector.Journal()
        self._manager: SessionManager | None = None
        self._ws: WebsocketServer | None = None
        self._tg: TaskGroup | None = None
        self._stack: AsyncExitStack | None = None
        self._connections: set[_Connection] = set()
        #: connections ended and sessions closed so far (what the collector may reclaim)
        self._released = 0
        self._holders: dict[str, set[_Connection]] = {}
        self._limits: dict[str, _SessionLimits] = {}
        #: one per token that connected (tokens are configured, so these are few)
        self._owners: dict[str, _OwnerLimits] = {}
        self._stopping = False
        self._stopped = anyio.Event()
        self._ids = itertools.count(1)
        self._record_dir = Path(self.settings.server.record_dir) if self.settings.server.record_dir else None
        self._descriptors = DescriptorGuard(
            monotonic=monotonic, on_refuse=lambda how: self.metrics.descriptors_refused.labels(how=how).inc()
        )
        self.port = 0

    # -- lifetime ------------------------------------------------------------------

    @property
    def manager(self) -> SessionManager:
        if self._manager is None:
            raise RuntimeError("the server is not running; use 'async with Server(...)'")
        return self._manager

    @property
    def url(self) -> str:
        host = self.settings.server.host
        if ":" in host:
            host = f"[{host}]"
        return f"ws://{host}:{self.port}{PATH}"

    @property
    def inspector_url(self) -> str:
        """Where a browser finds the inspector (:mod:`voice_context.inspector`)."""
        return "http" + self.url.removeprefix("ws").removesuffix(PATH) + "/inspector"

    @property
    def stopping(self) -> bool:
        """True once a shutdown has begun."""
        return self._stopping

    @property
    def connections(self) -> int:
        return len(self._connections)

    def load(self) -> Load:
        """What this server holds and has let go, for :mod:`voice_context.collector`."""
        sessions = self._manager.sessions if self._manager is not None else 0
        return Load(len(self._connections), sessions, self._released)

    async def __aenter__(self) -> Self:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            cfg = self.settings.server
            store = self._store
            if store is None:
                store = open_store(
                    self.settings.store.url,
                    data_dir=self.settings.store.data_dir,
                    session_ttl=self.settings.store.session_ttl,
                )
                self._store = store
                stack.push_async_callback(store.aclose)
            aclose = getattr(self.summarizer, "aclose", None)
            if self._owns_summarizer and aclose is not None:
                stack.push_async_callback(aclose)
            if self._record_dir is not None:
                self._record_dir.mkdir(parents=True, exist_ok=True)
            manager = SessionManager(
                self.summarizer,
                config=self.settings.session_config(self.summarizer),
                store=store,
                compaction_timeout=self.settings.summarizer.compaction_timeout,
                close_timeout=cfg.shutdown_timeout,
                replica=replica_name(cfg.replica, cfg.port),
                lease_ttl=cfg.lease_ttl,
                recall_ahead=self.settings.recall.ahead,
                # loading (a first use distils the static table: some 20 s) runs off the event loop
                embedder=await anyio.to_thread.run_sync(load_embedder, self.settings.recall.embedder),
            )
            self._manager = await stack.enter_async_context(manager)
            self._journal.attach(manager)
            self.metrics.watch_manager(
                lambda: manager.counters,
                lambda: manager.sessions,
                lambda: manager.in_flight,
                manager.indexing_lags,
            )
            self._tg = await stack.enter_async_context(anyio.create_task_group())
            self._guard_descriptors(stack)
            ticking = anyio.CancelScope()
            self._tg.start_soon(self._tick, ticking)
            stack.callback(ticking.cancel)
            if store.session_ttl is not None:
                retention = anyio.CancelScope()
                self._tg.start_soon(self._retain, store.session_ttl, retention)
                stack.callback(retention.cancel)  # before the task group waits for its tasks
            self._ws = await serve(
                self._handle,
                cfg.host,
                cfg.port,
                process_request=self._process_request,
                max_size=cfg.max_frame_bytes,
                server_header=None,
                ping_interval=cfg.ping_interval,
                ping_timeout=cfg.ping_timeout,
                close_timeout=cfg.send_timeout,
            )
            stack.push_async_callback(self.shutdown)
            self.port = self._ws.sockets[0].getsockname()[1] if self._ws.sockets else cfg.port
        except BaseException:
            await stack.__aexit__(None, None, None)
            raise
        self._stack = stack
        log.info("voice_context_server_listening", url=self.url, summarizer=self.summarizer.model)
        return self

    def _guard_descriptors(self, stack: AsyncExitStack) -> None:
        """Send the event loop's accept failures for want of descriptors to the guard
        (see :mod:`voice_context.descriptors`), until the server stops."""
        guard = self._descriptors
        guard.open()
        stack.callback(guard.close)
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()

        def fallback(context: dict[str, Any]) -> None:
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(guard.exception_handler(fallback))
        stack.callback(loop.set_exception_handler, previous)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None
        try:
            return await stack.__aexit__(exc_type, exc, tb)
        finally:
            self._manager = None
            self._tg = None
            log.info("voice_context_server_stopped")

    async def serve_forever(self) -> None:
        """Wait until the server has shut down (see :meth:`request_shutdown`)."""
        await self._stopped.wait()

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown without waiting for it (safe to call more than once)."""
        if self._tg is not None and not self._stopping:
            self._tg.start_soon(self.shutdown)

    async def shutdown(self) -> None:
        """Stop accepting, finish the requests in progress, close connections with 1001."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        try:
            with anyio.CancelScope(shield=True):
                await self._drain()
        finally:
            self._stopped.set()

    async def _drain(self) -> None:
        ws = self._ws
        if ws is None:
            return
        log.info("voice_context_shutdown_started", connections=len(self._connections))
        ws.close(close_connections=False)  # stop accepting; opening handshakes get a 503
        for conn in list(self._connections):
            conn.stop_reading()
        with anyio.move_on_after(self.settings.server.shutdown_timeout) as waited:
            await ws.wait_closed()
        if waited.cancelled_caught:
            log.warning("voice_context_shutdown_forced", connections=len(self._connections))
            for conn in list(self._connections):
                conn.scope.cancel()
            with anyio.move_on_after(SHUTDOWN_GRACE):
                await ws.wait_closed()
        log.info("voice_context_shutdown_finished")

    # -- HTTP on the same port -------------------------------------------------------

    def _process_request(
        self, connection: ServerConnection, request: Request
    ) -> Response | Coroutine[Any, Any, Response] | None:
        path = urlsplit(request.path).path
        if path == "/healthz":
            status = HTTPStatus.SERVICE_UNAVAILABLE if self._stopping else HTTPStatus.OK
            health = {
                "status": "stopping" if self._stopping else "ok",
                "sessions": self._manager.sessions if self._manager else 0,
                "connections": len(self._connections),
                "in_flight": self._manager.in_flight if self._manager else 0,
            }
            return _response(status, orjson.dumps(health), "application/json")
        if path == "/metrics":
            return _response(HTTPStatus.OK, self.metrics.render(), CONTENT_TYPE)
        if path == "/inspector" or path.startswith("/inspector/"):
            return self._inspector(path, request)  # a coroutine: it may read the store
        if path != PATH:
            missing = {"type": "error", "code": "not_found", "message": f"no such path: {path}"}
            return _response(HTTPStatus.NOT_FOUND, orjson.dumps(missing), "application/json")
        if self._descriptors.short():
            self.metrics.errors.labels(code=RATE_LIMITED).inc()
            self._descriptors.refuse("handshake")
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, refusal_body(), "application/json")
        limit = self.settings.server.max_connections
        if len(self._connections) >= limit:
            self.metrics.errors.labels(code=RATE_LIMITED).inc()
            log.warning("voice_context_connection_refused", connections=len(self._connections))
            full = codec.encode_error(
                RATE_LIMITED,
                f"the server serves {limit} connections at most: try again later",
                limit="connections",
            )
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, full.encode(), "application/json")
        tokens = self.settings.server.auth_tokens
        if tokens and not token_matches(bearer_token(request.headers), tokens):
            self.metrics.errors.labels(code=UNAUTHORIZED).inc()
            log.info("voice_context_unauthorized", remote=_remote(connection))
            denied = codec.encode_error(UNAUTHORIZED, "a valid 'Authorization: Bearer <token>' is required")
            return _response(
                HTTPStatus.UNAUTHORIZED,
                denied.encode(),
                "application/json",
                ("WWW-Authenticate", 'Bearer realm="voice-context"'),
            )
        owner = owner_of(bearer_token(request.headers)) if tokens else None
        held = self._owners[owner].connections if owner in self._owners else 0
        cap = self.settings.server.max_connections_per_owner
        if owner is not None and held >= cap:
            self.metrics.errors.labels(code=RATE_LIMITED).inc()
            log.warning("voice_context_connection_refused", reason="owner_connections", connections=held)
            full = codec.encode_error(
                RATE_LIMITED,
                f"this token has {held} connections open (limit {cap}): close one first",
                limit="owner_connections",
            )
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, full.encode(), "application/json")
        return None

    async def _inspector(self, path: str, request: Request) -> Response:
        """The read-only inspector (:mod:`voice_context.inspector`), behind the same tokens: a
        token comes as ``Authorization: Bearer`` or, for a browser, as ``?token=``."""
        tokens = self.settings.server.auth_tokens
        query = parse_qs(urlsplit(request.path).query)
        asked = query.get("token", [])
        token = bearer_token(request.headers) or (asked[0] if asked else None)
        if tokens and not token_matches(token, tokens):
            self.metrics.errors.labels(code=UNAUTHORIZED).inc()
            denied = codec.encode_error(UNAUTHORIZED, "the inspector needs a valid token (?token=...)")
            return _response(HTTPStatus.UNAUTHORIZED, denied.encode(), "application/json")
        owner = owner_of(token) if tokens else None
        manager, store = self._manager, self._store
        if path == "/inspector":
            return _response(HTTPStatus.OK, inspector.page(), "text/html; charset=utf-8")
        prefix = "/inspector/api/sessions/"
        # a session's name comes percent-encoded: "/turns" after it is never part of it
        raw = path[len(prefix) :] if path.startswith(prefix) else ""
        turns_of = raw.endswith("/turns")
        name = unquote(raw.removesuffix("/turns"))
        try:
            if manager is not None and store is not None:
                if path == "/inspector/api/sessions":
                    listed = await inspector.session_list(manager, store, owner)
                    return _response(HTTPStatus.OK, orjson.dumps(listed), "application/json")
                if turns_of:
                    start, end = _int(query, "start"), _int(query, "end")
                    turns = await inspector.folded_turns(manager, store, name, owner, start, end)
                    return _response(HTTPStatus.OK, orjson.dumps(turns), "application/json")
                if name:
                    chosen = _int(query, "context") or None
                    view = await inspector.session_view(manager, store, self._journal, name, owner, chosen)
                    return _response(HTTPStatus.OK, orjson.dumps(view), "application/json")
        except UnknownSession:
            missing = codec.encode_error(UNKNOWN_SESSION, f"no session {name!r} for this token")
            return _response(HTTPStatus.NOT_FOUND, missing.encode(), "application/json")
        except StoreError as exc:
            failed = codec.encode_error(INTERNAL, f"the store cannot be read: {exc}", retryable=exc.retryable)
            return _response(HTTPStatus.SERVICE_UNAVAILABLE, failed.encode(), "application/json")
        missing = codec.encode_error("not_found", f"no such path: {path}")
        return _response(HTTPStatus.NOT_FOUND, missing.encode(), "application/json")

    # -- one connection ----------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        if self._stopping:
            await ws.close(CloseCode.GOING_AWAY, "server shutting down")
            return
        tokens = self.settings.server.auth_tokens
        owner = owner_of(bearer_token(ws.request.headers)) if tokens and ws.request else None
        outbox, inbox = anyio.create_memory_object_stream[str](OUTBOX_FRAMES)
        conn = _Connection(f"c{next(self._ids)}-{uuid.uuid4().hex[:6]}", ws, owner, outbox, inbox)
        conn.on_drop = self.metrics.pushes_dropped.inc
        conn.max_queued = self.settings.server.max_outbox_chars
        owned = self._owner_limits(owner)
        if owned is not None:
            owned.connections += 1
        self._connections.add(conn)
        self.metrics.connections.inc()
        close: tuple[int, str] | None = None
        try:
            with structlog.contextvars.bound_contextvars(connection=conn.id):
                log.info("voice_context_connection_opened", remote=_remote(ws), authenticated=bool(owner))
                with conn.scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(self._send_loop, conn)
                        try:
                            close = await self._read_loop(conn)
                        finally:
                            outbox.close()  # the send loop drains what is queued, then ends
                if conn.scope.cancelled_caught:  # a shutdown that could not wait any longer
                    close = (CloseCode.GOING_AWAY, "server shutting down")
                if close is not None:
                    with anyio.move_on_after(SHUTDOWN_GRACE):
                        await ws.close(*close)
                log.info("voice_context_connection_closed", code=ws.close_code, sessions=len(conn.sessions))
        finally:
            outbox.close()
            inbox.close()
            with anyio.CancelScope(shield=True):
                await self._detach_all(conn)
            self._connections.discard(conn)
            self._released += 1
            self.metrics.connections.dec()
            if owned is not None:
                owned.connections -= 1

    async def _send_loop(self, conn: _Connection) -> None:
        """Hand each queued frame to the connection, each within ``send_timeout``; past it,
        or once the connection is closed, drain the outbox without sending."""
        timeout = self.settings.server.send_timeout
        async with conn.inbox:
            async for frame in conn.inbox:
                if not conn.lost:
                    with anyio.move_on_after(timeout) as waited:
                        try:
                            await conn.ws.send(frame)
                        except ConnectionClosed:  # the reader sees it too
                            conn.lose()
                    if waited.cancelled_caught:
                        self._cut_off(conn)
                conn.sent(frame)

    def _cut_off(self, conn: _Connection) -> None:
        """End a connection whose client has not taken a frame in ``send_timeout``: abort
        the transport (a closing handshake would wait on the same full buffers)."""
        log.warning(
            "voice_context_send_timed_out",
            timeout=self.settings.server.send_timeout,
            queued_chars=conn.queued,
        )
        self.metrics.errors.labels(code="send_timeout").inc()
        conn.lose()
        conn.ws.transport.abort()  # the reader's recv ends with ConnectionClosed

    async def _read_loop(self, conn: _Connection) -> tuple[int, str] | None:
        """Read frames and hand each to its session's queue; returns the close code to send, if any.

        A session's requests run one at a time, in the order they arrived; those of
        different sessions run side by side (a turn waiting for its commit does not hold
        up another session's context). The block ends only once every request read has
        been answered.
        """
        close: tuple[int, str] | None = None
        async with anyio.create_task_group() as work:
            try:
                close = await self._read_frames(conn, work)
            finally:
                conn.reading_done = True  # idle workers leave; busy ones finish their sessions first
                conn.wake.set()
        return close

    async def _read_frames(self, conn: _Connection, work: TaskGroup) -> tuple[int, str] | None:
        while not self._stopping:
            with anyio.CancelScope() as scope:
                conn.recv_scope = scope
                try:
                    await conn.room_to_reply()
                    await conn.room_to_work()
                    frame = await conn.ws.recv()
                except ConnectionClosed:
                    return None
                finally:
                    conn.recv_scope = None
            if scope.cancelled_caught:
                break
            if not isinstance(frame, str):
                log.info("voice_context_binary_frame", size=len(frame))
                self.metrics.errors.labels(code="binary_frame").inc()
                return CloseCode.UNSUPPORTED_DATA, "binary frames are not accepted: send JSON text"
            await self._route(conn, frame, work)
        return CloseCode.GOING_AWAY, "server shutting down"

    async def _route(self, conn: _Connection, frame: str, work: TaskGroup) -> None:
        """Parse a frame and queue it behind the requests of its session on this connection."""
        try:
            message, sent = codec.parse(frame, max_text_chars=self.settings.server.max_text_chars)
        except DecodeError as exc:
            await self._error(conn, exc.code, exc.message, msg_id=exc.id, session=exc.session)
            return
        except Exception:  # the last guard: a bug answers `internal` and the connection carries on
            log.exception("voice_context_request_failed", type=None)
            await self._error(conn, INTERNAL, "internal error", retryable=False)
            return
        if message.session is None:  # ping: a barrier, answered once all read before it are
            await conn.all_answered()
            await self._dispatch(conn, message, sent)
            return
        queue = conn.queues.get(message.session)
        conn.working += 1
        conn.working_chars += len(frame)
        if queue is not None:
            queue.append((message, sent, len(frame)))
            return
        conn.queues[message.session] = deque([(message, sent, len(frame))])
        conn.ready.append(message.session)
        conn.wake.set()
        # idle workers may not have run since they were woken: one for each session ready
        if (
            conn.idle_workers < len(conn.ready) and conn.workers < WORKERS
        ):  # workers live as long as the connection: no task per request
            conn.workers += 1
            work.start_soon(self._worker, conn)

    async def _worker(self, conn: _Connection) -> None:
        """Take a session with requests waiting, answer them in order until none is left; repeat."""
        while True:
            while not conn.ready:
                if conn.reading_done:
                    return
                conn.idle_workers += 1
                try:
                    conn.wake = anyio.Event() if conn.wake.is_set() else conn.wake
                    await conn.wake.wait()
                finally:
                    conn.idle_workers -= 1
            name = conn.ready.popleft()
            queue = conn.queues[name]
            try:
                while queue:
                    message, sent, size = queue[0]
                    try:
                        await conn.room_to_reply()  # a client that does not read gets no more answers
                        if not conn.lost:  # a reply nobody can receive is not worth working out
                            await self._dispatch(conn, message, sent)
                    finally:
                        queue.popleft()
                        conn.finished(size)
            finally:
                del conn.queues[name]

    async def _dispatch(self, conn: _Connection, message: ClientMessage, sent: dict[str, Any]) -> None:
        session = message.session
        with structlog.contextvars.bound_contextvars(session=session):
            try:
                reply, record = await self._answer(conn, message)
            except _Reject as exc:
                await self._error(
                    conn, exc.code, exc.message, msg_id=message.id, session=session, **exc.extra
                )
            except UnknownSession:
                text = f"no open session {session!r} on this connection: send session.open first"
                await self._error(conn, UNKNOWN_SESSION, text, msg_id=message.id, session=session)
            except ConfigError as exc:
                await self._error(conn, BAD_REQUEST, str(exc), msg_id=message.id, session=session)
            except RateLimited as exc:
                await self._error(conn, RATE_LIMITED, str(exc), msg_id=message.id, session=session)
            except SessionClosed as exc:
                text = f"session unavailable: {exc}"
                await self._error(conn, INTERNAL, text, msg_id=message.id, session=session, retryable=True)
            except StoreError as exc:
                log.warning("voice_context_store_failed", type=message.type, error=str(exc)[:300])
                await self._error(
                    conn,
                    INTERNAL,
                    f"the store failed: {exc}",
                    msg_id=message.id,
                    session=session,
                    retryable=exc.retryable,
                )
            except Exception:
                log.exception("voice_context_request_failed", type=message.type)
                await self._error(
                    conn, INTERNAL, "internal error", msg_id=message.id, session=session, retryable=False
                )
            else:
                if record:
                    self._record(message.session, sent)
                await conn.reply(reply)

    async def _error(
        self,
        conn: _Connection,
        code: str,
        message: str,
        *,
        msg_id: MessageId = None,
        session: str | None = None,
        **extra: Any,
    ) -> None:
        self.metrics.errors.labels(code=code).inc()
        log.info("voice_context_request_rejected", code=code, message=message[:200], id=msg_id)
        await conn.reply(codec.encode_error(code, message, msg_id=msg_id, session=session, **extra))

    # -- the messages ------------------------------------------------------------------

    async def _answer(self, conn: _Connection, message: ClientMessage) -> tuple[str, bool]:
        """The reply to one message, and whether the message is to be recorded."""
        manager = self.manager
        owner = conn.owner
        if isinstance(message, Ping):
            return codec.encode_pong(message.id), False
        name = message.session
        if isinstance(message, SessionOpen):
            return await self._open(conn, message), True
        if name not in conn.sessions:
            raise UnknownSession(name)
        if isinstance(message, TurnAppend):
            return await self._append_turn(conn, message)
        if isinstance(message, NoteAppend):
            limits = self._limits[name]
            async with limits.lock:
                self._take(conn, limits)
                changed = await manager.append_note(name, message.note, owner=owner)
            self.metrics.notes.inc()
            return codec.encode_note_appended(name, changed, message.id), True
        if isinstance(message, ContextGet):
            started = time.perf_counter()
            ctx = await manager.context(
                name,
                message.format,
                budget_chars=message.budget_chars,
                budget_tokens=message.budget_tokens,
                base_instructions=message.base_instructions,
                facts=message.facts,
                query=message.query,
                owner=owner,
            )
            in_flight = manager.state(name, owner=owner).in_flight is not None
            self.metrics.context_latency.observe(time.perf_counter() - started)
            self._journal.context(name, ctx)
            return codec.encode_context(name, ctx, in_flight=in_flight, msg_id=message.id), True
        if isinstance(message, SessionStateGet):
            return codec.encode_state(name, manager.state(name, owner=owner), message.id), True
        if isinstance(message, codec.ContextOverflow):
            try:
                ctx, applied = await manager.overflow(
                    name,
                    message.format,
                    limit_tokens=message.limit_tokens,
                    budget_chars=message.budget_chars,
                    base_instructions=message.base_instructions,
                    facts=message.facts,
                    query=message.query,
                    owner=owner,
                )
            except ContextOverflow as exc:
                raise _Reject(codec.TOO_LARGE, str(exc), limit="limit_tokens", needed=exc.needed) from None
            in_flight = manager.state(name, owner=owner).in_flight is not None
            folded = {
                "old_cursor": applied.old_cursor if applied else ctx.cursor,
                "cursor": ctx.cursor,
                "folded": (applied.new_cursor - applied.old_cursor) if applied else 0,
            }
            self._journal.context(name, ctx)
            return codec.encode_context(
                name, ctx, in_flight=in_flight, msg_id=message.id, emergency=folded
            ), True
        if isinstance(message, codec.SessionHandoff):
            handoff = await manager.handoff(
                name,
                limit_chars=message.limit_chars,
                base_instructions=message.base_instructions,
                facts=message.facts,
                query=message.query,
                last_turns=message.last_turns,
                owner=owner,
            )
            return codec.encode_handoff(name, handoff, message.id), True
        if isinstance(message, LandmarkPin):
            try:
                landmark = await manager.pin(
                    name,
                    message.index,
                    kind=message.kind,
                    reason=message.reason,
                    source="llm" if message.source == "llm" else "manual",
                    owner=owner,
                )
            except IndexError as exc:
                raise _Reject(BAD_REQUEST, str(exc)) from None
            return codec.encode_pinned(name, landmark, message.id), True
        if isinstance(message, LandmarkUnpin):
            removed = await manager.unpin(name, message.index, owner=owner)
            return codec.encode_unpinned(name, message.index, removed, message.id), True
        if isinstance(message, SessionDelete):
            await self._delete(conn, name)
            return codec.encode_deleted(name, message.id), False
        assert isinstance(message, SessionClose)
        await self._detach(conn, name)
        return codec.encode_closed(name, message.id), True

    async def _delete(self, conn: _Connection, name: str) -> None:
        """Forget a session everywhere: every connection holding it lets it go (it gets no
        more events), the manager and the store forget it, and so does its recording."""
        self.manager.session(name, owner=conn.owner)  # UnknownSession unless this owner's
        for holder in self._holders.pop(name, set()):
            holder.sessions.discard(name)
            self.manager.remove_listener(holder.push, session=name)
        conn.sessions.discard(name)
        await self.manager.delete(name, owner=conn.owner)
        self._journal.forget(name)
        if self._record_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                (self._record_dir / recording_name(name)).unlink()
        log.info("voice_context_session_deleted")

    async def _open(self, conn: _Connection, message: SessionOpen) -> str:
        name = message.session
        limit = self.settings.server.max_sessions_per_connection
        if name not in conn.sessions and len(conn.sessions) >= limit:
            raise _Reject(
                RATE_LIMITED,
                f"too many sessions on this connection (limit {limit}): close one first",
                limit="sessions_per_connection",
            )
        config = dict(message.config) if message.config is not None else None
        if config:
            check_client_overrides(config, self.manager.config)
        opened = await self.manager.open(name, config, owner=conn.owner)
        # nothing below awaits, and the manager's open returns only while the session is
        # live: the attach cannot half-happen (listener first, the one step that can raise)
        if name not in conn.sessions:
            self.manager.add_listener(conn.push, session=name)
            conn.sessions.add(name)
            self._holders.setdefault(name, set()).add(conn)
            if name not in self._limits:
                self._forget_idle_limits()
                cfg = self.settings.server
                bucket = TokenBucket(cfg.turns_per_second, cfg.turn_burst, self._monotonic())
                self._limits[name] = _SessionLimits(bucket)
        log.info("voice_context_session_opened", resumed=opened.resumed, turns=opened.stats.turns)
        return codec.encode_opened(name, opened, message.id)

    async def _append_turn(self, conn: _Connection, message: TurnAppend) -> tuple[str, bool]:
        name = message.session
        limits = self._limits[name]
        async with limits.lock:
            session = self.manager.session(name, owner=conn.owner)
            duplicate = find_duplicate(session, message.turn)
            if duplicate is not None:
                return codec.encode_turn_appended(name, duplicate, message.id, duplicate=True), False
            self._take(conn, limits)
            index = await self.manager.append_turn(name, message.turn, owner=conn.owner)
            found = (
                session.landmark(index) if self.manager.session(name, owner=conn.owner) is session else None
            )
        self.metrics.turns.inc()
        return codec.encode_turn_appended(name, index, message.id, landmark=found), True

    def _forget_idle_limits(self) -> None:
        """Drop the rate limits of sessions nobody holds whose buckets have refilled anyway
        (forgetting them changes nothing), once there are many."""
        if len(self._limits) < LIMITS_KEPT:
            return
        now = self._monotonic()
        for name, limits in list(self._limits.items()):
            if name not in self._holders and limits.bucket.full(now):
                del self._limits[name]

    def _owner_limits(self, owner: str | None) -> _OwnerLimits | None:
        """The limits of a token's owner (made at its first connection); ``None`` without tokens."""
        if owner is None:
            return None
        owned = self._owners.get(owner)
        if owned is None:
            cfg = self.settings.server
            bucket = TokenBucket(cfg.owner_turns_per_second, cfg.owner_turn_burst, self._monotonic())
            owned = self._owners[owner] = _OwnerLimits(bucket)
        return owned

    def _take(self, conn: _Connection, limits: _SessionLimits) -> None:
        """Spend one of the session's tokens and one of its owner's for a turn or a note, or
        refuse the request (spending neither)."""
        now = self._monotonic()
        cfg = self.settings.server
        owned = self._owner_limits(conn.owner)
        wait = limits.bucket.wait(now)
        if wait > 0:
            raise _Reject(
                RATE_LIMITED,
                f"too many turns and notes for this session (limit {cfg.turns_per_second:g} per second)",
                limit="turns_per_second",
                retry_after=math.ceil(wait * 1000) / 1000,
            )
        wait = owned.bucket.wait(now) if owned is not None else 0.0
        if wait > 0:
            raise _Reject(
                RATE_LIMITED,
                "too many turns and notes for this token's sessions together"
                f" (limit {cfg.owner_turns_per_second:g} per second)",
                limit="owner_turns_per_second",
                retry_after=math.ceil(wait * 1000) / 1000,
            )
        limits.bucket.take(now)
        if owned is not None:
            owned.bucket.take(now)

    async def _detach(self, conn: _Connection, name: str) -> None:
        """This connection is done with a session; the last one to leave closes it here."""
        conn.sessions.discard(name)
        self.manager.remove_listener(conn.push, session=name)
        holders = self._holders.get(name)
        if holders is not None:
            holders.discard(conn)
            if holders:
                return
            del self._holders[name]
        # the session's rate limit outlives this close: a close and an open must not refill it
        if self._stopping:
            return  # the manager lands compactions in flight as it closes
        try:
            await self.manager.close(name, owner=conn.owner)
        except UnknownSession:
            pass
        else:
            self._released += 1
            log.info("voice_context_session_closed")

    async def _detach_all(self, conn: _Connection) -> None:
        if self._manager is None:
            return
        for name in list(conn.sessions):
            with structlog.contextvars.bound_contextvars(session=name):
                await self._detach(conn, name)

    # -- the tier cascade -------------------------------------------------------------

    async def _tick(self, scope: anyio.CancelScope) -> None:
        """Start the tier rolls the time of day makes due (a day's at 03:00, a week's on
        Sunday at 04:00, a conversation's once its silence passes the gap) in sessions that
        get no traffic meanwhile; each session checks at most once a minute."""
        with scope:
            while True:
                await anyio.sleep(TICK_SECONDS)
                await self.manager.tick()

    # -- retention ---------------------------------------------------------------------

    async def _retain(self, ttl: float, scope: anyio.CancelScope) -> None:
        """The retention policy, every sweep interval, off the path of any reply: the
        sessions open here are kept, those idle past ``ttl`` are forgotten, and so are their
        recordings."""
        interval = self.settings.store.retention_interval or ttl / 4
        with scope:
            while True:
                await anyio.sleep(interval)
                try:
                    expired = await self.manager.retain()
                except StoreError as exc:  # the next sweep tries again, well within the ttl
                    log.warning("voice_context_retention_failed", error=str(exc)[:300])
                    continue
                if expired:
                    log.info("voice_context_sessions_expired", count=len(expired), sessions=expired[:20])
                if self._record_dir is not None:
                    await self._expire_recordings(self._record_dir, ttl)

    async def _expire_recordings(self, record_dir: Path, ttl: float) -> None:
        """Delete the recordings untouched for ``ttl`` whose session the store no longer holds
        (it expired, here or on another replica)."""
        live = set(self.manager.names())
        for name, path in await anyio.to_thread.run_sync(_stale_recordings, record_dir, time.time() - ttl):
            if name in live:
                continue
            try:
                if await self.manager.store.load(name) is not None:
                    continue
            except StoreError:
                return  # decide at the next sweep
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            log.info("voice_context_recording_expired", session=name, path=str(path))

    # -- recording ---------------------------------------------------------------------

    def _record(self, session: str | None, sent: dict[str, Any]) -> None:
        """Append an accepted message, as the client sent it, to its session's recording."""
        if self._record_dir is None or session is None:
            return
        path = self._record_dir / recording_name(session)
        try:
            line = orjson.dumps(sent) + b"\n"
            with path.open("ab") as out:  # one write, flushed on close
                out.write(line)
        except (OSError, orjson.JSONEncodeError) as exc:  # the request was applied: answer it anyway
            log.warning("voice_context_record_failed", path=str(path), error=str(exc))


def _stale_recordings(record_dir: Path, before: float) -> list[tuple[str, Path]]:
    """The recordings last written before ``before``, with the session each one records."""
    found = []
    for path in record_dir.glob("*.jsonl"):
        try:
            if path.stat().st_mtime >= before:
                continue
            with path.open("rb") as handle:
                first = orjson.loads(handle.readline())
        except (OSError, orjson.JSONDecodeError):
            continue
        if isinstance(first, dict) and isinstance(first.get("session"), str):
            found.append((first["session"], path))
    return found


def _int(query: dict[str, list[str]], key: str) -> int:
    """An integer query parameter (0 when absent or not a number)."""
    values = query.get(key, [])
    return int(values[0]) if values and values[0].lstrip("-").isdigit() else 0


def _response(status: HTTPStatus, body: bytes, content_type: str, *extra: tuple[str, str]) -> Response:
    headers = Headers(
        [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            ("Cache-Control", "no-store"),
            *extra,
        ]
    )
    return Response(status.value, status.phrase, headers, body)


def _remote(ws: ServerConnection) -> str:
    address: Any = ws.remote_address
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


__all__ = [
    "Server",
    "TokenBucket",
    "bearer_token",
    "find_duplicate",
    "owner_of",
    "recording_name",
    "replica_name",
    "token_matches",
]
