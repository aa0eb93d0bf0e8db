"""The tier cascade: conversations, days and weeks, the older the coarser.

The rules are told first on the pure core (a clock and a list of turn times are all
it needs); then a month of a garden diary is lived through on a real SQLite file with
the deterministic summarizer, a clock the test moves, two replicas racing for the same
rolls, a summarizer that fails, a restart, and the ``compact`` command.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zoneinfo
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import hypothesis
import pytest
from helpers import ManualClock, given, landed, started
from hypothesis import strategies as st

from voice_context.core.config import SessionConfig
from voice_context.core.session import (
    Abandoned,
    CompactionAbandoned,
    Restored,
    Session,
    TiersRolled,
    TurnAppended,
)
from voice_context.core.tiers import (
    Schedule,
    TierSummary,
    compose,
    conversations,
    due_rolls,
    parse_zone,
    rolled_through,
    tiered_summary,
)
from voice_context.core.turns import Turn
from voice_context.errors import ConfigError, SummarizerError, UnknownSession
from voice_context.manager import SessionManager
from voice_context.store.base import SessionRecord
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.summarizers.openai_compat import OpenAISummarizer
from voice_context.testing.openai_server import OpenAIServer, ReplyWith
from voice_context.tiering import roll_tiers

HOUR, DAY = 3600.0, 86400.0
MONDAY = datetime(2024, 3, 4, tzinfo=UTC).timestamp()  # Monday 4 March 2024, 00:00 UTC
SUNDAY = MONDAY - DAY


def at(day: int, hour: float = 10.0) -> float:
    """A time ``day`` days after Monday 4 March 2024, at ``hour`` UTC."""
    return MONDAY + day * DAY + hour * HOUR


def summary(tier: str, start: float, first: int, end: int, period_end: float | None = None) -> TierSummary:
    return TierSummary(tier, start, period_end or start + HOUR, first, end, f"{tier} {first}..{end}", 0.0)  # type: ignore[arg-type]


# -- the pure core -----------------------------------------------------------------------


def test_a_silence_longer_than_the_gap_ends_a_conversation() -> None:
    times = [at(0), at(0) + 60, at(0) + 29 * 60 + 60, at(0, 14), at(0, 14) + 5, at(1)]

    spans = conversations(times, 1800.0)

    assert [(c.first, c.end) for c in spans] == [(0, 3), (3, 5), (5, 6)]
    assert spans[0].start_at == at(0) and spans[0].last_at == at(0) + 30 * 60


def test_a_conversation_is_rolled_once_its_silence_passes_the_gap_or_the_session_closes() -> None:
    schedule = Schedule()
    spans = conversations([at(0), at(0) + 60], schedule.gap)

    assert due_rolls(spans, [], at(0) + 20 * 60, schedule) == []
    assert [r.tier for r in due_rolls(spans, [], at(0) + 20 * 60, schedule, closed=True)] == ["session"]
    [roll] = due_rolls(spans, [], at(0) + 60 + 1800, schedule)
    assert (roll.tier, roll.first_turn, roll.end_turn) == ("session", 0, 2)
    assert (roll.start, roll.end) == (at(0), at(0) + 60)


def test_a_day_is_rolled_at_three_the_next_morning_and_a_week_on_sunday_at_four() -> None:
    schedule = Schedule()
    # a conversation on Saturday 9 March (the last day of the week that began on Sunday 3 March)
    spans = conversations([at(5), at(5) + 60], schedule.gap)
    session = summary("session", at(5), 0, 2)

    day_start, day_end = schedule.day_of(at(5))
    assert (day_start, day_end) == (MONDAY + 5 * DAY, MONDAY + 6 * DAY)
    assert [r.tier for r in due_rolls(spans, [session], MONDAY + 6 * DAY + 2.9 * HOUR, schedule)] == []
    [day] = due_rolls(spans, [session], MONDAY + 6 * DAY + 3 * HOUR, schedule)
    assert (day.tier, day.start, day.end, day.inputs) == ("day", day_start, day_end, (session,))

    rolled_day = day.made("the day", 0.0)
    assert schedule.week_of(at(5)) == (SUNDAY, SUNDAY + 7 * DAY)
    assert due_rolls(spans, [session, rolled_day], MONDAY + 6 * DAY + 3.9 * HOUR, schedule) == []
    [week] = due_rolls(spans, [session, rolled_day], MONDAY + 6 * DAY + 4 * HOUR, schedule)
    assert (week.tier, week.start, week.end, week.first_turn, week.end_turn) == (
        "week",
        SUNDAY,
        SUNDAY + 7 * DAY,
        0,
        2,
    )


def test_a_day_waits_for_every_conversation_begun_in_it_and_a_week_for_every_day() -> None:
    schedule = Schedule()
    # Tuesday: two conversations, the second still going at 23:50 and past midnight
    times = [at(1, 9), at(1, 23.8), at(1, 23.8) + 15 * 60]
    spans = conversations(times, schedule.gap)
    first = summary("session", at(1, 9), 0, 1)
    next_morning = MONDAY + 2 * DAY + 3 * HOUR

    assert due_rolls(spans, [first], at(1, 23.8) + 20 * 60, schedule) == []
    due = due_rolls(spans, [first], next_morning, schedule)
    assert [r.tier for r in due] == ["session"], "the second conversation first; the day in the next pass"
    second = due[0].made("late", next_morning)
    [day] = due_rolls(spans, [first, second], next_morning, schedule)
    assert day.inputs == (first, second) and (day.first_turn, day.end_turn) == (0, 3)

    # the week waits for Tuesday's day summary even when every conversation has its own
    sunday_morning = SUNDAY + 7 * DAY + 5 * HOUR
    assert [r.tier for r in due_rolls(spans, [first, second], sunday_morning, schedule)] == ["day"]


def test_on_demand_a_period_is_rolled_as_soon_as_it_has_ended() -> None:
    schedule = Schedule()
    spans = conversations([at(0)], schedule.gap)
    session = summary("session", at(0), 0, 1)

    assert due_rolls(spans, [session], MONDAY + DAY + 60, schedule) == []
    [day] = due_rolls(spans, [session], MONDAY + DAY + 60, schedule, on_demand=True)
    assert day.tier == "day"
    assert due_rolls(spans, [session], MONDAY + DAY - 60, schedule, on_demand=True) == []


def test_days_and_weeks_are_counted_in_the_sessions_time_zone() -> None:
    schedule = Schedule(zone=parse_zone("America/Los_Angeles"))
    # 07:00 UTC on Tuesday is 23:00 on Monday in Los Angeles
    start, end = schedule.day_of(at(1, 7))
    assert datetime.fromtimestamp(start, schedule.zone).strftime("%a %d %H:%M") == "Mon 04 00:00"
    assert end - start == DAY
    # the week of 10 March 2024 has 167 hours there: clocks went forward
    week_start, week_end = schedule.week_of(datetime(2024, 3, 12, tzinfo=UTC).timestamp())
    assert week_end - week_start == 7 * DAY - HOUR


def test_a_settings_typo_is_refused_with_the_field_named() -> None:
    for bad in ({"time_zone": "Mars/Olympus"}, {"day_roll_at": "3am"}, {"week_roll_at": "Funday 04:00"}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            SessionConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="conversation_gap_seconds"):
        SessionConfig(conversation_gap_seconds=0)


@hypothesis.given(st.text(max_size=300) | st.sampled_from(sorted(zoneinfo.available_timezones())))
@hypothesis.example("x" * 300)  # too long for a file name
@hypothesis.example("💥" * 100)
@hypothesis.example("../../etc/passwd")
@hypothesis.example("/etc/localtime")
@hypothesis.example("Europe\x00Berlin")
@hypothesis.example("America/Argentina")  # a directory of zones
@hypothesis.example("Europe/")
def test_a_time_zone_is_a_zone_or_a_config_error_whatever_the_string(name: str) -> None:
    try:
        zone = parse_zone(name)
    except ConfigError as refused:
        assert "time_zone" in str(refused)
        assert len(str(refused)) < 200, "a long name is not echoed back whole"
    else:
        assert zone.key == name


def test_a_context_shows_the_coarsest_summary_of_each_part_never_two_and_none_past_the_cursor() -> None:
    rows = [
        summary("session", at(0), 0, 10),
        summary("session", at(1), 10, 20),
        summary("day", MONDAY, 0, 10),
        summary("day", MONDAY + DAY, 10, 20),
        summary("week", SUNDAY, 0, 20, SUNDAY + 7 * DAY),
        summary("session", at(7), 20, 30),
        summary("session", at(7, 15), 30, 40),
        summary("day", MONDAY + 7 * DAY, 20, 40),
    ]

    assert [(r.tier, r.first_turn) for r in compose(rows, cursor=45)] == [("week", 0), ("day", 20)]
    # the day of 11 March reaches past the cursor: its first conversation stands in for it
    assert [(r.tier, r.first_turn) for r in compose(rows, cursor=35)] == [("week", 0), ("session", 20)]
    assert rolled_through(rows) == 40

    text = tiered_summary(rows, 35, "the rolling summary of turns 30..34")
    assert text.index("3 March 2024 to 9 March 2024:") < text.index("11 March 2024, 10:00 to 11:00:")
    assert text.endswith("the rolling summary of turns 30..34")
    assert "day 0..10" not in text and "session 0..10" not in text
    # when the summaries cover the turn before the cursor, the rolling summary adds nothing
    assert "rolling" not in tiered_summary(rows, 40, "the rolling summary")


def turn(speaker: str, text: str, when: float) -> Turn:
    return Turn(speaker, "user" if speaker == "Ana" else "assistant", text, when)


def test_a_fold_that_begins_a_new_conversation_starts_the_rolling_summary_afresh() -> None:
    config = SessionConfig(tiers=True, recent_window=2, batch_size=2)
    session = Session("diary", config)
    times = [at(0), at(0) + 60, at(1), at(1) + 60, at(1) + 120, at(1) + 180]
    given(session, *[TurnAppended(turn("Ana", f"line {k}", when)) for k, when in enumerate(times)])

    first = started(session, at(1) + 200)
    assert first.start == 0 and first.end == 2
    landed(session, first.plan_id, "Ana wrote lines 0 and 1.", at(1) + 200)

    # turn 2 begins Tuesday's conversation, but Monday's has no summary yet: fold on
    given(session, TurnAppended(turn("Ana", "line 6", at(1) + 240)))
    onward = started(session, at(1) + 240)
    assert onward.previous_summary == "Ana wrote lines 0 and 1."
    assert given(session, CompactionAbandoned(onward.plan_id, at(1) + 240)) == [Abandoned(onward)]

    # Monday's conversation is in its summary now
    assert given(session, TiersRolled(2, at(1) + 240)) == []
    fresh = started(session, at(1) + 240)
    assert fresh.start == 2
    assert fresh.previous_summary == "" and [t.text for t in fresh.turns] == ["line 2", "line 3"]


def test_a_restored_session_told_what_its_record_leaves_out_starts_a_new_conversation_afresh() -> None:
    """A record holds the turns from the cursor on: the shell reads how far the tier summaries
    cover and the time of the turn before the cursor, and tells the session."""
    config = SessionConfig(tiers=True, recent_window=2, batch_size=2)
    tuesday = [turn("Ana", f"line {k}", at(1) + 60 * k) for k in range(2, 7)]
    session = Session("diary", config, cursor=2, turns=tuesday, summary="Ana wrote lines 0 and 1.")
    assert given(session, Restored(2, at(0) + 60, at(1) + 400)) == []
    assert session.folded_at == at(0) + 60
    fresh = started(session, at(1) + 400)
    assert (fresh.start, fresh.previous_summary) == (2, "")
    given(session, Restored(2, at(0), at(1) + 400))
    assert session.folded_at == at(0) + 60, "a time known already is kept"


# -- a month of a garden diary, on SQLite ------------------------------------------------

PLANTS = (
    "tulips roses basil mint thyme lavender daisies peonies irises lilies orchids ferns cacti sage "
    "dill chives parsley fennel garlic onions leeks carrots beets radishes kale spinach lettuce peas"
).split()
TIERED = {"tiers": True, "recent_window": 10, "batch_size": 5}


def diary(day: int) -> list[Turn]:
    """One morning's conversation: what Ana planted, and how many."""
    plant, start = PLANTS[day], at(day)
    lines = [
        ("Ana", f"This morning I planted {plant} along the fence."),
        ("Nova", f"How many {plant} went in?"),
        ("Ana", f"Exactly {day + 3} of them, all from the market."),
        ("Nova", "Noted in your garden log."),
    ]
    return [turn(speaker, text, start + k * 60) for k, (speaker, text) in enumerate(lines)]


class Gate:
    """A summarizer whose first calls wait until ``parties`` of them are waiting: replicas
    that race for the same roll all get to make it."""

    def __init__(self, inner: Summarizer, parties: int) -> None:
        self.inner, self.parties, self.waiting = inner, parties, 0
        self.open = anyio.Event()
        self.calls = 0

    @property
    def model(self) -> str:
        return "gate"

    async def summarize(self, request: SummaryRequest) -> str:
        self.calls += 1
        if not self.open.is_set():
            self.waiting += 1
            if self.waiting >= self.parties:
                self.open.set()
            with anyio.fail_after(10):
                await self.open.wait()
        return await self.inner.summarize(request)


class Broken:
    """A summarizer that is down."""

    model = "broken"

    async def summarize(self, request: SummaryRequest) -> str:
        raise SummarizerError("the model server is down", retryable=True)


@asynccontextmanager
async def replica(
    path: Path, clock: ManualClock, summarizer: Summarizer | None = None
) -> AsyncIterator[SessionManager]:
    store = SQLiteStore(path)
    try:
        config = SessionConfig(max_summary_chars=12000, **TIERED)  # type: ignore[arg-type]
        async with SessionManager(
            summarizer or DeterministicSummarizer(), config=config, store=store, clock=clock
        ) as manager:
            yield manager
    finally:
        await store.aclose()


async def live_days(manager: SessionManager, clock: ManualClock, days: range) -> None:
    """Ana and Nova talk every morning; the bot asks for its context after each turn."""
    for day in days:
        for spoken in diary(day):
            clock.now = spoken.at
            await manager.append_turn("garden", spoken)
            await manager.context("garden", budget_chars=4000)
        await manager.settled()


@pytest.mark.asyncio
async def test_a_month_of_mornings_rolls_into_conversations_days_and_weeks_and_old_dates_are_recalled(
    tmp_path: Path,
) -> None:
    clock = ManualClock(at(0))
    async with replica(tmp_path / "vc.db", clock) as manager:
        await manager.open("garden")
        await live_days(manager, clock, range(28))
        clock.now = at(28, 5)  # Monday 1 April, 05:00: Sunday's day roll time has passed
        await manager.tick()
        await manager.settled()

        rows = await manager.store.load_tiers("garden")
        counts = {tier: sum(1 for r in rows if r.tier == tier) for tier in ("session", "day", "week")}
        assert counts == {"session": 28, "day": 28, "week": 4}, "the week begun on 31 March has not ended"
        week_of_12_march = next(r for r in rows if r.tier == "week" and r.covers(8 * 4))
        assert week_of_12_march.heading() == "10 March 2024 to 16 March 2024"

        # three weeks later, a question about 12 March (Tuesday of the second week)
        clock.now = at(28, 9)
        question = "What did I plant on 12 March, and how many?"
        await manager.append_turn("garden", turn("Ana", question, clock.now))
        whole = await manager.context("garden", query=question)
        context = await manager.context("garden", budget_chars=6000, query=question)

    shown = whole.summary
    # the old weeks are shown as weeks, each once, oldest first, and never beside their days
    headings = [line for line in shown.splitlines() if line.endswith(":") and not line.startswith("[")]
    assert headings[:3] == [
        "3 March 2024 to 9 March 2024:",
        "10 March 2024 to 16 March 2024:",
        "17 March 2024 to 23 March 2024:",
    ]
    # the last week is not over: its days behind the cursor are shown as days
    assert headings[3:] == [f"{24 + k} March 2024:" for k in range(len(headings) - 3)] and len(headings) > 3
    assert shown.count("[12 March 2024, 10:00]") <= 1
    # the answer: from the finer summaries recall searches, dated by the day it was said
    answer = [r for r in context.recalled if "irises" in r.line]
    assert len(answer) == 1, "each line once, though its day and its conversation both hold it"
    assert answer[0].kind == "summary"
    assert answer[0].line.startswith("[12 March 2024, 10:00] Ana: This morning I planted irises")
    assert "Exactly 11 of them" in answer[0].line


async def stored_days(path: Path, days: range) -> None:
    """Mornings of the diary written straight to the store: nothing rolled yet."""
    store = SQLiteStore(path)
    await store.create(SessionRecord("garden", config=TIERED))
    for k, spoken in enumerate(t for day in days for t in diary(day)):
        await store.append_turn("garden", k, spoken)
    await store.aclose()


@pytest.mark.asyncio
async def test_two_replicas_racing_for_the_same_rolls_keep_one_summary_per_period(tmp_path: Path) -> None:
    await stored_days(tmp_path / "vc.db", range(3))
    clock = ManualClock(at(3, 5))  # Thursday morning: Monday's to Wednesday's rolls are due
    gate = Gate(DeterministicSummarizer(), parties=2)
    path = tmp_path / "vc.db"
    async with replica(path, clock, gate) as east, replica(path, clock, gate) as west:
        await east.open("garden")
        await west.open("garden")
        reports = []

        async def roll(manager: SessionManager) -> None:
            reports.append(await manager.roll_tiers("garden"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(roll, east)
            tg.start_soon(roll, west)
        rows = await east.store.load_tiers("garden")

    keys = [(r.tier, r.start) for r in rows]
    assert len(keys) == len(set(keys)) == 3 + 3, "three conversations, three days: each once"
    made = [m.key for report in reports for m in report.made]
    assert sorted(made) == sorted(keys), "every summary kept was made by one replica or the other"
    assert any(report.elsewhere for report in reports), "and they did race for the same rolls"
    assert reports[0].rows == reports[1].rows


@pytest.mark.asyncio
async def test_a_failing_summarizer_leaves_its_rolls_to_the_next_pass_and_contexts_keep_the_rolling_summary(
    tmp_path: Path,
) -> None:
    clock = ManualClock(at(0))
    async with replica(tmp_path / "vc.db", clock, Broken()) as broken:  # type: ignore[arg-type]
        await broken.open("garden")
        for day in range(2):
            for spoken in diary(day):
                clock.now = spoken.at
                await broken.append_turn("garden", spoken)
        clock.now = at(2, 5)
        report = await broken.roll_tiers("garden")
        assert report.failed is not None and "down" in report.failed
        assert report.made == [] and await broken.store.load_tiers("garden") == ()
        context = await broken.context("garden")
        assert "planted basil" not in context.summary
        said = [m["content"] for m in context.messages]
        assert len(said) == 8 and "This morning I planted tulips along the fence." in said[0], "nothing lost"

    async with replica(tmp_path / "vc.db", clock) as mended:  # a restart, with the summarizer back
        await mended.open("garden")
        report = await mended.roll_tiers("garden")
        assert [(m.tier, m.first_turn, m.end_turn) for m in report.made] == [
            ("session", 0, 4),
            ("session", 4, 8),
            ("day", 0, 4),
            ("day", 4, 8),
        ]


@pytest.mark.asyncio
async def test_a_session_without_tiers_refuses_a_roll(tmp_path: Path) -> None:
    async with SessionManager(DeterministicSummarizer()) as manager:
        await manager.open("plain")
        with pytest.raises(ConfigError, match="tiers"):
            await manager.roll_tiers("plain")


def test_the_compact_command_rolls_a_stored_session_on_demand(tmp_path: Path) -> None:
    anyio.run(stored_days, tmp_path / "data" / "voice-context.db", range(2))

    def compact(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "voice_context.cli", "compact", "--data-dir", str(tmp_path / "data")]
        return subprocess.run([*command, *args], capture_output=True, text=True, timeout=60, check=False)

    done = compact("--session", "garden", "--tier", "day", "--at", "2024-03-06T00:30:00+00:00")
    assert done.returncode == 0, done.stderr
    *made, totals = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(m["made"]["tier"], m["made"]["first_turn"]) for m in made] == [
        ("session", 0),
        ("session", 4),
        ("day", 0),
        ("day", 4),
    ]
    assert totals["summaries"] == {"session": 2, "day": 2, "week": 0}
    assert "[5 March 2024, 10:00] Ana: This morning I planted roses" in made[1]["made"]["text"]

    again = compact("--session", "garden", "--at", "2024-03-06T00:30:00+00:00")
    assert json.loads(again.stdout.splitlines()[-1])["made"] == 0, "nothing twice; the week has not ended"
    unknown = compact("--session", "nobody")
    assert unknown.returncode == 1 and "no session 'nobody'" in unknown.stderr


@pytest.mark.asyncio
async def test_closing_a_session_rolls_its_conversation_and_a_restart_picks_the_tiers_up(
    tmp_path: Path,
) -> None:
    clock = ManualClock(at(0))
    async with replica(tmp_path / "vc.db", clock) as first:
        await first.open("garden")
        await live_days(first, clock, range(5))
        clock.now = at(4, 1 / 6)  # ten minutes into Friday's conversation: it has not ended
        await first.close("garden")
        assert [(r.tier, r.first_turn) for r in await first.store.load_tiers("garden")][-1] == ("session", 16)
        with pytest.raises(UnknownSession):
            first.session("garden")

    async with replica(tmp_path / "vc.db", clock) as again:
        await again.open("garden")
        session = again.session("garden")
        said = [spoken for day in range(5) for spoken in diary(day)]
        assert session.cursor > 0 and session.folded_at == said[session.cursor - 1].at, "read back on restart"
        context = await again.context("garden")
    assert "3 March" not in context.summary
    assert "4 March 2024:" in context.summary, "Monday, rolled into its day on Tuesday at 03:00"
    assert "[4 March 2024, 10:00] Ana: This morning I planted tulips" in context.summary


@pytest.mark.asyncio
async def test_a_model_summarizes_each_conversation_and_condenses_a_day_over_its_ceiling(
    tmp_path: Path,
) -> None:
    """Over real HTTP, a model's words: a conversation's roll sends its turns alone; a day's
    sends the day's summaries to condense only when they do not fit its ceiling."""

    def words(body: dict[str, Any]) -> str:
        text = "\n".join(m["content"] for m in body["messages"] if m["role"] == "user")
        if "TRANSCRIPT" in text:
            plants = [p for p in PLANTS if f"planted {p}" in text]
            counts = [w for w in text.split() if w.isdigit() and int(w) < 40]
            return f"Ana planted {counts[0]} {plants[0]} from the market; Nova logged them."
        return "Ana planted tulips and roses, 3 and 4, from the market."

    afternoon = [replace(t, at=t.at - 2 * DAY + 5 * HOUR) for t in diary(2)]  # Monday at 15:00
    store = SQLiteStore(tmp_path / "vc.db")
    await store.create(SessionRecord("garden", config=TIERED))
    for k, spoken in enumerate(diary(0) + afternoon + diary(1)):
        await store.append_turn("garden", k, spoken)
    await store.aclose()
    async with OpenAIServer() as server:
        server.default = ReplyWith(words)
        model = OpenAISummarizer(base_url=server.base_url, model="tiny", max_retries=0, fold="paragraph")
        store = SQLiteStore(tmp_path / "vc.db")
        config = SessionConfig(tiers=True, day_summary_chars=60)
        async with model:
            report = await roll_tiers(
                store, model, "garden", config, at(2, 5), total_turns=12, tiers=("session", "day")
            )
        await store.aclose()
        sent = [request.json for request in server.requests]

    assert [(m.tier, m.first_turn, m.end_turn) for m in report.made] == [
        ("session", 0, 4),
        ("session", 4, 8),
        ("session", 8, 12),
        ("day", 0, 8),
        ("day", 8, 12),
    ]
    assert report.made[0].text == "Ana planted 3 tulips from the market; Nova logged them."
    first = "\n".join(m["content"] for m in sent[0]["messages"] if m["role"] == "user")
    assert "planted tulips" in first and "planted roses" not in first, "one conversation per roll"
    # Tuesday holds one summary (under the day's 60 chars): no call; Monday's two are condensed
    assert len(sent) == 4
    condense = "\n".join(m["content"] for m in sent[3]["messages"])
    assert "Condense it" in condense and "5 basil" in condense and "3 tulips" in condense
    assert report.made[3].text == "Ana planted tulips and roses, 3 and 4, from the market."
    assert report.made[4].text == report.made[2].text
