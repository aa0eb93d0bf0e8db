"""The server's composition root: the store, the summarizer, the session manager, the
background loops, the recorder and the websocket listener, and their one lifetime.

``async with Server(settings)`` opens what the server owns in one ``async with`` block
(:meth:`Server._lifetime`), inside one task group, and leaving it shuts down in the reverse
order: stop accepting, let the requests in progress finish and their replies go out (each
step within its deadline), write the recordings queued, cancel the background loops, let the
manager land (or give up on) the compactions in flight, and close what the server opened.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio
import anyio.to_thread
import structlog
from anyio.abc import TaskGroup, TaskStatus
from websockets.asyncio.server import Server as WebsocketServer
from websockets.asyncio.server import ServerConnection, serve
from websockets.frames import CloseCode

from voice_context.config import Settings, make_summarizer
from voice_context.errors import StoreError
from voice_context.logs import get_logger
from voice_context.manager import SessionManager
from voice_context.released import ReleasedConnection
from voice_context.server import inspector
from voice_context.server.collector import Load
from voice_context.server.connection import SHUTDOWN_GRACE, Connection
from voice_context.server.descriptors import DescriptorGuard
from voice_context.server.handlers import Handlers
from voice_context.server.http import PATH, Health, Routes, remote
from voice_context.server.limits import Limits
from voice_context.server.listener import BACKLOG, SharedListener
from voice_context.server.metrics import Metrics
from voice_context.server.recording import Recorder
from voice_context.sources import HTTPSource, with_sources
from voice_context.store import open_store
from voice_context.store.base import Store
from voice_context.summarizers.base import Summarizer

if TYPE_CHECKING:
    from voice_context.recall.embedding import Embedder

log = get_logger("voice_context.server")

TICK_SECONDS = 15.0
"""How often the server starts the tier rolls the time of day made due (see ``SessionManager.tick``)."""


def _load_embedder(kind: str) -> Embedder | None:
    """The embedder recall ranks with; without one (the default) numpy is never loaded."""
    if kind == "none":
        return None
    from voice_context.recall.embedding import load_embedder

    return load_embedder(kind)


def replica_name(configured: str | None, port: int) -> str | None:
    """Who this server is to the store's leases: the configured name, else ``host:port``
    when the port is fixed (so a restart is the same replica), else ``None`` (random)."""
    if configured:
        return configured
    return f"{socket.gethostname()}:{port}" if port else None


class Server:
    """The voice-context websocket server. See :mod:`voice_context.server`."""

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
        self._store = store
        self.metrics = Metrics()
        self._journal = inspector.Journal()
        self._limits = Limits(self.settings.server, monotonic)
        record_dir = self.settings.server.record_dir
        self._recorder = Recorder(Path(record_dir)) if record_dir else None
        self._descriptors = DescriptorGuard(
            monotonic=monotonic, on_refuse=lambda how: self.metrics.descriptors_refused.labels(how=how).inc()
        )
        self._routes = Routes(
            settings=self.settings.server,
            metrics=self.metrics,
            journal=self._journal,
            descriptors=self._descriptors,
            limits=self._limits,
            health=self._health,
            manager=lambda: self._manager,
            store=lambda: self._store,
        )
        self._manager: SessionManager | None = None
        self._handlers: Handlers | None = None
        self._ws: WebsocketServer | None = None
        self._shared: SharedListener | None = None
        self._tg: TaskGroup | None = None
        self._running: AbstractAsyncContextManager[None] | None = None
        self._connections: set[Connection] = set()
        #: connections ended so far (with the sessions closed: what the collector may reclaim)
        self._released = 0
        self._stopping = False
        self._stopped = anyio.Event()
        self._ids = itertools.count(1)
        self.port = 0

    def __repr__(self) -> str:
        state = "stopping" if self._stopping else "running" if self._manager is not None else "idle"
        return f"<Server {self.url} {state} connections={len(self._connections)}>"

    # -- what it holds --------------------------------------------------------------

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
        """Where a browser finds the inspector (:mod:`voice_context.server.inspector`)."""
        return "http" + self.url.removeprefix("ws").removesuffix(PATH) + "/inspector"

    @property
    def stopping(self) -> bool:
        """True once a shutdown has begun."""
        return self._stopping

    @property
    def connections(self) -> int:
        return len(self._connections)

    def load(self) -> Load:
        """What this server holds and has let go, for :mod:`voice_context.server.collector`."""
        sessions = self._manager.sessions if self._manager is not None else 0
        released = self._released + (self._handlers.released if self._handlers is not None else 0)
        return Load(len(self._connections), sessions, released)

    def _health(self) -> Health:
        manager = self._manager
        sessions, in_flight = (manager.sessions, manager.in_flight) if manager is not None else (0, 0)
        return Health(self._stopping, sessions, len(self._connections), in_flight)

    # -- lifetime ---------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        running = self._lifetime()
        await running.__aenter__()
        self._running = running
        log.info("voice_context_server_listening", url=self.url, summarizer=self.summarizer.model)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        running, self._running = self._running, None
        assert running is not None
        try:
            return await running.__aexit__(exc_type, exc, tb)
        finally:
            log.info("voice_context_server_stopped")

    @asynccontextmanager
    async def _lifetime(self) -> AsyncIterator[None]:
        """Everything the server runs, opened in order and closed in reverse."""
        cfg = self.settings.server
        async with AsyncExitStack() as owned:
            store = self._store
            if store is None:
                store = self._store = open_store(
                    self.settings.store.url,
                    data_dir=self.settings.store.data_dir,
                    session_ttl=self.settings.store.session_ttl,
                    sqlite_reads=self.settings.store.sqlite_reads,
                )
                owned.push_async_callback(store.aclose)
            await store.open()  # a new SQLite file's schema made before the server listens
            aclose = getattr(self.summarizer, "aclose", None)
            if self._owns_summarizer and aclose is not None:
                owned.push_async_callback(aclose)
            manager = SessionManager(
                self.summarizer,
                config=self.settings.session_config(self.summarizer),
                store=store,
                compaction_timeout=self.settings.summarizer.compaction_timeout,
                close_timeout=cfg.shutdown_timeout,
                replica=replica_name(cfg.replica, cfg.port),
                lease_ttl=cfg.lease_ttl,
                recall_ahead=self.settings.recall.ahead,
                tokenizer_ahead=cfg.preload_tokenizer,
                # loading (a first use distils the static table: some 40 s) runs off the event loop
                embedder=await anyio.to_thread.run_sync(_load_embedder, self.settings.recall.embedder),
            )
            async with manager, anyio.create_task_group() as tg, self._serving(manager, tg):
                yield

    @asynccontextmanager
    async def _serving(self, manager: SessionManager, tg: TaskGroup) -> AsyncIterator[None]:
        """The manager's listeners, the background loops and the websocket listener, in the
        task group ``tg``; on the way out, the shutdown, then the loops end."""
        cfg = self.settings.server
        self._manager, self._tg = manager, tg
        self._journal.attach(manager)
        self.metrics.watch_manager(
            lambda: manager.counters,
            lambda: manager.sessions,
            lambda: manager.in_flight,
            manager.indexing_lags,
        )
        self._handlers = Handlers(
            manager=manager,
            settings=cfg,
            limits=self._limits,
            metrics=self.metrics,
            journal=self._journal,
            recorder=self._recorder,
            stopping=lambda: self._stopping,
        )
        try:
            with self._descriptors_guarded():
                await tg.start(self._tick)
                ttl = manager.store.session_ttl
                if ttl is not None:
                    await tg.start(self._retain, ttl)
                if self._recorder is not None:
                    await self._recorder.prepare()

                def listen(**where: Any) -> WebsocketServer:
                    return serve(
                        self._handle,
                        process_request=self._routes.process_request,
                        max_size=cfg.max_frame_bytes,
                        server_header=None,
                        ping_interval=cfg.ping_interval,
                        ping_timeout=cfg.ping_timeout,
                        close_timeout=cfg.send_timeout,
                        create_connection=ReleasedConnection,
                        **where,  # passed on to loop.create_server
                    )

                if cfg.listen_fd is None:
                    self._ws = await listen(
                        host=cfg.host, port=cfg.port, reuse_port=cfg.reuse_port, backlog=BACKLOG
                    )
                    self.port = self._ws.sockets[0].getsockname()[1] if self._ws.sockets else cfg.port
                else:  # a worker of `serve --workers`, on the socket its supervisor bound
                    self._shared = SharedListener.adopt(cfg.listen_fd, cfg.loads_fd, cfg.worker)
                    self.port = self._shared.port
                    self._ws = await self._shared.serve(listen, tg)
                try:
                    yield
                finally:
                    try:
                        await self.shutdown()
                    finally:
                        if self._recorder is not None:
                            await self._recorder.aclose()
                        tg.cancel_scope.cancel()  # the background loops end with the server
        finally:
            if self._shared is not None:
                self._shared.close()
            self._released += self._handlers.released  # the sessions it closed stay counted
            self._manager = self._handlers = self._tg = None

    @contextlib.contextmanager
    def _descriptors_guarded(self) -> Iterator[None]:
        """Send the event loop's accept failures for want of descriptors to the guard
        (see :mod:`voice_context.server.descriptors`), while the server runs."""
        guard = self._descriptors
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()

        def fallback(context: dict[str, Any]) -> None:
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        guard.open()
        loop.set_exception_handler(guard.exception_handler(fallback))
        try:
            yield
        finally:
            loop.set_exception_handler(previous)
            guard.close()

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
        # shielded, as a cancelled server still owes its clients their replies, and bounded:
        # every wait in the drain has its own deadline, and this one is past all of them
        deadline = self.settings.server.shutdown_timeout + 3 * SHUTDOWN_GRACE
        try:
            with anyio.move_on_after(deadline, shield=True):
                await self._drain()
        finally:
            self._stopped.set()

    async def _drain(self) -> None:
        ws = self._ws
        if ws is None:
            return
        log.info("voice_context_shutdown_started", connections=len(self._connections))
        if self._shared is not None:
            self._shared.close()  # the siblings take the connections waiting
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

    # -- one connection ------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        if self._stopping or self._handlers is None:
            await ws.close(CloseCode.GOING_AWAY, "server shutting down")
            return
        owner = self._routes.owner(ws.request)
        conn = Connection(
            f"c{next(self._ids)}-{uuid.uuid4().hex[:6]}", ws, owner, self.settings.server, self.metrics
        )
        with self._limits.connection(owner), structlog.contextvars.bound_contextvars(connection=conn.id):
            self._connections.add(conn)
            self.metrics.connections.inc()
            try:
                log.info("voice_context_connection_opened", remote=remote(ws), authenticated=bool(owner))
                await conn.serve(self._handlers, lambda: self._stopping)
            finally:
                self._connections.discard(conn)
                self._released += 1
                self.metrics.connections.dec()

    # -- background loops ------------------------------------------------------------------

    async def _tick(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Start the tier rolls the time of day makes due (a day's at 03:00, a week's on
        Sunday at 04:00, a conversation's once its silence passes the gap) in sessions that
        get no traffic meanwhile; each session checks at most once a minute."""
        manager = self.manager  # (the server lets go of it at shutdown, before this loop ends)
        task_status.started()
        while True:
            await anyio.sleep(TICK_SECONDS)
            await manager.tick()

    async def _retain(self, ttl: float, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """The retention policy, every sweep interval, off the path of any reply: the
        sessions open here are kept, those idle past ``ttl`` are forgotten, and so are their
        recordings."""
        interval = self.settings.store.retention_interval or ttl / 4
        # the manager this loop serves: at shutdown the server lets go of it (``self.manager``
        # then raises) before this loop's cancellation reaches a sweep that just resumed
        manager = self.manager
        task_status.started()
        while True:
            await anyio.sleep(interval)
            try:
                expired = await manager.retain()
            except StoreError as exc:  # the next sweep tries again, well within the ttl
                log.warning("voice_context_retention_failed", error=str(exc)[:300])
                continue
            if expired:
                log.info("voice_context_sessions_expired", count=len(expired), sessions=expired[:20])
            if self._recorder is not None:
                await self._expire_recordings(manager, self._recorder, ttl)

    @staticmethod
    async def _expire_recordings(manager: SessionManager, recorder: Recorder, ttl: float) -> None:
        """Delete the recordings untouched for ``ttl`` whose session the store no longer holds
        (it expired, here or on another replica)."""
        live = set(manager.names())
        for name, path in await recorder.stale(time.time() - ttl):
            if name in live:
                continue
            try:
                if await manager.store.load(name) is not None:
                    continue
            except StoreError:
                return  # decide at the next sweep
            await recorder.delete(name, path)
            log.info("voice_context_recording_expired", session=name, path=str(path))
