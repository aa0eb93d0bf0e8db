"""The shared store: sessions in Redis, for several replicas behind a load balancer.

Key layout, for a session named ``room-1`` and the default prefix ``vc``::

    vc:{room-1}:meta    hash    name, cursor, summary, config (JSON), owner (JSON),
                                fence, compactions, created_at
    vc:{room-1}:turns   list    every turn, in order, each a JSON array
                                [speaker, role, text, at, id]; LLEN is the turn count
    vc:{room-1}:notes   hash    live, pending (JSON arrays of notes)
    vc:{room-1}:lease   string  the compaction lease's holder, with a PX expiry
    vc:{room-1}:rstate  hash    the recall index's docs, length, turns, notes (counts)
    vc:{room-1}:rpost   hash    word -> its postings, "key:tf:length " per doc holding it
    vc:{room-1}:rdf     hash    word -> how many docs hold it
    vc:{room-1}:rnotes  hash    note key -> the note as recall shows it (JSON)
    vc:{room-1}:rvec    hash    doc key -> its vector (base64), when an embedder ran
    vc:{room-1}:landmarks hash  a landmark per turn index (JSON)
    vc:{room-1}:tiers   hash    "tier:start" -> a rolled summary (JSON), one per tier and period

The ``{...}`` hash tag is the session's name, percent-encoded (``{``, ``}``,
``%``, ``:`` and anything outside ``A-Za-z0-9_.-~`` become ``%XX``; the empty
name becomes ``%``), so all of one session's keys share one Redis Cluster
slot and every script below touches a single slot.

Every change is one Lua script, atomic on the server:

- ``create``: writes the meta hash only if the session has none, and answers whether
  it did and the owner the hash holds: of replicas creating one name at once, one
  makes it and the others learn whose it is.
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
- ``renew``: extends the lease (``SET ... PX``) only while the session's fence is
  still the token the caller was granted: no grant since, so nobody else holds it
  (a lease that lapsed meanwhile is taken back).
- ``release``: deletes the lease only if the caller still holds it.
- ``index``: adds turns to the recall index only from the next turn it lacks,
  each once, and only turns the list holds; ``note`` gives a note the next
  negative key. Two replicas indexing the same turns index them once. A word's
  postings stop growing past ``MAX_TERM_DOCS`` docs (a search never reads a word
  that common), so appending to them stays cheap.

Retention: with ``session_ttl`` every one of those scripts (and ``touch``, which the
server runs for the sessions it serves) sets the session's keys to expire
``session_ttl`` seconds from now, together, so Redis itself forgets a session idle
for that long; ``expire`` has nothing to do. ``create`` clears whatever a forgotten
session of the same name left. Without it, keys never expire.

Group commit: turns and notes that arrive while a write is in flight are sent
together as one pipeline (not a transaction: each script stands alone, so a
turn at the wrong index fails alone); on a Cluster the client splits the
pipeline by node. Each is acknowledged once Redis has answered it.

Durability is the Redis server's: run it with ``appendonly yes`` and
``appendfsync always`` for "acknowledged means on disk" (``everysec`` may
lose the last second if the Redis host dies).
"""

from __future__ import annotations

import base64
import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import orjson
import redis.asyncio as aioredis
import redis.exceptions as rex
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from voice_context.core.landmarks import Landmark
from voice_context.core.recalled import MAX_TERM_DOCS, IndexedDoc, Passage, Posting, RecallStats
from voice_context.core.tiers import TierSummary
from voice_context.core.turns import Note, Turn
from voice_context.errors import SessionNotStored, StoreError, TurnConflict
from voice_context.store.base import (
    ChooseTerms,
    Created,
    FoldCommit,
    Picked,
    PickPassages,
    RecallSearch,
    SessionRecord,
    StoredSession,
)
from voice_context.store.common import (
    decode_config,
    decode_landmark,
    decode_notes,
    decode_tier,
    decode_turn,
    encode_config,
    encode_landmark,
    encode_notes,
    encode_tier,
    encode_turn,
    tier_field,
)
from voice_context.store.group import GroupCommit, Pending

PREFIX = "vc"
CLUSTER_SUFFIX = "+cluster"
RETRIES = 3
BACKOFF_BASE = 0.05
BACKOFF_CAP = 1.0
SOCKET_TIMEOUT = 5.0
CONNECT_TIMEOUT = 2.0
MAX_CONNECTIONS = 64
LIST_BATCH = 200
"""Sessions whose owner and counts one pipelined read asks for when listing them."""

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
if redis.call('EXISTS', KEYS[1]) == 1 then return {0, redis.call('HGET', KEYS[1], 'owner')} end
redis.call('DEL', unpack(KEYS, 2))  -- what a forgotten session of this name left
redis.call('HSET', KEYS[1], 'name', ARGV[1], 'cursor', 0, 'summary', '', 'config', ARGV[2],
           'owner', ARGV[3], 'fence', 0, 'compactions', 0, 'created_at', ARGV[4])
return {1, ARGV[3]}
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

_TOUCH = """
return 1
"""


# KEYS: meta, tiers. ARGV: field, body, end_turn, ttl. Keeps the summary when the tier and
# period have none or it covers more turns (never an older roll over a newer one): 1 when
# kept, 0 when not, -1 without the session.
_SAVE_TIER = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local current = redis.call('HGET', KEYS[2], ARGV[1])
if current then
  local covered = cjson.decode(current)['end_turn']
  if tonumber(ARGV[3]) <= tonumber(covered) then return 0 end
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
return 1
"""


def _kept(script: str) -> str:
    """``script`` followed by the retention rule: when the last argument is a ttl in ms
    (not ``''``) and the session exists, every key of the call expires that long from now."""
    return f"""local function body()
{script}
end
local result = body()
local ttl = ARGV[#ARGV]
if ttl ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then
  for _, key in ipairs(KEYS) do redis.call('PEXPIRE', key, ttl) end
end
return result
"""


# KEYS of the recall writes: meta, turns, notes, rstate, rpost, rdf, rnotes, rvec (``SessionKeys.kept``)
_INDEX = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local total = redis.call('LLEN', KEYS[2])
local turns = tonumber(redis.call('HGET', KEYS[4], 'turns') or '0')
local start, n, cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local pos, added, length = 4, 0, 0
for d = 0, n - 1 do
  local len, nt = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  pos = pos + 2
  local key = start + d
  if key == turns + added and key < total then
    for t = 1, nt do
      local term = ARGV[pos]
      if redis.call('HINCRBY', KEYS[6], term, 1) <= cap then
        local held = redis.call('HGET', KEYS[5], term) or ''
        redis.call('HSET', KEYS[5], term, held .. key .. ':' .. ARGV[pos + 1] .. ':' .. len .. ' ')
      end
      pos = pos + 2
    end
    added = added + 1
    length = length + len
  else
    pos = pos + 2 * nt
  end
end
if added > 0 then
  redis.call('HINCRBY', KEYS[4], 'turns', added)
  redis.call('HINCRBY', KEYS[4], 'docs', added)
  redis.call('HINCRBY', KEYS[4], 'length', length)
end
return redis.call('HMGET', KEYS[4], 'docs', 'length', 'turns', 'notes')
"""

_NOTE = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local key = -(tonumber(redis.call('HGET', KEYS[4], 'notes') or '0') + 1)
redis.call('HSET', KEYS[7], key, ARGV[1])
local len, nt, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
for t = 0, nt - 1 do
  local term = ARGV[5 + 2 * t]
  if redis.call('HINCRBY', KEYS[6], term, 1) <= cap then
    local held = redis.call('HGET', KEYS[5], term) or ''
    redis.call('HSET', KEYS[5], term, held .. key .. ':' .. ARGV[6 + 2 * t] .. ':' .. len .. ' ')
  end
end
redis.call('HINCRBY', KEYS[4], 'notes', 1)
redis.call('HINCRBY', KEYS[4], 'docs', 1)
redis.call('HINCRBY', KEYS[4], 'length', len)
return redis.call('HMGET', KEYS[4], 'docs', 'length', 'turns', 'notes')
"""

_VECTORS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
for i = 1, #ARGV - 1, 2 do redis.call('HSET', KEYS[8], ARGV[i], ARGV[i + 1]) end
return 1
"""

# KEYS: meta, rstate, rdf; ARGV: words
_DF = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local stats = redis.call('HMGET', KEYS[2], 'docs', 'length', 'turns', 'notes')
if #ARGV == 0 then return {stats, {}} end
return {stats, redis.call('HMGET', KEYS[3], unpack(ARGV))}
"""

# KEYS: turns, rnotes; ARGV: doc keys
_PASSAGES = """
local out = {}
for i, raw in ipairs(ARGV) do
  local key = tonumber(raw)
  if key >= 0 then
    out[i] = redis.call('LINDEX', KEYS[1], key) or ''
  else
    out[i] = redis.call('HGET', KEYS[2], raw) or ''
  end
end
return out
"""

_RENEW = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'fence') or '0') ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[3])
return 1
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


_APPEND_KEPT = _kept(_APPEND)
_SAVE_NOTES_KEPT = _kept(_SAVE_NOTES)


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

    def _sibling(self, suffix: str) -> str:
        return f"{self.meta.removesuffix('meta')}{suffix}"

    @property
    def recall(self) -> tuple[str, str, str, str, str]:
        """The recall index's keys: rstate, rpost, rdf, rnotes, rvec."""
        return tuple(self._sibling(s) for s in ("rstate", "rpost", "rdf", "rnotes", "rvec"))  # type: ignore[return-value]

    @property
    def landmarks(self) -> str:
        return self._sibling("landmarks")

    @property
    def tiers(self) -> str:
        return self._sibling("tiers")

    @property
    def kept(self) -> tuple[str, ...]:
        """Every key that lives as long as the session (the lease has its own expiry): what a
        write script lists, so that they all expire together."""
        return (self.meta, self.turns, self.notes, *self.rest)

    @property
    def rest(self) -> tuple[str, ...]:
        """The keys beside meta, turns and notes that expire with them: recall's and landmarks."""
        return (*self.recall, self.landmarks, self.tiers)


class RedisStore:
    """Sessions in Redis, shared by every replica that uses the same server and prefix.

    ``retries`` times (with exponential backoff from ``backoff_base`` up to
    ``backoff_cap`` seconds) the client reconnects and retries a command that
    met a dropped connection or a timeout; after that the request fails with
    a retryable ``StoreError``, and the next request tries again from scratch.
    At most ``max_connections`` connections are open to one Redis; a request
    that finds them all busy waits for one (up to ``socket_timeout``).
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
        session_ttl: float | None = None,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        if session_ttl is not None and session_ttl <= 0:
            raise ValueError("session_ttl must be positive (or None: kept until deleted)")
        self.session_ttl = session_ttl
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
        self._redis: aioredis.Redis | AsyncRedisCluster
        if cluster:
            self._redis = AsyncRedisCluster.from_url(url, **options)
        else:
            # many requests at once wait for one of the pool's connections rather than fail
            pool = aioredis.BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=socket_timeout, **options
            )
            self._redis = aioredis.Redis.from_pool(pool)  # owns the pool: closed with it
        self._create = self._redis.register_script(_kept(_CREATE))
        self._load = self._redis.register_script(_LOAD)
        self._save_config = self._redis.register_script(_kept(_SAVE_CONFIG))
        self._commit = self._redis.register_script(_kept(_COMMIT))
        self._touch = self._redis.register_script(_kept(_TOUCH))
        self._read = self._redis.register_script(_READ)
        self._acquire = self._redis.register_script(_ACQUIRE)
        self._renew = self._redis.register_script(_RENEW)
        self._release = self._redis.register_script(_RELEASE)
        self._index = self._redis.register_script(_kept(_INDEX))
        self._save_tier = self._redis.register_script(_kept(_SAVE_TIER))
        self._note = self._redis.register_script(_kept(_NOTE))
        self._vectors = self._redis.register_script(_kept(_VECTORS))
        self._df = self._redis.register_script(_DF)
        self._passages = self._redis.register_script(_PASSAGES)
        deadline = write_deadline(retries, backoff_cap, socket_timeout, connect_timeout)
        self.group: GroupCommit[_Write] = GroupCommit(self._write_group, deadline=deadline)
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
        owner = _owner(name, meta.get("owner"))
        try:
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

    async def create(self, record: SessionRecord) -> Created:
        k = self.keys(record.name)
        config = encode_config(record.config)
        owner = orjson.dumps(record.owner).decode()
        with self._errors("create"):
            made, held = await self._create(
                keys=[k.meta, k.turns, k.notes, *k.rest],
                args=[record.name, config, owner, repr(time.time()), self._ttl],
            )
        return Created(bool(made), _owner(record.name, held))

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        k = self.keys(name)
        keys = (k.meta, k.turns, k.notes, *k.rest)
        args = (index, encode_turn(turn), self._ttl)
        await self.group.submit(_Write(_APPEND_KEPT, name, keys, args, index))

    async def save_notes(
        self, name: str, live: Sequence[Note], pending: Sequence[Note], doc: IndexedDoc | None = None
    ) -> RecallStats | None:
        """Stores the notes; a new note's recall doc is indexed by a script of its own later (``None``)."""
        k = self.keys(name)
        keys = (k.meta, k.notes, k.turns, *k.rest)
        args = (encode_notes(live), encode_notes(pending), self._ttl)
        await self.group.submit(_Write(_SAVE_NOTES_KEPT, name, keys, args, None))
        return None

    async def save_config(self, name: str, config: dict[str, Any]) -> None:
        k = self.keys(name)
        with self._errors("save_config"):
            saved = await self._save_config(
                keys=[k.meta, k.turns, k.notes, *k.rest], args=[encode_config(config), self._ttl]
            )
        if not saved:
            raise SessionNotStored(name)

    async def commit_compaction(self, name: str, fold: FoldCommit) -> bool:
        k = self.keys(name)
        pending = encode_notes(fold.pending_notes)
        token: str | int = "" if fold.fence is None else fold.fence
        args: list[str | int] = [
            fold.expected_cursor,
            fold.new_cursor,
            fold.summary,
            pending,
            token,
            self._ttl,
        ]
        with self._errors("commit_compaction"):
            status = await self._commit(keys=[k.meta, k.notes, k.turns, *k.rest], args=args)
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

    async def renew_lease(self, name: str, holder: str, fence: int, ttl: float) -> bool:
        if ttl <= 0:
            raise ValueError("a lease needs a positive ttl")
        k = self.keys(name)
        with self._errors("renew_lease"):
            renewed = await self._renew(
                keys=[k.meta, k.lease], args=[holder, fence, max(1, round(ttl * 1000))]
            )
        return bool(renewed)

    async def release_lease(self, name: str, holder: str) -> None:
        with self._errors("release_lease"):
            await self._release(keys=[self.keys(name).lease], args=[holder])

    async def touch(self, names: Sequence[str]) -> None:
        if self.session_ttl is None:
            return
        with self._errors("touch"):
            for name in names:  # one script a session: each touches one Cluster slot
                k = self.keys(name)
                await self._touch(keys=[k.meta, k.turns, k.notes, *k.rest], args=[self._ttl])

    async def expire(self) -> list[str]:
        return []  # Redis forgets an idle session's keys by itself

    async def delete(self, name: str) -> None:
        k = self.keys(name)
        with self._errors("delete"):
            await self._redis.delete(*k.all, *k.rest)

    async def list_sessions(self, owner: str | None, limit: int) -> list[StoredSession]:
        # the meta keys by SCAN (every node of a Cluster), their names from the hash tags, then
        # the counts of the first names, a pipelined batch at a time, until ``limit`` are kept
        pattern = _glob_escape(self.prefix) + ":{*}:meta"
        start, end = len(self.prefix) + 2, -len("}:meta")
        out: list[StoredSession] = []
        with self._errors("list_sessions"):
            tags = [key[start:end] async for key in self._redis.scan_iter(match=pattern, count=1000)]
            names = sorted("" if tag == "%" else unquote(tag) for tag in tags)
            for first in range(0, len(names), LIST_BATCH):
                batch = names[first : first + LIST_BATCH]
                pipe = self._redis.pipeline(transaction=False)
                for name in batch:
                    k = self.keys(name)
                    pipe.hmget(k.meta, ["owner", "cursor"])
                    pipe.llen(k.turns)
                replies = await pipe.execute()
                for name, (held, cursor), turns in zip(batch, replies[::2], replies[1::2], strict=True):
                    if cursor is None:
                        continue  # forgotten between the scan and the read
                    found = _owner(name, held)
                    if found == owner:
                        out.append(StoredSession(name, found, int(turns), int(cursor)))
                        if len(out) >= limit:
                            return out
        return out

    # -- the recall index ------------------------------------------------------

    async def index_turns(self, name: str, start: int, docs: Sequence[IndexedDoc]) -> RecallStats:
        k = self.keys(name)
        args: list[str | int] = [start, len(docs), MAX_TERM_DOCS]
        for doc in docs:
            args += [doc.length, len(doc.terms)]
            for term, tf in doc.terms:
                args += [term, tf]
        with self._errors("index_turns"):
            reply = await self._index(keys=list(k.kept), args=[*args, self._ttl])
        if reply == -1:
            raise SessionNotStored(name)
        return _stats(reply)

    async def index_note(self, name: str, doc: IndexedDoc) -> RecallStats:
        k = self.keys(name)
        p = doc.passage
        args: list[str | int] = [orjson.dumps([p.at, p.speaker, p.text]).decode(), doc.length, len(doc.terms)]
        args.append(MAX_TERM_DOCS)
        for term, tf in doc.terms:
            args += [term, tf]
        with self._errors("index_note"):
            reply = await self._note(keys=list(k.kept), args=[*args, self._ttl])
        if reply == -1:
            raise SessionNotStored(name)
        return _stats(reply)

    async def recall_postings(
        self, name: str, terms: Sequence[str], choose: ChooseTerms | None = None
    ) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
        k = self.keys(name)
        rstate, rpost, rdf, _, _ = k.recall
        wanted = list(dict.fromkeys(terms))
        with self._errors("recall_postings"):
            reply = await self._df(keys=[k.meta, rstate, rdf], args=wanted)
        if reply == -1:
            raise SessionNotStored(name)
        stats = _stats(reply[0])
        df = {t: int(n) for t, n in zip(wanted, reply[1], strict=True) if n}
        read = choose(list(df), lambda t: df.get(t, 0), stats) if choose else list(df)
        out: dict[str, list[Posting]] = {}
        if read:
            with self._errors("recall_postings"):
                raw = await self._redis.hmget(rpost, read)
            for term, value in zip(read, raw, strict=True):
                if value:
                    out[term] = [_posting(item) for item in str(value).split()]
        return stats, df, out

    async def recall_passages(self, name: str, keys: Sequence[int]) -> dict[int, Passage]:
        k = self.keys(name)
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        with self._errors("recall_passages"):
            reply = await self._passages(keys=[k.turns, k.recall[3]], args=wanted)
        out: dict[int, Passage] = {}
        for key, raw in zip(wanted, reply, strict=True):
            if not raw:
                continue
            if key >= 0:
                turn = decode_turn(raw)
                out[key] = Passage("turn", key, turn.at, turn.speaker, turn.text, turn.role)
            else:
                at, speaker, text = orjson.loads(raw)
                out[key] = Passage("note", None, float(at), str(speaker), str(text))
        return out

    async def recall_search(
        self, name: str, terms: Sequence[str], choose: ChooseTerms, pick: PickPassages[Picked]
    ) -> RecallSearch[Picked]:
        """Not one snapshot here: the postings and then the passages, read as
        :meth:`recall_postings` and :meth:`recall_passages` read them (up to three round trips).
        A write may land between them; the index and the turns only grow, so a key the postings
        name keeps its passage (unless the session is deleted meanwhile)."""
        stats, df, postings = await self.recall_postings(name, terms, choose)
        picked, keys = pick(stats, df, postings)
        return RecallSearch(stats, df, postings, picked, await self.recall_passages(name, keys))

    async def save_vectors(self, name: str, vectors: dict[int, bytes]) -> None:
        if not vectors:
            return
        args: list[str | int] = []
        for key, vector in vectors.items():
            args += [key, base64.b64encode(vector).decode()]
        with self._errors("save_vectors"):
            saved = await self._vectors(keys=list(self.keys(name).kept), args=[*args, self._ttl])
        if saved == -1:
            raise SessionNotStored(name)

    async def load_vectors(self, name: str) -> dict[int, bytes]:
        with self._errors("load_vectors"):
            raw = await self._redis.hgetall(self.keys(name).recall[4])
        return {int(key): base64.b64decode(value) for key, value in raw.items()}

    def landmarks_key(self, name: str) -> str:
        return self.keys(name).landmarks

    async def save_landmark(self, name: str, landmark: Landmark) -> None:
        with self._errors("save_landmark"):
            if not await self._redis.exists(self.keys(name).meta):
                raise SessionNotStored(name)
            await self._redis.hset(self.landmarks_key(name), str(landmark.index), encode_landmark(landmark))
        await self.touch([name])  # with a session_ttl, the landmarks expire with the session

    async def delete_landmark(self, name: str, index: int) -> bool:
        with self._errors("delete_landmark"):
            return bool(await self._redis.hdel(self.landmarks_key(name), str(index)))

    async def load_landmarks(self, name: str) -> tuple[Landmark, ...]:
        with self._errors("load_landmarks"):
            raw: dict[Any, Any] = await self._redis.hgetall(self.landmarks_key(name))
        found = sorted((int(k), v) for k, v in raw.items())
        return tuple(decode_landmark(v) for _, v in found)

    async def save_tier(self, name: str, summary: TierSummary) -> bool:
        k = self.keys(name)
        with self._errors("save_tier"):
            kept = await self._save_tier(
                keys=[k.meta, k.tiers],
                args=[tier_field(summary), encode_tier(summary), summary.end_turn, self._ttl],
            )
        if kept == -1:
            raise SessionNotStored(name)
        return bool(kept)

    async def load_tiers(self, name: str) -> tuple[TierSummary, ...]:
        with self._errors("load_tiers"):
            raw: dict[Any, Any] = await self._redis.hgetall(self.keys(name).tiers)
        found = [decode_tier(value) for value in raw.values()]
        return tuple(sorted(found, key=lambda s: s.key))

    async def open(self) -> None:
        return None  # no schema; the client connects at its first command (and again after a restart)

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            await self._redis.aclose()

    # -- internals -------------------------------------------------------------

    @property
    def _ttl(self) -> str | int:
        """The last argument of every write script: the keys' ttl in ms, or ``''`` for none."""
        return "" if self.session_ttl is None else max(1, round(self.session_ttl * 1000))

    async def _write_group(self, batch: list[Pending[_Write]]) -> None:
        """One pipeline for the whole group (on a Cluster, one per node, split by the client).

        Each write is its own script, so one that fails (a turn at the wrong
        index, a session deleted meanwhile) fails alone. A connection that drops
        makes the client send the pipeline again: every write in it is safe to
        repeat (the identical turn at its index is taken as a retry).
        """
        with self._errors("append"):
            self.operations += len(batch) - 1  # ``_errors`` counted one
            pipe = self._redis.pipeline(transaction=False)
            for item in batch:
                op = item.op
                pipe.eval(op.script, len(op.keys), *op.keys, *op.args)
            replies = await pipe.execute(raise_on_error=False)
        for item, reply in zip(batch, replies, strict=True):
            op = item.op
            if isinstance(reply, rex.RedisError):
                self.errors += 1
                item.error = translate(reply, "append")
            elif isinstance(reply, BaseException):
                item.error = StoreError(f"redis store append: {reply}", retryable=False)
            elif op.index is None:
                if not reply:
                    item.error = SessionNotStored(op.name)
            else:
                status, stored = reply
                if status == -1:
                    item.error = SessionNotStored(op.name)
                elif status < 0:
                    item.error = TurnConflict(op.name, op.index, int(stored), differs=status == -2)

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


@dataclass(frozen=True, slots=True)
class _Write:
    """A turn (``index`` set) or the notes of a session, for the next group."""

    script: str
    name: str
    keys: tuple[str, ...]
    args: tuple[str | int, ...]
    index: int | None


def write_deadline(retries: int, backoff_cap: float, socket_timeout: float, connect_timeout: float) -> float:
    """The longest (seconds) a group's shielded write may take: no shorter than the client gives
    a pipeline before it fails it itself (the wait for a pooled connection, then each of its
    ``retries + 1`` tries' connect, send and read, with the backoffs between them), so the
    deadline never cuts a pipeline Redis would still answer."""
    tries = retries + 1
    return socket_timeout + tries * (connect_timeout + 2 * socket_timeout) + retries * backoff_cap


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


def _stats(reply: Sequence[Any]) -> RecallStats:
    return RecallStats(*(int(value or 0) for value in reply))


def _posting(item: str) -> Posting:
    key, tf, length = item.split(":")
    return int(key), int(tf), int(length)


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    return {flat[i]: flat[i + 1] for i in range(0, len(flat) - 1, 2)}


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a SCAN pattern."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _owner(name: str, raw: str | None) -> str | None:
    """A session's owner as the meta hash keeps it (JSON: a string, or null for none)."""
    try:
        owner = orjson.loads(raw or "null")
        if owner is not None and not isinstance(owner, str):
            raise ValueError("owner is not a string")
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise StoreError(f"redis store: session {name!r} is unreadable: {exc}", retryable=False) from exc
    return owner
