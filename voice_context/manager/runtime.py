"""The one feed point of the sessions served here: every event goes to a session through
:meth:`Runtime.feed`, and every effect that comes back is performed by the performer of its
type. The core decides; the shell performs, and feeds back what came of it::

    effects = await runtime.feed(live, TurnAppended(turn, now))
    # performed, in order: TurnHeld (indexed), RecallAhead, StartCompaction or Skip,
    # RollTiers, StoreLandmark: whichever the session said

A performer may feed the session again (a commit stored: ``CompactionStored``); what that came
to is performed the same way, and returned after the effect that led to it. An effect no
performer takes (``Abandoned``, ``Unpinned``) is an answer for the caller alone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from voice_context.core.session import Effect, Event, Session
from voice_context.manager.live import Live

E = TypeVar("E")

#: The manager's clock: what time it is, as the sessions' events say it.
Clock = Callable[[], float]


class Feed(Protocol):
    """The one feed point, as a job is given it (:meth:`Runtime.feed`)."""

    def __call__(
        self, live: Live, event: Event, *, session: Session | None = None
    ) -> Awaitable[list[Effect]]: ...


#: Performs one effect for a session served here (``session``: the copy that said it, the one
#: served or a fold's own); returns what the events it fed in turn came to, if it fed any.
Performer = Callable[[Live, Session, E], Awaitable[Sequence[Effect] | None]]


class Runtime:
    """The performers of the effects, by type, and the one place a session receives an event."""

    def __init__(self) -> None:
        self._performers: dict[type[Any], Performer[Any]] = {}

    def __repr__(self) -> str:
        kinds = ", ".join(sorted(kind.__name__ for kind in self._performers))
        return f"<Runtime performs={kinds}>"

    def performs(self, kind: type[E], performer: Performer[E]) -> None:
        """Have ``performer`` perform every effect of type ``kind`` (one performer a type)."""
        if kind in self._performers:
            raise ValueError(f"{kind.__name__} is performed already")
        self._performers[kind] = performer

    async def feed(self, live: Live, event: Event, *, session: Session | None = None) -> list[Effect]:
        """Feed ``event`` to the session (``live.session``, or ``session``: a copy a fold or a
        failure is about, which may have been rebuilt since), then perform each effect in order.

        Returns every effect, each followed by what it led to: the caller reads the ones that
        answer it (``TurnHeld``, ``PersistNotes``, ``Applied``, ``StartCompaction``...). Raises
        what the session raises for the event, and what a performer raises (a store error, for
        a write the caller asked for), the effects after it left undone."""
        session = live.session if session is None else session
        told: list[Effect] = []
        for effect in session.receive(event):
            told.append(effect)
            performer = self._performers.get(type(effect))
            if performer is not None:
                told.extend(await performer(live, session, effect) or ())
        return told
