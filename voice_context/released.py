"""Websocket connections whose socket transport is freed by reference count once lost.

CPython 3.11's socket transport keeps a bound method of its own (``_read_ready_cb``) for its
life: a reference cycle, so every closed connection's transport, socket and their dicts
outlive it until a cyclic collection. Under ``serve``'s frozen collector that is until a thaw
(see :mod:`voice_context.server.collector`); in a bot's process, until its collector's next full
pass. 3.12 drops the method when the connection is lost (CPython gh-100348); the connections
here do the same on 3.11, once the transport has finished its own closing. On 3.12 and later
the attribute is already ``None`` and nothing happens.
"""

from __future__ import annotations

import asyncio

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection


def release(transport: asyncio.BaseTransport) -> None:
    """Drop the transport's reference to its own bound method; it reads nothing more once closed."""
    if transport.is_closing() and getattr(transport, "_read_ready_cb", None) is not None:
        transport._read_ready_cb = None  # type: ignore[attr-defined]


class _Released(Connection):
    """Either end's connection, its transport released once lost (see the module)."""

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        asyncio.get_running_loop().call_soon(release, self.transport)


class ReleasedConnection(_Released, ServerConnection):
    """The server's end (given to ``serve`` as ``create_connection``)."""


class ReleasedClientConnection(_Released, ClientConnection):
    """The client's end (given to ``connect`` as ``create_connection``)."""
