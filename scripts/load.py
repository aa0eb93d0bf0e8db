"""Load harness: voice-paced sessions over real websockets against real ``voice-context serve`` processes.

Prints figures; asserts nothing. Every server is a subprocess of its own (the
real command line, the default store unless ``--store`` says otherwise), and so
is a trivial protocol-v1 server that answers every request at once: the same
client's round trip to it, measured in the same run under the same load, is
the baseline each figure is compared with. The load generator is this process,
one event loop, apart from every server it measures; its own CPU is printed so
that a saturated generator shows.

Modes:

``ramp`` (default)
    1. Burst: ``--burst-sessions`` sessions send ``--burst-turns`` turns each, as fast
       as acknowledgements come back, over ``--connections`` connections: durable
       ingest in turns/s, against the trivial server's; then the indexing lag it left (the
       recall index is written after the acknowledgement, in the background) and how long it
       takes to drain. Around it, ``--probe-sessions`` paced voice sessions (below) for
       ``--probe-seconds`` before the burst and again at once after it, while its folds and
       indexing are still to do: their reply p99 after the burst against before it.
    2. Ramp: for each N in ``--steps``, N paced sessions, first against the trivial
       server, then against the replicas. New sessions get 30-89 turns of history first, so
       recall and folds have work from the start. ``--pattern`` says how a session talks:

       ``voice`` (default): a user and a bot in turn, as a realtime voice bot runs: after
           every user turn a ``context.get`` (``instructions`` under ``budget_chars`` 5200,
           the user turn's text as ``query``), the bot's turn 0.4 s after the context,
           then a pause of 3-6 s; a screen note about every 30 s. The new sessions' history
           is folded and indexed before the step starts (each asks for contexts until one
           starts no fold and finds none running), so that the step's CPU is its exchanges'.
       ``group``: the words in the roles they come with (the recordings: a group, about 7
           user turns to each bot turn; ``--dialogue`` makes them a user and a bot in turn),
           a turn every 2-4 s, a ``context.get`` (``instructions``, 5200 chars, no query)
           before every bot turn; a screen note about every 30 s. The history is folded
           within the first steps, as the pattern always did.

       With ``--call-seconds S`` the sessions are calls: each ends after 0.5-1.5 x S (the
       first at a random point of its length), its session closed, and the next call starts
       at once in a new session with no history, as a telephony bot's do. Without it a
       session lasts the whole run.

       The words are the project's own recordings in ``fixtures/``, or, with ``--words
       FILE...``, LoCoMo-format dialogue (each file one conversation or a list of them,
       ``session_N`` lists of ``{speaker, text}``, at the top or under ``conversation``),
       said by a user and a bot in turn. By default each session says texts of its own: every
       turn keeps its line's speaker, role and number of sentences, and draws its sentences from
       those of all the lines, by the session's seed and the turn's number (the same in every
       run); screen notes keep their text and read numbers of their own. The servers keep caches
       keyed by text (a turn's sentences, its date hints and annotations, a summary's cuts), and
       1,000 sessions saying the same few thousand lines over and over hit them far more often
       than different conversations would, which flatters the CPU per exchange. (The
       recordings' lines are mostly one short sentence, so their sessions still share many
       texts: of 1,000 sessions' first 100 turns, 16% are distinct, against 98% with five LoCoMo
       conversations and 0.2% and 3% verbatim.) With ``--verbatim-words`` every session says the
       lines verbatim, as the harness did before, for figures comparable with those measured
       so. Per step: turns/s held, reply p50/p99/max beside the trivial server's, fold lag,
       indexing lag (from the servers' ``/metrics``), the servers' CPU, their CPU per exchange
       (a context and the bot turn after it, with the user turns and notes since the last: the
       servers' CPU seconds over the step divided by the exchanges completed, in ms) beside the
       trivial server's, and RSS per session; under it, the box's gauge (a fixed loop of pure
       Python, timed before the step: the box's speed moves with what else its host runs, so
       only steps with like gauges compare) and the servers' CPU by thread (the event loop,
       ``sqlite-writer``, ``sqlite-reader``, ``fold``).
       The capacity is the largest N whose reply p99 stays within ``--p99-ratio`` of the
       trivial server's and whose fold and indexing lags do not grow.
``length``
    One session grown to each of ``--lengths`` turns: reply p99, fold time, recall
    time, server RSS, bytes on disk per turn.
``backlog``
    One session: ``--backlog`` turns (20,000) appended as fast as they are acknowledged with
    no context asked, then how long its folds take to catch up (``session.state`` polled,
    which starts nothing), and a context's p50/p99 once they have.

``--replicas R --store redis`` starts a real redis-server and R replicas sharing it;
sessions are spread across the replicas (session k on replica k mod R).

``--workers N`` runs each replica as ``serve --workers N``: N server processes on the replica's
port, over its store. A server's CPU and RSS are then its supervisor's and its workers'
together (every live child of the process started, read from ``/proc``). ``/metrics`` on the
shared port answers for one worker at a time: the indexing lag is the largest of ``4 N``
scrapes, each on a fresh connection that the kernel gives to either worker; the folds are
counted from the servers' logs, where every worker writes.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.server import ServerConnection, serve

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
RECENT_WINDOW = 50  # the server's defaults: lag is what waits behind the cursor beyond these
BATCH_SIZE = 10
BUDGET = 5200


HARNESS_SETTINGS = {
    "server.workers": "--workers",
    "server.host": "127.0.0.1",
    "server.port": "a free one",
    "store.url": "--store",
    "store.data_dir": "one of the run's own",
}
"""What the harness sets itself for its servers (and what says it), refused as a ``--setting``:
it would serve otherwise than the harness measures (``server.workers`` behind its back: the
workers' CPU would go uncounted)."""


def setting_env(text: str) -> tuple[str, str]:
    """``--setting GROUP.FIELD=VALUE`` as the environment variable a server reads it from
    (``server.gc_freeze_seconds=10``: ``VOICE_CONTEXT_SERVER_GC_FREEZE_SECONDS``, ``10``). The
    servers get none of the environment's own ``VOICE_CONTEXT_*``: a run measures the settings
    it names, not what a shell happened to export."""
    key, sep, value = text.partition("=")
    group, dot, name = key.strip().partition(".")
    if not (sep and dot and group.isidentifier() and name.isidentifier()):
        raise argparse.ArgumentTypeError(
            f"--setting wants GROUP.FIELD=VALUE (server.gc_freeze_seconds=10), got {text!r}"
        )
    if (owned := HARNESS_SETTINGS.get(f"{group}.{name}".lower())) is not None:
        raise argparse.ArgumentTypeError(f"--setting {group}.{name}: the harness sets it ({owned})")
    return f"VOICE_CONTEXT_{group.upper()}_{name.upper()}", value


SERVER_ENV = {
    # the burst and the preloaded history go faster than speech; a bot holds many sessions
    "VOICE_CONTEXT_SERVER_TURNS_PER_SECOND": "100000",
    "VOICE_CONTEXT_SERVER_TURN_BURST": "100000",
    "VOICE_CONTEXT_SERVER_MAX_SESSIONS_PER_CONNECTION": "100000",
    "VOICE_CONTEXT_SERVER_MAX_CONNECTIONS": "10000",
}


# -- the project's own recordings ------------------------------------------------------


@dataclass(frozen=True)
class Line:
    speaker: str
    role: str
    text: str


def recorded_lines() -> list[Line]:
    """Every turn of the project's recordings, in order (both recordings, one after the other)."""
    out: list[Line] = []
    for path in sorted((ROOT / "fixtures").glob("*.jsonl")):
        if path.name.endswith(".probes.jsonl"):
            continue
        for raw in path.read_text(encoding="utf-8").splitlines():
            message = json.loads(raw)
            if message.get("type") == "turn.append":
                t = message["turn"]
                out.append(Line(t["speaker"], t["role"], t["text"]))
    return out


def recorded_notes() -> list[str]:
    out: list[str] = []
    for path in sorted((ROOT / "fixtures").glob("*.jsonl")):
        for raw in path.read_text(encoding="utf-8").splitlines():
            message = json.loads(raw)
            if message.get("type") == "note.append":
                out.append(message["note"]["text"])
    return out or ["the shared screen shows the agenda"]


def dialogue_lines(paths: Sequence[Path]) -> list[Line]:
    """Every turn of LoCoMo-format conversations, in order: each file holds one conversation
    or a list of them, its ``session_1``, ``session_2``, ... lists of ``{speaker, text}`` at the
    top or under ``conversation``. A shared photo's caption is said in its turn, as the
    project's importer streams LoCoMo."""
    out: list[Line] = []
    for path in paths:
        value = json.loads(path.read_text(encoding="utf-8"))
        for item in value if isinstance(value, list) else [value]:
            conversation = item.get("conversation", item) if isinstance(item, dict) else {}
            n = 1
            while isinstance(turns := conversation.get(f"session_{n}"), list):
                for turn in turns:
                    text = str(turn.get("text") or "")
                    if turn.get("blip_caption"):
                        text += f" [shares a photo: {turn['blip_caption']}]"
                    if text:
                        out.append(Line(str(turn.get("speaker") or "?"), "user", text))
                n += 1
    if len(out) < 2:
        raise SystemExit(f"no dialogue (session_N lists of speaker and text) in {', '.join(map(str, paths))}")
    return out


def in_turn(lines: Sequence[Line]) -> list[Line]:
    """The lines said by a user and a bot in turn: every other line is the bot's (an even number
    of lines, so that the roles still alternate when a session comes round to the first again)."""
    return [
        Line(line.speaker, "user", line.text) if k % 2 == 0 else Line("Bot", "assistant", line.text)
        for k, line in enumerate(lines[: len(lines) - len(lines) % 2])
    ]


LINES = recorded_lines()
NOTES = recorded_notes()
BOT_DELAY = 0.4  # the voice pattern: the bot's turn this long after its context


# -- what each session says ----------------------------------------------------------------

SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
"""Where a line's text is cut into sentences: after a ``.``, ``!`` or ``?`` and a space (the
punctuation stays with its sentence)."""
SCREEN_READING = re.compile(r"\b(\d{1,2})\b")
"""A screen note's readings: its numbers of one or two digits (scores, counts, rounds, minutes);
longer ones are names (a map called Tokyo 2099) or years, the same on every screen."""
_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_NOTES_APART = 0x5DEECE66DA3B1F27
"""What a note's draws start from, apart from a turn's with the same key."""


def _draw(state: int) -> int:
    """splitmix64's output for ``state``: 64 well-mixed bits, a pure function of the state (a
    ``random.Random`` seeded for every turn takes about 8 µs; this about 0.6)."""
    z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def session_seed(name: str) -> int:
    """A session's seed, from its name: the same in every run and every process (``hash()`` of
    a string is salted per process)."""
    return zlib.crc32(name.encode())


class Words:
    """What the sessions say: the lines, each session's own, or, ``verbatim``, the same for all.

    Not verbatim, the turn a session says in place of the line ``lines[index]`` keeps that
    line's speaker, role and number of sentences, and draws each of its sentences from the pool
    of every line's sentences (the lines cut at :data:`SENTENCE_END`), uniformly, repeats and
    all: the words are the recordings' own natural language, a turn's sentences as many as its
    line's and as long as the pool's on average (so the chars said over a run stay what the lines
    say), and only whole texts stop repeating from one session to the next, as they would on a
    server of different conversations. The draws are a pure function of the session's seed and
    the turn's number (:func:`_draw`), so that a session says the same at the same turn in every
    run, whatever it said before or was resumed at, and a paired run of two servers sends both
    the same words.

    A screen note keeps its text and redraws its readings (:data:`SCREEN_READING`), each with
    as many digits as the recorded one (a 0 may stay 0): a screen note is a reading of a screen
    whose layout repeats from one game or meeting to the next (the scoreboard, the map vote,
    the character select) while what it reads differs, and that is what differs here.
    Recombining the notes' clauses would make readings no screen shows (and the recordings hold
    ten one-sentence notes, too few to recombine), and a serial number appended would be a
    detail no screen note has. A note with no such reading (a character select) is said as it is.
    """

    def __init__(self, lines: Sequence[Line], notes: Sequence[str], *, verbatim: bool = False) -> None:
        self.lines = tuple(lines)
        self.notes = tuple(notes)
        self.verbatim = verbatim
        # a text's sentences: none empty (a line ending in a space after its stop cuts into one)
        cut = [
            [part for part in SENTENCE_END.split(line.text) if part.strip()] or [line.text]
            for line in self.lines
        ]
        self.shapes = tuple(len(parts) for parts in cut)
        self.pool = tuple(sentence for parts in cut for sentence in parts)
        # a note as its texts between readings, and each reading's (lowest, how many) values
        self.screens: tuple[tuple[list[str], tuple[tuple[int, int], ...]], ...] = tuple(
            (parts[::2], tuple(self._range(reading) for reading in parts[1::2]))
            for parts in (SCREEN_READING.split(note) for note in self.notes)
        )

    @staticmethod
    def _range(reading: str) -> tuple[int, int]:
        if reading == "0":
            return 0, 10
        low = 10 ** (len(reading) - 1)
        return low, 9 * low

    def line(self, seed: int, turn: int, index: int) -> Line:
        """What session ``seed`` says at its turn ``turn`` in place of ``lines[index]``."""
        line = self.lines[index % len(self.lines)]
        if self.verbatim:
            return line
        pool, size = self.pool, len(self.pool)
        state = (seed & 0xFFFFFFFF) << 32 | (turn & 0xFFFFFFFF)
        drawn = []
        for _ in range(self.shapes[index % len(self.lines)]):
            state = (state + _GAMMA) & _MASK
            drawn.append(pool[(_draw(state) * size) >> 64])
        return Line(line.speaker, line.role, " ".join(drawn))

    def note(self, seed: int, turn: int, index: int) -> str:
        """The screen note session ``seed`` sees at its turn ``turn`` in place of ``notes[index]``."""
        if self.verbatim:
            return self.notes[index % len(self.notes)]
        texts, readings = self.screens[index % len(self.notes)]
        state = ((seed & 0xFFFFFFFF) << 32 | (turn & 0xFFFFFFFF)) ^ _NOTES_APART
        out = [texts[0]]
        for (low, count), text in zip(readings, texts[1:], strict=True):
            state = (state + _GAMMA) & _MASK
            out += (str(low + ((_draw(state) * count) >> 64)), text)
        return "".join(out)

    def describe(self) -> str:
        if self.verbatim:
            return "verbatim: every session says the same lines"
        return f"distinct per session: each turn's sentences drawn from the lines' {len(self.pool):,}"


WORDS = Words(LINES, NOTES)
"""The words every session says (``main`` makes them again from its options)."""


# -- processes ---------------------------------------------------------------------------


GAUGE = """
import time
best = float("inf")
for _ in range(3):
    started, total = time.perf_counter(), 0
    for k in range(2_000_000):
        total += k
    best = min(best, time.perf_counter() - started)
print(best)
"""


def box_gauge() -> float:
    """The box's speed: the ms a fixed loop of pure Python takes in a process of its own (the best of
    three). It moves with what else the host runs on its cores (the same code measured hours apart
    on one box differed by a third in CPU per exchange), so figures taken with unlike gauges do not
    compare; only pairs run back to back do."""
    out = subprocess.run([sys.executable, "-c", GAUGE], capture_output=True, text=True, check=True).stdout
    return float(out) * 1e3


def stat_cpu_seconds(stat: Path) -> float:
    """The user and system CPU seconds in a ``/proc`` ``stat`` file (a process's or a thread's);
    0 once it is gone."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def cpu_seconds(pid: int) -> float:
    return stat_cpu_seconds(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """A process's CPU seconds by thread name: ``event loop`` for its main thread, the others
    by the name the system keeps for them (a server names its store's and its fold's threads:
    ``sqlite-writer``, ``sqlite-reader``, ``fold``)."""
    out: dict[str, float] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            name = "event loop" if task.name == str(pid) else task.joinpath("comm").read_text().strip()
        except OSError:
            continue  # (a thread that ended meanwhile)
        out[name] = out.get(name, 0.0) + stat_cpu_seconds(task / "stat")
    return out


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


class Process:
    """A server in a child process that prints ``listening on URL`` once it serves."""

    def __init__(
        self, name: str, args: list[str], env: dict[str, str], log: Path, *, workers: int = 1
    ) -> None:
        self.name = name
        self.log = log
        self.workers = workers
        # /metrics answers for one worker: so many scrapes see each of them (very likely)
        self.scrapes = 4 * workers if workers > 1 else 1
        full = {k: v for k, v in os.environ.items() if not k.startswith("VOICE_CONTEXT_")} | env
        with log.open("a") as err:
            self.popen = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=err, text=True, env=full, start_new_session=True
            )
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline()
        if not line.startswith("listening on "):
            self.popen.kill()
            raise RuntimeError(f"{name} did not start: {line!r}\n{log.read_text()[-2000:]}")
        self.url = line.split()[-1]
        self.pid = self.popen.pid

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()

    def pids(self) -> list[int]:
        """The process, and a supervisor's workers, which do the serving."""
        if self.workers == 1:
            return [self.pid]
        from voice_context.testing.processes import children

        return [self.pid, *children(self.pid)]

    def rss(self) -> int:
        return sum(rss_bytes(pid) for pid in self.pids())

    @property
    def http(self) -> str:
        return self.url.replace("ws://", "http://").removesuffix("/v1")

    def metrics(self) -> dict[str, float]:
        """The server's counters from ``/metrics`` (label-free series only, plus compactions by event)."""
        with urllib.request.urlopen(self.http + "/metrics", timeout=10) as reply:
            text = reply.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
        return out


def serve_args(store: str, data_dir: Path, profile: Path | None = None, workers: int = 1) -> list[str]:
    """The real command line; with ``profile``, run under cProfile, which writes it there on exit."""
    python = [sys.executable] + (["-m", "cProfile", "-o", str(profile)] if profile else [])
    return [
        *python, "-m", "voice_context", "serve", "--port", "0", "--store", store,
        "--data-dir", str(data_dir), "--log-format", "json",
        *(["--workers", str(workers)] if workers > 1 else []),
    ]  # fmt: skip


# -- the trivial protocol-v1 server ------------------------------------------------------


async def trivial_main() -> None:
    """Answers every protocol-v1 request at once, one frame at a time per connection, from
    counters alone: the transport and the JSON, nothing else."""
    turns: dict[str, int] = {}

    async def handle(ws: ServerConnection) -> None:
        async for frame in ws:
            m = orjson.loads(frame)
            kind, name, mid = m.get("type"), m.get("session"), m.get("id")
            if kind == "session.open":
                reply = {"type": "session.opened", "session": name, "resumed": name in turns}
                reply |= {"turns": turns.setdefault(name, 0), "cursor": 0}
            elif kind == "turn.append":
                reply = {"type": "turn.appended", "session": name, "index": turns.get(name, 0)}
                turns[name] = turns.get(name, 0) + 1
            elif kind == "note.append":
                reply = {"type": "note.appended", "session": name, "live": 1, "pending": 0}
            elif kind == "context.get":
                reply = {"type": "context", "session": name, "format": "instructions", "summary": ""}
                reply |= {
                    "cursor": 0,
                    "covered_through": -1,
                    "in_flight": False,
                    "instructions": "",
                    "chars": 0,
                }
            elif kind == "ping":
                reply = {"type": "pong"}
            else:
                reply = {"type": "session.closed", "session": name}
            if mid is not None:
                reply["id"] = mid
            await ws.send(orjson.dumps(reply).decode())

    async with serve(handle, "127.0.0.1", 0, max_size=None) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        print(f"listening on ws://127.0.0.1:{port}/v1", flush=True)
        await asyncio.Future()


# -- the client: one event loop, many connections, requests matched to replies by id --------


class Link:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)
        self.waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.reader = asyncio.create_task(self._read())

    @classmethod
    async def open(cls, url: str) -> Link:
        return cls(await connect(url, max_size=None, ping_interval=None, compression=None))

    async def request(self, message: dict[str, Any]) -> dict[str, Any]:
        mid = next(self.ids)
        message["id"] = mid
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.waiting[mid] = future
        await self.ws.send(orjson.dumps(message).decode())
        reply = await future
        if reply.get("type") == "error":
            raise RuntimeError(f"{reply.get('code')}: {reply.get('message')}")
        return reply

    async def _read(self) -> None:
        async for frame in self.ws:
            reply = orjson.loads(frame)
            future = self.waiting.pop(reply.get("id"), None)  # pushed events carry no id
            if future is not None and not future.done():
                future.set_result(reply)

    async def close(self) -> None:
        self.reader.cancel()
        await self.ws.close()


@dataclass(eq=False)
class Talker:
    """One session: where it is in the recordings, how many turns it has, what its replies said."""

    name: str
    link: Link
    offset: int
    history: int = 0
    turns: int = 0
    cursor: int = 0
    in_flight: bool = False
    next_note: float = 0.0
    #: calls ended (``--call-seconds``): the session is the call's, ``name`` then ends in ``~calls``
    calls: int = 0
    #: when the call ends (None: its end is not drawn yet)
    call_ends: float | None = None
    ended_turns: int = 0  # said in the calls that ended
    words: Words = field(default_factory=lambda: WORDS)
    seed: int = field(init=False)

    def __post_init__(self) -> None:
        self.seed = session_seed(self.name)

    def lag(self) -> int:
        """Turns waiting behind the cursor beyond the recent window."""
        return max(0, self.turns - RECENT_WINDOW - self.cursor)

    def line(self) -> Line:
        """What the session says next."""
        return self.said(self.turns)

    def said(self, turn: int) -> Line:
        """What the session says at its turn ``turn`` (in place of the recordings' line ``offset + turn``)."""
        return self.words.line(self.seed, turn, self.offset + turn)

    async def open(self) -> None:
        reply = await self.link.request({"type": "session.open", "session": self.name})
        self.turns, self.cursor = reply.get("turns", 0), reply.get("cursor", 0)

    def next_append(self, line: Line | None = None) -> dict[str, Any]:
        """The ``turn.append`` of the session's next turn (counted as said)."""
        line = line or self.line()
        turn = {"speaker": line.speaker, "role": line.role, "text": line.text, "at": time.time()}
        turn["id"] = f"u{self.turns}"
        self.turns += 1
        return {"type": "turn.append", "session": self.name, "turn": turn}

    async def say(self, line: Line | None = None) -> None:
        await self.link.request(self.next_append(line))

    async def context(self, query: str | None = None) -> None:
        request: dict[str, Any] = {
            "type": "context.get", "session": self.name, "format": "instructions", "budget_chars": BUDGET
        }  # fmt: skip
        if query is not None:
            request["query"] = query
        reply = await self.link.request(request)
        self.cursor = reply.get("cursor", self.cursor)
        self.in_flight = bool(reply.get("in_flight"))

    async def next_call(self) -> None:
        """The call ends, its session closed, and the next call starts in a session of its own,
        with no history (``--call-seconds``)."""
        await self.link.request({"type": "session.close", "session": self.name})
        self.calls += 1
        self.ended_turns += self.turns
        self.name = f"{self.name.split('~')[0]}~{self.calls}"
        self.seed = session_seed(self.name)
        await self.open()

    async def note(self) -> None:
        n = self.offset + self.turns
        text = self.words.note(self.seed, self.turns, n)
        speaker = self.words.lines[n % len(self.words.lines)].speaker
        note = {"text": text, "at": time.time(), "speaker": speaker, "source": "screen"}
        await self.link.request({"type": "note.append", "session": self.name, "note": note})


@dataclass
class Sample:
    """What one phase measured on the client side."""

    replies: list[float] = field(default_factory=list)
    appends: list[float] = field(default_factory=list)
    turns: int = 0
    notes: int = 0
    exchanges: int = 0
    """Contexts completed with the bot turn after them (the user turns and notes since the last
    are part of the exchange)."""
    calls: int = 0
    """Calls ended, their sessions closed and new ones opened (``--call-seconds``)."""
    errors: int = 0
    lag_first: list[int] = field(default_factory=list)
    lag_last: list[int] = field(default_factory=list)
    index_first: list[float] = field(default_factory=list)
    index_last: list[float] = field(default_factory=list)
    """The servers' indexing lag (turns and notes waiting for the recall index, the most one
    session waits for), scraped from ``/metrics`` every 2 s, in each half of the step."""
    threads: dict[str, float] = field(default_factory=dict)
    """The servers' CPU over the phase by thread name (summed over their processes), in cores:
    read from ``/proc`` like their CPU in all."""


def pct(samples: Sequence[float], q: float) -> float:
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Progress:
    """One status line, rewritten in place on a terminal, printed every few seconds otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def show(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            sys.stderr.write("\r\x1b[2K" + text)
            sys.stderr.flush()
        elif force or now - self.last >= 10:
            print("  ..", text, file=sys.stderr, flush=True)
            self.last = now

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


PROGRESS = Progress()


# -- the harness -------------------------------------------------------------------------


class Harness:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="voice-context-load-"))
        self.redis: Any = None
        self.replicas: list[Process] = []
        self.trivial: Process | None = None
        self.talkers: list[Talker] = []
        self.links: dict[str, list[Link]] = {}
        self.baseline_rss = 0
        self.burst_turns = 0  # turns the burst stored on the replicas

    # servers

    def start(self) -> None:
        args = self.args
        store = args.store
        if store == "redis":
            from voice_context.testing.redis_server import RedisServer

            self.redis = RedisServer(directory=self.work / "redis")
            self.redis.start()
            store = self.redis.url
        elif args.replicas > 1 and not store.startswith(("redis", "unix")):
            raise SystemExit("several replicas need a shared store: --store redis")
        if args.profile and args.workers > 1:
            raise SystemExit("--profile runs one process under cProfile: the workers would go unprofiled")
        if args.profile:
            args.profile = args.profile.resolve()
            args.profile.mkdir(parents=True, exist_ok=True)
        for r in range(args.replicas):
            self.replicas.append(
                Process(
                    f"replica-{r}",
                    serve_args(
                        store,
                        self.work / f"data-{r}",
                        args.profile / f"replica-{r}.prof" if args.profile else None,
                        args.workers,
                    ),
                    SERVER_ENV | dict(args.setting),
                    self.work / f"serve-{r}.log",
                    workers=args.workers,
                )
            )
        self.trivial = Process(
            "trivial", [sys.executable, __file__, "--trivial"], {}, self.work / "trivial.log"
        )
        time.sleep(0.5)
        self.baseline_rss = sum(p.rss() for p in self.replicas)

    def stop(self) -> None:
        for p in [*self.replicas, *([self.trivial] if self.trivial else [])]:
            p.stop()
        if self.redis is not None:
            self.redis.stop()
        if not self.args.keep:
            shutil.rmtree(self.work, ignore_errors=True)

    def server_pids(self) -> list[int]:
        pids = [pid for p in self.replicas for pid in p.pids()]
        if self.redis is not None and self.redis.process is not None:
            pids.append(self.redis.process.pid)
        return pids

    def disk_bytes(self) -> int:
        total = 0
        for r in range(len(self.replicas)):
            for path in (self.work / f"data-{r}").glob("*"):
                total += path.stat().st_size
        if self.redis is not None:
            for path in (self.work / "redis").rglob("*"):
                if path.is_file():
                    total += path.stat().st_size
        return total

    async def links_for(self, target: str, count: int) -> list[Link]:
        """``count`` connections to each replica (or to the trivial server)."""
        have = self.links.setdefault(target, [])
        urls = [self.trivial.url] if target == "trivial" and self.trivial else [p.url for p in self.replicas]
        while len(have) < count * len(urls):
            have.append(await Link.open(urls[len(have) % len(urls)]))
        return have

    # the burst

    async def burst(self, target: str) -> tuple[float, int]:
        args = self.args
        links = await self.links_for(target, args.connections)
        talkers = [
            Talker(f"burst-{target}-{k}", links[k % len(links)], offset=k * 7)
            for k in range(args.burst_sessions)
        ]
        await asyncio.gather(*(t.open() for t in talkers))
        done = 0
        started = time.perf_counter()

        async def run(t: Talker) -> None:
            nonlocal done
            for _ in range(args.burst_turns):
                await t.say()
                done += 1

        async def show() -> None:
            while True:
                await asyncio.sleep(1)
                elapsed = time.perf_counter() - started
                PROGRESS.show(f"burst on {target}: {done:,} turns, {done / elapsed:,.0f} turns/s")

        shower = asyncio.create_task(show())
        await asyncio.gather(*(run(t) for t in talkers))
        elapsed = time.perf_counter() - started
        shower.cancel()
        PROGRESS.done()
        await asyncio.gather(*(t.link.request({"type": "session.close", "session": t.name}) for t in talkers))
        return done / elapsed, done

    # paced sessions

    async def grow(self, target: str, n: int) -> list[Talker]:
        """The first ``n`` paced sessions on a target, opening (and preloading) the missing ones."""
        links = await self.links_for(target, max(1, -(-n // self.args.sessions_per_connection)))
        mine = [t for t in self.talkers if t.link in links]

        def talker(k: int) -> Talker:
            offset, history = (k * 37) % len(LINES), 30 + (k * 7919) % 60
            if self.args.pattern == "voice":  # at a user's line, and back at one after the history
                offset, history = offset - offset % 2, history - history % 2
            return Talker(f"voice-{target}-{k}", links[k % len(links)], offset, history)

        new = [talker(k) for k in range(len(mine), n)]
        await asyncio.gather(*(t.open() for t in new))

        async def preload(t: Talker, count: int) -> None:
            for _ in range(count):
                await t.say()

        started = time.perf_counter()
        pre = asyncio.gather(*(preload(t, t.history) for t in new))
        while not pre.done():
            await asyncio.sleep(0.5)
            PROGRESS.show(
                f"{target}: opening {len(new)} sessions with history, "
                f"{sum(t.turns for t in new):,} turns in {time.perf_counter() - started:.0f}s"
            )
        await pre
        if target != "trivial" and self.args.pattern == "voice":
            await self.settle(new)  # (the group pattern folds it within its first steps, as it always has)
        self.talkers.extend(new)
        return [*mine, *new]

    async def settle(self, talkers: list[Talker], limit: float = 120.0) -> None:
        """The history just loaded brought up to date before a step: every session asks for
        contexts until one starts no fold and finds none running, then the indexing drains; so
        that the step's CPU is its own exchanges', not the history's folds and indexing."""
        started = time.perf_counter()
        pending = talkers
        while pending and time.perf_counter() - started < limit:
            await asyncio.gather(*(t.context() for t in pending))
            pending = [t for t in pending if t.in_flight]
            PROGRESS.show(f"folding the history: {len(pending)} sessions with a fold in flight")
            if pending:
                await asyncio.sleep(0.5)
        await self.index_drain(max(1.0, limit - (time.perf_counter() - started)))
        PROGRESS.done()
        if pending:
            print(f"   ({len(pending)} sessions still folding their history after {limit:g}s)", flush=True)

    async def paced(
        self, talkers: list[Talker], seconds: float, label: str
    ) -> tuple[Sample, dict[str, float]]:
        sample = Sample()
        loop = asyncio.get_running_loop()
        started = loop.time()
        stop = started + seconds
        rng = random.Random(len(talkers))
        pids = self.server_pids() if label != "trivial" else ([self.trivial.pid] if self.trivial else [])
        cpu0 = [cpu_seconds(p) for p in pids]
        threads0 = [thread_cpu_seconds(p) for p in pids]
        me0 = time.process_time()

        async def say(t: Talker, line: Line) -> None:
            t0 = time.perf_counter()
            await t.say(line)
            sample.appends.append(time.perf_counter() - t0)
            sample.turns += 1

        async def context(t: Talker, query: str | None = None) -> None:
            t0 = time.perf_counter()
            await t.context(query)
            sample.replies.append(time.perf_counter() - t0)
            (sample.lag_first if loop.time() < started + seconds / 2 else sample.lag_last).append(t.lag())

        async def pause(low: float, high: float) -> None:
            """A pause, cut short at the step's end, so that the step's wall clock is its own."""
            await asyncio.sleep(min(rng.uniform(low, high), max(0.0, stop - loop.time())))

        async def note(t: Talker) -> None:
            if loop.time() >= t.next_note:
                await t.note()
                sample.notes += 1
                t.next_note += rng.uniform(25, 35)

        call = self.args.call_seconds

        async def hang_up(t: Talker) -> None:
            """With ``--call-seconds``: the call ends once its time is up, and the next begins."""
            if not call:
                return
            now = loop.time()
            if t.call_ends is None:  # the first call began at a random point of its length
                t.call_ends = now + rng.uniform(0, 2 * call)
            elif now >= t.call_ends:
                await t.next_call()
                sample.calls += 1
                t.call_ends = now + rng.uniform(0.5 * call, 1.5 * call)

        async def group(t: Talker) -> None:
            """A turn every 2-4 s, in the role its line has; a context before each bot turn."""
            await pause(0, 4)  # spread the sessions' first turns
            t.next_note = loop.time() + rng.uniform(0, 30)
            while loop.time() < stop:
                line = t.line()
                try:
                    if line.role == "assistant":
                        await context(t)
                    await say(t, line)
                    if line.role == "assistant":
                        sample.exchanges += 1
                    await note(t)
                    await hang_up(t)
                except RuntimeError:
                    sample.errors += 1
                await pause(2, 4)

        async def voice(t: Talker) -> None:
            """A user turn, its context (the turn as the query), the bot's turn 0.4 s later, 3-6 s."""
            await pause(0, 6)  # spread the sessions' first turns
            t.next_note = loop.time() + rng.uniform(0, 30)
            while loop.time() < stop:
                try:
                    user = replace(t.line(), role="user")
                    await say(t, user)
                    await context(t, user.text)
                    await asyncio.sleep(BOT_DELAY)
                    await say(t, replace(t.line(), role="assistant"))
                    sample.exchanges += 1
                    await note(t)
                    await hang_up(t)
                except RuntimeError:
                    sample.errors += 1
                await pause(3, 6)

        one = voice if self.args.pattern == "voice" else group

        async def show() -> None:
            while True:
                await asyncio.sleep(1)
                elapsed = loop.time() - started
                lag = max((t.lag() for t in talkers), default=0)
                PROGRESS.show(
                    f"{label}: {len(talkers)} sessions, {elapsed:4.0f}/{seconds:.0f}s, "
                    f"{sample.turns / max(elapsed, 1e-9):6.1f} turns/s, "
                    f"reply p99 {pct(sample.replies, 0.99) * 1e3:6.1f} ms, lag max {lag}"
                )

        async def scrape() -> None:
            while label != "trivial":
                await asyncio.sleep(2)
                lag = await self.indexing_lag()
                (sample.index_first if loop.time() < started + seconds / 2 else sample.index_last).append(lag)

        shower = asyncio.create_task(show())
        scraper = asyncio.create_task(scrape())
        await asyncio.gather(*(one(t) for t in talkers))
        shower.cancel()
        scraper.cancel()
        PROGRESS.done()
        wall = loop.time() - started
        cpu = sum(cpu_seconds(p) - c for p, c in zip(pids, cpu0, strict=True))
        threads: dict[str, float] = {}
        for pid, before in zip(pids, threads0, strict=True):
            for name, seconds in thread_cpu_seconds(pid).items():
                threads[name] = threads.get(name, 0.0) + seconds - before.get(name, 0.0)
        sample.threads = {name: seconds / wall for name, seconds in threads.items()}
        usage = {
            "wall": wall,
            "server_cpu": cpu / wall,
            "server_ms_per_exchange": cpu * 1e3 / sample.exchanges if sample.exchanges else float("nan"),
            "client_cpu": (time.process_time() - me0) / wall,
        }
        return sample, usage

    async def index_drain(self, limit: float = 120.0) -> tuple[float, float]:
        """The indexing lag now, and how long it takes to reach 0 (at most ``limit`` seconds)."""
        first = await self.indexing_lag()
        started = time.perf_counter()
        lag = first
        while lag > 0 and time.perf_counter() - started < limit:
            await asyncio.sleep(0.2)
            lag = await self.indexing_lag()
        return first, time.perf_counter() - started

    async def indexing_lag(self) -> float:
        """The most turns and notes one session waits for the recall index, over the replicas."""
        lags = [
            (await asyncio.to_thread(p.metrics)).get("voice_context_indexing_lag_max", 0.0)
            for p in self.replicas
            for _ in range(p.scrapes)
        ]
        return max(lags, default=0.0)

    def folds(self) -> Folds:
        """The folds every server (every worker) logged; started twice: for a batch another fold
        had already started at, across replicas."""
        seen: set[tuple[str, int]] = set()
        counts = dict.fromkeys(("started", "completed", "failed", "twice"), 0)
        for r in range(len(self.replicas)):
            for raw in (self.work / f"serve-{r}.log").read_text().splitlines():
                what = next((k for k in ("started", "completed", "failed") if f'"{FOLD}{k}"' in raw), None)
                if what is None:
                    continue
                counts[what] += 1
                if what == "started":
                    entry = json.loads(raw)
                    key = (entry["session"], entry["cursor"])
                    counts["twice"] += int(key in seen)
                    seen.add(key)
        return Folds(**counts)


FOLD = "voice_context_compaction_"
"""How the servers' log events about folds begin (each counted beside its counter on /metrics)."""


@dataclass(frozen=True)
class Folds:
    started: int
    completed: int
    failed: int
    twice: int


def lag_verdict(sample: Sample) -> tuple[int, float, float, bool]:
    first = statistics.fmean(sample.lag_first) if sample.lag_first else 0.0
    last = statistics.fmean(sample.lag_last) if sample.lag_last else 0.0
    worst = max([*sample.lag_first, *sample.lag_last], default=0)
    # a fold takes 10 turns at a time, so one session's lag saws between 0 and a batch or two; the
    # mean over every session moves by a turn or so from noise alone. Growing is more than that.
    grows = last > first + 2.0
    return worst, first, last, grows


async def ramp(args: argparse.Namespace) -> None:
    h = Harness(args)
    print(
        f"== voice-context load: {os.cpu_count()} cores; the load generator is this process"
        f" (pid {os.getpid()}), apart from every server; {args.replicas} replica(s) of {args.workers}"
        f" worker(s), store {args.store!r}" + "".join(f"; {name}={value}" for name, value in args.setting)
    )
    h.start()
    try:
        print(
            "   servers: "
            + ", ".join(f"{p.name} pid {p.pid} {p.url}" for p in h.replicas)
            + f"; trivial {h.trivial and h.trivial.url}"
        )
        if args.burst_sessions:
            print(
                f"\n== burst: {args.burst_sessions:,} sessions x {args.burst_turns} turns over"
                f" {args.connections} connections per server, acknowledged turns/s"
            )
            probe = await h.grow("voice", args.probe_sessions) if args.probe_sessions else []
            idle = (await h.paced(probe, args.probe_seconds, "before the burst"))[0] if probe else None
            trivial_rate, _ = await h.burst("trivial")
            real, h.burst_turns = await h.burst("voice")
            # the same paced sessions at once, while the burst's folds and indexing are still to do
            drain = asyncio.create_task(h.index_drain())
            after = (await h.paced(probe, args.probe_seconds, "after the burst"))[0] if probe else None
            left, drained = await drain
            print(f"   trivial protocol-v1 server   {trivial_rate:9,.0f} turns/s")
            print(
                f"   voice-context ({args.store:<6})      {real:9,.0f} turns/s"
                f"   x{real / trivial_rate:.2f} of trivial"
            )
            print(
                f"   indexing lag at the burst's end: {left:,.0f} turns (the most one session waited for),"
                f" drained in {drained:.1f}s"
            )
            if idle is not None and after is not None:

                def spread(replies: list[float]) -> str:
                    return " / ".join(
                        f"{x * 1e3:.1f}" for x in (pct(replies, 0.5), pct(replies, 0.99), max(replies))
                    )

                ratio = pct(after.replies, 0.99) / pct(idle.replies, 0.99)
                print(
                    f"   {len(probe)} paced sessions' replies, p50 / p99 / max ms: {spread(idle.replies)}"
                    f" in the {args.probe_seconds:g}s before the burst, {spread(after.replies)} in the"
                    f" {args.probe_seconds:g}s right after it; p99 x{ratio:.2f} of before"
                )
        words = ", ".join(w.name for w in args.words) if args.words else "the recordings in fixtures/"
        print(
            f"\n== ramp: paced sessions, pattern {args.pattern!r}, words {words} ({len(LINES):,} lines,"
            f" {WORDS.describe()};"
            f" {args.step_seconds:g}s per step, the trivial server first, then voice-context;"
            f" {args.sessions_per_connection} sessions per connection)"
        )
        header = (
            f"{'N':>6} {'turns/s':>8} {'ctx p50':>8} {'p99':>7} {'max':>7} {'triv p99':>8} {'x':>5}"
            f" {'app p99':>8} {'lag max':>7} {'lag 1st/2nd half':>16} {'grows':>5} {'idx lag 1st/2nd':>15}"
            f" {'srv CPU':>7} {'ms/exch':>7} {'triv ms/exch':>12} {'gen CPU':>7}"
            f" {'KB/sess':>8} {'errors':>6}"
        )
        print(
            "   (srv CPU: the servers' CPU, in % of one core; ms/exch: their CPU seconds per exchange"
            " completed, a context and the bot turn after it with the user turns and notes since the"
            " last; triv: the trivial server's, the same way; the box's gauge: a fixed loop of pure"
            " Python timed in a process of its own before each step, which moves with what else the"
            " host runs: compare steps with like gauges)"
        )
        print(header)
        capacity = within_budget = 0
        for n in [n for n in args.steps if n > 0]:
            gauge = box_gauge()  # before the step's sessions talk (the servers may still fold the last)
            trivial_talkers = await h.grow("trivial", n)
            triv, triv_usage = await h.paced(trivial_talkers, args.step_seconds, "trivial")
            talkers = await h.grow("voice", n)
            rss_before = sum(p.rss() for p in h.replicas)
            sample, usage = await h.paced(talkers, args.step_seconds, "voice")
            rss = sum(p.rss() for p in h.replicas)
            worst, first, last, grows = lag_verdict(sample)
            index_first = max(sample.index_first, default=0.0)
            index_last = max(sample.index_last, default=0.0)
            # indexing saws between 0 and a few turns; growing is more than a batch's worth, and more
            index_grows = index_last > max(2 * index_first, index_first + 10)
            grows = grows or index_grows
            ratio = pct(sample.replies, 0.99) / pct(triv.replies, 0.99)
            ok = ratio <= args.p99_ratio and not grows and sample.errors == 0
            if ok:
                capacity = n
            if pct(sample.replies, 0.99) * 1e3 <= args.p99_budget_ms and not grows and sample.errors == 0:
                within_budget = n
            per_session = (max(rss, rss_before) - h.baseline_rss) / n / 1024
            print(
                f"{n:>6} {sample.turns / usage['wall']:>8.1f} {pct(sample.replies, 0.5) * 1e3:>6.2f}ms"
                f" {pct(sample.replies, 0.99) * 1e3:>5.1f}ms {max(sample.replies, default=0) * 1e3:>5.0f}ms"
                f" {pct(triv.replies, 0.99) * 1e3:>6.2f}ms {ratio:>5.2f}"
                f" {pct(sample.appends, 0.99) * 1e3:>6.1f}ms"
                f" {worst:>7} {first:>7.1f}/{last:<8.1f} {'yes' if grows else 'no':>5}"
                f" {index_first:>7.0f}/{index_last:<7.0f}"
                f" {usage['server_cpu'] * 100:>6.0f}% {usage['server_ms_per_exchange']:>5.2f}ms"
                f" {triv_usage['server_ms_per_exchange']:>10.3f}ms"
                f" {usage['client_cpu'] * 100:>6.0f}% {per_session:>8.1f}"
                f" {sample.errors:>6}",
                flush=True,
            )
            print(f"{'':>6} the box's gauge before the step: {gauge:.0f} ms (lower is faster)")
            busy = sorted(
                ((cores, name) for name, cores in sample.threads.items() if cores >= 0.005), reverse=True
            )
            if busy:
                shares = ", ".join(f"{name} {share * 100:.0f}%" for share, name in busy)
                print(f"{'':>6} the servers' CPU by thread, in % of one core: {shares}")
            if args.call_seconds:
                ended = f"{sample.calls} ({triv.calls} on the trivial server)"
                print(f"{'':>6} calls ended and begun again: {ended}")
            if not ok and args.stop_at_capacity:
                break
        folds = h.folds()
        voices = [t for t in h.talkers if t.name.startswith("voice-voice")]
        stored = h.burst_turns + sum(t.turns + t.ended_turns for t in voices)
        print(
            f"\n   folds: {folds.completed} completed, {folds.failed} failed;"
            f" {folds.started} started, {folds.twice} of them for a batch already started"
        )
        print(
            f"   bytes on disk: {h.disk_bytes() / max(stored, 1):,.0f} per turn"
            f" ({stored:,} turns stored, the burst's among them)"
        )
        print(
            f"\n   capacity: {capacity:,} paced sessions (reply p99 within {args.p99_ratio}x of the"
            " trivial server's, no growing fold or indexing lag, no errors)"
        )
        print(f"   within a {args.p99_budget_ms:g} ms reply p99: {within_budget:,} paced sessions")
    finally:
        for links in h.links.values():
            for link in links:
                await link.close()
        h.stop()


# -- one session's backlog, folded with no context asked ----------------------------------


async def backlog(args: argparse.Namespace) -> None:
    """One session: ``--backlog`` turns appended as fast as they are acknowledged, no context
    asked; then how long its folds take to catch up (``session.state`` polled, which starts
    nothing), and a context's round trip once they have."""
    h = Harness(args)
    h.start()
    print(f"== one session's backlog, no context asked: store {args.store!r}, {os.cpu_count()} cores")
    try:
        links = await h.links_for("voice", 1)
        talker = Talker("backlog-voice", links[0], 0)
        await talker.open()
        t0 = time.perf_counter()
        while talker.turns < args.backlog:  # at full speed: 50 appends in flight, as a bulk import sends
            window = [talker.next_append() for _ in range(min(50, args.backlog - talker.turns))]
            await asyncio.gather(*map(talker.link.request, window))
            PROGRESS.show(f"appending: {talker.turns:,} turns")
        appended = time.perf_counter() - t0
        PROGRESS.done()
        state = await talker.link.request({"type": "session.state", "session": talker.name})
        left = state["turns"] - state["cursor"]
        rate = args.backlog / appended
        print(
            f"   {args.backlog:,} turns appended in {appended:.1f}s ({rate:,.0f} turns/s); "
            f"at the last acknowledgement {left:,} turns were not folded yet"
        )
        t1 = time.perf_counter()
        # folded: less than a backlog left (the recent window and 4 batches) and no fold in flight
        while state["in_flight"] or state["turns"] - state["cursor"] >= 50 + 4 * 10:
            await asyncio.sleep(0.2)
            state = await talker.link.request({"type": "session.state", "session": talker.name})
            PROGRESS.show(f"folding: cursor {state['cursor']:,} of {state['turns']:,}")
            if time.perf_counter() - t1 > args.backlog_wait:
                print(f"   not folded {args.backlog_wait:g}s after the last append")
                break
        PROGRESS.done()
        since_last = time.perf_counter() - t1
        print(
            f"   folded to cursor {state['cursor']:,} {since_last:.1f}s after the last append "
            f"({appended + since_last:.1f}s after the first), no context asked"
        )
        replies = []
        for _ in range(args.samples):
            t2 = time.perf_counter()
            await talker.context()
            replies.append(time.perf_counter() - t2)
        p50, p99 = pct(replies, 0.5) * 1000, pct(replies, 0.99) * 1000
        print(f"   then a context: p50 {p50:.2f} ms, p99 {p99:.2f} ms ({args.samples} requests)")
    finally:
        h.stop()


# -- one session, longer and longer ------------------------------------------------------


async def length(args: argparse.Namespace) -> None:
    from voice_context.core.config import SessionConfig
    from voice_context.core.session import Session, TurnAppended
    from voice_context.core.turns import Turn
    from voice_context.recall.index import RecallIndex, recall_candidates

    h = Harness(args)
    h.start()
    print(f"== one session, longer and longer: store {args.store!r}, {os.cpu_count()} cores")
    print(
        f"{'turns':>7} {'ctx p50':>8} {'ctx p99':>8} {'triv p99':>8} {'fold mean':>9} {'fold max':>8}"
        f" {'recall p99':>10} {'server RSS':>10} {'vs start':>9} {'disk/turn':>9}"
    )
    index = RecallIndex()
    session = Session("length", SessionConfig())
    try:
        links = await h.links_for("voice", 1)
        trivial = (await h.links_for("trivial", 1))[0]
        talker = Talker("length-voice", links[0], 0)
        await talker.open()
        shadow = Talker("length-trivial", trivial, 0)
        await shadow.open()
        rss0 = h.replicas[0].rss()
        log = h.work / "serve-0.log"
        seen_lines = 0
        for target in args.lengths:
            while talker.turns < target:
                line = talker.line()
                n = talker.turns
                await talker.say(line)
                turn = Turn(
                    line.speaker, "assistant" if line.role == "assistant" else "user", line.text, time.time()
                )
                index.add_turn(n, turn)
                session.receive(TurnAppended(turn))
                if n % 20 == 19:
                    await talker.context()  # folds keep up as they would in a call
                if n % 500 == 0:
                    PROGRESS.show(f"growing to {target:,}: {talker.turns:,} turns")
            PROGRESS.done()
            await asyncio.sleep(1.0)  # let the folds in flight land
            replies, baseline, recalls = [], [], []
            for k in range(args.samples):
                t0 = time.perf_counter()
                await talker.context()
                replies.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await shadow.context()
                baseline.append(time.perf_counter() - t0)
                query = talker.said(k * 7).text  # its turn 7k's words, said by now or not
                folded = Session(
                    "length",
                    SessionConfig(),
                    cursor=max(0, talker.turns - 60),
                    turns=session.verbatim_turns[-60:],
                )
                t0 = time.perf_counter()
                recall_candidates(index, folded, query)
                recalls.append(time.perf_counter() - t0)
            lines = log.read_text().splitlines()
            folds = [
                json.loads(raw)["latency"]
                for raw in lines[seen_lines:]
                if '"voice_context_compaction_completed"' in raw
            ]
            seen_lines = len(lines)
            rss = h.replicas[0].rss()
            print(
                f"{talker.turns:>7,} {pct(replies, 0.5) * 1e3:>6.2f}ms {pct(replies, 0.99) * 1e3:>6.2f}ms"
                f" {pct(baseline, 0.99) * 1e3:>6.2f}ms"
                f" {(statistics.fmean(folds) * 1e3 if folds else float('nan')):>7.1f}ms"
                f" {(max(folds) * 1e3 if folds else float('nan')):>6.1f}ms {pct(recalls, 0.99) * 1e3:>8.2f}ms"
                f" {rss / 2**20:>8.1f}MB {(rss - rss0) / 1024:>7.0f}KB {h.disk_bytes() / talker.turns:>9.0f}",
                flush=True,
            )
    finally:
        for links in h.links.values():
            for link in links:
                await link.close()
        h.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", nargs="?", default="ramp", choices=("ramp", "length", "backlog"))
    parser.add_argument("--trivial", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--store", default="sqlite", help="sqlite (default), memory or redis (a redis-server is started)"
    )
    parser.add_argument("--replicas", type=int, default=1)
    parser.add_argument(
        "--workers", type=int, default=1, metavar="N", help="serve --workers N for each replica (default 1)"
    )
    parser.add_argument(
        "--steps", type=lambda s: [int(x) for x in s.split(",")], default=[250, 500, 1000, 1500]
    )
    parser.add_argument("--step-seconds", type=float, default=30.0)
    parser.add_argument(
        "--call-seconds",
        type=float,
        default=0.0,
        help="paced sessions end after about this long (0.5-1.5x) and new ones start in their place,"
        " as the calls of a telephony bot do (0: sessions never end)",
    )
    parser.add_argument("--sessions-per-connection", type=int, default=25)
    parser.add_argument("--connections", type=int, default=20, help="connections per server for the burst")
    parser.add_argument("--burst-sessions", type=int, default=1000, help="0 skips the burst")
    parser.add_argument("--burst-turns", type=int, default=60)
    parser.add_argument(
        "--probe-sessions",
        type=int,
        default=50,
        help="paced sessions whose replies are measured before the burst and right after it (0: none)",
    )
    parser.add_argument(
        "--probe-seconds", type=float, default=20.0, help="how long each of those two steps lasts"
    )
    parser.add_argument("--p99-ratio", type=float, default=1.5)
    parser.add_argument("--p99-budget-ms", type=float, default=100.0, help="capacity within this p99")
    parser.add_argument(
        "--stop-at-capacity", action="store_true", help="stop the ramp at the first step past it"
    )
    parser.add_argument(
        "--lengths", type=lambda s: [int(x) for x in s.split(",")], default=[100, 1000, 5000, 20000]
    )
    parser.add_argument("--samples", type=int, default=200, help="context requests per length")
    parser.add_argument("--backlog", type=int, default=20_000, help="turns the backlog mode appends")
    parser.add_argument("--backlog-wait", type=float, default=300.0, help="how long it waits for the folds")
    parser.add_argument("--keep", action="store_true", help="keep the servers' files and logs")
    parser.add_argument(
        "--setting",
        type=setting_env,
        action="append",
        default=[],
        metavar="GROUP.FIELD=VALUE",
        help="a setting for the voice-context servers (repeatable), e.g. server.gc_freeze_seconds=10;"
        " they get none of the environment's VOICE_CONTEXT_* variables",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="run the replicas under cProfile and write replica-N.prof into DIR when they stop "
        "(read with python -m pstats; the figures then include the profiler's overhead)",
    )
    parser.add_argument(
        "--pattern",
        choices=("voice", "group"),
        default="voice",
        help="voice (default): a user turn, its context (the turn as the query), the bot's turn 0.4 s "
        "later, 3-6 s; group: a turn every 2-4 s in its line's role, a context before each bot turn",
    )
    parser.add_argument(
        "--words",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="LoCoMo-format JSON conversations to take the words from, said by a user and a bot in "
        "turn (by default the recordings in fixtures/)",
    )
    parser.add_argument(
        "--verbatim-words",
        action="store_true",
        help="every session says the lines verbatim, as the harness did before: figures comparable with "
        "those measured so (by default each session says texts of its own, the lines' sentences redrawn "
        "per session and turn, so that the servers' caches keyed by text are not hit by every session "
        "saying the same lines, as they would not be with different conversations)",
    )
    parser.add_argument(
        "--dialogue",
        action="store_true",
        help="with --pattern group: the recordings' lines said by a user and a bot in turn "
        "(by default their own roles: a group, about 7 user turns to each bot turn)",
    )
    parser.add_argument(
        "--recall-ahead", choices=("first", "every", "off"), help="the servers' [recall] ahead"
    )
    return parser


def words_for(args: argparse.Namespace) -> tuple[list[Line], Words]:
    """The lines the options ask for (from the recordings as recorded), and what the sessions say of them."""
    if args.words:
        lines = in_turn(dialogue_lines(args.words))
    elif args.dialogue or (args.mode == "ramp" and args.pattern == "voice"):
        lines = in_turn(LINES)
    else:
        lines = list(LINES)
    return lines, Words(lines, NOTES, verbatim=args.verbatim_words)


def main() -> None:
    global WORDS
    args = build_parser().parse_args()
    LINES[:], WORDS = words_for(args)
    if args.recall_ahead:
        SERVER_ENV["VOICE_CONTEXT_RECALL_AHEAD"] = args.recall_ahead
    if args.trivial:
        asyncio.run(trivial_main())
        return
    modes = {"ramp": ramp, "length": length, "backlog": backlog}
    asyncio.run(modes[args.mode](args))


if __name__ == "__main__":
    main()
