"""Score the contexts a replay produced against a probes file, beside three baselines.

The metric, for one checkpoint (a ``context.get`` the probes file names) and
one probe (an answer with evidence turns):

- the probe *counts* at the checkpoint when every evidence turn has already
  been spoken and none is still shown verbatim in our context (all are older
  than the response's ``first_turn``): it asks what survived compaction;
- **recall**: the rarity-weighted share of the answer's content words found
  anywhere in the context. Words are lowercased, possessives and plurals
  folded, numbers said as words read as digits (:func:`terms`), stopwords
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
pairs are scored, at the same char budget (the response's ``budget_chars``),
for three baselines built from the recording itself, as lines
``Speaker: text`` (and screen notes as rendered) under the request's base
instructions and facts:

- ``tail``: only the newest lines that fit (what voice bots do today);
- ``head_tail``: the oldest lines up to half the budget, then the newest;
- ``full``: every line, no budget (the ceiling).

``gap`` is the share of the tail-to-ceiling gap that ours recovers:
``(ours - tail) / (full - tail)``.

Everything here is pure but for :func:`read_probes`.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voice_context.core.budget import FACTS_HEADER, RECENT_HEADER
from voice_context.replay import Recording, note_from, turn_from
from voice_context.summarizers.deterministic import spoken_numbers

METHODS = ("ours", "tail", "head_tail", "full")

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
_MONTHS = frozenset(
    "january february march april may june july august september october november december".split()
)
_WEEKDAYS = frozenset("monday tuesday wednesday thursday friday saturday sunday".split())
_POSSESSIVE = re.compile(r"['’]s\b")
_APOSTROPHE = re.compile(r"['’]")
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
    lowered = _APOSTROPHE.sub("", _POSSESSIVE.sub("", spoken_numbers(text).lower()))
    return [stem(w) for w in _TOKEN.findall(lowered)]


def content_terms(text: str) -> set[str]:
    """The folded words of ``text`` that carry meaning."""
    return {t for t in terms(text) if t not in _STOPWORDS and (len(t) > 1 or t.isdigit())}


def number_terms(text: str) -> set[str]:
    """The numbers, month and weekday names of ``text``."""
    return {t for t in content_terms(text) if t.isdigit() or t in _MONTHS or t in _WEEKDAYS}


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


@dataclass(frozen=True, slots=True)
class ProbeSet:
    """A probes file: its meta line and its probes. ``checkpoints`` empty means every request."""

    probes: tuple[Probe, ...]
    checkpoints: frozenset[str] = frozenset()
    meta: Mapping[str, Any] = field(default_factory=dict)


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
            )
        )
    checkpoints = frozenset(str(c) for c in meta.get("checkpoints") or [])
    return ProbeSet(tuple(probes), checkpoints, meta)


def read_probes(path: str | Path) -> ProbeSet:
    with Path(path).open(encoding="utf-8") as handle:
        return parse_probes(handle)


# -- the conversation -------------------------------------------------------------------


@dataclass(slots=True)
class Conversation:
    """What the metric needs from a recording, for one session.

    ``lines`` are the baseline lines in recorded order, each with the ``seq`` of
    its message; ``index`` maps a turn id to its transcript index.
    """

    session: str
    speakers: tuple[str, ...]
    turn_speakers: list[str]
    index: dict[str, int]
    lines: list[tuple[int, str]]
    weights: dict[str, float]
    unseen: float
    label: re.Pattern[str] | None

    @classmethod
    def from_recording(cls, recording: Recording, session: str | None = None) -> Conversation:
        name = session
        turn_texts: list[str] = []
        turn_speakers: list[str] = []
        index: dict[str, int] = {}
        lines: list[tuple[int, str]] = []
        now = 0.0
        for seq, message in enumerate(recording.messages):
            msg_session = str(message.get("session") or "")
            if name is None and message["type"] in ("turn.append", "note.append"):
                name = msg_session
            if msg_session != name:
                continue
            if message["type"] == "turn.append" and isinstance(message.get("turn"), dict):
                turn = turn_from(message["turn"], now)
                now = turn.at
                if turn.id is not None:
                    index.setdefault(turn.id, len(turn_texts))
                turn_texts.append(turn.text)
                turn_speakers.append(turn.speaker)
                lines.append((seq, f"{turn.speaker}: {turn.text}" if turn.speaker else turn.text))
            elif message["type"] == "note.append" and isinstance(message.get("note"), dict):
                lines.append((seq, note_from(message["note"], now).render()))
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
    """One probe against one prepared context; ``None`` when the answer has no content words."""
    answer = content_terms(probe.answer)
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


def _render(base: str, facts: Sequence[str], lines: Sequence[str]) -> str:
    sections = [base] if base else []
    if facts:
        sections.append(FACTS_HEADER + "\n" + "\n".join(f"- {f}" for f in facts))
    if lines:
        sections.append(RECENT_HEADER + "\n" + "\n".join(lines))
    return "\n\n".join(sections)


def _frame(base: str, facts: Sequence[str]) -> int:
    return len(_render(base, facts, [""]))


def tail_baseline(lines: Sequence[str], budget: int | None, base: str = "", facts: Sequence[str] = ()) -> str:
    """The newest lines that fit ``budget`` (all of them when ``budget`` is ``None``)."""
    if budget is None:
        return _render(base, facts, lines)
    room = budget - _frame(base, facts)
    kept: list[str] = []
    used = -1
    for line in reversed(lines):
        if used + len(line) + 1 > room:
            break
        kept.append(line)
        used += len(line) + 1
    return _render(base, facts, kept[::-1])


def head_tail_baseline(
    lines: Sequence[str], budget: int | None, base: str = "", facts: Sequence[str] = ()
) -> str:
    """The oldest lines up to half the budget, then the newest lines that fit the rest."""
    if budget is None:
        return _render(base, facts, lines)
    room = budget - _frame(base, facts)
    head: list[str] = []
    used = -1
    for line in lines:
        if used + len(line) + 1 > room // 2:
            break
        head.append(line)
        used += len(line) + 1
    tail: list[str] = []
    for line in reversed(lines[len(head) :]):
        if used + len(line) + 1 > room:
            break
        tail.append(line)
        used += len(line) + 1
    return _render(base, facts, [*head, *tail[::-1]])


def full_baseline(lines: Sequence[str], base: str = "", facts: Sequence[str] = ()) -> str:
    """Every line: the ceiling."""
    return _render(base, facts, lines)


def context_text(response: Mapping[str, Any]) -> str:
    """The text a bot received: the instructions, or the messages' contents one per line."""
    if isinstance(response.get("instructions"), str) and response.get("format") != "messages":
        return str(response["instructions"])
    messages = response.get("messages") or []
    return "\n".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))


# -- aggregating ---------------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    """Sums for one method; :meth:`row` gives the averages."""

    pairs: int = 0
    recall: float = 0.0
    speaker_n: int = 0
    speaker_ok: int = 0
    numbers_n: int = 0
    numbers: float = 0.0

    def add(self, score: ProbeScore) -> None:
        self.pairs += 1
        self.recall += score.recall
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

    def row(self) -> dict[str, float | int | None]:
        return {
            "pairs": self.pairs,
            "recall": self.recall / self.pairs if self.pairs else None,
            "speaker": self.speaker_ok / self.speaker_n if self.speaker_n else None,
            "numbers": self.numbers / self.numbers_n if self.numbers_n else None,
        }


@dataclass(slots=True)
class Scores:
    """Tallies per method, summed over checkpoints (and recordings, with :meth:`merge`)."""

    tallies: dict[str, Tally] = field(default_factory=lambda: {m: Tally() for m in METHODS})
    checkpoints: list[dict[str, Any]] = field(default_factory=list)

    def merge(self, other: Scores) -> None:
        for method in METHODS:
            self.tallies[method].merge(other.tallies[method])
        self.checkpoints.extend(other.checkpoints)

    def summary(self) -> dict[str, Any]:
        rows = {m: self.tallies[m].row() for m in METHODS}
        ours, tail, full = (rows[m]["recall"] for m in ("ours", "tail", "full"))
        gap = None
        if ours is not None and tail is not None and full is not None and full - tail > 1e-9:
            gap = (ours - tail) / (full - tail)
        return {"pairs": self.tallies["ours"].pairs, "methods": rows, "gap": gap}


def _due(probe_turns: Sequence[int], turn_index: int, first_turn: int) -> bool:
    return bool(probe_turns) and max(probe_turns) <= turn_index and max(probe_turns) < first_turn


def score_contexts(contexts: Sequence[Mapping[str, Any]], probes: ProbeSet, conv: Conversation) -> Scores:
    """Score every checkpoint of one session's replay output. See the module docstring."""
    scores = Scores()
    resolved: list[tuple[Probe, list[int], set[str]]] = []
    for probe in probes.probes:
        turns = sorted(conv.index[e] for e in probe.evidence if e in conv.index)
        if turns:
            resolved.append((probe, turns, {conv.turn_speakers[i] for i in turns}))
    for record in contexts:
        if record.get("session", conv.session) != conv.session:
            continue
        if probes.checkpoints and str(record.get("request_id")) not in probes.checkpoints:
            continue
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
        request = record.get("request") or {}
        raw_base, raw_facts = request.get("base_instructions"), request.get("facts")
        base = raw_base if isinstance(raw_base, str) else ""
        facts = [str(f) for f in raw_facts] if isinstance(raw_facts, list) else []
        seq = int(record.get("seq", 1 << 60))
        lines = [line for s, line in conv.lines if s < seq]
        budget = response.get("budget_chars")
        budget = budget if isinstance(budget, int) else None
        texts = {
            "ours": context_text(response),
            "tail": tail_baseline(lines, budget, base, facts),
            "head_tail": head_tail_baseline(lines, budget, base, facts),
            "full": full_baseline(lines, base, facts),
        }
        for method, text in texts.items():
            prepared = _Text(text, conv)
            tally = Tally()
            for probe, _, speakers in due:
                result = score_probe(prepared, probe, conv, speakers)
                if result is not None:
                    tally.add(result)
            scores.tallies[method].merge(tally)
            row[method] = tally.row()["recall"]
        scores.checkpoints.append(row)
    return scores


__all__ = [
    "METHODS",
    "Conversation",
    "Probe",
    "ProbeScore",
    "ProbeSet",
    "Scores",
    "Tally",
    "content_terms",
    "context_text",
    "full_baseline",
    "head_tail_baseline",
    "idf_weights",
    "number_terms",
    "parse_probes",
    "read_probes",
    "score_contexts",
    "score_probe",
    "stem",
    "tail_baseline",
    "terms",
]
