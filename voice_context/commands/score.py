"""``voice-context score``: how much of what matters survived, beside the baselines.

::

    voice-context score RECORDING... [--contexts DIR] [--probes FILE]
                        [--config FILE] [--set KEY=VALUE[,VALUE...] ...] [--budget N[,N...]]
                        [--json FILE] [--checkpoints FILE]

Each recording needs a probes file (``NAME.probes.jsonl`` beside it, or
``--probes``). With ``--contexts DIR`` the contexts a previous ``replay --out
DIR`` wrote are scored; without it the recording is replayed offline first,
with the settings given (several values or budgets sweep a grid). For every
checkpoint and every probe whose evidence turns have left the verbatim part of
the context: the rarity-weighted recall of the answer's content words, whether
the evidence speaker is named with it and whether its numbers and dates
survive, for our context and, at the same budget, for the last turns that fit
(tail), head plus tail, and the whole transcript (the ceiling). See
:mod:`voice_context.scoring` for the exact definitions. After the table, the
date audit of each row: how many summary sentences were shown under a date
other than the day they were said, or under none (:mod:`voice_context.audit`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import anyio

from voice_context.audit import DateAudit, audit_contexts
from voice_context.commands.replay import add_settings_arguments, settings_and_grid, warnings_only
from voice_context.errors import ConfigError
from voice_context.replay import read_contexts, read_recording, recording_stem
from voice_context.scoring import Conversation, Scores, read_probes, score_contexts
from voice_context.sweep import probes_path, recordings_in, run_grid

HEADERS = ("point", "pairs", "ours", "tail", "head+tail", "ceiling", "gap", "speaker", "numbers")


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "score",
        help="score contexts against a probes file, beside the tail, head+tail and no-budget baselines",
        description="Score each checkpoint's context against the probes, beside three baselines.",
    )
    parser.add_argument("recordings", nargs="+", metavar="RECORDING", help="recording files or folders")
    parser.add_argument("--contexts", type=Path, metavar="DIR", help="score what `replay --out DIR` wrote")
    parser.add_argument("--probes", type=Path, metavar="FILE", help="the probes file (one recording only)")
    add_settings_arguments(parser)
    parser.add_argument("--json", type=Path, metavar="FILE", help="write the scores as JSON")
    parser.add_argument(
        "--checkpoints", type=Path, metavar="FILE", help="write per-checkpoint scores (JSONL)"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths = recordings_in(args.recordings)
    if args.probes is not None and len(paths) != 1:
        print("voice-context score: --probes names the probes of a single recording", file=sys.stderr)
        return 2
    for path in paths:
        probes = args.probes or probes_path(path)
        if not path.is_file() or not probes.is_file():
            print(f"voice-context score: missing {path if not path.is_file() else probes}", file=sys.stderr)
            return 2
    try:
        settings, points = settings_and_grid(args)
    except ConfigError as exc:
        print(f"voice-context score: {exc}", file=sys.stderr)
        return 2
    rows: list[tuple[str, Scores]] = []
    audits: list[DateAudit] = []
    if args.contexts is not None:
        total = Scores()
        dates = DateAudit()
        for path in paths:
            contexts = read_contexts(args.contexts / f"{recording_stem(path)}.contexts.jsonl")
            asked = args.contexts / f"{recording_stem(path)}.questions.jsonl"
            questions = read_contexts(asked) if asked.is_file() else []
            recording = read_recording(path)
            conv = Conversation.from_recording(recording)
            probes = read_probes(args.probes or probes_path(path))
            total.merge(score_contexts(contexts, probes, conv, questions))
            dates.merge(audit_contexts(contexts, recording))
        rows.append((str(args.contexts), total))
        audits.append(dates)
    else:
        if args.probes is not None:  # the grid runner looks beside the recording
            print(
                "voice-context score: --probes needs --contexts; put NAME.probes.jsonl beside it",
                file=sys.stderr,
            )
            return 2
        with warnings_only():
            results = anyio.run(lambda: run_grid(paths, settings, points, progress=sys.stderr.isatty()))
        for result in results:
            total = Scores()
            dates = DateAudit()
            for run_ in result.runs:
                if run_.scores is not None:
                    total.merge(run_.scores)
                if run_.dates is not None:
                    dates.merge(run_.dates)
            rows.append((result.point.label, total))
            audits.append(dates)
    print_scores(rows)
    for (label, _), dates in zip(rows, audits, strict=True):
        print(f"{label}: {dates}")
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                [
                    {"point": label, **scores.summary(), "dates": dates.row()}
                    for (label, scores), dates in zip(rows, audits, strict=True)
                ],
                indent=1,
            )
            + "\n",
            encoding="utf-8",
        )
    if args.checkpoints is not None:
        with args.checkpoints.open("w", encoding="utf-8") as handle:
            for label, scores in rows:
                for row in scores.checkpoints:
                    handle.write(json.dumps({"point": label, **row}) + "\n")
    return 0


def score_row(label: str, scores: Scores) -> list[str]:
    summary = scores.summary()
    methods = summary["methods"]

    def f(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    return [
        label,
        str(summary["pairs"]),
        f(methods["ours"]["recall"]),
        f(methods["tail"]["recall"]),
        f(methods["head_tail"]["recall"]),
        f(methods["full"]["recall"]),
        f(summary["gap"], 2),
        f(methods["ours"]["speaker"]),
        f(methods["ours"]["numbers"]),
    ]


def print_scores(rows: list[tuple[str, Scores]]) -> None:
    cells = [score_row(label, scores) for label, scores in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(HEADERS)]
    print(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(HEADERS, widths, strict=True))
        )
    )
    for c in cells:
        print(
            "  ".join(
                v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(c, widths, strict=True))
            )
        )
