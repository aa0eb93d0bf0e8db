"""Benchmarks of the reply path. Prints figures; asserts nothing.

1. ``build_context`` alone, by format and transcript size (the pure core).
2. ``SessionManager.context`` while idle, against the same calls while a
   summarizer that takes a long time is folding a batch for the session: the
   ratio shows whether a compaction in flight delays a reply.
3. Many sessions at once: the same percentiles across 50 sessions, each with
   its own compaction in flight.
4. Over the wire: ``context.get`` round trips through a real server on
   127.0.0.1 with the client, against ``ping`` round trips (the transport's
   floor) and against ``context.get`` while a slow fold is in flight.
5. The OpenAI Realtime integration: what one user turn costs (the turn stored,
   the context fetched, the ``session.update`` handed to the realtime socket)
   against the client's ping and its append alone; and what the pipecat
   processor adds to one LLM run (the new words stored, the context fetched), and
   what the LiveKit Agents hooks add to one reply.
6. Recall on the reply path: a 5,000-turn session (the text of the project's
   own recordings, each turn numbered), a context with a query (recall over the
   whole history, then the budget) against the same context with recall off:
   in process over an in-memory index (what a replay runs), and through
   ``SessionManager.context`` over the index a SQLite store keeps beside the
   turns (what a server runs); what indexing one turn costs; and what the
   served session holds in the process. Then a user turn stored and its context
   asked for 5 ms later, with recall ahead off (the context searches) and on
   (the search ran when the turn was stored).
7. Token budgets: ``build_context`` under a token budget in ``o200k_base`` (a
   warm count cache, as on a live session), against the same context under the
   char budget of the same size (4 chars a token).
8. Deterministic compression: ``compress`` of 100 fresh messages (conversation
   with repeats, rephrasings and filler), without and with a budget that
   forces convergence, against reading each message once (normalizing its
   words: the floor of any de-duplication).

9. A megabyte answer: an OpenAI-compatible server (the test server, in a
   process of its own) that ignores the token cap answers every fold with
   1 MB of prose, in 64 KB chunks and a word a chunk; the longest the event
   loop is blocked (a task that wakes every millisecond, its longest gap) while
   such a fold lands, folding a paragraph and by lines.

``--llm [MODEL]`` measures a real local model instead (a name from
``scripts/models``, smollm2 by default, or a GGUF file): it starts
``llama_cpp.server`` on 127.0.0.1, waits for it, and stops it at the end.

10. Seconds per fold: the project's own recordings folded batch by batch
   (10 turns, the summary carried from fold to fold) by the model, each fold
   timed, with the folds the fold check rejected (the deterministic lines
   stood in).
11. Over the wire with the model as the server's summarizer: ``context.get``
   while idle against ``context.get`` while the model folds a batch.

``--codec`` measures only the codec, beside msgspec (the ``bench`` extra); ``--postings DB``
only recall's postings walk, over a SQLite store (``scripts/load --keep`` leaves one):

12. Reading a client frame (JSON to a checked, typed message) with ours (orjson,
   then each field checked in Python) against msgspec structs that state the same
   limits, with the checks msgspec cannot state done after it, both ending in the
   same message; and writing a context reply with orjson against msgspec's encoder.
13. A search's postings walk: the store's rows read into Python and scored there
   (``select_postings``, ``bm25``) against BM25 summed by SQLite in C, over the
   newest user turns of up to 200 of the store's sessions as queries (the same
   scores, checked).

``--index-writes`` measures only what the recall index's writes cost a SQLite store
(``--words FILE...``: LoCoMo-format dialogue, the project's recordings without):

14. 40 sessions with a history of 60, 600 and 3,000 turns indexed, then 64 more turns
   each indexed, the sessions in turn as live sessions are: a turn at a time (each in
   a write of its own, as a turn's postings were written) against ``HELD_TURNS`` at a
   time (as a served session's are): the bytes the process hands the kernel to write
   (``wchar`` in ``/proc/self/io``: the log's frames and the checkpoints' copies) and
   its write calls per turn, and the CPU per turn, with the ratios to a turn at a time.

``--group-writes`` measures only a SQLite group's writes:

15. A group of 10, 100 and 400 sessions' turns written by the store's group commit, and
   their recall docs by its index group, against the same turns written one statement a
   row (``executemany``, as before), with another thread idle and then running pure Python
   (as the event loop does under load): ms a group at p50 and p99, and the statements it ran.
   CPython's ``sqlite3`` lets go of the interpreter's lock for every row a statement steps
   over; with the other thread busy, each taking back waits up to the switch interval, while
   the transaction holds the file's write lock.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import structlog

from voice_context import DeterministicSummarizer, SessionConfig, SessionManager, Turn
from voice_context.config import AheadMode, Settings
from voice_context.core.budget import build_context
from voice_context.core.session import Session, TurnAppended
from voice_context.recall.index import RecallIndex, recall_candidates
from voice_context.summarizers.compress import compress
from voice_context.summarizers.fakes import SlowSummarizer
from voice_context.summarizers.openai_compat import Fold
from voice_context.summarizers.repeats import key_of
from voice_context.tokenizers import load_tokenizer

WORDS = "we should try the new team comp tonight because Bob keeps dying as Hulk on Tokyo".split()


def turn(i: int) -> Turn:
    speaker = ("Alice", "Bob", "Nova")[i % 3]
    role = "assistant" if speaker == "Nova" else "user"
    text = " ".join(WORDS[(i + k) % len(WORDS)] for k in range(8 + i % 30))
    return Turn(speaker, role, f"{text} ({i}).", at=1_700_000_000.0 + 4 * i)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def row(label: str, samples: list[float], baseline: list[float] | None = None) -> str:
    p50, p99 = pct(samples, 0.5) * 1e6, pct(samples, 0.99) * 1e6
    ratio = ""
    if baseline:
        ratio = f"  p50 x{p50 / (pct(baseline, 0.5) * 1e6):.2f}  p99 x{p99 / (pct(baseline, 0.99) * 1e6):.2f}"
    mean = statistics.fmean(samples) * 1e6
    return f"{label:<52} p50 {p50:8.1f} us  p99 {p99:8.1f} us  mean {mean:8.1f} us{ratio}"


def timed(fn: Callable[[], object], n: int) -> list[float]:
    return timed_both(fn, n)[0]


def timed_both(fn: Callable[[], object], n: int) -> tuple[list[float], list[float]]:
    """Wall-clock and this thread's CPU time of each call. On a shared machine the wall
    clock's tail also counts the time other processes held the CPU; the CPU time does not."""
    wall, cpu = [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return wall, cpu


def bench_core(n: int) -> None:
    print("== build_context (pure core)")
    for size in (60, 200, 1000):
        session = Session("bench", SessionConfig(recent_window=size))
        for i in range(size):
            session.receive(TurnAppended(turn(i)))
        view = session.view()
        for fmt, budget in (("instructions", 5200), ("messages", None), ("messages", 8000)):
            samples = timed(
                lambda view=view, fmt=fmt, budget=budget: build_context(view, fmt, budget_chars=budget), n
            )
            print(row(f"{size:>5} turns  {fmt:<12} budget={budget}", samples))


async def bench_manager(n: int, delay: float, sessions: int) -> None:
    print("== SessionManager.context: idle vs. a compaction in flight")
    slow = SlowSummarizer(DeterministicSummarizer(), delay)
    async with SessionManager(slow, compaction_timeout=delay * 10, close_timeout=0.1) as manager:
        await manager.open("idle")
        for i in range(60):
            await manager.append_turn("idle", turn(i))
        idle: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            await manager.context("idle", "instructions")
            idle.append(time.perf_counter() - t0)
        print(row("60 turns, nothing to fold", idle))

        await manager.open("busy")
        for i in range(61):
            await manager.append_turn("busy", turn(i))
        await manager.context("busy", "instructions")  # starts folding 0..9, which takes `delay`
        busy: list[float] = []
        while manager.in_flight and len(busy) < n:
            t0 = time.perf_counter()
            await manager.context("busy", "instructions")
            busy.append(time.perf_counter() - t0)
        print(row(f"61 turns, a {delay:g}s fold in flight", busy, idle))

        names = [f"room-{k}" for k in range(sessions)]
        for name in names:
            await manager.open(name)
            for i in range(61):
                await manager.append_turn(name, turn(i))
        many: list[float] = []
        for _ in range(max(1, n // sessions)):
            for name in names:
                t0 = time.perf_counter()
                await manager.context(name, "instructions")
                many.append(time.perf_counter() - t0)
        print(row(f"{sessions} sessions, {manager.in_flight} folds in flight", many, idle))


async def bench_wire(n: int, delay: float) -> None:
    from voice_context.client import Client
    from voice_context.config import Settings
    from voice_context.server import Server

    print("== over the wire (real server on 127.0.0.1, the client)")
    settings = Settings().with_values("server", {"port": 0, "turns_per_second": 1e6, "turn_burst": 1_000_000})
    settings = settings.with_values("store", {"url": "memory"})
    slow = SlowSummarizer(DeterministicSummarizer(), delay)
    async with Server(settings, summarizer=slow) as server, Client(server.url) as client:
        pings: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            await client.ping()
            pings.append(time.perf_counter() - t0)
        print(row("ping (transport floor)", pings))
        room = await client.open("room")
        for i in range(60):
            t = turn(i)
            await room.append_turn(t.speaker, t.role, t.text, at=t.at)
        idle: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            await room.context(format="instructions", budget_chars=5200)
            idle.append(time.perf_counter() - t0)
        print(row("context.get, 60 turns, nothing to fold", idle, pings))
        t = turn(60)
        await room.append_turn(t.speaker, t.role, t.text, at=t.at)
        busy: list[float] = []
        first = await room.context(format="instructions", budget_chars=5200)
        assert first["in_flight"], "the first request starts a fold"
        while len(busy) < n:
            t0 = time.perf_counter()
            reply = await room.context(format="instructions", budget_chars=5200)
            busy.append(time.perf_counter() - t0)
            if not reply["in_flight"]:
                busy.pop()
                break
        print(row(f"context.get, a {delay:g}s fold in flight", busy, idle))


def sqlite_serving(folder: str) -> Settings:
    """Settings to serve on a free port with the default store in ``folder``, with no rate limit."""
    unlimited = {"port": 0, "turns_per_second": 1e6, "turn_burst": 1_000_000}
    return (
        Settings()
        .with_values("server", unlimited)
        .with_values("store", {"url": f"sqlite:///{folder}/bench.db"})
    )


async def bench_realtime(n: int) -> None:
    """What the OpenAI Realtime integration adds per user turn, from the transcript in to the
    ``response.create`` that carries its context out (the turn stored, the context fetched), against
    the same client's ping and its append alone, through a real server with the default store."""
    import tempfile

    from voice_context.client import Client
    from voice_context.integrations.openai_realtime import RealtimeMemory
    from voice_context.server import Server

    print("== OpenAI Realtime integration: one user turn (real server on 127.0.0.1, SQLite)")
    texts = recorded_texts()
    with tempfile.TemporaryDirectory() as tmp:
        settings = sqlite_serving(tmp)
        async with Server(settings) as server, Client(server.url) as client:
            room = await client.open("call")
            sent: list[dict[str, Any]] = []
            replied = anyio.Event()

            async def send(event: dict[str, Any]) -> None:
                sent.append(event)  # the realtime socket's send: what it costs is the provider's
                if event["type"] == "response.create":
                    replied.set()

            pings, appends, turns = [], [], []
            async with RealtimeMemory(
                room, send, base_instructions="You are Nova.", limit_chars=5200, timeout=5, reply_within=5
            ) as memory:
                for k in range(n):
                    text = texts[k % len(texts)][1]
                    t0 = time.perf_counter()
                    await client.ping()
                    pings.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    await room.append_turn("assistant", "assistant", f"{text} ({k})")
                    appends.append(time.perf_counter() - t0)
                    replied = anyio.Event()
                    await memory.on_event({"type": "input_audio_buffer.committed", "item_id": f"i{k}"})
                    event = {
                        "type": "conversation.item.input_audio_transcription.completed",
                        "item_id": f"i{k}",
                        "transcript": text,
                    }
                    t0 = time.perf_counter()
                    await memory.on_event(event)
                    await replied.wait()
                    turns.append(time.perf_counter() - t0)
            assert memory.replies == n and memory.fallbacks == 0 and memory.skipped == 0
        print(row("ping (transport floor)", pings))
        print(row("turn.append alone", appends, pings))
        print(row("a user turn: append, context.get, response.create", turns, pings))
        chars = [len(e["response"]["instructions"]) for e in sent if e["type"] == "response.create"]
        print(f"{'':<52} (instructions sent: {sum(chars) / n:,.0f} chars on average, {2 * n:,} turns stored)")


async def bench_pipecat(n: int) -> None:
    """What the pipecat processor adds to an LLM run: the new words stored, the context fetched
    and a fresh LLM context built, against the frame passing through untouched."""
    import tempfile

    from pipecat.frames.frames import LLMContextFrame
    from pipecat.processors.aggregators.llm_context import LLMContext

    from voice_context.integrations.pipecat import VoiceContextProcessor
    from voice_context.server import Server

    print("== pipecat processor: one LLM run (real server on 127.0.0.1, SQLite)")
    texts = recorded_texts()
    with tempfile.TemporaryDirectory() as tmp:
        settings = sqlite_serving(tmp)
        async with Server(settings) as server:
            processor = VoiceContextProcessor(server.url, session="call", budget_chars=8000, timeout=5)
            messages: list[dict[str, str]] = [{"role": "system", "content": "You are Nova."}]
            bare, run = [], []
            for k in range(n):
                messages.append({"role": "assistant", "content": f"{texts[k % len(texts)][1]} ({k})"})
                messages.append({"role": "user", "content": texts[(k + 1) % len(texts)][1]})
                frame = LLMContextFrame(context=LLMContext(messages=list(messages)))  # type: ignore[arg-type]
                t0 = time.perf_counter()
                frame.context.get_messages()  # what a pipeline without the processor does with it
                bare.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                await processor._with_memory(frame)
                run.append(time.perf_counter() - t0)
            await processor.aclose()
            assert processor.fallbacks == 0
    print(row("the frame passed on as it is", bare))
    print(row("with voice-context: 2 turns stored, context fetched", run))


async def bench_livekit(n: int) -> None:
    """What the LiveKit hooks add to a reply: the new turns stored and the memory put into a copy
    of the chat context (``VoiceContextMemory.update``)."""
    import tempfile

    from livekit.agents import llm

    from voice_context.integrations.livekit import VoiceContextMemory
    from voice_context.server import Server

    print("== LiveKit Agents hooks: one reply (real server on 127.0.0.1, SQLite)")
    texts = recorded_texts()
    with tempfile.TemporaryDirectory() as tmp:
        settings = sqlite_serving(tmp)
        async with Server(settings) as server:
            memory = VoiceContextMemory(server.url, session="call", budget_chars=8000, timeout=5)
            chat = llm.ChatContext()
            chat.add_message(role="system", content="You are Nova.")
            run = []
            for k in range(n):
                for role in ("assistant", "user"):
                    said = texts[(k + (role == "user")) % len(texts)][1]
                    message = chat.add_message(role=role, content=f"{said} ({k})")
                    memory._added(type("Added", (), {"item": message})())
                t0 = time.perf_counter()
                await memory.update(chat)
                run.append(time.perf_counter() - t0)
            await memory.aclose()
            assert memory.fallbacks == 0
    print(row("update: 2 turns stored, memory put in the context", run))


def recorded_texts() -> list[tuple[str, str]]:
    """(speaker, text) of every turn of the project's own recordings."""
    return [(t.speaker, t.text) for t in recorded_turns()]


def bench_recall(n: int, size: int = 5000) -> None:
    print(f"== recall on the reply path ({size:,} turns in one session, in process)")
    texts = recorded_texts()
    config = SessionConfig(max_summary_chars=12000)
    session = Session("bench", config)
    index = RecallIndex()
    tick = time.perf_counter()
    for i in range(size):
        speaker, text = texts[i % len(texts)]
        new = Turn(speaker, "user", f"{text} (take {i // len(texts)})", at=1_700_000_000.0 + 4 * i)
        session.receive(TurnAppended(new))
        index.add_turn(i, new)
    per_turn = (time.perf_counter() - tick) / size
    # fold as a server would have: the cursor near the end, every older turn only in the store
    folded = Session("bench", config, cursor=size - 60, turns=session.verbatim_turns[-60:])
    queries = [texts[(7 * k) % len(texts)][1] for k in range(n)]
    off = Session("bench", SessionConfig(recall=False), cursor=size - 60, turns=folded.verbatim_turns)
    samples_off, cpu_off = timed_both(lambda: build_context(off.view(), "instructions", budget_chars=8000), n)
    it = iter(queries * 2)

    def with_recall() -> None:
        query, recalled = recall_candidates(index, folded, next(it))
        build_context(folded.view(), "instructions", budget_chars=8000, recalled=recalled, query=query)

    samples, cpu = timed_both(with_recall, n)
    print(f"{'indexing one turn (in process)':<52} mean {per_turn * 1e6:8.1f} us")
    print(row("context, recall off (8,000 chars)", samples_off))
    print(row("context with a query: recall + budget", samples, samples_off))
    print(row("  the same, CPU time", cpu, cpu_off))
    anyio.run(bench_recall_served, n, size, texts, queries)


async def bench_recall_served(n: int, size: int, texts: list[tuple[str, str]], queries: list[str]) -> None:
    import tempfile
    import tracemalloc

    from voice_context.store.sqlite import SQLiteStore

    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "bench.db")
        async with SessionManager(DeterministicSummarizer(), store=store, close_timeout=30) as manager:
            tracemalloc.start()
            await manager.open("bench")
            manager.recall_ahead = "off"  # every context below searches on the reply path, until after_turn
            tick = time.perf_counter()
            for i in range(size):
                speaker, text = texts[i % len(texts)]
                new = Turn(speaker, "user", f"{text} (take {i // len(texts)})", at=1_700_000_000.0 + 4 * i)
                await manager.append_turn("bench", new)
                if i % 50 == 49:
                    await manager.context("bench", "messages")  # lets the folds keep up, as a bot would
            appended = time.perf_counter() - tick
            await manager.wait_indexed("bench")
            held, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            session = manager.session("bench")
            disk = await anyio.to_thread.run_sync(lambda: sum(f.stat().st_size for f in Path(tmp).iterdir()))

            async def timed_async(query: str | None) -> list[float]:
                out = []
                for k in range(n):
                    q = None if query is None else queries[k % len(queries)]
                    t0 = time.perf_counter()
                    await manager.context("bench", "instructions", budget_chars=8000, query=q)
                    out.append(time.perf_counter() - t0)
                return out

            async def after_turn(ahead: AheadMode) -> list[float]:
                """A user turn is stored, the bot asks for its context a moment later: recall
                ahead has searched meanwhile (or, off, the context searches itself)."""
                manager.recall_ahead = ahead
                out = []
                for k in range(n):
                    speaker, text = texts[(size + k) % len(texts)]
                    said = Turn(speaker, "user", f"{text} (again {k})", at=1_700_000_000.0 + 4 * (size + k))
                    await manager.append_turn("bench", said)
                    await anyio.sleep(0.005)
                    t0 = time.perf_counter()
                    await manager.context("bench", "instructions", budget_chars=8000)
                    out.append(time.perf_counter() - t0)
                return out

            plain = await timed_async(None)
            asked = await timed_async("query")
            searched = await after_turn("off")
            ahead = await after_turn("first")
        print(
            f"{'served: append + index one turn (SQLite, fsync)':<52} mean {appended / size * 1e6:8.1f} us"
            f"  cursor {session.cursor:,} of {session.total_turns:,}"
        )
        print(
            f"{'served: Python memory it took (bounded caches included)':<52} {held / 1024:8.1f} KiB"
            f"  (store on disk {disk / size:,.0f} bytes/turn)"
        )
        print(row("served: context, the newest user turn as query", plain))
        print(row("served: context with a query (SQLite index)", asked, plain))
        print(row("served: user turn, then its context (ahead off)", searched))
        print(row("  the same, recall ahead (the default)", ahead, searched))


def bench_tokens(n: int) -> None:
    print("== token budgets (o200k_base) against char budgets of the same size")
    counter = load_tokenizer("o200k_base")
    for size in (60, 1000):
        session = Session("bench", SessionConfig(recent_window=size))
        for i in range(size):
            session.receive(TurnAppended(turn(i)))
        view = session.view()
        for fmt, tokens in (("instructions", 1300), ("messages", 2000)):
            by_chars = timed(
                lambda view=view, fmt=fmt, tokens=tokens: build_context(view, fmt, budget_chars=tokens * 4), n
            )
            by_tokens = timed(
                lambda view=view, fmt=fmt, tokens=tokens: build_context(
                    view, fmt, budget_chars=100_000, budget_tokens=tokens, tokens=counter
                ),
                n,
            )
            print(row(f"{size:>5} turns  {fmt:<12} {tokens} tokens", by_tokens, by_chars))


def bench_compress(n: int) -> None:
    print("== deterministic compression of 100 messages")
    fillers = ("yeah", "ok lol", "right", "haha", "sure")

    def messages(seed: int) -> list[Turn]:
        out = []
        for i in range(100):
            k = seed * 100 + i
            if i % 10 == 3:
                text = fillers[k % len(fillers)]
            elif i % 10 == 6:  # a rephrasing of the message before
                text = out[-1].text.rstrip(".") + " then"
            else:
                text = turn(k).text
            out.append(Turn(("Alice", "Bob")[i % 2], "user", text, 1_700_000_000.0 + i))
        return out

    batches = [messages(seed) for seed in range(n)]  # fresh texts each time: no cache helps
    floor = timed(lambda it=iter(batches): [key_of(t.text) for t in next(it)], n)  # noqa: B008 - one pass
    plain = timed(lambda it=iter(batches): compress(next(it)), n)  # noqa: B008
    forced = timed(lambda it=iter(batches): compress(next(it), budget_chars=2000), n)  # noqa: B008
    print(row("reading each message once (the floor)", floor))
    print(row("compress: filler, exact and fuzzy duplicates", plain, floor))
    print(row("compress + force-converge to 2,000 chars", forced, floor))


HUGE_ANSWER_SERVER = """
import sys, anyio
from voice_context.testing.openai_server import OpenAIServer, Reply
text = ("Alice and Bob planned the dragon raid with Carol in Lisbon on Friday at 9. " * 14_000)[:1_000_000]
async def main():
    async with OpenAIServer(default=Reply(text, chunk_chars=int(sys.argv[1]) or None)) as server:
        print(server.base_url, flush=True)
        await anyio.to_thread.run_sync(sys.stdin.read)  # until the benchmark closes stdin
anyio.run(main)
"""


async def longest_blocked_fold(base_url: str, fold: Fold) -> tuple[float, float]:
    """One fold of 10 turns by a model at ``base_url``: its seconds, and the longest the event
    loop was blocked meanwhile (the longest gap between the wake-ups of a 1 ms sleeper)."""
    from voice_context.summarizers.openai_compat import OpenAISummarizer

    gaps: list[float] = []
    async with (
        OpenAISummarizer(model="m", base_url=base_url, fold=fold, timeout=60, max_retries=0) as model,
        SessionManager(model, compaction_timeout=120, close_timeout=0.1) as manager,
    ):
        await manager.open("room")
        for i in range(61):
            await manager.append_turn("room", turn(i))
        landed = anyio.Event()
        manager.add_listener(lambda event: landed.set())  # completed, or failed

        async def sleeper() -> None:
            last = time.perf_counter()
            while not landed.is_set():
                await anyio.sleep(0.001)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        started = time.perf_counter()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sleeper)
            await manager.context("room")
            await landed.wait()
        return time.perf_counter() - started, max(gaps)


def bench_huge_answer(rounds: int) -> None:
    print("== a 1 MB answer to every fold: the longest the event loop is blocked while it lands")
    for chunk_chars, chunks in ((65_536, "64 KB chunks"), (0, "a word a chunk")):
        server = subprocess.Popen(
            [sys.executable, "-c", HUGE_ANSWER_SERVER, str(chunk_chars)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert server.stdout is not None and server.stdin is not None
            base_url = server.stdout.readline().strip()
            folds: tuple[Fold, ...] = ("paragraph", "lines")
            for fold in folds:  # the first fold of each imports and warms the client: not counted
                anyio.run(longest_blocked_fold, base_url, fold)
            for fold in folds:
                runs = [anyio.run(longest_blocked_fold, base_url, fold) for _ in range(rounds)]
                blocked = sorted(1000 * gap for _, gap in runs)
                took = statistics.median(seconds for seconds, _ in runs)
                print(
                    f"{chunks:<15} fold={fold:<9} longest block p50 {statistics.median(blocked):6.1f} ms,"
                    f" max {blocked[-1]:6.1f} ms; the fold took {took:.2f} s"
                )
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait()


def recorded_turns() -> list[Turn]:
    """Every turn of the project's own recordings, as recorded (times included)."""
    out: list[Turn] = []
    for path in sorted((Path(__file__).resolve().parent.parent / "fixtures").glob("*.jsonl")):
        if path.name.endswith(".probes.jsonl"):
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            message = json.loads(line)
            if message.get("type") == "turn.append":
                t = message["turn"]
                out.append(Turn(t["speaker"], t["role"], t["text"], at=t["at"]))
    return out


async def bench_llm_folds(base_url: str, alias: str, folds: int, fold_seconds: float) -> None:
    from structlog.testing import capture_logs

    from voice_context.errors import SummarizerError
    from voice_context.summarizers.base import SummaryRequest
    from voice_context.summarizers.openai_compat import OpenAISummarizer

    print(f"== seconds per fold: {alias}, batches of 10 turns of the project's recordings")
    # the fold check's rejections are warnings: let them through to be counted
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))
    turns = recorded_turns()
    seconds: list[float] = []
    failed: list[str] = []
    summary = ""
    async with OpenAISummarizer(model=alias, base_url=base_url, timeout=fold_seconds, max_retries=0) as model:
        with capture_logs() as logs:
            for k in range(folds):
                batch = tuple(turns[(10 * k + i) % len(turns)] for i in range(10))
                request = SummaryRequest(
                    previous_summary=summary, turns=batch, max_chars=1200, first_index=10 * k
                )
                t0 = time.perf_counter()
                try:
                    summary = await model.summarize(request)
                except SummarizerError as exc:
                    failed.append(exc.kind)
                seconds.append(time.perf_counter() - t0)
                print(f"fold {k + 1}: {seconds[-1]:6.1f} s, summary {len(summary):5,} chars", flush=True)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    rejected = sum(1 for e in logs if e["event"] == "summary_fold_rejected")
    print(
        f"{folds} folds: p50 {statistics.median(seconds):.1f} s, max {max(seconds):.1f} s, "
        f"mean {statistics.fmean(seconds):.1f} s; rejected by the fold check {rejected}, "
        f"failed {len(failed)} {sorted(set(failed)) or ''}"
    )
    print(f"the last summary:\n{summary}")


async def bench_llm_wire(n: int, base_url: str, alias: str, fold_seconds: float) -> None:
    from voice_context.client import Client
    from voice_context.config import Settings
    from voice_context.server import Server

    print(f"== over the wire, {alias} as the summarizer: context.get idle vs. while it folds")
    settings = Settings().with_values("server", {"port": 0, "turns_per_second": 1e6, "turn_burst": 1_000_000})
    settings = settings.with_values("store", {"url": "memory"})
    settings = settings.with_values(
        "summarizer",
        {
            "kind": "openai",
            "base_url": base_url,
            "model": alias,
            "compaction_timeout": fold_seconds,
            "max_retries": 0,
        },
    )
    turns = recorded_turns()
    async with Server(settings) as server, Client(server.url) as client:
        room = await client.open("room")
        for t in turns[:60]:
            await room.append_turn(t.speaker, t.role, t.text, at=t.at)
        idle: list[float] = []
        for _ in range(n):
            t0 = time.perf_counter()
            await room.context(format="instructions", budget_chars=5200)
            idle.append(time.perf_counter() - t0)
        print(row("context.get, 60 turns, nothing to fold", idle))
        t = turns[60]
        await room.append_turn(t.speaker, t.role, t.text, at=t.at)
        first = await room.context(format="instructions", budget_chars=5200)
        assert first["in_flight"], "the first request starts a fold"
        busy: list[float] = []
        started = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            reply = await room.context(format="instructions", budget_chars=5200)
            if not reply["in_flight"]:
                break
            busy.append(time.perf_counter() - t0)
        landed = time.perf_counter() - started
        state = await room.state()
        print(row(f"context.get, the model's fold in flight ({landed:.1f} s)", busy, idle))
        print(f"the fold landed: cursor {state['cursor']}, failures {state['failures']}")


def bench_llm(n: int, name: str, folds: int, timeout: float, threads: int) -> None:
    import tempfile

    from voice_context.testing.llama_server import LlamaServer
    from voice_context.testing.models import MODELS, assemble

    if name.endswith(".gguf"):
        model, alias = Path(name), "local-model"
    else:
        model, alias = assemble(name), MODELS[name].alias
    log = Path(tempfile.mkdtemp(prefix="vc-llama-")) / "llama.log"
    print(f"starting llama_cpp.server with {model.name} (its log: {log})", flush=True)
    with LlamaServer(model, alias=alias, n_ctx=16384, threads=threads, log=log) as llama:
        anyio.run(bench_llm_folds, llama.base_url, alias, folds, timeout)
        anyio.run(bench_llm_wire, n, llama.base_url, alias, timeout)


def bench_codec(n: int) -> None:
    """12. (see the module docstring)."""
    from typing import Annotated, Literal

    import msgspec
    import orjson

    from voice_context import codec
    from voice_context.core.turns import Note

    text_limit = codec.DEFAULT_MAX_TEXT_CHARS
    name = Annotated[str, msgspec.Meta(min_length=1, max_length=codec.MAX_SESSION_CHARS)]
    low, high = codec.ID_RANGE
    message_id = (
        Annotated[int, msgspec.Meta(ge=low, le=high)]
        | Annotated[str, msgspec.Meta(max_length=codec.MAX_ID_CHARS)]
        | None
    )
    text = Annotated[str, msgspec.Meta(max_length=text_limit)]
    at = Annotated[float, msgspec.Meta(ge=0, lt=codec.MAX_AT)]
    speaker = Annotated[str, msgspec.Meta(min_length=1, max_length=codec.MAX_SPEAKER_CHARS)]

    # (made with defstruct: this module's annotations are strings, which msgspec resolves globally)
    turn_body = msgspec.defstruct(
        "TurnBody",
        [
            ("speaker", speaker),
            ("role", Literal["user", "assistant", "system", "tool"]),
            ("at", at),
            ("text", text | None, None),
            ("id", Annotated[str, msgspec.Meta(max_length=codec.MAX_ID_CHARS)] | None, None),
        ],
    )
    note_body = msgspec.defstruct(
        "NoteBody",
        [
            ("text", text),
            ("at", at),
            ("speaker", speaker | None, None),
            ("source", Annotated[str, msgspec.Meta(max_length=codec.MAX_SPEAKER_CHARS)] | None, None),
        ],
    )
    budget = Annotated[int, msgspec.Meta(ge=1, le=codec.MAX_BUDGET)]
    turn_append = msgspec.defstruct(
        "TurnAppend",
        [("session", name), ("turn", turn_body), ("id", message_id, None)],
        tag_field="type",
        tag="turn.append",
    )
    note_append = msgspec.defstruct(
        "NoteAppend",
        [("session", name), ("note", note_body), ("id", message_id, None)],
        tag_field="type",
        tag="note.append",
    )
    context_get = msgspec.defstruct(
        "ContextGet",
        [
            ("session", name),
            ("format", Literal["messages", "instructions"], "messages"),
            ("budget_chars", budget | None, None),
            ("budget_tokens", budget | None, None),
            ("base_instructions", str, ""),
            ("facts", list[str], []),
            ("query", text | None, None),
            ("id", message_id, None),
        ],
        tag_field="type",
        tag="context.get",
    )

    decoder = msgspec.json.Decoder(turn_append | note_append | context_get)

    def read(frame: bytes) -> codec.ClientMessage:
        """msgspec's reading, then what it cannot state (a printable name, words in a text),
        into the message ours makes."""
        m: Any = decoder.decode(frame)
        if not m.session.isprintable():
            raise codec.DecodeError(codec.BAD_REQUEST, "session must be printable")
        if isinstance(m, turn_append):
            b = m.turn
            if not b.speaker.strip() or not b.text or not b.text.strip():
                raise codec.DecodeError(codec.BAD_REQUEST, "turn.text must not be empty")
            return codec.TurnAppend(m.session, Turn(b.speaker, b.role, b.text, b.at, b.id), m.id)
        if isinstance(m, note_append):
            o = m.note
            if not o.text.strip():
                raise codec.DecodeError(codec.BAD_REQUEST, "note.text must not be empty")
            return codec.NoteAppend(m.session, Note(o.text, o.at, o.speaker, o.source), m.id)
        return codec.ContextGet(
            m.session,
            m.format,
            m.budget_chars,
            m.base_instructions,
            tuple(m.facts),
            m.id,
            m.query,
            m.budget_tokens,
        )

    turns = recorded_turns()
    said = turns[len(turns) // 2]
    frames = {
        "turn.append": {
            "type": "turn.append",
            "id": 41,
            "session": "call-00042",
            "turn": {"speaker": said.speaker, "role": said.role, "text": said.text, "at": said.at},
        },
        "note.append": {
            "type": "note.append",
            "id": 42,
            "session": "call-00042",
            "note": {"text": "Scoreboard: 12 kills, 3 deaths; the map vote shows Tokyo.", "at": said.at},
        },
        "context.get": {
            "type": "context.get",
            "id": 43,
            "session": "call-00042",
            "format": "instructions",
            "budget_chars": 5200,
            "base_instructions": "You are a friendly voice assistant.",
            "query": said.text,
        },
    }
    print(f"== the codec: a client frame read, ours against msgspec {msgspec.__version__}")
    cost: dict[str, tuple[float, float]] = {}
    for kind, obj in frames.items():
        frame = orjson.dumps(obj)
        assert read(frame) == codec.decode(frame), kind  # the same message either way
        ours, theirs = timed(lambda f=frame: codec.decode(f), n), timed(lambda f=frame: read(f), n)
        cost[kind] = (statistics.fmean(ours), statistics.fmean(theirs))
        print(row(f"{kind} ({len(frame)} bytes), ours", ours))
        print(row(f"{kind}, msgspec", theirs, ours))
    session = Session("call-00042", SessionConfig(recall=False))
    for t in turns[:200]:
        session.receive(TurnAppended(t))
    context = build_context(session.view(), "instructions", budget_chars=5200)

    def written() -> dict[str, Any]:  # the reply made of the context, as the server writes it
        return codec.reply_dict(codec.ContextReply.of("call-00042", context, False, 43))

    wire = written()
    assert orjson.loads(msgspec.json.encode(wire)) == orjson.loads(orjson.dumps(wire))
    size = len(orjson.dumps(wire))
    encode_ours = timed(lambda: orjson.dumps(written()), n)
    encode_theirs = timed(lambda: msgspec.json.encode(written()), n)
    print(row(f"a context reply ({size:,} bytes) written, orjson", encode_ours))
    print(row("the same, msgspec", encode_theirs, encode_ours))
    # an exchange reads two turns and a context.get (a note every few exchanges)
    ours_each = 2 * cost["turn.append"][0] + cost["context.get"][0]
    theirs_each = 2 * cost["turn.append"][1] + cost["context.get"][1]
    print(
        f"an exchange's frames read (two turns and a context.get): ours {ours_each * 1e6:.1f} us, "
        f"msgspec {theirs_each * 1e6:.1f} us (mean)"
    )


def bench_postings(db: Path) -> None:
    """13. (see the module docstring)."""
    import functools
    import random
    import sqlite3

    from voice_context.core.recalled import RecallStats
    from voice_context.recall.index import K1, B, bm25, choose_terms, idf, query_words
    from voice_context.store.sqlite_rows import select_postings

    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    names = [name for (name,) in conn.execute("SELECT session FROM recall_state")]
    names = random.Random(1).sample(names, min(200, len(names)))
    queries = [
        (name, sorted(query_words(text)))
        for name in names
        for (text,) in conn.execute(
            "SELECT text FROM turns WHERE session = ? AND role = 'user' ORDER BY idx DESC LIMIT 5", (name,)
        )
    ]
    choose = functools.partial(choose_terms, common=0.05)  # a context's default query: the newest user turn

    def store_choose(words: Sequence[str], df: Callable[[str], int], stats: RecallStats) -> list[str]:
        return choose(words, df, stats.docs)

    def in_python(name: str, words: list[str]) -> dict[int, float]:
        stats, df, postings = select_postings(conn, name, words, store_choose)
        terms = choose(list(df), lambda t: df.get(t, 0), stats.docs)
        return bm25(terms, postings, stats.docs, stats.length)

    def in_sqlite(name: str, words: list[str]) -> dict[int, float]:
        sid, docs, length = conn.execute(
            "SELECT sid, docs, length FROM recall_state WHERE session = ?", (name,)
        ).fetchone()
        marks = ",".join("?" * len(words))
        df = dict(
            conn.execute(f"SELECT term, df FROM recall_df WHERE sid = ? AND term IN ({marks})", (sid, *words))
        )
        read = choose(list(df), lambda t: df.get(t, 0), docs)
        if not read or not docs:
            return {}
        weights = [value for t in read for value in (t, idf(docs, df[t]) * (K1 + 1))]
        summed = (
            f"WITH q(term, w) AS (VALUES {','.join(['(?, ?)'] * len(read))})"
            " SELECT t.key, SUM(q.w * t.tf / (t.tf + ? + ? * t.length))"
            " FROM q JOIN recall_terms t ON t.sid = ? AND t.term = q.term GROUP BY t.key"
        )
        return dict(conn.execute(summed, (*weights, K1 * (1 - B), K1 * B / (length / docs or 1.0), sid)))

    rows = scored = 0
    for name, words in queries:
        ours, theirs = in_python(name, words), in_sqlite(name, words)
        assert ours.keys() == theirs.keys() and all(abs(ours[k] - theirs[k]) < 1e-9 for k in ours), name
        rows += sum(map(len, select_postings(conn, name, words, store_choose)[2].values()))
        scored += len(ours)
    print(f"== a search's postings walk: {len(queries)} queries over {len(names)} sessions of {db.name}")
    each = max(1, len(queries))
    print(f"per search, mean: {rows / each:.1f} postings read, {scored / each:.1f} docs scored")
    for label, fn in (("rows scored in Python", in_python), ("BM25 summed by SQLite", in_sqlite)):
        started = time.process_time()
        for _ in range(5):
            for name, words in queries:
                fn(name, words)
        print(
            f"{label:<30} {(time.process_time() - started) / (5 * len(queries)) * 1e6:7.1f} us CPU per search"
        )


async def bench_index_writes(words: list[Path], sessions: int, lengths: list[int], appended: int) -> None:
    """14. (see the module docstring)."""
    import tempfile

    from voice_context.manager.indexing import HELD_TURNS
    from voice_context.recall.index import indexed, turn_passage
    from voice_context.store import SessionRecord
    from voice_context.store.sqlite import SQLiteStore

    if words:
        from load import dialogue_lines

        said = [
            Turn(line.speaker, "user", line.text, at=1_700_000_000.0 + 4 * i)
            for i, line in enumerate(dialogue_lines(words))
        ]
    else:
        said = recorded_turns()

    def io() -> tuple[int, int]:
        fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return int(fields["wchar"]), int(fields["syscw"])

    def text_of(name: int, i: int) -> Turn:
        return said[(name * 7919 + i) % len(said)]  # each session its own stretch of the words

    source = ", ".join(path.name for path in words) or "the project's recordings"
    terms = statistics.mean(len(indexed(turn_passage(0, t)).terms) for t in said)
    print(
        f"== the recall index's writes: {sessions} sessions of {source} ({terms:.1f} words a turn),"
        f" {appended} turns each indexed after their history, the sessions in turn"
    )
    print(
        f"{'history':>8} {'per write':>9} {'KB written a turn':>18} {'write calls a turn':>19}"
        f" {'CPU a turn':>11}"
    )
    for length in lengths:
        baseline: tuple[float, float, float] | None = None
        for batch in (1, HELD_TURNS):
            with tempfile.TemporaryDirectory() as folder:
                store = SQLiteStore(Path(folder) / "index.db")
                for k in range(sessions):
                    name = f"s{k}"
                    await store.create(SessionRecord(name))
                    turns = [text_of(k, i) for i in range(length + appended)]
                    for i, t in enumerate(turns):
                        await store.append_turn(name, i, t)
                    docs = [indexed(turn_passage(i, t)) for i, t in enumerate(turns[:length])]
                    for start in range(0, length, 256):
                        await store.index_turns(name, start, docs[start : start + 256])
                docs_of = {
                    k: [indexed(turn_passage(i, text_of(k, i))) for i in range(length, length + appended)]
                    for k in range(sessions)
                }
                wrote, calls = io()
                started = time.process_time()
                for step in range(0, appended, batch):
                    for k in range(sessions):
                        await store.index_turns(f"s{k}", length + step, docs_of[k][step : step + batch])
                cpu = time.process_time() - started
                after = io()
                wrote, calls = after[0] - wrote, after[1] - calls
                await store.aclose()
            n = sessions * appended
            figures = (wrote / n / 1024, calls / n, cpu / n * 1e3)
            ratio = ""
            if baseline is not None:
                ratio = (
                    "   (" + ", ".join(f"{a / b:.2f}x" for a, b in zip(figures, baseline, strict=True)) + ")"
                )
            baseline = baseline or figures
            print(
                f"{length:>8} {batch:>6} turn{'s' if batch > 1 else ' '} {figures[0]:>18.1f}"
                f" {figures[1]:>19.1f} {figures[2]:>8.3f} ms{ratio}"
            )


def bench_group_writes(rounds: int, sizes: list[int]) -> None:
    """15. (see the module docstring)."""
    import threading

    busy = threading.Event()
    done = threading.Event()

    def spin() -> None:  # pure Python, as a busy event loop runs it
        while not done.is_set():
            if busy.wait(0.01):
                sum(range(1000))

    threading.Thread(target=spin, daemon=True).start()
    print(
        "== a group's writes in a SQLite store, with another thread idle and running pure Python (as the"
        " event loop does under load): ms a group, and the statements in it"
    )
    heads = ("group", "written", "statements", "idle p50", "busy p50", "busy p99", "busy/idle")
    print("{:>6} {:<22} {:>10} {:>9} {:>9} {:>9} {:>9}".format(*heads))
    try:
        for size in sizes:
            for how in ("one statement a row", "the store's", "the store's index"):
                count, idle, contended = group_times(how, size, rounds, busy)
                p50 = pct(contended, 0.5)
                print(
                    f"{size:>6} {how:<22} {count:>10} {pct(idle, 0.5) * 1e3:>9.2f} {p50 * 1e3:>9.2f}"
                    f" {pct(contended, 0.99) * 1e3:>9.2f} {p50 / pct(idle, 0.5):>8.1f}x"
                )
    finally:
        done.set()


def group_times(how: str, size: int, rounds: int, busy: Any) -> tuple[int, list[float], list[float]]:
    """Groups of ``size`` sessions' next turn (or their recall docs) written ``how``, in turn with
    the other thread idle and busy: the statements of one group, and the seconds each took."""
    import sqlite3
    import tempfile

    from voice_context.recall.index import indexed, turn_passage
    from voice_context.store import SessionRecord
    from voice_context.store.common import turn_fields
    from voice_context.store.group import Pending
    from voice_context.store.sqlite import SQLiteStore
    from voice_context.store.sqlite_groups import AppendTurn, Index, IndexTurns, Write
    from voice_context.store.sqlite_rows import writing

    said = recorded_turns()

    def one_a_row(conn: sqlite3.Connection, batch: list[Pending[Write]]) -> None:
        """The same group as one statement a row (``executemany``), as before."""
        with writing(conn):
            ops = [item.op for item in batch if isinstance(item.op, AppendTurn)]
            conn.executemany(
                "INSERT INTO turns (session, idx, speaker, role, text, at, id, tool)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(op.name, op.index, *op.fields) for op in ops],
            )
            conn.executemany(
                "UPDATE sessions SET total_turns = ?, updated_at = ? WHERE name = ?",
                [(op.index + 1, time.time(), op.name) for op in ops],
            )

    times: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as folder:
        store = SQLiteStore(Path(folder) / "groups.db")
        names = [f"s{k}" for k in range(size)]

        async def create() -> None:
            for name in names:
                await store.create(SessionRecord(name))

        anyio.run(create)
        conn = store.db._connection()
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        for index in range(2 * rounds):
            contended = index % 2 == 1
            (busy.set if contended else busy.clear)()
            turns = [said[(k * 31 + index) % len(said)] for k in range(size)]
            batch: list[Pending[Write]] = [
                Pending(AppendTurn(name, index, turn_fields(made)))
                for name, made in zip(names, turns, strict=True)
            ]
            docs: list[Pending[Index]] = [
                Pending(IndexTurns(name, index, (indexed(turn_passage(index, made)),)))
                for name, made in zip(names, turns, strict=True)
            ]
            if how == "the store's index":
                one_a_row(conn, batch)
            statements.clear()
            started = time.perf_counter()
            if how == "the store's index":
                store._writer._commit_derived(conn, docs)
            elif how == "the store's":
                store._writer._commit_group(conn, batch)
            else:
                one_a_row(conn, batch)
            times[contended].append(time.perf_counter() - started)
        busy.clear()
        count = len(statements)
        anyio.run(store.aclose)
    return count, times[False], times[True]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=2000, help="samples per figure")
    parser.add_argument("--delay", type=float, default=3.0, help="seconds the slow summarizer takes")
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument(
        "--llm", nargs="?", const="smollm2", metavar="MODEL", help="a local model instead (see above)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="folds of a 1 MB answer timed, per fold mode")
    parser.add_argument("--folds", type=int, default=5, help="folds timed with --llm")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one fold may take with --llm")
    parser.add_argument(
        "--threads", type=int, default=2, help="the model server's threads (1 is best on a busy machine)"
    )
    parser.add_argument("--codec", action="store_true", help="only the codec, beside msgspec (see above)")
    parser.add_argument(
        "--postings", type=Path, metavar="DB", help="only the postings walk over DB (see above)"
    )
    parser.add_argument(
        "--index-writes", action="store_true", help="only the recall index's writes, by batch (see above)"
    )
    parser.add_argument(
        "--words",
        type=Path,
        nargs="+",
        default=[],
        metavar="FILE",
        help="LoCoMo-format dialogue for --index-writes",
    )
    parser.add_argument(
        "--group-writes",
        action="store_true",
        help="only a SQLite group's writes, idle and contended (see above)",
    )
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    if args.group_writes:
        bench_group_writes(20, [10, 100, 400])
        return
    if args.index_writes:
        anyio.run(bench_index_writes, args.words, 40, [60, 600, 3000], 64)
        return
    if args.postings:
        bench_postings(args.postings)
        return
    if args.codec:
        bench_codec(args.n * 10)
        return
    if args.llm:
        bench_llm(min(args.n, 200), args.llm, args.folds, args.timeout, args.threads)
        return
    bench_core(args.n)
    bench_tokens(args.n)
    bench_compress(min(args.n, 1000))
    bench_recall(args.n)
    anyio.run(bench_manager, args.n, args.delay, args.sessions)
    anyio.run(bench_wire, args.n, args.delay)
    anyio.run(bench_realtime, min(args.n, 1000))
    anyio.run(bench_pipecat, min(args.n, 1000))
    anyio.run(bench_livekit, min(args.n, 1000))
    bench_huge_answer(args.rounds)


if __name__ == "__main__":
    main()
