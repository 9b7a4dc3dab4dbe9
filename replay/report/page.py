"""The report's content: headline cards, the metric table, and the figures' sections."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from replay.experiments.bathtub import Bathtub, bathtub
from replay.experiments.bootstrap import Interval
from replay.experiments.compare_stats import MetricSpec, metric_specs
from replay.metrics.hit_buckets import BUCKET_LABELS, bucket_index, rates_of
from replay.report import series
from replay.report.format import (
    Scale,
    fmt_ci,
    fmt_diff,
    fmt_number,
    fmt_relative,
    fmt_value,
    scale_for,
    shared_scales,
)
from replay.report.load_cost import cost_rows, load_context
from replay.report.model import Report, ReportRun
from replay.report.plots_dist import bathtub_figure, cdf_figure, sweep_figure
from replay.report.plots_time import hit_buckets_figure, load_figure, mix_figure

__all__ = ["HEADLINE", "metric_group", "page_context", "table_rows"]

FloatArray = npt.NDArray[np.float64]

_GROUPS = (
    ("Latency", ("ttft_s", "tpot_s", "e2e_s", "max_gap_s")),
    (
        "SLA and throughput",
        (
            "sla_attainment",
            "sla_goodput_req_s",
            "throughput_rps",
            "completed",
            "bcr_at_trace_rate_per_1000_usd_h",
        ),
    ),
    ("WAN and KV transfer", ("wan_bytes", "wan_gbps_mean", "wan_gbps_peak", "transfer_s")),
    (
        "Routing",
        ("rld_token_share", "rld_busy_mean", "pipelines", "handoffs", "reactive_p_rld", "hit_rate"),
    ),
    ("Cost and run", ("cost_per_hour", "simulated_s")),
)


HEADLINE = (
    "ttft_s.p50",
    "ttft_s.p90",
    "ttft_s.p99",
    "tpot_s.p50",
    "tpot_s.p99",
    "max_gap_s.p99",
    "sla_attainment",
    "sla_goodput_req_s",
    "bcr_at_trace_rate_per_1000_usd_h",
    "wan_gbps_mean",
    "transfer_s.p99",
    "rld_token_share",
)
"""The metrics of the report's first table (all of them follow further down)."""


def metric_group(key: str) -> str:
    """The table section a metric key belongs to."""
    head = key.split(".")[0]
    return next((name for name, keys in _GROUPS if head in keys), "Other")


def _mark(spec: MetricSpec, diff: float | None, ci: Interval | None) -> str:
    if ci is None or diff is None:
        return "na"
    if not ci.excludes_zero:
        return "ns"
    if spec.better is None:
        return "sig"
    improved = diff < 0 if spec.better == "lower" else diff > 0
    return "good" if improved else "bad"


def table_rows(report: Report) -> list[dict[str, Any]]:
    """One dict per metric: label, formatted values and differences, its group."""
    rows: list[dict[str, Any]] = []
    if report.compare is not None:
        scales = shared_scales([(r.spec.key, r.spec.unit, r.values) for r in report.compare.rows])
        for row in report.compare.rows:
            scale = scales[row.spec.key]
            diffs = [
                {
                    "text": fmt_diff(d.difference, scale, unit=scale.unit == "%"),
                    "relative": fmt_relative(d.relative),
                    "ci": fmt_ci(d.ci, scale),
                    "mark": _mark(row.spec, d.difference, d.ci),
                }
                for d in row.differences
            ]
            rows.append(_row(row.spec, scale, [fmt_number(v, scale) for v in row.values], diffs))
        return rows
    summaries = [run.summary for run in report.runs]
    specs = metric_specs(summaries)
    values_of = {spec.key: [spec.value(s) for s in summaries] for spec in specs}
    scales = shared_scales([(spec.key, spec.unit, values_of[spec.key]) for spec in specs])
    for spec in specs:
        values = values_of[spec.key]
        scale = scales[spec.key]
        rows.append(_row(spec, scale, [fmt_number(v, scale) for v in values], []))
    return rows


def _row(
    spec: MetricSpec, scale: Scale, values: list[str], diffs: list[dict[str, str]]
) -> dict[str, Any]:
    better = {"lower": "lower is better", "higher": "higher is better"}.get(spec.better or "", "")
    method = {"requests": "paired bootstrap over requests", "windows": "bootstrap over windows"}
    return {
        "group": metric_group(spec.key),
        "key": spec.key,
        "label": spec.label,
        "unit": scale.unit,
        "headline": spec.key in HEADLINE,
        "hint": "; ".join(x for x in (better, method.get(spec.method or "", "")) if x),
        "values": values,
        "diffs": diffs,
    }


def _cards(runs: Sequence[ReportRun]) -> list[dict[str, Any]]:
    out = []
    for i, run in enumerate(runs):
        s = run.summary
        sec = scale_for("s", [s.ttft_s.p99])
        items = [
            ("TTFT P50 / P99", f"{fmt_value(s.ttft_s.p50, sec)} / {fmt_value(s.ttft_s.p99, sec)}"),
            ("TPOT P50", fmt_value(s.tpot_s.p50, scale_for("s", [s.tpot_s.p50]))),
            ("SLA met", fmt_value(s.sla_attainment, scale_for("share", []))),
            ("SLA goodput at the trace's rate", f"{s.sla_goodput_req_s:.3g} req/s"),
            ("WAN mean", f"{s.wan_gbps_mean:.3g} Gbps"),
            (
                "BCR at the trace's rate",
                f"{s.bcr_at_trace_rate_per_1000_usd_h:.3g} req/s per 1000 USD/h",
            ),
        ]
        out.append({"label": run.label, "color": i, "items": items})
    return out


def _hit_rates(report: Report) -> tuple[FloatArray, str]:
    records = sorted(report.runs[0].records, key=lambda r: r.request_id)
    if report.hit_rates is not None:
        rates = rates_of([r.request_id for r in records], report.hit_rates)
        return rates, "trace hit rate, unbounded prefix cache"
    fallback = np.array([r.hit_p for r in records], dtype=np.float64)
    return fallback, f"realized P hit rate under {report.runs[0].label}: trace file not readable"


def _bathtub(report: Report, rates: FloatArray) -> Bathtub:
    if report.compare is not None and report.compare.bathtub is not None:
        return report.compare.bathtub
    ordered = [sorted(run.records, key=lambda r: r.request_id) for run in report.runs]
    met, ttft = [], []
    for run, records in zip(report.runs, ordered, strict=True):
        sla = run.summary.sla
        t = np.array([np.nan if r.ttft_s is None else r.ttft_s for r in records])
        p = np.array([np.nan if r.tpot_s is None else r.tpot_s for r in records])
        done = np.array([r.e2e_s is not None for r in records])
        with np.errstate(invalid="ignore"):
            ok = done & (t <= sla.ttft_s) & (~np.isfinite(p) | (p <= sla.tpot_s))
        met.append(ok.astype(np.float64))
        ttft.append(t)
    return bathtub([r.label for r in report.runs], rates, met, ttft, resamples=1000)


def _figures(report: Report) -> dict[str, str]:
    runs = report.runs
    first = runs[0].summary
    figs: dict[str, str] = {}
    figs["ttft"] = cdf_figure(
        "cdf-ttft", "TTFT distribution", "TTFT (s)",
        [(r.label, _values(r, "ttft_s")) for r in runs], threshold=first.sla.ttft_s,
    )  # fmt: skip
    figs["tpot"] = cdf_figure(
        "cdf-tpot", "TPOT distribution", "TPOT (ms)",
        [(r.label, _values(r, "tpot_s")) for r in runs], factor=1000.0,
        threshold=first.sla.tpot_s,
    )  # fmt: skip
    rates, source = _hit_rates(report)
    figs["bathtub"] = bathtub_figure(_bathtub(report, rates))
    origin = min(min(r.arrival_s for r in run.records) for run in runs)
    end = max(max((r.arrival_s + (r.e2e_s or 0.0)) for r in run.records) for run in runs)
    edges = series.bin_edges(end - origin)
    records = sorted(runs[0].records, key=lambda r: r.request_id)
    arrival = np.array([r.arrival_s for r in records]) - origin
    arrivals = series.bin_edges(float(arrival.max()))
    known = np.isfinite(rates)
    bucket = np.where(known, bucket_index(np.nan_to_num(rates)), -1)
    shares = series.shares_by_arrival(arrival, bucket, len(BUCKET_LABELS), arrivals)
    figs["hits"] = hit_buckets_figure(arrivals, shares, source)
    cluster = report.cluster
    wan = []
    for run in runs:
        start, stop, rate = series.wan_intervals(run.records, origin)
        gbps = series.interval_load(start, stop, rate * 8e-9, edges)
        if cluster is not None and cluster.wan_gbps is not None:
            gbps = series.cap_with_backlog(gbps, cluster.wan_gbps, edges)
        wan.append((run.label, gbps))
    figs["wan"] = load_figure(
        "wan", "WAN throughput over time", "Gbps", edges, wan,
        cluster.wan_gbps if cluster else None, "link capacity",
    )  # fmt: skip
    mixes = []
    for run in runs:
        arr = np.array([r.arrival_s for r in run.records]) - origin
        cat = np.array([series.mix_category(r) for r in run.records], dtype=np.int64)
        mix = series.shares_by_arrival(arr, cat, len(series.PIPELINE_MIX), arrivals)
        mixes.append((run.label, mix))
    figs["mix"] = mix_figure(arrivals, mixes)
    slots = cluster.rld_slots if cluster else None
    rld = []
    for run in runs:
        start, stop = series.rld_intervals(run.records, origin)
        load = series.interval_load(start, stop, np.ones_like(start), edges)
        rld.append((run.label, 100.0 * load / slots if slots else load))
    figs["rld"] = load_figure(
        "rld", "RLD occupancy over time",
        "batch slots in use (%)" if slots else "requests decoding on RLD", edges, rld,
        100.0 if slots else None, f"all {slots} slots" if slots else "",
    )  # fmt: skip
    if report.sweep is not None:
        probes = report.sweep.probes
        figs["sweep"] = sweep_figure(
            [p.arrival_rate_req_s for p in probes], [p.sla_attainment for p in probes],
            report.sweep.target, report.sweep.trace_timing_capacity_req_s,
        )  # fmt: skip
    return figs


def _values(run: ReportRun, field: str) -> FloatArray:
    return np.array(
        [np.nan if getattr(r, field) is None else getattr(r, field) for r in run.records],
        dtype=np.float64,
    )


def page_context(report: Report) -> dict[str, Any]:
    """Everything the template needs, as plain values and SVG strings."""
    if not report.runs:
        raise ValueError("a report needs at least one run")
    first = report.runs[0].summary
    labels = [run.label for run in report.runs]
    deployments = len({run.summary.preset for run in report.runs}) > 1
    compared = "Deployment" if deployments else "Policy"
    titles = {
        "run": f"Replay of {labels[0]}",
        "compare": f"{compared} comparison: " + " vs ".join(labels),
        "sweep": f"Capacity sweep of {labels[0]}",
    }
    presets = (
        ("presets", ", ".join(f"{run.label}: {run.summary.preset}" for run in report.runs))
        if deployments
        else ("preset", first.preset)
    )
    meta = [
        ("trace", Path(first.trace).name),
        presets,
        ("requests", f"{first.requests:,}"),
        ("seed", str(first.seed)),
        ("rate scale", f"{first.rate_scale:g}"),
        ("SLA", f"TTFT <= {first.sla.ttft_s:g} s, TPOT <= {first.sla.tpot_s * 1000:g} ms"),
    ]
    compare = report.compare
    figures = _figures(report)
    single = report.runs[0].summary if len(report.runs) == 1 else None
    capacity = report.cluster.wan_gbps if report.cluster is not None else None
    load = load_context(single, capacity) if single is not None else None
    if load is not None:
        figures["timeline"] = load.pop("figure")
    return {
        "kind": report.kind,
        "title": titles[report.kind],
        "meta": meta,
        "command": report.command,
        "warnings": [
            (run.label if len(report.runs) > 1 else "", text)
            for run in report.runs
            for text in run.summary.warnings
        ],
        "labels": labels,
        "baseline": labels[0],
        "cards": _cards(report.runs),
        "rows": table_rows(report),
        "groups": [name for name, _ in _GROUPS],
        "figures": figures,
        "load": load,
        "cost": cost_rows(single) if single is not None else [],
        "bootstrap": None
        if compare is None
        else {
            "resamples": compare.resamples,
            "window_s": compare.window_s,
            "windows": compare.windows,
        },
        "sweep": None if report.sweep is None else report.sweep.to_json(),
        "rld_slots": report.cluster.rld_slots if report.cluster is not None else None,
    }
