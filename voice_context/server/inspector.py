"""What a session remembers, and why a bot got the context it got: the read-only inspector
`voice-context serve` shows.

``GET /inspector`` is one page (``inspector.html``, no outside scripts or styles; its icon,
:data:`ICON`, the server answers at ``/favicon.ico``) that polls three JSON views:

- ``GET /inspector/api/sessions``: the sessions this token may see: those held open here
  (``live``) and those the store keeps (read from the store, never opened or held here);
- ``GET /inspector/api/sessions/{name}``: one session's timeline: the turns from the
  cursor on (each with its index), the cursor and the fold in flight, the summary's lines
  (each with the fold that made it), the folds and failures as they landed (each with the
  turns it folded and the lines it made), the screen notes, the landmarks, and the recent
  contexts a bot received (newest first, with what changed from the one before); the one
  asked for with ``?context=SEQ`` (the newest by default) is explained: its query, each
  recalled passage with why it ranked, what recall offered that was left out and why, the
  parts dropped, and what each part of the context took of its budget;
- ``GET /inspector/api/sessions/{name}/turns?start=A&end=B``: turns ``A .. B-1`` as the
  store keeps them (the ones a fold folded), at most :data:`TURNS_READ` at a time.

The views never change anything: a stored session is read, not opened, so its owner, its
expiry and whoever holds it elsewhere stay as they are. With ``auth_tokens`` configured
every request needs a token (``Authorization: Bearer``, or ``?token=`` for a browser), and
a token sees only its own sessions, stored ones included.

Every time shown is session time: the ``at`` the client sent with each turn and note (UTC),
in seconds in the views, and on the page written as a context dates its lines
(``8 May 2023, 13:56``, :func:`voice_context.core.times.stamp`). A context and a fold are
dated by the newest turn the session held when it happened, and numbered (``seq``) in the
order they happened here. Each passage recall offered carries its rank and its score over
the best one's of its kind (``of_best``): recall's own scores compare only with each other.

What the :class:`Journal` keeps costs little per reply: a reference to the context the bot
got (already built; nothing is copied or rendered again), at most :data:`CONTEXTS_KEPT` per
session and about :data:`CONTEXT_CHARS_KEPT` chars of them in all. Explanations (the words a
passage matched, what changed between two contexts) are worked out when a view is read.
"""

from __future__ import annotations

import itertools
import re
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, NamedTuple

from voice_context.core.budget import Context
from voice_context.core.config import SessionConfig
from voice_context.core.landmarks import Landmark
from voice_context.core.recalled import Recalled
from voice_context.core.session import Session
from voice_context.core.turns import Note, Turn
from voice_context.errors import ConfigError, UnknownSession
from voice_context.manager import CompactionEvent, SessionManager
from voice_context.recall.dates import date_terms, query_date_terms
from voice_context.recall.index import index_terms
from voice_context.store.base import SessionRecord, Store

__all__ = [
    "CONTEXTS_KEPT",
    "ICON",
    "Journal",
    "folded_turns",
    "page",
    "session_list",
    "session_view",
]

CONTEXTS_KEPT = 20
"""The newest contexts kept per session."""
EVENTS_KEPT = 50
"""The newest folds and failures kept per session."""
SESSIONS_KEPT = 10_000
"""Sessions whose contexts and folds are kept (the least recently active go first)."""
CONTEXT_CHARS_KEPT = 32_000_000
"""About how many chars of contexts are kept in all: past it, the oldest contexts of the least
recently active sessions go first (the newest context of the most recent session always stays)."""
STORED_LISTED = 500
"""At most this many stored sessions are listed."""
TURNS_READ = 200
"""At most this many folded turns are read from the store at a time."""
TIME_BASE = (
    "session time (UTC): the 'at' the client sent with each turn and note; a context or a fold"
    " is dated by the newest turn the session held then"
)

ICON = (
    b'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16">'
    b'<rect width="16" height="16" rx="3" fill="#2a5db0"/>'
    b'<path d="M4 6.5v3M6.7 4v8M9.3 5.5v5M12 7v2" stroke="#fff" stroke-width="1.6" stroke-linecap="round"/>'
    b"</svg>"
)
"""The inspector's icon (an SVG: a few bars of a voice), which the server answers at
``/favicon.ico``: the page links it, and a browser asks for it on a JSON view too."""

_STAMP = re.compile(r"^\[[^\]]*\] ")
_DROPPED = {
    "base_instructions": "the base instructions were cut to fit the budget",
    "current_turn": "the current turn did not fit the budget",
    "landmarks": "pinned landmarks did not fit",
    "facts": "durable facts did not fit",
    "summary_head": "the summary was cut to its newest sentences",
    "summary": "the summary did not fit",
    "notes": "screen notes did not fit",
    "older_turns": "turns from the cursor on did not fit the budget: no summary covers them yet",
}


@dataclass(slots=True)
class _Seen:
    """A context as kept: a reference to what the bot got, and what explains it."""

    seq: int
    at: float | None
    ctx: Context
    config: SessionConfig


@dataclass(slots=True)
class _Fold:
    """A fold or a failure as it landed, with the summary lines the fold made (``None``:
    not known, the summary before it was never seen here)."""

    seq: int
    at: float | None
    event: CompactionEvent
    made: tuple[str, ...] | None


@dataclass(slots=True)
class _Kept:
    owner: str | None
    contexts: deque[_Seen] = field(default_factory=lambda: deque(maxlen=CONTEXTS_KEPT))
    folds: deque[_Fold] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    summary: str | None = None
    """The summary as last seen: a fold's lines are those its summary adds to it."""


class Journal:
    """What the views show beyond a session's own state: its recent contexts and its folds as
    they landed, for the most recently active sessions. :meth:`attach` it to the manager."""

    def __init__(self) -> None:
        self._sessions: OrderedDict[str, _Kept] = OrderedDict()
        self._seq = itertools.count(1)
        self._manager: SessionManager | None = None
        self.chars = 0
        """Chars of the contexts kept."""

    def __repr__(self) -> str:
        contexts = sum(len(k.contexts) for k in self._sessions.values())
        return f"<Journal sessions={len(self._sessions)} contexts={contexts} chars={self.chars}>"

    def attach(self, manager: SessionManager) -> None:
        """Follow ``manager``'s folds (and read its sessions' time and summary as they land)."""
        self._manager = manager
        manager.add_listener(self.compaction)

    def _live(self, name: str) -> tuple[Session, str | None] | None:
        manager = self._manager
        if manager is None:
            return None
        try:
            owner = manager.owner(name)
            return manager.session(name, owner=owner), owner
        except UnknownSession:
            return None

    def _kept(self, name: str, owner: str | None) -> _Kept:
        kept = self._sessions.get(name)
        if kept is None or kept.owner != owner:  # a name deleted and made again: nothing carries over
            if kept is not None:
                self.chars -= sum(seen.ctx.chars for seen in kept.contexts)
            kept = self._sessions[name] = _Kept(owner)
        self._sessions.move_to_end(name)
        while len(self._sessions) > SESSIONS_KEPT:
            _, gone = self._sessions.popitem(last=False)
            self.chars -= sum(seen.ctx.chars for seen in gone.contexts)
        return kept

    def context(self, name: str, ctx: Context) -> None:
        """Keep the context a bot just got for session ``name`` (held open by the manager)."""
        found = self._live(name)
        if found is None:
            return
        session, owner = found
        kept = self._kept(name, owner)
        if kept.summary is None:
            kept.summary = session.summary
        if len(kept.contexts) == CONTEXTS_KEPT:
            self.chars -= kept.contexts[0].ctx.chars
        kept.contexts.append(_Seen(next(self._seq), _newest_at(session), ctx, session.config))
        self.chars += ctx.chars
        if self.chars > CONTEXT_CHARS_KEPT:
            self._shed(name)

    def _shed(self, newest: str) -> None:
        for name, kept in self._sessions.items():  # the least recently active first
            while kept.contexts and self.chars > CONTEXT_CHARS_KEPT:
                if name == newest and len(kept.contexts) == 1:
                    return
                self.chars -= kept.contexts.popleft().ctx.chars
            if self.chars <= CONTEXT_CHARS_KEPT:
                return

    def compaction(self, event: CompactionEvent) -> None:
        """A manager listener: keep a fold (with the lines it made) or a failure."""
        found = self._live(event.session)
        if found is None:
            return
        session, owner = found
        kept = self._kept(event.session, owner)
        made: tuple[str, ...] | None = ()
        if event.kind == "completed":
            summary = session.summary
            if kept.summary is not None:
                before = set(summary_lines(kept.summary))
                made = tuple(line for line in summary_lines(summary) if line not in before)
            elif event.old_cursor == 0:  # the first fold: every line is its own
                made = tuple(summary_lines(summary))
            else:
                made = None
            kept.summary = summary
        kept.folds.append(_Fold(next(self._seq), _newest_at(session), event, made))

    def forget(self, name: str) -> None:
        """The session was deleted: nothing of it is shown again."""
        kept = self._sessions.pop(name, None)
        if kept is not None:
            self.chars -= sum(seen.ctx.chars for seen in kept.contexts)

    def kept(self, name: str, owner: str | None) -> _Kept | None:
        """What is kept of session ``name`` while it belongs to ``owner``."""
        kept = self._sessions.get(name)
        return kept if kept is not None and kept.owner == owner else None


def _newest_at(session: Session) -> float | None:
    """The session's time now: when its newest turn was said (read without copying its turns)."""
    last = session.total_turns - 1
    return session.turn(last).at if last >= session.cursor else None


def summary_lines(summary: str) -> list[str]:
    """A summary's lines as the inspector shows them (blank lines left out)."""
    return [line for line in summary.split("\n") if line.strip()]


# -- the views ----------------------------------------------------------------------------


async def session_list(manager: SessionManager, store: Store, owner: str | None) -> list[dict[str, Any]]:
    """The sessions of ``owner`` (``None``: those opened without a token): those held open here,
    with their counters, then those the store keeps (at most :data:`STORED_LISTED`), by name."""
    out: list[dict[str, Any]] = []
    live = set(manager.names())
    for name in sorted(live):
        if manager.owner(name) != owner:
            continue
        stats = manager.session(name, owner=owner).stats()
        out.append(
            {
                "session": name,
                "live": True,
                "turns": stats.turns,
                "cursor": stats.cursor,
                "in_flight": stats.in_flight is not None,
                "summary_chars": stats.summary_chars,
                "live_notes": stats.live_notes,
                "pending_notes": stats.pending_notes,
                "failures": stats.failures,
                "compactions": stats.compactions,
                "landmarks": stats.landmarks,
            }
        )
    for stored in await store.list_sessions(owner, STORED_LISTED):
        if stored.name not in live:
            out.append(
                {
                    "session": stored.name,
                    "live": False,
                    "turns": stored.turns,
                    "cursor": stored.cursor,
                    "in_flight": False,
                }
            )
    return out


@dataclass(frozen=True, slots=True)
class _Snapshot:
    """What a view shows of a session, live or stored."""

    name: str
    live: bool
    owner: str | None
    turns: int
    cursor: int
    in_flight: int | None
    failures: int
    compactions: int
    config: SessionConfig
    verbatim: tuple[Turn, ...]
    summary: str
    live_notes: tuple[Note, ...]
    pending_notes: tuple[Note, ...]
    landmarks: tuple[Landmark, ...]


async def _snapshot(manager: SessionManager, store: Store, name: str, owner: str | None) -> _Snapshot:
    """Session ``name`` of ``owner``: the one held open here, else the store's (read only).
    Raises ``UnknownSession`` for none, or another owner's."""
    if name in manager.names():
        session = manager.session(name, owner=owner)  # UnknownSession: another owner's
        stats = session.stats()
        return _Snapshot(
            name,
            True,
            owner,
            stats.turns,
            stats.cursor,
            stats.in_flight,
            stats.failures,
            stats.compactions,
            session.config,
            session.verbatim_turns,
            session.summary,
            session.live_notes,
            session.pending_notes,
            session.landmarks,
        )
    record = await store.load(name)
    if record is None or record.owner != owner:
        raise UnknownSession(name)
    return _Snapshot(
        name,
        False,
        record.owner,
        record.total_turns,
        record.cursor,
        None,
        record.failures,
        record.compactions,
        _config(manager, record),
        record.turns,
        record.summary,
        record.live_notes,
        record.pending_notes,
        await store.load_landmarks(name),
    )


def _config(manager: SessionManager, record: SessionRecord) -> SessionConfig:
    try:
        return manager.config.with_overrides(record.config)
    except ConfigError:  # overrides this version no longer takes: the defaults show
        return manager.config


async def session_view(
    manager: SessionManager,
    store: Store,
    journal: Journal,
    name: str,
    owner: str | None,
    chosen: int | None = None,
) -> dict[str, Any]:
    """One session's timeline, with context ``chosen`` (a ``seq``; the newest by default)
    explained. Raises ``UnknownSession`` for a session ``owner`` may not see."""
    snap = await _snapshot(manager, store, name, owner)
    kept = journal.kept(name, snap.owner)
    folds = list(kept.folds) if kept is not None else []
    contexts = list(kept.contexts) if kept is not None else []
    first = snap.turns - len(snap.verbatim)
    lines = summary_lines(snap.summary)
    made_by: dict[str, _Fold] = {}
    for fold in folds:  # a line made again by a later fold is that one's
        for line in fold.made or ():
            made_by[line] = fold
    present = set(lines)
    picked = next((seen for seen in contexts if seen.seq == chosen), contexts[-1] if contexts else None)
    return {
        "session": name,
        "live": snap.live,
        "time_base": TIME_BASE,
        "turns": snap.turns,
        "cursor": snap.cursor,
        "in_flight": snap.in_flight,
        "failures": snap.failures,
        "compactions": snap.compactions,
        "recent_window": snap.config.recent_window,
        "verbatim": [
            {"index": first + k, "speaker": t.speaker, "role": t.role, "text": t.text, "at": t.at}
            for k, t in enumerate(snap.verbatim)
        ],
        "summary": [_summary_line(line, made_by.get(line)) for line in lines],
        "folds": [_fold(fold, present) for fold in reversed(folds)],
        "live_notes": [_note(n) for n in snap.live_notes],
        "pending_notes": [_note(n) for n in snap.pending_notes],
        "landmarks": [
            {"index": lm.index, "kind": lm.kind, "source": lm.source, "text": lm.turn.text}
            for lm in snap.landmarks
        ],
        "contexts": [
            _history(seen, contexts[k - 1] if k else None) for k, seen in reversed(list(enumerate(contexts)))
        ],
        "context": _explain(picked, manager.embedder is not None) if picked is not None else None,
    }


async def folded_turns(
    manager: SessionManager, store: Store, name: str, owner: str | None, start: int, end: int
) -> dict[str, Any]:
    """Turns ``start .. end-1`` of a session ``owner`` may see, as the store keeps them (at most
    :data:`TURNS_READ`). Raises ``UnknownSession`` for a session ``owner`` may not see."""
    await _snapshot(manager, store, name, owner)
    start = max(0, start)
    end = min(end, start + TURNS_READ)
    turns = await store.read_turns(name, start, end) if end > start else []
    return {
        "session": name,
        "start": start,
        "turns": [
            {"index": start + k, "speaker": t.speaker, "role": t.role, "text": t.text, "at": t.at}
            for k, t in enumerate(turns)
        ],
    }


def _note(note: Note) -> dict[str, Any]:
    return {"at": note.at, "text": note.render()}


def _summary_line(line: str, fold: _Fold | None) -> dict[str, Any]:
    out: dict[str, Any] = {"text": line, "fold": None}
    if fold is not None:
        out["fold"] = fold.seq
        out["turns"] = _folded_range(fold.event)
    return out


def _folded_range(event: CompactionEvent) -> list[int]:
    start = event.old_cursor if event.old_cursor is not None else event.cursor
    return [start, event.cursor - 1]


def _fold(fold: _Fold, present: set[str]) -> dict[str, Any]:
    e = fold.event
    out: dict[str, Any] = {
        "seq": fold.seq,
        "at": fold.at,
        "kind": e.kind,
        "cursor": e.cursor,
        "summary_chars": e.summary_chars,
        "latency": round(e.latency, 4),
        "trigger": e.trigger,
        "error": e.error,
    }
    if e.kind == "completed":
        out["turns"] = _folded_range(e)
        out["made"] = len(fold.made) if fold.made is not None else None
        out["still_shown"] = sum(line in present for line in fold.made or ())
    return out


def _last_turn(ctx: Context) -> int:
    return ctx.first_turn + ctx.turns_shown - 1


def _history(seen: _Seen, before: _Seen | None) -> dict[str, Any]:
    ctx = seen.ctx
    return {
        "seq": seen.seq,
        "at": seen.at,
        "format": ctx.format,
        "chars": ctx.chars,
        "budget_chars": ctx.budget_chars,
        "budget_tokens": ctx.budget_tokens,
        "tokens": ctx.tokens,
        "query": ctx.query,
        "turns": [ctx.first_turn, _last_turn(ctx)] if ctx.turns_shown else None,
        "recalled": len(ctx.recalled),
        "dropped": list(ctx.dropped),
        "changes": changes(before.ctx, ctx) if before is not None else [],
    }


def changes(before: Context, after: Context) -> list[str]:
    """What changed from one context of a session to the next, in words."""
    out: list[str] = []
    if after.cursor != before.cursor:
        out.append(f"a fold moved the cursor {before.cursor} → {after.cursor}")
    new = _last_turn(after) - _last_turn(before)
    if new:
        out.append(f"{new} new turn{'s' if abs(new) != 1 else ''} since")
    if after.first_turn != before.first_turn:
        out.append(f"verbatim from turn {before.first_turn} → {after.first_turn}")
    if after.query != before.query:
        out.append(f"query {_quote(before.query)} → {_quote(after.query)}")
    was = {r.line for r in before.recalled}
    now = {r.line for r in after.recalled}
    came, went = len(now - was), len(was - now)
    if came or went:
        out.append(f"recall: {came} passage{'s' if came != 1 else ''} in, {went} out")
    if after.summary != before.summary:
        out.append(f"summary {len(before.summary)} → {len(after.summary)} chars")
    for part in after.dropped:
        if part not in before.dropped:
            out.append(f"now dropped: {part}")
    for part in before.dropped:
        if part not in after.dropped:
            out.append(f"no longer dropped: {part}")
    if after.chars != before.chars:
        out.append(f"{before.chars} → {after.chars} chars")
    return out


def _quote(text: str, limit: int = 40) -> str:
    return f"“{text if len(text) <= limit else text[: limit - 1] + '…'}”"


def _explain(seen: _Seen, embedder: bool) -> dict[str, Any]:
    """Why the bot got this context: the query and its words, each passage recalled with why
    it ranked, what recall offered that is not shown and why, what was dropped, the budget."""
    ctx = seen.ctx
    words = set(index_terms(ctx.query))
    dates = set(query_date_terms(ctx.query, seen.at))
    standing = _standing([*ctx.recalled, *ctx.left_out])

    def offered(r: Recalled) -> dict[str, Any]:
        return _passage(r, standing[id(r)], words, dates, embedder)

    return {
        "seq": seen.seq,
        "at": seen.at,
        "format": ctx.format,
        "query": ctx.query,
        "query_words": sorted(words),
        "chars": ctx.chars,
        "budget_chars": ctx.budget_chars,
        "budget_tokens": ctx.budget_tokens,
        "tokens": ctx.tokens,
        "tokenizer": ctx.tokenizer,
        "cursor": ctx.cursor,
        "turns": [ctx.first_turn, _last_turn(ctx)] if ctx.turns_shown else None,
        "turns_shown": ctx.turns_shown,
        "summary_chars": len(ctx.summary),
        "recalled": [offered(r) for r in ctx.recalled],
        "left_out": [{**offered(r), "left_out": _left_out_reason(r, ctx, seen)} for r in ctx.left_out],
        "dropped": [_dropped(part, ctx) for part in ctx.dropped],
        "sections": [
            {
                "name": s.name,
                "chars": s.chars,
                "share": s.share,
                "tokens": s.tokens,
                "share_tokens": s.share_tokens,
            }
            for s in ctx.sections
        ],
        "text": ctx.instructions
        if ctx.format == "instructions"
        else "\n\n".join(f"[{m['role']}] {m.get('content') or ''}" for m in ctx.messages),
    }


class _Standing(NamedTuple):
    """Where a passage stood among those of its kind recall offered for one query."""

    rank: int
    """1 = the best."""
    of_best: float
    """Its score over the best one's (1.0 for the best): recall's raw scores mean little alone
    (a lexical rank score is 1/61 for the first hit), their ratios compare."""


def _standing(offered: Sequence[Recalled]) -> dict[int, _Standing]:
    """Each passage's standing among those of its kind recall offered: turns and notes are
    ranked together, summary lines apart (their scores are of another scale)."""
    out: dict[int, _Standing] = {}
    for group in (
        [r for r in offered if r.kind != "summary"],
        [r for r in offered if r.kind == "summary"],
    ):
        best = max((r.score for r in group), default=0.0)
        for k, r in enumerate(sorted(group, key=lambda r: -r.score)):
            out[id(r)] = _Standing(k + 1, round(r.score / best, 3) if best > 0 else 0.0)
    return out


def _passage(
    r: Recalled, standing: _Standing, words: set[str], dates: set[str], embedder: bool
) -> dict[str, Any]:
    matched = sorted(words & set(index_terms(_STAMP.sub("", r.line))))
    dated = r.at is not None and bool(dates & set(date_terms(r.at)))
    return {
        "kind": r.kind,
        "turn": r.turn,
        "line": r.line,
        "score": round(r.score, 4),
        "rank": standing.rank,
        "of_best": standing.of_best,
        "granularity": r.granularity if r.kind == "turn" else None,
        "matched": matched,
        "dated": dated,
        "why": _why(r, matched, dated, embedder),
    }


def _why(r: Recalled, matched: Iterable[str], dated: bool, embedder: bool) -> str:
    words = ", ".join(matched)
    if r.kind == "summary":
        return f"a summary line holding the query's words: {words}"
    reasons = []
    if words:
        reasons.append(f"holds the query's words {words}")
    if dated:
        reasons.append("was said on a day the query names")
    if not reasons:
        beside = "the turn beside it matched (a question and its answer share a topic)"
        reasons.append(beside + (", or the embedder found it close in meaning" if embedder else ""))
    if r.granularity == "sentences":
        reasons.append("shown as its matching sentences")
    return "; ".join(reasons)


def _left_out_reason(r: Recalled, ctx: Context, seen: _Seen) -> str:
    if r.turn is not None and ctx.turns_shown and r.turn >= ctx.first_turn:
        return "its turn is shown verbatim"
    if r.kind == "summary" and r.line in ctx.summary:
        return "the summary shown holds it"
    if len(ctx.recalled) >= seen.config.recall_limit:
        return f"recall_limit ({seen.config.recall_limit}) passages shown already"
    return "no room left in the budget"


def _dropped(part: str, ctx: Context) -> dict[str, str]:
    why = _DROPPED.get(part, part)
    if part == "older_turns" and ctx.first_turn > ctx.cursor:
        why = (
            f"turns {ctx.cursor}–{ctx.first_turn - 1} (from the cursor on) did not fit the budget:"
            " no summary covers them yet"
        )
    return {"part": part, "why": why}


def page() -> bytes:
    """The inspector's one HTML page."""
    return resources.files("voice_context.server").joinpath("inspector.html").read_bytes()
