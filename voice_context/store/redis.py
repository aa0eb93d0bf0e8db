"""The shared store: sessions in Redis, for several replicas behind a load balancer.

Key layout, for a session named ``room-1`` and the default prefix ``vc``::

    vc:{room-1}:meta    hash    name, cursor, summary, config (JSON), owner (JSON),
                                fence, compactions, created_at
    vc:{room-1}:turns   list    every turn, in order, each a JSON array
                                [speaker, role, text, at, id]; LLEN is the turn count
    vc:{room-1}:notes   hash    live, pending (JSON arrays of notes)
    vc:{room-1}:lease   string  the compaction lease's holder, with a PX expiry
    vc:{room-1}:landmarks hash  a landmark per turn index (JSON)

The ``{...}`` hash tag is the session's name, percent-encoded (``{``, ``}``,
``%``, ``:`` and anything outside ``A-Za-z0-9_.-~`` become ``%XX``; the empty
name becomes ``%``), so all of one session's keys share one Redis Cluster
slot and every script below touches a single slot.

Every change is one Lua script, atomic on the server:

- ``append``: stores the turn only if its index equals the list's length. If
  the index is below the length and the *identical* turn is already there,
  it succeeds without storing anything: that is a retry of a write whose
  reply was lost (the client retries by itself when a connection drops).
  Any other index raises :class:`TurnConflict`.
- ``commit``: moves cursor and summary (and replaces the pending notes) only
  if the cursor is still the expected one and, when a fence is given, the
  fence equals the session's fence counter; a retried commit whose effect
  is already there reports success.
- ``acquire``: grants the lease when it is free, expired or already the
  caller's (``SET ... PX``), and returns ``HINCRBY meta fence 1``: every
  grant gets a larger token, so a holder that stalled past its expiry can
  never land a commit once someone else has been granted the lease.
- ``release``: deletes the lease only if the caller still holds it.

Durability is the Redis server's: run it with ``appendonly yes`` and
``appendfsync always`` for "acknowledged means on disk" (``everysec`` may
lose the last second if the Redis host dies).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import orjson
import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from voice_context.core.landmarks import Landmark
from voice_context.core.turns import Note, Turn
from voice_context.errors import SessionNotStored, StoreError, TurnConflict
from voice_context.store.base import SessionRecord
from voice_context.store.common import (
    decode_config,
    decode_landmark,
    decode_notes,
    decode_turn,
    encode_config,
    encode_landmark,
    encode_notes,
    encode_turn,
)

PREFIX = "vc"
CLUSTER_SUFFIX = "+cluster"
RETRIES = 3
BACKOFF_BASE = 0.05
BACKOFF_CAP = 1.0
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0

# Error replies that say "not now" rather than "never".
_TRANSIENT_REPLIES = (
    "LOADING",
    "BUSY",
    "MISCONF",
    "OOM",
    "READONLY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "NOREPLICAS",
    "MOVED",
    "ASK",
)

_CREATE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'cursor', 0, 'summary', '', 'config', ARGV[2],
           'owner', ARGV[3], 'fence', 0, 'compactions', 0, 'created_at', ARGV[4])
return 1
"""

_LOAD = """
local meta = redis.call('HGETALL', KEYS[1])
if #meta == 0 then return false end
local cursor = tonumber(redis.call('HGET', KEYS[1], 'cursor'))
local total = redis.call('LLEN', KEYS[3])
local turns = redis.call('LRANGE', KEYS[3], cursor, -1)
return {meta, redis.call('HGETALL', KEYS[2]), total, turns}
"""

_APPEND = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local n = redis.call('LLEN', KEYS[2])
local i = tonumber(ARGV[1])
if i == n then
  redis.call('RPUSH', KEYS[2], ARGV[2])
  return {1, n + 1}
end
if i >= 0 and i < n then
  if redis.call('LINDEX', KEYS[2], i) == ARGV[2] then return {0, n} end
  return {-2, n}
end
return {-3, n}
"""

_SAVE_NOTES = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[2], 'live', ARGV[1], 'pending', ARGV[2])
return 1
"""

_SAVE_CONFIG = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'config', ARGV[1])
return 1
"""

_COMMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local cursor = tonumber(redis.call('HGET', KEYS[1], 'cursor'))
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
local expected = tonumber(ARGV[1])
local new = tonumber(ARGV[2])
if ARGV[5] ~= '' and tonumber(ARGV[5]) ~= fence then return 0 end
if cursor ~= expected then
  if cursor == new and redis.call('HGET', KEYS[1], 'summary') == ARGV[3]
     and (redis.call('HGET', KEYS[2], 'pending') or '[]') == ARGV[4] then
    return 2
  end
  return 0
end
if new > redis.call('LLEN', KEYS[3]) then return 0 end
redis.call('HSET', KEYS[1], 'cursor', new, 'summary', ARGV[3])
redis.call('HINCRBY', KEYS[1], 'compactions', 1)
redis.call('HSET', KEYS[2], 'pending', ARGV[4])
return 1
"""

_READ = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local first, last = tonumber(ARGV[1]), tonumber(ARGV[2])
if last < first then return {} end
return redis.call('LRANGE', KEYS[2], first, last)
"""

_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
return redis.call('HINCRBY', KEYS[1], 'fence', 1)
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


def session_tag(name: str) -> str:
    """The hash tag for a session: its name, percent-encoded so it holds no braces."""
    return quote(name, safe="") or "%"


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one session; all share the hash tag ``{<encoded name>}``."""

    meta: str
    turns: str
    notes: str
    lease: str

    @property
    def all(self) -> tuple[str, str, str, str]:
        return (self.meta, self.turns, self.notes, self.lease)


class RedisStore:
    """Sessions in Redis, shared by every replica that uses the same server and prefix.

    ``retries`` times (with exponential backoff from ``backoff_base`` up to
    ``backoff_cap`` seconds) the client reconnects and retries a command that
    met a dropped connection or a timeout; after that the request fails with
    a retryable ``StoreError``, and the next request tries again from scratch.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = PREFIX,
        cluster: bool = False,
        retries: int = RETRIES,
        backoff_base: float = BACKOFF_BASE,
        backoff_cap: float = BACKOFF_CAP,
        socket_timeout: float = SOCKET_TIMEOUT,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        if not prefix or any(c in prefix for c in "{}"):
            raise ValueError(f"a key prefix must be non-empty and hold no braces, got {prefix!r}")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        parts = urlsplit(url)
        if parts.scheme.endswith(CLUSTER_SUFFIX):
            cluster = True
            url = urlunsplit(parts._replace(scheme=parts.scheme.removesuffix(CLUSTER_SUFFIX)))
        self.prefix = prefix
        self.cluster = cluster
        self._where = (
            parts.path if parts.scheme == "unix" else f"{parts.hostname}:{parts.port or 6379}{parts.path}"
        )
        options: dict[str, Any] = {
            "decode_responses": True,
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
            "retry": Retry(ExponentialBackoff(cap=backoff_cap, base=backoff_base), retries),
            "retry_on_error": [rex.ConnectionError, rex.TimeoutError],
        }
        self._redis: aioredis.Redis | AsyncRedisCluster = (
            AsyncRedisCluster.from_url(url, **options) if cluster else aioredis.Redis.from_url(url, **options)
        )
        self._create = self._redis.register_script(_CREATE)
        self._load = self._redis.register_script(_LOAD)
        self._append = self._redis.register_script(_APPEND)
        self._save_notes = self._redis.register_script(_SAVE_NOTES)
        self._save_config = self._redis.register_script(_SAVE_CONFIG)
        self._commit = self._redis.register_script(_COMMIT)
        self._read = self._redis.register_script(_READ)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._release = self._redis.register_script(_RELEASE)
        self._closed = False
        self.operations = 0
        self.errors = 0

    def __repr__(self) -> str:
        kind = "cluster " if self.cluster else ""
        state = "closed" if self._closed else "open"
        return (
            f"<RedisStore {kind}{self._where} prefix={self.prefix!r} {state} "
            f"operations={self.operations} errors={self.errors}>"
        )

    @property
    def client(self) -> aioredis.Redis | AsyncRedisCluster:
        """The underlying client (for inspection in tests and tools)."""
        return self._redis

    def keys(self, name: str) -> SessionKeys:
        base = f"{self.prefix}:{{{session_tag(name)}}}"
        return SessionKeys(f"{base}:meta", f"{base}:turns", f"{base}:notes", f"{base}:lease")

    # -- the Store protocol ----------------------------------------------------

    async def load(self, name: str) -> SessionRecord | None:
        k = self.keys(name)
        with self._errors("load"):
            reply = await self._load(keys=[k.meta, k.notes, k.turns])
        if reply is None:
            return None
        meta, notes = _pairs(reply[0]), _pairs(reply[1])
        try:
            owner = orjson.loads(meta.get("owner") or "null")
            if owner is not None and not isinstance(owner, str):
                raise ValueError("owner is not a string")
            return SessionRecord(
                name,
                cursor=int(meta["cursor"]),
                summary=meta.get("summary", ""),
                total_turns=int(reply[2]),
                turns=tuple(decode_turn(raw) for raw in reply[3]),
                live_notes=decode_notes(notes.get("live")),
                pending_notes=decode_notes(notes.get("pending")),
                config=decode_config(meta.get("config")),
                owner=owner,
                compactions=int(meta.get("compactions", 0)),
            )
        except (KeyError, ValueError, orjson.JSONDecodeError) as exc:
            raise StoreError(f"redis store: session {name!r} is unreadable: {exc}", retryable=False) from exc

    async def create(self, record: SessionRecord) -> None:
        k = self.keys(record.name)
        config = encode_config(record.config)
        owner = orjson.dumps(record.owner).decode()
        with self._errors("create"):
            await self._create(keys=[k.meta], args=[record.name, config, owner, repr(time.time())])

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        k = self.keys(name)
        with self._errors("append_turn"):
            status, stored = await self._append(keys=[k.meta, k.turns], args=[index, encode_turn(turn)])
        if status == -1:
            raise SessionNotStored(name)
        if status < 0:
            raise TurnConflict(name, index, int(stored), differs=status == -2)

    async def save_notes(self, name: str, live: Sequence[Note], pending: Sequence[Note]) -> None:
        k = self.keys(name)
        with self._errors("save_notes"):
            saved = await self._save_notes(
                keys=[k.meta, k.notes], args=[encode_notes(live), encode_notes(pending)]
            )
        if not saved:
            raise SessionNotStored(name)

    async def save_config(self, name: str, config: dict[str, Any]) -> None:
        k = self.keys(name)
        with self._errors("save_config"):
            saved = await self._save_config(keys=[k.meta], args=[encode_config(config)])
        if not saved:
            raise SessionNotStored(name)

    async def commit_compaction(
        self,
        name: str,
        *,
        expected_cursor: int,
        new_cursor: int,
        summary: str,
        pending_notes: Sequence[Note],
        fence: int | None = None,
    ) -> bool:
        if new_cursor < expected_cursor:
            raise ValueError(f"the cursor only moves forward ({expected_cursor} -> {new_cursor})")
        k = self.keys(name)
        pending = encode_notes(pending_notes)
        token: str | int = "" if fence is None else fence
        args: list[str | int] = [expected_cursor, new_cursor, summary, pending, token]
        with self._errors("commit_compaction"):
            status = await self._commit(keys=[k.meta, k.notes, k.turns], args=args)
        if status == -1:
            raise SessionNotStored(name)
        return bool(status > 0)

    async def read_turns(self, name: str, start: int, end: int) -> list[Turn]:
        k = self.keys(name)
        first = max(start, 0)
        with self._errors("read_turns"):
            reply = await self._read(keys=[k.meta, k.turns], args=[first, end - 1])
        if reply is None:
            raise SessionNotStored(name)
        return [decode_turn(raw) for raw in reply]

    async def acquire_lease(self, name: str, holder: str, ttl: float) -> int | None:
        if ttl <= 0:
            raise ValueError("a lease needs a positive ttl")
        k = self.keys(name)
        with self._errors("acquire_lease"):
            token = await self._acquire(keys=[k.meta, k.lease], args=[holder, max(1, round(ttl * 1000))])
        if token == -1:
            raise SessionNotStored(name)
        return int(token) if token > 0 else None

    async def release_lease(self, name: str, holder: str) -> None:
        with self._errors("release_lease"):
            await self._release(keys=[self.keys(name).lease], args=[holder])

    async def delete(self, name: str) -> None:
        with self._errors("delete"):
            await self._redis.delete(*self.keys(name).all, self.landmarks_key(name))

    def landmarks_key(self, name: str) -> str:
        return f"{self.prefix}:{{{session_tag(name)}}}:landmarks"

    async def save_landmark(self, name: str, landmark: Landmark) -> None:
        with self._errors("save_landmark"):
            if not await self._redis.exists(self.keys(name).meta):
                raise SessionNotStored(name)
            await self._redis.hset(self.landmarks_key(name), str(landmark.index), encode_landmark(landmark))

    async def delete_landmark(self, name: str, index: int) -> bool:
        with self._errors("delete_landmark"):
            return bool(await self._redis.hdel(self.landmarks_key(name), str(index)))

    async def load_landmarks(self, name: str) -> tuple[Landmark, ...]:
        with self._errors("load_landmarks"):
            raw: dict[Any, Any] = await self._redis.hgetall(self.landmarks_key(name))
        found = sorted((int(k), v) for k, v in raw.items())
        return tuple(decode_landmark(v) for _, v in found)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._redis.aclose()

    # -- internals -------------------------------------------------------------

    @contextlib.contextmanager
    def _errors(self, where: str) -> Iterator[None]:
        if self._closed:
            raise StoreError("the redis store is closed", retryable=False)
        self.operations += 1
        try:
            yield
        except rex.RedisError as exc:
            self.errors += 1
            raise translate(exc, where) from exc


def translate(exc: rex.RedisError, where: str) -> StoreError:
    """A ``StoreError`` for a ``redis`` exception, retryable when trying later may help."""
    if isinstance(exc, rex.AuthenticationError | rex.AuthorizationError):
        retryable = False
    elif isinstance(exc, rex.ConnectionError | rex.TimeoutError):
        retryable = True  # includes BusyLoadingError: the server is still reading its data
    elif isinstance(exc, rex.ResponseError):
        retryable = str(exc).split(" ", 1)[0].upper() in _TRANSIENT_REPLIES or isinstance(
            exc, rex.ReadOnlyError | rex.OutOfMemoryError
        )
    else:
        retryable = False
    return StoreError(f"redis store {where}: {type(exc).__name__}: {exc}", retryable=retryable)


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat) - 1, 2)}
