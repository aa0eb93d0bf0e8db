"""The SQL the SQLite store runs (in its worker threads, and a reply's reads on the event loop's
thread): its transactions, and the statements its operations and its group writer share. Every
function here runs inside one transaction.

The reads a context waits for (a search's doc counts, postings and passages; a run of turns)
come back as one row each, a JSON array built by SQLite (:func:`rows_of`), not a row a result.
CPython's ``sqlite3`` lets go of the interpreter's lock for every step of a statement, each row
one step, and takes it back after: while the event loop is busy, each taking back waits for it,
up to the interpreter's switch interval (5 ms). A search of some forty rows waited through
forty of those; as one row a statement, through a handful. SQLite writes a ``REAL`` into JSON
with 15 digits, which loses the last bits of a time: a time comes back as ``quote(at)``, a text
that reads back as the very same float.

Writes are shaped the same way, for a second reason: a write transaction holds the file's write
lock through each of those waits, and another process's writer (``serve --workers 2``,
replicas on one file) waits on the lock meanwhile. A group's turns go in multi-row ``VALUES``
statements (:func:`insert_values`), its counts, notes and recall index in one statement over a
JSON array each (:class:`RecallWrites`): a group of hundreds of writes is a dozen statements, where
a statement run once a row (``executemany``) held the lock through hundreds of waits. Times are
bound as parameters, never read from JSON: SQLite's JSON parser rounds most of them.
"""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import time
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from voice_context.core.recalled import IndexedDoc, Passage, Posting, RecallStats
from voice_context.core.turns import Turn
from voice_context.errors import SessionNotStored
from voice_context.store.base import ChooseTerms
from voice_context.store.common import make_turn


class WriterConnection(sqlite3.Connection):
    """The store's writing connection: ``writing`` waits for the file's write lock itself, in
    steps of at most ``LOCK_STEP``, for up to ``lock_timeout`` seconds (the store's busy
    timeout)."""

    lock_timeout: float = 5.0


LOCK_STEP = 0.001
"""The longest sleep (seconds) between two tries for the file's write lock."""

_FIRST_STEP = 0.0001
_sleep = time.sleep  # the writer thread's pause between two tries (a seam for tests)


@contextlib.contextmanager
def writing(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, holding the write lock from its first statement to its
    ``COMMIT``. A ``WriterConnection``'s busy timeout, set aside while it waits for the lock
    (:func:`begin_immediate`), is put back after the ``COMMIT``: a statement run under the lock
    is one more wait for the interpreter's lock while another process waits for the file's."""
    timeout = begin_immediate(conn)
    restore = f"PRAGMA busy_timeout = {int(timeout * 1000)}" if timeout is not None else ""
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        if restore:
            with contextlib.suppress(sqlite3.Error):  # the write's own error is the one to raise
                conn.execute(restore)
        raise
    if restore:
        conn.execute(restore)


def begin_immediate(conn: sqlite3.Connection) -> float | None:
    """``BEGIN IMMEDIATE``: the file's write lock, taken up front. On a ``WriterConnection``,
    while another connection (another process on the same file, say) holds the lock, try again
    after 0.1, 0.2, 0.4, 0.8 ms and then every ``LOCK_STEP``, until ``lock_timeout`` has
    passed (then SQLite's "database is locked" is raised, as its busy handler would). Returns
    the busy timeout (seconds) the caller puts back once the transaction ends, SQLite's own
    set to 0 meanwhile; None on another connection.

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25, ... up to 100 ms between tries.
    Two processes that both write all the time (``serve --workers 2``, replicas on one file)
    each hold the lock for a few ms at a time, so a waiter on that schedule kept sleeping past
    the other's commits: turns waited hundreds of ms for a lock held a few ms at a time."""
    timeout = getattr(conn, "lock_timeout", None)
    if timeout is None:
        conn.execute("BEGIN IMMEDIATE")
        return None
    conn.execute("PRAGMA busy_timeout = 0")  # the tries below are the wait
    try:
        until_free(conn, "BEGIN IMMEDIATE", timeout)
    except BaseException:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")
        raise
    return float(timeout)


def until_free(conn: sqlite3.Connection, sql: str, timeout: float) -> sqlite3.Cursor:
    """Run ``sql``, trying again while SQLite answers that the file is busy: after 0.1, 0.2,
    0.4, 0.8 ms and then every ``LOCK_STEP``, until ``timeout`` seconds have passed (then the
    last "database is locked" is raised)."""
    deadline = 0.0
    step = _FIRST_STEP
    while True:
        try:
            return conn.execute(sql)
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
                raise
            now = time.monotonic()
            deadline = deadline or now + timeout
            if now >= deadline:
                raise
        _sleep(min(step, deadline - now))
        step = min(2 * step, LOCK_STEP)


@contextlib.contextmanager
def derived(conn: sqlite3.Connection) -> Iterator[None]:
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
def reading(conn: sqlite3.Connection) -> Iterator[None]:
    """One read transaction: its statements all see the same snapshot."""
    conn.execute("BEGIN")
    try:
        yield
    finally:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("COMMIT")


def total_turns(conn: sqlite3.Connection, name: str) -> int:
    """The session's turn count, or -1 when there is no such session."""
    row = conn.execute("SELECT total_turns FROM sessions WHERE name = ?", (name,)).fetchone()
    return -1 if row is None else int(row[0])


def forget(conn: sqlite3.Connection, name: str) -> None:
    """Delete everything kept of a session: its row, its turns, its recall index."""
    conn.execute("DELETE FROM turns WHERE session = ?", (name,))
    conn.execute("DELETE FROM landmarks WHERE session = ?", (name,))
    conn.execute("DELETE FROM tiers WHERE session = ?", (name,))
    conn.execute("DELETE FROM sessions WHERE name = ?", (name,))
    row = conn.execute("SELECT sid FROM recall_state WHERE session = ?", (name,)).fetchone()
    if row is not None:
        for table in ("recall_terms", "recall_df", "recall_notes", "recall_vectors", "recall_state"):
            conn.execute(f"DELETE FROM {table} WHERE sid = ?", (row[0],))


VALUES_ROWS = 64
"""The most rows one statement of :func:`insert_values` binds: with at most eight columns, 512
parameters, under the 999 of SQLite's older builds."""


def insert_values(conn: sqlite3.Connection, head: str, width: int, rows: Sequence[Sequence[object]]) -> None:
    """``head`` (``INSERT INTO t (a, b)``) of ``width`` columns for every row, bound as
    parameters, in multi-row ``VALUES`` statements of 64, 32, ..., 1 rows: a few statements for
    any number of rows, each one step (see the module's docstring). Bound, a ``REAL`` keeps
    every bit; SQLite's JSON parser rounds most times, so rows with times do not go by JSON."""
    start = 0
    while start < len(rows):
        size = min(VALUES_ROWS, 1 << (len(rows) - start).bit_length() - 1)
        chunk = rows[start : start + size]
        conn.execute(_values_sql(head, width, size), [value for row in chunk for value in row])
        start += size


@functools.cache
def _values_sql(head: str, width: int, size: int) -> str:
    row = "(" + ", ".join("?" * width) + ")"
    return f"{head} VALUES " + ", ".join([row] * size)


def turn_counts(conn: sqlite3.Connection, names: Iterable[str]) -> dict[str, int]:
    """The turn count of each of these sessions the store holds (one statement, one step)."""
    out = orjson.loads(
        conn.execute(
            "SELECT json_group_object(name, total_turns) FROM sessions"
            " WHERE name IN (SELECT value FROM json_each(?))",
            (orjson.dumps(list(names)).decode(),),
        ).fetchone()[0]
    )
    return cast(dict[str, int], out)


def recall_states(conn: sqlite3.Connection, names: Collection[str]) -> dict[str, tuple[int, RecallStats]]:
    """The recall index number and stats of each of these sessions, created empty for those
    without one (in a write; the sessions are stored). Two or four statements for any number."""

    def select(wanted: Collection[str]) -> dict[str, tuple[int, RecallStats]]:
        rows = rows_of(
            conn,
            "SELECT json_group_array(json_array(session, sid, docs, length, turns, notes))"
            " FROM recall_state WHERE session IN (SELECT value FROM json_each(?))",
            (orjson.dumps(list(wanted)).decode(),),
        )
        return {row[0]: (int(row[1]), RecallStats(*row[2:])) for row in rows}

    states = select(names)
    missing = [name for name in names if name not in states]
    if missing:
        conn.execute(
            "INSERT INTO recall_state (session) SELECT value FROM json_each(?)",
            (orjson.dumps(missing).decode(),),
        )
        states.update(select(missing))
    return states


@dataclass(slots=True)
class RecallWrites:
    """The recall index writes of a transaction (many sessions' turns and notes), gathered in
    order and then written in a handful of statements whatever their number
    (:meth:`write`): each session's next turn and note keys follow the writes before them."""

    states: dict[str, tuple[int, RecallStats]]
    """Each session's index number and stats, as of the writes gathered so far."""
    postings: list[tuple[int, str, int, int, int]] = field(default_factory=list)
    """(sid, term, key, tf, length)"""
    notes: list[tuple[int, int, float, str, str]] = field(default_factory=list)
    """(sid, key, at, speaker, text)"""
    changed: set[str] = field(default_factory=set)

    def turns(self, name: str, start: int, docs: Sequence[IndexedDoc], total: int) -> RecallStats:
        """Index the docs of the turns from ``start`` that follow the last one indexed and are
        stored (``total`` turns)."""
        sid, stats = self.states[name]
        turns, added, length = stats.turns, 0, 0
        for offset, doc in enumerate(docs):
            key = start + offset
            if key < turns:
                continue
            if key > turns + added or key >= total:
                break
            self.postings.extend((sid, term, key, tf, doc.length) for term, tf in doc.terms)
            added += 1
            length += doc.length
        if added:
            stats = RecallStats(stats.docs + added, stats.length + length, turns + added, stats.notes)
            self._set(name, sid, stats)
        return stats

    def note(self, name: str, doc: IndexedDoc) -> RecallStats:
        """Index a screen note under the session's next note key."""
        sid, stats = self.states[name]
        key = -(stats.notes + 1)
        p = doc.passage
        self.notes.append((sid, key, p.at, p.speaker, p.text))
        self.postings.extend((sid, term, key, tf, doc.length) for term, tf in doc.terms)
        stats = RecallStats(stats.docs + 1, stats.length + doc.length, stats.turns, stats.notes + 1)
        self._set(name, sid, stats)
        return stats

    def _set(self, name: str, sid: int, stats: RecallStats) -> None:
        self.states[name] = (sid, stats)
        self.changed.add(name)

    def write(self, conn: sqlite3.Connection) -> None:
        """The postings, each word's doc count (a doc holds a word once), the notes' passages
        and the sessions' stats: a statement each, over a JSON array (no time goes by JSON)."""
        if self.postings:
            conn.execute(
                "INSERT INTO recall_terms (sid, term, key, tf, length) SELECT json_extract(value, '$[0]'),"
                " json_extract(value, '$[1]'), json_extract(value, '$[2]'), json_extract(value, '$[3]'),"
                " json_extract(value, '$[4]') FROM json_each(?)",
                (orjson.dumps(self.postings).decode(),),
            )
            counts = Counter((sid, term) for sid, term, _, _, _ in self.postings)
            conn.execute(
                "INSERT INTO recall_df (sid, term, df) SELECT json_extract(value, '$[0]'),"
                " json_extract(value, '$[1]'), json_extract(value, '$[2]') FROM json_each(?) WHERE true"
                " ON CONFLICT (sid, term) DO UPDATE SET df = df + excluded.df",
                (orjson.dumps([(sid, term, n) for (sid, term), n in counts.items()]).decode(),),
            )
        if self.notes:
            insert_values(conn, "INSERT INTO recall_notes (sid, key, at, speaker, text)", 5, self.notes)
        if self.changed:
            rows = []
            for name in self.changed:
                sid, stats = self.states[name]
                rows.append((sid, stats.docs, stats.length, stats.turns, stats.notes))
            conn.execute(
                "UPDATE recall_state SET docs = json_extract(j.value, '$[1]'),"
                " length = json_extract(j.value, '$[2]'), turns = json_extract(j.value, '$[3]'),"
                " notes = json_extract(j.value, '$[4]')"
                " FROM json_each(?) AS j WHERE recall_state.sid = json_extract(j.value, '$[0]')",
                (orjson.dumps(rows).decode(),),
            )
        self.postings, self.notes, self.changed = [], [], set()


def select_postings(
    conn: sqlite3.Connection, name: str, terms: Sequence[str], choose: ChooseTerms | None
) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
    """The session's recall stats, the doc counts of ``terms``, and the postings of those
    ``choose`` picks (see :meth:`~voice_context.store.base.Store.recall_postings`)."""
    row = conn.execute(
        "SELECT sid, docs, length, turns, notes FROM recall_state WHERE session = ?", (name,)
    ).fetchone()
    if row is None:
        if total_turns(conn, name) < 0:
            raise SessionNotStored(name)
        return RecallStats(), {}, {}
    sid, stats = row[0], RecallStats(*row[1:])
    wanted = list(dict.fromkeys(terms))
    df: dict[str, int] = {}
    if wanted:
        df = orjson.loads(
            conn.execute(
                "SELECT json_group_object(term, df) FROM recall_df"
                " WHERE sid = ? AND term IN (SELECT value FROM json_each(?))",
                (sid, orjson.dumps(wanted).decode()),
            ).fetchone()[0]
        )
    read = choose(list(df), lambda t: df.get(t, 0), stats) if choose else list(df)
    out: dict[str, list[Posting]] = {}
    if read:
        for term, key, tf, length in rows_of(
            conn,
            "SELECT json_group_array(json_array(term, key, tf, length)) FROM recall_terms"
            " WHERE sid = ? AND term IN (SELECT value FROM json_each(?))",
            (sid, orjson.dumps(read).decode()),
        ):
            out.setdefault(term, []).append((key, tf, length))
    return stats, df, out


def rows_of(conn: sqlite3.Connection, sql: str, params: tuple[object, ...]) -> list[list[Any]]:
    """The rows of ``sql``, a statement whose one row is a JSON array of them (see the module's
    docstring for why)."""
    return cast(list[list[Any]], orjson.loads(conn.execute(sql, params).fetchone()[0]))


def select_passages(conn: sqlite3.Connection, name: str, keys: Sequence[int]) -> dict[int, Passage]:
    """The passages of the session with these keys (turns by index, notes by negative key)."""
    turn_keys = sorted({k for k in keys if k >= 0})
    note_keys = sorted({k for k in keys if k < 0})
    out: dict[int, Passage] = {}
    if turn_keys:
        for idx, speaker, role, text, at in rows_of(
            conn,
            "SELECT json_group_array(json_array(idx, speaker, role, text, quote(at))) FROM turns"
            " WHERE session = ? AND idx IN (SELECT value FROM json_each(?))",
            (name, orjson.dumps(turn_keys).decode()),
        ):
            out[idx] = Passage("turn", idx, float(at), speaker, text, role)
    if note_keys:
        for key, at, speaker, text in rows_of(
            conn,
            "SELECT json_group_array(json_array(n.key, quote(n.at), n.speaker, n.text))"
            " FROM recall_notes n JOIN recall_state s ON s.sid = n.sid"
            " WHERE s.session = ? AND n.key IN (SELECT value FROM json_each(?))",
            (name, orjson.dumps(note_keys).decode()),
        ):
            out[key] = Passage("note", None, float(at), speaker, text)
    return out


def select_turns(conn: sqlite3.Connection, name: str, start: int, end: int) -> list[Turn]:
    rows = rows_of(
        conn,
        "SELECT json_group_array(json_array(speaker, role, text, quote(at), id, tool)) FROM"
        " (SELECT * FROM turns WHERE session = ? AND idx >= ? AND idx < ? ORDER BY idx)",
        (name, start, end),
    )
    return [make_turn(*row) for row in rows]
