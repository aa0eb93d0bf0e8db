"""The SQLite store's group writer: the turns and notes that arrive while a write is in flight
are written together in the next transaction and fsync, and the recall index's writes in groups
of their own, without one (see :mod:`voice_context.store.group` and
:mod:`voice_context.store.sqlite`)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from voice_context.core.recalled import IndexedDoc, RecallStats
from voice_context.errors import SessionNotStored, TurnConflict
from voice_context.store.group import GroupCommit, Pending
from voice_context.store.sqlite_db import CLOSE_TIMEOUT, Connections
from voice_context.store.sqlite_rows import add_postings, derived, recall_state, total_turns, writing

#: Seconds at most a recall index write waits for the turns' writes queued or in flight.
DERIVED_YIELD = 0.2

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
        self.derived: GroupCommit[Index] = GroupCommit(self._write_derived, deadline=deadline)

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
        A write for a session the store does not hold fails alone."""
        self.db.operations += len(batch) - 1  # ``_call`` counted one
        with derived(conn), writing(conn):
            for item in batch:
                op = item.op
                total = total_turns(conn, op.name)
                if total < 0:
                    item.error = SessionNotStored(op.name)
                elif isinstance(op, IndexTurns):
                    op.stats = index_turns(conn, op, total)
                else:
                    op.stats = index_note(conn, op.name, op.doc)

    def _commit_group(self, conn: sqlite3.Connection, batch: list[Pending[Write]]) -> None:
        """Runs in the worker thread: one transaction, one fsync, for the whole group.

        The sessions' turn counts are read once; each write is checked against them
        in order (a turn at the wrong index, or for a session deleted meanwhile,
        gets its own error and writes nothing), then the turns that pass are
        inserted and the counts and notes updated, a statement each for the whole
        group, and the recall docs of notes given with them indexed. An error of SQLite's
        own fails the group (the caller gives every write of it that error).
        """
        self.db.operations += len(batch) - 1  # ``_call`` counted one
        now = self.clock()
        with writing(conn):
            totals = turn_counts(conn, {item.op.name for item in batch})
            inserts: list[tuple[object, ...]] = []
            written: dict[tuple[str, int], tuple[str, str, str, float, str | None, str | None]] = {}
            notes: list[tuple[str, str, float, str]] = []
            noted: list[SaveNotes] = []
            for item in batch:
                op = item.op
                total = totals.get(op.name)
                if total is None:
                    item.error = SessionNotStored(op.name)
                elif isinstance(op, SaveNotes):
                    notes.append((op.live, op.pending, now, op.name))
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
                conn.executemany(
                    "INSERT INTO turns (session, idx, speaker, role, text, at, id, tool)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    inserts,
                )
                moved = {name for name, _ in written}
                conn.executemany(
                    "UPDATE sessions SET total_turns = ?, updated_at = ? WHERE name = ?",
                    [(totals[name], now, name) for name in moved],
                )
            if notes:
                conn.executemany(
                    "UPDATE sessions SET live_notes = ?, pending_notes = ?, updated_at = ? WHERE name = ?",
                    notes,
                )
                for saved in noted:  # in order: the notes of one session take their keys in turn
                    assert saved.doc is not None
                    saved.stats = index_note(conn, saved.name, saved.doc)
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


def index_turns(conn: sqlite3.Connection, op: IndexTurns, total: int) -> RecallStats:
    """Index the turns of ``op`` that follow the last one indexed and are stored (in a write)."""
    sid, stats = recall_state(conn, op.name)
    turns, added, length = stats.turns, 0, 0
    rows: list[tuple[str, int, int, int]] = []
    for offset, doc in enumerate(op.docs):
        key = op.start + offset
        if key < turns:
            continue
        if key > turns + added or key >= total:
            break
        rows.extend((term, key, tf, doc.length) for term, tf in doc.terms)
        added += 1
        length += doc.length
    if not added:
        return stats
    add_postings(conn, sid, rows)
    conn.execute(
        "UPDATE recall_state SET docs = docs + ?, length = length + ?, turns = turns + ? WHERE sid = ?",
        (added, length, added, sid),
    )
    return RecallStats(stats.docs + added, stats.length + length, turns + added, stats.notes)


def index_note(conn: sqlite3.Connection, name: str, doc: IndexedDoc) -> RecallStats:
    """Index a screen note under the next note key (in a write)."""
    sid, stats = recall_state(conn, name)
    key = -(stats.notes + 1)
    p = doc.passage
    conn.execute(
        "INSERT INTO recall_notes (sid, key, at, speaker, text) VALUES (?, ?, ?, ?, ?)",
        (sid, key, p.at, p.speaker, p.text),
    )
    add_postings(conn, sid, [(term, key, tf, doc.length) for term, tf in doc.terms])
    conn.execute(
        "UPDATE recall_state SET docs = docs + 1, length = length + ?, notes = notes + 1 WHERE sid = ?",
        (doc.length, sid),
    )
    return RecallStats(stats.docs + 1, stats.length + doc.length, stats.turns, stats.notes + 1)


def turn_counts(conn: sqlite3.Connection, names: set[str]) -> dict[str, int]:
    """The turn count of each of these sessions the store holds."""
    out: dict[str, int] = {}
    ordered = list(names)
    for start in range(0, len(ordered), 500):  # SQLite limits the parameters of one statement
        chunk = ordered[start : start + 500]
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(f"SELECT name, total_turns FROM sessions WHERE name IN ({marks})", chunk)
        out.update((name, int(total)) for name, total in rows)
    return out


def stored_turn(
    conn: sqlite3.Connection, name: str, index: int
) -> tuple[str, str, str, float, str | None, str | None] | None:
    row = conn.execute(
        "SELECT speaker, role, text, at, id, tool FROM turns WHERE session = ? AND idx = ?", (name, index)
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3], row[4], row[5])
