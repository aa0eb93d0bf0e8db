"""What changes nothing: greetings, goodbyes, thanks, laughter, backchannels, acknowledgements
and voice-chat callouts (filler), sentences of small talk alone, and the interjections, vocatives,
hesitations and stutters a sentence can do without.

Recall leaves out of its index what tells nothing (:func:`without_small_talk`), the compression
drops filler turns (:func:`is_filler`), and the deterministic summarizer keeps a turn's sentences
shortened (:func:`shorten`) when they tell something (:func:`told_words`). Pure: no clock, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from voice_context.core.language.words import weighted_words
from voice_context.core.text import sentences

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


_LEAD = re.compile(
    r"^(?:(?:hey|hi|hello|heya|yo|wow|whoa|oh|ooh|ah|aw+|yeah|yep|yup|so|ok|okay|alright|um+|uh+|uhm|"
    r"hmm+|mm+|mhm|haha+|hehe+|lol|omg|gosh|anyway|anyways|also|but|and|actually|honestly|"
    r"oh my god|oh man|man|dude|bye|goodbye|ttyl|"
    # "well" and "like" lead a sentence of their own too: "Well done!", "Like my dad, I fish"
    r"well(?!\s+(?:done|said|worth|played|deserved|earned|spent|made|known)\b)|"
    r"like(?!\s+(?:my|your|his|her|its|our|their|me|him|them|us|this|that|these|those|you said)\b)"
    r"(?!\s+(?-i:(?!I\b)[A-Z])))"
    r"(?=[\s,!.…?-])[\s,!.…?-]*|"
    r"(?:great|awesome|nice|cool|thanks|thank you|right|sure|totally|absolutely|exactly|yes|no|true|remember|"
    r"wonderful|amazing|fantastic|congrats|congratulations|sweet|good|perfect|indeed|of course)"
    r"[\s]*[,!.…]+\s*)+",
    re.IGNORECASE,
)
_HESITATION = re.compile(r"(?:,\s*)?\b(?:um+|uh+|uhm|erm|er|hmm+|mm+)\b(?:\s*,)?", re.I)
# "you know" and "I mean" are hesitations ("It was, you know, hard"; "I mean it's fine"; "so you know
# he can") except where the words around make them the sentence's own verb: "let you know", "do you
# know", "you know what I mean", "what I mean", "I mean it.", "I mean to ask".
_FRAME = re.compile(r"(,\s*)?(?<![\w'])(you know|i mean)(?![\w'])(\s*,)?", re.I)
_WORD_BEFORE = re.compile(r"([\w']+)\W*$")
_WORD_AFTER = re.compile(r"\s*([\w']+)(\s*(?:[,.!?…;:]|$))?")
_KNOW_AFTER_VERB = frozenset(
    "let do did does don't didn't doesn't if as what how whether when where who y yo".split()
)
_KNOW_OBJECT = frozenset(
    "what how where who whom why when whether if about of him her them me us this these those "
    "anything something everything nothing anyone anybody someone somebody".split()
)
_MEAN_AFTER = frozenset("what you know if do did does which".split())
# an object only where the sentence ends on it: "You know it." but "you know it might rain"
_LAST_OBJECT = frozenset("it that this".split())


# Only words that leave a sentence whole when they go: "so much has happened" needs its "so much",
# "a kind of bread" its "kind of"; a capitalised "Super" may be a name ("Super Bowl").
_INTENSIFIER = re.compile(
    r"\b(?:really|just|super|actually|totally|definitely|literally|basically|honestly|truly|kinda)\s+"
    r"(?=[a-z])"
)
# Possessive: a word said again must end where its run of letters does, so no shorter run is tried.
_REPEAT = re.compile(r"\b(\w++(?:'\w++)?)(?:\s+\1\b)+", re.IGNORECASE)


_LEADING_LABEL = re.compile(r"^([A-Z][^:.!?\n]{0,48}?):\s+")
_VOCATIVE_HEAD = re.compile(r"^([A-Z][a-z]+)\s*(?:[,!]+\s*|[.!?…]*$)")
_VOCATIVE_TAIL = re.compile(r",\s*([A-Z][a-z]+)\s*([.!?…]*)$")
_NAME = re.compile(r"\b[A-Z][a-z]+\b")


def _frame_out(text: str) -> str:
    """``text`` without the "you know" and "I mean" that are hesitations in it."""
    low = text.lower()
    if "you know" not in low and "i mean" not in low:
        return text
    out: list[str] = []
    end = 0
    for match in _FRAME.finditer(text):
        kept_before = "".join(out) + text[end : match.start()]  # what stays of the words before
        before = None if match[1] else _WORD_BEFORE.search(kept_before)
        after = None if match[3] else _WORD_AFTER.match(text, match.end())
        prev = before[1].lower() if before else ""
        follows = after[1].lower() if after else ""
        ends = after is not None and after[2] is not None and follows in _LAST_OBJECT
        if match[2].lower() == "you know":
            kept = prev in _KNOW_AFTER_VERB or follows in _KNOW_OBJECT or ends
        else:  # "I mean it." and "I mean to ask" mean; "I mean it's fine" does not
            kept = prev in _MEAN_AFTER or follows == "to" or ends
        if not kept:
            out.append(text[end : match.start()])
            end = match.end()
    return "".join(out) + text[end:] if out else text


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
    return not told_words(text)


def told_words(text: str) -> set[str]:
    """The informative words of ``text`` (folded, numbers among them) once its pleasantries and
    callouts are set aside: what it tells."""
    return {word for word, weight in weighted_words(_pleasantries_out(text)) if weight >= 1.0}


def without_small_talk(text: str, speakers: Iterable[str] = ()) -> str:
    """``text`` without its sentences of small talk (greetings, goodbyes, thanks, laughter,
    backchannels, acknowledgements, callouts: :func:`is_filler`, the names of ``speakers``
    aside, so "Thanks, Mel!" is filler too): what in it could be asked about, ``""`` when
    nothing is. A sentence goes only when no word of it carries a fact."""
    names = tuple(speakers)
    return " ".join(s for s in sentences(text) if not is_filler(without_names(shorten(s, names), names)))


def finish_sentence(text: str) -> str:
    """``text`` as a sentence: without the punctuation and blanks around it, its first letter
    capitalised, its end punctuated (``""`` for nothing)."""
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
    text = _frame_out(_HESITATION.sub("", sentence))
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
    return finish_sentence(" ".join(text.split()))


def without_names(text: str, speakers: Sequence[str]) -> str:
    """``text`` without the speakers' names, which make "Thanks Mel!" look informative."""
    return _NAME.sub(lambda m: "" if _is_vocative(m.group(0), speakers) else m.group(0), text)


__all__ = [
    "finish_sentence",
    "is_filler",
    "shorten",
    "told_words",
    "without_names",
    "without_small_talk",
]
