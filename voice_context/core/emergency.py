"""Emergency compaction: what must stay when a bot's model reports a context overflow. Pure.

When a model refuses a prompt as too long, there is no time for a background
fold. The session keeps, unchanged, its **safety region**: the last user turn,
the last iteration (the last assistant step, with its tool calls and results,
and the user turn that asked for it), and any tool chain still waiting for its
result, from the earliest of them to the end (:func:`safety_start`).
Everything verbatim before it is folded at once: it is split into two halves
of about the same number of tokens, at a tool unit boundary (:func:`halves`),
each half is compressed and folded without a model, the two folds are merged
into the summary, and the context is built again under the limit. If the
safety region alone (with the base instructions) cannot fit, the request
fails at once with a clear error: nothing is retried.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from voice_context.core.tools import units
from voice_context.core.turns import Turn


def safety_start(turns: Sequence[Turn]) -> int:
    """The first turn (an index into ``turns``) of the safety region; ``len(turns)`` for none."""
    if not turns:
        return 0
    spans = units(turns)

    def unit_of(i: int) -> int:
        return next(a for a, b in spans if a <= i < b)

    start = spans[-1][0]  # the newest unit: an open tool chain runs to the end, so it is in it
    last_user = next((i for i in range(len(turns) - 1, -1, -1) if turns[i].role == "user"), None)
    if last_user is not None:
        start = min(start, unit_of(last_user))
    # the last iteration: the last assistant step (with its tool results), and the user turn that asked it
    last_assistant = next((i for i in range(len(turns) - 1, -1, -1) if turns[i].role == "assistant"), None)
    if last_assistant is not None:
        step = unit_of(last_assistant)
        if step > 0 and turns[step - 1].role == "user":
            step = unit_of(step - 1)
        start = min(start, step)
    return start


def halves(turns: Sequence[Turn], size: Callable[[Turn], int]) -> int:
    """Where to split ``turns`` in two halves of about the same ``size`` (a unit boundary):
    the end of the first half, an index into ``turns``."""
    total = sum(size(t) for t in turns)
    best, best_gap, running = 0, total, 0
    position = 0
    for a, b in units(turns):
        for k in range(a, b):
            running += size(turns[k])
        position = b
        gap = abs(total - 2 * running)
        if gap < best_gap:
            best, best_gap = position, gap
    return best


__all__ = ["halves", "safety_start"]
