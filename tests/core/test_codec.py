"""The wire codec: every client message decodes to a typed value, and nothing else crashes it."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
import pytest
from helpers import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from messages import field_values, json_values, message_like, pinned

from voice_context.codec import (
    CLIENT_TYPES,
    ERROR_CODES,
    SERVER_TYPES,
    Closed,
    Compacted,
    CompactionFailure,
    ContextGet,
    ContextReply,
    DecodeError,
    Deleted,
    Emergency,
    ErrorReply,
    HandoffReply,
    LandmarkFound,
    NoteAppend,
    NoteStored,
    Ping,
    Pinned,
    PinnedLandmark,
    Pong,
    RecalledLine,
    Reply,
    ServerMessage,
    SessionClose,
    SessionHandoff,
    SessionOpen,
    SessionOpened,
    SessionState,
    SessionStateGet,
    ShownLandmark,
    TurnAppend,
    TurnStored,
    Unpinned,
    decode,
    decode_reply,
    encode,
    encode_event,
    encode_reply,
    parse,
    parse_reply,
)
from voice_context.core.budget import build_context
from voice_context.core.handoff import Handoff, OpenQuestion
from voice_context.core.landmarks import Landmark
from voice_context.core.session import NotesChanged, Session, TurnAppended
from voice_context.core.turns import Note, Turn
from voice_context.errors import ProtocolError

T0 = 1714572187.0
DECODE_CODES = {"bad_request", "unknown_type", "too_large"}


def frame(**fields: Any) -> str:
    return orjson.dumps(fields).decode()


def turn_frame(**turn: Any) -> str:
    body = {"speaker": "Alice", "role": "user", "text": "hello there", "at": T0}
    body.update(turn)
    return frame(type="turn.append", id=7, session="room-1", turn=body)


def rejected(raw: str | bytes, **kwargs: Any) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode(raw, **kwargs)
    return info.value


# -- every message type decodes ------------------------------------------------------


def test_every_client_message_decodes_to_its_typed_value() -> None:
    assert decode(frame(type="session.open", id="o1", session="room-1", config={"batch_size": 5})) == (
        SessionOpen("room-1", {"batch_size": 5}, "o1")
    )
    assert decode(turn_frame(id="t-1")) == TurnAppend(
        "room-1", Turn("Alice", "user", "hello there", T0, "t-1"), 7
    )
    assert decode(
        frame(
            type="note.append",
            session="room-1",
            note={"text": "a spreadsheet", "at": T0, "speaker": "Bob", "source": "screen"},
        )
    ) == NoteAppend("room-1", Note("a spreadsheet", T0, "Bob", "screen"))
    assert decode(
        frame(
            type="context.get",
            id=3,
            session="room-1",
            format="instructions",
            budget_chars=5200,
            base_instructions="You are Nova.",
            facts=["Alice is vegan"],
        )
    ) == ContextGet("room-1", "instructions", 5200, "You are Nova.", ("Alice is vegan",), 3)
    assert decode(frame(type="session.state", session="room-1")) == SessionStateGet("room-1")
    assert decode(frame(type="session.close", session="room-1")) == SessionClose("room-1")
    assert decode(frame(type="ping", id=1)) == Ping(1)


def test_a_handoff_asks_for_at_most_fifty_turns_and_a_limit_that_is_a_count() -> None:
    assert decode(frame(type="session.handoff", session="s")) == SessionHandoff("s", None, "", (), None, 6)
    for bad in ({"last_turns": 51}, {"last_turns": -1}, {"last_turns": True}, {"limit_chars": -5}):
        error = rejected(frame(type="session.handoff", session="s", **bad))
        assert error.code == "bad_request", bad


def test_optional_fields_take_their_documented_defaults() -> None:
    message = decode(frame(type="context.get", session="s"))
    assert message == ContextGet("s", "messages", None, "", (), None)
    assert decode(frame(type="session.open", session="s")) == SessionOpen("s", None)


def test_integer_times_are_read_as_seconds_and_unknown_fields_are_ignored() -> None:
    message = decode(turn_frame(at=1714572187, mood="cheerful"))
    assert isinstance(message, TurnAppend)
    assert message.turn.at == T0


def test_bytes_frames_decode_like_text() -> None:
    assert decode(frame(type="ping").encode()) == Ping()


@pytest.mark.parametrize(
    "message",
    [
        SessionOpen("room-1", {"recent_window": 20}, "a"),
        SessionOpen("room 2 ✓"),
        TurnAppend("r", Turn("Nova", "assistant", "Sure.", 12.5, "t9"), 99),
        TurnAppend("r", Turn("tool-bot", "tool", "42", 0.0)),
        NoteAppend("r", Note("slides", 1.0), "n"),
        NoteAppend("r", Note("slides", 1.0, "Bob", "zoom")),
        ContextGet("r", "instructions", 0, "base", ("a", "b"), 5),
        ContextGet("r"),
        SessionStateGet("r", 1),
        SessionClose("r", "x"),
        SessionHandoff("r", 4000, "You are Nova.", ("Alice is vegan",), "the venue", 3, "h1"),
        SessionHandoff("r"),
        Ping("p", "r"),
    ],
)
def test_encode_is_the_inverse_of_decode(message: Any) -> None:
    assert decode(encode(message)) == message


# -- every bad input gets its documented code ------------------------------------------


@pytest.mark.parametrize(
    ("raw", "code", "words"),
    [
        ("not json", "bad_request", "not valid JSON"),
        ("", "bad_request", "not valid JSON"),
        ("[1, 2]", "bad_request", "JSON object"),
        ('"ping"', "bad_request", "JSON object"),
        (b"\xff\xfe", "bad_request", "not valid JSON"),
        (frame(session="s"), "bad_request", "type is required"),
        (frame(type=5, session="s"), "bad_request", "type must be a string"),
        (frame(type="turn.delete", session="s"), "unknown_type", "turn.delete"),
        (frame(type="turn.append"), "bad_request", "session is required"),
        (frame(type="session.open", session=""), "bad_request", "session must be"),
        (frame(type="session.open", session="x" * 201), "bad_request", "session must be"),
        (frame(type="session.open", session="a\nb"), "bad_request", "session must be"),
        (frame(type="session.open", session=7), "bad_request", "session must be"),
        (frame(type="session.open", session="s", config=[1]), "bad_request", "config must be an object"),
        (frame(type="ping", id=1.5), "bad_request", "id must be"),
        (frame(type="ping", id=True), "bad_request", "id must be"),
        (frame(type="ping", id="i" * 201), "bad_request", "id must be"),
        (frame(type="turn.append", session="s"), "bad_request", "turn is required"),
        (frame(type="turn.append", session="s", turn="hi"), "bad_request", "turn must be an object"),
        (turn_frame(role="narrator"), "bad_request", "turn.role must be one of"),
        (turn_frame(role=None), "bad_request", "turn.role is required"),
        (turn_frame(speaker=""), "bad_request", "turn.speaker must not be empty"),
        (turn_frame(speaker=3), "bad_request", "turn.speaker must be a string"),
        (turn_frame(text="   "), "bad_request", "turn.text must not be empty"),
        (turn_frame(at="yesterday"), "bad_request", "turn.at must be a number"),
        (turn_frame(at=None), "bad_request", "turn.at is required"),
        (turn_frame(at=False), "bad_request", "turn.at must be a number"),
        (turn_frame(at=1714572187000), "bad_request", "looks like milliseconds"),
        (turn_frame(at=1e20), "bad_request", "turn.at is 1e+20"),
        (turn_frame(at=-1e18), "bad_request", "between 0 and"),
        (frame(type="note.append", session="s", note={"text": "x", "at": -1}), "bad_request", "note.at"),
        (turn_frame(id=12), "bad_request", "turn.id must be a string"),
        (frame(type="note.append", session="s", note={"at": T0}), "bad_request", "note.text is required"),
        (frame(type="note.append", session="s", note={"text": "x"}), "bad_request", "note.at is required"),
        (frame(type="context.get", session="s", format="xml"), "bad_request", "format must be one of"),
        (frame(type="context.get", session="s", budget_chars=-1), "bad_request", "budget_chars"),
        (frame(type="context.get", session="s", budget_chars=10.5), "bad_request", "budget_chars"),
        (frame(type="context.get", session="s", budget_chars=True), "bad_request", "budget_chars"),
        (frame(type="context.get", session="s", facts="a"), "bad_request", "facts must be a list"),
        (frame(type="context.get", session="s", facts=[1]), "bad_request", "facts must be a list"),
        (frame(type="context.get", session="s", base_instructions=1), "bad_request", "base_instructions"),
    ],
)
def test_bad_input_gets_its_documented_code(raw: str | bytes, code: str, words: str) -> None:
    error = rejected(raw)
    assert error.code == code
    assert words in error.message


def test_a_readable_id_and_session_travel_with_the_error() -> None:
    error = rejected(turn_frame(role="narrator"))
    assert (error.id, error.session) == (7, "room-1")
    unknown = rejected(frame(type="dance", id="d1", session="room-9"))
    assert (unknown.code, unknown.id, unknown.session) == ("unknown_type", "d1", "room-9")


def test_text_over_the_limit_is_too_large_not_bad_request() -> None:
    assert decode(turn_frame(text="x" * 100), max_text_chars=100)
    error = rejected(turn_frame(text="x" * 101), max_text_chars=100)
    assert error.code == "too_large"
    assert "101 characters" in error.message
    note = frame(type="note.append", id=2, session="s", note={"text": "y" * 101, "at": 0})
    assert rejected(note, max_text_chars=100).code == "too_large"


def test_decode_errors_are_protocol_errors_with_documented_codes() -> None:
    error = rejected("{")
    assert isinstance(error, ProtocolError)
    assert DECODE_CODES <= ERROR_CODES


# -- fuzz: nothing crashes the decoder ---------------------------------------------------


def check_decodes_or_rejects(raw: str | bytes) -> None:
    try:
        message, sent = parse(raw, max_text_chars=50)
    except DecodeError as error:
        assert error.code in DECODE_CODES
        assert isinstance(error.message, str) and error.message
        assert error.id is None or isinstance(error.id, str | int)
    else:
        # whatever decodes re-encodes, and round-trips; and can be recorded as it was sent
        assert decode(encode(message), max_text_chars=50) == message
        assert orjson.loads(orjson.dumps(sent)) == sent


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_decodes_or_is_rejected(raw: str) -> None:
    check_decodes_or_rejects(raw)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_rejected(raw: bytes) -> None:
    check_decodes_or_rejects(raw)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_value_decodes_or_is_rejected(value: Any) -> None:
    check_decodes_or_rejects(json.dumps(value))


@settings(max_examples=600, deadline=None)
@given(message_like())
@pinned
def test_any_message_shaped_object_decodes_or_is_rejected(obj: dict[str, Any]) -> None:
    check_decodes_or_rejects(json.dumps(obj, ensure_ascii=False))


def test_lone_surrogates_and_deep_nesting_are_bad_requests() -> None:
    assert rejected('{"type": "ping", "id": "\\ud800"}').code == "bad_request"
    assert rejected("[" * 5000 + "]" * 5000).code == "bad_request"


# -- server messages -----------------------------------------------------------------------


def sent(frame: str) -> dict[str, Any]:
    """A server frame as the JSON object a bot reads."""
    value = orjson.loads(frame)
    assert isinstance(value, dict)
    return value


def test_server_messages_carry_the_contract_fields() -> None:
    session = Session("room-1")
    for i in range(3):
        session.receive(TurnAppended(Turn("Alice", "user", f"line {i}", T0 + i)))
    stats = session.stats()
    opened = sent(encode_reply(SessionOpened.of("room-1", False, stats, "o")))
    assert opened == {
        "type": "session.opened",
        "id": "o",
        "session": "room-1",
        "resumed": False,
        "turns": 3,
        "cursor": 0,
        "summary_chars": 0,
        "in_flight": False,
    }
    assert sent(encode_reply(TurnStored("room-1", 3, 4))) == {
        "type": "turn.appended",
        "id": 4,
        "session": "room-1",
        "index": 3,
    }
    noted = sent(encode_reply(NoteStored("room-1", NotesChanged(2, 1, 1, 0))))
    assert (noted["live"], noted["pending"]) == (2, 1)
    ctx = build_context(session.view(), "instructions", budget_chars=500)
    reply = sent(encode_reply(ContextReply.of("room-1", ctx, True, 9)))
    assert reply["type"] == "context"
    assert reply["instructions"] == ctx.instructions
    assert "messages" not in reply
    for key in ("summary", "cursor", "covered_through", "in_flight", "chars"):
        assert key in reply
    plain = build_context(session.view(), "messages")
    messages = sent(encode_reply(ContextReply.of("room-1", plain, False)))
    assert [m["content"] for m in messages["messages"]] == ["Alice: line 0", "Alice: line 1", "Alice: line 2"]
    state = sent(encode_reply(SessionState.of("room-1", stats)))
    for key in ("turns", "cursor", "in_flight", "summary_chars", "pending_notes", "failures"):
        assert key in state


def test_each_reply_is_the_frame_the_protocol_has_always_sent_and_reads_back_as_itself() -> None:
    session = Session("room-1")
    for i in range(2):
        session.receive(TurnAppended(Turn("Alice", "user", f"line {i}", T0 + i, f"t{i}")))
    stats = session.stats()
    said = Turn("Bob", "user", "the code is 4471", T0 + 1)
    code = Landmark(1, said, "decision", "a number", "manual", T0 + 9.5)
    ctx = build_context(session.view(), "messages", budget_chars=500)
    why = Turn("Alice", "user", "why?", T0 + 1)
    handoff = Handoff("be kind", 800, ((1, why),), (OpenQuestion(1, "Alice", "why?", T0 + 1),), 0, 2)
    frames: list[tuple[Reply, str]] = [
        (Pong(1), '{"type":"pong","id":1,"protocol":1}'),
        (
            SessionOpened.of("room-1", True, stats, "o"),
            '{"type":"session.opened","id":"o","session":"room-1","resumed":true,"turns":2,"cursor":0,'
            '"summary_chars":0,"in_flight":false}',
        ),
        (
            TurnStored("room-1", 1, 2, landmark=LandmarkFound.of(code)),
            '{"type":"turn.appended","id":2,"session":"room-1","index":1,'
            '"landmark":{"kind":"decision","reason":"a number","source":"manual"}}',
        ),
        (
            TurnStored("room-1", 1, 3, duplicate=True),
            '{"type":"turn.appended","id":3,"session":"room-1","index":1,"duplicate":true}',
        ),
        (
            NoteStored("room-1", NotesChanged(2, 1, 1, 0), 4),
            '{"type":"note.appended","id":4,"session":"room-1","live":2,"pending":1,"evicted":1,"dropped":0}',
        ),
        (
            ContextReply.of("room-1", ctx, False, 5, Emergency(0, 0, 0)),
            '{"type":"context","id":5,"session":"room-1","format":"messages","summary":"","cursor":0,'
            '"covered_through":-1,"in_flight":false,"chars":26,"first_turn":0,"turns_shown":2,'
            '"budget_chars":500,"budget_tokens":null,"tokens":null,"tokenizer":null,"dropped":[],"query":"",'
            '"recalled":[],"landmarks":[],"emergency":{"old_cursor":0,"cursor":0,"folded":0},'
            '"messages":[{"role":"user","content":"Alice: line 0"},'
            '{"role":"user","content":"Alice: line 1"}]}',
        ),
        (
            HandoffReply("room-1", handoff, 6),
            '{"type":"handoff","id":6,"session":"room-1","instructions":"be kind","chars":7,'
            '"limit_chars":800,"cursor":0,"turns":2,"recalled":0,'
            '"last_turns":[{"index":1,"speaker":"Alice","role":"user","text":"why?","at":1714572188.0}],'
            '"open_questions":[{"index":1,"speaker":"Alice","text":"why?","at":1714572188.0}]}',
        ),
        (
            SessionState.of("room-1", stats, 7),
            '{"type":"session.state","id":7,"session":"room-1","turns":2,"cursor":0,"in_flight":false,'
            '"summary_chars":0,"live_notes":0,"pending_notes":0,"failures":0,"compactions":0,'
            '"notes_dropped":0,"landmarks":0}',
        ),
        (
            Pinned("room-1", PinnedLandmark.of(code), 8),
            '{"type":"landmark.pinned","id":8,"session":"room-1","landmark":{"index":1,"kind":"decision",'
            '"reason":"a number","source":"manual","pinned_at":1714572196.5,"speaker":"Bob",'
            '"text":"the code is 4471","at":1714572188.0}}',
        ),
        (
            Unpinned("room-1", 1, True, 9),
            '{"type":"landmark.unpinned","id":9,"session":"room-1","index":1,"removed":true}',
        ),
        (Closed("room-1", 10), '{"type":"session.closed","id":10,"session":"room-1"}'),
        (Deleted("room-1"), '{"type":"session.deleted","session":"room-1"}'),
        (
            ErrorReply("too_large", "24 tokens", 11, "room-1", limit="limit_tokens", needed=24),
            '{"type":"error","id":11,"session":"room-1","code":"too_large","message":"24 tokens",'
            '"limit":"limit_tokens","needed":24}',
        ),
        (
            ErrorReply("internal", "the store failed: down", 12, "room-1", retryable=True),
            '{"type":"error","id":12,"session":"room-1","code":"internal","message":"the store failed: down",'
            '"retryable":true}',
        ),
    ]
    for reply, frame in frames:
        assert encode_reply(reply) == frame
        assert decode_reply(frame) == reply, frame
    assert Emergency.after(None, 4) == Emergency(4, 4, 0)


#: Server messages with every optional part filled in: each reads back as the value it was.
FULL: list[ServerMessage] = [
    ContextReply(
        session="room-1",
        format="instructions",
        summary="[1 May 2024, 14:03] Alice booked Lisbon.",
        cursor=12,
        covered_through=11,
        in_flight=True,
        chars=80,
        first_turn=10,
        turns_shown=4,
        budget_chars=2000,
        budget_tokens=600,
        tokens=23,
        tokenizer="o200k_base",
        dropped=("notes: no room",),
        query="when is the flight?",
        recalled=(RecalledLine("turn", "Alice: May 3rd", 3, "sentences"), RecalledLine("note", "a seat map")),
        landmarks=(ShownLandmark(2, "decision"),),
        instructions="Summary of earlier conversation: ...",
        emergency=Emergency(4, 12, 8),
        id="ctx-9",
    ),
    HandoffReply(
        "room-1",
        Handoff(
            "be kind",
            800,
            (
                (5, Turn("Nova", "assistant", "", T0, "c1", "call-1", "lookup", '{"city": "Lisbon"}')),
                (6, Turn("lookup", "tool", "sunny", T0 + 1, None, "call-1", "lookup")),
                (7, Turn("Alice", "user", "and the hotel?", T0 + 2)),
            ),
            (OpenQuestion(7, "Alice", "and the hotel?", T0 + 2),),
            4,
            8,
            3,
        ),
        "h",
    ),
    ErrorReply("rate_limited", "slow down", 3, "room-1", limit="turns_per_second", retry_after=0.05),
    Compacted("room-1", 10, 9, 120, 0.25, old_cursor=0, trigger="fill"),
    Compacted("room-1", 10, 9, 120, 0.25),
    CompactionFailure("room-1", 0, -1, 0, 0.1, error="timeout", retryable=True, failures=2, retry_at=T0),
]


@pytest.mark.parametrize("message", FULL, ids=[m.type for m in FULL])
def test_every_server_message_reads_back_as_the_value_it_was_written_from(message: ServerMessage) -> None:
    frame = (
        encode_event(message) if isinstance(message, Compacted | CompactionFailure) else encode_reply(message)
    )
    assert decode_reply(frame) == message
    read, obj = parse_reply(frame)
    assert read == message and obj == orjson.loads(frame)


def test_a_server_message_the_codec_cannot_read_is_refused_with_what_is_wrong() -> None:
    def refused(frame: str) -> DecodeError:
        with pytest.raises(DecodeError) as info:
            decode_reply(frame)
        return info.value

    assert refused("[]").message == "a server message must be a JSON object"
    assert refused('{"kind": "x"}').message == "a server message must have a string type"
    unknown = refused('{"type": "context.started", "id": 4}')
    assert (unknown.code, unknown.id) == ("unknown_type", 4)
    missing = refused('{"type": "turn.appended", "id": 5, "session": "room-1"}')
    assert (missing.code, missing.id) == ("bad_request", 5)
    assert missing.message == "turn.appended: index is required"
    flag = refused('{"type": "session.closed", "session": 7}')
    assert flag.message == "session.closed: session must be a string"
    half = '{"type": "context", "session": "r", "format": "messages", "summary": "", "cursor": 0}'
    assert refused(half).message == "context: covered_through is required"
    assert decode_reply('{"type": "pong", "protocol": 1, "added": "later"}') == Pong(protocol=1)


def check_reads_or_rejects(raw: str | bytes) -> None:
    """A server frame reads as a typed message of a type servers send, or is a ``DecodeError``."""
    try:
        message = decode_reply(raw)
    except DecodeError as exc:
        assert exc.code in {"bad_request", "unknown_type"}
        return
    assert message.type in SERVER_TYPES


@st.composite
def server_message_like(draw: st.DrawFn) -> str:
    """A frame a server sent, some of its fields dropped or given other values."""
    obj = orjson.loads(draw(st.sampled_from(FRAMES)))
    for key in list(obj):
        if draw(st.integers(0, 5)) == 0:
            del obj[key]
        elif draw(st.integers(0, 5)) == 0:
            obj[key] = draw(field_values)
    return json.dumps(obj, ensure_ascii=False)


@settings(max_examples=400, deadline=None)
@given(server_message_like() | json_values.map(json.dumps) | st.text(max_size=80))
def test_any_server_frame_reads_or_is_rejected(raw: str) -> None:
    check_reads_or_rejects(raw)


FRAMES = [
    encode_event(m) if isinstance(m, Compacted | CompactionFailure) else encode_reply(m) for m in FULL
] + [
    encode_reply(Pong(1)),
    encode_reply(TurnStored("room-1", 1, 2, landmark=LandmarkFound("decision", "a number", "heuristic"))),
    encode_reply(NoteStored("room-1", NotesChanged(2, 1, 1, 0), 4)),
    encode_reply(Pinned("room-1", PinnedLandmark(1, "decision", "", "manual", T0, "Bob", "4471", T0), 8)),
    encode_reply(Unpinned("room-1", 1, True, 9)),
]


def test_pushed_events_and_errors() -> None:
    done = sent(encode_event(Compacted("r", 10, 9, 120, 0.25, old_cursor=0)))
    assert done == {
        "type": "compaction.completed",
        "session": "r",
        "cursor": 10,
        "covered_through": 9,
        "summary_chars": 120,
        "latency": 0.25,
        "old_cursor": 0,
    }
    failed = CompactionFailure("r", 0, -1, 0, 0.1, error="timeout", retryable=True, failures=2, retry_at=T0)
    assert sent(encode_event(failed))["type"] == "compaction.failed"
    error = sent(encode_reply(ErrorReply("rate_limited", "slow down", 1, "r", retry_after=0.5)))
    assert error == {
        "type": "error",
        "id": 1,
        "session": "r",
        "code": "rate_limited",
        "message": "slow down",
        "retry_after": 0.5,
    }


# -- the documented examples are real messages ---------------------------------------------

PROTOCOL_DOC = ROOT / "docs" / "protocol.md"


def documented_examples() -> list[dict[str, Any]]:
    blocks = re.findall(r"```json\n(.*?)```", PROTOCOL_DOC.read_text(encoding="utf-8"), re.DOTALL)
    return [json.loads(block) for block in blocks]


def test_the_protocol_doc_shows_every_message_and_each_example_decodes() -> None:
    examples = documented_examples()
    shown = {example["type"] for example in examples}
    assert set(CLIENT_TYPES) <= shown
    assert shown - set(CLIENT_TYPES) >= set(SERVER_TYPES) - {"session.state"}
    for example in examples:
        if example.get("type") in CLIENT_TYPES and "turns" not in example:  # session.state has both
            assert decode(json.dumps(example)).type == example["type"]
        else:
            assert decode_reply(json.dumps(example)).type == example["type"], example
    codes = {example["code"] for example in examples if example["type"] == "error"}
    assert codes <= ERROR_CODES
    text = PROTOCOL_DOC.read_text(encoding="utf-8")
    for code in ERROR_CODES:
        assert f"| `{code}` |" in text, f"{code} has a row in the error table"
