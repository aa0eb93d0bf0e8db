"""A model summarizer that always folds: the deterministic fold stands in when the model cannot.

:class:`FallbackSummarizer` wraps a model summarizer (the OpenAI-compatible
one). When the model fails after its own retries (a timeout, a refused or
dropped connection, a 5xx, a malformed reply), runs past ``deadline``, or
answers nothing usable (empty or blank), the batch is folded without a model
instead: its turns are compressed (:func:`~voice_context.summarizers.compress.compress`)
and folded by the :class:`DeterministicSummarizer` into the previous summary,
within ``max_chars``. The batch is never left unfolded, to be retried forever
against a model that is down; each fallback is logged as
``summary_fallback`` with the model's error.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

import anyio

from voice_context.core.emergency import halves
from voice_context.core.session import CompactionPlan
from voice_context.core.tokens import TokenCounter
from voice_context.errors import SummarizerError
from voice_context.logs import get_logger
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.compress import compress, line_of
from voice_context.summarizers.deterministic import FOLD_THREAD, DeterministicSummarizer

_log = get_logger("voice_context.summarizer")


def deterministic_fold(request: SummaryRequest, folder: DeterministicSummarizer | None = None) -> str:
    """The batch folded with no model: compressed, then folded into the previous summary."""
    folder = folder or DeterministicSummarizer()
    if request.turns:
        request = replace(request, turns=compress(request.turns).turns)
    return folder.summarize_now(request)


class FallbackSummarizer:
    """``primary``, or the deterministic fold when it fails; see the module docstring.

    ``deadline`` (seconds, optional) bounds the primary's whole answer: set it
    below the compaction timeout, so that the fallback still has time to land.
    """

    def __init__(self, primary: Summarizer, *, deadline: float | None = None) -> None:
        if deadline is not None and deadline <= 0:
            raise ValueError("deadline must be positive")
        self.primary = primary
        self.deadline = deadline
        preferred = getattr(primary, "preferred_max_summary_chars", None)
        if preferred is not None:  # the ceiling the primary prefers is the session's default
            self.preferred_max_summary_chars = preferred
        self._folder = DeterministicSummarizer()
        self.fallbacks = 0

    @property
    def model(self) -> str:
        return self.primary.model

    def __repr__(self) -> str:
        return f"<FallbackSummarizer {self.primary!r} deadline={self.deadline} fallbacks={self.fallbacks}>"

    async def summarize(self, request: SummaryRequest) -> str:
        error = "empty"
        text = ""
        try:
            with anyio.fail_after(self.deadline):
                text = await self.primary.summarize(request)
        except SummarizerError as exc:
            error = exc.kind
        except TimeoutError:
            error = "timeout"
        if text.strip():
            return text
        self.fallbacks += 1
        _log.warning(
            "summary_fallback",
            model=self.primary.model,
            error=error,
            session=request.session,
            first_index=request.first_index,
            turns=len(request.turns),
        )
        return await FOLD_THREAD.run(partial(deterministic_fold, request, self._folder))

    async def aclose(self) -> None:
        close = getattr(self.primary, "aclose", None)
        if close is not None:
            await close()


def emergency_fold(plan: CompactionPlan, counter: TokenCounter, max_chars: int) -> str:
    """The summary after an emergency compaction: the plan's turns split in two halves of
    about the same number of tokens, each compressed and folded without a model, the second
    into the summary the first made (the merge), within ``max_chars``."""
    turns = list(plan.turns)
    cut = halves(turns, lambda t: counter.count(line_of(t)))
    folder = DeterministicSummarizer()
    summary = plan.previous_summary
    for half, notes in ((turns[:cut], plan.notes), (turns[cut:], ())):
        if not half and not notes:
            continue
        request = SummaryRequest(
            previous_summary=summary,
            turns=compress(half).turns,
            notes=notes,
            max_chars=max_chars,
            max_note_chars=plan.max_note_chars,
            first_index=plan.start,
        )
        summary = folder.summarize_now(request)
    return summary


__all__ = ["FallbackSummarizer", "deterministic_fold", "emergency_fold"]
