"""The pure session state machine: literal times, no event loop."""

from __future__ import annotations

import pytest
from helpers import notes, turn, turns

from voice_context.core.config import SessionConfig
from voice_context.core.session import (
    Accepted,
    Applied,
    CommitCompaction,
    CompactionFailed,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    Failed,
    NoteReceived,
    NotesChanged,
    NotesStored,
    PersistNotes,
    Rejected,
    Session,
    SessionStats,
    Skip,
    SkipReason,
    Stale,
    StartCompaction,
    SummaryReturned,
)
from voice_context.core.text import clamp_sentences
from voice_context.core.turns import Note
from voice_context.errors import ConfigError


def session_with(n: int, config: SessionConfig | None = None, *, name: str = "room") -> Session:
    session = Session(name, config)
    for t in turns(n):
        session.append_turn(t)
    return session


def plan_of(session: Session, now: float) -> CompactionPlan:
    decision = session.plan_compaction(now)
    assert isinstance(decision, CompactionPlan), decision
    return decision


def skip_of(session: Session, now: float) -> Skip:
    decision = session.plan_compaction(now)
    assert isinstance(decision, Skip), decision
    return decision


def applied(outcome: object) -> Applied:
    assert isinstance(outcome, Applied), outcome
    return outcome


def texts(session: Session) -> list[str]:
    return [t.text for t in session.view().turns]


# -- the seed's timeline --------------------------------------------------------


def test_seed_timeline() -> None:
    session = session_with(60)
    assert skip_of(session, 100.0) == Skip(SkipReason.BELOW_THRESHOLD, 10)

    assert session.append_turn(turn(60)) == 60
    first = plan_of(session, 100.0)
    assert (first.start, first.end, first.recent_start) == (0, 10, 11)
    assert first.turns == tuple(turns(10))
    assert first.previous_summary == ""
    assert first.started_at == 100.0
    assert first.max_chars == 1200
    assert first.max_note_chars == 400
    assert session.in_flight is first

    landed = applied(session.compaction_succeeded(first.plan_id, "Turns 0-9 folded.", 101.5))
    assert (landed.old_cursor, landed.new_cursor, landed.covered_through) == (0, 10, 9)
    assert landed.latency == 1.5
    assert not landed.clamped
    assert session.cursor == 10
    assert session.summary == "Turns 0-9 folded."
    assert session.in_flight is None
    assert texts(session) == [f"turn {i}" for i in range(10, 61)]

    for i in range(61, 70):
        session.append_turn(turn(i))
    assert skip_of(session, 102.0) == Skip(SkipReason.BELOW_THRESHOLD, 20)
    session.append_turn(turn(70))
    second = plan_of(session, 103.0)
    assert (second.start, second.end, second.recent_start) == (10, 20, 21)
    assert second.turns == tuple(turns(10, start_at=10))
    assert second.previous_summary == "Turns 0-9 folded."
    assert second.plan_id == first.plan_id + 1

    applied(session.compaction_succeeded(second.plan_id, "Turns 0-19 folded.", 104.0))
    assert session.cursor == 20
    assert session.view().covered_through == 19
    assert texts(session)[0] == "turn 20"


def test_elastic_window_while_in_flight() -> None:
    session = session_with(61)
    plan = plan_of(session, 0.0)
    for i in range(61, 64):  # three turns arrive during a 3 s compaction
        session.append_turn(turn(i))
        assert skip_of(session, float(i - 60)) == Skip(SkipReason.ALREADY_IN_FLIGHT, i + 1 - 50)
        view = session.view()
        assert view.cursor == 0
        assert len(view.turns) == i + 1  # nothing is dropped before the summary lands
    landed = applied(session.compaction_succeeded(plan.plan_id, "Early chat.", 3.0))
    assert landed.latency == 3.0
    view = session.view()
    assert view.cursor == 10
    assert texts(session) == [f"turn {i}" for i in range(10, 64)]
    assert len(view.turns) == 54
    # the boundary snapped forward; the count is below the threshold again
    assert skip_of(session, 4.0) == Skip(SkipReason.BELOW_THRESHOLD, 14)


# -- skip reasons ---------------------------------------------------------------


def test_below_threshold() -> None:
    assert skip_of(Session("empty"), 0.0) == Skip(SkipReason.BELOW_THRESHOLD, 0)
    assert skip_of(session_with(60), 0.0).reason is SkipReason.BELOW_THRESHOLD


def test_already_in_flight() -> None:
    session = session_with(75)
    plan_of(session, 0.0)
    assert skip_of(session, 1.0) == Skip(SkipReason.ALREADY_IN_FLIGHT, 25)


def test_no_eligible_batch_when_the_batch_is_too_young() -> None:
    session = Session("aged", SessionConfig(min_age_seconds=30.0))
    for t in turns(61, t0=1000.0):  # turn i at 1000+i; batch 0..9 ends at 1009
        session.append_turn(t)
    assert skip_of(session, 1038.0) == Skip(SkipReason.NO_ELIGIBLE_BATCH, 11)
    assert session.in_flight is None
    assert plan_of(session, 1039.0).end == 10


def test_session_ending() -> None:
    session = session_with(61)
    session.begin_ending()
    assert session.ending
    assert skip_of(session, 0.0) == Skip(SkipReason.SESSION_ENDING, 11)


def test_backing_off_until_retry_at() -> None:
    session = session_with(61)
    plan = plan_of(session, 10.0)
    failed = session.compaction_failed(plan.plan_id, "timeout", True, 12.0)
    assert isinstance(failed, Failed)
    assert failed.retry_at == 14.0  # base 2 s after the first failure
    assert skip_of(session, 13.9) == Skip(SkipReason.BACKING_OFF, 11, retry_at=14.0)
    assert plan_of(session, 14.0).start == 0


# -- failures and backoff ------------------------------------------------------------


def test_failure_keeps_the_cursor_and_clears_in_flight() -> None:
    session = session_with(61)
    plan = plan_of(session, 0.0)
    failed = session.compaction_failed(plan.plan_id, "http", True, 0.25)
    assert isinstance(failed, Failed)
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
        plan = plan_of(session, now)
        failed = session.compaction_failed(plan.plan_id, "timeout", True, now)
        assert isinstance(failed, Failed)
        delays.append(failed.retry_at - now)
        assert session.retry_at == failed.retry_at
        assert skip_of(session, failed.retry_at - 0.001).reason is SkipReason.BACKING_OFF
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
        plan = plan_of(session, now)
        failed = session.compaction_failed(plan.plan_id, "rate_limited", retryable, now, retry_after)
        assert isinstance(failed, Failed)
        assert skip_of(session, failed.retry_at - 0.001).reason is SkipReason.BACKING_OFF
        waits.append(failed.retry_at - now)
        now = failed.retry_at
    assert waits == [30.0, 4.0, 3600.0, 60.0]


def test_non_retryable_failure_waits_the_maximum() -> None:
    session = session_with(61, SessionConfig(retry_base_seconds=2.0, retry_max_seconds=60.0))
    plan = plan_of(session, 5.0)
    failed = session.compaction_failed(plan.plan_id, "auth", False, 5.0)
    assert isinstance(failed, Failed)
    assert not failed.retryable
    assert failed.retry_at == 65.0
    assert skip_of(session, 64.0).reason is SkipReason.BACKING_OFF
    assert isinstance(session.plan_compaction(65.0), CompactionPlan)


def test_success_resets_failures_and_backoff() -> None:
    session = session_with(61)
    for now in (0.0, 2.0, 6.0):  # three failures: retry after 2 s, 4 s, 8 s
        plan = plan_of(session, now)
        session.compaction_failed(plan.plan_id, "timeout", True, now)
    assert session.stats().failures == 3
    plan = plan_of(session, 14.0)
    applied(session.compaction_succeeded(plan.plan_id, "Folded.", 15.0))
    assert session.stats().failures == 0
    assert session.retry_at is None
    assert session.stats().compactions == 1
    # the next failure starts the backoff over at the base delay
    for i in range(61, 71):
        session.append_turn(turn(i))
    plan = plan_of(session, 20.0)
    failed = session.compaction_failed(plan.plan_id, "timeout", True, 20.0)
    assert isinstance(failed, Failed)
    assert (failed.failures, failed.retry_at) == (1, 22.0)


@pytest.mark.parametrize("text", ["", "   ", "\n \t\n"])
def test_empty_result_is_a_failure(text: str) -> None:
    session = session_with(61)
    plan = plan_of(session, 0.0)
    assert session.check_result(plan.plan_id, text) == Rejected(plan, "empty")
    failed = session.compaction_succeeded(plan.plan_id, text, 1.0)
    assert isinstance(failed, Failed)
    assert (failed.kind, failed.retryable, failed.failures) == ("empty", True, 1)
    assert session.cursor == 0
    assert session.in_flight is None


# -- stale results -------------------------------------------------------------------


def test_old_plan_result_after_a_failure_and_a_new_plan_is_stale() -> None:
    session = session_with(61)
    old = plan_of(session, 0.0)
    session.compaction_failed(old.plan_id, "timeout", True, 1.0)
    new = plan_of(session, 3.0)
    assert new.plan_id != old.plan_id
    assert (new.start, new.end) == (old.start, old.end)

    before = session.stats()
    assert session.compaction_succeeded(old.plan_id, "A late answer.", 4.0) == Stale(old.plan_id, new.plan_id)
    assert session.compaction_failed(old.plan_id, "timeout", True, 4.0) == Stale(old.plan_id, new.plan_id)
    assert session.stats() == before
    assert session.in_flight is new
    assert session.summary == ""

    applied(session.compaction_succeeded(new.plan_id, "The real answer.", 5.0))
    assert session.summary == "The real answer."


def test_result_after_abandon_is_stale() -> None:
    session = session_with(61)
    plan = plan_of(session, 0.0)
    assert session.abandon() is plan
    assert session.abandon() is None
    assert session.compaction_succeeded(plan.plan_id, "Too late.", 1.0) == Stale(plan.plan_id, None)
    assert session.compaction_failed(plan.plan_id, "timeout", True, 1.0) == Stale(plan.plan_id, None)
    assert session.check_result(plan.plan_id, "Too late.") == Stale(plan.plan_id, None)
    assert (session.cursor, session.summary, session.stats().failures) == (0, "", 0)
    # abandoning is not a failure: no backoff
    assert plan_of(session, 1.0).plan_id == plan.plan_id + 1


def test_an_unknown_plan_id_is_stale() -> None:
    session = session_with(61)
    plan = plan_of(session, 0.0)
    assert session.compaction_succeeded(plan.plan_id + 7, "Nope.", 1.0) == Stale(
        plan.plan_id + 7, plan.plan_id
    )
    assert session.in_flight is plan


# -- the summary budget --------------------------------------------------------------

SENTENCES = [f"Sentence number {i} says something." for i in range(6)]  # 34 chars each
OVERLONG = " ".join(SENTENCES)


def test_overlong_result_gets_one_recompaction_then_is_clamped() -> None:
    config = SessionConfig(max_summary_chars=80)
    session = session_with(61, config)
    session.append_note(Note("a whiteboard", 0.0))  # stays live: nothing pending
    plan = plan_of(session, 10.0)

    preview = session.check_result(plan.plan_id, OVERLONG)
    assert isinstance(preview, CompactionPlan)
    assert session.check_result(plan.plan_id, OVERLONG) == preview  # a preview takes no id
    assert session.in_flight is plan

    again = session.compaction_succeeded(plan.plan_id, OVERLONG, 11.0)
    assert isinstance(again, CompactionPlan)
    assert again == preview
    assert again.recompact
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
    assert isinstance(session.compaction_succeeded(plan.plan_id, "Short.", 11.5), Stale)

    landed = applied(session.compaction_succeeded(again.plan_id, OVERLONG + " More.", 12.0))
    assert landed.clamped
    assert landed.summary == " ".join(SENTENCES[:2])  # 69 chars: the longest whole-sentence prefix
    assert landed.summary == clamp_sentences(OVERLONG, 80)
    assert landed.summary.endswith(".")
    assert len(session.summary) <= 80
    assert landed.latency == 2.0  # measured from the first plan's start
    assert landed.plan is again
    assert session.cursor == 10


def test_recompaction_that_fits_is_not_clamped() -> None:
    session = session_with(61, SessionConfig(max_summary_chars=80))
    plan = plan_of(session, 0.0)
    again = session.compaction_succeeded(plan.plan_id, OVERLONG, 1.0)
    assert isinstance(again, CompactionPlan)
    landed = applied(session.compaction_succeeded(again.plan_id, "Condensed: six sentences.", 2.0))
    assert not landed.clamped
    assert session.summary == "Condensed: six sentences."


def test_recompaction_can_fail_too() -> None:
    session = session_with(61, SessionConfig(max_summary_chars=80))
    plan = plan_of(session, 0.0)
    again = session.compaction_succeeded(plan.plan_id, OVERLONG, 1.0)
    assert isinstance(again, CompactionPlan)
    failed = session.compaction_succeeded(again.plan_id, " ", 2.0)
    assert isinstance(failed, Failed)
    assert failed.plan is again
    assert (session.cursor, session.in_flight, session.stats().failures) == (0, None, 1)


def test_clamp_without_a_sentence_boundary_cuts_at_a_word() -> None:
    session = session_with(61, SessionConfig(max_summary_chars=40))
    plan = plan_of(session, 0.0)
    words = "word " * 30
    again = session.compaction_succeeded(plan.plan_id, words, 1.0)
    assert isinstance(again, CompactionPlan)
    landed = applied(session.compaction_succeeded(again.plan_id, words, 2.0))
    assert landed.clamped
    assert len(landed.summary) <= 40
    assert landed.summary.endswith("…")


def test_result_is_normalized() -> None:
    session = session_with(61)
    plan = plan_of(session, 0.0)
    assert session.check_result(plan.plan_id, "  Alice   spoke. \n\n Bob  too. ") == Accepted(
        plan, "Alice spoke.\nBob too.", False
    )
    applied(session.compaction_succeeded(plan.plan_id, "  Alice   spoke. \n\n Bob  too. ", 1.0))
    assert session.summary == "Alice spoke.\nBob too."


# -- screen notes ------------------------------------------------------------------


def test_notes_evict_into_pending() -> None:
    session = Session("notes")
    for i, note in enumerate(notes(8)):
        assert session.append_note(note) == NotesChanged(live=i + 1, pending=0, evicted=0, dropped=0)
    assert session.append_note(Note("ninth", 8.0)) == NotesChanged(live=8, pending=1, evicted=1, dropped=0)
    assert session.pending_notes == (Note("note 0", 0.0),)
    assert session.live_notes[-1] == Note("ninth", 8.0)
    assert session.view().live_notes == session.live_notes


def test_long_note_is_clipped_to_the_live_limit() -> None:
    session = Session("notes")
    session.append_note(Note("x " * 300, 0.0, speaker="Alice", source="game"))
    [note] = session.live_notes
    assert len(note.text) <= 220
    assert note.text.endswith("…")
    assert (note.speaker, note.source) == ("Alice", "game")


def test_pending_notes_fold_into_the_next_plan_within_budget() -> None:
    session = session_with(61)
    batch = notes(18, width=100)  # each renders as "Screen: " + 100 chars
    for note in batch:
        session.append_note(note)
    assert len(session.pending_notes) == 10
    plan = plan_of(session, 0.0)
    # 3 notes take 3 * 109 = 327 chars; a 4th would take 436 > 400
    assert plan.notes == tuple(batch[:3])
    assert sum(len(n.render()) + 1 for n in plan.notes) <= 400
    assert "notes=3" in repr(plan)


def test_oversized_single_note_still_folds() -> None:
    session = session_with(61, SessionConfig(max_note_chars=10, live_note_entries=1))
    session.append_note(Note("a note longer than ten chars", 0.0))
    session.append_note(Note("live", 1.0))
    plan = plan_of(session, 2.0)
    assert plan.notes == (Note("a note longer than ten chars", 0.0),)


def test_pending_notes_clear_only_on_success() -> None:
    session = session_with(61, SessionConfig(live_note_entries=2))
    for note in notes(5):
        session.append_note(note)
    assert session.pending_notes == tuple(notes(3))
    plan = plan_of(session, 0.0)
    assert plan.notes == tuple(notes(3))

    session.compaction_failed(plan.plan_id, "timeout", True, 1.0)
    assert session.pending_notes == tuple(notes(3))  # kept on failure
    retry = plan_of(session, 3.0)
    assert retry.notes == tuple(notes(3))
    assert session.abandon() is retry
    assert session.pending_notes == tuple(notes(3))  # kept when abandoned

    plan = plan_of(session, 3.0)
    assert plan.notes == tuple(notes(3))
    applied(session.compaction_succeeded(plan.plan_id, "Folded, with notes.", 4.0))
    assert session.pending_notes == ()
    assert session.live_notes == tuple(notes(2, start_at=3))


def test_notes_evicted_during_flight_stay_pending_after_success() -> None:
    session = session_with(61, SessionConfig(live_note_entries=1))
    session.append_note(Note("before", 0.0))
    session.append_note(Note("live", 1.0))
    plan = plan_of(session, 2.0)
    assert plan.notes == (Note("before", 0.0),)
    session.append_note(Note("during", 3.0))  # evicts "live" while the plan is in flight
    assert session.pending_notes == (Note("before", 0.0), Note("live", 1.0))
    applied(session.compaction_succeeded(plan.plan_id, "Folded.", 4.0))
    assert list(session.pending_notes) == [Note("live", 1.0)]
    assert session.pending_after(plan) == (Note("live", 1.0),)


def test_max_pending_notes_drops_the_oldest_and_counts() -> None:
    session = Session("notes", SessionConfig(live_note_entries=1, max_pending_notes=3))
    changes = [session.append_note(note) for note in notes(7)]
    assert session.pending_notes == tuple(notes(3, start_at=3))
    assert session.live_notes == (notes(7)[-1],)
    assert [c.dropped for c in changes] == [0, 0, 0, 0, 1, 1, 1]
    assert changes[-1] == NotesChanged(live=1, pending=3, evicted=1, dropped=1)
    assert session.stats().notes_dropped == 3


def test_a_note_dropped_from_pending_while_in_flight_is_not_resurrected() -> None:
    session = session_with(61, SessionConfig(live_note_entries=1, max_pending_notes=2))
    for note in notes(3):
        session.append_note(note)
    plan = plan_of(session, 0.0)
    assert plan.notes == tuple(notes(2))
    for note in notes(2, start_at=3):  # pushes note 0 and note 1 out of the pending queue
        session.append_note(note)
    assert session.pending_notes == tuple(notes(2, start_at=2))
    applied(session.compaction_succeeded(plan.plan_id, "Folded.", 1.0))
    assert session.pending_notes == tuple(notes(2, start_at=2))


def test_a_note_changes_nothing_until_the_store_holds_it() -> None:
    session = Session("notes", SessionConfig(live_note_entries=2))
    for note in notes(3):
        session.append_note(note)
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
    session.append_note(Note("folded", 0.0))
    session.append_note(Note("live", 1.0))
    plan = plan_of(session, 2.0)
    assert plan.notes == (Note("folded", 0.0),)

    session.receive(NoteReceived(Note("never stored", 3.0)))  # the write failed: never confirmed

    applied(session.compaction_succeeded(plan.plan_id, "Folded.", 4.0))
    assert session.pending_notes == ()  # not folded a second time by the next compaction
    session.append_note(Note("after", 5.0))
    assert list(session.pending_notes) == [Note("live", 1.0)]


def test_notes_staged_before_another_change_cannot_be_taken() -> None:
    session = Session("notes", SessionConfig(live_note_entries=1, max_pending_notes=2))
    [early] = session.receive(NoteReceived(Note("early", 1.0)))
    session.append_note(Note("meanwhile", 2.0))
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

    [landed] = session.receive(CompactionStored(start.plan.plan_id, 2.0))
    assert isinstance(landed, Applied)
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


# -- reconfigure, restore, repr, stats ---------------------------------------------


def test_reconfigure_applies_from_the_next_request() -> None:
    session = session_with(8, SessionConfig(recent_window=4, batch_size=4))
    for note in notes(5):
        session.append_note(note)
    assert skip_of(session, 0.0) == Skip(SkipReason.BELOW_THRESHOLD, 4)
    session.reconfigure(SessionConfig(recent_window=2, batch_size=2, live_note_entries=2))
    assert session.config.batch_size == 2
    assert session.live_notes == tuple(notes(2, start_at=3))  # shrinking the buffer evicts the oldest
    assert session.pending_notes == tuple(notes(3))
    plan = plan_of(session, 1.0)
    assert (plan.start, plan.end, plan.recent_start) == (0, 2, 6)
    assert plan.notes == tuple(notes(3))


def test_reconfigure_leaves_the_plan_in_flight_alone() -> None:
    session = session_with(61)
    plan = plan_of(session, 0.0)
    session.reconfigure(SessionConfig(batch_size=5))
    assert session.in_flight is plan
    applied(session.compaction_succeeded(plan.plan_id, "Folded.", 1.0))
    assert session.cursor == 10
    for i in range(61, 66):
        session.append_turn(turn(i))
    # 66 - 10 = 56 > 50 + 5
    nxt = plan_of(session, 2.0)
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
        session.append_note(note)
    assert repr(session) == (
        "<Session 'room-1' turns=61 cursor=0 in_flight=none notes=8+1 summary_chars=0 failures=0>"
    )
    plan = plan_of(session, 0.0)
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
    applied(session.compaction_succeeded(plan.plan_id, "Twelve chars", 1.0))
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
