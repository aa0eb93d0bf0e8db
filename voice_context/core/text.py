"""Small text helpers with exact length guarantees."""

from __future__ import annotations

import re

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
