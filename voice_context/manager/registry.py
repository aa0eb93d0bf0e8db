"""What the jobs of the manager share, each given only to the jobs that need it: the sessions
served here (:class:`Served`) and the one task group their background work runs in
(:class:`Background`). Neither knows the manager, nor any job."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVarTuple

import anyio
from anyio.abc import TaskGroup

from voice_context.config import ServerSettings, SummarizerSettings
from voice_context.core.session import SessionEnding
from voice_context.errors import UnknownSession
from voice_context.logs import get_logger
from voice_context.manager.live import Live
from voice_context.manager.runtime import Clock, Feed

log = get_logger("voice_context")

SERVER = ServerSettings()
SUMMARIZER = SummarizerSettings()
"""The defaults of the settings the manager takes (one home: :mod:`voice_context.config`)."""

Ts = TypeVarTuple("Ts")


class Now:
    """The manager's clock as the jobs read it: what its :attr:`clock` says now, whichever
    clock the manager was given or set to since (a replay sets its logical one)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def __call__(self) -> float:
        return self.clock()


class Background:
    """The one task group background work (folds, indexing, recall ahead, tier rolls) runs in.

    Its lifetime is lexical: :meth:`running` holds the task group; leaving it stops new work,
    gives the work counted in :attr:`in_flight` ``close_timeout`` seconds to land, then cancels
    the rest. :meth:`settled` waits for all of it to land.
    """

    def __init__(self, close_timeout: float) -> None:
        self.close_timeout = close_timeout
        self.closing = False
        self._tg: TaskGroup | None = None
        self._in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._background = 0
        self._settled = anyio.Event()
        self._settled.set()

    def __repr__(self) -> str:
        state = "closing" if self.closing else "running" if self.entered else "idle"
        return f"<Background {state} in_flight={self._in_flight}>"

    @contextlib.asynccontextmanager
    async def running(self, ending: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
        """Hold the task group; on the way out, call ``ending`` (no new work is started from
        then on), wait (shielded, at most ``close_timeout``) for the work in flight, cancel the rest."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                try:
                    yield
                finally:
                    self.closing = True
                    await ending()
                    with anyio.move_on_after(self.close_timeout, shield=True):
                        await self._idle.wait()
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None

    @property
    def entered(self) -> bool:
        """Whether :meth:`running` holds the task group now (closing or not)."""
        return self._tg is not None

    @property
    def started(self) -> bool:
        """Whether background work may be started now (inside :meth:`running`, not closing)."""
        return self.entered and not self.closing

    @property
    def in_flight(self) -> int:
        """Folds and tier rolls running now (what a shutdown waits for)."""
        return self._in_flight

    def spawn(self, fn: Callable[[*Ts], Coroutine[Any, Any, Any]], *args: *Ts) -> None:
        """Run ``fn`` in the background; it starts after the caller's next checkpoint, so a
        reply is built from what exists now, never from what the work would make."""
        assert self._tg is not None, "background work starts only inside 'async with'"
        self._background += 1
        if self._background == 1:
            self._settled = anyio.Event()
        self._tg.start_soon(self._counted, fn, *args)

    async def _counted(self, fn: Callable[[*Ts], Coroutine[Any, Any, Any]], *args: *Ts) -> None:
        try:
            await fn(*args)
        finally:
            self._background -= 1
            if self._background == 0:
                self._settled.set()

    async def settled(self) -> None:
        """Wait until every piece of background work started so far has landed: the folds
        (with the folds of a backlog after them), the tier rolls, the recall indexing, the
        searches of recall ahead and the index writes of sessions let go, and whatever they
        started in turn. What a context, a state or the store shows then is what that work
        made. For a replay on a logical clock, which lets the work of one message land
        before the next, and for tests, which await it instead of sleeping."""
        while self._background:
            await self._settled.wait()

    async def wait_idle(self) -> None:
        """Wait until no compaction or tier roll runs here (what a shutdown waits for; the
        indexing and recall ahead may still run: :meth:`settled` waits for them too)."""
        while self._in_flight:
            await self._idle.wait()

    def begin(self) -> None:
        """Count a fold or a roll as in flight until its :meth:`end`."""
        self._in_flight += 1
        if self._in_flight == 1:
            self._idle = anyio.Event()

    def end(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()


class Served:
    """The sessions served here, by name, and who owns each."""

    def __init__(self, feed: Feed, clock: Clock) -> None:
        self.live: dict[str, Live] = {}
        self._feed = feed
        self._clock = clock

    def __repr__(self) -> str:
        return f"<Served sessions={len(self.live)}>"

    def get(self, name: str, owner: str | None, *, check_owner: bool = True) -> Live:
        """The session served here by this name (for ``owner``); raises ``UnknownSession``."""
        live = self.live.get(name)
        if live is None or (check_owner and live.owner != owner):
            raise UnknownSession(name)
        return live

    def serves(self, live: Live) -> bool:
        """Whether ``live`` is still the copy served here under its name."""
        return self.live.get(live.session.name) is live

    async def end(self, live: Live) -> None:
        """No new compaction starts in the session (it closes, or is no longer served here)."""
        await self._feed(live, SessionEnding(self._clock()))

    async def disown(self, live: Live) -> None:
        """Stop serving a copy whose session the store gives another owner (or nobody): this
        replica must not act for its owner on what the store now keeps under that name."""
        session = live.session
        log.warning("voice_context_session_disowned", session=session.name)
        await self.end(live)
        live.cancel_fold()
        if self.serves(live):
            del self.live[session.name]


__all__ = ["SERVER", "SUMMARIZER", "Background", "Now", "Served"]
