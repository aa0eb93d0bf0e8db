"""Landmarks: turns that are never paraphrased, found by heuristics or pinned, shown whole."""

from __future__ import annotations

from contextlib import aclosing
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import started, summarized
from hypothesis import given, settings
from hypothesis import strategies as st
from serving import T0, running, wire

from voice_context.core.budget import LANDMARKS_HEADER, Format, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.landmarks import Landmark, detect, render
from voice_context.core.session import (
    Applied,
    CompactionAbandoned,
    ContextRequested,
    PinRequested,
    RecallAhead,
    Session,
    StartCompaction,
    StoreLandmark,
    TurnAppended,
    TurnHeld,
    Unpinned,
    UnpinRequested,
)
from voice_context.core.tokens import CharEstimate
from voice_context.core.turns import Turn
from voice_context.manager import SessionManager
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer

CODE_20 = "Here it is:\n```python\n" + "".join(f"x{i} = {i}\n" for i in range(20)) + "```"
CODE_19 = "Here it is:\n```python\n" + "".join(f"x{i} = {i}\n" for i in range(19)) + "```"

# -- the heuristics: positives and near-misses --------------------------------------------------


@pytest.mark.parametrize(
    "text, kind",
    [
        ("Decision: we ship on Friday.", "decision"),
        ("ok so DECISION: Lisbon, not Porto", "decision"),
        ("spec: the endpoint takes a session and an index", "spec"),
        ("(spec: v2) is final", "spec"),
        (CODE_20, "code"),
        ("~~~\n" + "line\n" * 25 + "~~~", "code"),
        ("@bob please ship it today", "action_item"),
        ("@ana fix this before the demo", "action_item"),
        ("@lee can you review the PR?", "action_item"),
        ("@ops_team, deploy the hotfix", "action_item"),
        ("See https://example.org/specs/voice-v2 for details", "link"),
        ("the design doc: https://github.com/acme/app/blob/main/docs/design.md.", "link"),
        ("https://docs.google.com/document/d/1AbC/edit", "link"),
        ("RFC at https://example.org/rfc/0042", "link"),
    ],
)
def test_each_heuristic_finds_its_landmark(text: str, kind: str) -> None:
    found = detect(text)
    assert found is not None and found.kind == kind, found


@pytest.mark.parametrize(
    "text",
    [
        "We made a decision yesterday.",  # the word, not the label
        "The spec is long, we should read it.",
        "specification: see below",  # another word that starts like it
        CODE_19,  # one line short of a long code block
        "```\nprint(1)\n```",
        "please ship it today",  # an imperative, but nobody is asked
        "@bob thanks, that was great",  # a mention, but nothing asked
        "@bob I fixed this already",  # a verb in the past
        "write to bob@example.com please ship the parcel",  # an e-mail address is not a mention
        "see https://www.youtube.com/watch?v=abc",  # a link, but not to a spec
        "https://example.org/respect/inspection",  # "spec" inside other words
        "Just chatting about the weather.",
    ],
)
def test_near_misses_are_not_landmarks(text: str) -> None:
    assert detect(text) is None


# -- the session: found as turns arrive, never folded ----------------------------------------------


def said(i: int, text: str, speaker: str = "Alice") -> Turn:
    return Turn(speaker, "user", text, T0 + 60 * i)


def test_a_landmark_is_found_as_it_arrives_and_left_out_of_every_fold() -> None:
    session = Session("s", SessionConfig(recent_window=2, batch_size=3))
    first = said(0, "We could fly on Friday.")
    assert session.receive(TurnAppended(first)) == [TurnHeld(0, None), RecallAhead(0, first)]
    held, _, store = session.receive(TurnAppended(said(1, "Decision: we fly on Friday at 9:40.", "Bob")))
    assert isinstance(held, TurnHeld) and held.landmark is not None
    assert store == StoreLandmark(held.landmark), "for the shell to store"
    assert (held.index, held.landmark.kind, held.landmark.source) == (1, "decision", "heuristic")
    assert session.landmark(1) == held.landmark
    session.receive(TurnAppended(said(2, "Fine by me.")))
    for i in range(3, 6):
        session.receive(TurnAppended(said(i, f"Point {i} of the packing list.")))
    plan = started(session, T0 + 600)
    assert (plan.start, plan.end) == (0, 3)
    assert [t.text for t in plan.turns] == ["We could fly on Friday.", "Fine by me."]
    assert plan.landmarks == 1


def test_a_turn_pinned_by_hand_is_left_out_of_every_fold_until_it_is_unpinned() -> None:
    session = Session("s", SessionConfig(recent_window=2, batch_size=3))
    for i in range(6):
        session.receive(TurnAppended(said(i, f"Point {i} of the packing list.")))
    pin = Landmark(1, said(1, "Point 1 of the packing list."), "spec", "the list", "manual", T0 + 400)
    assert session.receive(PinRequested(pin)) == []
    assert session.landmark(1) == pin
    with pytest.raises(IndexError):
        session.receive(PinRequested(replace(pin, index=6)))
    plan = started(session, T0 + 600)
    assert (plan.start, plan.end, plan.landmarks) == (0, 3, 1)
    assert [t.text for t in plan.turns] == ["Point 0 of the packing list.", "Point 2 of the packing list."]
    session.receive(CompactionAbandoned(plan.plan_id, T0 + 610))

    assert session.receive(UnpinRequested(1, T0 + 620)) == [Unpinned(pin)]
    assert session.receive(UnpinRequested(1, T0 + 620)) == [], "nothing left to unpin"
    again = started(session, T0 + 630)
    assert (again.landmarks, len(again.turns)) == (0, 3)


def test_a_batch_of_landmarks_alone_lands_and_leaves_the_summary_as_it_was() -> None:
    session = Session(
        "s", SessionConfig(recent_window=1, batch_size=1), summary="[1 May 2024, 14:03] Ann: Hi."
    )
    for i, text in enumerate(("Decision: Lisbon.", "ok", "sure")):
        session.receive(TurnAppended(said(i, text)))
    plan = started(session, T0)
    assert plan.turns == () and plan.landmarks == 1
    outcome = summarized(session, plan.plan_id, "", T0 + 1)
    assert isinstance(outcome, Applied) and session.cursor == 1
    assert session.summary == "[1 May 2024, 14:03] Ann: Hi."


# -- contexts: verbatim, dated, attributed, within the budget ----------------------------------------


LONG_TURNS = [
    said(i, f"Item {i}: we compare the options for the trip in some detail here.") for i in range(30)
]


def view_with(landmarks: list[Landmark], *, cursor: int = 40) -> Session:
    session = Session("s", SessionConfig(), cursor=cursor, turns=LONG_TURNS, landmarks=landmarks)
    return session


def pinned(i: int, text: str) -> Landmark:
    return Landmark(i, said(i, text, "Bob"), "decision", "says decision:", "manual", T0)


def test_a_landmark_long_folded_is_shown_word_for_word_dated_and_attributed() -> None:
    lm = pinned(3, "Decision: the budget is 4,200 euros, no more.")
    ctx = build_context(view_with([lm]).view(), "instructions", budget_chars=1200)
    assert ctx.landmarks == (lm,)
    assert (
        f"{LANDMARKS_HEADER}\n- [1 May 2024, 14:06] Bob: Decision: the budget is 4,200 euros, no more."
        in (ctx.instructions)
    )
    assert ctx.chars <= 1200


def test_a_landmark_shown_among_the_verbatim_turns_is_not_repeated() -> None:
    lm = Landmark(45, LONG_TURNS[5], "other", "", "manual", T0)
    ctx = build_context(view_with([lm]).view(), "messages", budget_chars=100_000)
    assert ctx.landmarks == ()
    assert sum(LONG_TURNS[5].text in m["content"] for m in ctx.messages) == 1


def test_when_landmarks_alone_exceed_the_budget_the_newest_that_fit_are_shown_whole() -> None:
    many = [pinned(i, f"Decision {i}: " + "a clause we must keep exactly. " * 4) for i in range(10)]
    ctx = build_context(view_with(many).view(), "instructions", budget_chars=600)
    assert ctx.chars <= 600
    assert ctx.landmarks and "landmarks" in ctx.dropped
    assert [lm.index for lm in ctx.landmarks] == sorted(lm.index for lm in ctx.landmarks)
    assert ctx.landmarks[-1].index == 9, "the newest first"
    for lm in ctx.landmarks:
        assert render(lm) in ctx.instructions, "never cut"


@settings(max_examples=120, deadline=None)
@given(
    texts=st.lists(
        st.sampled_from(
            [
                "Decision: we fly at 9:40.",
                "spec: two seats, one bag each.",
                "@bob please book it",
                "We might go to Porto.",
                "ok",
                "The hotel is near the river, with a view.",
            ]
        ),
        min_size=1,
        max_size=40,
    ),
    budget=st.integers(0, 2000),
    fmt=st.sampled_from(["instructions", "messages"]),
    tokens=st.booleans(),
)
def test_no_landmark_is_ever_altered_or_folded_and_no_budget_exceeded(
    texts: list[str], budget: int, fmt: Format, tokens: bool
) -> None:
    folder = DeterministicSummarizer()
    session = Session("prop", SessionConfig(recent_window=3, batch_size=2))
    sent: list[str] = []
    for i, text in enumerate(texts):
        session.receive(TurnAppended(said(i, text, ("Alice", "Bob")[i % 2])))
        [effect] = session.receive(ContextRequested(T0 + 60 * i))
        while isinstance(effect, StartCompaction):  # a fold, then any re-compaction pass
            plan = effect.plan
            sent.extend(t.text for t in plan.turns)
            effect = summarized(session, plan.plan_id, folder.summarize_now(SummaryRequest.for_plan(plan)), 0)
        counter = CharEstimate()
        ctx = build_context(
            session.view(),
            fmt,
            budget_chars=None if tokens else budget,
            budget_tokens=budget // 3 if tokens else None,
            tokens=counter if tokens else None,
        )
        text_out = (
            ctx.instructions if fmt == "instructions" else "\n".join(m["content"] for m in ctx.messages)
        )
        for lm in ctx.landmarks:
            assert render(lm) in text_out
            assert lm.turn == session.landmark(lm.index).turn  # type: ignore[union-attr]
        if tokens:
            assert ctx.tokens is not None and ctx.tokens <= budget // 3
        else:
            assert ctx.chars <= budget
    landmark_texts = {lm.turn.text for lm in session.landmarks}
    assert not landmark_texts & set(sent), "a landmark was sent to the summarizer"


# -- restarts and replicas ------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_pins_survive_a_restart_and_are_seen_by_another_replica(tmp_path: Path) -> None:
    path = tmp_path / "vc.db"
    async with (
        aclosing(SQLiteStore(path)) as store,
        SessionManager(DeterministicSummarizer(), store=store) as first,
    ):
        await first.open("room")
        await first.append_turn("room", said(0, "We land at 10:55."))
        await first.append_turn("room", said(1, "Decision: we take the 9:40."))
        pinned_by_hand = await first.pin("room", 0, kind="spec", reason="the arrival time")
        assert pinned_by_hand.source == "manual"
        async with (
            aclosing(SQLiteStore(path)) as other,
            SessionManager(DeterministicSummarizer(), store=other) as replica,
        ):
            await replica.open("room")
            kept = replica.session("room").landmarks
            assert [(lm.index, lm.kind, lm.source) for lm in kept] == [
                (0, "spec", "manual"),
                (1, "decision", "heuristic"),
            ]
        assert await first.unpin("room", 1) is True
    async with (
        aclosing(SQLiteStore(path)) as store,
        SessionManager(DeterministicSummarizer(), store=store) as restarted,
    ):
        await restarted.open("room")
        assert [lm.index for lm in restarted.session("room").landmarks] == [0], "the unpin lasts"


# -- over the wire ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_landmark_pin_and_unpin_over_a_real_server() -> None:
    async with running() as server, wire(server) as bot:
        await bot.open("room-1", config={"recent_window": 2, "batch_size": 1})
        first = await bot.append("room-1", 0, text="Let's book Lisbon for May 3rd, flying out of Porto.")
        assert "landmark" not in first
        decided = await bot.append("room-1", 1, text="Decision: we take the 9:40 flight on May 3rd.")
        assert decided["landmark"] == {"kind": "decision", "reason": "says decision:", "source": "heuristic"}

        pin = await bot.request("landmark.pin", session="room-1", index=0, kind="spec", reason="the trip")
        assert pin["type"] == "landmark.pinned"
        assert (pin["landmark"]["index"], pin["landmark"]["source"]) == (0, "manual")
        assert pin["landmark"]["text"] == "Let's book Lisbon for May 3rd, flying out of Porto."
        state = await bot.request("session.state", session="room-1")
        assert state["landmarks"] == 2

        for i in range(2, 8):
            await bot.append("room-1", i, text=f"Item {i}: some more detail on the plan for the trip. " * 2)
        ctx = await bot.request("context.get", session="room-1", format="instructions", budget_chars=800)
        assert ctx["first_turn"] > 1 and ctx["chars"] <= 800
        assert [lm["turn"] for lm in ctx["landmarks"]] == [0, 1]
        assert "Alice: Let's book Lisbon for May 3rd, flying out of Porto." in ctx["instructions"]

        unpinned = await bot.request("landmark.unpin", session="room-1", index=0)
        assert (unpinned["type"], unpinned["removed"]) == ("landmark.unpinned", True)
        again = await bot.request("landmark.unpin", session="room-1", index=0)
        assert again["removed"] is False

        for bad in ({"index": 99}, {"index": -1}, {"index": "0"}, {"index": 0, "source": "heuristic"}):
            refused = await bot.request("landmark.pin", session="room-1", **bad)
            assert (refused["type"], refused["code"]) == ("error", "bad_request"), refused
