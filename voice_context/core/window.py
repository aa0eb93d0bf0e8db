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

The fill trigger is the second rule, for contexts asked for under a budget
(chars, tokens or both): a count of turns says nothing of their length, and
turns from the cursor on that a context cannot show would be in neither the
summary nor the context. The context's layout protects a window of the newest
turns; the turns from the cursor on come right after it, before recall and the
summary (:mod:`voice_context.core.budget`), and as soon as they outgrow it
(``fill_trigger``, 0.7, of it: before they reach its edge, so that the turns
said while the fold is in flight still fit) the oldest of them fold until what
stays unfolded is at most half of that, whatever the count, always keeping the
newest turn. So those turns take the room of recall only while a fold is in
flight, and a context with room still shows the folded ones verbatim, from the
store. See :func:`fill_end`.
"""

from __future__ import annotations

import math
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
    """What a context laid out under a budget measured, which the fill trigger weighs.

    ``window`` is the room its layout protected for the newest verbatim turns (the recent
    window: ``recent_share`` of the budget and the ``recent_floor``), ``unfolded`` what the
    turns from the cursor on take as that context renders them, shown or not, and ``room``
    the budget left after the base instructions: each in (chars, tokens), as
    :attr:`voice_context.core.budget.Context.fill` reports them. ``chars`` and ``tokens``
    say which of the two the context's budget kept; ``counter`` counts tokens where a token
    budget was kept.
    """

    window: tuple[int, int] = (0, 0)
    unfolded: tuple[int, int] = (0, 0)
    room: tuple[int, int] = (0, 0)
    chars: bool = True
    tokens: bool = False
    counter: TokenCounter | None = None

    def kept(self) -> tuple[bool, bool]:
        """Which of (chars, tokens) the budget kept (tokens only with a counter to count them)."""
        return self.chars, self.tokens and self.counter is not None


def verbatim_sizes(turns: Sequence[Turn], config: SessionConfig, budget: FillBudget) -> list[tuple[int, int]]:
    """Each turn's size in (chars, tokens) as a context shows it: its line, clipped, and a line break."""
    sizes = []
    counter = budget.counter if budget.kept()[1] else None
    for turn in turns:
        line = f"{turn.speaker}: {clip(turn.text, config.max_turn_chars)}"
        sizes.append((len(line) + 1, counter.count(line) + 1 if counter is not None else 0))
    return sizes


def fill_end(
    cursor: int,
    sizes: Sequence[tuple[int, int]],
    fraction: float,
    budget: FillBudget,
    arriving: int = 0,
) -> int | None:
    """Where a fold due to the fill trigger ends (exclusive), or ``None`` when none is due.

    ``sizes`` are those of the turns from ``cursor`` on (:func:`verbatim_sizes`).
    The fill line is ``fraction`` of the protected window, in chars and in tokens, and
    never closer to the room than ``arriving`` turns, as long as the newest of these
    (the turns said while the last fold was in flight: as many may come while this one
    is). Due when those turns take more than the line (with ``fraction`` 1 and nothing
    arriving: as soon as one of them lies outside the window); the fold then takes the
    oldest of them until the rest is at most :data:`FILL_TARGET` of the line, and never
    the newest turn.
    """
    kept = budget.kept()
    if fraction <= 0 or len(sizes) < 2 or not any(kept):
        return None
    coming = sizes[len(sizes) - min(arriving, len(sizes)) :]
    lines = [
        min(fraction * budget.window[k], budget.room[k] - sum(s[k] for s in coming)) if kept[k] else math.inf
        for k in (0, 1)
    ]
    if budget.unfolded[0] <= lines[0] and budget.unfolded[1] <= lines[1]:
        return None
    caps = (lines[0] * FILL_TARGET, lines[1] * FILL_TARGET)
    first = len(sizes) - 1  # the newest turn always stays
    chars, tokens = sizes[first]
    while first > 0:
        more_chars, more_tokens = sizes[first - 1]
        if chars + more_chars > caps[0] or tokens + more_tokens > caps[1]:
            break
        chars += more_chars
        tokens += more_tokens
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
