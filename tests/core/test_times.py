"""How a context says when something was said: ``stamp`` dates any float, and keeps the times it
dated most recently in a dict that no garbage collection ever walks."""

from __future__ import annotations

import gc

from voice_context.core import times
from voice_context.core.times import STAMPS_HELD, day_text, stamp, utc


def test_any_float_is_dated_within_the_rendered_years() -> None:
    assert stamp(1683554160.0) == "8 May 2023, 13:56"
    assert stamp(1683554160.0) == "8 May 2023, 13:56"  # (now from what was kept)
    assert stamp(float("nan")) == "1 January 1970, 00:00"
    assert stamp(1e30) == "1 January 9000, 00:00"
    assert stamp(-1e30) == "1 January 1000, 00:00"


def test_a_summary_line_writes_its_day_as_a_dated_line_of_a_context_begins() -> None:
    for at in (1683554160.0, 951825600.0, float("nan"), 1e30, -1e30):  # 951825600: 29 February 2000
        assert stamp(at).startswith(day_text(utc(at)) + ", ")
    assert day_text(utc(951825600.0)) == "29 February 2000"


def test_the_times_dated_most_recently_are_kept_where_the_collector_never_looks() -> None:
    first = 1.7e9
    for k in range(STAMPS_HELD + 1000):
        stamp(first + 60.0 * k)
    assert len(times._stamps) == STAMPS_HELD
    # a dict of floats to strings is never tracked: the young collections, which run on the event
    # loop, do not walk its entries (functools.lru_cache's dict was tracked again at each new key)
    assert not gc.is_tracked(times._stamps)

    oldest = first + 60.0 * 1000
    assert next(iter(times._stamps)) == oldest
    stamp(oldest)  # dated again: now the most recently used
    for k in range(STAMPS_HELD - 1):
        stamp(2e9 + 60.0 * k)
    assert oldest in times._stamps
    assert first + 60.0 * 1001 not in times._stamps  # the least recently used went
