"""What the durable stores share: how turns and notes are written down; ``TurnConflict`` is re-exported."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import orjson

from voice_context.core.landmarks import Landmark
from voice_context.core.tiers import TierSummary
from voice_context.core.turns import ROLES, Note, Role, Turn
from voice_context.errors import StoreError, TurnConflict


def tool_field(turn: Turn) -> str | None:
    """A tool turn's call id, tool name and arguments as one JSON array (``None`` for other turns)."""
    if turn.tool_call_id is None:
        return None
    return orjson.dumps([turn.tool_call_id, turn.tool_name, turn.tool_arguments]).decode()


def turn_fields(turn: Turn) -> tuple[str, str, str, float, str | None, str | None]:
    return (turn.speaker, turn.role, turn.text, float(turn.at), turn.id, tool_field(turn))


def make_turn(speaker: str, role: str, text: str, at: float, id: str | None, tool: str | None = None) -> Turn:
    if role not in ROLES:
        raise StoreError(f"stored turn has an unknown role {role!r}", retryable=False)
    if tool is None:
        return Turn(speaker, cast(Role, role), text, float(at), id)
    try:
        call_id, name, arguments = orjson.loads(tool)
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise StoreError(f"stored tool turn is unreadable: {exc}", retryable=False) from exc
    return Turn(speaker, cast(Role, role), text, float(at), id, call_id, name, arguments)


def encode_turn(turn: Turn) -> str:
    """One turn as a compact JSON array; equal turns always encode to equal strings (a tool
    turn carries a sixth element, the :func:`tool_field`)."""
    fields = turn_fields(turn)
    return orjson.dumps(fields if fields[5] is not None else fields[:5]).decode()


def decode_turn(raw: str | bytes) -> Turn:
    try:
        fields = orjson.loads(raw)
        speaker, role, text, at, id = fields[:5]
        tool = fields[5] if len(fields) > 5 else None
    except (orjson.JSONDecodeError, ValueError, TypeError) as exc:
        raise StoreError(f"stored turn is unreadable: {exc}", retryable=False) from exc
    return make_turn(speaker, role, text, at, id, tool)


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


def encode_tier(summary: TierSummary) -> str:
    return orjson.dumps(summary.as_dict()).decode()


def decode_tier(raw: str | bytes) -> TierSummary:
    try:
        value = orjson.loads(raw)
        if not isinstance(value, dict):
            raise ValueError("not an object")
        return TierSummary.from_dict(value)
    except (orjson.JSONDecodeError, ValueError, KeyError, TypeError) as exc:
        raise StoreError(f"stored tier summary is unreadable: {exc}", retryable=False) from exc


def tier_field(summary: TierSummary) -> str:
    """A tier summary's name within its session: its tier and the start of its period."""
    return f"{summary.tier}:{summary.start!r}"


__all__ = [
    "TurnConflict",
    "decode_config",
    "decode_landmark",
    "decode_notes",
    "decode_tier",
    "decode_turn",
    "encode_config",
    "encode_landmark",
    "encode_notes",
    "encode_tier",
    "encode_turn",
    "make_turn",
    "tier_field",
    "turn_fields",
]
