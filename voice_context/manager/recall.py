"""Recall for a context: the search of the store's index and the summary's lines, run ahead of
the reply for a user turn as soon as it is stored, and the turns just before the cursor."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread

from voice_context.config import AheadMode
from voice_context.core.recalled import Offered, Recalled
from voice_context.core.session import RecallAhead, Session
from voice_context.core.turns import Turn, TurnRun
from voice_context.errors import StoreError
from voice_context.logs import get_logger
from voice_context.manager.indexing import Indexing
from voice_context.manager.live import Ahead, Basis, Live
from voice_context.manager.registry import Background
from voice_context.manager.tiers import Tiers
from voice_context.recall.index import DEFAULT_QUERY_COMMON, MAX_OLDER_TURNS, SummaryIndex, query_time
from voice_context.recall.stored import NOTHING_FOUND, find_in_store
from voice_context.store.base import Store

if TYPE_CHECKING:  # (numpy loads only with an embedder)
    from voice_context.recall.embedding import Embedder

log = get_logger("voice_context")

OLDER_READS = 3
"""How many times a context reads the turns before the cursor when folds keep moving it
meanwhile; then it shows none of them rather than wait for a still cursor."""


class Recall:
    """Finds what a context recalls; what it finds is a function of the session, not of
    timing (see :class:`~voice_context.manager.live.Basis`)."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder | None,
        recall_ahead: AheadMode,
        background: Background,
        indexing: Indexing,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.recall_ahead = recall_ahead
        self.background = background
        self.indexing = indexing

    def _vectors(self, live: Live) -> int:
        return len(live.recall.vectors or ()) if self.embedder is not None else 0

    def basis(self, live: Live) -> Basis:
        """The basis a search for a context would have now."""
        recall, session = live.recall, live.session
        return Basis(
            recall.searchable, recall.noted, self._vectors(live), session.total_turns - 1, session.cursor,
            session.summary, live.tiers,
        )  # fmt: skip

    # -- ahead of the reply ----------------------------------------------------

    async def ahead(self, live: Live, session: Session, ahead: RecallAhead) -> None:
        """The core found a user turn to search for ahead of the reply."""
        self.maybe_ahead(live, ahead.turn)

    def maybe_ahead(self, live: Live, turn: Turn) -> None:
        """Recall for a user turn just stored (the core said it is one to search for), in the
        background: the bot's next context will ask for it (its default query is the newest
        user turn). The manager's ``recall_ahead`` says how often: ``first`` once per context."""
        mode = self.recall_ahead
        if mode == "off" or not self.background.started:
            return
        if mode == "first" and not live.recall.armed:
            return
        ahead = Ahead(turn.text)
        live.recall.ahead = ahead
        live.recall.armed = False
        self.background.spawn(self._ahead, live, ahead)

    async def _ahead(self, live: Live, ahead: Ahead) -> None:
        try:
            await self.indexing.caught_up(live)
            if live.recall.ahead is ahead:  # no newer user turn meanwhile
                ahead.basis, ahead.found = await self.search(live, ahead.query, default=True)
        except Exception:  # the context will recall for itself
            log.warning("voice_context_recall_ahead_failed", session=live.session.name, exc_info=True)
        finally:
            ahead.done.set()

    async def found_ahead(self, live: Live, text: str) -> Offered | None:
        """What recall ahead found for ``text``, waiting for it if it is still running; ``None``
        when it was for another query, failed, or was made on another basis than this context's
        search would be (a turn, a note or a fold since; the indexing still behind): then the
        context searches for itself, and finds what the session holds. Either way the next user
        turn may start a recall ahead again."""
        ahead = live.recall.ahead
        live.recall.armed = True
        if ahead is None or ahead.query != text:
            return None
        await ahead.done.wait()
        await self.indexing.caught_up(live)  # what this context's own search would read
        if ahead.found is None or ahead.basis != self.basis(live):
            log.debug("voice_context_recall_ahead_unused", session=live.session.name)
            return None
        return ahead.found

    # -- on the reply path -----------------------------------------------------

    async def search(self, live: Live, text: str, *, default: bool) -> tuple[Basis | None, Offered]:
        """What recall offers a context for ``text`` (``default``: the newest user turn, no query
        named): passages from the store's index (rendered when the context asks, see
        :class:`Offered`), then summary lines; and the basis they were
        found on (``None`` when it is not known: the store failed, vectors came meanwhile). A
        store that fails leaves the context without them, never without a reply."""
        session, recall, embedder = live.session, live.recall, self.embedder
        limit = max(1, session.config.recall_limit) + 4  # a few spare for those shown verbatim anyway
        before = session.total_turns - 1
        vectors = self._vectors(live)
        query_vector = None
        if embedder is not None and recall.vectors:
            # a model's forward pass must not hold up the event loop
            query_vector = (await anyio.to_thread.run_sync(embedder.embed, [text]))[0]
        known = True
        try:
            stats, found = await find_in_store(
                self.store,
                session.name,
                text,
                before=before,
                limit=limit,
                query_vector=query_vector,
                vectors=recall.vectors,
                held=recall.held.view(),
                now=query_time(session),
                common=DEFAULT_QUERY_COMMON if default else 1.0,
                asked=not default,
            )
        except StoreError:
            log.warning("voice_context_recall_failed", session=session.name, exc_info=True)
            stats, found, known = None, NOTHING_FOUND, False
        if vectors != self._vectors(live):
            known = False  # vectors came during the search: which of them it saw is not known
        basis = None
        if known:
            basis = replace(self.basis(live), before=before)
            if stats is not None:  # (none: no word to search by, the same on any index)
                basis = replace(basis, turns=stats.turns, notes=stats.notes, vectors=vectors)
        lines = tuple(self._summary_lines(live, text))
        return basis, Offered(found.render, lines)

    @staticmethod
    def _summary_lines(live: Live, text: str) -> list[Recalled]:
        """The lines of the summary, then of the tiers a context does not show, for ``text``."""
        recall, limit = live.recall, live.session.config.recall_limit
        lines: list[Recalled] = []
        summary = live.session.summary
        if summary:
            if recall.summary is None or recall.summary.summary is not summary:
                recall.summary = SummaryIndex.of(summary)
            lines.extend(recall.summary.search(text, limit=limit))
        if live.tiers:
            seen = {r.line for r in lines}
            lines.extend(hit for hit in Tiers.index(live).search(text, limit=limit) if hit.line not in seen)
        return lines

    async def older(self, live: Live, budget_chars: int | None) -> TurnRun | None:
        """The turns just before the cursor a budgeted context may extend its verbatim run into:
        as many as the budget could hold at 20 chars a line, read once per cursor (none without
        a budget). Kept here only as far back as the budget's chars reach.

        A fold that lands while they are read moves the cursor past them: they are read again
        for the new cursor (a few times at most; the context joins only turns that run up to
        its cursor, see :func:`~voice_context.core.budget.build_context`)."""
        if budget_chars is None:
            return None
        count = min(MAX_OLDER_TURNS, budget_chars // 20)
        store, name = self.store, live.session.name
        run: TurnRun | None = None
        for _ in range(OLDER_READS):
            cursor = live.session.cursor
            if not cursor:
                return None
            cached = live.recall.older
            if cached is not None and cached[1].end == cursor and cached[0] >= count:
                return cached[1]
            try:
                turns = await store.read_turns(name, max(0, cursor - count), cursor)
            except StoreError:
                log.warning("voice_context_older_turns_failed", session=live.session.name, exc_info=True)
                return run
            run = _kept(cursor, turns, budget_chars)
            live.recall.older = (count, run)
            if live.session.cursor == cursor:  # decide again after the await
                return run
            log.info(
                "voice_context_older_turns_stale", session=live.session.name, read_for=cursor,
                cursor=live.session.cursor,
            )  # fmt: skip
        return run


def _kept(cursor: int, turns: list[Turn], budget_chars: int) -> TurnRun:
    """The newest of ``turns`` (which end at ``cursor``) that ``budget_chars`` reaches."""
    kept, chars = 0, 0
    for turn in reversed(turns):
        if chars >= budget_chars:
            break
        chars += len(turn.text) + len(turn.speaker) + 2
        kept += 1
    return TurnRun.of(cursor - kept, turns[len(turns) - kept :])
