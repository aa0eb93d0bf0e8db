"""Real ``voice-context serve`` processes: killed with SIGKILL, restarted, and side by side on Redis.

Each server is the real command line in its own process, listening on a free
port of 127.0.0.1; the bot is the real client. Nothing here is faked: a turn
the server acknowledged has to be in the store when the process dies a
moment later, and a second process has to serve it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import pytest
from helpers import ROOT
from serving import clean_env

from voice_context.client import Client, SessionHandle
from voice_context.core.turns import Turn
from voice_context.store.base import Store
from voice_context.store.redis import RedisStore
from voice_context.store.sqlite import SQLiteStore
from voice_context.testing.openai_server import OpenAIServer, Reply, Stall
from voice_context.testing.redis_server import RedisServer

#: Guards against a hang, never a measurement; slow machines raise the scale.
TIMEOUT = 20.0 * float(os.environ.get("VOICE_CONTEXT_TEST_TIMEOUT_SCALE", "1"))
T0 = 1714572187.0
#: ``voice-context serve`` with each group held before its COMMIT (see the program's docstring)
HELD_COMMITS = ROOT / "tests" / "serve_held_commits.py"
SERVE = ("-m", "voice_context", "serve")
#: Folds 2 turns once more than 6 lie at or after the cursor.
SMALL = {"recent_window": 4, "batch_size": 2}


def spoken(i: int) -> Turn:
    return Turn(("Alice", "Bob")[i % 2], "user", f"turn {i}: we meet on day {i}.", T0 + i, id=f"utt-{i}")


class Serve:
    """``voice-context serve`` in a child process; ``url`` is where it says it listens."""

    def __init__(self, store_url: str, data_dir: Path, log: Path, program: Sequence[str] = SERVE) -> None:
        self.args = [
            sys.executable, *program,
            "--port", "0", "--store", store_url, "--data-dir", str(data_dir), "--log-format", "json",
        ]  # fmt: skip
        self.log = log
        self.process: subprocess.Popen[str] | None = None
        self.url = ""
        #: settings given to the process as ``VOICE_CONTEXT_*`` variables
        self.env: dict[str, str] = {}

    def __repr__(self) -> str:
        pid = self.process.pid if self.process else None
        return f"<Serve {self.url or 'not listening'} pid={pid}>"

    def spawn(self) -> subprocess.Popen[str]:
        env = clean_env() | self.env
        with self.log.open("a") as log:
            self.process = subprocess.Popen(
                self.args, stdout=subprocess.PIPE, stderr=log, text=True, env=env, start_new_session=True
            )
        return self.process

    async def start(self) -> str:
        """Start the process and wait for the line that says where it listens."""
        self.spawn()
        return await self.listening()

    async def listening(self) -> str:
        """Wait for the line of the spawned process that says where it listens."""
        assert self.process is not None
        stdout = self.process.stdout
        assert stdout is not None
        with anyio.fail_after(TIMEOUT):
            line = await anyio.to_thread.run_sync(stdout.readline, abandon_on_cancel=True)
        if not line.startswith("listening on "):
            self.kill()
            raise RuntimeError(f"serve did not start: {line!r}\n{self.log.read_text()[-3000:]}")
        self.url = line.split()[-1]
        return self.url

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, no goodbye."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int | None:
        """SIGTERM: the graceful shutdown; returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def close(self) -> None:
        self.kill()
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


async def start_together(*serves: Serve) -> list[str]:
    """Start the processes side by side (each takes a second or two to import and listen)."""
    for serve in serves:
        serve.spawn()
    return [await serve.listening() for serve in serves]


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[list[Serve]]:
    made: list[Serve] = []
    yield made
    for server in made:
        server.close()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with RedisServer(directory=tmp_path / "redis") as server:
        yield server


@contextlib.asynccontextmanager
async def bot(url: str) -> AsyncIterator[Client]:
    with anyio.fail_after(TIMEOUT):
        async with Client(url, reconnect=False) as client:
            yield client


async def speak(room: SessionHandle, indices: range) -> None:
    for i in indices:
        t = spoken(i)
        assert await room.append_turn(t.speaker, t.role, t.text, at=t.at, id=t.id) == i


async def compacted(room: SessionHandle, cursor: int) -> dict[str, Any]:
    """Ask for contexts until the summary covers the turns before ``cursor``."""
    with anyio.fail_after(TIMEOUT):
        while True:
            ctx = await room.context()
            if ctx["cursor"] >= cursor:
                return ctx
            await anyio.sleep(0.01)


async def transcript(store: Store, name: str) -> list[Turn]:
    try:
        return await store.read_turns(name, 0, 10_000)
    finally:
        await store.aclose()


@pytest.mark.asyncio
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_kill_9_right_after_an_ack_then_a_restart_loses_nothing(
    backend: str, tmp_path: Path, servers: list[Serve], request: pytest.FixtureRequest
) -> None:
    data = tmp_path / "data"
    store_url = "sqlite" if backend == "sqlite" else request.getfixturevalue("redis_server").url
    first = Serve(store_url, data, tmp_path / "serve.log")
    servers.append(first)

    async with bot(await first.start()) as client:
        room = await client.open("room-1", SMALL)
        assert not room.resumed
        await speak(room, range(8))
        await room.append_note("the raid planner is open", at=T0 + 3, speaker="Alice", source="game")
        before = await compacted(room, 2)
        last = spoken(8)
        index = await room.append_turn(last.speaker, last.role, last.text, at=last.at, id=last.id)
        assert index == 8
        first.kill()  # the very moment the ack arrived

    second = Serve(store_url, data, tmp_path / "serve.log")
    servers.append(second)
    async with bot(await second.start()) as client:
        room = await client.open("room-1")
        assert room.resumed
        assert room.opened["turns"] == 9
        # asked before any context: the first context may start the next fold (nine turns leave
        # a batch due), and whether it lands before that context is answered is down to timing
        state = await room.state()
        after = await room.context()

    assert (state["cursor"], state["summary_chars"]) == (before["cursor"], len(before["summary"]))
    assert after["cursor"] >= before["cursor"]
    assert state["live_notes"] == 1
    shown = [m["content"] for m in after["messages"]]
    assert any("turn 8: we meet on day 8." in text for text in shown), "the last acked turn is back"
    store: Store = (
        SQLiteStore(data / "voice-context.db") if backend == "sqlite" else RedisStore(store_url, prefix="vc")
    )
    assert await transcript(store, "room-1") == [spoken(i) for i in range(9)]
    assert second.stop() == 0


@pytest.mark.asyncio
async def test_two_server_processes_on_one_redis_with_a_bot_moving_between_them(
    tmp_path: Path, servers: list[Serve], redis_server: RedisServer
) -> None:
    a = Serve(redis_server.url, tmp_path / "a", tmp_path / "a.log")
    b = Serve(redis_server.url, tmp_path / "b", tmp_path / "b.log")
    servers.extend([a, b])
    url_a, url_b = await start_together(a, b)
    name = f"room-{uuid.uuid4().hex[:6]}"

    # the bot starts on A; its connection there stays open, as a half-dead one would
    async with bot(url_a) as on_a:
        room = await on_a.open(name, SMALL)
        await speak(room, range(7))
        first = await compacted(room, 2)

        # the load balancer sends it to B
        async with bot(url_b) as on_b:
            moved = await on_b.open(name, SMALL)
            assert moved.resumed and moved.opened["turns"] == 7 and moved.opened["cursor"] == 2
            ctx = await moved.context()
            assert ctx["summary"] == first["summary"]
            await speak(moved, range(7, 11))
            second = await compacted(moved, 4)
            assert second["summary"] != first["summary"]

        # and back to A, through a new connection
        async with bot(url_a) as again:
            back = await again.open(name, SMALL)
            assert back.resumed and back.opened["turns"] == 11
            ctx = await back.context()
            assert ctx["cursor"] >= 4
            await speak(back, range(11, 12))

    assert await transcript(RedisStore(redis_server.url), name) == [spoken(i) for i in range(12)]
    assert a.stop() == 0 and b.stop() == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.asyncio
async def test_a_server_killed_during_a_compaction_folds_again_within_seconds_of_its_restart(
    tmp_path: Path, servers: list[Serve]
) -> None:
    async with OpenAIServer(default=Reply("Alice and Bob agreed to meet on day 1.")) as provider:
        provider.script(Stall())  # the compaction under way when the process dies never returns
        port = str(free_port())  # a restarted server listens where it did: the same replica
        first, second = (Serve("sqlite", tmp_path / "data", tmp_path / "serve.log") for _ in range(2))
        for serve in (first, second):
            serve.args[serve.args.index("--port") + 1] = port
            serve.env = {
                "VOICE_CONTEXT_SUMMARIZER_KIND": "openai",
                "VOICE_CONTEXT_SUMMARIZER_FOLD": "paragraph",  # the summary is the provider's words
                "VOICE_CONTEXT_SUMMARIZER_BASE_URL": provider.base_url,
                "VOICE_CONTEXT_SUMMARIZER_MODEL": "scripted",
                "VOICE_CONTEXT_SUMMARIZER_MAX_RETRIES": "0",
            }
            servers.append(serve)
        async with bot(await first.start()) as client:
            room = await client.open("room-1", SMALL)
            await speak(room, range(8))
            assert (await room.context())["in_flight"] is True
            with anyio.fail_after(TIMEOUT):
                while not provider.completions:  # noqa: ASYNC110 - the provider's own record
                    await anyio.sleep(0.01)
            first.kill()  # holding the session's compaction lease

        async with bot(await second.start()) as client:
            room = await client.open("room-1")
            restarted = time.monotonic()
            with anyio.fail_after(10.0):  # its own lease (20 s) is taken back, never waited out
                ctx = await compacted(room, 2)
            waited = time.monotonic() - restarted
        assert ctx["summary"] == "Alice and Bob agreed to meet on day 1."
        assert waited < 5.0, waited
        assert second.stop() == 0


@pytest.mark.asyncio
async def test_kill_9_between_a_groups_write_and_its_commit_loses_only_turns_never_acknowledged(
    tmp_path: Path, servers: list[Serve]
) -> None:
    data, log = tmp_path / "data", tmp_path / "serve.log"
    # every group waits a second between its last statement and its COMMIT: time enough for four
    # turns sent at once to queue up behind the one written alone
    first = Serve("sqlite", data, log, program=(str(HELD_COMMITS), "--hold", str(TIMEOUT / 20)))
    servers.append(first)
    url = await first.start()
    acked: list[tuple[str, int]] = []
    names = [f"room-{k}" for k in range(5)]

    rooms: dict[str, SessionHandle] = {}

    async def speaker(name: str, i: int) -> None:
        room = rooms[name]
        t = spoken(i)
        acked.append((name, await room.append_turn(t.speaker, t.role, t.text, at=t.at, id=t.id)))

    def paused_groups() -> list[list[tuple[str, int]]]:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
        return [
            [(name, index) for name, index in entry["writes"]]
            for entry in lines
            if entry.get("event") == "voice_context_store_commit_paused"
        ]

    async with contextlib.AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(bot(url)) for _ in names]
        for client, name in zip(clients, names, strict=True):
            rooms[name] = await client.open(name)
        await speaker(names[0], 0)  # a group of one, committed and acknowledged
        assert acked == [("room-0", 0)]

        async with anyio.create_task_group() as tg:
            for k, name in enumerate(names):
                tg.start_soon(speaker, name, 1 if k == 0 else 0)
            # the first to arrive is written alone; the other four wait, then form one group
            with anyio.fail_after(TIMEOUT):
                while not any(len(group) == 4 for group in paused_groups()):  # noqa: ASYNC110 - a log file
                    await anyio.sleep(0.02)
            first.kill()  # the group is written, not committed
            tg.cancel_scope.cancel()

    held = next(group for group in paused_groups() if len(group) == 4)
    assert not set(held) & set(acked), "no turn of the group that never committed was acknowledged"
    assert len(acked) == 2, "the turn committed alone before it was acknowledged"

    second = Serve("sqlite", data, log)
    servers.append(second)
    await second.start()
    store = SQLiteStore(data / "voice-context.db")
    try:
        stored = {name: await store.read_turns(name, 0, 10) for name in names}
    finally:
        await store.aclose()
    assert second.stop() == 0
    for name, index in acked:
        assert stored[name][index] == spoken(index), "every acknowledged turn is on disk"
    for name, index in held:
        assert len(stored[name]) <= index, f"{name} turn {index} was never committed"
