"""Recall over a store's index: the search a server runs for a context.

The store keeps every session's postings beside its turns (see
:class:`voice_context.store.base.Store`), so a process serving hundreds of
sessions holds none of their history. A search is one read of the store
(:meth:`~voice_context.store.base.Store.recall_search`): the postings of the
query's words, ranked inside the read with the same BM25 and fusion as the
in-process :class:`~voice_context.recall.index.RecallIndex`, then the few
passages it shows, all of one snapshot; short, whatever the session's length
(the store counts each word's docs, and the postings of words too common to
search by are never read). The passages are rendered after the read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from voice_context.core.recalled import Posting, Recalled, RecallStats
from voice_context.recall.dates import query_date_terms
from voice_context.recall.index import (
    LENDERS_PER_HIT,
    bm25,
    choose_terms,
    fuse,
    idf,
    nearest,
    query_words,
    render_hits,
    turn_key,
    with_neighbours,
)
from voice_context.store.base import Store


async def search_store(
    store: Store,
    name: str,
    query: str,
    *,
    before: int,
    limit: int,
    query_vector: Any = None,
    vectors: Mapping[int, Any] | None = None,
    min_share: float = 0.25,
    now: float | None = None,
    common: float = 1.0,
) -> tuple[RecallStats | None, list[Recalled]]:
    """The passages of session ``name`` that bear on ``query``, best first, rendered to show,
    with the stats of the index they were found in (how many turns and notes it held: its
    word counts, and so the ranking, follow from them); ``None`` when the query has no word
    to search by, and the answer is none whatever the index holds.

    Turns at ``before`` or later are left out (a context shows them verbatim);
    ``query_vector`` with the session's ``vectors`` (doc key -> unit vector) adds
    the vector ranking; ``now`` is when the query is asked (see :func:`query_terms`);
    words held by more than ``common`` of the docs are not searched by (see :func:`choose_terms`).
    """
    words = sorted(query_words(query))
    dates = query_date_terms(query, now)
    if not words and not dates and query_vector is None:
        return None, []
    choose = functools.partial(choose_terms, common=common)

    def keep(key: int) -> bool:
        return key < 0 or key < before

    # on the event loop, before the read: the session's vectors change there
    close = nearest(vectors, query_vector, keep, limit * 2) if query_vector is not None and vectors else []
    below = max(before, 0)  # notes' keys are < 0
    spread = LENDERS_PER_HIT * limit

    def pick(
        stats: RecallStats, df: dict[str, int], postings: dict[str, list[Posting]]
    ) -> tuple[tuple[list[str], list[tuple[int, float]]], list[int]]:
        """The words searched by and the best ``limit`` doc keys with their scores; then the keys
        of the passages to read: each turn with the one after it (a hit that asks a question is
        shown with its answer)."""
        terms = choose([*words, *dates], lambda t: df.get(t, 0), stats.docs)
        scored = bm25(terms, postings, stats.docs, stats.length)
        lexical = {
            key: score
            for key, score in with_neighbours(scored, turn_key, turn_key, spread=spread).items()
            if key < below
        }
        top = fuse(lexical, close, limit=limit, min_share=min_share)
        keys = [key for key, _ in top]
        return (terms, top), [*keys, *(key + 1 for key in keys if key >= 0)]

    found = await store.recall_search(name, [*words, *dates], choose, pick)
    stats, df, passages = found.stats, found.df, found.passages
    terms, top = found.picked
    if not top:
        return stats, []
    weight: Callable[[str], float] = lambda t: idf(stats.docs, df.get(t, 0))  # noqa: E731
    hits = [(passages[key], score) for key, score in top if key in passages]
    return stats, render_hits(
        hits, lambda turn: passages.get(turn + 1), set(terms), weight, drop_small_talk=common < 1.0
    )


__all__ = ["search_store"]
