"""What a session remembers, for people: the read-only inspector `voice-context serve` shows.

``GET /inspector`` is one page (``inspector.html``, no outside scripts or styles) that
polls two JSON views every second:

- ``GET /inspector/api/sessions``: the live sessions (those this token may see), each
  with its counters;
- ``GET /inspector/api/sessions/{name}``: one session's timeline: the turns from the
  cursor on (the verbatim window, each with its index), the cursor and the fold in
  flight, the folds and failures as they landed, the summary's dated lines, the
  screen notes live and pending, the landmarks, and the last context a bot received.

The views read the live sessions as they are; they never change anything. With
``auth_tokens`` configured every request needs a token (``Authorization: Bearer``, or
``?token=`` for a browser), and a token sees only the sessions opened with it.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from importlib import resources
from typing import Any

from voice_context.core.budget import Context
from voice_context.core.turns import Note
from voice_context.manager import CompactionEvent, SessionManager

__all__ = ["Journal", "page", "session_list", "session_view"]

EVENTS_KEPT = 50
"""The newest folds and failures kept per session."""
SESSIONS_KEPT = 10_000
"""Sessions whose events and last context are kept (the least recently active go first)."""


class Journal:
    """What the views show beyond a session's own state: its folds as they landed and the
    last context a bot received, for the most recently active sessions."""

    def __init__(self) -> None:
        self.events: OrderedDict[str, deque[dict[str, Any]]] = OrderedDict()
        self.contexts: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def __repr__(self) -> str:
        return f"<Journal sessions={len(self.events)} contexts={len(self.contexts)}>"

    def compaction(self, event: CompactionEvent) -> None:
        kept = self.events.get(event.session)
        if kept is None:
            kept = self.events[event.session] = deque(maxlen=EVENTS_KEPT)
        self.events.move_to_end(event.session)
        kept.append(
            {
                "at": time.time(),
                "kind": event.kind,
                "old_cursor": event.old_cursor,
                "cursor": event.cursor,
                "summary_chars": event.summary_chars,
                "latency": round(event.latency, 4),
                "trigger": event.trigger,
                "error": event.error,
            }
        )
        _trim(self.events)

    def context(self, session: str, ctx: Context) -> None:
        self.contexts[session] = {
            "at": time.time(),
            "format": ctx.format,
            "chars": ctx.chars,
            "budget_chars": ctx.budget_chars,
            "tokens": ctx.tokens,
            "first_turn": ctx.first_turn,
            "turns_shown": ctx.turns_shown,
            "summary_chars": len(ctx.summary),
            "query": ctx.query,
            "recalled": [r.line for r in ctx.recalled],
            "dropped": list(ctx.dropped),
            "text": ctx.instructions
            if ctx.format == "instructions"
            else "\n\n".join(f"[{m['role']}] {m.get('content') or ''}" for m in ctx.messages),
        }
        self.contexts.move_to_end(session)
        _trim(self.contexts)


def _trim(kept: OrderedDict[str, Any]) -> None:
    while len(kept) > SESSIONS_KEPT:
        kept.popitem(last=False)


def session_list(manager: SessionManager, owner: str | None) -> list[dict[str, Any]]:
    """The live sessions ``owner`` may see (all of them without tokens), with their counters."""
    out = []
    for name in sorted(manager.names()):
        held_by = manager.owner(name)
        if owner is not None and held_by != owner:
            continue
        stats = manager.session(name, owner=held_by).stats()
        out.append(
            {
                "session": name,
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
    return out


def _note(note: Note) -> dict[str, Any]:
    return {"at": note.at, "text": note.render()}


def session_view(manager: SessionManager, name: str, owner: str | None, journal: Journal) -> dict[str, Any]:
    """One session's timeline (raises ``UnknownSession`` for one ``owner`` may not see)."""
    session = manager.session(name, owner=owner)
    stats = session.stats()
    first = session.total_turns - len(session.verbatim_turns)
    return {
        "session": name,
        "turns": stats.turns,
        "cursor": stats.cursor,
        "in_flight": stats.in_flight,
        "failures": stats.failures,
        "compactions": stats.compactions,
        "recent_window": session.config.recent_window,
        "verbatim": [
            {"index": first + k, "speaker": t.speaker, "role": t.role, "text": t.text, "at": t.at}
            for k, t in enumerate(session.verbatim_turns)
        ],
        "summary": [line for line in session.summary.split("\n") if line.strip()],
        "live_notes": [_note(n) for n in session.live_notes],
        "pending_notes": [_note(n) for n in session.pending_notes],
        "landmarks": [
            {"index": lm.index, "kind": lm.kind, "source": lm.source, "text": lm.turn.text}
            for lm in session.landmarks
        ],
        "events": list(journal.events.get(name, ())),
        "last_context": journal.contexts.get(name),
    }


def page() -> bytes:
    """The inspector's one HTML page."""
    return resources.files("voice_context").joinpath("inspector.html").read_bytes()
