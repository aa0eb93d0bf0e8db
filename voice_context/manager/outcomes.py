"""Telling what a fold came to: the counters, the log and the listeners (the performer of
``Applied``, ``Failed`` and ``Stale``)."""

from __future__ import annotations

from typing import Any

from voice_context.core.session import (
    Applied,
    CompactionAbandoned,
    CompactionFailed,
    CompactionPlan,
    Failed,
    Session,
    Stale,
)
from voice_context.logs import get_logger
from voice_context.manager.live import CompactionEvent, Listener, Live
from voice_context.manager.runtime import Clock, Feed
from voice_context.summarizers.base import Summarizer

log = get_logger("voice_context")


class Outcomes:
    """Counts, logs and tells listeners of the folds that land, fail or go stale."""

    def __init__(self, feed: Feed, clock: Clock, summarizer: Summarizer) -> None:
        self.feed = feed
        self.clock = clock
        self.summarizer = summarizer
        self.counters: dict[str, int] = {"started": 0, "completed": 0, "failed": 0, "stale": 0}
        #: told of every session's folds (a session's own are on its :class:`Live`)
        self.listeners: list[Listener] = []

    def __repr__(self) -> str:
        return f"<Outcomes {self.counters}>"

    def emit(self, live: Live, event: CompactionEvent) -> None:
        """Tell the listeners of every session, then the session's own."""
        for listener in [*self.listeners, *live.listeners]:
            try:
                listener(event)
            except Exception:  # a listener's bug must not lose the compaction
                log.exception("voice_context_listener_failed", session=event.session)

    def stale(self, session: Session, plan_id: int, **fields: Any) -> None:
        """A result for a plan no longer in flight, dropped."""
        self.counters["stale"] += 1
        log.info("voice_context_compaction_stale", session=session.name, plan=plan_id, **fields)

    async def dropped(self, live: Live, session: Session, stale: Stale) -> None:
        """The core dropped a result for a plan no longer in flight."""
        self.stale(session, stale.plan_id, current=stale.current_plan_id)

    async def abandon(self, live: Live, session: Session, plan_id: int) -> None:
        """Nothing will land plan ``plan_id``: the session forgets it, when it is still in flight
        (no failure, no backoff; a plan no longer in flight needs nothing)."""
        if session.in_flight is not None and session.in_flight.plan_id == plan_id:
            await self.feed(live, CompactionAbandoned(plan_id, self.clock()), session=session)

    async def failure(
        self,
        live: Live,
        session: Session,
        plan: CompactionPlan,
        kind: str,
        retryable: bool,
        message: str,
        retry_after: float | None = None,
    ) -> None:
        """Tell the session the plan failed; what that came to is told (``Failed``, ``Stale``)."""
        failed = CompactionFailed(plan.plan_id, kind, retryable, self.clock(), retry_after, message)
        await self.feed(live, failed, session=session)

    async def applied(self, live: Live, session: Session, outcome: Applied) -> None:
        self.counters["completed"] += 1
        log.info(
            "voice_context_compaction_completed",
            session=session.name,
            plan=outcome.plan.plan_id,
            old_cursor=outcome.old_cursor,
            new_cursor=outcome.new_cursor,
            covered_through=outcome.covered_through,
            summary_chars=len(outcome.summary),
            clamped=outcome.clamped,
            latency=round(outcome.latency, 4),
        )
        self.emit(
            live,
            CompactionEvent(
                "completed",
                session.name,
                outcome.new_cursor,
                outcome.covered_through,
                len(outcome.summary),
                outcome.latency,
                old_cursor=outcome.old_cursor,
                trigger=outcome.plan.trigger,
                clamped=outcome.clamped,
                plan=outcome.plan,
            ),
        )

    async def failed(self, live: Live, session: Session, outcome: Failed) -> None:
        self.counters["failed"] += 1
        log.warning(
            "voice_context_compaction_failed",
            session=session.name,
            plan=outcome.plan.plan_id,
            model=self.summarizer.model,
            error=outcome.kind,
            message=outcome.message[:300],
            retryable=outcome.retryable,
            failures=outcome.failures,
            retry_at=outcome.retry_at,
        )
        self.emit(
            live,
            CompactionEvent(
                "failed",
                session.name,
                session.cursor,
                session.cursor - 1,
                len(session.summary),
                outcome.latency,
                error=outcome.kind,
                retryable=outcome.retryable,
                failures=outcome.failures,
                retry_at=outcome.retry_at,
                plan=outcome.plan,
            ),
        )
