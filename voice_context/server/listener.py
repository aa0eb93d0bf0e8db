"""One listening socket for the workers of ``serve --workers``, taken by the least loaded.

The supervisor binds the socket (:func:`bind`) and makes a small block of shared memory,
:class:`Loads`, with one slot a worker: the connections that worker holds open. Each worker
is given both (their descriptors, see ``[server] listen_fd`` and ``loads_fd``) and serves
through a :class:`SharedListener`: when a connection waits, every worker is woken, and each
asks :func:`voice_context.core.balance.wait_before_accepting` whether to take it. One that
holds more than a sibling stops watching the socket for a moment (it is out of the event
loop's selector meanwhile: no spinning) and looks again; one that has declined for the bound
takes it anyway, so a stopped or busy sibling strands nothing. A worker takes one connection
per decision: asyncio's own accept loop takes up to 100 at each wake-up, which
is what makes a shared socket greedy.

An accepted socket is handed to websockets as asyncio would (``loop.connect_accepted_socket``
with the asyncio server's protocol factory): the handshake, the HTTP endpoints, the limits
and the graceful close are websockets' as ever, which tracks these connections itself. The
websockets server listens meanwhile on a socket nobody can reach, so that it serves (an
opening handshake on a server that does not serve gets a 503) without accepting from the
shared one. The factory is a private attribute of asyncio's server (CPython 3.7-3.13); where
it is missing the worker logs it once and lets asyncio accept on the shared socket, as
before: correct, not balanced.

``accept()`` failing for want of descriptors goes to the event loop's exception handler, as
asyncio's accept errors do (the server's :class:`~voice_context.server.descriptors.DescriptorGuard`
answers it), and the worker stops watching for a second, as asyncio does.
"""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import select
import socket
import struct
import tempfile
import time
from collections.abc import Awaitable, Callable
from typing import Protocol, Self

from anyio.abc import TaskGroup
from websockets.asyncio.server import Server as WebsocketServer
from websockets.asyncio.server import ServerConnection

from voice_context.core.balance import wait_before_accepting
from voice_context.logs import get_logger
from voice_context.server.descriptors import ACCEPT_FAILED, OUT_OF_DESCRIPTORS

log = get_logger("voice_context.server")

BACKLOG = 2048
"""The listen backlog (the kernel caps it at ``net.core.somaxconn``), every ``serve`` socket's:
hundreds of bots reconnecting at once, after a restart, queue for their handshake where
asyncio's default of 100 has the kernel drop what overflows, for the clients to try again a
second or more later."""

ACCEPT_TRIES = 100
"""Failed ``accept()`` calls in one go at the descriptor limit before a worker pauses (asyncio's)."""

ACCEPT_RETRY_SECONDS = 1.0
"""How long a worker stops watching the socket after ``accept()`` failed (asyncio's own back-off)."""

SLOT = struct.calcsize("q")
"""Bytes a worker's count takes in :class:`Loads` (8, aligned)."""

ABSENT = -1
"""What a slot holds while its worker does not accept (not yet started, or shutting down)."""


def bind(host: str, port: int, *, reuse_port: bool = False, backlog: int = BACKLOG) -> socket.socket:
    """A listening TCP socket on the first address ``host`` resolves to (all interfaces for
    ``""``), with ``SO_REUSEADDR``, as asyncio binds a server's; ``SO_REUSEPORT`` only when
    asked (servers started apart that share the port). Raises ``OSError``."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:  # as asyncio does: the IPv6 address alone
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _shared_file(size: int) -> int:
    """A descriptor of ``size`` zeroed bytes in memory, for processes to map together."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("voice-context-loads", os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux: an unlinked file
        fd, path = tempfile.mkstemp(prefix="voice-context-loads-")
        os.unlink(path)
    os.ftruncate(fd, size)
    return fd


class Loads:
    """Each worker's count of open connections, in shared memory: one aligned 8-byte slot a
    worker, written by that worker alone (no lock: a reader sees the old count or the new
    one), :data:`ABSENT` while it does not accept."""

    def __init__(self, fd: int, index: int) -> None:
        """Map the block behind ``fd`` (a duplicate is kept; ``fd`` stays the caller's); this
        process is worker ``index``."""
        self._map = mmap.mmap(fd, os.fstat(fd).st_size)
        self._slots = memoryview(self._map).cast("q")
        slots = len(self._slots)
        if not 0 <= index < slots:
            self.close()
            raise ValueError(f"worker {index} has no slot among {slots}")
        self.index = index
        self._mine = 0
        self._accepting = False

    @classmethod
    def create(cls, workers: int) -> tuple[Self, int]:
        """A block of ``workers`` slots, all :data:`ABSENT`, seen as worker 0's; and its
        descriptor, to pass on (the caller closes it)."""
        fd = _shared_file(workers * SLOT)
        loads = cls(fd, 0)
        for k in range(workers):
            loads._slots[k] = ABSENT
        return loads, fd

    def __repr__(self) -> str:
        return f"<Loads worker={self.index} {list(self._slots)}>"

    @property
    def mine(self) -> int:
        """The connections this worker holds open."""
        return self._mine

    def others(self) -> list[int]:
        """The counts of the siblings that accept."""
        return [n for k, n in enumerate(self._slots) if k != self.index and n != ABSENT]

    def accepting(self, accepting: bool) -> None:
        """Show the siblings this worker's count (it accepts), or :data:`ABSENT` (it does not)."""
        self._accepting = accepting
        self._publish()

    def add(self, delta: int) -> None:
        self._mine += delta
        self._publish()

    def _publish(self) -> None:
        if not self._map.closed:
            self._slots[self.index] = self._mine if self._accepting else ABSENT

    def close(self) -> None:
        if not self._map.closed:
            self._slots.release()
            self._map.close()


def _unreachable() -> socket.socket:
    """A listening socket no one can connect to: a Unix socket whose path is gone."""
    where = tempfile.mkdtemp(prefix="voice-context-")
    path = os.path.join(where, "l")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        sock.listen(1)
    except BaseException:
        sock.close()
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
        with contextlib.suppress(OSError):
            os.rmdir(where)
    return sock


class Listen(Protocol):
    """How the server makes its websockets server, given where it listens (``sock=``)."""

    def __call__(self, *, sock: socket.socket) -> Awaitable[WebsocketServer]: ...


class SharedListener:
    """Takes connections from the socket the workers share, when this worker is the least
    loaded (see the module docstring). ``monotonic`` is the clock of the declining."""

    def __init__(
        self, sock: socket.socket, loads: Loads, *, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.sock = sock
        self.loads = loads
        self._monotonic = monotonic
        self._loop: asyncio.AbstractEventLoop | None = None
        self._factory: Callable[[], ServerConnection] | None = None
        self._tg: TaskGroup | None = None
        self._watching = False
        self._later: asyncio.TimerHandle | None = None
        #: since when this worker declines the connections waiting (None: it does not)
        self._declined_since: float | None = None
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        #: connections taken, and declinings (a look away), in all
        self.accepted = 0
        self.declined = 0
        self.closed = False

    @classmethod
    def adopt(cls, listen_fd: int, loads_fd: int | None, worker: int | None) -> Self:
        """The listener on the descriptors the supervisor passed (this process owns them now);
        without ``loads_fd``, a worker alone (it takes every connection)."""
        sock = socket.socket(fileno=listen_fd)
        sock.setblocking(False)
        if loads_fd is None:
            loads, loads_fd = Loads.create(1)
        else:
            loads = Loads(loads_fd, worker or 0)
        os.close(loads_fd)
        return cls(sock, loads)

    def __repr__(self) -> str:
        state = "closed" if self.closed else "watching" if self._watching else "looking away"
        counts = f"mine={self.loads.mine} accepted={self.accepted} declined={self.declined}"
        return f"<SharedListener {state} {counts}>"

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def serve(self, listen: Listen, tg: TaskGroup) -> WebsocketServer:
        """The websockets server, fed the connections this worker takes; the connections'
        tasks run in ``tg``."""
        ws = await listen(sock=_unreachable())
        factory = getattr(ws.server, "_protocol_factory", None)
        if factory is None:
            log.warning("voice_context_balance_unavailable", reason="asyncio.Server has no _protocol_factory")
            ws.close()
            await ws.wait_closed()
            self.closed = True  # asyncio accepts on the shared socket, and closes it
            return await listen(sock=self.sock)
        self._loop, self._factory, self._tg = asyncio.get_running_loop(), factory, tg
        self.loads.accepting(True)
        self._watch()
        return ws

    def close(self) -> None:
        """Stop taking connections (those taken carry on), and let go of the socket."""
        if self.closed:
            return
        self.closed = True
        self.loads.accepting(False)
        self._unwatch()
        if self._later is not None:
            self._later.cancel()
            self._later = None
        self.sock.close()

    # -- the loop's callbacks --------------------------------------------------------

    def _watch(self) -> None:
        if not self._watching and not self.closed:
            assert self._loop is not None
            self._loop.add_reader(self.sock.fileno(), self._ready)
            self._watching = True

    def _unwatch(self) -> None:
        if self._watching:
            assert self._loop is not None
            self._loop.remove_reader(self.sock.fileno())
            self._watching = False

    def _look_away(self, seconds: float) -> None:
        assert self._loop is not None
        self._unwatch()
        self._later = self._loop.call_later(seconds, self._look_again)

    def _look_again(self) -> None:
        self._later = None
        if not self._poll.poll(0):
            self._declined_since = None  # a sibling took what waited
        self._watch()  # what still waits wakes this worker at once

    def _ready(self) -> None:
        """A connection waits: take it, or look away for a moment."""
        now = self._monotonic()
        declined_for = 0.0 if self._declined_since is None else now - self._declined_since
        wait = wait_before_accepting(self.loads.mine, self.loads.others(), declined_for)
        if wait > 0:
            if self._declined_since is None:
                self._declined_since = now
            self.declined += 1
            self._look_away(wait)
            return
        self._declined_since = None
        self._accept()

    def _accept(self) -> None:
        """Take one connection. At the descriptor limit, each failed ``accept()`` goes to the
        loop's exception handler, where the server's guard answers one waiting connection 503
        with its spare descriptor; as asyncio's accept loop does, up to :data:`ACCEPT_TRIES`
        of them in one go, then a second's pause (what waits meanwhile, waits in the queue)."""
        assert self._loop is not None and self._tg is not None
        for _ in range(ACCEPT_TRIES):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # a sibling took it (or the guard answered the last), or its client left
            except OSError as exc:
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    log.warning("voice_context_accept_failed", error=str(exc))
                    break
                context = {"message": ACCEPT_FAILED, "exception": exc, "socket": self.sock}
                self._loop.call_exception_handler(context)
                continue
            self.accepted += 1
            self.loads.add(1)
            self._tg.start_soon(self._connect, conn)
            return
        self._look_away(ACCEPT_RETRY_SECONDS)

    async def _connect(self, conn: socket.socket) -> None:
        """Hand ``conn`` to websockets; count it until it ends."""
        assert self._loop is not None and self._factory is not None
        try:
            _, protocol = await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError as exc:  # the client left before it could be served
            conn.close()
            log.debug("voice_context_connection_lost_early", error=str(exc))
        else:
            await protocol.wait_closed()
        finally:
            self.loads.add(-1)
