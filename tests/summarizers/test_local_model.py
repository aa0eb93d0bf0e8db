"""The slow tier: a real local model behind a real llama.cpp server, end to end.

Opt in with ``VOICE_CONTEXT_SLOW=1`` after ``scripts/models smollm2``. The model
is tiny (SmolLM2-135M): its words are never asserted, only what the system
does with them: a fold lands, or the fold check rejects the words and the
deterministic lines stand in, and either way nothing said is lost.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from helpers import ROOT
from serving import TIMEOUT

from voice_context.client import Client
from voice_context.core.turns import Turn
from voice_context.errors import SummarizerError
from voice_context.summarizers.base import SummaryRequest
from voice_context.summarizers.check import missing_batch
from voice_context.summarizers.openai_compat import OpenAISummarizer
from voice_context.testing.llama_server import LlamaServer, llama_cpp_installed
from voice_context.testing.models import MODELS, ModelError, assemble

MODEL = MODELS["smollm2"]
#: A tiny model on two cores folds a batch in seconds; the guards leave it minutes.
MODEL_TIMEOUT = TIMEOUT * 24

pytestmark = [pytest.mark.slow, pytest.mark.timeout(MODEL_TIMEOUT * 4)]

# 2024-05-01 14:03:07 UTC
T0 = 1714572187.0

TRIP = [
    ("Alice", "Priya booked our Lisbon flights for 14 June, seats 23C and 23D."),
    ("Bob", "Great, the hotel in Alfama costs 420 euros for three nights."),
    ("Alice", "Marco joins us on Saturday with his sister Lena."),
    ("Bob", "We have to pay the 120 euro deposit by Friday."),
    ("Alice", "The fado show starts at 21:30 at Clube de Fado."),
    ("Bob", "I will rent a car from Hertz for the day trip to Sintra."),
    ("Alice", "Should we book the tram tour too?"),
    ("Bob", "Maybe, let's see what Marco thinks."),
    ("Alice", "I'll pack the adapters for the chargers."),
    ("Bob", "And I'll print the boarding passes."),
    ("Alice", "Did you check the weather in Lisbon?"),
    ("Bob", "Sunny, about 27 degrees all week."),
]
BATCH = 6
FACTS = ["Priya", "Lisbon", "14 June", "23C", "420", "Marco", "120", "21:30", "Hertz", "Sintra"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if not llama_cpp_installed():
        pytest.fail("llama-cpp-python is not installed: run scripts/models smollm2")
    try:
        model = assemble(MODEL.name)
    except ModelError as exc:
        pytest.fail(str(exc))
    log = tmp_path_factory.mktemp("llama") / "llama.log"
    with LlamaServer(model, alias=MODEL.alias, n_ctx=8192, log=log) as server:
        yield server


@asynccontextmanager
async def serve(config: Path, log: Path) -> AsyncIterator[str]:
    """``voice-context serve`` as a process, its logs (JSON lines) in ``log``; yields its URL."""
    command = [sys.executable, "-m", "voice_context", "serve", "--port", "0", "--log-format", "json"]
    command += ["--store", "memory", "--config", str(config)]
    with log.open("wb") as stderr:
        async with await anyio.open_process(command, stderr=stderr) as process:
            try:
                assert process.stdout is not None
                with anyio.fail_after(TIMEOUT * 2):
                    line = b""
                    while not line.endswith(b"\n"):
                        line += await process.stdout.receive()
                yield line.decode().strip().removeprefix("listening on ")
            finally:
                process.terminate()
                with anyio.move_on_after(TIMEOUT * 2):
                    await process.wait()
                if process.returncode is None:
                    process.kill()


def events(log: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in log.read_bytes().splitlines() if line.startswith(b"{")]


@pytest.mark.asyncio
async def test_a_served_session_folds_with_a_real_model_and_loses_nothing(
    llama: LlamaServer, tmp_path: Path
) -> None:
    config = tmp_path / "voice-context.toml"
    config.write_text(
        f'[summarizer]\nkind = "openai"\nbase_url = "{llama.base_url}"\nmodel = "{llama.alias}"\n'
        f"compaction_timeout = {MODEL_TIMEOUT:g}\nmax_retries = 0\n"
    )
    log = tmp_path / "serve.log"
    async with serve(config, log) as url, Client(url) as client:
        room = await client.open("trip", config={"recent_window": 4, "batch_size": BATCH})
        for i, (speaker, text) in enumerate(TRIP):
            await room.append_turn(speaker, "user", text, at=T0 + 20 * i, id=f"utt-{i}")
        first = await room.context(format="instructions")  # 12 turns > 4 + 6: folds turns 0..5
        assert first["in_flight"] and first["cursor"] == 0
        with anyio.fail_after(MODEL_TIMEOUT):
            while (state := await room.state())["cursor"] < BATCH and not state["failures"]:  # noqa: ASYNC110
                await anyio.sleep(0.2)
        context = await room.context(format="instructions")
    assert (state["turns"], state["cursor"], state["failures"]) == (len(TRIP), BATCH, 0)
    assert (context["cursor"], context["covered_through"]) == (BATCH, BATCH - 1)
    summary = context["summary"]

    logged = events(log)
    assert [e["new_cursor"] for e in logged if e["event"] == "voice_context_compaction_completed"] == [BATCH]
    rejected = [e for e in logged if e["event"] == "summary_fold_rejected"]
    if rejected:  # the model's words did not carry the batch: its dated lines stand in
        assert rejected[0]["first_index"] == 0
        assert summary.startswith("[1 May 2024, 14:03] Alice: Priya booked our Lisbon flights for 14 June")
        assert all(fact in summary for fact in FACTS)
    else:  # the model's words carry some of what the batch said
        batch = tuple(Turn(s, "user", t, T0 + 20 * i) for i, (s, t) in enumerate(TRIP[:BATCH]))
        request = SummaryRequest(previous_summary="", turns=batch, notes=(), max_chars=1200)
        async with OpenAISummarizer(model=llama.alias, base_url=llama.base_url) as summarizer:
            assert missing_batch(request, summary, summarizer.digest(request)) is None
    # nothing lost: every fact of the folded turns is still in what the bot is given
    assert all(fact in context["instructions"] for fact in FACTS)


@pytest.mark.asyncio
async def test_an_attempt_that_times_out_hangs_up_and_llama_cpp_stops_generating(
    llama: LlamaServer,
) -> None:
    assert llama.log is not None
    before = llama.log.read_text(errors="replace").count("Disconnected from client")
    turns = tuple(Turn(s, "user", t, T0 + 20 * i) for i, (s, t) in enumerate(TRIP))
    request = SummaryRequest(previous_summary="", turns=turns, notes=(), max_chars=1200)
    async with OpenAISummarizer(
        model=llama.alias, base_url=llama.base_url, timeout=0.2, max_retries=0
    ) as hasty:
        with pytest.raises(SummarizerError) as caught:
            await hasty.summarize(request)
    assert caught.value.kind == "timeout"
    with anyio.fail_after(MODEL_TIMEOUT):  # the server notices at its next token, and stops
        while llama.log.read_text(errors="replace").count("Disconnected from client") == before:  # noqa: ASYNC110
            await anyio.sleep(0.1)  # a line another process writes
    async with OpenAISummarizer(
        model=llama.alias, base_url=llama.base_url, timeout=MODEL_TIMEOUT, max_retries=0
    ) as patient:
        assert await patient.summarize(request)  # served, not queued behind the abandoned answer


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def command_line(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGKILL])
def test_a_benchmark_stopped_mid_run_takes_its_model_server_with_it(how: signal.Signals) -> None:
    """``scripts/bench --llm`` stopped by SIGTERM (a CI timeout, a stop by hand) stops the llama.cpp
    server it started; killed outright, the kernel stops the server for it."""
    if not llama_cpp_installed():
        pytest.fail("llama-cpp-python is not installed: run scripts/models smollm2")
    bench = ROOT / "scripts" / "bench.py"
    process = subprocess.Popen(
        [sys.executable, str(bench), "--llm", "smollm2", "--folds", "50"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + MODEL_TIMEOUT
        servers: list[int] = []
        while not servers and time.monotonic() < deadline:
            servers = [c for c in children(process.pid) if b"llama_cpp.server" in command_line(c)]
            time.sleep(0.2)
        assert servers, "the benchmark never started its model server"
        time.sleep(2)  # let it get going
        process.send_signal(how)
        process.wait(timeout=MODEL_TIMEOUT)
        deadline = time.monotonic() + TIMEOUT * 4
        while any(alive(s) for s in servers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(s) for s in servers), "the model server outlived the benchmark"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
