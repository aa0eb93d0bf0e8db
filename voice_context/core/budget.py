"""Build a reply's context under a char budget, by priority.

Two shapes come out of the same snapshot:

- ``messages``: OpenAI chat messages. System messages for the base
  instructions, the durable facts, "Earlier in this session: <summary>" and the
  live screen notes, then the verbatim turns from the cursor, the current turn
  last. ``chars`` counts the characters of every message's content.
- ``instructions``: one realtime ``instructions`` string: the base
  instructions, then sections for the durable facts, the session summary, the
  screen notes and the recent conversation. ``chars`` is its length.

When the budget is tight, parts are kept in this order, and whatever does not
fit is left out whole (turns) or cut at a sentence or word boundary (the
summary, and the current turn when it alone is larger than the budget):

1. the base instructions,
2. the current turn,
3. the ``priority_turns`` most recent verbatim turns, newest first,
4. the durable facts,
5. the session summary (its newest sentences first),
6. the live screen notes, newest first,
7. the older verbatim turns back to the cursor, newest first.

Verbatim turns are always a contiguous run ending at the current turn: a cut
falls at a turn boundary, never inside a turn and never leaving a hole. Nothing
returned is longer than the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from voice_context.core.session import ContextView
from voice_context.core.text import clip, keep_newest_sentences
from voice_context.core.turns import Note, Turn

Format = Literal["messages", "instructions"]
FORMATS: frozenset[str] = frozenset({"messages", "instructions"})
SUMMARY_PREFIX = "Earlier in this session: "
FACTS_HEADER = "Durable facts:"
SUMMARY_HEADER = "Session conversation summary:"
NOTES_HEADER = "Screen notes:"
RECENT_HEADER = "Recent conversation:"
Message = dict[str, str]


def estimate_tokens(chars: int) -> int:
    """A provider-neutral token estimate: about four characters a token."""
    return (chars + 3) // 4


@dataclass(frozen=True, slots=True)
class Context:
    """What a bot gets back for one reply.

    ``first_turn`` is the index of the oldest verbatim turn shown (equal to
    ``cursor`` when nothing was cut); ``summary`` is the summary as included,
    which may be its newest sentences only when the budget was tight.
    """

    format: Format
    cursor: int
    covered_through: int
    summary: str
    chars: int
    first_turn: int
    turns_shown: int
    messages: tuple[Message, ...] = ()
    instructions: str = ""
    budget_chars: int | None = None
    dropped: tuple[str, ...] = field(default=())


@dataclass(slots=True)
class _Parts:
    """The chosen content; rendering it is a pure function of this."""

    base: str = ""
    facts: list[str] = field(default_factory=list)
    summary: str = ""
    notes: list[str] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # newest first while choosing
    turn_roles: list[str] = field(default_factory=list)

    def copy(self) -> _Parts:
        return _Parts(
            self.base,
            list(self.facts),
            self.summary,
            list(self.notes),
            list(self.turns),
            list(self.turn_roles),
        )


def _turn_line(turn: Turn) -> str:
    return f"{turn.speaker}: {turn.text}" if turn.speaker else turn.text


def _turn_message(turn: Turn, text: str) -> Message:
    if turn.role == "user":
        return {"role": "user", "content": f"{turn.speaker}: {text}" if turn.speaker else text}
    if turn.role == "assistant":
        return {"role": "assistant", "content": text}
    label = f"{turn.speaker} ({turn.role})" if turn.speaker else turn.role
    return {"role": "system", "content": f"{label}: {text}"}


def _render_instructions(parts: _Parts) -> str:
    sections: list[str] = []
    if parts.base:
        sections.append(parts.base)
    if parts.facts:
        sections.append(FACTS_HEADER + "\n" + "\n".join(f"- {fact}" for fact in parts.facts))
    if parts.summary:
        sections.append(SUMMARY_HEADER + "\n" + parts.summary)
    if parts.notes:
        sections.append(NOTES_HEADER + "\n" + "\n".join(f"- {note}" for note in reversed(parts.notes)))
    if parts.turns:
        sections.append(RECENT_HEADER + "\n" + "\n".join(reversed(parts.turns)))
    return "\n\n".join(sections)


def _messages(parts: _Parts, chosen_turns: Sequence[Turn]) -> list[Message]:
    out: list[Message] = []
    if parts.base:
        out.append({"role": "system", "content": parts.base})
    if parts.facts:
        out.append(
            {"role": "system", "content": FACTS_HEADER + "\n" + "\n".join(f"- {f}" for f in parts.facts)}
        )
    if parts.summary:
        out.append({"role": "system", "content": SUMMARY_PREFIX + parts.summary})
    if parts.notes:
        body = "\n".join(f"- {note}" for note in reversed(parts.notes))
        out.append({"role": "system", "content": NOTES_HEADER + "\n" + body})
    texts = list(reversed(parts.turns))
    for turn, text in zip(chosen_turns, texts, strict=True):
        out.append(_turn_message(turn, text))
    return out


def build_context(
    view: ContextView,
    format: Format,
    *,
    budget_chars: int | None = None,
    base_instructions: str = "",
    facts: Sequence[str] = (),
) -> Context:
    """Assemble the context for one reply; see the module docstring for the rules.

    ``budget_chars`` defaults to the session's ``instructions_budget_chars`` for
    ``instructions`` and to no budget for ``messages``. Raises ``ValueError``
    for an unknown format or a negative budget.
    """
    if format not in FORMATS:
        raise ValueError(f"unknown context format {format!r}")
    if budget_chars is None and format == "instructions":
        budget_chars = view.config.instructions_budget_chars
    if budget_chars is not None and budget_chars < 0:
        raise ValueError("budget_chars must be >= 0")
    config = view.config
    turns = view.turns
    turn_texts = [clip(t.text, config.max_turn_chars) for t in turns]

    if format == "instructions":

        def size(parts: _Parts) -> int:
            return len(_render_instructions(parts))

        def line(i: int, text: str) -> str:
            return _turn_line(Turn(turns[i].speaker, turns[i].role, text, turns[i].at))

    else:

        def size(parts: _Parts) -> int:
            chosen = turns[len(turns) - len(parts.turns) :] if parts.turns else ()
            return sum(len(m["content"]) for m in _messages(parts, chosen))

        def line(i: int, text: str) -> str:
            return text

    limit = budget_chars if budget_chars is not None else -1
    parts = _Parts()
    dropped: list[str] = []

    def fits(candidate: _Parts) -> bool:
        return limit < 0 or size(candidate) <= limit

    def room(with_empty: _Parts) -> int:
        """How many content chars an item may take, given its rendering with empty content."""
        return limit - size(with_empty) if limit >= 0 else 1 << 30

    def add_clipped(setter: Callable[[_Parts, str], None], text: str, cut: Callable[[str, int], str]) -> bool:
        trial = parts.copy()
        setter(trial, text)
        if fits(trial):
            setter(parts, text)
            return True
        empty = parts.copy()
        setter(empty, "")
        space = room(empty)
        if space <= 0:
            return False
        short = cut(text, space)
        if not short:
            return False
        trial = parts.copy()
        setter(trial, short)
        if not fits(trial):  # pragma: no cover - rendering is linear in content
            return False
        setter(parts, short)
        return True

    # 1. base instructions
    if base_instructions and not add_clipped(lambda p, t: setattr(p, "base", t), base_instructions, clip):
        dropped.append("base_instructions")

    # 2 + 3 + 7. turns, newest first, contiguous
    def add_turn(i: int) -> bool:
        trial = parts.copy()
        trial.turns.append(line(i, turn_texts[i]))
        if fits(trial):
            parts.turns.append(line(i, turn_texts[i]))
            return True
        return False

    n = len(turns)
    next_turn = n - 1
    stopped = False
    if n:
        # the current turn: clipped to the budget if it alone is too long
        def set_current(p: _Parts, text: str) -> None:
            p.turns = [line(n - 1, text)]

        prefix_len = len(line(n - 1, ""))
        if add_clipped(
            set_current, turn_texts[-1], lambda t, k: clip(t, k - prefix_len) if k > prefix_len else ""
        ):
            next_turn = n - 2
        else:
            stopped = True
            dropped.append("current_turn")
    priority_floor = max(0, n - max(1, config.priority_turns))
    while not stopped and next_turn >= priority_floor:
        if not add_turn(next_turn):
            stopped = True
            break
        next_turn -= 1

    # 4. durable facts
    for fact in facts:
        trial = parts.copy()
        trial.facts.append(fact)
        if fits(trial):
            parts.facts.append(fact)
        else:
            dropped.append("facts")
            break

    # 5. summary, newest sentences first
    if view.summary and not add_clipped(
        lambda p, t: setattr(p, "summary", t), view.summary, keep_newest_sentences
    ):
        dropped.append("summary")
    elif view.summary and parts.summary != view.summary:
        dropped.append("summary_head")

    # 6. live screen notes, newest first
    for note in reversed(view.live_notes):
        trial = parts.copy()
        trial.notes.append(_note_line(note))
        if fits(trial):
            parts.notes.append(_note_line(note))
        else:
            dropped.append("notes")
            break

    # 7. older verbatim turns back to the cursor
    while not stopped and next_turn >= 0:
        if not add_turn(next_turn):
            stopped = True
            break
        next_turn -= 1
    if stopped and len(parts.turns) < n:
        dropped.append("older_turns")

    shown = len(parts.turns)
    chosen = turns[n - shown :] if shown else ()
    first_turn = view.cursor + n - shown
    if format == "instructions":
        text = _render_instructions(parts)
        return Context(
            format,
            view.cursor,
            view.covered_through,
            parts.summary,
            len(text),
            first_turn,
            shown,
            instructions=text,
            budget_chars=budget_chars,
            dropped=tuple(dropped),
        )
    messages = _messages(parts, chosen)
    chars = sum(len(m["content"]) for m in messages)
    return Context(
        format,
        view.cursor,
        view.covered_through,
        parts.summary,
        chars,
        first_turn,
        shown,
        messages=tuple(messages),
        budget_chars=budget_chars,
        dropped=tuple(dropped),
    )


def _note_line(note: Note) -> str:
    return note.render()
