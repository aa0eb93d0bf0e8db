"""One session's state machine: events in, effects out. No clock, no I/O.

A session holds the verbatim turns from the cursor on, the rolling summary of
everything before it, the live screen-note buffer, the evicted notes waiting
to be folded, its landmarks, and at most one compaction plan in flight. Every
change of its state is an event fed to :meth:`Session.receive`, with the time
as plain data; the shell performs the effects that come back, in order::

    session.receive(TurnAppended(turn, now))       -> [TurnHeld(index, landmark)], then as due:
                                                      RecallAhead(index, turn) for a user turn,
                                                      StartCompaction(plan) or Skip(...) for a
                                                      backlog, RollTiers(index) when the turn
                                                      ended a conversation, StoreLandmark(...)
    session.receive(TurnsAdopted(turns, at))       -> []   (held: another replica decided for them)
    session.receive(NoteReceived(note))            -> [PersistNotes(staged)]   (nothing applied)
    session.receive(NotesStored(staged))           -> []   (the buffers are the staged ones now)
    session.receive(ContextRequested(at, fill))    -> [StartCompaction(plan)] or [Skip(...)]
    session.receive(SummaryReturned(id, text, at)) -> [CommitCompaction(...)], [StartCompaction(
                                                      recompact)], [Failed(...)] or [Stale(...)]
    session.receive(CompactionStored(id, at))      -> [Applied(...)]   (cursor and summary move),
                                                      then StartCompaction(next) while a backlog
                                                      is left or a context waits (``waiting``)
    session.receive(CompactionFailed(id, ...))     -> [Failed(...)] or [Stale(...)]
    session.receive(CompactionAbandoned(id, at))   -> [Abandoned(plan)] or [Stale(...)]
    session.receive(OverflowReported(end, at))     -> [StartCompaction(emergency plan)]
    session.receive(PinRequested(landmark))        -> []   (pinned: shown whole, never folded)
    session.receive(UnpinRequested(index, at))     -> [Unpinned(landmark)] or []
    session.receive(Reconfigured(config, at))      -> []   (the limits apply from the next request)
    session.receive(SessionEnding(at))             -> []   (no compaction starts from now on)
    session.receive(TiersRolled(through, at))      -> []
    session.receive(Restored(through, folded_at, at)) -> []

A change the store must hold first is previewed, written by the shell, then
applied: ``CommitCompaction`` and ``PersistNotes`` change nothing until the
shell says the store has them (``CompactionStored``, ``NotesStored``); a write
that fails is answered ``CompactionFailed``, or simply never confirmed, and
nothing needs rolling back. The session decides all that follows an event, and
the shell decides nothing of its own: it performs each effect and feeds back
what came of it. The session manager is the shell over this protocol, serving
or replaying a recording on a logical clock: it writes to its store between an
effect and its confirmation. (A turn, a pinned landmark and an unpin are stored
by the shell before they are fed: they need no preview.) The events and effects
themselves are in :mod:`voice_context.core.events`, and are imported from here too; the
screen-note buffers, which the session holds and delegates to, in :mod:`voice_context.core.notes`.

Invariants, checked by the property tests:

- the cursor only moves forward, and only to the end of the plan that landed;
- a plan never contains a turn inside the recent window at the time it starts,
  unless the fill trigger made it due (they outgrew the window a context protects);
- every turn is either before the cursor (covered by the summary) or kept
  verbatim: there is no gap, whatever order results arrive in;
- the summary never exceeds ``max_summary_chars``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import NamedTuple

from voice_context.core.config import SessionConfig
from voice_context.core.events import (
    Abandoned,
    Applied,
    CommitCompaction,
    CompactionAbandoned,
    CompactionFailed,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    Effect,
    Event,
    Failed,
    NoteReceived,
    NotesChanged,
    NotesStored,
    OverflowReported,
    PersistNotes,
    PinRequested,
    RecallAhead,
    Reconfigured,
    Restored,
    RollTiers,
    SessionEnding,
    StagedNotes,
    Stale,
    StartCompaction,
    StoreLandmark,
    SummaryReturned,
    TiersRolled,
    TurnAppended,
    TurnHeld,
    TurnsAdopted,
    Unpinned,
    UnpinRequested,
)
from voice_context.core.landmarks import Landmark, found_in
from voice_context.core.notes import NoteBuffers
from voice_context.core.text import clamp_sentences, normalize
from voice_context.core.tools import fold_end, for_summary
from voice_context.core.turns import Note, Turn
from voice_context.core.window import (
    Batch,
    FillBudget,
    Skip,
    SkipReason,
    choose_batch,
    fill_end,
    has_backlog,
    verbatim_sizes,
)

#: Past this many failures in a row the backoff stops doubling (it is long at its ceiling by then).
MAX_BACKOFF_DOUBLINGS = 32
#: When a backlog is folded several batches at once, their turns' text stays under this
#: (about 4,000 tokens of a summarizer's input); a single batch is folded whatever its size.
MAX_FOLD_CHARS = 16_000
#: The longest wait a provider's ``Retry-After`` can impose on a session (one hour).
MAX_RETRY_AFTER = 3600.0
#: A summarizer's reply is read up to this many times the summary ceiling: the rest of an
#: overlong reply is never normalised, nor sent back to be condensed.
MAX_REPLY_FACTOR = 4
#: The fill trigger leaves room for as many turns as arrived while any of this many of the
#: last folds was in flight (a burst is met by the folds after it, not forgotten by the next).
ARRIVALS_KEPT = 4


@dataclass(frozen=True, slots=True)
class Accepted:
    """A result that will land as ``summary`` (``clamped`` after a last-resort cut)."""

    plan: CompactionPlan
    summary: str
    clamped: bool


@dataclass(frozen=True, slots=True)
class Rejected:
    """A result that cannot be used (``kind`` says why); it counts as a failure."""

    plan: CompactionPlan
    kind: str


class SessionStats(NamedTuple):
    """A session's counters, shared by logs, the wire and the tests."""

    turns: int
    cursor: int
    in_flight: int | None
    summary_chars: int
    live_notes: int
    pending_notes: int
    failures: int
    compactions: int
    notes_dropped: int
    landmarks: int = 0


@dataclass(frozen=True, slots=True)
class ContextView:
    """A snapshot of what a context is built from."""

    cursor: int
    summary: str
    turns: tuple[Turn, ...]
    live_notes: tuple[Note, ...]
    config: SessionConfig
    landmarks: tuple[Landmark, ...] = ()
    seen_notes: tuple[Note, ...] = ()
    """The newest screen notes seen (:data:`~voice_context.core.notes.SEEN_NOTES`), live, pending
    or folded: what a plain tail of the transcript shows among its turns (the recency floor counts
    with them; see :mod:`voice_context.core.budget`). Empty: the live notes stand in."""

    @property
    def covered_through(self) -> int:
        return self.cursor - 1


class Session:
    """The pure state machine of one session. See the module docstring."""

    def __init__(
        self,
        name: str,
        config: SessionConfig | None = None,
        *,
        cursor: int = 0,
        turns: Iterable[Turn] = (),
        summary: str = "",
        live_notes: Iterable[Note] = (),
        pending_notes: Iterable[Note] = (),
        failures: int = 0,
        compactions: int = 0,
        landmarks: Iterable[Landmark] = (),
        folded_at: float | None = None,
        rolled_through: int = 0,
    ) -> None:
        """Create a session, or restore one: ``turns`` are those from ``cursor`` on.

        With ``tiers`` on, ``folded_at`` is the time of the turn just before the cursor
        and ``rolled_through`` how far the tier summaries cover the transcript (see
        ``TiersRolled``)."""
        if cursor < 0:
            raise ValueError("cursor must be >= 0")
        self.name = name
        self.config = config or SessionConfig()
        self._cursor = cursor
        self._turns: list[Turn] = list(turns)
        self._summary = summary
        self._notes = NoteBuffers(self.config, live_notes, pending_notes)
        self._in_flight: CompactionPlan | None = None
        self._next_plan_id = 1
        self._failures = failures
        self._compactions = compactions
        self._retry_at: float | None = None
        self._ending = False
        #: the accepted result of the plan in flight, while the store commits it
        self._committing: Accepted | None = None
        self._landmarks: dict[int, Landmark] = {lm.index: lm for lm in landmarks}
        self._folded_at = folded_at
        self._rolled_through = rolled_through
        #: how many turns arrived while each of the last folds was in flight (the fill trigger
        #: leaves room for as many: see :func:`~voice_context.core.window.fill_end`)
        self._arrived: deque[int] = deque(maxlen=ARRIVALS_KEPT)
        self._flight_from = 0  # the turn count when the plan in flight started
        #: what the newest context asked for while a fold was in flight measured under its
        #: budget: the fill trigger it could not act on, weighed again once that fold lands
        self._waiting: FillBudget | None = None

    # -- reading ---------------------------------------------------------------

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def total_turns(self) -> int:
        return self._cursor + len(self._turns)

    @property
    def summary(self) -> str:
        return self._summary

    @property
    def in_flight(self) -> CompactionPlan | None:
        return self._in_flight

    @property
    def waiting(self) -> FillBudget | None:
        """What the newest context asked for while a fold was in flight measured under its
        budget, until a fold starts: a landed fold asks the fill trigger again with it, so that
        the contexts skipped as ``already_in_flight`` are not forgotten (``None``: none was)."""
        return self._waiting

    @property
    def backlog(self) -> bool:
        """Whether turns have piled up before the recent window with no context asked for
        them (:func:`~voice_context.core.window.has_backlog`): a fold is then started without one."""
        return has_backlog(self.total_turns, self._cursor, self.config)

    @property
    def ending(self) -> bool:
        return self._ending

    @property
    def live_notes(self) -> tuple[Note, ...]:
        return self._notes.live

    @property
    def pending_notes(self) -> tuple[Note, ...]:
        return self._notes.pending

    @property
    def verbatim_turns(self) -> tuple[Turn, ...]:
        """The turns from the cursor on, oldest first."""
        return tuple(self._turns)

    @property
    def retry_at(self) -> float | None:
        return self._retry_at

    def turn(self, index: int) -> Turn:
        """The turn at a transcript index, if it is still held (at or after the cursor)."""
        if not self._cursor <= index < self.total_turns:
            raise IndexError(f"turn {index} is not held (cursor {self._cursor}, turns {self.total_turns})")
        return self._turns[index - self._cursor]

    def stats(self) -> SessionStats:
        return SessionStats(
            turns=self.total_turns,
            cursor=self._cursor,
            in_flight=self._in_flight.plan_id if self._in_flight else None,
            summary_chars=len(self._summary),
            live_notes=self._notes.live_count,
            pending_notes=self._notes.pending_count,
            failures=self._failures,
            compactions=self._compactions,
            notes_dropped=self._notes.dropped,
            landmarks=len(self._landmarks),
        )

    @property
    def landmarks(self) -> tuple[Landmark, ...]:
        """The session's landmarks, oldest first."""
        return tuple(self._landmarks[i] for i in sorted(self._landmarks))

    def landmark(self, index: int) -> Landmark | None:
        return self._landmarks.get(index)

    def view(self) -> ContextView:
        return ContextView(
            self._cursor,
            self._summary,
            tuple(self._turns),
            self._notes.live,
            self.config,
            self.landmarks,
            self._notes.seen,
        )

    def __repr__(self) -> str:
        flight = f"plan#{self._in_flight.plan_id}" if self._in_flight else "none"
        return (
            f"<Session {self.name!r} turns={self.total_turns} cursor={self._cursor} "
            f"in_flight={flight} notes={self._notes.live_count}+{self._notes.pending_count} "
            f"summary_chars={len(self._summary)} failures={self._failures}>"
        )

    @property
    def folded_at(self) -> float | None:
        """The time of the newest folded turn (known once a fold landed, or when restored)."""
        return self._folded_at

    # -- events ----------------------------------------------------------------

    def receive(self, event: Event) -> list[Effect]:
        """Feed one event; returns the effects for the shell to perform or tell, in order.

        Raises ``ValueError`` for notes staged before another change of the buffers, or an
        overflow with nothing before its ``end`` to fold; ``IndexError`` for a pin of a turn
        the session does not have."""
        match event:
            case TurnAppended(turn=turn, now=now):
                return self._turn_appended(turn, turn.at if now is None else now)
            case TurnsAdopted(turns=adopted):
                for turn in adopted:
                    self._append_turn(turn)
                return []
            case NoteReceived(note=note):
                return [PersistNotes(self._notes.stage(note, self.config), note)]
            case NotesStored(staged=staged):
                self._notes.take(staged)
                return []
            case ContextRequested(at=at, budget=budget):
                decision = self._plan_compaction(at, budget)
                return [decision if isinstance(decision, Skip) else StartCompaction(decision)]
            case SummaryReturned(plan_id=plan_id, text=text, at=at):
                return [self._summary_returned(plan_id, text, at)]
            case CompactionStored(plan_id=plan_id, at=at):
                stored = self._compaction_stored(plan_id, at)
                return [stored] if isinstance(stored, Stale) else [stored, *self._onward(stored.plan, at)]
            case CompactionFailed(plan_id=plan_id, kind=kind, retryable=retryable, at=at):
                return [
                    self._compaction_failed(plan_id, kind, retryable, at, event.retry_after, event.message)
                ]
            case CompactionAbandoned(plan_id=plan_id):
                return [self._abandon(plan_id)]
            case OverflowReported(end=end, at=at):
                return [StartCompaction(self._emergency(at, end))]
            case PinRequested(landmark=landmark):
                self._pin(landmark)
                return []
            case UnpinRequested(index=index):
                removed = self._landmarks.pop(index, None)
                return [] if removed is None else [Unpinned(removed)]
            case Reconfigured(config=config):
                self._reconfigure(config)
                return []
            case SessionEnding():
                self._ending = True
                return []
            case TiersRolled(through=through):
                self._rolled_through = max(self._rolled_through, through)
                return []
            case Restored(rolled_through=through, folded_at=folded_at):
                self._rolled_through = max(self._rolled_through, through)
                if self._folded_at is None:
                    self._folded_at = folded_at
                return []
        raise TypeError(f"not a session event: {event!r}")  # pragma: no cover - the union is closed

    # -- internals -------------------------------------------------------------

    def _turn_appended(self, turn: Turn, now: float) -> list[Effect]:
        """Hold a turn, and say all that follows: index it (``TurnHeld``), recall ahead for a
        user turn, fold a backlog (turns piled up with no context asking: a fold starts from the
        append itself), roll the tiers when it ended a conversation, store its landmark."""
        before = self._turns[-1].at if self._turns else self._folded_at
        held = self._append_turn(turn)
        effects: list[Effect] = [held]
        if turn.role == "user" and self.config.recall and turn.text.strip():
            effects.append(RecallAhead(held.index, turn))
        if self._in_flight is None and self.backlog:
            decision = self._plan_compaction(now)
            effects.append(decision if isinstance(decision, Skip) else StartCompaction(decision))
        gap = self.config.conversation_gap_seconds
        if self.config.tiers and before is not None and turn.at - before > gap:
            effects.append(RollTiers(held.index))
        if held.landmark is not None:
            effects.append(StoreLandmark(held.landmark))
        return effects

    def _onward(self, landed: CompactionPlan, now: float) -> list[Effect]:
        """Once a fold landed: the next one, while a backlog is left (see
        :func:`~voice_context.core.window.has_backlog`) or a context asked for while it ran
        found the turns from the cursor past the fill line (:attr:`waiting`); none when no
        context needs to ask. An emergency fold starts none: the context rebuilt after it asks."""
        if landed.trigger == "emergency" or (not self.backlog and self._waiting is None):
            return []
        decision = self._plan_compaction(now, self._waiting)
        return [] if isinstance(decision, Skip) else [StartCompaction(decision)]

    def _append_turn(self, turn: Turn) -> TurnHeld:
        """Hold a finalized turn; a turn the landmark heuristics recognise is pinned as it arrives."""
        self._turns.append(turn)
        index = self.total_turns - 1
        found = found_in(index, turn) if self.config.landmarks else None
        if found is not None:
            self._landmarks[index] = found
        return TurnHeld(index, found)

    def _pin(self, landmark: Landmark) -> None:
        if not 0 <= landmark.index < self.total_turns:
            raise IndexError(f"no turn {landmark.index} (turns {self.total_turns})")
        self._landmarks[landmark.index] = landmark

    def _reconfigure(self, config: SessionConfig) -> None:
        self.config = config
        self._notes.reconfigure(config)

    def _plan_compaction(self, now: float, budget: FillBudget | None = None) -> CompactionPlan | Skip:
        """Evaluate the trigger for a context request at time ``now``.

        ``budget`` is what the context's layout measured under its budget: with
        one, the fill trigger is evaluated too (see :mod:`voice_context.core.window`), and a
        fold it makes due may reach into the recent window by count. Returns the
        plan to run (and marks it in flight) or why nothing starts.
        """
        decision = self._by_count(now)
        if budget is None or not self.config.fill_trigger:
            return decision if isinstance(decision, Skip) else self._begin(decision, now)
        if isinstance(decision, Skip) and decision.reason is not SkipReason.BELOW_THRESHOLD:
            if decision.reason is SkipReason.ALREADY_IN_FLIGHT:
                self._waiting = budget
            return decision
        sizes = verbatim_sizes(self._turns, self.config, budget)
        end = fill_end(self._cursor, sizes, self.config.fill_trigger, budget, max(self._arrived, default=0))
        if end is None or (isinstance(decision, Batch) and end <= decision.end):
            return decision if isinstance(decision, Skip) else self._begin(decision, now)
        if self._retry_at is not None and now < self._retry_at:
            return Skip(SkipReason.BACKING_OFF, decision.recent_start, retry_at=self._retry_at)
        return self._begin(Batch(self._cursor, end, decision.recent_start), now, trigger="fill")

    def _by_count(self, now: float) -> Batch | Skip:
        return choose_batch(
            total_turns=self.total_turns,
            cursor=self._cursor,
            config=self.config,
            in_flight=self._in_flight is not None,
            ending=self._ending,
            now=now,
            retry_at=self._retry_at,
            turn_times=[t.at for t in self._turns] if self.config.min_age_seconds else (),
        )

    def _check_result(self, plan_id: int, text: str) -> Accepted | CompactionPlan | Rejected | Stale:
        """What ``text`` would come to for ``plan_id``, without doing it. A ``CompactionPlan``
        here is only a preview of the re-compaction pass (its id is not taken yet)."""
        plan = self._in_flight
        if plan is None or plan.plan_id != plan_id:
            return self._stale(plan_id)
        limit = self.config.max_summary_chars
        readable = MAX_REPLY_FACTOR * limit
        text = normalize(text[: readable + 1])
        if len(text) > readable:
            text = clamp_sentences(text, readable)
        if not text and not plan.turns and not plan.notes and plan.landmarks and not plan.recompact:
            # a batch of landmarks alone adds nothing to the summary, and needs nothing from it
            return Accepted(plan, normalize(plan.previous_summary), False)
        if not text:
            return Rejected(plan, "empty")
        if len(text) <= limit:
            return Accepted(plan, text, False)
        if not plan.recompact:
            return replace(
                plan, plan_id=self._next_plan_id, turns=(), notes=(), previous_summary=text, recompact=True
            )
        return Accepted(plan, clamp_sentences(text, limit), True)

    def _compaction_failed(
        self,
        plan_id: int,
        kind: str,
        retryable: bool,
        now: float,
        retry_after: float | None = None,
        message: str = "",
    ) -> Failed | Stale:
        """Nothing moves, a later request retries (not before ``retry_after`` seconds when the
        provider asked for that, up to an hour)."""
        plan = self._in_flight
        if plan is None or plan.plan_id != plan_id:
            return self._stale(plan_id)
        return self._fail(plan, kind, retryable, now, retry_after, message)

    def _abandon(self, plan_id: int) -> Abandoned | Stale:
        plan = self._in_flight
        if plan is None or plan.plan_id != plan_id:
            return self._stale(plan_id)
        self._in_flight = None
        self._committing = None
        return Abandoned(plan)

    def _summary_returned(
        self, plan_id: int, text: str, now: float
    ) -> CommitCompaction | StartCompaction | Failed | Stale:
        verdict = self._check_result(plan_id, text)
        if isinstance(verdict, Stale):
            return verdict
        if isinstance(verdict, CompactionPlan):  # too long: one re-compaction pass
            self._take_plan_id()
            self._in_flight = verdict
            return StartCompaction(verdict)
        if isinstance(verdict, Rejected):
            plan = verdict.plan
            message = "empty emergency fold" if plan.trigger == "emergency" else "empty summary"
            return self._fail(plan, verdict.kind, True, now, message=message)
        self._committing = verdict
        plan = verdict.plan
        return CommitCompaction(
            plan, verdict.summary, self._notes.pending_after(plan.last_note_seq), verdict.clamped
        )

    def _compaction_stored(self, plan_id: int, now: float) -> Applied | Stale:
        verdict, plan = self._committing, self._in_flight
        if verdict is None or plan is None or verdict.plan is not plan or plan.plan_id != plan_id:
            return self._stale(plan_id)
        self._committing = None
        old = self._cursor
        if plan.end > old:
            self._folded_at = self._turns[plan.end - old - 1].at
        del self._turns[: plan.end - old]
        self._cursor = plan.end
        self._summary = verdict.summary
        self._notes.folded(plan.last_note_seq)
        self._in_flight = None
        self._arrived.append(self.total_turns - self._flight_from)
        self._failures = 0
        self._retry_at = None
        self._compactions += 1
        return Applied(plan, old, plan.end, verdict.summary, verdict.clamped, max(0.0, now - plan.started_at))

    def _begin(self, batch: Batch, now: float, *, trigger: str = "count") -> CompactionPlan | Skip:
        """Start ``batch``, its end moved back so that no tool call is folded without its
        result (nor the reverse); nothing starts when the oldest tool chain is still open."""
        end = self._cursor + fold_end(self._turns, batch.size)
        if end == self._cursor:
            return Skip(SkipReason.NO_ELIGIBLE_BATCH, batch.recent_start)
        return self._start(replace(batch, end=end), now, trigger=trigger)

    def _emergency(self, now: float, end: int) -> CompactionPlan:
        """A fold of every verbatim turn before ``end`` (a tool unit boundary), to run at once
        because the bot's model overflowed: it supersedes a plan in flight, whose result
        will be stale. Raises ``ValueError`` when there is nothing before ``end`` to fold."""
        if not self._cursor < end <= self.total_turns:
            raise ValueError(f"nothing to fold before turn {end} (cursor {self._cursor})")
        return self._start(Batch(self._cursor, end, end), now, trigger="emergency", whole=True)

    def _start(
        self, batch: Batch, now: float, *, trigger: str = "count", whole: bool = False
    ) -> CompactionPlan:
        self._waiting = None
        # several batches at once only as far as their text stays under MAX_FOLD_CHARS
        count, size = batch.size, self.config.batch_size
        while not whole and count > size and sum(len(t.text) for t in self._turns[:count]) > MAX_FOLD_CHARS:
            count -= size
        batch = replace(batch, end=batch.start + (fold_end(self._turns, count) or batch.size))
        notes, last_seq = self._notes.for_fold(self.config.max_note_chars)
        fresh = self._conversation_begins(batch)
        previous = self._summary if fresh is None else ""
        kept = [
            for_summary(t)
            for i, t in enumerate(self._turns[: batch.size])
            if batch.start + i not in self._landmarks and (fresh is None or batch.start + i >= fresh)
        ]
        plan = CompactionPlan(
            plan_id=self._take_plan_id(),
            start=batch.start,
            end=batch.end,
            recent_start=batch.recent_start,
            turns=tuple(kept),
            landmarks=sum(1 for i in range(batch.start, batch.end) if i in self._landmarks),
            notes=notes,
            last_note_seq=last_seq,
            previous_summary=previous,
            max_chars=self.config.max_summary_chars,
            max_note_chars=self.config.max_note_chars,
            started_at=now,
            trigger=trigger,
        )
        self._in_flight = plan
        self._flight_from = self.total_turns
        return plan

    def _conversation_begins(self, batch: Batch) -> int | None:
        """With ``tiers`` on: the index at which the newest conversation begun in ``batch``
        begins, when every turn before it is in a tier summary; else ``None`` (the fold goes
        on from the rolling summary). A conversation begins after a silence longer than
        ``conversation_gap_seconds``."""
        if not self.config.tiers:
            return None
        gap = self.config.conversation_gap_seconds
        previous, begins = self._folded_at, None
        for i, turn in enumerate(self._turns[: batch.size]):
            if previous is not None and turn.at - previous > gap:
                begins = batch.start + i
            previous = turn.at if previous is None else max(previous, turn.at)
        if begins is None or begins > self._rolled_through:
            return None
        return begins

    def _take_plan_id(self) -> int:
        plan_id = self._next_plan_id
        self._next_plan_id += 1
        return plan_id

    def _stale(self, plan_id: int) -> Stale:
        current = self._in_flight.plan_id if self._in_flight else None
        return Stale(plan_id, current)

    def _fail(
        self,
        plan: CompactionPlan,
        kind: str,
        retryable: bool,
        now: float,
        retry_after: float | None = None,
        message: str = "",
    ) -> Failed:
        self._in_flight = None
        self._committing = None
        self._arrived.append(self.total_turns - self._flight_from)
        self._failures += 1
        base, ceiling = self.config.retry_base_seconds, self.config.retry_max_seconds
        doublings = min(self._failures - 1, MAX_BACKOFF_DOUBLINGS)  # 2.0**1024 overflows a float
        delay = min(ceiling, base * 2**doublings) if retryable else ceiling
        if retry_after is not None and retry_after > 0:
            delay = max(delay, min(retry_after, MAX_RETRY_AFTER))
        self._retry_at = now + delay
        latency = max(0.0, now - plan.started_at)
        return Failed(plan, kind, retryable, self._failures, self._retry_at, latency, message)


__all__ = [
    "Abandoned",
    "Applied",
    "CommitCompaction",
    "CompactionAbandoned",
    "CompactionFailed",
    "CompactionPlan",
    "CompactionStored",
    "ContextRequested",
    "ContextView",
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
    "Session",
    "SessionEnding",
    "SessionStats",
    "Skip",
    "SkipReason",
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
