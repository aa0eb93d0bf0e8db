"""Per-session limits: small frozen values with named defaults, checked on creation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from voice_context.core.tiers import parse_day_at, parse_week_at, parse_zone
from voice_context.core.tokens import DEFAULT_TOKENIZER, TOKENIZERS
from voice_context.errors import ConfigError

RECENT_WINDOW = 50
BATCH_SIZE = 10
MAX_SUMMARY_CHARS = 1200
SUMMARY_PRIORITY_CHARS = 5000
MAX_NOTE_CHARS = 400
LIVE_NOTE_ENTRIES = 8
LIVE_NOTE_CHARS = 220
INSTRUCTIONS_BUDGET_CHARS = 5200
MAX_TURN_CHARS = 1200
RECENT_SHARE = 0.5
RECENT_FLOOR = 0.9
RECALL_SHARE = 0.45
SUMMARY_SHARE = 0.05
DEFAULT_RECALL_SHARE = 0.1
DEFAULT_SUMMARY_SHARE = 0.4
RECALL_LIMIT = 24
FILL_TRIGGER = 0.7
LANDMARK_SHARE = 0.25

#: The least each integer field of :class:`SessionConfig` may be: an integer below it (or a
#: float, or a boolean) is a ``ConfigError``. A summary needs room for one dated line (40).
INTEGER_MINIMA: Mapping[str, int] = {
    "recent_window": 1,
    "batch_size": 1,
    "max_summary_chars": 40,
    "summary_priority_chars": 40,
    "max_note_chars": 0,
    "live_note_entries": 1,
    "live_note_chars": 1,
    "max_pending_notes": 0,
    "instructions_budget_chars": 1,
    "max_turn_chars": 1,
    "priority_turns": 0,
    "recall_limit": 0,
    "tool_result_iterations": 0,
    "session_summary_chars": 1,
    "day_summary_chars": 1,
    "week_summary_chars": 1,
}


def _integer_of_at_least(least: int) -> str:
    return {0: "a non-negative integer", 1: "a positive integer"}.get(
        least, f"an integer of at least {least}"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """How one session keeps its context. Every field has the design's default.

    - ``recent_window``: turns kept verbatim at least (the window stretches while
      a compaction is in flight).
    - ``batch_size``: turns folded per compaction; compaction fires once more than
      ``recent_window + batch_size`` turns lie at or after the cursor.
    - ``max_summary_chars``: the rolling summary's ceiling.
    - ``summary_priority_chars``: in a budgeted context, how much of the summary
      outranks the older verbatim turns; the rest of a longer summary only takes
      the room those turns leave.
    - ``max_note_chars``: how much of the pending screen notes one compaction folds in.
    - ``live_note_entries`` / ``live_note_chars``: the live screen-note buffer.
    - ``max_pending_notes``: evicted notes waiting to be folded; past this the
      oldest are dropped (and counted), so a dead summarizer cannot grow memory.
    - ``instructions_budget_chars``: the default budget of a realtime
      ``instructions`` context.
    - ``max_turn_chars``: each verbatim turn is clipped to this in a context.
    - ``recent_share``: in a budgeted context, the share of the budget (after the
      base instructions) protected for the newest verbatim turns; they outrank
      everything but the base instructions and the current turn.
    - ``priority_turns``: at least this many newest turns are protected too, when
      they fit, whatever their share.
    - ``recent_floor``: and at least this share of the newest turns the budget
      would hold if it held nothing else (what a plain tail of the transcript
      shows): recall and the summary never push the verbatim run below it.
    - ``recall``: whether contexts recall old passages that bear on the query.
    - ``recall_share``: the share of a budget recall may take before the summary;
      room left once every verbatim turn is shown may take more passages.
    - ``summary_share``: the share of a budget the summary takes before the older
      verbatim turns (never more than ``summary_priority_chars``); the rest of a
      longer summary only takes the room those turns leave.
    - ``default_recall_share`` / ``default_summary_share``: the same two shares
      for a context asked for without a query, whose query is then the newest
      user turn: what that turn is about is less certain than what a query
      names, and the summary, the memory of everything older, gets more room.
    - ``recall_limit``: at most this many recalled passages in one context.
    - ``min_age_seconds``: a turn becomes eligible for compaction only once it is
      this old at the time of the request (0 keeps the design's pure count rule).
    - ``retry_base_seconds`` / ``retry_max_seconds``: after a failed compaction the
      next attempt waits ``base * 2**(failures-1)``, at most ``max``.
    - ``tokenizer``: what a token budget is counted in: ``o200k_base`` (GPT-4o and
      later), ``cl100k_base`` (GPT-4, GPT-3.5), or ``chars`` (the ``chars/3.5``
      estimate, which is also what counts when no tokenizer is installed).
    - ``fill_trigger``: a context asked for under a budget also starts a
      compaction when the verbatim turns from the cursor on pass this share of
      that budget (chars or tokens), whatever their count; 0 turns it off.
    - ``landmarks``: whether turns are read for landmarks as they arrive (pinned
      and unpinned ones by hand count either way).
    - ``landmark_share``: the share of a budget the landmarks take, newest first,
      right after the current turn; more of them only take the room left at the end.
    - ``tool_result_iterations``: tool results of the newest this many tool
      iterations are shown whole; older ones as a placeholder with the tool's
      name and the result's size.
    - ``tiers``: whether the session keeps the tier cascade (see
      :mod:`voice_context.core.tiers`): a summary per conversation, per day and per
      week, shown in place of the rolling summary for the periods they cover.
    - ``conversation_gap_seconds``: a silence this long ends a conversation.
    - ``time_zone``: the IANA zone days and weeks are counted in.
    - ``day_roll_at`` / ``week_roll_at``: when a day is rolled, the next morning
      (``03:00``), and the weekday a week starts on and is rolled, with the time
      (``Sun 04:00``).
    - ``session_summary_chars`` / ``day_summary_chars`` / ``week_summary_chars``: the
      ceiling of each tier's summaries.
    """

    recent_window: int = RECENT_WINDOW
    batch_size: int = BATCH_SIZE
    max_summary_chars: int = MAX_SUMMARY_CHARS
    summary_priority_chars: int = SUMMARY_PRIORITY_CHARS
    max_note_chars: int = MAX_NOTE_CHARS
    live_note_entries: int = LIVE_NOTE_ENTRIES
    live_note_chars: int = LIVE_NOTE_CHARS
    max_pending_notes: int = 64
    instructions_budget_chars: int = INSTRUCTIONS_BUDGET_CHARS
    max_turn_chars: int = MAX_TURN_CHARS
    priority_turns: int = 8
    recent_share: float = RECENT_SHARE
    recent_floor: float = RECENT_FLOOR
    recall: bool = True
    recall_share: float = RECALL_SHARE
    summary_share: float = SUMMARY_SHARE
    default_recall_share: float = DEFAULT_RECALL_SHARE
    default_summary_share: float = DEFAULT_SUMMARY_SHARE
    recall_limit: int = RECALL_LIMIT
    min_age_seconds: float = 0.0
    retry_base_seconds: float = 2.0
    retry_max_seconds: float = 60.0
    tokenizer: str = DEFAULT_TOKENIZER
    fill_trigger: float = FILL_TRIGGER
    landmarks: bool = True
    landmark_share: float = LANDMARK_SHARE
    tool_result_iterations: int = 2
    tiers: bool = False
    conversation_gap_seconds: float = 1800.0
    time_zone: str = "UTC"
    day_roll_at: str = "03:00"
    week_roll_at: str = "Sun 04:00"
    session_summary_chars: int = 1500
    day_summary_chars: int = 1500
    week_summary_chars: int = 2000

    def __post_init__(self) -> None:
        for name, least in INTEGER_MINIMA.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"{name} must be {_integer_of_at_least(least)}, got {value!r}")
        for name in ("min_age_seconds", "retry_base_seconds", "retry_max_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be a non-negative number, got {value!r}")
        shares = (
            "recent_share",
            "recent_floor",
            "recall_share",
            "summary_share",
            "default_recall_share",
            "default_summary_share",
            "fill_trigger",
            "landmark_share",
        )
        for name in shares:
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ConfigError(f"{name} must be a number between 0 and 1, got {value!r}")
        if self.recent_share + self.recall_share + self.summary_share > 1 + 1e-9:
            raise ConfigError("recent_share + recall_share + summary_share must not exceed 1")
        if self.recent_share + self.default_recall_share + self.default_summary_share > 1 + 1e-9:
            raise ConfigError("recent_share + default_recall_share + default_summary_share must not exceed 1")
        gap = self.conversation_gap_seconds
        if not isinstance(gap, int | float) or isinstance(gap, bool) or not gap > 0:
            raise ConfigError(f"conversation_gap_seconds must be a positive number, got {gap!r}")
        parse_zone(self.time_zone)
        parse_day_at(self.day_roll_at)
        parse_week_at(self.week_roll_at)
        for name in ("recall", "landmarks", "tiers"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.tokenizer not in TOKENIZERS:
            known = ", ".join(sorted(TOKENIZERS))
            raise ConfigError(f"tokenizer must be one of {known}, got {self.tokenizer!r}")

    def with_overrides(self, overrides: dict[str, Any] | None) -> SessionConfig:
        """A copy with some fields changed; unknown names raise ``ConfigError``."""
        if not overrides:
            return self
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise ConfigError(f"unknown session config key(s): {', '.join(unknown)}")
        try:
            return replace(self, **overrides)
        except TypeError as exc:  # pragma: no cover - replace() only raises on unknown names
            raise ConfigError(str(exc)) from exc

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: The fields a client may change when it opens a session, and the most it may ask for
#: (or the server's own default, when that is higher). The retry policy is the server's:
#: it protects the summarizer, so no client may shorten it.
CLIENT_MAXIMA: Mapping[str, int | float] = {
    "recent_window": 500,
    "batch_size": 100,
    "max_summary_chars": 20_000,
    "summary_priority_chars": 20_000,
    "max_note_chars": 4_000,
    "live_note_entries": 64,
    "live_note_chars": 2_000,
    "max_pending_notes": 256,
    "instructions_budget_chars": 100_000,
    "max_turn_chars": 8_000,
    "priority_turns": 100,
    "min_age_seconds": 3_600,
    "recent_share": 1,
    "recent_floor": 1,
    "recall": 1,
    "recall_share": 1,
    "summary_share": 1,
    "default_recall_share": 1,
    "default_summary_share": 1,
    "recall_limit": 32,
    "fill_trigger": 1,
    "landmarks": 1,
    "landmark_share": 1,
    "tool_result_iterations": 100,
    "tiers": 1,
    "conversation_gap_seconds": 7 * 86_400,
    "session_summary_chars": 20_000,
    "day_summary_chars": 20_000,
    "week_summary_chars": 20_000,
}
#: Fields a client may set that are names, not numbers (checked by :class:`SessionConfig`).
CLIENT_NAMES: frozenset[str] = frozenset({"tokenizer", "time_zone", "day_roll_at", "week_roll_at"})


def check_client_overrides(overrides: Mapping[str, Any], defaults: SessionConfig) -> None:
    """Refuse what a client may not ask of a session (``ConfigError``): a field outside
    :data:`CLIENT_MAXIMA` and :data:`CLIENT_NAMES`, or a number above its maximum."""
    refused = sorted(set(overrides) - set(CLIENT_MAXIMA) - CLIENT_NAMES)
    if refused:
        allowed = ", ".join([*CLIENT_MAXIMA, *sorted(CLIENT_NAMES)])
        raise ConfigError(f"session config cannot set {', '.join(refused)} (a client may set: {allowed})")
    for name, value in overrides.items():
        if name in CLIENT_NAMES:
            continue
        limit = max(CLIENT_MAXIMA[name], getattr(defaults, name))
        if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
            raise ConfigError(f"{name} may be at most {limit:g} (asked for {value:g})")
