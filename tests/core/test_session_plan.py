"""The whole plan: what follows an appended turn and a landed fold is the session's to say, and
the shell only performs it. Stories told to the pure session, with literal times."""

from __future__ import annotations

from helpers import given, started, turn, turns

from voice_context.core.config import SessionConfig
from voice_context.core.session import (
    Applied,
    CommitCompaction,
    CompactionFailed,
    CompactionStored,
    Failed,
    OverflowReported,
    RecallAhead,
    RollTiers,
    Session,
    StartCompaction,
    StoreLandmark,
    SummaryReturned,
    TurnAppended,
    TurnHeld,
    TurnsAdopted,
)
from voice_context.core.turns import Turn
from voice_context.core.window import Skip, SkipReason

# the defaults: 50 turns kept verbatim, folds of 10; a backlog is four batches past the window
BACKLOG = 50 + 4 * 10


def test_a_user_turn_is_held_and_searched_for_ahead_of_the_reply_a_bots_turn_is_only_held() -> None:
    session = Session("room")
    asked = turn(0)
    assert session.receive(TurnAppended(asked)) == [TurnHeld(0, None), RecallAhead(0, asked)]
    answered = turn(1, role="assistant")
    assert session.receive(TurnAppended(answered)) == [TurnHeld(1, None)]
    blank = Turn("Alice", "user", "  ", 2.0)
    assert session.receive(TurnAppended(blank)) == [TurnHeld(2, None)], "nothing to search for"


def test_without_recall_no_turn_is_searched_for_ahead() -> None:
    session = Session("room", SessionConfig(recall=False))
    assert session.receive(TurnAppended(turn(0))) == [TurnHeld(0, None)]


def test_a_backlog_folds_from_the_append_that_makes_it_at_the_shells_time() -> None:
    session = Session("burst")
    given(session, *[TurnAppended(t, now=500.0) for t in turns(BACKLOG - 1)])
    assert session.in_flight is None, "no context asked, and no backlog yet"
    held, ahead, start = session.receive(TurnAppended(turn(BACKLOG - 1), now=500.0))
    assert (held, ahead) == (TurnHeld(BACKLOG - 1, None), RecallAhead(BACKLOG - 1, turn(BACKLOG - 1)))
    assert isinstance(start, StartCompaction) and session.in_flight is start.plan
    # a backlog folds several batches at once, from the cursor, started when the shell stored the turn
    assert (start.plan.start, start.plan.end, start.plan.started_at) == (0, 40, 500.0)
    # while it runs, the next append starts nothing more
    assert session.receive(TurnAppended(turn(BACKLOG), now=501.0)) == [
        TurnHeld(BACKLOG, None),
        RecallAhead(BACKLOG, turn(BACKLOG)),
    ]


def test_a_backlog_while_backing_off_says_why_no_fold_starts() -> None:
    session = Session("burst")
    given(session, *[TurnAppended(t) for t in turns(61)])
    plan = started(session, 61.0)
    timeout = CompactionFailed(plan.plan_id, "timeout", True, 62.0, message="no answer in 30s")
    [failed] = session.receive(timeout)
    assert isinstance(failed, Failed) and failed.message == "no answer in 30s"
    given(session, *[TurnAppended(t, now=62.5) for t in turns(BACKLOG - 62, start_at=61)])
    *_, skip = session.receive(TurnAppended(turn(BACKLOG - 1), now=63.0))
    assert skip == Skip(SkipReason.BACKING_OFF, BACKLOG - 50, retry_at=failed.retry_at)


def test_a_turn_after_a_long_silence_ends_the_conversation_and_the_tiers_roll() -> None:
    session = Session("days", SessionConfig(tiers=True, conversation_gap_seconds=1800))
    given(session, TurnAppended(turn(0, at=0.0)), TurnAppended(turn(1, at=600.0)))
    assert RollTiers(2) not in session.receive(TurnAppended(turn(2, at=1200.0)))
    *_, roll = session.receive(TurnAppended(turn(3, at=1200.0 + 3601)))
    assert roll == RollTiers(3)


def test_the_first_turn_after_a_restart_is_weighed_against_the_last_folded_one() -> None:
    config = SessionConfig(tiers=True, conversation_gap_seconds=1800)
    session = Session("days", config, cursor=10, folded_at=1000.0)
    *_, roll = session.receive(TurnAppended(turn(10, at=1000.0 + 1801)))
    assert roll == RollTiers(10)
    without = Session("days", SessionConfig(conversation_gap_seconds=1800), cursor=10, folded_at=1000.0)
    assert not any(isinstance(e, RollTiers) for e in without.receive(TurnAppended(turn(10, at=9000.0))))


def test_a_landmark_found_in_a_turn_is_to_be_stored_last() -> None:
    session = Session("trip")
    decision = Turn("Bob", "user", "Decision: we fly on Friday at 9:40.", 0.0)
    effects = session.receive(TurnAppended(decision))
    held, store = effects[0], effects[-1]
    assert isinstance(held, TurnHeld) and held.landmark is not None
    assert store == StoreLandmark(held.landmark)


def test_a_landed_fold_starts_the_next_one_while_a_backlog_is_left() -> None:
    session = Session("burst")
    given(session, *[TurnAppended(t) for t in turns(150)])  # the 90th started a fold of 0..39
    first = session.in_flight
    assert first is not None and (first.start, first.end) == (0, 40)
    [commit] = session.receive(SummaryReturned(first.plan_id, "Early turns.", 200.0))
    assert isinstance(commit, CommitCompaction)
    applied, onward = session.receive(CompactionStored(first.plan_id, 200.0))
    assert isinstance(applied, Applied) and applied.new_cursor == 40
    # 110 turns left from the cursor: still a backlog, so the next fold starts as this one lands
    assert isinstance(onward, StartCompaction) and session.in_flight is onward.plan
    assert (onward.plan.start, onward.plan.started_at) == (40, 200.0)


def test_a_landed_fold_starts_nothing_once_the_backlog_is_gone() -> None:
    session = Session("calm")
    given(session, *[TurnAppended(t) for t in turns(61)])
    plan = started(session, 61.0)
    [commit] = session.receive(SummaryReturned(plan.plan_id, "The start.", 62.0))
    assert isinstance(commit, CommitCompaction)
    [applied] = session.receive(CompactionStored(plan.plan_id, 62.0))
    assert isinstance(applied, Applied) and session.in_flight is None


def test_an_emergency_fold_starts_none_after_it_the_context_rebuilt_after_it_asks() -> None:
    session = Session("overflow", SessionConfig(recent_window=2, batch_size=1))
    given(session, *[TurnAppended(t) for t in turns(BACKLOG)])
    backlog = session.in_flight
    assert backlog is not None, "six turns are a backlog here: a fold started from an append"
    [failed] = session.receive(SummaryReturned(backlog.plan_id, "", 90.0))
    assert isinstance(failed, Failed)  # backing off now; an overflow folds at once all the same
    [start] = session.receive(OverflowReported(10, 200.0))
    assert isinstance(start, StartCompaction) and start.plan.trigger == "emergency"
    [commit] = session.receive(SummaryReturned(start.plan.plan_id, "Everything before turn 10.", 200.0))
    assert isinstance(commit, CommitCompaction)
    [applied] = session.receive(CompactionStored(start.plan.plan_id, 200.0))
    assert isinstance(applied, Applied) and session.backlog and session.in_flight is None


def test_an_empty_answer_fails_with_words_that_say_so() -> None:
    session = Session("quiet")
    given(session, *[TurnAppended(t) for t in turns(61)])
    plan = started(session, 61.0)
    [failed] = session.receive(SummaryReturned(plan.plan_id, "  ", 62.0))
    assert isinstance(failed, Failed) and (failed.kind, failed.message) == ("empty", "empty summary")


def test_turns_another_replica_appended_are_held_and_nothing_follows_here() -> None:
    session = Session("shared")
    given(session, *[TurnAppended(t) for t in turns(3)])
    adopted = (*turns(BACKLOG, start_at=3)[:-1], Turn("Bob", "user", "Decision: we fly on Friday.", 99.0))
    assert session.receive(TurnsAdopted(adopted, 100.0)) == []
    assert session.total_turns == 3 + len(adopted) and session.in_flight is None
    assert session.landmark(session.total_turns - 1) is not None, "pinned as the other replica pinned it"
