"""Unix times as calendar times, for any float: rendering a time never raises.

The codec refuses implausible times on the wire, but a store may still hold a
turn written before it did, and a recording may carry anything. A summarizer
must render every one of them, so the conversion here is total: a time outside
the years 1000..9000 is shown as the nearest of those, and NaN as the epoch.
"""

from __future__ import annotations

import functools
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


_MONTHS = "January February March April May June July August September October November December".split()


# a context dates the same few dozen turns of its session, reply after reply: room for the recent
# turns of a thousand sessions (4,096 held those of a few dozen, and every context missed)
@functools.lru_cache(maxsize=32_768)
def stamp(at: float) -> str:
    """``8 May 2023, 13:56`` (UTC): how a dated line of a context (a recalled passage, a
    landmark, a line of a plain dated transcript) says when it was said."""
    when = utc(at)
    return f"{when.day} {_MONTHS[when.month - 1]} {when.year}, {when.hour:02d}:{when.minute:02d}"
