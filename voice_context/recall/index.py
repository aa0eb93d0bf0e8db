"""Recall: find the old passages of a session that bear on the current query.

Pure and synchronous: no clock, no I/O, no event loop. One :class:`RecallIndex`
per session holds every turn ever appended (and the screen notes seen while
the session was live), indexed for BM25 as they arrive. A search ranks whole
turns, then shows each hit at the granularity that carries its match in the
fewest chars: the sentences of the turn that hold the query's words, or the
whole turn when they are most of it. A hit comes back dated and attributed,
with relative dates resolved from the day it was said::

    [8 May 2023, 13:56] Caroline: I went to a LGBTQ support group yesterday [7 May 2023] …

When vectors are attached to passages (see :mod:`voice_context.recall.embedding`,
computed off the reply path), :meth:`RecallIndex.search` orders what the query's
words found by their meaning too, and fills with the passages nearest in meaning
only where the words found too few (:func:`rerank`); without them it is lexical only.

Cost: appending a turn tokenizes it once (a few microseconds); a search walks
the postings of the query's words only, then splits the best few turns into
sentences. The index keeps each turn's text, so memory grows with the
session's length (about the size of its transcript).
"""

from __future__ import annotations

import heapq
import math
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Literal, NamedTuple

import Stemmer

from voice_context.core.cache import CharBoundedCache, char_bounded_cache
from voice_context.core.language.dates import RELATIVE_DATE, may_hold_relative_date, resolve_dates
from voice_context.core.language.forms import BASE_FORMS
from voice_context.core.language.numbers import NUMBER_TOKENS, spoken_numbers_lower
from voice_context.core.language.small_talk import without_small_talk
from voice_context.core.language.words import lower_tokens, without_apostrophes
from voice_context.core.recalled import MAX_TERM_DOCS, IndexedDoc, Passage, Posting, Recalled
from voice_context.core.session import Session
from voice_context.core.text import ELLIPSIS, clip, normalize, sentences
from voice_context.core.times import stamp
from voice_context.core.turns import Note, Turn
from voice_context.recall.dates import DATE_TERMS, MAX_DATE_TERMS, date_terms, is_date_term, query_date_terms

K1 = 1.2
B = 0.75
RRF_K = 60
"""The lexical ranking's scores are reciprocal ranks, 1 / (RRF_K + place), the first 1/61."""
MEANING_WEIGHT = 0.15
"""With an embedder, how far closeness in meaning moves a passage among those its words found:
each scores its share of the best lexical score, plus this much for every standard deviation its
similarity to the query stands above theirs. Words choose; meaning breaks their near-ties. A
question that names a kind of thing ("What activities does she do?") shares a word or two with
many turns, and the ones that answer it are the closer in meaning. On LoCoMo's questions at 8,000
chars (``minilm-static``) every evidence turn of a many-part question went from 0.206 to 0.250 of
them; fused by reciprocal rank instead, the vector ranking's own hits displaced the words' and
every figure fell (every evidence turn 0.706 to 0.675). At 0.10 the gain halved; a decisive match
(a best lexical score far ahead of the rest) keeps its place at any weight this small."""
SENTENCE_SHARE = 0.75
"""A turn is shown as its matching sentences (and the one after them, where answers tend to be)
when they hold at least this share of its match and are clearly shorter than the turn."""

NEIGHBOUR_SHARE = 0.5
"""A turn's score takes this share of its better adjacent turn's: a question and its answer, a
remark and the reply to it, share a topic, and the turn that holds the answer often repeats none
of the query's words ("What did you research?" ... "Adoption agencies!"). Only the better
neighbour counts, and only half of it, so a turn never outranks the one it borrows from. On
LoCoMo's questions (the rank of an evidence turn among the older turns) it puts the evidence in
the first 10 for 0.78 of them, against 0.71 without, and first as often."""
MAX_QUERY_TERMS = 12
"""A search uses at most this many of the query's words: its rarest."""
DEFAULT_QUERY_COMMON = 0.05
"""A context that names no query recalls for the newest user turn by its words held by at most
this share of the session's docs: small talk ("1-0, easy", "thanks, see you") then recalls
nothing, and the room goes to the summary. A query a context names is searched by all its words."""
MAX_OLDER_TURNS = 400
"""At most this many folded turns are offered to extend a context's verbatim run."""
LENDERS_PER_HIT = 4
"""A search with room for ``limit`` hits lets its best ``LENDERS_PER_HIT * limit`` docs lend their
neighbours a share (see :func:`with_neighbours`)."""
SPEAKER_FOCUS = 0.9
"""A query asked for that names one of the session's speakers is about what that speaker said
(on LoCoMo, 95% of the turns that answer a question naming one speaker are that speaker's): a
hit of another speaker's counts this much (a lexical rank's score, so it falls about seven places
and a tenth of its rank), unless it asks a question the named speaker answers, which its passage
shows. A gentle nudge: at 0.5, every other speaker's hit fell below all of the named one's, which
lifted the pooled figures more but lowered a conversation whose questions swap its two speakers'
names by 0.025."""
FOCUS_WIDTH = 2
"""A search that may focus on a speaker ranks this many times its limit before it does, so that
the named speaker's turns the others outscored are among the hits."""

SMALL_TALK_CACHE_CHARS = 500_000
"""How many chars of shown spans the small-talk check remembers its answer for."""
SPLIT_CACHE_CHARS = 4_000_000
"""How many chars of docs a search keeps split into sentences with their words (the most
recently searched; their parsed forms take a few times their size). Per process, for every live
session: 512 docs, the bound before, held the hits of a few dozen sessions, so that with
hundreds each context split and stemmed its hits again."""
LINE_TERMS_CACHE_CHARS = 4_000_000
"""How many chars of summary lines keep their words (a fold changes a summary's newest lines
and leaves the others as they were, so a summary's index is rebuilt from these)."""
ANNOTATED_CACHE_CHARS = 2_000_000
"""How many chars of shown turns with a relative date keep their annotated form."""
HINT_CACHE_CHARS = 2_000_000
"""How many chars of shown turns keep whether they may say a relative date."""
_STOP = frozenset(
    """
    a an the and or but if so to of in on at by for with from as into onto about over under than then
    is are was were be been being am do does did done have has had having will would shall should can
    could might must i me my mine myself you your yours he him his she her hers it its we us our ours
    they them their theirs this that these those there here what which who whom whose when where why
    how not no nor yes just very too also only still even ever some any all each every both either
    neither such own same other another more most much many few lot lots s t d ll m re ve up down out
    off again once really quite get got gets getting go goes going gone went oh uh um yeah like know
    think mean gonna wanna thing things stuff well okay ok right sure maybe now hey hi hello wow haha
    lol yep yup hmm mm
    """.split()
)


_STEMMER = Stemmer.Stemmer("english")
_HYPHENATED = re.compile(r"[a-z]+(?:-[a-z]+)+")
WORD_TERMS = 50_000
"""How many words :func:`_word_term` remembers the term of (each of at most :data:`WORD_TERM_CHARS`
chars): a conversation's vocabulary is a few thousand words, and every text indexed or searched
is made of them."""
WORD_TERM_CHARS = 40
_WORD_TERMS: dict[str, str] = {}
"""Word -> its term, ``""`` for a word dropped (a stopword, a letter alone). Read without a lock:
a ``dict``'s ``get``, item assignment and ``clear`` are each atomic under the GIL, and a term is
a function of its word alone, so a thread that reads a word another is adding, or finds it gone
after a ``clear``, computes the same term."""


def _stemmed(word: str) -> str:
    """A word as the index holds it: Snowball-stemmed, a number without its leading zeros."""
    stem: str = _STEMMER.stemWord(word)
    return stem.lstrip("0") or "0" if stem.isdigit() else stem


def _word_term(word: str) -> str:
    """:func:`_stemmed`, or ``""`` for a word recall does not match on (remembered: see
    :data:`_WORD_TERMS`)."""
    term = "" if word in _STOP or (len(word) < 2 and not word.isdigit()) else _stemmed(word)
    if len(word) <= WORD_TERM_CHARS:
        if len(_WORD_TERMS) >= WORD_TERMS:
            _WORD_TERMS.clear()
        _WORD_TERMS[word] = term
    return term


def index_terms(text: str) -> list[str]:
    """The words recall matches on: lowercased, numbers said as words as digits, possessives
    dropped, Snowball-stemmed (English), stopwords dropped; a hyphenated word also counts
    written together, and an irregular form ("won", "bought", "children") under its base too
    ("win", "buy", "child"), which no suffix stemmer reaches. The same for turns and queries."""
    # every step but the tokenizing and the stemmer is skipped when its text cannot apply:
    # this runs for every turn stored and every sentence a search shows
    lowered = text.lower()
    found = lower_tokens(lowered)
    tokens: list[str] | None = found
    if not NUMBER_TOKENS.isdisjoint(found):  # a number said as words starts with one of these
        lowered, tokens = spoken_numbers_lower(lowered), None
    if "'" in lowered or "’" in lowered:
        lowered, tokens = without_apostrophes(lowered), None
    if tokens is None:
        tokens = lower_tokens(lowered)
    get = _WORD_TERMS.get
    terms: list[str] = []
    for word in tokens:
        term = get(word)
        if term is None:
            term = _word_term(word)
        if term:
            terms.append(term)
    if "-" in lowered:  # "de-stress" is also "destress"
        terms.extend(_stemmed(h.replace("-", "")) for h in _hyphenated(lowered))
    if not _IRREGULAR.isdisjoint(tokens):  # "won" is also "win"
        terms.extend(_BASE_TERMS[word] for word in tokens if word in _BASE_TERMS)
    return terms


_BASE_TERMS = {form: _stemmed(base) for form, base in BASE_FORMS.items() if _stemmed(base) != _stemmed(form)}
"""An irregular form -> the term of its base (:mod:`voice_context.core.language.forms`), where
the stemmer keeps the two apart ("won" -> "win", "bought" -> "buy", "children" -> "child")."""
_IRREGULAR = frozenset(_BASE_TERMS)


def _hyphenated(lowered: str) -> list[str]:
    """``_HYPHENATED.findall(lowered)``, searched for only in the chunks between blanks that hold a
    hyphen (a match never spans a blank): over a whole text, the regex tries every letter of every
    word, several times slower."""
    return [found for chunk in lowered.split() if "-" in chunk for found in _HYPHENATED.findall(chunk)]


QUERY_WORDS_CACHE_CHARS = 200_000
"""How many chars of queries keep their words (see :func:`query_words`)."""


@char_bounded_cache(QUERY_WORDS_CACHE_CHARS)
def query_words(query: str) -> frozenset[str]:
    """The words of :func:`index_terms` of a query, each once (remembered: a context searches the
    store's index and then its summary's for the same query)."""
    return frozenset(index_terms(query))


def annotate_dates(text: str, at: float) -> str:
    """Relative dates kept as said, with the day they mean in brackets:
    "yesterday" said on 8 May 2023 reads "yesterday [7 May 2023]"."""
    if not _may_hold_relative_date(text):  # ("this week", "past month" among them)
        return text
    return _annotated(f"{at!r}{_AT}{text}")  # the same turns are shown again and again


_AT = "\x00"
_may_hold_relative_date = CharBoundedCache(may_hold_relative_date, HINT_CACHE_CHARS)
"""The same turns are shown again and again: whether one may say a relative date is remembered
(a search of its lowercased copy takes several times a lookup)."""


@char_bounded_cache(ANNOTATED_CACHE_CHARS)
def _annotated(key: str) -> str:
    """:func:`annotate_dates` of a text with a hint of a relative date; ``key`` is when it was
    said (``repr`` of the float), :data:`_AT`, then the text."""
    said, _, text = key.partition(_AT)
    at = float(said)
    out: list[str] = []
    last = 0
    for match in RELATIVE_DATE.finditer(text):
        end = match.end("phrase")
        try:
            value = resolve_dates(match.group("phrase"), at)
        except (OverflowError, OSError, ValueError):
            return text
        for lead in ("on the night of ", "on ", "in "):
            if value.startswith(lead):
                value = value[len(lead) :]
                break
        if value and value != match.group("phrase"):
            out.append(text[last:end] + f" [{value}]")
            last = end
    out.append(text[last:])
    return "".join(out)


def doc_terms(text: str, speaker: str, at: float) -> list[str]:
    """The words a doc is indexed under: its text's, its speaker's name, and the day and month
    it was said (see :mod:`voice_context.recall.dates`)."""
    terms = index_terms(text)
    if speaker:
        terms.extend(index_terms(speaker))
    terms.extend(date_terms(at))
    return terms


def indexed(passage: Passage) -> IndexedDoc:
    """A passage ready for a store's recall index (or this process's). Its length for BM25 is
    its words', not its date words': every doc has the same two."""
    terms = doc_terms(passage.text, passage.speaker, passage.at)
    return IndexedDoc(passage, tuple(Counter(terms).items()), len(terms) - DATE_TERMS)


def turn_passage(index: int, turn: Turn) -> Passage:
    return Passage("turn", index, turn.at, turn.speaker, turn.text, turn.role)


def note_passage(note: Note) -> Passage:
    return Passage("note", None, note.at, note.speaker or "", note.render())


def idf(docs: int, df: int) -> float:
    """BM25's inverse document frequency of a word held by ``df`` of ``docs`` docs."""
    return math.log(1 + (docs - df + 0.5) / (df + 0.5))


def query_terms(
    query: str, df: Callable[[str], int], docs: int, now: float | None = None, *, common: float = 1.0
) -> list[str]:
    """The words a search uses: the rarest :data:`MAX_QUERY_TERMS` of the query's, which carry
    its meaning and bound the postings walked; a word held by more than :data:`MAX_TERM_DOCS`
    docs says little (its idf is near the floor) and is left out, so a search reads at most
    ``MAX_QUERY_TERMS * MAX_TERM_DOCS`` postings however long the session. Then the date words
    of the times the query names (``now``: when it is asked; see :mod:`voice_context.recall.dates`)."""
    return choose_terms([*set(index_terms(query)), *query_date_terms(query, now)], df, docs, common=common)


def choose_terms(
    words: Iterable[str], df: Callable[[str], int], docs: int, *, common: float = 1.0
) -> list[str]:
    """:func:`query_terms` for words already folded: the rarest that are not too common (held
    by at most ``common`` of the docs, and by at most :data:`MAX_TERM_DOCS`), then the date
    words (at most a week of days and a few months, outside the caps)."""
    kept = [t for t in dict.fromkeys(words) if df(t) <= MAX_TERM_DOCS]
    dates = [t for t in kept if is_date_term(t)]
    most = max(2, common * docs)
    plain = [t for t in kept if not is_date_term(t) and df(t) <= most]
    return sorted(plain, key=lambda t: (-idf(docs, df(t)), t))[:MAX_QUERY_TERMS] + dates[:MAX_DATE_TERMS]


def bm25(
    terms: Iterable[str],
    postings: Mapping[str, Sequence[Posting]],
    docs: int,
    total_length: int,
) -> dict[int, float]:
    """The BM25 score of every doc key that holds a query word."""
    if not docs:
        return {}
    avg = total_length / docs or 1.0
    scores: dict[int, float] = {}
    get = scores.get
    scale = K1 * (1 - B)
    per_length = K1 * B / avg
    for term in sorted(set(terms)):  # one order of the sum: equal scores stay equal, run after run
        held = postings.get(term)
        if not held:
            continue
        weight = idf(docs, len(held)) * (K1 + 1)
        for key, tf, length in held:
            scores[key] = get(key, 0.0) + weight * tf / (tf + scale + per_length * length)
    return scores


def with_neighbours(
    scores: Mapping[int, float],
    turn_of: Callable[[int], int | None],
    key_of: Callable[[int], int | None],
    *,
    spread: int,
) -> dict[int, float]:
    """``scores`` with each turn's :data:`NEIGHBOUR_SHARE` of its better adjacent turn's added
    (keys are doc keys; ``turn_of(key)`` is a doc's turn index, ``None`` for a note, which has
    no neighbours; ``key_of(turn)`` the key of a turn, ``None`` where it is not a doc). Only the
    ``spread`` best docs lend: a search shows a few dozen hits, and a long session scores
    thousands of docs (on LoCoMo, lending from the best 112 ranks the evidence as lending from
    all does)."""
    best: dict[int, float] = {}
    lenders = scores.items() if len(scores) <= spread else heapq.nlargest(spread, scores.items(), key=_score)
    for key, score in lenders:
        turn = turn_of(key)
        if turn is None:
            continue
        for near in (turn - 1, turn + 1):
            other = key_of(near) if near >= 0 else None
            if other is not None and score > best.get(other, 0.0):
                best[other] = score
    out = dict(scores)
    for key, score in best.items():
        out[key] = out.get(key, 0.0) + NEIGHBOUR_SHARE * score
    return out


def named_speaker(query: str, speakers: Iterable[str]) -> str | None:
    """The one speaker ``query`` names (a whole word, any case), or ``None`` when it names none or
    several (a question about both is about both)."""
    named = {s for s in speakers if s and _names(query, s)}
    return next(iter(named)) if len(named) == 1 else None


def _names(query: str, speaker: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(speaker)}(?!\w)", query, re.IGNORECASE) is not None


def speaker_focus(
    hits: Sequence[tuple[Passage, float]], reply_to: Callable[[int], Passage | None], query: str
) -> list[tuple[Passage, float]]:
    """``hits`` ranked again for a query that names one speaker (see :data:`SPEAKER_FOCUS`); as
    they are otherwise. A hit of another speaker keeps its score when it asks a question the
    named speaker answers (``reply_to(turn)``: the turn after it)."""
    who = named_speaker(query, {p.speaker for p, _ in hits})
    if who is None:
        return list(hits)

    def weight(passage: Passage) -> float:
        if passage.speaker == who:
            return 1.0
        if passage.turn is not None and asks(passage.text):
            reply = reply_to(passage.turn)
            if reply is not None and reply.speaker == who:
                return 1.0
        return SPEAKER_FOCUS

    ranked = [(passage, score * weight(passage)) for passage, score in hits]
    return sorted(ranked, key=lambda hit: -hit[1])  # stable: equals keep their order


def _score(item: tuple[int, float]) -> float:
    return item[1]


def turn_key(key: int) -> int | None:
    """A store's doc key as a turn index: a turn's key is its index; a note's is negative."""
    return key if key >= 0 else None


def _candidates(lexical: Mapping[int, float], limit: int, min_share: float) -> list[int]:
    """The best ``limit`` doc keys by lexical score (of equals, the newer), none under
    ``min_share`` of the best: a heap, as a long session scores thousands."""
    if not lexical:
        return []
    floor = min_share * max(lexical.values())
    return heapq.nlargest(limit, (d for d, s in lexical.items() if s >= floor), key=lambda d: (lexical[d], d))


def by_words(lexical: Mapping[int, float], *, limit: int, min_share: float = 0.25) -> list[tuple[int, float]]:
    """The best ``limit`` doc keys by their lexical scores (a hit under ``min_share`` of the best
    is noise and left out), best first, each scored by its place, 1 / (:data:`RRF_K` + place)."""
    order = _candidates(lexical, limit, min_share)
    return [(doc, 1.0 / (RRF_K + rank + 1)) for rank, doc in enumerate(order)]


def ranked(
    lexical: Mapping[int, float], similar: Mapping[int, float] | None, *, limit: int, min_share: float = 0.25
) -> list[tuple[int, float]]:
    """The best ``limit`` doc keys, best first: by their words alone (:func:`by_words`), or, with
    ``similar`` (an embedder's similarities to the query), by words and meaning (:func:`rerank`)."""
    if similar is None:
        return by_words(lexical, limit=limit, min_share=min_share)
    return rerank(lexical, similar, limit=limit, min_share=min_share)


def similarities(
    vectors: Mapping[int, Any], query_vector: Any, keep: Callable[[int], bool]
) -> dict[int, float]:
    """Each kept doc key's similarity to ``query_vector`` (unit vectors: their dot product); a
    session's :class:`Vectors` as they are, any other mapping made one first."""
    table = vectors if isinstance(vectors, Vectors) else Vectors(vectors)
    return table.similarities(query_vector, keep)


class Vectors(Mapping[int, Any]):
    """A session's unit vectors by doc key, kept as the rows of one matrix (grown by a quarter,
    at least 64 rows, so that at most a fifth of it is room not yet used), so that a query's
    similarity to every one of them is one product over memory already in one piece: stacking
    each vector again for every query cost seven times as much (0.46 against 0.07 ms for 419
    vectors of 384 floats), and grows with the session."""

    __slots__ = ("_keys", "_matrix", "_row")

    def __init__(self, rows: Mapping[int, Any] | None = None) -> None:
        self._row: dict[int, int] = {}
        self._keys: list[int] = []
        self._matrix: Any = None
        if rows:
            self.update(rows)

    def __repr__(self) -> str:
        return f"<Vectors {len(self._keys)}>"

    def update(self, rows: Mapping[int, Any]) -> None:
        """Add (or replace) the vectors of ``rows`` (doc key -> vector)."""
        for key, vector in rows.items():
            self[key] = vector

    def __setitem__(self, key: int, vector: Any) -> None:
        import numpy as np

        row = self._row.get(key)
        if row is None:
            row = len(self._keys)
            matrix = self._matrix
            if matrix is None or row == len(matrix):
                grown = np.empty((row + max(64, row // 4), len(vector)), dtype=np.float32)
                if matrix is not None:
                    grown[:row] = matrix
                self._matrix = grown
            self._row[key] = row
            self._keys.append(key)
        self._matrix[row] = vector

    def __getitem__(self, key: int) -> Any:
        return self._matrix[self._row[key]]

    def __contains__(self, key: object) -> bool:
        return key in self._row

    def __iter__(self) -> Iterator[int]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def similarities(self, query_vector: Any, keep: Callable[[int], bool]) -> dict[int, float]:
        """Each kept doc key's similarity to ``query_vector``: one matrix-vector product."""
        if not self._keys:
            return {}
        sims = (self._matrix[: len(self._keys)] @ query_vector).tolist()
        return {key: sim for key, sim in zip(self._keys, sims, strict=True) if keep(key)}


def rerank(
    lexical: Mapping[int, float], similar: Mapping[int, float], *, limit: int, min_share: float = 0.25
) -> list[tuple[int, float]]:
    """The best ``limit`` doc keys, best first, of the ``2 * limit`` the words rank best (none
    under ``min_share`` of the best), ordered by words and meaning: each scores its share of the
    best lexical score plus :data:`MEANING_WEIGHT` times the standard deviations its similarity
    (``similar``: doc key -> similarity to the query) stands above theirs, at most 3 either way
    (plus 3 of them, so that every score is positive). Where the words found fewer than ``limit``,
    the docs nearest in meaning fill the rest, each below every doc the words found (a share
    ``min_share`` of its similarity to the best similarity's; of equals, the newer first)."""
    order = _candidates(lexical, limit * 2, min_share)
    ranked: dict[int, float] = {}
    if order:
        best = lexical[order[0]]
        known = [similar[d] for d in order if d in similar]
        mean = sum(known) / len(known) if known else 0.0
        spread = math.sqrt(sum((v - mean) ** 2 for v in known) / len(known)) if known else 0.0
        for doc in order:
            sim = similar.get(doc)
            z = (sim - mean) / spread if sim is not None and spread > 0 else 0.0
            ranked[doc] = lexical[doc] / best + MEANING_WEIGHT * (min(3.0, max(-3.0, z)) + 3.0)
    top = sorted(ranked, key=lambda d: (-ranked[d], -d))[:limit]
    if len(top) < limit and similar:
        fill = heapq.nlargest(
            limit - len(top), (d for d in similar if d not in ranked), key=lambda d: (similar[d], d)
        )
        if fill:
            most = max(similar[fill[0]], 1e-9)
            for doc in fill:
                ranked[doc] = min_share * max(similar[doc], 0.0) / most
            top.extend(fill)
    return [(doc, ranked[doc]) for doc in top]


class Sentences(NamedTuple):
    """A doc as :func:`best_span` weighs it and :func:`render` shows it: its sentences, the words
    of each (none for a doc of one sentence, which is shown whole), where each starts in the
    sentences joined by spaces (``starts[k + 1] - starts[i]`` is the size of the run ``i..k``
    and its space after), and whether the doc, and each sentence, may say a relative date (a run
    of them may only if one of them may: a date's words never span the end of a sentence)."""

    parts: tuple[str, ...]
    words: tuple[frozenset[str], ...]
    starts: tuple[int, ...]
    dated: bool
    dated_parts: tuple[bool, ...]


@char_bounded_cache(SPLIT_CACHE_CHARS)
def split(text: str) -> Sentences:
    """A doc's :class:`Sentences` (cached for the docs searched most recently: all that does not
    depend on the query is worked out once)."""
    flat = normalize(text).replace("\n", " ")
    parts = tuple(sentences(flat))
    words = tuple(frozenset(index_terms(p)) if len(parts) > 1 else frozenset() for p in parts)
    starts = (0, *accumulate(len(p) + 1 for p in parts))
    dated = may_hold_relative_date(text)
    flat_dated = dated if flat == text else may_hold_relative_date(flat)
    # each sentence is a piece of ``flat``: none may say a date when ``flat`` may not (most docs)
    hints = tuple(map(may_hold_relative_date, parts)) if flat_dated else (False,) * len(parts)
    return Sentences(parts, words, starts, dated, hints)


REPLY_CHARS = 240
"""A hit that asks a question is shown with the start of the turn that answered it, up to this."""


def asks(text: str) -> bool:
    """Whether a turn ends by asking something (its answer is then the next turn)."""
    return text.rstrip().rstrip("\"')”’ ").endswith("?")


_NAMES = "\x00"
_NAME = "\x01"


@char_bounded_cache(SMALL_TALK_CACHE_CHARS)
def _small_talk(key: str) -> bool:
    """Whether a shown span is all small talk; ``key`` is the span, then :data:`_NAMES` and the
    speakers' names joined by :data:`_NAME` (one string, so the answer is cached: the same
    turns are hit again and again as a conversation goes on)."""
    text, _, names = key.partition(_NAMES)
    return not without_small_talk(text, names.split(_NAME) if names else ())


def _said_small_talk(
    text: str, wanted: set[str], weight: Callable[[str], float], speakers: Sequence[str] | None
) -> bool:
    """Whether :func:`render` leaves a hit of ``text`` out as small talk."""
    if speakers is None:
        return False
    return _small_talk(best_span(text, wanted, weight)[0] + _NAMES + _NAME.join(speakers))


def render(
    passage: Passage,
    score: float,
    wanted: set[str],
    weight: Callable[[str], float],
    *,
    reply: Passage | None = None,
    speakers: Sequence[str] | None = None,
) -> Recalled | None:
    """The line a context shows for a hit: dated, attributed, cut to its matching sentences
    when they carry the match in clearly fewer chars (``weight`` is a word's idf). A hit that
    asks a question carries the start of its ``reply`` (the next turn), where the answer is.
    With ``speakers`` (the names said in the session), ``None`` when what it would show is
    small talk, their names aside: a greeting or a goodbye that shares the query's words
    answers nothing."""
    text, granularity, dated = best_span(passage.text, wanted, weight)
    if speakers is not None and _small_talk(text + _NAMES + _NAME.join(speakers)):
        return None  # what matched is small talk ("... Take care of yourself."): no evidence of anything
    if dated and passage.kind == "turn":
        text = annotate_dates(text, passage.at)
    if reply is not None and reply.speaker != passage.speaker:
        answer = clip(annotate_dates(reply.text, reply.at), REPLY_CHARS)
        text = f"{text} {reply.speaker}: {answer}" if reply.speaker else f"{text} {answer}"
    when = stamp(passage.at)
    head = f"[{when}] " if when else ""
    if passage.kind == "turn" and passage.speaker:
        line = f"{head}{passage.speaker}: {text}"
    else:
        line = f"{head}{text}"
    return Recalled(passage.kind, passage.turn, line, score, granularity, passage.at)


def render_hits(
    hits: Iterable[tuple[Passage, float]],
    reply_to: Callable[[int], Passage | None],
    wanted: set[str],
    weight: Callable[[str], float],
    *,
    drop_small_talk: bool = False,
    shown_from: int | None = None,
) -> list[Recalled]:
    """The ranked hits as the lines a context shows, best first: a hit that asks a question
    carries its answer (``reply_to(turn)``, the turn after it), and a turn already shown in
    an earlier line, as a hit or as an answer, is not shown again. ``drop_small_talk``: a
    hit whose shown words are small talk is left out (what a context recalling for the newest
    user turn does: a goodbye then never brings back other goodbyes).

    ``shown_from``: the first turn the context shows verbatim. A hit of that turn or a later
    one is offered as it was said (:func:`unrendered`), not rendered: the context never shows
    it. Every other line is the one a render of them all gives: where a hit's rendering would
    decide one shown (whether the hit before it carries it as an answer), it is decided."""
    out: list[Recalled | None] = []
    shown: set[int] = set()
    weight = {t: weight(t) for t in wanted}.__getitem__  # once per word, not once per sentence
    hits = list(hits)
    speakers = sorted({p.speaker for p, _ in hits if p.speaker}) if drop_small_talk else None
    later = sys.maxsize if shown_from is None else shown_from
    waiting: dict[int, tuple[int, Passage]] = {}  # a hit shown verbatim -> its place in ``out``
    for passage, score in hits:
        turn = passage.turn
        if turn is not None and turn in shown:
            continue
        if turn is not None and turn >= later:
            waiting[turn] = (len(out), passage)
            out.append(unrendered(passage, score))
            continue
        reply = None
        if turn is not None and asks(passage.text):
            answer = waiting.pop(turn + 1, None)
            if answer is not None:  # a hit ranked higher, so shown already unless it was small talk
                k, said = answer
                if _said_small_talk(said.text, wanted, weight, speakers):
                    out[k] = None
                else:
                    shown.add(turn + 1)
            if turn + 1 not in shown:
                reply = reply_to(turn)
        line = render(passage, score, wanted, weight, reply=reply, speakers=speakers)
        if line is None:
            continue
        if turn is not None:
            shown.add(turn)
            if reply is not None:
                shown.add(turn + 1)
        out.append(line)
    return [line for line in out if line is not None]


def unrendered(passage: Passage, score: float) -> Recalled:
    """A hit as it was said, dated and attributed: what recall offers of a turn the context
    shows verbatim anyway (see :func:`render_hits`)."""
    when = stamp(passage.at)
    head = f"[{when}] " if when else ""
    said = f"{passage.speaker}: " if passage.kind == "turn" and passage.speaker else ""
    line = f"{head}{said}{passage.text}"
    return Recalled(passage.kind, passage.turn, line, score, "turn", passage.at)


def best_span(
    text: str, wanted: set[str], weight: Callable[[str], float]
) -> tuple[str, Literal["turn", "sentences"], bool]:
    """The turn's sentences that hold most of its match, when they are clearly shorter; and
    whether what is shown may say a relative date (see :class:`Sentences`)."""
    if not wanted:
        return text, "turn", _may_hold_relative_date(text)
    doc = split(text)
    parts = doc.parts
    if len(parts) < 2:
        return text, "turn", doc.dated
    weights = [sum(map(weight, held)) if (held := words & wanted) else 0 for words in doc.words]
    total = sum(weights)
    if total <= 0:
        return text, "turn", doc.dated
    # the shortest run of consecutive sentences holding SENTENCE_SHARE of the match
    best: tuple[int, int] | None = None
    best_size = 0
    starts = doc.starts  # a run's size: starts[j + 1] - starts[i]
    enough = SENTENCE_SHARE * total
    for i in range(len(parts)):
        if not weights[i]:  # the run from the next sentence holds as much and is shorter
            continue
        mass = 0.0
        for j in range(i, len(parts)):
            mass += weights[j]
            if mass >= enough:
                size = starts[j + 1] - starts[i]
                if best is None or size < best_size:
                    best, best_size = (i, j), size
                break
    if best is None:
        return text, "turn", doc.dated
    i, j = best
    j = min(len(parts) - 1, j + 1)  # the sentence after the match often holds the answer
    if starts[j + 1] - starts[i] - 1 >= 0.8 * len(text):  # (the length of the run joined)
        return text, "turn", doc.dated
    span = " ".join(parts[i : j + 1])
    lead = ELLIPSIS + " " if i > 0 else ""
    tail = " " + ELLIPSIS if j < len(parts) - 1 else ""
    return lead + span + tail, "sentences", any(doc.dated_parts[i : j + 1])


@dataclass(slots=True)
class _Doc:
    passage: Passage
    length: int


@dataclass(slots=True)
class RecallIndex:
    """BM25 over every turn (and note) of one session, held in this process, vectors optional.

    For measuring recall in process (``scripts/bench.py``); a session's index lives in its
    store, beside the turns (:class:`voice_context.store.base.Store`), so a process holds none
    of it. Both rank with the same functions. See the module docstring.
    """

    docs: list[_Doc] = field(default_factory=list)
    postings: dict[str, list[Posting]] = field(default_factory=dict)
    total_length: int = 0
    vectors: Vectors = field(default_factory=Vectors)
    """Doc id -> unit vector (a numpy array), attached when an embedder ran."""
    embedder: Any = None
    """An :class:`~voice_context.recall.embedding.Embedder`, or ``None`` for lexical recall only."""
    _turn_doc: dict[int, int] = field(default_factory=dict)
    _turn_end: int = 0
    """One past the highest turn index indexed."""

    def __repr__(self) -> str:
        return f"<RecallIndex docs={len(self.docs)} terms={len(self.postings)} vectors={len(self.vectors)}>"

    def __len__(self) -> int:
        return len(self.docs)

    # -- building -----------------------------------------------------------------------

    def add_turn(self, index: int, turn: Turn) -> int:
        """Index the turn at transcript ``index``; returns its doc id. Re-adding an index is a no-op."""
        known = self._turn_doc.get(index)
        if known is not None:
            return known
        doc = self._add(turn_passage(index, turn))
        self._turn_doc[index] = doc
        self._turn_end = max(self._turn_end, index + 1)
        return doc

    def add_turns(self, start: int, turns: Iterable[Turn]) -> None:
        for offset, turn in enumerate(turns):
            self.add_turn(start + offset, turn)

    def add_note(self, note: Note) -> int:
        return self._add(note_passage(note))

    @property
    def turns(self) -> int:
        """How many turns are indexed (turns ``0 .. turns-1``)."""
        return len(self._turn_doc)

    def doc_for_turn(self, index: int) -> int | None:
        return self._turn_doc.get(index)

    def attach_vector(self, doc: int, vector: Any) -> None:
        """Attach a unit vector to a doc (from a background embedding pass)."""
        if 0 <= doc < len(self.docs):
            self.vectors[doc] = vector

    def unembedded(self, limit: int) -> list[tuple[int, str]]:
        """Up to ``limit`` docs with no vector yet, newest first: what an embedder should do next."""
        out: list[tuple[int, str]] = []
        for doc in range(len(self.docs) - 1, -1, -1):
            if doc not in self.vectors:
                p = self.docs[doc].passage
                out.append((doc, f"{p.speaker}: {p.text}"))
                if len(out) >= limit:
                    break
        return out

    def embed_pending(self, limit: int = 256) -> int:
        """Embed up to ``limit`` docs that have no vector yet (newest first), in one batch; returns
        how many. Synchronous and CPU-bound: a server runs it in a worker thread, off the reply path."""
        if self.embedder is None:
            return 0
        todo = self.unembedded(limit)
        if not todo:
            return 0
        vectors = self.embedder.embed([text for _, text in todo])
        for (doc, _), vector in zip(todo, vectors, strict=True):
            self.vectors[doc] = vector
        return len(todo)

    def query_vector(self, query: str) -> Any:
        """The query's unit vector, or ``None`` without an embedder or an empty query."""
        if self.embedder is None or not query.strip():
            return None
        return self.embedder.embed([query])[0]

    def _add(self, passage: Passage) -> int:
        doc = indexed(passage)
        doc_id = len(self.docs)
        self.docs.append(_Doc(passage, doc.length))
        self.total_length += doc.length
        for term, tf in doc.terms:
            self.postings.setdefault(term, []).append((doc_id, tf, doc.length))
        return doc_id

    # -- searching -----------------------------------------------------------------------

    def idf(self, term: str) -> float:
        return idf(len(self.docs), len(self.postings.get(term, ())))

    def lexical(
        self, terms: Sequence[str], *, before: int | None = None, spread: int | None = None
    ) -> dict[int, float]:
        """BM25 score of every doc that holds a query word, with its neighbours' share (the
        ``spread`` best lend theirs, every doc by default: see :func:`with_neighbours`; turns at
        ``before`` or later excluded)."""
        docs = self.docs
        scores = with_neighbours(
            bm25(terms, self.postings, len(docs), self.total_length),
            lambda doc: docs[doc].passage.turn,
            self._turn_doc.get,
            spread=len(self.docs) if spread is None else spread,
        )
        if before is not None:  # the few turns a context shows verbatim anyway
            for turn in range(max(0, before), self._turn_end):
                scores.pop(self._turn_doc.get(turn, -1), None)
        return scores

    def _keep(self, before: int | None) -> Callable[[int], bool] | None:
        if before is None:
            return None
        docs = self.docs

        def keep(doc: int) -> bool:
            turn = docs[doc].passage.turn
            return turn is None or turn < before

        return keep

    def search(
        self,
        query: str,
        *,
        before: int | None = None,
        limit: int = 24,
        query_vector: Any = None,
        min_share: float = 0.25,
        now: float | None = None,
        common: float = 1.0,
    ) -> list[Recalled]:
        """The passages that bear on ``query``, best first, each rendered to show.

        ``before`` excludes turns at that index or later (the ones a context
        shows verbatim anyway); ``now`` is when the query is asked (a time it
        names without its year, or "yesterday", is resolved from it). A lexical
        hit scoring under ``min_share`` of the best is noise and left out.
        ``query_vector`` (a unit vector) orders the lexical hits by meaning too,
        and fills where they are too few (:func:`rerank`).
        """
        docs = len(self.docs)
        terms = query_terms(query, lambda t: len(self.postings.get(t, ())), docs, now, common=common)
        lexical = self.lexical(terms, before=before, spread=LENDERS_PER_HIT * limit)
        asked = common >= 1.0  # the newest user turn, the default query, is searched more narrowly
        wide = limit * FOCUS_WIDTH if asked else limit
        similar = None
        if query_vector is not None and self.vectors:
            similar = similarities(self.vectors, query_vector, self._keep(before) or (lambda _: True))
        top = ranked(lexical, similar, limit=wide, min_share=min_share)
        hits = [(self.docs[doc].passage, score) for doc, score in top]

        def reply_to(turn: int) -> Passage | None:
            answer = self._turn_doc.get(turn + 1)
            return self.docs[answer].passage if answer is not None else None

        if asked:
            hits = speaker_focus(hits, reply_to, query)[:limit]
        return render_hits(hits, reply_to, set(terms), self.idf, drop_small_talk=common < 1.0)


def summary_passages(summary: str) -> list[str]:
    """A summary's lines, the units recall offers from it."""
    return [line for line in normalize(summary).split("\n") if line.strip()]


SUMMARY_LINE_CHARS = 600
"""A summary line recall offers is clipped to this many chars."""
SCANNED_LINES = 64
"""A :class:`SummaryIndex` of at most this many lines is searched line by line (a rolling summary,
rebuilt at each fold, has a few dozen at most); one of more (the lines of many rolled summaries)
by the lines each word is in."""


@dataclass(frozen=True, slots=True)
class SummaryIndex:
    """The words of a summary's lines, indexed once per summary (it changes only when a fold
    lands), so that a context searches it without reading it again."""

    summary: str
    lines: tuple[str, ...]
    terms: tuple[frozenset[str], ...]
    """The words of each line."""
    words: dict[str, tuple[int, ...]] | None
    """The lines each word is in (``None`` for :data:`SCANNED_LINES` lines or fewer)."""
    shown: tuple[str, ...]
    """Each line as recall offers it (clipped to :data:`SUMMARY_LINE_CHARS`)."""
    spread: tuple[float, ...]
    """What each line's overlap with a query is divided by: the longer the line, the more."""

    @classmethod
    def of(cls, summary: str) -> SummaryIndex:
        lines = tuple(summary_passages(summary))
        terms = tuple(map(_line_terms, lines))
        shown = tuple(clip(line, SUMMARY_LINE_CHARS) for line in lines)
        spread = tuple(math.sqrt(1 + len(line) / 200) for line in lines)
        if len(lines) <= SCANNED_LINES:
            return cls(summary, lines, terms, None, shown, spread)
        words: dict[str, list[int]] = {}
        for k, held in enumerate(terms):
            for term in held:
                words.setdefault(term, []).append(k)
        return cls(summary, lines, terms, {t: tuple(ks) for t, ks in words.items()}, shown, spread)

    def search(self, query: str, *, limit: int = 4) -> list[Recalled]:
        """Lines that share words with ``query``, best first (overlap weighted by length)."""
        wanted = query_words(query)
        hits: dict[int, int]  # line -> how many of the query's words it holds
        if self.words is None:
            hits = {k: n for k, held in enumerate(self.terms) if (n := len(wanted & held))}
        else:
            hits = Counter()
            for term in wanted:
                hits.update(self.words.get(term, ()))
        spread = self.spread
        scored = sorted(((n / spread[k], k) for k, n in hits.items()), key=lambda item: (-item[0], -item[1]))
        return [Recalled("summary", None, self.shown[k], score) for score, k in scored[:limit]]


@char_bounded_cache(LINE_TERMS_CACHE_CHARS)
def _line_terms(line: str) -> frozenset[str]:
    return frozenset(index_terms(line))


def search_summary(summary: str, query: str, *, limit: int = 4) -> list[Recalled]:
    """Summary lines that share words with ``query``, best first (plain overlap weighted by length)."""
    if not summary or not query.strip():
        return []
    return SummaryIndex.of(summary).search(query, limit=limit)


def default_query(turns: Sequence[Turn]) -> str:
    """The newest user turn's text without its small talk: what a reply is about when the bot
    names nothing else. A greeting, a goodbye, thanks, a laugh or a backchannel leaves nothing
    (``""``), and a context then recalls nothing: its room goes to the summary."""
    for turn in reversed(turns):
        if turn.role == "user" and turn.text.strip():
            return without_small_talk(turn.text, {t.speaker for t in turns if t.speaker})
    return ""


def query_time(session: Session) -> float | None:
    """When a context's query is asked: the time of the session's newest turn."""
    turns = session.verbatim_turns
    return turns[-1].at if turns else None


def recall_candidates(
    index: RecallIndex, session: Session, query: str | None, *, query_vector: Any = None, embed: bool = False
) -> tuple[str, list[Recalled]]:
    """The query a context recalls for, and what recall offers it, best first.

    Turns are offered before summary lines; the context builder skips those it
    shows verbatim anyway. ``query_vector`` (or ``embed``, to embed the query here) adds the
    index's vectors to the ranking.
    """
    config = session.config
    text = default_query(session.verbatim_turns) if query is None else query
    if not config.recall or not text.strip():
        return text, []
    limit = max(1, config.recall_limit) + 4  # a few spare for those shown verbatim anyway
    if embed and query_vector is None:
        query_vector = index.query_vector(text)
    found = index.search(
        text,
        before=session.total_turns - 1,
        limit=limit,
        query_vector=query_vector,
        now=query_time(session),
        common=DEFAULT_QUERY_COMMON if query is None else 1.0,
    )
    found.extend(search_summary(session.summary, text, limit=config.recall_limit))
    return text, found


__all__ = [
    "DEFAULT_QUERY_COMMON",
    "SPEAKER_FOCUS",
    "RecallIndex",
    "Recalled",
    "SummaryIndex",
    "annotate_dates",
    "default_query",
    "index_terms",
    "query_time",
    "recall_candidates",
    "search_summary",
    "stamp",
    "summary_passages",
]
