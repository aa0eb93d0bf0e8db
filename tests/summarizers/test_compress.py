"""Deterministic compression: filler, exact and fuzzy duplicates, force-converge, and where it runs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from helpers import wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from voice_context.core.turns import Turn
from voice_context.manager import SessionManager
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.compress import compress, line_of
from voice_context.summarizers.fallback import FallbackSummarizer, deterministic_fold
from voice_context.summarizers.openai_compat import OpenAISummarizer
from voice_context.testing.openai_server import Empty, OpenAIServer, Reply, Stall, Status
from voice_context.tokenizers import load_tokenizer

T0 = 1714572187.0


def said(*lines: str) -> list[Turn]:
    """Turns from ``"Speaker: text"`` lines, a second apart."""
    out = []
    for i, line in enumerate(lines):
        speaker, _, text = line.partition(": ")
        out.append(Turn(speaker, "user", text, T0 + i))
    return out


def texts(turns: tuple[Turn, ...] | list[Turn]) -> list[str]:
    return [line_of(t) for t in turns]


# -- filler ----------------------------------------------------------------------------------


def test_backchannels_greetings_and_laughter_go_and_a_sentence_that_says_something_stays() -> None:
    done = compress(said("Bob: yeah", "Ann: lol", "Bob: Bye!", "Ann: Yeah, the raid is at nine.", "Bob: ok"))
    assert texts(done.turns) == ["Ann: Yeah, the raid is at nine."]
    assert done.filler == 4


def test_disfluencies_leave_a_turn_and_a_word_that_contains_them_does_not() -> None:
    done = compress(said("Ann: Um, we fly at nine, uh, from Porto.", "Bob: The drummer hummed a number."))
    assert texts(done.turns) == ["Ann: we fly at nine, from Porto.", "Bob: The drummer hummed a number."]


# -- exact duplicates --------------------------------------------------------------------------


def test_the_same_words_again_go_whatever_the_case_spacing_punctuation_or_speaker() -> None:
    done = compress(
        said("Ann: The raid is at nine.", "Bob: the raid  is at NINE", "Ann: The raid is at nine!")
    )
    assert texts(done.turns) == ["Ann: The raid is at nine."]
    assert done.exact == 2


def test_an_exact_repeat_goes_however_far_back_the_first_was() -> None:
    filler = [f"Ann: Point {i} is about the budget line {i}." for i in range(40)]
    done = compress(said("Bob: We book Lisbon for May 3rd.", *filler, "Bob: We book Lisbon for May 3rd."))
    assert done.exact == 1 and len(done.turns) == 41


# -- fuzzy duplicates ---------------------------------------------------------------------------


def test_a_rephrasing_within_90_goes() -> None:
    done = compress(
        said(
            "Ann: We should book the Lisbon flight for May 3rd.",
            "Bob: We should book the Lisbon flights for May 3rd",
        )
    )
    assert texts(done.turns) == ["Ann: We should book the Lisbon flight for May 3rd."]
    assert done.fuzzy == 1


@pytest.mark.parametrize(
    "first, second",
    [
        ("We meet on Friday at 9 in the lobby.", "We meet on Friday at 10 in the lobby."),  # a number differs
        ("Book the Lisbon flight for May 3rd.", "Cancel the Porto hotel for June 9th."),  # a different plan
        ("Take lane A.", "Take lane B."),  # short: only ever an exact duplicate
        ("We should book the Lisbon flight now.", "We should not book the Lisbon flight now, ever."),
    ],
)
def test_near_misses_are_kept(first: str, second: str) -> None:
    done = compress(said(f"Ann: {first}", f"Bob: {second}"))
    assert len(done.turns) == 2, done


def test_a_rephrasing_further_back_than_the_window_is_kept() -> None:
    between = [f"Ann: Item {i} of the packing list is sorted." for i in range(20)]
    done = compress(
        said(
            "Bob: We should book the Lisbon flight for May.",
            *between,
            "Bob: We should book the Lisbon flights for May",
        ),
        window=16,
    )
    assert done.fuzzy == 0 and len(done.turns) == 22


# -- protected turns and force-converge -----------------------------------------------------------


def test_protected_turns_are_never_dropped_as_filler_or_duplicates() -> None:
    done = compress(said("Ann: ok", "Bob: The raid is at nine.", "Ann: The raid is at nine."), keep={0, 2})
    assert texts(done.turns) == ["Ann: ok", "Bob: The raid is at nine.", "Ann: The raid is at nine."]


def test_force_converge_keeps_the_protected_then_the_newest_whole_then_older_ones_cut() -> None:
    turns = said(
        *(f"Ann: Plan {i} is set. It has many details we will not need later on." for i in range(10))
    )
    budget = 260
    done = compress(turns, budget_chars=budget, keep={0})
    assert done.chars_after <= budget
    assert done.kept[0] == 0 and done.turns[0] == turns[0], "the protected turn stays whole"
    assert done.kept == tuple(sorted(done.kept)), "order is kept"
    assert done.turns[-1] == turns[-1], "the newest stays whole"
    assert done.clipped and done.converged
    cut = [t.text.endswith("…") for t in done.turns[1:]]
    assert cut == sorted(cut, reverse=True) and cut[0], "the older ones are cut to their first sentence"


def test_protected_turns_that_alone_exceed_the_budget_are_cut_too() -> None:
    turns = said(*(f"Ann: Rule {i} holds. It has a long justification attached to it." for i in range(6)))
    done = compress(turns, budget_chars=120, keep=set(range(6)))
    assert done.chars_after <= 120 and done.turns


def test_force_converge_in_tokens() -> None:
    counter = load_tokenizer("o200k_base")
    turns = said(*(f"Ann: Option {i}: Lisbon or Porto? We weigh costs, dates and seats." for i in range(30)))
    done = compress(turns, budget_tokens=120, counter=counter)
    assert sum(counter.count(line_of(t)) + 1 for t in done.turns) <= 120
    assert done.turns and done.turns[-1] == turns[-1], "the newest survive whole"


WORD = st.sampled_from(
    ["raid", "nine", "Porto", "42", "yeah", "ok", "um", "the", "is", "at", "Lisbon", "lol"]
)
TEXT = st.lists(WORD, min_size=1, max_size=12).map(" ".join)


@settings(max_examples=200, deadline=None)
@given(
    texts_=st.lists(TEXT, max_size=40),
    budget=st.integers(0, 600),
    keep=st.sets(st.integers(0, 39), max_size=5),
)
def test_whatever_the_turns_the_result_fits_and_keeps_their_order(
    texts_: list[str], budget: int, keep: set[int]
) -> None:
    turns = [Turn(("Ann", "Bob")[i % 2], "user", text, T0 + i) for i, text in enumerate(texts_)]
    done = compress(turns, budget_chars=budget, keep=keep)
    assert sum(len(line_of(t)) + 1 for t in done.turns) <= budget
    assert list(done.kept) == sorted(done.kept)
    for position, turn in zip(done.kept, done.turns, strict=True):
        original = turns[position]
        assert (turn.speaker, turn.at) == (original.speaker, original.at)
        if position in keep and not turn.text.endswith("…"):
            assert turn == original, "a protected turn is never rewritten, only cut to fit"


# -- where it runs: before the model, and instead of it ------------------------------------------


@pytest_asyncio.fixture
async def model_server() -> AsyncIterator[OpenAIServer]:
    async with OpenAIServer(default=Reply("Ann and Bob chose Lisbon on 3 May, window seats.")) as running:
        yield running


REPEATS = said(
    "Ann: We fly to Lisbon on May 3rd.",
    "Bob: yeah",
    "Bob: We fly to Lisbon on May 3rd!",
    "Ann: We should take the window seats for May 3rd.",
    "Bob: We should take the window seat for May 3rd",
    "Ann: lol ok",
)


@pytest.mark.asyncio
async def test_the_model_is_sent_the_compressed_batch(model_server: OpenAIServer) -> None:
    request = SummaryRequest("", REPEATS, max_chars=1200)
    # the paragraph fold sends the transcript itself (the lines fold, its dated notes)
    async with OpenAISummarizer(
        model="m", base_url=model_server.base_url, max_retries=0, fold="paragraph"
    ) as model:
        with capture_logs() as logs:
            await model.summarize(request)
    sent = str(model_server.completions[-1].json["messages"])
    async with OpenAISummarizer(
        model="m", base_url=model_server.base_url, max_retries=0, compress_input=False, fold="paragraph"
    ) as plain:
        await plain.summarize(request)
    unpressed = str(model_server.completions[-1].json["messages"])
    assert "lol ok" in unpressed and "lol ok" not in sent
    assert sent.count("Lisbon on May 3rd") < unpressed.count("Lisbon on May 3rd")
    assert len(sent) < len(unpressed)
    [event] = [e for e in logs if e["event"] == "summary_input_compressed"]
    assert (event["turns"], event["kept"]) == (6, 2)
    assert event["chars_after"] < event["chars_before"]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "behaviour, error",
    [(Status(500), "server_error"), (Empty(), "malformed"), (Stall(30), "timeout")],
    ids=["error", "empty", "stall"],
)
async def test_when_the_model_fails_the_batch_is_folded_deterministically_and_the_cursor_moves(
    model_server: OpenAIServer, behaviour: Status | Empty | Stall, error: str
) -> None:
    model_server.script(behaviour)
    model = OpenAISummarizer(model="m", base_url=model_server.base_url, max_retries=0, timeout=5)
    summarizer = FallbackSummarizer(model, deadline=1.0)
    async with SessionManager(summarizer, compaction_timeout=5) as manager:
        await manager.open("room", {"recent_window": 2, "batch_size": 4})
        for turn in [*REPEATS, *said("Ann: Seats 14A and 14B.", "Bob: Booked.")]:
            await manager.append_turn("room", turn)
        with capture_logs() as logs:
            await manager.context("room")
            await wait_until(lambda: manager.state("room").cursor == 4)
        assert manager.state("room").failures == 0, "a fallback is a fold, not a failure"
        assert "Lisbon" in manager.session("room").summary
        assert [e["error"] for e in logs if e["event"] == "summary_fallback"] == [error]
    await model.aclose()


def test_the_deterministic_fold_carries_the_batch_without_its_repeats() -> None:
    folded = deterministic_fold(SummaryRequest("", REPEATS, max_chars=400))
    assert "Lisbon" in folded and folded.count("Lisbon") == 1
    assert len(folded) <= 400
