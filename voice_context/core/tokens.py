"""Counting tokens: what a token budget is measured in. Pure: a counter is handed in.

A :class:`TokenCounter` says how many tokens a text is in one tokenizer's own
count. The real ones (``o200k_base``, ``cl100k_base``) are loaded by
:mod:`voice_context.tokenizers`, the shell that reads their files; the core only
calls ``count``. :class:`CharEstimate` (``chars/3.5``) stands in where no
tokenizer is installed, and says so in its name.

Counts of the same texts repeat on every context (a turn's line is counted on
each reply that shows it), so :class:`CachedCounter` remembers them, bounded by
the characters it holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from voice_context.core.cache import CharBoundedCache

#: The tokenizers a session may name. ``chars`` is the estimate, chosen on purpose.
TOKENIZERS: frozenset[str] = frozenset({"o200k_base", "cl100k_base", "chars"})
DEFAULT_TOKENIZER = "o200k_base"
CHARS_PER_TOKEN = 3.5
#: A cached counter holds the counts of texts up to this many characters in all.
CACHE_CHARS = 4_000_000


@runtime_checkable
class TokenCounter(Protocol):
    """How many tokens a text is, in one tokenizer's own count."""

    @property
    def name(self) -> str:
        """The tokenizer's name (``o200k_base``), or ``chars/3.5`` for the estimate."""
        ...

    def count(self, text: str) -> int: ...


class CharEstimate:
    """``ceil(chars / 3.5)``: the estimate where no tokenizer is installed.

    It is subadditive (the count of two texts joined never exceeds the sum of
    their counts), which keeps a budget's size model an upper bound.
    """

    name = "chars/3.5"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def __repr__(self) -> str:
        return "<CharEstimate chars/3.5>"


class CachedCounter:
    """A counter that remembers the counts of the texts it saw most recently."""

    def __init__(self, inner: TokenCounter, max_chars: int = CACHE_CHARS) -> None:
        self.inner = inner
        self.name = inner.name
        self._count: CharBoundedCache[int] = CharBoundedCache(inner.count, max_chars)

    def count(self, text: str) -> int:
        if len(text) < 2:  # "" and one character: not worth a cache entry
            return self.inner.count(text)
        return self._count(text)

    def __repr__(self) -> str:
        return f"<CachedCounter {self.name} held={len(self._count)}>"


class FunctionCounter:
    """A counter from a plain ``text -> int`` function (a tokenizer's ``encode`` length)."""

    def __init__(self, name: str, fn: Callable[[str], int]) -> None:
        self.name = name
        self._fn = fn

    def count(self, text: str) -> int:
        return self._fn(text) if text else 0

    def __repr__(self) -> str:
        return f"<FunctionCounter {self.name}>"


__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_TOKENIZER",
    "TOKENIZERS",
    "CachedCounter",
    "CharEstimate",
    "FunctionCounter",
    "TokenCounter",
]
