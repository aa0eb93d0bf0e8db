"""Where sessions are kept: the ``Store`` protocol and its backends."""

from __future__ import annotations

from voice_context.store.base import SessionRecord, Store
from voice_context.store.memory import MemoryStore

__all__ = ["MemoryStore", "SessionRecord", "Store", "open_store"]


def open_store(url: str = "memory", *, data_dir: str = "data") -> Store:
    """The store a URL names: ``memory`` (nothing persists), more backends as they land.

    Raises ``ConfigError`` for a URL it does not know.
    """
    from voice_context.errors import ConfigError

    if url in ("memory", "memory://"):
        return MemoryStore()
    raise ConfigError(f"unknown store URL {url!r}")
