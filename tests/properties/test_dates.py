"""Property tests: whatever the conversation and however it is folded, every summary line is dated by
what it covers, never spans a pause between conversations, keeps the order things were said in, and
keeps its date when a budget cuts it; the date audit finds nothing misdated."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from voice_context.core.text import condense_summary
from voice_context.core.turns import Note, Turn
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.deterministic import SESSION_GAP, DeterministicSummarizer
from voice_context.tuning.audit import Source, Sources, audit_summaries
from voice_context.tuning.scoring import content_terms

T0 = datetime(2023, 5, 8, 21, 30, tzinfo=UTC).timestamp()  # late evening: conversations cross midnight
HEAD = re.compile(r"^\[(\d{1,2} [A-Z][a-z]+ \d{4}), (\d{2}:\d{2})\] ")
FACT = re.compile(r"\b(table|dish) (\d+)\b", re.IGNORECASE)
CITIES = ("Porto", "Lisbon", "Oslo", "Tahoe")
# the pauses between two things said: within a conversation, a long one, and days between conversations
PAUSE = st.sampled_from([20.0, 20.0, 20.0, 300.0, SESSION_GAP + 60, 3 * 3600.0, 86_400.0, 13 * 86_400.0])


@st.composite
def conversations(draw: st.DrawFn) -> tuple[list[Turn], list[tuple[int, Note]], list[int]]:
    """Turns, each saying one numbered fact; notes, each with the fold that takes it; batch sizes."""
    n = draw(st.integers(1, 40))
    at = T0
    turns: list[Turn] = []
    notes: list[tuple[int, Note]] = []
    for k in range(n):
        at += draw(PAUSE)
        speaker = draw(st.sampled_from(["Alice", "Bob"]))
        turns.append(Turn(speaker, "user", f"I booked table {k} in {CITIES[k % 4]}.", at))
        if draw(st.integers(0, 4)) == 0:
            # a note waits in the live buffer: any fold may take it, before or after its turns
            note = Note(f"a photo of dish {k}", at + 10, speaker=speaker, source="image")
            notes.append((draw(st.integers(0, n)), note))
    sizes = draw(st.lists(st.integers(1, 10), min_size=1, max_size=8))
    return turns, notes, sizes


def fold_all(turns: list[Turn], notes: list[tuple[int, Note]], sizes: list[int]) -> list[str]:
    """Every summary along the way, folding batches of the given sizes (cycled)."""
    summarizer = DeterministicSummarizer()
    summary, start, fold, out = "", 0, 0, []
    while start < len(turns) or any(f >= fold for f, _ in notes):
        size = sizes[fold % len(sizes)]
        batch = turns[start : start + size]
        due = tuple(note for f, note in notes if f == fold)
        if batch or due:
            request = SummaryRequest(previous_summary=summary, turns=batch, notes=due, max_chars=100_000)
            summary = summarizer.summarize_now(request)
            out.append(summary)
        start += size
        fold += 1
    return out


def said(turns: list[Turn], notes: list[tuple[int, Note]]) -> dict[tuple[str, int], float]:
    times = {("table", k): t.at for k, t in enumerate(turns)}
    for _, note in notes:
        times[("dish", int(note.text.rsplit(" ", 1)[1]))] = note.at
    return times


def day(at: float) -> str:
    when = datetime.fromtimestamp(at, tz=UTC)
    return f"{when.day} {when:%B %Y}"


@settings(max_examples=150, deadline=None)
@given(conversations())
def test_every_line_is_dated_by_what_it_covers_in_the_order_it_was_said(
    conversation: tuple[list[Turn], list[tuple[int, Note]], list[int]],
) -> None:
    turns, notes, sizes = conversation
    times = said(turns, notes)
    for summary in fold_all(turns, notes, sizes):
        starts = []
        for line in summary.split("\n"):
            head = HEAD.match(line)
            assert head, line  # every line carries its full date
            facts = [(kind.lower(), int(k)) for kind, k in FACT.findall(line)]
            assert facts, line
            # each fact is filed under the day it was said, or seen
            assert all(day(times[fact]) == head.group(1) for fact in facts), line
            spoken = [times[fact] for fact in facts if fact[0] == "table"]
            assert spoken == sorted(spoken), line  # in the order it was said
            assert all(b - a <= SESSION_GAP for a, b in itertools.pairwise(spoken)), line
            starts.append(datetime.strptime(" ".join(head.groups()), "%d %B %Y %H:%M"))
        assert starts == sorted(starts)  # and the lines are in time order


def sources(turns: list[Turn], notes: list[tuple[int, Note]]) -> Sources:
    def source(speaker: str, text: str, at: float) -> Source:
        return Source(
            speaker, datetime.fromtimestamp(at, tz=UTC).date(), frozenset(content_terms(text)), text
        )

    found = [source(t.speaker, t.text, t.at) for t in turns]
    found += [source(f"{n.speaker}'s screen (image)", n.text, n.at) for _, n in notes]
    return Sources(found)


@settings(max_examples=100, deadline=None)
@given(conversations(), st.integers(40, 2000))
def test_a_budget_cut_keeps_every_line_dated_and_every_sentence_whole(
    conversation: tuple[list[Turn], list[tuple[int, Note]], list[int]], limit: int
) -> None:
    turns, notes, sizes = conversation
    summary = fold_all(turns, notes, sizes)[-1]
    whole = set(re.split(r"(?<=\.) ", HEAD.sub("", summary).replace("\n", " ")))
    short = condense_summary(summary, limit)
    assert len(short) <= limit
    times = said(turns, notes)
    for line in filter(None, short.split("\n")):  # nothing at all when one sentence cannot fit
        head = HEAD.match(line)
        assert head, line
        facts = [(kind.lower(), int(k)) for kind, k in FACT.findall(line)]
        assert all(day(times[fact]) == head.group(1) for fact in facts), line
        spoken = [times[fact] for fact in facts if fact[0] == "table"]
        assert spoken == sorted(spoken), line  # lines joined to save their heads keep the order
        assert all(b - a <= SESSION_GAP for a, b in itertools.pairwise(spoken)), line
        assert not line.endswith("…"), line  # a sentence is shown whole or not at all
        for sentence in re.split(r"(?<=\.) ", HEAD.sub("", line)):
            bare = re.sub(r"^(?:Alice|Bob)(?:'s screen \(image\))?: ", "", sentence)
            assert sentence in whole or any(w.endswith(": " + bare) or w == bare for w in whole), sentence
    audit = audit_summaries([summary, short], sources(turns, notes))
    assert (audit.misdated, audit.undated, audit.unmatched) == (0, 0, 0)
    assert audit.judged > 0
