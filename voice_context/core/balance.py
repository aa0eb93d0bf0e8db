"""Which worker of ``serve --workers`` takes the next connection: the least loaded.

The workers watch one listening socket. When a connection waits, each asks
:func:`wait_before_accepting` with its own count of open connections, the live siblings'
counts, and how long it has been declining: a worker that holds no more than any sibling
accepts; one that holds more looks away for ``pause`` seconds, so that a sibling with fewer
takes it, and looks again. A sibling may be stopped, or too busy to look: once a worker has
declined for ``bound`` seconds it accepts anyway, and no connection waits longer than that.

Pure and synchronous: the caller reads the counts and the clock, and does the accepting.
"""

from __future__ import annotations

from collections.abc import Iterable

PAUSE = 0.002
"""Seconds a worker that holds more than a sibling looks away before it looks again."""

BOUND = 0.020
"""Seconds a worker declines a waiting connection at most before it accepts it anyway."""


def wait_before_accepting(
    mine: int, others: Iterable[int], declined_for: float = 0.0, *, pause: float = PAUSE, bound: float = BOUND
) -> float:
    """Seconds to look away before looking at the waiting connection again; ``0.0``: accept it now.

    ``mine``: the connections this worker holds open; ``others``: those each live sibling
    holds; ``declined_for``: how long this worker has been declining the connections waiting
    (``0.0`` when it just saw one arrive).
    """
    if declined_for >= bound or all(mine <= other for other in others):
        return 0.0
    return min(pause, bound - declined_for)
