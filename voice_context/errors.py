"""Every error voice-context raises on purpose.

::

    VoiceContextError
    ├── ConfigError            a configuration value is out of range or unknown (a ``ValueError``)
    ├── ProtocolError          a wire message cannot be accepted (carries ``code``)
    │   └── DecodeError        a client frame is not a valid message (carries ``id``, ``session``)
    ├── UnknownSession         no open session by that name (a ``KeyError``)
    ├── SessionClosed          the session is ending; nothing more is accepted
    ├── RateLimited            too many turns per second for one session
    ├── ContextOverflow        not even what must stay fits the model's limit (carries ``needed``, ``limit``)
    ├── SummarizerError        a summarizer call failed (carries ``retryable``, ``kind``)
    ├── StoreError             the store could not read or write (carries ``retryable``)
    │   ├── TurnConflict       another turn is stored at that index, or it would leave a gap
    │   └── SessionNotStored   the store holds no session by that name (a ``KeyError``)
    └── ClientError            the Python client: an ``error`` reply, or it could not ask (``code``)
        ├── ConnectionLost     the connection dropped with the request unanswered
        └── RequestTimeout     no reply within ``request_timeout`` (a ``TimeoutError``)

The pure core raises only ``ConfigError`` and ``ValueError`` for arguments
that break its contract. Third-party exceptions (``openai``, ``redis``,
``sqlite3``) are translated into ``SummarizerError`` and ``StoreError`` where
they are caught, at the edge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


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


class ContextOverflow(VoiceContextError):
    """Emergency compaction cannot fit the context under the model's limit: what must stay
    (the base instructions and the safety region) already takes ``needed`` tokens."""

    def __init__(self, message: str, *, needed: int, limit: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.limit = limit


class SummarizerError(VoiceContextError):
    """A summarizer call failed. ``retryable`` says whether trying later may help, and
    ``retry_after`` (seconds) how long the provider asked us to wait, when it said."""

    def __init__(
        self, message: str, *, retryable: bool = True, kind: str = "error", retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.kind = kind
        self.retry_after = retry_after


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


class DecodeError(ProtocolError):
    """A client frame that is not a valid message. ``id`` and ``session`` are set when readable."""

    def __init__(
        self, code: str, message: str, *, id: str | int | None = None, session: str | None = None
    ) -> None:
        super().__init__(code, message, id=id)
        self.session = session


class TurnConflict(StoreError, ValueError):
    """The store holds a different turn at that index, or the index would leave a gap.

    Never retryable: the caller's idea of the transcript is behind (or ahead of)
    the store's. Appending the *identical* turn at an index the store already
    holds is not a conflict: a durable store treats it as a retry of a write
    whose answer was lost, and succeeds without storing it twice.
    """

    def __init__(self, name: str, index: int, stored: int, *, differs: bool = False) -> None:
        if differs:
            message = f"session {name!r}: a different turn is already stored at index {index}"
        else:
            message = f"session {name!r}: turn index {index} out of order (the store has {stored})"
        super().__init__(message, retryable=False)
        self.name = name
        self.index = index
        self.stored = stored


class ClientError(VoiceContextError):
    """The server answered with an ``error`` (``code`` is its code), or the client could not ask."""

    def __init__(self, code: str, message: str, *, reply: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.reply = dict(reply) if reply is not None else None


class ConnectionLost(ClientError):
    """The connection dropped with this request unanswered, or could not be made again."""

    def __init__(self, message: str) -> None:
        super().__init__("connection_lost", message)


class RequestTimeout(ClientError, TimeoutError):
    """No reply came within the client's ``request_timeout``; the request may have been applied."""

    def __init__(self, message: str) -> None:
        super().__init__("timeout", message)
