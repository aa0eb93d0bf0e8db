"""Relative dates ("yesterday", "last Friday", "two weeks ago") said in a turn, found and made
absolute against the time the turn was said: the deterministic summarizer writes them as dates,
recall shows the day they mean beside them.

Pure: the time a turn was said is given, never read from a clock.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta

from voice_context.core.times import MONTHS, WEEKDAYS, day_text, utc

_WEEKDAYS = [day.lower() for day in WEEKDAYS]
_WEEKDAY_ABBR = {day[:3]: day for day in _WEEKDAYS}


def _month(year: int, month: int) -> str:
    while month < 1:
        month += 12
        year -= 1
    while month > 12:
        month -= 12
        year += 1
    return f"{MONTHS[month - 1]} {year}"


_COUNTS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "couple of": 2,
    "a couple of": 2,
}
RELATIVE_DATE = re.compile(
    # "the last week of June", "my next year", "for the past year" are not dates said relative to now
    r"(?<!\bthe )(?<!\bmy )(?<!\bour )(?<!\bhis )(?<!\bher )(?<!\btheir )(?<!\bthat )(?<!\bthis )"
    r"\b(?P<prep>(?:since|until|till|from|by|before|after|on|in|during|over|of)\s+)?"
    r"(?P<phrase>yesterday|tomorrow|last night|the day before yesterday|"
    r"(?:last|this past|past|next|this|the other) (?:week|weekend|month|year|"
    + "|".join(_WEEKDAYS)
    + r"|mon|tues?|wed|thu(?:rs?)?|fri|sat|sun)|"
    r"(?P<n>a few|a couple of|couple of|several|a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d+)"
    r" (?P<unit>day|week|month|year|weekend)s? ago)\b(?!['’]s)",
    # either case of the ASCII letters only: ignoring case alone would also match "yeſterday" (long s)
    # or "thıs week" (dotless i), which resolve as no date and stop the summarizer
    re.IGNORECASE | re.ASCII,
)
# Every text RELATIVE_DATE matches holds one of these once lowercased (and most texts hold none):
# the search for dates, with its lookbehinds at every position, runs only on those that do.
_RELATIVE_DATE_HINT = re.compile(
    r"yesterday|tomorrow|ago|"
    r"(?:last|past|next|this|other) (?:night|week|month|year|mon|tue|wed|thu|fri|sat|sun)"
)


def may_hold_relative_date(text: str) -> bool:
    """False when ``text`` holds no relative date :data:`RELATIVE_DATE` could match (most texts):
    its lowercased copy is searched, three times faster than a search that ignores case."""
    return _RELATIVE_DATE_HINT.search(text.lower()) is not None


# After a relative date said as an adverb ("I went there yesterday, ..."), "on 7 May 2023" reads as well:
# the end of the clause, a conjunction or a preposition.
_ADVERB_AFTER = re.compile(
    r"\s*(?:$|[.,!?;:)…]|[-–—]\s|(?:and|but|so|or|because|when|while|after|before|at|in|with|for|to|from|"
    r"since|until|as|where|which|who|if|then|too|again|already|now|though|although)\b)",
    re.IGNORECASE,
)
# After a relative date that starts a sentence: a comma, its end, or the subject ("Yesterday I went").
_SUBJECT_AFTER = re.compile(
    r"\s*(?:$|[,.!?…]|(?:I|we|you|he|she|they|it|my|our|his|her|their|me|mom|dad|the|a|an|there|this)\b|"
    r"[A-Z][a-z]+\b(?<!Was)(?<!Is))",
)
# Words after which a relative date is a noun ("spent yesterday", "feels like yesterday", "was last year").
_NOUN_BEFORE = frozenset(
    """
    spent spend spends spending enjoyed enjoy enjoys enjoying loved love loves loving remember remembers
    remembered remembering recall recalls recalled like liked likes feel feels felt seems seemed than was
    is were be been being about all whole entire missed miss since until
    """.split()
)
_OPENING = re.compile(r"(?:^|[.!?…]\s+|[-–—;:]\s+|\(\s*)[\"'“‘(]*$")


def _adverbial(match: re.Match[str]) -> bool:
    """Whether a relative date can become "on 7 May 2023" in place and leave the sentence whole.

    "I went there yesterday" can; "Last Friday was amazing" and "I spent
    yesterday at the beach" cannot: the phrase is a noun there.
    """
    text, start, end = match.string, match.start(), match.end()
    before = text[:start]
    if _OPENING.search(before):
        return _SUBJECT_AFTER.match(text, end) is not None
    words = re.findall(r"[A-Za-z'’]+", before[-40:])
    if words and words[-1].lower() in _NOUN_BEFORE:
        return False
    return _ADVERB_AFTER.match(text, end) is not None


def _resolve(match: re.Match[str], at: datetime) -> str:
    """One relative date made absolute.

    Periods ("last week" -> "the week before 8 May 2023") and durations ("a few
    days ago" -> "a few days before 8 May 2023") are noun phrases and replace the
    words in place. A day, month or year becomes "on 7 May 2023", "in June 2023",
    "in 2022" after a preposition or where the phrase is an adverb; elsewhere the
    words stay and the date follows in parentheses ("Last Friday (7 July 2023)
    was amazing"), so that the sentence stays whole.
    """
    prep = match.group("prep") or ""
    phrase = " ".join(match.group("phrase").lower().split())
    said = match.group(0)[len(prep) :]

    def point(where: str, value: str, night: bool = False) -> str:
        if prep:
            return prep + ("the night of " if night else "") + value
        if _adverbial(match):
            return ("on the night of " if night else where) + value
        return f"{said} ({value})"

    if phrase in ("yesterday", "the day before yesterday", "tomorrow", "last night"):
        days = {"yesterday": -1, "the day before yesterday": -2, "tomorrow": 1, "last night": -1}[phrase]
        return point("on ", day_text(at + timedelta(days=days)), night=phrase == "last night")
    if match.group("unit"):
        unit, amount = match.group("unit").lower(), match.group("n").lower()
        n = int(amount) if amount.isdigit() else _COUNTS.get(amount)
        if n is None:  # "a few days ago"
            return f"{prep}{amount} {unit}s before {day_text(at)}"
        if unit == "day":
            return point("on ", day_text(at - timedelta(days=n)))
        if unit == "month":
            return point("in ", _month(at.year, at.month - n))
        if unit == "year":
            return point("in ", str(at.year - n))
        return f"{prep}{'a' if n == 1 else n} {unit}{'' if n == 1 else 's'} before {day_text(at)}"
    words = phrase.split()
    which = "last" if words[0] in ("past", "the") or words[:2] == ["this", "past"] else words[0]
    unit = words[-1]
    step = {"last": -1, "next": 1}.get(which, 0)
    if unit == "year":
        return point("in ", str(at.year + step))
    if unit == "month":
        return point("in ", _month(at.year, at.month + step))
    if unit in ("week", "weekend"):
        return f"{prep}the {unit} { ({-1: 'before', 1: 'after'}.get(step, 'of')) } {day_text(at)}"
    day = _WEEKDAY_ABBR[unit[:3]]
    target = _WEEKDAYS.index(day)
    if step < 0:
        when = at - timedelta(days=(at.weekday() - target) % 7 or 7)
    else:
        when = at + timedelta(days=(target - at.weekday()) % 7 or (7 if step else 0))
    if prep or _adverbial(match):
        return point("on ", f"{day.capitalize()} {day_text(when)}")
    return f"{said} ({day_text(when)})"


def resolve_dates(text: str, at: float) -> str:
    """Relative dates in ``text`` made absolute, given that it was said at ``at`` (unix seconds, UTC).

    The sentence stays whole: see :func:`_resolve` for when the words are kept and
    the date added in parentheses.
    """
    if not may_hold_relative_date(text):
        return text
    when = utc(at)
    return RELATIVE_DATE.sub(lambda m: _resolve(m, when), text)


__all__ = ["RELATIVE_DATE", "may_hold_relative_date", "resolve_dates"]
