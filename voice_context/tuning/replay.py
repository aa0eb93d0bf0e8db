"""Feed recordings through the server's own handlers, offline with logical time, or to a live server.

A recording is what ``voice-context serve --record DIR`` writes: one accepted
client message a line, exactly as sent (``session.open``, ``turn.append``,
``note.append``, ``context.get``, ``session.state``, ``session.close``).
:func:`read_recording` reads every line with the codec, as the server read the
message: a replay sees exactly what a server accepts. A line the server would
have refused (not JSON, a role it does not know, a time in milliseconds, ...)
is skipped and listed with the codec's error, never fatal; so are ``ping`` and
``session.delete`` (which a server never records), and a message for a session
that no ``session.open`` before it opened (which a server refuses). Blank lines
are passed over. ``voice-context replay`` refuses a recording with a line it
skips, unless told to skip them (``--skip-bad-lines``).

Every message goes through the server's handler table
(:mod:`voice_context.server.handlers`), and every reply comes back through the
codec: offline, over a connection in the process for each session
(:class:`~voice_context.server.local.LocalConnection`), to the server's own
session manager on the memory store; live, over the bot client's websocket. So
a recording is answered as a server answers it, message by message: a retried
turn is stored once, a ``session.handoff`` asks for its context, a pin the
session cannot take is refused (and listed in ``skipped``). Offline, no rate
limit applies (the server that recorded the messages took them), and the
caller's ``--set`` values go on top of each ``session.open``'s config.

Offline replay runs with the recorded times as its clock (:class:`LogicalTime`)
and without sleeping:

- the logical time is the latest ``at`` seen so far (turns and notes carry
  one; a ``context.get`` happens at the time of the message before it);
- a ``context.get`` is answered as a server answers it: the
  compaction trigger evaluated at that time, recall searching the store, the
  turns before the cursor read from it, and the reply built from the state
  *before* any compaction it starts, as in production, where a reply never
  waits for its compaction;
- a started compaction lands at the same logical time, after the response
  and before the next message: the next event (and every later request)
  sees the new summary. A result too long for the summary ceiling gets its
  one re-compaction pass then too; a summarizer error is a failed
  compaction, retried after the session's backoff in logical time.

So the same recording, configuration and (deterministic) summarizer always
produce byte-identical contexts, and the contexts a server on the same
logical time serves for the same requests (``tests/tuning/test_one_path.py``). Only
the wall-clock timings (how long the summarizer and the context assembly
took) differ between runs; they are kept apart in their own file.

Outputs of :func:`write_result`, for a recording ``NAME.jsonl``:

- ``NAME.contexts.jsonl``: one line per ``context.get``: ``seq`` (line number
  in the recording, from 0), ``session``, ``request_id``, ``turn_index`` (the
  index of the newest turn, -1 before any), ``at`` (logical time),
  ``request`` (as recorded), ``response`` (the ``context`` reply the server
  sent, as a bot reads it: ``format``, ``instructions`` or
  ``messages``, ``summary``, ``chars``, ``budget_chars``, ``cursor``,
  ``covered_through``, ``first_turn``, ``turns_shown``, ``in_flight``,
  ``dropped``) and ``state`` (the session's counters then:
  ``turns``, ``cursor``, ``summary_chars``, ``compactions``,
  ``summarizer_calls``, ``chars_sent``);
- ``NAME.compactions.jsonl``: one line per summarizer call: which turns it
  folded, at which request and time, the characters it was sent, the outcome
  and the summary size after it;
- ``NAME.timings.json``: wall-clock milliseconds per summarizer call and per
  context assembly (the only output that is not reproducible).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import anyio

from voice_context import codec
from voice_context.codec import (
    DEFAULT_MAX_TEXT_CHARS,
    ContextGet,
    ContextOverflow,
    ErrorReply,
    LandmarkPin,
    LandmarkUnpin,
    NoteAppend,
    Ping,
    SessionClose,
    SessionDelete,
    SessionHandoff,
    SessionMessage,
    SessionOpen,
    SessionState,
    SessionStateGet,
    TurnAppend,
    TurnStored,
)
from voice_context.config import AheadMode, ServerSettings, Settings, make_summarizer, session_defaults
from voice_context.core.config import SessionConfig
from voice_context.core.session import CompactionPlan
from voice_context.core.turns import Turn
from voice_context.errors import ClientError, ConfigError, DecodeError
from voice_context.manager import CompactionEvent, SessionManager
from voice_context.recall.embedding import load_embedder
from voice_context.server.local import LocalConnection, local_handlers
from voice_context.summarizers.base import Summarizer, SummaryRequest

if TYPE_CHECKING:
    from voice_context.client import Client, Received


@dataclass(slots=True)
class Recording:
    """The messages of one recording file: each as the codec reads it (``decoded``) beside the
    JSON object it was read from (``messages``, kept as sent for the outputs), and the lines
    that were skipped, with why."""

    name: str
    messages: list[dict[str, Any]]
    skipped: list[str] = field(default_factory=list)
    path: Path | None = None
    decoded: list[SessionMessage] = field(default_factory=list)


def parse_recording(
    lines: Iterable[str], name: str = "recording", *, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS
) -> Recording:
    """Read recording lines with the codec (``max_text_chars`` as the server had it). Never
    raises for bad content: a line a server would not have recorded is listed in ``skipped``
    (``line N: why``, from line 1) and not replayed: one the codec refuses, a ``ping`` or a
    ``session.delete``, and a message for a session that no ``session.open`` before it opened
    (a server refuses it: no such session on the connection)."""
    messages: list[dict[str, Any]] = []
    decoded: list[SessionMessage] = []
    skipped: list[str] = []
    opened: set[str] = set()
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text:
            continue
        try:
            message, sent = codec.parse(text, max_text_chars=max_text_chars)
        except DecodeError as exc:
            skipped.append(f"line {number}: {exc.code}: {exc.message}")
            continue
        if isinstance(message, Ping | SessionDelete):
            skipped.append(f"line {number}: {message.type} is never recorded")
            continue
        if isinstance(message, SessionOpen):
            opened.add(message.session)
        elif message.session not in opened:
            skipped.append(
                f"line {number}: {message.type} for session {message.session!r}, "
                "which no session.open before it opened"
            )
            continue
        messages.append(sent)
        decoded.append(message)
    return Recording(name, messages, skipped, decoded=decoded)


def read_recording(path: str | Path, *, max_text_chars: int = DEFAULT_MAX_TEXT_CHARS) -> Recording:
    """Read one recording file (see :func:`parse_recording`)."""
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        recording = parse_recording(handle, recording_stem(path), max_text_chars=max_text_chars)
    recording.path = path
    return recording


def recording_stem(path: Path) -> str:
    """``room-1`` for ``room-1.jsonl``."""
    name = path.name
    return name[: -len(".jsonl")] if name.endswith(".jsonl") else path.stem


def request_chars(request: SummaryRequest) -> int:
    """What a summarizer is sent, in characters: the previous summary, each turn as
    ``speaker: text`` and each note as rendered (a model's prompt adds a fixed frame)."""
    turns = sum(len(t.speaker) + 2 + len(t.text) for t in request.turns)
    notes = sum(len(n.render()) + 1 for n in request.notes)
    return len(request.previous_summary) + turns + notes


@dataclass(slots=True)
class ReplayResult:
    """Everything one replay produced. ``contexts`` and ``compactions`` are reproducible."""

    name: str
    contexts: list[dict[str, Any]] = field(default_factory=list)
    compactions: list[dict[str, Any]] = field(default_factory=list)
    summarizer_ms: list[float] = field(default_factory=list)
    context_ms: list[float] = field(default_factory=list)
    turns: dict[str, list[Turn]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    """Per-question contexts: fetched at the end with each question as the query."""


class LogicalTime:
    """A replay's logical time: the clock a session manager reads, and a summarizer whose
    answers land at the logical moment they are due, whatever the wall clock does.

    The clock is the latest ``at`` the recording has reached (:meth:`at`). A fold that a
    context starts waits until that context's reply is built (:meth:`replying`), as a
    reply never waits for its fold; :meth:`settle`, after every message, lets it land (with
    its re-compaction pass, and any tier roll), and waits for the recall index to hold every
    turn and note, so the next message sees the new summary. What a replay gives is then a
    function of the recording alone: the offline replay runs on one, and so can a served
    session in the same process (its manager's ``clock`` set to :meth:`clock` and the server
    given :attr:`summarizer`).
    """

    def __init__(self, summarizer: Summarizer) -> None:
        self.now = 0.0
        self.seq = -1
        """The message of the recording being replayed (its line, from 0)."""
        self.summarizer = _Counting(summarizer, before=self._landing)
        self.manager: SessionManager | None = None
        """The manager whose work :meth:`settle` waits for."""
        self.on_call: Callable[[SummaryRequest], None] | None = None
        self._reply: anyio.Event | None = None

    def __repr__(self) -> str:
        held = " replying" if self._reply is not None else ""
        return f"<LogicalTime now={self.now} seq={self.seq}{held}>"

    def clock(self) -> float:
        return self.now

    def at(self, seq: int, now: float) -> None:
        """The replay has reached message ``seq``, at logical time ``now``."""
        self.seq, self.now = seq, now

    @contextlib.contextmanager
    def replying(self) -> Iterator[None]:
        """While a reply is being built, the folds it starts wait."""
        self._reply = anyio.Event()
        try:
            yield
        finally:
            reply, self._reply = self._reply, None
            reply.set()

    async def settle(self) -> None:
        """Let every fold, roll and index started so far land (:meth:`SessionManager.settled`)."""
        manager = self.manager
        if manager is None:
            raise RuntimeError("LogicalTime.settle needs the manager it paces (set .manager)")
        await manager.settled()

    async def _landing(self, request: SummaryRequest) -> None:
        while self._reply is not None:
            await self._reply.wait()
        if self.on_call is not None:
            self.on_call(request)


class _Folds:
    """The compactions of an offline replay, one record per summarizer call of a fold (see
    the module docstring): noted when the call is made, its outcome told by the manager's
    compaction events (or by the re-compaction pass it started: ``too_long``)."""

    def __init__(self, manager: SessionManager, logical: LogicalTime, result: ReplayResult) -> None:
        self.manager, self.logical, self.result = manager, logical, result
        self.open: dict[str, dict[str, Any]] = {}
        logical.on_call = self.called
        manager.add_listener(self.landed)

    def record(self, name: str, plan: CompactionPlan, sent: int) -> dict[str, Any]:
        session = self.manager.session(name)
        record: dict[str, Any] = {
            "session": name,
            "plan": plan.plan_id,
            "seq": self.logical.seq,
            "at": self.logical.now,
            "turn_index": session.total_turns - 1,
            "start": plan.start,
            "end": plan.end,
            "recompact": plan.recompact,
            "notes": len(plan.notes),
            "chars_sent": sent,
        }
        self.result.compactions.append(record)
        return record

    def called(self, request: SummaryRequest) -> None:
        name = request.session
        if name not in self.manager.names():
            return
        plan = self.manager.session(name).in_flight
        if plan is None or SummaryRequest.for_plan(plan, name) != request:
            return  # a tier roll: counted with the session's calls, not a compaction
        earlier = self.open.pop(name, None)
        if earlier is not None:  # its result was too long: this is the pass that condenses it
            self._outcome(earlier, "too_long")
        self.open[name] = self.record(name, plan, request_chars(request))

    def landed(self, event: CompactionEvent) -> None:
        if event.trigger == "emergency" and event.plan is not None:
            self._emergency(event.session, event.plan, event.clamped)
            return
        record = self.open.pop(event.session, None)
        if record is None:
            return  # a failure before any call
        if event.kind == "completed":
            outcome = "clamped" if event.clamped else "applied"
        else:
            outcome = f"failed:{event.error}"
        self._outcome(record, outcome, event.cursor, event.summary_chars)

    def _emergency(self, name: str, plan: CompactionPlan, clamped: bool) -> None:
        """An overflow's fold, made at once without a summarizer call, and applied."""
        record = self.record(name, plan, request_chars(SummaryRequest.for_plan(plan, name)))
        self._outcome(record, "clamped" if clamped else "applied")
        record["emergency"] = True

    def settled(self) -> None:
        """Calls whose result came to nothing (a plan no longer in flight) are ``stale``."""
        for record in self.open.values():
            self._outcome(record, "stale")
        self.open.clear()

    def _outcome(
        self, record: dict[str, Any], outcome: str, cursor: int | None = None, summary: int | None = None
    ) -> None:
        name = record["session"]
        live = self.manager.session(name) if name in self.manager.names() else None
        record["outcome"] = outcome
        record["cursor"] = cursor if cursor is not None or live is None else live.cursor
        record["summary_chars"] = summary if summary is not None or live is None else len(live.summary)


class OfflineReplay:
    """Replays a recording through the session manager on the memory store, in logical time
    (see the module docstring).

    ``config`` is the base session configuration; a recording's own
    ``session.open`` overrides apply on top, then ``overrides`` (the caller's
    ``--set`` values) on top of those. ``budget_chars`` and ``budget_tokens``
    replace every request's budgets when given. ``questions`` (``(id, question)``
    pairs) are asked at the end of the recording, each as the ``query`` of one
    more context fetched like the session's last request: the per-question mode
    of the scorer.
    """

    def __init__(
        self,
        summarizer: Summarizer,
        *,
        config: SessionConfig | None = None,
        overrides: Mapping[str, Any] | None = None,
        budget_chars: int | None = None,
        budget_tokens: int | None = None,
        questions: Sequence[tuple[str, str]] = (),
        embedder: Any = None,
        recall_ahead: AheadMode = "first",
        server: ServerSettings | None = None,
    ) -> None:
        self.summarizer = summarizer
        self.embedder = embedder
        self.config = config or session_defaults(summarizer)
        self.overrides = dict(overrides or {})
        self.budget_chars = budget_chars
        self.budget_tokens = budget_tokens
        self.questions = tuple(questions)
        self.recall_ahead = recall_ahead
        self.server = server or ServerSettings()

    async def run(self, recording: Recording) -> ReplayResult:
        result = ReplayResult(recording.name, skipped=list(recording.skipped))
        logical = LogicalTime(self.summarizer)
        async with SessionManager(
            logical.summarizer,
            config=self.config,
            compaction_timeout=math.inf,  # a fold lands when it is done, in logical time
            close_timeout=math.inf,
            clock=logical.clock,
            embedder=self.embedder,
            recall_ahead=self.recall_ahead,
            tokenizer_ahead=False,  # read when a token budget first needs it
        ) as manager:
            logical.manager = manager
            folds = _Folds(manager, logical, result)
            peer = _Local(manager, logical.summarizer, self.server, self.overrides)
            await _drive(
                recording,
                peer,
                realtime=False,
                speed=1.0,
                max_gap=None,
                budget_chars=self.budget_chars,
                budget_tokens=self.budget_tokens,
                result=result,
                logical=logical,
                settled=folds.settled,
            )
            await self._ask(recording, peer, logical, result)
            logical.on_call = None  # a fold a question started lands unrecorded: the recording is over
            await logical.settle()
        result.summarizer_ms = logical.summarizer.ms
        return result

    async def _ask(
        self, recording: Recording, peer: _Local, logical: LogicalTime, result: ReplayResult
    ) -> None:
        """Each question as the query of a context fetched like the session's last request, all
        at the end, on the state the recording left (a fold one starts lands after them all)."""
        if not self.questions:
            return
        last = {record["session"]: record for record in result.contexts}
        logical.at(len(recording.messages), logical.now)
        with logical.replying():
            for name, record in last.items():
                if name not in peer.manager.names():  # closed by the recording: its store resumes it
                    _answered(await peer.send(SessionOpen(name)))
                request = _as_get(recording.decoded[record["seq"]])
                for probe_id, question in self.questions:
                    probe_id_text = f"question-{probe_id}"
                    asked = _budgeted(
                        replace(request, query=question, id=probe_id_text),
                        self.budget_chars,
                        self.budget_tokens,
                    )
                    tick = time.perf_counter()
                    _, reply = _answered(await peer.send(asked))
                    result.context_ms.append((time.perf_counter() - tick) * 1000)
                    shown = {**record["request"], "query": question, "id": probe_id_text}
                    result.questions.append(
                        {
                            "probe": probe_id,
                            "seq": len(recording.messages),
                            "session": name,
                            "request_id": probe_id_text,
                            "turn_index": len(result.turns.get(name, ())) - 1,
                            "at": logical.now,
                            "request": shown,
                            "response": reply,
                            "state": await peer.state(name),
                        }
                    )


def _as_get(message: SessionMessage) -> ContextGet:
    """A recorded request as the ``context.get`` it amounts to (an overflow's limit as its budget)."""
    if isinstance(message, ContextOverflow):
        return ContextGet(
            message.session,
            message.format,
            message.budget_chars,
            message.base_instructions,
            message.facts,
            message.id,
            message.query,
            message.limit_tokens,
        )
    assert isinstance(message, ContextGet)
    return message


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), sort_keys=False)


def write_result(result: ReplayResult, out_dir: Path) -> dict[str, Path]:
    """Write the output files of one replay into ``out_dir`` (contexts, compactions, timings, and
    the per-question contexts when questions were asked); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "contexts": out_dir / f"{result.name}.contexts.jsonl",
        "compactions": out_dir / f"{result.name}.compactions.jsonl",
        "timings": out_dir / f"{result.name}.timings.json",
    }
    paths["contexts"].write_text("".join(_dump(c) + "\n" for c in result.contexts), encoding="utf-8")
    paths["compactions"].write_text("".join(_dump(c) + "\n" for c in result.compactions), encoding="utf-8")
    timings = {"summarizer_ms": result.summarizer_ms, "context_ms": result.context_ms}
    paths["timings"].write_text(json.dumps(timings) + "\n", encoding="utf-8")
    if result.questions:
        paths["questions"] = out_dir / f"{result.name}.questions.jsonl"
        paths["questions"].write_text("".join(_dump(c) + "\n" for c in result.questions), encoding="utf-8")
    return paths


def read_contexts(path: str | Path) -> list[dict[str, Any]]:
    """The context records a replay wrote (``NAME.contexts.jsonl``)."""
    out: list[dict[str, Any]] = []
    with Path(path).open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                value = json.loads(line)
                if isinstance(value, dict):
                    out.append(value)
    return out


# -- settings and grids -------------------------------------------------------------


def parse_assignments(pairs: Sequence[str]) -> dict[str, list[str]]:
    """``["recent_window=20,50", "summarizer.kind=openai"]`` -> ``{key: [values]}``.

    A key without a group prefix belongs to ``session``. Raises ``ConfigError``
    for a pair without ``=`` or without values.
    """
    out: dict[str, list[str]] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set wants KEY=VALUE[,VALUE...], got {pair!r}")
        values = [v.strip() for v in raw.split(",") if v.strip()]
        if not values:
            raise ConfigError(f"--set {key}= has no value")
        if "." not in key:
            key = f"session.{key}"
        out[key] = values
    return out


def apply_values(settings: Settings, values: Mapping[str, str]) -> Settings:
    """``settings`` with ``group.key`` values applied (strings are converted per field)."""
    by_group: dict[str, dict[str, str]] = {}
    for key, value in values.items():
        group, _, name = key.partition(".")
        by_group.setdefault(group, {})[name] = value
    for group, changes in by_group.items():
        settings = settings.with_values(group, changes)
    return settings


def session_overrides(values: Mapping[str, str], settings: Settings) -> dict[str, Any]:
    """The ``session.*`` values of a grid point, typed, as ``SessionConfig`` overrides."""
    names = [key.partition(".")[2] for key in values if key.startswith("session.")]
    return {name: getattr(settings.session, name) for name in names}


async def replay_file(
    path: str | Path,
    settings: Settings,
    *,
    values: Mapping[str, str] | None = None,
    budget_chars: int | None = None,
    budget_tokens: int | None = None,
    summarizer: Summarizer | None = None,
    questions: Sequence[tuple[str, str]] = (),
) -> ReplayResult:
    """Replay one recording file offline with ``settings`` and the ``group.key`` ``values`` on top;
    ``questions`` are asked at the end (see :class:`OfflineReplay`). ``budget_chars`` and
    ``budget_tokens`` replace every request's own budgets."""
    point = apply_values(settings, values or {})
    owned = summarizer is None
    summarizer = summarizer or make_summarizer(point.summarizer)
    engine = OfflineReplay(
        summarizer,
        config=settings.session_config(summarizer),
        overrides=session_overrides(values or {}, point),
        budget_chars=budget_chars,
        budget_tokens=budget_tokens,
        questions=questions,
        embedder=load_embedder(point.recall.embedder),
        recall_ahead=point.recall.ahead,
        server=point.server,
    )
    try:
        return await engine.run(read_recording(path, max_text_chars=point.server.max_text_chars))
    finally:
        if owned:
            await _close(summarizer)


async def _close(summarizer: object) -> None:
    """Close a summarizer made here (a model's HTTP client) before its event loop ends."""
    close = getattr(summarizer, "aclose", None)
    if close is not None:
        with anyio.move_on_after(5, shield=True):
            await close()


# -- live replays: real time, or a real server ----------------------------------------------


class _Counting:
    """Wraps a summarizer to count its calls and the characters it is sent, per session, and
    time them; ``before`` (when given) is awaited before each call."""

    def __init__(
        self, inner: Summarizer, before: Callable[[SummaryRequest], Awaitable[None]] | None = None
    ) -> None:
        self.inner = inner
        self.before = before
        self.calls: dict[str, int] = {}
        self.chars_sent: dict[str, int] = {}
        self.ms: list[float] = []
        preferred = getattr(inner, "preferred_max_summary_chars", None)
        if preferred is not None:  # the session defaults follow what it wraps
            self.preferred_max_summary_chars = preferred

    @property
    def model(self) -> str:
        return self.inner.model

    async def summarize(self, request: SummaryRequest) -> str:
        if self.before is not None:
            await self.before(request)
        name = request.session
        self.calls[name] = self.calls.get(name, 0) + 1
        self.chars_sent[name] = self.chars_sent.get(name, 0) + request_chars(request)
        tick = time.perf_counter()
        try:
            return await self.inner.summarize(request)
        finally:
            self.ms.append((time.perf_counter() - tick) * 1000)


class _Peer(Protocol):
    """Where a replay sends a recording's messages: the server's own handlers, in the process
    (:class:`_Local`), or a server at a URL, through the bot client (:class:`_Remote`)."""

    async def send(self, message: SessionMessage) -> Received:
        """The reply to ``message``, typed and as sent (an ``error`` reply among them)."""

    async def state(self, name: str) -> dict[str, Any]:
        """The session's counters, as a context's record shows them."""


def _answered(received: Received) -> Received:
    """``received``, unless it is an ``error`` reply: then ``ClientError``, as a bot gets it."""
    reply, sent = received
    if isinstance(reply, ErrorReply):
        raise ClientError(reply.code, reply.message, reply=sent)
    return received


def _at(message: SessionMessage) -> float | None:
    """The time a turn or a note carries (other messages carry none)."""
    if isinstance(message, TurnAppend):
        return message.turn.at
    if isinstance(message, NoteAppend):
        return message.note.at
    return None


def _budgeted(
    message: ContextGet | ContextOverflow, budget_chars: int | None, budget_tokens: int | None
) -> ContextGet | ContextOverflow:
    """A request with the replay's budgets in place of its own (a token budget replaces a
    ``context.get``'s alone: an overflow's limit is what its model took)."""
    if budget_chars is not None:
        message = replace(message, budget_chars=budget_chars)
    if budget_tokens is not None and isinstance(message, ContextGet):
        message = replace(message, budget_tokens=budget_tokens)
    return message


async def _drive(
    recording: Recording,
    peer: _Peer,
    *,
    realtime: bool,
    speed: float,
    max_gap: float | None,
    budget_chars: int | None,
    result: ReplayResult,
    budget_tokens: int | None = None,
    logical: LogicalTime | None = None,
    settled: Callable[[], None] | None = None,
) -> None:
    """Send a recording's messages to ``peer`` in order, sleeping the recorded gaps when
    ``realtime``; in ``logical`` time, each message at its logical moment, and what it started
    landed before the next one (``settled`` is called then). A session the recording closed
    and then writes to again is opened again first (the file may hold several connections'
    messages); a landmark, a state or a handoff for one not open is passed over."""
    turns: dict[str, list[Turn]] = {}
    opened: set[str] = set()
    now: float | None = None if logical is None else logical.now
    for seq, (sent, message) in enumerate(zip(recording.messages, recording.decoded, strict=True)):
        name = message.session
        at = _at(message)
        if at is not None:
            if realtime and now is not None and at > now:
                gap = (at - now) / speed
                await anyio.sleep(min(gap, max_gap) if max_gap is not None else gap)
            now = at if now is None else max(now, at)
        if logical is not None and now is not None:
            logical.at(seq, now)
        if isinstance(message, SessionOpen) or (
            name not in opened and isinstance(message, TurnAppend | NoteAppend | ContextGet | ContextOverflow)
        ):
            _answered(await peer.send(message if isinstance(message, SessionOpen) else SessionOpen(name)))
            opened.add(name)
            result.turns.setdefault(name, turns.setdefault(name, []))
        if isinstance(message, TurnAppend):
            stored, _ = _answered(await peer.send(message))
            if not (isinstance(stored, TurnStored) and stored.duplicate):  # a server stores a retry once
                turns[name].append(message.turn)
        elif isinstance(message, NoteAppend):
            _answered(await peer.send(message))
        elif (
            isinstance(message, LandmarkPin | LandmarkUnpin | SessionStateGet | SessionHandoff)
            and name in opened
        ):
            try:
                _answered(await peer.send(message))
            except ClientError as exc:  # refused, as the server refused it: nothing changed
                result.skipped.append(f"message {seq}: {message.type}: {exc.message}")
        elif isinstance(message, ContextGet | ContextOverflow):
            asked = _budgeted(message, budget_chars, budget_tokens)
            with logical.replying() if logical is not None else contextlib.nullcontext():
                tick = time.perf_counter()
                try:
                    _, reply = _answered(await peer.send(asked))
                except ClientError as exc:
                    result.skipped.append(f"message {seq}: {message.type}: {exc.message}")
                else:
                    result.context_ms.append((time.perf_counter() - tick) * 1000)
                    result.contexts.append(
                        {
                            "seq": seq,
                            "session": name,
                            "request_id": sent.get("id"),
                            "turn_index": len(turns[name]) - 1,
                            "at": now,
                            "request": sent,
                            "response": reply,
                            "state": await peer.state(name),
                        }
                    )
        elif isinstance(message, SessionClose) and name in opened:
            _answered(await peer.send(message))
            opened.discard(name)
        if logical is not None:
            await logical.settle()
            if settled is not None:
                settled()


class _Local:
    """The server's own handler table over the replay's session manager, through a connection
    in the process for each session (as each of a recording's sessions had its own);
    ``overrides`` go on top of every ``session.open``'s config."""

    def __init__(
        self,
        manager: SessionManager,
        summarizer: _Counting,
        settings: ServerSettings,
        overrides: Mapping[str, Any],
    ) -> None:
        self.manager = manager
        self.summarizer = summarizer
        self.handlers = local_handlers(manager, settings, overrides=overrides)
        self.connections: dict[str, LocalConnection] = {}

    def __repr__(self) -> str:
        return f"<_Local connections={len(self.connections)}>"

    async def send(self, message: SessionMessage) -> Received:
        conn = self.connections.get(message.session)
        if conn is None:
            conn = self.connections[message.session] = LocalConnection(self.handlers)
        return await conn.request(message)

    async def state(self, name: str) -> dict[str, Any]:
        """What the server says of the session, and what its summarizer was asked."""
        stats, _ = _answered(await self.send(SessionStateGet(name)))
        assert isinstance(stats, SessionState)
        return {
            "turns": stats.turns,
            "cursor": stats.cursor,
            "summary_chars": stats.summary_chars,
            "compactions": stats.compactions,
            "summarizer_calls": self.summarizer.calls.get(name, 0),
            "chars_sent": self.summarizer.chars_sent.get(name, 0),
        }


class _Remote:
    """A live server, through the bot client; ``prefix`` goes before every session name."""

    def __init__(self, client: Client, prefix: str) -> None:
        self.client = client
        self.prefix = prefix

    async def send(self, message: SessionMessage) -> Received:
        return await self.client.exchange(replace(message, session=self.prefix + message.session))

    async def state(self, name: str) -> dict[str, Any]:
        """The server's ``session.state`` reply, as it said it."""
        _, sent = _answered(await self.send(SessionStateGet(name)))
        return {k: v for k, v in sent.items() if k not in ("type", "id", "session")}


async def replay_realtime(
    path: str | Path,
    settings: Settings,
    *,
    values: Mapping[str, str] | None = None,
    budget_chars: int | None = None,
    speed: float = 1.0,
    max_gap: float | None = None,
) -> ReplayResult:
    """Replay through the session manager (the server's shell) in real time: the recorded gaps
    are slept (divided by ``speed``) and compactions land whenever they finish. Not reproducible."""
    point = apply_values(settings, values or {})
    recording = read_recording(path, max_text_chars=point.server.max_text_chars)
    summarizer = _Counting(make_summarizer(point.summarizer))
    origin: list[float] = []

    def clock() -> float:
        start = origin[0] if origin else 0.0
        return start + (time.monotonic() - origin[1]) * speed if origin else 0.0

    for message in recording.decoded:
        at = _at(message)
        if at is not None:
            origin[:] = [at, time.monotonic()]
            break
    result = ReplayResult(recording.name, skipped=list(recording.skipped))
    async with SessionManager(
        summarizer,
        config=point.session,
        compaction_timeout=point.summarizer.compaction_timeout,
        clock=clock,
        embedder=load_embedder(point.recall.embedder),
    ) as manager:
        sent = [0]

        def landed(event: CompactionEvent) -> None:
            chars_sent = sum(summarizer.chars_sent.values())
            outcome = "applied" if event.kind == "completed" else f"failed:{event.error}"
            record: dict[str, Any] = {
                "session": event.session,
                "at": clock(),
                "turn_index": len(result.turns.get(event.session, ())) - 1,
                "start": event.old_cursor if event.old_cursor is not None else event.cursor,
                "end": event.cursor,
                "outcome": outcome,
                "chars_sent": chars_sent - sent[0],
                "cursor": event.cursor,
                "summary_chars": event.summary_chars,
                "latency": event.latency,
            }
            sent[0] = chars_sent
            result.compactions.append(record)

        manager.add_listener(landed)
        await _drive(
            recording,
            _Local(manager, summarizer, point.server, {}),
            realtime=True,
            speed=speed,
            max_gap=max_gap,
            budget_chars=budget_chars,
            result=result,
        )
    await _close(summarizer.inner)
    result.summarizer_ms = summarizer.ms
    return result


async def replay_live(
    path: str | Path,
    url: str,
    *,
    token: str | None = None,
    realtime: bool = False,
    speed: float = 1.0,
    max_gap: float | None = None,
    budget_chars: int | None = None,
    budget_tokens: int | None = None,
    prefix: str = "",
    logical: LogicalTime | None = None,
) -> ReplayResult:
    """Replay against a live server at ``url`` with the bot client (``prefix`` is put before every
    session name, so a replay does not resume a real session). Not reproducible: the server's
    compactions run in the background, on its own clock; unless the server runs in this process
    on ``logical`` time (its manager's clock :meth:`LogicalTime.clock`, its summarizer
    :attr:`LogicalTime.summarizer`, and :attr:`LogicalTime.manager` its manager): then each
    message is sent at its logical moment and what it started lands before the next, as offline."""
    from voice_context.client import Client

    recording = read_recording(path)
    result = ReplayResult(recording.name, skipped=list(recording.skipped))
    async with Client(url, token=token) as client:
        await _drive(
            recording,
            _Remote(client, prefix),
            realtime=realtime,
            speed=speed,
            max_gap=max_gap,
            budget_chars=budget_chars,
            budget_tokens=budget_tokens,
            result=result,
            logical=logical,
        )
        for name in client.sessions:  # what the recording left open
            await client.request(SessionClose(name))
    return result


__all__ = [
    "LogicalTime",
    "OfflineReplay",
    "Recording",
    "ReplayResult",
    "apply_values",
    "parse_assignments",
    "parse_recording",
    "read_contexts",
    "read_recording",
    "recording_stem",
    "replay_file",
    "replay_live",
    "replay_realtime",
    "request_chars",
    "session_overrides",
    "write_result",
]
