"""voice-context: long-session memory for realtime voice bots.

The public API::

    from voice_context import SessionManager, DeterministicSummarizer, Turn

    async with SessionManager(DeterministicSummarizer()) as manager:
        await manager.open("room-1")
        await manager.append_turn("room-1", Turn("Alice", "user", "Let's raid at nine.", at=0.0))
        context = await manager.context("room-1", "instructions", budget_chars=5200)

The pure core (``voice_context.core``) can be driven without an event loop;
the websocket service, client, stores and replay tools build on it.
"""

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

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    # The OpenAI client is imported on first use: the CLI and the deterministic
    # default start without paying for it.
    if name == "OpenAISummarizer":
        from voice_context.summarizers.openai_compat import OpenAISummarizer

        return OpenAISummarizer
    raise AttributeError(f"module 'voice_context' has no attribute {name!r}")


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
