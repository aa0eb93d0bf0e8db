"""Property tests: the session's invariants under any order of events, and the
deterministic summarizer's contract."""

from __future__ import annotations

import re

import anyio
from helpers import noted, summarized
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from voice_context.core.budget import Context, Format, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.language.dates import resolve_dates
from voice_context.core.session import (
    MAX_FOLD_CHARS,
    Abandoned,
    Applied,
    CompactionAbandoned,
    CompactionFailed,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    Failed,
    Session,
    SkipReason,
    Stale,
    StartCompaction,
    SummaryReturned,
    TurnAppended,
    TurnHeld,
)
from voice_context.core.text import clip, normalize
from voice_context.core.turns import Note, Role, Turn
from voice_context.core.window import BACKLOG_BATCHES, MAX_FOLD_BATCHES, recent_start
from voice_context.recall.index import RecallIndex, recall_candidates
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.summarizers.prompt import build_messages

SPEAKERS = ("Alice", "Bob", "Nova", "Calc")
ROLE_OF: dict[str, Role] = {"Alice": "user", "Bob": "user", "Nova": "assistant", "Calc": "tool"}
WORDS = st.sampled_from(["the", "raid", "is", "on", "Friday", "at", "nine", "Porto", "42", "maybe", "ok"])
SENTENCE = st.lists(WORDS, min_size=1, max_size=8).map(lambda ws: " ".join(ws).capitalize() + ".")
PROSE = st.lists(SENTENCE, min_size=0, max_size=6).map(" ".join)
# the state machine draws from fixed texts: cheap to generate, and still of every length that matters
TEXTS = (
    "",
    "ok",
    "Friday.",
    "The raid is on Friday at nine.",
    "Porto maybe. The raid is on. At nine!",
    "Bob said the raid is on Friday at nine, maybe in Porto, and that 42 people are coming along too.",
    "One. Two. Three. Four. Five. Six. Seven. Eight. Nine. Ten. Eleven. Twelve. Thirteen. Fourteen.",
    "word " * 40,
)
TEXT = st.sampled_from(TEXTS)
STEP = st.sampled_from([0.0, 0.25, 1.0, 2.5])
T0 = 1714572187.0  # 2024-05-01 14:03:07 UTC


def once_a_day(line: str) -> str:
    """A recalled line as a context shows it after a line of the same day: its time alone."""
    return re.sub(r"^\[\d{1,2} [A-Z][a-z]+ \d{1,4}, ", "[", line)


def message_for(turn: Turn, text: str) -> dict[str, str]:
    if turn.role == "user":
        return {"role": "user", "content": f"{turn.speaker}: {text}"}
    if turn.role == "assistant":
        return {"role": "assistant", "content": text}
    return {"role": "system", "content": f"{turn.speaker} ({turn.role}): {text}"}


class SessionMachine(RuleBasedStateMachine):
    """A model of what the session must do, checked against the real one after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.session = Session("prop")
        self.appended: list[Turn] = []
        self.now = 0.0
        self.cursor = 0
        self.plan: CompactionPlan | None = None
        self.stale_ids: list[int] = [0]  # plan ids are taken from 1: 0 was never current

    @initialize(
        recent=st.integers(3, 6),
        batch=st.integers(1, 4),
        max_summary=st.integers(40, 160),
        live_entries=st.integers(1, 3),
        max_pending=st.integers(0, 4),
        max_turn=st.integers(8, 80),
        priority=st.integers(0, 4),
    )
    def configure(
        self,
        recent: int,
        batch: int,
        max_summary: int,
        live_entries: int,
        max_pending: int,
        max_turn: int,
        priority: int,
    ) -> None:
        config = SessionConfig(
            recent_window=recent,
            batch_size=batch,
            max_summary_chars=max_summary,
            live_note_entries=live_entries,
            live_note_chars=60,
            max_pending_notes=max_pending,
            max_note_chars=80,
            max_turn_chars=max_turn,
            priority_turns=priority,
            retry_base_seconds=1.0,
            retry_max_seconds=4.0,
        )
        self.session = Session("prop", config)
        self.recall = RecallIndex()

    # -- events ---------------------------------------------------------------

    @rule(
        count=st.integers(0, 4),
        speaker=st.sampled_from(SPEAKERS),
        text=TEXT,
        dt=STEP,
        fmt=st.sampled_from(["messages", "instructions"]),
        budget=st.none() | st.integers(0, 400),
        base=st.sampled_from(["", "You are Nova."]),
        facts=st.sampled_from([(), ("Alice is vegetarian.",), ("Bob lives in Porto.", "The raid is on.")]),
    )
    def converse(
        self,
        count: int,
        speaker: str,
        text: str,
        dt: float,
        fmt: Format,
        budget: int | None,
        base: str,
        facts: tuple[str, ...],
    ) -> None:
        """Some turns arrive, then the bot asks for its next context at a later time."""
        for _ in range(count):
            turn = Turn(speaker, ROLE_OF[speaker], text, self.now)
            held, *then = self.session.receive(TurnAppended(turn))
            assert isinstance(held, TurnHeld) and held.index == len(self.appended)
            for effect in then:  # a backlog folds from the append itself
                if isinstance(effect, StartCompaction):
                    assert self.plan is None and effect.plan.start == self.cursor
                    self.plan = effect.plan
            self.recall.add_turn(len(self.appended), turn)
            self.appended.append(turn)
        self.now += dt
        self.request_context(fmt, budget, base, facts)

    @rule(text=TEXT, speaker=st.sampled_from([None, "Alice"]))
    def append_note(self, text: str, speaker: str | None) -> None:
        note = Note(text or "blank", self.now, speaker=speaker)
        changed = noted(self.session, note)
        self.recall.add_note(note)
        config = self.session.config
        assert changed.live == len(self.session.live_notes) <= config.live_note_entries
        assert changed.pending == len(self.session.pending_notes) <= config.max_pending_notes
        assert changed.evicted in (0, 1)

    def request_context(self, fmt: Format, budget: int | None, base: str, facts: tuple[str, ...]) -> None:
        """Evaluate the trigger as a context request does, then build the context."""
        session = self.session
        total, cursor, was_in_flight = session.total_turns, session.cursor, session.in_flight
        [effect] = session.receive(ContextRequested(self.now))
        decision = effect.plan if isinstance(effect, StartCompaction) else effect
        window = recent_start(total, cursor, session.config.recent_window)
        event("plan" if isinstance(decision, CompactionPlan) else f"skip {decision.reason}")
        if isinstance(decision, CompactionPlan):
            assert was_in_flight is None
            assert decision.start == cursor
            folded, batch = decision.end - decision.start, session.config.batch_size
            if (window - cursor) // batch < BACKLOG_BATCHES:
                assert folded == batch
            else:  # a backlog folds several whole batches, within the characters allowed
                assert folded % batch == 0 and batch <= folded <= batch * MAX_FOLD_BATCHES
                assert folded == batch or sum(len(t.text) for t in decision.turns) <= MAX_FOLD_CHARS
            assert decision.end <= decision.recent_start == window  # never inside the recent window
            assert decision.turns == tuple(self.appended[decision.start : decision.end])
            assert decision.previous_summary == session.summary
            assert not decision.recompact
            assert session.in_flight is decision
            self.plan = decision
        else:
            assert decision.recent_start == window
            if was_in_flight is not None:
                assert decision.reason is SkipReason.ALREADY_IN_FLIGHT
            elif total - cursor <= session.config.recent_window + session.config.batch_size:
                assert decision.reason is SkipReason.BELOW_THRESHOLD
            else:
                assert decision.reason is SkipReason.BACKING_OFF
                assert decision.retry_at is not None and self.now < decision.retry_at
        query, recalled = recall_candidates(self.recall, session, None)
        self.check_context(
            build_context(
                session.view(),
                fmt,
                budget_chars=budget,
                base_instructions=base,
                facts=facts,
                recalled=recalled,
                query=query,
            ),
            budget if budget is not None or fmt == "messages" else session.config.instructions_budget_chars,
        )

    def check_context(self, ctx: Context, budget: int | None) -> None:
        view = self.session.view()
        n = len(view.turns)
        if budget is not None:
            assert ctx.chars <= budget
        if ctx.format == "messages":
            assert ctx.chars == sum(len(m["content"]) for m in ctx.messages)
        else:
            assert ctx.chars == len(ctx.instructions)
        # the verbatim turns shown are a contiguous run ending at the current turn
        assert 0 <= ctx.turns_shown <= n
        assert ctx.first_turn + ctx.turns_shown == view.cursor + n
        if ctx.format == "messages" and ctx.turns_shown:
            shown = view.turns[n - ctx.turns_shown :]
            tail = ctx.messages[len(ctx.messages) - ctx.turns_shown :]
            limit = view.config.max_turn_chars
            for turn, message in zip(shown[:-1], tail[:-1], strict=True):
                assert message == message_for(turn, clip(turn.text, limit))
            assert tail[-1]["role"] == message_for(shown[-1], "")["role"]
        if budget is None:
            assert ctx.turns_shown == n
            assert ctx.summary == view.summary
        # the newest turn is always shown, unless not even a clipped line of it fits
        if n:
            assert ctx.turns_shown >= 1 or ("current_turn" in ctx.dropped and budget is not None)
            if ctx.turns_shown == 0:
                assert budget is not None and budget < len(view.turns[-1].speaker) + 40
        # recall never repeats a turn shown verbatim, and stays within its count
        assert all(p.turn is None or p.turn < ctx.first_turn for p in ctx.recalled)
        assert len(ctx.recalled) <= view.config.recall_limit
        body = (
            ctx.instructions
            if ctx.format == "instructions"
            else "\n".join(m["content"] for m in ctx.messages)
        )
        # each recalled line is shown, its day said once for the lines of one day ("[13:58] Ann: ...")
        assert all(p.line in body or once_a_day(p.line) in body for p in ctx.recalled)
        # the sections add up to the whole; what recall offered is shown or said to be left out
        assert sum(s.chars for s in ctx.sections) == ctx.chars
        shared = {s.name for s in ctx.sections if s.share is not None}
        assert shared <= {"landmarks", "turns", "recall", "summary"} and (budget is None) == (not shared)
        assert not {id(p) for p in ctx.recalled} & {id(p) for p in ctx.left_out}

    @rule(
        action=st.sampled_from(["short", "short", "short", "overlong", "empty", "fail", "fatal", "abandon"]),
        dt=STEP,
        prose=TEXT,
    )
    @precondition(lambda self: self.plan is not None)
    def resolve(self, action: str, dt: float, prose: str) -> None:
        """The plan in flight gets an answer, fails, or is abandoned; its id is then no longer current."""
        plan = self.plan
        assert plan is not None
        self.now += dt
        self.stale_ids.append(plan.plan_id)
        session = self.session
        if action == "abandon":
            assert session.receive(CompactionAbandoned(plan.plan_id, self.now)) == [Abandoned(plan)]
            self.plan = None
            return
        if action in ("fail", "fatal"):
            [outcome] = session.receive(CompactionFailed(plan.plan_id, "timeout", action == "fail", self.now))
            assert isinstance(outcome, Failed)
            ceiling = session.config.retry_max_seconds
            assert self.now < outcome.retry_at <= self.now + ceiling
            if action == "fatal":
                assert outcome.retry_at == self.now + ceiling
            self.plan = None
            return
        limit = session.config.max_summary_chars
        body = {
            "short": clip(prose or "Nothing new.", limit),
            "overlong": (prose + " ") * (limit // max(1, len(prose)) + 1) + "Sentence to spare. " * 10,
            "empty": " \n ",
        }[action]
        answer = summarized(session, plan.plan_id, body, self.now)  # a commit stored at once
        clamped = getattr(answer, "clamped", False)
        event(f"result {type(answer).__name__}{' clamped' if clamped else ''}")
        if isinstance(answer, Applied):
            assert answer.old_cursor == self.cursor
            assert answer.new_cursor == plan.end
            assert answer.plan is plan
            assert session.summary == answer.summary
            assert answer.clamped == (plan.recompact and len(normalize(body)) > limit)
            self.cursor = plan.end
            self.plan = session.in_flight  # the next fold, while a backlog is left
            assert self.plan is None or (self.plan.start == self.cursor and not self.plan.recompact)
        elif isinstance(answer, StartCompaction):
            again = answer.plan
            assert action == "overlong" and not plan.recompact
            assert again.recompact and again.turns == () and again.end == plan.end
            assert session.in_flight is again
            self.plan = again
        else:
            assert isinstance(answer, Failed)
            assert action == "empty" and answer.kind == "empty"
            self.plan = None

    @rule(
        pick=st.integers(0, 1 << 16),
        text=TEXT,
        kind=st.sampled_from(["answer", "failure", "stored", "abandoned"]),
    )
    def deliver_stale(self, pick: int, text: str, kind: str) -> None:
        """A late word about a plan that is no longer current changes nothing."""
        plan_id = self.stale_ids[pick % len(self.stale_ids)]
        session = self.session
        before = (
            session.stats(),
            session.summary,
            session.pending_notes,
            session.in_flight,
            session.retry_at,
        )
        late = {
            "answer": SummaryReturned(plan_id, text or "Late.", self.now),
            "failure": CompactionFailed(plan_id, "timeout", True, self.now),
            "stored": CompactionStored(plan_id, self.now),
            "abandoned": CompactionAbandoned(plan_id, self.now),
        }[kind]
        assert session.receive(late) == [Stale(plan_id, self.plan.plan_id if self.plan else None)]
        after = (session.stats(), session.summary, session.pending_notes, session.in_flight, session.retry_at)
        assert after == before

    # -- invariants --------------------------------------------------------------

    @invariant()
    def holds(self) -> None:
        session = self.session
        config = session.config
        # the cursor only moves forward, and only to the end of a plan that landed
        assert session.cursor == self.cursor
        # coverage has no gap: every turn is before the cursor or held verbatim, in order
        view = session.view()
        assert view.cursor + len(view.turns) == len(self.appended) == session.total_turns
        assert view.turns == tuple(self.appended[view.cursor :])
        assert len(session.summary) <= config.max_summary_chars
        # at most one plan in flight, and it is the one the model expects
        assert session.in_flight is self.plan
        assert session.stats().in_flight == (self.plan.plan_id if self.plan else None)
        assert len(session.live_notes) <= config.live_note_entries
        assert len(session.pending_notes) <= config.max_pending_notes


# Hypothesis's default count of runs, each of up to 60 steps: enough for a backlog of four
# batches behind the cursor to build up (a third of the runs fold one) and for a clamped
# recompaction to land in a few of them; twice the runs found nothing more, in twice the time.
SessionMachine.TestCase.settings = settings(
    max_examples=100,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestSession = SessionMachine.TestCase


# -- the deterministic summarizer's contract ------------------------------------------


def summarize(request: SummaryRequest) -> str:
    return anyio.run(DeterministicSummarizer().summarize, request)


@settings(max_examples=150, deadline=None)
@given(
    previous=PROSE,
    batch=st.lists(st.tuples(st.sampled_from(SPEAKERS), PROSE), max_size=8),
    notes=st.lists(PROSE, max_size=3),
    max_chars=st.integers(40, 400),
    recompact=st.booleans(),
)
def test_deterministic_summary_fits_the_budget(
    previous: str, batch: list[tuple[str, str]], notes: list[str], max_chars: int, recompact: bool
) -> None:
    request = SummaryRequest(
        previous_summary=previous,
        turns=() if recompact else tuple(Turn(s, ROLE_OF[s], t, T0 + i) for i, (s, t) in enumerate(batch)),
        notes=tuple(Note(n or "blank", 0.0) for n in notes),
        max_chars=max_chars,
        recompact=recompact,
    )
    assert len(summarize(request)) <= max_chars


STATEFUL = (
    Turn("Alice", "user", "I will book the flight to Lisbon for Friday the 14th.", T0),
    Turn("Bob", "user", "My sister Carla moves to Berlin in March.", T0 + 4),
)
FILLER = tuple(
    Turn(s, "user", t, T0 + i)
    for i, (s, t) in enumerate([("Alice", "hi"), ("Bob", "yeah"), ("Alice", "haha"), ("Bob", "ok")])
)


def test_deterministic_keeps_speaker_names() -> None:
    text = summarize(SummaryRequest(previous_summary="", turns=STATEFUL, max_chars=1200))
    assert "Alice" in text and "Bob" in text


def test_deterministic_filler_adds_nothing() -> None:
    previous = "Alice adopted a cat named Miso."
    assert summarize(SummaryRequest(previous_summary=previous, turns=FILLER, max_chars=1200)) == previous


def test_deterministic_folds_the_previous_summary_in() -> None:
    previous = "Alice adopted a cat named Miso."
    text = summarize(SummaryRequest(previous_summary=previous, turns=STATEFUL, max_chars=1200))
    assert "Miso" in text
    assert len(text) > len(previous)  # the new batch is folded in with it


@settings(max_examples=200, deadline=None)
@given(st.floats())
def test_both_summarizers_render_any_time_without_raising(at: float) -> None:
    turn = Turn("Alice", "user", "Let's fly tomorrow, not next month.", at)
    request = SummaryRequest(turns=(turn,), notes=(), previous_summary="", max_chars=400)
    assert DeterministicSummarizer().summarize_now(request)
    assert "Alice" in build_messages(request)[-1]["content"]
    assert resolve_dates("three years ago, yesterday, next Friday", at)
