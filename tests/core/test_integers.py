"""Every integer field of the wire has a range, checked in the codec: a number out of range
(2^63 for a turn's index, say) is a ``bad_request`` before anything reaches a store."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from helpers import ROOT
from hypothesis import example, given, settings
from hypothesis import strategies as st
from serving import running, turn_body, wire

from voice_context import codec
from voice_context.codec import CLIENT_TYPES, INTEGER_FIELDS, ClientMessage, DecodeError, decode, encode
from voice_context.core.config import (
    CLIENT_MAXIMA,
    INTEGER_MINIMA,
    SessionConfig,
    check_client_overrides,
    settings_table,
)
from voice_context.errors import ConfigError
from voice_context.store.base import Store
from voice_context.store.memory import MemoryStore
from voice_context.store.redis import RedisStore
from voice_context.store.sqlite import SQLiteStore
from voice_context.testing.redis_server import RedisServer

T0 = 1714572187.0
PROTOCOL_DOC = ROOT / "docs" / "protocol.md"

#: One valid message of each type, to which a test sets one integer field.
VALID: dict[str, dict[str, Any]] = {
    "session.open": {"session": "room-1", "config": {"recent_window": 20}},
    "turn.append": {"session": "room-1", "turn": {"speaker": "Ann", "role": "user", "text": "hi", "at": T0}},
    "note.append": {"session": "room-1", "note": {"text": "a spreadsheet", "at": T0}},
    "context.get": {"session": "room-1", "format": "instructions", "budget_chars": 5200},
    "session.state": {"session": "room-1"},
    "session.close": {"session": "room-1"},
    "session.delete": {"session": "room-1"},
    "landmark.pin": {"session": "room-1", "index": 3, "kind": "spec"},
    "landmark.unpin": {"session": "room-1", "index": 3},
    "context.overflow": {"session": "room-1", "limit_tokens": 60},
    "session.handoff": {"session": "room-1", "limit_chars": 600, "last_turns": 2},
    "ping": {},
}


def holds_int(hint: Any) -> bool:
    """Whether a field of this type may hold an integer (``float`` accepts one too, but a time
    is read as a number, not as an integer field)."""
    if hint is int:
        return True
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(holds_int(arg) for arg in typing.get_args(hint))
    return False


def integer_fields_of(cls: type, prefix: str = "") -> Iterator[str]:
    """The integer fields of a message class, read from its definition (nested ones as ``turn.x``)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if holds_int(hint):
            yield prefix + f.name
        elif dataclasses.is_dataclass(hint) and isinstance(hint, type):
            yield from integer_fields_of(hint, f"{prefix}{f.name}.")


def message_classes() -> dict[str, type]:
    classes = typing.get_args(ClientMessage)
    return {cls.__dataclass_fields__["type"].default: cls for cls in classes}


def test_every_integer_field_of_every_message_has_a_range_and_a_valid_example() -> None:
    classes = message_classes()
    assert set(classes) == set(CLIENT_TYPES) == set(VALID) == set(INTEGER_FIELDS)
    for kind, cls in classes.items():
        assert set(integer_fields_of(cls)) == set(INTEGER_FIELDS[kind]), kind
        assert decode(json.dumps({"type": kind, **VALID[kind]})).type == kind


FIELDS = sorted((kind, key) for kind, ranges in INTEGER_FIELDS.items() for key in ranges)

#: Integers near every bound, those a store or a JSON reader cannot hold, and what is no integer.
EDGES = [0, 1, -1, 50, 51, 2**31, 10**9, 10**9 + 1, 2**53 - 1, 2**53, -(2**53 - 1), -(2**53)]
EDGES += [2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 10**30, -(10**30)]
NOT_INTEGERS = [True, False, 1.0, 0.0, -0.0, 2.5, 1e300, -1e300, "5", [5], {"n": 5}]
values = (
    st.sampled_from(EDGES)
    | st.integers()
    | st.integers(-(2**64), 2**64)
    | st.sampled_from(NOT_INTEGERS)
    | st.floats(allow_nan=False, allow_infinity=False)
)


def with_field(kind: str, key: str, value: Any) -> str:
    obj: dict[str, Any] = {"type": kind, **VALID[kind]}
    obj = json.loads(json.dumps(obj))  # a copy deep enough to change a nested field
    *outer, last = key.split(".")
    target = obj
    for part in outer:
        target = target[part]
    target[last] = value
    return json.dumps(obj)  # the standard library writes any integer, as a client may


def read(message: ClientMessage, key: str) -> Any:
    value: Any = message
    for part in key.split("."):
        value = getattr(value, part)
    return value


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from(FIELDS), values)
@example(("landmark.unpin", "index"), 2**63)
@example(("landmark.pin", "index"), 2**63)
@example(("context.get", "budget_tokens"), 2**64)
@example(("ping", "id"), -(2**63))
def test_an_integer_field_takes_exactly_the_integers_of_its_range(field: tuple[str, str], value: Any) -> None:
    kind, key = field
    low, high = INTEGER_FIELDS[kind][key]
    raw = with_field(kind, key, value)
    takes = type(value) is int and low <= value <= high
    if takes or (key == "id" and isinstance(value, str)):  # an id may be a string instead
        message = decode(raw)
        assert read(message, key) == value
        assert decode(encode(message)) == message
    else:
        with pytest.raises(DecodeError) as refused:
            decode(raw)
        assert refused.value.code == codec.BAD_REQUEST
        assert f"{key} must be" in refused.value.message


# -- the session config's counts: checked where the session's limits are ---------------------------


def config_counts() -> list[str]:
    """The integer fields of the session config a client may set, read from its definition."""
    hints = typing.get_type_hints(SessionConfig)
    counts = [f.name for f in dataclasses.fields(SessionConfig) if hints[f.name] is int]
    assert set(counts) == set(INTEGER_MINIMA), "every integer limit has its least value"
    return sorted(set(counts) & set(CLIENT_MAXIMA))


def test_a_client_may_set_every_count_of_the_session_config_but_the_retry_policy() -> None:
    assert config_counts() == sorted(INTEGER_MINIMA)


@settings(max_examples=800, deadline=None)
@given(st.sampled_from(config_counts()), values)
@example("recent_window", 2**63)
@example("max_summary_chars", 39)
@example("max_pending_notes", True)
def test_a_config_count_takes_exactly_the_integers_of_its_range(name: str, value: Any) -> None:
    message = decode(with_field("session.open", f"config.{name}", value))
    assert isinstance(message, codec.SessionOpen) and message.config is not None
    defaults = SessionConfig()
    if type(value) is int and INTEGER_MINIMA[name] <= value <= CLIENT_MAXIMA[name]:
        check_client_overrides(message.config, defaults)
        assert getattr(defaults.with_overrides(dict(message.config)), name) == value
    else:
        with pytest.raises(ConfigError, match=name):
            check_client_overrides(message.config, defaults)
            defaults.with_overrides(dict(message.config))


# -- the protocol doc gives the same ranges -------------------------------------------------------

ROW = re.compile(r"^\| (?P<names>[^|]+) \|(?: (?P<where>[^|]+) \|)? (?P<low>-?\d+) \| (?P<high>-?\d+) \|$")


def documented_rows(heading: str) -> list[tuple[list[str], str | None, int, int]]:
    """The rows with a numeric range of the first table after ``heading`` in the protocol doc."""
    text = PROTOCOL_DOC.read_text(encoding="utf-8")
    table = text[text.index(heading) :].split("\n\n|", 1)[1].split("\n\n", 1)[0]
    rows = []
    for line in ("|" + table).splitlines():
        found = ROW.match(line)
        if found:
            names = re.findall(r"`([a-z_.]+)`", found["names"])
            rows.append((names, found["where"], int(found["low"]), int(found["high"])))
    return rows


def test_the_protocol_doc_gives_every_integer_field_its_range() -> None:
    documented = set()
    for names, where, low, high in documented_rows("- Every integer field takes a JSON integer"):
        assert where is not None
        kinds = list(CLIENT_TYPES) if where == "every message" else re.findall(r"`([a-z_.]+)`", where)
        documented |= {(kind, name, low, high) for kind in kinds for name in names}
    expected = {(kind, key, *span) for kind, ranges in INTEGER_FIELDS.items() for key, span in ranges.items()}
    assert documented == expected


def test_the_protocol_doc_lists_every_session_setting_as_the_code_declares_it() -> None:
    text = PROTOCOL_DOC.read_text(encoding="utf-8")
    assert settings_table() in text  # every default, range and meaning, from the one declaration
    assert "| `recent_window` | `50` | 1 to 500 (an integer) |" in text


# -- over a real connection, on every store ----------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest_asyncio.fixture(params=["memory", "sqlite", "redis"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    made: Store
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "voice-context.db")
    else:
        made = RedisStore(request.getfixturevalue("redis_server").url, prefix=f"t{uuid.uuid4().hex[:8]}")
    yield made
    await made.aclose()


@pytest.mark.asyncio
async def test_a_turn_index_of_2_to_the_63_is_a_bad_request_and_the_sessions_carry_on(store: Store) -> None:
    async with running(store=store) as server, wire(server) as bot:
        for room in ("room-1", "room-2"):
            await bot.open(room)
            assert (await bot.append(room, 0))["index"] == 0
        for kind in ("landmark.unpin", "landmark.pin"):  # sent as any client may: the standard library's JSON
            await bot.send(json.dumps({"type": kind, "id": kind, "session": "room-1", "index": 2**63}))
            refused = await bot.reply()
            assert (refused["type"], refused["id"], refused["session"]) == ("error", kind, "room-1")
            assert refused["code"] == "bad_request", refused
            assert "index must be an integer from 0 to 9007199254740991" in refused["message"]
        await bot.send(json.dumps({"type": "ping", "id": 2**63}))
        refused = await bot.reply()
        assert (refused["code"], "id" in refused) == ("bad_request", False)
        assert (await bot.request("turn.append", session="room-2", turn=turn_body(1)))["index"] == 1
        pinned = await bot.request("landmark.pin", session="room-1", index=0)
        assert pinned["landmark"]["index"] == 0
        unpinned = await bot.request("landmark.unpin", session="room-1", index=0)
        assert (unpinned["type"], unpinned["removed"]) == ("landmark.unpinned", True)
        state = await bot.request("session.state", session="room-1")
        assert (state["turns"], state["landmarks"]) == (1, 0)
