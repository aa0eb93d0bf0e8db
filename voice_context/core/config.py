"""Per-session limits: small frozen values with named defaults, checked on creation."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from voice_context.core.tiers import parse_day_at, parse_week_at, parse_zone
from voice_context.core.tokens import DEFAULT_TOKENIZER, TOKENIZERS
from voice_context.errors import ConfigError

RECENT_WINDOW = 50
BATCH_SIZE = 10
MAX_SUMMARY_CHARS = 1200


@dataclass(frozen=True, slots=True)
class Rule:
    """What one session setting may be: its kind, the least a number may be, the most a
    client may ask for (``None``: the server's alone), and what it means."""

    kind: str
    """``count`` (an integer), ``share`` (0 to 1), ``seconds`` (a non-negative number),
    ``positive`` (a positive number), ``flag`` (true or false) or ``name`` (a string)."""
    doc: str
    least: int = 0
    most: int | float | None = None
    form: str = ""
    """What a ``name`` looks like, for the docs."""


def _setting(
    default: Any, kind: str, doc: str, *, least: int = 0, most: int | float | None = None, form: str = ""
) -> Any:
    """A field of :class:`SessionConfig`, declared once: its default and its :class:`Rule`."""
    return field(default=default, metadata={"rule": Rule(kind, doc, least, most, form)})


def _integer_of_at_least(least: int) -> str:
    return {0: "a non-negative integer", 1: "a positive integer"}.get(
        least, f"an integer of at least {least}"
    )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionConfig:
    """How one session keeps its context. Every field has the design's default, and is declared
    once: its default, what it may be, the most a client may ask for and what it means (its
    :class:`Rule`, in :data:`RULES`)."""

    recent_window: int = _setting(
        RECENT_WINDOW,
        "count",
        "turns kept verbatim at least (the window stretches while a compaction is in flight)",
        least=1,
        most=500,
    )
    batch_size: int = _setting(
        BATCH_SIZE,
        "count",
        "turns folded per compaction; compaction fires once more than recent_window + batch_size "
        "turns lie at or after the cursor",
        least=1,
        most=100,
    )
    max_summary_chars: int = _setting(
        MAX_SUMMARY_CHARS, "count", "the rolling summary's ceiling", least=40, most=20_000
    )
    summary_priority_chars: int = _setting(
        5000,
        "count",
        "in a budgeted context, how much of the summary outranks the older verbatim turns; the rest "
        "of a longer summary only takes the room those turns leave",
        least=40,
        most=20_000,
    )
    max_note_chars: int = _setting(
        400, "count", "how much of the pending screen notes one compaction folds in", most=4_000
    )
    live_note_entries: int = _setting(
        8, "count", "the live screen-note buffer: at most this many notes", least=1, most=64
    )
    live_note_chars: int = _setting(
        220, "count", "the live screen-note buffer: at most this many chars", least=1, most=2_000
    )
    max_pending_notes: int = _setting(
        64,
        "count",
        "evicted notes waiting to be folded; past this the oldest are dropped (and counted), so a "
        "dead summarizer cannot grow memory",
        most=256,
    )
    instructions_budget_chars: int = _setting(
        5200,
        "count",
        "the default budget of a realtime instructions context",
        least=1,
        most=100_000,
    )
    max_turn_chars: int = _setting(
        1200, "count", "each verbatim turn is clipped to this in a context", least=1, most=8_000
    )
    priority_turns: int = _setting(
        8,
        "count",
        "at least this many newest turns are protected too, when they fit, whatever their share",
        most=100,
    )
    recent_share: float = _setting(
        0.5,
        "share",
        "in a budgeted context, the share of the budget (after the base instructions) protected for "
        "the newest verbatim turns; they outrank everything but the base instructions and the "
        "current turn",
        most=1,
    )
    recent_floor: float = _setting(
        0.9,
        "share",
        "and at least this share of the newest turns the budget would hold if it held nothing else "
        "(what a plain tail of the transcript shows): recall and the summary never push the "
        "verbatim run below it",
        most=1,
    )
    recall: bool = _setting(
        True, "flag", "whether contexts recall old passages that bear on the query", most=1
    )
    recall_share: float = _setting(
        0.45,
        "share",
        "the share of a budget recall may take before the summary; room left once every verbatim "
        "turn is shown may take more passages",
        most=1,
    )
    summary_share: float = _setting(
        0.0,
        "share",
        "the share of a budget the summary takes before the older verbatim turns when a query is asked "
        "(never more than summary_priority_chars): its lines that bear on the query come through recall; "
        "the rest of a longer summary only takes the room those turns leave",
        most=1,
    )
    default_recall_share: float = _setting(
        0.1,
        "share",
        "recall_share for a context asked for without a query, whose query is then the newest user "
        "turn: what that turn is about is less certain than what a query names",
        most=1,
    )
    default_summary_share: float = _setting(
        0.4,
        "share",
        "summary_share for a context asked for without a query: the summary, the memory of "
        "everything older, gets more room",
        most=1,
    )
    recall_limit: int = _setting(24, "count", "at most this many recalled passages in one context", most=32)
    min_age_seconds: float = _setting(
        0.0,
        "seconds",
        "a turn becomes eligible for compaction only once it is this old at the time of the request "
        "(0 keeps the design's pure count rule)",
        most=3_600,
    )
    retry_base_seconds: float = _setting(
        2.0,
        "seconds",
        "after a failed compaction the next attempt waits base * 2**(failures-1), at most "
        "retry_max_seconds (the server's: it protects the summarizer, so no client may shorten it)",
    )
    retry_max_seconds: float = _setting(60.0, "seconds", "the longest wait between two attempts")
    tokenizer: str = _setting(
        DEFAULT_TOKENIZER,
        "name",
        "what a token budget is counted in: o200k_base (GPT-4o and later), cl100k_base (GPT-4, "
        "GPT-3.5), or chars (the chars/3.5 estimate, also what counts when no tokenizer is installed)",
        form="o200k_base, cl100k_base or chars",
    )
    fill_trigger: float = _setting(
        0.7,
        "share",
        "a context asked for under a budget also starts a compaction when the turns from the cursor "
        "on take more than this share of the room its layout protects for the newest turns (chars or "
        "tokens), whatever their count: they fold until half of that is left; 0 turns it off",
        most=1,
    )
    landmarks: bool = _setting(
        True,
        "flag",
        "whether turns are read for landmarks as they arrive (pinned and unpinned ones by hand count "
        "either way)",
        most=1,
    )
    landmark_share: float = _setting(
        0.25,
        "share",
        "the share of a budget the landmarks take, newest first, right after the current turn; more "
        "of them only take the room left at the end",
        most=1,
    )
    tool_result_iterations: int = _setting(
        2,
        "count",
        "tool results of the newest this many tool iterations are shown whole; older ones as a "
        "placeholder with the tool's name and the result's size",
        most=100,
    )
    tiers: bool = _setting(
        False,
        "flag",
        "whether the session keeps the tier cascade (voice_context.core.tiers): a summary per "
        "conversation, per day and per week, shown in place of the rolling summary for the periods "
        "they cover",
        most=1,
    )
    conversation_gap_seconds: float = _setting(
        1800.0, "positive", "a silence this long ends a conversation", most=7 * 86_400
    )
    time_zone: str = _setting(
        "UTC",
        "name",
        "the IANA zone days and weeks are counted in",
        form="an IANA zone name such as Europe/Berlin (at most 64 characters)",
    )
    day_roll_at: str = _setting("03:00", "name", "when a day is rolled, the next morning", form="HH:MM")
    week_roll_at: str = _setting(
        "Sun 04:00", "name", "the weekday a week starts on and is rolled, with the time", form="Sun HH:MM"
    )
    session_summary_chars: int = _setting(
        1500, "count", "the ceiling of each conversation's summary", least=1, most=20_000
    )
    day_summary_chars: int = _setting(
        1500, "count", "the ceiling of each day's summary", least=1, most=20_000
    )
    week_summary_chars: int = _setting(
        2000, "count", "the ceiling of each week's summary", least=1, most=20_000
    )

    def __post_init__(self) -> None:
        for name, rule in RULES.items():
            _check(name, rule, getattr(self, name))
        if self.recent_share + self.recall_share + self.summary_share > 1 + 1e-9:
            raise ConfigError("recent_share + recall_share + summary_share must not exceed 1")
        if self.recent_share + self.default_recall_share + self.default_summary_share > 1 + 1e-9:
            raise ConfigError("recent_share + default_recall_share + default_summary_share must not exceed 1")
        parse_zone(self.time_zone)
        parse_day_at(self.day_roll_at)
        parse_week_at(self.week_roll_at)
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
            named = ", ".join(name + did_you_mean(name, known) for name in unknown)
            raise ConfigError(f"unknown session config key(s): {named}")
        try:
            return replace(self, **overrides)
        except TypeError as exc:  # pragma: no cover - replace() only raises on unknown names
            raise ConfigError(str(exc)) from exc

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """What ends the error for an unknown key or group ``name``: `` (did you mean 'known'?)``
    with the one of ``known`` it is most likely a misspelling of, or ``""`` when none is close.
    Every place that refuses a name it does not know says it this way."""
    close = difflib.get_close_matches(name, sorted(set(known) - {name}), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check(name: str, rule: Rule, value: Any) -> None:
    if rule.kind == "count":
        if not isinstance(value, int) or isinstance(value, bool) or value < rule.least:
            raise ConfigError(f"{name} must be {_integer_of_at_least(rule.least)}, got {value!r}")
    elif rule.kind == "seconds":
        if not _number(value) or value < 0:
            raise ConfigError(f"{name} must be a non-negative number, got {value!r}")
    elif rule.kind == "positive":
        if not _number(value) or not value > 0:
            raise ConfigError(f"{name} must be a positive number, got {value!r}")
    elif rule.kind == "share":
        if not _number(value) or not 0 <= value <= 1:
            raise ConfigError(f"{name} must be a number between 0 and 1, got {value!r}")
    elif rule.kind == "flag":
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}")
    elif not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")


#: Every session setting's rule, in declaration order: the one table the checks, the client's
#: limits, the configuration file and the docs read.
RULES: Mapping[str, Rule] = {f.name: f.metadata["rule"] for f in fields(SessionConfig)}
#: The least each integer setting may be.
INTEGER_MINIMA: Mapping[str, int] = {name: r.least for name, r in RULES.items() if r.kind == "count"}
#: The fields a client may change when it opens a session, and the most it may ask for
#: (or the server's own default, when that is higher). The retry policy is the server's:
#: it protects the summarizer, so no client may shorten it.
CLIENT_MAXIMA: Mapping[str, int | float] = {n: r.most for n, r in RULES.items() if r.most is not None}
#: Fields a client may set that are names, not numbers (checked by :class:`SessionConfig`).
CLIENT_NAMES: frozenset[str] = frozenset(n for n, r in RULES.items() if r.kind == "name")


def settings_table() -> str:
    """The session settings as the protocol doc lists them (a test keeps the two the same)."""
    lines = ["| setting | default | a client may set | what it is |", "|---|---|---|---|"]
    for name, rule in RULES.items():
        default = SessionConfig.__dataclass_fields__[name].default
        shown = (
            str(default).lower()
            if isinstance(default, bool)
            else f"{default:g}"
            if _number(default)
            else default
        )
        if rule.kind == "name":
            allowed = rule.form
        elif rule.most is None:
            allowed = "no: the server's"
        elif rule.kind == "flag":
            allowed = "true or false"
        else:
            low = "more than 0" if rule.kind == "positive" else f"{rule.least:g}"
            allowed = f"{low} to {rule.most:g}" + (" (an integer)" if rule.kind == "count" else "")
        lines.append(f"| `{name}` | `{shown}` | {allowed} | {rule.doc} |")
    return "\n".join(lines)


def check_client_overrides(overrides: Mapping[str, Any], defaults: SessionConfig) -> None:
    """Refuse what a client may not ask of a session (``ConfigError``): a field outside
    :data:`CLIENT_MAXIMA` and :data:`CLIENT_NAMES`, or a number above its maximum."""
    allowed = [*CLIENT_MAXIMA, *sorted(CLIENT_NAMES)]
    refused = sorted(set(overrides) - set(allowed))
    if refused:
        # a setting only the server sets is named right; any other name may be a misspelt one
        named = ", ".join(name + ("" if name in RULES else did_you_mean(name, RULES)) for name in refused)
        raise ConfigError(f"session config cannot set {named}; a client may set: {', '.join(allowed)}")
    for name, value in overrides.items():
        if name in CLIENT_NAMES:
            continue
        limit = max(CLIENT_MAXIMA[name], getattr(defaults, name))
        if isinstance(value, int | float) and not isinstance(value, bool) and value > limit:
            raise ConfigError(f"{name} may be at most {limit:g} (asked for {value:g})")
