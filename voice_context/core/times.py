"""Unix times as calendar times, for any float: rendering a time never raises.

The codec refuses implausible times on the wire, but a store may still hold a
turn written before it did, and a recording may carry anything. A summarizer
must render every one of them, so the conversion here is total: a time outside
the years 1000..9000 is shown as the nearest of those, and NaN as the epoch.
"""

from __future__ import annotations

import contextlib
import math
from datetime import UTC, datetime

#: 1 January 1000 and 1 January 9000, UTC: far enough from datetime's limits
#: that the date arithmetic of a summarizer (a day, a month, ten years) stays valid.
EARLIEST_RENDERED = -30610224000.0
LATEST_RENDERED = 221845392000.0


def utc(at: float) -> datetime:
    """``at`` (unix seconds) as an aware UTC datetime, clamped to the rendered range."""
    if math.isnan(at):
        at = 0.0
    return datetime.fromtimestamp(min(max(at, EARLIEST_RENDERED), LATEST_RENDERED), tz=UTC)


MONTHS = "January February March April May June July August September October November December".split()
"""The months' names, as :func:`stamp` writes them: the one table of them that every reader and
writer of dates goes by."""
WEEKDAYS = "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split()
"""The weekdays' names, Monday first (``datetime.weekday()`` indexes them)."""


def day_text(when: datetime) -> str:
    """``8 May 2023``: the day of ``when`` as a summary line's head and a resolved relative date
    write it (and as :func:`stamp` begins)."""
    return f"{when.day} {MONTHS[when.month - 1]} {when.year}"


STAMPS_HELD = 32_768
"""How many times ``stamp`` keeps rendered: a context dates the same few dozen turns of its
session, reply after reply, so there is room for the recent turns of a thousand sessions
(4,096 held those of a few dozen, and every context missed)."""

_stamps: dict[float, str] = {}
"""The times rendered most recently, the least recently used first.

A plain dict of floats to strings: holding nothing that can form a cycle, it is never tracked
by the cyclic garbage collector, so no collection walks it. ``functools.lru_cache`` keys a
float argument by a new tuple, and each new tuple made its dict tracked again, among the
youngest objects, after a collection had untracked it: at 1,000 paced sessions its 28,000
entries were over half of what every collection of the young generations walked, on the event
loop, with every reply waiting."""


def stamp(at: float) -> str:
    """``8 May 2023, 13:56`` (UTC): how a dated line of a context (a recalled passage, a
    landmark, a line of a plain dated transcript) says when it was said."""
    held = _stamps
    text = held.pop(at, None)  # taken out and put back last: the most recently used
    if text is None:
        when = utc(at)
        text = f"{when.day} {MONTHS[when.month - 1]} {when.year}, {when.hour:02d}:{when.minute:02d}"
        if len(held) >= STAMPS_HELD:
            # the least recently used; another thread may change the dict meanwhile (a fold's
            # thread dates lines too), and then the oldest is left for the next miss
            with contextlib.suppress(RuntimeError, StopIteration):
                held.pop(next(iter(held)), None)
    held[at] = text
    return text
