"""Small text helpers with exact length guarantees."""

from __future__ import annotations

import heapq
import math
import re
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import lru_cache
from typing import NamedTuple

from voice_context.core.cache import CharBoundedCache, char_bounded_cache
from voice_context.core.times import MONTHS

_SENTENCE_END = re.compile(r"(?<=[.!?…])[\"')\]]*\s+")
ELLIPSIS = "…"


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` chars, at a word boundary when one is near, marked with "…"."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    if limit == 1:
        return ELLIPSIS
    head = text[: limit - 1]
    space = head.rfind(" ")
    if space >= limit // 2:
        head = head[:space]
    return head.rstrip() + ELLIPSIS


def clip_start(text: str, limit: int) -> str:
    """``text`` cut to its last ``limit`` chars at most, at a word boundary, marked with a leading "…"."""
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    if limit == 1:
        return ELLIPSIS
    tail = text[len(text) - (limit - 1) :]
    space = tail.find(" ")
    if 0 <= space <= len(tail) // 2:
        tail = tail[space + 1 :]
    return ELLIPSIS + tail.lstrip()


def normalize(text: str) -> str:
    """Collapse runs of blanks inside lines and drop empty lines; paragraphs (newlines) survive."""
    lines = (" ".join(line.split()) for line in text.splitlines())
    return "\n".join(line for line in lines if line)


def sentences(text: str) -> list[str]:
    """Split prose into sentences (keeps each sentence's closing punctuation)."""
    return [sentence for part in _SENTENCE_END.split(text.strip()) if (sentence := part.strip())]


def _pieces(text: str) -> list[tuple[str, str]]:
    """Sentences with the separator that joins each to the one before ("" for the first)."""
    out: list[tuple[str, str]] = []
    for paragraph in normalize(text).split("\n"):
        for i, sentence in enumerate(sentences(paragraph)):
            out.append((sentence, ("\n" if i == 0 else " ") if out else ""))
    return out


def _join(pieces: list[tuple[str, str]]) -> str:
    return "".join((sep if i else "") + sentence for i, (sentence, sep) in enumerate(pieces))


def clamp_sentences(text: str, limit: int) -> str:
    """The longest prefix of whole sentences that fits ``limit``; a word-clipped cut when none does.

    This is the last-resort safety clamp for an overlong summary.
    """
    if len(text) <= limit:
        return text
    pieces = _pieces(text)
    kept: list[tuple[str, str]] = []
    for piece in pieces:
        if len(_join([*kept, piece])) > limit:
            break
        kept.append(piece)
    if kept:
        return _join(kept)
    return clip(normalize(text), limit)


def keep_newest_sentences(text: str, limit: int) -> str:
    """The longest suffix of whole sentences that fits ``limit`` (the newest details survive)."""
    if len(text) <= limit:
        return text
    pieces = _pieces(text)
    kept: list[tuple[str, str]] = []
    for sentence, sep in reversed(pieces):
        candidate = [(sentence, sep), *kept]
        if len(_join(candidate)) > limit:
            break
        kept = candidate
    if kept:
        return _join(kept)
    return clip_start(normalize(text), limit)


# The end of a sentence in a normalized line: its closing punctuation (and a closing quote or
# bracket), then the single space before the next. Found by its punctuation, many times faster
# than by a look behind each blank of the line.
_LINE_SENTENCE_END = re.compile(r"[.!?…][\"')\]]? ")
# A line's head, "[8 May 2023, 13:56] ": it says when the line happened, so it stays with the line.
_LINE_HEAD = re.compile(r"^\[[^\]\n]{1,40}\]\s+")
# A sentence's speaker label, "Caroline: ": the sentences after it are hers until the next label.
_LABEL = re.compile(r"^[A-Z][^:.!?\n]{0,48}?: ")
_INFO_TOKEN = re.compile(r"[A-Za-z][A-Za-z'’-]*|\d[\d,.:/]*")
INFO_PAD = 20
"""Each sentence costs this many chars more than its length when a line chooses which to drop."""


class _Line(NamedTuple):
    """One line of a summary, parsed: its head, its sentences, and what each tells
    (:func:`information`) and who says it (:func:`_label`)."""

    head: str
    sentences: tuple[str, ...]
    infos: tuple[float, ...]
    labels: tuple[str, ...]


LINES_CACHE_CHARS = 4_000_000
"""How many chars of summary lines :func:`_summary_lines` keeps parsed: a fold changes a summary's
newest lines, and a cut of it keeps the lines it left whole, so most lines of a summary to condense
were parsed before (250 sessions' summaries take about 2.5 million chars)."""


@char_bounded_cache(LINES_CACHE_CHARS)
def _parsed_line(line: str) -> _Line | None:
    """A line of a summary as it is written (not normalized), parsed; ``None`` for a blank one."""
    paragraph = " ".join(line.split())
    if not paragraph:
        return None
    head = _LINE_HEAD.match(paragraph)
    prefix = head.group(0) if head else ""
    sentences = _line_sentences(paragraph[len(prefix) :])
    return _Line(prefix, sentences, tuple(map(information, sentences)), tuple(map(_label, sentences)))


def _summary_lines(text: str) -> tuple[_Line, ...]:
    """The lines of ``normalize(text)``, parsed (each line is normalized alone)."""
    parsed = tuple(line for line in map(_parsed_line, text.splitlines()) if line is not None)
    return parsed or (_Line("", (), (), ()),)  # (an empty text: one empty line)


def _line_sentences(body: str) -> tuple[str, ...]:
    """The sentences of a normalized line (its blanks are single spaces): split at each blank after
    a sentence's closing punctuation, or after the punctuation and a quote or bracket closing it."""
    parts: list[str] = []
    start = 0
    for end in _LINE_SENTENCE_END.finditer(body):
        parts.append(body[start : end.end() - 1])
        start = end.end()
    parts.append(body[start:])
    return tuple(part for part in parts if part)


@lru_cache(maxsize=16384)
def information(sentence: str) -> float:
    """What a sentence tells, per character, by its surface alone.

    Numbers and names (capitalised words after the first) count most, long words
    next, short words little: "Bob flew to Oslo on 9 May." outranks "That sounds
    so good to me!". A speaker label is not counted.
    """
    label = _LABEL.match(sentence)
    body = sentence[label.end() :] if label else sentence
    total = 0.0
    for k, token in enumerate(_INFO_TOKEN.findall(body)):
        if token[0].isdigit() or (k > 0 and token[0].isupper()):
            total += 2.0
        elif len(token) >= 7:
            total += 1.0
        elif len(token) >= 4:
            total += 0.5
    return total / (len(body) + INFO_PAD)


def _label(sentence: str) -> str:
    """A sentence's speaker label (``"Caroline: "``), ``""`` for none."""
    found = _LABEL.match(sentence)
    return found.group(0) if found else ""


def _drop_one(sentences: list[str], infos: list[float], labels: list[str]) -> tuple[int, int]:
    """Drop the sentence of a line that tells least (the latest on a tie); returns the chars saved
    and where it was. ``infos`` and ``labels`` are each sentence's :func:`information` and
    :func:`_label`, kept in step.

    A label the dropped sentence carried passes to the next sentence if it has
    none, so that no sentence changes speaker; a label that now repeats the one
    before it goes.
    """
    k = len(infos) - 1 - infos[::-1].index(min(infos))  # the last of the least
    dropped = sentences.pop(k)
    del infos[k]
    label = labels.pop(k)
    saved = len(dropped) + 1
    if label and k < len(sentences) and not labels[k]:
        sentences[k] = label + sentences[k]
        labels[k] = label  # (the label a sentence begins with ends at its first ": ")
        saved -= len(label)
    if 0 < k < len(sentences) and labels[k]:  # "Ann: A. Bob: B. Ann: C." without B: "Ann: A. C."
        again = labels[k]
        before = next(filter(None, reversed(labels[:k])), None)  # the label nearest before it
        if again == before:
            sentences[k] = sentences[k][len(again) :]
            labels[k] = _label(sentences[k])
            saved += len(again)
    return saved, k


def condense_summary(text: str, limit: int, *, half_life: float = 48.0) -> str:
    """``text`` shrunk to at most ``limit`` chars by whole sentences, coarser with age.

    A summary written as one paragraph without a head keeps its newest
    sentences (:func:`keep_newest_sentences`). A summary written in lines, one
    per time window and oldest first, each headed by its date and time
    (``[8 May 2023, 13:56] ...``), keeps a dated head on every line it shows, so
    that any line read alone says when it happened, and each line as long as it
    can: while the text is too long, the line whose length weighted by its age
    (``1 + age / half_life``, in lines) is the greatest loses the sentence that
    tells least (:func:`information`; order inside a line never changes). Once
    every line is down to one sentence, lines of the same conversation (the same
    date, begun less than :data:`JOIN_WITHIN` apart) join, oldest first, until the
    text fits (one head for both, the earlier time: heads must not crowd out
    what they date); when no lines can join, the joined lines lose sentences
    again the same way, and then whole lines go, the one that tells least first
    (:func:`information`; the newest never; of equals, the older): a dated fact
    of any age outlasts small talk. When the newest line alone, down to
    one sentence, is longer than ``limit``, nothing is left (``""``).

    Cached: one summary serves every context of its session until the next
    compaction (:data:`CUTS_CACHE_CHARS`).
    """
    if len(text) <= limit:
        return text
    return _SUMMARIES(text).cut(limit, half_life)


CUTS_CACHE_CHARS = 16_000_000
"""How many chars of summaries :func:`condense_summary` remembers the plan of (least recently
used first out). A summary's text is its session's own string, so the key costs nothing more;
what is held besides is its parse and its plan, about its size again. The bound is per process,
not per session: every live session's summary must fit in it, or each context plans its summary
again (250 sessions thrashing a cache of the last 256 cuts spent a third of the reply path's CPU
condensing)."""
CUTS_PER_SUMMARY = 8
"""The cuts of one summary kept as text (a context asks one or two lengths; the next context of
the session, between two folds, often asks the same ones again)."""

_Op = tuple[int, int, int, str | None]
"""One step of a summary's plan: ``(_DROP, line, sentence, the new text of the sentence after it
or None)``, ``(_JOIN, line, the line joined into it, None)`` or ``(_GONE, line, the line shown
before it or -1, None)``."""
_DROP, _JOIN, _GONE = 0, 1, 2


class _SummaryCuts:
    """One summary and its plan: the steps :func:`condense_summary` takes to shrink it, from
    whole towards a single sentence, each with the length it leaves. The steps it takes never
    depend on the limit, only where it stops; so the plan is made once per summary, as far as the
    shortest cut asked of it so far, and a cut to any limit replays its first steps (list pops,
    no search) and renders."""

    __slots__ = ("_cuts", "_lock", "_plan", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        self._plan: _Plan | None = None
        self._cuts: dict[tuple[int, float], str] = {}
        self._lock = threading.Lock()  # folds condense in worker threads too

    def cut(self, limit: int, half_life: float) -> str:
        key = (limit, half_life)
        with self._lock:  # the plan grows in place: one thread at a time
            found = self._cuts.get(key)
            if found is not None:
                return found
            plan = self._plan
            if plan is None or plan.half_life != half_life:
                plan = self._plan = _Plan(self.text, half_life)
            value = plan.cut(limit)
            if len(self._cuts) >= CUTS_PER_SUMMARY:
                del self._cuts[next(iter(self._cuts))]
            self._cuts[key] = value
        return value


_SUMMARIES: CharBoundedCache[_SummaryCuts] = CharBoundedCache(_SummaryCuts, CUTS_CACHE_CHARS)


class _Plan:
    """A dated summary's shrinking, step by step, taken as far as a cut has needed:
    ``totals[k]`` is its length after ``k`` steps."""

    __slots__ = ("_shrinking", "half_life", "paragraph", "parsed", "steps", "text", "totals")

    def __init__(self, text: str, half_life: float) -> None:
        self.text = text
        self.half_life = half_life
        self.parsed = _summary_lines(text)
        # one paragraph: keep_newest_sentences
        self.paragraph = len(self.parsed) == 1 and not self.parsed[0].head
        self._shrinking = None if self.paragraph else _Condensing.of(self.parsed, half_life)
        self.steps: list[_Op] = [] if self._shrinking is None else self._shrinking.steps
        self.totals = [len(text) if self._shrinking is None else self._shrinking.total]

    def _step(self) -> bool:
        """One more step of the shrink; False once it is down to a single sentence."""
        lines = self._shrinking
        if lines is None:
            return False
        while lines.after[lines.first] < lines.n:
            if lines.heap:
                lines.drop_sentence()
            elif not lines.join_same_date() and not lines.drop_sentences_again():
                lines.drop_line()
            if len(lines.steps) == len(self.totals):  # a step was taken (a heap entry may be stale)
                self.totals.append(lines.total)
                return True
        if len(lines.lines[lines.first]) > 1:  # one line left: it keeps its head
            lines.drop_from(lines.first)
            self.totals.append(lines.total)
            return True
        self._shrinking = None  # the whole plan is made: its working state is let go
        return False

    def cut(self, limit: int) -> str:
        if self.paragraph:
            return keep_newest_sentences(self.text, limit)
        while self.totals[-1] > limit and self._step():
            pass
        taken = next((k for k, total in enumerate(self.totals) if total <= limit), len(self.steps))
        heads = [line.head for line in self.parsed]
        lines = [list(line.sentences) for line in self.parsed]
        n = len(lines)
        after = list(range(1, n + 1))
        first = 0
        for kind, i, j, text in self.steps[:taken]:
            if kind == _DROP:
                del lines[i][j]
                if text is not None:
                    lines[i][j] = text
            elif kind == _JOIN:
                lines[i] += lines[j]
                after[i] = after[j]
            elif j < 0:  # _GONE, the first line shown
                first = after[i]
            else:
                after[j] = after[i]
        shown: list[str] = []
        k = first
        while k < n:
            shown.append(heads[k] + " ".join(lines[k]))
            k = after[k]
        result = "\n".join(shown)
        if len(result) <= limit:
            return result
        # a dated line down to one sentence that still does not fit is left out: a sentence is shown
        # whole or not at all, never cut into a fragment that may say something else
        return "" if heads[first] else keep_newest_sentences(result, limit)


@dataclass(slots=True)
class _Condensing:
    """A dated summary being shrunk by :func:`condense_summary`: its lines (a linked list over
    ``after``, from ``first``), what each sentence tells, and the lines that may lose one."""

    heads: list[str]
    days: list[tuple[str, int] | None]
    latest: list[int]  # the minute of day the last line joined began
    lines: list[list[str]]
    infos: list[list[float]]
    labels: list[list[str]]
    lengths: list[int]
    after: list[int]  # the next line still shown (n: none)
    alive: list[bool]
    total: int
    half_life: float
    n: int  # how many lines it began with
    heap: list[tuple[float, int]] = field(default_factory=list)
    first: int = 0  # lines before this one are gone
    steps: list[_Op] = field(default_factory=list)  # what was done, for :class:`_Plan`

    @classmethod
    def of(cls, parsed: tuple[_Line, ...], half_life: float) -> _Condensing:
        n = len(parsed)
        heads = [line.head for line in parsed]
        days = [_date_of(head) for head in heads]
        lines = [list(line.sentences) for line in parsed]
        lengths = [len(heads[i]) + len(" ".join(lines[i])) for i in range(n)]
        state = cls(
            heads=heads,
            days=days,
            latest=[day[1] if day else 0 for day in days],
            lines=lines,
            infos=[list(line.infos) for line in parsed],
            labels=[list(line.labels) for line in parsed],
            lengths=lengths,
            after=list(range(1, n + 1)),
            alive=[True] * n,
            total=sum(lengths) + n - 1,
            half_life=half_life,
            n=n,
        )
        # a max-heap of (age-weighted length, line) over the lines that still have two sentences or more
        state.heap = [state.weight(i) for i in range(n) if len(lines[i]) > 1]
        heapq.heapify(state.heap)
        return state

    def weight(self, i: int) -> tuple[float, int]:
        return (-self.lengths[i] * (1 + (self.n - 1 - i) / self.half_life), i)

    def drop_sentence(self) -> None:
        """The line with the greatest age-weighted length loses the sentence that tells least."""
        i = heapq.heappop(self.heap)[1]
        if not self.alive[i] or len(self.lines[i]) < 2:
            return
        self.drop_from(i)
        if len(self.lines[i]) > 1:
            heapq.heappush(self.heap, self.weight(i))

    def drop_from(self, i: int) -> None:
        """Line ``i`` loses the sentence that tells least (:func:`_drop_one`)."""
        line = self.lines[i]
        saved, k = _drop_one(line, self.infos[i], self.labels[i])
        self.total -= saved
        self.lengths[i] -= saved
        self.steps.append((_DROP, i, k, line[k] if k < len(line) else None))

    def join_same_date(self) -> bool:
        """Join the oldest two lines of the same conversation (one head for both, and no sentence
        lost); ``False`` when no two lines share a date any more."""
        i = self.first
        while self.after[i] < self.n and not _joinable(
            self.days[i], self.latest[i], self.days[self.after[i]]
        ):
            i = self.after[i]
        if self.after[i] >= self.n:
            return False
        j = self.after[i]
        self.lines[i] += self.lines[j]
        self.infos[i] += self.infos[j]
        self.labels[i] += self.labels[j]
        self.lengths[i] += 1 + self.lengths[j] - len(self.heads[j])
        self.total -= len(self.heads[j])
        self.latest[i] = self.latest[j]
        self.alive[j] = False
        self.after[i] = self.after[j]
        self.steps.append((_JOIN, i, j, None))
        return True

    def drop_sentences_again(self) -> bool:
        """Let the joined lines lose sentences again; ``False`` when none has two left."""
        joined = [k for k in range(self.first, self.n) if self.alive[k] and len(self.lines[k]) > 1]
        self.heap = [self.weight(k) for k in joined]
        heapq.heapify(self.heap)
        return bool(joined)

    def drop_line(self) -> None:
        """A line goes whole: the one that tells least per char, the newest never, of equals the older."""
        after = self.after
        gone, shown_before, previous, k = self.first, -1, self.first, after[self.first]
        while after[k] < self.n:
            if _told(self.infos[k]) < _told(self.infos[gone]):
                gone, shown_before = k, previous
            previous, k = k, after[k]
        self.total -= self.lengths[gone] + 1
        self.alive[gone] = False
        self.steps.append((_GONE, gone, shown_before, None))
        if gone == self.first:
            self.first = after[gone]
        else:
            after[shown_before] = after[gone]


def _told(infos: list[float]) -> float:
    """What a line tells per char: the mean :func:`information` of its sentences."""
    return sum(infos) / len(infos) if infos else 0.0


_HEAD_DATE = re.compile(r"^\[(.+?),? (\d{1,2}):(\d{2})\]\s+$")
JOIN_WITHIN = 2 * 60
"""Minutes: lines of the same date join only when the later began within this of the earlier one
(the deterministic summarizer's session gap), so that a joined line never spans two conversations."""


def _date_of(head: str) -> tuple[str, int] | None:
    """The date of a line's head and its minute of the day (``("8 May 2023", 836)`` for
    ``[8 May 2023, 13:56] ``); ``None`` for a line without a dated head."""
    found = _HEAD_DATE.match(head)
    return (found.group(1), int(found.group(2)) * 60 + int(found.group(3))) if found else None


def summary_before(summary: str, start: float, end: float) -> str:
    """``summary`` without its newest lines dated from ``start`` to ``end`` (a line's head is the
    minute its first turn was said, so such a line tells only of turns said in that time).
    Lines without a dated head, or dated after ``end``, and every line before them, stay."""
    cut = len(summary)
    while cut > 0:
        begin = summary.rfind("\n", 0, cut - 1) + 1
        head = _HEAD_WHEN.match(summary, begin, cut)
        if head is None or not start <= _head_time(head) <= end:
            break
        cut = begin
    return summary[:cut].rstrip("\n") if cut < len(summary) else summary


_HEAD_WHEN = re.compile(r"\[(\d{1,2}) ([A-Z][a-z]+) (\d{1,4}), (\d{1,2}):(\d{2})\] ")
_MONTH = {name: k + 1 for k, name in enumerate(MONTHS)}


def _head_time(head: re.Match[str]) -> float:
    """The unix time of a line head's ``8 May 2023, 13:56`` (UTC), as :func:`stamp` writes it;
    ``-inf`` for a head that names no calendar time (its line stays)."""
    day, month, year, hour, minute = head.groups()
    try:
        when = datetime(int(year), _MONTH[month], int(day), int(hour), int(minute), tzinfo=UTC)
    except (KeyError, ValueError):
        return -math.inf
    return when.timestamp()


def _joinable(day: tuple[str, int] | None, latest: int, following: tuple[str, int] | None) -> bool:
    return (
        day is not None
        and following is not None
        and day[0] == following[0]
        and 0 <= following[1] - latest < JOIN_WITHIN
    )
