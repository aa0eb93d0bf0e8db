"""The manager's public face: one method per thing a shell asks of a session, each handed to
the job that does it (see the package docstring)."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio

from voice_context.config import AheadMode, session_defaults
from voice_context.core.budget import Context, Format
from voice_context.core.config import SessionConfig
from voice_context.core.handoff import LAST_TURNS, Handoff
from voice_context.core.landmarks import Landmark, LandmarkSource
from voice_context.core.session import (
    Applied,
    CommitCompaction,
    Failed,
    NoteReceived,
    NotesChanged,
    PersistNotes,
    PinRequested,
    RecallAhead,
    RollTiers,
    Session,
    SessionEnding,
    SessionStats,
    Stale,
    StartCompaction,
    StoreLandmark,
    TurnAppended,
    TurnHeld,
    UnpinRequested,
)
from voice_context.core.tiers import TIERS, Tier
from voice_context.core.turns import Note, Turn
from voice_context.core.window import Skip
from voice_context.errors import ConfigError, StoreError, TurnConflict, UnknownSession
from voice_context.logs import get_logger
from voice_context.manager.compactions import Compactions
from voice_context.manager.indexing import Indexing
from voice_context.manager.leases import Leases
from voice_context.manager.live import Listener, Live, Opened
from voice_context.manager.outcomes import Outcomes
from voice_context.manager.recall import Recall
from voice_context.manager.registry import SERVER, SUMMARIZER, Background, Now, Served
from voice_context.manager.replicas import Replicas
from voice_context.manager.replies import Replies
from voice_context.manager.runtime import Runtime
from voice_context.manager.tiers import Tiers
from voice_context.manager.writes import Writes
from voice_context.store.base import Store
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import Summarizer
from voice_context.tiering import RollReport

if TYPE_CHECKING:  # (numpy loads only with an embedder)
    from voice_context.recall.embedding import Embedder

log = get_logger("voice_context")


class SessionManager:
    """Owns the live sessions and runs their compactions. See :mod:`voice_context.manager`.

    It composes the jobs, each given only what it needs (the store, the clock, the feed, the
    background task group, the sessions served here), and hands each request to the job that
    does it: :class:`Replicas` (opening, ownership, catch-up), :class:`Compactions` with
    :class:`Leases` (folds), :class:`Indexing` and :class:`Recall`, :class:`Tiers`, and
    :class:`Replies` (contexts, handoffs, emergencies). Every event reaches a session through
    its one feed point (:attr:`runtime`), whose performers are those jobs.
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
        #: whether entering reads the default tokenizer (some 1 s), before a reply counts tokens
        self.tokenizer_ahead = tokenizer_ahead
        self.config = config or session_defaults(summarizer)
        self.store: Store = store if store is not None else MemoryStore()
        self.compaction_timeout = compaction_timeout
        self.lease_ttl = lease_ttl
        self.close_timeout = close_timeout
        self._now = now = Now(clock)  # what the jobs read the clock through
        self.replica = replica or uuid.uuid4().hex[:12]
        #: the one feed point of the sessions served here, and the performers of their effects
        self.runtime = Runtime()
        self.feed = feed = self.runtime.feed
        self._background = background = Background(close_timeout)
        self._served = served = Served(feed, now)
        store = self.store
        self._tiers = Tiers(store, summarizer, now, feed, background, served)
        self._indexing = Indexing(store, embedder, background, served)
        self._recall = Recall(store, embedder, recall_ahead, background, self._indexing)
        self._replicas = Replicas(
            store, self.config, now, feed, background, served, self._tiers, self._indexing
        )
        self._outcomes = outcomes = Outcomes(feed, now, summarizer)
        leases = Leases(store, self.replica, lease_ttl, served, self._replicas, outcomes)
        self._compactions = Compactions(
            store, summarizer, compaction_timeout, now, feed, background, leases, outcomes
        )
        self._replies = Replies(
            self.config.tokenizer if tokenizer_ahead else None,
            served,
            now,
            feed,
            self._compactions,
            outcomes,
            self._indexing,
            self._recall,
            self._tiers,
        )
        self._stack: contextlib.AsyncExitStack | None = None
        # who performs each effect the sessions' cores say (an answer alone has no performer)
        performs = self.runtime.performs
        performs(TurnHeld, self._indexing.held)
        performs(RecallAhead, self._recall.ahead)
        performs(StartCompaction, self._compactions.start)
        performs(Skip, self._compactions.skipped)
        performs(CommitCompaction, self._compactions.commit)
        performs(Applied, outcomes.applied)
        performs(Failed, outcomes.failed)
        performs(Stale, outcomes.dropped)
        performs(RollTiers, self._tiers.ended)
        writes = Writes(store, feed, self._indexing)
        performs(StoreLandmark, writes.landmark)
        performs(PersistNotes, writes.notes)

    def __repr__(self) -> str:
        return (
            f"<SessionManager sessions={len(self.live)} in_flight={self.in_flight} "
            f"summarizer={self.summarizer.model}>"
        )

    # -- lifetime --------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self._replies.preload()
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(self._background.running(self._end_every_session))
            self._stack = stack.pop_all()
        return self

    async def _end_every_session(self) -> None:
        for live in list(self.live.values()):
            await self._served.end(live)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        stack, self._stack = self._stack, None
        assert stack is not None, "the manager was not entered"
        return await stack.__aexit__(exc_type, exc, tb)

    # -- what it holds ---------------------------------------------------------

    @property
    def clock(self) -> Callable[[], float]:
        """The manager's clock (a replay sets its logical one: the jobs follow it)."""
        return self._now.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self._now.clock = clock

    @property
    def recall_ahead(self) -> AheadMode:
        """When recall runs ahead of the reply (see :mod:`voice_context.manager`)."""
        return self._recall.recall_ahead

    @recall_ahead.setter
    def recall_ahead(self, mode: AheadMode) -> None:
        self._recall.recall_ahead = mode

    @property
    def live(self) -> dict[str, Live]:
        """The sessions served here, by name."""
        return self._served.live

    def get(self, name: str, owner: str | None, *, check_owner: bool = True) -> Live:
        """The session served here by this name (for ``owner``); raises ``UnknownSession``."""
        return self._served.get(name, owner, check_owner=check_owner)

    @property
    def closing(self) -> bool:
        """Whether the manager is shutting down (no new work starts)."""
        return self._background.closing

    @property
    def in_flight(self) -> int:
        """Folds and tier rolls running now (what a shutdown waits for)."""
        return self._background.in_flight

    async def wait_idle(self) -> None:
        """Wait until no compaction or tier roll runs here (what a shutdown waits for; the
        indexing and recall ahead may still run: :meth:`settled` waits for them too)."""
        await self._background.wait_idle()

    async def settled(self) -> None:
        """Wait until every piece of background work started so far has landed: the folds
        (with the folds of a backlog after them), the tier rolls, the recall indexing, the
        searches of recall ahead and the index writes of sessions let go, and whatever they
        started in turn. What a context, a state or the store shows then is what that work
        made. For a replay on a logical clock, which lets the work of one message land
        before the next, and for tests, which await it instead of sleeping."""
        await self._background.settled()

    @property
    def counters(self) -> dict[str, int]:
        """How many folds started, completed, failed, or came back stale."""
        return self._outcomes.counters

    @property
    def listeners(self) -> list[Listener]:
        """Told of every session's compactions."""
        return self._outcomes.listeners

    # -- listeners -------------------------------------------------------------

    def add_listener(self, listener: Listener, session: str | None = None) -> None:
        """Call ``listener`` for compaction events of one session, or of all of them."""
        if session is None:
            self.listeners.append(listener)
        else:
            self.get(session, None, check_owner=False).listeners.append(listener)

    def remove_listener(self, listener: Listener, session: str | None = None) -> None:
        targets = [self.listeners]
        if session is not None and session in self.live:
            targets.append(self.live[session].listeners)
        for target in targets:
            if listener in target:
                target.remove(listener)

    # -- sessions --------------------------------------------------------------

    @property
    def sessions(self) -> int:
        return len(self.live)

    def owner(self, name: str) -> str | None:
        """Who owns a live session (``None``: opened without a token)."""
        return self.get(name, None, check_owner=False).owner

    def names(self) -> list[str]:
        return list(self.live)

    def state(self, name: str, *, owner: str | None = None) -> SessionStats:
        return self.get(name, owner).session.stats()

    def session(self, name: str, *, owner: str | None = None) -> Session:
        """The live session object (for inspection; mutate it only through the manager)."""
        return self.get(name, owner).session

    async def open(
        self, name: str, overrides: dict[str, Any] | None = None, *, owner: str | None = None
    ) -> Opened:
        """Open a session, resuming it from memory or from the store if it exists.

        ``overrides`` change the session's limits (see :class:`SessionConfig`);
        raises ``ConfigError`` for an unknown or invalid one, ``UnknownSession``
        when the session belongs to another owner, ``StoreError`` when the store
        cannot be read.

        The store decides who owns a name, once: the first ``create`` of it wins,
        atomically, so of two owners racing for a new name through any number of
        replicas exactly one gets it (opens of one name here also run one at a
        time). A copy of the session held here is served only while the store's
        session is its owner's; a ``close`` during an open's awaits makes it
        decide again (from the store).
        """
        return await self._replicas.open(name, overrides, owner)

    async def append_turn(self, name: str, turn: Turn, *, owner: str | None = None) -> int:
        """Store the turn durably, then add it to the session; returns its index."""
        live = self.get(name, owner)
        async with live.lock:
            await self._store_turn(live, turn)
            # the core says what follows (indexing, recall ahead, a backlog's fold, a tier
            # roll, its landmark stored), and each is performed as it comes
            effects = await self.feed(live, TurnAppended(turn, self.clock()))
            [held] = [effect for effect in effects if isinstance(effect, TurnHeld)]
            return held.index

    async def _store_turn(self, live: Live, turn: Turn) -> None:
        """Append the turn in the store after the session's last turn; when another replica
        appended meanwhile, adopt the store's view and append after it (once)."""
        name = live.session.name
        index = live.session.total_turns
        try:
            await self.store.append_turn(name, index, turn)
        except TurnConflict as conflict:
            await self._replicas.catch_up_locked(live)
            if live.session.total_turns == index:
                raise
            index = live.session.total_turns
            try:
                await self.store.append_turn(name, index, turn)
            except TurnConflict:
                await self._replicas.catch_up_locked(live)
                text = f"session {name!r} is being appended to elsewhere at the same time: try again"
                raise StoreError(text, retryable=True) from conflict

    async def append_note(self, name: str, note: Note, *, owner: str | None = None) -> NotesChanged:
        """Add a screen-watch note; evicted notes queue for the next compaction."""
        live = self.get(name, owner)
        async with live.lock:  # the session is not rebuilt, nor its notes changed, while held
            effects = await self.feed(live, NoteReceived(note))
            [persist] = [effect for effect in effects if isinstance(effect, PersistNotes)]
            return persist.changed

    async def close(self, name: str, *, owner: str | None = None) -> None:
        """Stop serving a session here. Its state stays in the store; a compaction in
        flight is cancelled (the next one on reopen redoes it). With tiers on, its open
        conversation ends: it is rolled first (within ``close_timeout``; a roll left
        undone is made by the next roll of the session, as the sweep does)."""
        live = self.get(name, owner)
        if live.session.config.tiers and not self.closing:
            with anyio.move_on_after(self.close_timeout):
                try:
                    await self._tiers.roll(live, closed=True)
                except Exception as exc:
                    log.warning("voice_context_tier_roll_failed", session=name, error=str(exc)[:300])
            live = self.get(name, owner)
        await self.feed(live, SessionEnding(self.clock()))
        live.cancel_fold()
        self._indexing.release(live)
        self.live.pop(name, None)

    async def delete(self, name: str, *, owner: str | None = None) -> None:
        """Forget a session: close it here and delete everything the store keeps of it.

        Raises ``UnknownSession`` when it is not open here for ``owner``; an open of the
        same name waits for the delete, and then creates a new session.
        """
        async with self._replicas.opening(name):
            Indexing.drop_held(self.get(name, owner))  # deleted with the session, not written
            await self.close(name, owner=owner)
            record = await self.store.load(name)
            if record is not None and record.owner != owner:
                # the copy closed here was stale: the store's session by this name is another's
                log.warning("voice_context_session_disowned", session=name, reason="delete")
                raise UnknownSession(name)
            await self.store.delete(name)

    async def retain(self) -> list[str]:
        """Apply the store's retention policy once (``session_ttl``; nothing without one): the
        sessions open here are in use (their idle time starts again), and every session idle
        for longer is forgotten. Returns the forgotten sessions' names when the store knows
        them (Redis forgets idle keys by itself). The server calls it periodically; call it
        yourself, more often than the ttl, when you use a manager on a store with a ttl."""
        if self.store.session_ttl is None:
            return []
        await self.store.touch(self.names())
        return await self.store.expire()

    # -- replies ---------------------------------------------------------------

    async def context(
        self,
        name: str,
        format: Format = "messages",
        *,
        budget_chars: int | None = None,
        budget_tokens: int | None = None,
        base_instructions: str = "",
        facts: Sequence[str] = (),
        query: str | None = None,
        owner: str | None = None,
    ) -> Context:
        """The context for the next reply. Starts a compaction in the background when due;
        never waits for one.

        ``query`` is what recall looks for in the session's older history; by
        default the newest user turn. The context says what it recalled.
        ``budget_tokens`` is counted with the session's ``tokenizer``, and then
        the context reports its size in that count (``tokens``).
        """
        return await self._replies.context(
            name,
            format,
            budget_chars=budget_chars,
            budget_tokens=budget_tokens,
            base_instructions=base_instructions,
            facts=facts,
            query=query,
            owner=owner,
        )

    async def handoff(
        self,
        name: str,
        *,
        limit_chars: int | None = None,
        base_instructions: str = "",
        facts: Sequence[str] = (),
        query: str | None = None,
        last_turns: int = LAST_TURNS,
        owner: str | None = None,
    ) -> Handoff:
        """What a fresh provider session needs to go on (see :mod:`voice_context.core.handoff`):
        the context as ``instructions`` within ``limit_chars`` (by default the session's
        ``instructions_budget_chars``), ending with the questions still open, and the newest
        ``last_turns`` turns."""
        return await self._replies.handoff(
            name,
            limit_chars=limit_chars,
            base_instructions=base_instructions,
            facts=facts,
            query=query,
            last_turns=last_turns,
            owner=owner,
        )

    async def overflow(
        self,
        name: str,
        format: Format = "messages",
        *,
        limit_tokens: int | None = None,
        budget_chars: int | None = None,
        base_instructions: str = "",
        facts: Sequence[str] = (),
        query: str | None = None,
        owner: str | None = None,
    ) -> tuple[Context, Applied | None]:
        """Emergency compaction: the bot's model refused its context as too long.

        Keeps the safety region (the last user turn, the last iteration and any open tool
        chain) unchanged, folds everything verbatim before it at once (two halves by tokens,
        each compressed and folded without a model, merged into the summary), commits that,
        and returns the context rebuilt under ``limit_tokens`` with what moved. Raises
        :class:`ContextOverflow` at once when the base instructions and the safety region
        alone exceed the limit. A fold in flight is superseded (its result is dropped).
        """
        live = self.get(name, owner)
        applied = await self._replies.emergency(live, format, limit_tokens, base_instructions)
        context = await self.context(
            name,
            format,
            budget_chars=budget_chars,
            budget_tokens=limit_tokens,
            base_instructions=base_instructions,
            facts=facts,
            query=query,
            owner=owner,
        )
        return context, applied

    # -- landmarks -------------------------------------------------------------

    async def pin(
        self,
        name: str,
        index: int,
        *,
        kind: str = "other",
        reason: str = "",
        source: LandmarkSource = "manual",
        owner: str | None = None,
    ) -> Landmark:
        """Pin the turn at ``index`` as a landmark (replacing one already there) and store it.

        Raises ``IndexError`` when the session has no such turn.
        """
        live = self.get(name, owner)
        async with live.lock:
            session = live.session
            if not 0 <= index < session.total_turns:
                raise IndexError(f"session {name!r} has no turn {index} (it has {session.total_turns})")
            if index >= session.cursor:
                turn = session.turn(index)
            else:
                [turn] = await self.store.read_turns(name, index, index + 1)
            landmark = Landmark(index, turn, kind, reason, source, self.clock())
            await self.store.save_landmark(name, landmark)
            await self.feed(live, PinRequested(landmark))
            log.info("voice_context_landmark_pinned", session=name, index=index, kind=kind, source=source)
            return landmark

    async def unpin(self, name: str, index: int, *, owner: str | None = None) -> bool:
        """Unpin the landmark at ``index``; returns whether there was one."""
        live = self.get(name, owner)
        async with live.lock:
            removed = await self.store.delete_landmark(name, index)
            unpinned = await self.feed(live, UnpinRequested(index, self.clock()))
            removed = bool(unpinned) or removed
            log.info("voice_context_landmark_unpinned", session=name, index=index, removed=removed)
            return removed

    # -- recall indexing -------------------------------------------------------

    def indexing_lag(self, name: str, *, owner: str | None = None) -> int:
        """How many of the session's turns and notes wait for the recall index, or (with an
        embedder) for their vectors: work done in the background; 0 when recall sees everything."""
        return self._indexing.lag(self.get(name, owner))

    def indexing_lags(self) -> tuple[int, int]:
        """The largest :meth:`indexing_lag` of the live sessions, and their sum."""
        lags = [self._indexing.lag(live) for live in self.live.values()]
        return max(lags, default=0), sum(lags)

    async def wait_indexed(self, name: str, *, owner: str | None = None) -> int:
        """Wait for the background indexing of the session to finish; returns the lag left
        (0 unless the store keeps failing): for tools, benchmarks and tests."""
        lag = self.indexing_lag(name, owner=owner)
        while lag:
            live = self.get(name, owner)
            self._indexing.maybe_index(live)
            if not live.recall.running:
                break
            await live.recall.done.wait()
            before, lag = lag, self.indexing_lag(name, owner=owner)
            if lag >= before:
                break
        return lag

    # -- the tier cascade ------------------------------------------------------

    async def roll_tiers(
        self,
        name: str,
        *,
        owner: str | None = None,
        on_demand: bool = False,
        closed: bool = False,
        tiers: Sequence[Tier] = TIERS,
    ) -> RollReport:
        """Make the tier rolls due now for a session open here (every one, as far back as
        they are missing); ``on_demand`` rolls every ended period of ``tiers`` whatever the
        schedule. Raises ``ConfigError`` when the session does not keep tiers."""
        live = self.get(name, owner)
        if not live.session.config.tiers:
            raise ConfigError(f"session {name!r} does not keep tiers (set tiers = true)")
        return await self._tiers.roll(live, on_demand=on_demand, closed=closed, tiers=tiers)

    async def tick(self) -> None:
        """Start the tier rolls the clock has made due in every session open here (the
        server calls this periodically; a day's roll time passes without any traffic)."""
        for live in list(self.live.values()):
            self._tiers.maybe_roll(live)
