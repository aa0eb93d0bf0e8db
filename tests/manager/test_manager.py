"""The async shell: compactions run in the background and a context never waits for one."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import anyio
import pytest
from helpers import TIMEOUT, ManualClock, notes, turn, turns, wait_until

from voice_context.core.budget import SUMMARY_FOOTER, SUMMARY_PREFIX
from voice_context.core.session import Abandoned, CompactionAbandoned
from voice_context.core.turns import Note
from voice_context.errors import SessionClosed, StoreError, SummarizerError, UnknownSession
from voice_context.manager import CompactionEvent, SessionManager
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.fakes import FailingSummarizer, ScriptedSummarizer, SlowSummarizer
from voice_context.summarizers.openai_compat import OpenAISummarizer
from voice_context.testing.openai_server import OpenAIServer, Reply, Status

Logs = list[MutableMapping[str, Any]]


class GatedSummarizer:
    """Answers only once the test opens its gate; notes whether it was cancelled while waiting."""

    def __init__(self, answer: str = "Gated summary.") -> None:
        self.answer = answer
        self.gate = anyio.Event()
        self.entered = anyio.Event()
        self.calls = 0
        self.cancelled = 0

    @property
    def model(self) -> str:
        return "gated"

    async def summarize(self, request: SummaryRequest) -> str:
        self.calls += 1
        self.entered.set()
        try:
            await self.gate.wait()
        except anyio.get_cancelled_exc_class():
            self.cancelled += 1
            raise
        return self.answer


async def feed(manager: SessionManager, name: str, n: int, start_at: int = 0, **kw: Any) -> None:
    for t in turns(n, start_at, **kw):
        await manager.append_turn(name, t)


async def settle(manager: SessionManager) -> None:
    """Wait until every fold started so far has landed."""
    with anyio.fail_after(TIMEOUT):
        await manager.settled()


def compaction_logs(logs: Logs) -> list[MutableMapping[str, Any]]:
    return [entry for entry in logs if entry["event"].startswith("voice_context_compaction_")]


def pick(entry: MutableMapping[str, Any], *keys: str) -> dict[str, Any]:
    return {key: entry[key] for key in ("event", *keys)}


# -- (1) the must-show: a slow summarizer never delays a reply -----------------------


class HeldSummarizer(SlowSummarizer):
    """As slow as the story needs: it answers once the test lets it, not after some seconds."""

    def __init__(self, inner: Summarizer) -> None:
        super().__init__(inner, delay=0.0)
        self.answer = anyio.Event()

    async def summarize(self, request: SummaryRequest) -> str:
        self.started += 1
        await self.answer.wait()
        text = await self.inner.summarize(request)
        self.finished += 1
        return text


@pytest.mark.asyncio
async def test_context_never_waits_for_a_slow_compaction() -> None:
    scripted = ScriptedSummarizer()
    slow = HeldSummarizer(scripted)
    landed_at: list[float] = []
    with anyio.fail_after(TIMEOUT):
        async with SessionManager(slow) as manager:
            manager.add_listener(lambda event: landed_at.append(anyio.current_time()))
            await manager.open("room")
            await feed(manager, "room", 61)

            first = await manager.context("room")
            assert manager.in_flight == 1  # started in the background
            assert (first.cursor, first.summary, first.turns_shown) == (0, "", 61)
            await wait_until(lambda: slow.started == 1)

            returned: list[float] = []
            for i in range(61, 64):  # three turns arrive while the summarizer works
                await manager.append_turn("room", turn(i))
                ctx = await manager.context("room")
                returned.append(anyio.current_time())
                # the reply had its context while the compaction was still running
                assert manager.in_flight == 1
                assert (slow.started, slow.finished) == (1, 0)
                assert manager.session("room").in_flight is not None
                assert (ctx.cursor, ctx.summary, ctx.turns_shown, ctx.first_turn) == (0, "", i + 1, 0)

            slow.answer.set()
            await settle(manager)
            assert slow.finished == 1
            assert len(landed_at) == 1
            assert all(t < landed_at[0] for t in returned)  # every context came back before it landed

            after = await manager.context("room")
            assert after.cursor == 10
            assert after.summary == "Turns 0-9: Alice, Bob spoke."
            assert after.messages[0] == {
                "role": "system",
                "content": SUMMARY_PREFIX + after.summary + SUMMARY_FOOTER,
            }
            # the window stretched while in flight, then snapped forward: 10..63 verbatim
            assert (after.first_turn, after.turns_shown) == (10, 54)
            assert after.messages[1]["content"] == "Alice: turn 10"
            assert after.messages[-1]["content"] == "Bob: turn 63"
            assert manager.in_flight == 0
            [request] = scripted.requests
            assert request.turns == tuple(turns(10))
            assert (request.first_index, request.previous_summary, request.session) == (0, "", "room")


@pytest.mark.asyncio
async def test_settled_returns_once_the_fold_a_context_started_and_the_indexing_have_landed() -> None:
    gated = GatedSummarizer()
    async with SessionManager(gated) as manager:
        await manager.open("room")
        await feed(manager, "room", 61)
        await manager.context("room")  # folds turns 0..9 in the background
        settled = anyio.Event()

        async def wait() -> None:
            await manager.settled()
            settled.set()

        with anyio.fail_after(TIMEOUT):
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                await gated.entered.wait()
                assert not settled.is_set(), "the fold waits for its summary"
                gated.gate.set()
        assert manager.state("room").cursor == 10
        assert (manager.in_flight, manager.indexing_lag("room")) == (0, 0)


# -- (2) the seed's timeline, as logged ----------------------------------------------


@pytest.mark.asyncio
async def test_seed_timeline_through_the_manager(clock: ManualClock, logs: Logs) -> None:
    async with SessionManager(ScriptedSummarizer(), clock=clock) as manager:
        await manager.open("room")
        await feed(manager, "room", 60)
        await manager.context("room")
        await feed(manager, "room", 1, start_at=60)
        await manager.context("room")
        await settle(manager)
        await feed(manager, "room", 9, start_at=61)
        await manager.context("room")  # 70 turns, cursor 10: nothing yet
        await feed(manager, "room", 1, start_at=70)
        await manager.context("room")
        await settle(manager)
        assert manager.state("room").cursor == 20

    first, second = (
        "Turns 0-9: Alice, Bob spoke.",
        "Turns 0-9: Alice, Bob spoke. Turns 10-19: Alice, Bob spoke.",
    )
    events = compaction_logs(logs)
    assert [pick(e, "reason", "turns", "cursor", "recent_start") for e in events[::3]] == [
        {
            "event": "voice_context_compaction_skipped",
            "reason": "below_threshold",
            "turns": 60,
            "cursor": 0,
            "recent_start": 10,
        },
        {
            "event": "voice_context_compaction_skipped",
            "reason": "below_threshold",
            "turns": 70,
            "cursor": 10,
            "recent_start": 20,
        },
    ]
    assert events[0]["log_level"] == "debug"
    started = [pick(e, "cursor", "batch_size", "recent_start", "pending_note_count") for e in events[1::3]]
    assert started == [
        {
            "event": "voice_context_compaction_started",
            "cursor": 0,
            "batch_size": 10,
            "recent_start": 11,
            "pending_note_count": 0,
        },
        {
            "event": "voice_context_compaction_started",
            "cursor": 10,
            "batch_size": 10,
            "recent_start": 21,
            "pending_note_count": 0,
        },
    ]
    completed = [
        pick(e, "old_cursor", "new_cursor", "covered_through", "summary_chars", "latency")
        for e in events[2::3]
    ]
    assert completed == [
        {
            "event": "voice_context_compaction_completed",
            "old_cursor": 0,
            "new_cursor": 10,
            "covered_through": 9,
            "summary_chars": len(first),
            "latency": 0.0,
        },
        {
            "event": "voice_context_compaction_completed",
            "old_cursor": 10,
            "new_cursor": 20,
            "covered_through": 19,
            "summary_chars": len(second),
            "latency": 0.0,
        },
    ]
    assert len(events) == 6
    assert all(e["session"] == "room" for e in events)


@pytest.mark.asyncio
async def test_pending_notes_are_logged_folded_and_cleared(logs: Logs) -> None:
    scripted = ScriptedSummarizer()
    async with SessionManager(scripted) as manager:
        await manager.open("room", {"live_note_entries": 2})
        for i in range(4):
            await manager.append_note("room", Note(f"slide {i}", float(i), speaker="Alice"))
        await feed(manager, "room", 61)
        await manager.context("room")
        await settle(manager)
        assert manager.state("room").pending_notes == 0
        assert [n.text for n in manager.session("room").live_notes] == ["slide 2", "slide 3"]
        record = await manager.store.load("room")
        assert record is not None and record.pending_notes == ()
    [request] = scripted.requests
    assert [n.text for n in request.notes] == ["slide 0", "slide 1"]
    [started] = [e for e in logs if e["event"] == "voice_context_compaction_started"]
    assert started["pending_note_count"] == 2


@pytest.mark.asyncio
async def test_overlong_summary_gets_one_recompaction_then_is_clamped(logs: Logs) -> None:
    long = " ".join(f"Sentence number {i} is here." for i in range(10))
    scripted = ScriptedSummarizer([long, long])
    async with SessionManager(scripted) as manager:
        await manager.open("room", {"max_summary_chars": 60})
        await feed(manager, "room", 61)
        await manager.context("room")
        await settle(manager)
        assert manager.session("room").summary == "Sentence number 0 is here. Sentence number 1 is here."
    first, second = scripted.requests
    assert not first.recompact and len(first.turns) == 10
    # only the first 4 x 60 chars of a reply are read, up to their last full sentence
    read = " ".join(f"Sentence number {i} is here." for i in range(8))
    assert second.recompact and second.turns == () and second.previous_summary == read
    started = [e for e in logs if e["event"] == "voice_context_compaction_started"]
    assert [(e["batch_size"], e["recompact"]) for e in started] == [(10, False), (0, True)]
    [completed] = [e for e in logs if e["event"] == "voice_context_compaction_completed"]
    assert completed["clamped"] is True
    assert completed["summary_chars"] <= 60


# -- (3) failure, backoff, retry ----------------------------------------------------------


@pytest.mark.asyncio
async def test_failure_then_retry_after_backoff(clock: ManualClock, logs: Logs) -> None:
    scripted = ScriptedSummarizer([SummarizerError("upstream said 503", retryable=True, kind="http")])
    events: list[CompactionEvent] = []
    async with SessionManager(scripted, clock=clock) as manager:
        await manager.open("room")
        manager.add_listener(events.append)
        await feed(manager, "room", 61)
        await manager.context("room")
        await settle(manager)

        stats = manager.state("room")
        assert (stats.cursor, stats.in_flight, stats.failures) == (0, None, 1)
        [failed] = [e for e in logs if e["event"] == "voice_context_compaction_failed"]
        assert pick(failed, "model", "error", "retryable", "failures", "retry_at") == {
            "event": "voice_context_compaction_failed",
            "model": "scripted",
            "error": "http",
            "retryable": True,
            "failures": 1,
            "retry_at": clock.now + 2.0,
        }
        assert "503" in failed["message"]
        assert failed["log_level"] == "warning"

        ctx = await manager.context("room")  # still answers, from what exists
        assert (ctx.cursor, ctx.turns_shown) == (0, 61)
        clock.advance(1.999)
        await manager.context("room")
        skipped = [e for e in logs if e["event"] == "voice_context_compaction_skipped"]
        assert [e["reason"] for e in skipped] == ["backing_off", "backing_off"]
        assert skipped[0]["retry_at"] == clock.now + 0.001
        assert manager.in_flight == 0

        clock.advance(0.001)
        await manager.context("room")
        assert manager.in_flight == 1
        await settle(manager)
        stats = manager.state("room")
        assert (stats.cursor, stats.failures) == (10, 0)
        assert manager.session("room").retry_at is None
    assert [e.kind for e in events] == ["failed", "completed"]
    assert len(scripted.requests) == 2
    assert manager.counters == {"started": 2, "completed": 1, "failed": 1, "stale": 0}


@pytest.mark.asyncio
async def test_a_providers_retry_after_past_the_compaction_timeout_is_rate_limited_and_waited(
    clock: ManualClock, logs: Logs
) -> None:
    # The summarizer may retry, but the 45 s the provider asks for cannot end inside the
    # compaction's timeout: the 429 is told at once, and the session waits the 45 s (not 2 s).
    async with OpenAIServer(default=Reply("Alice booked Lisbon.")) as provider:
        provider.script(Status(429, headers={"Retry-After": "45"}))
        model = OpenAISummarizer(base_url=provider.base_url, model="m", timeout=TIMEOUT / 4, max_retries=1)
        async with (
            model,
            SessionManager(model, clock=clock, compaction_timeout=TIMEOUT / 2) as manager,
        ):
            await manager.open("room")
            await feed(manager, "room", 61)
            await manager.context("room")
            await settle(manager)
            [failed] = [e for e in logs if e["event"] == "voice_context_compaction_failed"]
            assert pick(failed, "error", "retryable", "retry_at") == {
                "event": "voice_context_compaction_failed",
                "error": "rate_limited",
                "retryable": True,
                "retry_at": clock.now + 45,
            }
            assert len(provider.completions) == 1, "no retry inside the compaction"

            clock.advance(44.999)
            await manager.context("room")
            assert manager.in_flight == 0
            assert len(provider.completions) == 1, "no second call before the provider said"

            clock.advance(0.001)
            await manager.context("room")
            await settle(manager)
            assert manager.state("room").cursor == 10
            assert len(provider.completions) == 2


@pytest.mark.parametrize(
    ("summarizer", "error", "retryable", "wait"),
    [
        (ScriptedSummarizer([SummarizerError("bad key", retryable=False, kind="auth")]), "auth", False, 60.0),
        (ScriptedSummarizer([RuntimeError("a summarizer bug")]), "RuntimeError", False, 60.0),
        (ScriptedSummarizer(["  \n "]), "empty", True, 2.0),
        (SlowSummarizer(ScriptedSummarizer(), delay=10.0), "timeout", True, 2.0),
        (FailingSummarizer("connection"), "connection", True, 2.0),
    ],
    ids=["non-retryable", "exception", "empty", "timeout", "failing"],
)
@pytest.mark.asyncio
async def test_every_kind_of_failure_is_non_fatal(
    summarizer: Summarizer, error: str, retryable: bool, wait: float, clock: ManualClock, logs: Logs
) -> None:
    events: list[CompactionEvent] = []
    async with SessionManager(summarizer, clock=clock, compaction_timeout=0.05) as manager:
        await manager.open("room")
        manager.add_listener(events.append)
        await feed(manager, "room", 61)
        await manager.context("room")
        await settle(manager)
        ctx = await manager.context("room")
        assert (ctx.cursor, ctx.turns_shown) == (0, 61)
        assert manager.state("room").in_flight is None
    [failed] = [e for e in logs if e["event"] == "voice_context_compaction_failed"]
    assert (failed["error"], failed["retryable"], failed["retry_at"]) == (error, retryable, clock.now + wait)
    [event] = events
    assert (event.kind, event.error, event.retryable, event.cursor, event.covered_through) == (
        "failed",
        error,
        retryable,
        0,
        -1,
    )


# -- (4) stale results and closed sessions ---------------------------------------------------


@pytest.mark.asyncio
async def test_closing_a_session_mid_compaction_lands_nothing(logs: Logs) -> None:
    gated = GatedSummarizer()
    events: list[CompactionEvent] = []
    async with SessionManager(gated) as manager:
        manager.add_listener(events.append)
        await manager.open("room")
        await feed(manager, "room", 61)
        await manager.context("room")
        with anyio.fail_after(TIMEOUT):
            await gated.entered.wait()
        await manager.close("room")
        await settle(manager)
        assert gated.cancelled == 1
        assert events == []
        assert "room" not in manager.names()
        with pytest.raises(UnknownSession):
            await manager.context("room")
        record = await manager.store.load("room")
        assert record is not None and (record.cursor, record.summary, record.total_turns) == (0, "", 61)

        # reopened, the session redoes the compaction from the store
        gated.gate.set()
        opened = await manager.open("room")
        assert opened.resumed
        assert (opened.stats.turns, opened.stats.cursor) == (61, 0)
        await manager.context("room")
        await settle(manager)
        assert manager.state("room").cursor == 10
    assert [e.kind for e in events] == ["completed"]
    assert [e["event"] for e in compaction_logs(logs)].count("voice_context_compaction_completed") == 1


@pytest.mark.asyncio
async def test_a_result_for_a_plan_no_longer_current_is_dropped_and_logged(logs: Logs) -> None:
    gated = GatedSummarizer("An answer nobody is waiting for.")
    events: list[CompactionEvent] = []
    async with SessionManager(gated) as manager:
        await manager.open("room")
        manager.add_listener(events.append, session="room")
        await feed(manager, "room", 61)
        await manager.context("room")
        with anyio.fail_after(TIMEOUT):
            await gated.entered.wait()
        session = manager.session("room")
        plan = session.in_flight
        assert plan is not None
        # what cancelling its task does to the session
        assert session.receive(CompactionAbandoned(plan.plan_id, manager.clock())) == [Abandoned(plan)]
        gated.gate.set()
        await settle(manager)

        assert events == []
        assert manager.counters["stale"] == 1
        stats = manager.state("room")
        assert (stats.cursor, stats.summary_chars, stats.failures) == (0, 0, 0)
        record = await manager.store.load("room")
        assert record is not None and record.cursor == 0
        [stale] = [e for e in logs if e["event"] == "voice_context_compaction_stale"]
        assert (stale["session"], stale["plan"], stale["current"]) == ("room", plan.plan_id, None)

        await manager.context("room")  # a new plan, a new id, and this one lands
        await settle(manager)
        assert manager.state("room").cursor == 10
    assert [e.kind for e in events] == ["completed"]


# -- (5) closing the manager -----------------------------------------------------------


@pytest.mark.asyncio
async def test_closing_the_manager_drains_work_in_flight() -> None:
    store = MemoryStore()
    slow = SlowSummarizer(ScriptedSummarizer(), delay=0.2)
    with anyio.fail_after(TIMEOUT):
        async with SessionManager(slow, store=store, close_timeout=TIMEOUT) as manager:
            await manager.open("room")
            await feed(manager, "room", 61)
            await manager.context("room")
            assert manager.in_flight == 1
    assert (slow.started, slow.finished) == (1, 1)
    assert manager.counters["completed"] == 1
    record = await store.load("room")
    assert record is not None and (record.cursor, record.summary) == (10, "Turns 0-9: Alice, Bob spoke.")


@pytest.mark.asyncio
async def test_closing_the_manager_cancels_what_outlives_close_timeout(logs: Logs) -> None:
    gated = GatedSummarizer()
    store = MemoryStore()
    with anyio.fail_after(TIMEOUT):
        async with SessionManager(gated, store=store, close_timeout=0.2) as manager:
            await manager.open("room")
            await feed(manager, "room", 61)
            await manager.context("room")
            await gated.entered.wait()
            leaving = anyio.current_time()
        left = anyio.current_time()
    assert left - leaving >= 0.19  # it gave the compaction its close_timeout first
    assert gated.cancelled == 1
    assert manager.in_flight == 0
    assert manager.counters["completed"] == 0
    record = await store.load("room")
    assert record is not None and record.cursor == 0

    # closed: no new session, and a late context request never starts a compaction
    with pytest.raises(SessionClosed):
        await manager.open("other")
    ctx = await manager.context("room")
    assert ctx.cursor == 0
    assert [e["reason"] for e in logs if e["event"] == "voice_context_compaction_skipped"] == [
        "session_ending"
    ]


@pytest.mark.asyncio
async def test_context_outside_the_block_leaves_no_plan_in_flight() -> None:
    manager = SessionManager(ScriptedSummarizer())
    await manager.open("room")
    await feed(manager, "room", 61)
    with pytest.raises(RuntimeError, match="async with"):
        await manager.context("room")
    assert manager.state("room").in_flight is None
    assert manager.in_flight == 0
    async with manager:
        await manager.context("room")
        await settle(manager)
        assert manager.state("room").cursor == 10


# -- (6) listeners ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_listeners_receive_completed_and_failed_events(clock: ManualClock, logs: Logs) -> None:
    scripted = ScriptedSummarizer([SummarizerError("down", kind="connection")])
    everything: list[CompactionEvent] = []
    mine: list[CompactionEvent] = []
    theirs: list[CompactionEvent] = []

    def broken(event: CompactionEvent) -> None:
        raise ValueError("a listener bug")

    async with SessionManager(scripted, clock=clock) as manager:
        manager.add_listener(everything.append)
        manager.add_listener(broken)
        await manager.open("room")
        await manager.open("other")
        manager.add_listener(mine.append, session="room")
        manager.add_listener(theirs.append, session="other")
        await feed(manager, "room", 61)
        await manager.context("room")
        await settle(manager)
        clock.advance(2.5)
        await manager.context("room")
        await settle(manager)
        manager.remove_listener(everything.append)
        manager.remove_listener(mine.append, session="room")
        await feed(manager, "room", 10, start_at=61)
        await manager.context("room")
        await settle(manager)
        assert manager.state("room").cursor == 20  # a broken listener loses nothing

    failed, completed = mine
    assert everything == mine
    assert theirs == []
    assert (failed.kind, failed.session, failed.error, failed.retryable, failed.failures) == (
        "failed",
        "room",
        "connection",
        True,
        1,
    )
    assert failed.retry_at == 1_000.0 + 2.0
    assert (failed.cursor, failed.covered_through, failed.summary_chars) == (0, -1, 0)
    assert (completed.kind, completed.old_cursor, completed.cursor, completed.covered_through) == (
        "completed",
        0,
        10,
        9,
    )
    assert completed.summary_chars == len("Turns 0-9: Alice, Bob spoke.")
    assert completed.latency == 0.0
    assert [e["event"] for e in logs].count("voice_context_listener_failed") == 3


# -- (7) owners ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_a_session_is_invisible_to_other_owners() -> None:
    async with SessionManager(ScriptedSummarizer()) as manager:
        await manager.open("room", owner="alice")
        await manager.append_turn("room", turn(0), owner="alice")
        for owner in (None, "bob"):
            with pytest.raises(UnknownSession):
                await manager.append_turn("room", turn(1), owner=owner)
            with pytest.raises(UnknownSession):
                await manager.append_note("room", Note("x", 0.0), owner=owner)
            with pytest.raises(UnknownSession):
                await manager.context("room", owner=owner)
            with pytest.raises(UnknownSession):
                manager.state("room", owner=owner)
            with pytest.raises(UnknownSession):
                await manager.close("room", owner=owner)
            with pytest.raises(UnknownSession):
                await manager.open("room", owner=owner)
        assert manager.state("room", owner="alice").turns == 1

        # the store remembers the owner once the session is closed here
        await manager.close("room", owner="alice")
        with pytest.raises(UnknownSession):
            await manager.open("room", owner="bob")
        opened = await manager.open("room", owner="alice")
        assert opened.resumed and opened.stats.turns == 1
        with pytest.raises(UnknownSession, match="nowhere"):
            await manager.context("nowhere")


# -- (8) many sessions at once ---------------------------------------------------------------


class PerSession:
    """Fails for one session, answers from the script's default for the others."""

    def __init__(self, failing: str) -> None:
        self.failing = failing
        self.inner = ScriptedSummarizer()

    @property
    def model(self) -> str:
        return "per-session"

    async def summarize(self, request: SummaryRequest) -> str:
        if request.session == self.failing:
            raise SummarizerError("this one is down", kind="connection")
        return await self.inner.summarize(request)


@pytest.mark.asyncio
async def test_many_sessions_compact_independently() -> None:
    slow = SlowSummarizer(PerSession(failing="s3"), delay=0.2)
    names = [f"s{i}" for i in range(20)]
    async with SessionManager(slow) as manager:
        for name in names:
            await manager.open(name, {"batch_size": 5} if name == "s7" else None)
            await feed(manager, name, 61, speakers=(f"{name}-A", f"{name}-B"))
        for name in names:
            await manager.context(name)
        assert manager.in_flight == 20
        await wait_until(lambda: slow.started == 20)
        assert slow.finished == 0  # all twenty are running at once
        await settle(manager)

        for name in names:
            stats = manager.state(name)
            summary = manager.session(name).summary
            if name == "s3":
                assert (stats.cursor, stats.failures, summary) == (0, 1, "")
            elif name == "s7":
                assert (stats.cursor, summary) == (5, "Turns 0-4: s7-A, s7-B spoke.")
            else:
                assert (stats.cursor, summary) == (10, f"Turns 0-9: {name}-A, {name}-B spoke.")
        assert manager.counters == {"started": 20, "completed": 19, "failed": 1, "stale": 0}


# -- landing waits for a note write in progress -------------------------------------


class SlowNoteStore(MemoryStore):
    """A store whose next note write waits for the test, then fails."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = anyio.Event()
        self.release = anyio.Event()
        self.fail_next = False

    async def save_notes(self, name: str, live: Any, pending: Any, doc: Any = None) -> Any:
        if self.fail_next:
            self.fail_next = False
            self.writing.set()
            await self.release.wait()
            raise StoreError("disk full", retryable=True)
        return await super().save_notes(name, live, pending, doc)


@pytest.mark.asyncio
async def test_a_compaction_lands_only_after_a_note_write_in_progress_settles() -> None:
    store = SlowNoteStore()
    gated = GatedSummarizer()
    with anyio.fail_after(TIMEOUT):
        async with SessionManager(gated, store=store) as manager:
            await manager.open("room", {"live_note_entries": 1})
            for note in notes(3):  # note 0 and note 1 are pushed out, pending
                await manager.append_note("room", note)
            await feed(manager, "room", 61)
            await manager.context("room")  # folds turns 0..9 with the two pending notes
            await gated.entered.wait()

            # a note write starts (and will fail) while the summary is ready to land
            store.fail_next = True
            async with anyio.create_task_group() as tg:

                async def write_note() -> None:
                    with pytest.raises(StoreError):
                        await manager.append_note("room", Note("note 3", 3.0))

                tg.start_soon(write_note)
                await store.writing.wait()
                gated.gate.set()
                # the summary is in: the fold queues for the session's lock, which the write holds
                await wait_until(lambda: manager.live["room"].lock.statistics().tasks_waiting == 1)
                assert manager.state("room").cursor == 0, "the fold waits for the note write"
                store.release.set()
            await settle(manager)

            session = manager.session("room")
            assert session.cursor == 10
            assert session.pending_notes == ()  # the folded notes are gone, not restored
            assert [n.text for n in session.live_notes] == ["note 2"]
            record = await store.load("room")
            assert record is not None and record.pending_notes == () and record.cursor == 10
