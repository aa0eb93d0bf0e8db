"""The async shell around the pure sessions: one task group, compactions in the background.

:class:`SessionManager` owns every live session and the task group their
compactions run in. A context request never waits on a summarizer: it decides,
synchronously, whether a compaction should start, starts it in the background,
and returns the context built from the summary that exists now.

Lifetimes are lexical::

    async with SessionManager(DeterministicSummarizer()) as manager:
        await manager.open("room-1")
        await manager.append_turn("room-1", Turn("Alice", "user", "hi", at=0.0))
        ctx = await manager.context("room-1", "instructions")

Leaving the block stops new compactions, gives those in flight
``close_timeout`` seconds to land (shielded), then cancels the rest. The manager
owns one task group, entered with ``async with``; the work a request starts
there (a fold, indexing, recall ahead, a tier roll) is not waited for, so the
reply is built from what exists now; a fold's lease renewals run in the fold's
own task group, started with ``tg.start``. ``await manager.settled()`` returns
once all of that work started so far has landed (a replay on a logical clock
awaits it after each message, and tests instead of sleeping).

Recall runs ahead of the reply (``recall_ahead``): when a user turn is stored,
the search for it (a context's default query) starts in the background, so that
the context asked for before the bot answers finds its passages ready instead of
reading the store's index on the reply path. ``first`` (the default) searches
ahead for the first user turn after each context: in a conversation of two, the
turn the bot answers; in a group, at most one search per reply goes unused.
``every`` searches for every user turn, so a group's bot finds the newest ready
too, at the cost of a search per turn; ``off`` never.

What a search finds is a function of the session, not of timing: every search
(ahead or on the reply path) waits for the background indexing to hold every turn
stored and every note seen, and a search ahead is used only when it was made on
the basis the context would search (:class:`~voice_context.manager.live.Basis`:
the same index, bound, summary and tiers). A context for another query, or after
a turn, a note or a fold since the search, recalls for itself.

The manager is composed of its jobs, each given only what it needs: the store,
the clock, the settings of its own, the one feed point, and from
:mod:`~voice_context.manager.registry` the sessions served here (``Served``) and
the one task group background work runs in (``Background``); no job holds the
manager. The jobs decide nothing of a session's own: every event reaches a
session through the feed point (:meth:`~voice_context.manager.runtime.Runtime.feed`),
and each effect its core answers is performed by the job that performs that
type of effect:

=================  ==========================================================
``runtime``        the one feed point, and the performers of the effects
``sessions``       :class:`SessionManager`, the face: a method per request
``replicas``       opening, who owns a name, catching up with the store
``compactions``    folds in the background: plan, summarize, commit, apply
``leases``         the store's compaction lease, renewed while a fold runs
``outcomes``       what a fold came to: counters, log, listeners
``indexing``       turns and notes into the store's recall index, in the background
``recall``         the search for a context, ahead of the reply and on its path
``tiers``          the tier cascade's rolls, and the summary a context shows of them
``replies``        contexts, handoffs and the emergency fold of an overflow
``writes``         a note's buffers and a found landmark, into the store
``live``           what is kept of each session served here
``registry``       the sessions served here, and the background task group
=================  ==========================================================
"""

from voice_context.manager.indexing import EMBED_BATCH, INDEX_BATCH, INDEX_WAIT
from voice_context.manager.live import CompactionEvent, Listener, Opened
from voice_context.manager.recall import OLDER_READS
from voice_context.manager.registry import SERVER, SUMMARIZER
from voice_context.manager.replicas import OPEN_ATTEMPTS
from voice_context.manager.replies import older_chars
from voice_context.manager.sessions import SessionManager
from voice_context.manager.tiers import TIER_CHECK_SECONDS

__all__ = [
    "EMBED_BATCH",
    "INDEX_BATCH",
    "INDEX_WAIT",
    "OLDER_READS",
    "OPEN_ATTEMPTS",
    "SERVER",
    "SUMMARIZER",
    "TIER_CHECK_SECONDS",
    "CompactionEvent",
    "Listener",
    "Opened",
    "SessionManager",
    "older_chars",
]
