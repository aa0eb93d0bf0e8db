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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache, partial
from typing import NamedTuple

from voice_context.core.cache import char_bounded_cache
from voice_context.core.text import clip, normalize, sentences
from voice_context.core.times import utc
from voice_context.core.turns import Note, Turn
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.repeats import WINDOW, key_of, numbers_of, said_again
from voice_context.worker import Worker

FOLD_THREAD = Worker("voice-context-fold")
"""The process's one thread for deterministic folds (every summarizer's, the fallback's too),
started when first given one: see ``DeterministicSummarizer.summarize``."""

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
# Leave-takings, cheers and emoticons: "Gotta run, bye!", "Ttyl!", "Woohoo!", "<3". Every phrase
# begins with a letter: "(?=\w)" spares the end of every word the trial of each phrase (a third faster).
_FAREWELL = re.compile(
    r"\b(?=\w)(?:(?:gotta|got to|have to|need to|i must|i should|i'?ll|i'?d better) "
    r"(?:go|run|jet|head out|bounce|log off|sign off)(?: now)?|"
    r"(?:talk|speak|chat) (?:to you |with you )?(?:soon|later|tomorrow|then)|"
    r"(?:see|catch) (?:you|ya|u) (?:later|soon|then|around|tomorrow)|take care(?: of yourself)?|"
    r"have (?:a|an) (?:good|great|nice|wonderful|lovely|awesome|fun) (?:one|day|night|evening|weekend|time)|"
    r"(?:good|nighty?) ?night|sweet dreams|peace out|bye(?:[ -]?bye)*|goodbye|ttyl|cya|xo(?:xo)*|"
    r"feel free to (?:reach out|ask|call|text|message|ping)(?: (?:to )?(?:me|us))?(?: any ?time)?|"
    r"(?:your|those|such) kind words|means? (?:a lot|so much|the world)(?: to (?:me|us))?|"
    r"loud and clear|good game|gg|no (?:problem|prob|worries)|you'?re (?:very )?welcome|any ?time|"
    r"(?:just )?let me know(?: if (?:you need|there'?s) anything(?: else)?(?: i can (?:do|help with))?)?|"
    r"if (?:there'?s|you need|i need) anything(?: else)?(?: i can do)?|i owe you(?: one)?|stay safe|"
    r"(?:i'?ll |we'?ll )?(?:get|be|keep|stay) in touch|"
    r"(?:i'?m |i am )?always here (?:for you|to help|if you (?:ever )?need (?:me|anything|to (?:talk|chat)))|"
    r"look after yourself|take it easy|have fun|can'?t wait|thanks for asking|keep (?:it up|in touch)|"
    r"stay in touch|(?:nice|good|great|lovely) (?:catching up|chatting|talking|to (?:chat|talk|catch up))"
    r"(?: with you)?|(?:good|nice|great) to (?:hear from|see) you|cheers|later|"
    r"w(?:oo)+h(?:oo)+|wo+h?o+|yay+|hooray|yippee|phew|whew|ugh+|aw+|yess+)\b"
    r"|<3+|[:;=]-?[()DdPp]\B|\bx[Dd]\b|[\U0001F300-\U0001FAFF\u2600-\u27BF]",
    re.IGNORECASE,
)
_FAREWELL_LOWER = re.compile(_FAREWELL.pattern)
"""The same, for an ASCII text lowercased: three times faster than ignoring case."""
# Acknowledgements, greetings, mic checks and voice-chat callouts, which steer the moment and leave
# nothing to remember: "Copy that", "Roger", "Go go", "On it", "Nice shot", "Can you hear me okay?",
# "I'm low, falling back", "Holding the door". Only the words go: what else the sentence says stays.
_CALLOUT = re.compile(  # as _FAREWELL, "(?=\w)": every callout begins with a letter
    r"\b(?=\w)(?:copy(?: that)?|roger(?: that)?|ten[- ]four|affirmative|understood|noted|got it|gotcha|"
    r"will do|on it|on my way|omw|(?:sounds|looks) (?:good|great|fine|like a plan)|fair(?: enough)?|deal|"
    r"makes sense|works for (?:me|us)|thanks? (?:you )?(?:all )?for (?:joining|coming|having me)|"
    r"that'?s (?:it|all) for (?:now|today|tonight)|"
    r"(?:great|good|fun|nice|lovely) (?:night|session|meeting|call)|"
    r"(?:go[\s,!.]+)+go|let'?s (?:go|do (?:it|this))(?=\s*(?:[,!.…]|$))|here we go|"
    r"(?:nice|good|great) (?:shot|one|call|try|job|work|play|round|fight|save|stuff)|"
    r"well played|wp|ez|ggs?|good (?:morning|afternoon|evening|day)|"
    r"(?:morning|afternoon|evening|hi|hey|hello) (?:all|everyone|everybody|guys|team|folks)|hello there|"
    r"welcome back(?:,? (?:everyone|all|guys))?|"
    r"can (?:you|everyone|everybody|y'?all) (?:all )?hear me(?: okay| ok| now| alright| fine| all right)?|"
    r"(?:i )?can hear you(?: fine| okay| ok| now)?|you'?re (?:on mute|muted|breaking up)|mic check|"
    r"(?:i'?m|i am) (?:back|here|ready|low|dead|down)|back|ready|brb|one sec(?:ond)?|hold on|hang on|"
    r"kay|w?oops|oop|watch (?:out|your back|behind)|behind (?:you|us)|cover me|on me|come to me|"
    r"group up|regroup|fall(?:ing)? back|push(?:ing)?(?: (?:left|right|mid|up|in|now|forward))*(?: side)?|"
    r"hold(?:ing)? (?:the )?(?:door|point|line))\b"
)  # matched on the lowercased text: a case-blind pattern this long is twice as slow
_MONTH_NAMES = "january february march april may june july august september october november december".split()
_WEEKDAYS = "monday tuesday wednesday thursday friday saturday sunday".split()
_DATEISH = frozenset(_MONTH_NAMES) | frozenset(_WEEKDAYS)
_WEEKDAY_ABBR = {day[:3]: day for day in _WEEKDAYS}

_LEAD = re.compile(
    r"^(?:(?:hey|hi|hello|heya|yo|wow|whoa|oh|ooh|ah|aw+|yeah|yep|yup|well|so|ok|okay|alright|um+|uh+|uhm|"
    r"hmm+|mm+|mhm|haha+|hehe+|lol|omg|gosh|anyway|anyways|also|but|and|like|actually|honestly|"
    r"oh my god|oh man|man|dude|bye|goodbye|ttyl)(?=[\s,!.…?-])[\s,!.…?-]*|"
    r"(?:great|awesome|nice|cool|thanks|thank you|right|sure|totally|absolutely|exactly|yes|no|true|remember|"
    r"wonderful|amazing|fantastic|congrats|congratulations|sweet|good|perfect|indeed|of course)"
    r"[\s]*[,!.…]+\s*)+",
    re.IGNORECASE,
)
_HESITATION = re.compile(r"(?:,\s*)?\b(?:um+|uh+|uhm|erm|er|hmm+|mm+|you know|i mean)\b(?:\s*,)?", re.I)
# Only words that leave a sentence whole when they go: "so much has happened" needs its "so much",
# "a kind of bread" its "kind of"; a capitalised "Super" may be a name ("Super Bowl").
_INTENSIFIER = re.compile(
    r"\b(?:really|just|super|actually|totally|definitely|literally|basically|honestly|truly|kinda)\s+"
    r"(?=[a-z])"
)
# Possessive: a word said again must end where its run of letters does, so no shorter run is tried.
_REPEAT = re.compile(r"\b(\w++(?:'\w++)?)(?:\s+\1\b)+", re.IGNORECASE)
_CLAUSE = re.compile(r"\s+[-–—]+\s+|;\s+")
_CAPTION_LEAD = re.compile(r"^(?:a |an )?(?:photo|picture|image|screenshot|close up|closeup)\s+of\s+", re.I)
_HEAD = re.compile(
    r"^\[(?:(?P<date>\d{1,2} [A-Za-z]+ \d{4}),? )?(?P<time>\d{1,2}:\d{2})\]\s*"
    r"|^\[(?P<iso>\d{4}-\d{2}-\d{2}) (?P<isotime>\d{1,2}:\d{2})\]\s*"
)
_LEADING_LABEL = re.compile(r"^([A-Z][^:.!?\n]{0,48}?):\s+")
_VOCATIVE_HEAD = re.compile(r"^([A-Z][a-z]+)\s*(?:[,!]+\s*|[.!?…]*$)")
_VOCATIVE_TAIL = re.compile(r",\s*([A-Z][a-z]+)\s*([.!?…]*)$")
_NAME = re.compile(r"\b[A-Z][a-z]+\b")
_LABEL = re.compile(r"(?:^|(?<=[.!?…] ))([A-Z][^:.!?\n]{0,48}?): ")

_UNITS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
)
_NUMBER_WORDS = {word: value for value, word in enumerate(_UNITS)} | {
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
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
#: How many characters of sentences and summary lines each of the two parse caches keeps
#: (with their parsed forms, about 7 bytes a character: some 7 MB each at most).
CACHE_CHARS = 1_000_000
#: A line's last sentence is worth this much more, so windows grow coarser before they go.
LAST_SENTENCE = 2.0
#: Far more than the relative rounding error of a sentence's score (a sum of a few hundred terms
#: at most, each within an ulp): a score that grew may be computed this much lower than before.
_ROUNDING = 1e-9


def _number_run(case: Callable[[str], str]) -> re.Pattern[str]:
    """A run of number words; ``case`` writes each word's letters (as given, or either case)."""
    scales = [case(scale) + r"(?:\s+" + case("and") + ")?" for scale in ("hundred", "thousand")]
    words = [*map(case, sorted(_NUMBER_WORDS, key=len, reverse=True)), *scales, case("point")]
    return re.compile(r"\b(?:(?:" + "|".join(words) + r")(?:[\s-]+|\b)){1,8}")


# Either case of the ASCII letters only: re.IGNORECASE would also match "ſix" (long s) or "fıve"
# (dotless i), which are no number words. Recall's index lowercases first and skips the classes.
_NUMBER_RUN = _number_run(lambda word: re.sub(r"[a-z]", lambda m: f"[{m[0]}{m[0].upper()}]", word))
_NUMBER_RUN_LOWER = _number_run(lambda word: word)
NUMBER_TOKENS = frozenset([*_NUMBER_WORDS, "hundred", "thousand", "point"])
"""The words a number said as words is made of (lowercase)."""
_TOKEN_BYTES = bytes(c if 0x61 <= c <= 0x7A or 0x30 <= c <= 0x39 else 0x20 for c in range(256))
"""Every byte but ``[a-z0-9]`` as a space: :func:`lower_tokens` splits on it."""


def lower_tokens(lowered: str) -> list[str]:
    """A lowercased text's words, as recall's index and the number check split them: each run of
    ``[a-z0-9]`` (``re.findall(r"[a-z0-9]+", lowered)``, about twice as fast); anything else,
    a char past ASCII too (``encode`` makes it one ``?``), separates them."""
    return lowered.encode("ascii", "replace").translate(_TOKEN_BYTES).decode("ascii").split()


# -- words and their value ----------------------------------------------------------------


def content_words(text: str) -> list[str]:
    """The lowercased words of ``text`` that carry meaning (no stopwords, no filler)."""
    return [w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP and len(w) > 1]


def _pleasantries_out(text: str) -> str:
    """``text`` without its standard pleasantries, acknowledgements and callouts."""
    if text.isascii():  # both searches run on the lowercased text, their spans cut from the text
        text = _spans_out(text, _FAREWELL_LOWER.finditer(text.lower()))
        return _spans_out(text, _CALLOUT.finditer(text.lower()))
    text = _FAREWELL.sub(" ", text)
    low = text.lower()
    if len(low) != len(text):  # a letter whose lowercase is longer: spans would not line up
        return _CALLOUT.sub(" ", low)
    return _spans_out(text, _CALLOUT.finditer(low))


def _spans_out(text: str, matches: Iterable[re.Match[str]]) -> str:
    """``text`` with a space for each match's span (matches of a copy of it the same length)."""
    out, end = [], 0
    for match in matches:
        out.append(text[end : match.start()])
        out.append(" ")
        end = match.end()
    return "".join(out) + text[end:] if out else text


def is_filler(text: str) -> bool:
    """True for greetings, goodbyes, thanks, laughter, backchannels, acknowledgements and callouts,
    and sentences of small talk: those with no informative word (a name, a number, a date, a word
    that is no small talk) once the standard pleasantries and callouts are set aside."""
    return not _told(text)


def _told(text: str) -> set[str]:
    """The informative words of ``text`` (folded, numbers among them) once its pleasantries and
    callouts are set aside: what it tells."""
    return {word for word, weight in _weight_items(_pleasantries_out(text)) if weight >= 1.0}


def without_small_talk(text: str, speakers: Iterable[str] = ()) -> str:
    """``text`` without its sentences of small talk (greetings, goodbyes, thanks, laughter,
    backchannels, acknowledgements, callouts: :func:`is_filler`, the names of ``speakers``
    aside, so "Thanks, Mel!" is filler too): what in it could be asked about, ``""`` when
    nothing is. A sentence goes only when no word of it carries a fact."""
    names = tuple(speakers)
    return " ".join(s for s in sentences(text) if not is_filler(_without_names(shorten(s, names), names)))


def _fold(word: str) -> str:
    return _fold_lowered(word.lower().replace("’", "'"))


def _fold_lowered(word: str) -> str:
    """:func:`_fold` of a word already lowercased, its ’ written '."""
    word = word.strip("'-.,:/")
    if word.endswith("'s"):
        word = word[:-2]
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@char_bounded_cache(CACHE_CHARS)
def _weight_items(text: str) -> tuple[tuple[str, float], ...]:
    """The informative words of a sentence (folded) and what each is worth."""
    out: dict[str, float] = {}
    for k, raw in enumerate(_WORD.findall(text)):
        low = raw.lower().replace("’", "'")
        if low in _STOP or (len(raw) < 2 and not raw.isdigit()):
            continue
        word = _fold_lowered(low)
        if not word or word in _STOP:
            continue
        if raw[0].isdigit() or word in _DATEISH:
            weight = 1.6
        elif word in _SMALL_TALK:
            weight = 0.25
        elif raw[0].isupper() and k > 0:
            weight = 1.6
        else:
            weight = 1.0 + (0.3 if len(word) >= 8 else 0.0)
        out[word] = max(out.get(word, 0.0), weight)
    return tuple(out.items())


# -- dates ------------------------------------------------------------------------------------


def _day(when: datetime) -> str:
    return f"{when.day} {_MONTH_NAMES[when.month - 1].capitalize()} {when.year}"


def _month(year: int, month: int) -> str:
    while month < 1:
        month += 12
        year -= 1
    while month > 12:
        month -= 12
        year += 1
    return f"{_MONTH_NAMES[month - 1].capitalize()} {year}"


_COUNTS = {
    "a": 1,
    "an": 1,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "couple of": 2,
    "a couple of": 2,
}
RELATIVE_DATE = re.compile(
    # "the last week of June", "my next year", "for the past year" are not dates said relative to now
    r"(?<!\bthe )(?<!\bmy )(?<!\bour )(?<!\bhis )(?<!\bher )(?<!\btheir )(?<!\bthat )(?<!\bthis )"
    r"\b(?P<prep>(?:since|until|till|from|by|before|after|on|in|during|over|of)\s+)?"
    r"(?P<phrase>yesterday|tomorrow|last night|the day before yesterday|"
    r"(?:last|this past|past|next|this|the other) (?:week|weekend|month|year|"
    + "|".join(_WEEKDAYS)
    + r"|mon|tues?|wed|thu(?:rs?)?|fri|sat|sun)|"
    r"(?P<n>a few|a couple of|couple of|several|a|an|one|two|three|four|five|six|seven|eight|nine|ten|\d+)"
    r" (?P<unit>day|week|month|year|weekend)s? ago)\b(?!['’]s)",
    # either case of the ASCII letters only: ignoring case alone would also match "yeſterday" (long s)
    # or "thıs week" (dotless i), which resolve as no date and stop the summarizer
    re.IGNORECASE | re.ASCII,
)
# Every text RELATIVE_DATE matches holds one of these once lowercased (and most texts hold none):
# the search for dates, with its lookbehinds at every position, runs only on those that do.
_RELATIVE_DATE_HINT = re.compile(
    r"yesterday|tomorrow|ago|"
    r"(?:last|past|next|this|other) (?:night|week|month|year|mon|tue|wed|thu|fri|sat|sun)"
)


def may_hold_relative_date(text: str) -> bool:
    """False when ``text`` holds no relative date :data:`RELATIVE_DATE` could match (most texts):
    its lowercased copy is searched, three times faster than a search that ignores case."""
    return _RELATIVE_DATE_HINT.search(text.lower()) is not None


# After a relative date said as an adverb ("I went there yesterday, ..."), "on 7 May 2023" reads as well:
# the end of the clause, a conjunction or a preposition.
_ADVERB_AFTER = re.compile(
    r"\s*(?:$|[.,!?;:)…]|[-–—]\s|(?:and|but|so|or|because|when|while|after|before|at|in|with|for|to|from|"
    r"since|until|as|where|which|who|if|then|too|again|already|now|though|although)\b)",
    re.IGNORECASE,
)
# After a relative date that starts a sentence: a comma, its end, or the subject ("Yesterday I went").
_SUBJECT_AFTER = re.compile(
    r"\s*(?:$|[,.!?…]|(?:I|we|you|he|she|they|it|my|our|his|her|their|me|mom|dad|the|a|an|there|this)\b|"
    r"[A-Z][a-z]+\b(?<!Was)(?<!Is))",
)
# Words after which a relative date is a noun ("spent yesterday", "feels like yesterday", "was last year").
_NOUN_BEFORE = frozenset(
    """
    spent spend spends spending enjoyed enjoy enjoys enjoying loved love loves loving remember remembers
    remembered remembering recall recalls recalled like liked likes feel feels felt seems seemed than was
    is were be been being about all whole entire missed miss since until
    """.split()
)
_OPENING = re.compile(r"(?:^|[.!?…]\s+|[-–—;:]\s+|\(\s*)[\"'“‘(]*$")


def _adverbial(match: re.Match[str]) -> bool:
    """Whether a relative date can become "on 7 May 2023" in place and leave the sentence whole.

    "I went there yesterday" can; "Last Friday was amazing" and "I spent
    yesterday at the beach" cannot: the phrase is a noun there.
    """
    text, start, end = match.string, match.start(), match.end()
    before = text[:start]
    if _OPENING.search(before):
        return _SUBJECT_AFTER.match(text, end) is not None
    words = re.findall(r"[A-Za-z'’]+", before[-40:])
    if words and words[-1].lower() in _NOUN_BEFORE:
        return False
    return _ADVERB_AFTER.match(text, end) is not None


def _resolve(match: re.Match[str], at: datetime) -> str:
    """One relative date made absolute.

    Periods ("last week" -> "the week before 8 May 2023") and durations ("a few
    days ago" -> "a few days before 8 May 2023") are noun phrases and replace the
    words in place. A day, month or year becomes "on 7 May 2023", "in June 2023",
    "in 2022" after a preposition or where the phrase is an adverb; elsewhere the
    words stay and the date follows in parentheses ("Last Friday (7 July 2023)
    was amazing"), so that the sentence stays whole.
    """
    prep = match.group("prep") or ""
    phrase = " ".join(match.group("phrase").lower().split())
    said = match.group(0)[len(prep) :]

    def point(where: str, value: str, night: bool = False) -> str:
        if prep:
            return prep + ("the night of " if night else "") + value
        if _adverbial(match):
            return ("on the night of " if night else where) + value
        return f"{said} ({value})"

    if phrase in ("yesterday", "the day before yesterday", "tomorrow", "last night"):
        days = {"yesterday": -1, "the day before yesterday": -2, "tomorrow": 1, "last night": -1}[phrase]
        return point("on ", _day(at + timedelta(days=days)), night=phrase == "last night")
    if match.group("unit"):
        unit, amount = match.group("unit").lower(), match.group("n").lower()
        n = int(amount) if amount.isdigit() else _COUNTS.get(amount)
        if n is None:  # "a few days ago"
            return f"{prep}{amount} {unit}s before {_day(at)}"
        if unit == "day":
            return point("on ", _day(at - timedelta(days=n)))
        if unit == "month":
            return point("in ", _month(at.year, at.month - n))
        if unit == "year":
            return point("in ", str(at.year - n))
        return f"{prep}{'a' if n == 1 else n} {unit}{'' if n == 1 else 's'} before {_day(at)}"
    words = phrase.split()
    which = "last" if words[0] in ("past", "the") or words[:2] == ["this", "past"] else words[0]
    unit = words[-1]
    step = {"last": -1, "next": 1}.get(which, 0)
    if unit == "year":
        return point("in ", str(at.year + step))
    if unit == "month":
        return point("in ", _month(at.year, at.month + step))
    if unit in ("week", "weekend"):
        return f"{prep}the {unit} { ({-1: 'before', 1: 'after'}.get(step, 'of')) } {_day(at)}"
    day = _WEEKDAY_ABBR[unit[:3]]
    target = _WEEKDAYS.index(day)
    if step < 0:
        when = at - timedelta(days=(at.weekday() - target) % 7 or 7)
    else:
        when = at + timedelta(days=(target - at.weekday()) % 7 or (7 if step else 0))
    if prep or _adverbial(match):
        return point("on ", f"{day.capitalize()} {_day(when)}")
    return f"{said} ({_day(when)})"


def resolve_dates(text: str, at: float) -> str:
    """Relative dates in ``text`` made absolute, given that it was said at ``at`` (unix seconds, UTC).

    The sentence stays whole: see :func:`_resolve` for when the words are kept and
    the date added in parentheses.
    """
    if not may_hold_relative_date(text):
        return text
    when = utc(at)
    return RELATIVE_DATE.sub(lambda m: _resolve(m, when), text)


def _digits(match: re.Match[str]) -> str:
    raw = match.group(0)
    body = re.sub(r"(?:[\s-]+and)?[\s-]*$", "", raw, flags=re.I)
    words = [w for w in re.split(r"[\s-]+", body.lower()) if w != "and"]
    # "one" alone is a pronoun more often than a number; "point" must sit between numbers
    if words == ["one"] or words[0] in ("point", "hundred", "thousand") or words[-1] == "point":
        return raw
    total, current, decimals = 0, 0, ""
    for k, word in enumerate(words):
        if decimals or word == "point":
            if word != "point" and (_NUMBER_WORDS.get(word, 10) > 9 or "point" in words[k + 1 :]):
                return raw
            decimals += "." if word == "point" else str(_NUMBER_WORDS[word])
        elif word == "hundred":
            current = max(current, 1) * 100
        elif word == "thousand":
            total, current = total + max(current, 1) * 1000, 0
        else:
            value = _NUMBER_WORDS[word]
            tens = current % 100
            fits = tens == 0 or (value < 10 and tens >= 20 and tens % 10 == 0)
            if not fits:
                return raw  # "one two three" is a count, not a number
            current += value
    return str(total + current) + decimals + raw[len(body) :]


def spoken_numbers(text: str) -> str:
    """Numbers said as words written as digits: "twenty five" -> "25", "twelve point five" -> "12.5"."""
    if NUMBER_TOKENS.isdisjoint(lower_tokens(text.lower())):  # (most texts say no number)
        return text
    return _NUMBER_RUN.sub(_digits, text)


def spoken_numbers_lower(lowered: str) -> str:
    """:func:`spoken_numbers` of a lowercased text (what recall's index does to every text)."""
    return _NUMBER_RUN_LOWER.sub(_digits, lowered)


# -- one batch ----------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _Sentence:
    speaker: str
    text: str
    weights: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, speaker: str, text: str) -> _Sentence:
        return cls(speaker, text, _weight_items(text))

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


def _finish(text: str) -> str:
    text = text.strip(" ,;:-–—")
    if not text:
        return ""
    text = text[0].upper() + text[1:]
    if text[-1] not in ".!?…":
        text += "."
    return text


def _is_vocative(word: str, speakers: Iterable[str]) -> bool:
    low = word.lower()
    return len(low) >= 3 and any(s.lower().startswith(low) for s in speakers)


def _first_group(match: re.Match[str]) -> str:
    return match[1]


def shorten(sentence: str, speakers: Sequence[str] = ()) -> str:
    """A sentence without its leading interjections, vocatives, hesitations and stutters."""
    text = _HESITATION.sub("", sentence)
    text = _INTENSIFIER.sub("", text)
    text = _REPEAT.sub(_first_group, text)
    for _ in range(3):
        before = text
        text = _LEAD.sub("", text).lstrip()
        head = _VOCATIVE_HEAD.match(text)
        if head and _is_vocative(head.group(1), speakers):
            text = text[head.end() :]
        if text == before:
            break
    # "Budget: 9000 approved" would read as a speaker's label in the summary
    label = _LEADING_LABEL.match(text)
    if label:
        text = f"{label[1]} - {text[label.end() :]}"
    tail = _VOCATIVE_TAIL.search(text)
    if tail and _is_vocative(tail.group(1), speakers):
        text = text[: tail.start()] + (tail.group(2) or ".")
    return _finish(" ".join(text.split()))


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
    items = _weight_items(sentence)
    return any(weight < 1.0 for _, weight in items) and not any(weight > 1.3 for _, weight in items)


def _turn_sentences(turn: Turn, speakers: Sequence[str]) -> list[tuple[str, set[str]]]:
    """The sentences of a turn worth keeping, shortened, each with its informative words
    (:func:`_told`, the speakers' names aside: they make "Thanks Mel!" look informative)."""
    text = spoken_numbers(resolve_dates(" ".join(turn.text.split()), turn.at))
    out: list[tuple[str, set[str]]] = []
    for sentence in sentences(text) or [text]:
        for clause in _CLAUSE.split(sentence):
            short = shorten(clause, speakers)
            told = _told(_without_names(short, speakers)) if short else set()
            if told and not _is_compliment(short):
                out.append((short, told))
    return out


def _without_names(text: str, speakers: Sequence[str]) -> str:
    """``text`` without the speakers' names, which make "Thanks Mel!" look informative."""
    return _NAME.sub(lambda m: "" if _is_vocative(m.group(0), speakers) else m.group(0), text)


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
        """Whether ``sentence``, whose informative words are ``told`` (:func:`_told`), says again
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
        self._words.update(_fold(name) for name in sentence.speaker.split())
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
    return who, _finish(_CAPTION_LEAD.sub("", " ".join(note.text.split())))


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
    items: list[tuple[float, int, Turn | Note]] = [(t.at, k, t) for k, t in enumerate(turns)]
    items += [(n.at, len(turns) + k, n) for k, n in enumerate(notes)]
    items.sort(key=lambda item: (item[0], item[1]))
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
            lines.append(_Line(_day(start), f"{start:%H:%M}", list(kept), notes_only=not spoken, until=until))

    for at, _, item in items:
        when = utc(at)
        if start is None or at - last > gap or when.date() != start.date():
            close()
            kept, said, start, spoken = [], _Said(known), when, False
            if before is not None and began is not None and len(lines) == 0:
                naive = when.replace(tzinfo=None)
                if naive.date() == began.date() and 0 <= (naive - began).total_seconds() <= gap:
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


_SCREEN = re.compile(r"(?:^|'s )[Ss]creen\b")


def _small_talk_line(turns: Sequence[Turn]) -> _Line:
    """A batch of pure small talk, first in a session: one honest line, so the summary is not empty
    (an empty summary is a failed compaction, and the same batch would fail again)."""
    when = utc(turns[0].at)
    names = sorted({t.speaker or t.role.capitalize() for t in turns})
    who = " and ".join(names) if len(names) <= 3 else ", ".join(names[:3]) + " and others"
    return _Line(_day(when), f"{when:%H:%M}", [_Sentence.of("", f"{who} made small talk.")])


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
            day = _day(datetime.strptime(head.group("iso"), "%Y-%m-%d"))
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
            found.append((who, text, _weight_items(text)))
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


__all__ = [
    "DeterministicSummarizer",
    "content_words",
    "is_filler",
    "may_hold_relative_date",
    "resolve_dates",
    "shorten",
    "spoken_numbers",
    "without_small_talk",
]
