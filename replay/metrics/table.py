"""The short summary table printed after a replay (rich)."""

from __future__ import annotations

from rich.table import Table

from replay.metrics.summary import Percentiles, Summary

__all__ = ["summary_table"]


def _p(p: Percentiles, scale: float = 1.0) -> str:
    """P50 / P90 / P99 in one unit, the row's (seconds times ``scale``)."""
    if p.p50 is None or p.p90 is None or p.p99 is None:
        return "-"
    return f"{p.p50 * scale:.3g} / {p.p90 * scale:.3g} / {p.p99 * scale:.3g}"


def _by_tier(values: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.0%}" for k, v in values.items()) or "-"


def _utilization(summary: Summary) -> str:
    line = f", line {summary.wan_busy:.0%}" if summary.wan_busy is not None else ""
    return _by_tier(summary.utilization) + line


def _cost(summary: Summary) -> str:
    split = ", ".join(f"{k} {v:.2f}" for k, v in summary.cost_split.items())
    return f"{summary.cost_per_hour:.2f}" + (f" ({split})" if split else "")


def _rejected(summary: Summary) -> str:
    if not summary.rejected:
        return "none"
    by = ", ".join(f"{k} {v}" for k, v in summary.rejected_by.items())
    return f"{summary.rejected} ({summary.rejected / summary.requests:.1%}): {by}"


# the rows a live run (`replay live`, index_mode "live") measures: what the client sees
_LIVE_ROWS = (
    "requests (completed)", "rejected (admission control)", "TTFT P50 / P90 / P99",
    "TPOT P50 / P90 / P99", "E2E P50 / P90 / P99", "largest gap P50 / P90 / P99", "SLA",
    "SLA goodput at the trace's rate", "short of", "pipelines", "wall",
)  # fmt: skip


def summary_table(summary: Summary) -> Table:
    """Key figures of one run, one row each (of a live run, only those it measured)."""
    live = summary.index_mode == "live"
    title = f"replay live: {summary.preset.removeprefix('live:')}" if live else (
        f"replay: {summary.policy} on {summary.preset}"
    )  # fmt: skip
    table = Table(title=title, show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value")
    t = summary.transfer_s
    rows = [
        ("requests (completed)", f"{summary.requests} ({summary.completed})"),
        ("rejected (admission control)", _rejected(summary)),
        ("TTFT P50 / P90 / P99 (s)", _p(summary.ttft_s)),
        ("TPOT P50 / P90 / P99 (ms)", _p(summary.tpot_s, 1000)),
        ("E2E P50 / P90 / P99 (s)", _p(summary.e2e_s)),
        ("largest gap P50 / P90 / P99 (ms)", _p(summary.max_gap_s, 1000)),
        (
            f"SLA (TTFT {summary.sla.ttft_s:g} s, TPOT {summary.sla.tpot_s * 1000:g} ms)",
            f"{summary.sla_attainment:.1%}",
        ),
        ("SLA goodput at the trace's rate (req/s)", f"{summary.sla_goodput_req_s:.3f}"),
        (
            "WAN",
            f"{summary.wan_bytes / 1e9:.1f} GB, mean {summary.wan_gbps_mean:.2f} Gbps "
            f"({summary.wan_utilization:.0%} of the line), peak {summary.wan_gbps_peak:.2f} Gbps",
        ),
        ("WAN backlog, largest (GB)", f"{summary.wan_backlog_gb_peak:.2f}"),
        ("utilization (busy time)", _utilization(summary)),
        ("KV memory used (mean)", _by_tier(summary.kv_used)),
        (
            "KV transfer P50 / P99 (s)",
            "-" if t.p50 is None or t.p99 is None else f"{t.p50:.3g} / {t.p99:.3g}",
        ),
        ("pipelines", ", ".join(f"{k} {v}" for k, v in summary.pipelines.items()) or "-"),
        ("handoffs", ", ".join(f"{k} {v}" for k, v in summary.handoffs.items()) or "-"),
        ("RLD token share", f"{summary.rld_token_share:.2%}"),
        ("RLD busy (mean requests)", f"{summary.rld_busy_mean:.2f}"),
        ("hit rate", ", ".join(f"{k} {v:.1%}" for k, v in summary.hit_rate.items())),
        ("cost (USD/h)", _cost(summary)),
        (
            "BCR at the trace's rate (req/s per 1000 USD/h)",
            f"{summary.bcr_at_trace_rate_per_1000_usd_h:.3f}",
        ),
        ("simulated / wall (s)", f"{summary.simulated_s:.0f} / {summary.wall_s:.2f}"),
    ]
    if summary.binding is not None:
        rows.insert(7, ("short of", f"{summary.binding.resource}: {summary.binding.reason}"))
    if live:
        rows[-1] = ("wall (s)", f"{summary.wall_s:.2f}")
        rows = [row for row in rows if row[0].startswith(_LIVE_ROWS)]
    for name, value in rows:
        table.add_row(name, value)
    return table
