"""``voice-context import``: public transcript datasets as recordings, their annotations as probes.

::

    voice-context import locomo|qmsum|ami FILE... --out DIR [--every N] [--requests-every K]
                                                  [--only ID ...]

Each conversation or meeting becomes ``DIR/NAME.jsonl`` (a recording, as
``voice-context serve --record`` writes them) and ``DIR/NAME.probes.jsonl``
(the questions, decisions and actions with their evidence turn ids, and the
ids of the checkpoint requests). LoCoMo gets a checkpoint at the end of every
session, the others every ``--every`` turns; a bot asks for its context every
``--requests-every`` turns besides. ``ami`` also reads ICSI files of the same
shape. See :mod:`voice_context.tuning.importers` for the details.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from voice_context.tuning.importers import (
    DEFAULT_CHECKPOINT_EVERY,
    DEFAULT_REQUEST_EVERY,
    SOURCES,
    import_files,
)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "import",
        help="turn LoCoMo, QMSum or AMI files into recordings with probes",
        description="Turn public transcript datasets into recordings, with their annotations as probes.",
    )
    parser.add_argument("source", choices=SOURCES, help="the dataset's shape")
    parser.add_argument("files", nargs="+", type=Path, metavar="FILE", help="dataset files (JSON or JSONL)")
    parser.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="where to write the recordings"
    )
    parser.add_argument(
        "--every",
        type=int,
        default=DEFAULT_CHECKPOINT_EVERY,
        metavar="N",
        help=f"qmsum/ami: a checkpoint every N turns (default {DEFAULT_CHECKPOINT_EVERY})",
    )
    parser.add_argument(
        "--requests-every",
        type=int,
        default=DEFAULT_REQUEST_EVERY,
        metavar="K",
        help=f"a context.get every K turns, as a bot replying (default {DEFAULT_REQUEST_EVERY}; 0: none)",
    )
    parser.add_argument("--only", nargs="+", default=(), metavar="ID", help="ami/qmsum: only these meetings")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    missing = [f for f in args.files if not f.is_file()]
    if missing:
        print(f"voice-context import: no such file: {missing[0]}", file=sys.stderr)
        return 2
    if args.every < 0 or args.requests_every < 0:
        print("voice-context import: --every and --requests-every must be >= 0", file=sys.stderr)
        return 2
    try:
        done = import_files(
            args.source,
            args.files,
            args.out,
            every=args.every,
            request_every=args.requests_every,
            only=args.only,
        )
    except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
        print(f"voice-context import: cannot read {args.source} data: {exc}", file=sys.stderr)
        return 1
    for imported in done:
        checkpoints = len(imported.meta.get("checkpoints", []))
        probes = len(imported.probes)
        print(f"{imported.name}: {imported.turns} turns, {checkpoints} checkpoints, {probes} probes")
    print(f"{len(done)} recording(s) in {args.out}")
    return 0 if done else 1
