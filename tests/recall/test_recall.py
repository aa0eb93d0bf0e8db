"""Recall: a reply gets the old details its query is about, dated and attributed, on every store."""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import hypothesis
import pytest
import Stemmer
from helpers import build_folded, read_twice
from hypothesis import given
from hypothesis import strategies as st
from serving import running, settings, wire

import voice_context
from voice_context.core.budget import RECALL_HEADER, RECENT_HEADER, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.language.forms import BASE_FORMS
from voice_context.core.language.numbers import spoken_numbers
from voice_context.core.recalled import Offered, Recalled, RecallStats
from voice_context.core.session import ContextView, Session
from voice_context.core.times import stamp
from voice_context.core.turns import Note, Turn, TurnRun
from voice_context.manager import SessionManager
from voice_context.manager.indexing import HELD_TURNS
from voice_context.recall.embedding import load_embedder
from voice_context.recall.index import _STOP as STOPWORDS
from voice_context.recall.index import (
    DEFAULT_QUERY_COMMON,
    RecallIndex,
    Vectors,
    annotate_dates,
    default_query,
    index_terms,
    indexed,
    note_passage,
    recall_candidates,
    render_hits,
    rerank,
    similarities,
    turn_key,
    turn_passage,
    with_neighbours,
)
from voice_context.recall.stored import HeldTurns, HeldView, Tail, search_store
from voice_context.store import MemoryStore, SessionRecord, Store
from voice_context.store.base import ChooseTerms
from voice_context.store.redis import RedisStore
from voice_context.store.sqlite import SQLiteStore
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.testing.redis_server import RedisServer

T0 = 1683554160.0  # 8 May 2023, 13:56 UTC
FILLER = [
    "Did you see the match last night?",
    "The new map is pretty fun to play on.",
    "I keep dying as Hulk, it is frustrating.",
    "Maybe try a different team comp next round.",
    "The queue times are long this evening.",
]
DETAIL = (
    "I went to a LGBTQ support group yesterday and it was so powerful. The coffee there was bad. "
    "Anyway, the raid starts at nine tonight and we still need a healer for it."
)


def chatter(n: int, start: int = 0, *, detail_at: int | None = None) -> list[Turn]:
    """``n`` turns of gaming small talk, one minute apart; the detail is said at ``detail_at``."""
    out = []
    for i in range(start, start + n):
        text = DETAIL if i == detail_at else f"{FILLER[i % len(FILLER)]} Round {i}."
        out.append(Turn(("Caroline", "Melanie")[i % 2], "user", text, T0 + 60 * i))
    return out


# -- the index, without an event loop ---------------------------------------------------------


def test_words_are_folded_the_same_way_for_turns_and_queries() -> None:
    assert index_terms("Caroline's support groups, twenty five of them!") == [
        "carolin",
        "support",
        "group",
        "25",
    ]
    assert index_terms("running to de-stress") == ["run", "de", "stress", "destress"]
    assert index_terms("Did you go?") == []  # nothing but stopwords


WORDS = [
    "one",
    "Twenty",
    "five",
    "hundred",
    "and",
    "point",
    "Caroline's",
    "it’s",
    "de-stress",
    "ſix",
    "fıve",
    "SİX",
    "tK",
    "İstanbul",
    "007",
    "runs",
    "-",
    "'",
    "the",
    "Group",
    "three-four",
    "won",
    "Bought",
    "children",
    "rose",
]


@hypothesis.settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(WORDS) | st.text(max_size=6), max_size=12).map(" ".join))
def test_the_words_of_a_text_are_what_the_whole_folding_gives_whatever_it_skips(text: str) -> None:
    """index_terms skips the steps a text cannot need (no number word, no apostrophe, no hyphen):
    it gives exactly what running every step gives."""
    lowered = spoken_numbers(text).lower()
    lowered = re.sub(r"['’]", "", re.sub(r"['’]s\b", "", lowered))
    words = [
        w for w in re.findall(r"[a-z0-9]+", lowered) if w not in STOPWORDS and (len(w) > 1 or w.isdigit())
    ]
    words += [h.replace("-", "") for h in re.findall(r"[a-z]+(?:-[a-z]+)+", lowered)]
    stem = Stemmer.Stemmer("english").stemWord
    every_step = [w.lstrip("0") or "0" if w.isdigit() else stem(w) for w in words]
    every_step += [
        stem(BASE_FORMS[w])
        for w in re.findall(r"[a-z0-9]+", lowered)
        if w in BASE_FORMS and stem(BASE_FORMS[w]) != stem(w)
    ]
    assert index_terms(text) == every_step


def test_a_question_in_the_base_form_finds_what_was_told_in_an_irregular_past() -> None:
    """No suffix stemmer brings "won" to "win" or "bought" to "buy": the index counts an irregular
    form under its base as well as under itself, for turns and queries alike."""
    assert index_terms("We won a trophy") == ["won", "trophi", "win"]
    assert index_terms("the children") == ["children", "child"]
    assert index_terms("a rose in the garden") == ["rose", "garden"]  # a flower as often as "rise"
    index = RecallIndex()
    index.add_turns(0, chatter(30))
    index.add_turns(30, [Turn("Caroline", "user", "All that work paid off: we won the trophy!", T0 + 3600)])
    index.add_turns(31, chatter(30, 31))
    index.add_turns(61, [Turn("Melanie", "user", "I bought a used kayak at the flea market.", T0 + 7200)])
    assert [hit.turn for hit in index.search("What did they win?")][:1] == [30]
    assert [hit.turn for hit in index.search("What did she buy?")][:1] == [61]
    assert [hit.turn for hit in index.search("Who has won?")][:1] == [30]  # and the form itself


def test_a_search_finds_the_turn_and_shows_its_matching_sentence_and_the_next_dated_and_attributed() -> None:
    index = RecallIndex()
    index.add_turns(0, chatter(40, detail_at=3))
    (best, *_) = index.search("When did Melanie go to the LGBTQ support group?")
    assert best.turn == 3
    assert best.granularity == "sentences"
    assert best.line == (
        "[8 May 2023, 13:59] Melanie: I went to a LGBTQ support group yesterday [7 May 2023] "
        "and it was so powerful. The coffee there was bad. …"
    )


def test_a_short_turn_is_shown_whole_and_turns_from_before_are_excluded() -> None:
    index = RecallIndex()
    index.add_turns(0, [Turn("Alice", "user", "Our budget is 4,968 euros.", T0)])
    index.add_turns(1, chatter(5, 1))
    (hit, *_) = index.search("what is the budget", limit=3)  # then its neighbour, turn 1
    assert (hit.turn, hit.granularity) == (0, "turn")
    assert hit.line == "[8 May 2023, 13:56] Alice: Our budget is 4,968 euros."
    assert index.search("what is the budget", before=0) == []


QUESTION = Turn("Caroline", "user", "So which pottery class did you sign up for in the end?", T0 + 600)
ANSWER = Turn("Melanie", "user", "The Thursday wheel-throwing one at the community center!", T0 + 660)


def test_a_turn_that_asks_is_recalled_with_the_answer_that_followed() -> None:
    index = RecallIndex()
    index.add_turns(0, [*chatter(10), QUESTION, ANSWER, *chatter(10, 12)])
    (hit, *_) = index.search("What pottery class did Melanie sign up for?")
    assert hit.turn == 10
    assert hit.line == (
        "[8 May 2023, 14:06] Caroline: So which pottery class did you sign up for in the end? "
        "Melanie: The Thursday wheel-throwing one at the community center!"
    )


@pytest.mark.asyncio
async def test_a_server_recalls_a_question_with_its_answer_from_the_stores_index(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", [*chatter(10), QUESTION, ANSWER, *chatter(60, 12)])
        await manager.wait_indexed("room")
        ctx = await manager.context("room", "messages", query="Which pottery class?")
    await store.aclose()
    (asked,) = [p for p in ctx.recalled if p.turn == 10]
    assert asked.line.endswith("Melanie: The Thursday wheel-throwing one at the community center!")


def test_an_answer_a_recalled_question_carries_is_not_shown_again_on_its_own() -> None:
    index = RecallIndex()
    index.add_turns(0, [*chatter(10), QUESTION, ANSWER, *chatter(10, 12)])
    # both turns match: whichever ranks first, the answer's words are shown once
    for query in ("pottery class wheel-throwing community center", "Which pottery class did you sign up for"):
        found = index.search(query)
        assert sum("wheel-throwing" in hit.line for hit in found) == 1
        assert sum("pottery class" in hit.line for hit in found) == 1


def test_weak_matches_are_noise_and_left_out() -> None:
    index = RecallIndex()
    index.add_turns(0, chatter(30, detail_at=7))
    found = index.search("LGBTQ support group round")
    assert found[0].turn == 7
    # "round" is in every other turn: those hits score far below the detail and are dropped
    assert len(found) < 5


def test_a_screen_note_is_recalled_with_its_provenance() -> None:
    index = RecallIndex()
    index.add_turns(0, chatter(10))
    index.add_note(Note("a photo of a dog walking past a mural", T0 + 30, "Caroline", "image"))
    (hit, *_) = index.search("the dog mural photo")
    assert hit.kind == "note" and hit.turn is None
    assert hit.line == "[8 May 2023, 13:56] Caroline's screen (image): a photo of a dog walking past a mural"


def test_relative_dates_keep_their_words_and_gain_the_day_they_mean() -> None:
    assert annotate_dates("I painted that lake sunrise last year.", T0) == (
        "I painted that lake sunrise last year [2022]."
    )
    assert annotate_dates("Since yesterday it rains.", T0) == "Since yesterday [7 May 2023] it rains."
    # every phrase the date search resolves is annotated, "this week" and "past month" among them
    assert annotate_dates("We moved this week.", T0) == "We moved this week [the week of 8 May 2023]."
    assert annotate_dates("It rained for a past month?", T0) == "It rained for a past month [April 2023]?"
    assert annotate_dates("Nothing relative here.", T0) == "Nothing relative here."
    assert annotate_dates("yesterday", 1e20).startswith("yesterday")  # any time: never raises
    assert stamp(float("nan")) == "1 January 1970, 00:00"


def test_the_default_query_is_the_newest_user_turn() -> None:
    turns = [Turn("Alice", "user", "Where is Porto?", 0.0), Turn("Nova", "assistant", "In Portugal.", 1.0)]
    assert default_query(turns) == "Where is Porto?"
    assert default_query([]) == ""


# -- the budget ---------------------------------------------------------------------------


def passage(turn: int, text: str, score: float = 1.0) -> Recalled:
    return Recalled("turn", turn, f"[8 May 2023, 13:56] Alice: {text}", score, "turn", T0 + turn)


def view(n: int = 20, cursor: int = 100, **config: object) -> ContextView:
    return ContextView(cursor, "", tuple(chatter(n, cursor)), (), SessionConfig(**config))  # type: ignore[arg-type]


def test_recall_takes_its_share_after_the_protected_recent_window_and_reads_in_order() -> None:
    offered = [passage(40, "the budget is 4,968 euros", 2.0), passage(12, "we fly on the 14th", 1.0)]
    ctx = build_context(view(), "instructions", budget_chars=1500, recalled=offered, query="budget")
    assert [p.turn for p in ctx.recalled] == [12, 40]  # shown in the order they were said
    assert RECALL_HEADER in ctx.instructions
    assert ctx.instructions.index("we fly on the 14th") < ctx.instructions.index("4,968")
    assert ctx.chars == len(ctx.instructions) <= 1500
    assert ctx.query == "budget"
    assert ctx.instructions.endswith(chatter(20, 100)[-1].text)  # the newest turn is always shown


def test_a_passage_of_a_turn_shown_verbatim_is_not_shown_twice() -> None:
    offered = [passage(115, "a turn the context shows anyway"), passage(3, "an old detail")]
    ctx = build_context(view(), "messages", recalled=offered)
    assert [p.turn for p in ctx.recalled] == [3]
    assert ctx.turns_shown == 20


def shown_dated(line: str, text: str) -> bool:
    """Whether a recalled ``line`` (``[8 May 2023, 13:59] Ann: ...``) is in ``text`` as a context shows
    it: whole, or with its time alone when a line of the same day comes before it, that day then
    said in the recall section above it."""
    day, _, rest = line[1:].partition(", ")
    if f"- {line}" in text:
        return True
    at = text.find(f"- [{rest}")
    return at > 0 and f"[{day}, " in text[text.index(RECALL_HEADER) : at]


def dated_tail(turns: Sequence[Turn], budget: int) -> int:
    """How many of the newest turns a plain dated transcript shows in ``budget`` chars."""
    used, count = len(RECENT_HEADER), 0
    for turn in reversed(turns):
        used += len(f"\n[{stamp(turn.at)}] {turn.speaker}: {turn.text}")
        if used > budget:
            break
        count += 1
    return count


def test_a_tight_budget_gives_recall_what_the_recency_floor_leaves() -> None:
    offered = [passage(k, f"old detail number {k} " + "x" * 60) for k in range(10)]
    budget = 2000
    shown = view(n=80)
    ctx = build_folded(shown, "instructions", budget_chars=budget, recalled=offered, query="detail")
    assert ctx.first_turn > shown.cursor  # more turns than the budget holds: no room is left over
    assert ctx.turns_shown >= math.ceil(0.9 * dated_tail(shown.turns, budget))
    recall_chars = len(RECALL_HEADER) + sum(len(p.line) + 3 for p in ctx.recalled)
    turn_chars = len(RECENT_HEADER) + sum(
        len(f"{t.speaker}: {t.text}") + 1 for t in shown.turns[-ctx.turns_shown :]
    )
    assert recall_chars > 0 and recall_chars + turn_chars <= budget


def test_recall_can_be_turned_off_per_session() -> None:
    ctx = build_context(view(recall=False), "messages", recalled=[passage(3, "an old detail")])
    assert ctx.recalled == ()


# -- on real stores, through the session manager -----------------------------------------------


SMALL = {"recent_window": 6, "batch_size": 4}


async def speak(manager: SessionManager, name: str, turns: list[Turn]) -> None:
    for turn in turns:
        await manager.append_turn(name, turn)
        await manager.context(name)  # compactions start as a bot's requests would start them


@pytest.mark.asyncio
async def test_recall_finds_an_old_detail_after_a_restart_on_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    store = SQLiteStore(path)
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", chatter(120, detail_at=3))
    await store.aclose()

    store = SQLiteStore(path)
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        opened = await manager.open("room")
        assert opened.resumed and opened.stats.cursor > 3  # turn 3 is folded: no longer verbatim
        query = "When was the LGBTQ support group?"
        ctx = await manager.context("room", "instructions", budget_chars=3000, query=query)
    await store.aclose()
    assert 3 in [p.turn for p in ctx.recalled]
    assert shown_dated(
        "[8 May 2023, 13:59] Melanie: I went to a LGBTQ support group yesterday [7 May 2023]",
        ctx.instructions,
    )


@pytest.mark.asyncio
async def test_on_sqlite_a_session_s_turns_are_indexed_a_batch_at_a_time_and_found_from_their_ack(
    tmp_path: Path,
) -> None:
    """Turn by turn, each of a turn's words would dirty a page of the store's index. The newest
    turns are held by the process instead, searched from memory, and written to the index
    ``HELD_TURNS`` at a time: a context asked right after the ack finds a turn the store's
    index does not hold yet, and no index write waits for fewer than a batch."""
    store = SQLiteStore(tmp_path / "sessions.db")
    query = "the LGBTQ support group"
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room", SMALL)
        index_writes = store.derived.groups
        await speak(manager, "room", chatter(30, detail_at=3))
        before_any, _, _ = await store.recall_postings("room", ())
        early = await manager.context("room", "instructions", budget_chars=1500, query=query)

        for turn in chatter(90, start=30):
            await manager.append_turn("room", turn)
            await manager.context("room")
        assert await manager.wait_indexed("room") == 0
        written = store.derived.groups - index_writes
        stats, _, _ = await store.recall_postings("room", ())
        late = await manager.context("room", "instructions", budget_chars=3000, query=query)
    await store.aclose()

    assert before_any.turns == 0 and 3 in [p.turn for p in early.recalled], "found while held"
    assert written >= 1 and HELD_TURNS * written <= stats.turns, "each write took a batch or more"
    assert 120 - stats.turns < HELD_TURNS, "what is left held is less than a batch"
    assert 3 in [p.turn for p in late.recalled], "found in the store's index"


@pytest.mark.asyncio
async def test_turns_held_for_the_index_are_written_when_the_session_closes_and_indexed_again_after_a_crash(
    tmp_path: Path,
) -> None:
    """What a process holds of a session's index is not the only copy of anything: closing the
    session writes it to the store, and a process that stops without closing it loses only
    work, which the next process to open the session does again from the stored turns (and
    holds them in its turn: fewer than a batch, they wait for no write)."""
    query = "the LGBTQ support group"
    store = SQLiteStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", chatter(20))
        await manager.close("room")
    closed, _, _ = await store.recall_postings("room", ())

    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room")
        await speak(manager, "room", chatter(30, start=20, detail_at=22))
    crashed, _, _ = await store.recall_postings("room", ())  # the manager ended without a close

    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room")
        # the first context may have room for nothing but the turns no summary covers yet (how
        # many there are depends on whether the crashed process landed its fold): they fold
        await manager.context("room", "instructions", budget_chars=1000)
        await manager.settled()
        ctx = await manager.context("room", "instructions", budget_chars=1000, query=query)
        reopened, _, _ = await store.recall_postings("room", ())
    await store.aclose()

    assert closed.turns == 20, "written when the session closed"
    assert crashed.turns == 20, "turns 20-49 were held, not written"
    assert 22 in [p.turn for p in ctx.recalled], "indexed again from the stored turns"
    assert reopened.turns == 20, "and held again"


class CountingIndexWrites(SQLiteStore):
    """A SQLite store that counts its index writes in flight, the most at once, and tells when
    ``expected`` of them are done."""

    writing = 0
    most = 0
    done = 0
    expected = 0
    all_done: anyio.Event

    async def index_turns(self, name: str, start: int, docs: Sequence[Any]) -> RecallStats:
        self.writing += 1
        self.most = max(self.most, self.writing)
        try:
            return await super().index_turns(name, start, docs)
        finally:
            self.writing -= 1
            self.done += 1
            if self.done == self.expected:
                self.all_done.set()


@pytest.mark.asyncio
async def test_sessions_let_go_together_write_what_they_held_one_session_at_a_time(tmp_path: Path) -> None:
    """A burst's sessions end together. What each held for its index reaches the store, one
    session's write at a time: a thousand of them at once would go in one group commit, and the
    live sessions' turns would wait behind it."""
    store = CountingIndexWrites(tmp_path / "sessions.db")
    names = [f"room-{k}" for k in range(20)]
    store.expected, store.all_done = len(names), anyio.Event()
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        for name in names:
            await manager.open(name, SMALL)
            await speak(manager, name, chatter(10))
        async with anyio.create_task_group() as tg:
            for name in names:
                tg.start_soon(manager.close, name)
        with anyio.fail_after(10):  # written in the background (a shutdown would drop those left)
            await store.all_done.wait()
    indexed = [(await store.recall_postings(name, ()))[0].turns for name in names]
    await store.aclose()
    assert indexed == [10] * len(names)
    assert store.most == 1


@pytest.mark.asyncio
async def test_on_sqlite_a_note_is_in_the_index_when_it_is_acknowledged_in_the_notes_own_commit(
    tmp_path: Path,
) -> None:
    """A note's postings go in the transaction that stores it: one commit, no index write of
    its own, and nothing waits for the index once the note is acknowledged."""
    store = SQLiteStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", chatter(12))
        await manager.wait_indexed("room")
        groups, index_writes = store.group.groups, store.derived.groups
        for k in range(3):
            await manager.append_note(
                "room", Note(f"a seating chart for table {k}", T0 + 60 * k, "Mel", "screen")
            )
            assert manager.indexing_lag("room") == 0
            stats, _, _ = await store.recall_postings("room", ())
            assert (stats.turns, stats.notes) == (0, k + 1)  # (the turns are held: fewer than a batch)
        assert (store.group.groups, store.derived.groups) == (groups + 3, index_writes)
        passages = await store.recall_passages("room", [-1, -2, -3])
    await store.aclose()
    assert [passages[-k].text.endswith(f"a seating chart for table {k - 1}") for k in (1, 2, 3)] == [True] * 3


class NotesAsideFirst(MemoryStore):
    """Indexes the first note in a write of its own (as Redis does), held until the test lets it
    go; the notes after it in their own writes, when given their docs."""

    def __init__(self) -> None:
        super().__init__()
        self.docs: list[object] = []
        self.held, self.release = anyio.Event(), anyio.Event()

    async def save_notes(self, name: str, live: Any, pending: Any, doc: Any = None) -> Any:
        self.docs.append(doc)
        return await super().save_notes(name, live, pending, None if len(self.docs) == 1 else doc)

    async def index_note(self, name: str, doc: Any) -> Any:
        if not self.held.is_set():
            self.held.set()
            await self.release.wait()
        return await super().index_note(name, doc)


@pytest.mark.asyncio
async def test_a_note_after_one_still_waiting_for_the_index_is_indexed_behind_it_in_the_order_seen() -> None:
    store = NotesAsideFirst()
    with anyio.fail_after(10):
        async with SessionManager(DeterministicSummarizer(), store=store) as manager:
            await manager.open("room", SMALL)
            await manager.append_note("room", Note("the first slide", T0, "Mel"))
            await store.held.wait()  # the background indexing has it, and waits
            await manager.append_note("room", Note("the second slide", T0 + 1, "Mel"))
            assert manager.indexing_lag("room") == 2
            store.release.set()
            assert await manager.wait_indexed("room") == 0
            passages = await store.recall_passages("room", [-1, -2])
    assert store.docs[0] is not None, "offered to the store with its doc"
    assert store.docs[1] is None, "the second waits behind the first: its key follows"
    assert passages[-1].text.endswith("the first slide") and passages[-2].text.endswith("the second slide")


SMALL_TALK = "The new map is pretty fun to play on."  # each of its words is said in a fifth of the turns


@pytest.mark.asyncio
async def test_a_context_without_a_query_recalls_nothing_for_small_talk(tmp_path: Path) -> None:
    """The default query is the newest user turn; words said in more than 5% of the turns tell
    nothing about which old turn it needs, so small talk leaves recall's room to the summary."""
    store = SQLiteStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", chatter(60, detail_at=3))
        await manager.append_turn("room", Turn("Caroline", "user", SMALL_TALK, T0 + 3600))
        plain = await manager.context("room", "instructions", budget_chars=3000)
        asked = await manager.context("room", "instructions", budget_chars=3000, query=SMALL_TALK)
        await manager.append_turn("room", Turn("Melanie", "user", "How did the LGBTQ group go?", T0 + 3660))
        detail = await manager.context("room", "instructions", budget_chars=3000)
    await store.aclose()
    assert [p.turn for p in plain.recalled if p.kind != "summary"] == []
    assert [p.turn for p in asked.recalled if p.kind == "turn"]  # a query named is searched by every word
    assert 3 in [p.turn for p in detail.recalled]  # a rare word still finds its turn


FAREWELLS = [
    "Catch you later, Caroline!",
    "Thanks so much, Mel! Take care of yourself.",
    "Talk to you soon. Bye!",
]


@pytest.mark.asyncio
@pytest.mark.parametrize("farewell", FAREWELLS)
async def test_a_farewell_recalls_nothing_however_rare_its_words_and_leaves_the_room_to_the_summary(
    tmp_path: Path, farewell: str
) -> None:
    """A goodbye said once before (its words rare, under the 5% cap) is still small talk: a
    context without a query recalls no turn for it, not even the earlier goodbyes, and the
    summary takes the room."""
    store = SQLiteStore(tmp_path / "sessions.db")
    earlier = [Turn("Melanie", "user", text, T0 + 30 * k) for k, text in enumerate(FAREWELLS)]
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", [*earlier, *chatter(60, len(earlier), detail_at=5)])
        await manager.append_turn("room", Turn("Caroline", "user", farewell, T0 + 7200))
        await manager.wait_indexed("room")
        ctx = await manager.context("room", "instructions", budget_chars=3000)
    await store.aclose()
    assert ctx.query == ""
    assert ctx.recalled == ()
    assert "LGBTQ support group" in ctx.summary  # the room went to the summary


def test_recalling_for_the_newest_turn_shows_no_hit_whose_matching_words_are_small_talk() -> None:
    """ "... Take care of yourself." matches "take care" and answers nothing: a context that
    recalls for the newest user turn does not show it; a query the bot names still finds it."""
    index = RecallIndex()
    goodbye = Turn("Melanie", "user", "The trip was long. Take care of yourself.", T0)
    index.add_turns(0, [goodbye, *chatter(20, 1)])
    as_default = index.search("take care of yourself", common=DEFAULT_QUERY_COMMON)
    assert 0 not in [hit.turn for hit in as_default]
    assert 0 in [hit.turn for hit in index.search("take care of yourself")]


SAID = [  # questions, their answers, small talk
    "What did you cook for the party?",
    "A lasagna, my grandmother's recipe.",
    "Take care of yourself.",
    "Thanks, talk soon!",
    "The party was at the lake house. We cooked a lasagna there. It rained all day.",
    "Did you go to the lake house again?",
    "Yes, on Saturday. The lasagna was gone by noon.",
]


@given(st.data())
def test_a_context_renders_only_the_hits_it_may_show_and_shows_what_rendering_them_all_gives(
    data: st.DataObject,
) -> None:
    """Recall offers a context its hits unrendered: the context renders them once it knows
    the turns it shows verbatim, and a hit of one of those it never shows. Whatever the
    ranking, the small talk and the questions whose answers ranked higher, every line it
    may show is the line a render of them all gives, and so is the context."""
    said = data.draw(st.lists(st.sampled_from(SAID), min_size=30, max_size=30))
    turns = [Turn(("Ann", "Bo")[i % 2], "user", text, T0 + 60 * i) for i, text in enumerate(said)]
    passages = {i: turn_passage(i, turn) for i, turn in enumerate(turns)}
    ranked = data.draw(st.lists(st.sampled_from(range(29)), unique=True, max_size=20))
    hits = [(passages[k], 10.0 - r / 4) for r, k in enumerate(ranked)]
    wanted = set(index_terms(data.draw(st.sampled_from(SAID)) + " lasagna party"))
    small_talk = data.draw(st.booleans())

    def render(shown_from: int | None) -> list[Recalled]:
        return render_hits(
            hits,
            lambda turn: passages.get(turn + 1),
            wanted,
            lambda word: 1.0 + len(word) % 3,
            drop_small_talk=small_talk,
            shown_from=shown_from,
        )

    every = render(None)
    for shown_from in range(31):
        may_show = [r for r in render(shown_from) if r.turn is None or r.turn < shown_from]
        assert may_show == [r for r in every if r.turn is None or r.turn < shown_from]
    shown = ContextView(0, "", tuple(turns), (), SessionConfig())
    budget = data.draw(st.integers(600, 2400))
    lazy = build_context(shown, "instructions", budget_chars=budget, recalled=Offered(render), query="party")
    whole = build_context(shown, "instructions", budget_chars=budget, recalled=every, query="party")
    assert replace(lazy, left_out=()) == replace(whole, left_out=())


RESEARCH_QUESTION = Turn("Caroline", "user", "What have you been researching lately?", T0 + 600)
RESEARCH_ANSWER = Turn("Melanie", "user", "Adoption agencies! I want to give a kid a loving home.", T0 + 660)


@pytest.mark.asyncio
async def test_a_questions_evidence_is_recalled_whole_even_when_it_shares_no_word_with_the_question(
    tmp_path: Path,
) -> None:
    """The answer to "What did Melanie research?" is "Adoption agencies!", which repeats no
    word of it; the turn that asked it does. The neighbour's share brings the answer in, as a
    whole turn or carried by its question, and never cut."""
    store = SQLiteStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", [*chatter(10), RESEARCH_QUESTION, RESEARCH_ANSWER, *chatter(60, 12)])
        await manager.wait_indexed("room")
        ctx = await manager.context(
            "room", "instructions", budget_chars=4000, query="What did Melanie research lately?"
        )
    await store.aclose()
    assert ctx.first_turn > 11  # the answer is no longer verbatim
    assert RESEARCH_ANSWER.text in ctx.instructions
    assert any(p.turn in (10, 11) and p.granularity == "turn" for p in ctx.recalled)


def test_a_turn_takes_half_of_its_better_neighbours_score() -> None:
    scores = {10: 4.0, 12: 1.0, -3: 9.0}  # two turns and a note
    spread = with_neighbours(scores, turn_key, turn_key, spread=3)
    assert spread == {10: 4.0, 12: 1.0, -3: 9.0, 9: 2.0, 11: 2.0, 13: 0.5}
    assert spread[11] < spread[10]  # never above the turn it borrows from


def test_replay_recalls_for_the_default_query_as_a_server_does() -> None:
    index = RecallIndex()
    turns = [*chatter(60, detail_at=3), Turn("Caroline", "user", SMALL_TALK, T0 + 3600)]
    index.add_turns(0, turns)
    session = Session("room", SessionConfig(), cursor=50, turns=turns[50:])
    assert recall_candidates(index, session, None) == (SMALL_TALK, [])
    assert recall_candidates(index, session, SMALL_TALK)[1]


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path / "redis") as server:
        yield server


@pytest.mark.asyncio
async def test_recall_finds_an_old_detail_on_another_replica_sharing_redis(redis_server: RedisServer) -> None:
    one, two = RedisStore(redis_server.url, prefix="vc"), RedisStore(redis_server.url, prefix="vc")
    async with (
        SessionManager(DeterministicSummarizer(), store=one, replica="one") as first,
        SessionManager(DeterministicSummarizer(), store=two, replica="two") as second,
    ):
        await first.open("room", SMALL)
        await speak(first, "room", chatter(30, detail_at=2))
        await first.close("room")
        await second.open("room")
        await second.append_turn(
            "room", Turn("Caroline", "user", "Remind me, what was that group?", T0 + 9999)
        )
        ctx = await second.context("room", "messages")  # the newest user turn is the query
    await one.aclose()
    await two.aclose()
    assert ctx.query == "Remind me, what was that group?"
    assert [p.turn for p in ctx.recalled][:1] == [2]
    assert any("LGBTQ support group" in m["content"] for m in ctx.messages if m["role"] == "system")


# -- over the wire -----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_context_get_takes_a_query_and_says_what_it_recalled() -> None:
    async with running(settings(), summarizer=DeterministicSummarizer()) as server, wire(server) as bot:
        await bot.open("room", config=SMALL)
        for i, turn in enumerate(chatter(80, detail_at=4)):
            body = {"speaker": turn.speaker, "role": turn.role, "text": turn.text, "at": turn.at}
            assert (await bot.request("turn.append", session="room", turn=body))["index"] == i
            await bot.request("context.get", session="room")
        reply = await bot.request(
            "context.get", session="room", format="instructions", budget_chars=2500, query="the support group"
        )
        assert reply["type"] == "context"
        assert reply["query"] == "the support group"
        (found,) = [p for p in reply["recalled"] if p.get("turn") == 4]
        assert found["granularity"] == "sentences"
        assert shown_dated(found["text"], reply["instructions"])
        bad = await bot.request("context.get", session="room", query=["not", "a", "string"])
        assert (bad["type"], bad["code"]) == ("error", "bad_request")
        assert "query" in bad["message"]
        again = await bot.request("context.get", session="room")
        assert again["type"] == "context"  # the connection and the session carry on


# -- with an embedder: vectors computed in the background, the query embedded off the loop ------


@pytest.mark.asyncio
async def test_with_an_embedder_recall_finds_a_paraphrase_no_word_of_the_query_matches() -> None:
    embedder = load_embedder("minilm")
    said = Turn("Melanie", "user", "We adopted a little beagle puppy from the shelter.", T0 - 3600)
    async with SessionManager(DeterministicSummarizer(), embedder=embedder) as manager:
        await manager.open("room", SMALL)
        await manager.append_turn("room", said)
        for turn in chatter(30, 1):
            await manager.append_turn("room", turn)
        query = "Do they have a pet dog?"
        lexical = RecallIndex()
        lexical.add_turns(0, [said, *chatter(30, 1)])
        assert [p.turn for p in lexical.search(query)] == []  # not one word in common
        await manager.settled()  # the background pass has embedded the turns
        ctx = await manager.context("room", "messages", query=query)
    assert 0 in [p.turn for p in ctx.recalled]


DAYS = [
    "Baked bread on Sunday, it came out too dense.",
    "Work is busy, the new release ships Friday.",
    "Rain all afternoon, the garden finally got water.",
    "School concert next week, the kids are nervous.",
    "Finished the mystery novel, the ending surprised me.",
    "My sister visits from Denver next month.",
]


@pytest.mark.asyncio
async def test_an_aggregate_question_gets_the_turns_that_answer_it_though_they_hold_none_of_its_words() -> (
    None
):
    # Melanie tells of her days, twice of a sport; "What sports does she do?" shares no word with any
    sports = {
        13: "Kickboxing class again last night, my legs are sore.",
        37: "Tennis with Anna this morning, I won both sets.",
    }
    turns = [
        Turn("Melanie", "user", sports.get(i, DAYS[(i // 2) % len(DAYS)]), T0 + 60 * i)
        if i % 2
        else Turn("Caroline", "user", "That sounds lovely, tell me more about it.", T0 + 60 * i)
        for i in range(61)
    ]
    query = "What sports does she do?"
    lexical = RecallIndex()
    lexical.add_turns(0, turns)
    assert lexical.search(query) == []  # not one word in common

    async with SessionManager(DeterministicSummarizer(), embedder=load_embedder("minilm")) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", turns)
        await manager.settled()  # the background pass has embedded the turns
        ctx = await manager.context("room", "messages", query=query)
    best = sorted(ctx.recalled, key=lambda p: -p.score)[:2]  # (a context shows them in time order)
    assert {p.turn for p in best} == set(sports), ctx.recalled


class Counting:
    """A real embedder that counts the texts it is given."""

    def __init__(self, name: str) -> None:
        self.inner = load_embedder(name)
        self.texts = 0

    @property
    def name(self) -> str:
        return str(self.inner.name) if self.inner is not None else "none"

    def embed(self, texts: Sequence[str]) -> Any:
        self.texts += len(texts)
        assert self.inner is not None
        return self.inner.embed(texts)


@pytest.mark.asyncio
async def test_vectors_are_kept_in_the_store_and_a_restarted_server_embeds_only_the_query(
    tmp_path: Path,
) -> None:
    said = Turn("Melanie", "user", "We adopted a little beagle puppy from the shelter.", T0 - 3600)
    first, second = Counting("minilm-static"), Counting("minilm-static")
    store = SQLiteStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store, embedder=first) as manager:
        await manager.open("room", SMALL)
        await speak(manager, "room", [said, *chatter(40, 1)])
        with anyio.fail_after(20):
            assert await manager.wait_indexed("room") == 0  # turns indexed and embedded in the background
    await store.aclose()

    store = SQLiteStore(tmp_path / "sessions.db")
    async with SessionManager(DeterministicSummarizer(), store=store, embedder=second) as manager:
        await manager.open("room")
        ctx = await manager.context("room", "messages", query="Do they have a pet dog?")
    await store.aclose()

    assert first.texts >= 41
    assert second.texts == 1, "only the query: the turns' vectors came from the store"
    assert 0 in [p.turn for p in ctx.recalled]


def test_room_left_under_a_budget_extends_the_verbatim_run_past_the_cursor() -> None:
    backchannels = [Turn("Alice", "user", f"Yeah {i}.", T0 + i) for i in range(60, 100)]  # short turns
    folded = TurnRun.of(60, backchannels)
    ctx = build_context(view(n=20), "instructions", budget_chars=4000, older=folded)
    assert ctx.turns_shown > 20 and ctx.first_turn < 100  # the run goes on into turns the summary covers
    assert ctx.first_turn + ctx.turns_shown == 120  # still one run ending at the current turn
    assert "older_turns" not in ctx.dropped
    assert build_context(view(n=20), "messages", older=folded).turns_shown == 20  # no budget: from the cursor


# -- the same ranking, run after run ---------------------------------------------------------

BM25_SCORES = """
from voice_context.recall.index import bm25
words = ["raid", "tokyo", "map", "shield", "luna", "winter", "soldier"]
postings = {w: [(k, 1 + k * j % 3, 5 + k % 7) for k in range(0, 40, 1 + j)] for j, w in enumerate(words)}
print(sorted(bm25(words, postings, 40, 300).items()))
"""


def test_bm25_scores_do_not_depend_on_the_process_s_hash_seed() -> None:
    """A doc's score is a sum over the query's words in one order (a set's order follows the
    process's hash seed, and a float sum its order): two replicas, or two runs, rank alike."""
    env = {**os.environ, "PYTHONPATH": str(Path(voice_context.__file__).parents[1])}
    printed = {
        subprocess.run(
            [sys.executable, "-c", BM25_SCORES],
            env={**env, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("0", "1", "2")
    }
    assert len(printed) == 1


def test_a_session_s_vectors_are_one_matrix_that_answers_as_each_vector_would() -> None:
    """A query is compared with every vector of the session in one product; what it gives is each
    vector's own dot product, for the docs kept, whatever the order they came in and however many
    times the matrix grew."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(7)
    rows = {key: rng.standard_normal(8).astype(np.float32) for key in [*range(200), -1, -2]}
    vectors = Vectors()
    for key in sorted(rows, key=lambda k: (k % 7, k)):  # out of order, a row at a time: it grows
        vectors.update({key: rows[key]})
    rows[5] = rng.standard_normal(8).astype(np.float32)
    vectors[5] = rows[5]  # a vector replaced keeps its row
    assert len(vectors) == 202 and set(vectors) == set(rows)
    query = rng.standard_normal(8).astype(np.float32)
    kept = similarities(vectors, query, lambda key: key < 150)
    assert set(kept) == {key for key in rows if key < 150}
    for key, sim in kept.items():
        assert sim == pytest.approx(float(rows[key] @ query), rel=1e-5, abs=1e-5)
        assert np.array_equal(vectors[key], rows[key])
    assert similarities(Vectors(), query, lambda key: True) == {}


def test_meaning_orders_what_the_words_found_among_near_ties() -> None:
    found = {1: 1.0, 2: 0.98, 3: 0.97, 4: 0.5}  # four turns share the query's words, three nearly equally
    meaning = {1: 0.1, 2: 0.2, 3: 0.9, 4: 0.3, 9: 0.99}  # turn 9 is close in meaning, and holds none of them
    ranked = rerank(found, meaning, limit=3)
    assert [doc for doc, _ in ranked] == [3, 2, 1], "the closest in meaning of the near-ties first"
    assert 9 not in dict(ranked), "the words found enough: meaning adds nothing of its own"


def test_a_decisive_match_keeps_its_place_whatever_the_meaning_says() -> None:
    found = {1: 1.0, 2: 0.3, 3: 0.3}
    meaning = {1: 0.0, 2: 0.9, 3: 0.8}
    assert [doc for doc, _ in rerank(found, meaning, limit=3)] == [1, 2, 3]


def test_where_the_words_find_too_few_the_nearest_in_meaning_fill_below_them_the_newer_first() -> None:
    ranked = rerank({5: 1.0}, {5: 0.2, 7: 0.5, 8: 0.5, 2: 0.1}, limit=3)
    assert [doc for doc, _ in ranked] == [5, 8, 7]  # 7 and 8 are equally close: the newer first
    scores = [score for _, score in ranked]
    assert scores == sorted(scores, reverse=True) and scores[-1] > 0
    assert rerank({}, {}, limit=3) == []


# -- a search is one read of the store ------------------------------------------------------


class ReadTwice:
    """A store whose recall searches read the postings, then the passages, in two reads (as a
    search read them before it was one read; see :func:`helpers.read_twice`)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def recall_search(self, name: str, terms: Sequence[str], choose: ChooseTerms, pick: Any) -> Any:
        return await read_twice(self.store, name, terms, choose, pick)


HISTORY_WORDS = (
    "locker code gym raid healer coffee lisbon porto train ticket window seat sister wedding dog "
    "vet paint guitar lesson marathon knee doctor recipe lasagna garden tomato camping lake"
).split()
HISTORY_DATES = ("yesterday", "last week", "in May", "on 3 May 2023", "last Friday", "this month")


def said_at_random(rng: random.Random, n: int) -> list[Turn]:
    """``n`` turns of common and rare words (a few dated, a few asking), an hour apart."""
    weights = [1 / (rank + 1) for rank in range(len(HISTORY_WORDS))]
    out = []
    for i in range(n):
        words = rng.choices(HISTORY_WORDS, weights, k=rng.randint(2, 12))
        if rng.random() < 0.15:
            words.append(rng.choice(HISTORY_DATES))
        text = " ".join(words) + ("?" if rng.random() < 0.2 else ".")
        who, role = ("Caroline", "assistant") if i % 2 == 0 else ("Melanie", "user")
        out.append(Turn(who, role, text, T0 + 3600 * i))
    return out


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.asyncio
async def test_a_search_in_one_read_finds_what_it_found_in_two(kind: str, tmp_path: Path) -> None:
    import numpy as np

    rng = random.Random(34)
    store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "sessions.db")
    lengths = {"one": 40, "two": 150, "three": 90}
    vectors: dict[str, dict[int, Any]] = {}
    for name, n in lengths.items():
        await store.create(SessionRecord(name))
        said = said_at_random(rng, n)
        for i, turn in enumerate(said):
            await store.append_turn(name, i, turn)
        await store.index_turns(name, 0, [indexed(turn_passage(i, turn)) for i, turn in enumerate(said)])
        for k in range(5):
            note = Note(f"{rng.choice(HISTORY_WORDS)} on screen", T0 + 7200 * k, speaker="Melanie")
            await store.index_note(name, indexed(note_passage(note)))
        units = np.random.default_rng(len(vectors)).normal(size=(n + 5, 8)).astype(np.float32)
        units /= np.linalg.norm(units, axis=1, keepdims=True)
        vectors[name] = dict(zip([*range(n), *range(-1, -6, -1)], units, strict=True))

    found_any = 0
    for _ in range(300):
        name = rng.choice(list(lengths))
        query = " ".join(rng.sample(HISTORY_WORDS, rng.randint(1, 5)))
        if rng.random() < 0.3:
            query += " " + rng.choice(HISTORY_DATES)
        vector = None
        if rng.random() < 0.3:
            vector = vectors[name][rng.randrange(lengths[name])]
        asked: dict[str, Any] = dict(
            before=rng.randint(0, lengths[name]),
            limit=rng.randint(1, 28),
            query_vector=vector,
            vectors=vectors[name],
            now=T0 + 3600 * lengths[name],
            common=rng.choice([1.0, DEFAULT_QUERY_COMMON]),
        )

        found = await search_store(store, name, query, **asked)

        assert found == await search_store(ReadTwice(store), name, query, **asked), query
        found_any += bool(found[1])
    assert found_any > 200
    await store.aclose()


def test_a_search_reads_the_held_turns_as_they_were_when_it_was_asked() -> None:
    """A search reads the held docs in the store's thread while the event loop holds more:
    what it was given is what it counts, and docs written to the store meanwhile are counted
    once, from the store."""
    docs = [indexed(turn_passage(i, turn)) for i, turn in enumerate(chatter(40, detail_at=33))]
    held = HeldTurns(30, docs[30:34])
    asked = held.view()
    for doc in docs[34:]:
        held.add(doc)  # turns held after the search was asked for
    left = held.after(32)  # turns 30 and 31 written meanwhile

    def over(view: HeldView, store_turns: int) -> tuple[RecallStats, dict[str, int]]:
        stats, df, _ = Tail(view, ["lgbtq", "round"]).over(
            RecallStats(store_turns, 10 * store_turns, store_turns)
        )
        return stats, df

    assert over(asked, 30) == (
        RecallStats(34, 300 + sum(d.length for d in docs[30:34]), 34),
        {"lgbtq": 1, "round": 3},
    )
    assert over(asked, 32)[0].turns == 34, "the two written meanwhile are the store's, counted once"
    assert over(held.view(), 30)[0].turns == 40 and over(left.view(), 32)[0].turns == 40
    assert over(HeldTurns(31, docs[31:34]).view(), 30)[0].turns == 30, "a gap: nothing added"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@pytest.mark.asyncio
async def test_a_search_finds_the_turns_held_in_memory_as_if_the_store_held_them(
    kind: str, tmp_path: Path
) -> None:
    """The process serving a session holds its newest turns until a batch is written: a search
    given them ranks them with the store's index exactly as an index that holds them all, the
    same passages with the same scores. The store may have written some of them meanwhile
    (the held docs then overlap its index): those are counted once."""
    rng = random.Random(29)

    def open_store(label: str) -> Store:
        return MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / f"{label}.db")

    whole, part = open_store("whole"), open_store("part")
    said = said_at_random(rng, 120)
    docs = [indexed(turn_passage(i, turn)) for i, turn in enumerate(said)]
    notes = [
        indexed(note_passage(Note(f"{w} on screen", T0 + 7200 * k))) for k, w in enumerate(HISTORY_WORDS[::7])
    ]
    for store in (whole, part):
        await store.create(SessionRecord("room"))
        for i, turn in enumerate(said):
            await store.append_turn("room", i, turn)
        for note in notes:
            await store.index_note("room", note)
    await whole.index_turns("room", 0, docs)
    await part.index_turns("room", 0, docs[:90])  # the store's index holds turns 0-89

    found_any = 0
    for _ in range(200):
        start = rng.choice([90, 90, 80, 60])  # held from turn 90, or from before: written meanwhile
        query = " ".join(rng.sample(HISTORY_WORDS, rng.randint(1, 5)))
        if rng.random() < 0.3:
            query += " " + rng.choice(HISTORY_DATES)
        asked: dict[str, Any] = dict(
            before=rng.randint(60, 120),
            limit=rng.randint(1, 28),
            now=T0 + 3600 * 120,
            common=rng.choice([1.0, DEFAULT_QUERY_COMMON]),
        )

        held = await search_store(part, "room", query, held=HeldTurns(start, docs[start:]).view(), **asked)

        assert held == await search_store(whole, "room", query, **asked), query
        found_any += any(p.turn is not None and p.turn >= 90 for p in held[1])
    assert found_any > 50
    for store in (whole, part):
        await store.aclose()


# -- a question about one speaker, what that speaker said ------------------------------------------


def test_a_question_naming_one_speaker_ranks_that_speakers_turn_first() -> None:
    index = RecallIndex()
    bob = "We rode the harbour ferry to Porto in June, my sister and I, and it rained."
    index.add_turns(
        0,
        [
            Turn("Bob", "user", bob, T0),
            Turn("Alice", "user", "Bob, the harbour ferry to Porto is lovely.", T0 + 60),
            Turn("Bob", "user", "Sure, sounds fun.", T0 + 120),
        ],
    )
    # Alice's turn holds the query's words in fewer: it outranks Bob's, which tells what was asked
    (best, *_) = index.search("When did Bob take the harbour ferry to Porto?")
    assert best.turn == 0
    # the newest user turn as the query (not asked for) is ranked as it was: names in it are
    # more often said to someone than asked about
    (best, *_) = index.search("Bob, take the harbour ferry to Porto", common=DEFAULT_QUERY_COMMON)
    assert best.turn == 1


def test_a_question_the_named_speaker_answers_keeps_its_place_with_the_answer() -> None:
    index = RecallIndex()
    index.add_turns(
        0,
        [
            Turn("Alice", "user", "Bob, which pottery class did you sign up for?", T0),
            Turn("Bob", "user", "The Thursday wheel-throwing one!", T0 + 60),
            Turn("Bob", "user", "I love pottery.", T0 + 120),
        ],
    )
    (best, *_) = index.search("Which pottery class did Bob sign up for?")
    assert best.turn == 0 and "Bob: The Thursday wheel-throwing one!" in best.line


def test_recalled_lines_of_one_day_say_the_day_once() -> None:
    offered = [
        Recalled("turn", 3, "[8 May 2023, 13:59] Melanie: I went to a support group.", 2.0, at=T0 + 180),
        Recalled("turn", 5, "[8 May 2023, 14:01] Caroline: It helped me a lot.", 1.5, at=T0 + 300),
        Recalled("turn", 9, "[9 May 2023, 10:00] Melanie: The group meets on Fridays.", 1.0, at=T0 + 86_400),
    ]
    ctx = build_context(view(), "instructions", budget_chars=4000, recalled=offered)
    section = ctx.instructions[ctx.instructions.index(RECALL_HEADER) :].split("\n\n")[0]
    assert section.split("\n- ")[1:] == [
        "[8 May 2023, 13:59] Melanie: I went to a support group.",
        "[14:01] Caroline: It helped me a lot.",
        "[9 May 2023, 10:00] Melanie: The group meets on Fridays.",
    ]
    assert [p.line for p in ctx.recalled] == [p.line for p in offered], "what the reply says it recalled"
    assert ctx.chars == len(ctx.instructions)


def test_an_aggregate_question_gets_the_turns_that_answer_it_though_none_holds_its_words() -> None:
    """ "What activities does Melanie do?": her turns answer it, and say neither "activities" nor
    "do"; the other speaker's turns that hold the word answer nothing about her."""
    talk = [
        ("Caroline", "The center runs group activities for teens every week."),
        ("Melanie", "I signed up for a pottery class on Thursdays."),
        ("Caroline", "Those activities keep the kids busy after school."),
        ("Melanie", "We went camping at the beach with the kids."),
        ("Caroline", "Outdoor activities are my favourite part of the job."),
        ("Melanie", "I swim in the lake most mornings."),
        ("Caroline", "Good for you!"),
    ]
    index = RecallIndex()
    index.add_turns(0, [Turn(who, "user", text, T0 + 60 * k) for k, (who, text) in enumerate(talk)])
    found = index.search("What activities does Melanie do?", limit=3)
    assert sorted(p.turn for p in found) == [1, 3, 5]
