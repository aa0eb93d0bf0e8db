"""Did a fold fold? A model's summary must carry the batch it was given.

A small model asked to fold a batch into the summary may hand back the previous
summary unchanged, or a rewrite that keeps none of the batch: the cursor then
moves past turns nobody will see again. :func:`missing_batch` says when that
happened, by what the batch adds: the names, numbers and dates (its *anchors*)
and the other content words of its dated digest (the deterministic
summarizer's lines for it, their heads set aside) that the previous summary did not already hold. A
summary that holds none of them, or is the previous one, has not folded the
batch. Nor has one that drops the previous summary (keeps fewer than half of its
anchors, a quarter when it had to condense a summary near its ceiling), nor one
that copies its prompt (a tiny model may hand back the
prompt's fences, ``<<<TRANSCRIPT``, or its transcript lines, ``[#12 2024-05-01
14:03:07]``): it holds the batch's words, but as an echo, not a summary.
"""

from __future__ import annotations

import re

from voice_context.core.language.words import DATE_WORDS, content_words
from voice_context.core.text import normalize
from voice_context.summarizers.base import SummaryRequest

__all__ = [
    "anchors",
    "dropped_previous",
    "missing_batch",
    "note_facts",
    "rewritten_lines",
    "speaks_for_itself",
]

_TIME = re.compile(r"\b\d{1,2}:\d{2}\b")
_ECHO = re.compile(r"<<<[A-Z_]+\b|\b[A-Z_]+>>>|\[#\d+ \d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})?\]")
_HEAD = re.compile(r"^\[[^\]\n]*\]\s*", re.MULTILINE)
_TOKEN = re.compile(r"[A-Za-z][A-Za-z'’-]*|\d[\d,.]*")


def anchors(text: str) -> set[str]:
    """The names, numbers and dates of ``text``, lowercased: capitalised words that carry
    meaning ("Porto", "Susie", not "The"), numbers, month and weekday names."""
    meaningful = set(content_words(text))
    found: set[str] = set()
    for token in _TOKEN.findall(_TIME.sub(" ", text)):
        word = token.lower().rstrip(".,").removesuffix("'s").removesuffix("’s")
        named = token[0].isupper() and len(word) > 1 and word in meaningful
        if token[0].isdigit() or word in DATE_WORDS or named:
            found.add(word)
    return found


def missing_batch(request: SummaryRequest, summary: str, digest: str) -> str | None:
    """Why ``summary`` does not carry ``request``'s batch, or ``None`` when it does.

    ``digest`` is the batch's dated digest. A summary that echoes its prompt
    never does. A re-compaction has no batch, and a batch whose anchors the
    previous summary already holds adds nothing to check.
    """
    if _ECHO.search(summary) and not _ECHO.search(request.previous_summary):
        return "echoes the prompt"
    if request.recompact or not (request.turns or request.notes):
        return None
    if normalize(summary) == normalize(request.previous_summary):
        return "unchanged"
    before = anchors(request.previous_summary) | set(content_words(request.previous_summary))
    said = _HEAD.sub("", digest)  # a line's date is the batch's, not something said in it
    new = (anchors(said) | set(content_words(_TIME.sub(" ", said)))) - before
    after = anchors(summary) | set(content_words(summary))
    if new and not new & after:
        return "none of the batch's names, numbers, dates or words"
    return dropped_previous(request, summary)


KEPT_SHARE = 0.5
"""A fold keeps at least this share of the previous summary's names, numbers and dates (half
of that when the previous summary is near its ceiling and the fold has to condense it)."""
MIN_ANCHORS = 4
"""A previous summary with fewer anchors than this is too slight to judge by them."""


def dropped_previous(request: SummaryRequest, summary: str) -> str | None:
    """Why ``summary`` does not carry the previous summary, or ``None`` when it does: a model
    asked to fold a batch in may hand back the batch alone, and everything summarized before
    it would be lost with the next fold."""
    before = anchors(request.previous_summary)
    if len(before) < MIN_ANCHORS:
        return None
    crowded = len(request.previous_summary) >= 0.8 * request.max_chars
    share = KEPT_SHARE / 2 if crowded else KEPT_SHARE
    if len(before & anchors(summary)) < share * len(before):
        return "drops the previous summary"
    return None


_LABEL = re.compile(r"(?:^|(?<=[.!?…]) )([A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*)*)(?:'s screen \([^)]*\))?: ")
_SENTENCE_START = re.compile(r"(?:^|[.!?…:]\s+|\(\s*)([A-Za-z][\w'’-]*)")


def note_facts(note: str) -> set[str]:
    """What a rewrite of a dated note must keep, lowercased: who speaks in it (its ``Name:``
    labels), its numbers, its months and weekdays, and the capitalised words inside its
    sentences (a name; a capital that only starts a sentence proves nothing)."""
    facts = {label.lower() for label in _LABEL.findall(note)}
    starts = {m.start(1) for m in _SENTENCE_START.finditer(note)}
    for m in _TOKEN.finditer(_TIME.sub(" ", note)):
        token = m.group()
        word = token.lower().rstrip(".,").removesuffix("'s").removesuffix("’s")
        if (
            token[0].isdigit()
            or word in DATE_WORDS
            or (
                token[0].isupper()
                and len(word) > 1
                and m.start() not in starts
                and word not in ("i'll", "i'm", "i've")
            )
        ):
            facts.add(word)
    return facts


_QUOTED = re.compile(r'"[^"\n]*"|“[^”\n]*”')
_FIRST_PERSON = re.compile(r"\b(?:I(?:['’](?:m|ve|ll|d))?|[Mm]e|[Mm]y|[Mm]ine|[Mm]yself)\b")


def speaks_for_itself(rewrite: str) -> bool:
    """Whether a rewrite says "I", "me" or "my" outside quotation marks: nobody can tell who
    that is once the ``Name:`` labels are gone ("Melanie says I'll do my best")."""
    return bool(_FIRST_PERSON.search(_QUOTED.sub(" ", rewrite)))


_LINE_HEAD = re.compile(r"^\s*(?:[-*•]\s*|\d+[.)]\s*)?(\[[^\]\n]+\])\s*(.*)$")
#: A rewrite may be this much longer than its note (and this many chars more) before it counts
#: as rambling, not rewriting.
REWRITE_GROWTH = (2.0, 120)


def rewritten_lines(digest: str, answer: str) -> tuple[list[str], int]:
    """Each line of ``digest`` as the model rewrote it, when the rewrite kept it; otherwise
    the digest's own line. Returns the lines, in the digest's order, and how many are rewrites.

    A rewrite is the answer's line with the same head (``[8 May 2023, 13:56]``; list marks
    before it are ignored). It is kept when it holds every name, number and date of its
    note (one may go when the note has five or more), tells it in the third person (no
    ``Name:`` label of the note left in it: a model that copies the note with a "said" in
    front has not rewritten it; and no "I", "me" or "my" outside quotation marks, whose
    speaker the prose no longer names), does not echo the prompt, and is not more than about twice
    as long: otherwise the note stands, so a fact is never lost to a rewrite and a line
    never loses its date.
    """
    answered: dict[str, str] = {}
    for raw in answer.splitlines():
        match = _LINE_HEAD.match(raw)
        if match and match[1] not in answered and match[2].strip():
            answered[match[1]] = match[2].strip()
    out: list[str] = []
    kept = 0
    for line in digest.splitlines():
        if not line.strip():
            continue
        match = _LINE_HEAD.match(line)
        rewrite = answered.get(match[1]) if match else None
        if match is None or rewrite is None:
            out.append(line)
            continue
        note = match[2]
        facts = note_facts(note)
        missing = facts - {w.lower().rstrip(".,") for w in _TOKEN.findall(rewrite)}
        allowed = 1 if len(facts) >= 5 else 0
        growth, extra = REWRITE_GROWTH
        voiced = {label.lower() for label in _LABEL.findall(rewrite)} & facts
        if (
            len(missing) > allowed
            or voiced  # a speaker still speaks in it ("Bob: I'll tank"): copied, not told
            or speaks_for_itself(rewrite)  # "I" with no label: whose?
            or _ECHO.search(rewrite)
            or len(rewrite) > growth * len(note) + extra
        ):
            out.append(line)
            continue
        out.append(f"{match[1]} {rewrite}")
        kept += 1
    return out, kept
