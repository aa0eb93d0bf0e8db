"""Tool turns: calls and results never separated, old results as placeholders, the OpenAI shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import skipped, started, summarized
from hypothesis import given, settings
from hypothesis import strategies as st
from serving import T0, running, wire

from voice_context.codec import TurnAppend, decode, message_dict
from voice_context.core.budget import Format, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.session import (
    ContextRequested,
    ContextView,
    Session,
    SkipReason,
    StartCompaction,
    TurnAppended,
)
from voice_context.core.tokens import CharEstimate
from voice_context.core.tools import fold_end, placeholder, tool_iterations, units
from voice_context.core.turns import Turn
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer


def user(text: str, at: float = T0) -> Turn:
    return Turn("Alice", "user", text, at)


def call(call_id: str, name: str = "find_flight", arguments: str = '{"to": "LIS"}', text: str = "") -> Turn:
    return Turn("Nova", "assistant", text, T0, None, call_id, name, arguments)


def result(
    call_id: str, text: str = '{"flight": "TP 1234", "departs": "09:40"}', name: str = "find_flight"
) -> Turn:
    return Turn(name, "tool", text, T0, None, call_id, name)


def reply(text: str) -> Turn:
    return Turn("Nova", "assistant", text, T0)


CHAIN = [
    user("Find me a flight to Lisbon."),  # 0
    call("c1"),  # 1
    user("Morning if you can."),  # 2  said while the tool ran
    result("c1"),  # 3
    call("c2", "seat_map", '{"flight": "TP 1234"}'),  # 4  two calls in one step
    call("c3", "price", '{"flight": "TP 1234"}'),  # 5
    result("c2", '{"free": ["14A", "14B"]}', "seat_map"),  # 6
    result("c3", '{"eur": 129}', "price"),  # 7
    reply("TP 1234 at 9:40, 129 euros, 14A and 14B are free."),  # 8
]


# -- the units a cut may fall between ------------------------------------------------------------


def test_a_call_and_its_result_are_one_unit_with_whatever_was_said_between() -> None:
    assert units(CHAIN) == [(0, 1), (1, 4), (4, 8), (8, 9)]


def test_a_call_without_a_result_runs_to_the_end() -> None:
    open_chain = [*CHAIN, user("And a hotel?"), call("c4", "hotels"), user("Near the river.")]
    assert units(open_chain)[-1] == (10, 12)


def test_a_fold_end_moves_back_to_the_start_of_the_unit_it_falls_in() -> None:
    assert fold_end(CHAIN, 3) == 1, "turns 1..3 go together: the fold stops before the call"
    assert fold_end(CHAIN, 4) == 4
    assert fold_end(CHAIN, 6) == 4
    assert fold_end([call("c9"), user("hm")], 1) == 0, "an open chain first: nothing to fold yet"


def test_iterations_count_back_from_the_newest() -> None:
    ages = tool_iterations(CHAIN)
    assert [ages[i] for i in (1, 3, 4, 5, 6, 7)] == [1, 1, 0, 0, 0, 0]


# -- folds ---------------------------------------------------------------------------------------


def test_a_batch_boundary_inside_a_tool_chain_moves_back_and_never_splits_it() -> None:
    session = Session("s", SessionConfig(recent_window=4, batch_size=3))
    for t in CHAIN:
        session.receive(TurnAppended(t))
    plan = started(session, T0)
    assert (plan.start, plan.end) == (0, 1), "0..2 would take call c1 without its result"


def test_an_open_chain_at_the_cursor_waits_for_its_result() -> None:
    session = Session("s", SessionConfig(recent_window=2, batch_size=1))
    for t in (call("c1"), user("a"), user("b"), user("c")):
        session.receive(TurnAppended(t))
    assert skipped(session, T0).reason is SkipReason.NO_ELIGIBLE_BATCH


# -- contexts ------------------------------------------------------------------------------------


def view(turns: list[Turn], **config: Any) -> ContextView:
    return ContextView(0, "", tuple(turns), (), SessionConfig(**config))


def test_messages_come_in_the_openai_tool_call_shape() -> None:
    ctx = build_context(view(CHAIN), "messages")
    shape = [
        (m["role"], m.get("tool_call_id"), [c["id"] for c in m.get("tool_calls", [])]) for m in ctx.messages
    ]
    assert shape == [
        ("user", None, []),
        ("assistant", None, ["c1"]),
        ("tool", "c1", []),
        ("user", None, []),  # what was said while the tool ran comes after its result
        ("assistant", None, ["c2", "c3"]),
        ("tool", "c2", []),
        ("tool", "c3", []),
        ("assistant", None, []),
    ]
    first_call = ctx.messages[1]["tool_calls"][0]
    assert first_call == {
        "id": "c1",
        "type": "function",
        "function": {"name": "find_flight", "arguments": '{"to": "LIS"}'},
    }
    assert ctx.messages[2]["content"] == '{"flight": "TP 1234", "departs": "09:40"}'


def test_results_older_than_the_last_iterations_become_placeholders() -> None:
    ctx = build_context(view(CHAIN, tool_result_iterations=1), "messages")
    tool_messages = [m for m in ctx.messages if m["role"] == "tool"]
    assert (
        tool_messages[0]["content"] == placeholder(CHAIN[3]) == "[result of find_flight compacted: 41 chars]"
    )
    assert tool_messages[1]["content"] == '{"free": ["14A", "14B"]}', "the newest iteration stays whole"


def test_instructions_show_calls_and_results_as_lines() -> None:
    ctx = build_context(view(CHAIN), "instructions", budget_chars=5000)
    assert 'Nova calls find_flight({"to": "LIS"})' in ctx.instructions
    assert 'seat_map returned: {"free": ["14A", "14B"]}' in ctx.instructions


def test_a_budget_keeps_or_drops_a_chain_whole() -> None:
    starts = {a for a, _ in units(CHAIN)}
    for budget in range(0, 400, 7):
        ctx = build_context(view(CHAIN), "messages", budget_chars=budget)
        assert ctx.chars <= budget
        assert ctx.turns_shown == 0 or ctx.first_turn in starts, "a cut inside a tool chain"
        assert_paired(ctx.messages)


def assert_paired(messages: tuple[dict[str, Any], ...]) -> None:
    """Every tool message answers a call of the assistant message just before its run of tool
    messages, and every call is answered there."""
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, f"a result without its call: {m}"
            open_calls.discard(m["tool_call_id"])
            continue
        assert not open_calls, f"calls without their results: {open_calls}"
        open_calls = {c["id"] for c in m.get("tool_calls", [])}
    assert not open_calls, f"calls without their results: {open_calls}"


STEP = st.sampled_from(["user", "reply", "call", "calls", "result", "chatter"])


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(STEP, min_size=1, max_size=40),
    budget=st.integers(0, 1500),
    fmt=st.sampled_from(["messages", "instructions"]),
    tokens=st.booleans(),
    keep=st.integers(0, 3),
)
def test_no_tool_pair_is_ever_split_by_a_cut_a_fold_or_a_budget(
    steps: list[str], budget: int, fmt: Format, tokens: bool, keep: int
) -> None:
    folder = DeterministicSummarizer()
    session = Session("prop", SessionConfig(recent_window=3, batch_size=2, tool_result_iterations=keep))
    pending: list[str] = []
    made = 0
    for i, step in enumerate(steps):
        if step == "call" or step == "calls":
            for _ in range(1 if step == "call" else 2):
                made += 1
                pending.append(f"c{made}")
                said = f"Checking {made}." if step == "calls" else ""  # parallel calls, each with words
                session.receive(TurnAppended(call(f"c{made}", arguments=f'{{"n": {made}}}', text=said)))
        elif step == "result" and pending:
            session.receive(TurnAppended(result(pending.pop(0), text=f'{{"answer": {i}}}' * (1 + i % 4))))
        elif step == "reply":
            session.receive(TurnAppended(reply(f"Reply {i}.")))
        else:
            session.receive(TurnAppended(user(f"Turn {i} from the user, at some length.")))
        [effect] = session.receive(ContextRequested(T0 + i))
        while isinstance(effect, StartCompaction):  # a fold, then any re-compaction pass
            plan = effect.plan
            folded = [t for t in plan.turns]
            called = {t.tool_call_id for t in folded if t.is_tool_call}
            answered = {t.tool_call_id for t in folded if t.is_tool_result}
            assert called == answered, "a fold took a call without its result, or the reverse"
            text = folder.summarize_now(SummaryRequest.for_plan(plan)) or "Nothing to note."
            effect = summarized(session, plan.plan_id, text, T0 + i)
        counter = CharEstimate()
        ctx = build_context(
            session.view(),
            fmt,
            budget_chars=None if tokens else budget,
            budget_tokens=budget // 3 if tokens else None,
            tokens=counter if tokens else None,
        )
        if tokens:
            assert ctx.tokens is not None and ctx.tokens <= budget // 3
        else:
            assert ctx.chars <= budget
        starts = {session.cursor + a for a, _ in units(session.verbatim_turns)}
        assert ctx.turns_shown == 0 or ctx.first_turn in starts, "a cut inside a tool chain"
        if fmt == "messages":
            assert_paired(ctx.messages)


# -- over the wire -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_tool_turns_over_a_real_server() -> None:
    async with running() as server, wire(server) as bot:
        await bot.open("room-1")
        await bot.append("room-1", 0, text="Find me a flight to Lisbon.")
        called = await bot.request(
            "turn.append",
            session="room-1",
            turn={
                "speaker": "Nova",
                "role": "assistant",
                "at": T0 + 1,
                "tool_call": {"id": "call_1", "name": "find_flight", "arguments": {"to": "LIS"}},
            },
        )
        assert called["index"] == 1
        answered = await bot.request(
            "turn.append",
            session="room-1",
            turn={
                "speaker": "find_flight",
                "role": "tool",
                "text": '{"flight": "TP 1234"}',
                "at": T0 + 2,
                "tool_result": {"id": "call_1", "name": "find_flight"},
            },
        )
        assert answered["index"] == 2
        ctx = await bot.request("context.get", session="room-1", format="messages")
        assert ctx["messages"][1] == {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "find_flight", "arguments": '{"to":"LIS"}'},
                }
            ],
        }
        assert ctx["messages"][2] == {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": '{"flight": "TP 1234"}',
        }

        for bad in (
            {"speaker": "Ann", "role": "user", "text": "x", "at": T0, "tool_call": {"id": "c", "name": "f"}},
            {"speaker": "Nova", "role": "assistant", "at": T0, "tool_call": {"name": "f"}},
            {"speaker": "t", "role": "tool", "text": "x", "at": T0, "tool_result": "c"},
        ):
            refused = await bot.request("turn.append", session="room-1", turn=bad)
            assert (refused["type"], refused["code"]) == ("error", "bad_request"), refused


def test_a_recorded_tool_turn_replays_as_it_was_sent() -> None:
    for turn in (call("c1"), result("c1"), user("plain")):
        recorded = message_dict(TurnAppend("room-1", turn))["turn"]
        # a replay decodes its recordings with the codec, as the server decoded them
        assert decode(json.dumps({"type": "turn.append", "session": "s", "turn": recorded})).turn == turn  # type: ignore[union-attr]


def test_a_bot_that_speaks_while_it_calls_two_tools_has_its_words_joined_within_the_budget() -> None:
    """Parallel calls each carrying what the bot said go out as one message whose content joins
    the words with a space: the size of the context counts that space too."""
    turns = [
        user("Find me a flight to Lisbon, and what does it cost?"),
        call("c1", text="Checking the flights"),
        call("c2", "price", '{"to": "LIS"}', text="and the fares."),
        result("c1"),
        result("c2", '{"eur": 129}', "price"),
        reply("TP 1234 at 9:40, 129 euros."),
    ]
    whole = build_context(view(turns), "messages")
    assert whole.messages[1]["content"] == "Checking the flights and the fares."
    assert whole.chars == sum(len(m["content"]) for m in whole.messages) + len(
        'find_flight{"to": "LIS"}'
    ) + len('price{"to": "LIS"}')
    for budget in range(0, 300, 5):
        ctx = build_context(view(turns), "messages", budget_chars=budget)
        assert ctx.chars <= budget
        assert_paired(ctx.messages)
