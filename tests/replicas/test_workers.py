"""``voice-context serve --workers 2``: two real server processes on one port over one SQLite
file, under a supervisor that starts them, passes signals on, and stops them all when one dies."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from anyio.abc import Process
from serving import TIMEOUT, Wire, clean_env, http_get
from websockets.asyncio.client import ClientConnection, connect

from voice_context.config import load_settings
from voice_context.core.balance import BOUND
from voice_context.errors import ConfigError
from voice_context.testing.processes import children

#: two interpreters each load the server (and the first makes the store's schema) before it listens
STARTUP = TIMEOUT * 6


@dataclass
class Supervised:
    """A ``serve --workers 2`` process, where it listens, and its log (the workers' too)."""

    process: Process
    url: str
    port: int
    log: Path
    #: the worker processes, as the kernel lists the supervisor's children once it listens
    children: list[int]

    def events(self, name: str) -> list[dict[str, Any]]:
        lines = self.log.read_text().splitlines()
        entries = [orjson.loads(line) for line in lines if line.startswith("{")]
        return [entry for entry in entries if entry.get("event") == name]

    def worker_pids(self) -> dict[int, int]:
        return {entry["worker"]: entry["pid"] for entry in self.events("voice_context_worker_started")}

    def connected_to(self) -> set[int]:
        """The workers that took a websocket connection so far (each says so in its log)."""
        return {entry["worker"] for entry in self.events("voice_context_connection_opened")}

    def held(self) -> dict[int, int]:
        """The websocket connections each worker holds open, as the workers' logs tell."""
        held = dict.fromkeys(self.worker_pids(), 0)
        for entry in self.events("voice_context_connection_opened"):
            held[entry["worker"]] += 1
        for entry in self.events("voice_context_connection_closed"):
            held[entry["worker"]] -= 1
        return held

    def holder(self, ws: ClientConnection) -> int:
        """The worker that took the connection ``ws`` (its log names the client's port)."""
        here = "{}:{}".format(*ws.local_address[:2])
        [worker] = [
            e["worker"] for e in self.events("voice_context_connection_opened") if e["remote"] == here
        ]
        return int(worker)

    async def logged(self, name: str, count: int) -> None:
        """Wait until the workers logged ``name`` ``count`` times (a worker logs a connection once
        it served the handshake, maybe after the client saw the reply)."""
        with anyio.fail_after(TIMEOUT):
            while len(self.events(name)) < count:  # noqa: ASYNC110 - other processes' logs
                await anyio.sleep(0.02)

    async def exit_code(self) -> int:
        with anyio.fail_after(TIMEOUT * 4):
            return await self.process.wait()


@asynccontextmanager
async def supervised(tmp_path: Path, *args: str) -> AsyncIterator[Supervised]:
    """``voice-context serve --workers 2 --port 0`` over a SQLite file in ``tmp_path``, its
    stderr in a file (the workers log there too); killed, workers and all, when the block ends."""
    log = tmp_path / "serve.log"
    command = [sys.executable, "-m", "voice_context", "serve", "--port", "0", "--log-format", "json"]
    command += ["--workers", "2", "--store", f"sqlite:///{tmp_path / 'voice-context.db'}", *args]
    with log.open("wb") as stderr:
        process = await anyio.open_process(command, env=clean_env(), stderr=stderr)
    running: Supervised | None = None
    async with process:
        try:
            assert process.stdout is not None
            printed = b""
            with anyio.fail_after(STARTUP):
                while printed.count(b"\n") < 2:
                    chunk = await process.stdout.receive()
                    printed += chunk
            listening, inspector = printed.decode().splitlines()[:2]
            assert listening.startswith("listening on ws://127.0.0.1:"), listening
            url = listening.removeprefix("listening on ")
            port = int(url.rsplit(":", 1)[1].removesuffix("/v1"))
            assert inspector == f"inspector at http://127.0.0.1:{port}/inspector"
            running = Supervised(process, url, port, log, children(process.pid))
            assert len(running.children) == 2
            yield running
        finally:
            for pid in [process.pid, *(running.children if running is not None else [])]:
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
            with anyio.move_on_after(TIMEOUT):
                await process.wait()


async def gone(pid: int) -> bool:
    """Whether ``pid`` ends within the timeout."""
    with anyio.move_on_after(TIMEOUT * 4):
        while alive(pid):  # noqa: ASYNC110 - another process's end, which no event tells
            await anyio.sleep(0.05)
    return not alive(pid)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (an ended process not yet reaped by its parent does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.asyncio
async def test_both_workers_serve_one_port_a_bot_moves_between_them_and_a_signal_stops_them_all(
    tmp_path: Path,
) -> None:
    async with supervised(tmp_path) as running:
        # worker 0 made the new file's schema before it listened, alone (the others then opened it)
        made = f"file:{tmp_path / 'voice-context.db'}?mode=ro"
        with contextlib.closing(sqlite3.connect(made, uri=True)) as db:
            assert db.execute("SELECT version FROM schema_version").fetchone() is not None

        # each request on a fresh connection, which the kernel gives either worker
        answered: set[int] = set()
        for _ in range(200):
            health = await http_get(running.port, "/healthz")
            assert health.json()["status"] == "ok"
            answered.add(health.json()["worker"])
            if answered == {0, 1}:
                break
        assert answered == {0, 1}
        assert set(running.worker_pids()) == {0, 1}

        # a bot that reconnects lands on either worker, and resumes its session with every turn
        said, connection = 0, 0
        while connection < 8 or running.connected_to() != {0, 1}:
            connection += 1
            assert connection <= 64, running.connected_to()
            async with connect(running.url, open_timeout=TIMEOUT) as ws:
                bot = Wire(ws)
                opened = await bot.open("room-1")
                assert (opened["resumed"], opened["turns"]) == (connection > 1, said)
                for _ in range(2):
                    assert (await bot.append("room-1", said))["index"] == said
                    said += 1
                context = await bot.request("context.get", session="room-1", format="messages")
                words = str(context["messages"])
                assert [i for i in range(said) if not re.search(rf"\bturn {i}\b", words)] == []

        # a signal to the supervisor stops every worker gracefully, and it exits 0
        async with connect(running.url, open_timeout=TIMEOUT) as ws:
            bot = Wire(ws)
            await bot.open("room-1")
            assert (await bot.append("room-1", said))["index"] == said
            running.process.send_signal(signal.SIGTERM)
            assert await bot.closed_with() == 1001
        assert await running.exit_code() == 0
        stopped = {entry["worker"]: entry["code"] for entry in running.events("voice_context_worker_stopped")}
        assert stopped == {0: 0, 1: 0}
        assert len(running.events("voice_context_server_stopped")) == 2, "each worker shut down as serve does"
        assert [pid for pid in running.children if alive(pid)] == []


@pytest.mark.asyncio
async def test_connections_go_to_the_worker_that_holds_fewest(tmp_path: Path) -> None:
    async with supervised(tmp_path) as running, AsyncExitStack() as held:
        # twenty bots connect one after another and stay: each worker holds ten
        bots = [await held.enter_async_context(connect(running.url, open_timeout=TIMEOUT)) for _ in range(20)]
        await running.logged("voice_context_connection_opened", 20)
        counts = running.held()
        assert sorted(counts) == [0, 1] and abs(counts[0] - counts[1]) <= 1, counts

        # and each says so (a plain HTTP request is a connection too: one of them answers)
        health = (await http_get(running.port, "/healthz")).json()
        assert health["connections"] == counts[health["worker"]]

        # the bots on one worker leave: the next ten bots all go to it, the one holding fewer
        emptied = running.holder(bots[0])
        leaving = [bot for bot in bots if running.holder(bot) == emptied]
        for bot in leaving:
            await bot.close()
        await running.logged("voice_context_connection_closed", len(leaving))
        assert running.held()[emptied] == 0
        for _ in range(10):
            await held.enter_async_context(connect(running.url, open_timeout=TIMEOUT))
        await running.logged("voice_context_connection_opened", 30)
        assert running.held()[emptied] >= 9, running.held()


@pytest.mark.asyncio
async def test_a_stopped_worker_strands_no_connection_the_other_takes_them_within_the_bound(
    tmp_path: Path,
) -> None:
    async with supervised(tmp_path) as running, AsyncExitStack() as held:
        stopped = running.worker_pids()[1]
        os.kill(stopped, signal.SIGSTOP)  # it holds fewer than the other from now on, and looks at nothing
        try:
            waited = []
            for _ in range(6):
                began = time.monotonic()
                await held.enter_async_context(connect(running.url, open_timeout=TIMEOUT))
                waited.append(time.monotonic() - began)
            await running.logged("voice_context_connection_opened", 6)
            assert running.held() == {0: 6, 1: 0}
            # the other declined each (it held more) for the bound at most, then took it
            assert max(waited) < BOUND + TIMEOUT / 5, waited
        finally:
            os.kill(stopped, signal.SIGCONT)

        # back, it holds the fewest: the next bots go to it
        for _ in range(3):
            await held.enter_async_context(connect(running.url, open_timeout=TIMEOUT))
        await running.logged("voice_context_connection_opened", 9)
        assert running.held() == {0: 6, 1: 3}


@pytest.mark.asyncio
async def test_a_worker_killed_stops_the_other_and_the_supervisor_exits_non_zero(tmp_path: Path) -> None:
    async with supervised(tmp_path) as running:
        pids = running.worker_pids()
        os.kill(pids[1], signal.SIGKILL)
        assert await running.exit_code() != 0
        [exited] = running.events("voice_context_worker_exited")
        assert (exited["worker"], exited["code"]) == (1, -signal.SIGKILL)
        stopped = {entry["worker"]: entry["code"] for entry in running.events("voice_context_worker_stopped")}
        assert stopped == {0: 0}, "the other was stopped gracefully"
        assert not alive(pids[0])


@pytest.mark.asyncio
async def test_workers_whose_supervisor_is_killed_outright_shut_down_gracefully(tmp_path: Path) -> None:
    async with supervised(tmp_path) as running:
        os.kill(running.process.pid, signal.SIGKILL)  # no signal to pass on: the workers see it alone
        for pid in running.children:
            assert await gone(pid)
        assert {entry["worker"] for entry in running.events("voice_context_supervisor_gone")} == {0, 1}
        assert len(running.events("voice_context_server_stopped")) == 2


@pytest.mark.asyncio
async def test_workers_over_the_memory_store_are_refused() -> None:
    command = [sys.executable, "-m", "voice_context", "serve", "--port", "0", "--store", "memory"]
    with anyio.fail_after(TIMEOUT * 2):
        result = await anyio.run_process([*command, "--workers", "2"], env=clean_env(), check=False)
    assert result.returncode == 2
    assert result.stdout == b"", "nothing listened"
    assert b"server.workers = 2 needs a store the workers share" in result.stderr


def test_the_number_of_workers_comes_from_the_file_or_the_environment_within_1_to_64(tmp_path: Path) -> None:
    config = tmp_path / "voice-context.toml"
    config.write_text("[server]\nworkers = 4\nreuse_port = true\n")
    settings = load_settings(config, env={})
    assert (settings.server.workers, settings.server.reuse_port, settings.server.worker) == (4, True, None)
    settings = load_settings(
        config, env={"VOICE_CONTEXT_SERVER_WORKERS": "1", "VOICE_CONTEXT_SERVER_WORKER": "3"}
    )
    assert (settings.server.workers, settings.server.worker) == (1, 3)
    for wrong in ("0", "65"):
        with pytest.raises(ConfigError, match=r"server\.workers must be 1\.\.64"):
            load_settings(env={"VOICE_CONTEXT_SERVER_WORKERS": wrong})


def test_the_descriptors_a_worker_is_given_come_from_the_environment_and_are_checked() -> None:
    env = {"VOICE_CONTEXT_SERVER_LISTEN_FD": "3", "VOICE_CONTEXT_SERVER_LOADS_FD": "4"}
    settings = load_settings(env=env | {"VOICE_CONTEXT_SERVER_WORKER": "1"})
    assert (settings.server.listen_fd, settings.server.loads_fd) == (3, 4)
    with pytest.raises(ConfigError, match=r"server\.loads_fd needs server\.listen_fd and server\.worker"):
        load_settings(env=env)
    with pytest.raises(ConfigError, match=r"server\.listen_fd must be a descriptor"):
        load_settings(env={"VOICE_CONTEXT_SERVER_LISTEN_FD": "-1"})
