"""The deterministic summarizer: what it keeps, how it writes it, and how it shrinks."""

from __future__ import annotations

from datetime import UTC, datetime

import anyio

from voice_context.core.turns import Note, Turn
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.deterministic import (
    DeterministicSummarizer,
    is_filler,
    resolve_dates,
    shorten,
    spoken_numbers,
)

#: Monday 8 May 2023, 13:56 UTC
MONDAY = datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()


def fold(turns: list[Turn], previous: str = "", max_chars: int = 4000, notes: tuple[Note, ...] = ()) -> str:
    request = SummaryRequest(previous_summary=previous, turns=turns, notes=notes, max_chars=max_chars)
    return anyio.run(DeterministicSummarizer().summarize, request)


def test_it_is_a_summarizer_named_deterministic() -> None:
    summarizer = DeterministicSummarizer()
    assert isinstance(summarizer, Summarizer)
    assert summarizer.model == "deterministic"


def test_a_batch_becomes_one_dated_line_of_attributed_sentences() -> None:
    text = fold(
        [
            Turn("Caroline", "user", "Hey Mel! Good to see you! How have you been?", MONDAY),
            Turn("Melanie", "user", "Hey Caroline! I'm swamped with the kids & work.", MONDAY + 20),
            Turn("Caroline", "user", "I went to a LGBTQ support group yesterday.", MONDAY + 40),
        ]
    )
    assert "\n" not in text
    assert text.startswith("[8 May 2023, 13:56] ")
    assert "Caroline: I went to a LGBTQ support group on 7 May 2023." in text
    assert "Melanie: I'm swamped with the kids & work." in text
    assert "Good to see you" not in text and "Hey" not in text


def test_the_next_batch_on_the_same_day_is_headed_by_its_time_only() -> None:
    first = fold([Turn("Alice", "user", "The raid on Porto starts at nine.", MONDAY)])
    second = fold([Turn("Bob", "user", "I will bring 40 potions.", MONDAY + 600)], previous=first)
    assert second == first + "\n[14:06] Bob: I will bring 40 potions."
    next_day = fold([Turn("Bob", "user", "We lost the raid in Porto.", MONDAY + 86_400)], previous=second)
    assert next_day.endswith("\n[9 May 2023, 13:56] Bob: We lost the raid in Porto.")


def test_relative_dates_are_resolved_against_the_time_they_were_said() -> None:
    assert resolve_dates("I joined a gym last week", MONDAY) == "I joined a gym the week before 8 May 2023"
    assert resolve_dates("Last year, I renovated it", MONDAY) == "in 2022, I renovated it"
    assert resolve_dates("since yesterday", MONDAY) == "since 7 May 2023"
    assert resolve_dates("we met last Fri", MONDAY) == "we met on Friday 5 May 2023"
    assert resolve_dates("two days ago", MONDAY) == "on 6 May 2023"
    assert resolve_dates("next month", MONDAY) == "in June 2023"
    assert resolve_dates("a few days ago", MONDAY) == "a few days before 8 May 2023"


def test_spoken_numbers_become_digits_but_counts_and_pronouns_stay_words() -> None:
    assert spoken_numbers("it sells for twenty five Euro") == "it sells for 25 Euro"
    assert spoken_numbers("twelve point five a unit") == "12.5 a unit"
    assert spoken_numbers("two hundred and fifty people") == "250 people"
    assert spoken_numbers("one two three") == "one two three"
    assert spoken_numbers("the one I like") == "the one I like"


def test_filler_and_small_talk_are_dropped_and_sentences_shortened() -> None:
    for filler in ("hi", "yeah", "haha", "ok", "That's awesome!", "Good to see you!", "Thanks so much!"):
        assert is_filler(filler), filler
    assert not is_filler("The remote sells for 25 Euro.")
    assert shorten("Um well this is the kick-off meeting for our our project.") == (
        "This is the kick-off meeting for our project."
    )
    assert shorten("Wow, Caroline! I really love the painting, Mel.", ["Caroline", "Melanie"]) == (
        "I love the painting."
    )


def test_a_sentence_that_starts_like_a_label_is_not_taken_for_a_speaker_later() -> None:
    first = fold([Turn("Nova", "assistant", "Budget: 9000 approved. Rooms cost 4968.", MONDAY)])
    assert "Budget - 9000 approved." in first
    again = fold(
        [Turn("Bob", "user", "I booked the flights to Lisbon.", MONDAY + 60)], previous=first, max_chars=95
    )
    assert "Budget:" not in again


def test_filler_adds_nothing_to_an_existing_summary_and_a_first_filler_batch_says_so() -> None:
    filler = [Turn("Alice", "user", "hi", MONDAY), Turn("Bob", "user", "haha ok", MONDAY + 1)]
    assert fold(filler, previous="Alice adopted a cat named Miso.") == "Alice adopted a cat named Miso."
    assert fold(filler) == "[8 May 2023, 13:56] Alice and Bob made small talk."


def test_screen_notes_are_folded_in_with_their_provenance() -> None:
    note = Note("a photo of a painting of a sunset over a lake", MONDAY, speaker="Melanie", source="image")
    text = fold([Turn("Melanie", "user", "I painted this in Tahoe.", MONDAY)], notes=(note,))
    assert "Melanie's screen (image): A painting of a sunset over a lake." in text


CITIES = "Lisbon Porto Berlin Oslo Tahoe Lyon Quito Perth Dakar Hanoi Cusco Turku".split()


def test_when_it_must_shrink_older_lines_grow_coarser_but_stay() -> None:
    previous = ""
    for day, city in enumerate(CITIES):
        batch = [
            Turn("Alice", "user", f"I flew to {city} with {day + 2} friends.", MONDAY + day * 86_400),
            Turn(
                "Bob",
                "user",
                f"My cousin Rui opened a bakery in {city} in {2010 + day}.",
                MONDAY + day * 86_400,
            ),
            Turn("Alice", "user", f"We hiked {day + 10} kilometres along the coast near {city}.", MONDAY),
            Turn("Bob", "user", f"The {city} museum closes on Mondays at {day + 3} pm.", MONDAY),
        ]
        previous = fold(batch, previous=previous, max_chars=1400)
        assert len(previous) <= 1400
    lines = previous.split("\n")
    assert lines[0].startswith("[8 May 2023, 13:56] ") and "Lisbon" in lines[0]  # the oldest window stays
    assert lines[-1].startswith("[19 May 2023, 13:56] ")
    assert lines[0].count(".") < lines[-1].count(".")  # but it keeps fewer sentences than the newest


def test_every_output_fits_even_a_tiny_budget() -> None:
    long_turn = Turn("Alice", "user", "Porto " * 200, MONDAY)
    for limit in (40, 41, 77, 120):
        assert 0 < len(fold([long_turn], max_chars=limit)) <= limit


def test_the_same_request_always_gives_the_same_summary() -> None:
    turns = [
        Turn("Alice", "user", f"We moved the launch to {d} June in Lisbon.", MONDAY + d) for d in range(10)
    ]
    assert fold(turns, max_chars=300) == fold(turns, max_chars=300)
