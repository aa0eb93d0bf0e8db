"""Small builders shared by the tests: turns, notes, a clock the test moves, timeouts."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import anyio

from voice_context.core.turns import Note, Role, Turn

#: Every guard against a hang is a multiple of this; slow machines raise the scale.
TIMEOUT_SCALE = float(os.environ.get("VOICE_CONTEXT_TEST_TIMEOUT_SCALE", "1"))
TIMEOUT = 5.0 * TIMEOUT_SCALE

SPEAKERS = ("Alice", "Bob")


def turn(index: int, *, speaker: str | None = None, role: Role = "user", at: float | None = None) -> Turn:
    """The turn a test appends at transcript ``index``: its text names its index."""
    who = speaker if speaker is not None else SPEAKERS[index % len(SPEAKERS)]
    return Turn(who, role, f"turn {index}", float(index) if at is None else at)


def turns(n: int, start_at: int = 0, *, speakers: Sequence[str] = SPEAKERS, t0: float = 0.0) -> list[Turn]:
    """``n`` turns for indices ``start_at .. start_at+n-1``, spoken one second apart from ``t0``."""
    return [
        Turn(speakers[i % len(speakers)], "user", f"turn {i}", t0 + float(i))
        for i in range(start_at, start_at + n)
    ]


def notes(n: int, start_at: int = 0, *, width: int = 0) -> list[Note]:
    """``n`` screen notes; ``width`` pads each note's text to that many chars."""
    out = []
    for i in range(start_at, start_at + n):
        text = f"note {i}"
        out.append(Note(text.ljust(width, "~") if width else text, float(i)))
    return out


class ManualClock:
    """A clock the test moves by hand: pass ``clock`` where a ``() -> float`` is wanted."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


async def wait_until(predicate: Callable[[], bool], *, within: float = TIMEOUT) -> None:
    """Yield to the event loop until ``predicate()`` is true, failing after ``within`` seconds.

    For state that has no event to wait on (a counter, a flag on a fake).
    """
    with anyio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polls plain attributes, not an event
            await anyio.sleep(0.001)
