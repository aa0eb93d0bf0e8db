"""Keeping the cyclic garbage collector off the live sessions, without keeping garbage.

A live session is hundreds of long-lived objects (its turns, its recall postings); with a
thousand sessions a full collection walks some 400,000 of them and stops the event loop
for half a second, every reply waiting behind it. ``gc.freeze()`` moves the objects alive
now out of the collector's reach, so later collections walk only what is new.

What it freezes is kept until ``gc.unfreeze()``: a reference cycle among frozen objects
is never collected, even once it is garbage. Two rules keep that from becoming memory
that never returns:

- a collection runs just before each freeze, so only what is really alive is frozen
  (that collection walks only what is not frozen yet: what the last interval made);
- what was frozen and has since died in a cycle (a closed session's; no longer a closed
  connection's transport, which the server frees by reference count, see
  :mod:`voice_context.released`) is reclaimed by a thaw:
  unfreeze, collect everything, freeze again. A thaw is the full pause the freeze avoids
  (0.2 s at 500 sessions, every reply waiting), so it runs at once when nothing is
  connected (nobody waits behind it), and with clients connected at most once every
  ``thaw_seconds`` (10 minutes), once the connections and sessions let go since the last
  thaw reach a quarter of those still live (at least ``min_released``).

What dies in a cycle is little: a thaw after 150 of 500 sessions and their connections
closed finds nothing to collect. A thaw at every quarter let go paused every reply once a
minute or so under the churn of calls that each hold a session a few minutes, for nothing.

What a churn leaves is free memory that the C allocator keeps (glibc's heap shrinks only
from its top): 300 visits beside 2 clients that stayed left the server 5-8 MB larger with
as many Python objects alive, and ``malloc_trim`` gave it all back. So a thaw ends by
handing the allocator's free memory back to the system (``malloc_trim``, where the C
library has it): 0.05-0.6 ms on the 120-400 MB heap of a server holding 500 paced sessions,
beside the thaw's own 0.2 s.

:class:`CollectorPolicy` decides (time is data); :func:`keep_collector_off` performs it.
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import cast

import anyio

from voice_context.config import FREEZE_SECONDS
from voice_context.logs import get_logger

log = get_logger("voice_context.server.collector")

CHECK_SECONDS = 1.0
"""How often the policy is asked whether a thaw is due (more often when freezes are)."""
MIN_RELEASED = 100
"""Connections and sessions let go since the last thaw before a thaw with clients connected."""
THAW_SECONDS = 600.0
"""The least time between two thaws with clients connected (none is needed while idle)."""


class Step(Enum):
    WAIT = "wait"
    FREEZE = "freeze"  # collect what is not frozen, then freeze the survivors
    THAW = "thaw"  # unfreeze, collect everything, freeze the survivors, trim the C heap


@dataclass(frozen=True, slots=True)
class Load:
    """What the server holds and has let go, read when the policy is asked."""

    connections: int
    sessions: int
    released: int  # connections ended and sessions closed since the server started


class CollectorPolicy:
    """When to freeze and when to thaw; see the module docstring. ``now`` is monotonic."""

    def __init__(
        self,
        now: float,
        *,
        freeze_seconds: float = FREEZE_SECONDS,
        min_released: int = MIN_RELEASED,
        thaw_seconds: float = THAW_SECONDS,
    ) -> None:
        self.freeze_seconds = freeze_seconds
        self.min_released = min_released
        self.thaw_seconds = thaw_seconds
        self.frozen_at = now
        self.thawed_at = now
        self.released_at_thaw = 0

    def step(self, now: float, load: Load) -> Step:
        released = load.released - self.released_at_thaw
        live = load.connections + load.sessions
        busy_thaw_due = now - self.thawed_at >= self.thaw_seconds and released >= max(
            self.min_released, live // 4
        )
        if released > 0 and (load.connections == 0 or busy_thaw_due):
            self.released_at_thaw = load.released
            self.frozen_at = self.thawed_at = now
            return Step.THAW
        if now - self.frozen_at >= self.freeze_seconds:
            self.frozen_at = now
            return Step.FREEZE
        return Step.WAIT


def _find_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim`` (hands the heap's free pages back to the system), or ``None``
    where the C library has none (musl, macOS)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return cast(Callable[[int], int], trim)


_MALLOC_TRIM = _find_malloc_trim()


def release_free_memory() -> bool:
    """Hand the C allocator's free memory back to the system; whether it could."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


def perform(step: Step) -> int:
    """Carry out a step; the number of unreachable objects the collection found."""
    if step is Step.WAIT:
        return 0
    if step is Step.THAW:
        gc.unfreeze()
    found = gc.collect()
    gc.freeze()
    if step is Step.THAW:
        release_free_memory()
    return found


async def keep_collector_off(
    load: Callable[[], Load],
    *,
    freeze_seconds: float = FREEZE_SECONDS,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Run the policy until cancelled."""
    policy = CollectorPolicy(monotonic(), freeze_seconds=freeze_seconds)
    check = min(CHECK_SECONDS, freeze_seconds)
    while True:
        await anyio.sleep(check)
        step = policy.step(monotonic(), load())
        if step is Step.WAIT:
            continue
        started = time.perf_counter()
        found = perform(step)
        # (not ``gc.get_freeze_count()``: it counts the frozen objects one by one, 23 ms for two
        # million, with every reply waiting)
        seconds = round(time.perf_counter() - started, 4)
        log.debug("voice_context_gc", step=step.value, unreachable=found, seconds=seconds)
