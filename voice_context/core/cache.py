"""A least-recently-used cache of a one-string function, bounded by the size of what it holds.

``functools.lru_cache`` bounds the number of entries, not their size: 16,384
entries of 8,000-character sentences and their parsed forms held tens of
megabytes for the whole process. This cache counts the characters of its keys
(what it holds grows with them) and drops the least recently used entries past
``max_chars``. It is safe to call from several threads at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

V = TypeVar("V")


class CharBoundedCache(Generic[V]):
    """``fn(text)``, remembered for the most recently used texts up to ``max_chars`` in all."""

    def __init__(self, fn: Callable[[str], V], max_chars: int) -> None:
        if max_chars < 1:
            raise ValueError("max_chars must be positive")
        self.fn = fn
        self.max_chars = max_chars
        self.chars = 0
        self._held: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()  # folds run in worker threads, several at once
        self.__doc__ = fn.__doc__

    def __call__(self, text: str) -> V:
        held = self._held
        # a hit takes no lock (the lock is contended between the fold threads and the event
        # loop's): the lookup and the move to the end are each one call of the C OrderedDict
        # that runs whole under the GIL (a str key's hash and equality run no Python code), and
        # neither changes what is held or its count; a key another thread dropped between the
        # two is not moved back
        try:
            value = held[text]
        except KeyError:
            pass
        else:
            try:  # noqa: SIM105 (not contextlib.suppress: a hit is a few hundred nanoseconds, suppress adds half)
                held.move_to_end(text)
            except KeyError:  # dropped by another thread meanwhile: it was used least recently
                pass
            return value
        value = self.fn(text)  # outside the lock: two threads may both compute a value, never corrupt
        if len(text) <= self.max_chars:
            with self._lock:
                if text not in held:
                    held[text] = value
                    self.chars += len(text)
                while self.chars > self.max_chars:
                    dropped, _ = held.popitem(last=False)
                    self.chars -= len(dropped)
        return value

    def __len__(self) -> int:
        return len(self._held)

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self.chars = 0


def char_bounded_cache(max_chars: int) -> Callable[[Callable[[str], V]], CharBoundedCache[V]]:
    """Decorate a one-string function with a :class:`CharBoundedCache`."""

    def wrap(fn: Callable[[str], V]) -> CharBoundedCache[V]:
        return CharBoundedCache(fn, max_chars)

    return wrap
