"""The validation of the simulator against measured latencies: report.html and the
terminal table, with the same figures in both.

The page reuses the replay report's stylesheet, Jinja environment and CDF figure; its
own template is ``templates/validate.html.j2``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from markupsafe import Markup
from rich.table import Table

from replay.experiments.validate import STATISTICS, MetricValidation, ValidationResult
from replay.report.format import fmt_number, fmt_relative, scale_for
from replay.report.plots_dist import cdf_figure
from replay.report.render import environment

__all__ = ["TTFT_MEANINGS", "render_validate_report", "validate_table", "write_validate_report"]

TTFT_MEANINGS = {
    "decode": "first token the client receives, from the decode side (ttft_s)",
    "prefill": "first token from the prefill side, before the KV transfer (ttft_prefill_s)",
}
"""What TTFT means under each ``--ttft`` definition."""

_NAMES = {"mean": "mean", "p50": "P50", "p90": "P90", "p99": "P99"}
_LABELS = ("measured", "simulated")


def _title(metric: MetricValidation, ttft: str) -> str:
    prefill = metric.key == "ttft_s" and ttft == "prefill"
    return f"{metric.label} (prefill side)" if prefill else metric.label


def _rows(metric: MetricValidation) -> tuple[str, list[dict[str, str]]]:
    """The metric's display unit and one row per statistic, then MAPE and correlation."""
    values = [s.get(n) for s in (metric.measured, metric.simulated) for n in STATISTICS]
    scale = scale_for("s", values)
    rows = [
        {
            "kind": "stat",
            "name": _NAMES[name],
            "measured": fmt_number(metric.measured.get(name), scale),
            "simulated": fmt_number(metric.simulated.get(name), scale),
            "error": fmt_relative(metric.error.get(name)) or "-",
        }
        for name in STATISTICS
    ]
    mape = "-" if metric.mape is None else f"{metric.mape * 100:.1f}%"
    r = "-" if metric.correlation is None else f"{metric.correlation:.3f}"
    blank = {"measured": "", "simulated": ""}
    rows.append({"kind": "mape", "name": "per-request MAPE", **blank, "error": mape})
    rows.append({"kind": "r", "name": "correlation (Pearson r)", **blank, "error": r})
    return scale.unit, rows


def _counts(result: ValidationResult) -> list[tuple[str, str]]:
    c = result.counts
    return [
        ("requests measured", f"{c.measured:,}"),
        ("requests simulated", f"{c.simulated:,}"),
        ("joined by request_id", f"{c.joined:,}"),
        ("only measured", f"{c.only_measured:,}"),
        ("only simulated", f"{c.only_simulated:,}"),
        ("unfinished, measured", f"{c.unfinished_measured:,}"),
        ("unfinished, simulated", f"{c.unfinished_simulated:,}"),
        ("finished in both (compared)", f"{c.compared:,}"),
    ]


def _figure(metric: MetricValidation, ttft: str) -> str:
    title = _title(metric, ttft)
    ms = metric.key == "tpot_s"
    return cdf_figure(
        f"validate-{metric.key.removesuffix('_s')}",
        f"{title} distribution",
        f"{title} ({'ms' if ms else 's'})",
        [("measured", metric.measured_values), ("simulated", metric.simulated_values)],
        factor=1000.0 if ms else 1.0,
    )


def _context(result: ValidationResult, command: str | None) -> dict[str, Any]:
    metrics = []
    for metric in result.metrics:
        unit, rows = _rows(metric)
        metrics.append(
            {
                "title": _title(metric, result.ttft),
                "field": metric.field,
                "pairs": f"{metric.pairs:,}",
                "unit": unit,
                "rows": rows,
                "figure": Markup(_figure(metric, result.ttft)),
            }
        )
    return {
        "title": "Simulator validation: simulated against measured",
        "meta": [
            ("measured", result.measured),
            ("simulated", result.simulated),
            ("TTFT", f"{result.ttft}: {TTFT_MEANINGS[result.ttft]}"),
            ("compared", f"{result.counts.compared:,} of {result.counts.joined:,} joined"),
        ],
        "command": command,
        "warnings": list(result.warnings),
        "labels": _LABELS,
        "metrics": metrics,
        "counts": _counts(result),
    }


def render_validate_report(result: ValidationResult, command: str | None = None) -> str:
    """The validation as one self-contained HTML document (the replay report's look)."""
    template = environment().get_template("validate.html.j2")
    return template.render(**_context(result, command))


def write_validate_report(path: Path, result: ValidationResult, command: str | None = None) -> Path:
    """Write ``path`` (its folder is created) and return it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_validate_report(result, command), encoding="utf-8")
    return path


def validate_table(result: ValidationResult) -> Table:
    """Measured, simulated and the relative error of each statistic, per metric; MAPE and
    correlation per metric; the counts in the caption."""
    c = result.counts
    table = Table(
        title=f"replay validate: {result.simulated} against {result.measured}",
        caption=(
            f"error = (simulated - measured) / measured; {c.compared:,} of {c.joined:,} "
            f"joined requests finished in both; only measured {c.only_measured:,}, only "
            f"simulated {c.only_simulated:,}; unfinished: measured {c.unfinished_measured:,}, "
            f"simulated {c.unfinished_simulated:,}"
        ),
    )
    table.add_column("metric", style="bold")
    for name in ("measured", "simulated", "error"):
        table.add_column(name, justify="right")
    for i, metric in enumerate(result.metrics):
        if i:
            table.add_section()
        unit, rows = _rows(metric)
        title = _title(metric, result.ttft)
        for row in rows:
            stat = row["name"]
            if row["kind"] == "stat":
                label = f"{title} {stat} ({unit})"
            elif row["kind"] == "mape":
                label = f"{title} {stat} ({metric.pairs:,} requests)"
            else:
                label = f"{title} {stat}"
            table.add_row(label, row["measured"], row["simulated"], row["error"])
    return table
