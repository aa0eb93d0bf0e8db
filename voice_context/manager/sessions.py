"""The async shell around the pure sessions: one task group, compactions in the background.

:class:`SessionManager` owns every live session and the task group their
compactions run in. A context request never waits on a summarizer: it decides,
synchronously, whether a compaction should start, starts it in the background,
and returns the context built from the summary that exists now.

Lifetimes are lexical::

    async with SessionManager(DeterministicSummarizer()) as manager:
        await manager.open("room-1")
        await manager.append_turn("room-1", Turn("Alice", "user", "hi", at=0.0))
        ctx = await manager.context("room-1", "instructions")

Leaving the block stops new compactions, gives those in flight
``close_timeout`` seconds to land, then cancels the rest.

Recall runs ahead of the reply (``recall_ahead``): when a user turn is stored,
the search for it (a context's default query) starts in the background, so that
the context asked for before the bot answers finds its passages ready instead of
reading the store's index on the reply path. ``first`` (the default) searches
ahead for the first user turn after each context: in a conversation of two, the
turn the bot answers; in a group, at most one search per reply goes unused.
``every`` searches for every user turn, so a group's bot finds the newest ready
too, at the cost of a search per turn; ``off`` never.

What a search finds is a function of the session, not of timing: every search
(ahead or on the reply path) waits for the background indexing to hold every turn
stored and every note seen, and a search ahead is used only when it was made on
the basis the context would search (:class:`_Basis`: the same index, bound,
summary and tiers). A context for another query, or after a turn, a note or a
fold since the search, recalls for itself.
"""

from __future__ import annotations

import contextlib
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Literal, Self

import anyio
import anyio.to_thread
import structlog
from anyio.abc import TaskGroup

from voice_context.config import AheadMode, ServerSettings, SummarizerSettings, session_defaults
from voice_context.core.budget import Context, Format, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.emergency import safety_start
from voice_context.core.handoff import LAST_TURNS, Handoff, fit_questions, open_questions
from voice_context.core.landmarks import Landmark, LandmarkSource
from voice_context.core.recalled import Recalled
from voice_context.core.session import (
    Applied,
    CommitCompaction,
    CompactionAbandoned,
    CompactionFailed,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    ContextView,
    Effect,
    Failed,
    NoteReceived,
    NotesChanged,
    NotesStored,
    OverflowReported,
    PersistNotes,
    PinRequested,
    Reconfigured,
    Restored,
    Session,
    SessionEnding,
    SessionStats,
    Stale,
    StartCompaction,
    SummaryReturned,
    TiersRolled,
    TurnAppended,
    TurnHeld,
    UnpinRequested,
)
from voice_context.core.tiers import (
    TIERS,
    Tier,
    TierSummary,
    hidden_lines,
    parse_zone,
    rolled_through,
    tiered_summary,
)
from voice_context.core.tokens import TokenCounter
from voice_context.core.turns import Note, Turn, TurnRun
from voice_context.core.window import FillBudget, Skip, SkipReason
from voice_context.errors import (
    ConfigError,
    ContextOverflow,
    SessionClosed,
    StoreError,
    SummarizerError,
    TurnConflict,
    UnknownSession,
)
from voice_context.recall.embedding import Embedder
from voice_context.recall.index import (
    DEFAULT_QUERY_COMMON,
    MAX_OLDER_TURNS,
    SummaryIndex,
    default_query,
    indexed,
    note_passage,
    query_time,
    turn_passage,
)
from voice_context.recall.stored import search_store
from voice_context.store.base import SessionRecord, Store
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.fallback import emergency_fold
from voice_context.tiering import RollReport, roll_tiers
from voice_context.tokenizers import load_tokenizer

log = structlog.get_logger("voice_context")

SERVER = ServerSettings()
SUMMARIZER = SummarizerSettings()
"""The defaults of the settings the manager takes (one home: :mod:`voice_context.config`)."""

EMBED_BATCH = 256
"""At most this many docs embedded by one model call in the background."""
INDEX_BATCH = 256
"""At most this many turns indexed by one store write in the background."""
TIER_CHECK_SECONDS = 60.0
"""How often (by the manager's clock) a session with tiers on checks for rolls made due by the
time of day alone; a conversation that ends when a turn comes after a silence is rolled at once."""
OPEN_ATTEMPTS = 3
"""An open that finds no session, fails to create it (another replica did, for the same owner)
and then finds none again (deleted meanwhile) tries this many times before a retryable error."""
OLDER_READS = 3
"""How many times a context reads the turns before the cursor when folds keep moving it
meanwhile; then it shows none of them rather than wait for a still cursor."""
INDEX_WAIT = 2.0
"""The longest a search waits for the background indexing (seconds) before it searches the
index as it stands."""


@dataclass(eq=False)
class _Recall:
    """What a live session keeps here of its recall index (the store holds the index itself):
    how far indexing has come, what waits for it, and two bounded caches."""

    indexed: int = 0
    """Turns ``0 .. indexed-1`` are in the store's index."""
    noted: int = 0
    """How many notes are in the store's index."""
    notes: list[Note] = field(default_factory=list)
    """Notes waiting to be indexed."""
    running: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    vectors: dict[int, Any] | None = None
    """Doc key -> unit vector, when the manager has an embedder."""
    unembedded: list[int] = field(default_factory=list)
    """Indexed doc keys with no vector yet."""
    older: tuple[int, TurnRun] | None = None
    """The turns just before the cursor last read for a context: (how many were asked for, the
    run kept of them, which ends at the cursor it was read for)."""
    summary: SummaryIndex | None = None
    """The words of the summary's lines, indexed once per summary."""
    ahead: _Ahead | None = None
    """Recall for a user turn, run when it was stored (see :meth:`SessionManager.context`)."""
    armed: bool = True
    """Whether the next user turn starts a recall ahead: not while one started since the last
    context is waiting unused (in a group, most turns are not the one the bot answers)."""


@dataclass(frozen=True, slots=True)
class _Basis:
    """What a search's passages are a function of, besides its query: the index it read
    (how many turns and notes it held, and vectors with an embedder: its word counts, so
    its ranking, follow from them), the bound from which turns are shown verbatim and not
    searched, and the summary, cursor and tiers whose lines it searched. Two searches for
    one query on one basis find the same passages."""

    turns: int
    notes: int
    vectors: int
    before: int
    cursor: int
    summary: str
    tiers: tuple[TierSummary, ...]


@dataclass(eq=False)
class _Ahead:
    """Recall run ahead of the reply: for a user turn as soon as it is stored, so that the
    context the bot asks for before answering it finds its passages ready. It answers a
    context whose query is that turn's text and whose basis is the one it searched."""

    query: str
    done: anyio.Event = field(default_factory=anyio.Event)
    found: list[Recalled] | None = None
    basis: _Basis | None = None


@dataclass(frozen=True, slots=True)
class Opened:
    """The answer to ``open``: whether an existing session was resumed, and its counters."""

    name: str
    resumed: bool
    stats: SessionStats


@dataclass(frozen=True, slots=True)
class CompactionEvent:
    """Pushed to listeners when a compaction lands or fails."""

    kind: Literal["completed", "failed"]
    session: str
    cursor: int
    covered_through: int
    summary_chars: int
    latency: float
    old_cursor: int | None = None
    error: str | None = None
    retryable: bool | None = None
    failures: int = 0
    retry_at: float | None = None
    trigger: str | None = None
    """For a completed fold: ``count`` (the batch rule) or ``fill`` (the fill trigger)."""


Listener = Callable[[CompactionEvent], None]


@dataclass(eq=False)
class _Live:
    session: Session
    owner: str | None
    lock: anyio.Lock = field(default_factory=anyio.Lock)
    scope: anyio.CancelScope | None = None
    listeners: list[Listener] = field(default_factory=list)
    recall: _Recall = field(default_factory=_Recall)
    #: the config overrides the store keeps for the session
    overrides: dict[str, Any] = field(default_factory=dict)
    #: the last compaction skip logged at INFO (its reason, and the plan or backoff it was about)
    last_skip: tuple[SkipReason, object] | None = None
    #: with tiers on: the session's rolled summaries, when they were last rolled, and the
    #: roll in progress (one at a time per session here)
    tiers: tuple[TierSummary, ...] = ()
    tiers_checked: float = -math.inf
    rolling: anyio.Lock = field(default_factory=anyio.Lock)
    roll_again: bool = False
    tier_index: tuple[tuple[TierSummary, ...], int, SummaryIndex] | None = None


@dataclass(eq=False)
class _Lease:
    """A compaction lease held while a fold runs: its fencing token, whether a renewal found
    it superseded, and the summarizer call to cancel then."""

    fence: int
    lost: bool = False
    fold: anyio.CancelScope | None = None


class SessionManager:
    """Owns the live sessions and runs their compactions. See the module docstring."""

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
    ) -> None:
        if lease_ttl <= 0:
            raise ValueError("lease_ttl must be positive")
        self.summarizer = summarizer
        self.embedder = embedder
        self.recall_ahead = recall_ahead
        self.config = config or session_defaults(summarizer)
        self.store: Store = store if store is not None else MemoryStore()
        self.compaction_timeout = compaction_timeout
        self.lease_ttl = lease_ttl
        self.close_timeout = close_timeout
        self.clock = clock
        self.replica = replica or uuid.uuid4().hex[:12]
        self._live: dict[str, _Live] = {}
        self._open_locks: dict[str, tuple[anyio.Lock, list[int]]] = {}
        self._tg: TaskGroup | None = None
        self._closing = False
        self._in_flight = 0
        self._idle = anyio.Event()
        self._idle.set()
        self.counters: dict[str, int] = {"started": 0, "completed": 0, "failed": 0, "stale": 0}
        self._listeners: list[Listener] = []
        self._counters: dict[str, TokenCounter] = {}

    def __repr__(self) -> str:
        return (
            f"<SessionManager sessions={len(self._live)} in_flight={self._in_flight} "
            f"summarizer={self.summarizer.model}>"
        )

    # -- lifetime --------------------------------------------------------------

    async def __aenter__(self) -> Self:
        # the default tokenizer's file is read once per process, before the first reply needs it
        tokenizer = self.config.tokenizer
        self._counters[tokenizer] = await anyio.to_thread.run_sync(load_tokenizer, tokenizer)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._tg is not None
        self._closing = True
        for live in self._live.values():
            live.session.receive(SessionEnding(self.clock()))
        with anyio.move_on_after(self.close_timeout, shield=True):
            await self._idle.wait()
        self._tg.cancel_scope.cancel()
        try:
            return await self._tg.__aexit__(exc_type, exc, tb)
        finally:
            self._tg = None

    # -- listeners -------------------------------------------------------------

    def add_listener(self, listener: Listener, session: str | None = None) -> None:
        """Call ``listener`` for compaction events of one session, or of all of them."""
        if session is None:
            self._listeners.append(listener)
        else:
            self._get(session, None, check_owner=False).listeners.append(listener)

    def remove_listener(self, listener: Listener, session: str | None = None) -> None:
        targets = [self._listeners]
        if session is not None and session in self._live:
            targets.append(self._live[session].listeners)
        for target in targets:
            if listener in target:
                target.remove(listener)

    # -- sessions --------------------------------------------------------------

    @property
    def sessions(self) -> int:
        return len(self._live)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def owner(self, name: str) -> str | None:
        """Who owns a live session (``None``: opened without a token)."""
        return self._get(name, None, check_owner=False).owner

    def names(self) -> list[str]:
        return list(self._live)

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
        async with self._opening(name):
            while True:
                if self._closing:
                    raise SessionClosed("the server is shutting down")
                live = self._live.get(name)
                if live is None:
                    return await self._open_from_store(name, overrides, owner)
                if live.owner != owner:
                    if not await self._disowned(live):
                        raise UnknownSession(name)
                    continue  # the copy here was stale: the store decides
                async with live.lock:
                    if self._live.get(name) is not live:
                        continue  # closed while this open waited for the lock
                    try:
                        await self._catch_up_locked(live)
                    except UnknownSession:
                        continue  # the store's session is another owner's now: it decides
                    if overrides:
                        merged = {**live.overrides, **overrides}
                        config = self.config.with_overrides(merged)
                        await self.store.save_config(name, merged)
                        live.overrides = merged
                        before = (live.session.live_notes, live.session.pending_notes)
                        live.session.receive(Reconfigured(config, self.clock()))
                        await self._save_notes_if_changed(live.session, before)
                    if self._live.get(name) is live:
                        return Opened(name, True, live.session.stats())
                # closed during the awaits above: decide again

    @contextlib.asynccontextmanager
    async def _opening(self, name: str) -> AsyncIterator[None]:
        """Hold the open lock of one session name (dropped once nobody waits on it)."""
        entry = self._open_locks.setdefault(name, (anyio.Lock(), [0]))
        lock, waiting = entry
        waiting[0] += 1
        try:
            async with lock:
                yield
        finally:
            waiting[0] -= 1
            if waiting[0] == 0 and self._open_locks.get(name) is entry:
                del self._open_locks[name]

    async def _open_from_store(
        self, name: str, overrides: dict[str, Any] | None, owner: str | None
    ) -> Opened:
        # in use from now on: a retention sweep between this read and the next must not forget it
        await self.store.touch([name])
        record = await self._claim(name, overrides, owner)
        if record is not None:
            merged = {**record.config, **(overrides or {})}
            landmarks = await self.store.load_landmarks(name)
            session = _restore(record, self.config.with_overrides(merged), landmarks)
            if overrides:
                await self.store.save_config(name, merged)
            await self._save_notes_if_changed(session, (record.live_notes, record.pending_notes))
            recall = await self._recall_state(name)
            resumed = True
        else:
            merged = dict(overrides or {})
            session = Session(name, self.config.with_overrides(merged))
            recall = _Recall(vectors={} if self.embedder is not None else None)
            resumed = False
        if self._closing:  # the shutdown began during the awaits above
            raise SessionClosed("the server is shutting down")
        tiers = await self._tier_state(session) if session.config.tiers else ()
        # only opens insert sessions, and they hold this name's open lock
        live = self._live.setdefault(
            name, _Live(session, owner, overrides=merged, recall=recall, tiers=tiers)
        )
        self._maybe_index(live)
        return Opened(name, resumed, live.session.stats())

    async def _claim(
        self, name: str, overrides: dict[str, Any] | None, owner: str | None
    ) -> SessionRecord | None:
        """The store's record of the session for ``owner`` to resume, or ``None`` when this call
        created it. The store decides who owns a name, in one step: of replicas creating one
        name at once, one creates it, and the others resume it (the same owner) or raise
        ``UnknownSession`` (another owner), as they do for a session they find stored."""
        for _ in range(OPEN_ATTEMPTS):
            record = await self.store.load(name)
            if record is None:
                merged = dict(overrides or {})
                self.config.with_overrides(merged)  # an invalid override creates nothing
                created = await self.store.create(SessionRecord(name, config=merged, owner=owner))
                if created.made:
                    return None
                if created.owner != owner:
                    raise UnknownSession(name)
                continue  # created elsewhere meanwhile, for this owner: resume what it stored
            if record.owner != owner:
                raise UnknownSession(name)
            return record
        text = f"session {name!r} is being created and deleted elsewhere at the same time: try again"
        raise StoreError(text, retryable=True)

    async def _save_notes_if_changed(
        self, session: Session, before: tuple[Sequence[Note], Sequence[Note]]
    ) -> None:
        """Persist the note buffers when lowered limits evicted or dropped some of them."""
        after = (session.live_notes, session.pending_notes)
        if (tuple(before[0]), tuple(before[1])) != after:
            await self.store.save_notes(session.name, *after)

    async def append_turn(self, name: str, turn: Turn, *, owner: str | None = None) -> int:
        """Store the turn durably, then add it to the session; returns its index."""
        live = self._get(name, owner)
        async with live.lock:
            index = live.session.total_turns
            before = self._last_at(live.session)
            try:
                await self.store.append_turn(name, index, turn)
            except TurnConflict as conflict:
                # another replica appended meanwhile: adopt the store's view, append after it
                await self._catch_up_locked(live)
                if live.session.total_turns == index:
                    raise
                index = live.session.total_turns
                try:
                    await self.store.append_turn(name, index, turn)
                except TurnConflict:
                    await self._catch_up_locked(live)
                    text = f"session {name!r} is being appended to elsewhere at the same time: try again"
                    raise StoreError(text, retryable=True) from conflict
            [held] = live.session.receive(TurnAppended(turn))
            assert isinstance(held, TurnHeld)
            self._maybe_index(live)
            self._maybe_recall_ahead(live, turn)
            config = live.session.config
            if config.tiers and before is not None and turn.at - before > config.conversation_gap_seconds:
                self._maybe_roll(live, now=True)  # a conversation just ended: roll it
            if held.landmark is not None:
                await self._save_landmark(name, held.landmark)
            return held.index

    async def append_note(self, name: str, note: Note, *, owner: str | None = None) -> NotesChanged:
        """Add a screen-watch note; evicted notes queue for the next compaction."""
        live = self._get(name, owner)
        async with live.lock:  # the session is not rebuilt, nor its notes changed, while held
            session = live.session
            [persist] = session.receive(NoteReceived(note))
            assert isinstance(persist, PersistNotes)
            await self.store.save_notes(name, persist.live, persist.pending)  # a failure changes nothing
            session.receive(NotesStored(persist.staged))
            live.recall.notes.append(note)
            self._maybe_index(live)
            return persist.changed

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
        live = self._get(name, owner)
        tokenizer = live.session.config.tokenizer
        counter = self._counters.get(tokenizer)
        if counter is None:  # the first use of a tokenizer reads its file: off the event loop
            counter = await anyio.to_thread.run_sync(load_tokenizer, tokenizer)
            self._counters[tokenizer] = counter
            live = self._get(name, owner)  # decide again after the await
        if budget_chars is None and format == "instructions":
            budget_chars = live.session.config.instructions_budget_chars
        self._maybe_compact(live, FillBudget(budget_chars, budget_tokens, counter))
        self._maybe_roll(live)
        session = live.session
        text = default_query(session.verbatim_turns) if query is None else query
        ahead = session.config.recall and query is None  # recall ahead is for the default query
        recalled = await self._recalled_ahead(live, text) if ahead else None
        if recalled is None and session.config.recall and text.strip():
            await self._catch_up_index(live)
            _, recalled = await self._recall(live, text, default=query is None)
        older = await self._older(live, older_chars(budget_chars, budget_tokens))
        live = self._get(name, owner)  # decide again after the awaits
        return build_context(
            self._view(live),
            format,
            budget_chars=budget_chars,
            budget_tokens=budget_tokens,
            tokens=counter if budget_tokens is not None else None,  # a whole count costs ~45 us/kchar
            base_instructions=base_instructions,
            facts=facts,
            recalled=recalled or [],
            query=text,
            older=older,
            asked=query is not None,
        )

    def indexing_lag(self, name: str, *, owner: str | None = None) -> int:
        """How many of the session's turns and notes wait for the recall index, or (with an
        embedder) for their vectors: work done in the background; 0 when recall sees everything."""
        return self._lag(self._get(name, owner))

    def _lag(self, live: _Live) -> int:
        recall = live.recall
        waiting = live.session.total_turns - recall.indexed + len(recall.notes)
        return waiting + (len(recall.unembedded) if self.embedder is not None else 0)

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
        live = self._get(name, owner)
        session = live.session
        limit = session.config.instructions_budget_chars if limit_chars is None else limit_chars
        questions, section = fit_questions(open_questions(session.verbatim_turns, session.cursor), limit)
        context = await self.context(
            name,
            "instructions",
            budget_chars=max(0, limit - (len(section) + 2 if section else 0)),
            base_instructions=base_instructions,
            facts=facts,
            query=query,
            owner=owner,
        )
        instructions = "\n\n".join(part for part in (context.instructions, section) if part)
        session = self._get(name, owner).session
        verbatim = session.verbatim_turns
        count = max(0, min(last_turns, len(verbatim)))
        first = session.total_turns - count
        return Handoff(
            instructions,
            limit,
            tuple((first + k, turn) for k, turn in enumerate(verbatim[len(verbatim) - count :])),
            tuple(questions),
            session.cursor,
            session.total_turns,
            len(context.recalled),
        )

    def indexing_lags(self) -> tuple[int, int]:
        """The largest :meth:`indexing_lag` of the live sessions, and their sum."""
        lags = [self._lag(live) for live in self._live.values()]
        return max(lags, default=0), sum(lags)

    async def wait_indexed(self, name: str, *, owner: str | None = None) -> int:
        """Wait for the background indexing of the session to finish; returns the lag left
        (0 unless the store keeps failing): for tools, benchmarks and tests."""
        lag = self.indexing_lag(name, owner=owner)
        while lag:
            live = self._get(name, owner)
            self._maybe_index(live)
            if not live.recall.running:
                break
            await live.recall.done.wait()
            before, lag = lag, self.indexing_lag(name, owner=owner)
            if lag >= before:
                break
        return lag

    def state(self, name: str, *, owner: str | None = None) -> SessionStats:
        return self._get(name, owner).session.stats()

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
        live = self._get(name, owner)
        tokenizer = live.session.config.tokenizer
        counter = self._counters.get(tokenizer)
        if counter is None:
            counter = await anyio.to_thread.run_sync(load_tokenizer, tokenizer)
            self._counters[tokenizer] = counter
        applied: Applied | None = None
        async with live.lock:
            session = live.session
            keep = session.cursor + safety_start(session.verbatim_turns)
            if limit_tokens is not None:
                needed = self._needed(session, keep, format, base_instructions, counter)
                if needed > limit_tokens:
                    raise ContextOverflow(
                        f"the base instructions and the last turns that must stay take {needed} tokens,"
                        f" over the limit of {limit_tokens}",
                        needed=needed,
                        limit=limit_tokens,
                    )
            if keep > session.cursor:
                if live.scope is not None:
                    live.scope.cancel()  # its plan is superseded: its result would be stale
                [start] = session.receive(OverflowReported(keep, self.clock()))
                assert isinstance(start, StartCompaction)
                plan = start.plan
                text = emergency_fold(plan, counter, session.config.max_summary_chars)
                # the same protocol as any fold: the result committed to the store, then applied
                told: list[Applied] = []
                effects = session.receive(SummaryReturned(plan.plan_id, text, self.clock()))
                again = await self._perform(live, session, effects, None, "empty emergency fold", told)
                if again is not None:  # a re-compaction pass: the next request folds again
                    session.receive(CompactionAbandoned(again.plan_id, self.clock()))
                if told:
                    applied = told[0]
                    log.warning(
                        "voice_context_emergency_compaction",
                        session=name,
                        old_cursor=applied.old_cursor,
                        new_cursor=applied.new_cursor,
                        folded=plan.end - plan.start,
                        summary_chars=len(applied.summary),
                        limit_tokens=limit_tokens,
                    )
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

    @staticmethod
    def _needed(session: Session, keep: int, format: Format, base: str, counter: TokenCounter) -> int:
        """The tokens the base instructions and the safety region take, as a context shows them."""
        region = ContextView(keep, "", session.verbatim_turns[keep - session.cursor :], (), session.config)
        shown = build_context(region, format, base_instructions=base, budget_chars=1 << 30, tokens=counter)
        assert shown.tokens is not None
        return shown.tokens

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
        live = self._get(name, owner)
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
            live.session.receive(PinRequested(landmark))
            log.info("voice_context_landmark_pinned", session=name, index=index, kind=kind, source=source)
            return landmark

    async def unpin(self, name: str, index: int, *, owner: str | None = None) -> bool:
        """Unpin the landmark at ``index``; returns whether there was one."""
        live = self._get(name, owner)
        async with live.lock:
            removed = await self.store.delete_landmark(name, index)
            unpinned = live.session.receive(UnpinRequested(index, self.clock()))
            removed = bool(unpinned) or removed
            log.info("voice_context_landmark_unpinned", session=name, index=index, removed=removed)
            return removed

    async def _save_landmark(self, name: str, landmark: Landmark) -> None:
        """Store a landmark the heuristics found. The turn is stored already: a landmark
        that cannot be stored is logged; it stays pinned here, and a session restored
        elsewhere does without it (an unpin must last, so restored turns are not read again)."""
        try:
            await self.store.save_landmark(name, landmark)
        except StoreError as exc:
            log.warning(
                "voice_context_landmark_not_stored", session=name, index=landmark.index, error=str(exc)
            )
        else:
            log.info(
                "voice_context_landmark_pinned",
                session=name,
                index=landmark.index,
                kind=landmark.kind,
                source=landmark.source,
            )

    def session(self, name: str, *, owner: str | None = None) -> Session:
        """The live session object (for inspection; mutate it only through the manager)."""
        return self._get(name, owner).session

    async def close(self, name: str, *, owner: str | None = None) -> None:
        """Stop serving a session here. Its state stays in the store; a compaction in
        flight is cancelled (the next one on reopen redoes it). With tiers on, its open
        conversation ends: it is rolled first (within ``close_timeout``; a roll left
        undone is made by the next roll of the session, as the sweep does)."""
        live = self._get(name, owner)
        if live.session.config.tiers and not self._closing:
            with anyio.move_on_after(self.close_timeout):
                try:
                    await self._roll(live, closed=True)
                except Exception as exc:
                    log.warning("voice_context_tier_roll_failed", session=name, error=str(exc)[:300])
            live = self._get(name, owner)
        live.session.receive(SessionEnding(self.clock()))
        if live.scope is not None:
            live.scope.cancel()
        self._live.pop(name, None)

    async def delete(self, name: str, *, owner: str | None = None) -> None:
        """Forget a session: close it here and delete everything the store keeps of it.

        Raises ``UnknownSession`` when it is not open here for ``owner``; an open of the
        same name waits for the delete, and then creates a new session.
        """
        async with self._opening(name):
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

    # -- internals -------------------------------------------------------------

    async def _disowned(self, live: _Live) -> bool:
        """Whether the copy held here is of a session the store no longer gives its owner (it
        was deleted or forgotten elsewhere, and maybe its name taken by another owner since);
        such a copy is dropped, and an open by another owner decides from the store."""
        record = await self.store.load(live.session.name)
        if record is not None and record.owner == live.owner:
            return False
        if self._live.get(live.session.name) is live:
            self._disown(live)
        return True

    def _disown(self, live: _Live) -> None:
        """Stop serving a copy whose session the store gives another owner (or nobody): this
        replica must not act for its owner on what the store now keeps under that name."""
        session = live.session
        log.warning("voice_context_session_disowned", session=session.name)
        session.receive(SessionEnding(self.clock()))
        if live.scope is not None:
            live.scope.cancel()
        if self._live.get(session.name) is live:
            del self._live[session.name]

    async def _catch_up_locked(self, live: _Live) -> None:
        """Adopt the store's copy of the session if another replica moved it on.

        Turns reach the store before they reach a session, so a store holding
        more turns, a later cursor or other notes than this replica knows means
        another replica served the session meanwhile. When it only appended turns,
        they are appended here too and a compaction in flight goes on (its commit
        still holds); otherwise the session is rebuilt from the store (a compaction
        in flight here is cancelled: its commit would be refused). A store that is
        behind this replica is left alone.
        """
        session = live.session
        record = await self.store.load(session.name)
        if record is not None and record.owner != live.owner:
            self._disown(live)
            raise UnknownSession(session.name)
        if record is None or record.total_turns < session.total_turns or record.cursor < session.cursor:
            return
        seen = (session.total_turns, session.cursor, session.live_notes, session.pending_notes)
        if (record.total_turns, record.cursor, record.live_notes, record.pending_notes) == seen:
            return
        held = session.verbatim_turns
        if (record.cursor, record.summary, record.live_notes, record.pending_notes) == (
            session.cursor,
            session.summary,
            session.live_notes,
            session.pending_notes,
        ) and record.turns[: len(held)] == held:
            # only turns were added elsewhere: take them, and let a fold in flight land
            for turn in record.turns[len(held) :]:
                session.receive(TurnAppended(turn))
            log.info(
                "voice_context_session_caught_up",
                session=session.name,
                turns=record.total_turns,
                cursor=record.cursor,
                was_turns=seen[0],
                was_cursor=seen[1],
            )
            return
        if session.in_flight is not None and live.scope is not None:
            live.scope.cancel()
        session.receive(SessionEnding(self.clock()))
        live.session = _restore(record, session.config, await self.store.load_landmarks(session.name))
        if live.session.config.tiers:
            live.tiers = await self._tier_state(live.session)
        live.recall.older = None
        log.info(
            "voice_context_session_caught_up",
            session=session.name,
            turns=record.total_turns,
            cursor=record.cursor,
            was_turns=seen[0],
            was_cursor=seen[1],
        )

    # -- recall ----------------------------------------------------------------

    async def _recall_state(self, name: str) -> _Recall:
        """Where a stored session's recall index stands (and its vectors, with an embedder)."""
        stats, _, _ = await self.store.recall_postings(name, ())
        recall = _Recall(indexed=stats.turns, noted=stats.notes)
        if self.embedder is not None:
            import numpy as np

            stored = await self.store.load_vectors(name)
            recall.vectors = {key: np.frombuffer(raw, dtype=np.float32) for key, raw in stored.items()}
            keys = [*range(stats.turns), *range(-1, -stats.notes - 1, -1)]
            recall.unembedded = [key for key in keys if key not in recall.vectors]
        return recall

    async def _catch_up_index(self, live: _Live) -> None:
        """Wait (at most ``INDEX_WAIT``) for the background indexing to hold every turn stored
        and every note seen: a search made then finds what the session holds, however far
        behind the indexing was when it was asked for. The turn just stored takes about
        a millisecond; a burst of appends, longer."""
        recall = live.recall
        with anyio.move_on_after(INDEX_WAIT):
            while recall.running and self._lag(live):
                await recall.done.wait()

    def _basis(self, live: _Live) -> _Basis:
        """The basis a search for a context would have now (see :class:`_Basis`)."""
        recall, session = live.recall, live.session
        vectors = len(recall.vectors or ()) if self.embedder is not None else 0
        return _Basis(
            recall.indexed, recall.noted, vectors, session.total_turns - 1, session.cursor,
            session.summary, live.tiers,
        )  # fmt: skip

    def _maybe_recall_ahead(self, live: _Live, turn: Turn) -> None:
        """Recall for a user turn just stored, in the background: the bot's next context will
        ask for it (its default query is the newest user turn)."""
        session = live.session
        if (
            self.recall_ahead == "off"
            or turn.role != "user"
            or not session.config.recall
            or not turn.text.strip()
            or self._tg is None
            or self._closing
        ):
            return
        if self.recall_ahead == "first" and not live.recall.armed:
            return
        ahead = _Ahead(turn.text)
        live.recall.ahead = ahead
        live.recall.armed = False
        self._tg.start_soon(self._recall_ahead, live, ahead)

    async def _recall_ahead(self, live: _Live, ahead: _Ahead) -> None:
        try:
            await self._catch_up_index(live)
            if live.recall.ahead is ahead:  # no newer user turn meanwhile
                ahead.basis, ahead.found = await self._recall(live, ahead.query, default=True)
        except Exception:  # the context will recall for itself
            log.warning("voice_context_recall_ahead_failed", session=live.session.name, exc_info=True)
        finally:
            ahead.done.set()

    async def _recalled_ahead(self, live: _Live, text: str) -> list[Recalled] | None:
        """What recall ahead found for ``text``, waiting for it if it is still running; ``None``
        when it was for another query, failed, or was made on another basis than this context's
        search would be (a turn, a note or a fold since; the indexing still behind): then the
        context searches for itself, and finds what the session holds. Either way the next user
        turn may start a recall ahead again."""
        ahead = live.recall.ahead
        live.recall.armed = True
        if ahead is None or ahead.query != text:
            return None
        await ahead.done.wait()
        await self._catch_up_index(live)  # what this context's own search would read
        if ahead.found is None or ahead.basis != self._basis(live):
            log.debug("voice_context_recall_ahead_unused", session=live.session.name)
            return None
        return ahead.found

    async def _recall(self, live: _Live, text: str, *, default: bool) -> tuple[_Basis | None, list[Recalled]]:
        """What recall offers a context for ``text`` (``default``: the newest user turn, no query
        named): passages from the store's index, then summary lines; and the basis they were
        found on (``None`` when it is not known: the store failed, vectors came meanwhile). A
        store that fails leaves the context without them, never without a reply."""
        session, recall = live.session, live.recall
        limit = max(1, session.config.recall_limit) + 4  # a few spare for those shown verbatim anyway
        before = session.total_turns - 1
        vectors = len(recall.vectors or ()) if self.embedder is not None else 0
        query_vector = None
        if self.embedder is not None and recall.vectors:
            # a model's forward pass must not hold up the event loop
            query_vector = (await anyio.to_thread.run_sync(self.embedder.embed, [text]))[0]
        known = True
        try:
            stats, found = await search_store(
                self.store,
                session.name,
                text,
                before=before,
                limit=limit,
                query_vector=query_vector,
                vectors=recall.vectors,
                now=query_time(session),
                common=DEFAULT_QUERY_COMMON if default else 1.0,
            )
        except StoreError:
            log.warning("voice_context_recall_failed", session=session.name, exc_info=True)
            stats, found, known = None, [], False
        if vectors != (len(recall.vectors or ()) if self.embedder is not None else 0):
            known = False  # vectors came during the search: which of them it saw is not known
        basis = None
        if known:
            basis = replace(self._basis(live), before=before)
            if stats is not None:  # (none: no word to search by, the same on any index)
                basis = replace(basis, turns=stats.turns, notes=stats.notes, vectors=vectors)
        summary = live.session.summary
        if summary:
            if recall.summary is None or recall.summary.summary is not summary:
                recall.summary = SummaryIndex.of(summary)
            found.extend(recall.summary.search(text, limit=session.config.recall_limit))
        if live.tiers:
            seen = {r.line for r in found if r.kind == "summary"}
            hits = self._tier_index(live).search(text, limit=session.config.recall_limit)
            found.extend(hit for hit in hits if hit.line not in seen)
        return basis, found

    def _tier_index(self, live: _Live) -> SummaryIndex:
        """The lines of the rolled summaries a context does not show, indexed once per roll:
        recall searches every tier."""
        if live.tier_index is None or live.tier_index[:2] != (live.tiers, live.session.cursor):
            cursor = live.session.cursor
            live.tier_index = (live.tiers, cursor, SummaryIndex.of(hidden_lines(live.tiers, cursor)))
        return live.tier_index[2]

    def _view(self, live: _Live) -> ContextView:
        """What a context is built from: with tiers on, the summary is the rolled summaries
        that cover the history behind the cursor, then the rolling summary (see
        :func:`voice_context.core.tiers.tiered_summary`)."""
        view = live.session.view()
        if not live.tiers:
            return view
        zone = parse_zone(view.config.time_zone)
        return replace(view, summary=tiered_summary(live.tiers, view.cursor, view.summary, zone))

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
        live = self._get(name, owner)
        if not live.session.config.tiers:
            raise ConfigError(f"session {name!r} does not keep tiers (set tiers = true)")
        return await self._roll(live, on_demand=on_demand, closed=closed, tiers=tiers)

    async def tick(self) -> None:
        """Start the tier rolls the clock has made due in every session open here (the
        server calls this periodically; a day's roll time passes without any traffic)."""
        for live in list(self._live.values()):
            self._maybe_roll(live)

    async def _roll(
        self, live: _Live, *, on_demand: bool = False, closed: bool = False, tiers: Sequence[Tier] = TIERS
    ) -> RollReport:
        async with live.rolling:
            session = live.session
            live.tiers_checked = self.clock()
            report = await roll_tiers(
                self.store,
                self.summarizer,
                session.name,
                session.config,
                self.clock(),
                total_turns=session.total_turns,
                on_demand=on_demand,
                closed=closed,
                tiers=tiers,
            )
            live.tiers = report.rows
            live.session.receive(TiersRolled(report.through, self.clock()))
            return report

    def _maybe_roll(self, live: _Live, *, now: bool = False) -> None:
        """Roll the session's tiers in the background when a conversation just ended
        (``now``) or, otherwise, at most every :data:`TIER_CHECK_SECONDS` of the clock."""
        if not live.session.config.tiers or self._tg is None or self._closing:
            return
        at = self.clock()
        if not now and at - live.tiers_checked < TIER_CHECK_SECONDS:
            return
        live.tiers_checked = at
        if live.rolling.locked():  # the roll under way goes round once more when it is done
            live.roll_again = True
            return
        self._in_flight += 1
        self._idle = anyio.Event() if self._in_flight == 1 else self._idle
        self._tg.start_soon(self._roll_in_background, live)

    async def _roll_in_background(self, live: _Live) -> None:
        try:
            live.roll_again = True
            while live.roll_again and self._live.get(live.session.name) is live and not self._closing:
                live.roll_again = False
                await self._roll(live)
        except Exception as exc:  # a store failure: the next check tries again
            log.warning("voice_context_tier_roll_failed", session=live.session.name, error=str(exc)[:300])
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def _tier_state(self, session: Session) -> tuple[TierSummary, ...]:
        """A restored session's rolled summaries, and what its core needs of them: how far
        they cover the transcript, and the time of the turn just before the cursor."""
        rows = await self.store.load_tiers(session.name)
        folded_at: float | None = None
        if session.cursor and session.folded_at is None:
            [last] = await self.store.read_turns(session.name, session.cursor - 1, session.cursor)
            folded_at = last.at
        session.receive(Restored(rolled_through(rows), folded_at, self.clock()))
        return rows

    @staticmethod
    def _last_at(session: Session) -> float | None:
        """The time of the session's newest turn (that it knows of)."""
        if session.total_turns > session.cursor:
            return session.turn(session.total_turns - 1).at
        return session.folded_at

    async def _older(self, live: _Live, budget_chars: int | None) -> TurnRun | None:
        """The turns just before the cursor a budgeted context may extend its verbatim run into:
        as many as the budget could hold at 20 chars a line, read once per cursor (none without
        a budget). Kept here only as far back as the budget's chars reach.

        A fold that lands while they are read moves the cursor past them: they are read again
        for the new cursor (a few times at most; the context joins only turns that run up to
        its cursor, see :func:`build_context`)."""
        if budget_chars is None:
            return None
        count = min(MAX_OLDER_TURNS, budget_chars // 20)
        run: TurnRun | None = None
        for _ in range(OLDER_READS):
            cursor = live.session.cursor
            if not cursor:
                return None
            cached = live.recall.older
            if cached is not None and cached[1].end == cursor and cached[0] >= count:
                return cached[1]
            try:
                turns = await self.store.read_turns(live.session.name, max(0, cursor - count), cursor)
            except StoreError:
                log.warning("voice_context_older_turns_failed", session=live.session.name, exc_info=True)
                return run
            kept, chars = 0, 0
            for turn in reversed(turns):
                if chars >= budget_chars:
                    break
                chars += len(turn.text) + len(turn.speaker) + 2
                kept += 1
            run = TurnRun.of(cursor - kept, turns[len(turns) - kept :])
            live.recall.older = (count, run)
            if live.session.cursor == cursor:  # decide again after the await
                return run
            log.info(
                "voice_context_older_turns_stale", session=live.session.name, read_for=cursor,
                cursor=live.session.cursor,
            )  # fmt: skip
        return run

    def _maybe_index(self, live: _Live) -> None:
        """Index what waits for it (turns, notes; their vectors), in the background."""
        recall = live.recall
        pending = (
            recall.notes or recall.indexed < live.session.total_turns or (recall.unembedded and self.embedder)
        )
        if recall.running or not pending or self._tg is None or self._closing:
            return
        recall.running = True
        if recall.done.is_set():
            recall.done = anyio.Event()
        self._tg.start_soon(self._index, live)

    async def _index(self, live: _Live) -> None:
        """Write what waits to the store's recall index, batch by batch, until nothing does.
        A failure is logged and retried with the next append; it never breaks the session."""
        recall = live.recall
        name = live.session.name
        try:
            while self._live.get(name) is live and not self._closing:
                if recall.notes:
                    note = recall.notes[0]
                    stats = await self.store.index_note(name, indexed(note_passage(note)))
                    recall.notes.pop(0)
                    recall.noted = stats.notes
                    if self.embedder is not None:
                        recall.unembedded.append(-stats.notes)
                    continue
                session = live.session
                start, end = recall.indexed, session.total_turns
                if start < end:
                    stop = min(end, start + INDEX_BATCH)
                    if start >= session.cursor:
                        first = session.total_turns - len(session.verbatim_turns)
                        turns = list(session.verbatim_turns[start - first : stop - first])
                    else:
                        turns = await self.store.read_turns(name, start, stop)
                    docs = [indexed(turn_passage(start + k, t)) for k, t in enumerate(turns)]
                    stats = await self.store.index_turns(name, start, docs)
                    if stats.turns == start and docs:
                        break  # the store would not take them: try again with the next append
                    if self.embedder is not None:
                        recall.unembedded.extend(range(max(start, recall.indexed), stats.turns))
                    recall.indexed = stats.turns
                    continue
                if recall.unembedded and self.embedder is not None:
                    await self._embed(live)
                    continue
                break
        except Exception:  # recall is best effort: the turns are safe in the store
            log.warning("voice_context_indexing_failed", session=name, exc_info=True)
        finally:
            recall.running = False
            recall.done.set()

    async def _embed(self, live: _Live) -> None:
        """One batch of vectors: the model run in a worker thread, the vectors kept in the store."""
        import numpy as np

        recall = live.recall
        assert self.embedder is not None
        keys = recall.unembedded[:EMBED_BATCH]
        passages = await self.store.recall_passages(live.session.name, keys)
        todo = [key for key in keys if key in passages]
        texts = [f"{passages[k].speaker}: {passages[k].text}" for k in todo]
        vectors: Any = await anyio.to_thread.run_sync(self.embedder.embed, texts) if texts else []
        rows = {key: np.asarray(v, dtype=np.float32) for key, v in zip(todo, vectors, strict=True)}
        await self.store.save_vectors(live.session.name, {k: v.tobytes() for k, v in rows.items()})
        if recall.vectors is None:
            recall.vectors = {}
        recall.vectors.update(rows)
        del recall.unembedded[: len(keys)]

    def _get(self, name: str, owner: str | None, *, check_owner: bool = True) -> _Live:
        live = self._live.get(name)
        if live is None or (check_owner and live.owner != owner):
            raise UnknownSession(name)
        return live

    def _maybe_compact(self, live: _Live, budget: FillBudget | None = None) -> None:
        session = live.session
        [decision] = session.receive(ContextRequested(self.clock(), budget))
        if isinstance(decision, Skip):
            # a skip worth telling is told once: per plan in flight, per backoff
            repeat = {
                SkipReason.ALREADY_IN_FLIGHT: session.in_flight.plan_id if session.in_flight else None,
                SkipReason.BACKING_OFF: decision.retry_at,
            }.get(decision.reason)
            told = (decision.reason, repeat)
            quiet = decision.reason is SkipReason.BELOW_THRESHOLD or (
                repeat is not None and live.last_skip == told
            )
            live.last_skip = told
            level = log.debug if quiet else log.info
            level(
                "voice_context_compaction_skipped",
                session=session.name,
                reason=decision.reason.value,
                turns=session.total_turns,
                cursor=session.cursor,
                recent_start=decision.recent_start,
                retry_at=decision.retry_at,
            )
            return
        assert isinstance(decision, StartCompaction)
        if self._tg is None:  # nothing will run the plan: do not leave it in flight
            session.receive(CompactionAbandoned(decision.plan.plan_id, self.clock()))
            raise RuntimeError("SessionManager must be used as 'async with SessionManager(...)'")
        self._in_flight += 1
        self._idle = anyio.Event() if self._in_flight == 1 else self._idle
        live.scope = anyio.CancelScope()  # a close before the task runs must cancel it too
        self._tg.start_soon(self._compact, live, decision.plan, live.scope)

    async def _compact(self, live: _Live, plan: CompactionPlan, scope: anyio.CancelScope) -> None:
        session = live.session
        fence: int | None = None
        running = plan
        try:
            with scope, structlog.contextvars.bound_contextvars(session=session.name):
                if scope.cancel_called:  # closed before this task ran: not even a lease
                    return
                fence = await self._lease(live, session, plan)
                if fence is None or not await self._still_due(live, session, plan):
                    return
                lease = _Lease(fence)
                async with anyio.create_task_group() as renewals:
                    renewals.start_soon(self._renew_lease, session.name, lease)
                    current: CompactionPlan | None = plan
                    while current is not None:
                        running = current
                        current = await self._run_plan(live, session, current, lease)
                    renewals.cancel_scope.cancel()
        except Exception as exc:  # a bug, here or in a backend, must not escape into the task group
            if isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # raised inside the renewals' task group
            log.exception("voice_context_compaction_crashed", session=session.name, plan=running.plan_id)
            if session.in_flight is not None and session.in_flight.plan_id == running.plan_id:
                self._record_failure(
                    live, session, running, "internal", False, f"{type(exc).__name__}: {exc}"
                )
        finally:
            # cancelled (the session closed, the manager shut down) with this task's plan
            # still in flight: nothing else will land it (a plan no longer in flight is stale)
            session.receive(CompactionAbandoned(running.plan_id, self.clock()))
            if live.scope is scope:
                live.scope = None
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
            if fence is not None:
                await self._release_lease(session.name)

    async def _release_lease(self, name: str) -> None:
        with anyio.move_on_after(2, shield=True):
            try:
                await self.store.release_lease(name, self.replica)
            except Exception as exc:  # the lease expires on its own; never fail a task over it
                log.warning("voice_context_lease_release_failed", session=name, error=str(exc)[:300])

    async def _renew_lease(self, name: str, lease: _Lease) -> None:
        """Renew the lease every third of its ttl while the fold runs. Superseded (another
        replica was granted it after it lapsed): cancel the summarizer call, whose result
        must not be committed. A store that fails a renewal is tried again at the next one
        (the commit is fenced anyway)."""
        while True:
            await anyio.sleep(self.lease_ttl / 3)
            try:
                kept = await self.store.renew_lease(name, self.replica, lease.fence, self.lease_ttl)
            except StoreError as exc:
                log.warning("voice_context_lease_renewal_failed", session=name, error=str(exc)[:300])
                continue
            if not kept:
                lease.lost = True
                log.warning("voice_context_lease_lost", session=name, fence=lease.fence)
                if lease.fold is not None:
                    lease.fold.cancel()
                return

    async def _still_due(self, live: _Live, session: Session, plan: CompactionPlan) -> bool:
        """Decide again once the lease is held: another replica may have folded this batch
        while this one waited for the lease. Then the plan is dropped, and the session
        catches up with the store instead of folding the same turns again."""
        try:
            record = await self.store.load(session.name)
        except StoreError as exc:
            self._record_failure(live, session, plan, "store", exc.retryable, str(exc))
            return False
        if record is not None and record.owner != live.owner:
            self._disown(live)
            return False
        if record is None or record.cursor == plan.start:
            return True  # (a session gone from the store fails at its commit)
        session.receive(CompactionAbandoned(plan.plan_id, self.clock()))  # stale if no longer in flight
        self.counters["stale"] += 1
        log.info(
            "voice_context_compaction_stale",
            session=session.name,
            plan=plan.plan_id,
            current=None,
            reason="folded_elsewhere",
            cursor=record.cursor,
        )
        async with live.lock:
            with contextlib.suppress(StoreError, UnknownSession):
                await self._catch_up_locked(live)
        return False

    async def _lease(self, live: _Live, session: Session, plan: CompactionPlan) -> int | None:
        """Take the store's compaction lease (its fencing token); ``None`` when the plan
        cannot go ahead (another replica holds the lease, or the store failed)."""
        try:
            token = await self.store.acquire_lease(session.name, self.replica, self.lease_ttl)
        except StoreError as exc:
            self._record_failure(live, session, plan, "store", exc.retryable, str(exc))
            return None
        if token is None:
            session.receive(CompactionAbandoned(plan.plan_id, self.clock()))
            log.info(
                "voice_context_compaction_skipped",
                session=session.name,
                reason="leased_elsewhere",
                turns=session.total_turns,
                cursor=session.cursor,
                recent_start=plan.recent_start,
            )
        return token

    async def _run_plan(
        self, live: _Live, session: Session, plan: CompactionPlan, lease: _Lease
    ) -> CompactionPlan | None:
        if lease.lost:
            self._lease_lost(live, session, plan)
            return None
        self.counters["started"] += 1
        log.info(
            "voice_context_compaction_started",
            session=session.name,
            plan=plan.plan_id,
            cursor=plan.start,
            batch_size=len(plan.turns),
            recent_start=plan.recent_start,
            pending_note_count=len(plan.notes),
            recompact=plan.recompact,
            trigger=plan.trigger,
        )
        request = SummaryRequest.for_plan(plan, session.name)
        text: str | None = None
        with anyio.CancelScope() as fold:  # cancelled when a renewal finds the lease superseded
            lease.fold = fold
            try:
                with anyio.fail_after(self.compaction_timeout):
                    text = await self.summarizer.summarize(request)
            except SummarizerError as exc:
                self._record_failure(live, session, plan, exc.kind, exc.retryable, str(exc), exc.retry_after)
                return None
            except TimeoutError:
                self._record_failure(
                    live, session, plan, "timeout", True, f"no answer in {self.compaction_timeout:g}s"
                )
                return None
            except Exception as exc:  # a summarizer bug must not take the server down
                self._record_failure(live, session, plan, type(exc).__name__, False, str(exc))
                return None
            finally:
                lease.fold = None
        if text is None or lease.lost:
            self._lease_lost(live, session, plan)
            return None
        # Landing holds the session's lock, so a turn or a note written meanwhile cannot
        # interleave with the commit: the pending notes the store keeps are the ones the
        # session keeps.
        async with live.lock:
            return await self._land(live, session, plan, text, lease.fence)

    def _lease_lost(self, live: _Live, session: Session, plan: CompactionPlan) -> None:
        self._record_failure(
            live, session, plan, "lease_lost", True, "another replica was granted the compaction lease"
        )

    async def _land(
        self, live: _Live, session: Session, plan: CompactionPlan, text: str, fence: int | None
    ) -> CompactionPlan | None:
        if live.session is not session:
            # the session was rebuilt from the store meanwhile: this result is for a copy
            # that no longer serves anyone
            self.counters["stale"] += 1
            log.info("voice_context_compaction_stale", session=session.name, plan=plan.plan_id, current=None)
            return None
        effects = session.receive(SummaryReturned(plan.plan_id, text, self.clock()))
        return await self._perform(live, session, effects, fence, "empty summary")

    async def _perform(
        self,
        live: _Live,
        session: Session,
        effects: list[Effect],
        fence: int | None,
        message: str = "",
        told: list[Applied] | None = None,
    ) -> CompactionPlan | None:
        """Do and tell what a compaction's event came to; returns the next plan to run under
        the same lease (a re-compaction pass), if any. A fold that lands is added to ``told``."""
        next_plan: CompactionPlan | None = None
        for effect in effects:
            if isinstance(effect, StartCompaction):
                next_plan = effect.plan
            elif isinstance(effect, CommitCompaction):
                next_plan = await self._commit(live, session, effect, fence, told)
            elif isinstance(effect, Applied):
                self._log_applied(live, session, effect)
                if told is not None:
                    told.append(effect)
            elif isinstance(effect, Failed):
                self._log_failure(live, session, effect, message)
            elif isinstance(effect, Stale):
                self.counters["stale"] += 1
                log.info(
                    "voice_context_compaction_stale",
                    session=session.name,
                    plan=effect.plan_id,
                    current=effect.current_plan_id,
                )
        return next_plan

    async def _commit(
        self,
        live: _Live,
        session: Session,
        commit: CommitCompaction,
        fence: int | None,
        told: list[Applied] | None = None,
    ) -> CompactionPlan | None:
        """Cursor, summary and the notes left, into the store together; then into the session."""
        plan = commit.plan
        try:
            committed = await self.store.commit_compaction(
                session.name,
                expected_cursor=plan.start,
                new_cursor=plan.end,
                summary=commit.summary,
                pending_notes=commit.pending_notes,
                fence=fence,
            )
        except StoreError as exc:
            self._record_failure(live, session, plan, "store", exc.retryable, str(exc))
            return None
        if not committed:
            self._record_failure(
                live, session, plan, "fenced", True, "the store moved on (another replica compacted)"
            )
            with contextlib.suppress(StoreError, UnknownSession):
                await self._catch_up_locked(live)
            return None
        effects = session.receive(CompactionStored(plan.plan_id, self.clock()))
        return await self._perform(live, session, effects, fence, told=told)

    def _record_failure(
        self,
        live: _Live,
        session: Session,
        plan: CompactionPlan,
        kind: str,
        retryable: bool,
        message: str,
        retry_after: float | None = None,
    ) -> None:
        failed = CompactionFailed(plan.plan_id, kind, retryable, self.clock(), retry_after)
        for effect in session.receive(failed):
            if isinstance(effect, Failed):
                self._log_failure(live, session, effect, message)
            else:
                self.counters["stale"] += 1
                log.info("voice_context_compaction_stale", session=session.name, plan=plan.plan_id)

    def _log_applied(self, live: _Live, session: Session, outcome: Applied) -> None:
        self.counters["completed"] += 1
        log.info(
            "voice_context_compaction_completed",
            session=session.name,
            plan=outcome.plan.plan_id,
            old_cursor=outcome.old_cursor,
            new_cursor=outcome.new_cursor,
            covered_through=outcome.covered_through,
            summary_chars=len(outcome.summary),
            clamped=outcome.clamped,
            latency=round(outcome.latency, 4),
        )
        self._emit(
            live,
            CompactionEvent(
                "completed",
                session.name,
                outcome.new_cursor,
                outcome.covered_through,
                len(outcome.summary),
                outcome.latency,
                old_cursor=outcome.old_cursor,
                trigger=outcome.plan.trigger,
            ),
        )

    def _log_failure(self, live: _Live, session: Session, outcome: Failed, message: str) -> None:
        self.counters["failed"] += 1
        log.warning(
            "voice_context_compaction_failed",
            session=session.name,
            plan=outcome.plan.plan_id,
            model=self.summarizer.model,
            error=outcome.kind,
            message=message[:300],
            retryable=outcome.retryable,
            failures=outcome.failures,
            retry_at=outcome.retry_at,
        )
        self._emit(
            live,
            CompactionEvent(
                "failed",
                session.name,
                session.cursor,
                session.cursor - 1,
                len(session.summary),
                outcome.latency,
                error=outcome.kind,
                retryable=outcome.retryable,
                failures=outcome.failures,
                retry_at=outcome.retry_at,
            ),
        )

    def _emit(self, live: _Live, event: CompactionEvent) -> None:
        for listener in [*self._listeners, *live.listeners]:
            try:
                listener(event)
            except Exception:  # a listener's bug must not lose the compaction
                log.exception("voice_context_listener_failed", session=event.session)


def older_chars(budget_chars: int | None, budget_tokens: int | None) -> int | None:
    """The char budget that bounds how many turns before the cursor a context may show:
    a token budget holds at most about four chars a token of them."""
    if budget_tokens is None:
        return budget_chars
    from_tokens = budget_tokens * 4
    return from_tokens if budget_chars is None else min(budget_chars, from_tokens)


def _restore(record: SessionRecord, config: SessionConfig, landmarks: Sequence[Landmark] = ()) -> Session:
    """A live session from the store's record (which holds the turns from its cursor on)
    and its landmarks."""
    return Session(
        record.name,
        config,
        cursor=record.cursor,
        turns=record.turns,
        summary=record.summary,
        live_notes=record.live_notes,
        pending_notes=record.pending_notes,
        compactions=record.compactions,
        landmarks=landmarks,
    )
