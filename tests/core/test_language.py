"""The text helpers recall, the summarizers and the metric share live in the core, on their own:
recall reads a turn's words, dates and numbers without loading a summarizer, and the helpers load
nothing but the core."""

from __future__ import annotations

import subprocess
import sys

from serving import TIMEOUT, clean_env

from voice_context.core.language.dates import resolve_dates
from voice_context.core.language.numbers import spoken_numbers, spoken_numbers_lower
from voice_context.core.language.small_talk import is_filler, without_small_talk
from voice_context.core.language.words import DATE_WORDS, weighted_words, without_apostrophes
from voice_context.core.times import MONTHS, WEEKDAYS, utc
from voice_context.summarizers.check import anchors
from voice_context.tuning.scoring import number_terms

MONDAY = 1683554160.0  # 8 May 2023, 13:56 UTC


def loaded_by(module: str) -> list[str]:
    """The package's modules a fresh interpreter holds once it has imported ``module``."""
    probe = (
        f"import sys, {module}\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith('voice_context.'))))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", probe], env=clean_env(), capture_output=True, text=True, timeout=TIMEOUT * 4
    )
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.split()


def test_recall_reads_words_dates_and_numbers_without_loading_a_summarizer() -> None:
    loaded = loaded_by("voice_context.recall.index")
    assert "voice_context.core.language.dates" in loaded
    assert [m for m in loaded if m.startswith("voice_context.summarizers")] == []
    assert "voice_context.worker" not in loaded, "no fold thread on a reply's path"


def test_the_language_helpers_load_nothing_but_the_core() -> None:
    modules = ["dates", "numbers", "small_talk", "words"]
    loaded = loaded_by(", ".join(f"voice_context.core.language.{m}" for m in modules))
    assert [m for m in loaded if not m.startswith("voice_context.core")] == []


def test_one_table_of_months_and_weekdays_names_the_words_that_say_when() -> None:
    when = utc(MONDAY)
    assert (MONTHS[when.month - 1], WEEKDAYS[when.weekday()]) == ("May", "Monday")
    said = "we fly in june, back on friday"
    weights = dict(weighted_words(said))  # the summarizer: a date's name is worth a name's
    assert weights["june"] == weights["friday"] > weights["fly"]
    assert {"june", "friday"} <= anchors(said)  # what a model's summary must keep
    assert number_terms(said) == {"june", "friday"}  # what the metric checks an answer for
    assert {"june", "friday"} <= DATE_WORDS


def test_a_turn_reads_the_same_to_the_summarizer_recall_and_the_metric() -> None:
    said = "Yesterday Mel's sister paid twenty five euros. Thanks, Mel!"
    assert resolve_dates(said, MONDAY) == "on 7 May 2023 Mel's sister paid twenty five euros. Thanks, Mel!"
    assert spoken_numbers(said) == "Yesterday Mel's sister paid 25 euros. Thanks, Mel!"
    assert spoken_numbers_lower(said.lower()) == spoken_numbers(said).lower()
    assert without_apostrophes(said.lower()).startswith("yesterday mel sister")
    assert is_filler("Thanks, Mel!") is False  # a name tells something, unless it is a speaker's
    assert without_small_talk(said, ["Mel"]) == "Yesterday Mel's sister paid twenty five euros."
