"""Handing a session to a fresh provider session: the open questions, and the instructions.

Realtime providers end a session after a while (OpenAI Realtime, Gemini Live): the
bot opens a new one, and the new one knows nothing. A handoff gives it what it needs
to go on as if nothing happened: the context as realtime ``instructions`` within the
provider's limit, the last turns, and the questions still open, the ones asked and
never answered, which the old session would have picked up next.

A question is open when a turn asks it (its last sentence ends with ``?``) and no
later turn of the conversation comes from anyone else: a reply of any kind closes
it, even "I don't know". Only the verbatim turns are read (what the summary folded
was answered or forgotten long ago). Pure: no clock, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from voice_context.core.landmarks import stamp
from voice_context.core.text import normalize, sentences
from voice_context.core.turns import Turn

__all__ = [
    "LAST_TURNS",
    "MAX_OPEN_QUESTIONS",
    "OPEN_QUESTIONS_HEADER",
    "Handoff",
    "OpenQuestion",
    "fit_questions",
    "open_questions",
    "render_questions",
]

OPEN_QUESTIONS_HEADER = "Open questions (asked in this conversation and not answered yet):"
MAX_OPEN_QUESTIONS = 5
"""At most this many open questions, the newest."""
LAST_TURNS = 6
"""The newest turns a handoff carries as items, by default."""
MAX_QUESTION_CHARS = 300
"""A question longer than this is shown cut at a word (with ``…``)."""


@dataclass(frozen=True, slots=True)
class OpenQuestion:
    """A question asked at transcript ``index`` that nobody else answered after it."""

    index: int
    speaker: str
    text: str
    at: float


@dataclass(frozen=True, slots=True)
class Handoff:
    """What a fresh provider session needs: ``instructions`` (the context, then the open
    questions) within ``limit_chars``, the ``last_turns`` by transcript index, the questions."""

    instructions: str
    limit_chars: int
    last_turns: tuple[tuple[int, Turn], ...]
    open_questions: tuple[OpenQuestion, ...]
    cursor: int
    turns: int
    recalled: int = 0

    @property
    def chars(self) -> int:
        return len(self.instructions)


def fit_questions(questions: Sequence[OpenQuestion], limit_chars: int) -> tuple[list[OpenQuestion], str]:
    """The newest questions whose section takes at most a quarter of ``limit_chars``, and that section."""
    kept = list(questions)
    section = render_questions(kept)
    while kept and len(section) + 2 > limit_chars // 4:
        kept = kept[1:]
        section = render_questions(kept)
    return kept, section


def _question(text: str) -> str | None:
    """The sentence that asks, when the turn ends by asking something."""
    said = normalize(text).replace("\n", " ").strip()
    if not said.rstrip("\"')”’ ").endswith("?"):
        return None
    parts = sentences(said)
    asked = parts[-1] if parts else said
    if len(asked) > MAX_QUESTION_CHARS:
        cut = asked[:MAX_QUESTION_CHARS].rsplit(" ", 1)[0]
        asked = f"{cut} …"
    return asked


def open_questions(
    turns: Sequence[Turn], first_index: int, limit: int = MAX_OPEN_QUESTIONS
) -> list[OpenQuestion]:
    """The questions among ``turns`` (the first at transcript ``first_index``) that no later turn
    from another speaker followed, oldest first, at most ``limit`` (the newest)."""
    found: list[OpenQuestion] = []
    later_speakers: set[str] = set()
    for offset in range(len(turns) - 1, -1, -1):
        turn = turns[offset]
        if turn.is_tool_call or turn.is_tool_result:
            continue
        speaker = turn.speaker
        if later_speakers - {speaker}:  # someone else spoke after it: asked and answered
            later_speakers.add(speaker)
            continue
        asked = _question(turn.text)
        if asked is not None:
            found.append(OpenQuestion(first_index + offset, speaker, asked, turn.at))
            if len(found) >= limit:
                break
        later_speakers.add(speaker)
    return found[::-1]


def render_questions(questions: Sequence[OpenQuestion]) -> str:
    """The open questions as the section a handoff's instructions end with (``""`` for none)."""
    if not questions:
        return ""
    lines = [f"- [{stamp(q.at)}] {q.speaker}: {q.text}" for q in questions]
    return OPEN_QUESTIONS_HEADER + "\n" + "\n".join(lines)
