"""What recall offers a context: a passage from the session's past, ready to show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

PassageKind = Literal["turn", "note", "summary"]


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
