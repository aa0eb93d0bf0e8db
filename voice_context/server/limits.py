"""Rate limits: turns and notes per second for each session and for each token's sessions
together, and how many connections a token holds. Pure decisions, fed the time as data."""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import anyio

from voice_context.config import ServerSettings

#: Past this many remembered rate limits, those of idle sessions whose buckets are full are forgotten.
LIMITS_KEPT = 4096


class TokenBucket:
    """Turns per second for one session: ``rate`` tokens a second, at most ``burst`` saved.

    ``take(now)`` spends a token and returns 0.0, or returns how many seconds
    until one is available (and spends nothing). ``now`` is any monotonic time.
    """

    def __init__(self, rate: float, burst: int, now: float) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.rate = rate
        self.burst = float(burst)
        self.tokens = float(burst)
        self.updated = now

    def wait(self, now: float) -> float:
        """Seconds until a token is available at ``now`` (0.0 if one is), spending nothing."""
        tokens = min(self.burst, self.tokens + max(0.0, now - self.updated) * self.rate)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) / self.rate

    def full(self, now: float) -> bool:
        """Whether the bucket has refilled to ``burst`` by ``now``: then it remembers nothing."""
        return self.tokens + max(0.0, now - self.updated) * self.rate >= self.burst

    def take(self, now: float) -> float:
        elapsed = max(0.0, now - self.updated)
        self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
        self.updated = max(self.updated, now)
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass(eq=False)
class SessionLimits:
    """One session's bucket, and the lock its turns and notes are taken under (a duplicate
    turn is found, and a token spent, in the same step as the append)."""

    bucket: TokenBucket
    lock: anyio.Lock = field(default_factory=lambda: anyio.Lock(fast_acquire=True))  # (see Live.lock)


@dataclass(eq=False)
class OwnerLimits:
    """What one token spends across all its connections and sessions on this replica."""

    bucket: TokenBucket
    connections: int = 0


class Wait(NamedTuple):
    """A turn or a note refused for now: which limit, said for people, and when to try again."""

    limit: str
    message: str
    retry_after: float


class Limits:
    """The rate limits of every session and every token's owner on this server.

    A session's limit outlives its close (a close and an open must not refill it); once
    many are kept, those of sessions nobody holds whose buckets have refilled are forgotten
    (forgetting them changes nothing). Limits that are not ``metered`` refuse nothing: those
    of the handlers a replay feeds in-process (what they are fed, a server took already).
    """

    def __init__(
        self, settings: ServerSettings, monotonic: Callable[[], float], *, metered: bool = True
    ) -> None:
        self.settings = settings
        self.metered = metered
        self._monotonic = monotonic
        self._sessions: dict[str, SessionLimits] = {}
        #: one per token that connected (tokens are configured, so these are few)
        self._owners: dict[str, OwnerLimits] = {}

    def __repr__(self) -> str:
        return f"<Limits sessions={len(self._sessions)} owners={len(self._owners)}>"

    def session(self, name: str) -> SessionLimits:
        """The limits of a session opened on this server (``KeyError`` for one never opened)."""
        return self._sessions[name]

    def opened(self, name: str, held: Container[str]) -> None:
        """A session is held here: make its limits, unless it has them (``held``: the sessions
        some connection holds, whose limits are never forgotten)."""
        if name in self._sessions:
            return
        if len(self._sessions) >= LIMITS_KEPT:
            now = self._monotonic()
            for old, limits in list(self._sessions.items()):
                if old not in held and limits.bucket.full(now):
                    del self._sessions[old]
        cfg = self.settings
        self._sessions[name] = SessionLimits(
            TokenBucket(cfg.turns_per_second, cfg.turn_burst, self._monotonic())
        )

    def owner(self, owner: str | None) -> OwnerLimits | None:
        """The limits of a token's owner (made at its first connection); ``None`` without tokens."""
        if owner is None:
            return None
        owned = self._owners.get(owner)
        if owned is None:
            cfg = self.settings
            bucket = TokenBucket(cfg.owner_turns_per_second, cfg.owner_turn_burst, self._monotonic())
            owned = self._owners[owner] = OwnerLimits(bucket)
        return owned

    @contextmanager
    def connection(self, owner: str | None) -> Iterator[None]:
        """Count a connection of ``owner`` while it lasts."""
        owned = self.owner(owner)
        if owned is not None:
            owned.connections += 1
        try:
            yield
        finally:
            if owned is not None:
                owned.connections -= 1

    def connections_of(self, owner: str | None) -> int:
        """How many connections a token's owner holds here."""
        owned = self._owners.get(owner) if owner is not None else None
        return owned.connections if owned is not None else 0

    def take(self, owner: str | None, limits: SessionLimits) -> Wait | None:
        """Spend one of the session's tokens and one of its owner's for a turn or a note, or
        say why not (spending neither)."""
        if not self.metered:
            return None
        now = self._monotonic()
        cfg = self.settings
        owned = self.owner(owner)
        wait = limits.bucket.wait(now)
        if wait > 0:
            return Wait(
                "turns_per_second",
                f"too many turns and notes for this session (limit {cfg.turns_per_second:g} per second)",
                _retry_after(wait),
            )
        wait = owned.bucket.wait(now) if owned is not None else 0.0
        if wait > 0:
            return Wait(
                "owner_turns_per_second",
                "too many turns and notes for this token's sessions together"
                f" (limit {cfg.owner_turns_per_second:g} per second)",
                _retry_after(wait),
            )
        limits.bucket.take(now)
        if owned is not None:
            owned.bucket.take(now)
        return None


def _retry_after(wait: float) -> float:
    """A wait in seconds as ``retry_after`` says it: rounded up to the millisecond."""
    return math.ceil(wait * 1000) / 1000
