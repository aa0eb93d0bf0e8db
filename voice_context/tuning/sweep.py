"""Replay recordings over a grid of settings: a progress bar, a table, and a report with plots.

A grid is every combination of the values given per key
(``--set recent_window=20,50 --set max_summary_chars=800,1200``) and of the
budgets (``--budget 4000,8000``). Each point replays every recording offline
(:mod:`voice_context.tuning.replay`); when a recording has a probes file beside it
(``NAME.probes.jsonl``), the point is also scored (:mod:`voice_context.tuning.scoring`).

The table has one row per point: contexts served, compactions, summarizer calls
and characters sent (in all, and per turn), context and summary sizes,
wall-clock latencies of the summarizer and of the context assembly, the
recall scores when there were probes, and the share of summary sentences shown
under the wrong date or none (the date audit, :mod:`voice_context.tuning.audit`); under it,
a legend says what each column means (:data:`COLUMNS`). The
report (``report/index.html`` with PNG plots, or the PNGs alone) shows, per
recording and point: the context size over the session, the summary size with
the compactions marked, the cursor, summarizer calls and characters sent over
the session, the latencies, and the recall beside the baselines.

``matplotlib``, ``rich`` and ``tqdm`` (the ``report`` extra) are imported only
when they are used; without them the table is plain text, there is no progress
bar, and no plots are drawn.
"""

from __future__ import annotations

import html
import importlib
import itertools
import json
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TextIO

from voice_context.config import Settings
from voice_context.summarizers.base import Summarizer
from voice_context.tuning.audit import DateAudit, audit_contexts
from voice_context.tuning.replay import (
    Recording,
    ReplayResult,
    read_recording,
    recording_stem,
    replay_file,
    write_result,
)
from voice_context.tuning.scoring import Conversation, Scores, read_probes, score_contexts

MAX_PLOTTED_RECORDINGS = 8


@dataclass(frozen=True, slots=True)
class Point:
    """One combination of the grid: ``group.key`` values, and the budget override (if any)."""

    values: tuple[tuple[str, str], ...] = ()
    budget: int | None = None

    @property
    def label(self) -> str:
        parts = [f"{key.removeprefix('session.')}={value}" for key, value in self.values]
        if self.budget is not None:
            parts.append(f"budget={self.budget}")
        return " ".join(parts) or "defaults"

    @property
    def slug(self) -> str:
        parts = [f"{key.removeprefix('session.')}-{value}" for key, value in self.values]
        if self.budget is not None:
            parts.append(f"budget-{self.budget}")
        slug = "_".join(parts) or "defaults"
        return "".join(c if c.isalnum() or c in "-_." else "-" for c in slug)


def grid(assignments: Mapping[str, Sequence[str]], budgets: Sequence[int | None] = (None,)) -> list[Point]:
    """Every combination, in the order the keys and values were given (budgets vary fastest)."""
    keys = list(assignments)
    combos = itertools.product(*(assignments[key] for key in keys)) if keys else [()]
    return [
        Point(tuple(zip(keys, combo, strict=True)), budget)
        for combo in combos
        for budget in (budgets or (None,))
    ]


@dataclass(slots=True)
class Run:
    """One recording replayed at one point, with its scores when it had probes."""

    recording: str
    result: ReplayResult
    scores: Scores | None = None
    dates: DateAudit | None = None


@dataclass(slots=True)
class PointResult:
    point: Point
    runs: list[Run] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The point's line in the table (and in ``sweep.json``)."""
        contexts = [c for run in self.runs for c in run.result.contexts]
        compactions = [c for run in self.runs for c in run.result.compactions]
        turns = sum(len(t) for run in self.runs for t in run.result.turns.values())
        sent = sum(c["chars_sent"] for c in compactions)
        applied = sum(1 for c in compactions if c["outcome"] in ("applied", "clamped"))
        finals = [
            run.result.contexts[-1]["state"]["summary_chars"] for run in self.runs if run.result.contexts
        ]
        chars = [c["response"]["chars"] for c in contexts]
        summarizer_ms = [ms for run in self.runs for ms in run.result.summarizer_ms]
        context_ms = [ms for run in self.runs for ms in run.result.context_ms]
        if contexts and not any(_counts_summarizer(c) for c in contexts):
            # a live server does not say what its summarizer was sent: unknown, not 0; its state
            # says how many compactions each session has had
            applied = sum(
                run.result.contexts[-1]["state"].get("compactions", 0)
                for run in self.runs
                if run.result.contexts
            )
        row: dict[str, Any] = {
            "point": self.point.label,
            "recordings": len(self.runs),
            "turns": turns,
            "contexts": len(contexts),
            "compactions": applied,
            "summarizer_calls": len(compactions),
            "chars_sent": sent,
            "chars_sent_per_turn": sent / turns if turns else 0.0,
            "context_chars_mean": statistics.fmean(chars) if chars else 0.0,
            "context_chars_max": max(chars, default=0),
            "summary_chars_final": statistics.fmean(finals) if finals else 0.0,
            "summarizer_ms_p50": _quantile(summarizer_ms, 0.5),
            "summarizer_ms_p95": _quantile(summarizer_ms, 0.95),
            "context_ms_p50": _quantile(context_ms, 0.5),
            "context_ms_p95": _quantile(context_ms, 0.95),
        }
        if contexts and not any(_counts_summarizer(c) for c in contexts):
            row.update(summarizer_calls=None, chars_sent=None, chars_sent_per_turn=None)
        scored = [run.scores for run in self.runs if run.scores is not None]
        if scored:
            total = Scores()
            for scores in scored:
                total.merge(scores)
            summary = total.summary()
            row["pairs"] = summary["pairs"]
            for method, values in summary["methods"].items():
                row[f"recall_{method}"] = values["recall"]
            row["gap"] = summary["gap"]
            row["speaker"] = summary["methods"]["ours"]["speaker"]
            row["numbers"] = summary["methods"]["ours"]["numbers"]
        audits = [run.dates for run in self.runs if run.dates is not None]
        if audits:
            dates = DateAudit()
            for audit in audits:
                dates.merge(audit)
            row["dates_judged"] = dates.judged
            row["misdated"] = dates.misdated + dates.undated
            row["misdated_share"] = dates.share
        return row


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def probes_path(recording: Path) -> Path:
    """Where a recording's probes file lives: ``NAME.probes.jsonl`` beside ``NAME.jsonl``."""
    return recording.with_name(recording_stem(recording) + ".probes.jsonl")


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    try:
        tqdm = importlib.import_module("tqdm").tqdm
    except ImportError:  # pragma: no cover - the report extra is not installed
        return None
    return tqdm(total=total, file=sys.stderr, unit="replay", dynamic_ncols=True)


async def run_grid(
    paths: Sequence[Path],
    settings: Settings,
    points: Sequence[Point],
    *,
    out_dir: Path | None = None,
    progress: bool = True,
    summarizer: Summarizer | None = None,
) -> list[PointResult]:
    """Replay every recording at every point; write each run's files under ``out_dir`` (one
    folder per point when there are several) and score runs that have probes."""
    recordings: dict[Path, Recording] = {path: read_recording(path) for path in paths}
    scoring: dict[Path, tuple[Conversation, Any]] = {}
    for path, recording in recordings.items():
        if probes_path(path).exists():
            scoring[path] = (Conversation.from_recording(recording), read_probes(probes_path(path)))
    bar = _progress(len(points) * len(paths), progress)
    results: list[PointResult] = []
    try:
        for point in points:
            outcome = PointResult(point)
            for path in paths:
                if bar is not None:
                    bar.set_description(f"{point.label} {recording_stem(path)}"[:60])
                asked = scoring[path][1].questions() if path in scoring else ()
                result = await replay_file(
                    path,
                    settings,
                    values=dict(point.values),
                    budget_chars=point.budget,
                    summarizer=summarizer,
                    questions=asked,
                )
                if out_dir is not None:
                    write_result(result, out_dir / point.slug if len(points) > 1 else out_dir)
                scores = None
                if path in scoring:
                    conv, probes = scoring[path]
                    scores = score_contexts(result.contexts, probes, conv, result.questions)
                dates = audit_contexts(result.contexts, recordings[path])
                outcome.runs.append(Run(recording_stem(path), result, scores, dates))
                if bar is not None:
                    bar.update(1)
            results.append(outcome)
    finally:
        if bar is not None:
            bar.close()
    return results


# -- the table ---------------------------------------------------------------------------------


class Column(NamedTuple):
    """A column of the table: the row's key, its title, how a value is written, and what it
    means (the legend under the table says it, and ``docs/replay.md`` the same)."""

    key: str
    title: str
    fmt: str
    meaning: str


COLUMNS: tuple[Column, ...] = (
    Column("point", "point", "{}", "the --set and --budget values of the row (defaults: none given)"),
    Column("contexts", "contexts", "{:d}", "contexts served, all recordings together"),
    Column(
        "compactions",
        "compactions",
        "{:d}",
        "folds the sessions took (a summary applied, or clamped to its ceiling)",
    ),
    Column(
        "summarizer_calls", "calls", "{:d}", "summarizer calls, those that failed or answered too long too"
    ),
    Column(
        "chars_sent",
        "chars sent",
        "{:,d}",
        "chars sent to the summarizer: the summary before, the turns, the notes",
    ),
    Column("chars_sent_per_turn", "sent/turn", "{:.0f}", "chars sent per turn appended"),
    Column("context_chars_mean", "ctx chars", "{:.0f}", "the mean size of a context served, in chars"),
    Column(
        "summary_chars_final",
        "summary",
        "{:.0f}",
        "the summary's size at a recording's end, in chars (the mean)",
    ),
    Column("summarizer_ms_p95", "sum ms p95", "{:.2f}", "a summarizer call's wall-clock ms, 95th percentile"),
    Column("context_ms_p95", "ctx ms p95", "{:.2f}", "a context's assembly's wall-clock ms, 95th percentile"),
    Column(
        "recall_ours",
        "ours",
        "{:.3f}",
        "recall: how much of the probes' answers our contexts hold (0 to 1)",
    ),
    Column("recall_tail", "tail", "{:.3f}", "the same for the tail: the newest lines that fit the budget"),
    Column(
        "recall_head_tail",
        "head+tail",
        "{:.3f}",
        "the same for the oldest lines to half the budget, then the newest",
    ),
    Column("recall_full", "ceiling", "{:.3f}", "the same for every line, no budget"),
    Column("gap", "gap", "{:.2f}", "the gap recovered: (ours - tail) / (ceiling - tail)"),
    Column(
        "misdated_share",
        "misdated",
        "{:.1%}",
        "the share of summary sentences shown under the wrong date or none",
    ),
)
"""The table's columns; those of the recall (``ours`` to ``gap``) when some row was scored
against probes, ``misdated`` when some summary was audited. A ``-`` is a value not known (a
live server does not say what its summarizer was sent)."""


def table_cells(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Headers and formatted cells; score columns appear only when some row was scored."""
    columns = _shown(rows)
    cells = [
        [c.fmt.format(row[c.key]) if row.get(c.key) is not None else "-" for c in columns] for row in rows
    ]
    return [c.title for c in columns], cells


def _shown(rows: Sequence[Mapping[str, Any]]) -> list[Column]:
    return [c for c in COLUMNS if any(c.key in row for row in rows)]


def legend(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What each column the table of ``rows`` shows means, a line each (``sum ms p95  a
    summarizer call's ...``): printed under the table."""
    columns = _shown(rows)
    width = max((len(c.title) for c in columns), default=0)
    return [f"{c.title.ljust(width)}  {c.meaning}" for c in columns]


def print_table(rows: Sequence[Mapping[str, Any]], file: TextIO | None = None) -> None:
    """The table on the terminal: with rich when it is installed, plain text otherwise."""
    headers, cells = table_cells(rows)
    out = file or sys.stdout
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - the report extra is not installed
        widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
        print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)), file=out)
        for r in cells:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)), file=out)
    else:
        table = Table(show_lines=False)
        for i, header in enumerate(headers):
            table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
        for r in cells:
            table.add_row(*r)
        width = sum(max(len(h), *(len(r[i]) for r in cells)) + 3 for i, h in enumerate(headers)) + 1
        Console(file=out, width=width).print(table)
    print("", *legend(rows), sep="\n", file=out)


# -- the report --------------------------------------------------------------------------------


def write_report(results: Sequence[PointResult], out_dir: Path, fmt: str = "html") -> Path | None:
    """Draw the plots into ``out_dir`` (and an ``index.html`` for ``fmt="html"``).

    Returns the index (or the folder, for PNGs alone), or ``None`` when matplotlib
    is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - the report extra is not installed
        return None
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [r.row() for r in results]
    names = sorted({run.recording for r in results for run in r.runs})[:MAX_PLOTTED_RECORDINGS]
    figures = _session_plots(plt, results, names, out_dir)
    figures.append(_latency_plot(plt, results, out_dir))
    if any("recall_ours" in row for row in rows):
        figures.append(_recall_plot(plt, results, rows, out_dir))
    (out_dir / "sweep.json").write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    if fmt != "html":
        return out_dir
    index = out_dir / "index.html"
    index.write_text(_index_html(results, rows, names, figures), encoding="utf-8")
    return index


_Draw = Callable[[Any, Run, str], None]


def _session_plots(
    plt: Any, results: Sequence[PointResult], names: Sequence[str], out_dir: Path
) -> list[tuple[str, str]]:
    """The plots over the session, one panel per recording; returns their (file, title)."""
    plots: list[tuple[str, str, str, _Draw]] = [
        ("context_chars.png", "Context size over the session (chars)", "chars", _context_size),
        (
            "summary_chars.png",
            "Summary size; dots mark compactions as they landed",
            "summary chars",
            _summary_size,
        ),
        ("cursor.png", "Cursor: turns folded into the summary", "cursor", _cursor),
    ]
    if any(_counts_summarizer(c) for r in results for run in r.runs for c in run.result.contexts):
        plots.append(
            (
                "summarizer.png",
                "Characters sent to the summarizer per turn so far; calls (dotted)",
                "chars/turn",
                _sent,
            )
        )
    for filename, title, ylabel, draw in plots:
        _per_recording(plt, results, names, out_dir / filename, title, ylabel, draw)
    return [(filename, title) for filename, title, _, _ in plots]


def _per_recording(
    plt: Any,
    results: Sequence[PointResult],
    names: Sequence[str],
    path: Path,
    title: str,
    ylabel: str,
    draw: _Draw,
) -> None:
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.6 * len(names) + 0.6), squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        for result in results:
            for run in result.runs:
                if run.recording == name:
                    draw(ax, run, result.point.label)
        ax.set_title(name, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("turn index", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="upper right", fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.82 if handles else 1, 0.97))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _context_size(ax: Any, run: Run, label: str) -> None:
    xs = [c["turn_index"] for c in run.result.contexts]
    ax.plot(xs, [c["response"]["chars"] for c in run.result.contexts], label=label, linewidth=1)


def _summary_size(ax: Any, run: Run, label: str) -> None:
    xs = [c["turn_index"] for c in run.result.contexts]
    (line,) = ax.plot(xs, [c["state"]["summary_chars"] for c in run.result.contexts], label=label, lw=1)
    landed = [c for c in run.result.compactions if c["outcome"] in ("applied", "clamped")]
    ax.scatter(
        [c["turn_index"] for c in landed],
        [c["summary_chars"] for c in landed],
        s=6,
        color=line.get_color(),
    )


def _cursor(ax: Any, run: Run, label: str) -> None:
    xs = [c["turn_index"] for c in run.result.contexts]
    ax.step(xs, [c["state"]["cursor"] for c in run.result.contexts], where="post", label=label, lw=1)


def _sent(ax: Any, run: Run, label: str) -> None:
    counted = [c for c in run.result.contexts if _counts_summarizer(c)]  # not a live server's
    if not counted:
        return
    xs = [c["turn_index"] for c in counted]
    ys = [c["state"]["chars_sent"] / max(1, c["turn_index"] + 1) for c in counted]
    (line,) = ax.plot(xs, ys, label=label, lw=1)
    calls = [c["state"]["summarizer_calls"] for c in counted]
    twin = getattr(ax, "_calls_axis", None) or ax.twinx()
    ax._calls_axis = twin
    twin.plot(xs, calls, linestyle=":", lw=1, color=line.get_color())
    twin.set_ylabel("calls (dotted)", fontsize=7)
    twin.tick_params(labelsize=7)


def _latency_plot(plt: Any, results: Sequence[PointResult], out_dir: Path) -> tuple[str, str]:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5))
    labels = [r.point.label for r in results]
    for ax, key, title in (
        (axes[0], "summarizer_ms", "Summarizer call (ms, wall clock)"),
        (axes[1], "context_ms", "Context assembly (ms, wall clock)"),
    ):
        data = [[ms for run in r.runs for ms in getattr(run.result, key)] or [0.0] for r in results]
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=6, rotation=30, ha="right")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
    return _saved(plt, fig, out_dir, "latency.png", "Latencies")


def _recall_plot(
    plt: Any, results: Sequence[PointResult], rows: Sequence[Mapping[str, Any]], out_dir: Path
) -> tuple[str, str]:
    methods = [("recall_ours", "ours"), ("recall_tail", "tail"), ("recall_head_tail", "head+tail")]
    methods.append(("recall_full", "ceiling (no budget)"))
    fig, ax = plt.subplots(figsize=(10, 3 + 0.2 * len(rows)))
    height = 0.8 / len(methods)
    for k, (key, name) in enumerate(methods):
        ax.barh(
            [i + k * height for i in range(len(rows))],
            [row.get(key) or 0.0 for row in rows],
            height=height,
            label=name,
        )
    labels = [r.point.label for r in results]
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(rows))], labels, fontsize=7)
    ax.set_xlabel("rarity-weighted recall of answers whose evidence left the verbatim window", fontsize=8)
    ax.legend(fontsize=7)
    return _saved(plt, fig, out_dir, "recall.png", "Recall beside the baselines, at the same budget")


def _saved(plt: Any, fig: Any, out_dir: Path, filename: str, title: str) -> tuple[str, str]:
    """Lay ``fig`` out, write it as ``filename`` and close it; returns its (file, title)."""
    fig.tight_layout()
    fig.savefig(out_dir / filename, dpi=90)
    plt.close(fig)
    return filename, title


def _index_html(
    results: Sequence[PointResult],
    rows: Sequence[dict[str, Any]],
    names: Sequence[str],
    figures: Sequence[tuple[str, str]],
) -> str:
    headers, cells = table_cells(rows)
    recordings = len({run.recording for r in results for run in r.runs})
    parts = [
        "<!doctype html><meta charset='utf-8'><title>voice-context sweep</title>",
        "<style>body{font:14px sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}td:first-child{text-align:left}"
        "img{max-width:100%;display:block;margin:1em 0}"
        "dl{display:grid;grid-template-columns:auto 1fr;gap:0 1em}dd{margin:0}</style>",
        "<h1>voice-context sweep</h1>",
        f"<p>{len(results)} point(s) &times; {recordings} "
        "recording(s). Latencies are wall clock; everything else is reproducible.</p>",
        "<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in headers) + "</tr>",
        *("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in cells),
        "</table>",
        "<dl>",
        *(f"<dt>{html.escape(c.title)}</dt><dd>{html.escape(c.meaning)}</dd>" for c in _shown(rows)),
        "</dl>",
    ]
    if len(names) < recordings:
        parts.append(f"<p>Plots show the first {len(names)} recordings.</p>")
    for filename, title in figures:
        parts.append(f"<h2>{html.escape(title)}</h2><img src='{filename}' alt='{html.escape(title)}'>")
    return "\n".join(parts) + "\n"


def _counts_summarizer(context: Mapping[str, Any]) -> bool:
    """Whether a context's state says what the summarizer was sent (a replay here does; a live
    server's ``session.state`` does not)."""
    return "chars_sent" in context["state"] and "summarizer_calls" in context["state"]


def recordings_in(paths: Iterable[str | Path]) -> list[Path]:
    """Recording files named, or found in the folders named (probes and replay outputs skipped)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                p
                for p in sorted(path.glob("*.jsonl"))
                if not p.name.endswith(
                    (".probes.jsonl", ".contexts.jsonl", ".compactions.jsonl", ".questions.jsonl")
                )
            )
        else:
            found.append(path)
    return found


__all__ = [
    "COLUMNS",
    "Column",
    "Point",
    "PointResult",
    "Run",
    "grid",
    "legend",
    "print_table",
    "probes_path",
    "recordings_in",
    "run_grid",
    "table_cells",
    "write_report",
]
