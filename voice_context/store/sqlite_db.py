"""The SQLite store's connections: the writer (which creates and migrates the schema when it
first opens the file), used by a worker thread of its own, and the read-only readers of a
reply's path; ``sqlite3`` errors become ``StoreError`` here, at the edge.

A reply's reads (a search, the turns before the cursor) run on the event loop's own thread, by
default (``reads="loop"``). A read is some 0.3-1 ms of SQLite and Python, from pages the system
keeps in memory; handed to a thread, it waited for that thread to wake and take the
interpreter's lock, and for the lock again after each statement, while the event loop and the
other threads held it: at 1,000 paced sessions on two cores, searches of under a millisecond's
work took 16-37 ms at p90, and replies waited with them. On the loop, nothing waits for a hand-off; what
the loop gives up is the read's own time, which it spent waiting anyway. The loop's connection
never waits for a lock (SQLite's busy timeout 0): a read that finds the file busy (a rare moment
in WAL mode: another connection recovering the log) goes to the reader's thread, which waits for
it there. A store on a disk slow to read (a network file system, pages the system does not keep)
would make the loop wait for the disk: ``reads="thread"`` (``[store] sqlite_reads``) keeps every
read on the reader's thread, as before.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Literal, TypeVar

import anyio

from voice_context.errors import StoreError
from voice_context.logs import get_logger
from voice_context.store.sqlite_rows import WriterConnection, until_free
from voice_context.store.sqlite_schema import migrate
from voice_context.worker import Worker

T = TypeVar("T")

log = get_logger("voice_context.store")

OLDEST_SQLITE = (3, 33, 0)
"""The oldest SQLite the store runs on (``UPDATE ... FROM``, which a group's writes use)."""

CLOSE_TIMEOUT = 10.0
"""The longest (seconds) closing waits, shielded, for the operations in flight to end."""

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


SQLiteReads = Literal["loop", "thread"]
SQLITE_READS: tuple[SQLiteReads, ...] = ("loop", "thread")

_BUSY = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class Connections:
    """Runs each operation (a function of a connection, one whole transaction): writes one at a
    time in the writer's worker thread (see :mod:`~voice_context.worker`); a reply's reads on the
    event loop's thread (``reads="loop"``, falling back to the reader's thread when the file is
    busy) or in the reader's thread, one at a time (``reads="thread"``)."""

    def __init__(self, path: Path, busy_timeout: float, reads: SQLiteReads = "loop") -> None:
        if reads not in SQLITE_READS:
            raise ValueError(f"reads must be loop or thread, got {reads!r}")
        self.path = path
        self.busy_timeout = busy_timeout
        self.reads = reads
        self.writer: sqlite3.Connection | None = None
        #: the read-only connection of the reader's thread, and the event loop's
        self.reader: sqlite3.Connection | None = None
        self.loop_reader: sqlite3.Connection | None = None
        #: reads that found the file busy on the loop and went to the reader's thread
        self.busy_reads = 0
        self._writes = Worker("voice-context-sqlite-writer")
        self._reads = Worker("voice-context-sqlite-reader")
        self.closed = False
        self.operations = 0
        self.errors = 0

    async def run(self, where: str, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` on the writer; raises ``StoreError`` (its ``sqlite3`` error translated)."""
        self.check_open()
        return await self._writes.run(partial(self.call, where, op))

    async def run_read(self, where: str, op: Callable[[sqlite3.Connection], T], *, on_loop: bool = True) -> T:
        """A read on a reply's path: on a read-only connection, beside the writes, on the event
        loop's thread or the reader's (see the module's docstring; ``on_loop=False`` for a read
        too long for the loop). Until the writer has opened the file (and migrated it), on the
        writer's connection."""
        self.check_open()
        if self.writer is None:
            return await self.run(where, op)
        if self.reads == "loop" and on_loop:
            try:
                return self.call(where, op, "loop")
            except StoreError as exc:
                cause = exc.__cause__
                if getattr(cause, "sqlite_errorcode", 0) & 0xFF not in _BUSY:
                    raise
                self.busy_reads += 1  # the reader's thread waits for the file, not the loop
        return await self._reads.run(partial(self.call, where, op, "reader"))

    def check_open(self) -> None:
        if self.closed:
            raise StoreError("the sqlite store is closed", retryable=False)

    def call(
        self,
        where: str,
        op: Callable[[sqlite3.Connection], T],
        on: Literal["writer", "reader", "loop"] = "writer",
    ) -> T:
        """Runs ``op`` on the connection ``on`` names, in its thread (one call at a time per
        connection)."""
        self.operations += 1
        try:
            if on == "loop":
                return op(self._loop_connection())
            return op(self._read_connection() if on == "reader" else self._connection())
        except sqlite3.Error as exc:
            self.errors += 1
            raise translate(exc, where) from exc
        except OSError as exc:
            self.errors += 1
            raise StoreError(f"sqlite store {where}: {exc}", retryable=True) from exc

    def _connection(self) -> sqlite3.Connection:
        if self.writer is not None:
            return self.writer
        if sqlite3.sqlite_version_info < OLDEST_SQLITE:
            oldest = ".".join(map(str, OLDEST_SQLITE))
            found = sqlite3.sqlite_version
            raise StoreError(
                f"sqlite store: this Python's SQLite is {found}; it needs {oldest} or newer", retryable=False
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            factory=WriterConnection,
        )
        conn.lock_timeout = self.busy_timeout
        try:
            # two processes opening a new file at once: the one that loses the race to switch
            # it to WAL is told "database is locked" at once, without SQLite's busy handler
            mode = until_free(conn, "PRAGMA journal_mode = WAL", self.busy_timeout).fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"sqlite store: {self.path} cannot use WAL (got {mode!r})", retryable=False)
            conn.execute("PRAGMA synchronous = FULL")
            # a statement that changes many rows (a batch of postings) keeps its undo log in
            # memory, not in a temporary file written and read back
            conn.execute("PRAGMA temp_store = MEMORY")
            migrate(conn)
        except BaseException:
            conn.close()
            raise
        self.writer = conn
        return conn

    def _read_connection(self) -> sqlite3.Connection:
        if self.reader is None:
            self.reader = self._open_reader(self.busy_timeout)
        return self.reader

    def _loop_connection(self) -> sqlite3.Connection:
        if self.loop_reader is None:
            self.loop_reader = self._open_reader(0.0)  # never waits for a lock on the loop
        return self.loop_reader

    def _open_reader(self, timeout: float) -> sqlite3.Connection:
        reader = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
        reader.execute("PRAGMA query_only = ON")
        return reader

    async def aclose(self) -> None:
        """Refuse new operations, then close both connections once the operations in flight
        have ended: shielded, and within ``CLOSE_TIMEOUT`` (a connection still in use then is
        left to the process's end, and logged)."""
        if self.closed:
            return
        self.closed = True

        def close_writer() -> None:
            if self.writer is not None:
                conn, self.writer = self.writer, None
                conn.close()

        def close_reader() -> None:
            if self.reader is not None:
                reader, self.reader = self.reader, None
                reader.close()

        if self.loop_reader is not None:  # (its reads ran on this thread, and none is in flight)
            loop_reader, self.loop_reader = self.loop_reader, None
            loop_reader.close()

        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True) as scope:
            await self._reads.run(close_reader)
            await self._writes.run(close_writer)
        self._reads.stop()
        self._writes.stop()
        if scope.cancelled_caught:
            log.warning("voice_context_store_close_timed_out", path=str(self.path), seconds=CLOSE_TIMEOUT)
