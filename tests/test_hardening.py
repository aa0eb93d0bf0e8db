"""Regressions from the hardening pass: each one over a real connection to a real server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serving import T0, running, wire

from voice_context.core.turns import Turn
from voice_context.store.base import SessionRecord
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer, resolve_dates
from voice_context.summarizers.prompt import build_messages

SMALL = {"recent_window": 2, "batch_size": 1}


# -- defect 1: one implausible time must not stop a session's compaction -----------------------


@pytest.mark.asyncio
async def test_a_time_in_milliseconds_or_out_of_range_is_refused_and_the_session_goes_on() -> None:
    async with running(summarizer=DeterministicSummarizer()) as server, wire(server) as bot:
        await bot.open("room-1", config=SMALL)
        for at, words in (
            (1714572187000, "looks like milliseconds"),  # JavaScript's Date.now()
            (1e20, "between 0 and"),
            (-1e18, "between 0 and"),
        ):
            refused = await bot.append("room-1", 0, at=at)
            assert (refused["type"], refused["code"]) == ("error", "bad_request"), refused
            assert words in refused["message"]
        for i in range(4):
            assert (await bot.append("room-1", i))["index"] == i
        await bot.request("context.get", session="room-1")
        landed = await bot.push()
        assert (landed["type"], landed["cursor"]) == ("compaction.completed", 1)


@pytest.mark.asyncio
async def test_a_stored_turn_with_an_absurd_time_is_folded_like_any_other() -> None:
    store = MemoryStore()
    await store.create(SessionRecord("room-1", config=SMALL))
    for index, at in enumerate((1e20, -1e18, T0 * 1000)):  # written before the codec refused them
        await store.append_turn("room-1", index, Turn("Alice", "user", f"odd time {index}", at))
    async with running(summarizer=DeterministicSummarizer(), store=store) as server, wire(server) as bot:
        opened = await bot.open("room-1")
        assert (opened["resumed"], opened["turns"]) == (True, 3)
        for i in range(3, 8):
            await bot.append("room-1", i)
            await bot.request("context.get", session="room-1")
            landed = await bot.push()
            assert landed["type"] == "compaction.completed", landed
        state = await bot.request("session.state", session="room-1")
        assert (state["cursor"], state["failures"]) == (5, 0)
        ctx = await bot.request("context.get", session="room-1", format="instructions")
        assert "Odd time 1." in ctx["summary"]


@settings(max_examples=200, deadline=None)
@given(st.floats())
def test_both_summarizers_render_any_time_without_raising(at: float) -> None:
    turn = Turn("Alice", "user", "Let's fly tomorrow, not next month.", at)
    request = SummaryRequest(turns=(turn,), notes=(), previous_summary="", max_chars=400)
    assert DeterministicSummarizer().summarize_now(request)
    assert "Alice" in build_messages(request)[-1]["content"]
    assert resolve_dates("three years ago, yesterday, next Friday", at)
