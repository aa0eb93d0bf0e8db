"""Numbers said as words ("twenty five", "twelve point five", "two hundred and fifty") written as
digits, so that a summary, recall's index and the metric read "25 euros" however it was said.

Pure: no clock, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from voice_context.core.language.words import lower_tokens

_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
)
_NUMBER_WORDS = {word: value for value, word in enumerate(_UNITS)} | {
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}


def _number_run(case: Callable[[str], str]) -> re.Pattern[str]:
    """A run of number words; ``case`` writes each word's letters (as given, or either case)."""
    scales = [case(scale) + r"(?:\s+" + case("and") + ")?" for scale in ("hundred", "thousand")]
    words = [*map(case, sorted(_NUMBER_WORDS, key=len, reverse=True)), *scales, case("point")]
    return re.compile(r"\b(?:(?:" + "|".join(words) + r")(?:[\s-]+|\b)){1,8}")


# Either case of the ASCII letters only: re.IGNORECASE would also match "ſix" (long s) or "fıve"
# (dotless i), which are no number words. Recall's index lowercases first and skips the classes.
_NUMBER_RUN = _number_run(lambda word: re.sub(r"[a-z]", lambda m: f"[{m[0]}{m[0].upper()}]", word))
_NUMBER_RUN_LOWER = _number_run(lambda word: word)
NUMBER_TOKENS = frozenset([*_NUMBER_WORDS, "hundred", "thousand", "point"])
"""The words a number said as words is made of (lowercase)."""


def _digits(match: re.Match[str]) -> str:
    raw = match.group(0)
    body = re.sub(r"(?:[\s-]+and)?[\s-]*$", "", raw, flags=re.I)
    words = [w for w in re.split(r"[\s-]+", body.lower()) if w != "and"]
    # "one" alone is a pronoun more often than a number; "point" must sit between numbers
    if words == ["one"] or words[0] in ("point", "hundred", "thousand") or words[-1] == "point":
        return raw
    total, current, decimals = 0, 0, ""
    for k, word in enumerate(words):
        if decimals or word == "point":
            if word != "point" and (_NUMBER_WORDS.get(word, 10) > 9 or "point" in words[k + 1 :]):
                return raw
            decimals += "." if word == "point" else str(_NUMBER_WORDS[word])
        elif word == "hundred":
            current = max(current, 1) * 100
        elif word == "thousand":
            total, current = total + max(current, 1) * 1000, 0
        else:
            value = _NUMBER_WORDS[word]
            tens = current % 100
            fits = tens == 0 or (value < 10 and tens >= 20 and tens % 10 == 0)
            if not fits:
                return raw  # "one two three" is a count, not a number
            current += value
    return str(total + current) + decimals + raw[len(body) :]


def spoken_numbers(text: str) -> str:
    """Numbers said as words written as digits: "twenty five" -> "25", "twelve point five" -> "12.5"."""
    if NUMBER_TOKENS.isdisjoint(lower_tokens(text.lower())):  # (most texts say no number)
        return text
    return _NUMBER_RUN.sub(_digits, text)


def spoken_numbers_lower(lowered: str) -> str:
    """:func:`spoken_numbers` of a lowercased text (what recall's index does to every text)."""
    return _NUMBER_RUN_LOWER.sub(_digits, lowered)


__all__ = ["NUMBER_TOKENS", "spoken_numbers", "spoken_numbers_lower"]
