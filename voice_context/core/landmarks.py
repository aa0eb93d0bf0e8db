"""Landmarks: turns that are never paraphrased. Found by heuristics, or pinned by hand.

A landmark is a turn whose exact words matter later: a decision, a spec, a long
code block, an order given to someone, a link to a design. It is shown
verbatim, dated and attributed, in every later context that has room for it,
and a compaction never folds it into the summary (the summarizer never sees
it). :func:`detect` finds them in a turn's text:

- ``decision``: a ``decision:`` label (``Decision: we ship on Friday``);
- ``spec``: a ``spec:`` label;
- ``code``: a fenced code block of 20 lines or more;
- ``action_item``: an ``@mention`` with an imperative (``@bob please ship it``,
  ``@ana fix this``, ``@lee can you review the PR``);
- ``link``: a link to a spec or a design document (a URL whose path names a
  spec, design, RFC, ADR, PRD or proposal, or a shared document).

Each landmark keeps its kind, why it is one, how it was found (``heuristic``,
``llm``, ``manual``) and when it was pinned. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal, cast, get_args

from voice_context.core.times import stamp
from voice_context.core.turns import ROLES, Role, Turn

LandmarkSource = Literal["heuristic", "llm", "manual"]
SOURCES: frozenset[str] = frozenset(get_args(LandmarkSource))
KINDS: frozenset[str] = frozenset({"decision", "spec", "code", "link", "action_item", "question", "other"})
MIN_CODE_LINES = 20
MAX_REASON_CHARS = 200

_LABEL = re.compile(r"(?:^|(?<=[\s(\[*_>-]))(decision|spec)\s*:", re.IGNORECASE)
_FENCE = re.compile(r"^[ \t]*(```|~~~)[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.MULTILINE | re.DOTALL)
# an @mention: not part of an e-mail address or a word
_MENTION = re.compile(r"(?<![\w.@])@([A-Za-z][\w.-]{0,38}[\w])")
_IMPERATIVE_VERBS = (
    "ship|fix|deploy|review|merge|update|check|send|book|file|write|add|remove|revert|release|test|"
    "look|take|handle|finish|rebase|approve|schedule|prepare|draft|call|email|move|close|open|run|"
    "push|land|cut|rollback|roll|investigate|follow|pick|own|sort|make|get|do|change|rename|delete"
)
# "please ship", "can you review", "could you fix", or the verb first after the mention: "@bob fix this"
_ASK = re.compile(
    rf"\b(?:please|pls|plz|kindly)\s+(?:{_IMPERATIVE_VERBS})\b"
    rf"|\b(?:can|could|would|will)\s+you\s+(?:please\s+)?(?:{_IMPERATIVE_VERBS})\b"
    rf"|\b(?:{_IMPERATIVE_VERBS})\s+(?:this|that|it|these|those)\b",
    re.IGNORECASE,
)
_VERB_AFTER_MENTION = re.compile(
    rf"(?<![\w.@])@[A-Za-z][\w.-]{{0,38}}[\w][,:]?\s+(?:please\s+)?(?:{_IMPERATIVE_VERBS})\b(?!\s*(?:you|ya)\b)",
    re.IGNORECASE,
)
_URL = re.compile(r"https?://[^\s<>()\"']+", re.IGNORECASE)
_DOC_PATH = re.compile(
    r"(?:^|[/_.#=-])(?:specs?|design(?:[-_]?docs?)?|rfcs?|adrs?|prds?|proposals?)(?:$|[/_.#?=-]|\d)",
    re.IGNORECASE,
)
_SHARED_DOC = re.compile(r"docs\.google\.com/document|notion\.so/|confluence|/wiki/", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Found:
    """What :func:`detect` found in one turn."""

    kind: str
    reason: str


@dataclass(frozen=True, slots=True)
class Landmark:
    """A pinned turn: ``index`` in the transcript, the turn itself, and why it is kept whole."""

    index: int
    turn: Turn
    kind: str
    reason: str
    source: LandmarkSource
    pinned_at: float

    def as_dict(self) -> dict[str, Any]:
        t = self.turn
        return {
            "index": self.index,
            "turn": {"speaker": t.speaker, "role": t.role, "text": t.text, "at": t.at, "id": t.id},
            "kind": self.kind,
            "reason": self.reason,
            "source": self.source,
            "pinned_at": self.pinned_at,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Landmark:
        """The inverse of :meth:`as_dict`; raises ``ValueError`` for anything malformed."""
        try:
            t = raw["turn"]
            role = t["role"]
            source = raw["source"]
            if role not in ROLES or source not in SOURCES:
                raise ValueError(f"unknown role {role!r} or source {source!r}")
            turn = Turn(str(t["speaker"]), _role(role), str(t["text"]), float(t["at"]), t.get("id"))
            return cls(
                int(raw["index"]), turn, str(raw["kind"]), str(raw["reason"]), source, float(raw["pinned_at"])
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"malformed landmark: {exc}") from exc


def _role(value: str) -> Role:
    if value not in ROLES:
        raise ValueError(f"unknown role {value!r}")
    return cast(Role, value)


def _code_lines(text: str) -> int:
    longest = 0
    for block in _FENCE.finditer(text):
        body = block.group(2)
        longest = max(longest, body.count("\n") + (0 if body.endswith("\n") or not body else 1))
    return longest


def _doc_link(text: str) -> str | None:
    for url in map(str, _URL.findall(text)):
        rest = url.split("://", 1)[1]
        host, _, path = rest.partition("/")
        if _SHARED_DOC.search(rest) or _DOC_PATH.search("/" + path):
            return url.rstrip(".,;:!?")
        if host.split(".")[0].lower() in ("spec", "specs", "design", "rfc", "rfcs"):
            return url.rstrip(".,;:!?")
    return None


def detect(text: str) -> Found | None:
    """The landmark ``text`` is, by the heuristics above (the first that applies), or ``None``."""
    label = _LABEL.search(text)
    if label:
        kind = label.group(1).lower()
        return Found(kind, f"says {kind}:")
    lines = _code_lines(text) if "```" in text or "~~~" in text else 0
    if lines >= MIN_CODE_LINES:
        return Found("code", f"a code block of {lines} lines")
    if "@" in text:
        mention = _MENTION.search(text)
        if mention and (_ASK.search(text) or _VERB_AFTER_MENTION.search(text)):
            return Found("action_item", f"asks @{mention.group(1)} to act")
    if "://" in text:
        link = _doc_link(text)
        if link:
            return Found("link", f"links a spec or design doc: {link}"[:MAX_REASON_CHARS])
    return None


def render(landmark: Landmark) -> str:
    """The landmark as a context shows it: dated, attributed, its words exactly."""
    return f"[{stamp(landmark.turn.at)}] {landmark.turn.speaker}: {landmark.turn.text}"


def found_in(index: int, turn: Turn) -> Landmark | None:
    """The landmark the heuristics find in the turn at ``index``, pinned when it was said."""
    found = detect(turn.text)
    if found is None:
        return None
    return Landmark(index, turn, found.kind, found.reason, "heuristic", turn.at)


__all__ = [
    "KINDS",
    "MIN_CODE_LINES",
    "SOURCES",
    "Found",
    "Landmark",
    "LandmarkSource",
    "detect",
    "found_in",
    "render",
    "stamp",
]
