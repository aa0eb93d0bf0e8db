"""``voice-context replay``: feed recordings through the session code, offline or against a server.

::

    voice-context replay RECORDING... [--config FILE] [--set KEY=VALUE[,VALUE...] ...]
                         [--budget N[,N...]] [--out DIR] [--report html|png|none]
                         [--skip-bad-lines]
                         [--realtime [--speed X] [--max-gap SECONDS]] [--url URL [--token T]]

RECORDING is a file written by ``voice-context serve --record`` (or by
``voice-context import``), or a folder of them. Offline (the default), time
follows the recording without sleeping, and the same recording and settings
always give byte-identical outputs. ``--set`` takes ``session`` keys
(``recent_window=20``) or ``group.key`` (``summarizer.kind=openai``); several
values, or several ``--budget`` values, run as a grid. With ``--out``, each run
writes ``NAME.contexts.jsonl``, ``NAME.compactions.jsonl`` and
``NAME.timings.json`` (in one folder per grid point when there are several),
and a report with plots goes to ``DIR/report``. A table is always printed;
recordings with a ``NAME.probes.jsonl`` beside them are scored too. A recording the
replay cannot follow is refused (exit 2) before anything is replayed, with its first
bad line: one that is not a message a server takes (not JSON, not an object, an
unknown type, a missing or invalid field), ``ping`` or ``session.delete`` (never
recorded), or a message for a session no ``session.open`` before it opened. With
``--skip-bad-lines`` it is replayed without them, and stderr says how many were
skipped, and the first few. A file in which no line is a message is refused either way.

``--realtime`` sleeps the recorded gaps (divided by ``--speed``) and runs the
server's own session manager, compactions landing when they finish; ``--url``
replays against a live server with the bot client. Neither is reproducible.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import structlog

from voice_context.config import Settings, load_settings
from voice_context.errors import ClientError, ConfigError
from voice_context.tuning.audit import audit_contexts
from voice_context.tuning.replay import (
    ReplayResult,
    apply_values,
    parse_assignments,
    read_recording,
    recording_stem,
    replay_live,
    replay_realtime,
    write_result,
)
from voice_context.tuning.scoring import Conversation, read_probes, score_contexts
from voice_context.tuning.sweep import (
    PointResult,
    Run,
    grid,
    print_table,
    probes_path,
    recordings_in,
    run_grid,
    write_report,
)

#: How many of the bad lines ``--skip-bad-lines`` skipped are named on stderr.
SHOWN_BAD_LINES = 3


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config``, ``--set`` and ``--budget``, shared with ``voice-context score``."""
    parser.add_argument("--config", metavar="FILE", help="a TOML settings file (as for serve)")
    parser.add_argument(
        "--set",
        dest="assignments",
        action="append",
        default=[],
        metavar="KEY=VALUE[,VALUE...]",
        help="a setting (session key, or group.key); several values sweep a grid",
    )
    parser.add_argument(
        "--budget",
        metavar="N[,N...]",
        help="the budget_chars of every context.get (default: as recorded); several values sweep",
    )


def settings_and_grid(args: argparse.Namespace) -> tuple[Settings, Any]:
    settings = load_settings(args.config)
    assignments = parse_assignments(args.assignments)
    budgets: list[int | None] = [None]
    if args.budget:
        try:
            budgets = [int(b) for b in args.budget.split(",") if b.strip()]
        except ValueError as exc:
            raise ConfigError(f"--budget wants integers, got {args.budget!r}") from exc
    points = grid(assignments, budgets)
    for point in points:  # fail on a bad value before replaying anything
        summarizer = apply_values(settings, dict(point.values)).summarizer
        if summarizer.kind == "openai":
            summarizer.endpoint()
    return settings, points


@contextlib.contextmanager
def warnings_only() -> Iterator[None]:
    """The session manager's logs, while replaying: warnings only, to stderr (the table is
    printed on stdout); the logging set before is restored after."""
    saved = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    try:
        yield
    finally:
        structlog.configure(**saved)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="replay recordings offline (or against a server) and write the contexts a bot got",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("recordings", nargs="+", metavar="RECORDING", help="recording files or folders")
    add_settings_arguments(parser)
    parser.add_argument(
        "--out", metavar="DIR", type=Path, help="write contexts, compactions, timings, report"
    )
    parser.add_argument(
        "--report", choices=("html", "png", "none"), default="html", help="with --out (default html)"
    )
    parser.add_argument("--realtime", action="store_true", help="sleep the recorded gaps (not reproducible)")
    parser.add_argument(
        "--speed", type=float, default=1.0, help="with --realtime: play this many times faster"
    )
    parser.add_argument(
        "--max-gap", type=float, metavar="SECONDS", help="with --realtime: sleep at most this"
    )
    parser.add_argument("--url", help="replay against a live server, e.g. ws://127.0.0.1:8765/v1")
    parser.add_argument("--token", help="with --url: the bearer token")
    parser.add_argument("--session-prefix", default="", help="with --url: put this before every session name")
    parser.add_argument(
        "--skip-bad-lines",
        action="store_true",
        help="replay a recording without the lines it cannot follow, and say which (default: refuse it)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings, points = settings_and_grid(args)
    except ConfigError as exc:
        print(f"voice-context replay: {exc}", file=sys.stderr)
        return 2
    paths = recordings_in(args.recordings)
    missing = [p for p in paths if not p.is_file()]
    if missing or not paths:
        print(
            f"voice-context replay: no such recording: {missing[0] if missing else args.recordings}",
            file=sys.stderr,
        )
        return 2
    if args.speed <= 0:
        print("voice-context replay: --speed must be positive", file=sys.stderr)
        return 2
    for path in paths:
        problem = not_a_recording(path, settings.server.max_text_chars)
        if problem is not None:
            print(f"voice-context replay: {path} is not a recording: {problem}", file=sys.stderr)
            return 2
        bad = bad_lines(path, settings.server.max_text_chars)
        if bad and not args.skip_bad_lines:
            more = f" ({len(bad)} bad lines in all)" if len(bad) > 1 else ""
            print(
                f"voice-context replay: {path}: {bad[0]}{more}; --skip-bad-lines replays it without them",
                file=sys.stderr,
            )
            return 2
        if bad:
            shown = "; ".join(bad[:SHOWN_BAD_LINES])
            more = f"; and {len(bad) - SHOWN_BAD_LINES} more" if len(bad) > SHOWN_BAD_LINES else ""
            print(f"voice-context replay: {path}: skipped {_lines(len(bad))}: {shown}{more}", file=sys.stderr)
    with warnings_only():
        if args.url or args.realtime:
            try:
                results = anyio.run(_live, args, settings, points, paths)
            except ClientError as exc:  # the server at --url refused, or could not be reached
                print(f"voice-context replay: {args.url}: {exc}", file=sys.stderr)
                return 1
        else:
            results = anyio.run(
                lambda: run_grid(paths, settings, points, out_dir=args.out, progress=not args.no_progress)
            )
    print_table([r.row() for r in results])
    if args.out is not None and args.report != "none":
        index = write_report(results, args.out / "report", args.report)
        if index is None:
            print(
                "no report: matplotlib is not installed (pip install 'voice-context[report]')",
                file=sys.stderr,
            )
        else:
            print(f"report: {index}")
    return 0


def bad_lines(path: Path, max_text_chars: int) -> list[str]:
    """The lines of a recording the replay cannot follow, each ``line N: why`` (from line 1),
    in order: those :func:`~voice_context.tuning.replay.parse_recording` skips."""
    return read_recording(path, max_text_chars=max_text_chars).skipped


def _lines(count: int) -> str:
    return f"{count} bad line" if count == 1 else f"{count} bad lines"


def not_a_recording(path: Path, max_text_chars: int) -> str | None:
    """Why ``path`` cannot be replayed (no line of it is a message a server takes), or ``None``."""
    try:
        recording = read_recording(path, max_text_chars=max_text_chars)
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot read it ({exc})"
    if recording.messages:
        return None
    if not recording.skipped:
        return "it is empty"
    more = f" (and {len(recording.skipped) - 1} more)" if len(recording.skipped) > 1 else ""
    return f"no line is a message a server takes: {recording.skipped[0]}{more}"


async def _live(
    args: argparse.Namespace, settings: Settings, points: Any, paths: list[Path]
) -> list[PointResult]:
    results: list[PointResult] = []
    for point in points:
        outcome = PointResult(point)
        for path in paths:
            result: ReplayResult
            if args.url:
                if point.values:
                    raise SystemExit(
                        "voice-context replay: --set has no effect on a live server (use --budget)"
                    )
                result = await replay_live(
                    path,
                    args.url,
                    token=args.token,
                    realtime=args.realtime,
                    speed=args.speed,
                    max_gap=args.max_gap,
                    budget_chars=point.budget,
                    prefix=args.session_prefix,
                )
            else:
                result = await replay_realtime(
                    path,
                    settings,
                    values=dict(point.values),
                    budget_chars=point.budget,
                    speed=args.speed,
                    max_gap=args.max_gap,
                )
            if args.out is not None:
                write_result(result, args.out / point.slug if len(points) > 1 else args.out)
            scores = None
            if probes_path(path).exists():
                conv = Conversation.from_recording(read_recording(path))
                scores = score_contexts(result.contexts, read_probes(probes_path(path)), conv)
            dates = audit_contexts(result.contexts, read_recording(path))
            outcome.runs.append(Run(recording_stem(path), result, scores, dates))
        results.append(outcome)
    return results
