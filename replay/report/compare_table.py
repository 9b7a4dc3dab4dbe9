"""The comparison and the sweep as rich tables for the terminal."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from replay.experiments.compare import CompareResult, MetricRow
from replay.report.format import fmt_ci, fmt_diff, fmt_number, fmt_relative, scale_for
from replay.report.page import HEADLINE, metric_group

__all__ = ["compare_table"]

_STYLE = {"good": "bold green", "bad": "bold red", "sig": "bold blue", "ns": "dim", "na": "dim"}


def _mark(row: MetricRow, j: int) -> str:
    d = row.differences[j]
    if d.ci is None or d.difference is None:
        return "na"
    if not d.ci.excludes_zero:
        return "ns"
    if row.spec.better is None:
        return "sig"
    improved = d.difference < 0 if row.spec.better == "lower" else d.difference > 0
    return "good" if improved else "bad"


def compare_table(result: CompareResult, *, all_metrics: bool = False) -> Table:
    """Values per policy and differences from the baseline with their 95% intervals;
    ``*`` marks an interval that excludes zero (green better, red worse)."""
    labels = result.labels
    title = f"replay compare on {result.results[0].summary.preset}: vs {labels[0]}"
    table = Table(title=title, caption="* 95% interval excludes 0 (green: better, red: worse)")
    table.add_column("metric", style="bold")
    for i, label in enumerate(labels):
        table.add_column(label, justify="right")
        if i:
            table.add_column(f"Δ {label} [95% CI]", justify="right")
    group = ""
    for row in result.rows:
        if not all_metrics and row.spec.key not in HEADLINE:
            continue
        if all_metrics and metric_group(row.spec.key) != group:
            if group:
                table.add_section()
            group = metric_group(row.spec.key)
        scale = scale_for(row.spec.unit, row.values)
        name = f"{row.spec.label} ({scale.unit})" if scale.unit else row.spec.label
        cells: list[str | Text] = [name]
        for i, value in enumerate(row.values):
            cells.append(fmt_number(value, scale))
            if i:
                d = row.differences[i - 1]
                mark = _mark(row, i - 1)
                star = "*" if mark in ("good", "bad", "sig") else " "
                text = fmt_diff(d.difference, scale, unit=scale.unit == "%")
                rel = fmt_relative(d.relative)
                ci = fmt_ci(d.ci, scale)
                body = f"{text}{star} {rel}".rstrip() + (f"\n{ci}" if ci else "")
                cells.append(Text(body, style=_STYLE[mark]))
        table.add_row(*cells)
    return table
