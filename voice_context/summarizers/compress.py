"""Deterministic compression: fewer turns, the same conversation, within a budget. No model.

:func:`compress` takes a run of turns and returns the ones worth keeping, in
their order, in four steps:

1. **filler**: a short turn (80 chars and 8 words at most) that only greets, laughs, agrees or
   says goodbye (``is_filler``) goes, and disfluencies (``um``, ``uh``, ``erm``) leave the
   turns that stay;
2. **exact duplicates**: a turn whose words (case, spacing and punctuation
   aside) repeat an earlier turn's goes;
3. **fuzzy duplicates**: a turn within ``fuzzy`` (90 of 100, rapidfuzz's
   ``fuzz.ratio``) of one of the ``window`` turns kept before it goes, unless
   the two differ in a number ("at 9" and "at 10" are not the same plan): the rule of
   :mod:`voice_context.summarizers.repeats`, which the deterministic summarizer applies to sentences;
4. **force-converge**, only when a budget is given and still exceeded: the
   protected turns are kept first, then the others newest first, whole while
   they fit and cut to their first sentence once they do not; what does not
   fit even cut goes. Protected turns that alone exceed the budget are treated
   like the others (newest first). The result always fits (no turns at all fit
   any budget).

Turns in ``keep`` (by position) are never dropped as filler or duplicates and
are the last to be cut. A budget is in chars (each turn as its ``speaker:
text`` line and a line break) and/or in tokens of a counter.

It runs before a model summarizer (fewer tokens sent), as the fold when a model
fails or answers something unusable (see :mod:`voice_context.summarizers.fallback`),
and inside emergency compaction. 100 turns take about six and a half times as long as
normalizing each of them once (``scripts/bench``).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace

from rapidfuzz.utils import default_process

from voice_context.core.language.small_talk import is_filler
from voice_context.core.text import ELLIPSIS, sentences
from voice_context.core.tokens import TokenCounter
from voice_context.core.turns import Turn
from voice_context.summarizers.repeats import FUZZY, WINDOW, key_of, numbers_of, said_again

MAX_FILLER_CHARS = 80
MAX_FILLER_WORDS = 8
"""Only turns this short (in chars and words) are read for filler: longer ones always say
something, and reading every long turn for greetings would cost more than the rest."""
_DISFLUENCY = re.compile(r"(?<![\w'])(?:u+m+|u+h+|e+r+m+|e+r+|h+m+)(?![\w'])[,.]?\s*", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Compression:
    """What :func:`compress` kept, and why the rest went.

    ``kept`` are the positions (in the input) of ``turns``; ``clipped`` counts
    turns cut to fit, ``converged`` turns dropped to fit.
    """

    turns: tuple[Turn, ...]
    kept: tuple[int, ...]
    filler: int = 0
    exact: int = 0
    fuzzy: int = 0
    clipped: int = 0
    converged: int = 0
    chars_before: int = 0
    chars_after: int = 0

    @property
    def dropped(self) -> int:
        return self.filler + self.exact + self.fuzzy + self.converged


def line_of(turn: Turn) -> str:
    """A turn as a summarizer or a context reads it: ``speaker: text``."""
    return f"{turn.speaker}: {turn.text}"


def _size(turn: Turn, counter: TokenCounter | None) -> tuple[int, int]:
    line = line_of(turn)
    return len(line) + 1, (counter.count(line) + 1 if counter is not None else 0)


def compress(
    turns: Sequence[Turn],
    *,
    budget_chars: int | None = None,
    budget_tokens: int | None = None,
    counter: TokenCounter | None = None,
    keep: Collection[int] = (),
    fuzzy: float = FUZZY,
    window: int = WINDOW,
) -> Compression:
    """The turns worth keeping, within the budget when one is given; see the module docstring.

    Raises ``ValueError`` for a negative budget, or a token budget without a counter.
    """
    if (budget_chars is not None and budget_chars < 0) or (budget_tokens is not None and budget_tokens < 0):
        raise ValueError("a budget must be >= 0")
    if budget_tokens is not None and counter is None:
        raise ValueError("a token budget needs a counter")
    protected = set(keep)
    before = after = 0
    chosen: list[tuple[int, Turn]] = []
    keys: list[str] = []
    key_numbers: list[list[str]] = []
    seen: set[str] = set()
    filler = exact = near = 0
    for i, turn in enumerate(turns):
        text = turn.text
        before += len(turn.speaker) + len(text) + 3
        key = " ".join(default_process(text).split())  # key_of, inlined: this loop is the hot path
        guarded = i in protected
        if not guarded:
            if key in seen:  # the cheapest test first
                exact += 1
                continue
            if len(text) <= MAX_FILLER_CHARS and key.count(" ") < MAX_FILLER_WORDS and is_filler(text):
                filler += 1
                continue
            if "um" in key or "uh" in key or "hm" in key or "erm" in key:  # maybe a disfluency
                text = _DISFLUENCY.sub("", text).strip()
                if not text:
                    filler += 1
                    continue
                key = key_of(text)
            if key in seen:
                exact += 1
                continue
        numbers = numbers_of(key)
        if not guarded and said_again(key, numbers, keys, key_numbers, fuzzy):
            near += 1
            continue
        chosen.append((i, turn if text == turn.text else replace(turn, text=text)))
        after += len(turn.speaker) + len(text) + 3
        keys.append(key)
        key_numbers.append(numbers)
        if len(keys) > window:  # the last ``window`` turns kept
            del keys[0], key_numbers[0]
        seen.add(key)
    clipped, converged = 0, 0
    if budget_chars is not None or budget_tokens is not None:
        token_counter = counter if budget_tokens is not None else None
        chosen, clipped, converged = _converge(chosen, protected, budget_chars, budget_tokens, token_counter)
        after = sum(len(t.speaker) + len(t.text) + 3 for _, t in chosen)
    out = tuple(t for _, t in chosen)
    return Compression(
        turns=out,
        kept=tuple(i for i, _ in chosen),
        filler=filler,
        exact=exact,
        fuzzy=near,
        clipped=clipped,
        converged=converged,
        chars_before=before,
        chars_after=after,
    )


def _first_sentence(text: str) -> str:
    parts = sentences(text)
    if len(parts) < 2:
        return text
    return parts[0] + " " + ELLIPSIS


def _converge(
    chosen: list[tuple[int, Turn]],
    protected: set[int],
    budget_chars: int | None,
    budget_tokens: int | None,
    counter: TokenCounter | None,
) -> tuple[list[tuple[int, Turn]], int, int]:
    """The turns that fit: the protected ones first, then the others newest first, whole while
    they fit and cut to their first sentence once they do not. Protected turns that alone
    exceed the budget are cut, then dropped, oldest first."""
    caps = (
        budget_chars if budget_chars is not None else 1 << 62,
        budget_tokens if budget_tokens is not None else 1 << 62,
    )
    used = [0, 0]

    def take(turn: Turn) -> bool:
        size = _size(turn, counter)
        if used[0] + size[0] > caps[0] or used[1] + size[1] > caps[1]:
            return False
        used[0] += size[0]
        used[1] += size[1]
        return True

    kept: dict[int, Turn] = {}
    clipped = converged = 0
    guarded = [k for k in range(len(chosen)) if chosen[k][0] in protected]
    sizes = [_size(chosen[k][1], counter) for k in guarded]
    if sum(s[0] for s in sizes) <= caps[0] and sum(s[1] for s in sizes) <= caps[1]:
        for k in guarded:
            take(chosen[k][1])
            kept[k] = chosen[k][1]
    rest = [k for k in range(len(chosen)) if k not in kept]
    for k in reversed(rest):  # newest first
        turn = chosen[k][1]
        if caps[0] - used[0] < len(turn.speaker) + 4:  # not even "speaker: x" fits: the rest goes
            converged += 1
            continue
        if take(turn):
            kept[k] = turn
            continue
        short = _first_sentence(turn.text)
        if short != turn.text and take(replace(turn, text=short)):
            kept[k] = replace(turn, text=short)
            clipped += 1
        else:
            converged += 1
    return [(chosen[k][0], kept[k]) for k in sorted(kept)], clipped, converged


__all__ = ["FUZZY", "WINDOW", "Compression", "compress", "line_of"]
