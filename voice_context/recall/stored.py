"""Recall over a store's index: the search a server runs for a context.

The store keeps every session's postings beside its turns (see
:class:`voice_context.store.base.Store`), so a process serving hundreds of
sessions holds none of their history. A search is one read of the store
(:meth:`~voice_context.store.base.Store.recall_search`): the postings of the
query's words, ranked inside the read with the same BM25 and reranking as the
in-process :class:`~voice_context.recall.index.RecallIndex`, then the few
passages it shows, all of one snapshot; short, whatever the session's length
(the store counts each word's docs, and the postings of words too common to
search by are never read). The passages are rendered after the read, when the
context asks: it need not render those of the turns it shows verbatim.

A session's newest turns may be held by the process serving it rather than
written to the index yet (they are written a batch at a time): a search is
given them, and ranks them inside the read as if the store held them, beside
the index's own docs. Which of them the store holds already is read from its
stats, so a batch written meanwhile is counted once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from voice_context.core.recalled import IndexedDoc, Passage, Posting, Recalled, RecallStats
from voice_context.recall.dates import query_date_terms
from voice_context.recall.index import (
    FOCUS_WIDTH,
    LENDERS_PER_HIT,
    bm25,
    choose_terms,
    idf,
    query_words,
    ranked,
    render_hits,
    similarities,
    speaker_focus,
    turn_key,
    with_neighbours,
)
from voice_context.store.base import Store


async def search_store(
    store: Store, name: str, query: str, **asked: Any
) -> tuple[RecallStats | None, list[Recalled]]:
    """:func:`find_in_store`, every hit rendered."""
    stats, found = await find_in_store(store, name, query, **asked)
    return stats, found.render()


async def find_in_store(
    store: Store,
    name: str,
    query: str,
    *,
    before: int,
    limit: int,
    query_vector: Any = None,
    vectors: Mapping[int, Any] | None = None,
    min_share: float = 0.25,
    held: HeldView | None = None,
    now: float | None = None,
    common: float = 1.0,
    asked: bool = True,
) -> tuple[RecallStats | None, Found]:
    """The passages of session ``name`` that bear on ``query``, best first, to be rendered,
    with the stats of the index they were found in (how many turns and notes it held: its
    word counts, and so the ranking, follow from them); ``None`` when the query has no word
    to search by, and the answer is none whatever the index holds.

    Turns at ``before`` or later are left out (a context shows them verbatim);
    ``query_vector`` with the session's ``vectors`` (doc key -> unit vector) orders
    the words' hits by meaning too, and fills where they are too few (see :func:`rerank`);
    ``held``: the docs of the newest turns, which the store's index may not hold yet,
    searched with it (see :class:`HeldTurns`); ``now`` is when the query is
    asked (see :func:`query_terms`); words held by more than ``common`` of the docs are not
    searched by (see :func:`choose_terms`); ``asked``: the query was asked for, not the newest
    user turn (whose names are more often said to someone than asked about): one that names a
    speaker of the session ranks that speaker's turns first (:func:`speaker_focus`).

    What it found is rendered when asked (:meth:`Found.render`): a context renders it once it
    knows the turns it shows verbatim, which it need not render.
    """
    words = sorted(query_words(query))
    dates = query_date_terms(query, now)
    if not words and not dates and query_vector is None:
        return None, NOTHING_FOUND
    tail = Tail(held or HeldTurns().view(), [*words, *dates])

    def choose(terms: Sequence[str], df: Callable[[str], int], stats: RecallStats) -> list[str]:
        """The words whose postings the store reads: counted with the docs it does not hold."""
        merged, extra, _ = tail.over(stats)
        return choose_terms([*terms, *extra], lambda t: df(t) + extra.get(t, 0), merged.docs, common=common)

    def keep(key: int) -> bool:
        return key < 0 or key < before

    # on the event loop, before the read: the session's vectors change there
    similar = similarities(vectors, query_vector, keep) if query_vector is not None and vectors else None
    below = max(before, 0)  # notes' keys are < 0
    spread = LENDERS_PER_HIT * limit
    wide = limit * FOCUS_WIDTH if asked else limit  # ranked again by speaker once passages are read

    def pick(
        stored: RecallStats, df: dict[str, int], postings: dict[str, list[Posting]]
    ) -> tuple[tuple[RecallStats, dict[str, int], list[str], list[tuple[int, float]]], list[int]]:
        """The index searched (the store's with the docs it does not hold), its doc counts, the
        words searched by and the best ``limit`` doc keys with their scores; then the keys of
        the passages to read: each turn with the one after it (a hit that asks a question is
        shown with its answer)."""
        stats, extra, more = tail.over(stored)
        if extra:
            df = {t: df.get(t, 0) + extra.get(t, 0) for t in {*df, *extra}}
            postings = {t: [*postings.get(t, ()), *more.get(t, ())] for t in {*postings, *more}}
        terms = choose_terms([*words, *dates], lambda t: df.get(t, 0), stats.docs, common=common)
        scored = bm25(terms, postings, stats.docs, stats.length)
        lexical = {
            key: score
            for key, score in with_neighbours(scored, turn_key, turn_key, spread=spread).items()
            if key < below
        }
        top = ranked(lexical, similar, limit=wide, min_share=min_share)
        keys = [key for key, _ in top]
        return (stats, df, terms, top), [*keys, *(key + 1 for key in keys if key >= 0)]

    found = await store.recall_search(name, [*words, *dates], choose, pick)
    stats, df, terms, top = found.picked
    passages = found.passages
    hits = [(passages[key], score) for key, score in top if key in passages]
    focused = speaker_focus(hits, lambda turn: passages.get(turn + 1), query)[:limit] if asked else hits
    return stats, Found(tuple(focused), passages, frozenset(terms), stats.docs, df, common < 1.0)


@dataclass(frozen=True, slots=True)
class Found:
    """The passages a search found, best first, with what rendering them needs: the passages
    read (each hit's answer among them), the words searched by, and the index's doc counts
    (``docs`` docs, ``df`` per word) that weigh them."""

    hits: tuple[tuple[Passage, float], ...]
    passages: Mapping[int, Passage]
    terms: frozenset[str]
    docs: int
    df: Mapping[str, int]
    drop_small_talk: bool

    def render(self, shown_from: int | None = None) -> list[Recalled]:
        """The hits as the lines a context shows (see :func:`render_hits`; ``shown_from``: the
        first turn the context shows verbatim, whose hits need no rendering)."""
        if not self.hits:
            return []
        docs, df, passages = self.docs, self.df, self.passages
        return render_hits(
            self.hits,
            lambda turn: passages.get(turn + 1),
            set(self.terms),
            lambda t: idf(docs, df.get(t, 0)),
            drop_small_talk=self.drop_small_talk,
            shown_from=shown_from,
        )


NOTHING_FOUND = Found((), {}, frozenset(), 0, {}, False)
"""What a search offers when it found nothing, or could not search."""


class HeldView(NamedTuple):
    """What a search reads of :class:`HeldTurns`: the docs of turns ``start .. stop-1``, their
    postings by word, and their lengths."""

    start: int
    stop: int
    postings: Mapping[str, Sequence[Posting]]
    lengths: Sequence[int]


class HeldTurns:
    """The docs of a session's newest turns, ``start, start+1, ...``, held by the process serving
    it until they are written to the store's index: with their postings by word, kept as each
    doc comes (a search reads the postings of its few words, not every word held).

    A search runs in the store's thread while the event loop adds docs: :meth:`view` is what
    it reads, and it reads nothing past the ``stop`` it was given (postings added since are left
    out by their keys). Docs are only ever added; the docs left once some are written are a new
    :class:`HeldTurns` (:meth:`after`), so a view taken before keeps what it saw."""

    def __init__(self, start: int = 0, docs: Iterable[IndexedDoc] = ()) -> None:
        self.start = start
        self.docs: list[IndexedDoc] = []
        self._postings: dict[str, list[Posting]] = {}
        self._lengths: list[int] = []
        for doc in docs:
            self.add(doc)

    def __len__(self) -> int:
        return len(self.docs)

    def add(self, doc: IndexedDoc) -> None:
        """The doc of turn ``start + len(self)``."""
        key = self.start + len(self.docs)
        postings = self._postings
        for term, tf in doc.terms:
            if (held := postings.get(term)) is None:
                postings[term] = [(key, tf, doc.length)]
            else:
                held.append((key, tf, doc.length))
        self._lengths.append(doc.length)
        self.docs.append(doc)

    def after(self, start: int) -> HeldTurns:
        """The docs of turns from ``start`` on (those before it are in the store's index)."""
        return HeldTurns(start, self.docs[start - self.start :] if start >= self.start else ())

    def view(self) -> HeldView:
        return HeldView(self.start, self.start + len(self.docs), self._postings, self._lengths)


class Tail:
    """The held docs as a search adds them to what it reads of the store's index: only those the
    index does not hold (by its turn count), and of their words only the query's."""

    def __init__(self, held: HeldView, words: Sequence[str]) -> None:
        self.held = held
        self.words = list(dict.fromkeys(words))  # in the query's order: so are the words it adds
        self._over: tuple[int, tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]] | None = None

    def over(self, stats: RecallStats) -> tuple[RecallStats, dict[str, int], dict[str, list[Posting]]]:
        """The index of ``stats`` with the docs it lacks; the query words' doc counts and postings
        in those docs. Nothing is added when the index lacks turns before the held ones (the
        store lost part of its index, and the process indexes them again): keys would be skipped."""
        if self._over is not None and self._over[0] == stats.turns:
            return self._over[1]
        start, stop, held, lengths = self.held
        count, skip = stop - start, stats.turns - start
        df: dict[str, int] = {}
        postings: dict[str, list[Posting]] = {}
        merged = stats
        if 0 <= skip < count:
            for word in self.words:
                found = [p for p in held.get(word, ()) if stats.turns <= p[0] < stop]
                if found:
                    df[word] = len(found)  # (a doc holds a word once)
                    postings[word] = found
            n, length = count - skip, sum(lengths[skip:count])
            merged = RecallStats(stats.docs + n, stats.length + length, stats.turns + n, stats.notes)
        self._over = (stats.turns, (merged, df, postings))
        return merged, df, postings


__all__ = ["NOTHING_FOUND", "Found", "HeldTurns", "HeldView", "find_in_store", "search_store"]
