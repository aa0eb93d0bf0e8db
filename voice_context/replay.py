"""Feed recordings through the same session code, offline with logical time.

A recording is what ``voice-context serve --record DIR`` writes: one accepted
client message a line, exactly as sent (``session.open``, ``turn.append``,
``note.append``, ``context.get``, ``session.state``, ``session.close``).
:func:`read_recording` reads every line with the codec, as the server read the
message: a replay sees exactly what a server accepts. A line the server would
have refused (not JSON, a role it does not know, a time in milliseconds, ...)
is skipped and listed with the codec's error, never fatal; so are blank lines,
``ping`` and ``session.delete`` (which a server never records).

Offline replay is a shell over the same session protocol as the session
manager (:meth:`~voice_context.core.session.Session.receive`: events in,
effects out), with the recorded times as the clock, no store and without
sleeping:

- the logical time is the latest ``at`` seen so far (turns and notes carry
  one; a ``context.get`` happens at the time of the message before it);
- at every ``context.get`` the compaction trigger is evaluated at that time;
  the context is built from the state *before* any compaction it starts, as
  in production, where a reply never waits for its compaction;
- a started compaction runs at once and its result lands at the same logical
  time, after the response: the next event (and every later request) sees
  the new summary (a commit the manager writes to its store is confirmed at
  once). A result too long for the summary ceiling gets its one re-compaction
  pass at once too; a summarizer error is a failed compaction, retried after
  the session's backoff in logical time.

So the same recording, configuration and (deterministic) summarizer always
produce byte-identical contexts. Only the wall-clock timings (how long the
summarizer and the context assembly took) differ between runs; they are kept
apart in their own file.

Outputs of :func:`write_result`, for a recording ``NAME.jsonl``:

- ``NAME.contexts.jsonl``: one line per ``context.get``: ``seq`` (line number
  in the recording, from 0), ``session``, ``request_id``, ``turn_index`` (the
  index of the newest turn, -1 before any), ``at`` (logical time),
  ``request`` (as recorded), ``response`` (the ``context`` reply the server
  would have sent, built by the same codec: ``format``, ``instructions`` or
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

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import anyio

from voice_context import codec
from voice_context.codec import (
    DEFAULT_MAX_TEXT_CHARS,
    ContextGet,
    ContextOverflow,
    LandmarkPin,
    LandmarkUnpin,
    NoteAppend,
    Ping,
    SessionClose,
    SessionDelete,
    SessionMessage,
    SessionOpen,
    TurnAppend,
)
from voice_context.config import Settings, make_summarizer, session_defaults
from voice_context.core.budget import Context, Format, build_context
from voice_context.core.config import SessionConfig
from voice_context.core.emergency import safety_start
from voice_context.core.landmarks import Landmark, LandmarkSource
from voice_context.core.session import (
    Applied,
    CommitCompaction,
    CompactionFailed,
    CompactionPlan,
    CompactionStored,
    ContextRequested,
    ContextView,
    Effect,
    Failed,
    NoteReceived,
    NotesStored,
    OverflowReported,
    PersistNotes,
    PinRequested,
    Reconfigured,
    Session,
    StartCompaction,
    SummaryReturned,
    TiersRolled,
    TurnAppended,
    TurnHeld,
    UnpinRequested,
)
from voice_context.core.tiers import TierSummary, hidden_lines, parse_zone, tiered_summary
from voice_context.core.turns import Note, Turn
from voice_context.core.window import FillBudget
from voice_context.errors import ClientError, ConfigError, DecodeError, SummarizerError
from voice_context.errors import ContextOverflow as ContextOverflowError
from voice_context.manager import TIER_CHECK_SECONDS, CompactionEvent, SessionManager
from voice_context.recall.embedding import load_embedder
from voice_context.recall.index import RecallIndex, SummaryIndex, older_turns, recall_candidates
from voice_context.store.base import SessionRecord
from voice_context.store.memory import MemoryStore
from voice_context.summarizers.base import Summarizer, SummaryRequest
from voice_context.summarizers.fallback import emergency_fold
from voice_context.tiering import roll_tiers
from voice_context.tokenizers import load_tokenizer


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
    raises for bad content: a line the codec refuses is listed in ``skipped``."""
    messages: list[dict[str, Any]] = []
    decoded: list[SessionMessage] = []
    skipped: list[str] = []
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


def context_response(
    session: str, context: Context, *, in_flight: bool, request_id: Any = None
) -> dict[str, Any]:
    """A :class:`Context` as the ``context`` reply the server sends (built by the same codec)."""
    msg_id = request_id if isinstance(request_id, str | int) and not isinstance(request_id, bool) else None
    return codec.reply_dict(codec.ContextReply(session, context, in_flight, msg_id))


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


@dataclass(slots=True)
class _Live:
    session: Session
    turns: list[Turn] = field(default_factory=list)
    recall: RecallIndex = field(default_factory=RecallIndex)
    calls: int = 0
    chars_sent: int = 0
    #: the last ``context.get`` as recorded, and as the codec read it
    last_request: tuple[dict[str, Any], ContextGet] | None = None
    #: with tiers on: an in-process store for the rolls, the summaries rolled, the last check
    store: MemoryStore | None = None
    tiers: tuple[TierSummary, ...] = ()
    tiers_checked: float = -math.inf
    tier_index: tuple[tuple[TierSummary, ...], int, SummaryIndex] | None = None


class OfflineReplay:
    """Replays messages against pure sessions; see the module docstring for the time model.

    ``config`` is the base session configuration; a recording's own
    ``session.open`` overrides apply on top, then ``overrides`` (the caller's
    ``--set`` values) on top of those. ``budget_chars`` replaces every
    request's budget when given. ``questions`` (``(id, question)`` pairs) are
    asked at the end of the recording, each as the ``query`` of one more
    context fetched like the session's last request: the per-question mode of
    the scorer.
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
    ) -> None:
        self.summarizer = summarizer
        self.embedder = embedder
        self.config = config or session_defaults(summarizer)
        self.overrides = dict(overrides or {})
        self.budget_chars = budget_chars
        self.budget_tokens = budget_tokens
        self.questions = tuple(questions)

    async def run(self, recording: Recording) -> ReplayResult:
        result = ReplayResult(recording.name, skipped=list(recording.skipped))
        live: dict[str, _Live] = {}
        now = 0.0
        started = False
        for seq, (sent, message) in enumerate(zip(recording.messages, recording.decoded, strict=True)):
            name = message.session
            if isinstance(message, SessionOpen):
                overrides = dict(message.config or {})
                config = self.config.with_overrides(overrides).with_overrides(self.overrides)
                if name in live:
                    live[name].session.receive(Reconfigured(config, now))
                else:
                    live[name] = _Live(Session(name, config), recall=RecallIndex(embedder=self.embedder))
                    result.turns[name] = live[name].turns
                continue
            state = live.get(name)
            if state is None:
                if not isinstance(message, TurnAppend | NoteAppend | ContextGet):
                    continue
                # a recording that begins after its session was opened: the defaults apply
                state = live[name] = _Live(
                    Session(name, self.config.with_overrides(self.overrides)),
                    recall=RecallIndex(embedder=self.embedder),
                )
                result.turns[name] = state.turns
            if isinstance(message, TurnAppend):
                turn = message.turn
                now = turn.at if not started else max(now, turn.at)
                started = True
                before = state.turns[-1].at if state.turns else None
                [held] = state.session.receive(TurnAppended(turn))
                assert isinstance(held, TurnHeld)
                index = held.index
                state.recall.add_turn(index, turn)
                state.recall.embed_pending()
                state.turns.append(turn)
                if state.session.config.tiers:
                    await self._turn_stored(state, index, turn, before, now)
            elif isinstance(message, NoteAppend):
                note = message.note
                now = note.at if not started else max(now, note.at)
                started = True
                [persist] = state.session.receive(NoteReceived(note))
                assert isinstance(persist, PersistNotes)
                state.session.receive(NotesStored(persist.staged))  # no store to wait for
                state.recall.add_note(note)
            elif isinstance(message, ContextGet):
                await self._context(seq, sent, message, state, now, result)
            elif isinstance(message, LandmarkPin):
                if 0 <= message.index < len(state.turns):
                    turn = state.turns[message.index]
                    source: LandmarkSource = "llm" if message.source == "llm" else "manual"  # as served
                    landmark = Landmark(message.index, turn, message.kind, message.reason, source, now)
                    state.session.receive(PinRequested(landmark))
                else:  # the server answered an error and changed nothing
                    result.skipped.append(f"message {seq}: landmark.pin: no turn {message.index}")
            elif isinstance(message, LandmarkUnpin):
                state.session.receive(UnpinRequested(message.index, now))
            elif isinstance(message, ContextOverflow):
                await self._overflow(seq, sent, message, state, now, result)
            elif isinstance(message, SessionClose) and state.session.config.tiers:
                await self._roll(state, now, closed=True)  # its conversation ends with it
            # session.close: nothing is in flight offline, and a server keeps a closed session's
            # state in its store, so a later session.open resumes it as it was
        for state in live.values():
            if state.last_request is None:
                continue
            sent, request = state.last_request
            for probe_id, question in self.questions:
                probe_id_text = f"question-{probe_id}"
                asked = replace(request, query=question, id=probe_id_text)
                shown = {**sent, "query": question, "id": probe_id_text}
                await self._context(len(recording.messages), shown, asked, state, now, result, probe=probe_id)
        return result

    async def _context(
        self,
        seq: int,
        sent: dict[str, Any],
        message: ContextGet,
        state: _Live,
        now: float,
        result: ReplayResult,
        *,
        probe: str | None = None,
    ) -> None:
        session = state.session
        started: CompactionPlan | None = None
        if probe is None:
            state.last_request = (sent, message)
        budget = self.budget_chars if self.budget_chars is not None else message.budget_chars
        budget_tokens = self.budget_tokens if self.budget_tokens is not None else message.budget_tokens
        counter = load_tokenizer(session.config.tokenizer) if budget_tokens is not None else None
        if probe is None:
            fill = FillBudget(
                budget
                if budget is not None or message.format != "instructions"
                else session.config.instructions_budget_chars,
                budget_tokens,
                counter,
            )
            [decision] = session.receive(ContextRequested(now, fill))
            if isinstance(decision, StartCompaction):
                started = decision.plan
        config_budget = session.config.instructions_budget_chars
        if session.config.tiers and now - state.tiers_checked >= TIER_CHECK_SECONDS:
            await self._roll(state, now)
        tick = time.perf_counter()
        query, recalled = recall_candidates(state.recall, session, message.query, embed=True)
        view = session.view()
        if state.tiers:
            zone = parse_zone(session.config.time_zone)
            view = replace(view, summary=tiered_summary(state.tiers, view.cursor, view.summary, zone))
            if session.config.recall and query.strip():
                seen = {r.line for r in recalled if r.kind == "summary"}
                hits = self._tier_index(state).search(query, limit=session.config.recall_limit)
                recalled.extend(hit for hit in hits if hit.line not in seen)
        context = build_context(
            view,
            message.format,
            budget_chars=budget,
            budget_tokens=budget_tokens,
            tokens=counter,
            base_instructions=message.base_instructions,
            facts=list(message.facts),
            recalled=recalled,
            query=query,
            older=older_turns(
                state.recall,
                session,
                budget if budget is not None or message.format != "instructions" else config_budget,
            ),
            asked=message.query is not None,
        )
        result.context_ms.append((time.perf_counter() - tick) * 1000)
        stats = session.stats()
        (result.contexts if probe is None else result.questions).append(
            {
                **({"probe": probe} if probe is not None else {}),
                "seq": seq,
                "session": session.name,
                "request_id": sent.get("id"),
                "turn_index": session.total_turns - 1,
                "at": now,
                "request": sent,
                "response": context_response(
                    session.name,
                    context,
                    in_flight=session.in_flight is not None,
                    request_id=message.id,
                ),
                "state": {
                    "turns": stats.turns,
                    "cursor": stats.cursor,
                    "summary_chars": stats.summary_chars,
                    "compactions": stats.compactions,
                    "summarizer_calls": state.calls,
                    "chars_sent": state.chars_sent,
                },
            }
        )
        while started is not None:
            started = await self._compact(seq, started, state, now, result)

    async def _overflow(
        self,
        seq: int,
        sent: dict[str, Any],
        message: ContextOverflow,
        state: _Live,
        now: float,
        result: ReplayResult,
    ) -> None:
        """Emergency compaction, as the session manager does it: everything verbatim before the
        safety region folded at once without a model, then the context rebuilt under the limit.
        When the safety region alone is over the limit the server answers an error and changes
        nothing: the message is listed in ``skipped``."""
        session = state.session
        counter = load_tokenizer(session.config.tokenizer)
        keep = session.cursor + safety_start(session.verbatim_turns)
        if message.limit_tokens is not None:
            region = session.verbatim_turns[keep - session.cursor :]
            shown = build_context(
                ContextView(keep, "", region, (), session.config),
                message.format,
                base_instructions=message.base_instructions,
                budget_chars=1 << 30,
                tokens=counter,
            )
            if shown.tokens is not None and shown.tokens > message.limit_tokens:
                needed, limit = shown.tokens, message.limit_tokens
                result.skipped.append(f"message {seq}: context.overflow: needs {needed} tokens, over {limit}")
                return
        if keep > session.cursor:
            [start] = session.receive(OverflowReported(keep, now))
            assert isinstance(start, StartCompaction)
            plan = start.plan
            text = emergency_fold(plan, counter, session.config.max_summary_chars)
            record = self._record(
                seq, plan, state, now, request_chars(SummaryRequest.for_plan(plan, session.name))
            )
            self._settle(plan, session.receive(SummaryReturned(plan.plan_id, text, now)), state, now, record)
            record["emergency"] = True
            result.compactions.append(record)
        asked = ContextGet(
            message.session,
            message.format,
            message.budget_chars,
            message.base_instructions,
            message.facts,
            message.id,
            message.query,
            message.limit_tokens,
        )
        await self._context(seq, sent, asked, state, now, result)

    def _record(self, seq: int, plan: CompactionPlan, state: _Live, now: float, sent: int) -> dict[str, Any]:
        return {
            "session": state.session.name,
            "plan": plan.plan_id,
            "seq": seq,
            "at": now,
            "turn_index": state.session.total_turns - 1,
            "start": plan.start,
            "end": plan.end,
            "recompact": plan.recompact,
            "notes": len(plan.notes),
            "chars_sent": sent,
        }

    @staticmethod
    def _settle(
        plan: CompactionPlan, effects: list[Effect], state: _Live, now: float, record: dict[str, Any]
    ) -> CompactionPlan | None:
        """Perform what the session makes of a result (with no store, a commit is confirmed at
        once), noting the outcome in ``record``; returns the re-compaction pass it started, if any."""
        session = state.session
        next_plan: CompactionPlan | None = None
        record["outcome"] = "stale"
        for effect in effects:
            if isinstance(effect, CommitCompaction):
                effects.extend(session.receive(CompactionStored(plan.plan_id, now)))
            elif isinstance(effect, StartCompaction):
                next_plan = effect.plan
                record["outcome"] = "too_long"
            elif isinstance(effect, Applied):
                record["outcome"] = "clamped" if effect.clamped else "applied"
            elif isinstance(effect, Failed):
                record["outcome"] = f"failed:{effect.kind}"
        record["cursor"] = session.cursor
        record["summary_chars"] = len(session.summary)
        return next_plan

    async def _turn_stored(
        self, state: _Live, index: int, turn: Turn, before: float | None, now: float
    ) -> None:
        """With tiers on, the turn goes to the replay's own store too; a turn after a silence
        longer than the gap ends a conversation, which is rolled at once (as the server does)."""
        session = state.session
        if state.store is None:
            state.store = MemoryStore()
            await state.store.create(SessionRecord(session.name))
            for k, earlier in enumerate(state.turns[:-1]):
                await state.store.append_turn(session.name, k, earlier)
        await state.store.append_turn(session.name, index, turn)
        if before is not None and turn.at - before > session.config.conversation_gap_seconds:
            await self._roll(state, now)

    async def _roll(self, state: _Live, now: float, *, closed: bool = False) -> None:
        """Make the tier rolls due at ``now``, counting their summarizer calls with the folds'."""
        session = state.session
        if state.store is None:
            return
        state.tiers_checked = now
        report = await roll_tiers(
            state.store,
            _Tally(self.summarizer, state),
            session.name,
            session.config,
            now,
            total_turns=session.total_turns,
            closed=closed,
        )
        state.tiers = report.rows
        session.receive(TiersRolled(report.through, now))

    @staticmethod
    def _tier_index(state: _Live) -> SummaryIndex:
        cursor = state.session.cursor
        if state.tier_index is None or state.tier_index[:2] != (state.tiers, cursor):
            state.tier_index = (state.tiers, cursor, SummaryIndex.of(hidden_lines(state.tiers, cursor)))
        return state.tier_index[2]

    async def _compact(
        self, seq: int, plan: CompactionPlan, state: _Live, now: float, result: ReplayResult
    ) -> CompactionPlan | None:
        """Run one plan, and perform what the session makes of its result (with no store, a
        commit is confirmed at once); returns the re-compaction pass it started, if any."""
        session = state.session
        request = SummaryRequest.for_plan(plan, session.name)
        sent = request_chars(request)
        state.calls += 1
        state.chars_sent += sent
        record = self._record(seq, plan, state, now, sent)
        tick = time.perf_counter()
        effects: list[Effect]
        try:
            text = await self.summarizer.summarize(request)
        except SummarizerError as exc:
            effects = session.receive(CompactionFailed(plan.plan_id, exc.kind, exc.retryable, now))
        except Exception as exc:  # a summarizer bug is a failed compaction, as in the server
            effects = session.receive(CompactionFailed(plan.plan_id, type(exc).__name__, False, now))
        else:
            effects = session.receive(SummaryReturned(plan.plan_id, text, now))
        result.summarizer_ms.append((time.perf_counter() - tick) * 1000)
        next_plan = self._settle(plan, effects, state, now, record)
        result.compactions.append(record)
        return next_plan


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


class _Tally:
    """A summarizer whose calls and characters sent count in a replayed session's state."""

    def __init__(self, inner: Summarizer, state: _Live) -> None:
        self.inner, self.state = inner, state

    @property
    def model(self) -> str:
        return self.inner.model

    async def summarize(self, request: SummaryRequest) -> str:
        self.state.calls += 1
        self.state.chars_sent += request_chars(request)
        return await self.inner.summarize(request)


class _Counting:
    """Wraps a summarizer to count its calls and the characters it is sent."""

    def __init__(self, inner: Summarizer) -> None:
        self.inner = inner
        self.calls = 0
        self.chars_sent = 0
        self.ms: list[float] = []

    @property
    def model(self) -> str:
        return self.inner.model

    async def summarize(self, request: SummaryRequest) -> str:
        self.calls += 1
        self.chars_sent += request_chars(request)
        tick = time.perf_counter()
        try:
            return await self.inner.summarize(request)
        finally:
            self.ms.append((time.perf_counter() - tick) * 1000)


class _Target(Protocol):
    async def open(self, name: str, config: dict[str, Any]) -> None: ...
    async def turn(self, name: str, turn: Turn) -> None: ...
    async def note(self, name: str, note: Note) -> None: ...
    async def context(
        self, name: str, message: ContextGet | ContextOverflow, budget: int | None
    ) -> dict[str, Any]: ...
    async def landmark(self, name: str, message: LandmarkPin | LandmarkUnpin) -> None: ...
    async def state(self, name: str) -> dict[str, Any]: ...
    async def close(self, name: str) -> None: ...


async def _drive(
    recording: Recording,
    target: _Target,
    *,
    realtime: bool,
    speed: float,
    max_gap: float | None,
    budget_chars: int | None,
    result: ReplayResult,
) -> None:
    """Send a recording's messages to ``target`` in order, sleeping the recorded gaps when ``realtime``."""
    turns: dict[str, list[Turn]] = {}
    opened: set[str] = set()
    now: float | None = None
    for seq, (sent, message) in enumerate(zip(recording.messages, recording.decoded, strict=True)):
        name = message.session
        at: float | None = None
        if isinstance(message, TurnAppend):
            at = message.turn.at
        elif isinstance(message, NoteAppend):
            at = message.note.at
        if at is not None:
            if realtime and now is not None and at > now:
                gap = (at - now) / speed
                await anyio.sleep(min(gap, max_gap) if max_gap is not None else gap)
            now = at if now is None else max(now, at)
        if isinstance(message, SessionOpen) or (
            name not in opened and isinstance(message, TurnAppend | NoteAppend | ContextGet | ContextOverflow)
        ):
            config = dict(message.config or {}) if isinstance(message, SessionOpen) else {}
            await target.open(name, config)
            opened.add(name)
            result.turns.setdefault(name, turns.setdefault(name, []))
            if isinstance(message, SessionOpen):
                continue
        if isinstance(message, TurnAppend):
            await target.turn(name, message.turn)
            turns[name].append(message.turn)
        elif isinstance(message, NoteAppend):
            await target.note(name, message.note)
        elif isinstance(message, LandmarkPin | LandmarkUnpin) and name in opened:
            try:
                await target.landmark(name, message)
            except (ClientError, IndexError) as exc:  # refused, as the server refused it: nothing changed
                result.skipped.append(f"message {seq}: {message.type}: {exc}")
        elif isinstance(message, ContextGet | ContextOverflow):
            tick = time.perf_counter()
            try:
                reply = await target.context(name, message, budget_chars)
            except (ClientError, ContextOverflowError) as exc:
                result.skipped.append(f"message {seq}: {message.type}: {exc}")
                continue
            result.context_ms.append((time.perf_counter() - tick) * 1000)
            state = await target.state(name)
            result.contexts.append(
                {
                    "seq": seq,
                    "session": name,
                    "request_id": sent.get("id"),
                    "turn_index": len(turns[name]) - 1,
                    "at": now,
                    "request": sent,
                    "response": reply,
                    "state": state,
                }
            )
        elif isinstance(message, SessionClose) and name in opened:
            await target.close(name)
            opened.discard(name)


def _context_args(
    message: ContextGet | ContextOverflow, budget: int | None
) -> tuple[Format, int | None, str, list[str], str | None]:
    return (
        message.format,
        budget if budget is not None else message.budget_chars,
        message.base_instructions,
        list(message.facts),
        message.query,
    )


class _ManagerTarget:
    """The in-process session manager (the server's own shell), on a clock that follows the recording."""

    def __init__(self, manager: SessionManager, summarizer: _Counting, overrides: Mapping[str, Any]) -> None:
        self.manager = manager
        self.summarizer = summarizer
        self.overrides = dict(overrides)

    async def open(self, name: str, config: dict[str, Any]) -> None:
        await self.manager.open(name, {**config, **self.overrides})

    async def turn(self, name: str, turn: Turn) -> None:
        await self.manager.append_turn(name, turn)

    async def note(self, name: str, note: Note) -> None:
        await self.manager.append_note(name, note)

    async def context(
        self, name: str, message: ContextGet | ContextOverflow, budget: int | None
    ) -> dict[str, Any]:
        fmt, budget_chars, base, facts, query = _context_args(message, budget)
        if isinstance(message, ContextOverflow):
            context, _ = await self.manager.overflow(
                name,
                fmt,
                limit_tokens=message.limit_tokens,
                budget_chars=budget_chars,
                base_instructions=base,
                facts=facts,
                query=query,
            )
        else:
            context = await self.manager.context(
                name,
                fmt,
                budget_chars=budget_chars,
                budget_tokens=message.budget_tokens,
                base_instructions=base,
                facts=facts,
                query=query,
            )
        in_flight = self.manager.session(name).in_flight is not None
        return context_response(name, context, in_flight=in_flight, request_id=message.id)

    async def landmark(self, name: str, message: LandmarkPin | LandmarkUnpin) -> None:
        if isinstance(message, LandmarkPin):
            source: LandmarkSource = "llm" if message.source == "llm" else "manual"
            await self.manager.pin(
                name, message.index, kind=message.kind, reason=message.reason, source=source
            )
        else:
            await self.manager.unpin(name, message.index)

    async def state(self, name: str) -> dict[str, Any]:
        stats = self.manager.state(name)
        return {
            "turns": stats.turns,
            "cursor": stats.cursor,
            "summary_chars": stats.summary_chars,
            "compactions": stats.compactions,
            "summarizer_calls": self.summarizer.calls,
            "chars_sent": self.summarizer.chars_sent,
        }

    async def close(self, name: str) -> None:
        await self.manager.close(name)


class _ClientTarget:
    """A live server, through the bot client."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.handles: dict[str, Any] = {}
        self.last: dict[str, dict[str, Any]] = {}

    async def open(self, name: str, config: dict[str, Any]) -> None:
        self.handles[name] = await self.client.open(self.prefix + name, config or None)

    async def turn(self, name: str, turn: Turn) -> None:
        await self.handles[name].append_turn(turn.speaker, turn.role, turn.text, at=turn.at, id=turn.id)

    async def note(self, name: str, note: Note) -> None:
        await self.handles[name].append_note(note.text, at=note.at, speaker=note.speaker, source=note.source)

    async def context(
        self, name: str, message: ContextGet | ContextOverflow, budget: int | None
    ) -> dict[str, Any]:
        fmt, budget_chars, base, facts, query = _context_args(message, budget)
        handle = self.handles[name]
        reply: dict[str, Any]
        if isinstance(message, ContextOverflow):
            reply = await handle.overflow(message.limit_tokens, fmt, budget_chars, base, facts, query)
        else:
            reply = await handle.context(
                fmt, budget_chars, base, facts, query, budget_tokens=message.budget_tokens
            )
        return reply

    async def landmark(self, name: str, message: LandmarkPin | LandmarkUnpin) -> None:
        if isinstance(message, LandmarkPin):
            await self.handles[name].pin(message.index, message.kind, message.reason, message.source)
        else:
            await self.handles[name].unpin(message.index)

    async def state(self, name: str) -> dict[str, Any]:
        reply: dict[str, Any] = await self.handles[name].state()
        return {k: v for k, v in reply.items() if k not in ("type", "id", "session")}

    async def close(self, name: str) -> None:
        await self.handles.pop(name).close()


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

    for message in recording.messages:
        body = message.get("turn") or message.get("note")
        if isinstance(body, dict) and isinstance(body.get("at"), int | float):
            origin[:] = [float(body["at"]), time.monotonic()]
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
            outcome = "applied" if event.kind == "completed" else f"failed:{event.error}"
            record: dict[str, Any] = {
                "session": event.session,
                "at": clock(),
                "turn_index": len(result.turns.get(event.session, ())) - 1,
                "start": event.old_cursor if event.old_cursor is not None else event.cursor,
                "end": event.cursor,
                "outcome": outcome,
                "chars_sent": summarizer.chars_sent - sent[0],
                "cursor": event.cursor,
                "summary_chars": event.summary_chars,
                "latency": event.latency,
            }
            sent[0] = summarizer.chars_sent
            result.compactions.append(record)

        manager.add_listener(landed)
        target = _ManagerTarget(manager, summarizer, {})
        await _drive(
            recording,
            target,
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
    prefix: str = "",
) -> ReplayResult:
    """Replay against a live server at ``url`` with the bot client (``prefix`` is put before every
    session name, so a replay does not resume a real session). Not reproducible: the server's
    compactions run in the background, on its own clock."""
    from voice_context.client import Client

    recording = read_recording(path)
    result = ReplayResult(recording.name, skipped=list(recording.skipped))
    async with Client(url, token=token) as client:
        target = _ClientTarget(client, prefix)
        await _drive(
            recording,
            target,
            realtime=realtime,
            speed=speed,
            max_gap=max_gap,
            budget_chars=budget_chars,
            result=result,
        )
        for name in list(target.handles):
            await target.close(name)
    return result


__all__ = [
    "OfflineReplay",
    "Recording",
    "ReplayResult",
    "apply_values",
    "context_response",
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
