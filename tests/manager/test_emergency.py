"""Emergency compaction: a model's context overflowed; fold at once and answer a context that fits."""

from __future__ import annotations

from contextlib import aclosing
from pathlib import Path

import anyio
import pytest
from serving import T0, running, wire

from voice_context.core.emergency import halves, safety_start
from voice_context.core.turns import Turn
from voice_context.errors import ContextOverflow
from voice_context.manager import SessionManager
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.tokenizers import load_tokenizer

COUNTER = load_tokenizer("o200k_base")


def user(text: str, i: int = 0) -> Turn:
    return Turn(("Alice", "Bob")[i % 2], "user", text, T0 + 60 * i)


def reply(text: str, i: int = 0) -> Turn:
    return Turn("Nova", "assistant", text, T0 + 60 * i)


def call(call_id: str, i: int = 0) -> Turn:
    return Turn("Nova", "assistant", "", T0 + 60 * i, None, call_id, "find_flight", '{"to": "LIS"}')


def result(call_id: str, i: int = 0) -> Turn:
    return Turn("find_flight", "tool", '{"flight": "TP 1234"}', T0 + 60 * i, None, call_id, "find_flight")


# -- what must stay ------------------------------------------------------------------------------


def test_the_safety_region_starts_at_the_last_user_turn_or_the_last_iteration() -> None:
    assert safety_start([user("a"), reply("b"), user("c"), reply("d")]) == 2, "the last step and its ask"
    assert safety_start([user("a"), user("b"), call("c1"), result("c1")]) == 1, "the last user turn asked"
    assert safety_start([user("a"), call("c1"), user("b"), result("c1"), reply("e")]) == 1, "the chain whole"
    assert safety_start([user("b"), user("a"), reply("b"), call("c9"), reply("waiting")]) == 1, (
        "an open chain stays"
    )
    assert safety_start([call("c1"), result("c1"), reply("done"), user("next")]) == 2
    assert safety_start([]) == 0


def test_the_rest_is_split_in_two_halves_by_tokens_at_a_unit_boundary() -> None:
    turns = [user("short"), user("word " * 100), call("c1"), result("c1"), user("word " * 100)]
    cut = halves(turns, lambda t: COUNTER.count(t.text) + 1)
    assert cut in (2, 4), "never between a call and its result"
    assert cut == 2


# -- the manager ---------------------------------------------------------------------------------

FIRST_HALF = [
    user(f"Option {i}: fly from Porto on day {i}, said at some length to fill the window.", i)
    for i in range(20)
]
SECOND_HALF = [
    user(f"Option {i}: drive from Faro on day {i}, said at some length to fill the window.", i)
    for i in range(20, 40)
]
TAIL = [call("c1", 40), result("c1", 41), reply("TP 1234 it is.", 42), user("Book it, please.", 43)]
SESSION = [*FIRST_HALF, *SECOND_HALF, *TAIL]


async def fill(manager: SessionManager, name: str = "room") -> None:
    await manager.open(name)  # recent_window 50: the count rule never fires for 44 turns
    for turn in SESSION:
        await manager.append_turn(name, turn)


@pytest.mark.asyncio
async def test_an_overflow_folds_all_but_the_safety_region_and_the_context_fits(tmp_path: Path) -> None:
    async with (
        aclosing(SQLiteStore(tmp_path / "vc.db")) as store,
        SessionManager(DeterministicSummarizer(), store=store) as manager,
    ):
        await fill(manager)
        assert manager.state("room").cursor == 0
        ctx, applied = await manager.overflow("room", "messages", limit_tokens=300)
        # the safety region: Nova's last step (42) and the user turn after it; the tool chain folds whole
        assert applied is not None and (applied.old_cursor, applied.new_cursor) == (0, 42)
        assert ctx.tokens is not None and ctx.tokens <= 300
        assert ctx.first_turn <= 42, "the safety region is shown whole"
        contents = [m["content"] for m in ctx.messages]
        assert contents[-2:] == ["TP 1234 it is.", "Bob: Book it, please."]
        summary = manager.session("room").summary
        assert "Porto" in summary and "Faro" in summary, "both halves are in the merged summary"
        assert "find_flight" in summary and "TP 1234" in summary, "the call and its result folded together"
    async with (
        aclosing(SQLiteStore(tmp_path / "vc.db")) as store,
        SessionManager(DeterministicSummarizer(), store=store) as again,
    ):
        await again.open("room")
        assert again.state("room").cursor == 42, "the emergency fold was committed"


@pytest.mark.asyncio
async def test_when_what_must_stay_cannot_fit_it_fails_fast_and_changes_nothing() -> None:
    async with SessionManager(DeterministicSummarizer()) as manager:
        await fill(manager)
        with pytest.raises(ContextOverflow) as refused:
            await manager.overflow("room", "messages", limit_tokens=20, base_instructions="Be brief. " * 20)
        assert refused.value.needed > refused.value.limit == 20
        assert manager.state("room").cursor == 0


class GatedSummarizer:
    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.entered = anyio.Event()

    @property
    def model(self) -> str:
        return "gated"

    async def summarize(self, request: SummaryRequest) -> str:
        self.entered.set()
        await self.gate.wait()
        return DeterministicSummarizer().summarize_now(request)


@pytest.mark.asyncio
async def test_a_fold_in_flight_is_superseded_and_its_result_dropped() -> None:
    gated = GatedSummarizer()
    async with SessionManager(gated) as manager:
        await manager.open("room", {"recent_window": 10, "batch_size": 5})
        for turn in SESSION:
            await manager.append_turn("room", turn)
        await manager.context("room")  # starts a fold of 0..4 (and more) in the background
        await gated.entered.wait()
        _, applied = await manager.overflow("room", limit_tokens=400)
        assert applied is not None and manager.state("room").cursor == 42
        gated.gate.set()
        await manager.settled()
        assert manager.state("room").cursor == 42, "the stale fold changed nothing"


# -- over the wire -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_context_overflow_over_a_real_server() -> None:
    async with running(summarizer=DeterministicSummarizer()) as server, wire(server) as bot:
        await bot.open("room-1")
        for i, turn in enumerate(SESSION[:30]):
            await bot.append("room-1", i, text=turn.text)
        answer = await bot.request(
            "context.overflow", session="room-1", format="instructions", limit_tokens=250
        )
        assert answer["type"] == "context"
        assert answer["emergency"] == {"old_cursor": 0, "cursor": 29, "folded": 29}
        assert answer["tokens"] <= 250 and answer["budget_tokens"] == 250
        assert answer["instructions"].endswith(SESSION[29].text)
        pushed = await bot.push()
        assert (pushed["type"], pushed["trigger"], pushed["cursor"]) == (
            "compaction.completed",
            "emergency",
            29,
        )

        refused = await bot.request("context.overflow", session="room-1", limit_tokens=5)
        assert (refused["type"], refused["code"], refused["limit"]) == ("error", "too_large", "limit_tokens")
        assert refused["needed"] > 5
        bad = await bot.request("context.overflow", session="room-1", limit_tokens=-3)
        assert (bad["type"], bad["code"]) == ("error", "bad_request")
