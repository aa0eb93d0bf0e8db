"""Telling a thing said again: the fuzzy rule both compressions share, turn by turn or sentence by sentence.

Two texts are the same thing said twice when their words (lowercased, punctuation and spacing
aside: :func:`key_of`) are within :data:`FUZZY` of each other (rapidfuzz's ``fuzz.ratio``) and
they say the same numbers ("at 9" and "at 10" are not the same plan). Texts shorter than
:data:`MIN_FUZZY_CHARS` are only ever exact repeats: a few letters apart is a different word.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rapidfuzz.fuzz import ratio
from rapidfuzz.process import extract
from rapidfuzz.utils import default_process

FUZZY = 90.0
"""Two texts at least this similar (``fuzz.ratio``, 0..100) are the same thing said twice."""
WINDOW = 16
"""A text is compared with at most this many texts kept just before it."""
MIN_FUZZY_CHARS = 12
"""Shorter texts are only ever exact repeats."""
_DIGITS = re.compile(r"\d+")


def key_of(text: str) -> str:
    """What two texts must share to be the same: their words, lowercased, punctuation aside."""
    return " ".join(default_process(text).split())


def numbers_of(key: str) -> list[str]:
    """The numbers a key says, in order."""
    return _DIGITS.findall(key)


def said_again(
    key: str,
    numbers: Sequence[str],
    keys: Sequence[str],
    key_numbers: Sequence[Sequence[str]],
    fuzzy: float = FUZZY,
) -> bool:
    """Whether ``key`` (with its ``numbers``) is within ``fuzzy`` of one of ``keys`` that says
    the same numbers (``key_numbers[k]`` are the numbers of ``keys[k]``)."""
    if len(key) < MIN_FUZZY_CHARS or not keys:
        return False
    matches = extract(key, keys, scorer=ratio, score_cutoff=fuzzy, limit=None, processor=None)
    return any(list(key_numbers[match[2]]) == list(numbers) for match in matches)


__all__ = ["FUZZY", "MIN_FUZZY_CHARS", "WINDOW", "key_of", "numbers_of", "said_again"]
