"""The pure session state machine: literal times, no event loop."""

from __future__ import annotations

import pytest
from helpers import given, landed, noted, notes, skipped, started, turn, turns

from voice_context.core.config import SessionConfig
from voice_context.core.session import (
    Abandoned,
    Applied,
    CommitCompaction,
    CompactionAbandoned,
    CompactionFailed,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    Failed,
    NoteReceived,
    NotesChanged,
    NotesStored,
    OverflowReported,
    PersistNotes,
    RecallAhead,
    Reconfigured,
    Session,
    SessionEnding,
    SessionStats,
    Skip,
    SkipReason,
    Stale,
    StartCompaction,
    SummaryReturned,
    TurnAppended,
    TurnHeld,
)
from voice_context.core.text import clamp_sentences
from voice_context.core.turns import Note
from voice_context.errors import ConfigError


def session_with(n: int, config: SessionConfig | None = None, *, name: str = "room") -> Session:
    session = Session(name, config)
    given(session, *[TurnAppended(t) for t in turns(n)])
    return session


def failed_at(session: Session, plan_id: int, kind: str, at: float, *, retryable: bool = True) -> Failed:
    """The summarizer failed for ``plan_id`` at ``at``: the failure told."""
    [failed] = session.receive(CompactionFailed(plan_id, kind, retryable, at))
    assert isinstance(failed, Failed), failed
    return failed


def recompaction(session: Session, plan_id: int, text: str, at: float) -> CompactionPlan:
    """An overlong answer for ``plan_id``: the re-compaction pass it starts."""
    [effect] = session.receive(SummaryReturned(plan_id, text, at))
    assert isinstance(effect, StartCompaction) and effect.plan.recompact, effect
    return effect.plan


def texts(session: Session) -> list[str]:
    return [t.text for t in session.view().turns]


# -- the seed's timeline --------------------------------------------------------


def test_seed_timeline() -> None:
    session = session_with(60)
    assert skipped(session, 100.0) == Skip(SkipReason.BELOW_THRESHOLD, 10)

    assert given(session, TurnAppended(turn(60))) == [TurnHeld(60, None), RecallAhead(60, turn(60))]
    first = started(session, 100.0)
    assert (first.start, first.end, first.recent_start) == (0, 10, 11)
    assert first.turns == tuple(turns(10))
    assert first.previous_summary == ""
    assert first.started_at == 100.0
    assert first.max_chars == 1200
    assert first.max_note_chars == 400
    assert session.in_flight is first

    applied = landed(session, first.plan_id, "Turns 0-9 folded.", 101.5)
    assert (applied.old_cursor, applied.new_cursor, applied.covered_through) == (0, 10, 9)
    assert applied.latency == 1.5
    assert not applied.clamped
    assert session.cursor == 10
    assert session.summary == "Turns 0-9 folded."
    assert session.in_flight is None
    assert texts(session) == [f"turn {i}" for i in range(10, 61)]

    given(session, *[TurnAppended(turn(i)) for i in range(61, 70)])
    assert skipped(session, 102.0) == Skip(SkipReason.BELOW_THRESHOLD, 20)
    given(session, TurnAppended(turn(70)))
    second = started(session, 103.0)
    assert (second.start, second.end, second.recent_start) == (10, 20, 21)
    assert second.turns == tuple(turns(10, start_at=10))
    assert second.previous_summary == "Turns 0-9 folded."
    assert second.plan_id == first.plan_id + 1

    landed(session, second.plan_id, "Turns 0-19 folded.", 104.0)
    assert session.cursor == 20
    assert session.view().covered_through == 19
    assert texts(session)[0] == "turn 20"


def test_elastic_window_while_in_flight() -> None:
    session = session_with(61)
    plan = started(session, 0.0)
    for i in range(61, 64):  # three turns arrive during a 3 s compaction
        given(session, TurnAppended(turn(i)))
        assert skipped(session, float(i - 60)) == Skip(SkipReason.ALREADY_IN_FLIGHT, i + 1 - 50)
        view = session.view()
        assert view.cursor == 0
        assert len(view.turns) == i + 1  # nothing is dropped before the summary lands
    applied = landed(session, plan.plan_id, "Early chat.", 3.0)
    assert applied.latency == 3.0
    view = session.view()
    assert view.cursor == 10
    assert texts(session) == [f"turn {i}" for i in range(10, 64)]
    assert len(view.turns) == 54
    # the boundary snapped forward; the count is below the threshold again
    assert skipped(session, 4.0) == Skip(SkipReason.BELOW_THRESHOLD, 14)


# -- skip reasons ---------------------------------------------------------------


def test_below_threshold() -> None:
    assert skipped(Session("empty"), 0.0) == Skip(SkipReason.BELOW_THRESHOLD, 0)
    assert skipped(session_with(60), 0.0).reason is SkipReason.BELOW_THRESHOLD


def test_already_in_flight() -> None:
    session = session_with(75)
    started(session, 0.0)
    assert skipped(session, 1.0) == Skip(SkipReason.ALREADY_IN_FLIGHT, 25)


def test_no_eligible_batch_when_the_batch_is_too_young() -> None:
    session = Session("aged", SessionConfig(min_age_seconds=30.0))
    given(session, *[TurnAppended(t) for t in turns(61, t0=1000.0)])  # turn i at 1000+i: 0..9 ends at 1009
    assert skipped(session, 1038.0) == Skip(SkipReason.NO_ELIGIBLE_BATCH, 11)
    assert session.in_flight is None
    assert started(session, 1039.0).end == 10


def test_session_ending() -> None:
    session = session_with(61)
    assert given(session, SessionEnding(0.0)) == []
    assert session.ending
    assert skipped(session, 0.0) == Skip(SkipReason.SESSION_ENDING, 11)


def test_backing_off_until_retry_at() -> None:
    session = session_with(61)
    plan = started(session, 10.0)
    failed = failed_at(session, plan.plan_id, "timeout", 12.0)
    assert failed.retry_at == 14.0  # base 2 s after the first failure
    assert skipped(session, 13.9) == Skip(SkipReason.BACKING_OFF, 11, retry_at=14.0)
    assert started(session, 14.0).start == 0


# -- failures and backoff ------------------------------------------------------------


def test_failure_keeps_the_cursor_and_clears_in_flight() -> None:
    session = session_with(61)
    plan = started(session, 0.0)
    failed = failed_at(session, plan.plan_id, "http", 0.25)
    assert (failed.kind, failed.retryable, failed.failures, failed.latency) == ("http", True, 1, 0.25)
    assert failed.plan is plan
    assert session.cursor == 0
    assert session.summary == ""
    assert session.in_flight is None
    assert len(session.view().turns) == 61
    assert session.stats().failures == 1


def test_backoff_doubles_and_is_capped() -> None:
    config = SessionConfig(retry_base_seconds=2.0, retry_max_seconds=10.0)
    session = session_with(61, config)
    now = 0.0
    delays = []
    for _ in range(5):
        plan = started(session, now)
        failed = failed_at(session, plan.plan_id, "timeout", now)
        delays.append(failed.retry_at - now)
        assert session.retry_at == failed.retry_at
        assert skipped(session, failed.retry_at - 0.001).reason is SkipReason.BACKING_OFF
        now = failed.retry_at
    assert delays == [2.0, 4.0, 8.0, 10.0, 10.0]
    assert session.stats().failures == 5


def test_a_providers_retry_after_sets_the_backoff_when_it_is_the_longer_wait() -> None:
    session = session_with(61, SessionConfig(retry_base_seconds=2.0, retry_max_seconds=60.0))
    waits = []
    now = 0.0
    # (retry_after, retryable): the provider's 30 s beats the first step's 2 s; 1 s loses to the
    # second step's 4 s; two hours are held to one; a refusal waits the ceiling all the same
    for retry_after, retryable in ((30.0, True), (1.0, True), (7200.0, True), (30.0, False)):
        plan = started(session, now)
        [failed] = session.receive(
            CompactionFailed(plan.plan_id, "rate_limited", retryable, now, retry_after)
        )
        assert isinstance(failed, Failed)
        assert skipped(session, failed.retry_at - 0.001).reason is SkipReason.BACKING_OFF
        waits.append(failed.retry_at - now)
        now = failed.retry_at
    assert waits == [30.0, 4.0, 3600.0, 60.0]


def test_non_retryable_failure_waits_the_maximum() -> None:
    session = session_with(61, SessionConfig(retry_base_seconds=2.0, retry_max_seconds=60.0))
    plan = started(session, 5.0)
    failed = failed_at(session, plan.plan_id, "auth", 5.0, retryable=False)
    assert not failed.retryable
    assert failed.retry_at == 65.0
    assert skipped(session, 64.0).reason is SkipReason.BACKING_OFF
    assert started(session, 65.0).start == 0


def test_success_resets_failures_and_backoff() -> None:
    session = session_with(61)
    for now in (0.0, 2.0, 6.0):  # three failures: retry after 2 s, 4 s, 8 s
        plan = started(session, now)
        failed_at(session, plan.plan_id, "timeout", now)
    assert session.stats().failures == 3
    plan = started(session, 14.0)
    landed(session, plan.plan_id, "Folded.", 15.0)
    assert session.stats().failures == 0
    assert session.retry_at is None
    assert session.stats().compactions == 1
    # the next failure starts the backoff over at the base delay
    given(session, *[TurnAppended(turn(i)) for i in range(61, 71)])
    plan = started(session, 20.0)
    failed = failed_at(session, plan.plan_id, "timeout", 20.0)
    assert (failed.failures, failed.retry_at) == (1, 22.0)


@pytest.mark.parametrize("text", ["", "   ", "\n \t\n"])
def test_empty_result_is_a_failure(text: str) -> None:
    session = session_with(61)
    plan = started(session, 0.0)
    # retried after the base 2 s, like any retryable failure
    assert session.receive(SummaryReturned(plan.plan_id, text, 1.0)) == [
        Failed(plan, "empty", True, 1, 3.0, 1.0)
    ]
    assert session.cursor == 0
    assert session.in_flight is None


# -- stale results -------------------------------------------------------------------


def test_old_plan_result_after_a_failure_and_a_new_plan_is_stale() -> None:
    session = session_with(61)
    old = started(session, 0.0)
    failed_at(session, old.plan_id, "timeout", 1.0)
    new = started(session, 3.0)
    assert new.plan_id != old.plan_id
    assert (new.start, new.end) == (old.start, old.end)

    before = session.stats()
    assert (
        given(
            session,
            SummaryReturned(old.plan_id, "A late answer.", 4.0),
            CompactionStored(old.plan_id, 4.0),
            CompactionFailed(old.plan_id, "timeout", True, 4.0),
            CompactionAbandoned(old.plan_id, 4.0),
        )
        == [Stale(old.plan_id, new.plan_id)] * 4
    )
    assert session.stats() == before
    assert session.in_flight is new
    assert session.summary == ""

    landed(session, new.plan_id, "The real answer.", 5.0)
    assert session.summary == "The real answer."


def test_result_after_abandon_is_stale() -> None:
    session = session_with(61)
    plan = started(session, 0.0)
    assert session.receive(CompactionAbandoned(plan.plan_id, 0.5)) == [Abandoned(plan)]
    assert session.in_flight is None
    assert (
        given(
            session,
            CompactionAbandoned(plan.plan_id, 0.5),
            SummaryReturned(plan.plan_id, "Too late.", 1.0),
            CompactionFailed(plan.plan_id, "timeout", True, 1.0),
        )
        == [Stale(plan.plan_id, None)] * 3
    )
    assert (session.cursor, session.summary, session.stats().failures) == (0, "", 0)
    # abandoning is not a failure: no backoff
    assert started(session, 1.0).plan_id == plan.plan_id + 1


def test_an_unknown_plan_id_is_stale() -> None:
    session = session_with(61)
    plan = started(session, 0.0)
    assert session.receive(SummaryReturned(plan.plan_id + 7, "Nope.", 1.0)) == [
        Stale(plan.plan_id + 7, plan.plan_id)
    ]
    assert session.in_flight is plan


# -- the summary budget --------------------------------------------------------------

SENTENCES = [f"Sentence number {i} says something." for i in range(6)]  # 34 chars each
OVERLONG = " ".join(SENTENCES)


def test_overlong_result_gets_one_recompaction_then_is_clamped() -> None:
    config = SessionConfig(max_summary_chars=80)
    session = session_with(61, config)
    noted(session, Note("a whiteboard", 0.0))  # stays live: nothing pending
    plan = started(session, 10.0)

    again = recompaction(session, plan.plan_id, OVERLONG, 11.0)
    assert again.plan_id == plan.plan_id + 1
    assert (again.start, again.end, again.recent_start) == (0, 10, 11)
    assert again.turns == ()
    assert again.notes == ()
    assert again.previous_summary == OVERLONG
    assert again.started_at == 10.0
    assert session.in_flight is again
    assert session.cursor == 0
    assert "recompact" in repr(again)

    # the first plan's id is no longer current
    assert session.receive(SummaryReturned(plan.plan_id, "Short.", 11.5)) == [
        Stale(plan.plan_id, again.plan_id)
    ]

    applied = landed(session, again.plan_id, OVERLONG + " More.", 12.0)
    assert applied.clamped
    assert applied.summary == " ".join(SENTENCES[:2])  # 69 chars: the longest whole-sentence prefix
    assert applied.summary == clamp_sentences(OVERLONG, 80)
    assert applied.summary.endswith(".")
    assert len(session.summary) <= 80
    assert applied.latency == 2.0  # measured from the first plan's start
    assert applied.plan is again
    assert session.cursor == 10


def test_recompaction_that_fits_is_not_clamped() -> None:
    session = session_with(61, SessionConfig(max_summary_chars=80))
    plan = started(session, 0.0)
    again = recompaction(session, plan.plan_id, OVERLONG, 1.0)
    applied = landed(session, again.plan_id, "Condensed: six sentences.", 2.0)
    assert not applied.clamped
    assert session.summary == "Condensed: six sentences."


def test_recompaction_can_fail_too() -> None:
    session = session_with(61, SessionConfig(max_summary_chars=80))
    plan = started(session, 0.0)
    again = recompaction(session, plan.plan_id, OVERLONG, 1.0)
    [failed] = session.receive(SummaryReturned(again.plan_id, " ", 2.0))
    assert isinstance(failed, Failed)
    assert failed.plan is again
    assert (session.cursor, session.in_flight, session.stats().failures) == (0, None, 1)


def test_clamp_without_a_sentence_boundary_cuts_at_a_word() -> None:
    session = session_with(61, SessionConfig(max_summary_chars=40))
    plan = started(session, 0.0)
    words = "word " * 30
    again = recompaction(session, plan.plan_id, words, 1.0)
    applied = landed(session, again.plan_id, words, 2.0)
    assert applied.clamped
    assert len(applied.summary) <= 40
    assert applied.summary.endswith("…")


def test_result_is_normalized() -> None:
    session = session_with(61)
    plan = started(session, 0.0)
    assert given(
        session,
        SummaryReturned(plan.plan_id, "  Alice   spoke. \n\n Bob  too. ", 1.0),
        CompactionStored(plan.plan_id, 1.0),
    ) == [
        CommitCompaction(plan, "Alice spoke.\nBob too.", (), False),
        Applied(plan, 0, 10, "Alice spoke.\nBob too.", False, 1.0),
    ]
    assert session.summary == "Alice spoke.\nBob too."


# -- screen notes ------------------------------------------------------------------


def test_notes_evict_into_pending() -> None:
    session = Session("notes")
    for i, note in enumerate(notes(8)):
        assert noted(session, note) == NotesChanged(live=i + 1, pending=0, evicted=0, dropped=0)
    assert noted(session, Note("ninth", 8.0)) == NotesChanged(live=8, pending=1, evicted=1, dropped=0)
    assert session.pending_notes == (Note("note 0", 0.0),)
    assert session.live_notes[-1] == Note("ninth", 8.0)
    assert session.view().live_notes == session.live_notes


def test_long_note_is_clipped_to_the_live_limit() -> None:
    session = Session("notes")
    noted(session, Note("x " * 300, 0.0, speaker="Alice", source="game"))
    [note] = session.live_notes
    assert len(note.text) <= 220
    assert note.text.endswith("…")
    assert (note.speaker, note.source) == ("Alice", "game")


def test_pending_notes_fold_into_the_next_plan_within_budget() -> None:
    session = session_with(61)
    batch = notes(18, width=100)  # each renders as "Screen: " + 100 chars
    for note in batch:
        noted(session, note)
    assert len(session.pending_notes) == 10
    plan = started(session, 0.0)
    # 3 notes take 3 * 109 = 327 chars; a 4th would take 436 > 400
    assert plan.notes == tuple(batch[:3])
    assert sum(len(n.render()) + 1 for n in plan.notes) <= 400
    assert "notes=3" in repr(plan)


def test_oversized_single_note_still_folds() -> None:
    session = session_with(61, SessionConfig(max_note_chars=10, live_note_entries=1))
    noted(session, Note("a note longer than ten chars", 0.0))
    noted(session, Note("live", 1.0))
    plan = started(session, 2.0)
    assert plan.notes == (Note("a note longer than ten chars", 0.0),)


def test_pending_notes_clear_only_on_success() -> None:
    session = session_with(61, SessionConfig(live_note_entries=2))
    for note in notes(5):
        noted(session, note)
    assert session.pending_notes == tuple(notes(3))
    plan = started(session, 0.0)
    assert plan.notes == tuple(notes(3))

    failed_at(session, plan.plan_id, "timeout", 1.0)
    assert session.pending_notes == tuple(notes(3))  # kept on failure
    retry = started(session, 3.0)
    assert retry.notes == tuple(notes(3))
    assert session.receive(CompactionAbandoned(retry.plan_id, 3.0)) == [Abandoned(retry)]
    assert session.pending_notes == tuple(notes(3))  # kept when abandoned

    plan = started(session, 3.0)
    assert plan.notes == tuple(notes(3))
    landed(session, plan.plan_id, "Folded, with notes.", 4.0)
    assert session.pending_notes == ()
    assert session.live_notes == tuple(notes(2, start_at=3))


def test_notes_evicted_during_flight_stay_pending_after_success() -> None:
    session = session_with(61, SessionConfig(live_note_entries=1))
    noted(session, Note("before", 0.0))
    noted(session, Note("live", 1.0))
    plan = started(session, 2.0)
    assert plan.notes == (Note("before", 0.0),)
    noted(session, Note("during", 3.0))  # evicts "live" while the plan is in flight
    assert session.pending_notes == (Note("before", 0.0), Note("live", 1.0))
    [commit] = session.receive(SummaryReturned(plan.plan_id, "Folded.", 4.0))
    assert commit == CommitCompaction(plan, "Folded.", (Note("live", 1.0),), False)  # what the store keeps
    [applied] = session.receive(CompactionStored(plan.plan_id, 4.0))
    assert isinstance(applied, Applied)
    assert list(session.pending_notes) == [Note("live", 1.0)]


def test_max_pending_notes_drops_the_oldest_and_counts() -> None:
    session = Session("notes", SessionConfig(live_note_entries=1, max_pending_notes=3))
    changes = [noted(session, note) for note in notes(7)]
    assert session.pending_notes == tuple(notes(3, start_at=3))
    assert session.live_notes == (notes(7)[-1],)
    assert [c.dropped for c in changes] == [0, 0, 0, 0, 1, 1, 1]
    assert changes[-1] == NotesChanged(live=1, pending=3, evicted=1, dropped=1)
    assert session.stats().notes_dropped == 3


def test_a_note_dropped_from_pending_while_in_flight_is_not_resurrected() -> None:
    session = session_with(61, SessionConfig(live_note_entries=1, max_pending_notes=2))
    for note in notes(3):
        noted(session, note)
    plan = started(session, 0.0)
    assert plan.notes == tuple(notes(2))
    for note in notes(2, start_at=3):  # pushes note 0 and note 1 out of the pending queue
        noted(session, note)
    assert session.pending_notes == tuple(notes(2, start_at=2))
    landed(session, plan.plan_id, "Folded.", 1.0)
    assert session.pending_notes == tuple(notes(2, start_at=2))


def test_a_note_changes_nothing_until_the_store_holds_it() -> None:
    session = Session("notes", SessionConfig(live_note_entries=2))
    for note in notes(3):
        noted(session, note)
    before = (session.live_notes, session.pending_notes)
    [persist] = session.receive(NoteReceived(Note("new", 9.0)))
    assert isinstance(persist, PersistNotes)
    assert (persist.live, persist.pending) == ((notes(3)[2], Note("new", 9.0)), tuple(notes(2)))
    assert (session.live_notes, session.pending_notes) == before, "a preview, not a change"
    assert session.receive(NotesStored(persist.staged)) == []
    assert (session.live_notes, session.pending_notes) == (persist.live, persist.pending)


def test_a_note_never_stored_while_in_flight_leaves_what_the_plan_folds() -> None:
    """A note write fails while a compaction is in flight: when the compaction lands, the
    notes it folded leave the pending queue, and the next note evicts as if nothing happened."""
    session = session_with(61, SessionConfig(live_note_entries=1))
    noted(session, Note("folded", 0.0))
    noted(session, Note("live", 1.0))
    plan = started(session, 2.0)
    assert plan.notes == (Note("folded", 0.0),)

    session.receive(NoteReceived(Note("never stored", 3.0)))  # the write failed: never confirmed

    landed(session, plan.plan_id, "Folded.", 4.0)
    assert session.pending_notes == ()  # not folded a second time by the next compaction
    noted(session, Note("after", 5.0))
    assert list(session.pending_notes) == [Note("live", 1.0)]


def test_notes_staged_before_another_change_cannot_be_taken() -> None:
    session = Session("notes", SessionConfig(live_note_entries=1, max_pending_notes=2))
    [early] = session.receive(NoteReceived(Note("early", 1.0)))
    noted(session, Note("meanwhile", 2.0))
    assert isinstance(early, PersistNotes)
    with pytest.raises(ValueError, match="changed since"):
        session.receive(NotesStored(early.staged))
    assert session.live_notes == (Note("meanwhile", 2.0),)


def test_a_result_is_committed_to_the_store_before_the_session_applies_it() -> None:
    session = session_with(61)
    [start] = session.receive(ContextRequested(0.0))
    assert isinstance(start, StartCompaction)
    [commit] = session.receive(SummaryReturned(start.plan.plan_id, "Folded.", 1.0))
    assert isinstance(commit, CommitCompaction)
    assert (commit.plan, commit.summary, commit.pending_notes) == (start.plan, "Folded.", ())
    assert (session.cursor, session.summary, session.in_flight) == (0, "", start.plan), "not yet"

    [applied] = session.receive(CompactionStored(start.plan.plan_id, 2.0))
    assert isinstance(applied, Applied)
    assert (session.cursor, session.summary, session.in_flight) == (10, "Folded.", None)
    assert session.receive(CompactionStored(start.plan.plan_id, 3.0)) == [Stale(start.plan.plan_id, None)]


def test_a_commit_the_store_refused_is_a_failure_and_moves_nothing() -> None:
    session = session_with(61)
    [start] = session.receive(ContextRequested(0.0))
    assert isinstance(start, StartCompaction)
    session.receive(SummaryReturned(start.plan.plan_id, "Folded.", 1.0))
    [failed] = session.receive(CompactionFailed(start.plan.plan_id, "fenced", True, 1.5))
    assert isinstance(failed, Failed) and (failed.kind, failed.failures) == ("fenced", 1)
    assert session.receive(CompactionStored(start.plan.plan_id, 2.0)) == [Stale(start.plan.plan_id, None)]
    assert (session.cursor, session.summary, session.in_flight) == (0, "", None)


def test_an_overlong_result_starts_its_recompaction_and_a_context_request_may_skip() -> None:
    session = session_with(61, SessionConfig(max_summary_chars=40))
    [start] = session.receive(ContextRequested(0.0))
    assert isinstance(start, StartCompaction)
    [again] = session.receive(SummaryReturned(start.plan.plan_id, "A long sentence here. " * 5, 1.0))
    assert isinstance(again, StartCompaction) and again.plan.recompact
    assert session.receive(ContextRequested(1.5)) == [Skip(SkipReason.ALREADY_IN_FLIGHT, 11)]


# -- an overflow --------------------------------------------------------------------


def test_an_overflow_folds_every_turn_before_the_safety_region_and_supersedes_the_plan_in_flight() -> None:
    session = session_with(61)
    plan = started(session, 0.0)
    [start] = session.receive(OverflowReported(58, 1.0))
    assert isinstance(start, StartCompaction)
    urgent = start.plan
    assert (urgent.start, urgent.end, urgent.trigger) == (0, 58, "emergency")
    assert (urgent.plan_id, urgent.turns) == (plan.plan_id + 1, tuple(turns(58)))
    assert session.in_flight is urgent
    assert session.receive(SummaryReturned(plan.plan_id, "Late.", 1.5)) == [
        Stale(plan.plan_id, urgent.plan_id)
    ]
    applied = landed(session, urgent.plan_id, "Everything but the last three turns.", 2.0)
    assert (applied.new_cursor, texts(session)) == (58, ["turn 58", "turn 59", "turn 60"])
    with pytest.raises(ValueError, match="nothing to fold"):
        session.receive(OverflowReported(58, 3.0))


# -- reconfigure, restore, repr, stats ---------------------------------------------


def test_reconfigure_applies_from_the_next_request() -> None:
    session = session_with(8, SessionConfig(recent_window=4, batch_size=4))
    for note in notes(5):
        noted(session, note)
    assert skipped(session, 0.0) == Skip(SkipReason.BELOW_THRESHOLD, 4)
    assert (
        given(session, Reconfigured(SessionConfig(recent_window=2, batch_size=2, live_note_entries=2), 0.5))
        == []
    )
    assert session.config.batch_size == 2
    assert session.live_notes == tuple(notes(2, start_at=3))  # shrinking the buffer evicts the oldest
    assert session.pending_notes == tuple(notes(3))
    plan = started(session, 1.0)
    assert (plan.start, plan.end, plan.recent_start) == (0, 2, 6)
    assert plan.notes == tuple(notes(3))


def test_reconfigure_leaves_the_plan_in_flight_alone() -> None:
    session = session_with(61)
    plan = started(session, 0.0)
    given(session, Reconfigured(SessionConfig(batch_size=5), 0.5))
    assert session.in_flight is plan
    landed(session, plan.plan_id, "Folded.", 1.0)
    assert session.cursor == 10
    given(session, *[TurnAppended(turn(i)) for i in range(61, 66)])
    # 66 - 10 = 56 > 50 + 5
    nxt = started(session, 2.0)
    assert (nxt.start, nxt.end) == (10, 15)


def test_restored_session_counts_from_its_cursor() -> None:
    session = Session(
        "restored",
        cursor=40,
        turns=turns(5, start_at=40),
        summary="Forty turns in.",
        pending_notes=notes(2),
        compactions=4,
    )
    assert session.total_turns == 45
    assert session.turn(40).text == "turn 40"
    assert session.turn(44).text == "turn 44"
    with pytest.raises(IndexError):
        session.turn(39)
    with pytest.raises(IndexError):
        session.turn(45)
    assert session.pending_notes == tuple(notes(2))
    assert session.stats().compactions == 4
    assert session.view().covered_through == 39
    with pytest.raises(ValueError, match="cursor"):
        Session("bad", cursor=-1)


def test_repr_and_stats() -> None:
    session = session_with(61, name="room-1")
    for note in notes(9):
        noted(session, note)
    assert repr(session) == (
        "<Session 'room-1' turns=61 cursor=0 in_flight=none notes=8+1 summary_chars=0 failures=0>"
    )
    plan = started(session, 0.0)
    assert repr(plan) == "<CompactionPlan #1 fold turns=0..9 notes=1>"
    assert repr(session) == (
        "<Session 'room-1' turns=61 cursor=0 in_flight=plan#1 notes=8+1 summary_chars=0 failures=0>"
    )
    assert session.stats() == SessionStats(
        turns=61,
        cursor=0,
        in_flight=1,
        summary_chars=0,
        live_notes=8,
        pending_notes=1,
        failures=0,
        compactions=0,
        notes_dropped=0,
    )
    landed(session, plan.plan_id, "Twelve chars", 1.0)
    stats = session.stats()
    assert (stats.turns, stats.cursor, stats.in_flight, stats.summary_chars) == (61, 10, None, 12)
    assert (stats.pending_notes, stats.compactions) == (0, 1)
    assert stats._asdict()["turns"] == 61


@pytest.mark.parametrize(
    "overrides",
    [
        {"batch_size": 0},
        {"recent_window": -1},
        {"max_summary_chars": 39},
        {"max_pending_notes": -1},
        {"retry_base_seconds": -1.0},
        {"batch_size": True},
        {"nope": 1},
    ],
)
def test_bad_config_is_refused(overrides: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        SessionConfig().with_overrides(overrides)
