"""The SQL the SQLite store runs in its worker threads: its transactions, and the statements
its operations and its group writer share. Every function here runs inside one transaction."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator, Sequence

from voice_context.core.recalled import RecallStats
from voice_context.core.turns import Turn
from voice_context.store.common import make_turn


@contextlib.contextmanager
def writing(conn: sqlite3.Connection) -> Iterator[None]:
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
    conn.execute("INSERT OR IGNORE INTO recall_state (session) VALUES (?)", (name,))
    row = conn.execute(
        "SELECT sid, docs, length, turns, notes FROM recall_state WHERE session = ?", (name,)
    ).fetchone()
    return int(row[0]), RecallStats(*row[1:])


def add_postings(conn: sqlite3.Connection, rows: Sequence[tuple[int, str, int, int, int]]) -> None:
    """Postings (sid, term, key, tf, length) into the index, each word's doc count with them."""
    conn.executemany("INSERT INTO recall_terms (sid, term, key, tf, length) VALUES (?, ?, ?, ?, ?)", rows)
    conn.executemany(
        "INSERT INTO recall_df (sid, term, df) VALUES (?, ?, 1)"
        " ON CONFLICT (sid, term) DO UPDATE SET df = df + 1",
        [(sid, term) for sid, term, _, _, _ in rows],
    )


def select_turns(conn: sqlite3.Connection, name: str, start: int, end: int) -> list[Turn]:
    rows = conn.execute(
        "SELECT speaker, role, text, at, id, tool FROM turns WHERE session = ? AND idx >= ? AND idx < ?"
        " ORDER BY idx",
        (name, start, end),
    ).fetchall()
    return [make_turn(*row) for row in rows]
