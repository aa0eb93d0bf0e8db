"""Serving at the process's file-descriptor limit: refuse cleanly, log once, carry on.

Every connection holds a descriptor, and so do the store's file or its connections
and a recording being written. At the limit (``ulimit -n``) two things went wrong:
the event loop's accept loop logged a traceback for every failed ``accept()`` (a
hundred per wake-up, 262 MB of log in 100 s), and the work of the connections
already served (a store write, a recording) could fail for want of a descriptor.

:class:`DescriptorGuard` keeps both from happening:

- **headroom**: a handshake is refused (HTTP 503, ``rate_limited`` with
  ``"limit": "descriptors"``) while fewer than ``reserve`` descriptors are left, so
  the connections already served keep the descriptors their work needs;
- **at the limit**: when ``accept()`` fails anyway (many sockets arriving at once),
  the event loop's error goes to :meth:`accept_failed` instead of the log. It frees
  the one descriptor it keeps in reserve for this, accepts the waiting connection,
  answers it the same 503 and closes it (the client gets an answer, not a hang in
  the backlog), then takes the spare back. The event loop pauses accepting for a
  second after such an error (asyncio's own back-off; a worker of ``serve --workers``,
  which accepts on its own, sends its failures here and pauses the same way);
- **the log**: one ``voice_context_descriptors_exhausted`` line per ``interval``
  seconds at most, counting the refusals since the last one.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from voice_context.codec import RATE_LIMITED, ErrorReply, encode_reply
from voice_context.logs import get_logger

log = get_logger("voice_context.server")

#: Descriptors kept free for the work of the connections already served (an eighth of the
#: limit when that is less).
RESERVE = 32
#: At most one log line per this many seconds while short of descriptors.
LOG_INTERVAL = 10.0
#: What asyncio's accept loop reports when ``accept()`` runs out of descriptors.
ACCEPT_FAILED = "socket.accept() out of system resource"

#: What ``accept()`` fails with for want of descriptors (or of the kernel's memory for a socket).
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


def refusal_body() -> bytes:
    """The body of the HTTP 503 that refuses a handshake for want of descriptors."""
    text = "the server is short of file descriptors: try again later"
    return encode_reply(ErrorReply(RATE_LIMITED, text, limit="descriptors")).encode()


def _raw_refusal() -> bytes:
    body = refusal_body()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
    )
    return head.encode() + body


def descriptor_limit() -> int | None:
    """The soft limit on this process's open descriptors, or ``None`` where it is not known."""
    if sys.platform == "win32":  # pragma: no cover - no RLIMIT_NOFILE there
        return None
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return None if soft == resource.RLIM_INFINITY else int(soft)


def descriptors_in_use() -> int | None:
    """How many descriptors this process holds open (Linux and macOS), or ``None``.

    Raises ``OSError`` when listing them needs a descriptor there is none left for.
    """
    for where in ("/proc/self/fd", "/dev/fd"):
        if os.path.isdir(where):
            return len(os.listdir(where)) - 1  # the listing's own descriptor
    return None


class DescriptorGuard:
    """See the module docstring. ``monotonic`` is the clock of the log interval."""

    def __init__(
        self,
        *,
        reserve: int | None = None,
        interval: float = LOG_INTERVAL,
        monotonic: Callable[[], float],
        limit: int | None = None,
        on_refuse: Callable[[str], None] = lambda how: None,
    ) -> None:
        self.limit = limit if limit is not None else descriptor_limit()
        if reserve is None:
            reserve = RESERVE if self.limit is None else min(RESERVE, self.limit // 8)
        self.reserve = reserve
        self.interval = interval
        self._monotonic = monotonic
        self._on_refuse = on_refuse
        self._spare: int | None = None
        self._logged_at = -math.inf
        #: refusals since the last log line, and in all
        self.pending = 0
        self.refused = 0

    def __repr__(self) -> str:
        return f"<DescriptorGuard limit={self.limit} reserve={self.reserve} refused={self.refused}>"

    def open(self) -> None:
        """Take the spare descriptor that :meth:`accept_failed` frees to answer a refusal."""
        if self._spare is None:
            with contextlib.suppress(OSError):
                self._spare = os.open(os.devnull, os.O_RDONLY)

    def close(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            os.close(spare)

    def short(self) -> bool:
        """Whether fewer than ``reserve`` descriptors are left (then a handshake is refused)."""
        if self.limit is None:
            return False
        try:
            used = descriptors_in_use()
        except OSError:
            return True  # not even one left to look
        return used is not None and used >= self.limit - self.reserve

    def refuse(self, how: str) -> None:
        """Count one refused connection (``how``: ``handshake`` or ``accept``); log it unless
        a line was written in the last interval."""
        self.refused += 1
        self.pending += 1
        self._on_refuse(how)
        now = self._monotonic()
        if now - self._logged_at < self.interval:
            return
        self._logged_at = now
        try:
            used = descriptors_in_use()
        except OSError:
            used = None
        log.warning(
            "voice_context_descriptors_exhausted",
            limit=self.limit,
            in_use=used,
            reserve=self.reserve,
            refused=self.pending,
            how=how,
            next_report_in=self.interval,
        )
        self.pending = 0

    def accept_failed(self, listening: Any) -> None:
        """``accept()`` ran out of descriptors: answer one waiting connection 503, with the spare."""
        sock = getattr(listening, "_sock", listening)  # asyncio hands over a TransportSocket
        if self._spare is not None and isinstance(sock, socket.socket):
            self.close()
            try:
                conn, _ = sock.accept()
            except OSError:
                pass  # nobody waiting after all, or still no descriptor
            else:
                with conn, contextlib.suppress(OSError):
                    conn.setblocking(False)
                    with contextlib.suppress(BlockingIOError):
                        conn.recv(65536)  # read the request: closing on unread data resets
                    conn.send(_raw_refusal())
                    conn.shutdown(socket.SHUT_WR)
            finally:
                self.open()
        self.refuse("accept")

    def exception_handler(
        self, fallback: Callable[[dict[str, Any]], None]
    ) -> Callable[[Any, dict[str, Any]], None]:
        """An event-loop exception handler: accept failures for want of descriptors come here,
        anything else goes to ``fallback``."""

        def handle(loop: Any, context: dict[str, Any]) -> None:
            exc = context.get("exception")
            if context.get("message") == ACCEPT_FAILED and (
                isinstance(exc, OSError) and exc.errno in OUT_OF_DESCRIPTORS
            ):
                self.accept_failed(context.get("socket"))
                return
            fallback(context)

        return handle
