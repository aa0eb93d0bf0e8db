"""The embedded store: one SQLite file in WAL mode, the default.

Access model: one ``sqlite3`` connection per store for everything that
writes, used by one operation at a time in a thread of its own that takes the
next operation as soon as the last returns (see :mod:`voice_context.worker`).
The reads on a reply's path (a recall search, the turns before the cursor)
have read-only connections of their own, run on the event loop's thread by default
(``reads="loop"``; see :mod:`~voice_context.store.sqlite_db` for why) or in a thread of
their own: in WAL mode a reader sees the last commit without waiting for the writer, so a
context is never queued behind a group's fsync. Each store method is a single function that
runs a whole transaction, from ``BEGIN`` to ``COMMIT``; no transaction ever spans an
``await``. A cancelled caller therefore never leaves a transaction open: the thread finishes
(or rolls back) before the cancellation is delivered, and a read on the loop's thread runs
to its end before anything else does. Nothing beyond the standard library and orjson (a
statement's rows as one JSON array) is needed.

Durability: ``journal_mode=WAL`` with ``synchronous=FULL``. In WAL mode a
commit appends to the write-ahead log; with ``FULL`` every commit also
``fsync``\\s the log before returning, so a turn is on disk before the bot is
told ``turn.appended``. (``NORMAL`` would survive ``kill -9`` of the server,
since the OS keeps what was written, but could lose the last commits on a
power cut or a kernel crash.)

Group commit: turns and notes (``append_turn``, ``save_notes``) that arrive
while a write is in flight, from any session and any connection, are written
together by the next worker call, in one transaction and one fsync (see
:mod:`voice_context.store.group`); each is acknowledged only once that
transaction has committed. Each write is checked on its own first, so a turn
at the wrong index fails alone, not its group. A note given with its recall doc is
indexed in that same transaction (no index write of its own, no indexing lag after
the acknowledgement). The other recall index writes (``index_turns``, a session's
turns a batch at a time, ``index_note``) are grouped the same way, in transactions
of their own that need no fsync (what they hold can be derived again from the
turns), and they give way to the turns': an index group waits while turns are
queued or being written, up to ``DERIVED_YIELD`` (0.2 s), so a burst of
appends is acknowledged at the pace of its own commits and the index catches
up in larger groups (the indexing lag on ``/metrics`` shows it). Either kind of group is a
dozen statements or so whatever its size, never a statement a row: each statement waits for
the interpreter's lock while holding the file's (see :mod:`~voice_context.store.sqlite_rows`).
A ``before_commit``
hook, given to the constructor, is called with each group's writes between its last
statement and its ``COMMIT`` (a seam for tests: to hold a group there, or kill the
process there).

Writes start with ``BEGIN IMMEDIATE``: the file's write lock is taken up
front, so two writers never deadlock on a lock upgrade, and a writer waits up
to ``busy_timeout`` for another one (another process on the same file,
say) before giving up with a retryable ``StoreError`` ("database is locked").
It waits by trying again every millisecond at most (after 0.1, 0.2, 0.4 and 0.8 ms),
not on SQLite's own busy handler, whose sleeps grow to 100 ms: two processes
that both write all the time each hold the lock a few ms at a time, and a
waiter on SQLite's schedule slept past the other's commits again and again
(:func:`~voice_context.store.sqlite_rows.begin_immediate`).
Several processes on one machine may share one file: creating a session (which
reads back its owner), leases and conditional commits are single transactions, so
they are exclusive across processes too.
Two processes opening a new file at once both open it: the one that loses the race to switch
the file to WAL is told "database is locked" at once, without SQLite's busy handler, and tries
again on the same schedule as a write (:func:`~voice_context.store.sqlite_rows.until_free`). A
server opens its file before it listens (:meth:`SQLiteStore.open`).
(Not on a network file system: WAL needs shared memory between the processes.)

Retention: with ``session_ttl``, :meth:`SQLiteStore.expire` deletes the sessions
whose ``updated_at`` (set by every write, and by ``touch``) is older than that, 25
sessions per transaction; the server calls it periodically, never on the
path of a reply.

The store's collaborators: :mod:`~voice_context.store.sqlite_db` (the two connections,
their worker threads, ``sqlite3`` errors translated), :mod:`~voice_context.store.sqlite_groups`
(the group writer), :mod:`~voice_context.store.sqlite_schema` (the schema and its
migrations) and :mod:`~voice_context.store.sqlite_rows` (the transactions and shared statements).

Schema, version 1::

    schema_version(version)
    sessions(name PK, cursor, summary, total_turns, config JSON, owner,
             live_notes JSON, pending_notes JSON, compactions,
             lease_holder, lease_until, fence, created_at, updated_at)
    turns(session, idx, speaker, role, text, at, id, PRIMARY KEY (session, idx))
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from voice_context.core.landmarks import Landmark
from voice_context.core.recalled import IndexedDoc, Passage, Posting, RecallStats
from voice_context.core.tiers import TierSummary
from voice_context.core.turns import Note, Turn
from voice_context.errors import SessionNotStored
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
from voice_context.store.common import (
    decode_config,
    decode_landmark,
    decode_notes,
    decode_tier,
    encode_config,
    encode_landmark,
    encode_notes,
    encode_tier,
    turn_fields,
)
from voice_context.store.sqlite_db import Connections, SQLiteReads, translate
from voice_context.store.sqlite_groups import (
    DERIVED_YIELD,
    AppendTurn,
    CommitHook,
    GroupWriter,
    IndexNote,
    IndexTurns,
    SaveNotes,
)
from voice_context.store.sqlite_rows import (
    derived,
    forget,
    reading,
    recall_states,
    select_passages,
    select_postings,
    select_turns,
    total_turns,
    writing,
)
from voice_context.store.sqlite_schema import SCHEMA_VERSION

__all__ = [
    "BUSY_TIMEOUT",
    "DERIVED_YIELD",
    "EXPIRE_BATCH",
    "SCHEMA_VERSION",
    "CommitHook",
    "SQLiteStore",
    "translate",
]

BUSY_TIMEOUT = 5.0
#: The most turns a read of turns takes on the event loop's thread (with ``reads="loop"``): a
#: context's turns before the cursor are at most ``recall.index.MAX_OLDER_TURNS`` (400, about
#: 1 ms to read; a test keeps this above it); longer runs are read in the reader's thread.
LOOP_READ_TURNS = 512
#: Sessions deleted per transaction by ``expire`` (each with all its turns): 25 sessions of 200
#: turns hold the write lock for about 8 ms (100 held it for 36 ms), so a turn append waits little.
EXPIRE_BATCH = 25


class SQLiteStore:
    """Sessions in one SQLite file. See the module docstring for the guarantees."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = BUSY_TIMEOUT,
        clock: Callable[[], float] = time.time,
        session_ttl: float | None = None,
        before_commit: CommitHook | None = None,
        reads: SQLiteReads = "loop",
    ) -> None:
        if busy_timeout < 0:
            raise ValueError("busy_timeout must be >= 0")
        if session_ttl is not None and session_ttl <= 0:
            raise ValueError("session_ttl must be positive (or None: kept until deleted)")
        self.session_ttl = session_ttl
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._clock = clock
        #: the writer's and the reader's connections (an operation of SQL of one's own: ``db.run``)
        self.db = Connections(self.path, busy_timeout, reads)
        self._writer = GroupWriter(self.db, clock, before_commit)
        self.group = self._writer.group
        #: the recall index's writes, grouped the same way across sessions (without an fsync)
        self.derived = self._writer.derived

    async def open(self) -> None:
        """Open the file now (in WAL mode, the schema made or migrated), rather than at the
        first operation: a server does so before it listens, so that of ``serve --workers N``
        worker 0, started alone first, makes a new file's schema before the others open it.
        Calling it again does nothing."""
        await self.db.run("open", lambda conn: None)

    @property
    def operations(self) -> int:
        return self.db.operations

    @property
    def errors(self) -> int:
        return self.db.errors

    def __repr__(self) -> str:
        state = "closed" if self.db.closed else ("open" if self.db.writer is not None else "not opened")
        return (
            f"<SQLiteStore {str(self.path)!r} {state} operations={self.operations} errors={self.errors} "
            f"groups={self.group.groups}>"
        )

    # -- the Store protocol ----------------------------------------------------

    async def load(self, name: str) -> SessionRecord | None:
        def op(conn: sqlite3.Connection) -> SessionRecord | None:
            with reading(conn):
                row = conn.execute(
                    "SELECT cursor, summary, total_turns, config, owner, live_notes, pending_notes,"
                    " compactions FROM sessions WHERE name = ?",
                    (name,),
                ).fetchone()
                if row is None:
                    return None
                cursor, summary, total, config, owner, live, pending, compactions = row
                turns = select_turns(conn, name, cursor, total)
            return SessionRecord(
                name,
                cursor=cursor,
                summary=summary,
                total_turns=total,
                turns=tuple(turns),
                live_notes=decode_notes(live),
                pending_notes=decode_notes(pending),
                config=decode_config(config),
                owner=owner,
                compactions=compactions,
            )

        return await self.db.run("load", op)

    async def create(self, record: SessionRecord) -> Created:
        config = encode_config(record.config)

        def op(conn: sqlite3.Connection) -> Created:
            now = self._clock()
            # one write transaction: the insert and the owner read back are exclusive across
            # connections and processes (BEGIN IMMEDIATE), so a name is owned exactly once
            with writing(conn):
                made = conn.execute(
                    "INSERT INTO sessions (name, config, owner, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
                    (record.name, config, record.owner, now, now),
                ).rowcount
                if made:
                    return Created(True, record.owner)
                [owner] = conn.execute("SELECT owner FROM sessions WHERE name = ?", (record.name,)).fetchone()
                return Created(False, owner)

        return await self.db.run("create", op)

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        await self.group.submit(AppendTurn(name, index, turn_fields(turn)))

    async def save_notes(
        self, name: str, live: Sequence[Note], pending: Sequence[Note], doc: IndexedDoc | None = None
    ) -> RecallStats | None:
        op = SaveNotes(name, encode_notes(live), encode_notes(pending), doc)
        await self.group.submit(op)
        return op.stats

    async def save_config(self, name: str, config: dict[str, Any]) -> None:
        encoded = encode_config(config)

        def op(conn: sqlite3.Connection) -> None:
            with writing(conn):
                changed = conn.execute(
                    "UPDATE sessions SET config = ?, updated_at = ? WHERE name = ?",
                    (encoded, self._clock(), name),
                ).rowcount
                if changed == 0:
                    raise SessionNotStored(name)

        await self.db.run("save_config", op)

    async def commit_compaction(self, name: str, fold: FoldCommit) -> bool:
        pending = encode_notes(fold.pending_notes)

        def op(conn: sqlite3.Connection) -> bool:
            with writing(conn):
                row = conn.execute(
                    "SELECT cursor, summary, pending_notes, total_turns, fence FROM sessions WHERE name = ?",
                    (name,),
                ).fetchone()
                if row is None:
                    raise SessionNotStored(name)
                cursor, stored_summary, stored_pending, total, current_fence = row
                if fold.fence is not None and fold.fence != current_fence:
                    return False
                if cursor != fold.expected_cursor:
                    # the same commit, retried after its answer was lost, has nothing left to do
                    return (cursor, stored_summary, stored_pending) == (
                        fold.new_cursor,
                        fold.summary,
                        pending,
                    )
                if fold.new_cursor > total:
                    return False
                conn.execute(
                    "UPDATE sessions SET cursor = ?, summary = ?, pending_notes = ?,"
                    " compactions = compactions + 1, updated_at = ? WHERE name = ?",
                    (fold.new_cursor, fold.summary, pending, self._clock(), name),
                )
                return True

        return await self.db.run("commit_compaction", op)

    async def read_turns(self, name: str, start: int, end: int) -> list[Turn]:
        def op(conn: sqlite3.Connection) -> list[Turn]:
            with reading(conn):
                if total_turns(conn, name) < 0:
                    raise SessionNotStored(name)
                return select_turns(conn, name, max(start, 0), end)

        # a longer run (a tier's roll reads a day of turns) would hold every reply on the loop
        return await self.db.run_read("read_turns", op, on_loop=end - start <= LOOP_READ_TURNS)

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        if ttl <= 0:
            raise ValueError("a lease needs a positive ttl")

        def op(conn: sqlite3.Connection) -> int | None:
            with writing(conn):
                row = conn.execute(
                    "SELECT lease_holder, lease_until, fence FROM sessions WHERE name = ?", (name,)
                ).fetchone()
                if row is None:
                    raise SessionNotStored(name)
                current, until, fence = row
                now = self._clock()
                if current is not None and current != holder and until > now:
                    return None
                conn.execute(
                    "UPDATE sessions SET lease_holder = ?, lease_until = ?, fence = ? WHERE name = ?",
                    (holder, now + ttl, fence + 1, name),
                )
                return int(fence) + 1

        return await self.db.run("acquire_lease", op)

    async def renew_lease(self, name: str, holder: str, fence: int, ttl: float) -> bool:
        if ttl <= 0:
            raise ValueError("a lease needs a positive ttl")

        def op(conn: sqlite3.Connection) -> bool:
            with writing(conn):
                # every grant moves the fence: the same fence means no grant since this one
                renewed = conn.execute(
                    "UPDATE sessions SET lease_holder = ?, lease_until = ? WHERE name = ? AND fence = ?",
                    (holder, self._clock() + ttl, name, fence),
                ).rowcount
                return renewed == 1

        return await self.db.run("renew_lease", op)

    async def release_lease(self, name: str, holder: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            with writing(conn):
                conn.execute(
                    "UPDATE sessions SET lease_holder = NULL, lease_until = 0"
                    " WHERE name = ? AND lease_holder = ?",
                    (name, holder),
                )

        await self.db.run("release_lease", op)

    async def touch(self, names: Sequence[str]) -> None:
        if self.session_ttl is None or not names:
            return

        def op(conn: sqlite3.Connection) -> None:
            with writing(conn):
                conn.execute(  # one statement for every name (see sqlite_rows: never a row a statement)
                    "UPDATE sessions SET updated_at = ? WHERE name IN (SELECT value FROM json_each(?))",
                    (self._clock(), orjson.dumps(list(names)).decode()),
                )

        await self.db.run("touch", op)

    async def expire(self) -> list[str]:
        ttl = self.session_ttl
        if ttl is None:
            return []

        def op(conn: sqlite3.Connection) -> list[str]:
            with writing(conn):
                rows = conn.execute(
                    "SELECT name FROM sessions WHERE updated_at < ? LIMIT ?",
                    (self._clock() - ttl, EXPIRE_BATCH),
                ).fetchall()
                names = [str(row[0]) for row in rows]
                for name in names:
                    forget(conn, name)
                return names

        expired: list[str] = []
        while True:  # a batch per transaction, so that other writers get their turn between them
            batch = await self.db.run("expire", op)
            expired.extend(batch)
            if len(batch) < EXPIRE_BATCH:
                return expired

    async def delete(self, name: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            with writing(conn):
                forget(conn, name)

        await self.db.run("delete", op)

    async def list_sessions(self, owner: str | None, limit: int) -> list[StoredSession]:
        def op(conn: sqlite3.Connection) -> list[StoredSession]:
            with reading(conn):
                rows = conn.execute(
                    "SELECT name, owner, total_turns, cursor FROM sessions"
                    " WHERE owner IS ? ORDER BY name LIMIT ?",
                    (owner, limit),
                ).fetchall()
            return [StoredSession(*row) for row in rows]

        return await self.db.run("list_sessions", op)

    # -- the recall index --------------------------------------------------------

    async def index_turns(self, name: str, start: int, docs: Sequence[IndexedDoc]) -> RecallStats:
        op = IndexTurns(name, start, tuple(docs))
        await self.derived.submit(op)
        assert op.stats is not None
        return op.stats

    async def index_note(self, name: str, doc: IndexedDoc) -> RecallStats:
        op = IndexNote(name, doc)
        await self.derived.submit(op)
        assert op.stats is not None
        return op.stats

    async def recall_postings(
        self, name: str, terms: Sequence[str], choose: ChooseTerms | None = None
    ) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
        def op(conn: sqlite3.Connection) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
            with reading(conn):
                return select_postings(conn, name, terms, choose)

        return await self.db.run_read("recall_postings", op)

    async def recall_passages(self, name: str, keys: Sequence[int]) -> dict[int, Passage]:
        def op(conn: sqlite3.Connection) -> dict[int, Passage]:
            with reading(conn):
                return select_passages(conn, name, keys)

        return await self.db.run_read("recall_passages", op)

    async def recall_search(
        self, name: str, terms: Sequence[str], choose: ChooseTerms, pick: PickPassages[Picked]
    ) -> RecallSearch[Picked]:
        def op(conn: sqlite3.Connection) -> RecallSearch[Picked]:
            with reading(conn):  # one transaction: the passages are of the postings' snapshot
                stats, df, postings = select_postings(conn, name, terms, choose)
                picked, keys = pick(stats, df, postings)
                return RecallSearch(stats, df, postings, picked, select_passages(conn, name, keys))

        return await self.db.run_read("recall_search", op)

    async def save_vectors(self, name: str, vectors: dict[int, bytes]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            with derived(conn), writing(conn):
                if total_turns(conn, name) < 0:
                    raise SessionNotStored(name)
                [(sid, _)] = recall_states(conn, [name]).values()
                conn.executemany(
                    "INSERT OR REPLACE INTO recall_vectors (sid, key, vector) VALUES (?, ?, ?)",
                    [(sid, key, vector) for key, vector in vectors.items()],
                )

        await self.db.run("save_vectors", op)

    async def load_vectors(self, name: str) -> dict[int, bytes]:
        def op(conn: sqlite3.Connection) -> dict[int, bytes]:
            with reading(conn):
                rows = conn.execute(
                    "SELECT v.key, v.vector FROM recall_vectors v JOIN recall_state s ON s.sid = v.sid"
                    " WHERE s.session = ?",
                    (name,),
                ).fetchall()
            return {int(key): bytes(vector) for key, vector in rows}

        return await self.db.run("load_vectors", op)

    async def save_landmark(self, name: str, landmark: Landmark) -> None:
        body = encode_landmark(landmark)

        def op(conn: sqlite3.Connection) -> None:
            with writing(conn):
                if conn.execute("SELECT 1 FROM sessions WHERE name = ?", (name,)).fetchone() is None:
                    raise SessionNotStored(name)
                conn.execute(
                    "INSERT OR REPLACE INTO landmarks (session, idx, body) VALUES (?, ?, ?)",
                    (name, landmark.index, body),
                )

        await self.db.run("save_landmark", op)

    async def delete_landmark(self, name: str, index: int) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            with writing(conn):
                cursor = conn.execute("DELETE FROM landmarks WHERE session = ? AND idx = ?", (name, index))
                return cursor.rowcount > 0

        return await self.db.run("delete_landmark", op)

    async def load_landmarks(self, name: str) -> tuple[Landmark, ...]:
        def op(conn: sqlite3.Connection) -> tuple[Landmark, ...]:
            with reading(conn):
                rows = conn.execute(
                    "SELECT body FROM landmarks WHERE session = ? ORDER BY idx", (name,)
                ).fetchall()
            return tuple(decode_landmark(row[0]) for row in rows)

        return await self.db.run("load_landmarks", op)

    async def save_tier(self, name: str, summary: TierSummary) -> bool:
        body = encode_tier(summary)

        def op(conn: sqlite3.Connection) -> bool:
            with writing(conn):
                if conn.execute("SELECT 1 FROM sessions WHERE name = ?", (name,)).fetchone() is None:
                    raise SessionNotStored(name)
                # kept only when there is none, or this one covers more turns (never older over newer)
                cursor = conn.execute(
                    "INSERT INTO tiers (session, tier, start, end_turn, body) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (session, tier, start) DO UPDATE SET end_turn = excluded.end_turn,"
                    " body = excluded.body WHERE excluded.end_turn > tiers.end_turn",
                    (name, summary.tier, summary.start, summary.end_turn, body),
                )
                return cursor.rowcount > 0

        return await self.db.run("save_tier", op)

    async def load_tiers(self, name: str) -> tuple[TierSummary, ...]:
        def op(conn: sqlite3.Connection) -> tuple[TierSummary, ...]:
            with reading(conn):
                rows = conn.execute(
                    "SELECT body FROM tiers WHERE session = ? ORDER BY tier, start", (name,)
                ).fetchall()
            return tuple(decode_tier(row[0]) for row in rows)

        return await self.db.run("load_tiers", op)

    async def aclose(self) -> None:
        """Close the file (see :meth:`~voice_context.store.sqlite_db.Connections.aclose`)."""
        await self.db.aclose()
