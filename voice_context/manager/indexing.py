"""The background indexing of the sessions served here: their turns and notes into the
store's recall index, batch by batch (and their vectors, with an embedder)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread

from voice_context.core.recalled import IndexedDoc, RecallStats
from voice_context.core.session import Session, TurnHeld
from voice_context.core.turns import Note, Turn
from voice_context.logs import get_logger
from voice_context.manager.live import Live, RecallState
from voice_context.manager.registry import Background, Served
from voice_context.recall.index import Vectors, indexed, note_passage, turn_passage
from voice_context.recall.stored import HeldTurns
from voice_context.store.base import Store

if TYPE_CHECKING:  # (numpy loads only with an embedder)
    from voice_context.recall.embedding import Embedder

log = get_logger("voice_context")

EMBED_BATCH = 256
"""At most this many docs embedded by one model call in the background."""
INDEX_BATCH = 256
"""At most this many turns indexed by one store write in the background."""
HELD_TURNS = 32
"""A session's newest turns are held here, searched from memory, until this many wait: then
they are written to the store's index in one write. A turn's fifteen-odd words each land on
their own page of the index (its postings are kept by word), so turn by turn every word costs
a page write; a batch's words share the pages. On SQLite, the bytes a turn's index writes cost
fall to a tenth in a 600-turn session, to a fifth in a 3,000-turn one, and their CPU to a
quarter (``scripts/bench --index-writes``; ``docs/benchmarks.md``). What is held costs a search
about 13 microseconds, and a session about 2 KB a turn held. A restart, or a move to
another process, loses none of it: the catch-up indexes every stored turn the store's index
lacks (and holds them, when they are fewer than a batch)."""
INDEX_WAIT = 2.0
"""The longest a search waits for the background indexing (seconds) before it searches the
index as it stands."""


class Indexing:
    """Keeps each session's recall index up with its turns and notes, in the background;
    a failure is logged and tried again with the next append, never the session's."""

    def __init__(
        self, store: Store, embedder: Embedder | None, background: Background, served: Served
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.background = background
        self.served = served
        # the turns held by sessions let go, written one session at a time: a burst's thousand
        # sessions closing at once would otherwise queue a thousand index writes, in one group
        # commit, ahead of the live sessions' turns
        self._released = anyio.CapacityLimiter(1)

    async def restored(self, name: str) -> RecallState:
        """Where a stored session's recall index stands (and its vectors, with an embedder)."""
        store = self.store
        stats, _, _ = await store.recall_postings(name, ())
        recall = RecallState(held=HeldTurns(stats.turns), noted=stats.notes)
        if self.embedder is not None:
            import numpy as np

            stored = await store.load_vectors(name)
            rows = {key: np.frombuffer(raw, dtype=np.float32) for key, raw in stored.items()}
            recall.vectors = Vectors(rows)
            keys = [*range(stats.turns), *range(-1, -stats.notes - 1, -1)]
            recall.unembedded = [key for key in keys if key not in recall.vectors]
        return recall

    def fresh(self) -> RecallState:
        """The recall state of a session created here."""
        return RecallState(vectors=Vectors() if self.embedder is not None else None)

    def lag(self, live: Live) -> int:
        """How many of the session's turns and notes recall does not find yet (or, with an
        embedder, have no vector yet): neither in the store's index nor held here."""
        recall = live.recall
        waiting = live.session.total_turns - recall.searchable + len(recall.notes)
        return waiting + (len(recall.unembedded) if self.embedder is not None else 0)

    async def caught_up(self, live: Live) -> None:
        """Wait (at most ``INDEX_WAIT``) for the background indexing to find every turn stored
        and every note seen: a search made then finds what the session holds, however far
        behind the indexing was when it was asked for. A turn appended here is held at once;
        a session opened here after its turns were appended elsewhere (a restart, another
        replica), and a burst of appends, wait for their turns to be read and indexed."""
        recall = live.recall
        if not (recall.running and self.lag(live)):
            return  # (most contexts) no cancel scope to open
        with anyio.move_on_after(INDEX_WAIT):
            while recall.running and self.lag(live):
                await recall.done.wait()

    async def held(self, live: Live, session: Session, held: TurnHeld) -> None:
        """A turn just stored and held by the session: held for search, and indexed."""
        self.hold(live, held.index, session.turn(held.index))
        self.maybe_index(live)

    def hold(self, live: Live, index: int, turn: Turn) -> None:
        """The turn just stored at ``index``: held for search when recall finds every turn
        before it (else the background indexing, behind, takes the turns in order)."""
        recall = live.recall
        if recall.searchable != index:
            return
        recall.held.add(indexed(turn_passage(index, turn)))
        if self.embedder is not None:
            recall.unembedded.append(index)

    def release(self, live: Live) -> None:
        """The session is no longer served here: write what it held to the store's index, in
        the background (a failure leaves it to the catch-up of the next process to open it)."""
        recall = live.recall
        if recall.held and self.background.started:
            start, docs = recall.indexed, tuple(recall.held.docs)
            recall.held = HeldTurns(recall.indexed)
            self.background.spawn(self._write_released, live.session.name, start, docs)

    @staticmethod
    def drop_held(live: Live) -> None:
        """Forget what the session holds for its index, unwritten (it is being deleted)."""
        live.recall.held = HeldTurns(live.recall.indexed)

    async def _write_released(self, name: str, start: int, docs: tuple[IndexedDoc, ...]) -> None:
        try:
            async with self._released:
                await self.store.index_turns(name, start, docs)
        except Exception:  # recall is best effort: the turns are safe in the store
            log.warning("voice_context_indexing_failed", session=name, exc_info=True)

    @staticmethod
    def note_doc(live: Live, note: Note) -> IndexedDoc | None:
        """The recall doc of the note about to be stored, for the store to index in the note's
        own write, when no note waits for the index before it (``None`` else: the background
        indexing takes the notes in the order they came)."""
        return None if live.recall.notes else indexed(note_passage(note))

    def stored_with_note(self, live: Live, note: Note, stats: RecallStats | None) -> None:
        """The note is stored; ``stats``: the index after the store indexed it in the same
        write, ``None`` when it did not (then it waits for the background indexing)."""
        recall = live.recall
        if stats is None:
            recall.notes.append(note)
            return
        recall.noted = stats.notes
        if self.embedder is not None:
            recall.unembedded.append(-stats.notes)

    def maybe_index(self, live: Live) -> None:
        """Index what waits for it (turns, notes; their vectors), in the background."""
        recall = live.recall
        pending = (
            recall.notes
            or recall.searchable < live.session.total_turns
            or len(recall.held) >= HELD_TURNS
            or (recall.unembedded and self.embedder)
        )
        if recall.running or not pending or not self.background.started:
            return
        recall.running = True
        if recall.done.is_set():
            recall.done = anyio.Event()
        self.background.spawn(self._index, live)

    async def _index(self, live: Live) -> None:
        """Write what waits to the store's recall index, batch by batch, until nothing does.
        A failure is logged and retried with the next append; it never breaks the session."""
        recall = live.recall
        try:
            while self.served.serves(live) and not self.background.closing:
                if recall.notes:
                    await self._index_note(live)
                elif recall.searchable < live.session.total_turns:
                    if not await self._index_turns(live):
                        break  # the store would not take them: try again with the next append
                elif len(recall.held) >= HELD_TURNS:
                    if not await self._write_held(live):
                        break
                elif recall.unembedded and self.embedder is not None:
                    await self._embed(live)
                else:
                    break
        except Exception:  # recall is best effort: the turns are safe in the store
            log.warning("voice_context_indexing_failed", session=live.session.name, exc_info=True)
        finally:
            recall.running = False
            recall.done.set()

    async def _index_note(self, live: Live) -> None:
        recall = live.recall
        note = recall.notes[0]
        stats = await self.store.index_note(live.session.name, indexed(note_passage(note)))
        recall.notes.pop(0)
        recall.noted = stats.notes
        if self.embedder is not None:
            recall.unembedded.append(-stats.notes)

    async def _index_turns(self, live: Live) -> bool:
        """One batch of the turns neither indexed nor held, from the first of them (what is
        held is written with it); whether the store took them."""
        recall, session, store = live.recall, live.session, self.store
        start = recall.indexed
        stop = min(session.total_turns, recall.searchable + INDEX_BATCH)
        docs = list(recall.held.docs)
        if start + len(docs) >= session.cursor:
            first = session.total_turns - len(session.verbatim_turns)
            turns = list(session.verbatim_turns[start + len(docs) - first : stop - first])
        else:
            turns = await store.read_turns(session.name, start + len(docs), stop)
        if not turns:
            return False  # the store lacks turns the session counts: try again with the next append
        docs.extend(indexed(turn_passage(start + k, t)) for k, t in enumerate(turns, start=len(docs)))
        if len(docs) < HELD_TURNS:  # (a session opened after a restart: the turns it had held)
            searchable = recall.searchable
            recall.held = HeldTurns(start, docs)
            self._embed_later(recall, searchable)
            return True
        return await self._write(live, start, docs)

    async def _write_held(self, live: Live) -> bool:
        """The turns held here into the store's index, in one write; whether the store took them."""
        return await self._write(live, live.recall.indexed, list(live.recall.held.docs))

    async def _write(self, live: Live, start: int, docs: list[IndexedDoc]) -> bool:
        """The docs of turns ``start, start+1, ...`` into the store's index; whether it took them."""
        recall = live.recall
        searchable = recall.searchable
        stats = await self.store.index_turns(live.session.name, start, docs)
        if stats.turns == start and docs:
            return False
        if stats.turns < recall.indexed:  # the store's index lost turns: index them again
            recall.held = HeldTurns(stats.turns)
            return True
        # turns held meanwhile stay held; those the write (or another replica's) took are dropped
        if stats.turns > recall.indexed:
            recall.held = recall.held.after(stats.turns)
        self._embed_later(recall, searchable)
        return True

    def _embed_later(self, recall: RecallState, searchable: int) -> None:
        """The turns recall finds from ``searchable`` on wait for their vectors (with an embedder)."""
        if self.embedder is not None and recall.searchable > searchable:
            kept = recall.vectors or Vectors()  # (a restarted process read those kept in the store)
            recall.unembedded.extend(k for k in range(searchable, recall.searchable) if k not in kept)

    async def _embed(self, live: Live) -> None:
        """One batch of vectors: the model run in a worker thread, the vectors kept in the store."""
        import numpy as np

        recall, store, embedder = live.recall, self.store, self.embedder
        assert embedder is not None
        keys = recall.unembedded[:EMBED_BATCH]
        passages = await store.recall_passages(live.session.name, keys)
        todo = [key for key in keys if key in passages]
        texts = [f"{passages[k].speaker}: {passages[k].text}" for k in todo]
        vectors: Any = await anyio.to_thread.run_sync(embedder.embed, texts) if texts else []
        rows = {key: np.asarray(v, dtype=np.float32) for key, v in zip(todo, vectors, strict=True)}
        await store.save_vectors(live.session.name, {k: v.tobytes() for k, v in rows.items()})
        if recall.vectors is None:
            recall.vectors = Vectors()
        recall.vectors.update(rows)
        del recall.unembedded[: len(keys)]
