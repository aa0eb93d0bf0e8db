"""Words and what they are worth: how a text is cut into words, which words carry no meaning
(stopwords) and which little (small talk), and the weight of each informative word of a sentence.

Recall's index, the summarizers and the metric read words through these. Pure: no clock, no I/O.
"""

from __future__ import annotations

import re

from voice_context.core.cache import char_bounded_cache
from voice_context.core.times import MONTHS, WEEKDAYS

_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]*|\d[\d,.:/]*")
_STOPWORDS = """
a an the and or but if so to of in on at by for with from as is are was were be been being am do does did
have has had i you he she it we they me him her us them my your his its our their this that these those
there here what which who whom whose when where why how not no yes just really very too also then than
can could would should will shall may might must about into over after before up down out off again
oh uh um yeah like know think mean get got go going gonna wanna kind sort thing things stuff lot lots
well okay ok right sure maybe some any all more most much many one ones now still even only i'm it's
that's i've you're we're they're don't can't didn't isn't wasn't i'll you'll we'll let's what's there's
it'll i'd you'd he's she's mm hmm mhm huh ah eh hey hi hello
"""
_STOP = frozenset(_STOPWORDS.split())
_SMALL_TALK = frozenset(
    """
    good great awesome amazing cool nice lovely glad happy sad sorry thanks thank fun wonderful fantastic
    incredible beautiful super sweet proud excited exciting hope hoping wish sounds sound feel feels felt
    feeling totally definitely absolutely true see seeing hear hearing heard talk talking chat chatting
    care wow interesting love loved loves time times day days people person life world really awesome
    appreciate appreciated glad lucky luck best better tough hard yay congrats congratulations ha haha
    hahaha lol lmao hehe omg gosh agree agreed thing way ways keep keeping going doing done make making
    made take taking took look looks looking looked want wanted need needed say said tell told share
    sharing shared let lets new old lot big little bit yes yeah okay cool alright right exactly indeed
    anyway guess guys friend friends stuff kind sort mean means same worries worry problem
    perfect fine nasty crazy insane wild nope yep yup nah everyone everybody something anything everything
    inspiring inspired powerful thankful grateful impressive impressed talented caring helpful rewarding
    important vital necessary cute fancy brave hopeful optimistic thrilled blessed peaceful stunning
    gorgeous adorable hilarious silly fave
    """.split()
)
DATE_WORDS = frozenset(name.lower() for name in (*MONTHS, *WEEKDAYS))
"""The months' and the weekdays' names, lowercase: the words that say when."""
WEIGHTS_CACHE_CHARS = 1_000_000
"""How many characters of sentences :func:`weighted_words` keeps the words of (with their
parsed forms, about 7 bytes a character: some 7 MB at most)."""
_POSSESSIVE = re.compile(r"['’]s\b")
_APOSTROPHE = re.compile(r"['’]")


_TOKEN_BYTES = bytes(c if 0x61 <= c <= 0x7A or 0x30 <= c <= 0x39 else 0x20 for c in range(256))
"""Every byte but ``[a-z0-9]`` as a space: :func:`lower_tokens` splits on it."""


def lower_tokens(lowered: str) -> list[str]:
    """A lowercased text's words, as recall's index and the number check split them: each run of
    ``[a-z0-9]`` (``re.findall(r"[a-z0-9]+", lowered)``, about twice as fast); anything else,
    a char past ASCII too (``encode`` makes it one ``?``), separates them."""
    return lowered.encode("ascii", "replace").translate(_TOKEN_BYTES).decode("ascii").split()


def without_apostrophes(text: str) -> str:
    """``text`` without its possessives' ``'s`` and then its apostrophes (``'`` or ``’``):
    "Mel's" -> "Mel", "don't" -> "dont", as recall's index and the metric's words are read."""
    return _APOSTROPHE.sub("", _POSSESSIVE.sub("", text))


def content_words(text: str) -> list[str]:
    """The lowercased words of ``text`` that carry meaning (no stopwords, no filler)."""
    return [w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP and len(w) > 1]


def fold_word(word: str) -> str:
    """A word as its weight is kept (:func:`weighted_words`): lowercased, without the punctuation
    around it, a possessive or a plural: ``Agencies`` -> ``agency``, ``Mel's`` -> ``mel``."""
    return _fold_lowered(word.lower().replace("’", "'"))


def _fold_lowered(word: str) -> str:
    """:func:`fold_word` of a word already lowercased, its ’ written '."""
    word = word.strip("'-.,:/")
    if word.endswith("'s"):
        word = word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@char_bounded_cache(WEIGHTS_CACHE_CHARS)
def weighted_words(text: str) -> tuple[tuple[str, float], ...]:
    """The informative words of a sentence (folded) and what each is worth."""
    out: dict[str, float] = {}
    for k, raw in enumerate(_WORD.findall(text)):
        low = raw.lower().replace("’", "'")
        if low in _STOP or (len(raw) < 2 and not raw.isdigit()):
            continue
        word = _fold_lowered(low)
        if not word or word in _STOP:
            continue
        if raw[0].isdigit() or word in DATE_WORDS:
            weight = 1.6
        elif word in _SMALL_TALK:
            weight = 0.25
        elif raw[0].isupper() and k > 0:
            weight = 1.6
        else:
            weight = 1.0 + (0.3 if len(word) >= 8 else 0.0)
        out[word] = max(out.get(word, 0.0), weight)
    return tuple(out.items())


__all__ = [
    "DATE_WORDS",
    "WEIGHTS_CACHE_CHARS",
    "content_words",
    "fold_word",
    "lower_tokens",
    "weighted_words",
    "without_apostrophes",
]
