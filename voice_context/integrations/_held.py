"""A voice-context session held open for a framework that handles frames in one task and
cleans up in another: the client lives in a task of its own (a client's lifetime is one
task's, anyio's structured concurrency), and every other task asks it for the session."""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from voice_context.client import Client, SessionHandle
from voice_context.errors import ConnectionLost

__all__ = ["HeldSession"]

log = structlog.get_logger("voice_context.integrations")


class HeldSession:
    """One session of a voice-context server, connected on first use, again after a drop."""

    def __init__(
        self, url: str, session: str, *, token: str | None = None, close_timeout: float = 1.0
    ) -> None:
        self.url = url
        self.session = session
        self.token = token
        self.close_timeout = close_timeout
        self._client: Client | None = None
        self._room: SessionHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()

    def __repr__(self) -> str:
        state = "connected" if self._room is not None else "not connected"
        return f"<HeldSession {self.session!r} at {self.url} {state}>"

    async def open(self) -> SessionHandle:
        """The session; raises ``ConnectionLost`` when the server cannot be reached (the next
        call tries again). Callers bound the wait with their own timeout."""
        if self._room is not None and self._client is not None and self._client.connected:
            return self._room
        if self._task is None or self._task.done():
            self._ready, self._stop = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._hold(self._ready, self._stop))
        await self._ready.wait()
        if self._room is None:
            raise ConnectionLost(f"voice-context at {self.url} is not reachable")
        return self._room

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        self._stop.set()
        with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(task, self.close_timeout)

    async def _hold(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        try:
            async with Client(self.url, token=self.token, reconnect=False) as client:
                room = await client.open(self.session)
                self._client, self._room = client, room
                ready.set()
                await stop.wait()
        except Exception as exc:  # unreachable, refused, dropped: the next call tries again
            log.warning("voice_context_unreachable", session=self.session, url=self.url, error=repr(exc))
        finally:
            self._client = self._room = None
            ready.set()
