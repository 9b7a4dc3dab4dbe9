"""One replay's load over time and its cost split, as the report shows them.

Both come from ``summary.json`` as written (``timeline``, ``utilization``, ``kv_used``,
``wan_utilization``, ``wan_backlog_gb_peak``, ``cost_split``), in the words and units of
``replay run``'s table: utilization and KV memory used in percent, the backlog in GB,
cost in USD/h.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from replay.metrics.summary import Summary
from replay.report.plots_time import timeline_figure

__all__ = ["COST_PARTS", "cost_rows", "load_context"]

FloatArray = npt.NDArray[np.float64]

COST_PARTS = {
    "p": "P tier's GPUs (prefill)",
    "rld": "RLD tier's GPUs (relay decode)",
    "md": "MD tier's GPUs (main decode)",
    "wan": "the WAN line",
}
"""What each key of ``cost_split`` prices."""


def _by_tier(values: dict[str, float]) -> str:
    """``p 68%, rld 30%, md 3%``, as ``replay run`` prints it."""
    return ", ".join(f"{k} {v:.0%}" for k, v in values.items()) or "-"


def cost_rows(summary: Summary) -> list[dict[str, str]]:
    """One row per part of ``cost_split`` (USD/h, share of ``cost_per_hour``), then the total."""
    total = summary.cost_per_hour
    rows = [
        {
            "part": key,
            "what": COST_PARTS.get(key, key),
            "usd_h": f"{value:.2f}",
            "share": f"{value / total:.1%}" if total > 0 else "-",
        }
        for key, value in summary.cost_split.items()
    ]
    if rows:
        rows.append({"part": "cost", "what": "total", "usd_h": f"{total:.2f}", "share": "100.0%"})
    return rows


def _line_gbps(summary: Summary, capacity_gbps: float | None) -> float | None:
    """The line's bandwidth: the preset's, else what summary.json's ratio implies."""
    if capacity_gbps:
        return capacity_gbps
    if summary.wan_utilization > 0:
        return summary.wan_gbps_mean / summary.wan_utilization
    return None


def load_context(summary: Summary, capacity_gbps: float | None) -> dict[str, Any] | None:
    """The timeline figure and the run's means for the template (None without a timeline).
    ``capacity_gbps`` is the line's bandwidth when known (``ClusterFacts.wan_gbps``)."""
    timeline = summary.timeline
    if timeline is None or not timeline.t_s:
        return None
    starts = np.asarray(timeline.t_s, dtype=np.float64)
    edges = np.append(starts, starts[-1] + timeline.window_s)

    def arrays(values: dict[str, list[float]]) -> dict[str, FloatArray]:
        return {k: np.asarray(v, dtype=np.float64) for k, v in values.items() if v}

    gbps = _line_gbps(summary, capacity_gbps)
    has_line = gbps is not None and "wan" in summary.cost_split and bool(timeline.wan_gbps)
    wan = np.asarray(timeline.wan_gbps, dtype=np.float64) / gbps if has_line and gbps else None
    backlog = np.asarray(timeline.wan_backlog_gb, dtype=np.float64) if has_line else None
    figure = timeline_figure(
        edges, arrays(timeline.utilization), arrays(timeline.kv_used), wan, backlog
    )
    means = [
        ("utilization (busy time)", _by_tier(summary.utilization)),
        ("KV memory used (mean)", _by_tier(summary.kv_used)),
    ]
    if has_line and gbps:
        means += [
            (
                "WAN",
                f"mean {summary.wan_gbps_mean:.2f} Gbps ({summary.wan_utilization:.0%} of "
                f"the {gbps:g} Gbps line)",
            ),
            ("WAN backlog, largest", f"{summary.wan_backlog_gb_peak:.2f} GB"),
        ]
    return {
        "figure": figure,
        "window_s": timeline.window_s,
        "windows": len(timeline.t_s),
        "means": means,
    }
