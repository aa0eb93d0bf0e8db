"""``voice-context serve --workers N``: N server processes on one port, over one store.

One process's event loop keeps to one core (one interpreter lock), so a box with more cores
runs more processes. With ``[server] workers`` above 1, ``serve`` is a supervisor of worker
processes, each the ordinary ``python -m voice_context serve`` with the same flags, one
worker. The supervisor binds the one listening socket itself (the real port, when ``--port 0``
asked for any free one) and makes a small block of shared memory where each worker keeps its
count of open connections; it passes both to each worker (``[server] listen_fd`` and
``loads_fd``), which serves on that socket instead of binding one. Every worker watches the
socket, and the one that holds the fewest connections takes the next (one a sibling has left
waiting for 20 ms, stopped or busy, is taken anyway): see :mod:`voice_context.server.listener`.
Bots hold their connections for hours, so a spread by the kernel's hash (``SO_REUSEPORT``,
which the workers used before) stayed as uneven as it began. Worker 0 starts first, alone: the
store's schema is made (or migrated) by one process before the others open the store. Workers
1..N-1 then start, the supervisor lets go of the socket (once the last worker stops listening,
the port refuses), and it prints the two lines ``serve`` prints (where it listens, where the
inspector is).
Each worker holds compaction leases under a name of its own (``<replica>/<k>``, the same after
a restart on a fixed port), and the workers share sessions through the store as replicas do:
a bot whose next connection lands on another worker resumes its session from the store.

The first SIGTERM or SIGINT goes to every worker, and each shuts down gracefully as ``serve``
does; the supervisor exits 0 once all of them exited 0. A worker that exits on its own (a
crash, ``kill -9``) is logged, the others are stopped the same way, and the supervisor exits
non-zero, so that a process manager restarts the whole: the port never goes on serving with
fewer workers than configured without anyone being told, and the bots reconnect and resume
their sessions from the store. A supervisor killed outright (SIGKILL) passes nothing on: its
workers notice they lost their parent within a second and shut down gracefully too. The workers'
logs go to the supervisor's stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

import anyio
from anyio.abc import Process, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream

from voice_context.config import ENV_PREFIX, Settings
from voice_context.errors import ConfigError
from voice_context.logs import get_logger
from voice_context.server.app import replica_name
from voice_context.server.connection import SHUTDOWN_GRACE
from voice_context.server.listener import Loads, bind

log = get_logger("voice_context.serve")

ORPHAN_POLL_SECONDS = 1.0
"""How often a worker checks that its supervisor is still there."""

LISTENING = "listening on "
"""How a server's first line on stdout begins: ``listening on ws://HOST:PORT/v1``."""

MAX_LINE = 64 * 1024


def check_shared(settings: Settings) -> None:
    """Raise :class:`ConfigError` when the workers would share nothing: the memory store lives
    in one process, so each worker would hold sessions of its own that the others cannot see."""
    if settings.server.workers > 1 and settings.store.url in ("memory", "memory://"):
        raise ConfigError(
            f"server.workers = {settings.server.workers} needs a store the workers share (sqlite or "
            "redis): the memory store lives in one process"
        )


def replica_base(settings: Settings) -> str:
    """What the workers' lease names are made from: the configured replica, else
    ``<hostname>:<port>`` on a fixed port (a restart keeps the names), else a random name
    (a port picked anew at each start is no one's to take back)."""
    cfg = settings.server
    return replica_name(cfg.replica, cfg.port) or f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"


async def stop_when_orphaned(request_shutdown: Callable[[], None], supervisor: int) -> None:
    """In a worker: shut down gracefully once the supervisor (the parent process ``supervisor``)
    is gone, killed with a signal it could not pass on (SIGKILL): the workers never go on
    serving unsupervised, each holding the port."""
    while os.getppid() == supervisor:  # noqa: ASYNC110 - the kernel tells no event of it
        await anyio.sleep(ORPHAN_POLL_SECONDS)
    log.warning("voice_context_supervisor_gone", supervisor=supervisor)
    request_shutdown()


@dataclass(eq=False)
class Worker:
    """One worker process and what it printed once it listened."""

    index: int
    process: Process
    banner: list[str] = field(default_factory=list)
    ready: anyio.Event = field(default_factory=anyio.Event)

    def __repr__(self) -> str:
        state = "running" if self.process.returncode is None else f"exited {self.process.returncode}"
        return f"<Worker {self.index} pid={self.process.pid} {state}>"

    def send(self, signum: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            self.process.send_signal(signum)

    async def read_banner(self, stdout: BufferedByteReceiveStream) -> None:
        """Read up to the ``listening on`` line and the inspector's after it (nothing when the
        process ends first), then mark the worker ready either way."""
        try:
            while not self.banner:
                line = (await stdout.receive_until(b"\n", MAX_LINE)).decode()
                if line.startswith(LISTENING):
                    self.banner = [line, (await stdout.receive_until(b"\n", MAX_LINE)).decode()]
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.DelimiterNotFound):
            pass
        finally:
            self.ready.set()


class Supervisor:
    """Starts the workers, passes signals on, and stops them all when one exits on its own."""

    def __init__(self, settings: Settings, argv: Sequence[str]) -> None:
        self.settings = settings
        self.argv = list(argv)
        self.base = replica_base(settings)
        self.workers: list[Worker] = []
        self.stopping = False
        #: the exit code: the first worker to exit on its own decides it
        self.code = 0
        self._tg: TaskGroup | None = None
        #: the socket the workers share, its port, and the descriptor of their loads (both the
        #: supervisor's until the workers are started)
        self._listening: socket.socket
        self.port = settings.server.port
        self._loads_fd = -1

    def __repr__(self) -> str:
        state = "stopping" if self.stopping else "running"
        return f"<Supervisor {self.base} {state} workers={self.workers}>"

    async def run(self) -> int:
        """Serve until every worker has exited; the exit code. Raises ``OSError`` when the port
        cannot be bound."""
        cfg = self.settings.server
        self._listening = bind(cfg.host, cfg.port, reuse_port=cfg.reuse_port)
        self.port = int(self._listening.getsockname()[1])  # the real one, when asked for any (0)
        loads, self._loads_fd = Loads.create(cfg.workers)  # every slot empty until its worker accepts
        loads.close()
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._watch, signals)
                async with anyio.create_task_group() as running:
                    await self._start_all(running)
                tg.cancel_scope.cancel()
        return self.code

    async def _start_all(self, tg: TaskGroup) -> None:
        try:
            started = await self._start_each(tg)
        finally:
            # the workers hold them now: once the last of them stops listening, the port refuses
            self._listening.close()
            os.close(self._loads_fd)
        if started and not self.stopping:
            workers = len(self.workers)
            log.info("voice_context_workers_listening", workers=workers, port=self.port, replica=self.base)
            for line in self.workers[0].banner:
                print(line, flush=True)

    async def _start_each(self, tg: TaskGroup) -> bool:
        """Start the workers one after another, each once the one before listens (worker 0 makes
        the store's schema alone); whether all of them listen."""
        for k in range(self.settings.server.workers):
            if self.stopping:
                return False
            worker = await self._spawn(k)
            tg.start_soon(self._run, worker)
            await worker.ready.wait()
            if not worker.banner:
                return False  # it ended before listening: _run stops the others
        return True

    async def _spawn(self, k: int) -> Worker:
        command = [sys.executable, "-m", "voice_context", "serve", *self.argv, "--port", str(self.port)]
        listen_fd = self._listening.fileno()
        env = os.environ | {
            f"{ENV_PREFIX}SERVER_WORKERS": "1",
            f"{ENV_PREFIX}SERVER_REPLICA": f"{self.base}/{k}",
            f"{ENV_PREFIX}SERVER_WORKER": str(k),
            f"{ENV_PREFIX}SERVER_LISTEN_FD": str(listen_fd),
            f"{ENV_PREFIX}SERVER_LOADS_FD": str(self._loads_fd),
        }
        process = await anyio.open_process(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stderr=None,
            pass_fds=(listen_fd, self._loads_fd),
        )
        worker = Worker(k, process)
        self.workers.append(worker)
        log.info("voice_context_worker_started", worker=k, pid=process.pid)
        if self.stopping:  # a signal came while it was being started
            worker.send(signal.SIGTERM)
        return worker

    async def _run(self, worker: Worker) -> None:
        """Watch one worker: its banner, then its stdout to the end (so it never blocks on a
        full pipe), then its exit."""
        assert worker.process.stdout is not None
        stdout = BufferedByteReceiveStream(worker.process.stdout)
        await worker.read_banner(stdout)
        with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError):
            while True:
                await stdout.receive()
        code = await worker.process.wait()
        self._exited(worker, code)

    def _exited(self, worker: Worker, code: int) -> None:
        fields = {"worker": worker.index, "pid": worker.process.pid, "code": code}
        if self.stopping:
            log.info("voice_context_worker_stopped", **fields)
            # a worker still starting when the signal came may die of it before it can catch it
            if code not in (0, -signal.SIGTERM, -signal.SIGINT) and self.code == 0:
                self.code = 1
            return
        # on its own: the others are stopped too, never left serving fewer than configured
        log.error("voice_context_worker_exited", **fields)
        self.code = code if code > 0 else 1
        self._stop_all(signal.SIGTERM)

    async def _watch(self, signals: AsyncIterator[signal.Signals]) -> None:
        async for signum in signals:
            name = signal.Signals(signum).name
            if self.stopping:
                log.warning("voice_context_signal_ignored", signal=name)
                continue
            log.info("voice_context_signal", signal=name)
            self._stop_all(signum)

    def _stop_all(self, signum: signal.Signals) -> None:
        """Pass ``signum`` on to every worker still running; kill those still running once a
        graceful shutdown should have ended."""
        self.stopping = True
        for worker in self.workers:
            if worker.process.returncode is None:
                worker.send(signum)
        if self._tg is not None:
            self._tg.start_soon(self._kill_late)

    async def _kill_late(self) -> None:
        # a worker's drain is bounded by shutdown_timeout (+ grace), and so is landing its folds
        await anyio.sleep(2 * self.settings.server.shutdown_timeout + 3 * SHUTDOWN_GRACE + 5)
        for worker in self.workers:
            if worker.process.returncode is None:
                log.error("voice_context_worker_killed", worker=worker.index, pid=worker.process.pid)
                worker.send(signal.SIGKILL)
