"""The SQLite store's group writer: the turns and notes that arrive while a write is in flight
are written together in the next transaction and fsync, and the recall index's writes in groups
of their own, without one (see :mod:`voice_context.store.group` and
:mod:`voice_context.store.sqlite`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio
import orjson

from voice_context.core.recalled import IndexedDoc, RecallStats
from voice_context.errors import SessionNotStored, TurnConflict
from voice_context.store.group import GroupCommit, Pending
from voice_context.store.sqlite_db import CLOSE_TIMEOUT, Connections
from voice_context.store.sqlite_rows import (
    RecallWrites,
    derived,
    insert_values,
    recall_states,
    turn_counts,
    writing,
)

#: Seconds at most a recall index write waits for the turns' writes queued or in flight.
DERIVED_YIELD = 0.2
INDEX_POSTINGS = 4096
"""The most postings one recall index transaction writes (beyond its first write's own): some
15 ms of SQLite's work on a small machine, about 3.3 us a posting. The file's write lock is
held about that long at most, while the other process's turns (``--workers 2``) wait on it; a
transaction of a whole burst's or opening's index held it for up to 0.86 s."""

CommitHook = Callable[[Sequence[Sequence[object]]], None]
"""Called in the writer's thread with the writes of a group (each ``[session, index]`` or
``[session, "notes"]``) between the group's last statement and its ``COMMIT``: a test's seam,
to hold a group there (or to kill the process there)."""


class GroupWriter:
    """Writes the turns and notes of many sessions in groups (:attr:`group`), and the recall
    index's writes in groups of their own (:attr:`derived`) that give way to the turns'."""

    def __init__(
        self, db: Connections, clock: Callable[[], float], before_commit: CommitHook | None = None
    ) -> None:
        self.db = db
        self.clock = clock
        self.before_commit = before_commit
        deadline = write_deadline(db.busy_timeout)
        self.group: GroupCommit[Write] = GroupCommit(self._write_group, deadline=deadline)
        #: the recall index's writes, grouped the same way across sessions (without an fsync)
        self.derived: GroupCommit[Index] = GroupCommit(
            self._write_derived, deadline=deadline, weight=postings, max_weight=INDEX_POSTINGS
        )

    async def _write_group(self, batch: list[Pending[Write]]) -> None:
        await self.db.run("append", lambda conn: self._commit_group(conn, batch))

    async def _write_derived(self, batch: list[Pending[Index]]) -> None:
        self.db.check_open()
        # the turns' own writes go first: during a burst of appends the index waits (and
        # its next group grows), at most DERIVED_YIELD, so acknowledgements keep their pace
        with anyio.move_on_after(DERIVED_YIELD):
            await self.group.idle()
        await self.db.run("index", lambda conn: self._commit_derived(conn, batch))

    def _commit_derived(self, conn: sqlite3.Connection, batch: list[Pending[Index]]) -> None:
        """Runs in the worker thread: the recall index writes of many sessions in one
        transaction, without an fsync of its own (see :func:`~voice_context.store.sqlite_rows.derived`).
        A write for a session the store does not hold fails alone. A handful of statements
        for the whole group (see :class:`~voice_context.store.sqlite_rows.RecallWrites`)."""
        self.db.operations += len(batch) - 1  # ``_call`` counted one
        with derived(conn), writing(conn):
            totals = turn_counts(conn, {item.op.name for item in batch})
            index = RecallWrites(recall_states(conn, list(totals)))
            for item in batch:
                op = item.op
                total = totals.get(op.name)
                if total is None:
                    item.error = SessionNotStored(op.name)
                elif isinstance(op, IndexTurns):
                    op.stats = index.turns(op.name, op.start, op.docs, total)
                else:
                    op.stats = index.note(op.name, op.doc)
            index.write(conn)

    def _commit_group(self, conn: sqlite3.Connection, batch: list[Pending[Write]]) -> None:
        """Runs in the worker thread: one transaction, one fsync, for the whole group.

        The sessions' turn counts are read once; each write is checked against them
        in order (a turn at the wrong index, or for a session deleted meanwhile,
        gets its own error and writes nothing), then the turns that pass are
        inserted and the counts and notes updated, a few statements for the whole group
        whatever its size (a statement run once a row waits for the interpreter's lock
        after every row, holding the file's write lock meanwhile: see
        :mod:`~voice_context.store.sqlite_rows`), and the recall docs of notes given with
        them indexed. An error of SQLite's own fails the group (the caller gives every write
        of it that error).
        """
        self.db.operations += len(batch) - 1  # ``_call`` counted one
        now = self.clock()
        with writing(conn):
            totals = turn_counts(conn, {item.op.name for item in batch})
            inserts: list[tuple[object, ...]] = []
            written: dict[tuple[str, int], tuple[str, str, str, float, str | None, str | None]] = {}
            notes: list[tuple[str, str, str]] = []
            noted: list[SaveNotes] = []
            for item in batch:
                op = item.op
                total = totals.get(op.name)
                if total is None:
                    item.error = SessionNotStored(op.name)
                elif isinstance(op, SaveNotes):
                    notes.append((op.live, op.pending, op.name))
                    if op.doc is not None:
                        noted.append(op)
                elif op.index == total:
                    inserts.append((op.name, op.index, *op.fields))
                    written[(op.name, op.index)] = op.fields
                    totals[op.name] = total + 1
                elif 0 <= op.index < total:
                    stored = written.get((op.name, op.index)) or stored_turn(conn, op.name, op.index)
                    if stored != op.fields:
                        item.error = TurnConflict(op.name, op.index, total, differs=True)
                    # else: a retry of a write that landed, nothing to do
                else:
                    item.error = TurnConflict(op.name, op.index, total)
            if inserts:
                head = "INSERT INTO turns (session, idx, speaker, role, text, at, id, tool)"
                insert_values(conn, head, 8, inserts)
                moved = {name for name, _ in written}
                conn.execute(
                    "UPDATE sessions SET total_turns = json_extract(j.value, '$[1]'), updated_at = ?1"
                    " FROM json_each(?2) AS j WHERE sessions.name = json_extract(j.value, '$[0]')",
                    (now, orjson.dumps([(name, totals[name]) for name in moved]).decode()),
                )
            if notes:
                last = {name: (live, pending) for live, pending, name in notes}  # in order: the last wins
                conn.execute(
                    "UPDATE sessions SET live_notes = json_extract(j.value, '$[1]'),"
                    " pending_notes = json_extract(j.value, '$[2]'), updated_at = ?1"
                    " FROM json_each(?2) AS j WHERE sessions.name = json_extract(j.value, '$[0]')",
                    (now, orjson.dumps([(name, *kept) for name, kept in last.items()]).decode()),
                )
            if noted:
                index = RecallWrites(recall_states(conn, {saved.name for saved in noted}))
                for saved in noted:  # in order: the notes of one session take their keys in turn
                    assert saved.doc is not None
                    saved.stats = index.note(saved.name, saved.doc)
                index.write(conn)
            if self.before_commit is not None:
                self.before_commit([item.op.where for item in batch if item.error is None])


def write_deadline(busy_timeout: float) -> float:
    """The longest (seconds) a group's shielded write may take: as long as closing the store
    waits for the writer to be free (``CLOSE_TIMEOUT``), then the group's own wait for the
    file's lock (``busy_timeout``). It can never cut a write SQLite would still complete: a
    write in the writer's thread runs to its end whatever the deadline (anyio never abandons
    a worker thread that was not told it may), so only a group still waiting for the writer
    is given up, with nothing of it written."""
    return CLOSE_TIMEOUT + busy_timeout


@dataclass(slots=True)
class AppendTurn:
    name: str
    index: int
    fields: tuple[str, str, str, float, str | None, str | None]

    @property
    def where(self) -> list[object]:
        return [self.name, self.index]


@dataclass(slots=True)
class SaveNotes:
    name: str
    live: str
    pending: str
    doc: IndexedDoc | None = None
    """The new note's recall doc, indexed in the notes' own transaction."""
    stats: RecallStats | None = None
    """The session's index once the note is in it (set by the group that wrote both)."""

    @property
    def where(self) -> list[object]:
        return [self.name, "notes"]


Write = AppendTurn | SaveNotes


@dataclass(slots=True)
class IndexTurns:
    name: str
    start: int
    docs: tuple[IndexedDoc, ...]
    stats: RecallStats | None = None
    """The session's index once this write is in (set by the group that writes it)."""


@dataclass(slots=True)
class IndexNote:
    name: str
    doc: IndexedDoc
    stats: RecallStats | None = None


Index = IndexTurns | IndexNote


def postings(op: Index) -> int:
    """The postings an index write adds (at most: a turn indexed already adds none)."""
    if isinstance(op, IndexTurns):
        return sum(len(doc.terms) for doc in op.docs)
    return len(op.doc.terms)


def stored_turn(
    conn: sqlite3.Connection, name: str, index: int
) -> tuple[str, str, str, float, str | None, str | None] | None:
    row = conn.execute(
        "SELECT speaker, role, text, at, id, tool FROM turns WHERE session = ? AND idx = ?", (name, index)
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3], row[4], row[5])
