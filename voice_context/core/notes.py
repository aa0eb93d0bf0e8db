"""A session's screen-note buffers: which notes are live, which wait to be folded, which were seen.

The live buffer holds the newest notes, each clipped to ``live_note_chars``, and a context shows
them whole. A note pushed out of it (past ``live_note_entries``) waits, numbered, among the
pending notes until a fold takes it into the summary; past ``max_pending_notes`` the oldest
pending note is dropped, and counted. The newest notes seen, live, pending or folded, are kept
too (:data:`SEEN_NOTES`): what a plain tail of the transcript shows among its turns.

A note is staged on copies first (:meth:`NoteBuffers.stage`: nothing changes), and the staged
buffers are taken once the store holds them (:meth:`NoteBuffers.take`). Every change of the
buffers moves their version, so that a staging another change overtook is refused rather than
taken over it. Pure and synchronous like the rest of the core: the limits come from the
session's config at each call, and :class:`~voice_context.core.session.Session` holds one of
these and delegates to it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from operator import attrgetter

from voice_context.core.config import SessionConfig
from voice_context.core.events import NotesChanged, StagedNotes
from voice_context.core.text import clip
from voice_context.core.turns import Note

#: The newest notes kept for the recency floor's plain tail of the transcript, whether still
#: live, pending or folded (a tail that reaches past them counts fewer notes: more turns).
SEEN_NOTES = 64


class NoteBuffers:
    """The live, pending and seen screen notes of one session. See the module docstring."""

    def __init__(
        self, config: SessionConfig, live: Iterable[Note] = (), pending: Iterable[Note] = ()
    ) -> None:
        """Restore the buffers. Restored buffers may be over limits lowered since they were
        stored: the overflow goes as a note appended now would (the oldest live notes to
        pending, the oldest pending notes dropped)."""
        self._live: deque[Note] = deque(live)
        self._pending: deque[tuple[int, Note]] = deque()
        self._seen: deque[Note] = deque(maxlen=SEEN_NOTES)
        self._seq = 0  # the number of the newest pending note
        self._dropped = 0
        self._version = 0  # moves with every change of the buffers
        for note in pending:
            self._queue_pending(note, config)
        self._seen.extend(sorted((*self.pending, *self._live), key=attrgetter("at")))
        self._evict(config)

    @property
    def live(self) -> tuple[Note, ...]:
        return tuple(self._live)

    @property
    def pending(self) -> tuple[Note, ...]:
        return tuple(note for _, note in self._pending)

    @property
    def seen(self) -> tuple[Note, ...]:
        """The newest notes seen (:data:`SEEN_NOTES`), live, pending or folded, in the order they came."""
        return tuple(self._seen)

    @property
    def live_count(self) -> int:
        return len(self._live)

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def dropped(self) -> int:
        """How many pending notes were dropped, the oldest first, to keep ``max_pending_notes``."""
        return self._dropped

    def __repr__(self) -> str:
        return f"<NoteBuffers live={len(self._live)} pending={len(self._pending)} dropped={self._dropped}>"

    def stage(self, note: Note, config: SessionConfig) -> StagedNotes:
        """The buffers with ``note`` added, computed on copies: nothing changes yet."""
        limit = config.live_note_chars
        if len(note.text) > limit:
            note = Note(clip(note.text, limit), note.at, note.speaker, note.source)
        live, pending = deque(self._live), deque(self._pending)
        seq, dropped, evicted = self._seq, self._dropped, 0
        live.append(note)
        while len(live) > config.live_note_entries:
            seq += 1
            pending.append((seq, live.popleft()))
            evicted += 1
            while len(pending) > config.max_pending_notes:
                pending.popleft()
                dropped += 1
        changed = NotesChanged(len(live), len(pending), evicted, dropped - self._dropped)
        return StagedNotes(tuple(live), tuple(pending), seq, dropped, changed, self._version)

    def take(self, staged: StagedNotes) -> None:
        """Become the ``staged`` buffers, which the store holds now. Raises ``ValueError`` when
        the buffers changed since they were staged."""
        if staged.version != self._version:
            raise ValueError("the note buffers changed since these notes were staged: stage them again")
        self._live = deque(staged.live)
        self._pending = deque(staged.numbered)
        if staged.live:  # a staging adds one note, the newest live one
            self._seen.append(staged.live[-1])
        self._seq = staged.note_seq
        self._dropped = staged.notes_dropped
        self._version += 1

    def reconfigure(self, config: SessionConfig) -> None:
        """Hold to ``config``'s limits: the oldest live notes past ``live_note_entries`` go to
        pending (the oldest pending notes past ``max_pending_notes`` are dropped)."""
        self._version += 1
        self._evict(config)

    def for_fold(self, budget: int) -> tuple[tuple[Note, ...], int]:
        """The oldest pending notes that fit ``budget`` chars (at least one, if any), and the
        number of the last of them (0: none): what a fold starting now takes."""
        taken: list[Note] = []
        last_seq = 0
        used = 0
        for seq, note in self._pending:
            size = len(note.render()) + 1
            if taken and used + size > budget:
                break
            taken.append(note)
            used += size
            last_seq = seq
        return tuple(taken), last_seq

    def pending_after(self, last_seq: int) -> tuple[Note, ...]:
        """The pending notes that remain once a fold that took them through ``last_seq`` lands."""
        return tuple(note for seq, note in self._pending if seq > last_seq)

    def folded(self, last_seq: int) -> None:
        """A fold that took the pending notes through ``last_seq`` landed: they go (those
        evicted while it ran stay pending, for the next fold)."""
        while self._pending and self._pending[0][0] <= last_seq:
            self._pending.popleft()
        self._version += 1

    def _evict(self, config: SessionConfig) -> None:
        while len(self._live) > config.live_note_entries:
            self._queue_pending(self._live.popleft(), config)

    def _queue_pending(self, note: Note, config: SessionConfig) -> None:
        self._version += 1
        self._seq += 1
        self._pending.append((self._seq, note))
        while len(self._pending) > config.max_pending_notes:
            self._pending.popleft()
            self._dropped += 1


__all__ = ["SEEN_NOTES", "NoteBuffers"]
