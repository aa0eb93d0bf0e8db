"""The two things a session is made of: spoken turns and screen-watch notes.

Both are frozen values. A turn's position in the transcript (its *index*) is not
part of the turn: the session assigns it on append, and it never changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Role = Literal["user", "assistant", "system", "tool"]
ROLES: frozenset[str] = frozenset(get_args(Role))


@dataclass(frozen=True, slots=True)
class Turn:
    """One finalized transcript turn.

    ``at`` is the time the turn was spoken, in unix seconds. ``id`` is the
    bot's own identifier for the turn, if it has one (echoed back, never
    interpreted).

    A bot that calls tools sends them as turns too: a **tool call** is an
    ``assistant`` turn with ``tool_call_id``, ``tool_name`` and
    ``tool_arguments`` (JSON text; ``text`` is what the assistant said with
    it, often nothing); a **tool result** is a ``tool`` turn with the
    ``tool_call_id`` it answers (and ``tool_name``), the result in ``text``.
    A call and its result are never separated (see :mod:`voice_context.core.tools`).
    """

    speaker: str
    role: Role
    text: str
    at: float
    id: str | None = None
    tool_call_id: str | None = None
    tool_name: str | None = None
    tool_arguments: str | None = None

    @property
    def is_tool_call(self) -> bool:
        return self.role == "assistant" and self.tool_call_id is not None

    @property
    def is_tool_result(self) -> bool:
        return self.role == "tool" and self.tool_call_id is not None


@dataclass(frozen=True, slots=True)
class TurnRun:
    """Consecutive turns of one transcript and the index of the first: a run of turns
    read from a store carries where it starts, so that it is joined only to the turn
    that follows it.

    ``TurnRun.of(first, turns)`` makes one from any sequence; ``end`` is the index just
    after its last turn.
    """

    first: int
    turns: tuple[Turn, ...] = ()

    @classmethod
    def of(cls, first: int, turns: Sequence[Turn]) -> TurnRun:
        return cls(first, tuple(turns))

    @property
    def end(self) -> int:
        return self.first + len(self.turns)

    def until(self, end: int) -> TurnRun:
        """The part of the run that ends exactly at index ``end``: every turn before ``end``
        when the run reaches it, none when a gap lies between the run and ``end``."""
        if not self.first <= end <= self.end:
            return TurnRun(end)
        return TurnRun(self.first, self.turns[: end - self.first])


@dataclass(frozen=True, slots=True)
class Note:
    """One screen-watch note: what was on a shared screen, and whose it was."""

    text: str
    at: float
    speaker: str | None = None
    source: str | None = None

    def render(self) -> str:
        """The note as one line of prose, keeping its provenance."""
        who = self.speaker or ""
        where = f" ({self.source})" if self.source else ""
        if who:
            return f"{who}'s screen{where}: {self.text}"
        return f"Screen{where}: {self.text}"
