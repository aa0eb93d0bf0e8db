"""The embedded store: one SQLite file in WAL mode, the default.

Access model: one ``sqlite3`` connection per store for everything that
writes, used by one operation at a time in a worker thread
(``anyio.to_thread.run_sync`` behind a capacity limiter of one). The reads on
a reply's path (recall's postings and passages, the turns before the cursor)
have a second, read-only connection and a worker of their own: in WAL mode a
reader sees the last commit without waiting for the writer, so a context is
never queued behind a group's fsync. Each store method is a single function that runs a whole
transaction in the thread, from ``BEGIN`` to ``COMMIT``; no transaction ever
spans an ``await``. A cancelled caller therefore never leaves a transaction
open: the thread finishes (or rolls back) before the cancellation is
delivered. Nothing beyond the standard library is needed.

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
at the wrong index fails alone, not its group. The recall index's writes
(``index_turns``, ``index_note``) are grouped the same way, in transactions
of their own that need no fsync (what they hold can be derived again from the
turns), and they give way to the turns': an index group waits while turns are
queued or being written, up to ``DERIVED_YIELD`` (0.2 s), so a burst of
appends is acknowledged at the pace of its own commits and the index catches
up in larger groups (the indexing lag on ``/metrics`` shows it). ``VOICE_CONTEXT_TEST_COMMIT_PAUSE``
(seconds, tests only) holds each group between its last statement and its
``COMMIT``, so a test can kill the process there.

Writes start with ``BEGIN IMMEDIATE``: the file's write lock is taken up
front, so two writers never deadlock on a lock upgrade, and a writer waits up
to ``busy_timeout`` for another one (another process on the same file,
say) before giving up with a retryable ``StoreError`` ("database is locked").
Several processes on one machine may share one file: creating a session (which
reads back its owner), leases and conditional commits are single transactions, so
they are exclusive across processes too.
(Not on a network file system: WAL needs shared memory between the processes.)

Retention: with ``session_ttl``, :meth:`SQLiteStore.expire` deletes the sessions
whose ``updated_at`` (set by every write, and by ``touch``) is older than that, 25
sessions per transaction; the server calls it periodically, never on the
path of a reply.

Schema, version 1::

    schema_version(version)
    sessions(name PK, cursor, summary, total_turns, config JSON, owner,
             live_notes JSON, pending_notes JSON, compactions,
             lease_holder, lease_until, fence, created_at, updated_at)
    turns(session, idx, speaker, role, text, at, id, PRIMARY KEY (session, idx))
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import structlog

from voice_context.core.landmarks import Landmark
from voice_context.core.recalled import IndexedDoc, Passage, Posting, RecallStats
from voice_context.core.tiers import TierSummary
from voice_context.core.turns import Note, Turn
from voice_context.errors import SessionNotStored, StoreError, TurnConflict
from voice_context.store.base import ChooseTerms, Created, SessionRecord, StoredSession
from voice_context.store.common import (
    decode_config,
    decode_landmark,
    decode_notes,
    decode_tier,
    encode_config,
    encode_landmark,
    encode_notes,
    encode_tier,
    make_turn,
    turn_fields,
)
from voice_context.store.group import GroupCommit, Pending

T = TypeVar("T")

log = structlog.get_logger("voice_context.store")

PAUSE_ENV = "VOICE_CONTEXT_TEST_COMMIT_PAUSE"
"""Seconds each group waits, its statements run, before its COMMIT: a window for durability
tests to kill the process in. Never set outside tests."""

SCHEMA_VERSION = 5
BUSY_TIMEOUT = 5.0
#: Sessions deleted per transaction by ``expire`` (each with all its turns): 25 sessions of 200
#: turns hold the write lock for about 8 ms (100 held it for 36 ms), so a turn append waits little.
EXPIRE_BATCH = 25
#: Seconds at most a recall index write waits for the turns' writes queued or in flight.
DERIVED_YIELD = 0.2

_LANDMARKS = """
    CREATE TABLE IF NOT EXISTS landmarks (
        session TEXT    NOT NULL,
        idx     INTEGER NOT NULL,
        body    TEXT    NOT NULL,
        PRIMARY KEY (session, idx)
    ) WITHOUT ROWID
    """

# version 5: the tier cascade's summaries, one per session, tier and period start
_TIERS = """
    CREATE TABLE IF NOT EXISTS tiers (
        session  TEXT    NOT NULL,
        tier     TEXT    NOT NULL,
        start    REAL    NOT NULL,
        end_turn INTEGER NOT NULL,
        body     TEXT    NOT NULL,
        PRIMARY KEY (session, tier, start)
    ) WITHOUT ROWID
    """

_SCHEMA = (
    """
    CREATE TABLE sessions (
        name          TEXT PRIMARY KEY,
        cursor        INTEGER NOT NULL DEFAULT 0,
        summary       TEXT    NOT NULL DEFAULT '',
        total_turns   INTEGER NOT NULL DEFAULT 0,
        config        TEXT    NOT NULL DEFAULT '{}',
        owner         TEXT,
        live_notes    TEXT    NOT NULL DEFAULT '[]',
        pending_notes TEXT    NOT NULL DEFAULT '[]',
        compactions   INTEGER NOT NULL DEFAULT 0,
        lease_holder  TEXT,
        lease_until   REAL    NOT NULL DEFAULT 0,
        fence         INTEGER NOT NULL DEFAULT 0,
        created_at    REAL    NOT NULL,
        updated_at    REAL    NOT NULL
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE turns (
        session TEXT    NOT NULL,
        idx     INTEGER NOT NULL,
        speaker TEXT    NOT NULL,
        role    TEXT    NOT NULL,
        text    TEXT    NOT NULL,
        at      REAL    NOT NULL,
        id      TEXT,
        tool    TEXT,
        PRIMARY KEY (session, idx)
    ) WITHOUT ROWID
    """,
    _LANDMARKS,
    _TIERS,
)
#: What each older schema version needs to become the current one.
_MIGRATIONS: dict[int, tuple[str, ...]] = {}  # filled in below, once the recall schema is defined

# version 4: the recall index, by a small session number (``sid``) so that a posting
# row holds no session name
_RECALL_SCHEMA = (
    """
    CREATE TABLE IF NOT EXISTS recall_state (
        sid     INTEGER PRIMARY KEY,
        session TEXT    NOT NULL UNIQUE,
        docs    INTEGER NOT NULL DEFAULT 0,
        length  INTEGER NOT NULL DEFAULT 0,
        turns   INTEGER NOT NULL DEFAULT 0,
        notes   INTEGER NOT NULL DEFAULT 0
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS recall_terms (
        sid    INTEGER NOT NULL,
        term   TEXT    NOT NULL,
        key    INTEGER NOT NULL,
        tf     INTEGER NOT NULL,
        length INTEGER NOT NULL,
        PRIMARY KEY (sid, term, key)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS recall_df (
        sid    INTEGER NOT NULL,
        term   TEXT    NOT NULL,
        df     INTEGER NOT NULL,
        PRIMARY KEY (sid, term)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS recall_notes (
        sid     INTEGER NOT NULL,
        key     INTEGER NOT NULL,
        at      REAL    NOT NULL,
        speaker TEXT    NOT NULL,
        text    TEXT    NOT NULL,
        PRIMARY KEY (sid, key)
    ) WITHOUT ROWID
    """,
    """
    CREATE TABLE IF NOT EXISTS recall_vectors (
        sid    INTEGER NOT NULL,
        key    INTEGER NOT NULL,
        vector BLOB    NOT NULL,
        PRIMARY KEY (sid, key)
    ) WITHOUT ROWID
    """,
)

#: What each older schema version needs to become the next: 2 landmarks, 3 tool turns, 4 recall,
#: 5 tiers.
_MIGRATIONS.update(
    {1: (_LANDMARKS,), 2: ("ALTER TABLE turns ADD COLUMN tool TEXT",), 3: _RECALL_SCHEMA, 4: (_TIERS,)}
)

# SQLite's primary result codes that may clear up on their own: busy/locked,
# out of memory, I/O error, disk full, cannot open, lock protocol.
_TRANSIENT = {5, 6, 7, 10, 13, 14, 15}
_TRANSIENT_WORDS = ("locked", "busy", "disk i/o", "disk is full", "unable to open", "out of memory")


def translate(exc: sqlite3.Error, where: str) -> StoreError:
    """A ``StoreError`` for a ``sqlite3`` exception, retryable when trying later may help."""
    code = getattr(exc, "sqlite_errorcode", None)
    message = str(exc)
    if code is not None:
        retryable = (code & 0xFF) in _TRANSIENT
    else:
        retryable = isinstance(exc, sqlite3.OperationalError) and any(
            word in message.lower() for word in _TRANSIENT_WORDS
        )
    return StoreError(f"sqlite store {where}: {message}", retryable=retryable)


class SQLiteStore:
    """Sessions in one SQLite file. See the module docstring for the guarantees."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = BUSY_TIMEOUT,
        clock: Callable[[], float] = time.time,
        session_ttl: float | None = None,
    ) -> None:
        if busy_timeout < 0:
            raise ValueError("busy_timeout must be >= 0")
        if session_ttl is not None and session_ttl <= 0:
            raise ValueError("session_ttl must be positive (or None: kept until deleted)")
        self.session_ttl = session_ttl
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._clock = clock
        self._conn: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self._reader: sqlite3.Connection | None = None
        self._read_limiter = anyio.CapacityLimiter(1)
        self._closed = False
        self.group: GroupCommit[_Write] = GroupCommit(self._write_group)
        #: the recall index's writes, grouped the same way across sessions (without an fsync)
        self.derived: GroupCommit[_Index] = GroupCommit(self._write_derived)
        #: a test's window between a group's last statement and its COMMIT (see ``PAUSE_ENV``)
        self.pause_before_commit = float(os.environ.get(PAUSE_ENV) or 0)
        self.operations = 0
        self.errors = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._conn is not None else "not opened")
        return (
            f"<SQLiteStore {str(self.path)!r} {state} operations={self.operations} errors={self.errors} "
            f"groups={self.group.groups}>"
        )

    # -- the Store protocol ----------------------------------------------------

    async def load(self, name: str) -> SessionRecord | None:
        def op(conn: sqlite3.Connection) -> SessionRecord | None:
            with _read(conn):
                row = conn.execute(
                    "SELECT cursor, summary, total_turns, config, owner, live_notes, pending_notes,"
                    " compactions FROM sessions WHERE name = ?",
                    (name,),
                ).fetchone()
                if row is None:
                    return None
                cursor, summary, total, config, owner, live, pending, compactions = row
                turns = _select_turns(conn, name, cursor, total)
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

        return await self._run("load", op)

    async def create(self, record: SessionRecord) -> Created:
        config = encode_config(record.config)

        def op(conn: sqlite3.Connection) -> Created:
            now = self._clock()
            # one write transaction: the insert and the owner read back are exclusive across
            # connections and processes (BEGIN IMMEDIATE), so a name is owned exactly once
            with _write(conn):
                made = conn.execute(
                    "INSERT INTO sessions (name, config, owner, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
                    (record.name, config, record.owner, now, now),
                ).rowcount
                if made:
                    return Created(True, record.owner)
                [owner] = conn.execute("SELECT owner FROM sessions WHERE name = ?", (record.name,)).fetchone()
                return Created(False, owner)

        return await self._run("create", op)

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        await self.group.submit(_AppendTurn(name, index, turn_fields(turn)))

    async def save_notes(self, name: str, live: Sequence[Note], pending: Sequence[Note]) -> None:
        await self.group.submit(_SaveNotes(name, encode_notes(live), encode_notes(pending)))

    async def save_config(self, name: str, config: dict[str, Any]) -> None:
        encoded = encode_config(config)

        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                changed = conn.execute(
                    "UPDATE sessions SET config = ?, updated_at = ? WHERE name = ?",
                    (encoded, self._clock(), name),
                ).rowcount
                if changed == 0:
                    raise SessionNotStored(name)

        await self._run("save_config", op)

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
        if new_cursor < expected_cursor:
            raise ValueError(f"the cursor only moves forward ({expected_cursor} -> {new_cursor})")
        pending = encode_notes(pending_notes)

        def op(conn: sqlite3.Connection) -> bool:
            with _write(conn):
                row = conn.execute(
                    "SELECT cursor, summary, pending_notes, total_turns, fence FROM sessions WHERE name = ?",
                    (name,),
                ).fetchone()
                if row is None:
                    raise SessionNotStored(name)
                cursor, stored_summary, stored_pending, total, current_fence = row
                if fence is not None and fence != current_fence:
                    return False
                if cursor != expected_cursor:
                    # the same commit, retried after its answer was lost, has nothing left to do
                    return (cursor, stored_summary, stored_pending) == (new_cursor, summary, pending)
                if new_cursor > total:
                    return False
                conn.execute(
                    "UPDATE sessions SET cursor = ?, summary = ?, pending_notes = ?,"
                    " compactions = compactions + 1, updated_at = ? WHERE name = ?",
                    (new_cursor, summary, pending, self._clock(), name),
                )
                return True

        return await self._run("commit_compaction", op)

    async def read_turns(self, name: str, start: int, end: int) -> list[Turn]:
        def op(conn: sqlite3.Connection) -> list[Turn]:
            with _read(conn):
                if _total_turns(conn, name) < 0:
                    raise SessionNotStored(name)
                return _select_turns(conn, name, max(start, 0), end)

        return await self._run_read("read_turns", op)

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        if ttl <= 0:
            raise ValueError("a lease needs a positive ttl")

        def op(conn: sqlite3.Connection) -> int | None:
            with _write(conn):
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

        return await self._run("acquire_lease", op)

    async def renew_lease(self, name: str, holder: str, fence: int, ttl: float) -> bool:
        if ttl <= 0:
            raise ValueError("a lease needs a positive ttl")

        def op(conn: sqlite3.Connection) -> bool:
            with _write(conn):
                # every grant moves the fence: the same fence means no grant since this one
                renewed = conn.execute(
                    "UPDATE sessions SET lease_holder = ?, lease_until = ? WHERE name = ? AND fence = ?",
                    (holder, self._clock() + ttl, name, fence),
                ).rowcount
                return renewed == 1

        return await self._run("renew_lease", op)

    async def release_lease(self, name: str, holder: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                conn.execute(
                    "UPDATE sessions SET lease_holder = NULL, lease_until = 0"
                    " WHERE name = ? AND lease_holder = ?",
                    (name, holder),
                )

        await self._run("release_lease", op)

    async def touch(self, names: Sequence[str]) -> None:
        if self.session_ttl is None or not names:
            return

        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                now = self._clock()
                conn.executemany(
                    "UPDATE sessions SET updated_at = ? WHERE name = ?", [(now, name) for name in names]
                )

        await self._run("touch", op)

    async def expire(self) -> list[str]:
        ttl = self.session_ttl
        if ttl is None:
            return []

        def op(conn: sqlite3.Connection) -> list[str]:
            with _write(conn):
                rows = conn.execute(
                    "SELECT name FROM sessions WHERE updated_at < ? LIMIT ?",
                    (self._clock() - ttl, EXPIRE_BATCH),
                ).fetchall()
                names = [str(row[0]) for row in rows]
                for name in names:
                    _forget(conn, name)
                return names

        expired: list[str] = []
        while True:  # a batch per transaction, so that other writers get their turn between them
            batch = await self._run("expire", op)
            expired.extend(batch)
            if len(batch) < EXPIRE_BATCH:
                return expired

    async def delete(self, name: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                _forget(conn, name)

        await self._run("delete", op)

    async def list_sessions(self, owner: str | None, limit: int) -> list[StoredSession]:
        def op(conn: sqlite3.Connection) -> list[StoredSession]:
            with _read(conn):
                rows = conn.execute(
                    "SELECT name, owner, total_turns, cursor FROM sessions"
                    " WHERE owner IS ? ORDER BY name LIMIT ?",
                    (owner, limit),
                ).fetchall()
            return [StoredSession(*row) for row in rows]

        return await self._run("list_sessions", op)

    # -- the recall index --------------------------------------------------------

    async def index_turns(self, name: str, start: int, docs: Sequence[IndexedDoc]) -> RecallStats:
        op = _IndexTurns(name, start, tuple(docs))
        await self.derived.submit(op)
        assert op.stats is not None
        return op.stats

    async def index_note(self, name: str, doc: IndexedDoc) -> RecallStats:
        op = _IndexNote(name, doc)
        await self.derived.submit(op)
        assert op.stats is not None
        return op.stats

    async def recall_postings(
        self, name: str, terms: Sequence[str], choose: ChooseTerms | None = None
    ) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
        wanted = list(dict.fromkeys(terms))

        def op(conn: sqlite3.Connection) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
            with _read(conn):
                row = conn.execute(
                    "SELECT sid, docs, length, turns, notes FROM recall_state WHERE session = ?", (name,)
                ).fetchone()
                if row is None:
                    if _total_turns(conn, name) < 0:
                        raise SessionNotStored(name)
                    return RecallStats(), {}, {}
                sid, stats = row[0], RecallStats(*row[1:])
                df: dict[str, int] = {}
                if wanted:
                    marks = ",".join("?" * len(wanted))
                    df = dict(
                        conn.execute(
                            f"SELECT term, df FROM recall_df WHERE sid = ? AND term IN ({marks})",
                            (sid, *wanted),
                        ).fetchall()
                    )
                read = choose(list(df), lambda t: df.get(t, 0), stats.docs) if choose else list(df)
                out: dict[str, list[Posting]] = {}
                if read:
                    marks = ",".join("?" * len(read))
                    for term, key, tf, length in conn.execute(
                        f"SELECT term, key, tf, length FROM recall_terms WHERE sid = ? AND term IN ({marks})",
                        (sid, *read),
                    ):
                        out.setdefault(term, []).append((key, tf, length))
                return stats, df, out

        return await self._run_read("recall_postings", op)

    async def recall_passages(self, name: str, keys: Sequence[int]) -> dict[int, Passage]:
        turn_keys = sorted({k for k in keys if k >= 0})
        note_keys = sorted({k for k in keys if k < 0})

        def op(conn: sqlite3.Connection) -> dict[int, Passage]:
            out: dict[int, Passage] = {}
            with _read(conn):
                if turn_keys:
                    marks = ",".join("?" * len(turn_keys))
                    for idx, speaker, role, text, at in conn.execute(
                        "SELECT idx, speaker, role, text, at FROM turns"
                        f" WHERE session = ? AND idx IN ({marks})",
                        (name, *turn_keys),
                    ):
                        out[idx] = Passage("turn", idx, at, speaker, text, role)
                if note_keys:
                    marks = ",".join("?" * len(note_keys))
                    for key, at, speaker, text in conn.execute(
                        "SELECT n.key, n.at, n.speaker, n.text FROM recall_notes n"
                        " JOIN recall_state s ON s.sid = n.sid"
                        f" WHERE s.session = ? AND n.key IN ({marks})",
                        (name, *note_keys),
                    ):
                        out[key] = Passage("note", None, at, speaker, text)
            return out

        return await self._run_read("recall_passages", op)

    async def save_vectors(self, name: str, vectors: dict[int, bytes]) -> None:
        def op(conn: sqlite3.Connection) -> None:
            with _derived(conn), _write(conn):
                if _total_turns(conn, name) < 0:
                    raise SessionNotStored(name)
                sid, _ = _recall_state(conn, name)
                conn.executemany(
                    "INSERT OR REPLACE INTO recall_vectors (sid, key, vector) VALUES (?, ?, ?)",
                    [(sid, key, vector) for key, vector in vectors.items()],
                )

        await self._run("save_vectors", op)

    async def load_vectors(self, name: str) -> dict[int, bytes]:
        def op(conn: sqlite3.Connection) -> dict[int, bytes]:
            with _read(conn):
                rows = conn.execute(
                    "SELECT v.key, v.vector FROM recall_vectors v JOIN recall_state s ON s.sid = v.sid"
                    " WHERE s.session = ?",
                    (name,),
                ).fetchall()
            return {int(key): bytes(vector) for key, vector in rows}

        return await self._run("load_vectors", op)

    async def save_landmark(self, name: str, landmark: Landmark) -> None:
        body = encode_landmark(landmark)

        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                if conn.execute("SELECT 1 FROM sessions WHERE name = ?", (name,)).fetchone() is None:
                    raise SessionNotStored(name)
                conn.execute(
                    "INSERT OR REPLACE INTO landmarks (session, idx, body) VALUES (?, ?, ?)",
                    (name, landmark.index, body),
                )

        await self._run("save_landmark", op)

    async def delete_landmark(self, name: str, index: int) -> bool:
        def op(conn: sqlite3.Connection) -> bool:
            with _write(conn):
                cursor = conn.execute("DELETE FROM landmarks WHERE session = ? AND idx = ?", (name, index))
                return cursor.rowcount > 0

        return await self._run("delete_landmark", op)

    async def load_landmarks(self, name: str) -> tuple[Landmark, ...]:
        def op(conn: sqlite3.Connection) -> tuple[Landmark, ...]:
            with _read(conn):
                rows = conn.execute(
                    "SELECT body FROM landmarks WHERE session = ? ORDER BY idx", (name,)
                ).fetchall()
            return tuple(decode_landmark(row[0]) for row in rows)

        return await self._run("load_landmarks", op)

    async def save_tier(self, name: str, summary: TierSummary) -> bool:
        body = encode_tier(summary)

        def op(conn: sqlite3.Connection) -> bool:
            with _write(conn):
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

        return await self._run("save_tier", op)

    async def load_tiers(self, name: str) -> tuple[TierSummary, ...]:
        def op(conn: sqlite3.Connection) -> tuple[TierSummary, ...]:
            with _read(conn):
                rows = conn.execute(
                    "SELECT body FROM tiers WHERE session = ? ORDER BY tier, start", (name,)
                ).fetchall()
            return tuple(decode_tier(row[0]) for row in rows)

        return await self._run("load_tiers", op)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True

        def op() -> None:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

        def close_reader() -> None:
            if self._reader is not None:
                reader, self._reader = self._reader, None
                reader.close()

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(close_reader, limiter=self._read_limiter)
            await anyio.to_thread.run_sync(op, limiter=self._limiter)

    # -- internals -------------------------------------------------------------

    async def _write_group(self, batch: list[Pending[_Write]]) -> None:
        if self._closed:
            raise StoreError("the sqlite store is closed", retryable=False)
        await anyio.to_thread.run_sync(
            self._call, "append", lambda conn: self._commit_group(conn, batch), limiter=self._limiter
        )

    async def _write_derived(self, batch: list[Pending[_Index]]) -> None:
        if self._closed:
            raise StoreError("the sqlite store is closed", retryable=False)
        # the turns' own writes go first: during a burst of appends the index waits (and
        # its next group grows), at most DERIVED_YIELD, so acknowledgements keep their pace
        with anyio.move_on_after(DERIVED_YIELD):
            await self.group.idle()
        if self._closed:
            raise StoreError("the sqlite store is closed", retryable=False)
        await anyio.to_thread.run_sync(
            self._call, "index", lambda conn: self._commit_derived(conn, batch), limiter=self._limiter
        )

    def _commit_derived(self, conn: sqlite3.Connection, batch: list[Pending[_Index]]) -> None:
        """Runs in the worker thread: the recall index writes of many sessions in one
        transaction, without an fsync of its own (see :func:`_derived`). A write for a
        session the store does not hold fails alone."""
        self.operations += len(batch) - 1  # ``_call`` counted one
        with _derived(conn), _write(conn):
            for item in batch:
                op = item.op
                total = _total_turns(conn, op.name)
                if total < 0:
                    item.error = SessionNotStored(op.name)
                elif isinstance(op, _IndexTurns):
                    op.stats = _index_turns(conn, op, total)
                else:
                    op.stats = _index_note(conn, op)

    def _commit_group(self, conn: sqlite3.Connection, batch: list[Pending[_Write]]) -> None:
        """Runs in the worker thread: one transaction, one fsync, for the whole group.

        The sessions' turn counts are read once; each write is checked against them
        in order (a turn at the wrong index, or for a session deleted meanwhile,
        gets its own error and writes nothing), then the turns that pass are
        inserted and the counts and notes updated, a statement each for the whole
        group. An error of SQLite's own fails the group (the caller gives every
        write of it that error).
        """
        self.operations += len(batch) - 1  # ``_call`` counted one
        now = self._clock()
        with _write(conn):
            totals = _turn_counts(conn, {item.op.name for item in batch})
            inserts: list[tuple[object, ...]] = []
            written: dict[tuple[str, int], tuple[str, str, str, float, str | None, str | None]] = {}
            notes: list[tuple[str, str, float, str]] = []
            for item in batch:
                op = item.op
                total = totals.get(op.name)
                if total is None:
                    item.error = SessionNotStored(op.name)
                elif isinstance(op, _SaveNotes):
                    notes.append((op.live, op.pending, now, op.name))
                elif op.index == total:
                    inserts.append((op.name, op.index, *op.fields))
                    written[(op.name, op.index)] = op.fields
                    totals[op.name] = total + 1
                elif 0 <= op.index < total:
                    stored = written.get((op.name, op.index)) or _stored_turn(conn, op.name, op.index)
                    if stored != op.fields:
                        item.error = TurnConflict(op.name, op.index, total, differs=True)
                    # else: a retry of a write that landed, nothing to do
                else:
                    item.error = TurnConflict(op.name, op.index, total)
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
            conn.executemany(
                "UPDATE sessions SET live_notes = ?, pending_notes = ?, updated_at = ? WHERE name = ?", notes
            )
            if self.pause_before_commit > 0:
                log.warning(
                    "voice_context_store_commit_paused",
                    seconds=self.pause_before_commit,
                    writes=[item.op.where for item in batch if item.error is None],
                )
                time.sleep(self.pause_before_commit)

    async def _run(self, where: str, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreError("the sqlite store is closed", retryable=False)
        return await anyio.to_thread.run_sync(self._call, where, op, limiter=self._limiter)

    async def _run_read(self, where: str, op: Callable[[sqlite3.Connection], T]) -> T:
        """A read on a reply's path: on the read-only connection, beside the writes. Until the
        writer has opened the file (and migrated it), on the writer's connection."""
        if self._closed:
            raise StoreError("the sqlite store is closed", retryable=False)
        if self._conn is None:
            return await self._run(where, op)
        return await anyio.to_thread.run_sync(self._call, where, op, True, limiter=self._read_limiter)

    def _call(self, where: str, op: Callable[[sqlite3.Connection], T], read: bool = False) -> T:
        """Runs in a worker thread, one call at a time per connection."""
        self.operations += 1
        try:
            return op(self._read_connection() if read else self._connection())
        except sqlite3.Error as exc:
            self.errors += 1
            raise translate(exc, where) from exc
        except OSError as exc:
            self.errors += 1
            raise StoreError(f"sqlite store {where}: {exc}", retryable=True) from exc

    def _connection(self) -> sqlite3.Connection:
        if self._conn is not None:
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"sqlite store: {self.path} cannot use WAL (got {mode!r})", retryable=False)
            conn.execute("PRAGMA synchronous = FULL")
            _migrate(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _read_connection(self) -> sqlite3.Connection:
        if self._reader is not None:
            return self._reader
        reader = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        reader.execute("PRAGMA query_only = ON")
        self._reader = reader
        return reader


@contextlib.contextmanager
def _write(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, holding the write lock from its first statement."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def _derived(conn: sqlite3.Connection) -> Iterator[None]:
    """A write of what can be derived again from the turns (the recall index): committed
    without its own fsync. In WAL mode the next turn's commit fsyncs the log, this write
    with it; a power cut before that loses only index entries, which are written again
    from the turns when the session next opens."""
    conn.execute("PRAGMA synchronous = NORMAL")
    try:
        yield
    finally:
        conn.execute("PRAGMA synchronous = FULL")


@contextlib.contextmanager
def _read(conn: sqlite3.Connection) -> Iterator[None]:
    """One read transaction: its statements all see the same snapshot."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("COMMIT")


@dataclass(frozen=True, slots=True)
class _AppendTurn:
    name: str
    index: int
    fields: tuple[str, str, str, float, str | None, str | None]

    @property
    def where(self) -> list[object]:
        return [self.name, self.index]


@dataclass(frozen=True, slots=True)
class _SaveNotes:
    name: str
    live: str
    pending: str

    @property
    def where(self) -> list[object]:
        return [self.name, "notes"]


_Write = _AppendTurn | _SaveNotes


@dataclass(slots=True)
class _IndexTurns:
    name: str
    start: int
    docs: tuple[IndexedDoc, ...]
    stats: RecallStats | None = None
    """The session's index once this write is in (set by the group that writes it)."""


@dataclass(slots=True)
class _IndexNote:
    name: str
    doc: IndexedDoc
    stats: RecallStats | None = None


_Index = _IndexTurns | _IndexNote


def _index_turns(conn: sqlite3.Connection, op: _IndexTurns, total: int) -> RecallStats:
    """Index the turns of ``op`` that follow the last one indexed and are stored (in a write)."""
    sid, stats = _recall_state(conn, op.name)
    turns, added, length = stats.turns, 0, 0
    rows: list[tuple[int, str, int, int, int]] = []
    for offset, doc in enumerate(op.docs):
        key = op.start + offset
        if key < turns:
            continue
        if key > turns + added or key >= total:
            break
        rows.extend((sid, term, key, tf, doc.length) for term, tf in doc.terms)
        added += 1
        length += doc.length
    if not added:
        return stats
    _add_postings(conn, rows)
    conn.execute(
        "UPDATE recall_state SET docs = docs + ?, length = length + ?, turns = turns + ? WHERE sid = ?",
        (added, length, added, sid),
    )
    return RecallStats(stats.docs + added, stats.length + length, turns + added, stats.notes)


def _index_note(conn: sqlite3.Connection, op: _IndexNote) -> RecallStats:
    """Index a screen note under the next note key (in a write)."""
    sid, stats = _recall_state(conn, op.name)
    key = -(stats.notes + 1)
    doc = op.doc
    p = doc.passage
    conn.execute(
        "INSERT INTO recall_notes (sid, key, at, speaker, text) VALUES (?, ?, ?, ?, ?)",
        (sid, key, p.at, p.speaker, p.text),
    )
    _add_postings(conn, [(sid, term, key, tf, doc.length) for term, tf in doc.terms])
    conn.execute(
        "UPDATE recall_state SET docs = docs + 1, length = length + ?, notes = notes + 1 WHERE sid = ?",
        (doc.length, sid),
    )
    return RecallStats(stats.docs + 1, stats.length + doc.length, stats.turns, stats.notes + 1)


def _turn_counts(conn: sqlite3.Connection, names: set[str]) -> dict[str, int]:
    """The turn count of each of these sessions the store holds."""
    out: dict[str, int] = {}
    ordered = list(names)
    for start in range(0, len(ordered), 500):  # SQLite limits the parameters of one statement
        chunk = ordered[start : start + 500]
        marks = ",".join("?" * len(chunk))
        rows = conn.execute(f"SELECT name, total_turns FROM sessions WHERE name IN ({marks})", chunk)
        out.update((name, int(total)) for name, total in rows)
    return out


def _stored_turn(
    conn: sqlite3.Connection, name: str, index: int
) -> tuple[str, str, str, float, str | None, str | None] | None:
    row = conn.execute(
        "SELECT speaker, role, text, at, id, tool FROM turns WHERE session = ? AND idx = ?", (name, index)
    ).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3], row[4], row[5])


def _total_turns(conn: sqlite3.Connection, name: str) -> int:
    """The session's turn count, or -1 when there is no such session."""
    row = conn.execute("SELECT total_turns FROM sessions WHERE name = ?", (name,)).fetchone()
    return -1 if row is None else int(row[0])


def _forget(conn: sqlite3.Connection, name: str) -> None:
    """Delete everything kept of a session: its row, its turns, its recall index."""
    conn.execute("DELETE FROM turns WHERE session = ?", (name,))
    conn.execute("DELETE FROM landmarks WHERE session = ?", (name,))
    conn.execute("DELETE FROM tiers WHERE session = ?", (name,))
    conn.execute("DELETE FROM sessions WHERE name = ?", (name,))
    row = conn.execute("SELECT sid FROM recall_state WHERE session = ?", (name,)).fetchone()
    if row is not None:
        for table in ("recall_terms", "recall_df", "recall_notes", "recall_vectors", "recall_state"):
            conn.execute(f"DELETE FROM {table} WHERE sid = ?", (row[0],))


def _recall_state(conn: sqlite3.Connection, name: str) -> tuple[int, RecallStats]:
    """The session's recall index number and stats, created empty when it has none (in a write)."""
    conn.execute("INSERT OR IGNORE INTO recall_state (session) VALUES (?)", (name,))
    row = conn.execute(
        "SELECT sid, docs, length, turns, notes FROM recall_state WHERE session = ?", (name,)
    ).fetchone()
    return int(row[0]), RecallStats(*row[1:])


def _add_postings(conn: sqlite3.Connection, rows: Sequence[tuple[int, str, int, int, int]]) -> None:
    """Postings (sid, term, key, tf, length) into the index, each word's doc count with them."""
    conn.executemany("INSERT INTO recall_terms (sid, term, key, tf, length) VALUES (?, ?, ?, ?, ?)", rows)
    conn.executemany(
        "INSERT INTO recall_df (sid, term, df) VALUES (?, ?, 1)"
        " ON CONFLICT (sid, term) DO UPDATE SET df = df + 1",
        [(sid, term) for sid, term, _, _, _ in rows],
    )


def _select_turns(conn: sqlite3.Connection, name: str, start: int, end: int) -> list[Turn]:
    rows = conn.execute(
        "SELECT speaker, role, text, at, id, tool FROM turns WHERE session = ? AND idx >= ? AND idx < ?"
        " ORDER BY idx",
        (name, start, end),
    ).fetchall()
    return [make_turn(*row) for row in rows]


def _migrate(conn: sqlite3.Connection) -> None:
    """Create the schema in a fresh file; refuse a file written by a newer version.

    A file that already has its schema is only read here, so a process can
    start while another one holds the write lock.
    """
    version = _schema_version(conn)
    if version is None:
        with _write(conn):
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            version = _schema_version(conn)
            if version is None:
                for statement in (*_SCHEMA, *_RECALL_SCHEMA):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                version = SCHEMA_VERSION
    if version < SCHEMA_VERSION:
        with _write(conn):
            version = _schema_version(conn) or SCHEMA_VERSION  # another process may have migrated
            while version < SCHEMA_VERSION:
                for statement in _MIGRATIONS[version]:
                    conn.execute(statement)
                version += 1
            conn.execute("UPDATE schema_version SET version = ?", (version,))
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"sqlite store: the file has schema version {version}, newer than {SCHEMA_VERSION}",
            retryable=False,
        )


def _schema_version(conn: sqlite3.Connection) -> int | None:
    """The file's schema version, or ``None`` when it has none yet."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if exists is None:
        return None
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return None if row is None or row[0] is None else int(row[0])
