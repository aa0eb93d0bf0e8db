"""A summarizer that needs no model and no network: extractive, speaker-attributed, budgeted.

The summary is prose, one line per time window, oldest first, each headed by
the date and time its window began::

    [8 May 2023, 13:56] Caroline: I went to an LGBTQ support group on 7 May 2023. Melanie: ...
    [8 May 2023, 14:20] Caroline: I'm researching adoption agencies. Melanie's screen (image): A lake.

Every line is dated by what it covers, and any line read alone says when it
happened (a context that must shrink the summary may show only some lines):

- each batch of turns becomes a line, split where the conversation paused for
  longer than ``session_gap`` (:data:`SESSION_GAP`, two hours) or the day
  (UTC) changed, so that no line spans two conversations; a batch that goes on
  the conversation of the last line joins it while both fit in
  :data:`LINE_CHARS` (fewer, fuller lines spend less of the summary on heads);
- a screen note is dated by when it was seen, not by the fold that absorbs it
  (notes wait in the live buffer, often long after the turns around them were
  folded): it joins the end of the line of the conversation it was seen in, or
  gets a line of its own; lines stay in time order;
- the head always carries the full date.

A line keeps the batch's sentences that carry state, shortened and attributed,
in the order they were said: who decided, asked, promised or planned what, and
when (names, numbers, dates, commitments). What changes nothing goes:

- filler: greetings and mic checks ("Evening all, can you hear me okay?"),
  goodbyes ("Gotta run, bye!", "Ttyl"), thanks, backchannels, acknowledgements
  and voice-chat callouts ("Loud and clear", "Copy that", "Roger", "Go go",
  "On it", "Nice shot", "gg", "Holding the door"), cheers ("Woohoo!"),
  laughter, emoticons ("<3"), and sentences with no word that is more than
  small talk ("That's awesome!", "How have you been?", "Sounds great, I love
  that feeling!"); compliments of the one spoken to ("You'd be a great
  counselor!");
- repeated rephrasings: a statement that brings no informative word (a name, a
  date, a word that is no small talk) and no number its stretch of
  conversation had not said (in the batch, or on the summary's newest line
  when the batch goes on its conversation)
  ("Right, Voltix for the batteries, 2 euros a unit" after "We decided to go
  with Voltix for the batteries, at 2 euros a unit"), or that repeats one of
  the 16 sentences before it fuzzily, as the compression tells repeated turns
  (:mod:`~voice_context.summarizers.repeats`). A question, a decision, a
  proposal or a commitment ("Agreed, let's go with Casa do Rio") is an act
  of its own and stays, and a new number is news ("1-1" after "1-0");
- sentences are shortened, never broken: leading interjections ("Wow,"),
  vocatives ("Hey Mel!"), hesitations ("um", "uh"), stuttered repeats and
  intensifiers that leave the sentence whole ("really", "just") go; dashes and
  semicolons split a sentence into its clauses;
- relative dates are resolved against the time the turn was spoken:
  "yesterday" becomes "on 7 May 2023", "last week" "the week before
  8 May 2023", "last year" "in 2022", "two days ago" "on 6 May 2023"; where the
  words are a noun ("Last Friday was amazing", "I spent yesterday at the
  beach"), they stay and the date follows in parentheses ("Last Friday
  (7 July 2023) was amazing");
- numbers spoken as words become digits ("twenty five euros" -> "25 euros");
- screen notes are folded in as sentences of their own, with their provenance.

When the summary must shrink to ``max_chars``, sentences are dropped (never
cut) by their value per character, lowest first. A sentence's value is the
information its words carry (names, numbers, dates and rarer words count more,
small talk less), shared out among the sentences that repeat the same words,
and discounted with age: older windows grow coarser, never silently cut off,
and the newest keep their detail. Lines left empty disappear. Everything is a
pure function of the request: the same request always gives the same summary.
"""

from __future__ import annotations

import heapq
import re
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache, partial
from operator import attrgetter
from typing import NamedTuple

from voice_context.core.cache import char_bounded_cache
from voice_context.core.language.dates import resolve_dates
from voice_context.core.language.numbers import spoken_numbers
from voice_context.core.language.small_talk import (
    finish_sentence,
    is_filler,
    shorten,
    told_words,
    without_names,
)
from voice_context.core.language.words import fold_word, weighted_words
from voice_context.core.text import clip, normalize, sentences
from voice_context.core.times import day_text, utc
from voice_context.core.turns import Note, Turn
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.repeats import WINDOW, key_of, numbers_of, said_again
from voice_context.worker import Worker

FOLD_THREAD = Worker("voice-context-fold")
"""The process's one thread for deterministic folds (every summarizer's, the fallback's too),
started when first given one: see ``DeterministicSummarizer.summarize``."""

_CLAUSE = re.compile(r"\s+[-–—]+\s+|;\s+")
_CAPTION_LEAD = re.compile(r"^(?:a |an )?(?:photo|picture|image|screenshot|close up|closeup)\s+of\s+", re.I)
_HEAD = re.compile(
    r"^\[(?:(?P<date>\d{1,2} [A-Za-z]+ \d{4}),? )?(?P<time>\d{1,2}:\d{2})\]\s*"
    r"|^\[(?P<iso>\d{4}-\d{2}-\d{2}) (?P<isotime>\d{1,2}:\d{2})\]\s*"
)
_LABEL = re.compile(r"(?:^|(?<=[.!?…] ))([A-Z][^:.!?\n]{0,48}?): ")

#: Each sentence costs this many chars more than its length when ranking, so that a
#: short exclamation ("Bon voyage!") does not outrank a fact for being short.
COST_PAD = 20
#: A pause longer than this (seconds) between two things said starts a new line: a voice
#: session rarely pauses this long, and conversations days apart must not share a date.
SESSION_GAP = 2 * 60 * 60.0
#: A new batch joins the line before it, of the same conversation, while both fit in this many chars:
#: every line carries its full date, and fewer, fuller lines spend less of a summary on heads. No more
#: than recall quotes of a summary line (600 chars), so that a recalled line is the line shown.
LINE_CHARS = 600
#: How many characters of summary lines the parse cache keeps (with their parsed forms, about
#: 7 bytes a character: some 7 MB at most; the words of sentences are kept by
#: :func:`~voice_context.core.language.words.weighted_words`, as many again).
CACHE_CHARS = 1_000_000
#: A line's last sentence is worth this much more, so windows grow coarser before they go.
LAST_SENTENCE = 2.0
#: Far more than the relative rounding error of a sentence's score (a sum of a few hundred terms
#: at most, each within an ulp): a score that grew may be computed this much lower than before.
_ROUNDING = 1e-9


# -- one batch ----------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Sentence:
    speaker: str
    text: str
    weights: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, speaker: str, text: str) -> _Sentence:
        return cls(speaker, text, weighted_words(text))

    @property
    def value(self) -> float:
        return sum(w for _, w in self.weights)


@dataclass(slots=True)
class _Line:
    day: str | None  # "8 May 2023", or None when unknown
    time: str | None  # "13:56", or None for a line without a head
    sentences: list[_Sentence]
    length: int = 0
    notes_only: bool = False  # a new line of screen notes seen apart from the batch's turns
    until: datetime | None = None  # for a new line: when its last turn or note was (naive UTC)


_NUMBER = re.compile(r"\d+(?:[-–.,:/]\d+)*")
# Dialogue acts a summary keeps even in words already said: a question (who asked), a decision, a
# proposal or a commitment (who decided, planned or promised): "Agreed, let's go with Casa do Rio".
_ACT = re.compile(
    r"\?\W*$|\b(?:agreed?|decided?|decision|let'?s|we'?ll|i'?ll|(?:we|i) will|(?:i'?m|we'?re) going to|"
    r"(?:i|we) can|(?:i|we) promise|approved?|confirm(?:s|ed)?)\b",
    re.IGNORECASE,
)


_YOU = re.compile(r"^(?:you|you'?re|you'?d|you'?ll|you'?ve|your|you are|you have|you will)\b", re.IGNORECASE)
_BIDDING = re.compile(r"\b(?:should|need|needs|must|ha(?:ve|s) to|can|could|please|remember|forget)\b", re.I)


def _is_compliment(sentence: str) -> bool:
    """A compliment or encouragement of the one spoken to ("You'd be a great counselor!", "Your
    painting is lovely."): it tells how the speaker feels, not what happened. A sentence that asks,
    bids ("You should book it"), commits, or says a number or a name is none."""
    if not _YOU.match(sentence) or sentence.rstrip().endswith("?") or _NUMBER.search(sentence):
        return False
    if _ACT.search(sentence) or _BIDDING.search(sentence):
        return False
    items = weighted_words(sentence)
    return any(weight < 1.0 for _, weight in items) and not any(weight > 1.3 for _, weight in items)


def _turn_sentences(turn: Turn, speakers: Sequence[str]) -> list[tuple[str, set[str]]]:
    """The sentences of a turn worth keeping, shortened, each with its informative words
    (:func:`~voice_context.core.language.small_talk.told_words`, the speakers' names aside: they
    make "Thanks Mel!" look informative)."""
    text = spoken_numbers(resolve_dates(" ".join(turn.text.split()), turn.at))
    out: list[tuple[str, set[str]]] = []
    for sentence in sentences(text) or [text]:
        for clause in _CLAUSE.split(sentence):
            short = shorten(clause, speakers)
            told = told_words(without_names(short, speakers)) if short else set()
            if told and not _is_compliment(short):
                out.append((short, told))
    return out


class _Said:
    """What a stretch of conversation said so far (the batch's sentences of it, after the summary
    line it goes on), to tell a sentence that says it again.

    A statement is said again when it brings no informative word (weighing 1 or more: a name, a
    date, a word that is no small talk) and no number that the stretch and its speakers' names
    did not already say ("Right, Voltix at 2 euros" after "We go with Voltix at 2 euros a
    unit"; "1-1" is new after "1-0"); a question, a decision, a proposal or a commitment
    (:data:`_ACT`) is an act of its own, which says who asked, decided or promised, and stays.
    Any sentence is said again when it is a fuzzy repeat of one of the :data:`WINDOW` sentences
    before it, as :mod:`~voice_context.summarizers.repeats` tells turns apart.
    """

    __slots__ = ("_keys", "_known", "_numbers", "_words")

    def __init__(self, known: Mapping[str, _Told] | None = None) -> None:
        self._keys: deque[tuple[str, list[str]]] = deque(maxlen=WINDOW)
        self._words: set[str] = set()
        self._numbers: set[str] = set()
        self._known = known or {}
        """What each speaker's sentences in the summary already say: one of theirs that brings
        nothing beyond it is not said again, however long ago it was said."""

    def take(self, sentence: _Sentence, told: set[str]) -> bool:
        """Whether ``sentence``, whose informative words are ``told`` (:func:`told_words`), says again
        what was said; either way, from now on it was said."""
        text = sentence.text
        numbers = _NUMBER.findall(text)
        key = key_of(text)
        key_numbers = numbers_of(key)
        words = {word for word in told if not word[0].isdigit()}
        known = self._known.get(sentence.speaker)
        new_words = words - self._words
        new_numbers = set(numbers) - self._numbers
        if known is not None:
            new_words -= known.words
            new_numbers -= known.numbers
        again = (not new_words and not new_numbers and not _ACT.search(text)) or said_again(
            key, key_numbers, [k for k, _ in self._keys], [n for _, n in self._keys]
        )
        self._add(sentence, numbers, key, key_numbers)
        return again

    def add(self, sentence: _Sentence) -> None:
        key = key_of(sentence.text)
        self._add(sentence, _NUMBER.findall(sentence.text), key, numbers_of(key))

    def _add(self, sentence: _Sentence, numbers: list[str], key: str, key_numbers: list[str]) -> None:
        self._words.update(word for word, _ in sentence.weights)
        self._words.update(fold_word(name) for name in sentence.speaker.split())
        self._numbers.update(numbers)
        self._keys.append((key, key_numbers))


class _Told(NamedTuple):
    """The informative words and the numbers of one speaker's sentences in a summary."""

    words: frozenset[str]
    numbers: frozenset[str]


def _told_by_speaker(lines: Sequence[_Line]) -> dict[str, _Told]:
    """What each speaker's sentences in ``lines`` say (see :class:`_Told`)."""
    words: defaultdict[str, set[str]] = defaultdict(set)
    numbers: defaultdict[str, set[str]] = defaultdict(set)
    for line in lines:
        for sentence in line.sentences:
            if sentence.speaker:
                words[sentence.speaker].update(word for word, _ in sentence.weights)
                numbers[sentence.speaker].update(_NUMBER.findall(sentence.text))
    return {who: _Told(frozenset(words[who]), frozenset(numbers[who])) for who in words}


def _note_sentence(note: Note) -> tuple[str, str]:
    who = f"{note.speaker}'s screen" if note.speaker else "Screen"
    if note.source:
        who += f" ({note.source})"
    return who, finish_sentence(_CAPTION_LEAD.sub("", " ".join(note.text.split())))


def _new_lines(
    turns: Sequence[Turn],
    notes: Sequence[Note],
    note_chars: int,
    gap: float,
    before: _Line | None = None,
    known: Mapping[str, _Told] | None = None,
) -> list[_Line]:
    """A batch as lines, one per stretch of conversation, each headed by the time it began.

    Turns and notes are put in the order they happened (a note by the time it
    was seen, which may be long after the batch's turns: notes wait in the live
    buffer). A pause longer than ``gap`` seconds, or a new day (UTC), starts a
    new line, so that no line spans two conversations. Inside a line, sentences
    keep the order they were said in; a sentence that says again what the
    conversation just said (:class:`_Said`) goes. ``before`` is the summary's
    newest line: a batch that begins on its day, less than ``gap`` after its
    head, goes on its conversation, and what it said counts as said. ``known``
    is what each speaker's sentences in the summary say: a statement of theirs
    that brings nothing beyond it is not said again (a person's facts are told
    once, on the line they were first said on).
    """
    began = _when(before) if before is not None else None
    if began is not None and notes:
        # a note seen before the summary's newest stretch began belongs to an earlier one: it gets
        # lines of its own (each joins the line of the conversation it was seen in), never the head
        # of a line that goes on with this batch's turns, said later, ahead of that newest stretch
        early = [utc(n.at).replace(tzinfo=None) < began for n in notes]
        if any(early):
            late = [n for n, e in zip(notes, early, strict=True) if e]
            rest = [n for n, e in zip(notes, early, strict=True) if not e]
            return [
                *_new_lines((), late, note_chars, gap),
                *_new_lines(turns, rest, note_chars, gap, before, known),
            ]
    speakers = sorted({t.speaker for t in turns if t.speaker})
    lines: list[_Line] = []
    kept: list[_Sentence] = []
    said = _Said(known)
    start: datetime | None = None
    last = 0.0
    used = 0
    spoken = False

    def close() -> None:
        if kept and start is not None:
            until = utc(last).replace(tzinfo=None)
            lines.append(
                _Line(day_text(start), f"{start:%H:%M}", list(kept), notes_only=not spoken, until=until)
            )

    for item in _in_time_order(turns, notes):
        at, when = item.at, utc(item.at)
        if start is None or at - last > gap or when.date() != start.date():
            close()
            kept, said, start, spoken = [], _Said(known), when, False
            if before is not None and began is not None and not lines and _goes_on(began, when, gap):
                for sentence in before.sentences:
                    said.add(sentence)
        last = max(last, at)
        if isinstance(item, Turn):
            spoken = True
            who = item.speaker or item.role.capitalize()
            for text, told in _turn_sentences(item, speakers):
                sentence = _Sentence.of(who, text)
                if not said.take(sentence, told):
                    kept.append(sentence)
            continue
        who, text = _note_sentence(item)
        if not text or is_filler(text):
            continue
        if used and used + len(text) > note_chars:
            text = clip(text, max(20, note_chars - used))
        used += len(text)
        kept.append(_Sentence.of(who, text))
        said.add(kept[-1])
    close()
    return lines


def _in_time_order(turns: Sequence[Turn], notes: Sequence[Note]) -> list[Turn | Note]:
    """The turns and the notes in the order they happened, a note by the time it was seen; at
    the same time, the turns before the notes, each in the order given."""
    return sorted([*turns, *notes], key=attrgetter("at"))  # a stable sort keeps that order


def _goes_on(began: datetime, when: datetime, gap: float) -> bool:
    """Whether a stretch that begins at ``when`` goes on the conversation of a line that began
    at ``began`` (naive, UTC): on the same day, and at most ``gap`` seconds after it."""
    naive = when.replace(tzinfo=None)
    return naive.date() == began.date() and 0 <= (naive - began).total_seconds() <= gap


_SCREEN = re.compile(r"(?:^|'s )[Ss]creen\b")


def _small_talk_line(turns: Sequence[Turn]) -> _Line:
    """A batch of pure small talk, first in a session: one honest line, so the summary is not empty
    (an empty summary is a failed compaction, and the same batch would fail again)."""
    when = utc(turns[0].at)
    names = sorted({t.speaker or t.role.capitalize() for t in turns})
    who = " and ".join(names) if len(names) <= 3 else ", ".join(names[:3]) + " and others"
    return _Line(day_text(when), f"{when:%H:%M}", [_Sentence.of("", f"{who} made small talk.")])


def _when(line: _Line) -> datetime | None:
    """When a line's window began, from its head; ``None`` for a line without a dated head."""
    if line.day is None or line.time is None:
        return None
    return _parse_when(f"{line.day} {line.time}")


@lru_cache(maxsize=4096)
def _parse_when(head: str) -> datetime | None:
    """``8 May 2023 13:56`` as a datetime. One string, not the day and the time apart:
    ``lru_cache`` keys a lone string by itself, and anything else by a new tuple, which made its
    dict (of datetimes, untracked by the garbage collector) tracked again among the youngest
    objects, walked by every collection (see ``voice_context.core.times``)."""
    try:
        return datetime.strptime(head, "%d %B %Y %H:%M")
    except ValueError:
        return None


def _notes_only(line: _Line) -> bool:
    return line.notes_only or all(_SCREEN.search(s.speaker) for s in line.sentences)


def _insert(lines: list[_Line], line: _Line, gap: float) -> None:
    """Put ``line`` after every line that began no later than it (the summary stays in time order).

    A line without a dated head is never passed: what it says has no known time.
    Screen notes wait in the live buffer and are often folded apart from the
    turns around them, before or after them: a line of notes alone joins the
    end of the line of the conversation it was seen in (the last line that began
    before it, on the same day, less than ``gap`` seconds earlier), and a line of
    turns takes in the lines of notes alone seen during its conversation.
    """
    key = _when(line)
    k = len(lines)
    while key is not None and k > 0:
        other = _when(lines[k - 1])
        if other is None or other <= key:
            break
        k -= 1
    if key is None:
        lines.insert(k, line)
        return
    if line.notes_only:
        host = lines[k - 1] if k > 0 else None
        began = _when(host) if host is not None else None
        if (
            host is not None
            and began is not None
            and host.day == line.day
            and (key - began).total_seconds() <= gap
        ):
            host.sentences.extend(line.sentences)
            return
        lines.insert(k, line)
        return
    end = line.until or key
    notes: list[_Sentence] = []
    while k > 0 and _when(lines[k - 1]) == key and _notes_only(lines[k - 1]):
        notes[:0] = lines.pop(k - 1).sentences  # seen in the minute the line began
        k -= 1
    while k < len(lines):
        after, began = lines[k], _when(lines[k])
        if began is None or after.day != line.day or (began - end).total_seconds() > gap:
            break
        if not _notes_only(after):
            break
        notes.extend(lines.pop(k).sentences)
    line.sentences.extend(notes)
    if k == len(lines) and k > 0:
        host = lines[k - 1]
        began = _when(host)
        if (
            began is not None
            and host.day == line.day
            and (key - began).total_seconds() <= gap
            and len(_render_line(host)) + len(_render_line(line)) <= LINE_CHARS
        ):
            host.sentences.extend(line.sentences)
            return
    lines.insert(k, line)


# -- the whole summary ----------------------------------------------------------------------------


@char_bounded_cache(CACHE_CHARS)
def _parse_line(
    raw: str,
) -> tuple[str | None, str | None, bool, tuple[tuple[str, str, tuple[tuple[str, float], ...]], ...]]:
    """One summary line: its head's date and time, whether it has a head, its labelled sentences.

    Cached: a summary's older lines come back unchanged with every batch.
    """
    head = _HEAD.match(raw)
    day: str | None = None
    time: str | None = None
    if head:
        if head.group("iso"):
            day = day_text(datetime.strptime(head.group("iso"), "%Y-%m-%d"))
            time = head.group("isotime")
        else:
            day, time = head.group("date"), head.group("time")
        body = raw[head.end() :]
    else:
        body = raw
    found: list[tuple[str, str, tuple[tuple[str, float], ...]]] = []
    cuts = [(m.start(), m.end(), m.group(1)) for m in _LABEL.finditer(body)]
    if not cuts or cuts[0][0] > 0:
        cuts.insert(0, (0, 0, ""))
    for k, (_, end, who) in enumerate(cuts):
        stop = cuts[k + 1][0] if k + 1 < len(cuts) else len(body)
        for text in sentences(body[end:stop]):
            found.append((who, text, weighted_words(text)))
    return day, time, head is not None, tuple(found)


def _parse(summary: str) -> list[_Line]:
    """The lines of a summary, normalized (:func:`~voice_context.core.text.normalize`)."""
    lines: list[_Line] = []
    day: str | None = None
    for raw in summary.split("\n"):
        head_day, time, has_head, found = _parse_line(raw)
        if has_head:
            day = head_day or day
        if found:
            lines.append(
                _Line(
                    day if has_head else None,
                    time,
                    [_Sentence(who, text, weights) for who, text, weights in found],
                )
            )
    return lines


def _render_line(line: _Line) -> str:
    """One line, headed by its full date and time: any line read alone says when it happened."""
    parts: list[str] = []
    if line.time is not None:
        parts.append(f"[{line.day}, {line.time}]" if line.day else f"[{line.time}]")
    last: str | None = None
    for sentence in line.sentences:
        if sentence.speaker and sentence.speaker != last:
            parts.append(f"{sentence.speaker}: {sentence.text}")
        else:
            parts.append(sentence.text)
        last = sentence.speaker
    return " ".join(parts)


def _render(lines: Sequence[_Line]) -> str:
    return "\n".join(_render_line(line) for line in lines)


class DeterministicSummarizer:
    """Extractive, speaker-attributed summaries within the char budget. No model, no network.

    ``half_life`` is the age, in lines, at which a sentence is worth half as much
    when the summary must shrink: lower makes older windows coarser sooner.
    ``session_gap`` is the pause, in seconds, that ends one conversation and
    begins the next: a batch's line is split there (and at midnight, UTC), so
    that every line is dated by what it covers (:data:`SESSION_GAP` by default).
    """

    #: The summary ceiling sessions get with this summarizer unless they set their own:
    #: its lines cost nothing to write, so it keeps the detail of hundreds of turns (one
    #: dated line per batch) where a model summarizer is held to the design's 1,200 chars.
    #: Contexts still fit any budget: only ``summary_priority_chars`` of it outranks
    #: the older verbatim turns.
    preferred_max_summary_chars = 12_000

    def __init__(self, *, half_life: float = 48.0, session_gap: float = SESSION_GAP) -> None:
        if half_life <= 0:
            raise ValueError("half_life must be positive")
        if session_gap <= 0:
            raise ValueError("session_gap must be positive")
        self.half_life = half_life
        self.session_gap = session_gap

    @property
    def model(self) -> str:
        return "deterministic"

    def __repr__(self) -> str:
        return f"<DeterministicSummarizer half_life={self.half_life:g} session_gap={self.session_gap:g}>"

    async def summarize(self, request: SummaryRequest) -> str:
        """The fold, in the process's fold thread (:data:`FOLD_THREAD`): it takes a few milliseconds
        (tens for a long summary), which would otherwise hold every reply of the event loop waiting.

        One fold at a time, in the order asked. A fold is Python from end to end and holds the
        interpreter while it runs, so two folds at once take no less time than one after the
        other; but every thread that wants the interpreter is one more the event loop waits
        behind when it comes back from the network. In anyio's worker threads a burst's folds
        ran up to 40 at once."""
        return await FOLD_THREAD.run(partial(self.summarize_now, request))

    def summarize_now(self, request: SummaryRequest) -> str:
        """The same as ``summarize``, synchronously (it never waits on anything)."""
        previous = normalize(request.previous_summary)
        lines = _parse(previous)
        new: list[_Line] = []
        if request.turns or request.notes:
            newest = lines[-1] if lines else None
            known = _told_by_speaker(lines)
            new = _new_lines(
                request.turns, request.notes, request.max_note_chars, self.session_gap, newest, known
            )
            if not new and not previous and request.turns:
                new = [_small_talk_line(request.turns)]
        if not new and len(previous) <= request.max_chars:
            return previous
        for line in new:
            _insert(lines, line, self.session_gap)
        return self.fit(lines, request.max_chars)

    def fit(self, lines: list[_Line], limit: int) -> str:
        """Drop the sentences worth least per character until the summary fits ``limit``.

        A sentence's worth is shared with the sentences that repeat its words, so
        it is re-scored whenever one of those goes; a line's last sentence counts
        double, so that windows grow coarser before they disappear.
        """
        rendered = [_render_line(line) for line in lines]
        text = "\n".join(rendered)
        if len(text) <= limit:
            return text
        entries = [(line, sentence) for line in lines for sentence in line.sentences]
        holders: defaultdict[str, list[int]] = defaultdict(list)
        for k, (_, sentence) in enumerate(entries):
            for word, _ in sentence.weights:
                holders[word].append(k)
        # a sentence's words are distinct: a word's count is the number of sentences that hold it
        counts = {word: len(held) for word, held in holders.items()}
        weights = [sentence.weights for _, sentence in entries]
        costs = [len(sentence.text) + COST_PAD for _, sentence in entries]
        newest = len(lines) - 1
        discount = {id(line): 1.0 / (1.0 + (newest - li) / self.half_life) for li, line in enumerate(lines)}
        discounts = [discount[id(line)] for line, _ in entries]
        position = {id(sentence): k for k, (_, sentence) in enumerate(entries)}
        alive = [True] * len(entries)
        stale = [False] * len(entries)

        def score(k: int) -> float:
            value = sum([w / counts[word] for word, w in weights[k]])
            last = LAST_SENTENCE if len(entries[k][0].sentences) == 1 else 1.0
            return value * last * discounts[k] / costs[k]

        # A sentence's score only grows (its words' counts fall, a line's last sentence counts
        # double): one whose words lost a holder is re-scored only when it comes up (``stale``).
        heap = [(score(k), k) for k in range(len(entries))]
        heapq.heapify(heap)
        shown = list(lines)
        for line, line_text in zip(shown, rendered, strict=True):
            line.length = len(line_text)
        total = len(text)
        remaining = len(entries)
        while heap and total > limit and remaining > 1:
            lowest, k = heapq.heappop(heap)
            if stale[k]:
                stale[k] = False
                heapq.heappush(heap, (score(k), k))
                continue
            # rounding alone may put a stale score a hair above its new one: refresh those close by
            while heap and stale[heap[0][1]] and heap[0][0] <= lowest * (1.0 + _ROUNDING):
                _, other = heapq.heappop(heap)
                stale[other] = False
                heapq.heappush(heap, (score(other), other))
            if heap and heap[0] < (lowest, k):
                heapq.heappush(heap, (lowest, k))
                continue
            alive[k] = False
            remaining -= 1
            line, sentence = entries[k]
            line.sentences = [s for s in line.sentences if s is not sentence]
            if line.sentences:
                new_length = len(_render_line(line))
                total += new_length - line.length
                line.length = new_length
            else:
                shown.remove(line)
                total -= line.length + (1 if shown else 0)
            for word, _ in weights[k]:
                counts[word] -= 1
                for other in holders[word]:
                    stale[other] = alive[other]
            if len(line.sentences) == 1:
                stale[position[id(line.sentences[0])]] = True
        text = _render(shown)
        if len(text) > limit:
            text = clip(text.replace("\n", " "), limit)
        return text


__all__ = ["DeterministicSummarizer"]
