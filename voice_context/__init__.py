"""voice-context: long-session memory for realtime voice bots.

The public API::

    from voice_context import SessionManager, DeterministicSummarizer, Turn

    async with SessionManager(DeterministicSummarizer()) as manager:
        await manager.open("room-1")
        await manager.append_turn("room-1", Turn("Alice", "user", "Let's raid at nine.", at=0.0))
        context = await manager.context("room-1", "instructions", budget_chars=5200)

The pure core (``voice_context.core``) can be driven without an event loop;
the websocket service, client, stores and replay tools build on it.

Each public name is imported from its module on first use (PEP 562): ``import voice_context``
loads nothing else, so a process that needs only a part of the package (``voice-context
serve``, a test, the core alone) does not pay for the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from voice_context.core.budget import Context, build_context, estimate_tokens
    from voice_context.core.config import SessionConfig
    from voice_context.core.session import Session, SessionStats
    from voice_context.core.turns import Note, Turn
    from voice_context.core.window import SkipReason
    from voice_context.errors import (
        ClientError,
        ConfigError,
        ConnectionLost,
        ContextOverflow,
        DecodeError,
        ProtocolError,
        RateLimited,
        RequestTimeout,
        SessionClosed,
        SessionNotStored,
        StoreError,
        SummarizerError,
        TurnConflict,
        UnknownSession,
        VoiceContextError,
    )
    from voice_context.manager import CompactionEvent, Opened, SessionManager
    from voice_context.summarizers.base import Summarizer, SummaryRequest
    from voice_context.summarizers.deterministic import DeterministicSummarizer
    from voice_context.summarizers.openai_compat import OpenAISummarizer

__version__ = "0.1.0"

_PUBLIC: dict[str, tuple[str, ...]] = {
    "voice_context.core.budget": ("Context", "build_context", "estimate_tokens"),
    "voice_context.core.config": ("SessionConfig",),
    "voice_context.core.session": ("Session", "SessionStats"),
    "voice_context.core.turns": ("Note", "Turn"),
    "voice_context.core.window": ("SkipReason",),
    "voice_context.errors": (
        "ClientError",
        "ConfigError",
        "ConnectionLost",
        "ContextOverflow",
        "DecodeError",
        "ProtocolError",
        "RateLimited",
        "RequestTimeout",
        "SessionClosed",
        "SessionNotStored",
        "StoreError",
        "SummarizerError",
        "TurnConflict",
        "UnknownSession",
        "VoiceContextError",
    ),
    "voice_context.manager": ("CompactionEvent", "Opened", "SessionManager"),
    "voice_context.summarizers.base": ("Summarizer", "SummaryRequest"),
    "voice_context.summarizers.deterministic": ("DeterministicSummarizer",),
    "voice_context.summarizers.openai_compat": ("OpenAISummarizer",),
}
"""Each public name, by the module it comes from."""
_HOMES = {name: module for module, names in _PUBLIC.items() for name in names}


if not TYPE_CHECKING:  # to a type checker the names are the imports above, and no others

    def __getattr__(name: str) -> object:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module 'voice_context' has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value  # found here from now on, without this call
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_HOMES})


__all__ = [
    "ClientError",
    "CompactionEvent",
    "ConfigError",
    "ConnectionLost",
    "Context",
    "ContextOverflow",
    "DecodeError",
    "DeterministicSummarizer",
    "Note",
    "OpenAISummarizer",
    "Opened",
    "ProtocolError",
    "RateLimited",
    "RequestTimeout",
    "Session",
    "SessionClosed",
    "SessionConfig",
    "SessionManager",
    "SessionNotStored",
    "SessionStats",
    "SkipReason",
    "StoreError",
    "Summarizer",
    "SummarizerError",
    "SummaryRequest",
    "Turn",
    "TurnConflict",
    "UnknownSession",
    "VoiceContextError",
    "__version__",
    "build_context",
    "estimate_tokens",
]
