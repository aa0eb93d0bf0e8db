"""What the cores say to write to the store besides a fold: the note buffers of a note received
(with its recall doc), and a landmark the heuristics found in a turn just stored."""

from __future__ import annotations

from voice_context.core.session import Effect, NotesStored, PersistNotes, Session, StoreLandmark
from voice_context.errors import StoreError
from voice_context.logs import get_logger
from voice_context.manager.indexing import Indexing
from voice_context.manager.live import Live
from voice_context.manager.runtime import Feed
from voice_context.store.base import Store

log = get_logger("voice_context")


class Writes:
    """The performer of ``PersistNotes`` and ``StoreLandmark``."""

    def __init__(self, store: Store, feed: Feed, indexing: Indexing) -> None:
        self.store = store
        self.feed = feed
        self.indexing = indexing

    async def notes(self, live: Live, session: Session, persist: PersistNotes) -> list[Effect]:
        """Write the note buffers (with the note's recall doc, when no note waits for the index
        before it), then tell the session the store holds them; a failure changes nothing (nor
        is the note indexed)."""
        note = persist.note
        assert note is not None, "the session names the note it staged"
        doc = Indexing.note_doc(live, note)
        stats = await self.store.save_notes(session.name, persist.live, persist.pending, doc)
        effects = await self.feed(live, NotesStored(persist.staged), session=session)
        self.indexing.stored_with_note(live, note, stats)
        self.indexing.maybe_index(live)
        return effects

    async def landmark(self, live: Live, session: Session, store: StoreLandmark) -> None:
        """Store a landmark the heuristics found. The turn is stored already: a landmark
        that cannot be stored is logged; it stays pinned here, and a session restored
        elsewhere does without it (an unpin must last, so restored turns are not read again)."""
        name, landmark = session.name, store.landmark
        try:
            await self.store.save_landmark(name, landmark)
        except StoreError as exc:
            log.warning(
                "voice_context_landmark_not_stored", session=name, index=landmark.index, error=str(exc)
            )
        else:
            log.info(
                "voice_context_landmark_pinned",
                session=name,
                index=landmark.index,
                kind=landmark.kind,
                source=landmark.source,
            )
