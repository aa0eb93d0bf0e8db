"""Rolling the tier cascade: the shell around :mod:`voice_context.core.tiers`.

:func:`roll_tiers` reads what a session's rolls need from the store (its tier
summaries, the turns the summaries do not cover yet, its landmarks), asks the core
which rolls are due, makes each with the summarizer and stores it. It calls again
until nothing more is due, so one call makes a conversation's summary, then its
day's, then its week's, and fills every period without its summary however far
back (the sweep).

Several replicas may roll the same session at once: each roll lands through
``Store.save_tier``, which keeps one summary per tier and period and never an older
roll over a newer one, so the loser's work is dropped (logged as ``rolled_elsewhere``)
and the summaries are the same whichever replica won. A failed summarizer call
stops the pass (logged); the next pass tries again, and contexts keep using the
rolling summary meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from voice_context.core.config import SessionConfig
from voice_context.core.tiers import (
    TIERS,
    Roll,
    Schedule,
    Tier,
    TierSummary,
    conversations,
    due_rolls,
    rolled_through,
)
from voice_context.core.tools import for_summary
from voice_context.core.turns import Turn
from voice_context.logs import get_logger
from voice_context.store.base import Store
from voice_context.summarizers.base import Summarizer, SummaryRequest

log = get_logger("voice_context.tiers")

#: At most this many passes of one call (a pass makes every roll due at once).
MAX_PASSES = 4


@dataclass(slots=True)
class RollReport:
    """What one call did: the summaries it stored, those another replica had already
    stored, and the summaries the session has now."""

    made: list[TierSummary] = field(default_factory=list)
    elsewhere: list[Roll] = field(default_factory=list)
    failed: str | None = None
    rows: tuple[TierSummary, ...] = ()

    @property
    def through(self) -> int:
        return rolled_through(self.rows)


def ceiling(config: SessionConfig, tier: Tier) -> int:
    return {
        "session": config.session_summary_chars,
        "day": config.day_summary_chars,
        "week": config.week_summary_chars,
    }[tier]


async def make_summary(
    summarizer: Summarizer, roll: Roll, config: SessionConfig, name: str, turns: Sequence[Turn] = ()
) -> str:
    """The text of ``roll``: its turns summarized (a conversation), or its inputs condensed
    (a day, a week), within the tier's ceiling; one more condensing pass when the
    summarizer's first answer is too long."""
    limit = ceiling(config, roll.tier)
    if roll.tier == "session":
        request = SummaryRequest(
            previous_summary="",
            turns=turns,
            max_chars=limit,
            first_index=roll.first_turn,
            session=name,
        )
        text = (await summarizer.summarize(request)).strip()
    else:
        text = "\n".join(row.text.strip() for row in roll.inputs if row.text.strip())
    if len(text) > limit:
        request = SummaryRequest(
            previous_summary=text, turns=(), max_chars=limit, recompact=True, session=name
        )
        text = (await summarizer.summarize(request)).strip()
    return text


async def roll_tiers(
    store: Store,
    summarizer: Summarizer,
    name: str,
    config: SessionConfig,
    now: float,
    *,
    total_turns: int,
    closed: bool = False,
    on_demand: bool = False,
    tiers: Sequence[Tier] = TIERS,
) -> RollReport:
    """Make every roll due at ``now`` for session ``name`` (its transcript holds
    ``total_turns`` turns); see the module docstring. ``on_demand`` rolls each period of
    ``tiers`` as soon as it has ended, whatever the schedule."""
    schedule = Schedule.of(config)
    report = RollReport(rows=await store.load_tiers(name))
    landmarks: set[int] | None = None
    for _ in range(MAX_PASSES):
        rows = report.rows
        start = rolled_through(rows)
        turns = await store.read_turns(name, start, total_turns) if start < total_turns else []
        spans = conversations([t.at for t in turns], schedule.gap, start)
        due = due_rolls(spans, rows, now, schedule, closed=closed, on_demand=on_demand, tiers=tiers)
        if not due:
            break
        for roll in due:
            chosen: list[Turn] = []
            if roll.tier == "session":
                if landmarks is None:
                    landmarks = {lm.index for lm in await store.load_landmarks(name)}
                chosen = [
                    for_summary(t)
                    for i, t in enumerate(turns[roll.first_turn - start : roll.end_turn - start])
                    if roll.first_turn + i not in landmarks
                ]
            try:
                text = await make_summary(summarizer, roll, config, name, chosen)
            except Exception as exc:  # a summarizer failure: contexts keep the rolling summary
                report.failed = f"{type(exc).__name__}: {str(exc)[:200]}"
                log.warning(
                    "voice_context_tier_roll_failed",
                    session=name,
                    tier=roll.tier,
                    first_turn=roll.first_turn,
                    end_turn=roll.end_turn,
                    error=report.failed,
                )
                return report
            made = roll.made(text, now)
            if await store.save_tier(name, made):
                report.made.append(made)
                log.info(
                    "voice_context_tier_rolled",
                    session=name,
                    tier=roll.tier,
                    start=roll.start,
                    end=roll.end,
                    first_turn=roll.first_turn,
                    end_turn=roll.end_turn,
                    inputs=len(roll.inputs),
                    chars=len(text),
                )
            else:
                report.elsewhere.append(roll)
                log.info(
                    "voice_context_tier_roll_skipped",
                    session=name,
                    tier=roll.tier,
                    start=roll.start,
                    reason="rolled_elsewhere",
                )
        report.rows = await store.load_tiers(name)
    return report


__all__ = ["RollReport", "ceiling", "make_summary", "roll_tiers"]
