"""A store that lives in this process: for tests and for running without persistence."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from voice_context.core.landmarks import Landmark
from voice_context.core.recalled import IndexedDoc, Passage, Posting, RecallStats
from voice_context.core.tiers import TierSummary, should_replace
from voice_context.core.turns import Note, Turn
from voice_context.errors import SessionNotStored, TurnConflict
from voice_context.store.base import (
    ChooseTerms,
    Created,
    FoldCommit,
    Picked,
    PickPassages,
    RecallSearch,
    SessionRecord,
    StoredSession,
)


@dataclass
class _Entry:
    record: SessionRecord
    turns: list[Turn] = field(default_factory=list)
    lease_holder: str | None = None
    lease_until: float = 0.0
    fence: int = 0
    recall: RecallStats = field(default_factory=RecallStats)
    postings: dict[str, list[Posting]] = field(default_factory=dict)
    notes: dict[int, Passage] = field(default_factory=dict)
    vectors: dict[int, bytes] = field(default_factory=dict)
    landmarks: dict[int, Landmark] = field(default_factory=dict)
    tiers: dict[tuple[str, float], TierSummary] = field(default_factory=dict)


class MemoryStore:
    """Keeps every session in a dict. Nothing survives the process."""

    #: nothing outlives the process anyway: sessions are kept until deleted or the process ends
    session_ttl: float | None = None

    def __init__(self, *, clock: Any = time.monotonic) -> None:
        self._sessions: dict[str, _Entry] = {}
        self._clock = clock

    def __repr__(self) -> str:
        return f"<MemoryStore sessions={len(self._sessions)}>"

    def _entry(self, name: str) -> _Entry:
        entry = self._sessions.get(name)
        if entry is None:
            raise SessionNotStored(name)
        return entry

    async def load(self, name: str) -> SessionRecord | None:
        entry = self._sessions.get(name)
        if entry is None:
            return None
        rec = entry.record
        return replace(rec, total_turns=len(entry.turns), turns=tuple(entry.turns[rec.cursor :]))

    async def create(self, record: SessionRecord) -> Created:
        entry = self._sessions.get(record.name)
        if entry is not None:
            return Created(False, entry.record.owner)
        self._sessions[record.name] = _Entry(replace(record, turns=(), total_turns=0))
        return Created(True, record.owner)

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        entry = self._entry(name)
        stored = len(entry.turns)
        if index < stored and entry.turns[index] == turn:
            return  # a retry of a write whose answer was lost: stored once
        if index != stored:
            raise TurnConflict(name, index, stored, differs=index < stored)
        entry.turns.append(turn)

    async def save_notes(
        self, name: str, live: Sequence[Note], pending: Sequence[Note], doc: IndexedDoc | None = None
    ) -> RecallStats | None:
        entry = self._entry(name)
        entry.record = replace(entry.record, live_notes=tuple(live), pending_notes=tuple(pending))
        return None if doc is None else await self.index_note(name, doc)

    async def save_config(self, name: str, config: dict[str, Any]) -> None:
        entry = self._entry(name)
        entry.record = replace(entry.record, config=dict(config))

    async def commit_compaction(self, name: str, fold: FoldCommit) -> bool:
        entry = self._entry(name)
        if fold.fence is not None and fold.fence != entry.fence:
            return False
        if entry.record.cursor == fold.new_cursor and entry.record.summary == fold.summary:
            return True  # a retry of a commit that already landed
        if entry.record.cursor != fold.expected_cursor or fold.new_cursor > len(entry.turns):
            return False
        entry.record = replace(
            entry.record,
            cursor=fold.new_cursor,
            summary=fold.summary,
            pending_notes=tuple(fold.pending_notes),
            compactions=entry.record.compactions + 1,
        )
        return True

    async def list_sessions(self, owner: str | None, limit: int) -> list[StoredSession]:
        out: list[StoredSession] = []
        for name in sorted(self._sessions):
            entry = self._sessions[name]
            if len(out) >= limit:
                break
            if entry.record.owner == owner:
                out.append(StoredSession(name, entry.record.owner, len(entry.turns), entry.record.cursor))
        return out

    async def read_turns(self, name: str, start: int, end: int) -> list[Turn]:
        return list(self._entry(name).turns[start:end])

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        entry = self._entry(name)
        now = self._clock()
        if entry.lease_holder not in (None, holder) and entry.lease_until > now:
            return None
        entry.lease_holder, entry.lease_until = holder, now + ttl
        entry.fence += 1
        return entry.fence

    async def renew_lease(self, name: str, holder: str, fence: int, ttl: float) -> bool:
        entry = self._sessions.get(name)
        if entry is None or entry.fence != fence:
            return False
        entry.lease_holder, entry.lease_until = holder, self._clock() + ttl
        return True

    async def release_lease(self, name: str, holder: str) -> None:
        entry = self._sessions.get(name)
        if entry is not None and entry.lease_holder == holder:
            entry.lease_holder, entry.lease_until = None, 0.0

    async def touch(self, names: Sequence[str]) -> None:
        return None

    async def expire(self) -> list[str]:
        return []

    async def delete(self, name: str) -> None:
        self._sessions.pop(name, None)

    async def index_turns(self, name: str, start: int, docs: Sequence[IndexedDoc]) -> RecallStats:
        entry = self._entry(name)
        for offset, doc in enumerate(docs):
            key = start + offset
            if key < entry.recall.turns:
                continue
            if key > entry.recall.turns or key >= len(entry.turns):
                break
            self._index(entry, key, doc)
            entry.recall = replace(entry.recall, turns=entry.recall.turns + 1)
        return entry.recall

    async def index_note(self, name: str, doc: IndexedDoc) -> RecallStats:
        entry = self._entry(name)
        key = -(entry.recall.notes + 1)
        entry.notes[key] = doc.passage
        self._index(entry, key, doc)
        entry.recall = replace(entry.recall, notes=entry.recall.notes + 1)
        return entry.recall

    def _index(self, entry: _Entry, key: int, doc: IndexedDoc) -> None:
        for term, tf in doc.terms:
            entry.postings.setdefault(term, []).append((key, tf, doc.length))
        entry.recall = replace(
            entry.recall, docs=entry.recall.docs + 1, length=entry.recall.length + doc.length
        )

    async def recall_postings(
        self, name: str, terms: Sequence[str], choose: ChooseTerms | None = None
    ) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
        return _postings(self._entry(name), terms, choose)

    async def recall_passages(self, name: str, keys: Sequence[int]) -> dict[int, Passage]:
        return _passages(self._entry(name), keys)

    async def recall_search(
        self, name: str, terms: Sequence[str], choose: ChooseTerms, pick: PickPassages[Picked]
    ) -> RecallSearch[Picked]:
        entry = self._entry(name)
        stats, df, postings = _postings(entry, terms, choose)
        picked, keys = pick(stats, df, postings)
        return RecallSearch(stats, df, postings, picked, _passages(entry, keys))

    async def save_vectors(self, name: str, vectors: dict[int, bytes]) -> None:
        self._entry(name).vectors.update(vectors)

    async def load_vectors(self, name: str) -> dict[int, bytes]:
        return dict(self._entry(name).vectors)

    async def save_landmark(self, name: str, landmark: Landmark) -> None:
        self._entry(name).landmarks[landmark.index] = landmark

    async def delete_landmark(self, name: str, index: int) -> bool:
        return self._entry(name).landmarks.pop(index, None) is not None

    async def save_tier(self, name: str, summary: TierSummary) -> bool:
        entry = self._entry(name)
        if not should_replace(entry.tiers.get(summary.key), summary):
            return False
        entry.tiers[summary.key] = summary
        return True

    async def load_tiers(self, name: str) -> tuple[TierSummary, ...]:
        entry = self._sessions.get(name)
        if entry is None:
            return ()
        return tuple(entry.tiers[key] for key in sorted(entry.tiers))

    async def load_landmarks(self, name: str) -> tuple[Landmark, ...]:
        entry = self._sessions.get(name)
        if entry is None:
            return ()
        return tuple(entry.landmarks[i] for i in sorted(entry.landmarks))

    async def open(self) -> None:
        return None  # nothing to make

    async def aclose(self) -> None:
        return None


def _postings(
    entry: _Entry, terms: Sequence[str], choose: ChooseTerms | None
) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
    df = {t: len(entry.postings[t]) for t in terms if t in entry.postings}
    read = choose(list(df), lambda t: df.get(t, 0), entry.recall) if choose else list(df)
    return entry.recall, df, {t: list(entry.postings[t]) for t in read if t in entry.postings}


def _passages(entry: _Entry, keys: Sequence[int]) -> dict[int, Passage]:
    out: dict[int, Passage] = {}
    for key in keys:
        if key < 0:
            if key in entry.notes:
                out[key] = entry.notes[key]
        elif key < len(entry.turns):
            turn = entry.turns[key]
            out[key] = Passage("turn", key, turn.at, turn.speaker, turn.text, turn.role)
    return out
