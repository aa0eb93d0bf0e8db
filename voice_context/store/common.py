"""What the durable stores share: how turns and notes are written down; ``TurnConflict`` is re-exported."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import orjson

from voice_context.core.landmarks import Landmark
from voice_context.core.turns import ROLES, Note, Role, Turn
from voice_context.errors import StoreError, TurnConflict


def turn_fields(turn: Turn) -> tuple[str, str, str, float, str | None]:
    return (turn.speaker, turn.role, turn.text, float(turn.at), turn.id)


def make_turn(speaker: str, role: str, text: str, at: float, id: str | None) -> Turn:
    if role not in ROLES:
        raise StoreError(f"stored turn has an unknown role {role!r}", retryable=False)
    return Turn(speaker, cast(Role, role), text, float(at), id)


def encode_turn(turn: Turn) -> str:
    """One turn as a compact JSON array; equal turns always encode to equal strings."""
    return orjson.dumps(turn_fields(turn)).decode()


def decode_turn(raw: str | bytes) -> Turn:
    try:
        speaker, role, text, at, id = orjson.loads(raw)
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise StoreError(f"stored turn is unreadable: {exc}", retryable=False) from exc
    return make_turn(speaker, role, text, at, id)


def encode_notes(notes: Iterable[Note]) -> str:
    return orjson.dumps(
        [{"text": n.text, "at": float(n.at), "speaker": n.speaker, "source": n.source} for n in notes]
    ).decode()


def decode_notes(raw: str | bytes | None) -> tuple[Note, ...]:
    if not raw:
        return ()
    try:
        items: Sequence[dict[str, Any]] = orjson.loads(raw)
        return tuple(Note(i["text"], float(i["at"]), i.get("speaker"), i.get("source")) for i in items)
    except (orjson.JSONDecodeError, ValueError, TypeError, KeyError) as exc:
        raise StoreError(f"stored notes are unreadable: {exc}", retryable=False) from exc


def encode_config(config: dict[str, Any]) -> str:
    try:
        return orjson.dumps(config, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError as exc:
        raise ValueError(f"session config cannot be stored: {exc}") from exc


def decode_config(raw: str | bytes | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise StoreError(f"stored session config is unreadable: {exc}", retryable=False) from exc
    if not isinstance(value, dict):
        raise StoreError("stored session config is not an object", retryable=False)
    return value


def encode_landmark(landmark: Landmark) -> str:
    return orjson.dumps(landmark.as_dict()).decode()


def decode_landmark(raw: str | bytes) -> Landmark:
    try:
        value = orjson.loads(raw)
        if not isinstance(value, dict):
            raise ValueError("not an object")
        return Landmark.from_dict(value)
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise StoreError(f"stored landmark is unreadable: {exc}", retryable=False) from exc


__all__ = [
    "TurnConflict",
    "decode_config",
    "decode_landmark",
    "decode_notes",
    "decode_turn",
    "encode_config",
    "encode_landmark",
    "encode_notes",
    "encode_turn",
    "make_turn",
    "turn_fields",
]
