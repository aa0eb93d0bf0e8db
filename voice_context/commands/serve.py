"""``voice-context serve``: run the websocket sidecar until SIGTERM or SIGINT.

Settings come from the defaults, then ``--config FILE`` (TOML), then
``VOICE_CONTEXT_*`` environment variables, then the flags given here. The
listening URL is printed on stdout (``listening on ws://HOST:PORT/v1``, with the
real port when ``--port 0`` asked for any free one), then the inspector's on the next line
(``inspector at http://HOST:PORT/inspector``); logs go to stderr.

The first SIGTERM or SIGINT shuts down gracefully: stop accepting, finish the
requests in progress, close connections with 1001, land the compactions in
flight (up to ``server.shutdown_timeout``), close the store; then exit 0.

``--workers N`` (``server.workers``) runs N such servers on the one port, over the
same store, under a supervisor: see :mod:`voice_context.commands.workers`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from functools import partial
from typing import Any

import anyio
import structlog

from voice_context.commands.workers import Supervisor, check_shared, stop_when_orphaned
from voice_context.config import Settings, load_settings
from voice_context.errors import ConfigError, StoreError
from voice_context.logs import get_logger
from voice_context.server import Server
from voice_context.server.collector import keep_collector_off
from voice_context.store.base import Store

log = get_logger("voice_context.serve")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "serve",
        help="run the websocket sidecar",
        description="Serve protocol v1 at ws://HOST:PORT/v1, with /healthz and /metrics on the same port.",
    )
    parser.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on; 0 picks a free one (default 8765)")
    parser.add_argument("--config", metavar="FILE", help="a TOML settings file")
    parser.add_argument("--record", metavar="DIR", help="write every accepted message to DIR/<session>.jsonl")
    parser.add_argument(
        "--store", metavar="URL", help="sqlite (default), sqlite:///path.db, memory, redis://..."
    )
    parser.add_argument("--data-dir", metavar="DIR", help="where the embedded store keeps its file")
    parser.add_argument(
        "--log-format",
        choices=("auto", "json", "console"),
        default="auto",
        help="JSON lines, or readable lines; auto picks console on a terminal (default auto)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="server processes on the one port, over the same store (default 1; not with --store memory)",
    )
    parser.set_defaults(func=run)


FLAGS = {
    "--host": "host",
    "--port": "port",
    "--config": "config",
    "--record": "record",
    "--store": "store",
    "--data-dir": "data_dir",
    "--log-format": "log_format",
    "--log-level": "log_level",
}
"""The flags a worker is given as the supervisor was (all but ``--workers``), by their attribute."""


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The supervisor's flags, for each of its workers."""
    argv: list[str] = []
    for flag, name in FLAGS.items():
        value = getattr(args, name)
        if value is not None:
            argv += [flag, str(value)]
    return argv


def settings_from(args: argparse.Namespace) -> Settings:
    """Defaults, the file, the environment, then the flags."""
    settings = load_settings(args.config)
    server: dict[str, Any] = {}
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    if args.record is not None:
        server["record_dir"] = args.record
    if getattr(args, "workers", None) is not None:  # (compact reads its settings here too)
        server["workers"] = args.workers
    if server:
        settings = settings.with_values("server", server)
    store: dict[str, Any] = {}
    if args.store is not None:
        store["url"] = args.store
    if args.data_dir is not None:
        store["data_dir"] = args.data_dir
    if store:
        settings = settings.with_values("store", store)
    return settings


def configure_logging(fmt: str = "auto", level: str = "info") -> None:
    """structlog to stderr: JSON lines, or readable lines on a terminal."""
    if fmt == "auto":
        fmt = "console" if sys.stderr.isatty() else "json"
    renderer: Any = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        # a line in one write: the workers of `serve --workers` share one stderr, and with an
        # unbuffered one (PYTHONUNBUFFERED) print's two writes of a line would interleave theirs
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    logging.getLogger("websockets").setLevel(logging.WARNING)


async def serve(settings: Settings, *, store: Store | None = None) -> None:
    """Run until the first SIGTERM or SIGINT, then shut down gracefully. ``store``: the one to
    serve from (the caller closes it), instead of the one ``settings.store`` names. A worker of
    ``serve --workers`` says which in every log line (the workers share one stderr)."""
    worker = settings.server.worker
    supervisor = os.getppid()
    with (
        structlog.contextvars.bound_contextvars(**({} if worker is None else {"worker": worker})),
        anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals,
    ):
        async with Server(settings, store=store) as server:
            print(f"listening on {server.url}", flush=True)
            token = " (add ?token=YOUR_TOKEN)" if settings.server.auth_tokens else ""
            print(f"inspector at {server.inspector_url}{token}", flush=True)

            async def watch() -> None:
                async for signum in signals:
                    if server.stopping:
                        log.warning("voice_context_signal_ignored", signal=signal.Signals(signum).name)
                        continue
                    log.info("voice_context_signal", signal=signal.Signals(signum).name)
                    server.request_shutdown()

            async with anyio.create_task_group() as tg:
                tg.start_soon(watch)
                if worker is not None:
                    tg.start_soon(stop_when_orphaned, server.request_shutdown, supervisor)
                freeze_seconds = settings.server.gc_freeze_seconds
                if freeze_seconds > 0:
                    tg.start_soon(partial(keep_collector_off, server.load, freeze_seconds=freeze_seconds))
                await server.serve_forever()
                tg.cancel_scope.cancel()


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
        check_shared(settings)
    except ConfigError as exc:
        print(f"voice-context serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(args.log_format, args.log_level)
    try:
        if settings.server.workers > 1:
            code: int = anyio.run(Supervisor(settings, worker_argv(args)).run)
            return code
        anyio.run(serve, settings)
    except (ConfigError, StoreError) as exc:
        print(f"voice-context serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{settings.server.host}:{settings.server.port}"
        print(f"voice-context serve: cannot listen on {where}: {exc}", file=sys.stderr)
        return 1
    return 0
