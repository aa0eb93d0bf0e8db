"""A sweep: a 2x2 grid over a fixture gives one table row per point, with a legend under it, and a
report with plots."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from helpers import ROOT

from voice_context.cli import main
from voice_context.tuning.sweep import COLUMNS, Point, grid, legend, print_table, table_cells

FIXTURE = ROOT / "fixtures" / "raid-night.jsonl"


def test_values_per_key_make_a_grid_with_budgets_varying_fastest() -> None:
    points = grid({"session.recent_window": ["20", "50"]}, [3000, 5200])
    assert [p.label for p in points] == [
        "recent_window=20 budget=3000",
        "recent_window=20 budget=5200",
        "recent_window=50 budget=3000",
        "recent_window=50 budget=5200",
    ]
    assert points[0].slug == "recent_window-20_budget-3000"
    assert grid({}) == [Point()]
    assert Point().label == "defaults"


def test_a_two_by_two_sweep_prints_a_table_and_writes_a_report(tmp_path: Path, capsys: Any) -> None:
    out = tmp_path / "sweep"
    code = main(
        [
            "replay",
            str(FIXTURE),
            "--set",
            "recent_window=10,50",
            "--set",
            "max_summary_chars=800,3000",
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    for label in (
        "recent_window=10 max_summary_chars=800",
        "recent_window=10 max_summary_chars=3000",
        "recent_window=50 max_summary_chars=800",
        "recent_window=50 max_summary_chars=3000",
    ):
        assert label in printed
    assert "ceiling" in printed  # the fixture has probes beside it: the points are scored

    slugs = sorted(p.name for p in out.iterdir() if p.name != "report")
    assert slugs == [
        "recent_window-10_max_summary_chars-3000",
        "recent_window-10_max_summary_chars-800",
        "recent_window-50_max_summary_chars-3000",
        "recent_window-50_max_summary_chars-800",
    ]
    for slug in slugs:
        assert (out / slug / "raid-night.contexts.jsonl").stat().st_size > 0

    report = out / "report"
    for png in (
        "context_chars.png",
        "summary_chars.png",
        "cursor.png",
        "summarizer.png",
        "latency.png",
        "recall.png",
    ):
        assert (report / png).read_bytes().startswith(b"\x89PNG"), png
    index = (report / "index.html").read_text(encoding="utf-8")
    assert "<img src='context_chars.png'" in index and "recent_window=10 max_summary_chars=800" in index

    rows = json.loads((report / "sweep.json").read_text(encoding="utf-8"))
    assert len(rows) == 4
    by_point = {row["point"]: row for row in rows}
    # a recent window shorter than the one the fill trigger keeps folds more turns into the summary
    assert (
        by_point["recent_window=10 max_summary_chars=800"]["compactions"]
        > by_point["recent_window=50 max_summary_chars=800"]["compactions"]
    )
    assert all(row["summary_chars_final"] <= 800 for p, row in by_point.items() if p.endswith("=800"))
    headers, cells = table_cells(rows)
    assert headers[:3] == ["point", "contexts", "compactions"] and len(cells) == 4
    # and every point's summaries are audited for their dates
    assert headers[-1] == "misdated" and "misdated" in printed
    assert all(row["dates_judged"] > 0 and row["misdated_share"] is not None for row in rows)


def test_under_the_table_a_legend_says_what_each_column_it_prints_means(capsys: Any) -> None:
    assert main(["replay", str(FIXTURE), "--no-progress"]) == 0  # the fixture has probes: every column
    printed = capsys.readouterr().out.splitlines()
    header = next(line for line in printed if "┃" in line)
    columns = [cell.strip() for cell in header.strip("┃").split("┃")]
    assert len(columns) == len(COLUMNS) == 16, columns
    below = printed[printed.index(next(line for line in printed if line.startswith("└"))) + 1 :]
    explained = [line for line in below if line.strip()]
    assert [line[: len(column)] for line, column in zip(explained, columns, strict=True)] == columns
    assert all(line[len(column) :].startswith("  ") for line, column in zip(explained, columns, strict=True))
    # and docs/replay.md says the same, line for line
    doc = (FIXTURE.parent.parent / "docs" / "replay.md").read_text(encoding="utf-8")
    assert all(line in doc for line in legend([{c.key: 1 for c in COLUMNS}]))
    assert all(line in doc for line in explained)


def test_the_legend_names_only_the_columns_a_table_without_scores_shows() -> None:
    rows = [{"point": "defaults", "contexts": 3, "compactions": 1, "summarizer_calls": None}]
    headers, _ = table_cells(rows)
    out = io.StringIO()
    print_table(rows, file=out)
    named = [line.split("  ")[0] for line in out.getvalue().split("\n\n", 1)[1].splitlines() if line]
    assert named == headers == ["point", "contexts", "compactions", "calls"]
