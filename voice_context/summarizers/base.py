"""The summarizer contract: previous summary + a batch of turns -> a new summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from voice_context.core.session import CompactionPlan
from voice_context.core.turns import Note, Turn


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """Everything a summarizer needs to fold one batch into the running summary.

    ``first_index`` is the transcript index of ``turns[0]``. ``recompact`` is
    true for the second pass the core asks for when a summary came back too
    long: then ``turns`` is empty and ``previous_summary`` is the overlong text
    to condense.
    """

    previous_summary: str
    turns: Sequence[Turn]
    notes: Sequence[Note] = ()
    max_chars: int = 1200
    max_note_chars: int = 400
    first_index: int = 0
    recompact: bool = False
    session: str = field(default="", compare=False)

    @classmethod
    def for_plan(cls, plan: CompactionPlan, session: str = "") -> SummaryRequest:
        """The request that carries out a session's compaction plan."""
        return cls(
            previous_summary=plan.previous_summary,
            turns=plan.turns,
            notes=plan.notes,
            max_chars=plan.max_chars,
            max_note_chars=plan.max_note_chars,
            first_index=plan.start,
            recompact=plan.recompact,
            session=session,
        )


@runtime_checkable
class Summarizer(Protocol):
    """Anything that can fold a batch of turns into a summary.

    ``summarize`` returns the new summary text. It raises
    :class:`voice_context.errors.SummarizerError` (with ``retryable`` set) for
    anything that went wrong; the session manager treats every other exception
    the same way, as a non-retryable failure.
    """

    @property
    def model(self) -> str:
        """A short name for logs: the model, or the kind of summarizer."""
        ...

    async def summarize(self, request: SummaryRequest) -> str: ...
