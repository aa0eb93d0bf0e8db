"""The compaction rule: which batch is eligible now, and if none, why not.

Everything before the cursor is already folded into the summary; everything
from the cursor on is shown verbatim. A compaction folds only the oldest turns
that have fully left the protected recent window::

    recent_start = max(cursor, turns - recent_window)
    fires when turns - cursor > recent_window + batch_size and nothing is in flight
    batch = [cursor, cursor + batch_size)

With the defaults (50 recent, batch 10): at cursor 0 and 61 turns it folds
0..9 and the cursor moves to 10; at cursor 10 nothing fires until 71 turns,
then 10..19.

The fill trigger is the second rule, for sessions of long turns: a context
asked for under a budget (chars, tokens or both) also fires a compaction when
the verbatim part, the turns from the cursor on as the context would show
them, passes ``fill_trigger`` (0.7) of that budget, whatever the count. It
folds the oldest turns until what stays verbatim is at most half that (so the
next turn does not fire again), always keeping the newest turn. The budget
would cut those turns from the context anyway: folded, they are in the
summary instead of nowhere (and a context with room still shows them
verbatim, from the store). See :func:`fill_end`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from voice_context.core.config import SessionConfig
from voice_context.core.text import clip
from voice_context.core.tokens import TokenCounter
from voice_context.core.turns import Turn


class SkipReason(StrEnum):
    """Why a context request did not start a compaction."""

    BELOW_THRESHOLD = "below_threshold"
    ALREADY_IN_FLIGHT = "already_in_flight"
    NO_ELIGIBLE_BATCH = "no_eligible_batch"
    SESSION_ENDING = "session_ending"
    BACKING_OFF = "backing_off"


@dataclass(frozen=True, slots=True)
class Batch:
    """The half-open turn range ``[start, end)`` to fold, and where the recent window begins."""

    start: int
    end: int
    recent_start: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Skip:
    """No compaction now. ``retry_at`` is set when the reason is a backoff."""

    reason: SkipReason
    recent_start: int
    retry_at: float | None = None


#: A backlog of at least this many whole batches before the recent window is folded several
#: batches at a time (a session that fell behind catches up in fewer summarizer calls)...
BACKLOG_BATCHES = 4
#: ...at most this many in one compaction (the session also bounds their characters).
MAX_FOLD_BATCHES = 8


def has_backlog(total_turns: int, cursor: int, config: SessionConfig) -> bool:
    """Whether the turns before the recent window have piled up to a backlog (at least
    :data:`BACKLOG_BATCHES` batches): turns appended with no context asked for them (a burst, an
    import, a bot that asks rarely). A fold then starts from the append itself; in a conversation,
    where contexts are asked every turn or two, folds start from the contexts, as designed."""
    return total_turns - cursor >= config.recent_window + BACKLOG_BATCHES * config.batch_size


FILL_TARGET = 0.5
"""A fold made due by the fill trigger leaves this share of the fill line verbatim."""


@dataclass(frozen=True, slots=True)
class FillBudget:
    """The budget a context is asked in, which the fill trigger measures the verbatim part against."""

    chars: int | None = None
    tokens: int | None = None
    counter: TokenCounter | None = None

    @property
    def bounded(self) -> bool:
        return self.chars is not None or (self.tokens is not None and self.counter is not None)


def verbatim_sizes(turns: Sequence[Turn], config: SessionConfig, budget: FillBudget) -> list[tuple[int, int]]:
    """Each turn's size in (chars, tokens) as a context shows it: its line, clipped, and a line break."""
    sizes = []
    counter = budget.counter if budget.tokens is not None else None
    for turn in turns:
        line = f"{turn.speaker}: {clip(turn.text, config.max_turn_chars)}"
        sizes.append((len(line) + 1, counter.count(line) + 1 if counter is not None else 0))
    return sizes


def fill_end(
    cursor: int, sizes: Sequence[tuple[int, int]], fraction: float, budget: FillBudget
) -> int | None:
    """Where a fold due to the fill trigger ends (exclusive), or ``None`` when none is due.

    ``sizes`` are those of the turns from ``cursor`` on (:func:`verbatim_sizes`).
    Due when their total passes ``fraction`` of the budget in chars or in tokens;
    the fold then takes the oldest turns until the rest is at most half that,
    and never the newest turn.
    """
    if fraction <= 0 or len(sizes) < 2 or not budget.bounded:
        return None
    caps = (
        fraction * budget.chars if budget.chars is not None else float("inf"),
        fraction * budget.tokens if budget.tokens is not None else float("inf"),
    )
    total = (sum(s[0] for s in sizes), sum(s[1] for s in sizes))
    if total[0] <= caps[0] and total[1] <= caps[1]:
        return None
    kept = [0, 0]
    first = len(sizes) - 1  # the newest turn always stays
    kept[0], kept[1] = sizes[first]
    while first > 0:
        chars, tokens = sizes[first - 1]
        if kept[0] + chars > caps[0] * FILL_TARGET or kept[1] + tokens > caps[1] * FILL_TARGET:
            break
        kept[0] += chars
        kept[1] += tokens
        first -= 1
    return cursor + first if first > 0 else None


def recent_start(total_turns: int, cursor: int, recent_window: int) -> int:
    """The first index of the protected recent window (never before the cursor)."""
    return max(cursor, total_turns - recent_window)


def choose_batch(
    *,
    total_turns: int,
    cursor: int,
    config: SessionConfig,
    in_flight: bool = False,
    ending: bool = False,
    now: float | None = None,
    retry_at: float | None = None,
    turn_times: Sequence[float] = (),
) -> Batch | Skip:
    """Decide whether a compaction should start, given the session's counters.

    ``turn_times`` holds the ``at`` of the turns from the cursor on; it is only
    read when ``config.min_age_seconds`` is set (a batch whose last turn is
    younger than that is not eligible yet). ``retry_at`` is the earliest time a
    failed compaction may be retried.
    """
    if cursor < 0 or cursor > total_turns:
        raise ValueError(f"cursor {cursor} outside 0..{total_turns}")
    start = recent_start(total_turns, cursor, config.recent_window)
    if ending:
        return Skip(SkipReason.SESSION_ENDING, start)
    if in_flight:
        return Skip(SkipReason.ALREADY_IN_FLIGHT, start)
    if total_turns - cursor <= config.recent_window + config.batch_size:
        return Skip(SkipReason.BELOW_THRESHOLD, start)
    if retry_at is not None and now is not None and now < retry_at:
        return Skip(SkipReason.BACKING_OFF, start, retry_at=retry_at)
    if start - cursor < config.batch_size:  # pragma: no cover - implied by the threshold above
        return Skip(SkipReason.NO_ELIGIBLE_BATCH, start)
    backlog = (start - cursor) // config.batch_size
    batches = min(backlog, MAX_FOLD_BATCHES) if backlog >= BACKLOG_BATCHES else 1
    if config.min_age_seconds and now is not None and turn_times:
        # as many of those batches as are old enough (the first one must be)
        while batches and now - turn_times[batches * config.batch_size - 1] < config.min_age_seconds:
            batches -= 1
        if not batches:
            return Skip(SkipReason.NO_ELIGIBLE_BATCH, start)
    return Batch(cursor, cursor + batches * config.batch_size, start)
