"""The tier cascade: the older a part of a session, the coarser its summary.

Turns make **conversations**: a conversation ends where the next turn comes more
than ``conversation_gap_seconds`` after the last one (30 minutes by default), when
the clock passes that gap, or when the session closes. Each ended conversation is
rolled into a **session** summary; the conversations that began on one local day
(in the session's ``time_zone``) into a **day** summary, once that day's roll time
has passed (03:00 the next morning by default); and the days of a week (Sunday to
Saturday by default) into a **week** summary at the week's roll time (Sunday 04:00).
Each summary says the period it covers and the turns it covers (``first_turn`` to
``end_turn``, end exclusive).

Everything here is pure: :func:`conversations` splits turn times, :func:`due_rolls`
says which rolls the clock and the summaries made so far call for (a sweep: every
period without its summary, however far back), :func:`should_replace` is the rule a
store applies so that a roll never lands over a newer one, and :func:`compose` picks
what a context shows: for each part of the history the coarsest summary that covers
it, never two summaries for the same turns, and only summaries wholly behind the
cursor (the turns after it are shown verbatim or folded into the rolling summary).
The shell (:mod:`voice_context.tiering`) reads turns, calls the summarizer and stores.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, time, timedelta
from typing import Any, Literal
from zoneinfo import ZoneInfo

from voice_context.errors import ConfigError

Tier = Literal["session", "day", "week"]
TIERS: tuple[Tier, ...] = ("session", "day", "week")
"""Finest first: each rolls into the next."""

WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_WEEK_AT = re.compile(r"^(Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\s+(\d{1,2}):(\d{2})$", re.IGNORECASE)
_DAY_AT = re.compile(r"^(\d{1,2}):(\d{2})$")
#: The longest zone name taken (the longest IANA name, America/Argentina/ComodRivadavia, has 32).
MAX_ZONE_CHARS = 64
#: How much of a name that is not a zone's an error shows.
SHOWN_CHARS = 40
#: What a zone name is made of: ASCII words of letters, digits, ``_``, ``-`` and ``+``, joined
#: by single slashes (no dots, so no ``..``, and no leading slash).
_ZONE = re.compile(r"[A-Za-z0-9_+-]+(?:/[A-Za-z0-9_+-]+)*", re.ASCII)


def _clock_time(hours: str, minutes: str, text: str) -> time:
    h, m = int(hours), int(minutes)
    if h > 23 or m > 59:
        raise ConfigError(f"not a time of day: {text!r}")
    return time(h, m)


def parse_day_at(text: str) -> time:
    """``"03:00"``: the local time a day is rolled, the next morning."""
    match = _DAY_AT.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(f"day_roll_at must look like 03:00, got {text!r}")
    return _clock_time(match[1], match[2], text)


def parse_week_at(text: str) -> tuple[int, time]:
    """``"Sun 04:00"``: the weekday (0 Monday .. 6 Sunday) a week starts and is rolled on,
    and the local time of the roll."""
    match = _WEEK_AT.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ConfigError(f"week_roll_at must look like 'Sun 04:00', got {text!r}")
    return WEEKDAYS.index(match[1][:3].title()), _clock_time(match[2], match[3], text)


def parse_zone(name: object) -> ZoneInfo:
    """``"Europe/Berlin"``: the IANA zone days and weeks are counted in, from the zone
    database (the ``tzdata`` package, or the system's).

    Raises ``ConfigError``, and nothing else, for anything but the name of a zone the
    database holds: a name is looked up as a file, so one that is not shaped like a zone
    name (too long, a NUL, a path such as ``../../etc/passwd``, a directory of zones) is
    refused before the lookup, and what the lookup raises all the same is translated."""
    if not isinstance(name, str) or len(name) > MAX_ZONE_CHARS or _ZONE.fullmatch(name) is None:
        raise _not_a_zone(name)
    try:
        return ZoneInfo(name)
    except Exception as exc:  # not found, a directory, not a zone file, a truncated one: no zone
        raise _not_a_zone(name) from exc


def _not_a_zone(name: object) -> ConfigError:
    shown = repr(name)
    if len(shown) > SHOWN_CHARS:  # not echoed back whole
        shown = f"{shown[:SHOWN_CHARS]}…"
    if isinstance(name, str) and len(name) > MAX_ZONE_CHARS:
        shown += f" ({len(name)} characters, at most {MAX_ZONE_CHARS})"
    return ConfigError(f"time_zone must be an IANA zone name such as Europe/Berlin, got {shown}")


UTC_ZONE = ZoneInfo("UTC")


@dataclass(frozen=True, slots=True)
class Schedule:
    """When conversations end and days and weeks are rolled, read from a session's config."""

    gap: float = 1800.0
    zone: ZoneInfo = UTC_ZONE
    day_at: time = time(3, 0)
    week_day: int = 6
    week_at: time = time(4, 0)

    @classmethod
    def of(cls, config: Any) -> Schedule:
        """From a :class:`~voice_context.core.config.SessionConfig` (already checked)."""
        week_day, week_at = parse_week_at(config.week_roll_at)
        return cls(
            gap=float(config.conversation_gap_seconds),
            zone=parse_zone(config.time_zone),
            day_at=parse_day_at(config.day_roll_at),
            week_day=week_day,
            week_at=week_at,
        )

    def day_of(self, at: float) -> tuple[float, float]:
        """The local day holding ``at``: its start and end (unix seconds; 23 or 25 hours
        long on the days clocks change)."""
        local = datetime.fromtimestamp(at, tz=self.zone).date()
        start = datetime.combine(local, time(0), tzinfo=self.zone)
        end = datetime.combine(local + timedelta(days=1), time(0), tzinfo=self.zone)
        return start.timestamp(), end.timestamp()

    def week_of(self, at: float) -> tuple[float, float]:
        """The week holding ``at``, from the local midnight of its first weekday."""
        local = datetime.fromtimestamp(at, tz=self.zone).date()
        first = local - timedelta(days=(local.weekday() - self.week_day) % 7)
        start = datetime.combine(first, time(0), tzinfo=self.zone)
        end = datetime.combine(first + timedelta(days=7), time(0), tzinfo=self.zone)
        return start.timestamp(), end.timestamp()

    def rolls_at(self, tier: Tier, end: float) -> float:
        """When a period ending at ``end`` (a local midnight) is due: that morning's roll time."""
        local = datetime.fromtimestamp(end, tz=self.zone).date()
        at = self.day_at if tier == "day" else self.week_at
        return datetime.combine(local, at, tzinfo=self.zone).timestamp()


@dataclass(frozen=True, slots=True)
class TierSummary:
    """One rolled summary: of a conversation, a day or a week.

    ``start``/``end`` is the period it covers (for a conversation, its first and last
    turn's time; for a day or a week, local midnight to local midnight);
    ``first_turn``/``end_turn`` the turns it covers; ``made_at`` when it was rolled.
    """

    tier: Tier
    start: float
    end: float
    first_turn: int
    end_turn: int
    text: str
    made_at: float = 0.0

    @property
    def key(self) -> tuple[Tier, float]:
        return self.tier, self.start

    def covers(self, index: int) -> bool:
        return self.first_turn <= index < self.end_turn

    def as_dict(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "start": self.start,
            "end": self.end,
            "first_turn": self.first_turn,
            "end_turn": self.end_turn,
            "text": self.text,
            "made_at": self.made_at,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TierSummary:
        tier = data["tier"]
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}")
        return cls(
            tier=tier,
            start=float(data["start"]),
            end=float(data["end"]),
            first_turn=int(data["first_turn"]),
            end_turn=int(data["end_turn"]),
            text=str(data["text"]),
            made_at=float(data.get("made_at", 0.0)),
        )

    def heading(self, zone: ZoneInfo | None = None) -> str:
        """The period the summary is of, in words, and nothing else (a heading is nobody's
        sentence): ``8 May 2023, 13:56 to 14:40`` (a conversation), ``8 May 2023`` (a day),
        ``7 May 2023 to 13 May 2023`` (a week)."""
        zone = zone or UTC_ZONE
        start = datetime.fromtimestamp(self.start, tz=zone)
        if self.tier == "session":
            end = datetime.fromtimestamp(self.end, tz=zone)
            until = f"{end:%H:%M}" if end.date() == start.date() else _date(end) + f", {end:%H:%M}"
            return f"{_date(start)}, {start:%H:%M} to {until}"
        if self.tier == "day":
            return _date(start)
        last = datetime.fromtimestamp(self.end, tz=zone) - timedelta(hours=12)
        return f"{_date(start)} to {_date(last)}"

    def render(self, zone: ZoneInfo | None = None) -> str:
        return f"{self.heading(zone)}:\n{self.text.strip()}"


def _date(when: datetime) -> str:
    return f"{when.day} {when:%B %Y}"


def should_replace(existing: TierSummary | None, new: TierSummary) -> bool:
    """Whether a store keeps ``new`` for its tier and period: when it has none, or when
    ``new`` covers more turns (a roll made after late turns arrived). An equal roll is
    the same roll made twice (two replicas): the first stays. An older roll never lands
    over a newer one."""
    return existing is None or new.end_turn > existing.end_turn


@dataclass(frozen=True, slots=True)
class Conversation:
    """Turns ``first..end-1``, none more than the gap after the one before."""

    first: int
    end: int
    start_at: float
    last_at: float


def conversations(times: Sequence[float], gap: float, first: int = 0) -> list[Conversation]:
    """Split turns (their times, from transcript index ``first``) where the gap between two
    is longer than ``gap`` seconds. A turn whose time goes backwards stays in its conversation."""
    found: list[Conversation] = []
    if not times:
        return found
    begin, start_at, last_at = first, times[0], times[0]
    for offset, at in enumerate(times[1:], start=1):
        if at - last_at > gap:
            found.append(Conversation(begin, first + offset, start_at, last_at))
            begin, start_at = first + offset, at
        last_at = max(last_at, at)
    found.append(Conversation(begin, first + len(times), start_at, last_at))
    return found


@dataclass(frozen=True, slots=True)
class Roll:
    """One summary to make. A session roll summarizes turns ``first_turn..end_turn-1``;
    a day or week roll condenses ``inputs``, the finer summaries of its period."""

    tier: Tier
    start: float
    end: float
    first_turn: int
    end_turn: int
    inputs: tuple[TierSummary, ...] = ()

    def made(self, text: str, at: float) -> TierSummary:
        return TierSummary(self.tier, self.start, self.end, self.first_turn, self.end_turn, text, at)

    def __repr__(self) -> str:
        return f"<Roll {self.tier} turns={self.first_turn}..{self.end_turn - 1} inputs={len(self.inputs)}>"


def due_rolls(
    spans: Sequence[Conversation],
    rows: Sequence[TierSummary],
    now: float,
    schedule: Schedule,
    *,
    closed: bool = False,
    on_demand: bool = False,
    tiers: Sequence[Tier] = TIERS,
) -> list[Roll]:
    """The rolls due at ``now``, finest first, given the conversations and the summaries
    already made. A day or week roll is due once its roll time has passed and every finer
    summary of its period exists; rolls whose inputs a finer roll in this list makes come
    in a later call (the shell calls again until nothing is due). ``on_demand`` rolls a
    period as soon as it has ended, whatever the schedule; ``closed`` ends the last
    conversation now."""
    by_key = {row.key: row for row in rows}
    due: list[Roll] = []
    ended = [
        c
        for k, c in enumerate(spans)
        if k + 1 < len(spans) or closed or on_demand or now - c.last_at >= schedule.gap
    ]
    if "session" in tiers:
        for c in ended:
            roll = Roll("session", c.start_at, c.last_at, c.first, c.end)
            if should_replace(by_key.get(("session", c.start_at)), roll.made("", now)):
                due.append(roll)
    sessions = {row.start: row for row in rows if row.tier == "session"}
    days = {row.start: row for row in rows if row.tier == "day"}

    def rolled(c: Conversation, tier: Tier) -> bool:
        """Whether ``c`` is in a finished summary of ``tier``."""
        found = sessions.get(c.start_at) if tier == "session" else days.get(schedule.day_of(c.start_at)[0])
        return c in ended and found is not None and found.end_turn >= c.end

    coarser: tuple[tuple[Tier, Tier, Callable[[float], tuple[float, float]]], ...] = (
        ("day", "session", schedule.day_of),
        ("week", "day", schedule.week_of),
    )
    for tier, finer, period in coarser:
        if tier not in tiers:
            continue
        # a period waits for every conversation begun in it to be in its finer summaries
        waiting = {period(c.start_at) for c in spans if not rolled(c, finer)}
        if tier == "week":  # and for every conversation summary of it to be in its day's
            waiting |= {
                period(row.start)
                for row in sessions.values()
                if (day := days.get(schedule.day_of(row.start)[0])) is None or day.end_turn < row.end_turn
            }
        groups: dict[tuple[float, float], list[TierSummary]] = {}
        for made in rows:
            if made.tier == finer:
                groups.setdefault(period(made.start), []).append(made)
        for (start, end), members in sorted(groups.items()):
            if (start, end) in waiting:
                continue
            if now < (end if on_demand else schedule.rolls_at(tier, end)):
                continue
            members.sort(key=lambda r: r.first_turn)
            first, last = members[0].first_turn, max(r.end_turn for r in members)
            roll = Roll(tier, start, end, first, last, tuple(members))
            if should_replace(by_key.get((tier, start)), roll.made("", now)):
                due.append(roll)
    return due


def compose(rows: Sequence[TierSummary], cursor: int) -> list[TierSummary]:
    """What a context shows of the rolled summaries: the coarsest summary of each part of
    the history behind ``cursor``, oldest first. A summary is shown only when it lies wholly
    behind the cursor and covers no turn a coarser one shown covers."""
    chosen: list[TierSummary] = []
    for tier in reversed(TIERS):
        for row in sorted((r for r in rows if r.tier == tier), key=lambda r: r.first_turn):
            if row.end_turn > cursor or row.end_turn <= row.first_turn:
                continue
            if any(row.first_turn < c.end_turn and c.first_turn < row.end_turn for c in chosen):
                continue
            chosen.append(row)
    return sorted(chosen, key=lambda r: r.first_turn)


def rolled_through(rows: Sequence[TierSummary]) -> int:
    """How far from the first turn the summaries cover without a hole: every turn before
    this is in some summary."""
    through = 0
    for row in sorted(rows, key=lambda r: r.first_turn):
        if row.first_turn > through:
            break
        through = max(through, row.end_turn)
    return through


def render(rows: Sequence[TierSummary], zone: ZoneInfo | None = None) -> str:
    """The summaries a context shows, as one text: each under its heading."""
    return "\n\n".join(row.render(zone) for row in rows if row.text.strip())


def tiered_summary(
    rows: Sequence[TierSummary], cursor: int, rolling: str, zone: ZoneInfo | None = None
) -> str:
    """The summary a context shows with tiers on: the rolled summaries :func:`compose` picks,
    oldest first, then the rolling summary unless they already cover the turn just before
    the cursor (the rolling summary starts afresh with each conversation, so then it holds
    nothing they do not)."""
    shown = compose(rows, cursor)
    text = render(shown, zone)
    if rolling.strip() and not (cursor and any(row.covers(cursor - 1) for row in shown)):
        text = f"{text}\n\n{rolling}" if text else rolling
    return text


def hidden_lines(rows: Sequence[TierSummary], cursor: int) -> str:
    """The lines of the summaries :func:`hidden` finds, each once (a day holds its
    conversations' lines): the text recall searches in the tiers."""
    lines = dict.fromkeys(
        line for row in hidden(rows, cursor) for line in row.text.splitlines() if line.strip()
    )
    return "\n".join(lines)


def hidden(rows: Sequence[TierSummary], cursor: int) -> list[TierSummary]:
    """The rolled summaries a context does not show (finer ones under a coarser one, and
    those reaching past the cursor): what recall searches besides the transcript."""
    shown = {row.key for row in compose(rows, cursor)}
    return [row for row in rows if row.key not in shown]


__all__ = [
    "TIERS",
    "Conversation",
    "Roll",
    "Schedule",
    "Tier",
    "TierSummary",
    "compose",
    "conversations",
    "due_rolls",
    "hidden",
    "hidden_lines",
    "parse_day_at",
    "parse_week_at",
    "parse_zone",
    "render",
    "rolled_through",
    "should_replace",
    "tiered_summary",
]
