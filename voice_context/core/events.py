"""Every event a session receives and every effect it answers with, in one place: what happened,
fed to :meth:`voice_context.core.session.Session.receive`, and what the shell is to do, or to
tell. Plain frozen values: no clock, no I/O (re-exported by :mod:`voice_context.core.session`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from voice_context.core.config import SessionConfig
from voice_context.core.landmarks import Landmark
from voice_context.core.turns import Note, Turn
from voice_context.core.window import FillBudget, Skip


@dataclass(frozen=True, slots=True)
class CompactionPlan:
    """One summarizer call to make: fold ``turns`` (indices ``start..end-1``) into the summary.

    ``plan_id`` versions the result: only the result of the plan currently in
    flight is applied. A ``recompact`` plan has no turns: it asks for the
    overlong ``previous_summary`` to be condensed, and lands at the same ``end``.
    """

    plan_id: int
    start: int
    end: int
    recent_start: int
    turns: tuple[Turn, ...]
    notes: tuple[Note, ...]
    last_note_seq: int
    previous_summary: str
    max_chars: int
    max_note_chars: int
    started_at: float
    recompact: bool = False
    trigger: str = "count"
    """What made it due: ``count`` (the batch rule), ``fill`` (the turns from the cursor on
    passed the fill line of the context that asked: see :func:`~voice_context.core.window.fill_end`)
    or ``emergency`` (the bot's model reported a context overflow)."""
    landmarks: int = 0
    """How many turns of ``start..end-1`` are landmarks, left out of ``turns``: a
    compaction never paraphrases one."""

    def __repr__(self) -> str:
        kind = "recompact" if self.recompact else "fold"
        span = f"{self.start}..{self.end - 1}"
        return f"<CompactionPlan #{self.plan_id} {kind} turns={span} notes={len(self.notes)}>"


@dataclass(frozen=True, slots=True)
class Applied:
    """A result landed: the cursor moved from ``old_cursor`` to ``new_cursor``."""

    plan: CompactionPlan
    old_cursor: int
    new_cursor: int
    summary: str
    clamped: bool
    latency: float

    @property
    def covered_through(self) -> int:
        return self.new_cursor - 1


@dataclass(frozen=True, slots=True)
class Failed:
    """A compaction failed: nothing moved; the next attempt waits until ``retry_at``."""

    plan: CompactionPlan
    kind: str
    retryable: bool
    failures: int
    retry_at: float
    latency: float
    message: str = field(default="", compare=False)
    """What went wrong, in words (the summarizer's error, the store's, or why a reply was refused)."""


@dataclass(frozen=True, slots=True)
class Stale:
    """A result for a plan that is no longer in flight: dropped, never applied."""

    plan_id: int
    current_plan_id: int | None


@dataclass(frozen=True, slots=True)
class NotesChanged:
    """What appending a note did to the buffers."""

    live: int
    pending: int
    evicted: int
    dropped: int


@dataclass(frozen=True, slots=True)
class StagedNotes:
    """The note buffers as they will be once the store holds them (see ``PersistNotes``)."""

    live: tuple[Note, ...]
    numbered: tuple[tuple[int, Note], ...]
    note_seq: int
    notes_dropped: int
    changed: NotesChanged
    version: int

    @property
    def pending(self) -> tuple[Note, ...]:
        return tuple(note for _, note in self.numbered)


# -- events: what happened, fed to ``Session.receive`` ------------------------------------


@dataclass(frozen=True, slots=True)
class ContextRequested:
    """A reply got its context at ``at``: the compaction triggers are evaluated (the fill
    trigger by what that context's layout measured under its budget, ``budget``, when it
    had one: :attr:`voice_context.core.budget.Context.fill`)."""

    at: float
    budget: FillBudget | None = None


@dataclass(frozen=True, slots=True)
class NoteReceived:
    """A screen note to add to the live buffer (once the store holds the result)."""

    note: Note


@dataclass(frozen=True, slots=True)
class NotesStored:
    """The store holds the buffers of a ``PersistNotes``: the session takes them."""

    staged: StagedNotes


@dataclass(frozen=True, slots=True)
class SummaryReturned:
    """The summarizer answered ``text`` for plan ``plan_id``."""

    plan_id: int
    text: str
    at: float


@dataclass(frozen=True, slots=True)
class CompactionStored:
    """The store committed the ``CommitCompaction`` of plan ``plan_id``."""

    plan_id: int
    at: float


@dataclass(frozen=True, slots=True)
class CompactionFailed:
    """Plan ``plan_id`` failed: the summarizer, the store or the lease (``kind`` says which)."""

    plan_id: int
    kind: str
    retryable: bool
    at: float
    retry_after: float | None = None
    message: str = field(default="", compare=False)
    """What went wrong, in words: told with the failure (``Failed.message``)."""


@dataclass(frozen=True, slots=True)
class CompactionAbandoned:
    """Nothing will land plan ``plan_id`` (its task was cancelled, or will never run): it is
    forgotten, and is no failure (no backoff)."""

    plan_id: int
    at: float


@dataclass(frozen=True, slots=True)
class TurnAppended:
    """A finalized turn, already stored by the shell: it is held verbatim from now on, and
    pinned as it arrives when the landmark heuristics recognise it. The session answers with
    all that follows (see :meth:`Session.receive`)."""

    turn: Turn
    now: float | None = None
    """The shell's clock when the turn was stored: when a fold the append starts is decided
    (``None``: the turn's own time)."""

    @property
    def at(self) -> float:
        return self.turn.at


@dataclass(frozen=True, slots=True)
class TurnsAdopted:
    """Turns another replica stored after the ones held here (and decided about: its folds,
    its landmarks stored): held from now on, the landmarks the heuristics find in them pinned
    as that replica pinned them. Nothing else follows from them here."""

    turns: tuple[Turn, ...]
    at: float


@dataclass(frozen=True, slots=True)
class OverflowReported:
    """The bot's model refused its context as too long: every verbatim turn before ``end``
    (a tool unit boundary, where the safety region begins) is to be folded at once."""

    end: int
    at: float


@dataclass(frozen=True, slots=True)
class PinRequested:
    """Pin ``landmark`` (replacing one at its index), already stored by the shell: from now on
    it is shown whole, and no compaction folds it. Its time is ``landmark.pinned_at``."""

    landmark: Landmark

    @property
    def at(self) -> float:
        return self.landmark.pinned_at


@dataclass(frozen=True, slots=True)
class UnpinRequested:
    """Unpin the landmark at ``index`` (already deleted from the store). A turn already folded
    stays out of the summary; one still verbatim is folded as usual."""

    index: int
    at: float


@dataclass(frozen=True, slots=True)
class Reconfigured:
    """New limits, from the next request on (a plan in flight is left alone); a smaller live
    note buffer evicts its oldest notes to pending at once."""

    config: SessionConfig
    at: float


@dataclass(frozen=True, slots=True)
class SessionEnding:
    """The session is closing (or no longer served here): no new compaction starts."""

    at: float


@dataclass(frozen=True, slots=True)
class TiersRolled:
    """The tier summaries now cover every turn before ``through``
    (:func:`voice_context.core.tiers.rolled_through`). With ``tiers`` on, a fold whose batch
    begins a new conversation then starts the rolling summary afresh from that conversation:
    what came before is in its conversation's summary."""

    through: int
    at: float


@dataclass(frozen=True, slots=True)
class Restored:
    """What a restored session's record leaves out, read by the shell: how far the tier
    summaries cover the transcript (``rolled_through``) and the time of the turn just before
    the cursor (``folded_at``, ``None`` when unknown); a time known already is kept."""

    rolled_through: int
    folded_at: float | None
    at: float


Event = (
    ContextRequested
    | NoteReceived
    | NotesStored
    | SummaryReturned
    | CompactionStored
    | CompactionFailed
    | CompactionAbandoned
    | TurnAppended
    | TurnsAdopted
    | OverflowReported
    | PinRequested
    | UnpinRequested
    | Reconfigured
    | SessionEnding
    | TiersRolled
    | Restored
)


# -- effects: what the shell is to do, or to tell ----------------------------------------------


@dataclass(frozen=True, slots=True)
class StartCompaction:
    """Call the summarizer for ``plan`` (it is in flight from now on)."""

    plan: CompactionPlan


@dataclass(frozen=True, slots=True)
class PersistNotes:
    """Write these note buffers, then answer ``NotesStored(staged)``; until then nothing changed."""

    staged: StagedNotes
    note: Note | None = field(default=None, compare=False)
    """The note as it was received (before any clipping): what recall indexes of it."""

    @property
    def live(self) -> tuple[Note, ...]:
        return self.staged.live

    @property
    def pending(self) -> tuple[Note, ...]:
        return self.staged.pending

    @property
    def changed(self) -> NotesChanged:
        return self.staged.changed


@dataclass(frozen=True, slots=True)
class CommitCompaction:
    """Commit cursor ``plan.end``, ``summary`` and the ``pending_notes`` left, all together (if
    the store's cursor is still ``plan.start``); then answer ``CompactionStored``, or
    ``CompactionFailed`` when the store refused or failed."""

    plan: CompactionPlan
    summary: str
    pending_notes: tuple[Note, ...]
    clamped: bool


@dataclass(frozen=True, slots=True)
class TurnHeld:
    """A turn is held at transcript ``index``; ``landmark`` is the one the heuristics pinned
    on it, for the shell to store (``None``: none)."""

    index: int
    landmark: Landmark | None


@dataclass(frozen=True, slots=True)
class RecallAhead:
    """A user turn was just held at ``index``: search for it now, ahead of the reply that
    answers it (a context's default query is the newest user turn)."""

    index: int
    turn: Turn


@dataclass(frozen=True, slots=True)
class RollTiers:
    """The turn held at ``index`` ended a conversation (it came more than
    ``conversation_gap_seconds`` after the turn before it): roll the tiers now."""

    index: int


@dataclass(frozen=True, slots=True)
class StoreLandmark:
    """Store the landmark the heuristics pinned on a turn just held (the turn is stored):
    one that cannot be stored stays pinned here."""

    landmark: Landmark


@dataclass(frozen=True, slots=True)
class Unpinned:
    """The landmark an unpin removed."""

    landmark: Landmark


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The plan in flight was forgotten: its result, if one ever comes, is stale."""

    plan: CompactionPlan


#: ``StartCompaction``, ``PersistNotes`` and ``CommitCompaction`` are done (the last two then
#: confirmed), and so are ``TurnHeld`` (the turn indexed for recall), ``RecallAhead``,
#: ``RollTiers`` and ``StoreLandmark``; the others are told (logged, pushed to clients).
Effect = (
    StartCompaction
    | PersistNotes
    | CommitCompaction
    | Applied
    | Failed
    | Stale
    | Skip
    | TurnHeld
    | RecallAhead
    | RollTiers
    | StoreLandmark
    | Unpinned
    | Abandoned
)


__all__ = [
    "Abandoned",
    "Applied",
    "CommitCompaction",
    "CompactionAbandoned",
    "CompactionFailed",
    "CompactionPlan",
    "CompactionStored",
    "ContextRequested",
    "Effect",
    "Event",
    "Failed",
    "NoteReceived",
    "NotesChanged",
    "NotesStored",
    "OverflowReported",
    "PersistNotes",
    "PinRequested",
    "RecallAhead",
    "Reconfigured",
    "Restored",
    "RollTiers",
    "SessionEnding",
    "StagedNotes",
    "Stale",
    "StartCompaction",
    "StoreLandmark",
    "SummaryReturned",
    "TiersRolled",
    "TurnAppended",
    "TurnHeld",
    "TurnsAdopted",
    "UnpinRequested",
    "Unpinned",
]
