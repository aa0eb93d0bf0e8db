"""What a client sends wrong, or a store kept from before the codec refused it: each is answered
with its documented error, and the connection, the session and the other sessions carry on.
Over real connections to a real server."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from messages import message_like, pinned
from serving import T0, Wire, running, settings, turn_body, wire
from structlog.testing import capture_logs

from voice_context import codec
from voice_context.core.turns import Turn
from voice_context.errors import StoreError
from voice_context.server import Server
from voice_context.store.base import SessionRecord
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.deterministic import DeterministicSummarizer
from voice_context.summarizers.fakes import ScriptedSummarizer

SMALL = {"recent_window": 2, "batch_size": 1}


class BrokenStore(MemoryStore):
    """Fails turn appends for two sessions: one as a store outage, one as a bug."""

    async def append_turn(self, name: str, index: int, turn: Turn) -> None:
        if name == "outage":
            raise StoreError("disk unavailable", retryable=True)
        if name == "bug":
            raise RuntimeError("a bug in a backend")
        await super().append_turn(name, index, turn)


# -- bad input: an error, and the connection carries on --------------------------------------


def bad_turn(session: str = "good", **changes: Any) -> dict[str, Any]:
    return {"type": "turn.append", "session": session, "turn": {**turn_body(0), **changes}}


BAD_INPUT: list[tuple[str, Any, str]] = [
    ("not JSON", "{oops", "bad_request"),
    ("an array", "[1, 2, 3]", "bad_request"),
    ("no type", {"id": "x", "session": "room-1"}, "bad_request"),
    ("an unknown type", {"type": "turn.delete", "id": "x", "session": "room-1"}, "unknown_type"),
    ("no session", {"type": "turn.append", "id": "x", "turn": turn_body(0)}, "bad_request"),
    ("a role not in the list", bad_turn(role="god"), "bad_request"),
    ("a time that is not a number", bad_turn(at="now"), "bad_request"),
    ("an empty text", bad_turn(text=""), "bad_request"),
    ("a negative budget", {"type": "context.get", "session": "good", "budget_chars": -5}, "bad_request"),
    ("facts that are not strings", {"type": "context.get", "session": "good", "facts": [1]}, "bad_request"),
    ("an unknown config key", {"type": "session.open", "session": "o", "config": {"x": 1}}, "bad_request"),
    (
        "a bad config value",
        {"type": "session.open", "session": "o", "config": {"batch_size": 0}},
        "bad_request",
    ),
    ("a session never opened", bad_turn("nowhere"), "unknown_session"),
    (
        "the state of a session never opened",
        {"type": "session.state", "session": "nowhere"},
        "unknown_session",
    ),
    ("a text over the limit", bad_turn(text="x" * 201), "too_large"),
]


@pytest.mark.asyncio
async def test_every_bad_input_gets_its_documented_error_while_another_session_keeps_working() -> None:
    async with running(settings(max_text_chars=200)) as server, wire(server) as bot:
        await bot.open("good")
        for index, (what, message, code) in enumerate(BAD_INPUT):
            if isinstance(message, dict):
                message = {**message, "id": f"bad-{index}"}
            await bot.send(message)
            error = await bot.reply()
            assert error["type"] == "error", what
            assert error["code"] == code, f"{what}: {error}"
            assert error["message"], what
            if (isinstance(message, dict) and code != "bad_request") or what.startswith("a role"):
                assert error["id"] == f"bad-{index}", what
            appended = await bot.append("good", index)
            assert appended["index"] == index, f"after {what} the good session goes on"
        state = await bot.request("session.state", session="good")
        assert state["turns"] == len(BAD_INPUT)


@pytest.mark.asyncio
async def test_store_failures_and_bugs_answer_internal_and_the_connection_carries_on() -> None:
    async with running(store=BrokenStore()) as server, wire(server) as bot:
        for name in ("outage", "bug", "good"):
            await bot.open(name)
        with capture_logs() as logs:
            outage = await bot.append("outage", 0)
            bug = await bot.append("bug", 0)
        assert (outage["code"], outage["retryable"], outage["session"]) == ("internal", True, "outage")
        assert "disk unavailable" in outage["message"]
        assert (bug["code"], bug["retryable"], bug["message"]) == ("internal", False, "internal error")
        assert any(e["event"] == "voice_context_request_failed" and e["type"] == "turn.append" for e in logs)
        assert (await bot.append("good", 0))["index"] == 0


@pytest.mark.asyncio
async def test_a_binary_frame_closes_the_connection_with_1003() -> None:
    async with running() as server, wire(server) as bot:
        await bot.open("room-1")
        await bot.send(b'{"type": "ping"}')
        assert await bot.closed_with() == 1003


@pytest.mark.asyncio
async def test_a_frame_over_the_size_limit_closes_the_connection_with_1009() -> None:
    async with running(settings(max_frame_bytes=1024)) as server, wire(server) as bot:
        assert (await bot.request("ping"))["type"] == "pong"
        await bot.send({"type": "turn.append", "session": "s", "turn": turn_body(0, text="y" * 2000)})
        assert await bot.closed_with() == 1009


# -- times that cannot be a turn's: refused, and folded if stored ----------------------------------


@pytest.mark.asyncio
async def test_a_time_in_milliseconds_or_out_of_range_is_refused_and_the_session_goes_on() -> None:
    async with running(summarizer=DeterministicSummarizer()) as server, wire(server) as bot:
        await bot.open("room-1", config=SMALL)
        for at, words in (
            (1714572187000, "looks like milliseconds"),  # JavaScript's Date.now()
            (1e20, "between 0 and"),
            (-1e18, "between 0 and"),
        ):
            refused = await bot.append("room-1", 0, at=at)
            assert (refused["type"], refused["code"]) == ("error", "bad_request"), refused
            assert words in refused["message"]
        for i in range(4):
            assert (await bot.append("room-1", i))["index"] == i
        await bot.request("context.get", session="room-1")
        landed = await bot.push()
        assert (landed["type"], landed["cursor"]) == ("compaction.completed", 1)


@pytest.mark.asyncio
async def test_a_stored_turn_with_an_absurd_time_is_folded_like_any_other() -> None:
    store = MemoryStore()
    await store.create(SessionRecord("room-1", config=SMALL))
    for index, at in enumerate((1e20, -1e18, T0 * 1000)):  # written before the codec refused them
        await store.append_turn("room-1", index, Turn("Alice", "user", f"odd time {index}", at))
    async with running(summarizer=DeterministicSummarizer(), store=store) as server, wire(server) as bot:
        opened = await bot.open("room-1")
        assert (opened["resumed"], opened["turns"]) == (True, 3)
        for i in range(3, 8):
            await bot.append("room-1", i)
            await bot.request("context.get", session="room-1")
            landed = await bot.push()
            assert landed["type"] == "compaction.completed", landed
        state = await bot.request("session.state", session="room-1")
        assert (state["cursor"], state["failures"]) == (5, 0)
        ctx = await bot.request("context.get", session="room-1", format="instructions")
        assert "Odd time 1." in ctx["summary"]


# -- values, not only types; and a last guard in the server -------------------------


@pytest.mark.asyncio
async def test_a_list_or_an_object_where_a_string_belongs_gets_bad_request_not_a_closed_connection() -> None:
    async with running() as server, wire(server) as bot:
        await bot.open("room-1")
        for wrong in ([], {}, ["messages"]):
            refused = await bot.request("context.get", session="room-1", format=wrong)
            assert (refused["type"], refused["code"]) == ("error", "bad_request"), refused
            assert "format must be one of" in refused["message"]
        assert (await bot.request("context.get", session="room-1"))["type"] == "context"


@pytest.mark.asyncio
async def test_a_bug_while_reading_a_frame_answers_internal_and_the_connection_carries_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real_parse = codec.parse

    def parse_with_a_bug(frame: str | bytes, **kwargs: Any) -> Any:
        if "trigger-the-bug" in str(frame):
            raise RuntimeError("a bug in the codec")
        return real_parse(frame, **kwargs)

    monkeypatch.setattr(codec, "parse", parse_with_a_bug)
    async with running() as server, wire(server) as bot:
        await bot.open("room-1")
        with capture_logs() as logs:
            await bot.send({"type": "ping", "id": "trigger-the-bug"})
            failed = await bot.reply()
        assert (failed["type"], failed["code"], failed["retryable"]) == ("error", "internal", False)
        assert any(e["event"] == "voice_context_request_failed" for e in logs)
        assert (await bot.append("room-1", 0))["index"] == 0


@pytest.fixture(scope="module")
def live_bot() -> Iterator[tuple[BlockingPortal, Wire]]:
    """One real server and one connection to it, shared by every fuzz example."""
    with start_blocking_portal() as portal:
        server = Server(settings(), summarizer=ScriptedSummarizer(), store=MemoryStore())
        with (
            portal.wrap_async_context_manager(server),
            portal.wrap_async_context_manager(wire(server)) as bot,
        ):
            yield portal, bot


async def one_reply_each(bot: Wire, message: dict[str, Any], after: str) -> list[dict[str, Any]]:
    """Send a fuzzed message, then reopen room-1 and ping: every reply up to the pong."""
    await bot.send(json.dumps(message))
    await bot.send({"type": "session.open", "id": after, "session": "room-1"})
    await bot.send({"type": "ping", "id": after})
    replies = []
    while not replies or replies[-1] != {"type": "pong", "id": after, "protocol": 1}:
        replies.append(await bot.reply())
    return replies


FUZZ_IDS = itertools.count()


@hypothesis_settings(max_examples=300, deadline=None)
@given(message_like())
@pinned
def test_any_message_shaped_object_gets_exactly_one_reply_from_a_live_server(
    live_bot: tuple[BlockingPortal, Wire], obj: dict[str, Any]
) -> None:
    portal, bot = live_bot
    after = f"after-{next(FUZZ_IDS)}"
    replies = portal.call(one_reply_each, bot, obj, after)
    assert len(replies) == 3, replies
    answer, reopened, pong = replies
    assert answer.get("code") != "internal", (obj, answer)
    assert (reopened["type"], pong["type"]) == ("session.opened", "pong")
    assert not bot.ws.close_code


# -- a time zone that names no zone is a bad_request, not an internal error -----------------------

NOT_ZONES = ("x" * 300, "💥" * 100, "../../etc/passwd", "Europe\x00Berlin", "America/Argentina")
"""Looked up as files in the zone database (the tzdata package): a name too long for a file
name, a path out of the database, a NUL, a directory of zones."""


@pytest.mark.asyncio
async def test_a_time_zone_that_names_no_zone_is_a_bad_request_for_a_new_or_a_reopened_session() -> None:
    store = MemoryStore()
    async with running(store=store) as server, wire(server) as bot, wire(server) as other:
        await other.open("room-9", config={"time_zone": "Europe/Berlin"})
        await bot.open("room-1", config={"time_zone": "Europe/Lisbon"})
        await bot.append("room-1", 0)
        with capture_logs() as logs:
            for zone in NOT_ZONES:
                new = await bot.open("room-2", config={"time_zone": zone})
                again = await bot.open("room-1", config={"time_zone": zone})  # open on this connection
                for refused in (new, again):
                    assert (refused["type"], refused["code"]) == ("error", "bad_request"), refused
                    assert refused["message"].startswith("config.time_zone must be an IANA zone name")
            await bot.request("session.close", session="room-1")
            stored = await bot.open("room-1", config={"time_zone": "💥" * 100})  # resumed from the store
            assert stored["code"] == "bad_request"
        assert not [e for e in logs if e["log_level"] == "error"], "nothing failed inside the server"
        # the connection, the session, and the other connection's session all go on
        assert (await bot.request("session.state", session="room-2"))["code"] == "unknown_session"
        reopened = await bot.open("room-1")
        assert (reopened["resumed"], reopened["turns"]) == (True, 1)
        assert (await bot.append("room-1", 1))["index"] == 1
        assert (await other.append("room-9", 0))["index"] == 0
    record = await store.load("room-1")
    assert record is not None and record.config == {"time_zone": "Europe/Lisbon"}, "its zone unchanged"
    assert await store.load("room-2") is None, "a refused open creates nothing"
