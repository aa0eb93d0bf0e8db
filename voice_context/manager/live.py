"""What the manager keeps of each live session, and the values its jobs pass around."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import anyio

from voice_context.core.config import SessionConfig
from voice_context.core.landmarks import Landmark
from voice_context.core.recalled import Offered
from voice_context.core.session import CompactionPlan, Session, SessionStats
from voice_context.core.tiers import TierSummary
from voice_context.core.turns import Note, TurnRun
from voice_context.core.window import SkipReason
from voice_context.recall.index import SummaryIndex, Vectors
from voice_context.recall.stored import HeldTurns
from voice_context.store.base import SessionRecord


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
    """For a completed fold: ``count`` (the batch rule), ``fill`` (the fill trigger) or
    ``emergency`` (a context overflow)."""
    clamped: bool = False
    """For a completed fold: whether its summary was cut to the ceiling as a last resort."""
    plan: CompactionPlan | None = None
    """The plan that landed or failed: what a listener that accounts for every fold (a
    replay) reads of it. Never on the wire."""


Listener = Callable[[CompactionEvent], None]


@dataclass(frozen=True, slots=True)
class Basis:
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
class Ahead:
    """Recall run ahead of the reply: for a user turn as soon as it is stored, so that the
    context the bot asks for before answering it finds its passages ready. It answers a
    context whose query is that turn's text and whose basis is the one it searched."""

    query: str
    done: anyio.Event = field(default_factory=anyio.Event)
    found: Offered | None = None
    basis: Basis | None = None


@dataclass(eq=False)
class RecallState:
    """What a live session keeps here of its recall index (the store holds the index itself):
    how far indexing has come, what waits for it, and two bounded caches."""

    held: HeldTurns = field(default_factory=HeldTurns)
    """The docs of the turns after those in the store's index (from :attr:`indexed` on): searched
    from here until the background indexing writes them to the store, a batch at a time (see
    :data:`voice_context.manager.indexing.HELD_TURNS`)."""
    noted: int = 0
    """How many notes are in the store's index."""
    notes: list[Note] = field(default_factory=list)
    """Notes waiting to be indexed."""
    running: bool = False
    done: anyio.Event = field(default_factory=anyio.Event)
    vectors: Vectors | None = None
    """Doc key -> unit vector, when the manager has an embedder."""
    unembedded: list[int] = field(default_factory=list)
    """Indexed doc keys with no vector yet."""
    older: tuple[int, TurnRun] | None = None
    """The turns just before the cursor last read for a context: (how many were asked for, the
    run kept of them, which ends at the cursor it was read for)."""
    summary: SummaryIndex | None = None
    """The words of the summary's lines, indexed once per summary."""
    ahead: Ahead | None = None
    """Recall for a user turn, run when it was stored (see :mod:`voice_context.manager`)."""
    armed: bool = True
    """Whether the next user turn starts a recall ahead: not while one started since the last
    context is waiting unused (in a group, most turns are not the one the bot answers)."""

    @property
    def indexed(self) -> int:
        """Turns ``0 .. indexed-1`` are in the store's index (the held docs start there)."""
        return self.held.start

    @property
    def searchable(self) -> int:
        """Turns ``0 .. searchable-1`` are found by a search: in the store's index or held here."""
        return self.indexed + len(self.held)


@dataclass(eq=False)
class Live:
    """A session served here: the core session, who owns it, its lock, the fold in flight
    (its cancel scope), its listeners, and what its recall and tiers keep here."""

    session: Session
    owner: str | None
    #: taken without a trip through the event loop when free (the common case: one connection
    #: answers a session's requests one at a time), as every turn takes it
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))
    scope: anyio.CancelScope | None = None
    listeners: list[Listener] = field(default_factory=list)
    recall: RecallState = field(default_factory=RecallState)
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
    #: the lease of the fold whose result lands now (under the lock): its commit is fenced by
    #: it, and a plan the core starts meanwhile (a re-compaction pass, a backlog's next fold)
    #: runs next under it rather than in a task of its own
    landing: Lease | None = None

    def cancel_fold(self) -> None:
        """Cancel the fold in flight, if any: its result would be stale."""
        if self.scope is not None:
            self.scope.cancel()


@dataclass(eq=False)
class Lease:
    """A compaction lease held while a fold runs: its fencing token, whether a renewal found
    it superseded, and the summarizer call to cancel then."""

    fence: int
    lost: bool = False
    fold: anyio.CancelScope | None = None


def restore(record: SessionRecord, config: SessionConfig, landmarks: Sequence[Landmark] = ()) -> Session:
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
