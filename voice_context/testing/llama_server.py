"""A real llama.cpp server for the slow tests and the benches: ``python -m llama_cpp.server``.

It serves one GGUF model on 127.0.0.1, on a free port, until it is stopped::

    with LlamaServer(assemble("smollm2"), alias="smollm2-135m-instruct") as llama:
        summarizer = OpenAISummarizer(base_url=llama.base_url, model=llama.alias, max_retries=0)

It needs ``llama-cpp-python[server]`` (``scripts/models`` installs it). The
server is started with ``--interrupt_requests false``, so that requests queue
instead of cutting each other's streams off, and its own output goes to
``log`` (a file), where llama.cpp writes its timings and the clients it saw
leave.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from voice_context.testing.redis_server import free_port

__all__ = ["LlamaServer", "llama_cpp_installed"]

STARTUP_TIMEOUT = 180.0
STOP_TIMEOUT = 10.0


def llama_cpp_installed() -> bool:
    """Whether ``llama_cpp`` can be imported by this interpreter."""
    return importlib.util.find_spec("llama_cpp") is not None


class LlamaServer:
    """One ``llama_cpp.server`` process; ``start`` waits until it lists its model."""

    def __init__(
        self,
        model: str | Path,
        *,
        alias: str = "local-model",
        n_ctx: int = 8192,
        threads: int = 2,
        log: str | Path | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        extra_args: Sequence[str] = (),
        python: str = sys.executable,
    ) -> None:
        self.model = Path(model)
        self.alias = alias
        self.n_ctx = n_ctx
        self.threads = threads
        self.log = Path(log) if log is not None else None
        self.startup_timeout = startup_timeout
        self.extra_args = tuple(extra_args)
        self.python = python
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LlamaServer {self.model.name} as {self.alias!r} 127.0.0.1:{self.port} {state}>"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def base_url(self) -> str:
        """The API root to give an OpenAI client, ending in ``/v1``."""
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        return [
            self.python,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model),
            "--model_alias",
            self.alias,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.n_ctx),
            "--n_threads",
            str(self.threads),
            "--n_threads_batch",
            str(self.threads),
            "--interrupt_requests",
            "false",
            *self.extra_args,
        ]

    def start(self) -> None:
        """Start the server and wait until ``GET /v1/models`` answers; ``RuntimeError`` if it
        exits or stays silent past ``startup_timeout`` (with the end of its log)."""
        if self.running:
            raise RuntimeError("already running")
        if not self.model.is_file():
            raise FileNotFoundError(f"no model file {self.model}")
        if not llama_cpp_installed():
            raise RuntimeError("llama-cpp-python is not installed: run scripts/models")
        self.port = free_port()
        out = self.log.open("ab") if self.log is not None else subprocess.DEVNULL
        try:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},  # its log, line by line, as it happens
                preexec_fn=_die_with_parent if _main_thread() else None,
            )
        finally:
            if self.log is not None and not isinstance(out, int):
                out.close()
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"llama_cpp.server exited with {self.process.returncode}{self._tail()}")
            if self._lists_model():
                return
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama_cpp.server did not answer in {self.startup_timeout:g}s{self._tail()}")

    def _lists_model(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as response:
                listed = json.loads(response.read())
        except (OSError, ValueError, urllib.error.URLError):
            return False
        return any(entry.get("id") == self.alias for entry in listed.get("data", []))

    def _tail(self) -> str:
        if self.log is None or not self.log.is_file():
            return ""
        lines = self.log.read_text(errors="replace").splitlines()[-15:]
        return ":\n" + "\n".join(lines)

    def stop(self) -> None:
        """Terminate the server (kill it if it will not go) and wait for it."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(STOP_TIMEOUT)

    def __enter__(self) -> Self:
        # a SIGTERM to this process (a benchmark stopped by hand, a CI timeout) unwinds through
        # __exit__ instead of ending the process where it stands, so the server is stopped too
        self._previous_handler: Any = None
        if _main_thread():
            self._previous_handler = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self.start()
        except BaseException:
            self._restore_handler()
            raise
        return self

    def _restore_handler(self) -> None:
        if self._previous_handler is not None and _main_thread():
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            self._restore_handler()


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    """In the child, before it runs the server: on Linux, have the kernel send it SIGTERM when
    the process that started it dies, even by ``kill -9``, so no server outlives its user."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
