"""Regressions from the hardening pass: each one over a real connection to a real server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from serving import T0, running, wire
from structlog.testing import capture_logs

from voice_context.core.turns import Turn
from voice_context.store.base import SessionRecord
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer, resolve_dates
from voice_context.summarizers.fakes import FailingSummarizer
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


# -- defect 2: nothing in a background compaction escapes into the server's task group ---------


class LeaseBugStore(MemoryStore):
    """A backend with a bug in its lease code, for one session."""

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        if name == "buggy":
            raise RuntimeError("a bug in a backend")
        return await super().acquire_lease(name, holder, ttl)


@pytest.mark.asyncio
async def test_a_session_deleted_from_the_store_fails_its_compaction_and_the_server_goes_on() -> None:
    store = MemoryStore()
    async with running(store=store) as server, wire(server) as bot:
        await bot.open("room-1", config=SMALL)
        await bot.open("room-2", config=SMALL)
        for i in range(4):
            await bot.append("room-1", i)
            await bot.append("room-2", i)
        await store.delete("room-1")  # an operator removed the row meanwhile
        await bot.request("context.get", session="room-1")
        failed = await bot.push()
        assert (failed["type"], failed["session"]) == ("compaction.failed", "room-1")
        assert (failed["error"], failed["retryable"]) == ("store", False)
        await bot.request("context.get", session="room-2")
        landed = await bot.push()
        assert (landed["type"], landed["session"], landed["cursor"]) == ("compaction.completed", "room-2", 1)
        assert (await bot.request("ping"))["type"] == "pong"


@pytest.mark.asyncio
async def test_a_bug_in_a_compaction_is_recorded_as_a_failure_and_the_server_goes_on() -> None:
    async with running(store=LeaseBugStore()) as server, wire(server) as bot:
        await bot.open("buggy", config=SMALL)
        await bot.open("fine", config=SMALL)
        for i in range(4):
            await bot.append("buggy", i)
            await bot.append("fine", i)
        with capture_logs() as logs:
            await bot.request("context.get", session="buggy")
            failed = await bot.push()
        assert (failed["type"], failed["error"], failed["retryable"]) == (
            "compaction.failed",
            "internal",
            False,
        )
        assert any(e["event"] == "voice_context_compaction_crashed" for e in logs)
        state = await bot.request("session.state", session="buggy")
        assert (state["failures"], state["in_flight"]) == (1, False)
        await bot.request("context.get", session="fine")
        assert (await bot.push())["type"] == "compaction.completed"


@pytest.mark.asyncio
async def test_the_backoff_stops_doubling_long_before_a_float_overflows() -> None:
    failing = FailingSummarizer("server_error")
    config = {**SMALL, "retry_base_seconds": 0.0, "retry_max_seconds": 0.0}
    async with running(summarizer=failing) as server, wire(server) as bot:
        await bot.open("room-1", config=config)
        for i in range(4):
            await bot.append("room-1", i)
        for attempt in range(1, 1040):  # 2.0 ** 1024 overflowed after 1,025 failures
            await bot.request("context.get", session="room-1")
            failed = await bot.push()
            assert (failed["type"], failed["failures"]) == ("compaction.failed", attempt)
        assert (await bot.request("session.state", session="room-1"))["failures"] == 1039
