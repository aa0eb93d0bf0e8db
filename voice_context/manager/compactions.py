"""Folds in the background: a plan the core decided on is summarized under the store's lease,
committed to the store, then applied to the session (the core says what each result means)."""

from __future__ import annotations

import anyio
import structlog

from voice_context.core.session import (
    CommitCompaction,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    Effect,
    Session,
    StartCompaction,
    SummaryReturned,
)
from voice_context.core.window import FillBudget, Skip, SkipReason
from voice_context.errors import StoreError, SummarizerError
from voice_context.logs import get_logger
from voice_context.manager.leases import Leases
from voice_context.manager.live import Lease, Live
from voice_context.manager.outcomes import Outcomes
from voice_context.manager.registry import Background
from voice_context.manager.runtime import Clock, Feed
from voice_context.store.base import FoldCommit, Store
from voice_context.summarizers.base import Summarizer, SummaryRequest

log = get_logger("voice_context")


class Compactions:
    """Starts the folds the sessions' cores ask for and lands their results: the performer of
    ``StartCompaction``, ``Skip`` and ``CommitCompaction``."""

    def __init__(
        self,
        store: Store,
        summarizer: Summarizer,
        compaction_timeout: float,
        clock: Clock,
        feed: Feed,
        background: Background,
        leases: Leases,
        outcomes: Outcomes,
    ) -> None:
        self.store = store
        self.summarizer = summarizer
        self.compaction_timeout = compaction_timeout
        self.clock = clock
        self.feed = feed
        self.background = background
        self.leases = leases
        self.outcomes = outcomes

    async def maybe_compact(self, live: Live, budget: FillBudget | None = None) -> None:
        """Tell the core a context was laid out (what it measured, ``budget``): a fold it finds
        due starts in the background."""
        await self.feed(live, ContextRequested(self.clock(), budget))

    async def skipped(self, live: Live, session: Session, skip: Skip) -> None:
        """No fold starts, for the reason the core gave."""
        _log_skip(live, skip)

    async def start(self, live: Live, session: Session, start: StartCompaction) -> None:
        """Run a plan the core started: in the background, under a lease of its own; within a
        fold's landing (a re-compaction pass, a backlog's next fold), next under that fold's
        lease; an emergency plan is run by the request that reported the overflow."""
        background, plan = self.background, start.plan
        if plan.trigger == "emergency" or live.landing is not None:
            return
        if not background.entered:  # nothing will run the plan: do not leave it in flight
            await self.outcomes.abandon(live, session, plan.plan_id)
            raise RuntimeError("SessionManager must be used as 'async with SessionManager(...)'")
        background.begin()
        live.scope = anyio.CancelScope()  # a close before the task runs must cancel it too
        background.spawn(self._compact, live, plan, live.scope)

    async def _compact(self, live: Live, plan: CompactionPlan, scope: anyio.CancelScope) -> None:
        session = live.session
        fence: int | None = None
        running = plan
        try:
            with scope, structlog.contextvars.bound_contextvars(session=session.name):
                if scope.cancel_called:  # closed before this task ran: not even a lease
                    return
                fence = await self.leases.acquire(live, session, plan)
                if fence is None or not await self.leases.still_due(live, session, plan):
                    return
                lease = Lease(fence)
                async with anyio.create_task_group() as renewals:
                    await renewals.start(self.leases.renew, session.name, lease)
                    current: CompactionPlan | None = plan
                    while current is not None:
                        running = current
                        # a re-compaction pass, or the next fold of a backlog the core started
                        # as this one landed: it runs under the same lease
                        current = await self._run_plan(live, session, current, lease)
                        if current is not None and lease.lost and not current.recompact:
                            await self.outcomes.abandon(live, session, current.plan_id)
                            current = None
                    renewals.cancel_scope.cancel()
        except Exception as exc:  # a bug, here or in a backend, must not escape into the task group
            if isinstance(exc, ExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # raised inside the renewals' task group
            log.exception("voice_context_compaction_crashed", session=session.name, plan=running.plan_id)
            if session.in_flight is not None and session.in_flight.plan_id == running.plan_id:
                message = f"{type(exc).__name__}: {exc}"
                await self.outcomes.failure(live, session, running, "internal", False, message)
        finally:
            # cancelled (the session closed, the manager shut down) with this task's plan
            # still in flight: nothing else will land it
            await self.outcomes.abandon(live, session, running.plan_id)
            if live.scope is scope:
                live.scope = None
            self.background.end()
            if fence is not None:
                await self.leases.release(session.name)

    async def _run_plan(
        self, live: Live, session: Session, plan: CompactionPlan, lease: Lease
    ) -> CompactionPlan | None:
        if lease.lost:
            await self.leases.lost(live, session, plan)
            return None
        self.outcomes.counters["started"] += 1
        log.info(
            "voice_context_compaction_started",
            session=session.name,
            plan=plan.plan_id,
            cursor=plan.start,
            batch_size=len(plan.turns),
            recent_start=plan.recent_start,
            pending_note_count=len(plan.notes),
            recompact=plan.recompact,
            trigger=plan.trigger,
        )
        text: str | None = None
        failed = False
        with anyio.CancelScope() as fold:  # cancelled when a renewal finds the lease superseded
            lease.fold = fold
            try:
                text = await self._summarize(live, session, plan)
                failed = text is None
            finally:
                lease.fold = None
        if failed:
            return None  # told already
        if text is None or lease.lost:
            await self.leases.lost(live, session, plan)
            return None
        # Landing holds the session's lock, so a turn or a note written meanwhile cannot
        # interleave with the commit: the pending notes the store keeps are the ones the
        # session keeps.
        async with live.lock:
            return await self._land(live, session, plan, text, lease)

    async def _summarize(self, live: Live, session: Session, plan: CompactionPlan) -> str | None:
        """The summarizer's answer for ``plan``; ``None`` when it failed (told already)."""
        timeout = self.compaction_timeout
        fail = self.outcomes.failure
        try:
            with anyio.fail_after(timeout):
                return await self.summarizer.summarize(SummaryRequest.for_plan(plan, session.name))
        except SummarizerError as exc:
            await fail(live, session, plan, exc.kind, exc.retryable, str(exc), exc.retry_after)
        except TimeoutError:
            await fail(live, session, plan, "timeout", True, f"no answer in {timeout:g}s")
        except Exception as exc:  # a summarizer bug must not take the server down
            await fail(live, session, plan, type(exc).__name__, False, str(exc))
        return None

    async def _land(
        self, live: Live, session: Session, plan: CompactionPlan, text: str, lease: Lease
    ) -> CompactionPlan | None:
        """Feed the answer; returns the plan that runs next under the lease (a re-compaction
        pass, a backlog's next fold), if the core started one."""
        if live.session is not session:
            # the session was rebuilt from the store meanwhile: this result is for a copy
            # that no longer serves anyone
            self.outcomes.stale(session, plan.plan_id, current=None)
            return None
        live.landing = lease
        try:
            answer = SummaryReturned(plan.plan_id, text, self.clock())
            effects = await self.feed(live, answer, session=session)
        finally:
            live.landing = None
        starts = [effect.plan for effect in effects if isinstance(effect, StartCompaction)]
        return starts[-1] if starts else None

    async def commit(self, live: Live, session: Session, commit: CommitCompaction) -> list[Effect]:
        """Cursor, summary and the notes left, into the store together (fenced by the lease
        of the fold landing, if any); then into the session: what that came to."""
        plan = commit.plan
        fence = live.landing.fence if live.landing is not None else None
        try:
            fold = FoldCommit(
                expected_cursor=plan.start,
                new_cursor=plan.end,
                summary=commit.summary,
                pending_notes=tuple(commit.pending_notes),
                fence=fence,
            )
            committed = await self.store.commit_compaction(session.name, fold)
        except StoreError as exc:
            await self.outcomes.failure(live, session, plan, "store", exc.retryable, str(exc))
            return []
        if not committed:
            message = "the store moved on (another replica compacted)"
            await self.outcomes.failure(live, session, plan, "fenced", True, message)
            await self.leases.catch_up(live)
            return []
        stored = CompactionStored(plan.plan_id, self.clock())
        return await self.feed(live, stored, session=session)


def _log_skip(live: Live, decision: Skip) -> None:
    """Log a skipped fold; one worth telling is told once: per plan in flight, per backoff."""
    session = live.session
    repeat = {
        SkipReason.ALREADY_IN_FLIGHT: session.in_flight.plan_id if session.in_flight else None,
        SkipReason.BACKING_OFF: decision.retry_at,
    }.get(decision.reason)
    told = (decision.reason, repeat)
    quiet = decision.reason is SkipReason.BELOW_THRESHOLD or (repeat is not None and live.last_skip == told)
    live.last_skip = told
    level = log.debug if quiet else log.info
    level(
        "voice_context_compaction_skipped",
        session=session.name,
        reason=decision.reason.value,
        turns=session.total_turns,
        cursor=session.cursor,
        recent_start=decision.recent_start,
        retry_at=decision.retry_at,
    )
