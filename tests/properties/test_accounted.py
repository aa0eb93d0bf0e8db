"""Every turn accounted for: in every context, each turn is covered by the summary or shown.

The design's promise is that nothing falls between the two layers: the turns before the cursor
are the summary's, and each turn from the cursor on is shown (verbatim, or recalled whole). These
stories drive the pure core as the server does (a context built from the session, then the
trigger weighing what it measured, the fold landing before the next context or one context
later) over random transcripts, budgets (chars, tokens or both), base instructions, queries,
speakers and dates, whose written length moves what a dated tail holds.
"""

from __future__ import annotations

import datetime as dt

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from voice_context.core.budget import Context, Format, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.session import (
    Applied,
    CommitCompaction,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    NoteReceived,
    NotesStored,
    PersistNotes,
    Session,
    StartCompaction,
    SummaryReturned,
    TurnAppended,
)
from voice_context.core.tokens import TokenCounter
from voice_context.core.turns import Note, Turn, TurnRun
from voice_context.recall.index import RecallIndex, recall_candidates
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.tokenizers import load_tokenizer

SUMMARIZER = DeterministicSummarizer()
WORDS = (
    "harbour harbor lisbon porto ferry tickets passport museum tram dinner friday budget train "
    "hotel sister concert guitar painting garden marathon recipe library visa flight noon "
    "we should book the early one maybe I think that sounds good how about tomorrow instead"
).split()
SPEAKERS = ("Al", "Bea", "Christopher", "Maximiliana", "Jo", "Nova")
#: 1 January 2020 .. 31 December 2027: day and month names of every length, one- and two-digit days
FIRST_DAY = dt.datetime(2020, 1, 1, tzinfo=dt.UTC).timestamp()
SPAN = 8 * 365 * 86_400


def missing_turns(ctx: Context, total: int) -> list[int]:
    """The turns from the context's cursor on that it shows nowhere: not verbatim, not recalled whole."""
    recalled = {p.turn for p in ctx.recalled if p.kind == "turn" and p.granularity == "turn"}
    return [i for i in range(ctx.cursor, min(ctx.first_turn, total)) if i not in recalled]


def land(session: Session, plan: CompactionPlan, at: float) -> list[CompactionPlan]:
    """The deterministic summarizer answers the plan and the store commits it (a re-compaction
    pass, when the answer is too long, is answered the same way); the next fold it starts."""
    while True:
        text = SUMMARIZER.summarize_now(SummaryRequest.for_plan(plan))
        [effect] = session.receive(SummaryReturned(plan.plan_id, text, at))
        if isinstance(effect, StartCompaction):
            plan = effect.plan
            continue
        assert isinstance(effect, CommitCompaction), effect
        applied, *onward = session.receive(CompactionStored(plan.plan_id, at))
        assert isinstance(applied, Applied)
        return [effect.plan for effect in onward if isinstance(effect, StartCompaction)]


class Bot:
    """A bot streaming one conversation into a pure session and asking for its context under one
    budget, as a server would serve it: recall over every turn, the store's folded turns behind
    the cursor, the trigger weighing each context once it is built."""

    def __init__(
        self,
        *,
        budget_chars: int | None,
        budget_tokens: int | None,
        counter: TokenCounter | None,
        base: str,
        format: Format,
        lag: int,
    ) -> None:
        self.session = Session("story", SessionConfig(max_summary_chars=600))
        self.index = RecallIndex()
        self.said: list[Turn] = []
        self.budget_chars, self.budget_tokens, self.counter = budget_chars, budget_tokens, counter
        self.base, self.format, self.lag = base, format, lag
        self.waiting: list[tuple[int, CompactionPlan]] = []  # folds in flight, and when they land
        self.contexts = 0

    def say(self, turn: Turn) -> None:
        for effect in self.session.receive(TurnAppended(turn)):
            if isinstance(effect, StartCompaction):  # a backlog folds from the append itself
                self.waiting.append((self.contexts + 1 + self.lag, effect.plan))
        self.index.add_turn(len(self.said), turn)
        self.said.append(turn)

    def show(self, note: Note) -> None:
        [persist] = self.session.receive(NoteReceived(note))
        assert isinstance(persist, PersistNotes)
        self.session.receive(NotesStored(persist.staged))

    def ask(self, query: str | None) -> Context:
        session = self.session
        for due, plan in list(self.waiting):  # the folds that land before this context
            if due <= self.contexts:
                onward = land(session, plan, self.said[-1].at)
                self.waiting.remove((due, plan))
                self.waiting.extend((self.contexts + 1 + self.lag, later) for later in onward)
        text, found = recall_candidates(self.index, session, query)
        ctx = build_context(
            session.view(),
            self.format,
            budget_chars=self.budget_chars,
            budget_tokens=self.budget_tokens,
            tokens=self.counter if self.budget_tokens is not None else None,
            base_instructions=self.base,
            recalled=found,
            query=text,
            older=TurnRun.of(0, self.said[: session.cursor]),
            asked=query is not None,
        )
        [decision] = session.receive(ContextRequested(self.said[-1].at, ctx.fill))
        if isinstance(decision, StartCompaction):
            self.waiting.append((self.contexts + 1 + self.lag, decision.plan))
        self.contexts += 1
        return ctx


words = st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(" ".join)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[dict[str, object], list[tuple[Turn, bool, str | None, str]]]:
    """A bot's settings, and what happens: each turn, whether a context follows it (a bot asks
    every turn or two), the query it names (``None``: the newest user turn's), a note seen."""
    kind = draw(st.sampled_from(["chars", "tokens", "both"]))
    budget = draw(st.integers(800, 12_000))
    lag = draw(st.integers(0, 1))
    base = draw(st.text(alphabet="abc de", max_size=budget // 6))
    room = budget - len(base)
    # a turn takes at most a fifth of the room (a tenth when a fold lands one context late): the
    # turns said while a fold is in flight must fit where the folded ones were
    most = max(8, min(1_000, room // (5 + 5 * lag)))
    settings_ = {
        "budget_chars": budget if kind != "tokens" else None,
        "budget_tokens": budget // 4 if kind != "chars" else None,
        "base": base,
        "format": draw(st.sampled_from(["instructions", "messages"])),
        "lag": lag,
    }
    at = FIRST_DAY + draw(st.integers(0, SPAN))
    events = []
    asked_last = True
    for _ in range(draw(st.integers(2, 140))):
        at += draw(st.sampled_from([5, 30, 600, 86_400, 40 * 86_400]))
        speaker = draw(st.sampled_from(SPEAKERS))
        text = draw(words)[:most].strip() or "ok"
        role = "assistant" if speaker == "Nova" else "user"
        ask = not asked_last or draw(st.booleans())
        asked_last = ask
        query = draw(st.one_of(st.none(), words)) if ask else None
        note = draw(st.sampled_from(["", "", "", "a map of the harbour"]))
        events.append((Turn(speaker, role, text, at), ask, query, note))
    return settings_, events


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conversations())
def test_every_context_shows_every_turn_the_summary_does_not_cover(
    story: tuple[dict[str, object], list[tuple[Turn, bool, str | None, str]]],
) -> None:
    options, events = story
    counter = load_tokenizer("o200k_base")
    bot = Bot(counter=counter, **options)  # type: ignore[arg-type]
    for turn, ask, query, note in events:
        bot.say(turn)
        if note:
            bot.show(Note(note, turn.at))
        if ask:
            ctx = bot.ask(query)
            assert missing_turns(ctx, len(bot.said)) == [], (bot.session, ctx.first_turn, ctx.dropped)
            if ctx.budget_chars is not None:
                assert ctx.chars <= ctx.budget_chars
            if ctx.budget_tokens is not None:
                assert ctx.tokens is not None and ctx.tokens <= ctx.budget_tokens
