"""Client messages for the fuzzers: objects shaped like them, with plausible and implausible
fields, and the inputs that once got past the decoder's checks. The codec's fuzzer
(``core/test_codec.py``) and the live server's (``wire/test_bad_input.py``) share them."""

from __future__ import annotations

from typing import Any

from hypothesis import example as pin
from hypothesis import strategies as st

from voice_context.codec import CLIENT_TYPES


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


#: Inputs that once got past the decoder's checks; each stays pinned.
PINNED: list[dict[str, Any]] = [
    {"type": "context.get", "session": "room-1", "format": []},
    {"type": "context.get", "session": "room-1", "format": {}},
    {"type": "ping", "x": nested(300)},
    {
        "type": "turn.append",
        "session": "room-1",
        "turn": {"speaker": "A", "role": "user", "text": "t", "at": 1.7e12},
    },
    {"type": "note.append", "session": "room-1", "note": {"text": "t", "at": 1e20}},
    {"type": "note.append", "session": "room-1", "note": {"text": "t", "at": -1e18}},
]


def pinned(test: Any) -> Any:
    for obj in PINNED:
        test = pin(obj)(test)
    return test


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=60),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5)
    ),
    max_leaves=20,
)
field_values = (
    st.sampled_from(["room-1", "", "x" * 201, "a\tb", "user", "assistant", "messages", "instructions"])
    | json_values
)


@st.composite
def message_like(draw: st.DrawFn) -> dict[str, Any]:
    """Objects shaped like client messages, with plausible and implausible fields."""
    obj: dict[str, Any] = {}
    if draw(st.booleans()):
        obj["type"] = draw(st.sampled_from(CLIENT_TYPES) | st.text(max_size=12) | json_values)
    for key in ("id", "session", "config", "format", "budget_chars", "base_instructions", "facts"):
        if draw(st.integers(0, 3)) == 0:
            obj[key] = draw(field_values)
    for key, keys in (("turn", ("speaker", "role", "text", "at", "id")), ("note", ("text", "at", "speaker"))):
        if draw(st.booleans()):
            obj[key] = {k: draw(field_values) for k in keys if draw(st.integers(0, 4))}
    return obj
