"""The registry every job of the manager shares: its settings, the sessions served here, the
one task group their background work runs in, and the counters and listeners it tells."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVarTuple

import anyio
from anyio.abc import TaskGroup

from voice_context.config import AheadMode, ServerSettings, SummarizerSettings, session_defaults
from voice_context.core.config import SessionConfig
from voice_context.core.session import SessionEnding
from voice_context.errors import UnknownSession
from voice_context.logs import get_logger
from voice_context.manager.live import CompactionEvent, Listener, Live
from voice_context.store.base import Store
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import Summarizer

if TYPE_CHECKING:  # (numpy loads only with an embedder)
    from voice_context.recall.embedding import Embedder

log = get_logger("voice_context")

SERVER = ServerSettings()
SUMMARIZER = SummarizerSettings()
"""The defaults of the settings the manager takes (one home: :mod:`voice_context.config`)."""

Ts = TypeVarTuple("Ts")


class Registry:
    """The sessions served here (by name) and what every job needs to serve them.

    Its lifetime is lexical: :meth:`running` holds the task group that background work
    (folds, indexing, recall ahead, tier rolls) runs in; leaving it stops new work, gives
    the work counted in :attr:`in_flight` ``close_timeout`` seconds to land, then cancels
    the rest. :meth:`settled` waits for all of it to land.
    """

    def __init__(
        self,
        summarizer: Summarizer,
        *,
        config: SessionConfig | None = None,
        store: Store | None = None,
        compaction_timeout: float = SUMMARIZER.compaction_timeout,
        close_timeout: float = SERVER.shutdown_timeout,
        clock: Callable[[], float] = time.time,
        replica: str | None = None,
        embedder: Embedder | None = None,
        lease_ttl: float = SERVER.lease_ttl,
        recall_ahead: AheadMode = "first",
        tokenizer_ahead: bool = True,
    ) -> None:
        if lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive")
        self.summarizer = summarizer
        self.embedder = embedder
        self.recall_ahead = recall_ahead
        #: whether entering reads the default tokenizer (some 1 s), before a reply counts tokens
        self.tokenizer_ahead = tokenizer_ahead
        self.config = config or session_defaults(summarizer)
        self.store: Store = store if store is not None else MemoryStore()
        self.compaction_timeout = compaction_timeout
        self.lease_ttl = lease_ttl
        self.close_timeout = close_timeout
        self.clock = clock
        self.replica = replica or uuid.uuid4().hex[:12]
        self.live: dict[str, Live] = {}
        self.closing = False
        self.counters: dict[str, int] = {"started": 0, "completed": 0, "failed": 0, "stale": 0}
        self.listeners: list[Listener] = []
        self._tg: TaskGroup | None = None
        self._in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self._background = 0
        self._settled = anyio.Event()
        self._settled.set()
        self._assemble()

    def _assemble(self) -> None:
        """Build the jobs that share this registry (see :class:`~voice_context.manager.SessionManager`)."""

    # -- the sessions ----------------------------------------------------------

    def get(self, name: str, owner: str | None, *, check_owner: bool = True) -> Live:
        """The session served here by this name (for ``owner``); raises ``UnknownSession``."""
        live = self.live.get(name)
        if live is None or (check_owner and live.owner != owner):
            raise UnknownSession(name)
        return live

    def serves(self, live: Live) -> bool:
        """Whether ``live`` is still the copy served here under its name."""
        return self.live.get(live.session.name) is live

    def disown(self, live: Live) -> None:
        """Stop serving a copy whose session the store gives another owner (or nobody): this
        replica must not act for its owner on what the store now keeps under that name."""
        session = live.session
        log.warning("voice_context_session_disowned", session=session.name)
        session.receive(SessionEnding(self.clock()))
        live.cancel_fold()
        if self.serves(live):
            del self.live[session.name]

    # -- the background --------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Hold the task group background work runs in; on the way out, end every session,
        wait (shielded, at most ``close_timeout``) for the work in flight, cancel the rest."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                try:
                    yield
                finally:
                    self.closing = True
                    for live in self.live.values():
                        live.session.receive(SessionEnding(self.clock()))
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

    # -- telling ---------------------------------------------------------------

    def emit(self, live: Live, event: CompactionEvent) -> None:
        """Tell the listeners of every session, then the session's own."""
        for listener in [*self.listeners, *live.listeners]:
            try:
                listener(event)
            except Exception:  # a listener's bug must not lose the compaction
                log.exception("voice_context_listener_failed", session=event.session)
