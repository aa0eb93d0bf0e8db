"""The SQLite store's two connections: the writer (which creates and migrates the schema when it
first opens the file) and the read-only reader of a reply's path, each used by one worker thread
at a time; ``sqlite3`` errors become ``StoreError`` here, at the edge."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import anyio
import structlog

from voice_context.errors import StoreError
from voice_context.store.sqlite_rows import WriterConnection
from voice_context.store.sqlite_schema import migrate
from voice_context.worker import Worker

T = TypeVar("T")

log = structlog.get_logger("voice_context.store")

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


class Connections:
    """Runs each operation (a function of a connection, one whole transaction) in a worker
    thread of the connection's own (see :mod:`~voice_context.worker`): writes one at a
    time on the writer, a reply's reads one at a time on the reader."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.writer: sqlite3.Connection | None = None
        self.reader: sqlite3.Connection | None = None
        self._writes = Worker("voice-context-sqlite-writer")
        self._reads = Worker("voice-context-sqlite-reader")
        self.closed = False
        self.operations = 0
        self.errors = 0

    async def run(self, where: str, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` on the writer; raises ``StoreError`` (its ``sqlite3`` error translated)."""
        self.check_open()
        return await self._writes.run(partial(self.call, where, op))

    async def run_read(self, where: str, op: Callable[[sqlite3.Connection], T]) -> T:
        """A read on a reply's path: on the read-only connection, beside the writes. Until the
        writer has opened the file (and migrated it), on the writer's connection."""
        self.check_open()
        if self.writer is None:
            return await self.run(where, op)
        return await self._reads.run(partial(self.call, where, op, True))

    def check_open(self) -> None:
        if self.closed:
            raise StoreError("the sqlite store is closed", retryable=False)

    def call(self, where: str, op: Callable[[sqlite3.Connection], T], read: bool = False) -> T:
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
        if self.writer is not None:
            return self.writer
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
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
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
        if self.reader is not None:
            return self.reader
        reader = sqlite3.connect(
            self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=False
        )
        reader.execute("PRAGMA query_only = ON")
        self.reader = reader
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

        with anyio.move_on_after(CLOSE_TIMEOUT, shield=True) as scope:
            await self._reads.run(close_reader)
            await self._writes.run(close_writer)
        self._reads.stop()
        self._writes.stop()
        if scope.cancelled_caught:
            log.warning("voice_context_store_close_timed_out", path=str(self.path), seconds=CLOSE_TIMEOUT)
