"""The compaction lease: one replica folds a session at a time, fenced by the store."""

from __future__ import annotations

import contextlib

import anyio
from anyio.abc import TaskStatus

from voice_context.core.session import CompactionPlan, Session
from voice_context.errors import StoreError, UnknownSession
from voice_context.logs import get_logger
from voice_context.manager.live import Lease, Live
from voice_context.manager.outcomes import Outcomes
from voice_context.manager.registry import Served
from voice_context.manager.replicas import Replicas
from voice_context.store.base import Store

log = get_logger("voice_context")

RELEASE_TIMEOUT = 2.0
"""The longest (seconds) a lease's release may take, shielded; it expires on its own anyway."""


class Leases:
    """Takes, renews and releases the store's compaction lease for the folds run here."""

    def __init__(
        self,
        store: Store,
        replica: str,
        lease_ttl: float,
        served: Served,
        replicas: Replicas,
        outcomes: Outcomes,
    ) -> None:
        self.store = store
        self.replica = replica
        self.lease_ttl = lease_ttl
        self.served = served
        self.replicas = replicas
        self.outcomes = outcomes

    async def acquire(self, live: Live, session: Session, plan: CompactionPlan) -> int | None:
        """Take the store's compaction lease (its fencing token); ``None`` when the plan
        cannot go ahead (another replica holds the lease, or the store failed)."""
        try:
            token = await self.store.acquire_lease(session.name, self.replica, self.lease_ttl)
        except StoreError as exc:
            await self.outcomes.failure(live, session, plan, "store", exc.retryable, str(exc))
            return None
        if token is None:
            await self.outcomes.abandon(live, session, plan.plan_id)
            log.info(
                "voice_context_compaction_skipped",
                session=session.name,
                reason="leased_elsewhere",
                turns=session.total_turns,
                cursor=session.cursor,
                recent_start=plan.recent_start,
            )
        return token

    async def still_due(self, live: Live, session: Session, plan: CompactionPlan) -> bool:
        """Decide again once the lease is held: another replica may have folded this batch
        while this one waited for the lease. Then the plan is dropped, and the session
        catches up with the store instead of folding the same turns again."""
        try:
            record = await self.store.load(session.name)
        except StoreError as exc:
            await self.outcomes.failure(live, session, plan, "store", exc.retryable, str(exc))
            return False
        if record is not None and record.owner != live.owner:
            await self.served.disown(live)
            return False
        if record is None or record.cursor == plan.start:
            return True  # (a session gone from the store fails at its commit)
        await self.outcomes.abandon(live, session, plan.plan_id)
        reason = "folded_elsewhere"
        self.outcomes.stale(session, plan.plan_id, current=None, reason=reason, cursor=record.cursor)
        async with live.lock:
            await self.catch_up(live)
        return False

    async def catch_up(self, live: Live) -> None:
        """Follow the store after a fold found it moved on (best effort: the next request
        catches up if this cannot)."""
        with contextlib.suppress(StoreError, UnknownSession):
            await self.replicas.catch_up_locked(live)

    async def renew(self, name: str, lease: Lease, *, task_status: TaskStatus[None]) -> None:
        """Renew the lease every third of its ttl while the fold runs. Superseded (another
        replica was granted it after it lapsed): cancel the summarizer call, whose result
        must not be committed. A store that fails a renewal is tried again at the next one
        (the commit is fenced anyway)."""
        store, replica, ttl = self.store, self.replica, self.lease_ttl
        task_status.started()
        while True:
            await anyio.sleep(ttl / 3)
            try:
                kept = await store.renew_lease(name, replica, lease.fence, ttl)
            except StoreError as exc:
                log.warning("voice_context_lease_renewal_failed", session=name, error=str(exc)[:300])
                continue
            if not kept:
                lease.lost = True
                log.warning("voice_context_lease_lost", session=name, fence=lease.fence)
                if lease.fold is not None:
                    lease.fold.cancel()
                return

    async def release(self, name: str) -> None:
        """Give the lease back, shielded and within ``RELEASE_TIMEOUT``."""
        with anyio.move_on_after(RELEASE_TIMEOUT, shield=True):
            try:
                await self.store.release_lease(name, self.replica)
            except Exception as exc:  # the lease expires on its own; never fail a task over it
                log.warning("voice_context_lease_release_failed", session=name, error=str(exc)[:300])

    async def lost(self, live: Live, session: Session, plan: CompactionPlan) -> None:
        """The fold of ``plan`` ran past a lease another replica was granted: it fails."""
        await self.outcomes.failure(
            live, session, plan, "lease_lost", True, "another replica was granted the compaction lease"
        )
