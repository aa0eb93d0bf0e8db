"""The deterministic summarizer: what it keeps, how it writes it, and how it shrinks."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import anyio
import pytest
from helpers import ROOT
from hypothesis import given
from hypothesis import strategies as st

from voice_context.codec import NoteAppend, TurnAppend
from voice_context.core.config import BATCH_SIZE
from voice_context.core.language import words
from voice_context.core.language.dates import RELATIVE_DATE, _resolve, resolve_dates
from voice_context.core.language.numbers import spoken_numbers
from voice_context.core.language.small_talk import is_filler, shorten
from voice_context.core.times import utc
from voice_context.core.turns import Note, Turn
from voice_context.summarizers import deterministic
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.deterministic import LINE_CHARS, SESSION_GAP, DeterministicSummarizer
from voice_context.tuning.replay import read_recording

#: Monday 8 May 2023, 13:56 UTC
MONDAY = datetime(2023, 5, 8, 13, 56, tzinfo=UTC).timestamp()
RAID_NIGHT = ROOT / "fixtures" / "raid-night.jsonl"


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


def test_every_line_carries_its_full_date_so_a_line_read_alone_still_says_when() -> None:
    first = fold([Turn("Alice", "user", "The raid on Porto starts at nine.", MONDAY)])
    # the next batch of the same conversation joins the line while it is short
    second = fold([Turn("Bob", "user", "I will bring 40 potions.", MONDAY + 600)], previous=first)
    assert second == "[8 May 2023, 13:56] Alice: The raid on Porto starts at 9. Bob: I will bring 40 potions."
    next_day = fold([Turn("Bob", "user", "We lost the raid in Porto.", MONDAY + 86_400)], previous=second)
    assert next_day == second + "\n[9 May 2023, 13:56] Bob: We lost the raid in Porto."
    # a summary written before every line was dated gets its dates back on the next fold
    old = "[8 May 2023, 13:56] Alice: The raid on Porto starts at 9.\n[14:06] Bob: I will bring 40 potions."
    assert fold([Turn("Bob", "user", "We lost the raid.", MONDAY + 900)], previous=old).split("\n") == [
        "[8 May 2023, 13:56] Alice: The raid on Porto starts at 9.",
        "[8 May 2023, 14:06] Bob: I will bring 40 potions. We lost the raid.",
    ]


def test_a_line_full_of_one_conversation_leaves_the_next_batch_a_line_of_its_own() -> None:
    summary = ""
    for k in range(20):
        said = f"Table {k} at the Porto bistro is booked for {k + 2} people on the terrace near the harbour."
        summary = fold([Turn("Alice", "user", said, MONDAY + 60 * k)], previous=summary)
    lines = summary.split("\n")
    assert len(lines) > 1 and all(len(line) <= LINE_CHARS for line in lines)
    assert all(line.startswith("[8 May 2023, 1") for line in lines)


def test_a_batch_that_spans_two_conversations_is_filed_under_each_ones_date() -> None:
    june_26 = datetime(2023, 6, 26, 18, 0, tzinfo=UTC).timestamp()
    july_9 = datetime(2023, 7, 9, 10, 0, tzinfo=UTC).timestamp()
    text = fold(
        [
            Turn("Jolene", "user", "My snake Seraphim escaped twice this month.", june_26),
            Turn("Deborah", "user", "Bye Jolene, ttyl!", june_26 + 20),
            Turn("Deborah", "user", "I started a running group with Anna.", july_9),
        ]
    )
    assert text.split("\n") == [
        "[26 June 2023, 18:00] Jolene: My snake Seraphim escaped twice in June 2023.",
        "[9 July 2023, 10:00] Deborah: I started a running group with Anna.",
    ]


def test_a_long_pause_on_the_same_day_starts_a_new_line_and_so_does_midnight() -> None:
    morning = fold(
        [
            Turn("Tom", "user", "The patch for Hollow Knight is downloading.", MONDAY),
            Turn("Tom", "user", "I fixed the router in the garage.", MONDAY + SESSION_GAP + 60),
        ]
    )
    assert [line[:21] for line in morning.split("\n")] == ["[8 May 2023, 13:56] T", "[8 May 2023, 15:57] T"]
    late = datetime(2023, 5, 8, 23, 59, tzinfo=UTC).timestamp()
    night = fold(
        [
            Turn("Tom", "user", "The server in Oslo went down.", late),
            Turn("Tom", "user", "It came back after 40 minutes.", late + 120),
        ]
    )
    assert [line[:20] for line in night.split("\n")] == ["[8 May 2023, 23:59] ", "[9 May 2023, 00:01] "]


def test_sentences_keep_the_order_they_were_said_in() -> None:
    text = fold(
        [
            Turn("Tom", "user", "I'm still downloading the patch.", MONDAY),
            Turn("Priya", "user", "It's 40 gigabytes, tell me when it's done.", MONDAY + 20),
            Turn("Tom", "user", "Patch 1.4 is done!", MONDAY + 40),
        ]
    )
    assert text == (
        "[8 May 2023, 13:56] Tom: I'm still downloading the patch. "
        "Priya: It's 40 gigabytes, tell me when it's done. Tom: Patch 1.4 is done!"
    )


def test_a_note_is_filed_under_the_day_it_was_seen_not_the_day_of_the_batch_that_folds_it() -> None:
    june_26 = datetime(2023, 6, 26, 18, 0, tzinfo=UTC).timestamp()
    july_9 = datetime(2023, 7, 9, 10, 0, tzinfo=UTC).timestamp()
    # the note waited in the live buffer: it is folded with turns from two weeks before it
    seen_later = Note("a photo of a snake on a warm rock", july_9 + 30, speaker="Jolene", source="image")
    first = fold([Turn("Jolene", "user", "Seraphim escaped twice this month.", june_26)], notes=(seen_later,))
    assert first.split("\n") == [
        "[26 June 2023, 18:00] Jolene: Seraphim escaped twice in June 2023.",
        "[9 July 2023, 10:00] Jolene's screen (image): A snake on a warm rock.",
    ]
    # the turns it was seen with, folded later, take it into their line
    then = fold(
        [
            Turn("Jolene", "user", "Susie loves the heat lamp I bought.", july_9),
            Turn("Deborah", "user", "I started a running group with Anna.", july_9 + 60),
        ],
        previous=first,
    )
    assert then.split("\n")[1] == (
        "[9 July 2023, 10:00] Jolene: Susie loves the heat lamp I bought. "
        "Deborah: I started a running group with Anna. Jolene's screen (image): A snake on a warm rock."
    )
    # and a note seen during turns folded long ago joins their line
    late_note = Note("a photo of a running track", july_9 + 90, speaker="Deborah", source="image")
    again = fold([], previous=then, notes=(late_note,))
    assert again.split("\n")[1].endswith("Deborah's screen (image): A running track.")
    assert again.count("\n") == 1


def test_a_note_seen_before_the_newest_stretch_joins_its_own_conversation_and_the_batch_stays_in_order() -> (
    None
):
    night = datetime(2023, 5, 8, 21, 30, tzinfo=UTC).timestamp()
    cities = ["Porto", "Oslo", "Lisbon", "Tahoe", "Kyoto", "Lima", "Quito", "Rabat"]

    def bookings(first: int, at: float) -> list[Turn]:  # long enough that two folds make two lines
        return [
            Turn(
                "Alice",
                "user",
                f"I booked table {first + k} in {city} for {first + k + 2} guests.",
                at + 20 * k,
            )
            for k, city in enumerate(cities)
        ]

    summary = fold(bookings(0, night))
    summary = fold(bookings(8, night + 600), previous=summary)
    # a photo seen at 21:30 waited in the live buffer while the 21:40 bookings were folded
    photo = Note("a photo of dish 0", night + 30, speaker="Alice", source="image")
    summary = fold(bookings(16, night + 1200), previous=summary, notes=(photo,))
    lines = summary.split("\n")
    assert [line[: len("[8 May 2023, 21:30]")] for line in lines] == [
        "[8 May 2023, 21:30]",
        "[8 May 2023, 21:40]",
        "[8 May 2023, 21:50]",
    ]
    assert lines[0].endswith("Alice's screen (image): Dish 0.")
    tables = [int(k) for k in re.findall(r"table (\d+)", summary)]
    assert tables == sorted(tables), "the 21:50 bookings are not told before the 21:40 ones"


def test_goodbyes_cheers_and_emoticons_are_filler() -> None:
    for filler in (
        "Ttyl, Bye!",
        "Gotta run bye!",
        "<3.",
        "Woohoo!",
        "Take care!",
        "See you later :)",
        "Bye!",
    ):
        assert is_filler(filler), filler
    text = fold(
        [
            Turn("Deborah", "user", "Thanks Jolene! Bye Jolene.", MONDAY),
            Turn("Jolene", "user", "Yay, I got the job at the Lisbon aquarium! <3", MONDAY + 20),
        ]
    )
    assert text == "[8 May 2023, 13:56] Jolene: Yay, I got the job at the Lisbon aquarium!"


def test_a_sentence_stays_whole_when_its_relative_date_is_resolved() -> None:
    saturday = datetime(2023, 7, 8, 12, 0, tzinfo=UTC).timestamp()
    said = [
        ("Last Friday was amazing - I had a picnic with my girlfriend.", None),
        ("Since we last talked, so much has happened.", None),
        ("I spent yesterday at the beach in Tahoe.", None),
        ("Time flies, it feels like yesterday I put this dress on!", None),
    ]
    text = fold([Turn("Calvin", "user", t, saturday + 20 * i) for i, (t, _) in enumerate(said)])
    assert "Calvin: Last Friday (7 July 2023) was amazing. I had a picnic with my girlfriend." in text
    assert "Since we last talked, so much has happened." in text
    assert "I spent yesterday (7 July 2023) at the beach in Tahoe." in text
    assert "it feels like yesterday (7 July 2023) I put this dress on!" in text
    # where the words are an adverb, the date takes their place
    assert resolve_dates("I went to a support group yesterday and it was great", MONDAY) == (
        "I went to a support group on 7 May 2023 and it was great"
    )
    assert resolve_dates("Yesterday I went", MONDAY) == "on 7 May 2023 I went"
    assert resolve_dates("Last year was tough", MONDAY) == "Last year (2022) was tough"
    assert resolve_dates("for the past year", MONDAY) == "for the past year"


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


def test_letters_that_only_fold_to_a_number_word_s_are_left_as_they_are() -> None:
    # Unicode case folding takes a long s for "s" and a dotless i for "i": no number words
    assert spoken_numbers("ſix fıve and Twenty Two") == "ſix fıve and 22"


def test_filler_and_small_talk_are_dropped_and_sentences_shortened() -> None:
    for filler in ("hi", "yeah", "haha", "ok", "That's awesome!", "Good to see you!", "Thanks so much!"):
        assert is_filler(filler), filler
    for filler in ("Copy that!", "Roger.", "Go go go!", "On it.", "Nice shot!", "gg", "Loud and clear."):
        assert is_filler(filler), filler  # voice-chat acknowledgements and callouts
    assert is_filler("Evening all, can you hear me okay?")
    assert is_filler("Sounds great, I love that feeling!")  # no word of it is more than small talk
    assert not is_filler("The remote sells for 25 Euro.")
    assert not is_filler("Lisbon works for me if the hotel is under 150 euros a night.")
    assert not is_filler("Let's go with Casa do Rio.")
    assert shorten("Um well this is the kick-off meeting for our our project.") == (
        "This is the kick-off meeting for our project."
    )
    assert shorten("Wow, Caroline! I really love the painting, Mel.", ["Caroline", "Melanie"]) == (
        "I love the painting."
    )


def test_a_hesitation_goes_but_the_same_words_stay_where_the_sentence_needs_them() -> None:
    assert shorten("It was, you know, a long week.") == "It was a long week."
    assert shorten("You know, I think the trip is on.") == "I think the trip is on."
    assert shorten("I mean, the car is fine.") == "The car is fine."
    # said inside the sentence, the words are its own: cutting them would leave "let I challenged"
    assert shorten("I wanted to let you know I challenged myself last Friday.") == (
        "I wanted to let you know I challenged myself last Friday."
    )
    assert shorten("Do you know what I mean?") == "Do you know what I mean?"
    assert shorten("I mean it.") == "I mean it."
    # a meeting's hesitations are rarely set off by commas: the words around tell them apart
    assert shorten("so you know he can fit in a pocket.") == "He can fit in a pocket."
    assert shorten("I mean it's usually quite small,") == "It's usually quite small."
    assert shorten("but, you know, I mean most of the time") == "Most of the time."
    assert shorten("Like how much does a remote control cost?") == "How much does a remote control cost?"
    assert shorten("Well, I think so.") == "I think so."
    assert shorten("Like, it was huge.") == "It was huge."
    assert shorten("Well done on the race!") == "Well done on the race!"
    assert shorten("Like my dad, I love fishing.") == "Like my dad, I love fishing."


def test_the_raid_night_folded_keeps_the_plans_and_drops_the_callouts() -> None:
    recording = read_recording(RAID_NIGHT)
    turns = [m.turn for m in recording.decoded if isinstance(m, TurnAppend)]
    notes = [m.note for m in recording.decoded if isinstance(m, NoteAppend)]
    summarizer = DeterministicSummarizer()
    summary = ""
    for start in range(0, len(turns), BATCH_SIZE):  # batch by batch, as a session folds
        batch = turns[start : start + BATCH_SIZE]
        seen = tuple(n for n in notes if batch[0].at <= n.at <= batch[-1].at)
        request = SummaryRequest(previous_summary=summary, turns=batch, notes=seen, max_chars=12_000)
        summary = summarizer.summarize_now(request)
    for said in ("Loud and clear", "Alright", "Go go", "can you hear me", "Welcome back", "Good call"):
        assert said not in summary, said  # greetings, acknowledgements
    for said in ("Holding the door", "Push left side", "falling back"):
        assert said not in summary, said  # callouts
    assert "Noted" not in summary  # Nova's rephrasing of the LAN party plan Tom and Priya had just made
    for kept in (
        "Tom: I'll tank with Magneto.",
        "my birthday is next Friday (28 June 2024)",
        "Tom: I'll order pizza, bring your own headsets and chairs. Priya: I can bring my spare monitor.",
        "Priya: I'll register the team as Frozen Pizza.",
        "Priya: 15 dollars per team, I'll pay and you can pay me back. James: Deal, I'll send you 5.",
        "James: I'll set up the custom lobby, password is frosty.",
        "Scrim on Wednesday 26 June at 8 pm",
    ):
        assert kept in summary, kept


def test_a_batch_keeps_the_decision_with_who_and_when_and_drops_what_says_nothing_new() -> None:
    summarizer = DeterministicSummarizer()
    said = [
        ("Alice", "Okay, so which supplier do we go with for the batteries?"),
        ("Bob", "Mm-hmm."),
        ("Carol", "Copy that."),
        ("Alice", "We decided to go with Voltix for the batteries, at 2 euros a unit."),
        ("Bob", "Right, so Voltix for the batteries, 2 euros a unit."),  # a rephrasing
        ("Carol", "I'll send them the order next Friday."),
        ("Bob", "Sounds good, on it."),
        ("Carol", "Roger, thanks everyone!"),
    ]
    turns = [Turn(who, "user", text, MONDAY + 20 * k) for k, (who, text) in enumerate(said)]
    assert summarizer.summarize_now(SummaryRequest(previous_summary="", turns=turns, max_chars=4000)) == (
        "[8 May 2023, 13:56] Alice: Which supplier do we go with for the batteries? "
        "We decided to go with Voltix for the batteries, at 2 euros a unit. "
        "Carol: I'll send them the order on Friday 12 May 2023."
    )


def test_what_says_again_the_line_before_goes_but_a_new_score_or_an_act_stays() -> None:
    summarizer = DeterministicSummarizer()
    first = summarizer.summarize_now(
        SummaryRequest(
            previous_summary="",
            turns=[Turn("Priya", "user", "Round one is ours, 1-0 on Tokyo.", MONDAY)],
            max_chars=4000,
        )
    )
    later = [
        Turn("Tom", "user", "Tokyo, round one, ours.", MONDAY + 60),  # said in the line before
        Turn("James", "user", "1-1 on Tokyo.", MONDAY + 80),  # a new score, in words said before
        Turn("Tom", "user", "Agreed, Tokyo then.", MONDAY + 100),  # a decision, in words said before
        Turn("Priya", "user", "Round one is ours, 1-0 on Tokyo!", MONDAY + 120),  # said again
    ]
    text = summarizer.summarize_now(SummaryRequest(previous_summary=first, turns=later, max_chars=4000))
    assert text == (
        "[8 May 2023, 13:56] Priya: Round one is ours, 1-0 on Tokyo. "
        "James: 1-1 on Tokyo. Tom: Agreed, Tokyo then."
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
        at = MONDAY + day * 86_400
        batch = [
            Turn("Alice", "user", f"I flew to {city} with {day + 2} friends.", at),
            Turn("Bob", "user", f"My cousin Rui opened a bakery in {city} in {2010 + day}.", at),
            Turn("Alice", "user", f"We hiked {day + 10} kilometres along the coast near {city}.", at),
            Turn("Bob", "user", f"The {city} museum closes on Mondays at {day + 3} pm.", at),
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


def test_a_relative_date_spelled_with_letters_outside_ascii_is_left_as_said() -> None:
    # ignoring case, "ſ" (long s) matches "s" and "ı" (dotless i) matches "i": such a phrase once
    # reached the date table as "yeſterday", raised, and so failed every fold of its batch
    for said in ("We met yeſterday.", "Thıs week I ran.", "I ran laſt Monday."):
        assert resolve_dates(said, MONDAY) == said
        assert "Alice" in fold([Turn("Alice", "user", said + " The launch moved to Lisbon.", MONDAY)])
    assert resolve_dates("We met YESTERDAY.", MONDAY) == "We met on 7 May 2023."


@given(
    prefix=st.sampled_from(["", "I saw her ", "Since ", "we met on "]),
    phrase=st.sampled_from(
        [
            "yesterday",
            "tomorrow",
            "last night",
            "the day before yesterday",
            *(
                f"{when} {unit}"
                for when in ("last", "this past", "past", "next", "this", "the other")
                for unit in ("week", "weekend", "month", "year", "monday", "tues", "thurs", "sun")
            ),
            *(f"{n} {unit} ago" for n in ("a few", "two", "3", "an") for unit in ("day", "weeks", "month")),
        ]
    ),
    case=st.sampled_from([str.lower, str.upper, str.title]),
    suffix=st.sampled_from(["", ".", ", and then we left", " I think"]),
)
def test_every_relative_date_is_resolved_though_most_texts_skip_the_search(
    prefix: str, phrase: str, case: Callable[[str], str], suffix: str
) -> None:
    # resolve_dates searches only the texts with a hint of a relative date: the hint must miss none
    text = prefix + case(phrase) + suffix
    at = datetime(2023, 5, 8, 12, tzinfo=UTC).timestamp()
    when = utc(at)
    assert resolve_dates(text, at) == RELATIVE_DATE.sub(lambda m: _resolve(m, when), text)


class Watched(DeterministicSummarizer):
    """Notes which thread folds, and how many folds run at once."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()
        self.running = self.most = 0
        self.lock = threading.Lock()

    def summarize_now(self, request: SummaryRequest) -> str:
        with self.lock:
            self.threads.add(threading.get_ident())
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(0.005)  # long enough for every fold asked meanwhile to start, if it could
        try:
            return super().summarize_now(request)
        finally:
            with self.lock:
                self.running -= 1


@pytest.mark.asyncio
async def test_a_burst_of_folds_runs_one_at_a_time_in_the_summarizer_s_own_thread() -> None:
    """A fold holds the interpreter from end to end: two at once take no less time than one after
    the other, and each more thread wanting the interpreter is one more the event loop waits behind."""
    summarizer = Watched()
    requests = [
        SummaryRequest(
            previous_summary="", turns=[Turn("Ana", "user", f"Table {k} is booked for {k} pm.", float(k))]
        )
        for k in range(12)
    ]
    folded: dict[int, str] = {}

    async def fold(k: int) -> None:
        folded[k] = await summarizer.summarize(requests[k])

    async with anyio.create_task_group() as tg:
        for k in range(12):
            tg.start_soon(fold, k)

    assert summarizer.most == 1
    assert len(summarizer.threads) == 1 and threading.get_ident() not in summarizer.threads
    assert [folded[k] for k in range(12)] == [DeterministicSummarizer().summarize_now(r) for r in requests]


def test_a_persons_fact_said_again_in_a_later_conversation_is_not_said_again() -> None:
    week = 7 * 86_400
    first = fold(
        [
            Turn("Bob", "user", "I'm vegetarian, so no steak for me.", MONDAY),
            Turn("Alice", "user", "Noted. I booked the Porto trip for June.", MONDAY + 30),
        ]
    )
    later = fold(
        [
            Turn("Bob", "user", "Remember, I'm vegetarian, no steak for me.", MONDAY + week),
            Turn("Alice", "user", "Sure. I'm vegetarian too now, since May.", MONDAY + week + 30),
            Turn("Bob", "user", "I booked a cooking class in Lisbon.", MONDAY + week + 60),
        ],
        previous=first,
    )
    assert later.count("Bob: I'm vegetarian") == 1, "Bob's fact stays on the line it was first said on"
    assert "Alice: I'm vegetarian too now, since May." in later, "Alice never said it: news of her own"
    assert "cooking class in Lisbon" in later, "what Bob says that is new is kept"


# -- the deterministic summarizer's caches are bounded by size ------------------------


def test_the_deterministic_summarizers_caches_hold_at_most_their_budget_of_text() -> None:
    summarizer, summary = DeterministicSummarizer(), ""
    for batch in range(3):  # the caches fill through the summarizer...
        turns = tuple(
            Turn("Alice", "user", f"Item {batch}-{k} costs {k} euros.", 1714572187.0) for k in range(10)
        )
        summary = summarizer.summarize_now(
            SummaryRequest(turns=turns, previous_summary=summary, max_chars=1200)
        )
    for cache, budget in (
        (words.weighted_words, words.WEIGHTS_CACHE_CHARS),
        (deterministic._parse_line, deterministic.CACHE_CHARS),
    ):
        assert cache.chars > 0
        for n in range(200):  # ...and past their budget: 1.6 M chars of distinct 8,000-char lines
            cache(f"[1 May 2024, 14:03] Alice: line {n}. " + "Lisbon costs 420 euros. " * 330)
        assert cache.chars <= budget
        assert len(cache) < 200
