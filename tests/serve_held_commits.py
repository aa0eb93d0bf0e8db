"""``voice-context serve`` on the SQLite store, with every group held between its last statement
and its COMMIT for ``--hold SECONDS`` (and logged as ``voice_context_store_commit_paused``, with
its writes): a window for a durability test to kill the process in.

    python tests/serve_held_commits.py --hold 2 --port 0 --store sqlite --data-dir DIR ...

The other arguments are ``voice-context serve``'s.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import anyio
import structlog

from voice_context.cli import build_parser
from voice_context.commands.serve import configure_logging, serve, settings_from
from voice_context.config import Settings
from voice_context.store import sqlite_path
from voice_context.store.sqlite import CommitHook, SQLiteStore

log = structlog.get_logger("voice_context.store")


def held(seconds: float) -> CommitHook:
    def hold(writes: Sequence[Sequence[object]]) -> None:
        log.warning("voice_context_store_commit_paused", seconds=seconds, writes=[list(w) for w in writes])
        time.sleep(seconds)

    return hold


async def main(settings: Settings, seconds: float) -> None:
    path = sqlite_path(settings.store.url, data_dir=settings.store.data_dir)
    assert path is not None, "the held commits are the SQLite store's"
    store = SQLiteStore(path, before_commit=held(seconds))
    try:
        await serve(settings, store=store)
    finally:
        await store.aclose()


if __name__ == "__main__":
    ours = argparse.ArgumentParser(add_help=False)
    ours.add_argument("--hold", type=float, required=True)
    known, rest = ours.parse_known_args()
    args = build_parser().parse_args(["serve", *rest])
    configure_logging(args.log_format, args.log_level)
    anyio.run(main, settings_from(args), known.hold)
    sys.exit(0)
