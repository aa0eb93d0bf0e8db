"""The date audit: is every summary sentence filed under the day it was said?

A summary that says "Deborah: I started a running group with Anna." under
26 June, when Deborah said it on 9 July, makes a bot answer "when" wrongly.
This audit reads the summaries a replay served (the ``summary`` of each
``context`` reply, as shown after any budget cut) and checks each sentence
against the recording it came from:

- a sentence's **date** is the date in its line's head (``[9 July 2023, 14:02]``);
  a line whose head has only a time (``[14:05]``), or no head at all, is read
  as a person reads it, under the last date written above it in the text
  shown; a sentence with no date anywhere above it is **undated**;
- its **source** is the turn (or screen note) of the same speaker whose content
  words cover the most of the sentence's, each word weighted by its rarity in
  the conversation (``ln((N + 1) / (df + 1)) + 1``, as in the recall metric).
  Resolved dates ("on 7 May 2023") are set aside before matching, since the
  source says "yesterday". A sentence whose best source covers less than
  :data:`MIN_COVER` of its weight is **unmatched** and not judged (a model's
  paraphrase, or "Alice and Bob made small talk.");
- it is **misdated** when its date is not the day (UTC) of its source; when
  several sources match equally well (a sentence said twice), any of their days
  will do.

Each distinct (session, date, sentence) is judged once, however many replies
showed it. ``share`` is (misdated + undated) / judged. Everything here is pure.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any

from voice_context.codec import NoteAppend, TurnAppend
from voice_context.core.text import normalize, sentences
from voice_context.core.times import MONTHS, WEEKDAYS, utc
from voice_context.tuning.replay import Recording
from voice_context.tuning.scoring import content_terms

#: A sentence is judged only when its best source holds at least this share of its word weight.
MIN_COVER = 0.6
#: Misdated sentences kept as examples, per audit.
MAX_EXAMPLES = 20

_MONTH = "|".join(MONTHS)
_WEEKDAY = "|".join(WEEKDAYS)
_HEAD = re.compile(
    rf"^\[(?:(?P<day>\d{{1,2}}) (?P<month>{_MONTH}) (?P<year>\d{{4}}),? )?\d{{1,2}}:\d{{2}}\]\s*"
    r"|^\[(?P<iso>\d{4}-\d{2}-\d{2})[ T]\d{1,2}:\d{2}\]\s*"
)
_RESOLVED = re.compile(
    rf"\b(?:(?:{_WEEKDAY}) )?\d{{1,2}} (?:{_MONTH}) \d{{4}}\b"
    rf"|\b(?:{_MONTH}) \d{{4}}\b"
)


@dataclass(frozen=True, slots=True)
class Source:
    """A turn or a screen note of the recording: who, on which day, with which words."""

    speaker: str
    day: date
    terms: frozenset[str]
    text: str


@dataclass(frozen=True, slots=True)
class Misdated:
    """One sentence under the wrong date (or none): what it says and when it was said."""

    session: str
    sentence: str
    shown_under: str | None
    said_on: tuple[str, ...]
    days_off: int | None

    def row(self) -> dict[str, Any]:
        return {
            "session": self.session,
            "sentence": self.sentence,
            "shown_under": self.shown_under,
            "said_on": list(self.said_on),
            "days_off": self.days_off,
        }


@dataclass(slots=True)
class DateAudit:
    """Counts over the distinct summary sentences of one or more replays."""

    judged: int = 0
    misdated: int = 0
    undated: int = 0
    unmatched: int = 0
    max_days_off: int = 0
    examples: list[Misdated] = field(default_factory=list)

    @property
    def share(self) -> float | None:
        """The share of judged sentences under a wrong date or none (``None`` when none was judged)."""
        return (self.misdated + self.undated) / self.judged if self.judged else None

    def merge(self, other: DateAudit) -> None:
        self.judged += other.judged
        self.misdated += other.misdated
        self.undated += other.undated
        self.unmatched += other.unmatched
        self.max_days_off = max(self.max_days_off, other.max_days_off)
        self.examples.extend(other.examples[: max(0, MAX_EXAMPLES - len(self.examples))])

    def row(self) -> dict[str, Any]:
        return {
            "judged": self.judged,
            "misdated": self.misdated,
            "undated": self.undated,
            "unmatched": self.unmatched,
            "share": self.share,
            "max_days_off": self.max_days_off,
        }

    def __str__(self) -> str:
        share = "-" if self.share is None else f"{self.share:.1%}"
        return (
            f"dates: {self.judged} summary sentences judged, {self.misdated} misdated, "
            f"{self.undated} undated ({share}), {self.unmatched} unmatched"
        )


class Sources:
    """The turns and notes of one session, indexed by speaker and word."""

    def __init__(self, sources: Sequence[Source]) -> None:
        self.sources = list(sources)
        df: Counter[str] = Counter()
        for source in self.sources:
            df.update(source.terms)
        n = len(self.sources)
        self.weights = {w: math.log((n + 1) / (c + 1)) + 1 for w, c in df.items()}
        self.unseen = math.log(n + 1) + 1
        self.by_word: dict[tuple[str, str], list[int]] = defaultdict(list)
        self.speakers = {s.speaker for s in self.sources if s.speaker}
        for k, source in enumerate(self.sources):
            for word in source.terms:
                self.by_word[(source.speaker, word)].append(k)
                self.by_word[("", word)].append(k)
        # longest first, so "Anna Lee's screen" is not read as "Anna"
        names = sorted(self.speakers, key=lambda s: (-len(s), s))
        self.label = (
            re.compile(r"(?:^|(?<=[.!?…] ))(" + "|".join(re.escape(s) for s in names) + r"): ")
            if names
            else None
        )

    @classmethod
    def from_recording(cls, recording: Recording, session: str) -> Sources:
        found: list[Source] = []
        for message in recording.decoded:
            if message.session != session:
                continue
            if isinstance(message, TurnAppend):
                turn = message.turn
                found.append(_source(turn.speaker or turn.role.capitalize(), turn.text, turn.at))
            elif isinstance(message, NoteAppend):
                note = message.note
                found.append(_source(_note_label(note.speaker, note.source), note.text, note.at))
        return cls(found)

    def weight(self, word: str) -> float:
        return self.weights.get(word, self.unseen)

    def best(self, speaker: str, text: str) -> tuple[float, list[Source]]:
        """The sources that cover the most of ``text``'s word weight, and that share (0 to 1)."""
        words = content_terms(_RESOLVED.sub(" ", text))
        total = sum(self.weight(w) for w in words)
        if not words or total <= 0:
            return 0.0, []
        key = speaker if speaker in self.speakers else ""
        mass: dict[int, float] = defaultdict(float)
        for word in words:
            for k in self.by_word.get((key, word), ()):
                mass[k] += self.weight(word)
        if not mass:
            return 0.0, []
        top = max(mass.values())
        return top / total, [self.sources[k] for k, m in mass.items() if m >= top - 1e-9]


def _note_label(speaker: str | None, source: str | None) -> str:
    who = f"{speaker}'s screen" if speaker else "Screen"
    return who + (f" ({source})" if source else "")


def _source(speaker: str, text: str, at: float) -> Source:
    return Source(speaker, utc(at).date(), frozenset(content_terms(text)), text)


def _head_date(head: re.Match[str]) -> date | None:
    if head.group("iso"):
        return date.fromisoformat(head.group("iso"))
    if head.group("day"):
        month = MONTHS.index(head.group("month")) + 1
        return date(int(head.group("year")), month, int(head.group("day")))
    return None


def dated_sentences(summary: str, label: re.Pattern[str] | None) -> list[tuple[date | None, str, str]]:
    """A summary's sentences as a reader finds them: (date, speaker label, sentence).

    The date is that of the sentence's line head, or of the last head above it
    that has one; ``None`` when there is none. The speaker label is the last
    ``Name:`` before the sentence in its line ("" when there is none).
    """
    out: list[tuple[date | None, str, str]] = []
    current: date | None = None
    for line in normalize(summary).split("\n"):
        head = _HEAD.match(line)
        body = line
        if head:
            current = _head_date(head) or current
            body = line[head.end() :]
        cuts = [(m.start(), m.end(), m.group(1)) for m in label.finditer(body)] if label else []
        if not cuts or cuts[0][0] > 0:
            cuts.insert(0, (0, 0, ""))
        for k, (_, end, who) in enumerate(cuts):
            stop = cuts[k + 1][0] if k + 1 < len(cuts) else len(body)
            for sentence in sentences(body[end:stop]):
                out.append((current, who, sentence))
    return out


def audit_summaries(summaries: Iterable[str], sources: Sources, session: str = "") -> DateAudit:
    """Judge every distinct dated sentence of ``summaries`` against ``sources``."""
    audit = DateAudit()
    seen: set[tuple[date | None, str, str]] = set()
    for summary in summaries:
        for item in dated_sentences(summary, sources.label):
            if item in seen:
                continue
            seen.add(item)
            shown, who, text = item
            cover, best = sources.best(who, text)
            if cover < MIN_COVER:
                audit.unmatched += 1
                continue
            audit.judged += 1
            days = sorted({s.day for s in best})
            if shown is not None and shown in days:
                continue
            off = None if shown is None else min(abs((shown - d).days) for d in days)
            if shown is None:
                audit.undated += 1
            else:
                audit.misdated += 1
                audit.max_days_off = max(audit.max_days_off, off or 0)
            if len(audit.examples) < MAX_EXAMPLES:
                audit.examples.append(
                    Misdated(
                        session,
                        f"{who}: {text}" if who else text,
                        shown.isoformat() if shown else None,
                        tuple(d.isoformat() for d in days),
                        off,
                    )
                )
    return audit


def audit_contexts(contexts: Sequence[Mapping[str, Any]], recording: Recording) -> DateAudit:
    """The date audit of one replay: every summary its ``context`` replies showed."""
    by_session: dict[str, list[str]] = defaultdict(list)
    for record in contexts:
        response = record.get("response") or {}
        summary = response.get("summary")
        if isinstance(summary, str) and summary:
            by_session[str(record.get("session") or "")].append(summary)
    spoken = {m.session for m in recording.decoded if isinstance(m, TurnAppend)}
    audit = DateAudit()
    for session, summaries in by_session.items():
        # a live replay may name its sessions with a prefix: one spoken session is the one meant
        name = session if session in spoken or len(spoken) != 1 else next(iter(spoken))
        sources = Sources.from_recording(recording, name)
        audit.merge(audit_summaries(dict.fromkeys(summaries), sources, session))
    return audit


__all__ = [
    "MIN_COVER",
    "DateAudit",
    "Misdated",
    "Source",
    "Sources",
    "audit_contexts",
    "audit_summaries",
    "dated_sentences",
]
