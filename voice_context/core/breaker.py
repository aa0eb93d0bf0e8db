"""When to try reaching a server again after it did not answer: a circuit breaker.

::

    closed ──a try fails──▶ open ──backoff passed: one call tries──▶ probing
      ▲                      ▲                                          │
      │                      └──────────────the probe fails─────────────┤
      └──────────────────────────the probe reaches it───────────────────┘

Closed, every call may try. After a failed try (refused, or not answered in time: a server
that takes the connection and never answers is as down as one that refuses it) the circuit
is open: every call is refused at once (no try, no wait) until a backoff has passed. The
backoff doubles with each failure in a row, from ``base`` up to ``cap``, less a random share
of it of up to ``jitter`` (so that the bots of one server do not all come back in step). Then one call
probes while the others are still refused; a probe that reaches the server closes the
circuit, one that fails opens it for the next, longer, backoff.

Pure and synchronous: the caller passes the time (any monotonic clock) and does the trying.
"""

from __future__ import annotations

import math
import random
from typing import Literal

State = Literal["closed", "open", "probing"]

#: Past this many failures in a row the backoff stops doubling (it is at ``cap`` long before).
MAX_DOUBLINGS = 32


class CircuitBreaker:
    """Whether a call may try to reach a server now; see the module docstring.

    ``wait(now)`` says how long a call must wait before trying (``0.0``: try now);
    ``attempt(now)`` marks a try begun, ``failed(now)`` / ``succeeded(now)`` its end.
    Raises ``ValueError`` for a ``base`` or ``cap`` that is not positive, a ``cap``
    below ``base``, or a ``jitter`` outside 0..1.
    """

    def __init__(
        self, *, base: float = 0.05, cap: float = 2.0, jitter: float = 0.5, rng: random.Random | None = None
    ) -> None:
        if base <= 0 or cap < base:
            raise ValueError(f"the backoff needs 0 < base <= cap, got base={base:g} cap={cap:g}")
        if not 0 <= jitter < 1:
            raise ValueError(f"jitter must be in 0..1 (a share of the backoff), got {jitter:g}")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self._rng = rng or random.Random()
        self.failures = 0
        """Failed tries in a row (0 while the circuit is closed)."""
        self.retry_at = -math.inf
        self.opened_at: float | None = None
        self.probing = False

    def __repr__(self) -> str:
        if self.state == "closed":
            return "<CircuitBreaker closed>"
        return f"<CircuitBreaker {self.state} failures={self.failures} retry_at={self.retry_at:.3f}>"

    @property
    def state(self) -> State:
        if self.probing:
            return "probing"
        return "open" if self.failures else "closed"

    def wait(self, now: float) -> float:
        """Seconds before a call may try: ``0.0`` when it may now, ``inf`` while another call probes."""
        if self.probing:
            return math.inf
        if not self.failures:
            return 0.0
        return max(0.0, self.retry_at - now)

    def attempt(self, now: float) -> None:
        """A call tries now (its caller saw ``wait`` come to 0, or slept it out); with the
        circuit open, that call is the one probe."""
        self.probing = self.failures > 0

    def failed(self, now: float) -> bool:
        """The try did not reach the server: the circuit is open for the next backoff.
        ``True`` when this failure opened it (it was closed)."""
        opened = not self.failures
        if opened:
            self.opened_at = now
        self.probing = False
        self.failures += 1
        self.retry_at = now + self.backoff(self.failures)
        return opened

    def succeeded(self, now: float) -> float | None:
        """The try reached the server: the circuit is closed. Returns how long it had been
        open, in seconds (``None`` when it was closed)."""
        was_open = self.opened_at
        self.failures = 0
        self.probing = False
        self.retry_at = -math.inf
        self.opened_at = None
        return None if was_open is None else now - was_open

    def backoff(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row: doubled each time, capped, jittered."""
        full = min(self.cap, self.base * 2.0 ** min(failures - 1, MAX_DOUBLINGS))
        return full * (1.0 - self.jitter * self._rng.random())


__all__ = ["CircuitBreaker", "State"]
