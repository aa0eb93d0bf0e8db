"""A long summary in a budgeted context: its priority share, the room older turns leave, and
how it shrinks (coarser with age, never past the budget)."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import replace

from helpers import build_folded, noted
from hypothesis import given, settings
from hypothesis import strategies as st

from voice_context.core.budget import Format, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.recalled import Recalled
from voice_context.core.session import ContextView, Session, TurnAppended
from voice_context.core.text import condense_summary, summary_before
from voice_context.core.times import stamp
from voice_context.core.turns import Note, Turn, TurnRun

LINES = [
    f"[{day} May 2023, 10:00] Alice: We booked {city} for {day} nights. Bob: The ferry leaves at {day} pm. "
    f"Alice: My cousin lives near the {city} harbour."
    for day, city in zip(
        range(1, 31), "Lisbon Porto Berlin Oslo Tahoe Lyon Quito Perth Dakar Hanoi".split() * 3, strict=True
    )
]
SUMMARY = "\n".join(LINES)

COUNTED_PRIORITY = {"recent_share": 0.0, "recent_floor": 0.0, "recall_share": 0.0, "summary_share": 1.0}
"""No protected share and no recency floor: the summary takes up to ``summary_priority_chars``
before the older turns."""


def conversation(n: int) -> tuple[Turn, ...]:
    return tuple(
        Turn("Alice" if i % 2 else "Bob", "user", f"turn number {i} of the call", float(i)) for i in range(n)
    )


def view(summary: str = SUMMARY, n: int = 40, **config: float) -> ContextView:
    return ContextView(
        100,
        summary,
        conversation(n),
        (),
        SessionConfig(max_summary_chars=20_000, **{**COUNTED_PRIORITY, **config}),
    )


def test_a_summary_longer_than_its_share_gives_way_to_older_turns_then_takes_the_room_left() -> None:
    everything = len(build_folded(view(), "instructions", budget_chars=100_000).instructions)
    turns_only = build_folded(view(summary=""), "instructions", budget_chars=100_000).chars

    # a budget that cannot hold every turn and the whole summary: the summary keeps its share,
    # the older turns (the summary covers them) take the rest
    tight = build_folded(view(summary_priority_chars=1000), "instructions", budget_chars=2000)
    assert len(tight.summary) <= 1000
    assert 0 < tight.turns_shown < 40
    assert tight.chars <= 2000
    assert "summary_head" in tight.dropped

    # room for every turn: the summary grows into whatever they leave
    roomy = build_folded(view(summary_priority_chars=1000), "instructions", budget_chars=turns_only + 3000)
    assert roomy.turns_shown == 40
    assert 2000 < len(roomy.summary) < len(SUMMARY)
    assert roomy.chars <= turns_only + 3000

    # room for everything: nothing is left out
    whole = build_folded(view(summary_priority_chars=1000), "instructions", budget_chars=everything)
    assert (whole.summary, whole.turns_shown, whole.dropped) == (SUMMARY, 40, ())


def test_without_a_budget_the_whole_summary_is_given() -> None:
    context = build_context(view(summary_priority_chars=1000), "messages")
    assert context.summary == SUMMARY
    assert context.turns_shown == 40


def test_a_shrunk_summary_keeps_every_time_window_it_can_coarser_with_age() -> None:
    short = condense_summary(SUMMARY, 3000)
    assert len(short) <= 3000
    kept = short.split("\n")
    assert len(kept) == len(LINES)  # every window is still there
    assert all(line.startswith(LINES[i].split("]")[0]) for i, line in enumerate(kept))  # heads intact
    assert kept[-1] == LINES[-1]  # the newest window keeps its detail
    assert len(kept[0]) < len(LINES[0])  # the oldest is coarser

    tiny = condense_summary(SUMMARY, 400).split("\n")
    assert tiny[-1].startswith(LINES[-1][:20])  # when lines must go, the newest stays
    assert len(tiny) < len(LINES)


def test_when_lines_must_go_small_talk_goes_before_an_older_fact() -> None:
    passport = "[1 May 2023, 10:00] Ana: My passport number is 4471 and it expires on 9 June."
    newest = "[4 May 2023, 10:00] Ben: Okay."
    summary = "\n".join(
        [
            passport,
            "[2 May 2023, 10:00] Ben: Haha that is so funny to me.",
            "[3 May 2023, 10:00] Ana: Sounds good to me.",
            newest,
        ]
    )
    assert condense_summary(summary, len(passport) + 1 + len(newest)).split("\n") == [passport, newest]


def test_a_shrunk_line_keeps_its_date_and_what_tells_most_in_the_order_it_was_said() -> None:
    line = (
        "[9 July 2023, 10:00] Jolene: That sounds so good to me! Susie moved to Lisbon on 3 July. "
        "Deborah: Wow, I love that for you. I started a running group with Anna."
    )
    assert condense_summary(line, 110) == (
        "[9 July 2023, 10:00] Jolene: Susie moved to Lisbon on 3 July. "
        "Deborah: I started a running group with Anna."
    )
    # the label of a sentence that goes passes to the next one: nobody is given another's words
    assert condense_summary(line, 70) == "[9 July 2023, 10:00] Jolene: Susie moved to Lisbon on 3 July."
    # and a label that would repeat the one before it goes with the sentence between them
    talk = "[9 July 2023, 10:00] Ann: We fly to Lisbon on 3 May with Rui. Bob: Wow ok. Ann: Porto on 5 May."
    assert condense_summary(talk, len(talk) - 5) == (
        "[9 July 2023, 10:00] Ann: We fly to Lisbon on 3 May with Rui. Porto on 5 May."
    )
    # and a cut too hard for the shortest sentence shows nothing rather than a fragment of it
    assert condense_summary(line, 40) == ""


def test_when_every_line_is_down_to_one_sentence_lines_of_one_conversation_share_a_head() -> None:
    summary = "\n".join(
        [
            "[8 May 2023, 10:00] Tom: The patch for Hollow Knight is 40 GB. Priya: Wow, that is big.",
            "[8 May 2023, 10:04] Priya: I set up the router in the garage.",
            "[8 May 2023, 10:09] Tom: We play the Porto map at 9.",
            "[8 May 2023, 15:00] Tom: The Porto server went down at 14:40.",
            "[9 May 2023, 10:00] Priya: I ordered 3 pizzas.",
        ]
    )
    expected = [
        "[8 May 2023, 10:00] Tom: The patch for Hollow Knight is 40 GB. "
        "Priya: I set up the router in the garage. Tom: We play the Porto map at 9.",
        "[8 May 2023, 15:00] Tom: The Porto server went down at 14:40.",  # hours later: another conversation
        "[9 May 2023, 10:00] Priya: I ordered 3 pizzas.",  # another day
    ]
    assert condense_summary(summary, len("\n".join(expected))).split("\n") == expected


def test_a_one_paragraph_summary_keeps_its_newest_sentences() -> None:
    text = "Alpha happened first. Beta came second. Gamma was third. Delta is newest."
    assert condense_summary(text, 40) == "Gamma was third. Delta is newest."


SENTENCE = st.sampled_from(["Alice: We booked Porto.", "Bob left at 9.", "A long day at the harbour!", "Ok."])
LINE = st.lists(SENTENCE, min_size=1, max_size=5).map(" ".join)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(LINE, min_size=1, max_size=12), limit=st.integers(0, 400))
def test_a_condensed_summary_never_exceeds_its_limit(lines: list[str], limit: int) -> None:
    text = "\n".join(lines)
    short = condense_summary(text, limit)
    assert len(short) <= limit
    if len(text) <= limit:
        assert short == text


@settings(max_examples=100, deadline=None)
@given(budget=st.integers(0, 6000), share=st.integers(40, 3000), n=st.integers(0, 40))
def test_no_context_exceeds_its_budget_whatever_the_share(budget: int, share: int, n: int) -> None:
    context = build_context(view(n=n, summary_priority_chars=share), "instructions", budget_chars=budget)
    assert context.chars == len(context.instructions) <= budget
    older = conversation(n)[n - context.turns_shown : n - 1]  # the current turn alone may be clipped
    assert "\n".join(f"{t.speaker}: {t.text}" for t in older) in context.instructions


# -- the recency floor: the summary and recall never crowd out the freshest turns --------------


def plain_tail(turns: tuple[Turn, ...], fmt: Format, budget: int) -> int:
    """How many of the newest turns a context of nothing but dated turns holds in ``budget``:
    what a bot that keeps the tail of its transcript, each line with when it was said, shows."""
    dated = tuple(replace(t, speaker=f"[{stamp(t.at)}] {t.speaker}") for t in turns)
    count = 0
    while count < len(turns):
        alone = ContextView(0, "", dated[len(turns) - count - 1 :], (), SessionConfig())
        if build_context(alone, fmt, budget_chars=10**9).chars > budget:
            break
        count += 1
    return count


def recalled(n: int) -> list[Recalled]:
    return [
        Recalled("turn", k, f"[{k % 28 + 1} May 2023, 10:00] Alice: we booked the ferry for {k} pm", 1.0)
        for k in range(n)
    ]


def test_a_long_summary_and_recall_take_only_what_the_floor_leaves_them() -> None:
    talk = tuple(
        Turn("Alice" if i % 2 else "Bob", "user", f"turn {i}: " + "so we were saying " * (i % 5), float(i))
        for i in range(60)
    )
    default = ContextView(100, SUMMARY, talk, (), SessionConfig(max_summary_chars=20_000))
    ctx = build_folded(default, "instructions", budget_chars=4000, recalled=recalled(20), query="ferry")
    tail = plain_tail(talk, "instructions", 4000)
    assert ctx.turns_shown >= math.ceil(0.9 * tail)
    assert ctx.recalled and ctx.summary  # both still get the room the floor leaves
    assert ctx.chars <= 4000

    no_floor = ContextView(100, SUMMARY, talk, (), SessionConfig(max_summary_chars=20_000, recent_floor=0.0))
    crowded = build_folded(no_floor, "instructions", budget_chars=4000, recalled=recalled(20), query="ferry")
    assert crowded.turns_shown < ctx.turns_shown  # the shares alone let them crowd the turns out


@settings(max_examples=60, deadline=None)
@given(
    budget=st.integers(min_value=100, max_value=6000),
    lengths=st.lists(st.integers(min_value=1, max_value=300), min_size=1, max_size=80),
    fmt=st.sampled_from(["instructions", "messages"]),
    floor=st.sampled_from([0.5, 0.9, 1.0]),
)
def test_the_newest_turns_shown_are_never_fewer_than_the_floor_of_a_plain_tail(
    budget: int, lengths: list[int], fmt: Format, floor: float
) -> None:
    talk = tuple(
        Turn("Alice" if i % 2 else "Bob", "user", ("x" * size)[:size], float(i))
        for i, size in enumerate(lengths)
    )
    config = SessionConfig(max_summary_chars=20_000, recent_floor=floor)
    ctx = build_context(
        ContextView(100, SUMMARY, talk, (), config),
        fmt,
        budget_chars=budget,
        recalled=recalled(12),
        query="x",
    )
    assert ctx.chars <= budget
    assert ctx.turns_shown >= math.ceil(floor * plain_tail(talk, fmt, budget))


def test_the_floor_counts_every_screen_note_a_plain_tail_shows_not_only_the_live_ones() -> None:
    # a call with a screen note every third turn: the live buffer holds 8 of them, but a plain
    # tail of the transcript shows every note seen among its turns, and takes their room
    hungry = SessionConfig(
        max_summary_chars=20_000, recall_limit=60, recent_share=0.3, recall_share=0.7, summary_share=0.0
    )
    session = Session("stream", hungry)  # recall would take everything the floor leaves
    transcript: list[str] = []
    for i in range(60):
        turn = Turn("Alice" if i % 2 else "Bob", "user", f"turn {i}: " + "we were saying " * 3, float(i))
        session.receive(TurnAppended(turn))
        transcript.append(f"[{stamp(turn.at)}] {turn.speaker}: {turn.text}")
        if i % 3 == 0:
            seen = f"the map shows the harbour from the north side, frame {i}"
            note = Note(seen, float(i), "Alice", "screen")
            noted(session, note)
            transcript.append(note.render())
    assert len(session.live_notes) == 8 and len(session.view().seen_notes) == 20

    budget = 3500
    ctx = build_folded(session.view(), "instructions", budget_chars=budget, recalled=recalled(60), query="x")
    tail_turns = 0  # the newest lines of the transcript that fit, counting only turns
    size = len("Recent conversation:")
    for line in reversed(transcript):
        size += len(line) + 1
        if size > budget:
            break
        tail_turns += not line.startswith("Alice's screen")
    assert ctx.turns_shown >= math.ceil(0.9 * tail_turns)
    assert len(ctx.recalled) > 0 and ctx.chars <= budget
    # counted with its live notes alone, the tail looks longer: the floor would keep more turns
    # than 0.9 of what the transcript's tail shows, and give recall less
    live_only = ContextView(0, "", session.verbatim_turns, session.live_notes, hungry)
    overcounted = build_folded(
        live_only, "instructions", budget_chars=budget, recalled=recalled(60), query="x"
    )
    assert overcounted.turns_shown > ctx.turns_shown
    assert len(overcounted.recalled) < len(ctx.recalled)


def test_without_a_query_the_summary_takes_the_room_an_asked_query_gives_recall() -> None:
    # a query asked for: recall_share (0.25) before the summary's summary_share (0.05); the newest
    # user turn as the query: default_recall_share (0.1) before default_summary_share (0.2)
    config = SessionConfig(max_summary_chars=20_000, recent_floor=0.0, recent_share=0.5)
    seen = ContextView(100, SUMMARY, conversation(200), (), config)
    found = [
        Recalled(
            "turn",
            k,
            f"[{k} April 2023, 09:00] Bob: the harbour ferry ticket number {k} is in my bag",
            9.0 - k,
        )
        for k in range(1, 9)
    ]

    asked = build_folded(seen, "instructions", budget_chars=4000, recalled=found, query="ferry ticket")
    default = build_folded(
        seen, "instructions", budget_chars=4000, recalled=found, query="ferry ticket", asked=False
    )

    assert len(default.recalled) < len(asked.recalled) == 8
    assert len(default.summary) > len(asked.summary) + 100
    assert asked.chars <= 4000 and default.chars <= 4000


def test_a_small_recall_share_still_holds_one_passage() -> None:
    # the section's header is paid from the budget, not from recall's share
    config = SessionConfig(max_summary_chars=20_000)
    seen = ContextView(100, "", conversation(60), (), config)
    locker = Recalled("turn", 3, "[2 May 2023, 10:00] Ana: My gym locker code is 4417.", 5.0)

    ctx = build_folded(seen, "instructions", budget_chars=1500, recalled=[locker], asked=False)

    assert [r.turn for r in ctx.recalled] == [3]  # 0.1 of 1,500 chars: 150, less than header and line
    assert "locker code is 4417" in ctx.instructions


def test_a_thousand_sessions_summaries_are_each_cut_once_between_two_folds() -> None:
    # every live session condenses its own summary for each of its contexts; a cache sized for
    # one session (the last 256 cuts) made each context of many sessions cut its summary again
    summaries = [SUMMARY.replace("Alice", f"Alice{k}") for k in range(1000)]
    first = [(condense_summary(s, 3000), condense_summary(s, 2048)) for s in summaries]
    again = [(condense_summary(s, 3000), condense_summary(s, 2048)) for s in summaries]
    assert all(a is b and c is d for (a, c), (b, d) in zip(first, again, strict=True))
    assert all(len(a) <= 3000 and len(c) <= 2048 for a, c in first)


SAID = [
    "We booked Lisbon for three nights.",
    "Thanks!",
    "The ferry leaves at 5 pm.",
    "My cousin lives near the harbour and works at the fish market on weekends.",
    "Bob adopted a dog named Rex last spring.",
    "That sounds great, really great.",
    "The budget is 4,968 euros.",
    "Alice starts her new job at the hospital on Monday.",
]
ONE_DAY_AT_A_TIME = "\n".join(  # a few lines a day, minutes apart: lines that join as they shrink
    f"[{1 + i // 4} May 2023, {10 + i % 4}:{5 * (i % 3):02d}] "
    + " ".join(
        f"{('Alice', 'Bob')[(i + k) % 2]}: {SAID[(3 * i + 5 * k) % len(SAID)]}" for k in range(i % 4 + 1)
    )
    for i in range(16)
)


def test_what_a_context_shows_of_the_summary_is_the_summary_cut_once() -> None:
    """The summary's share cuts it, then the room left may cut it shorter. What the context
    shows is the summary's own cut to that length, as a context with just that room gets it:
    never a cut of the cut, which would weigh what survived the first cut as a summary of its
    own (its lines join under other heads, other sentences go)."""
    config = SessionConfig(max_summary_chars=20_000, summary_priority_chars=1000)
    for n in (20, 40):
        shown = ContextView(100, ONE_DAY_AT_A_TIME, conversation(n), (), config)
        for budget in range(1000, 1500, 10):
            summary = build_context(shown, "instructions", budget_chars=budget).summary
            assert summary == condense_summary(ONE_DAY_AT_A_TIME, len(summary)), budget


# -- what the verbatim turns show, the summary does not say again -----------------------------


def at(day: int, hour: int = 10) -> float:
    return dt.datetime(2023, 5, day, hour, tzinfo=dt.UTC).timestamp()


def test_a_summary_line_whose_whole_time_the_verbatim_turns_show_is_not_shown_twice() -> None:
    summary = "\n".join(
        [
            "[1 May 2023, 10:00] Alice: We booked Lisbon.",
            "[2 May 2023, 10:00] Bob: The ferry leaves at 9.",
            "[3 May 2023, 10:00] Alice: My cousin lives near the harbour.",
        ]
    )
    # a fold came soon after the 3 May talk (turns 40-45): the summary tells of it, and a context
    # with room still shows those turns
    talk = [Turn("Alice", "user", f"line {k} of the 3 May talk", at(3) + 60 * k) for k in range(7)]
    view = ContextView(46, summary, (talk[-1],), (), SessionConfig(recent_floor=0.0, recent_share=0.0))
    folded = TurnRun.of(40, talk[:-1])
    ctx = build_context(view, "instructions", budget_chars=4000, older=folded)
    assert ctx.first_turn == 40 and ctx.summary == "\n".join(summary.split("\n")[:2])

    # when the turns the context protects start after the first of them, the line tells of one
    # they do not show: it stays
    fewer = replace(view, config=replace(view.config, priority_turns=6))
    ctx = build_context(fewer, "instructions", budget_chars=4000, older=folded)
    assert "near the harbour" in ctx.summary


def test_only_the_newest_lines_dated_within_the_verbatim_turns_time_are_left_out() -> None:
    lines = ["[1 May 2023, 10:00] A: one.", "[2 May 2023, 10:00] B: two.", "[3 May 2023, 10:00] C: three."]
    summary = "\n".join(lines)
    assert summary_before(summary, at(2), at(9)) == lines[0]
    assert summary_before(summary, at(2) + 1, at(9)) == "\n".join(lines[:2]), "a minute's head is its start"
    assert summary_before(summary, at(1), at(2, 9)) == summary, "dated after the newest turn: not told twice"
    assert summary_before("[31 February 2023, 10:00] X: a day no calendar has.", 0, 1e12).startswith("[31")
    assert summary_before("A paragraph with no dates.", 0, 1e12) == "A paragraph with no dates."


def test_when_the_floor_leaves_less_than_both_shares_recall_and_the_summary_split_it_by_them() -> None:
    # no query: the newest user turn is the query, recall's share is 0.1 and the summary's 0.4;
    # the recency floor leaves less than both, and recall, laid out first, took it all
    config = SessionConfig(max_summary_chars=20_000)
    seen = ContextView(100, SUMMARY, conversation(60), (), config)
    offered = recalled(30)
    ctx = build_folded(seen, "instructions", budget_chars=3000, recalled=offered, asked=False)
    by = {s.name: s.chars for s in ctx.sections}
    left = by["recall"] + by["summary"]
    assert ctx.recalled and ctx.summary
    assert by["recall"] <= 0.1 / (0.1 + 0.4) * left + 80, by  # its part, and a passage's overshoot at most
    # asked, recall's share (0.45) and the summary's (0) give recall all of it
    asked = build_folded(seen, "instructions", budget_chars=3000, recalled=offered, query="ferry")
    assert {s.name: s.chars for s in asked.sections}["summary"] == 0
