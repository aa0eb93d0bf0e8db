"""Protocol v1 on the wire: JSON text frames in, typed messages out, and back.

This module is the only place where wire JSON becomes typed values and where
replies become JSON again. It is pure: no I/O, no clock.

- :func:`decode` turns one client frame into a frozen message
  (:class:`SessionOpen`, :class:`TurnAppend`, :class:`NoteAppend`,
  :class:`ContextGet`, :class:`SessionStateGet`, :class:`SessionClose`,
  :class:`Ping`). Whatever the input, it returns a message or raises
  :class:`DecodeError` (a :class:`ProtocolError`) with code ``bad_request``,
  ``unknown_type`` or ``too_large``, carrying the message's ``id`` and
  ``session`` when those could be read. Every integer field takes a JSON integer
  within its range in :data:`INTEGER_FIELDS` (turn indexes and ids up to
  2^53 - 1, budgets up to :data:`MAX_BUDGET`), so nothing out of range reaches
  a session or a store.
  Each message type is read by its own function in one table.
- :func:`encode` is its inverse, for clients and for recordings:
  ``decode(encode(m)) == m``.
- Every message the server sends is a frozen value made of what the wire carries
  and nothing more: the replies (:class:`SessionOpened`, :class:`TurnStored`,
  :class:`ContextReply`, :class:`ErrorReply`, ...) and the pushed events
  (:class:`Compacted`, :class:`CompactionFailure`). The server makes them from
  the manager's values (``ContextReply.of(session, context, ...)``), so this
  module needs nothing of the manager. Each one's JSON shape is written here
  once: :func:`encode_reply` makes a reply the frame the server sends, and
  :func:`encode_event` a pushed event.
- :func:`decode_reply` is their inverse: one server frame back as its typed
  message (``decode_reply(encode_reply(r)) == r``), or :class:`DecodeError`
  (``unknown_type`` for a type no server sends, ``bad_request`` for a field that
  is missing or mistyped). The bot client reads every frame through it
  (:func:`parse_reply` also hands back the JSON object as the server sent it).

Unknown fields are ignored, so that clients and servers can add fields freely.
See ``docs/protocol.md`` for the contract.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Final, NamedTuple, cast

import orjson

from voice_context.core.budget import FORMATS, Format
from voice_context.core.handoff import LAST_TURNS, Handoff, OpenQuestion
from voice_context.core.session import NotesChanged
from voice_context.core.tiers import parse_zone
from voice_context.core.turns import ROLES, Note, Role, Turn
from voice_context.errors import ConfigError, DecodeError

if TYPE_CHECKING:
    from voice_context.core.budget import Context, Message
    from voice_context.core.landmarks import Landmark
    from voice_context.core.recalled import Recalled
    from voice_context.core.session import Applied, SessionStats

PROTOCOL_VERSION: Final = 1
MAX_SESSION_CHARS: Final = 200
MAX_ID_CHARS: Final = 200
MAX_SPEAKER_CHARS: Final = 200
MAX_KIND_CHARS: Final = 40
MAX_REASON_CHARS: Final = 200
DEFAULT_MAX_TEXT_CHARS: Final = 8000
#: Times are unix seconds from 0 up to (not including) 1e11, the year 5138: a larger
#: value is a mistake, most often milliseconds (JavaScript's ``Date.now()``, about 1.7e12).
MAX_AT: Final = 1e11
#: Objects and arrays inside a message nest at most this deep (unknown fields included):
#: a recording must be able to write any accepted message back as JSON.
MAX_DEPTH: Final = 32
#: The largest integer every reader and store keeps exact: a JSON reader that holds numbers
#: as doubles (JavaScript's ``Number.MAX_SAFE_INTEGER``, Redis's Lua scripts) loses the next
#: ones, and SQLite's INTEGER (signed 64-bit) holds it. Turn indexes and integer ids stay in it.
MAX_SAFE_INTEGER: Final = 2**53 - 1
#: The most characters or tokens a budget or a limit may name: far more than any model's
#: context window holds (and a budget larger than the session is no budget at all).
MAX_BUDGET: Final = 1_000_000_000

# error codes (the contract: never renamed)
BAD_REQUEST: Final = "bad_request"
UNKNOWN_TYPE: Final = "unknown_type"
UNKNOWN_SESSION: Final = "unknown_session"
TOO_LARGE: Final = "too_large"
UNAUTHORIZED: Final = "unauthorized"
RATE_LIMITED: Final = "rate_limited"
INTERNAL: Final = "internal"
ERROR_CODES: Final = frozenset(
    {BAD_REQUEST, UNKNOWN_TYPE, UNKNOWN_SESSION, TOO_LARGE, UNAUTHORIZED, RATE_LIMITED, INTERNAL}
)

MessageId = str | int | None


# -- client messages -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionOpen:
    session: str
    config: Mapping[str, Any] | None = None
    id: MessageId = None
    type: str = field(default="session.open", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class TurnAppend:
    session: str
    turn: Turn
    id: MessageId = None
    type: str = field(default="turn.append", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class NoteAppend:
    session: str
    note: Note
    id: MessageId = None
    type: str = field(default="note.append", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class ContextGet:
    session: str
    format: Format = "messages"
    budget_chars: int | None = None
    base_instructions: str = ""
    facts: tuple[str, ...] = ()
    id: MessageId = None
    query: str | None = None
    budget_tokens: int | None = None
    type: str = field(default="context.get", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class SessionStateGet:
    session: str
    id: MessageId = None
    type: str = field(default="session.state", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class SessionClose:
    session: str
    id: MessageId = None
    type: str = field(default="session.close", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class SessionDelete:
    """Forget the session: its turns, summary, notes and recording, on every connection."""

    session: str
    id: MessageId = None
    type: str = field(default="session.delete", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class ContextOverflow:
    """The bot's model refused its context as too long: compact at once, answer a context that fits."""

    session: str
    limit_tokens: int | None = None
    format: Format = "messages"
    budget_chars: int | None = None
    base_instructions: str = ""
    facts: tuple[str, ...] = ()
    query: str | None = None
    id: MessageId = None
    type: str = field(default="context.overflow", init=False, repr=False)


MAX_LAST_TURNS: Final = 50
"""The most turns a ``session.handoff`` may ask for as items."""


@dataclass(frozen=True, slots=True)
class SessionHandoff:
    """A fresh provider session takes over: the context as instructions within ``limit_chars``,
    the newest ``last_turns`` turns and the questions still open."""

    session: str
    limit_chars: int | None = None
    base_instructions: str = ""
    facts: tuple[str, ...] = ()
    query: str | None = None
    last_turns: int = LAST_TURNS
    id: MessageId = None
    type: str = field(default="session.handoff", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class LandmarkPin:
    """Pin the turn at ``index`` as a landmark: shown whole in every later context, never folded."""

    session: str
    index: int
    kind: str = "other"
    reason: str = ""
    source: str = "manual"
    id: MessageId = None
    type: str = field(default="landmark.pin", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class LandmarkUnpin:
    """Unpin the landmark at ``index``."""

    session: str
    index: int
    id: MessageId = None
    type: str = field(default="landmark.unpin", init=False, repr=False)


@dataclass(frozen=True, slots=True)
class Ping:
    """Answered with ``pong``; needs no session. Not recorded."""

    id: MessageId = None
    session: str | None = None
    type: str = field(default="ping", init=False, repr=False)


ClientMessage = (
    SessionOpen
    | TurnAppend
    | NoteAppend
    | ContextGet
    | SessionStateGet
    | SessionClose
    | SessionDelete
    | LandmarkPin
    | LandmarkUnpin
    | ContextOverflow
    | SessionHandoff
    | Ping
)
SessionMessage = (
    SessionOpen
    | TurnAppend
    | NoteAppend
    | ContextGet
    | SessionStateGet
    | SessionClose
    | SessionDelete
    | LandmarkPin
    | LandmarkUnpin
    | ContextOverflow
    | SessionHandoff
)

CLIENT_TYPES: Final = (
    "session.open",
    "turn.append",
    "note.append",
    "context.get",
    "session.state",
    "session.close",
    "session.delete",
    "landmark.pin",
    "landmark.unpin",
    "context.overflow",
    "session.handoff",
    "ping",
)


class IntRange(NamedTuple):
    """The integers a field takes, both ends included."""

    low: int
    high: int


ID_RANGE: Final = IntRange(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
INDEX_RANGE: Final = IntRange(0, MAX_SAFE_INTEGER)
BUDGET_RANGE: Final = IntRange(0, MAX_BUDGET)

#: The integer fields of each client message besides ``id``, and the integers each takes.
_INTEGERS: Final[Mapping[str, Mapping[str, IntRange]]] = {
    "context.get": {"budget_chars": BUDGET_RANGE, "budget_tokens": BUDGET_RANGE},
    "context.overflow": {"limit_tokens": BUDGET_RANGE, "budget_chars": BUDGET_RANGE},
    "session.handoff": {"limit_chars": BUDGET_RANGE, "last_turns": IntRange(0, MAX_LAST_TURNS)},
    "landmark.pin": {"index": INDEX_RANGE},
    "landmark.unpin": {"index": INDEX_RANGE},
}
#: Every integer field of every client message, by message type, and the integers it takes;
#: anything else there (a float such as ``1.0``, ``true``, a number out of range) is a
#: ``bad_request``, answered before the message reaches a session or a store. Integers are
#: read only through this table (the session ``config`` is checked by the session's own rules).
INTEGER_FIELDS: Final[Mapping[str, Mapping[str, IntRange]]] = MappingProxyType(
    {kind: MappingProxyType({"id": ID_RANGE, **_INTEGERS.get(kind, {})}) for kind in CLIENT_TYPES}
)


# -- decoding --------------------------------------------------------------------


def _loads(frame: str | bytes | bytearray | memoryview) -> object:
    try:
        if isinstance(frame, memoryview):
            frame = bytes(frame)
        return orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(BAD_REQUEST, f"not valid JSON: {exc}") from None
    except (TypeError, ValueError, RecursionError):  # pragma: no cover - orjson raises JSONDecodeError
        raise DecodeError(BAD_REQUEST, "not valid JSON") from None


def _nested_deeper(value: object, limit: int) -> bool:
    """Whether objects and arrays in ``value`` nest more than ``limit`` levels deep."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, dict | list))
    return False


def _read_id(obj: Mapping[str, object]) -> MessageId:
    raw = obj.get("id")
    if raw is None:
        return None
    if isinstance(raw, str):
        if len(raw) > MAX_ID_CHARS:
            raise DecodeError(BAD_REQUEST, f"id must be at most {MAX_ID_CHARS} characters")
        return raw
    low, high = ID_RANGE
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise DecodeError(BAD_REQUEST, f"id must be a string or an integer from {low} to {high}")
    return raw


def valid_session_name(name: object) -> bool:
    """A session name: a non-empty string of at most 200 printable characters."""
    return isinstance(name, str) and 0 < len(name) <= MAX_SESSION_CHARS and name.isprintable()


@dataclass(frozen=True, slots=True)
class _Reader:
    """Reads typed fields out of one ``kind`` message object, raising ``DecodeError`` with context."""

    obj: Mapping[str, object]
    kind: str
    id: MessageId
    session: str | None
    max_text_chars: int

    def fail(self, message: str, code: str = BAD_REQUEST) -> DecodeError:
        return DecodeError(code, message, id=self.id, session=self.session)

    def framed(self, kind: str, **fields: object) -> _Reader:
        """The same message read as a ``kind`` message, with ``fields`` set (a message that
        frames a context is read as ``context.get`` reads one)."""
        return _Reader({**self.obj, **fields}, kind, self.id, self.session, self.max_text_chars)

    def session_name(self) -> str:
        """The message's ``session``: required, and a valid name."""
        if self.obj.get("session") is None:
            raise self.fail("session is required")
        if self.session is None:
            raise self.fail("session must be a non-empty string of at most 200 printable characters")
        return self.session

    def string(
        self,
        obj: Mapping[str, object],
        key: str,
        where: str,
        *,
        required: bool = True,
        non_empty: bool = True,
        max_chars: int | None = None,
        too_large: bool = False,
    ) -> str | None:
        raw = obj.get(key)
        if raw is None:
            if required:
                raise self.fail(f"{where}{key} is required")
            return None
        if not isinstance(raw, str):
            raise self.fail(f"{where}{key} must be a string")
        if non_empty and not raw.strip():
            raise self.fail(f"{where}{key} must not be empty")
        if max_chars is not None and len(raw) > max_chars:
            code = TOO_LARGE if too_large else BAD_REQUEST
            raise self.fail(f"{where}{key} is {len(raw)} characters, over the limit of {max_chars}", code)
        return raw

    def integer(self, key: str, *, required: bool = False) -> int | None:
        """The integer field ``key``, within its range in :data:`INTEGER_FIELDS` for this kind
        of message (``None`` when it is absent and not required)."""
        low, high = INTEGER_FIELDS[self.kind][key]
        raw = self.obj.get(key)
        if raw is None:
            if required:
                raise self.fail(f"{key} is required")
            return None
        if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
            raise self.fail(f"{key} must be an integer from {low} to {high}")
        return raw

    def time(self, obj: Mapping[str, object], key: str, where: str) -> float:
        raw = obj.get(key)
        if raw is None:
            raise self.fail(f"{where}{key} is required (unix seconds)")
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise self.fail(f"{where}{key} must be a number (unix seconds)")
        value = float(raw)
        if not math.isfinite(value):  # pragma: no cover - JSON has no infinities
            raise self.fail(f"{where}{key} must be finite")
        if not 0 <= value < MAX_AT:
            if MAX_AT * 10 <= value < MAX_AT * 1000:
                raise self.fail(
                    f"{where}{key} is {raw!r}: it looks like milliseconds; send unix seconds"
                    f" ({value / 1000:.3f})"
                )
            raise self.fail(f"{where}{key} is {raw!r}: unix seconds must be between 0 and {MAX_AT:.0e}")
        return value

    def object(self, key: str, *, required: bool = True) -> Mapping[str, object] | None:
        raw = self.obj.get(key)
        if raw is None:
            if required:
                raise self.fail(f"{key} is required")
            return None
        if not isinstance(raw, dict):
            raise self.fail(f"{key} must be an object")
        return cast(Mapping[str, object], raw)


def decode(
    frame: str | bytes | bytearray | memoryview, *, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
) -> ClientMessage:
    """One client frame as a typed message; raises only :class:`DecodeError`."""
    return parse(frame, max_text_chars=max_text_chars)[0]


def parse(
    frame: str | bytes | bytearray | memoryview, *, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
) -> tuple[ClientMessage, dict[str, Any]]:
    """The typed message and the JSON object it was read from (for recordings, kept as sent)."""
    obj = _loads(frame)
    if not isinstance(obj, dict):
        raise DecodeError(BAD_REQUEST, "a message must be a JSON object")
    return _message(obj, max_text_chars), obj


def _message(obj: dict[str, Any], max_text_chars: int) -> ClientMessage:
    """What every message is checked for (an ``id``, a known ``type``, its depth), then the
    reading of its type in :data:`_DECODERS`."""
    msg_id = _read_id(obj)
    raw_session = obj.get("session")
    session = raw_session if valid_session_name(raw_session) else None
    kind = obj.get("type")
    if kind is None:
        raise DecodeError(BAD_REQUEST, "type is required", id=msg_id, session=session)
    if not isinstance(kind, str):
        raise DecodeError(BAD_REQUEST, "type must be a string", id=msg_id, session=session)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        shown = kind if len(kind) <= 60 else kind[:60] + "…"
        raise DecodeError(UNKNOWN_TYPE, f"unknown message type {shown!r}", id=msg_id, session=session)
    r = _Reader(obj, kind, msg_id, session, max_text_chars)
    if _nested_deeper(obj, MAX_DEPTH):
        raise r.fail(f"a message must not nest objects or arrays more than {MAX_DEPTH} levels deep")
    return decoder(r)


def _ping(r: _Reader) -> Ping:
    if r.obj.get("session") is not None and r.session is None:
        raise r.fail("session must be a non-empty string of at most 200 printable characters")
    return Ping(r.id, r.session)


def _session_open(r: _Reader) -> SessionOpen:
    session = r.session_name()
    config = r.object("config", required=False)
    if config is not None and "time_zone" in config:
        # looked up as a file in the zone database: checked here, before any session is touched
        try:
            parse_zone(config["time_zone"])
        except ConfigError as exc:
            raise r.fail(f"config.{exc}") from None
    return SessionOpen(session, dict(config) if config is not None else None, r.id)


def _turn_append(r: _Reader) -> TurnAppend:
    session = r.session_name()
    body = r.object("turn")
    assert body is not None
    speaker = r.string(body, "speaker", "turn.", max_chars=MAX_SPEAKER_CHARS)
    role = r.string(body, "role", "turn.")
    if role not in ROLES:
        raise r.fail(f"turn.role must be one of {', '.join(sorted(ROLES))}")
    call, result = body.get("tool_call"), body.get("tool_result")
    if call is not None and result is not None:
        raise r.fail("a turn is a tool_call or a tool_result, not both")
    tool = _tool_fields(r, role, call, result)
    text = r.string(
        body,
        "text",
        "turn.",
        max_chars=r.max_text_chars,
        too_large=True,
        non_empty=call is None,
        required=call is None,
    )
    at = r.time(body, "at", "turn.")
    turn_id = r.string(body, "id", "turn.", required=False, max_chars=MAX_ID_CHARS)
    assert speaker is not None
    return TurnAppend(session, Turn(speaker, cast(Role, role), text or "", at, turn_id, **tool), r.id)


def _tool_fields(r: _Reader, role: str, call: object, result: object) -> dict[str, str | None]:
    """A turn's ``tool_call`` or ``tool_result`` as the keyword fields of its :class:`Turn`."""
    if call is None and result is None:
        return {}
    field_name = "tool_call" if call is not None else "tool_result"
    tool_body = call if call is not None else result
    if not isinstance(tool_body, dict):
        raise r.fail(f"turn.{field_name} must be an object")
    if (role, field_name) not in (("assistant", "tool_call"), ("tool", "tool_result")):
        raise r.fail("a tool_call is an assistant turn and a tool_result a tool turn")
    where = f"turn.{field_name}."
    tool: dict[str, str | None] = {
        "tool_call_id": r.string(tool_body, "id", where, max_chars=MAX_ID_CHARS),
        "tool_name": r.string(
            tool_body, "name", where, required=call is not None, max_chars=MAX_SPEAKER_CHARS
        ),
    }
    if call is not None:
        arguments = tool_body.get("arguments", "")
        if not isinstance(arguments, str):  # OpenAI sends the arguments as JSON text
            arguments = orjson.dumps(arguments).decode()
        if len(arguments) > r.max_text_chars:
            raise r.fail(f"{where}arguments are over the limit of {r.max_text_chars}", TOO_LARGE)
        tool["tool_arguments"] = arguments
    return tool


def _note_append(r: _Reader) -> NoteAppend:
    session = r.session_name()
    body = r.object("note")
    assert body is not None
    text = r.string(body, "text", "note.", max_chars=r.max_text_chars, too_large=True)
    at = r.time(body, "at", "note.")
    speaker = r.string(body, "speaker", "note.", required=False, max_chars=MAX_SPEAKER_CHARS)
    source = r.string(body, "source", "note.", required=False, max_chars=MAX_SPEAKER_CHARS)
    assert text is not None
    return NoteAppend(session, Note(text, at, speaker, source), r.id)


def _context_get(r: _Reader) -> ContextGet:
    session = r.session_name()
    fmt = r.obj.get("format", "messages")
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise r.fail(f"format must be one of {', '.join(sorted(FORMATS))}")
    budget = r.integer("budget_chars")
    tokens = r.integer("budget_tokens")
    base = r.string(r.obj, "base_instructions", "", required=False, non_empty=False)
    raw_facts = r.obj.get("facts")
    if raw_facts is None:
        facts: tuple[str, ...] = ()
    elif isinstance(raw_facts, list) and all(isinstance(f, str) for f in raw_facts):
        facts = tuple(cast(list[str], raw_facts))
    else:
        raise r.fail("facts must be a list of strings")
    query = r.string(r.obj, "query", "", required=False, non_empty=False, max_chars=r.max_text_chars)
    return ContextGet(session, cast(Format, fmt), budget, base or "", facts, r.id, query, tokens)


def _context_overflow(r: _Reader) -> ContextOverflow:
    session = r.session_name()
    limit = r.integer("limit_tokens")
    budget = r.integer("budget_chars")
    # the rest is read as context.get reads it; limit_tokens is the token budget
    got = _context_get(r.framed("context.get", budget_chars=None, budget_tokens=None))
    return ContextOverflow(
        session, limit, got.format, budget, got.base_instructions, got.facts, got.query, r.id
    )


def _session_handoff(r: _Reader) -> SessionHandoff:
    session = r.session_name()
    limit = r.integer("limit_chars")
    last = r.integer("last_turns")
    # the rest is read as context.get reads it; the budgets are limit_chars's to set
    framing = r.framed("context.get", format="instructions", budget_chars=None, budget_tokens=None)
    got = _context_get(framing)
    last_turns = LAST_TURNS if last is None else last
    return SessionHandoff(session, limit, got.base_instructions, got.facts, got.query, last_turns, r.id)


def _landmark_pin(r: _Reader) -> LandmarkPin:
    session = r.session_name()
    index = r.integer("index", required=True)
    assert index is not None
    pin_kind = r.string(r.obj, "kind", "", required=False, max_chars=MAX_KIND_CHARS) or "other"
    reason = r.string(r.obj, "reason", "", required=False, non_empty=False, max_chars=MAX_REASON_CHARS)
    source = r.string(r.obj, "source", "", required=False) or "manual"
    if source not in ("manual", "llm"):
        raise r.fail("source must be manual or llm (heuristic landmarks are found by the server)")
    return LandmarkPin(session, index, pin_kind, reason or "", source, r.id)


def _landmark_unpin(r: _Reader) -> LandmarkUnpin:
    session = r.session_name()
    index = r.integer("index", required=True)
    assert index is not None
    return LandmarkUnpin(session, index, r.id)


def _session_state(r: _Reader) -> SessionStateGet:
    return SessionStateGet(r.session_name(), r.id)


def _session_close(r: _Reader) -> SessionClose:
    return SessionClose(r.session_name(), r.id)


def _session_delete(r: _Reader) -> SessionDelete:
    return SessionDelete(r.session_name(), r.id)


#: How each client message type is read, once its ``id``, ``type`` and depth are checked.
_DECODERS: Final[Mapping[str, Callable[[_Reader], ClientMessage]]] = {
    "session.open": _session_open,
    "turn.append": _turn_append,
    "note.append": _note_append,
    "context.get": _context_get,
    "session.state": _session_state,
    "session.close": _session_close,
    "session.delete": _session_delete,
    "landmark.pin": _landmark_pin,
    "landmark.unpin": _landmark_unpin,
    "context.overflow": _context_overflow,
    "session.handoff": _session_handoff,
    "ping": _ping,
}
assert tuple(_DECODERS) == CLIENT_TYPES


# -- encoding client messages ----------------------------------------------------


def _dumps(obj: Mapping[str, Any]) -> str:
    return orjson.dumps(obj).decode()


def _with_id(obj: dict[str, Any], msg_id: MessageId) -> dict[str, Any]:
    """``obj`` with the request's ``id`` placed right after ``type``, when there is one."""
    if msg_id is None:
        return obj
    kind = obj.pop("type")
    return {"type": kind, "id": msg_id, **obj}


def message_dict(message: ClientMessage) -> dict[str, Any]:
    """The wire form of a client message as a dict (canonical: only defined fields)."""
    out: dict[str, Any] = {"type": message.type}
    if message.id is not None:
        out["id"] = message.id
    if message.session is not None:
        out["session"] = message.session
    if isinstance(message, SessionOpen):
        if message.config is not None:
            out["config"] = dict(message.config)
    elif isinstance(message, TurnAppend):
        out["turn"] = turn_wire(message.turn)
    elif isinstance(message, NoteAppend):
        n = message.note
        note: dict[str, Any] = {"text": n.text, "at": n.at}
        if n.speaker is not None:
            note["speaker"] = n.speaker
        if n.source is not None:
            note["source"] = n.source
        out["note"] = note
    elif isinstance(message, ContextGet):
        out["format"] = message.format
        if message.budget_chars is not None:
            out["budget_chars"] = message.budget_chars
        if message.budget_tokens is not None:
            out["budget_tokens"] = message.budget_tokens
        _frame_fields(out, message)
    elif isinstance(message, ContextOverflow):
        if message.limit_tokens is not None:
            out["limit_tokens"] = message.limit_tokens
        out["format"] = message.format
        if message.budget_chars is not None:
            out["budget_chars"] = message.budget_chars
        _frame_fields(out, message)
    elif isinstance(message, SessionHandoff):
        if message.limit_chars is not None:
            out["limit_chars"] = message.limit_chars
        _frame_fields(out, message)
        out["last_turns"] = message.last_turns
    elif isinstance(message, LandmarkPin):
        out.update(index=message.index, kind=message.kind, source=message.source)
        if message.reason:
            out["reason"] = message.reason
    elif isinstance(message, LandmarkUnpin):
        out["index"] = message.index
    return out


def _frame_fields(out: dict[str, Any], message: ContextGet | ContextOverflow | SessionHandoff) -> None:
    """What frames a context, for every message that asks for one: base instructions, facts, query."""
    if message.base_instructions:
        out["base_instructions"] = message.base_instructions
    if message.facts:
        out["facts"] = list(message.facts)
    if message.query is not None:
        out["query"] = message.query


def turn_wire(t: Turn) -> dict[str, Any]:
    """A turn as the wire carries it (``turn.append``'s ``turn``)."""
    turn: dict[str, Any] = {"speaker": t.speaker, "role": t.role, "text": t.text, "at": t.at}
    if t.id is not None:
        turn["id"] = t.id
    if t.is_tool_call:
        turn["tool_call"] = {"id": t.tool_call_id, "name": t.tool_name, "arguments": t.tool_arguments or ""}
    elif t.is_tool_result:
        turn["tool_result"] = {"id": t.tool_call_id, **({"name": t.tool_name} if t.tool_name else {})}
    return turn


def encode(message: ClientMessage) -> str:
    """A client message as one JSON text frame; ``decode(encode(m)) == m``."""
    return _dumps(message_dict(message))


# -- server messages -------------------------------------------------------------
#
# Each message the server sends is a frozen value below made of what the wire carries and
# nothing more, so that a frame read back is the value it was written from. Its ``body`` is
# the one place that knows its JSON shape (:func:`encode_reply` puts the request's ``id``
# right after ``type``). The server makes them from the manager's values (``of``).


@dataclass(frozen=True, slots=True)
class Pong:
    """The answer to ``ping``, with the protocol version the server speaks."""

    id: MessageId = None
    protocol: int = PROTOCOL_VERSION
    type: ClassVar[str] = "pong"

    def body(self) -> dict[str, Any]:
        return {"type": self.type, "protocol": self.protocol}


@dataclass(frozen=True, slots=True)
class SessionOpened:
    """The answer to ``session.open``: whether the session was resumed, and its counters."""

    session: str
    resumed: bool
    turns: int
    cursor: int
    summary_chars: int
    in_flight: bool
    id: MessageId = None
    type: ClassVar[str] = "session.opened"

    @classmethod
    def of(cls, session: str, resumed: bool, stats: SessionStats, id: MessageId = None) -> SessionOpened:
        """The answer for a session opened with counters ``stats``."""
        in_flight = stats.in_flight is not None
        return cls(session, resumed, stats.turns, stats.cursor, stats.summary_chars, in_flight, id)

    def body(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "session": self.session,
            "resumed": self.resumed,
            "turns": self.turns,
            "cursor": self.cursor,
            "summary_chars": self.summary_chars,
            "in_flight": self.in_flight,
        }


class LandmarkFound(NamedTuple):
    """A landmark the server found in a turn as it stored it, as ``turn.appended`` says it."""

    kind: str
    reason: str
    source: str

    @classmethod
    def of(cls, landmark: Landmark) -> LandmarkFound:
        return cls(landmark.kind, landmark.reason, landmark.source)


@dataclass(frozen=True, slots=True)
class TurnStored:
    """The answer to ``turn.append``: the turn's index (an identical retry's first one, as a
    ``duplicate``), and the landmark the server found in it, if any."""

    session: str
    index: int
    id: MessageId = None
    duplicate: bool = False
    landmark: LandmarkFound | None = None
    type: ClassVar[str] = "turn.appended"

    def body(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"type": self.type, "session": self.session, "index": self.index}
        if self.duplicate:
            obj["duplicate"] = True
        if self.landmark is not None:
            obj["landmark"] = self.landmark._asdict()
        return obj


@dataclass(frozen=True, slots=True)
class NoteStored:
    """The answer to ``note.append``: what the note did to the note buffers."""

    session: str
    changed: NotesChanged
    id: MessageId = None
    type: ClassVar[str] = "note.appended"

    def body(self) -> dict[str, Any]:
        c = self.changed
        return {
            "type": self.type,
            "session": self.session,
            "live": c.live,
            "pending": c.pending,
            "evicted": c.evicted,
            "dropped": c.dropped,
        }


class Emergency(NamedTuple):
    """What a ``context.overflow``'s emergency fold moved: the cursor before and after it,
    and how many turns it folded (0 when it folded none)."""

    old_cursor: int
    cursor: int
    folded: int

    @classmethod
    def after(cls, applied: Applied | None, cursor: int) -> Emergency:
        """What the fold ``applied`` moved (``None``: none was needed) for a context at ``cursor``."""
        if applied is None:
            return cls(cursor, cursor, 0)
        return cls(applied.old_cursor, cursor, applied.new_cursor - applied.old_cursor)


class RecalledLine(NamedTuple):
    """A passage recall gave a context, as the context's ``recalled`` shows it: the turn it
    quotes (``None`` for a note or a summary line), and for a turn's passage whether it is the
    whole turn or its matching sentences."""

    kind: str
    text: str
    turn: int | None = None
    granularity: str | None = None

    @classmethod
    def of(cls, recalled: Recalled) -> RecalledLine:
        granularity = recalled.granularity if recalled.kind == "turn" else None
        return cls(recalled.kind, recalled.line, recalled.turn, granularity)

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "text": self.text}
        if self.turn is not None:
            out["turn"] = self.turn
        if self.granularity is not None:
            out["granularity"] = self.granularity
        return out


class ShownLandmark(NamedTuple):
    """A landmark a context shows whole: the turn's index and the landmark's kind."""

    turn: int
    kind: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextReply:
    """The answer to ``context.get`` and ``context.overflow`` (which says its ``emergency``):
    ``messages`` in the ``messages`` format, ``instructions`` in the other."""

    session: str
    format: Format
    summary: str
    cursor: int
    covered_through: int
    in_flight: bool
    chars: int
    first_turn: int
    turns_shown: int
    budget_chars: int | None = None
    budget_tokens: int | None = None
    tokens: int | None = None
    tokenizer: str | None = None
    dropped: tuple[str, ...] = ()
    query: str = ""
    recalled: tuple[RecalledLine, ...] = ()
    landmarks: tuple[ShownLandmark, ...] = ()
    messages: tuple[Message, ...] = ()
    instructions: str = ""
    emergency: Emergency | None = None
    id: MessageId = None
    type: ClassVar[str] = "context"

    @classmethod
    def of(
        cls,
        session: str,
        context: Context,
        in_flight: bool,
        id: MessageId = None,
        emergency: Emergency | None = None,
    ) -> ContextReply:
        """The answer that carries ``context`` (``in_flight``: a fold of the session runs)."""
        ctx = context
        as_messages = ctx.format == "messages"
        return cls(
            session=session,
            format=ctx.format,
            summary=ctx.summary,
            cursor=ctx.cursor,
            covered_through=ctx.covered_through,
            in_flight=in_flight,
            chars=ctx.chars,
            first_turn=ctx.first_turn,
            turns_shown=ctx.turns_shown,
            budget_chars=ctx.budget_chars,
            budget_tokens=ctx.budget_tokens,
            tokens=ctx.tokens,
            tokenizer=ctx.tokenizer,
            dropped=tuple(ctx.dropped),
            query=ctx.query,
            recalled=tuple(RecalledLine.of(r) for r in ctx.recalled),
            landmarks=tuple(ShownLandmark(lm.index, lm.kind) for lm in ctx.landmarks),
            messages=tuple(ctx.messages) if as_messages else (),
            instructions="" if as_messages else ctx.instructions,
            emergency=emergency,
            id=id,
        )

    def body(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "type": self.type,
            "session": self.session,
            "format": self.format,
            "summary": self.summary,
            "cursor": self.cursor,
            "covered_through": self.covered_through,
            "in_flight": self.in_flight,
            "chars": self.chars,
            "first_turn": self.first_turn,
            "turns_shown": self.turns_shown,
            "budget_chars": self.budget_chars,
            "budget_tokens": self.budget_tokens,
            "tokens": self.tokens,
            "tokenizer": self.tokenizer,
            "dropped": list(self.dropped),
            "query": self.query,
            "recalled": [r.wire() for r in self.recalled],
            "landmarks": [lm._asdict() for lm in self.landmarks],
        }
        if self.emergency is not None:
            obj["emergency"] = self.emergency._asdict()
        if self.format == "messages":
            obj["messages"] = [dict(m) for m in self.messages]
        else:
            obj["instructions"] = self.instructions
        return obj


@dataclass(frozen=True, slots=True)
class HandoffReply:
    """The answer to ``session.handoff``."""

    session: str
    handoff: Handoff
    id: MessageId = None
    type: ClassVar[str] = "handoff"

    def body(self) -> dict[str, Any]:
        h = self.handoff
        return {
            "type": self.type,
            "session": self.session,
            "instructions": h.instructions,
            "chars": h.chars,
            "limit_chars": h.limit_chars,
            "cursor": h.cursor,
            "turns": h.turns,
            "recalled": h.recalled,
            "last_turns": [{"index": index, **turn_wire(turn)} for index, turn in h.last_turns],
            "open_questions": [
                {"index": q.index, "speaker": q.speaker, "text": q.text, "at": q.at} for q in h.open_questions
            ],
        }


@dataclass(frozen=True, slots=True)
class SessionState:
    """The answer to ``session.state``: the session's counters."""

    session: str
    turns: int
    cursor: int
    in_flight: bool
    summary_chars: int
    live_notes: int
    pending_notes: int
    failures: int
    compactions: int
    notes_dropped: int
    landmarks: int
    id: MessageId = None
    type: ClassVar[str] = "session.state"

    @classmethod
    def of(cls, session: str, stats: SessionStats, id: MessageId = None) -> SessionState:
        s = stats
        return cls(
            session,
            s.turns,
            s.cursor,
            s.in_flight is not None,
            s.summary_chars,
            s.live_notes,
            s.pending_notes,
            s.failures,
            s.compactions,
            s.notes_dropped,
            s.landmarks,
            id,
        )

    def body(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "session": self.session,
            "turns": self.turns,
            "cursor": self.cursor,
            "in_flight": self.in_flight,
            "summary_chars": self.summary_chars,
            "live_notes": self.live_notes,
            "pending_notes": self.pending_notes,
            "failures": self.failures,
            "compactions": self.compactions,
            "notes_dropped": self.notes_dropped,
            "landmarks": self.landmarks,
        }


@dataclass(frozen=True, slots=True)
class PinnedLandmark:
    """A landmark as ``landmark.pinned`` carries it: where it is, why, and the turn's words."""

    index: int
    kind: str
    reason: str
    source: str
    pinned_at: float
    speaker: str
    text: str
    at: float

    @classmethod
    def of(cls, landmark: Landmark) -> PinnedLandmark:
        t = landmark.turn
        lm = landmark
        return cls(lm.index, lm.kind, lm.reason, lm.source, lm.pinned_at, t.speaker, t.text, t.at)

    def wire(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "kind": self.kind,
            "reason": self.reason,
            "source": self.source,
            "pinned_at": self.pinned_at,
            "speaker": self.speaker,
            "text": self.text,
            "at": self.at,
        }


@dataclass(frozen=True, slots=True)
class Pinned:
    """The answer to ``landmark.pin``: the landmark as it is kept."""

    session: str
    landmark: PinnedLandmark
    id: MessageId = None
    type: ClassVar[str] = "landmark.pinned"

    def body(self) -> dict[str, Any]:
        return {"type": self.type, "session": self.session, "landmark": self.landmark.wire()}


@dataclass(frozen=True, slots=True)
class Unpinned:
    """The answer to ``landmark.unpin``: whether there was a landmark at ``index`` to remove."""

    session: str
    index: int
    removed: bool
    id: MessageId = None
    type: ClassVar[str] = "landmark.unpinned"

    def body(self) -> dict[str, Any]:
        return {"type": self.type, "session": self.session, "index": self.index, "removed": self.removed}


@dataclass(frozen=True, slots=True)
class Closed:
    """The answer to ``session.close``."""

    session: str
    id: MessageId = None
    type: ClassVar[str] = "session.closed"

    def body(self) -> dict[str, Any]:
        return {"type": self.type, "session": self.session}


@dataclass(frozen=True, slots=True)
class Deleted:
    """The answer to ``session.delete``."""

    session: str
    id: MessageId = None
    type: ClassVar[str] = "session.deleted"

    def body(self) -> dict[str, Any]:
        return {"type": self.type, "session": self.session}


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """An ``error``: one of :data:`ERROR_CODES` (or an HTTP refusal's ``not_found``) and a
    message for people, with the documented optional fields that apply."""

    code: str
    message: str
    id: MessageId = None
    session: str | None = None
    limit: str | None = None
    """Which limit was hit."""
    retry_after: float | None = None
    """Seconds until trying again may succeed."""
    needed: int | None = None
    """What must stay in a context takes this many tokens (a ``too_large`` overflow)."""
    retryable: bool | None = None
    type: ClassVar[str] = "error"

    def body(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"type": self.type}
        if self.session is not None:
            obj["session"] = self.session
        obj["code"] = self.code
        obj["message"] = self.message
        extra = {"limit": self.limit, "retry_after": self.retry_after, "needed": self.needed}
        obj.update((key, value) for key, value in extra.items() if value is not None)
        if self.retryable is not None:
            obj["retryable"] = self.retryable
        return obj


Reply = (
    Pong
    | SessionOpened
    | TurnStored
    | NoteStored
    | ContextReply
    | HandoffReply
    | SessionState
    | Pinned
    | Unpinned
    | Closed
    | Deleted
    | ErrorReply
)


@dataclass(frozen=True, slots=True)
class Compacted:
    """Pushed when a fold lands (``compaction.completed``): the cursor it moved from and to,
    the summary's size, and what made it due (``count``, ``fill`` or ``emergency``)."""

    session: str
    cursor: int
    covered_through: int
    summary_chars: int
    latency: float
    old_cursor: int | None = None
    trigger: str | None = None
    type: ClassVar[str] = "compaction.completed"

    def body(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "type": self.type,
            "session": self.session,
            "cursor": self.cursor,
            "covered_through": self.covered_through,
            "summary_chars": self.summary_chars,
            "latency": self.latency,
            "old_cursor": self.old_cursor,
        }
        if self.trigger is not None:
            obj["trigger"] = self.trigger
        return obj


@dataclass(frozen=True, slots=True)
class CompactionFailure:
    """Pushed when a fold fails (``compaction.failed``): why, whether it is retried, and when."""

    session: str
    cursor: int
    covered_through: int
    summary_chars: int
    latency: float
    error: str | None = None
    retryable: bool | None = None
    failures: int = 0
    retry_at: float | None = None
    type: ClassVar[str] = "compaction.failed"

    def body(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "session": self.session,
            "cursor": self.cursor,
            "covered_through": self.covered_through,
            "summary_chars": self.summary_chars,
            "latency": self.latency,
            "error": self.error,
            "retryable": self.retryable,
            "failures": self.failures,
            "retry_at": self.retry_at,
        }


Pushed = Compacted | CompactionFailure
"""A message the server pushes unasked, to every connection holding the session."""
ServerMessage = Reply | Pushed


def reply_dict(reply: Reply) -> dict[str, Any]:
    """The wire form of a reply as a dict, the request's ``id`` right after ``type``."""
    return _with_id(reply.body(), reply.id)


def encode_reply(reply: Reply) -> str:
    """A reply as the one JSON text frame the server sends."""
    return _dumps(reply_dict(reply))


def encode_event(event: Pushed) -> str:
    """A pushed ``compaction.completed`` or ``compaction.failed`` message."""
    return _dumps(event.body())


# -- reading server messages -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Fields:
    """Reads the typed fields of one ``kind`` server message (or of an object inside it),
    raising ``DecodeError`` that names the message and the field. A field that is absent
    reads as one that is ``null``."""

    obj: Mapping[str, object]
    kind: str
    id: MessageId

    def fail(self, message: str) -> DecodeError:
        return DecodeError(BAD_REQUEST, f"{self.kind}: {message}", id=self.id)

    def _get(
        self, key: str, inside: Mapping[str, object] | None, what: str, ok: Callable[[object], bool]
    ) -> object:
        value = (self.obj if inside is None else inside).get(key)
        if value is not None and not ok(value):
            raise self.fail(f"{key} must be {what}")
        return value

    def _required(self, key: str, value: object) -> object:
        if value is None:
            raise self.fail(f"{key} is required")
        return value

    def maybe_text(self, key: str, inside: Mapping[str, object] | None = None) -> str | None:
        return cast(str | None, self._get(key, inside, "a string", lambda v: isinstance(v, str)))

    def text(self, key: str, inside: Mapping[str, object] | None = None) -> str:
        return cast(str, self._required(key, self.maybe_text(key, inside)))

    def maybe_integer(self, key: str, inside: Mapping[str, object] | None = None) -> int | None:
        return cast(int | None, self._get(key, inside, "an integer", _is_integer))

    def integer(self, key: str, inside: Mapping[str, object] | None = None) -> int:
        return cast(int, self._required(key, self.maybe_integer(key, inside)))

    def maybe_number(self, key: str, inside: Mapping[str, object] | None = None) -> float | None:
        value = self._get(key, inside, "a number", lambda v: _is_integer(v) or isinstance(v, float))
        return None if value is None else float(cast(float, value))

    def number(self, key: str, inside: Mapping[str, object] | None = None) -> float:
        return cast(float, self._required(key, self.maybe_number(key, inside)))

    def maybe_flag(self, key: str, inside: Mapping[str, object] | None = None) -> bool | None:
        return cast(bool | None, self._get(key, inside, "true or false", lambda v: isinstance(v, bool)))

    def flag(self, key: str, inside: Mapping[str, object] | None = None) -> bool:
        return cast(bool, self._required(key, self.maybe_flag(key, inside)))

    def maybe_object(
        self, key: str, inside: Mapping[str, object] | None = None
    ) -> Mapping[str, object] | None:
        return cast(Mapping[str, object] | None, self._get(key, inside, "an object", _is_object))

    def objects(self, key: str) -> list[Mapping[str, object]]:
        """A list of objects (required)."""
        value = self._required(key, self._get(key, None, "a list of objects", _is_objects))
        return cast(list[Mapping[str, object]], value)

    def texts(self, key: str) -> tuple[str, ...]:
        """A list of strings (required)."""
        value = self._get(key, None, "a list of strings", lambda v: _is_list(v, str))
        return tuple(cast(list[str], self._required(key, value)))


def _is_integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_object(value: object) -> bool:
    return isinstance(value, dict)


def _is_list(value: object, item: type) -> bool:
    return isinstance(value, list) and all(isinstance(v, item) for v in value)


def _is_objects(value: object) -> bool:
    return _is_list(value, dict)


def decode_reply(frame: str | bytes | bytearray | memoryview) -> ServerMessage:
    """One server frame as its typed message (a reply or a pushed event); raises only
    :class:`DecodeError`. ``decode_reply(encode_reply(r)) == r``."""
    return parse_reply(frame)[0]


def parse_reply(frame: str | bytes | bytearray | memoryview) -> tuple[ServerMessage, dict[str, Any]]:
    """The typed server message and the JSON object it was read from (which a client may hand
    on as the server sent it, fields it does not know included); raises only :class:`DecodeError`."""
    obj = _loads(frame)
    if not isinstance(obj, dict):
        raise DecodeError(BAD_REQUEST, "a server message must be a JSON object")
    msg_id = _read_id(obj)
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise DecodeError(BAD_REQUEST, "a server message must have a string type", id=msg_id)
    reader = _SERVER_READERS.get(kind)
    if reader is None:
        shown = kind if len(kind) <= 60 else kind[:60] + "…"
        raise DecodeError(UNKNOWN_TYPE, f"unknown server message type {shown!r}", id=msg_id)
    return reader(_Fields(obj, kind, msg_id)), obj


def _read_pong(f: _Fields) -> Pong:
    return Pong(f.id, f.integer("protocol"))


def _read_session_opened(f: _Fields) -> SessionOpened:
    counters = (f.integer("turns"), f.integer("cursor"), f.integer("summary_chars"))
    return SessionOpened(f.text("session"), f.flag("resumed"), *counters, f.flag("in_flight"), f.id)


def _read_turn_stored(f: _Fields) -> TurnStored:
    found = f.maybe_object("landmark")
    landmark = None
    if found is not None:
        landmark = LandmarkFound(f.text("kind", found), f.text("reason", found), f.text("source", found))
    duplicate = f.maybe_flag("duplicate") or False
    return TurnStored(f.text("session"), f.integer("index"), f.id, duplicate, landmark)


def _read_note_stored(f: _Fields) -> NoteStored:
    changed = NotesChanged(
        f.integer("live"), f.integer("pending"), f.integer("evicted"), f.integer("dropped")
    )
    return NoteStored(f.text("session"), changed, f.id)


def _read_context(f: _Fields) -> ContextReply:
    # read in the order the server writes the fields, so that the first one amiss is named
    session, fmt = f.text("session"), f.text("format")
    if fmt not in FORMATS:
        raise f.fail(f"format must be one of {', '.join(sorted(FORMATS))}")
    summary, cursor, covered = f.text("summary"), f.integer("cursor"), f.integer("covered_through")
    in_flight, chars = f.flag("in_flight"), f.integer("chars")
    first_turn, turns_shown = f.integer("first_turn"), f.integer("turns_shown")
    budget_chars, budget_tokens = f.maybe_integer("budget_chars"), f.maybe_integer("budget_tokens")
    tokens, tokenizer = f.maybe_integer("tokens"), f.maybe_text("tokenizer")
    dropped, query = f.texts("dropped"), f.text("query")
    recalled = tuple(
        RecalledLine(
            f.text("kind", r), f.text("text", r), f.maybe_integer("turn", r), f.maybe_text("granularity", r)
        )
        for r in f.objects("recalled")
    )
    landmarks = tuple(
        ShownLandmark(f.integer("turn", lm), f.text("kind", lm)) for lm in f.objects("landmarks")
    )
    moved = f.maybe_object("emergency")
    emergency = None
    if moved is not None:
        emergency = Emergency(
            f.integer("old_cursor", moved), f.integer("cursor", moved), f.integer("folded", moved)
        )
    messages: tuple[Message, ...] = ()
    instructions = ""
    if fmt == "messages":
        messages = tuple(dict(m) for m in f.objects("messages"))
        for m in messages:
            f.text("role", m)
    else:
        instructions = f.text("instructions")
    return ContextReply(
        session=session,
        format=cast(Format, fmt),
        summary=summary,
        cursor=cursor,
        covered_through=covered,
        in_flight=in_flight,
        chars=chars,
        first_turn=first_turn,
        turns_shown=turns_shown,
        budget_chars=budget_chars,
        budget_tokens=budget_tokens,
        tokens=tokens,
        tokenizer=tokenizer,
        dropped=dropped,
        query=query,
        recalled=recalled,
        landmarks=landmarks,
        messages=messages,
        instructions=instructions,
        emergency=emergency,
        id=f.id,
    )


def _read_handoff(f: _Fields) -> HandoffReply:
    f.integer("chars")  # the instructions' length: said for the reader, kept by them
    last_turns = tuple((f.integer("index", t), _wire_turn(f, t)) for t in f.objects("last_turns"))
    questions = tuple(
        OpenQuestion(f.integer("index", q), f.text("speaker", q), f.text("text", q), f.number("at", q))
        for q in f.objects("open_questions")
    )
    handoff = Handoff(
        f.text("instructions"),
        f.integer("limit_chars"),
        last_turns,
        questions,
        f.integer("cursor"),
        f.integer("turns"),
        f.integer("recalled"),
    )
    return HandoffReply(f.text("session"), handoff, f.id)


def _wire_turn(f: _Fields, body: Mapping[str, object]) -> Turn:
    """A turn as :func:`turn_wire` writes it."""
    role = f.text("role", body)
    if role not in ROLES:
        raise f.fail(f"a turn's role must be one of {', '.join(sorted(ROLES))}")
    tool: dict[str, str | None] = {}
    call, result = f.maybe_object("tool_call", body), f.maybe_object("tool_result", body)
    if call is not None:
        tool = {"tool_call_id": f.text("id", call), "tool_name": f.text("name", call)}
        tool["tool_arguments"] = f.text("arguments", call)
    elif result is not None:
        tool = {"tool_call_id": f.text("id", result), "tool_name": f.maybe_text("name", result)}
    text, at = f.text("text", body), f.number("at", body)
    return Turn(f.text("speaker", body), cast(Role, role), text, at, f.maybe_text("id", body), **tool)


def _read_session_state(f: _Fields) -> SessionState:
    return SessionState(
        f.text("session"),
        f.integer("turns"),
        f.integer("cursor"),
        f.flag("in_flight"),
        f.integer("summary_chars"),
        f.integer("live_notes"),
        f.integer("pending_notes"),
        f.integer("failures"),
        f.integer("compactions"),
        f.integer("notes_dropped"),
        f.integer("landmarks"),
        f.id,
    )


def _read_pinned(f: _Fields) -> Pinned:
    lm = f.maybe_object("landmark")
    if lm is None:
        raise f.fail("landmark is required")
    kept = PinnedLandmark(
        f.integer("index", lm),
        f.text("kind", lm),
        f.text("reason", lm),
        f.text("source", lm),
        f.number("pinned_at", lm),
        f.text("speaker", lm),
        f.text("text", lm),
        f.number("at", lm),
    )
    return Pinned(f.text("session"), kept, f.id)


def _read_unpinned(f: _Fields) -> Unpinned:
    return Unpinned(f.text("session"), f.integer("index"), f.flag("removed"), f.id)


def _read_closed(f: _Fields) -> Closed:
    return Closed(f.text("session"), f.id)


def _read_deleted(f: _Fields) -> Deleted:
    return Deleted(f.text("session"), f.id)


def _read_error(f: _Fields) -> ErrorReply:
    return ErrorReply(
        f.text("code"),
        f.text("message"),
        f.id,
        f.maybe_text("session"),
        limit=f.maybe_text("limit"),
        retry_after=f.maybe_number("retry_after"),
        needed=f.maybe_integer("needed"),
        retryable=f.maybe_flag("retryable"),
    )


def _read_compacted(f: _Fields) -> Compacted:
    where = (f.text("session"), f.integer("cursor"), f.integer("covered_through"), f.integer("summary_chars"))
    return Compacted(*where, f.number("latency"), f.maybe_integer("old_cursor"), f.maybe_text("trigger"))


def _read_compaction_failure(f: _Fields) -> CompactionFailure:
    where = (f.text("session"), f.integer("cursor"), f.integer("covered_through"), f.integer("summary_chars"))
    return CompactionFailure(
        *where,
        f.number("latency"),
        f.maybe_text("error"),
        f.maybe_flag("retryable"),
        f.integer("failures"),
        f.maybe_number("retry_at"),
    )


#: How each server message type is read, once its ``id`` and ``type`` are.
_SERVER_READERS: Final[Mapping[str, Callable[[_Fields], ServerMessage]]] = {
    Pong.type: _read_pong,
    SessionOpened.type: _read_session_opened,
    TurnStored.type: _read_turn_stored,
    NoteStored.type: _read_note_stored,
    ContextReply.type: _read_context,
    HandoffReply.type: _read_handoff,
    SessionState.type: _read_session_state,
    Pinned.type: _read_pinned,
    Unpinned.type: _read_unpinned,
    Closed.type: _read_closed,
    Deleted.type: _read_deleted,
    ErrorReply.type: _read_error,
    Compacted.type: _read_compacted,
    CompactionFailure.type: _read_compaction_failure,
}
#: Every type of message the server sends (replies and pushed events).
SERVER_TYPES: Final = tuple(_SERVER_READERS)


__all__ = [
    "BAD_REQUEST",
    "CLIENT_TYPES",
    "ERROR_CODES",
    "INTEGER_FIELDS",
    "INTERNAL",
    "MAX_BUDGET",
    "MAX_SAFE_INTEGER",
    "PROTOCOL_VERSION",
    "RATE_LIMITED",
    "SERVER_TYPES",
    "TOO_LARGE",
    "UNAUTHORIZED",
    "UNKNOWN_SESSION",
    "UNKNOWN_TYPE",
    "ClientMessage",
    "Closed",
    "Compacted",
    "CompactionFailure",
    "ContextGet",
    "ContextOverflow",
    "ContextReply",
    "DecodeError",
    "Deleted",
    "Emergency",
    "ErrorReply",
    "HandoffReply",
    "IntRange",
    "LandmarkFound",
    "LandmarkPin",
    "LandmarkUnpin",
    "NoteAppend",
    "NoteStored",
    "Ping",
    "Pinned",
    "PinnedLandmark",
    "Pong",
    "Pushed",
    "RecalledLine",
    "Reply",
    "ServerMessage",
    "SessionClose",
    "SessionDelete",
    "SessionHandoff",
    "SessionMessage",
    "SessionOpen",
    "SessionOpened",
    "SessionState",
    "SessionStateGet",
    "ShownLandmark",
    "TurnAppend",
    "TurnStored",
    "Unpinned",
    "decode",
    "decode_reply",
    "encode",
    "encode_event",
    "encode_reply",
    "message_dict",
    "parse",
    "parse_reply",
    "reply_dict",
    "turn_wire",
    "valid_session_name",
]
