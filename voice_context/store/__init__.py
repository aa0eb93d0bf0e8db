"""Where sessions are kept: the ``Store`` protocol and its backends.

=============================  ==================================================
``memory``                     this process only; nothing survives a restart
``sqlite``                     ``<data_dir>/voice-context.db`` (the default)
``sqlite:///abs/path.db``      that file (``sqlite://rel/path.db``: relative to
                               the working directory)
``redis://host:port/db``       a Redis server shared by every replica
``rediss://...``, ``unix://``  the same over TLS, or over a Unix socket
``redis+cluster://host:port``  a Redis Cluster (any node; ``rediss+cluster://`` for TLS)
=============================  ==================================================
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from voice_context.store.base import Created, FoldCommit, SessionRecord, Store, StoredSession
from voice_context.store.memory import MemoryStore

if TYPE_CHECKING:
    from voice_context.store.sqlite_db import SQLiteReads

__all__ = [
    "Created",
    "FoldCommit",
    "MemoryStore",
    "SessionRecord",
    "Store",
    "StoredSession",
    "open_store",
    "sqlite_path",
]

DB_FILE = "voice-context.db"


def sqlite_path(url: str, *, data_dir: str = "data") -> Path | None:
    """The file a ``sqlite`` URL names, or ``None`` if the URL is not a sqlite one."""
    if url in ("sqlite", "sqlite://"):
        return Path(data_dir).expanduser() / DB_FILE
    if url.startswith("sqlite://"):
        return Path(url[len("sqlite://") :]).expanduser()
    return None


def open_store(
    url: str = "memory",
    *,
    data_dir: str = "data",
    session_ttl: float | None = None,
    sqlite_reads: SQLiteReads = "loop",
) -> Store:
    """The store a URL names (see the module docstring).

    ``session_ttl`` (seconds since a session's last activity) is the retention policy of
    the durable stores; the memory store keeps sessions as long as the process lives.
    ``sqlite_reads`` is where a SQLite store runs a reply's reads: on the event loop's thread
    (``loop``) or in a thread of their own (``thread``, for a file on a disk slow to read).

    Nothing is connected yet: the first request opens the file or the
    connection, and a store that is unreachable then fails that request with
    a ``StoreError``. Raises ``ConfigError`` for a URL it does not know, or a
    data directory it cannot create.
    """
    from voice_context.errors import ConfigError

    if url in ("memory", "memory://"):
        return MemoryStore()
    path = sqlite_path(url, data_dir=data_dir)
    if path is not None:
        from voice_context.store.sqlite import SQLiteStore

        if path.name in ("", ".", ".."):
            raise ConfigError(f"store URL {url!r} names no file")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the data directory {path.parent}: {exc}") from exc
        return SQLiteStore(path, session_ttl=session_ttl, reads=sqlite_reads)
    if url.startswith(("redis://", "rediss://", "unix://", "redis+cluster://", "rediss+cluster://")):
        try:
            from voice_context.store.redis import RedisStore
        except ImportError as exc:
            raise ConfigError(
                f"a redis store needs the redis package: pip install 'voice-context[redis]' ({exc})"
            ) from exc

        try:
            return RedisStore(url, session_ttl=session_ttl)
        except ValueError as exc:
            raise ConfigError(f"bad redis store URL {url!r}: {exc}") from exc
    raise ConfigError(
        f"unknown store URL {url!r} (memory, sqlite, sqlite:///path.db, redis://host:port/db,"
        " redis+cluster://host:port)"
    )
