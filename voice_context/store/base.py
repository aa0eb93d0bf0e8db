"""The store contract: where sessions outlive the process that serves them.

A store keeps, per session: the full transcript (append-only, by index), the
cursor and the summary (which always move together), the live and pending
screen notes, the session's config overrides and owner, its landmarks, and a
compaction lease with a fencing token so that only one replica folds a
session at a time.

Backends translate their own exceptions into :class:`StoreError` at the edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from voice_context.core.landmarks import Landmark
from voice_context.core.turns import Note, Turn


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session as the store holds it.

    ``turns`` are the turns from ``cursor`` on (what a live session needs);
    ``total_turns`` counts every turn ever appended.
    """

    name: str
    cursor: int = 0
    summary: str = ""
    total_turns: int = 0
    turns: tuple[Turn, ...] = ()
    live_notes: tuple[Note, ...] = ()
    pending_notes: tuple[Note, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    owner: str | None = None
    failures: int = 0
    compactions: int = 0


@runtime_checkable
class Store(Protocol):
    """Durable session state. Every method raises ``StoreError`` on failure, and
    ``SessionNotStored`` (a ``StoreError``) when it needs a session the store does not hold."""

    async def load(self, name: str) -> SessionRecord | None:
        """The session's record, or ``None`` if the store has never seen it."""
        ...

    async def create(self, record: SessionRecord) -> None:
        """Record a new session (its config and owner). Idempotent for the same name."""
        ...

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        """Durably store the turn at ``index``; the ack to the bot waits for this."""
        ...

    async def save_notes(self, name: str, live: Sequence[Note], pending: Sequence[Note]) -> None:
        """Replace the session's live and pending notes."""
        ...

    async def save_config(self, name: str, config: dict[str, Any]) -> None:
        """Replace the session's config overrides (given again when it was resumed)."""
        ...

    async def commit_compaction(
        self,
        name: str,
        *,
        expected_cursor: int,
        new_cursor: int,
        summary: str,
        pending_notes: Sequence[Note],
        fence: int | None = None,
    ) -> bool:
        """Move cursor and summary together, if the cursor is still ``expected_cursor``
        and ``fence`` (when given) is still the newest lease token. Returns whether it did.
        """
        ...

    async def read_turns(self, name: str, start: int, end: int) -> list[Turn]:
        """The stored turns with indices in ``[start, end)``."""
        ...

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        """Take the session's compaction lease for ``ttl`` seconds; returns a fencing
        token that grows with every grant, or ``None`` while another holder has it."""
        ...

    async def release_lease(self, name: str, holder: str) -> None: ...

    async def delete(self, name: str) -> None:
        """Forget the session entirely (its landmarks too)."""
        ...

    async def save_landmark(self, name: str, landmark: Landmark) -> None:
        """Keep a landmark (replacing the one at its index): it outlives restarts and is
        seen by every replica."""
        ...

    async def delete_landmark(self, name: str, index: int) -> bool:
        """Unpin the landmark at ``index``; returns whether there was one."""
        ...

    async def load_landmarks(self, name: str) -> tuple[Landmark, ...]:
        """The session's landmarks, oldest first (none for a session the store lacks)."""
        ...

    async def aclose(self) -> None: ...
