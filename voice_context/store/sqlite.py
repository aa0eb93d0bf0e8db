"""The embedded store: one SQLite file in WAL mode, the default.

Access model: one ``sqlite3`` connection per store, used by one operation at
a time in a worker thread (``anyio.to_thread.run_sync`` behind a capacity
limiter of one). Each store method is a single function that runs a whole
transaction in the thread, from ``BEGIN`` to ``COMMIT``; no transaction ever
spans an ``await``. A cancelled caller therefore never leaves a transaction
open: the thread finishes (or rolls back) before the cancellation is
delivered. Nothing beyond the standard library is needed.

Durability: ``journal_mode=WAL`` with ``synchronous=FULL``. In WAL mode a
commit appends to the write-ahead log; with ``FULL`` every commit also
``fsync``\\s the log before returning, so a turn is on disk before the bot is
told ``turn.appended``. (``NORMAL`` would survive ``kill -9`` of the server,
since the OS keeps what was written, but could lose the last commits on a
power cut or a kernel crash; one fsync per turn is cheap at speech rates.)

Writes start with ``BEGIN IMMEDIATE``: the file's write lock is taken up
front, so two writers never deadlock on a lock upgrade, and a writer waits up
to ``busy_timeout`` for another one (another process on the same file,
say) before giving up with a retryable ``StoreError`` ("database is locked").
Several processes on one machine may share one file: leases and conditional
commits are single transactions, so they are exclusive across processes too.
(Not on a network file system: WAL needs shared memory between the processes.)

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
from pathlib import Path
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from voice_context.core.landmarks import Landmark
from voice_context.core.turns import Note, Turn
from voice_context.errors import SessionNotStored, StoreError, TurnConflict
from voice_context.store.base import SessionRecord
from voice_context.store.common import (
    decode_config,
    decode_landmark,
    decode_notes,
    encode_config,
    encode_landmark,
    encode_notes,
    make_turn,
    turn_fields,
)

T = TypeVar("T")

SCHEMA_VERSION = 3
BUSY_TIMEOUT = 5.0

_LANDMARKS = """
    CREATE TABLE IF NOT EXISTS landmarks (
        session TEXT    NOT NULL,
        idx     INTEGER NOT NULL,
        body    TEXT    NOT NULL,
        PRIMARY KEY (session, idx)
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
)
#: What each older schema version needs to become the current one.
_MIGRATIONS = {1: (_LANDMARKS,), 2: ("ALTER TABLE turns ADD COLUMN tool TEXT",)}

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
    ) -> None:
        if busy_timeout < 0:
            raise ValueError("busy_timeout must be >= 0")
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._clock = clock
        self._conn: sqlite3.Connection | None = None
        self._limiter = anyio.CapacityLimiter(1)
        self._closed = False
        self.operations = 0
        self.errors = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._conn is not None else "not opened")
        return f"<SQLiteStore {str(self.path)!r} {state} operations={self.operations} errors={self.errors}>"

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

    async def create(self, record: SessionRecord) -> None:
        config = encode_config(record.config)

        def op(conn: sqlite3.Connection) -> None:
            now = self._clock()
            with _write(conn):
                conn.execute(
                    "INSERT INTO sessions (name, config, owner, created_at, updated_at)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
                    (record.name, config, record.owner, now, now),
                )

        await self._run("create", op)

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        fields = turn_fields(turn)

        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                moved = conn.execute(
                    "UPDATE sessions SET total_turns = total_turns + 1, updated_at = ?"
                    " WHERE name = ? AND total_turns = ?",
                    (self._clock(), name, index),
                ).rowcount
                if moved == 1:
                    conn.execute(
                        "INSERT INTO turns (session, idx, speaker, role, text, at, id, tool)"
                        " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (name, index, *fields),
                    )
                    return
                stored = _total_turns(conn, name)
                if stored < 0:
                    raise SessionNotStored(name)
                if 0 <= index < stored:
                    row = conn.execute(
                        "SELECT speaker, role, text, at, id, tool FROM turns WHERE session = ? AND idx = ?",
                        (name, index),
                    ).fetchone()
                    if row is not None and tuple(row) == fields:
                        return  # a retry of a write that landed: nothing to do
                    raise TurnConflict(name, index, stored, differs=True)
                raise TurnConflict(name, index, stored)

        await self._run("append_turn", op)

    async def save_notes(self, name: str, live: Sequence[Note], pending: Sequence[Note]) -> None:
        encoded = (encode_notes(live), encode_notes(pending))

        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                changed = conn.execute(
                    "UPDATE sessions SET live_notes = ?, pending_notes = ?, updated_at = ? WHERE name = ?",
                    (*encoded, self._clock(), name),
                ).rowcount
                if changed == 0:
                    raise SessionNotStored(name)

        await self._run("save_notes", op)

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

        return await self._run("read_turns", op)

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

    async def release_lease(self, name: str, holder: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                conn.execute(
                    "UPDATE sessions SET lease_holder = NULL, lease_until = 0"
                    " WHERE name = ? AND lease_holder = ?",
                    (name, holder),
                )

        await self._run("release_lease", op)

    async def delete(self, name: str) -> None:
        def op(conn: sqlite3.Connection) -> None:
            with _write(conn):
                conn.execute("DELETE FROM turns WHERE session = ?", (name,))
                conn.execute("DELETE FROM landmarks WHERE session = ?", (name,))
                conn.execute("DELETE FROM sessions WHERE name = ?", (name,))

        await self._run("delete", op)

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

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True

        def op() -> None:
            if self._conn is not None:
                conn, self._conn = self._conn, None
                conn.close()

        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(op, limiter=self._limiter)

    # -- internals -------------------------------------------------------------

    async def _run(self, where: str, op: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise StoreError("the sqlite store is closed", retryable=False)
        return await anyio.to_thread.run_sync(self._call, where, op, limiter=self._limiter)

    def _call(self, where: str, op: Callable[[sqlite3.Connection], T]) -> T:
        """Runs in the worker thread, one call at a time."""
        self.operations += 1
        try:
            return op(self._connection())
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
def _read(conn: sqlite3.Connection) -> Iterator[None]:
    """One read transaction: its statements all see the same snapshot."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("COMMIT")


def _total_turns(conn: sqlite3.Connection, name: str) -> int:
    """The session's turn count, or -1 when there is no such session."""
    row = conn.execute("SELECT total_turns FROM sessions WHERE name = ?", (name,)).fetchone()
    return -1 if row is None else int(row[0])


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
                for statement in _SCHEMA:
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
