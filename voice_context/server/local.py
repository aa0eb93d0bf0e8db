"""A connection in the process: the server's own handlers, without a socket.

What a websocket connection is to a bot, :class:`LocalConnection` is to code in the same
process (the replay feeds its recordings through one for each session): each request is
answered by the server's handler table (:mod:`voice_context.server.handlers`), one at a
time, and its reply comes back through the codec, typed and as a bot reads it. The events
the manager pushes to a connection's sessions are not followed here: whoever needs them
listens to the manager itself.

::

    handlers = local_handlers(manager, ServerSettings())
    conn = LocalConnection(handlers)
    reply, sent = await conn.request(SessionOpen("room-1"))
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from voice_context import codec
from voice_context.codec import ClientMessage, Compacted, CompactionFailure, Reply
from voice_context.config import ServerSettings
from voice_context.manager import CompactionEvent, SessionManager
from voice_context.server import inspector
from voice_context.server.handlers import Handlers
from voice_context.server.limits import Limits
from voice_context.server.metrics import Metrics


def local_handlers(
    manager: SessionManager, settings: ServerSettings, *, overrides: Mapping[str, Any] | None = None
) -> Handlers:
    """The server's handlers over ``manager``, for connections in the process: nothing is
    recorded, no rate limit is metered (what they are fed, a server took already, or the
    operator sends), and ``overrides`` go on top of every ``session.open``'s config."""
    return Handlers(
        manager=manager,
        settings=settings,
        limits=Limits(settings, time.monotonic, metered=False),
        metrics=Metrics(),
        journal=inspector.Journal(),
        recorder=None,
        stopping=lambda: False,
        overrides=dict(overrides or {}),
    )


@dataclass(eq=False)
class LocalConnection:
    """One connection in the process to ``handlers`` (a :class:`~voice_context.server.handlers.Peer`)."""

    handlers: Handlers
    owner: str | None = None
    sessions: set[str] = field(default_factory=set)
    _frames: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"<LocalConnection sessions={len(self.sessions)}>"

    def push(self, event: CompactionEvent) -> None:
        """Not followed here (see the module)."""

    async def reply(self, frame: str) -> None:
        self._frames.append(frame)

    async def request(self, message: ClientMessage) -> tuple[Reply, dict[str, Any]]:
        """Answer ``message`` as a server answers it: its reply, typed and as sent (an ``error``
        reply is returned, as a bot would read it)."""
        await self.handlers.dispatch(self, message, codec.message_dict(message))
        [frame] = self._frames  # a handler answers every request once
        self._frames.clear()
        reply, sent = codec.parse_reply(frame)
        assert not isinstance(reply, Compacted | CompactionFailure), "an event is pushed, never replied"
        return reply, sent

    async def close(self) -> None:
        """Let go of the sessions it holds, as a connection that ends does."""
        await self.handlers.release(self)


__all__ = ["LocalConnection", "local_handlers"]
