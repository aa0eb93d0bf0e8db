"""The SQLite store's schema: created in a fresh file, migrated from an older version, and
a file written by a newer version refused (the tables: see :mod:`voice_context.store.sqlite`)."""

from __future__ import annotations

import sqlite3

from voice_context.errors import StoreError
from voice_context.store.sqlite_rows import writing

SCHEMA_VERSION = 5

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


def migrate(conn: sqlite3.Connection) -> None:
    """Create the schema in a fresh file; refuse a file written by a newer version.

    A file that already has its schema is only read here, so a process can
    start while another one holds the write lock.
    """
    version = schema_version(conn)
    if version is None:
        with writing(conn):
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            version = schema_version(conn)
            if version is None:
                for statement in (*_SCHEMA, *_RECALL_SCHEMA):
                    conn.execute(statement)
                conn.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
                version = SCHEMA_VERSION
    if version < SCHEMA_VERSION:
        with writing(conn):
            version = schema_version(conn) or SCHEMA_VERSION  # another process may have migrated
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


def schema_version(conn: sqlite3.Connection) -> int | None:
    """The file's schema version, or ``None`` when it has none yet."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if exists is None:
        return None
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    return None if row is None or row[0] is None else int(row[0])
