"""A clock that moves only when a test moves it, so that an hour-long call runs in a moment.

The test and the servers it runs share one :class:`ManualClock`: a stand-in that closes a
connection after ten minutes sleeps until then on it, and wakes when the test moves the
clock past that time::

    clock = ManualClock(T0)
    ...
    clock.advance_to(T0 + 600)   # every sleeper whose time has come wakes
"""

from __future__ import annotations

import heapq
import itertools

import anyio
import anyio.lowlevel

__all__ = ["ManualClock"]


class ManualClock:
    """Time that stands still until :meth:`advance_to` (or :meth:`advance`) moves it on."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, anyio.Event]] = []
        self._order = itertools.count()

    def __repr__(self) -> str:
        return f"<ManualClock now={self._now:.3f} sleepers={len(self._sleepers)}>"

    def now(self) -> float:
        return self._now

    async def sleep_until(self, deadline: float) -> None:
        if deadline <= self._now:
            await anyio.lowlevel.checkpoint()
            return
        woken = anyio.Event()
        heapq.heappush(self._sleepers, (deadline, next(self._order), woken))
        await woken.wait()

    def advance_to(self, when: float) -> None:
        """Move the time on to ``when`` (never back) and wake every sleeper due by then."""
        self._now = max(self._now, when)
        while self._sleepers and self._sleepers[0][0] <= self._now:
            heapq.heappop(self._sleepers)[2].set()

    def advance(self, seconds: float) -> None:
        self.advance_to(self._now + seconds)
