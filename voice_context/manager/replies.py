"""What a reply asks the manager for: the context, a handoff to a fresh provider session, and
the context rebuilt after an emergency fold when the bot's model refused it as too long."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import anyio.to_thread

from voice_context.core.budget import Context, Format, build_context
from voice_context.core.emergency import safety_start
from voice_context.core.handoff import LAST_TURNS, Handoff, fit_questions, open_questions
from voice_context.core.session import (
    Applied,
    ContextView,
    OverflowReported,
    Session,
    StartCompaction,
    SummaryReturned,
)
from voice_context.core.tokens import TokenCounter
from voice_context.errors import ContextOverflow
from voice_context.logs import get_logger
from voice_context.manager.compactions import Compactions
from voice_context.manager.indexing import Indexing
from voice_context.manager.live import Live
from voice_context.manager.outcomes import Outcomes
from voice_context.manager.recall import Recall
from voice_context.manager.registry import Served
from voice_context.manager.runtime import Clock, Feed
from voice_context.manager.tiers import Tiers
from voice_context.recall.index import default_query
from voice_context.summarizers.fallback import emergency_fold
from voice_context.tokenizers import load_tokenizer

log = get_logger("voice_context")


class Replies:
    """Builds contexts and handoffs; never waits for a fold (it starts one when due)."""

    def __init__(
        self,
        tokenizer: str | None,
        served: Served,
        clock: Clock,
        feed: Feed,
        compactions: Compactions,
        outcomes: Outcomes,
        indexing: Indexing,
        recall: Recall,
        tiers: Tiers,
    ) -> None:
        #: the default tokenizer, read as the manager is entered (``None``: at its first use)
        self.tokenizer = tokenizer
        self.served = served
        self.clock = clock
        self.feed = feed
        self.compactions = compactions
        self.outcomes = outcomes
        self.indexing = indexing
        self.recall = recall
        self.tiers = tiers
        self._counters: dict[str, TokenCounter] = {}

    async def preload(self) -> None:
        """Read the default tokenizer's file once per process, before the first reply needs it
        (unless the manager was told not to: ``tokenizer_ahead``)."""
        if self.tokenizer is not None:
            tokenizer = self.tokenizer
            self._counters[tokenizer] = await anyio.to_thread.run_sync(load_tokenizer, tokenizer)

    async def counter(self, tokenizer: str) -> TokenCounter:
        """The token counter of a tokenizer; its first use reads its file, off the event loop."""
        counter = self._counters.get(tokenizer)
        if counter is None:
            counter = await anyio.to_thread.run_sync(load_tokenizer, tokenizer)
            self._counters[tokenizer] = counter
        return counter

    async def context(
        self,
        name: str,
        format: Format,
        *,
        budget_chars: int | None,
        budget_tokens: int | None,
        base_instructions: str,
        facts: Sequence[str],
        query: str | None,
        owner: str | None,
    ) -> Context:
        """See :meth:`voice_context.manager.SessionManager.context`."""
        served = self.served
        live = served.get(name, owner)
        tokenizer = live.session.config.tokenizer
        counter = self._counters.get(tokenizer)
        if counter is None and budget_tokens is not None:  # only a token budget counts tokens
            counter = await self.counter(tokenizer)
            live = served.get(name, owner)  # decide again after the await
        if budget_chars is None and format == "instructions":
            budget_chars = live.session.config.instructions_budget_chars
        self.tiers.maybe_roll(live)
        session = live.session
        text = default_query(session.verbatim_turns) if query is None else query
        ahead = session.config.recall and query is None  # recall ahead is for the default query
        recalled = await self.recall.found_ahead(live, text) if ahead else None
        if recalled is None and session.config.recall and text.strip():
            await self.indexing.caught_up(live)
            _, recalled = await self.recall.search(live, text, default=query is None)
        older = await self.recall.older(live, older_chars(budget_chars, budget_tokens))
        live = served.get(name, owner)  # decide again after the awaits
        context = build_context(
            self.tiers.view(live),
            format,
            budget_chars=budget_chars,
            budget_tokens=budget_tokens,
            tokens=counter if budget_tokens is not None else None,  # a whole count costs ~45 us/kchar
            base_instructions=base_instructions,
            facts=facts,
            recalled=recalled or [],
            query=text,
            older=older,
            asked=query is not None,
        )
        # a fold due now is decided by what this context's layout measured (the fill trigger), and
        # lands for the next one: what a context shows never hangs on when a fold happens to land
        await self.compactions.maybe_compact(live, context.fill)
        return context

    async def handoff(
        self,
        name: str,
        *,
        limit_chars: int | None,
        base_instructions: str,
        facts: Sequence[str],
        query: str | None,
        last_turns: int = LAST_TURNS,
        owner: str | None,
    ) -> Handoff:
        """See :meth:`voice_context.manager.SessionManager.handoff`."""
        session = self.served.get(name, owner).session
        limit = session.config.instructions_budget_chars if limit_chars is None else limit_chars
        questions, section = fit_questions(open_questions(session.verbatim_turns, session.cursor), limit)
        context = await self.context(
            name,
            "instructions",
            budget_chars=max(0, limit - (len(section) + 2 if section else 0)),
            budget_tokens=None,
            base_instructions=base_instructions,
            facts=facts,
            query=query,
            owner=owner,
        )
        instructions = "\n\n".join(part for part in (context.instructions, section) if part)
        session = self.served.get(name, owner).session
        verbatim = session.verbatim_turns
        count = max(0, min(last_turns, len(verbatim)))
        first = session.total_turns - count
        return Handoff(
            instructions,
            limit,
            tuple((first + k, turn) for k, turn in enumerate(verbatim[len(verbatim) - count :])),
            tuple(questions),
            session.cursor,
            session.total_turns,
            len(context.recalled),
        )

    async def emergency(
        self, live: Live, format: Format, limit_tokens: int | None, base_instructions: str
    ) -> Applied | None:
        """Fold everything before the safety region at once, without a model, and commit it
        (see :meth:`voice_context.manager.SessionManager.overflow`); what moved, if anything."""
        counter = await self.counter(live.session.config.tokenizer)
        async with live.lock:
            session = live.session
            keep = session.cursor + safety_start(session.verbatim_turns)
            if limit_tokens is not None:
                needed = _needed(session, keep, format, base_instructions, counter)
                if needed > limit_tokens:
                    raise ContextOverflow(
                        f"the base instructions and the last turns that must stay take {needed} tokens,"
                        f" over the limit of {limit_tokens}",
                        needed=needed,
                        limit=limit_tokens,
                    )
            if keep <= session.cursor:
                return None
            live.cancel_fold()  # its plan is superseded: its result would be stale
            [start] = await self.feed(live, OverflowReported(keep, self.clock()))
            assert isinstance(start, StartCompaction)  # run here, at once (its performer leaves it)
            plan = start.plan
            text = emergency_fold(plan, counter, session.config.max_summary_chars)
            # the same protocol as any fold: the result committed to the store, then applied
            effects = await self.feed(live, SummaryReturned(plan.plan_id, text, self.clock()))
            for again in effects:
                if isinstance(again, StartCompaction):  # a re-compaction pass: the next request folds again
                    await self.outcomes.abandon(live, session, again.plan.plan_id)
            told = [effect for effect in effects if isinstance(effect, Applied)]
            if not told:
                return None
            applied = told[0]
            log.warning(
                "voice_context_emergency_compaction",
                session=session.name,
                old_cursor=applied.old_cursor,
                new_cursor=applied.new_cursor,
                folded=plan.end - plan.start,
                summary_chars=len(applied.summary),
                limit_tokens=limit_tokens,
            )
            return applied


def _needed(session: Session, keep: int, format: Format, base: str, counter: TokenCounter) -> int:
    """The tokens the base instructions and the safety region take, as a context shows them."""
    region = ContextView(keep, "", session.verbatim_turns[keep - session.cursor :], (), session.config)
    shown = build_context(region, format, base_instructions=base, budget_chars=1 << 30, tokens=counter)
    assert shown.tokens is not None
    return shown.tokens


def older_chars(budget_chars: int | None, budget_tokens: int | None) -> int | None:
    """The char budget that bounds how many turns before the cursor a context may show:
    a token budget holds at most about four chars a token of them."""
    if budget_tokens is None:
        return budget_chars
    from_tokens = budget_tokens * 4
    return from_tokens if budget_chars is None else min(budget_chars, from_tokens)
