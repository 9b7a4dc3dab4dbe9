"""The metrics of ``summary.json`` as bootstrap statistics, for paired policy comparisons.

Every compared metric is a row: its value in each policy's ``summary.json`` and, for
each policy after the first, the difference from the first with a 95% interval.

- Latencies and per-request figures (``method: "requests"``): TTFT, TPOT, E2E, the
  largest gap and the KV transfer (P50 / P90 / P99 / mean), SLA attainment, RLD token
  share, realized hit rates, pipeline and handoff counts. Units are requests, paired
  by request id: a resample draws request ids, and both policies' statistics are taken
  over the same draw.
- Rates (``method: "windows"``): SLA goodput, throughput, WAN bytes and mean Gbps, and BCR,
  all at the trace's rate.
  Units are fixed windows of arrival time; a request's SLA outcome and WAN bytes count
  in the window of its arrival, and a resample's rate is its windows' total over the
  run's duration (as in ``summary.json``), so the identity resample gives the summary's
  figure exactly.
- Figures with no sampling meaning (``method: null``): peak WAN Gbps (a maximum),
  cost per hour (a constant of the preset), simulated seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from replay.experiments.bootstrap import Statistic, identity, mean, percentile, ratio, total
from replay.metrics.record import RequestRecord
from replay.metrics.summary import Summary

__all__ = [
    "MetricSpec",
    "PolicyData",
    "metric_specs",
    "point_values",
    "policy_data",
    "window_of",
]

FloatArray = npt.NDArray[np.float64]
Better = Literal["lower", "higher"]
Method = Literal["requests", "windows"]


@dataclass(frozen=True, slots=True)
class PolicyData:
    """One policy's per-request arrays (in the common request order) and window totals."""

    summary: Summary
    values: dict[str, FloatArray]  # per request; NaN where the record has None
    windows: dict[str, FloatArray]  # per window totals


def window_of(arrival_s: FloatArray, window_s: float) -> npt.NDArray[np.int64]:
    """The index of each arrival's window, counted from the first arrival."""
    start = float(arrival_s.min()) if arrival_s.size else 0.0
    return np.floor((arrival_s - start) / window_s).astype(np.int64)


def _array(values: Sequence[float | None]) -> FloatArray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def policy_data(
    summary: Summary, records: Sequence[RequestRecord], windows: npt.NDArray[np.int64]
) -> PolicyData:
    """Arrays of ``records`` (already in the common order) and their totals per window."""
    sla = summary.sla
    ttft = _array([r.ttft_s for r in records])
    tpot = _array([r.tpot_s for r in records])
    e2e = _array([r.e2e_s for r in records])
    done = np.isfinite(e2e)
    with np.errstate(invalid="ignore"):
        met = done & (ttft <= sla.ttft_s) & (~np.isfinite(tpot) | (tpot <= sla.tpot_s))
    length = _array([r.input_length for r in records])
    values: dict[str, FloatArray] = {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "max_gap_s": _array([r.max_gap_s for r in records]),
        "transfer_s": _array([r.transfer_s for r in records]),
        "met": met.astype(np.float64),
        "done": done.astype(np.float64),
        "one": np.ones(len(records), dtype=np.float64),
        "tokens_rld": _array([r.tokens_rld for r in records]),
        "tokens_out": _array([r.tokens_rld + r.tokens_md for r in records]),
        "reactive": _array([float(r.reactive) for r in records]),
        "wan_bytes": _array([r.wan_bytes for r in records]),
        "rld_busy_s": _array([r.rld_busy_s or 0.0 for r in records]),
    }
    for tier, hits in (
        ("p", [r.hit_p for r in records]),
        ("rld", [r.hit_rld for r in records]),
        ("md", [r.hit_md for r in records]),
    ):
        rate = _array(hits)
        used = np.isfinite(rate)
        values[f"hit_num.{tier}"] = np.where(used, rate * length, 0.0)
        values[f"hit_den.{tier}"] = np.where(used, length, 0.0)
    for name in {r.pipeline for r in records} | set(summary.pipelines):
        values[f"pipelines.{name}"] = _array([float(r.pipeline == name) for r in records])
    for name in {r.handoff for r in records if r.handoff} | set(summary.handoffs):
        values[f"handoffs.{name}"] = _array([float(r.handoff == name) for r in records])
    count = int(windows.max()) + 1 if windows.size else 0
    totals = {
        key: np.bincount(windows, weights=values[key], minlength=count).astype(np.float64)
        for key in ("met", "done", "wan_bytes")
    }
    return PolicyData(summary, values, totals)


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One row of the comparison: how to read it from a summary and to bootstrap it."""

    key: str
    label: str
    unit: str
    better: Better | None
    method: Method | None
    value: Callable[[Summary], float | None]
    stat: Callable[[PolicyData], Statistic] | None = None


def _pct(field: str, label: str, unit: str, stats: Sequence[str]) -> list[MetricSpec]:
    out = []
    for name in stats:
        q = {"p50": 50.0, "p90": 90.0, "p99": 99.0}.get(name)

        def value(s: Summary, f: str = field, n: str = name) -> float | None:
            got: float | None = getattr(getattr(s, f), n)
            return got

        def stat(d: PolicyData, f: str = field, q: float | None = q) -> Statistic:
            return mean(d.values[f]) if q is None else percentile(d.values[f], q)

        title = f"{label} {'mean' if q is None else name.upper()}"
        out.append(MetricSpec(f"{field}.{name}", title, unit, "lower", "requests", value, stat))
    return out


def _hit(tier: str) -> Callable[[PolicyData], Statistic]:
    return lambda d: ratio(d.values[f"hit_num.{tier}"], d.values[f"hit_den.{tier}"])


def _hit_value(tier: str) -> Callable[[Summary], float | None]:
    return lambda s: s.hit_rate.get(tier)


def _counts(kind: str, names: Sequence[str]) -> list[MetricSpec]:
    out = []
    for name in names:

        def value(s: Summary, n: str = name) -> float | None:
            return float(getattr(s, kind).get(n, 0))

        def stat(d: PolicyData, key: str = f"{kind}.{name}") -> Statistic:
            return total(d.values.get(key, d.values["one"] * 0.0))

        out.append(
            MetricSpec(
                f"{kind}.{name}",
                f"{name} {'requests' if kind == 'pipelines' else 'handoffs'}",
                "",
                None,
                "requests",
                value,
                stat,
            )
        )
    return out


def _rate(window_key: str, scale: Callable[[Summary], float]) -> Callable[[PolicyData], Statistic]:
    return lambda d: total(d.windows[window_key], scale(d.summary))


def _per(value: float) -> float:
    return 1.0 / value if value > 0 else 0.0


def metric_specs(summaries: Sequence[Summary]) -> list[MetricSpec]:
    """The compared metrics, in report order (pipelines and handoffs seen in any run)."""
    pipelines = sorted({k for s in summaries for k in s.pipelines})
    handoffs = sorted({k for s in summaries for k in s.handoffs})
    tiers = [t for t in ("p", "rld", "md") if any(t in s.hit_rate for s in summaries)]
    four = ("p50", "p90", "p99", "mean")
    specs = [
        *_pct("ttft_s", "TTFT", "s", four),
        *_pct("tpot_s", "TPOT", "s", four),
        *_pct("e2e_s", "E2E", "s", four),
        *_pct("max_gap_s", "largest gap", "s", four),
        MetricSpec(
            "sla_attainment", "SLA met", "share", "higher", "requests",
            lambda s: s.sla_attainment, lambda d: ratio(d.values["met"], d.values["one"]),
        ),
        MetricSpec(
            "sla_goodput_req_s", "SLA goodput at the trace's rate", "req/s", "higher", "windows",
            lambda s: s.sla_goodput_req_s, _rate("met", lambda s: _per(s.trace_duration_s)),
        ),
        MetricSpec(
            "throughput_rps", "throughput", "req/s", "higher", "windows",
            lambda s: s.throughput_rps, _rate("done", lambda s: _per(s.trace_duration_s)),
        ),
        MetricSpec(
            "completed", "completed requests", "", "higher", "requests",
            lambda s: float(s.completed), lambda d: total(d.values["done"]),
        ),
        MetricSpec(
            "bcr_at_trace_rate_per_1000_usd_h", "BCR at the trace's rate",
            "req/s per 1000 USD/h", "higher", "windows",
            lambda s: s.bcr_at_trace_rate_per_1000_usd_h,
            _rate("met", lambda s: _per(s.trace_duration_s) * _per(s.cost_per_hour) * 1000),
        ),
        MetricSpec(
            "wan_bytes", "WAN bytes", "B", "lower", "windows",
            lambda s: s.wan_bytes, _rate("wan_bytes", lambda s: 1.0),
        ),
        MetricSpec(
            "wan_gbps_mean", "WAN mean", "Gbps", "lower", "windows",
            lambda s: s.wan_gbps_mean, _rate("wan_bytes", lambda s: 8e-9 * _per(s.simulated_s)),
        ),
        MetricSpec(
            "wan_gbps_peak", "WAN peak, 1 s", "Gbps", "lower", None, lambda s: s.wan_gbps_peak
        ),
        *_pct("transfer_s", "KV transfer", "s", ("p50", "p99", "mean")),
        MetricSpec(
            "rld_token_share", "RLD token share", "share", None, "requests",
            lambda s: s.rld_token_share,
            lambda d: ratio(d.values["tokens_rld"], d.values["tokens_out"]),
        ),
        MetricSpec(
            "rld_busy_mean", "RLD busy", "mean requests", None, "requests",
            lambda s: s.rld_busy_mean,
            lambda d: total(d.values["rld_busy_s"], _per(d.summary.simulated_s)),
        ),
        *_counts("pipelines", pipelines),
        *_counts("handoffs", handoffs),
        MetricSpec(
            "reactive_p_rld", "reactive P-RLD requests", "", None, "requests",
            lambda s: float(s.reactive_p_rld), lambda d: total(d.values["reactive"]),
        ),
    ]  # fmt: skip
    for tier in tiers:
        specs.append(
            MetricSpec(
                f"hit_rate.{tier}", f"token hit rate {tier.upper()}", "share", "higher",
                "requests", _hit_value(tier), _hit(tier),
            )
        )  # fmt: skip
    specs += [
        MetricSpec("cost_per_hour", "cost", "USD/h", "lower", None, lambda s: s.cost_per_hour),
        MetricSpec("simulated_s", "simulated time", "s", None, None, lambda s: s.simulated_s),
    ]  # fmt: skip
    return specs


def point_values(spec: MetricSpec, data: PolicyData) -> float | None:
    """The metric recomputed from the arrays on the identity resample (checks and tests)."""
    if spec.stat is None:
        return None
    units = len(data.values["one"]) if spec.method == "requests" else len(data.windows["met"])
    value = float(spec.stat(data)(identity(units))[0])
    return value if np.isfinite(value) else None
