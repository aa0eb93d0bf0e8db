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
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import Any, cast

import orjson

from voice_context.core.recalled import Passage, Posting, RecallStats
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
    """One write transaction, holding the write lock from its first statement."""
    begin_immediate(conn)
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def begin_immediate(conn: sqlite3.Connection) -> None:
    """``BEGIN IMMEDIATE``: the file's write lock, taken up front. On a ``WriterConnection``,
    while another connection (another process on the same file, say) holds the lock, try again
    after 0.1, 0.2, 0.4, 0.8 ms and then every ``LOCK_STEP``, until ``lock_timeout`` has
    passed (then SQLite's "database is locked" is raised, as its busy handler would).

    SQLite's own busy handler sleeps 1, 2, 5, 10, 15, 20, 25, ... up to 100 ms between tries.
    Two processes that both write all the time (``serve --workers 2``, replicas on one file)
    each hold the lock for a few ms at a time, so a waiter on that schedule kept sleeping past
    the other's commits: turns waited hundreds of ms for a lock held a few ms at a time."""
    timeout = getattr(conn, "lock_timeout", None)
    if timeout is None:
        conn.execute("BEGIN IMMEDIATE")
        return
    conn.execute("PRAGMA busy_timeout = 0")  # the tries below are the wait
    try:
        deadline = 0.0
        step = _FIRST_STEP
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if getattr(exc, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY:
                    raise
                now = time.monotonic()
                deadline = deadline or now + timeout
                if now >= deadline:
                    raise
            _sleep(min(step, deadline - now))
            step = min(2 * step, LOCK_STEP)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {int(timeout * 1000)}")


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


def recall_state(conn: sqlite3.Connection, name: str) -> tuple[int, RecallStats]:
    """The session's recall index number and stats, created empty when it has none (in a write)."""
    row = conn.execute(
        "SELECT sid, docs, length, turns, notes FROM recall_state WHERE session = ?", (name,)
    ).fetchone()
    if row is None:
        sid = conn.execute("INSERT INTO recall_state (session) VALUES (?)", (name,)).lastrowid
        assert sid is not None  # (sid is the table's rowid)
        return sid, RecallStats()
    return int(row[0]), RecallStats(*row[1:])


def add_postings(conn: sqlite3.Connection, sid: int, rows: Sequence[tuple[str, int, int, int]]) -> None:
    """Postings (term, key, tf, length) of session ``sid`` into the index, each word's doc count
    with them (a doc holds a word once).

    Two statements, each over a JSON array, whatever the rows: SQLite runs each in one call
    without the interpreter's lock. A statement run once per row takes the lock back after
    every row, and while the event loop is busy each of those waits for it (up to the switch
    interval): a batch of a few hundred postings then held the writer, and the turns' acks
    queued behind it, for a long time."""
    conn.execute(
        "INSERT INTO recall_terms (sid, term, key, tf, length)"
        " SELECT ?, json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]'),"
        " json_extract(value, '$[3]') FROM json_each(?)",
        (sid, orjson.dumps(rows).decode()),
    )
    counts = Counter(term for term, _, _, _ in rows)
    conn.execute(
        "INSERT INTO recall_df (sid, term, df)"
        " SELECT ?, json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?) WHERE true"
        " ON CONFLICT (sid, term) DO UPDATE SET df = df + excluded.df",
        (sid, orjson.dumps(list(counts.items())).decode()),
    )


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
