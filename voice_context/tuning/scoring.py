"""Score the contexts a replay produced against a probes file, beside three baselines.

The metric, for one checkpoint (a ``context.get`` the probes file names) and
one probe (an answer with evidence turns):

- the probe *counts* at the checkpoint when every evidence turn has already
  been spoken and none is still shown verbatim in our context (all are older
  than the response's ``first_turn``): it asks what survived compaction;
- **recall**: the rarity-weighted share of the answer's content words found
  anywhere in the context, leaving out the words its question says (a context
  fetched for the question holds those for the asking). Words are lowercased,
  possessives and plurals folded, numbers said as words read as digits (:func:`terms`), stopwords
  dropped; a word's weight is its inverse
  document frequency over the conversation's own turns,
  ``ln((N + 1) / (df + 1)) + 1`` (N turns, df of them holding the word), so
  "tokyo" weighs more than "game" in a conversation about games;
- **speaker**: among probes with some recall, whether the context segment that
  holds most of the answer's weight names an evidence turn's speaker (a
  segment runs from one ``Name:`` label to the next; it names a speaker by that
  label or by mentioning the name);
- **numbers**: among probes whose answer has numbers, month or weekday names,
  the share of those that appear in the context.

Scores are averaged over every (checkpoint, probe) pair that counts. The same
pairs are scored, at the same budget (the response's ``budget_chars``, or its
``budget_tokens`` in the tokenizer the context was counted in, when it had one),
for baselines built from the recording itself, as lines ``Speaker: text``
(and screen notes as rendered) under the request's base instructions and
facts. The baselines carry what the real transcript carries: a line
``[8 May 2023, 13:56]`` opens each conversation session (a gap of 30 minutes
or more) and the first line any baseline shows, and costs its chars:

- ``tail``: only the newest lines that fit (what voice bots do today);
- ``head_tail``: the oldest lines up to half the budget, then the newest;
- ``bm25_10`` / ``bm25_30``: naive retrieval: the lines BM25 ranks best for
  the query (the question in per-question mode, otherwise the query our
  context answered, by default the newest user turn) in 10% / 30% of the
  budget, dated, then the newest lines in the rest;
- ``full``: every line, no budget (the ceiling).

``gap`` is the share of the tail-to-ceiling gap that ours recovers:
``(ours - tail) / (full - tail)``. Beside every recall figure stands what it
costs: ``recent``, the newest turns shown verbatim, counted back from the
last turn to the first one missing, for ours and for each baseline.

The pairs are also reported in buckets: ``final`` (the last checkpoint of
each recording alone: early checkpoints are easy), ``temporal`` and
``other`` (questions about when, and the rest), and ``question``: the
per-question mode, where for each probe none of whose evidence is left in the tail
baseline at the end of the conversation, the context was fetched with the
probe's question as its query (see :func:`score_questions`).

Everything here is pure but for :func:`read_probes`.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from voice_context.codec import NoteAppend, TurnAppend
from voice_context.core.budget import FACTS_HEADER, RECENT_HEADER
from voice_context.core.language.numbers import spoken_numbers
from voice_context.core.language.words import DATE_WORDS, without_apostrophes
from voice_context.core.times import day_text
from voice_context.core.tokens import DEFAULT_TOKENIZER
from voice_context.tuning.replay import Recording

METHODS = ("ours", "tail", "head_tail", "bm25_10", "bm25_30", "full")
BUCKETS = ("final", "temporal", "other", "question")
SESSION_GAP = 1800.0
"""Seconds of silence that open a new conversation session (and a date line in the baselines)."""
_TEMPORAL = re.compile(
    r"^\s*(?:when\b|what (?:date|day|year|month|time)\b|how long (?:ago|before|after)\b"
    r"|in which (?:year|month)\b)",
    re.IGNORECASE,
)

_STOPWORDS = frozenset(
    """
    a an the and or but if so to of in on at by for with from as into onto about over under than then
    is are was were be been being am do does did done have has had having will would shall should can
    could may might must i me my mine myself you your yours he him his she her hers it its we us our
    ours they them their theirs this that these those there here what which who whom whose when where
    why how not no nor yes just very too also only still even ever some any all each every both either
    neither such own same other another more most much many few lot lots s t d ll m re ve
    up down out off again once very really quite get got gets getting go goes going gone went
    """.split()
) - {"may"}
_TOKEN = re.compile(r"[a-z0-9]+")


def stem(word: str) -> str:
    """A light, predictable folding: plurals and leading zeros. ``agencies`` -> ``agency``."""
    if word.isdigit():
        return word.lstrip("0") or "0"
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Every folded word of ``text``, stopwords included, in order. Numbers said as words count
    as their digits ("twenty five" is "25"), on every side of the comparison."""
    lowered = without_apostrophes(spoken_numbers(text).lower())
    return [stem(w) for w in _TOKEN.findall(lowered)]


def content_terms(text: str) -> set[str]:
    """The folded words of ``text`` that carry meaning."""
    return {t for t in terms(text) if t not in _STOPWORDS and (len(t) > 1 or t.isdigit())}


def number_terms(text: str) -> set[str]:
    """The numbers, month and weekday names of ``text``."""
    return {t for t in content_terms(text) if t.isdigit() or t in DATE_WORDS}


def idf_weights(documents: Iterable[str]) -> tuple[dict[str, float], float]:
    """Inverse document frequency of each content word, and the weight of an unseen word."""
    df: Counter[str] = Counter()
    n = 0
    for doc in documents:
        n += 1
        df.update(content_terms(doc))
    weights = {w: math.log((n + 1) / (c + 1)) + 1 for w, c in df.items()}
    return weights, math.log(n + 1) + 1


# -- probes -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Probe:
    """An answer the context should still carry, and the turns (by id) it came from."""

    id: str
    kind: str
    answer: str
    evidence: tuple[str, ...]
    question: str = ""
    category: str = ""

    @property
    def temporal(self) -> bool:
        """A question about when (LoCoMo's category 2, or worded so)."""
        return self.category == "2" or bool(_TEMPORAL.match(self.question))


@dataclass(frozen=True, slots=True)
class ProbeSet:
    """A probes file: its meta line and its probes. ``checkpoints`` empty means every request."""

    probes: tuple[Probe, ...]
    checkpoints: frozenset[str] = frozenset()
    meta: Mapping[str, Any] = field(default_factory=dict)

    def questions(self) -> list[tuple[str, str]]:
        """``(id, question)`` of every probe that asks one: the per-question mode's queries."""
        return [(p.id, p.question) for p in self.probes if p.question.strip()]


def parse_probes(lines: Iterable[str]) -> ProbeSet:
    """Read probes-file lines; lines without an answer or evidence are ignored."""
    meta: dict[str, Any] = {}
    probes: list[Probe] = []
    for line in lines:
        if not line.strip():
            continue
        item = json.loads(line)
        if not isinstance(item, dict):
            continue
        if item.get("kind") == "meta":
            meta = item
            continue
        evidence = item.get("evidence") or []
        answer = item.get("answer")
        if answer is None or not evidence:
            continue
        probes.append(
            Probe(
                id=str(item.get("id", len(probes))),
                kind=str(item.get("kind", "qa")),
                answer=str(answer),
                evidence=tuple(str(e) for e in evidence),
                question=str(item.get("question", "")),
                category=str(item.get("category", "")),
            )
        )
    checkpoints = frozenset(str(c) for c in meta.get("checkpoints") or [])
    return ProbeSet(tuple(probes), checkpoints, meta)


def read_probes(path: str | Path) -> ProbeSet:
    with Path(path).open(encoding="utf-8") as handle:
        return parse_probes(handle)


# -- the conversation -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Line:
    """One baseline line: the ``seq`` of its message, when it was said, its text, and its turn
    index (``None`` for a screen note)."""

    seq: int
    at: float
    text: str
    turn: int | None


@dataclass(slots=True)
class Conversation:
    """What the metric needs from a recording, for one session.

    ``lines`` are the baseline lines in recorded order; ``index`` maps a turn
    id to its transcript index.
    """

    session: str
    speakers: tuple[str, ...]
    turn_speakers: list[str]
    index: dict[str, int]
    lines: list[Line]
    weights: dict[str, float]
    unseen: float
    label: re.Pattern[str] | None
    _words: dict[int, tuple[set[str], Counter[str]]] = field(default_factory=dict)

    def words(self, line: Line) -> tuple[set[str], Counter[str]]:
        """A line's content words and the counts of all its words (cached)."""
        got = self._words.get(line.seq)
        if got is None:
            got = self._words[line.seq] = (content_terms(line.text), Counter(terms(line.text)))
        return got

    @classmethod
    def from_recording(cls, recording: Recording, session: str | None = None) -> Conversation:
        name = session
        turn_texts: list[str] = []
        turn_speakers: list[str] = []
        index: dict[str, int] = {}
        lines: list[Line] = []
        for seq, message in enumerate(recording.decoded):
            if name is None and isinstance(message, TurnAppend | NoteAppend):
                name = message.session
            if message.session != name:
                continue
            if isinstance(message, TurnAppend):
                turn = message.turn
                if turn.id is not None:
                    index.setdefault(turn.id, len(turn_texts))
                text = f"{turn.speaker}: {turn.text}" if turn.speaker else turn.text
                lines.append(Line(seq, turn.at, text, len(turn_texts)))
                turn_texts.append(turn.text)
                turn_speakers.append(turn.speaker)
            elif isinstance(message, NoteAppend):
                note = message.note
                lines.append(Line(seq, note.at, note.render(), None))
        weights, unseen = idf_weights(turn_texts)
        speakers = tuple(sorted({s for s in turn_speakers if s}, key=lambda s: (-len(s), s)))
        label = re.compile("(" + "|".join(re.escape(s) for s in speakers) + "):") if speakers else None
        return cls(name or "", speakers, turn_speakers, index, lines, weights, unseen, label)

    def weight(self, word: str) -> float:
        return self.weights.get(word, self.unseen)


# -- scoring one context ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProbeScore:
    recall: float
    speaker: bool | None  # None when nothing of the answer is in the context
    numbers: float | None  # None when the answer has no numbers or dates


class _Text:
    """A context prepared for scoring: its words and its speaker segments."""

    def __init__(self, text: str, conv: Conversation) -> None:
        self.words = content_terms(text)
        self.segments: list[tuple[set[str], frozenset[str]]] = []
        for line in text.split("\n"):
            if not line.strip():
                continue
            cuts = [(m.start(), m.group(1)) for m in conv.label.finditer(line)] if conv.label else []
            if not cuts or cuts[0][0] > 0:
                cuts.insert(0, (0, ""))
            for k, (start, who) in enumerate(cuts):
                end = cuts[k + 1][0] if k + 1 < len(cuts) else len(line)
                piece = line[start:end]
                named = {s for s in conv.speakers if s in piece}
                if who:
                    named.add(who)
                self.segments.append((content_terms(piece), frozenset(named)))


def score_probe(text: _Text, probe: Probe, conv: Conversation, speakers: set[str]) -> ProbeScore | None:
    """One probe against one prepared context; ``None`` when the answer has no content words
    its question does not say."""
    answer = content_terms(probe.answer) - content_terms(probe.question)
    if not answer:
        return None
    total = sum(conv.weight(w) for w in answer)
    found = answer & text.words
    recall = sum(conv.weight(w) for w in found) / total
    speaker: bool | None = None
    if found:
        best = -1.0
        speaker = False
        for words, named in text.segments:
            mass = sum(conv.weight(w) for w in answer & words)
            if mass <= 0:
                continue
            ok = bool(named & speakers)
            if mass > best + 1e-9:
                best, speaker = mass, ok
            elif abs(mass - best) <= 1e-9:
                speaker = speaker or ok
    numbers = number_terms(probe.answer)
    number_share = len(numbers & text.words) / len(numbers) if numbers else None
    return ProbeScore(recall, speaker, number_share)


# -- baselines ---------------------------------------------------------------------------


def date_line(at: float) -> str:
    """``[8 May 2023, 13:56]``: how a transcript dates a conversation session (UTC)."""
    try:
        when = datetime.fromtimestamp(at, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return "[?]"
    return f"[{day_text(when)}, {when.hour:02d}:{when.minute:02d}]"


def _dated(lines: Sequence[Line], all_lines: Sequence[Line] | None = None) -> list[str]:
    """``lines`` (in order) with a date line before the first, and before each that opens a
    session (after a gap of :data:`SESSION_GAP`) or follows a hole in what is shown."""
    out: list[str] = []
    previous: Line | None = None
    for line in lines:
        if previous is None or line.at - previous.at >= SESSION_GAP:
            out.append(date_line(line.at))
        out.append(line.text)
        previous = line
    return out


def _render(base: str, facts: Sequence[str], lines: Sequence[str], header: str = RECENT_HEADER) -> str:
    sections = [base] if base else []
    if facts:
        sections.append(FACTS_HEADER + "\n" + "\n".join(f"- {f}" for f in facts))
    if lines:
        sections.append(header + "\n" + "\n".join(lines))
    return "\n\n".join(sections)


Measure = Callable[[str], int]
"""How a budget counts a text: its chars (``len``), or a tokenizer's count."""


def recent_turns(lines: Sequence[Line], shown: Sequence[Line]) -> int:
    """The newest turns shown: counted back from the last turn to the first one missing."""
    kept = {line.turn for line in shown if line.turn is not None}
    count = 0
    for line in reversed(lines):
        if line.turn is None:
            continue
        if line.turn not in kept:
            break
        count += 1
    return count


def _newest(
    lines: Sequence[Line], fits: Callable[[list[Line]], bool], skip: frozenset[int] = frozenset()
) -> list[Line]:
    """The most newest lines (``skip`` aside) for which ``fits`` holds: a size only grows with
    more lines, so the count is found by bisection."""
    candidates = [lines[k] for k in range(len(lines)) if k not in skip]
    low, high = 0, len(candidates)  # fits(low newest) holds; find the largest such count
    while low < high:
        mid = (low + high + 1) // 2
        if fits(candidates[len(candidates) - mid :]):
            low = mid
        else:
            high = mid - 1
    return candidates[len(candidates) - low :] if low else []


def tail_baseline(
    lines: Sequence[Line],
    budget: int | None,
    base: str = "",
    facts: Sequence[str] = (),
    measure: Measure = len,
) -> tuple[str, list[Line]]:
    """The newest lines that fit ``budget`` (all of them when ``budget`` is ``None``), dated."""
    if budget is None:
        return _render(base, facts, _dated(lines)), list(lines)
    kept = _newest(lines, lambda trial: measure(_render(base, facts, _dated(trial))) <= budget)
    return _render(base, facts, _dated(kept)), kept


def head_tail_baseline(
    lines: Sequence[Line],
    budget: int | None,
    base: str = "",
    facts: Sequence[str] = (),
    measure: Measure = len,
) -> tuple[str, list[Line]]:
    """The oldest lines up to half the budget, then the newest lines that fit the rest, dated."""
    if budget is None:
        return _render(base, facts, _dated(lines)), list(lines)
    room = budget - measure(_render(base, facts, [""]))
    head: list[Line] = []
    for line in lines:
        if measure("\n".join(_dated([*head, line]))) > room // 2:
            break
        head.append(line)

    def fits(trial: list[Line]) -> bool:
        return measure(_render(base, facts, [*_dated(head), *_dated(trial)])) <= budget

    tail = _newest(lines[len(head) :], fits)
    return _render(base, facts, [*_dated(head), *_dated(tail)]), [*head, *tail]


def _bm25_rank(lines: Sequence[Line], query: str, conv: Conversation) -> list[int]:
    """Line positions by BM25 score for ``query`` (k1 1.2, b 0.75), best first, matches only."""
    wanted = content_terms(query)
    if not wanted:
        return []
    docs = [conv.words(line)[0] for line in lines]
    counts = [conv.words(line)[1] for line in lines]
    lengths = [sum(c.values()) for c in counts]
    avg = (sum(lengths) / len(lengths)) if lengths else 1.0
    n = len(lines)
    scores: dict[int, float] = {}
    for word in wanted:
        holders = [k for k, doc in enumerate(docs) if word in doc]
        if not holders:
            continue
        idf = math.log(1 + (n - len(holders) + 0.5) / (len(holders) + 0.5))
        for k in holders:
            tf = counts[k][word]
            scores[k] = scores.get(k, 0.0) + idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lengths[k] / avg))
    return sorted(scores, key=lambda k: (-scores[k], -k))


def bm25_baseline(
    lines: Sequence[Line],
    budget: int | None,
    query: str,
    share: float,
    conv: Conversation,
    base: str = "",
    facts: Sequence[str] = (),
    measure: Measure = len,
) -> tuple[str, list[Line]]:
    """Naive retrieval: the best BM25 lines for ``query`` in ``share`` of the budget, then the
    newest lines that fit the rest. Every line dated; without a budget, every line."""
    if budget is None:
        return _render(base, facts, _dated(lines)), list(lines)
    room = budget - measure(_render(base, facts, [""]))
    header = "Retrieved:"
    picked: list[int] = []
    retrieved_room = int(room * share)
    for k in _bm25_rank(lines, query, conv):
        trial = sorted([*picked, k])
        if measure(header + "\n" + "\n".join(_dated([lines[j] for j in trial]))) + 2 > retrieved_room:
            continue
        picked = trial
    retrieved = [lines[j] for j in picked]
    block = (header + "\n" + "\n".join(_dated(retrieved))) if retrieved else ""

    def render(recent: list[Line]) -> str:
        sections = [base] if base else []
        if facts:
            sections.append(FACTS_HEADER + "\n" + "\n".join(f"- {f}" for f in facts))
        if block:
            sections.append(block)
        if recent:
            sections.append(RECENT_HEADER + "\n" + "\n".join(_dated(recent)))
        return "\n\n".join(sections)

    recent = _newest(lines, lambda trial: measure(render(trial)) <= budget, frozenset(picked))
    return render(recent), [*retrieved, *recent]


def full_baseline(lines: Sequence[Line], base: str = "", facts: Sequence[str] = ()) -> str:
    """Every line, dated: the ceiling."""
    return _render(base, facts, _dated(lines))


def context_text(response: Mapping[str, Any]) -> str:
    """The text a bot received: the instructions, or the messages' contents one per line."""
    if isinstance(response.get("instructions"), str) and response.get("format") != "messages":
        return str(response["instructions"])
    messages = response.get("messages") or []
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


# -- aggregating ---------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """Sums for one method; :meth:`row` gives the averages. ``recent`` sums, per pair, the
    newest turns the method showed verbatim (its cost in recency)."""

    pairs: int = 0
    recall: float = 0.0
    speaker_n: int = 0
    speaker_ok: int = 0
    numbers_n: int = 0
    numbers: float = 0.0
    recent: int = 0

    def add(self, score: ProbeScore, recent: int = 0) -> None:
        self.pairs += 1
        self.recall += score.recall
        self.recent += recent
        if score.speaker is not None:
            self.speaker_n += 1
            self.speaker_ok += int(score.speaker)
        if score.numbers is not None:
            self.numbers_n += 1
            self.numbers += score.numbers

    def merge(self, other: Tally) -> None:
        self.pairs += other.pairs
        self.recall += other.recall
        self.speaker_n += other.speaker_n
        self.speaker_ok += other.speaker_ok
        self.numbers_n += other.numbers_n
        self.numbers += other.numbers
        self.recent += other.recent

    def row(self) -> dict[str, float | int | None]:
        return {
            "pairs": self.pairs,
            "recall": self.recall / self.pairs if self.pairs else None,
            "speaker": self.speaker_ok / self.speaker_n if self.speaker_n else None,
            "numbers": self.numbers / self.numbers_n if self.numbers_n else None,
            "recent": self.recent / self.pairs if self.pairs else None,
        }


def _methods() -> dict[str, Tally]:
    return {m: Tally() for m in METHODS}


def _summarize(tallies: Mapping[str, Tally]) -> dict[str, Any]:
    rows = {m: tallies[m].row() for m in METHODS}
    ours, tail, full = (rows[m]["recall"] for m in ("ours", "tail", "full"))
    gap = None
    if ours is not None and tail is not None and full is not None and full - tail > 1e-9:
        gap = (ours - tail) / (full - tail)
    recency = None
    if rows["ours"]["recent"] is not None and rows["tail"]["recent"]:
        recency = float(rows["ours"]["recent"] or 0) / float(rows["tail"]["recent"] or 1)
    return {"pairs": tallies["ours"].pairs, "methods": rows, "gap": gap, "recency": recency}


@dataclass(slots=True)
class Scores:
    """Tallies per method, summed over checkpoints (and recordings, with :meth:`merge`):
    ``tallies`` pools every checkpoint; ``buckets`` holds the same per bucket (:data:`BUCKETS`)."""

    tallies: dict[str, Tally] = field(default_factory=_methods)
    buckets: dict[str, dict[str, Tally]] = field(default_factory=lambda: {b: _methods() for b in BUCKETS})
    checkpoints: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: Scores) -> None:
        for method in METHODS:
            self.tallies[method].merge(other.tallies[method])
            for bucket in BUCKETS:
                self.buckets[bucket][method].merge(other.buckets[bucket][method])
        self.checkpoints.extend(other.checkpoints)

    def summary(self) -> dict[str, Any]:
        """The pooled figures (``pairs``, ``methods``, ``gap``, ``recency``: ours' newest verbatim
        turns over the tail's), and the same for each bucket under ``buckets``."""
        out = _summarize(self.tallies)
        out["buckets"] = {b: _summarize(self.buckets[b]) for b in BUCKETS}
        return out


def _due(probe_turns: Sequence[int], turn_index: int, first_turn: int) -> bool:
    return bool(probe_turns) and max(probe_turns) <= turn_index and max(probe_turns) < first_turn


def _request_frame(record: Mapping[str, Any]) -> tuple[str, list[str]]:
    request = record.get("request") or {}
    raw_base, raw_facts = request.get("base_instructions"), request.get("facts")
    base = raw_base if isinstance(raw_base, str) else ""
    facts = [str(f) for f in raw_facts] if isinstance(raw_facts, list) else []
    return base, facts


def response_budget(response: Mapping[str, Any]) -> tuple[int | None, Measure]:
    """The budget the baselines get, and how it counts: a token budget in the tokenizer our
    context was counted in when the request had one, else the char budget."""
    tokens = response.get("budget_tokens")
    if isinstance(tokens, int) and not isinstance(tokens, bool):
        from voice_context.tokenizers import load_tokenizer

        name = str(response.get("tokenizer") or DEFAULT_TOKENIZER)
        return tokens, load_tokenizer("chars" if name.startswith("chars") else name).count
    budget = response.get("budget_chars")
    return (budget if isinstance(budget, int) else None), len


def _method_texts(
    response: Mapping[str, Any],
    lines: Sequence[Line],
    query: str,
    conv: Conversation,
    base: str,
    facts: list[str],
) -> dict[str, tuple[str, int]]:
    """Every method's context text and the newest turns it shows verbatim."""
    budget, measure = response_budget(response)
    tail, tail_lines = tail_baseline(lines, budget, base, facts, measure)
    head_tail, head_tail_lines = head_tail_baseline(lines, budget, base, facts, measure)
    bm10, bm10_lines = bm25_baseline(lines, budget, query, 0.1, conv, base, facts, measure)
    bm30, bm30_lines = bm25_baseline(lines, budget, query, 0.3, conv, base, facts, measure)
    turns = [line for line in lines if line.turn is not None]
    return {
        "ours": (context_text(response), int(response.get("turns_shown", 0) or 0)),
        "tail": (tail, recent_turns(lines, tail_lines)),
        "head_tail": (head_tail, recent_turns(lines, head_tail_lines)),
        "bm25_10": (bm10, recent_turns(lines, bm10_lines)),
        "bm25_30": (bm30, recent_turns(lines, bm30_lines)),
        "full": (full_baseline(lines, base, facts), len(turns)),
    }


def _resolve(probes: ProbeSet, conv: Conversation) -> list[tuple[Probe, list[int], set[str]]]:
    resolved: list[tuple[Probe, list[int], set[str]]] = []
    for probe in probes.probes:
        turns = sorted(conv.index[e] for e in probe.evidence if e in conv.index)
        if turns:
            resolved.append((probe, turns, {conv.turn_speakers[i] for i in turns}))
    return resolved


def score_contexts(
    contexts: Sequence[Mapping[str, Any]],
    probes: ProbeSet,
    conv: Conversation,
    questions: Sequence[Mapping[str, Any]] = (),
) -> Scores:
    """Score every checkpoint of one session's replay output, and the per-question contexts
    (``questions``) when given. See the module docstring."""
    scores = Scores()
    resolved = _resolve(probes, conv)
    chosen = [
        record
        for record in contexts
        if record.get("session", conv.session) == conv.session
        and (not probes.checkpoints or str(record.get("request_id")) in probes.checkpoints)
    ]
    for position, record in enumerate(chosen):
        response = record.get("response") or {}
        turn_index = int(record.get("turn_index", -1))
        first_turn = int(response.get("first_turn", response.get("cursor", 0)))
        due = [item for item in resolved if _due(item[1], turn_index, first_turn)]
        row: dict[str, Any] = {
            "request_id": record.get("request_id"),
            "turn_index": turn_index,
            "first_turn": first_turn,
            "budget_chars": response.get("budget_chars"),
            "due": len(due),
        }
        if not due:
            scores.checkpoints.append(row)
            continue
        base, facts = _request_frame(record)
        seq = int(record.get("seq", 1 << 60))
        lines = [line for line in conv.lines if line.seq < seq]
        query = str(response.get("query") or "")
        final = position == len(chosen) - 1
        for method, (text, recent) in _method_texts(response, lines, query, conv, base, facts).items():
            prepared = _Text(text, conv)
            tally = Tally()
            for probe, _, speakers in due:
                result = score_probe(prepared, probe, conv, speakers)
                if result is None:
                    continue
                tally.add(result, recent)
                one = Tally()
                one.add(result, recent)
                scores.buckets["temporal" if probe.temporal else "other"][method].merge(one)
                if final:
                    scores.buckets["final"][method].merge(one)
            scores.tallies[method].merge(tally)
            row[method] = tally.row()["recall"]
        scores.checkpoints.append(row)
    scores.merge(score_questions(questions, probes, conv))
    return scores


def score_questions(questions: Sequence[Mapping[str, Any]], probes: ProbeSet, conv: Conversation) -> Scores:
    """The per-question mode: each record is a context fetched at the end of the conversation
    with one probe's question as its query (``probe`` names it). A probe counts when every one
    of its evidence turns has left the tail baseline at the same budget; it is scored alone, for
    ours and every baseline, into the ``question`` bucket."""
    scores = Scores()
    by_id = {probe.id: (probe, turns, speakers) for probe, turns, speakers in _resolve(probes, conv)}
    for record in questions:
        if record.get("session", conv.session) != conv.session:
            continue
        item = by_id.get(str(record.get("probe")))
        if item is None:
            continue
        probe, evidence, speakers = item
        response = record.get("response") or {}
        base, facts = _request_frame(record)
        seq = int(record.get("seq", 1 << 60))
        lines = [line for line in conv.lines if line.seq < seq]
        budget, measure = response_budget(response)
        _, tail_lines = tail_baseline(lines, budget, base, facts, measure)
        if {line.turn for line in tail_lines} & set(evidence):
            continue  # the tail still shows some of it: the checkpoints' rule, and the yardstick's
        texts = _method_texts(response, lines, probe.question, conv, base, facts)
        for method, (text, recent) in texts.items():
            result = score_probe(_Text(text, conv), probe, conv, speakers)
            if result is not None:
                scores.buckets["question"][method].add(result, recent)
    return scores


__all__ = [
    "BUCKETS",
    "METHODS",
    "Conversation",
    "Line",
    "Probe",
    "ProbeScore",
    "ProbeSet",
    "Scores",
    "Tally",
    "bm25_baseline",
    "content_terms",
    "context_text",
    "date_line",
    "full_baseline",
    "head_tail_baseline",
    "idf_weights",
    "number_terms",
    "parse_probes",
    "read_probes",
    "recent_turns",
    "response_budget",
    "score_contexts",
    "score_probe",
    "score_questions",
    "stem",
    "tail_baseline",
    "terms",
]
