"""A voice-context session held open for a framework that handles frames in one task and
cleans up in another: the client lives in a task of its own (a client's lifetime is one
task's, anyio's structured concurrency), and every other task asks it for the session.

When the server is down, one circuit breaker serves every client the held session makes
(one per connection): after a failed try, calls fail at once until its backoff has passed,
then one call's try is the probe while the others still fail at once (see
:mod:`voice_context.core.breaker`). A bot that bounds each call with a short timeout
waits for a sidecar that is down once, not at every turn."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from voice_context.client import Client, SessionHandle
from voice_context.core.breaker import CircuitBreaker
from voice_context.errors import ConnectionLost
from voice_context.logs import get_logger

__all__ = ["HeldSession"]

log = get_logger("voice_context.integrations")


class HeldSession:
    """One session of a voice-context server, connected on first use, again after a drop."""

    def __init__(
        self,
        url: str,
        session: str,
        *,
        token: str | None = None,
        close_timeout: float = 1.0,
        breaker: CircuitBreaker | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.session = session
        self.token = token
        self.close_timeout = close_timeout
        self.breaker = breaker if breaker is not None else CircuitBreaker()
        self.clock = clock
        self._client: Client | None = None
        self._room: SessionHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()

    def __repr__(self) -> str:
        state = "connected" if self._room is not None else f"not connected, circuit {self.breaker.state}"
        return f"<HeldSession {self.session!r} at {self.url} {state}>"

    async def open(self) -> SessionHandle:
        """The session; raises ``ConnectionLost`` when the server cannot be reached: at once
        while the circuit is open or another call is trying it. Callers bound the wait with
        their own timeout."""
        room, client = self._room, self._client
        if room is not None and client is not None:
            if client.connected:
                return room
            await self._let_go()  # the connection dropped: that client is done, connect again
        if self._task is None or self._task.done() or not self._ready.is_set():
            wait = self.breaker.wait(self.clock())
            if wait > 0:
                raise ConnectionLost(f"voice-context at {self.url} did not answer; not tried again yet")
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
        # asyncio.wait neither raises the task's own end nor swallows the caller's cancellation
        # (which a suppressed CancelledError around wait_for did): a caller cancelled while closing
        # stays cancelled, and a task that does not end within close_timeout is cancelled.
        try:
            _, running = await asyncio.wait({task}, timeout=self.close_timeout)
        except BaseException:
            task.cancel()  # the caller gave up: the connection is not left behind either
            raise
        if running:
            task.cancel()
            await asyncio.wait({task}, timeout=self.close_timeout)

    async def _let_go(self) -> None:
        """End the task holding a client whose connection dropped (not cancelled by the caller's
        own timeout: that client closes either way)."""
        task, self._task = self._task, None
        self._client = self._room = None
        self._stop.set()
        if task is not None:
            await asyncio.wait({task}, timeout=self.close_timeout)

    async def _hold(self, ready: asyncio.Event, stop: asyncio.Event) -> None:
        room: SessionHandle | None = None
        try:
            async with Client(
                self.url, token=self.token, reconnect=False, breaker=self.breaker, clock=self.clock
            ) as client:
                room = await client.open(self.session)
                self._client, self._room = client, room
                ready.set()
                await stop.wait()
        except ConnectionLost as exc:  # the client's circuit logs when the server goes and comes back
            log.debug("voice_context_unreachable", session=self.session, url=self.url, error=repr(exc))
        except Exception as exc:  # refused (a token, a session of another token): the next call tries again
            log.warning("voice_context_unreachable", session=self.session, url=self.url, error=repr(exc))
        finally:
            if self._room is room:  # not a newer task's
                self._client = self._room = None
            ready.set()
