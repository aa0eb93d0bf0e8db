"""The fill trigger: a session of long turns compacts before its budget cuts turns nobody folded."""

from __future__ import annotations

import pytest
from helpers import skipped, started, summarized
from hypothesis import given, settings
from hypothesis import strategies as st
from serving import T0, running, wire
from structlog.testing import capture_logs

from voice_context.core.budget import build_context
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
from voice_context.core.turns import Turn
from voice_context.core.window import FillBudget, SkipReason, fill_end
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.tokenizers import load_tokenizer

SUMMARIZER = DeterministicSummarizer()
BUDGET = FillBudget(chars=5200)


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


def test_below_the_fill_line_nothing_is_due() -> None:
    sizes = [(100, 0)] * 36  # 3,600 chars: under 0.7 of 5,200 (3,640)
    assert fill_end(0, sizes, 0.7, BUDGET) is None


def test_past_the_fill_line_the_oldest_turns_fold_until_half_of_it_is_left() -> None:
    sizes = [(100, 0)] * 37  # 3,700 chars: over 3,640
    end = fill_end(20, sizes, 0.7, BUDGET)
    assert end == 20 + 37 - 18, "18 turns of 100 chars are at most 1,820, half the line"


def test_the_newest_turn_always_stays_however_large() -> None:
    assert fill_end(5, [(100, 0), (9000, 0)], 0.7, BUDGET) == 6
    assert fill_end(5, [(9000, 0)], 0.7, BUDGET) is None, "one turn alone: nothing older to fold"


def test_a_token_budget_fires_on_tokens_and_off_turns_it_off() -> None:
    sizes = [(40, 30)] * 10  # 400 chars, 300 tokens
    assert fill_end(0, sizes, 0.7, FillBudget(chars=5200)) is None
    assert fill_end(0, sizes, 0.7, FillBudget(tokens=400, counter=CharEstimate())) == 10 - 4
    assert fill_end(0, sizes, 0.0, FillBudget(tokens=400, counter=CharEstimate())) is None
    assert fill_end(0, sizes, 0.7, FillBudget()) is None, "no budget, no fill line"


# -- a session of long turns ---------------------------------------------------------------


def test_long_turns_fold_by_fill_long_before_the_count_rule_and_nothing_falls_into_a_gap() -> None:
    session = Session("long", SessionConfig())  # recent_window 50, batch 10: the count rule waits for 61
    folds = []
    for i in range(40):
        session.receive(TurnAppended(long_turn(i)))
        now = T0 + i
        ctx = build_context(session.view(), "instructions", budget_chars=5200)
        assert ctx.first_turn <= session.cursor, (
            f"turns {session.cursor}..{ctx.first_turn - 1} in no one's hands"
        )
        [decision] = session.receive(ContextRequested(now, BUDGET))
        if isinstance(decision, StartCompaction):
            assert decision.plan.trigger == "fill"
            folds.append((decision.plan.start, decision.plan.end))
            land(session, decision.plan, now)
    # a line is 408 chars: the 9th turn passes 3,640 (0.7 of 5,200), and 4 turns (1,632) stay
    assert folds[:2] == [(0, 5), (5, 10)], folds
    assert session.cursor >= 30


def test_without_the_fill_trigger_the_same_session_has_a_gap() -> None:
    session = Session("long", SessionConfig(fill_trigger=0.0))
    for i in range(40):
        session.receive(TurnAppended(long_turn(i)))
        skipped(session, T0 + i, BUDGET)  # the count rule waits, and nothing else fires
    ctx = build_context(session.view(), "instructions", budget_chars=5200)
    assert session.cursor == 0 and ctx.first_turn > 20, "turns 0..20 are neither summarized nor shown"


def test_the_fill_trigger_waits_for_a_fold_in_flight_and_for_a_backoff() -> None:
    session = Session("long")
    for i in range(12):
        session.receive(TurnAppended(long_turn(i)))
    plan = started(session, T0, BUDGET)
    assert skipped(session, T0, BUDGET).reason is SkipReason.ALREADY_IN_FLIGHT
    session.receive(CompactionFailed(plan.plan_id, "timeout", True, T0))
    assert skipped(session, T0 + 1, BUDGET).reason is SkipReason.BACKING_OFF
    assert started(session, T0 + 3, BUDGET).trigger == "fill"


def test_when_the_count_rule_and_the_fill_line_both_fire_the_longer_fold_wins() -> None:
    session = Session("both", SessionConfig(recent_window=4, batch_size=2))
    for i in range(7):
        session.receive(TurnAppended(long_turn(i, 900)))
    plan = started(session, T0, BUDGET)
    # 908-char lines: two of them (1,816) fit under 1,820, half the fill line
    assert (plan.end, plan.trigger) == (5, "fill"), "the count rule alone would fold 0..1"


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(10, 500), min_size=1, max_size=60),
    budget=st.integers(5000, 12_000),
    tokens=st.booleans(),
)
def test_with_a_context_per_turn_no_turn_ever_falls_into_a_gap(
    sizes: list[int], budget: int, tokens: bool
) -> None:
    """Turns of up to a tenth of the budget, a context after each, folds landing at once."""
    counter = load_tokenizer("o200k_base")
    fill = FillBudget(tokens=budget // 4, counter=counter) if tokens else FillBudget(chars=budget)
    session = Session("prop", SessionConfig(max_summary_chars=400))
    for i, size in enumerate(sizes):
        session.receive(TurnAppended(long_turn(i, size)))
        ctx = build_context(
            session.view(),
            "instructions",
            budget_chars=fill.chars or 100_000,
            budget_tokens=fill.tokens,
            tokens=counter if tokens else None,
        )
        assert ctx.first_turn <= session.cursor
        [decision] = session.receive(ContextRequested(T0 + i, fill))
        if isinstance(decision, StartCompaction):
            land(session, decision.plan, T0 + i)


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
