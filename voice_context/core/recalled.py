"""What recall offers a context: a passage from the session's past, ready to show."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

PassageKind = Literal["turn", "note", "summary"]

MAX_TERM_DOCS = 1000
"""A word held by more docs than this is too common to search by: a search leaves it out, and
a store may stop keeping its postings past this many."""

Posting = tuple[int, int, int]
"""One doc holding one word: ``(key, tf, length)``: the doc's key (a turn's transcript index,
or a negative number for a note), how often the word is in it, and how many words it has."""


@dataclass(frozen=True, slots=True)
class Passage:
    """A doc of a session's recall index as recall shows it: a turn (``turn`` is its
    transcript index) or a screen note (``turn`` is ``None``)."""

    kind: PassageKind
    turn: int | None
    at: float
    speaker: str
    text: str
    role: str = "user"


@dataclass(frozen=True, slots=True)
class IndexedDoc:
    """A doc as a store's recall index keeps it: its passage (a turn's text is the stored
    turn's: a store need not keep it twice), its words with their counts, and its length."""

    passage: Passage
    terms: tuple[tuple[str, int], ...]
    length: int


@dataclass(frozen=True, slots=True)
class RecallStats:
    """A session's recall index at a glance: how many docs, their total length in words,
    how many turns (``0 .. turns-1``) and notes it holds."""

    docs: int = 0
    length: int = 0
    turns: int = 0
    notes: int = 0


@dataclass(frozen=True, slots=True)
class Recalled:
    """One passage recall offers a context.

    ``turn`` is the transcript index of the turn it quotes (``None`` for a note
    or a summary line); ``line`` is what the context shows, dated and
    attributed; ``score`` ranks it (higher is better); ``granularity`` says
    whether the line is the whole turn or only its matching sentences.
    """

    kind: PassageKind
    turn: int | None
    line: str
    score: float
    granularity: Literal["turn", "sentences"] = "turn"
    at: float | None = None

    def as_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "text": self.line}
        if self.turn is not None:
            out["turn"] = self.turn
        if self.kind == "turn":
            out["granularity"] = self.granularity
        return out


@dataclass(frozen=True, slots=True)
class Offered:
    """What recall offers a context, best first: the passages a search found, rendered when the
    context asks (``render(shown_from)``: the first turn it shows verbatim, whose passages it
    never shows and so need no rendering; ``None``: render them all), then ``more`` (summary
    lines) as they are."""

    render: Callable[[int | None], list[Recalled]]
    more: tuple[Recalled, ...] = ()

    def __call__(self, shown_from: int | None = None) -> list[Recalled]:
        return [*self.render(shown_from), *self.more]
