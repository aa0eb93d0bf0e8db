"""Turn public transcript datasets into recordings, with their annotations as probes.

A *recording* is what ``voice-context serve --record`` writes: one JSON protocol
message a line (``session.open``, ``turn.append``, ``note.append``,
``context.get``, ``session.close``). An import writes, for every conversation
or meeting, ``NAME.jsonl`` and a *probes file* ``NAME.probes.jsonl`` beside it:

- a first line ``{"kind": "meta", ...}`` naming the source, the speakers and
  the ids of the ``context.get`` requests that are checkpoints to score;
- one line per probe: ``{"kind": "qa" | "decision" | "action" | "query",
  "id", "question", "answer", "evidence": [turn ids], ...}``. Evidence ids are
  the ``id`` of turns in the recording.

The importers keep the spoken text as it was transcribed (only annotation
markup such as QMSum's ``{vocalsound}`` is removed); relative dates like
"yesterday" are left for the summarizer, which knows each turn's time.

Supported shapes:

- ``locomo``: LoCoMo conversations (``speaker_a``, ``session_N``,
  ``session_N_date_time``, ``qa``). Turns are spaced ``turn_seconds`` (30)
  apart from their session's date; a shared image is said in its turn, as
  `` [shares a photo: CAPTION]`` after the text (as LoCoMo's own evaluation and
  the shared retention yardstick read it, so that a replay serves the contexts a
  server gives that stream); a checkpoint closes every session; category 1-4
  questions become ``qa`` probes (category 5 has no gold answer).
- ``ami``: AMI/ICSI NXT meetings, one JSON object a line (``utterances`` with
  ``start`` seconds, ``speaker_roles``, ``summary.decisions|actions``). The
  speaker is the participant's role; decisions and actions with evidence become
  probes.
- ``qmsum``: QMSum meetings (``meeting_transcripts``, ``specific_query_list``);
  no times are given, so turns are spaced ``turn_seconds`` apart; specific
  queries become ``query`` probes whose evidence is their text spans.

Everything here is pure but for :func:`import_files`, which reads and writes files.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from voice_context.core.times import MONTHS

SOURCES = ("locomo", "ami", "qmsum")
DEFAULT_CHECKPOINT_EVERY = 50
DEFAULT_REQUEST_EVERY = 5
DEFAULT_TURN_SECONDS = 20.0
LOCOMO_TURN_SECONDS = 30.0
"""LoCoMo turns are this far apart within their session, as the retention yardstick streams them."""
#: AMI and QMSum carry no calendar date; their meetings start at this instant.
MEETING_START = datetime(2024, 3, 4, 10, 0, tzinfo=UTC).timestamp()

_LOCOMO_DATE = re.compile(
    r"^\s*(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})\s*$", re.IGNORECASE
)
_MONTHS = {name.lower(): i + 1 for i, name in enumerate(MONTHS)}
_MARKUP = re.compile(r"\{\s*(?:disfmarker|vocalsound|gap|pause|nonvocalsound|comment)[^}]*\}", re.IGNORECASE)


@dataclass(slots=True)
class Imported:
    """One recording to write: its messages, probes and metadata."""

    name: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def turns(self) -> int:
        return sum(1 for m in self.messages if m["type"] == "turn.append")


class _Writer:
    """Builds one recording: turns, notes, periodic requests and named checkpoints."""

    def __init__(self, name: str, request_every: int) -> None:
        self.out = Imported(name)
        self.request_every = max(0, request_every)
        self.turn_count = 0
        self.checkpoints: list[str] = []
        self.turn_ids: set[str] = set()
        self.out.messages.append({"type": "session.open", "session": name})

    def turn(self, speaker: str, text: str, at: float, turn_id: str) -> None:
        self.out.messages.append(
            {
                "type": "turn.append",
                "session": self.out.name,
                "turn": {"speaker": speaker, "role": "user", "text": text, "at": at, "id": turn_id},
            }
        )
        self.turn_ids.add(turn_id)
        self.turn_count += 1

    def maybe_request(self) -> None:
        """A bot asks for its context every ``request_every`` turns (as it would before replying)."""
        if self.request_every and self.turn_count % self.request_every == 0:
            self.request(f"ctx-{self.turn_count}")

    def request(self, request_id: str) -> None:
        last = self.out.messages[-1]
        if last["type"] == "context.get" and not last["id"].startswith("checkpoint-"):
            self.out.messages.pop()  # a checkpoint at the same moment replaces the plain request
        self.out.messages.append(
            {"type": "context.get", "session": self.out.name, "id": request_id, "format": "instructions"}
        )

    def checkpoint(self, label: str) -> None:
        request_id = f"checkpoint-{label}"
        self.request(request_id)
        self.checkpoints.append(request_id)

    def finish(self, source: str, speakers: Sequence[str], **meta: Any) -> Imported:
        self.out.messages.append({"type": "session.close", "session": self.out.name})
        self.out.meta = {
            "kind": "meta",
            "source": source,
            "recording": f"{self.out.name}.jsonl",
            "speakers": list(speakers),
            "turns": self.turn_count,
            "checkpoints": self.checkpoints,
            **meta,
        }
        return self.out


# -- LoCoMo ---------------------------------------------------------------------


def parse_locomo_date(text: str) -> float:
    """``"1:56 pm on 8 May, 2023"`` as unix seconds (UTC); raises ``ValueError`` when unreadable."""
    match = _LOCOMO_DATE.match(text)
    if not match:
        raise ValueError(f"unreadable LoCoMo date {text!r}")
    hour, minute, half, day, month_name, year = match.groups()
    month = _MONTHS.get(month_name.lower())
    if month is None:
        raise ValueError(f"unreadable month in {text!r}")
    h = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    return datetime(int(year), month, int(day), h, int(minute), tzinfo=UTC).timestamp()


def locomo_evidence(raw: Any, known: set[str]) -> list[str]:
    """LoCoMo evidence ids, repaired: split lists, ``D:11:26`` -> ``D11:26``, ``D30:05`` -> ``D30:5``;
    ids that name no turn are dropped."""
    items = raw if isinstance(raw, list) else [raw]
    out: list[str] = []
    for item in items:
        for part in re.split(r"[;,\s]+", str(item)):
            match = re.fullmatch(r"D:?(\d+):0*(\d+)", part.strip())
            if not match:
                continue
            turn_id = f"D{int(match.group(1))}:{int(match.group(2))}"
            if turn_id in known and turn_id not in out:
                out.append(turn_id)
    return out


def import_locomo(
    data: dict[str, Any],
    name: str,
    *,
    request_every: int = DEFAULT_REQUEST_EVERY,
    turn_seconds: float = LOCOMO_TURN_SECONDS,
) -> Imported:
    """One LoCoMo conversation as a recording with its QA probes."""
    writer = _Writer(name, request_every)
    speakers = [str(data.get("speaker_a", "")), str(data.get("speaker_b", ""))]
    n = 1
    while isinstance(data.get(f"session_{n}"), list):
        turns = data[f"session_{n}"]
        start = parse_locomo_date(str(data.get(f"session_{n}_date_time", "")))
        for i, raw in enumerate(turns):
            at = start + i * turn_seconds
            speaker = str(raw.get("speaker") or "")
            text = str(raw.get("text") or "")
            caption = raw.get("blip_caption")
            if caption:
                # said in the turn, as the yardstick streams it: as a screen note the caption's
                # room went to recall, and replayed contexts scored above the ones served
                text += f" [shares a photo: {caption}]"
            writer.turn(speaker, text, at, str(raw.get("dia_id") or f"D{n}:{i + 1}"))
            writer.maybe_request()
        if turns:
            writer.checkpoint(f"session-{n}")
        n += 1
    probes: list[dict[str, Any]] = []
    for i, qa in enumerate(data.get("qa") or []):
        if "answer" not in qa:
            continue  # adversarial questions carry no gold answer
        evidence = locomo_evidence(qa.get("evidence") or [], writer.turn_ids)
        if not evidence:
            continue
        probes.append(
            {
                "kind": "qa",
                "id": f"q{i + 1}",
                "question": str(qa.get("question", "")),
                "answer": str(qa["answer"]),
                "evidence": evidence,
                "category": qa.get("category"),
            }
        )
    out = writer.finish("locomo", [s for s in speakers if s], sessions=n - 1)
    out.probes = probes
    return out


# -- AMI / ICSI -------------------------------------------------------------------


def _ami_speakers(meeting: dict[str, Any]) -> dict[str, str]:
    """Channel letter -> the participant's role (``Speaker X`` when roles are missing or repeat)."""
    roles = meeting.get("speaker_roles") or {}
    names: dict[str, str] = {}
    for letter in sorted({str(u.get("speaker")) for u in meeting.get("utterances") or []}):
        role = roles.get(letter, {}).get("role") if isinstance(roles.get(letter), dict) else None
        names[letter] = str(role) if role else f"Speaker {letter}"
    counts: dict[str, int] = {}
    for value in names.values():
        counts[value] = counts.get(value, 0) + 1
    return {k: (v if counts[v] == 1 else f"{v} ({k})") for k, v in names.items()}


def import_ami(
    meeting: dict[str, Any],
    name: str,
    *,
    every: int = DEFAULT_CHECKPOINT_EVERY,
    request_every: int = DEFAULT_REQUEST_EVERY,
    start: float = MEETING_START,
) -> Imported:
    """One AMI (or ICSI) meeting as a recording with its decision and action probes."""
    writer = _Writer(name, request_every)
    speakers = _ami_speakers(meeting)
    utterances = sorted(meeting.get("utterances") or [], key=lambda u: (float(u.get("start", 0)), u["idx"]))
    for utterance in utterances:
        text = " ".join(str(utterance.get("text") or "").split())
        if not text:
            continue
        speaker = speakers.get(str(utterance.get("speaker")), "Speaker")
        writer.turn(speaker, text, start + float(utterance.get("start", 0)), f"u{utterance['idx']}")
        writer.maybe_request()
        if every and writer.turn_count % every == 0:
            writer.checkpoint(f"turn-{writer.turn_count}")
    if every and writer.turn_count % every:
        writer.checkpoint(f"turn-{writer.turn_count}")
    probes: list[dict[str, Any]] = []
    summary = meeting.get("summary") or {}
    for section, kind in (("decisions", "decision"), ("actions", "action")):
        for item in summary.get(section) or []:
            evidence = [f"u{i}" for i in item.get("evidence") or [] if f"u{i}" in writer.turn_ids]
            if not evidence:
                continue
            probes.append(
                {
                    "kind": kind,
                    "id": str(item.get("id")),
                    "answer": str(item.get("text", "")),
                    "evidence": evidence,
                }
            )
    out = writer.finish(
        str(meeting.get("corpus") or "ami").lower(),
        sorted(set(speakers.values())),
        meeting=meeting.get("meeting_id"),
    )
    out.probes = probes
    return out


# -- QMSum ------------------------------------------------------------------------


def clean_markup(text: str) -> str:
    """QMSum's annotation tags (``{disfmarker}``, ``{vocalsound}``, ...) removed, blanks collapsed."""
    return " ".join(_MARKUP.sub(" ", text).split())


def import_qmsum(
    meeting: dict[str, Any],
    name: str,
    *,
    every: int = DEFAULT_CHECKPOINT_EVERY,
    request_every: int = DEFAULT_REQUEST_EVERY,
    start: float = MEETING_START,
    turn_seconds: float = DEFAULT_TURN_SECONDS,
) -> Imported:
    """One QMSum meeting as a recording with its specific queries as probes."""
    writer = _Writer(name, request_every)
    speakers: set[str] = set()
    for i, raw in enumerate(meeting.get("meeting_transcripts") or []):
        text = clean_markup(str(raw.get("content") or ""))
        if not text:
            continue
        speaker = str(raw.get("speaker") or "Speaker")
        speakers.add(speaker)
        writer.turn(speaker, text, start + i * turn_seconds, f"t{i}")
        writer.maybe_request()
        if every and writer.turn_count % every == 0:
            writer.checkpoint(f"turn-{writer.turn_count}")
    if every and writer.turn_count % every:
        writer.checkpoint(f"turn-{writer.turn_count}")
    probes: list[dict[str, Any]] = []
    for i, query in enumerate(meeting.get("specific_query_list") or []):
        evidence: list[str] = []
        for span in query.get("relevant_text_span") or []:
            try:
                lo, hi = int(span[0]), int(span[-1])
            except (ValueError, TypeError, IndexError):
                continue
            evidence.extend(f"t{j}" for j in range(lo, hi + 1) if f"t{j}" in writer.turn_ids)
        if not evidence:
            continue
        probes.append(
            {
                "kind": "query",
                "id": f"s{i + 1}",
                "question": str(query.get("query", "")),
                "answer": str(query.get("answer", "")),
                "evidence": list(dict.fromkeys(evidence)),
            }
        )
    out = writer.finish("qmsum", sorted(speakers))
    out.probes = probes
    return out


# -- files ------------------------------------------------------------------------


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "recording"


def _load_json_objects(path: Path) -> Iterator[dict[str, Any]]:
    """A JSON file holding one object or a list of them, or a JSONL file of objects."""
    text = path.read_text(encoding="utf-8")
    stripped = text.lstrip()
    if stripped.startswith("["):
        yield from (item for item in json.loads(text) if isinstance(item, dict))
        return
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        for line in text.splitlines():
            if line.strip():
                value = json.loads(line)
                if isinstance(value, dict):
                    yield value
        return
    if isinstance(value, dict):
        yield value


def convert(
    source: str,
    path: Path,
    *,
    every: int = DEFAULT_CHECKPOINT_EVERY,
    request_every: int = DEFAULT_REQUEST_EVERY,
    only: Iterable[str] = (),
) -> Iterator[Imported]:
    """The recordings in one dataset file. ``only`` keeps meetings whose id is listed."""
    wanted = set(only)
    for k, item in enumerate(_load_json_objects(path)):
        if source == "locomo":
            stem = path.stem if k == 0 else f"{path.stem}-{k}"
            yield import_locomo(item, f"locomo-{_slug(stem)}", request_every=request_every)
        elif source == "ami":
            meeting_id = str(item.get("meeting_id") or f"{path.stem}-{k}")
            if wanted and meeting_id not in wanted:
                continue
            corpus = str(item.get("corpus") or "ami").lower()
            yield import_ami(item, f"{corpus}-{_slug(meeting_id)}", every=every, request_every=request_every)
        elif source == "qmsum":
            if wanted and path.stem not in wanted:
                continue
            yield import_qmsum(item, f"qmsum-{_slug(path.stem)}", every=every, request_every=request_every)
        else:
            raise ValueError(f"unknown source {source!r}; expected one of {', '.join(SOURCES)}")


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def write_imported(imported: Imported, out_dir: Path) -> tuple[Path, Path]:
    """Write ``NAME.jsonl`` and ``NAME.probes.jsonl`` into ``out_dir``; returns both paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    recording = out_dir / f"{imported.name}.jsonl"
    probes = out_dir / f"{imported.name}.probes.jsonl"
    recording.write_text("".join(_dump(m) + "\n" for m in imported.messages), encoding="utf-8")
    lines = [imported.meta, *imported.probes]
    probes.write_text("".join(_dump(p) + "\n" for p in lines), encoding="utf-8")
    return recording, probes


def import_files(
    source: str,
    paths: Sequence[Path],
    out_dir: Path,
    *,
    every: int = DEFAULT_CHECKPOINT_EVERY,
    request_every: int = DEFAULT_REQUEST_EVERY,
    only: Iterable[str] = (),
) -> list[Imported]:
    """Convert every file and write its recordings; returns what was written."""
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; expected one of {', '.join(SOURCES)}")
    done: list[Imported] = []
    wanted = tuple(only)
    for path in paths:
        for imported in convert(source, path, every=every, request_every=request_every, only=wanted):
            write_imported(imported, out_dir)
            done.append(imported)
    return done
