"""Small text helpers with exact length guarantees."""

from __future__ import annotations

import heapq
import re
from functools import lru_cache

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
    return [part.strip() for part in _SENTENCE_END.split(text.strip()) if part.strip()]


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


_LINE_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|(?<=[.!?…][\"')\]])\s+")


@lru_cache(maxsize=16)
def _summary_lines(text: str) -> tuple[tuple[str, ...], ...]:
    """A summary's lines as their sentences (cached: one summary serves many contexts)."""
    return tuple(
        tuple(part for part in _LINE_SENTENCE_END.split(paragraph) if part)
        for paragraph in normalize(text).split("\n")
    )


def condense_summary(text: str, limit: int, *, half_life: float = 48.0) -> str:
    """``text`` shrunk to at most ``limit`` chars by whole sentences, coarser with age.

    A summary written as one paragraph keeps its newest sentences
    (:func:`keep_newest_sentences`). A summary written in lines, one per time
    window and oldest first, keeps each line's start (its head and first
    sentence) as long as it can: while the text is too long, the line whose
    length weighted by its age (``1 + age / half_life``, in lines) is the
    greatest loses its last sentence; once every line is down to one sentence,
    the oldest lines go. A summarizer that writes each line's most important
    sentences first loses the least.
    """
    if len(text) <= limit:
        return text
    parsed = _summary_lines(text)
    if len(parsed) == 1:
        return keep_newest_sentences(text, limit)
    lines = [list(line) for line in parsed]
    lengths = [len(" ".join(line)) for line in lines]
    total = sum(lengths) + len(lines) - 1
    # a max-heap of (age-weighted length, line) over the lines that still have two sentences or more
    heap = [(-lengths[i] * (1 + (len(lines) - 1 - i) / half_life), i) for i in range(len(lines))]
    heap = [item for item in heap if len(lines[item[1]]) > 1]
    heapq.heapify(heap)
    first = 0  # lines before this one are gone
    while total > limit and first < len(lines) - 1:
        if not heap:
            total -= lengths[first] + 1
            first += 1
            continue
        _, i = heapq.heappop(heap)
        if i < first:
            continue
        dropped = lines[i].pop()
        lengths[i] -= len(dropped) + 1
        total -= len(dropped) + 1
        if len(lines[i]) > 1:
            heapq.heappush(heap, (-lengths[i] * (1 + (len(lines) - 1 - i) / half_life), i))
    lines = lines[first:]
    result = "\n".join(" ".join(line) for line in lines)
    return result if len(result) <= limit else keep_newest_sentences(result, limit)
