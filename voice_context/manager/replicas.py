"""Ownership and catch-up: which copy of a session this replica may serve, and how it follows
the store when another replica served the session meanwhile."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio

from voice_context.core.config import SessionConfig
from voice_context.core.session import Reconfigured, Session, SessionEnding, TurnsAdopted
from voice_context.core.turns import Note
from voice_context.errors import SessionClosed, StoreError, UnknownSession
from voice_context.logs import get_logger
from voice_context.manager.indexing import Indexing
from voice_context.manager.live import Live, Opened, restore
from voice_context.manager.registry import Background, Served
from voice_context.manager.runtime import Clock, Feed
from voice_context.manager.tiers import Tiers
from voice_context.store.base import SessionRecord, Store

log = get_logger("voice_context")

OPEN_ATTEMPTS = 3
"""An open that finds no session, fails to create it (another replica did, for the same owner)
and then finds none again (deleted meanwhile) tries this many times before a retryable error."""


class Replicas:
    """Opens sessions as the store decides who owns them, and keeps the copies served here
    in step with the store."""

    def __init__(
        self,
        store: Store,
        config: SessionConfig,
        clock: Clock,
        feed: Feed,
        background: Background,
        served: Served,
        tiers: Tiers,
        indexing: Indexing,
    ) -> None:
        self.store = store
        #: the defaults a session's overrides go on top of
        self.config = config
        self.clock = clock
        self.feed = feed
        self.background = background
        self.served = served
        self.tiers = tiers
        self.indexing = indexing
        self._open_locks: dict[str, tuple[anyio.Lock, list[int]]] = {}

    async def open(self, name: str, overrides: dict[str, Any] | None, owner: str | None) -> Opened:
        """See :meth:`voice_context.manager.SessionManager.open`."""
        served = self.served
        async with self.opening(name):
            while True:
                if self.background.closing:
                    raise SessionClosed("the server is shutting down")
                live = served.live.get(name)
                if live is None:
                    return await self._open_from_store(name, overrides, owner)
                if live.owner != owner:
                    if not await self.disowned(live):
                        raise UnknownSession(name)
                    continue  # the copy here was stale: the store decides
                async with live.lock:
                    if not served.serves(live):
                        continue  # closed while this open waited for the lock
                    try:
                        await self.catch_up_locked(live)
                    except UnknownSession:
                        continue  # the store's session is another owner's now: it decides
                    if overrides:
                        await self._reconfigure(live, overrides)
                    if served.serves(live):
                        return Opened(name, True, live.session.stats())
                # closed during the awaits above: decide again

    async def _reconfigure(self, live: Live, overrides: dict[str, Any]) -> None:
        merged = {**live.overrides, **overrides}
        config = self.config.with_overrides(merged)
        await self.store.save_config(live.session.name, merged)
        live.overrides = merged
        before = (live.session.live_notes, live.session.pending_notes)
        await self.feed(live, Reconfigured(config, self.clock()))
        await self.save_notes_if_changed(live.session, before)

    @contextlib.asynccontextmanager
    async def opening(self, name: str) -> AsyncIterator[None]:
        """Hold the open lock of one session name (dropped once nobody waits on it)."""
        entry = self._open_locks.setdefault(name, (anyio.Lock(), [0]))
        lock, waiting = entry
        waiting[0] += 1
        try:
            async with lock:
                yield
        finally:
            waiting[0] -= 1
            if waiting[0] == 0 and self._open_locks.get(name) is entry:
                del self._open_locks[name]

    async def _open_from_store(
        self, name: str, overrides: dict[str, Any] | None, owner: str | None
    ) -> Opened:
        store = self.store
        # in use from now on: a retention sweep between this read and the next must not forget it
        await store.touch([name])
        record = await self._claim(name, overrides, owner)
        if record is not None:
            merged = {**record.config, **(overrides or {})}
            landmarks = await store.load_landmarks(name)
            session = restore(record, self.config.with_overrides(merged), landmarks)
            if overrides:
                await store.save_config(name, merged)
            await self.save_notes_if_changed(session, (record.live_notes, record.pending_notes))
            recall = await self.indexing.restored(name)
        else:
            merged = dict(overrides or {})
            session = Session(name, self.config.with_overrides(merged))
            recall = self.indexing.fresh()
        if self.background.closing:  # the shutdown began during the awaits above
            raise SessionClosed("the server is shutting down")
        live = Live(session, owner, overrides=merged, recall=recall)
        if session.config.tiers:
            live.tiers = await self.tiers.restored(live)
        # only opens insert sessions, and they hold this name's open lock
        live = self.served.live.setdefault(name, live)
        self.indexing.maybe_index(live)
        return Opened(name, record is not None, live.session.stats())

    async def _claim(
        self, name: str, overrides: dict[str, Any] | None, owner: str | None
    ) -> SessionRecord | None:
        """The store's record of the session for ``owner`` to resume, or ``None`` when this call
        created it. The store decides who owns a name, in one step: of replicas creating one
        name at once, one creates it, and the others resume it (the same owner) or raise
        ``UnknownSession`` (another owner), as they do for a session they find stored."""
        store = self.store
        for _ in range(OPEN_ATTEMPTS):
            record = await store.load(name)
            if record is None:
                merged = dict(overrides or {})
                self.config.with_overrides(merged)  # an invalid override creates nothing
                created = await store.create(SessionRecord(name, config=merged, owner=owner))
                if created.made:
                    return None
                if created.owner != owner:
                    raise UnknownSession(name)
                continue  # created elsewhere meanwhile, for this owner: resume what it stored
            if record.owner != owner:
                raise UnknownSession(name)
            return record
        text = f"session {name!r} is being created and deleted elsewhere at the same time: try again"
        raise StoreError(text, retryable=True)

    async def save_notes_if_changed(
        self, session: Session, before: tuple[Sequence[Note], Sequence[Note]]
    ) -> None:
        """Persist the note buffers when lowered limits evicted or dropped some of them."""
        after = (session.live_notes, session.pending_notes)
        if (tuple(before[0]), tuple(before[1])) != after:
            await self.store.save_notes(session.name, *after)

    async def disowned(self, live: Live) -> bool:
        """Whether the copy held here is of a session the store no longer gives its owner (it
        was deleted or forgotten elsewhere, and maybe its name taken by another owner since);
        such a copy is dropped, and an open by another owner decides from the store."""
        record = await self.store.load(live.session.name)
        if record is not None and record.owner == live.owner:
            return False
        if self.served.serves(live):
            await self.served.disown(live)
        return True

    async def catch_up_locked(self, live: Live) -> None:
        """Adopt the store's copy of the session if another replica moved it on.

        Turns reach the store before they reach a session, so a store holding
        more turns, a later cursor or other notes than this replica knows means
        another replica served the session meanwhile. When it only appended turns,
        they are appended here too and a compaction in flight goes on (its commit
        still holds); otherwise the session is rebuilt from the store (a compaction
        in flight here is cancelled: its commit would be refused). A store that is
        behind this replica is left alone.
        """
        session = live.session
        record = await self.store.load(session.name)
        if record is not None and record.owner != live.owner:
            await self.served.disown(live)
            raise UnknownSession(session.name)
        if record is None or record.total_turns < session.total_turns or record.cursor < session.cursor:
            return
        seen = (session.total_turns, session.cursor, session.live_notes, session.pending_notes)
        if (record.total_turns, record.cursor, record.live_notes, record.pending_notes) == seen:
            return
        if _only_appended(record, session):
            # only turns were added elsewhere: take them, and let a fold in flight land
            adopted = tuple(record.turns[len(session.verbatim_turns) :])
            await self.feed(live, TurnsAdopted(adopted, self.clock()))
        else:
            await self._rebuild(live, record)
        log.info(
            "voice_context_session_caught_up",
            session=session.name,
            turns=record.total_turns,
            cursor=record.cursor,
            was_turns=seen[0],
            was_cursor=seen[1],
        )

    async def _rebuild(self, live: Live, record: SessionRecord) -> None:
        """Serve the store's copy of the session instead of the one held here."""
        session = live.session
        if session.in_flight is not None:
            live.cancel_fold()
        await self.feed(live, SessionEnding(self.clock()))
        landmarks = await self.store.load_landmarks(session.name)
        live.session = restore(record, session.config, landmarks)
        if live.session.config.tiers:
            live.tiers = await self.tiers.restored(live)
        live.recall.older = None


def _only_appended(record: SessionRecord, session: Session) -> bool:
    """Whether the store's copy differs from the session only by turns appended after it."""
    held = session.verbatim_turns
    return (record.cursor, record.summary, record.live_notes, record.pending_notes) == (
        session.cursor,
        session.summary,
        session.live_notes,
        session.pending_notes,
    ) and record.turns[: len(held)] == held
