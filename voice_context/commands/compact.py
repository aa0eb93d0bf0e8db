"""``voice-context compact``: roll a stored session's tier summaries now.

::

    voice-context compact --session ID [--tier session|day|week] [--config FILE]
                          [--store URL] [--data-dir DIR] [--at ISO-8601]

Rolls, on demand, every period of the tiers up to ``--tier`` (``week`` by default)
that has ended by ``--at`` (now by default) and lacks its summary, whatever the
schedule: conversations ended by a silence longer than the gap (or by the end of the
transcript), days after their midnight, weeks after theirs. Uses the store and the
summarizer of the settings (``--config``, or the defaults: the embedded SQLite store
and the deterministic summarizer). Safe beside running servers: a roll another process
already made is kept, never overwritten by an older one. Prints one JSON line per
summary made, then one with the totals (logs go to standard error); exits 1 when the
session is unknown, does not keep tiers, or a roll failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

import anyio

from voice_context.commands.serve import configure_logging, settings_from
from voice_context.config import Settings, make_summarizer
from voice_context.core.tiers import TIERS, Tier
from voice_context.errors import ConfigError, StoreError
from voice_context.store import open_store
from voice_context.tiering import roll_tiers


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "compact",
        help="roll a stored session's conversation, day and week summaries now",
        description="Roll every ended period of a session's tiers that lacks its summary.",
    )
    parser.add_argument("--session", required=True, metavar="ID", help="the session's name")
    parser.add_argument(
        "--tier", choices=TIERS, default="week", help="roll the tiers up to this one (default: week)"
    )
    parser.add_argument("--at", metavar="ISO-8601", help="the time to roll at (default: now)")
    parser.add_argument("--config", metavar="FILE", help="a TOML settings file")
    parser.add_argument("--store", metavar="URL", help="sqlite (default), sqlite:///path.db, redis://...")
    parser.add_argument("--data-dir", metavar="DIR", help="where the embedded store keeps its file")
    parser.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))
    parser.set_defaults(func=run, host=None, port=None, record=None)


def _when(text: str | None) -> float:
    if text is None:
        return datetime.now().timestamp()
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise ConfigError(f"--at must be an ISO-8601 time, got {text!r}") from exc
    return when.timestamp()


async def compact(settings: Settings, name: str, tier: Tier, now: float) -> int:
    store = open_store(settings.store.url, data_dir=settings.store.data_dir)
    summarizer = make_summarizer(settings.summarizer)
    try:
        record = await store.load(name)
        if record is None:
            print(f"voice-context compact: no session {name!r} in the store", file=sys.stderr)
            return 1
        config = settings.session_config(summarizer).with_overrides(record.config)
        if not config.tiers:
            print(f"voice-context compact: session {name!r} does not keep tiers", file=sys.stderr)
            return 1
        report = await roll_tiers(
            store,
            summarizer,
            name,
            config,
            now,
            total_turns=record.total_turns,
            on_demand=True,
            tiers=TIERS[: TIERS.index(tier) + 1],
        )
    finally:
        aclose = getattr(summarizer, "aclose", None)
        if aclose is not None:
            await aclose()
        await store.aclose()
    for made in report.made:
        print(json.dumps({"made": made.as_dict()}, ensure_ascii=False))
    totals = {
        "session": name,
        "made": len(report.made),
        "rolled_elsewhere": len(report.elsewhere),
        "summaries": {t: sum(1 for r in report.rows if r.tier == t) for t in TIERS},
        "failed": report.failed,
    }
    print(json.dumps(totals, ensure_ascii=False))
    return 1 if report.failed else 0


def run(args: argparse.Namespace) -> int:
    configure_logging(level=args.log_level)
    try:
        settings = settings_from(args)
        return anyio.run(compact, settings, args.session, args.tier, _when(args.at))
    except (ConfigError, StoreError) as exc:
        print(f"voice-context compact: {exc}", file=sys.stderr)
        return 2
