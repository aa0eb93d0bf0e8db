"""The time a voice-stack adapter plans by: a provider's connection ends at a time (Gemini
Live's ``goAway`` gives what is left of it, an OpenAI Realtime session lasts an hour), and the
adapter acts before then.

The adapters take a :class:`Clock` so that a test can run a call of an hour in a moment:
:class:`WallClock` is the real one, :class:`voice_context.testing.clock.ManualClock` one that
moves only when a test says so.
"""

from __future__ import annotations

import time
from typing import Protocol

import anyio

__all__ = ["Clock", "WallClock"]


class Clock(Protocol):
    """Seconds since the epoch (``now``), and a wait until such a time (``sleep_until``)."""

    def now(self) -> float: ...

    async def sleep_until(self, deadline: float) -> None: ...


class WallClock:
    """The system's clock (``time.time``)."""

    def __repr__(self) -> str:
        return "<WallClock>"

    def now(self) -> float:
        return time.time()

    async def sleep_until(self, deadline: float) -> None:
        await anyio.sleep(max(0.0, deadline - time.time()))
