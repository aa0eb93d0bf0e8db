"""Tool turns: a call and its result travel together. Pure.

A bot that calls tools appends a **tool call** (an ``assistant`` turn with a
``tool_call_id``) and later its **tool result** (a ``tool`` turn with the same
``tool_call_id``); other turns may come between them (someone speaks while the
tool runs). Model providers refuse a result whose call is missing, and a call
whose result is missing, so nothing here ever separates them:

- :func:`units` splits a run of turns into the pieces a cut may fall between:
  the span from a call to its result (spans that overlap merge) is one unit, a
  call with no result yet runs to the end, and every other turn is a unit of
  its own. A context's budget (:mod:`voice_context.core.budget`) keeps or drops
  whole units;
- :func:`fold_end` moves the end of a compaction batch to a unit boundary, so
  no fold takes a call without its result (or the reverse);
- :func:`placeholder` is what a result older than the last
  ``tool_result_iterations`` tool iterations is shown as: the tool's name and
  the result's size, never the result itself.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import replace

from voice_context.core.text import clip
from voice_context.core.turns import Turn


def units(turns: Sequence[Turn]) -> list[tuple[int, int]]:
    """The half-open spans ``[a, b)`` of ``turns`` a cut may fall between, in order."""
    n = len(turns)
    reach = list(range(1, n + 1))  # reach[i]: the end of the span that must stay with turn i
    calls: dict[str, int] = {}
    for i, turn in enumerate(turns):
        if turn.is_tool_call and turn.tool_call_id is not None:
            calls[turn.tool_call_id] = i
            reach[i] = n  # until its result arrives
    for i, turn in enumerate(turns):
        if turn.is_tool_result and turn.tool_call_id in calls:
            start = calls.pop(turn.tool_call_id)
            if start < i:
                reach[start] = i + 1
            else:  # a result before its call: keep them as they are
                reach[start] = start + 1
    for call in calls.values():
        reach[call] = n
    out: list[tuple[int, int]] = []
    i = 0
    while i < n:
        end = reach[i]
        j = i
        while j < end:
            end = max(end, reach[j])
            j += 1
        out.append((i, end))
        i = end
    return out


def fold_end(turns: Sequence[Turn], end: int) -> int:
    """The largest unit boundary at or before ``end`` (``turns`` from the batch's start):
    0 when the first unit runs past ``end`` (then nothing can be folded yet)."""
    best = 0
    for a, b in units(turns):
        if b <= end:
            best = b
        if a >= end:
            break
    return best


def tool_iterations(turns: Sequence[Turn]) -> list[int]:
    """For each turn, how many tool iterations began after the one it belongs to (0 for
    the newest, and for a turn that is neither a call nor a result). An iteration is a run of
    consecutive calls (one assistant step may call several tools) with their results."""
    starts = [i for i, t in enumerate(turns) if t.is_tool_call and (i == 0 or not turns[i - 1].is_tool_call)]
    age = [0] * len(turns)
    by_call: dict[str, int] = {}
    for i, turn in enumerate(turns):
        if turn.is_tool_call and turn.tool_call_id is not None:
            by_call[turn.tool_call_id] = len(starts) - bisect_right(starts, i)
            age[i] = by_call[turn.tool_call_id]
        elif turn.is_tool_result and turn.tool_call_id is not None:
            age[i] = by_call.get(turn.tool_call_id, 0)
    return age


def placeholder(turn: Turn) -> str:
    """What an old tool result is shown as: the tool's name and the result's size."""
    name = turn.tool_name or "tool"
    return f"[result of {name} compacted: {len(turn.text)} chars]"


SUMMARY_RESULT_CHARS = 400
"""A tool result is sent to a summarizer cut to this many chars (its head says what it is)."""


def for_summary(turn: Turn) -> Turn:
    """A turn as a summarizer reads it: a call says what it called, a long result is cut."""
    if turn.is_tool_call:
        called = f"calls {turn.tool_name}({turn.tool_arguments or ''})"
        return replace(turn, text=f"{turn.text} {called}".strip())
    if turn.is_tool_result:
        return replace(turn, text=clip(turn.text, SUMMARY_RESULT_CHARS))
    return turn


def compacted(turn: Turn) -> Turn:
    """The tool result with its text replaced by its placeholder."""
    return replace(turn, text=placeholder(turn))


__all__ = ["compacted", "fold_end", "for_summary", "placeholder", "tool_iterations", "units"]
