"""Contexts under a char budget: layout, priority, cuts at boundaries, exact sizes."""

from __future__ import annotations

import pytest
from helpers import given, turns

from voice_context.core.budget import (
    FACTS_HEADER,
    MIN_SUMMARY_CUT,
    RECENT_HEADER,
    SUMMARY_FOOTER,
    SUMMARY_HEADER,
    SUMMARY_PREFIX,
    Context,
    Format,
    build_context,
    estimate_tokens,
)
from voice_context.core.config import SessionConfig
from voice_context.core.session import ContextView, Session, TurnAppended
from voice_context.core.text import clip
from voice_context.core.turns import Note, Turn, TurnRun

SUMMARY = "Alpha happened first. Beta came second. Gamma was third. Delta is newest."
FACTS = ("Alice is vegetarian.", "Bob lives in Porto.")
NOTES = (Note("a spreadsheet of costs", 1.0, speaker="Alice", source="sheets"), Note("a map", 2.0))
CONVERSATION = (
    Turn("Alice", "user", "Shall we book the trip?", 100.0),
    Turn("Nova", "assistant", "I can help with that.", 101.0),
    Turn("Calc", "tool", "total = 420", 102.0),
    Turn("Bob", "user", "Yes, Friday works.", 103.0),
)

COUNTED_PRIORITY = {"recent_share": 0.0, "recent_floor": 0.0, "recall_share": 0.0, "summary_share": 1.0}
"""A layout with no protected share and no recency floor: only ``priority_turns`` outrank facts,
and the summary takes up to ``summary_priority_chars`` before the older turns (the order these
tests pin down)."""


def view_of(
    conversation: tuple[Turn, ...] | list[Turn] = CONVERSATION,
    *,
    cursor: int = 10,
    summary: str = SUMMARY,
    live_notes: tuple[Note, ...] = NOTES,
    config: SessionConfig | None = None,
) -> ContextView:
    return ContextView(cursor, summary, tuple(conversation), live_notes, config or SessionConfig())


def real_size(ctx: Context) -> int:
    if ctx.format == "instructions":
        return len(ctx.instructions)
    return sum(len(m["content"]) for m in ctx.messages)


def turn_content(turn: Turn, text: str) -> tuple[str, str]:
    if turn.role == "user":
        return "user", f"{turn.speaker}: {text}"
    if turn.role == "assistant":
        return "assistant", text
    return "system", f"{turn.speaker} ({turn.role}): {text}"


def assert_turns_contiguous(ctx: Context, view: ContextView) -> None:
    """Shown turns are the newest ``turns_shown``, in order; only the current one may be clipped."""
    n = len(view.turns)
    assert 0 <= ctx.turns_shown <= n
    assert ctx.first_turn == view.cursor + n - ctx.turns_shown
    shown = view.turns[n - ctx.turns_shown :]
    limit = view.config.max_turn_chars
    if ctx.format == "messages":
        tail = ctx.messages[len(ctx.messages) - ctx.turns_shown :] if ctx.turns_shown else ()
        for i, (turn, message) in enumerate(zip(shown, tail, strict=True)):
            role, content = turn_content(turn, clip(turn.text, limit))
            assert message["role"] == role
            if i < len(shown) - 1:
                assert message["content"] == content
            else:
                head = content[: len(content) - len(clip(turn.text, limit))]
                assert message["content"].startswith(head)
    else:
        lines = [f"{t.speaker}: {clip(t.text, limit)}" for t in shown]
        if not lines:
            assert RECENT_HEADER not in ctx.instructions
            return
        section = ctx.instructions[ctx.instructions.index(RECENT_HEADER) :]
        got = section.split("\n")[1:]
        assert got[:-1] == lines[:-1]
        assert got[-1].startswith(f"{shown[-1].speaker}: ")


# -- layout ------------------------------------------------------------------------


def test_messages_layout() -> None:
    ctx = build_context(view_of(), "messages", base_instructions="Be brief.", facts=FACTS)
    assert list(ctx.messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Durable facts:\n- Alice is vegetarian.\n- Bob lives in Porto."},
        {"role": "system", "content": SUMMARY_HEADER + SUMMARY + SUMMARY_FOOTER},
        {
            "role": "system",
            "content": "Screen notes:\n- Alice's screen (sheets): a spreadsheet of costs\n- Screen: a map",
        },
        {"role": "user", "content": "Alice: Shall we book the trip?"},
        {"role": "assistant", "content": "I can help with that."},
        {"role": "system", "content": "Calc (tool): total = 420"},
        {"role": "user", "content": "Bob: Yes, Friday works."},
    ]
    assert ctx.format == "messages"
    assert (ctx.cursor, ctx.covered_through, ctx.first_turn, ctx.turns_shown) == (10, 9, 10, 4)
    assert ctx.summary == SUMMARY
    assert ctx.budget_chars is None
    assert ctx.dropped == ()
    assert ctx.instructions == ""
    assert ctx.chars == real_size(ctx)


def test_messages_without_summary_or_notes() -> None:
    ctx = build_context(view_of(cursor=0, summary="", live_notes=()), "messages")
    assert [m["role"] for m in ctx.messages] == ["user", "assistant", "system", "user"]
    assert ctx.messages[-1]["content"] == "Bob: Yes, Friday works."
    assert (ctx.cursor, ctx.covered_through) == (0, -1)


def test_instructions_sections() -> None:
    ctx = build_context(view_of(), "instructions", base_instructions="You are Nova.", facts=FACTS)
    assert ctx.instructions == (
        "You are Nova.\n\n"
        "Durable facts:\n- Alice is vegetarian.\n- Bob lives in Porto.\n\n"
        f"{SUMMARY_HEADER}{SUMMARY}{SUMMARY_FOOTER}\n\n"
        "Screen notes:\n- Alice's screen (sheets): a spreadsheet of costs\n- Screen: a map\n\n"
        "Recent conversation:\nAlice: Shall we book the trip?\nNova: I can help with that.\n"
        "Calc: total = 420\nBob: Yes, Friday works."
    )
    assert ctx.chars == len(ctx.instructions)
    assert ctx.budget_chars == 5200  # the session's default for instructions
    assert ctx.messages == ()
    assert ctx.dropped == ()


def test_empty_session() -> None:
    view = view_of((), cursor=0, summary="", live_notes=())
    assert build_context(view, "messages").messages == ()
    ctx = build_context(view, "instructions", base_instructions="Hello.")
    assert (ctx.instructions, ctx.chars, ctx.turns_shown, ctx.first_turn) == ("Hello.", 6, 0, 0)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="format"):
        build_context(view_of(), "xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget"):
        build_context(view_of(), "messages", budget_chars=-1)


def test_context_from_a_live_session() -> None:
    session = Session("room")
    given(session, *[TurnAppended(t) for t in turns(3)])
    ctx = build_context(session.view(), "messages")
    assert [m["content"] for m in ctx.messages] == ["Alice: turn 0", "Bob: turn 1", "Alice: turn 2"]


def test_estimate_tokens() -> None:
    assert [estimate_tokens(n) for n in (0, 1, 4, 5, 400)] == [0, 1, 1, 2, 100]


# -- per-turn clip -------------------------------------------------------------------


def test_each_turn_is_clipped_to_max_turn_chars() -> None:
    config = SessionConfig(max_turn_chars=40)
    long = "word " * 60
    conversation = [Turn("Alice", "user", long, 0.0), Turn("Bob", "user", "short", 1.0)]
    view = view_of(conversation, summary="", live_notes=(), config=config)
    messages = build_context(view, "messages").messages
    assert messages[0]["content"] == "Alice: " + clip(long, 40)
    assert len(messages[0]["content"]) <= len("Alice: ") + 40
    assert messages[0]["content"].endswith("…")
    assert messages[1]["content"] == "Bob: short"
    text = build_context(view, "instructions").instructions
    assert f"Alice: {clip(long, 40)}\nBob: short" in text


# -- the current turn under a tiny budget ---------------------------------------------


def test_current_turn_survives_a_tiny_budget_clipped_instructions() -> None:
    view = view_of([Turn("Alice", "user", "x" * 500, 0.0)], summary="", live_notes=())
    frame = len(RECENT_HEADER + "\nAlice: ")
    for room in (1, 2, 12, 100):
        ctx = build_context(view, "instructions", budget_chars=frame + room)
        assert ctx.turns_shown == 1, room
        assert ctx.instructions == RECENT_HEADER + "\nAlice: " + clip("x" * 500, room)
        assert ctx.chars == frame + room
    too_small = build_context(view, "instructions", budget_chars=frame)
    assert (too_small.turns_shown, too_small.chars) == (0, 0)
    assert "current_turn" in too_small.dropped


def test_current_turn_survives_a_tiny_budget_clipped_messages() -> None:
    text = "please remember that the meeting moved to Thursday at nine"
    view = view_of([*CONVERSATION, Turn("Alice", "user", text, 9.0)])
    ctx = build_context(view, "messages", budget_chars=30, base_instructions="", facts=FACTS)
    assert ctx.turns_shown == 1
    [message] = ctx.messages
    assert message["role"] == "user"
    assert message["content"] == "Alice: " + clip(text, 23)
    assert ctx.chars <= 30
    assert "facts" in ctx.dropped and "summary" in ctx.dropped


def test_base_instructions_come_first() -> None:
    ctx = build_context(view_of(), "instructions", budget_chars=20, base_instructions="B" * 50)
    assert ctx.instructions == clip("B" * 50, 20)
    assert ctx.turns_shown == 0
    assert "current_turn" in ctx.dropped


# -- priority --------------------------------------------------------------------------

#: what the label and the fence around a summary cost in the messages shape
FENCE = len(SUMMARY_PREFIX) + len(SUMMARY_FOOTER)


def test_summary_cut_keeps_the_newest_sentences() -> None:
    view = view_of([Turn("Alice", "user", "hi", 0.0)], summary=SUMMARY, live_notes=())
    full = build_context(view, "messages")
    budget = full.chars - len("Alpha happened first. ")
    ctx = build_context(view, "messages", budget_chars=budget)
    assert ctx.summary == "Beta came second. Gamma was third. Delta is newest."
    assert ctx.messages[0]["content"] == SUMMARY_PREFIX + ctx.summary + SUMMARY_FOOTER
    assert ctx.chars == budget
    assert "summary_head" in ctx.dropped

    full = build_context(view, "instructions", budget_chars=10_000)
    budget = full.chars - len("Alpha happened first. Beta came second. ")
    ctx = build_context(view, "instructions", budget_chars=budget)
    assert ctx.summary == "Gamma was third. Delta is newest."
    assert f"{SUMMARY_HEADER}Gamma was third. Delta is newest.{SUMMARY_FOOTER}\n\n" in ctx.instructions
    assert ctx.chars == budget


def test_a_summary_with_no_real_room_is_left_out_rather_than_sent_as_a_stub() -> None:
    view = view_of([Turn("Alice", "user", "hi", 0.0)], summary="A" * 300 + ".", live_notes=())
    bare = build_context(view, "messages", budget_chars=0 + len("Alice: hi"))
    assert bare.summary == "" and "summary" in bare.dropped
    for room in range(1, MIN_SUMMARY_CUT):
        ctx = build_context(view, "messages", budget_chars=len("Alice: hi") + FENCE + room)
        assert ctx.summary == "", room
        assert "summary" in ctx.dropped
    ctx = build_context(view, "messages", budget_chars=len("Alice: hi") + FENCE + MIN_SUMMARY_CUT)
    assert len(ctx.summary) == MIN_SUMMARY_CUT and ctx.summary.startswith("…")


def test_a_dropped_current_turn_is_not_also_reported_as_older_turns() -> None:
    view = view_of([Turn("Alice", "user", "hello there", 0.0)], summary="", live_notes=())
    ctx = build_context(
        view, "instructions", budget_chars=len("You are Nova.") + 3, base_instructions="You are Nova."
    )
    assert ctx.turns_shown == 0
    assert ctx.dropped == ("current_turn",)


def folded_behind(
    conversation: list[Turn],
    unfolded: int,
    *,
    summary: str,
    live_notes: tuple[Note, ...],
    config: SessionConfig,
) -> tuple[ContextView, TurnRun]:
    """A session whose newest ``unfolded`` turns are from the cursor on, and the turns before
    them folded (the summary covers them; the store still keeps them): its view, and those."""
    cursor = 10 + len(conversation) - unfolded
    view = ContextView(cursor, summary, tuple(conversation[-unfolded:]), live_notes, config)
    return view, TurnRun.of(10, conversation[:-unfolded])


def test_newest_turns_outrank_facts_which_outrank_the_summary_which_outranks_older_turns() -> None:
    config = SessionConfig(priority_turns=2, **COUNTED_PRIORITY)
    view, older = folded_behind(turns(6, start_at=10), 2, summary=SUMMARY, live_notes=(), config=config)
    two_newest = build_context(view_of(view.turns, summary="", live_notes=(), config=config), "messages")

    ctx = build_context(view, "messages", budget_chars=two_newest.chars + 5, facts=FACTS, older=older)
    assert (ctx.turns_shown, ctx.summary) == (2, "")
    assert [m for m in ctx.messages if m["content"].startswith(FACTS_HEADER)] == []

    facts_only = len(FACTS_HEADER) + sum(len(f"\n- {f}") for f in FACTS)
    ctx = build_context(
        view, "messages", budget_chars=two_newest.chars + facts_only, facts=FACTS, older=older
    )
    assert (ctx.turns_shown, ctx.summary) == (2, "")
    assert ctx.messages[0]["content"] == FACTS_HEADER + "\n- Alice is vegetarian.\n- Bob lives in Porto."

    with_summary = two_newest.chars + facts_only + FENCE + len(SUMMARY)
    budget = with_summary + len("Bob: turn 13") - 1
    ctx = build_context(view, "messages", budget_chars=budget, facts=FACTS, older=older)
    assert (ctx.turns_shown, ctx.summary) == (2, SUMMARY)
    assert ctx.dropped == ()  # every turn from the cursor on is shown: the summary has the rest
    budget = with_summary + len("Bob: turn 13")
    ctx = build_context(view, "messages", budget_chars=budget, facts=FACTS, older=older)
    assert (ctx.turns_shown, ctx.first_turn, ctx.summary) == (3, 13, SUMMARY)


def test_turns_from_the_cursor_on_outrank_facts_the_summary_and_notes() -> None:
    """No summary covers them yet: a context that left one out would show it nowhere."""
    config = SessionConfig(priority_turns=2, **COUNTED_PRIORITY)
    view = view_of(turns(6, start_at=10), summary=SUMMARY, live_notes=NOTES, config=config)
    all_turns = build_context(view_of(view.turns, summary="", live_notes=(), config=config), "messages")

    ctx = build_context(view, "messages", budget_chars=all_turns.chars, facts=FACTS)
    assert (ctx.turns_shown, ctx.first_turn, ctx.summary) == (6, view.cursor, "")
    assert set(ctx.dropped) == {"facts", "summary", "notes"}
    # a char less, and they cannot all be shown whatever the context gives up: it gives up
    # nothing for them, and they take what is left after the rest, as older turns do
    ctx = build_context(view, "messages", budget_chars=all_turns.chars - 1, facts=FACTS)
    assert "older_turns" in ctx.dropped and ctx.messages[0]["content"].startswith(FACTS_HEADER)


def test_notes_outrank_older_turns() -> None:
    config = SessionConfig(priority_turns=1, **COUNTED_PRIORITY)
    view, older_run = folded_behind(turns(4), 1, summary="Short summary.", live_notes=NOTES, config=config)
    everything = build_context(view, "instructions", budget_chars=10_000, older=older_run)
    assert everything.turns_shown == 4
    older = len("\nAlice: turn 2") + len("\nBob: turn 1") + len("\nAlice: turn 0")
    ctx = build_context(view, "instructions", budget_chars=everything.chars - older, older=older_run)
    assert ctx.turns_shown == 1  # every older turn went before any note did
    assert ctx.summary == "Short summary."
    assert "- Screen: a map" in ctx.instructions
    assert "spreadsheet" in ctx.instructions
    ctx = build_context(view, "instructions", budget_chars=everything.chars - older - 1, older=older_run)
    assert "- Screen: a map" in ctx.instructions  # the newest note stays
    assert "spreadsheet" not in ctx.instructions
    assert "notes" in ctx.dropped


def body_of(ctx: Context) -> str:
    return ctx.instructions if ctx.format == "instructions" else "\n".join(m["content"] for m in ctx.messages)


@pytest.mark.parametrize("fmt", ["messages", "instructions"])
def test_every_budget_keeps_the_priority_order(fmt: Format) -> None:
    """Parts are taken greedily in priority order: whatever is missing did not fit when its turn came."""
    config = SessionConfig(priority_turns=2, **COUNTED_PRIORITY)
    whole = view_of(turns(6, start_at=10), summary=SUMMARY, live_notes=NOTES, config=config)
    # the two newest turns are from the cursor on; the four before them are folded, and shown
    # only as the budget has room
    view, older = folded_behind(list(whole.turns), 2, summary=SUMMARY, live_notes=NOTES, config=config)
    n = len(whole.turns)

    def cost(shown: int, facts: tuple[str, ...], summary: str, notes: tuple[Note, ...]) -> int:
        """The exact size of a context holding just these parts."""
        part = view_of(
            whole.turns[n - shown :] if shown else (), summary=summary, live_notes=notes, config=config
        )
        return build_context(part, fmt, budget_chars=10**9, facts=facts).chars

    full = build_context(view, fmt, budget_chars=10**9, facts=FACTS, older=older)
    assert full.dropped == ()
    assert full.chars == cost(n, FACTS, SUMMARY, NOTES)
    for budget in range(full.chars + 2):
        ctx = build_context(view, fmt, budget_chars=budget, facts=FACTS, older=older)
        assert ctx.chars == real_size(ctx) <= budget
        assert_turns_contiguous(ctx, whole)
        body = body_of(ctx)
        facts = tuple(f for f in FACTS if f"- {f}" in body)
        notes = tuple(note for note in NOTES if f"- {note.render()}" in body)
        assert facts == FACTS[: len(facts)], budget  # in the order given
        assert notes == NOTES[len(NOTES) - len(notes) :], budget  # newest first
        if ctx.turns_shown == 0:
            assert ctx.chars == 0, budget  # nothing outranks the current turn
            continue
        first = min(ctx.turns_shown, 2)
        if ctx.turns_shown < 2:
            assert cost(ctx.turns_shown + 1, (), "", ()) > budget, budget
        if len(facts) < len(FACTS):
            assert cost(first, FACTS[: len(facts) + 1], "", ()) > budget, budget
        if ctx.summary != SUMMARY:
            assert cost(first, facts, SUMMARY, ()) > budget, budget
            # whole newest sentences; when not even one fits, a word-clipped tail marked "…"
            tail = ctx.summary.removeprefix("…")
            assert ctx.summary == "" or SUMMARY.endswith(" " + ctx.summary) or SUMMARY.endswith(tail), budget
        if len(notes) < len(NOTES):
            assert cost(first, facts, ctx.summary, NOTES[len(NOTES) - len(notes) - 1 :]) > budget, budget
        if 2 <= ctx.turns_shown < n:
            assert cost(ctx.turns_shown + 1, facts, ctx.summary, notes) > budget, budget
        if ctx.chars and body.endswith(view.turns[-1].text):  # the current turn is whole
            assert ctx.chars == cost(ctx.turns_shown, facts, ctx.summary, notes), budget
    exact = build_context(view, fmt, budget_chars=full.chars, facts=FACTS, older=older)
    assert (exact.chars, exact.dropped, exact.messages, exact.instructions) == (
        full.chars,
        (),
        full.messages,
        full.instructions,
    )


# -- the turns before the cursor -------------------------------------------------------


def shown_lines(ctx: Context) -> list[str]:
    """The verbatim turns an instructions context shows, oldest first."""
    section = ctx.instructions[ctx.instructions.index(RECENT_HEADER) :]
    return section.split("\n")[1:]


def test_turns_read_for_an_earlier_cursor_are_not_joined_across_the_gap() -> None:
    view = view_of(turns(5, 20), cursor=20, summary="", live_notes=())
    read_before_a_fold = TurnRun.of(0, turns(10))  # turns 0-9: the cursor was at 10 then

    ctx = build_context(view, "instructions", budget_chars=4000, older=read_before_a_fold)

    assert shown_lines(ctx) == [f"{t.speaker}: {t.text}" for t in turns(5, 20)]  # turns 20-24 only
    assert (ctx.first_turn, ctx.turns_shown) == (20, 5)


def test_older_turns_that_reach_past_the_cursor_are_cut_where_the_view_begins() -> None:
    view = view_of(turns(5, 20), cursor=20, summary="", live_notes=())
    overlapping = TurnRun.of(15, turns(8, 15))  # turns 15-22: 20-22 are the view's own

    ctx = build_context(view, "instructions", budget_chars=4000, older=overlapping)

    assert shown_lines(ctx) == [f"{t.speaker}: {t.text}" for t in turns(10, 15)]  # 15-24, each once
    assert (ctx.first_turn, ctx.turns_shown) == (15, 10)
