"""A summarizer that needs no model and no network: extractive, speaker-attributed, budgeted.

It keeps the sentences that carry state (names, numbers, dates, decisions,
commitments, open questions), drops filler (greetings, laughter, backchannels,
repeated rephrasings), attributes each kept sentence to its speaker, and writes
one line per batch, headed by the batch's time. Older lines are condensed
first when the summary must shrink, so detail fades with age.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from voice_context.core.text import clip, keep_newest_sentences, normalize, sentences
from voice_context.core.turns import Note, Turn
from voice_context.summarizers.base import SummaryRequest

_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*|\d[\d,.:/-]*")
_FILLER = re.compile(
    r"^(?:(?:hi|hello|hey|yo|heya|bye|goodbye|thanks|thank you|ok(?:ay)?|yeah|yep|yes|no|nope|sure|right|"
    r"cool|nice|great|awesome|wow|oh|ah|uh|um|hmm+|mm+|mhm|uh-huh|mm-hmm|lol|haha+|hehe+|ha|lmao|k|"
    r"alright|gotcha|i see|true|"
    r"exactly|totally|same|good|fine|really|indeed|wait|well|so)[\s,.!?…-]*)+$",
    re.IGNORECASE,
)
_STOPWORDS = """
a an the and or but if so to of in on at by for with from as is are was were be been being am do does did
have has had i you he she it we they me him her us them my your his its our their this that these those
there here what which who whom whose when where why how not no yes just really very too also then than
can could would should will shall may might must about into over after before up down out off again
oh uh um yeah like know think mean get got go going gonna wanna kind sort thing things stuff lot lots
well okay ok right sure maybe some any all more most much many one ones now still even only
"""
_STOP = frozenset(_STOPWORDS.split())
_DECISION = re.compile(
    r"\b(decid\w*|agree\w*|plan\w*|will|going to|gonna|let's|lets|promise\w*|deadline|schedul\w*|"
    r"need to|have to|must|should|todo|remind\w*|book\w*|buy|bought|start\w*|finish\w*|adopt\w*|"
    r"moved?|married|birthday|favou?rite|prefer\w*|love[sd]?|hate[sd]?)\b",
    re.IGNORECASE,
)
_NUMBER = re.compile(r"\d")
_MONTHS = re.compile(
    r"\b(jan(uary)?|feb(ruary)?|mar(ch)?|apr(il)?|may|june?|july?|aug(ust)?|sep(tember)?|oct(ober)?|"
    r"nov(ember)?|dec(ember)?|monday|tuesday|wednesday|thursday|friday|saturday|sunday|yesterday|"
    r"tomorrow|tonight|today|last (week|month|year)|next (week|month|year))\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class _Candidate:
    order: int
    speaker: str
    text: str
    score: float


def content_words(text: str) -> list[str]:
    """The lowercased words of ``text`` that carry meaning (no stopwords, no filler)."""
    return [w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP and len(w) > 1]


def is_filler(text: str) -> bool:
    """True for greetings, laughter, backchannels and other turns that change nothing."""
    stripped = text.strip()
    return not stripped or bool(_FILLER.match(stripped)) or not content_words(stripped)


def _score(sentence: str, seen: set[str]) -> float:
    words = content_words(sentence)
    if not words:
        return 0.0
    fresh = [w for w in words if w not in seen]
    score = len(set(fresh)) + 0.3 * len(set(words))
    if _NUMBER.search(sentence) or _MONTHS.search(sentence):
        score += 3
    if _DECISION.search(sentence):
        score += 2
    if sentence.rstrip().endswith("?"):
        score += 1.5
    names = re.findall(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+", sentence)
    score += 1.5 * len(set(names))
    return score / math.sqrt(max(4, len(sentence) / 12))


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M")


class DeterministicSummarizer:
    """Extractive, speaker-attributed summaries within the char budget. No model, no network.

    ``line_share`` is the part of ``max_chars`` one batch's line may take when
    it is written; older lines shrink further when the summary runs out of room.
    """

    def __init__(self, *, line_share: float = 0.5, stamp_times: bool = True) -> None:
        if not 0 < line_share <= 1:
            raise ValueError("line_share must be in (0, 1]")
        self.line_share = line_share
        self.stamp_times = stamp_times

    @property
    def model(self) -> str:
        return "deterministic"

    def __repr__(self) -> str:
        return f"<DeterministicSummarizer line_share={self.line_share}>"

    async def summarize(self, request: SummaryRequest) -> str:
        return self.summarize_now(request)

    def summarize_now(self, request: SummaryRequest) -> str:
        """The same as ``summarize``, synchronously (it never waits on anything)."""
        limit = request.max_chars
        lines = [line for line in normalize(request.previous_summary).split("\n") if line]
        if request.turns or request.notes:
            room = max(60, int(limit * self.line_share))
            line = self._line(request.turns, request.notes, request.max_note_chars, room)
            if line:
                lines.append(line)
        return self._fit(lines, limit)

    # -- one batch -------------------------------------------------------------

    def _line(self, turns: Sequence[Turn], notes: Sequence[Note], note_chars: int, room: int) -> str:
        candidates: list[_Candidate] = []
        seen_texts: set[str] = set()
        order = 0
        for turn in turns:
            if is_filler(turn.text):
                continue
            for sentence in sentences(turn.text) or [turn.text]:
                key = " ".join(content_words(sentence))
                if not key or key in seen_texts or is_filler(sentence):
                    continue
                seen_texts.add(key)
                candidates.append(_Candidate(order, turn.speaker or turn.role, sentence, 0.0))
                order += 1
        seen: set[str] = set()
        scored = []
        for cand in candidates:
            scored.append(_Candidate(cand.order, cand.speaker, cand.text, _score(cand.text, seen)))
            seen.update(content_words(cand.text))
        note_text = ""
        if notes:
            rendered = "; ".join(note.render() for note in notes)
            note_text = "Screen: " + clip(rendered, max(20, min(note_chars, room // 3)))
        head = ""
        if self.stamp_times and turns:
            head = f"[{_stamp(turns[0].at)}] "
        budget = room - len(head) - (len(note_text) + 1 if note_text else 0)
        chosen = self._choose(scored, budget)
        body = self._render(chosen)
        parts = [p for p in (body, note_text) if p]
        if not parts:
            return ""
        return clip(head + " ".join(parts), room)

    @staticmethod
    def _choose(cands: list[_Candidate], budget: int) -> list[_Candidate]:
        picked: list[_Candidate] = []
        for cand in sorted(cands, key=lambda c: (-c.score, c.order)):
            trial = sorted([*picked, cand], key=lambda c: c.order)
            if len(DeterministicSummarizer._render(trial)) <= budget:
                picked = trial
        return picked

    @staticmethod
    def _render(cands: Sequence[_Candidate]) -> str:
        out: list[str] = []
        last = None
        for cand in cands:
            text = cand.text.strip()
            if text[-1:] not in ".!?…":
                text += "."
            out.append(text if cand.speaker == last else f"{cand.speaker}: {text}")
            last = cand.speaker
        return " ".join(out)

    # -- the whole summary -------------------------------------------------------

    def _fit(self, lines: list[str], limit: int) -> str:
        """Shrink the oldest lines first until the summary fits ``limit``."""
        lines = list(lines)
        while len("\n".join(lines)) > limit and lines:
            excess = len("\n".join(lines)) - limit
            oldest = lines[0]
            if len(lines) > 1 and len(oldest) - excess < 40:
                lines.pop(0)
                continue
            target = max(0, len(oldest) - max(excess, len(oldest) // 3))
            lines[0] = _condense(oldest, target)
            if not lines[0]:
                lines.pop(0)
        return "\n".join(lines)


def _condense(line: str, target: int) -> str:
    """Keep the line's time head and its most informative sentences within ``target`` chars."""
    if target < 20:
        return ""
    match = re.match(r"^(\[[^\]]*\]\s*)", line)
    head = match.group(1) if match else ""
    body = line[len(head) :]
    parts = sentences(body)
    if len(parts) <= 1:
        return head + keep_newest_sentences(body, target - len(head)) if target > len(head) + 10 else ""
    seen: set[str] = set()
    ranked = sorted(range(len(parts)), key=lambda i: -_score(parts[i], seen))
    keep: set[int] = set()
    for i in ranked:
        trial = " ".join(parts[j] for j in sorted(keep | {i}))
        if len(head) + len(trial) <= target:
            keep.add(i)
    if not keep:
        return ""
    return head + " ".join(parts[j] for j in sorted(keep))
