"""The store contract: where sessions outlive the process that serves them.

A store keeps, per session: the full transcript (append-only, by index), the
cursor and the summary (which always move together), the live and pending
screen notes, the session's config overrides and owner, its landmarks, and a
compaction lease with a fencing token so that only one replica folds a session
at a time; with a ``session_ttl``, only until the session has been idle that long.
It keeps the summaries of the tier cascade (conversations, days, weeks), one per tier
and period. Beside them it keeps the session's recall index: the words of every turn and note
with their counts (BM25's postings), the notes' text, and the turns' vectors when an
embedder made them; so a process serving a session holds none of its history, and
every replica searches the same index. The index goes with its session.

Backends translate their own exceptions into :class:`StoreError` at the edge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, runtime_checkable

from voice_context.core.landmarks import Landmark
from voice_context.core.recalled import IndexedDoc, Passage, Posting, RecallStats
from voice_context.core.tiers import TierSummary
from voice_context.core.turns import Note, Turn


@dataclass(frozen=True, slots=True, kw_only=True)
class FoldCommit:
    """What a landed fold writes to a store, all or nothing: the cursor moves from
    ``expected_cursor`` to ``new_cursor`` (never back), and the summary and the notes still
    waiting to be folded are replaced with it. ``fence`` is the lease token the fold ran under
    (``None``: no lease)."""

    expected_cursor: int
    new_cursor: int
    summary: str
    pending_notes: tuple[Note, ...] = ()
    fence: int | None = None

    def __post_init__(self) -> None:
        if self.new_cursor < self.expected_cursor:
            raise ValueError(f"the cursor only moves forward ({self.expected_cursor} -> {self.new_cursor})")
        object.__setattr__(self, "pending_notes", tuple(self.pending_notes))


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


class Created(NamedTuple):
    """What :meth:`Store.create` did: whether this call made the session, and the owner the
    store holds for the name after it (the record's own when it made it). Of replicas racing
    to create one name, one makes it and every other is told its owner: the opener whose
    owner it is not must refuse the session."""

    made: bool
    owner: str | None


class StoredSession(NamedTuple):
    """A stored session at a glance, as :meth:`Store.list_sessions` lists it: its name, its
    owner, how many turns it holds and its cursor."""

    name: str
    owner: str | None
    turns: int
    cursor: int


ChooseTerms = Callable[[Sequence[str], Callable[[str], int], RecallStats], list[str]]
"""Picks the words a search reads the postings of, from their doc counts and the index's stats."""

Picked = TypeVar("Picked")

PickPassages = Callable[[RecallStats, dict[str, int], dict[str, list[Posting]]], tuple[Picked, Sequence[int]]]
"""Ranks what a search read of the index (its stats, the words' doc counts, the postings read)
and says which passages to read: its ranking, whatever it is, and their keys."""


@dataclass(frozen=True, slots=True)
class RecallSearch(Generic[Picked]):
    """What one read of a session's recall index found for a search (see
    :meth:`Store.recall_search`): the index's stats, how many docs hold each of the query's
    words (those it holds), the postings of the words chosen, what ``pick`` made of them, and
    the passages it asked for (those the store holds)."""

    stats: RecallStats
    df: dict[str, int]
    postings: dict[str, list[Posting]]
    picked: Picked
    passages: dict[int, Passage]


@runtime_checkable
class Store(Protocol):
    """Durable session state. Every method raises ``StoreError`` on failure, and
    ``SessionNotStored`` (a ``StoreError``) when it needs a session the store does not hold."""

    #: Seconds after its last activity (a write, or a ``touch``) that a session is forgotten;
    #: ``None`` keeps every session until it is deleted.
    session_ttl: float | None

    async def load(self, name: str) -> SessionRecord | None:
        """The session's record, or ``None`` if the store has never seen it."""
        ...

    async def create(self, record: SessionRecord) -> Created:
        """Record a new session (its config and owner) unless the store holds one by that name,
        atomically (one transaction, one script): a name is owned once, by the first create,
        and a later create changes nothing and is told who owns it."""
        ...

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        """Durably store the turn at ``index``; the ack to the bot waits for this. Its recall
        doc is indexed later, by :meth:`index_turns` (a batch of turns at a time: the process
        serving the session searches the newest ones from memory meanwhile)."""
        ...

    async def save_notes(
        self, name: str, live: Sequence[Note], pending: Sequence[Note], doc: IndexedDoc | None = None
    ) -> RecallStats | None:
        """Replace the session's live and pending notes.

        With ``doc`` (the recall doc of the note just added), a store may add it to the session's
        recall index in the same write, under the next note key (as :meth:`index_note` does): then
        it returns the index's stats after the write. ``None``: the note is not indexed (no
        ``doc``, or a store that indexes in writes of their own), and :meth:`index_note` indexes
        it later. Notes take their keys in the order they are indexed: the caller gives a doc only
        when none of the session's notes waits for the index before this one.
        """
        ...

    async def save_config(self, name: str, config: dict[str, Any]) -> None:
        """Replace the session's config overrides (given again when it was resumed)."""
        ...

    async def commit_compaction(self, name: str, fold: FoldCommit) -> bool:
        """Land ``fold``: move cursor and summary together, if the cursor is still
        ``fold.expected_cursor`` and ``fold.fence`` (when given) is still the newest lease
        token. Returns whether it did (a retry of a commit that already landed did)."""
        ...

    async def read_turns(self, name: str, start: int, end: int) -> list[Turn]:
        """The stored turns with indices in ``[start, end)``."""
        ...

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        """Take the session's compaction lease for ``ttl`` seconds; returns a fencing
        token that grows with every grant, or ``None`` while another holder has it."""
        ...

    async def renew_lease(self, name: str, holder: str, fence: int, ttl: float) -> bool:
        """Extend the lease granted with token ``fence`` to ``ttl`` seconds from now.

        Returns ``False`` when a later grant superseded it (the fencing token moved on),
        or the session is gone: the holder has lost the lease. A lease that lapsed and
        was granted to nobody since is taken back.
        """
        ...

    async def release_lease(self, name: str, holder: str) -> None: ...

    async def touch(self, names: Sequence[str]) -> None:
        """These sessions are in use: their idle time starts again now (unknown names are
        ignored; nothing to do without a ``session_ttl``)."""
        ...

    async def expire(self) -> list[str]:
        """Forget every session idle for longer than ``session_ttl``; returns their names
        (a backend that forgets them by itself, as Redis does, returns none)."""
        ...

    async def delete(self, name: str) -> None:
        """Forget the session entirely (its landmarks and its recall index too)."""
        ...

    async def list_sessions(self, owner: str | None, limit: int) -> list[StoredSession]:
        """The first ``limit`` stored sessions of ``owner`` (``None``: those made without one), by
        name. A read: it changes nothing, and keeps no idle session from expiring."""
        ...

    # -- the recall index ------------------------------------------------------

    async def index_turns(self, name: str, start: int, docs: Sequence[IndexedDoc]) -> RecallStats:
        """Add the docs of turns ``start, start+1, ...`` to the session's recall index.

        Turns are indexed in order, each once: docs for turns already indexed are
        skipped (another replica got there first), and nothing is indexed when ``start``
        is past the next turn to index. Returns the index's stats after the call.
        """
        ...

    async def index_note(self, name: str, doc: IndexedDoc) -> RecallStats:
        """Add a screen note to the recall index (it gets the next negative key)."""
        ...

    async def recall_postings(
        self, name: str, terms: Sequence[str], choose: ChooseTerms | None = None
    ) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
        """The index's stats, how many docs hold each of ``terms`` (those it holds), and the
        postings of the terms ``choose(terms, df, stats)`` picks (of all of them without it)."""
        ...

    async def recall_passages(self, name: str, keys: Sequence[int]) -> dict[int, Passage]:
        """The passages with these keys (turns by transcript index, notes by negative key)."""
        ...

    async def recall_search(
        self, name: str, terms: Sequence[str], choose: ChooseTerms, pick: PickPassages[Picked]
    ) -> RecallSearch[Picked]:
        """The read side of a search: the index's stats and the doc counts of ``terms``, the
        postings of the words ``choose`` picks (as :meth:`recall_postings`), what
        ``pick(stats, df, postings)`` makes of them, and the passages of the keys it returns (as
        :meth:`recall_passages`). SQLite and the memory store read it all at once, from one
        snapshot, so a write that lands meanwhile is in all of it or in none; Redis reads it in
        two round trips. ``pick`` runs inside the read (for SQLite in the reader's worker thread,
        holding the reader): it should be quick, and touch nothing the event loop changes."""
        ...

    async def save_vectors(self, name: str, vectors: dict[int, bytes]) -> None:
        """Keep the docs' vectors (an embedder's, serialized), by doc key."""
        ...

    async def load_vectors(self, name: str) -> dict[int, bytes]:
        """Every vector kept for the session, by doc key."""
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

    # -- the tier cascade ------------------------------------------------------

    async def save_tier(self, name: str, summary: TierSummary) -> bool:
        """Keep a rolled summary, one per session, tier and period start, atomically: only
        when the store has none for them or ``summary`` covers more turns (the rule of
        :func:`voice_context.core.tiers.should_replace`). Returns whether it was kept;
        ``False`` means an equal or newer roll is already there (another replica's)."""
        ...

    async def load_tiers(self, name: str) -> tuple[TierSummary, ...]:
        """The session's rolled summaries, by tier and period start (none for an unknown session)."""
        ...

    async def open(self) -> None:
        """Make the store ready now rather than at its first operation (a server calls it before
        it listens): a file's schema made or migrated. Nothing, where there is nothing to make."""
        ...

    async def aclose(self) -> None: ...
