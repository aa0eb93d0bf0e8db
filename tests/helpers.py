"""Small builders shared by the tests: turns, notes, event stories told to a session, a clock the
test moves, timeouts, a recall search read the long way."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import anyio

from voice_context.core.budget import Context, Format, build_context
from voice_context.core.session import (
    Applied,
    CommitCompaction,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    ContextView,
    Effect,
    Event,
    NoteReceived,
    NotesChanged,
    NotesStored,
    PersistNotes,
    Session,
    Skip,
    StartCompaction,
    SummaryReturned,
)
from voice_context.core.turns import Note, Role, Turn, TurnRun
from voice_context.core.window import FillBudget
from voice_context.store.base import ChooseTerms, PickPassages, RecallSearch, Store

#: Every guard against a hang is a multiple of this; slow machines raise the scale.
ROOT = Path(__file__).resolve().parent.parent
"""The checkout: ``fixtures/``, ``docs/``, ``scripts/``, ``examples/`` and ``tests/`` itself."""

TIMEOUT_SCALE = float(os.environ.get("VOICE_CONTEXT_TEST_TIMEOUT_SCALE", "1"))
TIMEOUT = 5.0 * TIMEOUT_SCALE

SPEAKERS = ("Alice", "Bob")


def turn(index: int, *, speaker: str | None = None, role: Role = "user", at: float | None = None) -> Turn:
    """The turn a test appends at transcript ``index``: its text names its index."""
    who = speaker if speaker is not None else SPEAKERS[index % len(SPEAKERS)]
    return Turn(who, role, f"turn {index}", float(index) if at is None else at)


def turns(n: int, start_at: int = 0, *, speakers: Sequence[str] = SPEAKERS, t0: float = 0.0) -> list[Turn]:
    """``n`` turns for indices ``start_at .. start_at+n-1``, spoken one second apart from ``t0``."""
    return [
        Turn(speakers[i % len(speakers)], "user", f"turn {i}", t0 + float(i))
        for i in range(start_at, start_at + n)
    ]


def notes(n: int, start_at: int = 0, *, width: int = 0) -> list[Note]:
    """``n`` screen notes; ``width`` pads each note's text to that many chars."""
    out = []
    for i in range(start_at, start_at + n):
        text = f"note {i}"
        out.append(Note(text.ljust(width, "~") if width else text, float(i)))
    return out


# -- event stories: a session is told what happened, and answers with effects ---------------------


def given(session: Session, *events: Event) -> list[Effect]:
    """Feed ``events`` to the session in order; returns every effect that came back, in order."""
    return [effect for event in events for effect in session.receive(event)]


def started(session: Session, at: float, budget: FillBudget | None = None) -> CompactionPlan:
    """A context is asked at ``at``: the plan whose compaction that starts."""
    [effect] = session.receive(ContextRequested(at, budget))
    assert isinstance(effect, StartCompaction), effect
    return effect.plan


def skipped(session: Session, at: float, budget: FillBudget | None = None) -> Skip:
    """A context is asked at ``at``: why no compaction starts."""
    [effect] = session.receive(ContextRequested(at, budget))
    assert isinstance(effect, Skip), effect
    return effect


def summarized(session: Session, plan_id: int, text: str, at: float) -> Effect:
    """The summarizer answers ``text`` for ``plan_id`` at ``at``, and a commit is stored at once,
    as a shell without a store confirms it: the one effect the answer comes to (``Applied``,
    ``Failed``, ``Stale``, or ``StartCompaction`` for a re-compaction pass). A fold that lands
    may start the next one (a backlog left): that one is then in flight."""
    [effect] = session.receive(SummaryReturned(plan_id, text, at))
    if isinstance(effect, CommitCompaction):
        effect, *_ = session.receive(CompactionStored(plan_id, at))
    return effect


def landed(session: Session, plan_id: int, text: str, at: float) -> Applied:
    """The summarizer answers ``text`` for ``plan_id``, and the store commits it: what landed."""
    effect = summarized(session, plan_id, text, at)
    assert isinstance(effect, Applied), effect
    return effect


def folded(view: ContextView, unfolded: int = 2) -> tuple[ContextView, TurnRun]:
    """The same conversation with all but its newest ``unfolded`` turns folded: the summary covers
    them and the store keeps them, so a context shows them only as its budget has room (the turns
    from the cursor on come before recall and the summary). Its view, and those older turns."""
    keep = min(unfolded, len(view.turns))
    cut = len(view.turns) - keep
    older = TurnRun.of(view.cursor, view.turns[:cut])
    return replace(view, cursor=view.cursor + cut, turns=view.turns[cut:]), older


def build_folded(view: ContextView, format: Format, unfolded: int = 2, **options: Any) -> Context:
    """:func:`build_context` for ``view`` with all but its newest ``unfolded`` turns folded
    (see :func:`folded`)."""
    shown, older = folded(view, unfolded)
    return build_context(shown, format, older=older, **options)


def noted(session: Session, note: Note) -> NotesChanged:
    """A screen note arrives and the store holds the buffers at once: what it did to them."""
    [persist] = session.receive(NoteReceived(note))
    assert isinstance(persist, PersistNotes), persist
    assert session.receive(NotesStored(persist.staged)) == []
    return persist.changed


class ManualClock:
    """A clock the test moves by hand: pass ``clock`` where a ``() -> float`` is wanted."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


async def wait_until(predicate: Callable[[], bool], *, within: float = TIMEOUT) -> None:
    """Yield to the event loop until ``predicate()`` is true, failing after ``within`` seconds.

    For state that has no event to wait on (a counter, a flag on a fake).
    """
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polls plain attributes, not an event
            await anyio.sleep(0.001)


Picked = TypeVar("Picked")


async def read_twice(
    store: Store, name: str, terms: Sequence[str], choose: ChooseTerms, pick: PickPassages[Picked]
) -> RecallSearch[Picked]:
    """What ``store.recall_search`` should return, read the long way: the postings, then the
    passages ``pick`` asks for, in two reads (as a search read them before it was one read)."""
    stats, df, postings = await store.recall_postings(name, terms, choose)
    picked, keys = pick(stats, df, postings)
    return RecallSearch(stats, df, postings, picked, await store.recall_passages(name, keys))
