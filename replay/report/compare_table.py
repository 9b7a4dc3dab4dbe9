"""The comparison as a rich table for the terminal.

Labels are the report's (``MetricSpec.label``) with the row's display unit in brackets,
as ``replay run``'s table writes them: ``SLA met (%)``, ``SLA goodput at the trace's rate
(req/s)``, ``BCR at the trace's rate (req/s per 1000 USD/h)``; the percentiles of one
quantity (TTFT P50, P90, P99) share one unit. A difference is in the row's unit
(percentage points for a share), followed by the relative change. The table reads at 80
columns: metric names never wrap, policy labels fold rather than being cut, and a
difference column is headed by ``Δ`` alone (it follows its policy's column; the baseline
is in the title).
"""

from __future__ import annotations

import textwrap

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from replay.experiments.compare import CompareResult, MetricRow
from replay.report.format import (
    Scale,
    fmt_ci,
    fmt_diff,
    fmt_number,
    fmt_relative,
    shared_scales,
)
from replay.report.page import HEADLINE, metric_group

__all__ = ["compare_table"]

_METRIC_WIDTH = 20
"""A metric name wraps (between words) past this width when the table is too wide."""
_MEASURE = Console(width=1000)
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


def _diff_cell(row: MetricRow, j: int, scale: Scale) -> Text:
    """``+7.04* +53.0%`` over ``[+6.29, +8.63]``: the difference in the row's unit (``pp``
    for a share), ``*`` when its interval excludes 0, the relative change, the interval."""
    d = row.differences[j]
    mark = _mark(row, j)
    star = "*" if mark in ("good", "bad", "sig") else " "
    # a no-break space keeps "+98 pp" whole when a narrow column wraps
    text = fmt_diff(d.difference, scale, unit=scale.unit == "%").replace(" ", "\u00a0")
    body = f"{text}{star} {fmt_relative(d.relative)}".rstrip()
    ci = fmt_ci(d.ci, scale)
    return Text(body + (f"\n{ci}" if ci else ""), style=_STYLE[mark])


def compare_table(
    result: CompareResult, *, all_metrics: bool = False, width: int | None = None
) -> Table:
    """Values per policy and differences from the baseline with their 95% intervals;
    ``*`` marks an interval that excludes zero (green better, red worse). Metric names
    wrap at ``_METRIC_WIDTH`` when the table would be wider than ``width``."""
    table = _table(result, all_metrics, None)
    if width is not None and Measurement.get(_MEASURE, _MEASURE.options, table).maximum > width:
        table = _table(result, all_metrics, _METRIC_WIDTH)
    return table


def _table(result: CompareResult, all_metrics: bool, wrap: int | None) -> Table:
    labels = result.labels
    presets = list(dict.fromkeys(result.presets))
    if result.deployments:
        title = f"replay compare of deployments ({', '.join(presets)}): Δ vs {labels[0]}"
    else:
        title = f"replay compare on {presets[0]}: Δ vs {labels[0]}"
    table = Table(
        title=title,
        caption="Δ: difference from the baseline in the row's unit (pp: percentage points), "
        "then relative (xN: N times); [95% interval]; * interval excludes 0 (green: better, "
        "red: worse)",
    )
    # wrapped here, between words: rich would shrink the column below its words
    table.add_column("metric", style="bold", no_wrap=True)
    for i, label in enumerate(labels):
        table.add_column(label, justify="right", overflow="fold")
        if i:
            table.add_column("Δ [95% CI]", justify="right", overflow="fold")
    group = ""
    scales = shared_scales([(r.spec.key, r.spec.unit, r.values) for r in result.rows])
    for row in result.rows:
        if not all_metrics and row.spec.key not in HEADLINE:
            continue
        if all_metrics and metric_group(row.spec.key) != group:
            if group:
                table.add_section()
            group = metric_group(row.spec.key)
        scale = scales[row.spec.key]
        name = f"{row.spec.label} ({scale.unit})" if scale.unit else row.spec.label
        cells: list[str | Text] = [textwrap.fill(name, wrap) if wrap else name]
        for i, value in enumerate(row.values):
            cells.append(fmt_number(value, scale))
            if i:
                cells.append(_diff_cell(row, i - 1, scale))
        table.add_row(*cells)
    return table
