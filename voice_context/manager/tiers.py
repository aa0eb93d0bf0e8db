"""The tier cascade of the sessions served here: their rolls, by the clock, by a conversation's
end or on demand, and the summary a context shows of them (the rule: :mod:`voice_context.core.tiers`;
the rolls themselves: :mod:`voice_context.tiering`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from voice_context.core.session import ContextView, Restored, RollTiers, Session, TiersRolled
from voice_context.core.tiers import (
    TIERS,
    Tier,
    TierSummary,
    hidden_lines,
    parse_zone,
    rolled_through,
    tiered_summary,
)
from voice_context.logs import get_logger
from voice_context.manager.live import Live
from voice_context.manager.registry import Background, Served
from voice_context.manager.runtime import Clock, Feed
from voice_context.recall.index import SummaryIndex
from voice_context.store.base import Store
from voice_context.summarizers.base import Summarizer
from voice_context.tiering import RollReport, roll_tiers

log = get_logger("voice_context")

TIER_CHECK_SECONDS = 60.0
"""How often (by the manager's clock) a session with tiers on checks for rolls made due by the
time of day alone; a conversation that ends when a turn comes after a silence is rolled at once."""


class Tiers:
    """Rolls the tiers of the sessions that keep them, one roll at a time per session."""

    def __init__(
        self,
        store: Store,
        summarizer: Summarizer,
        clock: Clock,
        feed: Feed,
        background: Background,
        served: Served,
    ) -> None:
        self.store = store
        self.summarizer = summarizer
        self.clock = clock
        self.feed = feed
        self.background = background
        self.served = served

    async def roll(
        self, live: Live, *, on_demand: bool = False, closed: bool = False, tiers: Sequence[Tier] = TIERS
    ) -> RollReport:
        """Make the rolls due now (every one, as far back as they are missing)."""
        async with live.rolling:
            session = live.session
            live.tiers_checked = self.clock()
            report = await roll_tiers(
                self.store,
                self.summarizer,
                session.name,
                session.config,
                self.clock(),
                total_turns=session.total_turns,
                on_demand=on_demand,
                closed=closed,
                tiers=tiers,
            )
            live.tiers = report.rows
            await self.feed(live, TiersRolled(report.through, self.clock()))
            return report

    async def ended(self, live: Live, session: Session, roll: RollTiers) -> None:
        """A conversation just ended (the core says with which turn): roll it now."""
        self.maybe_roll(live, now=True)

    def maybe_roll(self, live: Live, *, now: bool = False) -> None:
        """Roll the session's tiers in the background when a conversation just ended
        (``now``) or, otherwise, at most every :data:`TIER_CHECK_SECONDS` of the clock."""
        background = self.background
        if not live.session.config.tiers or not background.started:
            return
        at = self.clock()
        if not now and at - live.tiers_checked < TIER_CHECK_SECONDS:
            return
        live.tiers_checked = at
        if live.rolling.locked():  # the roll under way goes round once more when it is done
            live.roll_again = True
            return
        background.begin()
        background.spawn(self._roll_in_background, live)

    async def _roll_in_background(self, live: Live) -> None:
        background = self.background
        try:
            live.roll_again = True
            while live.roll_again and self.served.serves(live) and not background.closing:
                live.roll_again = False
                await self.roll(live)
        except Exception as exc:  # a store failure: the next check tries again
            log.warning("voice_context_tier_roll_failed", session=live.session.name, error=str(exc)[:300])
        finally:
            background.end()

    async def restored(self, live: Live) -> tuple[TierSummary, ...]:
        """A restored session's rolled summaries, and what its core needs of them: how far
        they cover the transcript, and the time of the turn just before the cursor."""
        store, session = self.store, live.session
        rows = await store.load_tiers(session.name)
        folded_at: float | None = None
        if session.cursor and session.folded_at is None:
            [last] = await store.read_turns(session.name, session.cursor - 1, session.cursor)
            folded_at = last.at
        await self.feed(live, Restored(rolled_through(rows), folded_at, self.clock()))
        return rows

    @staticmethod
    def index(live: Live) -> SummaryIndex:
        """The lines of the rolled summaries a context does not show, indexed once per roll:
        recall searches every tier."""
        if live.tier_index is None or live.tier_index[:2] != (live.tiers, live.session.cursor):
            cursor = live.session.cursor
            live.tier_index = (live.tiers, cursor, SummaryIndex.of(hidden_lines(live.tiers, cursor)))
        return live.tier_index[2]

    @staticmethod
    def view(live: Live) -> ContextView:
        """What a context is built from: with tiers on, the summary is the rolled summaries
        that cover the history behind the cursor, then the rolling summary (see
        :func:`voice_context.core.tiers.tiered_summary`)."""
        view = live.session.view()
        if not live.tiers:
            return view
        zone = parse_zone(view.config.time_zone)
        return replace(view, summary=tiered_summary(live.tiers, view.cursor, view.summary, zone))
