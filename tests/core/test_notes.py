"""A session's screen-note buffers on their own: literal times, no event loop."""

from __future__ import annotations

import pytest
from helpers import notes

from voice_context.core.config import SessionConfig
from voice_context.core.events import NotesChanged
from voice_context.core.notes import SEEN_NOTES, NoteBuffers
from voice_context.core.turns import Note

TWO_LIVE = SessionConfig(live_note_entries=2, max_pending_notes=3)


def test_a_staged_note_changes_nothing_until_it_is_taken() -> None:
    buffers = NoteBuffers(TWO_LIVE, live=notes(2))
    staged = buffers.stage(Note("third", 2.0), TWO_LIVE)
    assert staged.changed == NotesChanged(live=2, pending=1, evicted=1, dropped=0)
    assert (buffers.live, buffers.pending) == (tuple(notes(2)), ())

    buffers.take(staged)
    assert buffers.live == (Note("note 1", 1.0), Note("third", 2.0))
    assert buffers.pending == (Note("note 0", 0.0),)
    with pytest.raises(ValueError, match="changed since"):
        buffers.take(staged)  # the buffers it was staged on are gone


def test_a_fold_takes_the_oldest_pending_notes_and_leaves_those_evicted_while_it_ran() -> None:
    buffers = NoteBuffers(TWO_LIVE, live=notes(2, start_at=2), pending=notes(2))
    taken, through = buffers.for_fold(budget=1_000)
    assert taken == tuple(notes(2))

    buffers.take(buffers.stage(Note("during", 4.0), TWO_LIVE))  # evicts note 2 into pending
    assert buffers.pending_after(through) == (Note("note 2", 2.0),)
    buffers.folded(through)
    assert buffers.pending == (Note("note 2", 2.0),)
    assert buffers.seen == (*notes(4), Note("during", 4.0)), "a folded note was still seen"


def test_restored_buffers_over_lowered_limits_overflow_as_a_new_note_would() -> None:
    buffers = NoteBuffers(TWO_LIVE, live=notes(3, start_at=4), pending=notes(4))
    assert buffers.live == tuple(notes(2, start_at=5))
    assert buffers.pending == tuple(notes(3, start_at=2))  # notes 0 and 1 dropped, 4 evicted
    assert repr(buffers) == "<NoteBuffers live=2 pending=3 dropped=2>"
    assert buffers.seen == tuple(notes(6, start_at=1)), "all but the one dropped before they were seen"
    assert len(NoteBuffers(TWO_LIVE, live=notes(SEEN_NOTES + 5)).seen) == SEEN_NOTES
