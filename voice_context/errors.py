"""Every error voice-context raises on purpose.

::

    VoiceContextError
    ├── ConfigError            a configuration value is out of range or unknown
    ├── ProtocolError          a wire message cannot be accepted (carries ``code``)
    ├── UnknownSession         no open session by that name
    ├── SessionClosed          the session is ending; nothing more is accepted
    ├── RateLimited            too many turns per second for one session
    ├── SummarizerError        a summarizer call failed (carries ``retryable``)
    └── StoreError             the store could not read or write (carries ``retryable``)
        └── SessionNotStored   the store holds no session by that name (also a ``KeyError``)

The pure core raises only ``ConfigError`` and ``ValueError`` for arguments
that break its contract. Third-party exceptions (``openai``, ``redis``,
``sqlite3``) are translated into ``SummarizerError`` and ``StoreError`` where
they are caught, at the edge.
"""

from __future__ import annotations


class VoiceContextError(Exception):
    """The root of everything voice-context raises on purpose."""


class ConfigError(VoiceContextError, ValueError):
    """A configuration value is out of range, of the wrong type, or unknown."""


class ProtocolError(VoiceContextError):
    """A wire message cannot be accepted.

    ``code`` is one of the documented protocol error codes (``bad_request``,
    ``unknown_type``, ``unknown_session``, ``too_large``, ``unauthorized``,
    ``rate_limited``, ``internal``).
    """

    def __init__(self, code: str, message: str, *, id: str | int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id


class UnknownSession(VoiceContextError, KeyError):
    """No open session by that name (or not one this caller may touch)."""

    def __str__(self) -> str:
        return f"unknown session {self.args[0]!r}" if self.args else "unknown session"


class SessionClosed(VoiceContextError):
    """The session is ending or has ended; it accepts nothing more."""


class RateLimited(VoiceContextError):
    """Too many turns per second were appended to one session."""


class SummarizerError(VoiceContextError):
    """A summarizer call failed. ``retryable`` says whether trying later may help."""

    def __init__(self, message: str, *, retryable: bool = True, kind: str = "error") -> None:
        super().__init__(message)
        self.retryable = retryable
        self.kind = kind


class StoreError(VoiceContextError):
    """The store could not read or write. The request that hit it failed; state is intact."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class SessionNotStored(StoreError, KeyError):
    """The store holds no session by that name: never created, or deleted meanwhile.

    Never retryable. It is a ``KeyError`` too, as a missing key in a mapping is.
    """

    def __init__(self, name: str) -> None:
        super().__init__(f"the store holds no session {name!r}", retryable=False)
        self.name = name

    def __str__(self) -> str:
        return f"the store holds no session {self.name!r}"
