"""The fill trigger: a session of long turns compacts before its budget cuts turns nobody folded."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from helpers import summarized
from serving import T0, running, wire
from structlog.testing import capture_logs

from voice_context.core.budget import Context, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.session import (
    Applied,
    CompactionFailed,
    CompactionPlan,
    ContextRequested,
    Session,
    StartCompaction,
    TurnAppended,
)
from voice_context.core.tokens import CharEstimate
from voice_context.core.turns import Turn, TurnRun
from voice_context.core.window import FillBudget, Skip, SkipReason, fill_end
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer

SUMMARIZER = DeterministicSummarizer()


def long_turn(i: int, size: int = 400) -> Turn:
    words = f"Item {i}: we compare the Lisbon and Porto options for day {i} in detail. "
    return Turn(("Alice", "Bob")[i % 2], "user", (words * (size // len(words) + 1))[:size], T0 + i)


def land(session: Session, plan: CompactionPlan, now: float) -> Applied:
    text = SUMMARIZER.summarize_now(SummaryRequest.for_plan(plan))
    outcome = summarized(session, plan.plan_id, text, now)
    while isinstance(outcome, StartCompaction):  # a re-compaction pass
        text = SUMMARIZER.summarize_now(SummaryRequest.for_plan(outcome.plan))
        outcome = summarized(session, outcome.plan.plan_id, text, now)
    assert isinstance(outcome, Applied)
    return outcome


# -- the rule ---------------------------------------------------------------------------------


ROOM = 100_000


def measured(window: int, unfolded: int, tokens: tuple[int, int] | None = None) -> FillBudget:
    """What a context laid out in a char budget (and a token one, given ``tokens``) measured,
    with room to spare."""
    if tokens is None:
        return FillBudget((window, 0), (unfolded, 0), (ROOM, 0))
    return FillBudget(
        (window, tokens[0]), (unfolded, tokens[1]), (ROOM, ROOM), tokens=True, counter=CharEstimate()
    )


def test_while_the_turns_from_the_cursor_fit_the_protected_window_nothing_is_due() -> None:
    sizes = [(100, 0)] * 36
    assert fill_end(0, sizes, 1.0, measured(3600, 3600)) is None


def test_once_they_outgrow_it_the_oldest_fold_until_half_of_it_is_left() -> None:
    sizes = [(100, 0)] * 37
    end = fill_end(20, sizes, 1.0, measured(3600, 3700))
    assert end == 20 + 37 - 18, "18 turns of 100 chars are 1,800, half the window"


def test_a_smaller_fill_trigger_folds_before_they_reach_the_window_edge() -> None:
    sizes = [(100, 0)] * 30
    assert fill_end(0, sizes, 0.7, measured(4000, 3000)) == 30 - 14, "14 turns: at most half of 2,800"
    assert fill_end(0, sizes, 0.0, measured(4000, 9000)) is None, "0 turns it off"


def test_the_newest_turn_always_stays_however_large() -> None:
    assert fill_end(5, [(100, 0), (9000, 0)], 1.0, measured(3000, 9100)) == 6
    alone = fill_end(5, [(9000, 0)], 1.0, measured(3000, 9000))
    assert alone is None, "one turn alone: nothing older to fold"


def test_a_token_budget_fires_on_tokens() -> None:
    sizes = [(40, 30)] * 10  # 400 chars, 300 tokens
    assert fill_end(0, sizes, 1.0, measured(5000, 400, tokens=(400, 300))) is None
    assert fill_end(0, sizes, 1.0, measured(5000, 400, tokens=(280, 300))) == 10 - 4
    only_tokens = FillBudget(
        (0, 280), (400, 300), (0, ROOM), chars=False, tokens=True, counter=CharEstimate()
    )
    assert fill_end(0, sizes, 1.0, only_tokens) == 10 - 4, "no char budget: chars do not count"
    assert fill_end(0, sizes, 1.0, FillBudget((0, 0), (400, 300), (0, 0), chars=False)) is None, "none kept"


def test_the_line_leaves_room_for_as_many_turns_as_came_while_the_last_fold_was_in_flight() -> None:
    sizes = [(100, 0)] * 30  # 3,000 chars, under 0.7 of a window of 4,500 (3,150)
    room = FillBudget((4500, 0), (3000, 0), (4000, 0))
    assert fill_end(0, sizes, 0.7, room) is None
    # ten turns came while the last fold was in flight: as many may come while the next one is,
    # and 3,000 + 1,000 would fill the room; the line moves to 3,000 - so 2,900 after a fold
    assert fill_end(0, sizes, 0.7, room, arriving=10) is None, "3,000 is the line itself"
    assert fill_end(0, sizes, 0.7, room, arriving=11) == 30 - 14, "the line is 2,900: at most 1,450 stay"


# -- a session of long turns ---------------------------------------------------------------


def ask(
    session: Session, now: float, said: Sequence[Turn] = (), budget: int = 5200
) -> tuple[Context, Skip | CompactionPlan]:
    """A bot asks for its context: built from the session as it is (and the turns ``said`` before
    its cursor, which the store keeps), then the trigger weighs what that context measured, as
    the server does."""
    older = TurnRun.of(0, said[: session.cursor])
    ctx = build_context(session.view(), "instructions", budget_chars=budget, older=older)
    [decision] = session.receive(ContextRequested(now, ctx.fill))
    if isinstance(decision, StartCompaction):
        return ctx, decision.plan
    assert isinstance(decision, Skip)
    return ctx, decision


def test_long_turns_fold_by_fill_long_before_the_count_rule_and_nothing_falls_into_a_gap() -> None:
    session = Session("long", SessionConfig())  # recent_window 50, batch 10: the count rule waits for 61
    folds, said = [], []
    for i in range(40):
        said.append(long_turn(i))
        session.receive(TurnAppended(said[-1]))
        ctx, decision = ask(session, T0 + i, said)
        gap = f"turns {session.cursor}..{ctx.first_turn - 1} in no one's hands"
        assert ctx.first_turn <= session.cursor, gap
        if isinstance(decision, CompactionPlan):
            assert decision.trigger == "fill"
            folds.append((decision.start, decision.end))
            land(session, decision, T0 + i)
    # a line is 408 chars. Until the transcript reaches past the protected window, the window
    # could take the whole room: the 9th turn passes 0.7 of 5,200 chars, and the newest 4 (1,632)
    # are at most half of that line. From then on the window holds 11 turns (4,476 chars): a fold
    # is due when 8 are unfolded (3,256, past 3,133), and the newest 3 stay
    assert folds[:3] == [(0, 5), (5, 10), (10, 15)], folds
    assert session.cursor >= 30


def test_without_the_fill_trigger_the_same_session_has_a_gap() -> None:
    session = Session("long", SessionConfig(fill_trigger=0.0))
    for i in range(40):
        session.receive(TurnAppended(long_turn(i)))
        _, decision = ask(session, T0 + i)
        assert isinstance(decision, Skip)  # the count rule waits, and nothing else fires
    ctx = build_context(session.view(), "instructions", budget_chars=5200)
    assert session.cursor == 0 and ctx.first_turn > 20, "turns 0..20 are neither summarized nor shown"


def test_the_fill_trigger_waits_for_a_fold_in_flight_and_for_a_backoff() -> None:
    session = Session("long")
    for i in range(12):
        session.receive(TurnAppended(long_turn(i)))
    _, plan = ask(session, T0)
    assert isinstance(plan, CompactionPlan)
    ctx, skip = ask(session, T0)
    assert isinstance(skip, Skip) and skip.reason is SkipReason.ALREADY_IN_FLIGHT
    assert ctx.first_turn == 0, "while the fold is in flight, the turns it folds are still shown"
    session.receive(CompactionFailed(plan.plan_id, "timeout", True, T0))
    _, skip = ask(session, T0 + 1)
    assert isinstance(skip, Skip) and skip.reason is SkipReason.BACKING_OFF
    _, again = ask(session, T0 + 3)
    assert isinstance(again, CompactionPlan) and again.trigger == "fill"


def test_a_context_asked_for_while_a_fold_runs_is_weighed_again_when_the_fold_lands() -> None:
    session, said = Session("long"), [long_turn(i) for i in range(12)]
    for turn in said:
        session.receive(TurnAppended(turn))
    _, plan = ask(session, T0, said)
    assert isinstance(plan, CompactionPlan)
    for i in range(12, 20):  # the call goes on while the fold runs
        said.append(long_turn(i))
        session.receive(TurnAppended(said[-1]))
    ctx, skip = ask(session, T0 + 1, said)
    assert isinstance(skip, Skip) and skip.reason is SkipReason.ALREADY_IN_FLIGHT
    assert session.waiting == ctx.fill, "what that context measured is kept for the fold's landing"
    land(session, plan, T0 + 2)
    # the fold that landed asks the fill trigger again with it: the next fold starts at once,
    # not at the next context, which would have been laid out with the turns past the line
    onward = session.in_flight
    assert onward is not None and (onward.start, onward.trigger) == (plan.end, "fill")
    assert session.waiting is None, "a fold started: the demand is met"


def test_when_the_count_rule_and_the_fill_line_both_fire_the_longer_fold_wins() -> None:
    session = Session("both", SessionConfig(recent_window=4, batch_size=2))
    for i in range(7):
        session.receive(TurnAppended(long_turn(i, 900)))
    _, plan = ask(session, T0)
    assert isinstance(plan, CompactionPlan)
    # 908-char lines: the window holds the newest 5 (the floor, 0.9 of 5 dated lines, and one
    # within the share), 0.7 of it is 3,178 chars, and only the newest turn is at most half that
    assert (plan.end, plan.trigger) == (6, "fill"), "the count rule alone would fold 0..1"


# -- over the wire --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_token_budgeted_context_over_a_real_server_starts_a_fill_fold() -> None:
    async with running(summarizer=DeterministicSummarizer()) as server, wire(server) as bot:
        await bot.open("room-1")
        for i in range(8):
            await bot.append("room-1", i, text=long_turn(i).text)
        with capture_logs() as logs:
            first = await bot.request("context.get", session="room-1", format="messages", budget_tokens=800)
            pushed = await bot.push()
        assert first["in_flight"] is True and first["cursor"] == 0
        assert pushed["type"] == "compaction.completed" and pushed["cursor"] > 0
        assert pushed["trigger"] == "fill"
        started = [e for e in logs if e["event"] == "voice_context_compaction_started"]
        assert [e["trigger"] for e in started] == ["fill"]
        later = await bot.request("context.get", session="room-1", format="messages", budget_tokens=800)
        assert later["cursor"] == pushed["cursor"] and later["summary"]
        assert later["tokens"] <= 800


def unfolded_when_a_fold_is_due_after(burst: int) -> int:
    """A session of 408-char lines whose first fold is in flight while ``burst`` more turns
    arrive, and whose folds land at once from then on: how many turns are unfolded when the
    third fold is due."""
    session, said = Session("burst"), []
    folds = 0
    while True:
        said.append(long_turn(len(said)))
        session.receive(TurnAppended(said[-1]))
        _, decision = ask(session, T0, said)
        if not isinstance(decision, CompactionPlan):
            continue
        folds += 1
        if folds == 3:
            return session.total_turns - session.cursor
        for _ in range(burst if folds == 1 else 0):
            said.append(long_turn(len(said)))
            session.receive(TurnAppended(said[-1]))
        land(session, decision, T0)


def test_turns_that_piled_up_during_a_fold_make_the_next_ones_start_sooner() -> None:
    calm, after_a_burst = unfolded_when_a_fold_is_due_after(0), unfolded_when_a_fold_is_due_after(6)
    # as many turns may come while the next fold is in flight: the line moves from 0.7 of the
    # window (3,133 chars) to the room less six lines (5,200 - 2,448 = 2,752)
    assert (calm, after_a_burst) == (8, 7)
