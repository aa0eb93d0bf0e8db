"""A voice-context session held open for a framework that handles frames in one task and
cleans up in another: the client lives in a task of its own (a client's lifetime is one
task's, anyio's structured concurrency), and every other task asks it for the session.

When the server is down or hung, one circuit breaker serves every client the held session
makes (one per connection), and a call never waits for a server that failed it once. A
refused connection opens the circuit, and so does a call that did not end within its
timeout (:meth:`HeldSession.within`): a server that takes the connection and never answers
costs one timeout, not one at every turn. While the circuit is open every call fails at
once; once its backoff has passed, the next call starts one try in the background, the
probe, and fails at once too (see :mod:`voice_context.core.breaker`). The probe is a new
connection with the session opened on it: when it is, the circuit is closed and the next
call gets the session. A connection on which a call timed out is let go (it closes in the
background), so that the probe is never a request queued behind one the server never
answered."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio

from voice_context.client import Client, SessionHandle
from voice_context.core.breaker import CircuitBreaker
from voice_context.errors import ConnectionLost, RequestTimeout
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
        self._waitable = False
        """Whether calls may wait for the connection ``_task`` is making: one begun with the
        circuit closed, until a call times out waiting for it. A probe is never waited for."""
        self._leaving: set[asyncio.Task[None]] = set()
        """Tasks let go of after a call timed out on their connection, still closing it."""
        self._ready = asyncio.Event()
        self._stop = asyncio.Event()

    def __repr__(self) -> str:
        state = "connected" if self.connected else f"not connected, circuit {self.breaker.state}"
        return f"<HeldSession {self.session!r} at {self.url} {state}>"

    @property
    def connected(self) -> bool:
        """Whether the session is open on a live connection (the next call gets it at once)."""
        return self._room is not None and self._client is not None and self._client.connected

    @asynccontextmanager
    async def within(self, seconds: float) -> AsyncIterator[SessionHandle]:
        """The session, for a call that must end within ``seconds``: the block.

        Raises ``ConnectionLost`` as :meth:`open` does, and ``TimeoutError`` when the call did
        not end in time: the server did not answer, which opens the circuit as a refused
        connection does, and lets go of the connection the call was waiting on."""
        try:
            with anyio.fail_after(seconds):
                yield await self.open()
        except TimeoutError as exc:
            self._no_answer(f"no answer within {seconds:g}s ({exc!r})")
            raise

    async def open(self) -> SessionHandle:
        """The session; raises ``ConnectionLost`` when the server cannot be reached: at once
        while the circuit is open, starting the probe when its backoff has passed, and while
        the probe or a connection a call timed out on is still being made. Callers bound the
        wait with their own timeout (:meth:`within`)."""
        room, client = self._room, self._client
        if room is not None and client is not None:
            if client.connected:
                return room
            await self._let_go()  # the connection dropped: that client is done, connect again
        if self._task is not None and not self._task.done():
            if not self._waitable:
                raise self._trying()
        else:
            if self.breaker.wait(self.clock()) > 0:
                raise ConnectionLost(f"voice-context at {self.url} did not answer; not tried again yet")
            self._waitable = not self.breaker.failures
            self._ready, self._stop = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._hold(self._ready, self._stop))
            if not self._waitable:
                raise self._trying()
        await self._ready.wait()
        if self._room is None:
            raise ConnectionLost(f"voice-context at {self.url} is not reachable")
        return self._room

    async def close(self) -> None:
        task, self._task = self._task, None
        tasks = set(self._leaving)
        if task is not None:
            tasks.add(task)
            if self._room is None and not self._waitable:
                task.cancel()  # a try nobody waits for: nothing to close, and a hung server would keep it
        self._stop.set()
        if not tasks:
            return
        # asyncio.wait neither raises the task's own end nor swallows the caller's cancellation
        # (which a suppressed CancelledError around wait_for did): a caller cancelled while closing
        # stays cancelled, and a task that does not end within close_timeout is cancelled.
        try:
            _, running = await asyncio.wait(tasks, timeout=self.close_timeout)
        except BaseException:
            for left in tasks:
                left.cancel()  # the caller gave up: the connection is not left behind either
            raise
        if running:
            for left in running:
                left.cancel()
            await asyncio.wait(running, timeout=self.close_timeout)

    def _trying(self) -> ConnectionLost:
        return ConnectionLost(f"voice-context at {self.url} did not answer; trying it in the background")

    def _no_answer(self, error: str) -> None:
        """A call timed out: the circuit opens, no call waits for the connection being made,
        and a connection the session is open on is let go."""
        self._open_circuit(error)
        self._waitable = False
        if self._room is not None:
            task, self._task = self._task, None
            self._client = self._room = None
            self._stop.set()
            if task is not None and not task.done():
                self._leaving.add(task)
                task.add_done_callback(self._leaving.discard)

    def _open_circuit(self, error: str) -> None:
        """The server did not answer: the circuit opens, unless it is open already (counted by
        whatever opened it, a refused connection or another call's timeout)."""
        now = self.clock()
        if not self.breaker.failures and self.breaker.failed(now):
            log.warning(
                "voice_context_client_circuit_opened",
                url=self.url,
                session=self.session,
                error=error,
                retry_in=round(self.breaker.retry_at - now, 3),
            )

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
        except RequestTimeout as exc:  # connected, but the session never opened: as good as down
            self._open_circuit(repr(exc))
        except Exception as exc:  # refused (a token, a session of another token): the next call tries again
            log.warning("voice_context_unreachable", session=self.session, url=self.url, error=repr(exc))
        finally:
            if self._room is room:  # not a newer task's
                self._client = self._room = None
            ready.set()
