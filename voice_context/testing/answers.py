"""A stand-in for a model's words that shows what its prompt held: the examples' model offline.

A statement is acknowledged (``Noted.``); a question is answered with the sentence of the prompt
that shares the most words with it, quoted. So a bot whose prompt carried an old fact answers
with it, and one whose prompt lost it does not: what the reply says is what the memory gave.

    answer("...\\nuser: My booking code is QX7-ALPHA.\\n...", "What was my booking code?")
    # 'From memory: My booking code is QX7-ALPHA.'

:func:`answer_chat` is the same for a chat-completions request (the words of
:class:`~voice_context.testing.openai_server.ReplyWith`); :func:`answer` takes a realtime
session's instructions and the user's words (a
:class:`~voice_context.testing.realtime_server.User`'s ``reply``).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["NOTED", "answer", "answer_chat"]

NOTED = "Noted."
"""The answer to anything that is not a question, or to a question the prompt says nothing about."""

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
# what a line of a context starts with before the words said: a list mark, a date, a speaker
_LEAD = re.compile(r"^(?:-\s*)?(?:\[[^]]*\]\s*)?(?:[\w .'-]{1,40}:\s+)?")
_WORD = re.compile(r"[a-z0-9][a-z0-9-]*")
_FILLER = frozenset(
    "again and are can did does for from give had has have how me my our please tell that the this "
    "was what when where which who why with you your".split()
)


def _words(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if len(w) > 2 and w not in _FILLER}


def answer(prompt: str, question: str) -> str:
    """What the stand-in says to ``question`` with ``prompt`` before it: for a question (ending
    in ``?``), the prompt's sentence (no question itself) that shares the most words with it;
    otherwise, or when no sentence shares a word, :data:`NOTED`."""
    question = _LEAD.sub("", question.strip(), count=1)
    asked = _words(question)
    if not question.endswith("?") or not asked:
        return NOTED
    best, shared = "", 0
    for sentence in _SENTENCE_END.split(prompt):
        said = _LEAD.sub("", sentence.strip(), count=1)
        if said.endswith("?"):
            continue
        overlap = len(asked & _words(said))
        if overlap > shared:
            best, shared = said, overlap
    return f"From memory: {best}" if shared else NOTED


def answer_chat(request: Any) -> str:
    """:func:`answer` for a chat-completions request: its last user message, against every
    message's words (the instructions, the summary, what was recalled, the turns)."""
    messages = request.get("messages", []) if isinstance(request, dict) else []
    texts = [_content(m) for m in messages if isinstance(m, dict)]
    users = [_content(m) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return answer("\n".join(texts), users[-1]) if users else NOTED


def _content(message: dict[str, Any]) -> str:
    """A message's words: its content, or the text parts of it."""
    content = message.get("content")
    if isinstance(content, list):
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""
