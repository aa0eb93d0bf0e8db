"""What the server does with each request: a table of handlers, one a message type, and the
one place where what they raise becomes a protocol ``error``.

A handler gets the connection and the typed message and returns an :class:`Answer`: the
typed reply (encoded by :mod:`voice_context.codec`) and whether the message goes into the
session's recording. Anything it raises is mapped by :func:`error_reply`; a request a
handler refuses itself raises :class:`Refused`.

A connection is anything a :class:`Peer` is: a websocket's
(:class:`~voice_context.server.connection.Connection`), or one in the process
(:class:`~voice_context.server.local.LocalConnection`, which the replay feeds recordings
through), so every request, served or replayed, is answered by the one table here.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple, Protocol

import anyio
import structlog

from voice_context import codec
from voice_context.codec import (
    BAD_REQUEST,
    INTERNAL,
    RATE_LIMITED,
    TOO_LARGE,
    UNKNOWN_SESSION,
    ClientMessage,
    Closed,
    ContextGet,
    ContextOverflow,
    ContextReply,
    Deleted,
    Emergency,
    ErrorReply,
    HandoffReply,
    LandmarkFound,
    LandmarkPin,
    LandmarkUnpin,
    NoteAppend,
    NoteStored,
    Ping,
    Pinned,
    PinnedLandmark,
    Pong,
    Reply,
    SessionClose,
    SessionDelete,
    SessionHandoff,
    SessionOpen,
    SessionOpened,
    SessionState,
    SessionStateGet,
    TurnAppend,
    TurnStored,
    Unpinned,
)
from voice_context.config import ServerSettings
from voice_context.core.config import check_client_overrides
from voice_context.core.session import Session
from voice_context.core.turns import Turn
from voice_context.errors import ConfigError, RateLimited, SessionClosed, StoreError, UnknownSession
from voice_context.errors import ContextOverflow as Overflowed
from voice_context.logs import get_logger
from voice_context.manager import CompactionEvent, SessionManager
from voice_context.server import inspector
from voice_context.server.connection import SHUTDOWN_GRACE
from voice_context.server.limits import Limits, SessionLimits
from voice_context.server.metrics import Metrics
from voice_context.server.recording import Recorder

log = get_logger("voice_context.server")

DUPLICATE_LOOKBACK = 32


def find_duplicate(session: Session, turn: Turn, lookback: int = DUPLICATE_LOOKBACK) -> int | None:
    """The index of a recent turn identical to ``turn`` (same ``id`` and content), if any.

    Only turns that carry an ``id`` are ever duplicates: a bot that retries a
    turn with the same ``id`` gets the first index back instead of a second copy.
    """
    if turn.id is None:
        return None
    held = session.verbatim_turns
    first = session.total_turns - len(held)
    turn_id = turn.id
    for offset in range(len(held) - 1, max(-1, len(held) - 1 - lookback), -1):
        recent = held[offset]
        if recent.id == turn_id and recent == turn:  # (the id first: a whole turn compares every field)
            return first + offset
    return None


class Peer(Protocol):
    """What the handlers need of a connection: whose it is (``owner``, the token's; ``None``
    without tokens), the sessions it holds, and where its replies and the events of its
    sessions go."""

    owner: str | None
    sessions: set[str]

    def push(self, event: CompactionEvent) -> None:
        """A manager listener for the sessions it holds: never waits."""

    async def reply(self, frame: str) -> None:
        """Send one reply frame, before any event the request caused."""


class Refused(Exception):
    """A request refused by the server (not the manager): becomes an ``error`` reply."""

    def __init__(
        self, code: str, message: str, *, limit: str | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.limit = limit
        self.retry_after = retry_after


class Answer(NamedTuple):
    """A handler's reply, and whether its message is recorded."""

    reply: Reply
    record: bool


def error_reply(exc: Exception, message: ClientMessage) -> ErrorReply:
    """The ``error`` that answers ``message`` when answering it raised ``exc``: the one place
    where what the server, the manager and the store raise becomes a protocol error code.
    Call it in the ``except`` block (a bug is logged with its traceback)."""
    at: dict[str, Any] = {"id": message.id, "session": message.session}
    match exc:
        case Refused():
            return ErrorReply(exc.code, exc.message, **at, limit=exc.limit, retry_after=exc.retry_after)
        case UnknownSession():
            text = f"no open session {message.session!r} on this connection: send session.open first"
            return ErrorReply(UNKNOWN_SESSION, text, **at)
        case ConfigError():
            return ErrorReply(BAD_REQUEST, str(exc), **at)
        case RateLimited():
            return ErrorReply(RATE_LIMITED, str(exc), **at)
        case Overflowed():
            return ErrorReply(TOO_LARGE, str(exc), **at, limit="limit_tokens", needed=exc.needed)
        case SessionClosed():
            return ErrorReply(INTERNAL, f"session unavailable: {exc}", **at, retryable=True)
        case StoreError():
            log.warning("voice_context_store_failed", type=message.type, error=str(exc)[:300])
            return ErrorReply(INTERNAL, f"the store failed: {exc}", **at, retryable=exc.retryable)
        case _:
            log.exception("voice_context_request_failed", type=message.type)
            return ErrorReply(INTERNAL, "internal error", **at, retryable=False)


@dataclass(eq=False, kw_only=True)
class Handlers:
    """Answers the requests of every connection of one server, and keeps which connections
    hold which sessions (the last to let a session go closes it)."""

    manager: SessionManager
    settings: ServerSettings
    limits: Limits
    metrics: Metrics
    journal: inspector.Journal
    recorder: Recorder | None
    stopping: Callable[[], bool]
    #: session settings put on top of what every ``session.open`` asks for, and not checked as
    #: a client's are (they are the operator's): a replay's ``--set`` values; none in a server
    overrides: Mapping[str, Any] = field(default_factory=dict)
    #: the connections holding each session
    holders: dict[str, set[Peer]] = field(default_factory=dict)
    #: sessions closed here so far (what the collector may reclaim)
    released: int = 0

    def __repr__(self) -> str:
        return f"<Handlers sessions_held={len(self.holders)} released={self.released}>"

    # -- the connection's side -----------------------------------------------------------

    async def dispatch(self, conn: Peer, message: ClientMessage, sent: dict[str, Any]) -> None:
        """Answer one request: its reply (recorded first when it is one to record) or an ``error``."""
        # bound and reset by hand: `bound_contextvars`' generator costs three times the binding
        bound = structlog.contextvars.bind_contextvars(session=message.session)
        try:
            try:
                if not isinstance(message, Ping | SessionOpen) and message.session not in conn.sessions:
                    raise UnknownSession(message.session)
                answer = await HANDLERS[type(message)](self, conn, message)
            except Exception as exc:
                await self.reject(conn, error_reply(exc, message))
                return
            if answer.record and self.recorder is not None and message.session is not None:
                await self.recorder.record(message.session, sent)
            await conn.reply(codec.encode_reply(answer.reply))
        finally:
            structlog.contextvars.reset_contextvars(**bound)

    async def reject(self, conn: Peer, error: ErrorReply) -> None:
        """Answer with an ``error``, counted and logged."""
        self.metrics.errors.labels(code=error.code).inc()
        log.info("voice_context_request_rejected", code=error.code, message=error.message[:200], id=error.id)
        await conn.reply(codec.encode_reply(error))

    async def release(self, conn: Peer) -> None:
        """A connection has ended: let go of each session it holds (each within a deadline,
        shielded, as a cancelled connection still owes the manager its closes)."""
        for name in list(conn.sessions):
            deadline = self.settings.shutdown_timeout + SHUTDOWN_GRACE
            with structlog.contextvars.bound_contextvars(session=name):
                with anyio.move_on_after(deadline, shield=True) as waited:
                    await self._detach(conn, name)
                if waited.cancelled_caught:
                    log.warning("voice_context_session_release_timed_out", timeout=deadline)

    # -- the handlers --------------------------------------------------------------------

    async def ping(self, conn: Peer, message: Ping) -> Answer:
        return Answer(Pong(message.id), False)

    async def open(self, conn: Peer, message: SessionOpen) -> Answer:
        name = message.session
        limit = self.settings.max_sessions_per_connection
        if name not in conn.sessions and len(conn.sessions) >= limit:
            raise Refused(
                RATE_LIMITED,
                f"too many sessions on this connection (limit {limit}): close one first",
                limit="sessions_per_connection",
            )
        config = dict(message.config) if message.config is not None else None
        if config:
            check_client_overrides(config, self.manager.config)
        if self.overrides:
            config = {**(config or {}), **self.overrides}
        opened = await self.manager.open(name, config, owner=conn.owner)
        # nothing below awaits, and the manager's open returns only while the session is
        # live: the attach cannot half-happen (listener first, the one step that can raise)
        if name not in conn.sessions:
            self.manager.add_listener(conn.push, session=name)
            conn.sessions.add(name)
            self.holders.setdefault(name, set()).add(conn)
            self.limits.opened(name, self.holders)
        log.info("voice_context_session_opened", resumed=opened.resumed, turns=opened.stats.turns)
        return Answer(SessionOpened.of(name, opened.resumed, opened.stats, message.id), True)

    async def append_turn(self, conn: Peer, message: TurnAppend) -> Answer:
        name = message.session
        limits = self.limits.session(name)
        async with limits.lock:
            session = self.manager.session(name, owner=conn.owner)
            duplicate = find_duplicate(session, message.turn)
            if duplicate is not None:
                return Answer(TurnStored(name, duplicate, message.id, duplicate=True), False)
            self._take(conn, limits)
            index = await self.manager.append_turn(name, message.turn, owner=conn.owner)
            found = (
                session.landmark(index) if self.manager.session(name, owner=conn.owner) is session else None
            )
        self.metrics.turns.inc()
        landmark = LandmarkFound.of(found) if found is not None else None
        return Answer(TurnStored(name, index, message.id, landmark=landmark), True)

    async def append_note(self, conn: Peer, message: NoteAppend) -> Answer:
        name = message.session
        limits = self.limits.session(name)
        async with limits.lock:
            self._take(conn, limits)
            changed = await self.manager.append_note(name, message.note, owner=conn.owner)
        self.metrics.notes.inc()
        return Answer(NoteStored(name, changed, message.id), True)

    async def context(self, conn: Peer, message: ContextGet) -> Answer:
        name = message.session
        started = time.perf_counter()
        ctx = await self.manager.context(
            name,
            message.format,
            budget_chars=message.budget_chars,
            budget_tokens=message.budget_tokens,
            base_instructions=message.base_instructions,
            facts=message.facts,
            query=message.query,
            owner=conn.owner,
        )
        in_flight = self.manager.state(name, owner=conn.owner).in_flight is not None
        self.metrics.context_latency.observe(time.perf_counter() - started)
        self.journal.context(name, ctx)
        return Answer(ContextReply.of(name, ctx, in_flight, message.id), True)

    async def overflow(self, conn: Peer, message: ContextOverflow) -> Answer:
        name = message.session
        ctx, applied = await self.manager.overflow(
            name,
            message.format,
            limit_tokens=message.limit_tokens,
            budget_chars=message.budget_chars,
            base_instructions=message.base_instructions,
            facts=message.facts,
            query=message.query,
            owner=conn.owner,
        )
        in_flight = self.manager.state(name, owner=conn.owner).in_flight is not None
        self.journal.context(name, ctx)
        emergency = Emergency.after(applied, ctx.cursor)
        return Answer(ContextReply.of(name, ctx, in_flight, message.id, emergency), True)

    async def handoff(self, conn: Peer, message: SessionHandoff) -> Answer:
        name = message.session
        handoff = await self.manager.handoff(
            name,
            limit_chars=message.limit_chars,
            base_instructions=message.base_instructions,
            facts=message.facts,
            query=message.query,
            last_turns=message.last_turns,
            owner=conn.owner,
        )
        return Answer(HandoffReply(name, handoff, message.id), True)

    async def state(self, conn: Peer, message: SessionStateGet) -> Answer:
        name = message.session
        return Answer(SessionState.of(name, self.manager.state(name, owner=conn.owner), message.id), True)

    async def pin(self, conn: Peer, message: LandmarkPin) -> Answer:
        name = message.session
        try:
            landmark = await self.manager.pin(
                name,
                message.index,
                kind=message.kind,
                reason=message.reason,
                source="llm" if message.source == "llm" else "manual",
                owner=conn.owner,
            )
        except IndexError as exc:
            raise Refused(BAD_REQUEST, str(exc)) from None
        return Answer(Pinned(name, PinnedLandmark.of(landmark), message.id), True)

    async def unpin(self, conn: Peer, message: LandmarkUnpin) -> Answer:
        name = message.session
        removed = await self.manager.unpin(name, message.index, owner=conn.owner)
        return Answer(Unpinned(name, message.index, removed, message.id), True)

    async def delete(self, conn: Peer, message: SessionDelete) -> Answer:
        """Forget a session everywhere: every connection holding it lets it go (it gets no
        more events), the manager and the store forget it, and so does its recording."""
        name = message.session
        self.manager.session(name, owner=conn.owner)  # UnknownSession unless this owner's
        for holder in self.holders.pop(name, set()):
            holder.sessions.discard(name)
            self.manager.remove_listener(holder.push, session=name)
        conn.sessions.discard(name)
        await self.manager.delete(name, owner=conn.owner)
        self.journal.forget(name)
        if self.recorder is not None:
            await self.recorder.delete(name)
        log.info("voice_context_session_deleted")
        return Answer(Deleted(name, message.id), False)

    async def close(self, conn: Peer, message: SessionClose) -> Answer:
        await self._detach(conn, message.session)
        return Answer(Closed(message.session, message.id), True)

    # -- helpers -------------------------------------------------------------------------

    def _take(self, conn: Peer, limits: SessionLimits) -> None:
        """Spend a token of the session's and of its owner's for a turn or a note, or refuse."""
        wait = self.limits.take(conn.owner, limits)
        if wait is not None:
            raise Refused(RATE_LIMITED, wait.message, limit=wait.limit, retry_after=wait.retry_after)

    async def _detach(self, conn: Peer, name: str) -> None:
        """This connection is done with a session; the last one to leave closes it here."""
        conn.sessions.discard(name)
        self.manager.remove_listener(conn.push, session=name)
        holders = self.holders.get(name)
        if holders is not None:
            holders.discard(conn)
            if holders:
                return
            del self.holders[name]
        # the session's rate limit outlives this close: a close and an open must not refill it
        if self.stopping():
            return  # the manager lands compactions in flight as it closes
        try:
            await self.manager.close(name, owner=conn.owner)
        except UnknownSession:
            pass
        else:
            self.released += 1
            log.info("voice_context_session_closed")


Handler = Callable[[Handlers, Peer, Any], Awaitable[Answer]]

#: The handler of each message type.
HANDLERS: Final[Mapping[type[ClientMessage], Handler]] = {
    Ping: Handlers.ping,
    SessionOpen: Handlers.open,
    TurnAppend: Handlers.append_turn,
    NoteAppend: Handlers.append_note,
    ContextGet: Handlers.context,
    ContextOverflow: Handlers.overflow,
    SessionHandoff: Handlers.handoff,
    SessionStateGet: Handlers.state,
    LandmarkPin: Handlers.pin,
    LandmarkUnpin: Handlers.unpin,
    SessionDelete: Handlers.delete,
    SessionClose: Handlers.close,
}
