"""When a query is about: the days and months it names, as words a recall index holds.

Every passage is indexed with two date words beside its own, its day and its month
(UTC, as :func:`~voice_context.recall.index.stamp` shows them): ``@d2023-10-13`` and
``@m2023-10``. A query that names a time ("on October 13, 2023", "in May 2023", "in June",
"yesterday", "last week", "last Friday") gets the same words, so that BM25 ranks what was said
then above the same words said another time, by the usual rarity: a day is held by the turns
of one conversation, a month by more. No word a speaker can say looks like one (``@`` is never
part of an indexed word), and a query that names no time gets none.

A date without its year (``in June``, ``on 13 October``) is the latest such date on or before
the query's ``now`` (the newest turn's time, the moment the bot is answering); without ``now``
it is left out, and so are the relative ones. Pure: no clock, no I/O.
"""

from __future__ import annotations

import contextlib
import re
from datetime import date, timedelta

from voice_context.core.times import MONTHS, WEEKDAYS, utc

DAY = "@d"
MONTH = "@m"
WEEK_DAYS = 7
DATE_TERMS = 2
"""Date words per indexed passage: its day and its month."""
MAX_DATE_TERMS = 10
"""A search uses at most this many date words (a week of days and a few months)."""

_MONTHS = [name.lower() for name in MONTHS]
_WEEKDAYS = [day.lower() for day in WEEKDAYS]
_MONTH_WORD = (
    r"(?P<{0}>Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)\.?"
)
_DAY_NUM = r"(?P<{0}>[0-3]?\d)(?:st|nd|rd|th)?"
_YEAR = r"(?P<{0}>(?:19|20)\d\d)"
# month names are matched as written with a capital, so that "may", "march" and "august" the
# words are not taken for months; ASR and chat text capitalise months
_DATE = re.compile(
    r"\b(?:"
    + (_MONTH_WORD.format("m1") + r"\s+" + _DAY_NUM.format("d1") + r"(?:,?\s+" + _YEAR.format("y1") + r")?")
    + r"|"
    + (_DAY_NUM.format("d2") + r"\s+(?:of\s+)?" + _MONTH_WORD.format("m2"))
    + (r"(?:,?\s+" + _YEAR.format("y2") + r")?")
    + r"|"
    + (_MONTH_WORD.format("m3") + r"(?:\s+of)?,?\s+" + _YEAR.format("y3"))
    + r"|"
    + (r"(?:(?i:in|during|since|early|late|mid|of|last|this)\s+)" + _MONTH_WORD.format("m4"))
    + (r"(?:(?:\s+of)?,?\s+" + _YEAR.format("y4") + r")?")
    + r"|(?P<iso>(?:19|20)\d\d-[01]\d-[0-3]\d)"
    + r")\b"
)
# "the last week of the raid" and "my last month there" are not said relative to now
_RELATIVE = re.compile(
    r"(?<!\bthe )(?<!\bmy )(?<!\bour )(?<!\bthat )"
    r"\b(?P<word>yesterday|today|tonight|(?P<which>last|this|past)\s+"
    r"(?P<unit>week|month|weekend|" + "|".join(_WEEKDAYS) + r"))\b(?!\s+of\b)",
    re.IGNORECASE,
)


def date_terms(at: float) -> tuple[str, str]:
    """The date words a passage said at ``at`` is indexed under: its day and its month."""
    when = utc(at).date()
    return day_term(when), month_term(when.year, when.month)


def is_date_term(term: str) -> bool:
    """Whether an indexed word is a date word (no word a speaker says starts with ``@``)."""
    return term.startswith("@")


def day_term(when: date) -> str:
    return f"{DAY}{when.isoformat()}"


def month_term(year: int, month: int) -> str:
    return f"{MONTH}{year:04d}-{month:02d}"


def _month(word: str) -> int:
    return next(k for k, name in enumerate(_MONTHS, 1) if name.startswith(word.lower().rstrip(".")[:3]))


def _latest(today: date | None, month: int, day: int | None) -> tuple[int, int, int | None] | None:
    """The year of the latest ``month`` (and ``day``) on or before ``today``."""
    if today is None:
        return None
    year = today.year
    if (month, day or 1) > (today.month, today.day if day else 1):
        year -= 1
    return year, month, day


_MONTH_HEADS = tuple(name[:3] for name in MONTHS)
"""How every month word :data:`_DATE` matches begins (its month words are matched as written)."""
_RELATIVE_PARTS = ("day", "week", "month", "tonight")
"""What every match of :data:`_RELATIVE` holds one of, in any case ("yesterday", "last Friday",
"this weekend", "past month", "tonight")."""


def _may_name_a_date(query: str) -> bool:
    """False when :data:`_DATE` cannot match ``query`` (most queries: then it is not run): it
    names no month as written, and holds no start of an ISO date (``19..-`` or ``20..-``)."""
    if "-" in query and ("19" in query or "20" in query):
        return True
    return any(head in query for head in _MONTH_HEADS)


def _may_name_a_relative_date(query: str) -> bool:
    """False when :data:`_RELATIVE` cannot match ``query``: an ASCII query without any of
    :data:`_RELATIVE_PARTS` in any case (past ASCII, what its case-blind match takes for them is
    left to it)."""
    if not query.isascii():
        return True
    lowered = query.lower()
    return any(part in lowered for part in _RELATIVE_PARTS)


def query_date_terms(query: str, now: float | None = None) -> list[str]:
    """The date words of the times ``query`` names (see the module docstring), in order, once each."""
    today = utc(now).date() if now is not None else None
    out: list[str] = []
    named = _may_name_a_date(query)
    relative = today is not None and _may_name_a_relative_date(query)
    if not named and not relative:
        return out

    def add(term: str) -> None:
        if term not in out:
            out.append(term)

    for m in _DATE.finditer(query) if named else ():
        if m.group("iso"):
            with contextlib.suppress(ValueError):
                add(day_term(date.fromisoformat(m.group("iso"))))
            continue
        month_word = m.group("m1") or m.group("m2") or m.group("m3") or m.group("m4")
        month = _month(month_word)
        day_text = m.group("d1") or m.group("d2")
        year_text = m.group("y1") or m.group("y2") or m.group("y3") or m.group("y4")
        day = int(day_text) if day_text else None
        if year_text:
            found: tuple[int, int, int | None] | None = (int(year_text), month, day)
        else:
            found = _latest(today, month, day)
        if found is None:
            continue
        year, month, day = found
        if day is None:
            add(month_term(year, month))
            continue
        try:
            add(day_term(date(year, month, day)))
        except ValueError:
            add(month_term(year, month))
    if today is None or not relative:
        return out
    for m in _RELATIVE.finditer(query):
        word = m.group("word").lower()
        unit = (m.group("unit") or "").lower()
        which = (m.group("which") or "").lower()
        if word == "yesterday":
            add(day_term(today - timedelta(days=1)))
        elif word in ("today", "tonight"):
            add(day_term(today))
        elif unit == "month":
            first = today.replace(day=1)
            if which == "last":
                first = (first - timedelta(days=1)).replace(day=1)
            add(month_term(first.year, first.month))
        elif unit in ("week", "weekend"):
            monday = today - timedelta(days=today.weekday())
            if which in ("last", "past"):
                monday -= timedelta(days=WEEK_DAYS)
            days = range(5, 7) if unit == "weekend" else range(WEEK_DAYS)
            for k in days:
                when = monday + timedelta(days=k)
                if when <= today:
                    add(day_term(when))
        elif unit in _WEEKDAYS:
            back = (today.weekday() - _WEEKDAYS.index(unit)) % WEEK_DAYS or WEEK_DAYS
            add(day_term(today - timedelta(days=back)))
    return out


__all__ = [
    "DATE_TERMS",
    "DAY",
    "MAX_DATE_TERMS",
    "MONTH",
    "date_terms",
    "day_term",
    "is_date_term",
    "month_term",
    "query_date_terms",
]
