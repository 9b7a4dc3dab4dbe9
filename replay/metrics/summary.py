"""The run's summary: latency percentiles, SLA goodput, WAN use, cost and BCR (numpy)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field

from replay.metrics.bcr import bcr_per_1000_usd_h
from replay.metrics.binding import Binding, find_binding
from replay.metrics.columns import (
    equals,
    float_values,
    is_none,
    sequential_sum,
    string_counts,
)
from replay.metrics.record import RequestRecord
from replay.metrics.summary_inputs import (
    ClientTiming,
    ClusterFacts,
    Observed,
    Percentiles,
    RunSetup,
    SlaThresholds,
)
from replay.metrics.timeline import MAX_WINDOWS, TimelineSummary, busy_shares, timeline_summary

__all__ = [
    "MAX_WINDOWS",
    "ClientTiming",
    "ClusterFacts",
    "Observed",
    "Percentiles",
    "RunSetup",
    "SlaThresholds",
    "Summary",
    "TimelineSummary",
    "TransferStats",
    "client_timing",
    "summarize",
    "timeline_summary",
    "wan_gbps",
]

FloatArray = npt.NDArray[np.float64]


class TransferStats(BaseModel):
    p50: float | None
    p99: float | None
    mean: float | None


class Summary(BaseModel):
    """summary.json: everything but ``wall_s`` is a function of the run's inputs (a live
    run's, measured, are not: its latencies and ``client``)."""

    policy: str
    preset: str
    trace: str
    requests: int
    completed: int
    seed: int
    rate_scale: float
    kv_event_delay_s: float
    sla: SlaThresholds
    ttft_s: Percentiles
    tpot_s: Percentiles
    e2e_s: Percentiles
    max_gap_s: Percentiles
    sla_attainment: float
    sla_goodput_req_s: float
    throughput_rps: float
    wan_bytes: float
    wan_gbps_mean: float
    wan_gbps_peak: float
    transfer_s: TransferStats
    rld_token_share: float
    rld_busy_mean: float = Field(
        0.0, description="Mean requests decoding on RLD: RLD busy time summed over requests, "
        "over the simulated time",
    )  # fmt: skip
    index_mode: str = "events"
    rejected: int = Field(
        0, description="Requests admission control refused at arrival (past the cluster's "
        "capacity); they count as missing the SLA",
    )  # fmt: skip
    rejected_by: dict[str, int] = Field(
        default_factory=dict, description="Rejected requests by the bottleneck that refused "
        "them: prefill, wan, rld, md",
    )  # fmt: skip
    preemptions: int = Field(
        0, description="Times a decode instance ran out of KV memory and preempted a request "
        "(freed, recomputed later); 0 with `memory.allocation: reserve-output`",
    )  # fmt: skip
    preempted_requests: int = Field(0, description="Requests preempted at least once")
    pipelines: dict[str, int]
    handoffs: dict[str, int]
    reactive_p_rld: int
    hit_rate: dict[str, float]
    cost_per_hour: float
    bcr_at_trace_rate_per_1000_usd_h: float = Field(
        description="BCR at the trace's rate: sla_goodput_req_s per 1000 USD/h of "
        "cost_per_hour (req/s per 1000 USD/h)"
    )
    trace_duration_s: float
    simulated_s: float
    wall_s: float
    cluster: dict[str, Any] = Field(
        default_factory=dict, description="The preset as resolved for the run (overrides "
        "applied, its model and hardware entries included): `--preset` loads it as a file",
    )  # fmt: skip
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="The `--set` overrides, as given"
    )
    version: str = Field("", description="pdd-router's version that ran the replay")
    kv_event_wan_delay_s: float = Field(
        0.0, description="How much later the KV events of instances outside the prefill "
        "pool's datacenter reached the index (`--kv-event-wan-delay`)",
    )  # fmt: skip
    step_costs: dict[str, str] = Field(
        default_factory=dict, description="Where each pool's step costs came from: perfdb "
        "(measured kernels), calibrated or roofline, with what was used or why the database "
        "was not",
    )  # fmt: skip
    warnings: list[str] = Field(
        default_factory=list, description="Why the run's figures may mislead (a baseline on "
        "a cluster it was not made for, a trace without prefixes, a cluster that fell behind)",
    )  # fmt: skip
    wan_utilization: float = Field(
        0.0, description="The line's mean rate over its bandwidth (fraction; 0 without a line)"
    )
    wan_backlog_gb_peak: float = Field(
        0.0, description="Most bytes waiting on the line at once (GB, sampled)"
    )
    utilization: dict[str, float] = Field(
        default_factory=dict, description="Per tier, busy time over the run's window and its "
        "instances (P prefilling, RLD and MD decoding a non-empty batch; fractions)",
    )  # fmt: skip
    instance_utilization: dict[str, float] = Field(
        default_factory=dict, description="Per instance, busy time over the run's window"
    )
    wan_busy: float | None = Field(
        None, description="Share of the run's window the line was sending (None: no line)"
    )
    ttft_missed_split_s: dict[str, float] = Field(
        default_factory=dict, description="The requests that missed the TTFT limit "
        "(requests), their mean TTFT (ttft) and where it went: prefill_queue, prefill, line "
        "(the KV copy over the line, for a first token from MD) and decode (the rest: "
        "waiting for a decode instance, its first step), split into decode_md (P-MD) and "
        "decode_rld (P-RLD, P-RLD-MD); seconds; empty when none missed it or in a live run",
    )  # fmt: skip
    binding: Binding | None = Field(
        None, description="What runs short when over 5% of requests miss the SLA or any is "
        "rejected, and the `replay plan` command that sizes it (None otherwise)",
    )  # fmt: skip
    kv_used: dict[str, float] = Field(
        default_factory=dict, description="Per tier, KV memory in use over capacity (fraction)"
    )
    cost_split: dict[str, float] = Field(
        default_factory=dict, description="cost_per_hour by part: each tier's GPUs and the "
        "line (USD/h)",
    )  # fmt: skip
    timeline: TimelineSummary | None = Field(
        None, description="The line's and the tiers' load over the run, in windows"
    )
    client: ClientTiming | None = Field(
        None, description="A live run's client: how late it sent requests and read tokens "
        "(None in a replay)",
    )  # fmt: skip
    config: dict[str, Any] | None = Field(
        None, description="The run's whole configuration (a replay's `ReplayConfig`): "
        "`ReplayConfig.model_validate(summary['config'])` rebuilds it",
    )  # fmt: skip


def _pct(values: FloatArray, qs: tuple[int, ...]) -> list[float | None]:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return [None] * (len(qs) + 1)
    points = np.percentile(finite, qs)
    out: list[float | None] = [round(float(x), 6) for x in points]
    return [*out, round(float(finite.mean()), 6)]


def _percentiles(values: FloatArray) -> Percentiles:
    p50, p90, p99, mean = _pct(values, (50, 90, 99))
    return Percentiles(p50=p50, p90=p90, p99=p99, mean=mean)


def client_timing(
    send_lags_s: Sequence[float], loop_stalls_s: Sequence[float], loop_period_s: float
) -> ClientTiming:
    """A live client's promptness from each request's send lag and each timed sleep of
    ``loop_period_s`` (how late it woke)."""
    stalls = np.asarray(loop_stalls_s, dtype=np.float64)
    stalled = float(stalls.sum())
    timed = stalled + loop_period_s * stalls.size
    return ClientTiming(
        requests_sent=len(send_lags_s),
        send_lag_s=_percentiles(np.asarray(send_lags_s, dtype=np.float64)),
        loop_samples=int(stalls.size),
        loop_stalled_s=round(stalled, 6),
        loop_stalled_share=round(stalled / timed, 6) if stalls.size else None,
        loop_stall_s_max=round(float(stalls.max()), 6) if stalls.size else None,
    )


def wan_gbps(times: Sequence[float], rates: Sequence[float], start: float, end: float) -> float:
    """Peak Gbps over 1 s windows from ``start``, given the link's rate steps (from
    ``times[i]``, ``rates[i]`` bytes/s)."""
    if len(times) < 2 or end <= start:
        return 0.0
    t = np.asarray(times, dtype=np.float64)
    r = np.asarray(rates, dtype=np.float64)
    cumulative = np.concatenate(([0.0], np.cumsum(r[:-1] * np.diff(t))))
    edges = np.arange(start, end + 1.0, 1.0)
    k = np.clip(np.searchsorted(t, edges, side="right") - 1, 0, len(t) - 1)
    at_edges = cumulative[k] + r[k] * np.maximum(edges - t[k], 0.0)
    per_window = np.diff(at_edges)
    return round(float(per_window.max()) * 8 / 1e9, 6) if per_window.size else 0.0


def summarize(
    records: Sequence[RequestRecord],
    setup: RunSetup,
    cluster: ClusterFacts | None = None,
    observed: Observed | None = None,
) -> Summary:
    """Aggregate per-request records into the run's summary."""
    cluster = cluster or ClusterFacts()
    observed = observed or Observed()
    latency = _latency(records, setup.sla)
    n, served = len(records), is_none(records, "rejected")
    duration, simulated = latency.pop("duration"), latency.pop("simulated")
    start, end = latency.pop("start"), latency.pop("end")
    met, completed = latency.pop("met"), latency.pop("completed")
    p50, p99, mean = _pct(float_values(records, "transfer_s"), (50, 99))
    # Python's sum, in record order: the same float as adding the records one by one
    wan_bytes = sequential_sum(float_values(records, "wan_bytes"))
    tokens_rld = sequential_sum(float_values(records, "tokens_rld"))
    tokens_all = tokens_rld + sequential_sum(float_values(records, "tokens_md"))
    rld_busy = sequential_sum(np.nan_to_num(float_values(records, "rld_busy_s"), nan=0.0))
    goodput = met / duration
    wan_mean = wan_bytes * 8 / simulated / 1e9 if simulated > 0 else 0.0
    timeline, wan_throughput = observed.timeline, observed.wan_throughput
    backlog = timeline.wan_backlog_gb if timeline is not None else []
    rejected_by = string_counts(records, "rejected")
    preempted = float_values(records, "preemptions")
    cost, bandwidth = cluster.cost_per_hour, cluster.wan_bandwidth_gbps
    shares = busy_shares(timeline, simulated)
    summary = Summary(
        policy=setup.policy, preset=setup.preset, trace=setup.trace, requests=n,
        completed=completed, seed=setup.seed, rate_scale=setup.rate_scale,
        kv_event_delay_s=setup.kv_event_delay_s, sla=setup.sla, **latency,
        sla_attainment=round(met / n, 6) if n else 0.0,
        sla_goodput_req_s=round(goodput, 6),
        throughput_rps=round(completed / duration, 6),
        wan_bytes=wan_bytes,
        wan_gbps_mean=round(wan_mean, 6),
        wan_gbps_peak=wan_gbps(*wan_throughput, start, end) if wan_throughput else 0.0,
        transfer_s=TransferStats(p50=p50, p99=p99, mean=mean),
        rld_token_share=round(tokens_rld / tokens_all, 6) if tokens_all else 0.0,
        rld_busy_mean=round(rld_busy / simulated, 6) if simulated > 0 else 0.0,
        index_mode=setup.index_mode,
        rejected=sum(rejected_by.values()),
        rejected_by=rejected_by,
        preemptions=int(preempted.sum()),
        preempted_requests=int((preempted > 0).sum()),
        pipelines=string_counts(records, "pipeline", where=served),
        handoffs=string_counts(records, "handoff"),
        reactive_p_rld=int(float_values(records, "reactive").sum()),
        hit_rate=_hit_rates(records, served),
        cost_per_hour=round(cost, 6),
        bcr_at_trace_rate_per_1000_usd_h=round(bcr_per_1000_usd_h(goodput, cost), 6),
        trace_duration_s=round(duration, 6),
        simulated_s=round(simulated, 6),
        wall_s=round(observed.wall_s, 3),
        cluster=dict(cluster.resolved or {}),
        overrides=dict(setup.overrides or {}),
        version=setup.version,
        warnings=list(observed.warnings),
        kv_event_wan_delay_s=setup.kv_event_wan_delay_s,
        wan_utilization=round(wan_mean / bandwidth, 6) if bandwidth else 0.0,
        wan_backlog_gb_peak=round(max(backlog), 6) if backlog else 0.0,
        utilization=shares.tiers, instance_utilization=shares.instances, wan_busy=shares.wan,
        ttft_missed_split_s=(  # a live run's records have no prefill or copy times
            ttft_missed_split(records, setup.sla.ttft_s) if observed.client is None else {}
        ),
        kv_used={t: _mean(v) for t, v in timeline.kv_used.items()} if timeline else {},
        cost_split={k: round(v, 6) for k, v in (cluster.cost_split or {}).items()},
        timeline=timeline_summary(timeline) if timeline is not None else None,
        client=observed.client,
        config=dict(setup.config) if setup.config is not None else None,
    )  # fmt: skip
    return summary.model_copy(update={"binding": find_binding(summary)})


def _latency(records: Sequence[RequestRecord], sla: SlaThresholds) -> dict[str, Any]:
    """The latency percentiles, the requests done and meeting the SLA, and the run's span
    (one column at a time, each dropped once used: a million records are 8 MB a column)."""
    n = len(records)
    arrival = float_values(records, "arrival_s")
    e2e = float_values(records, "e2e_s")
    done = np.isfinite(e2e)
    completed = int(done.sum())
    start = float(arrival.min()) if n else 0.0
    end = float(np.nanmax(arrival + e2e)) if completed else start
    simulated = max(end - start, 0.0)
    duration = float(arrival.max() - arrival.min()) if n else 0.0
    if duration <= 0.0:
        duration = simulated if simulated > 0.0 else 1.0
    del arrival
    e2e_s = _percentiles(e2e)
    del e2e
    ttft = float_values(records, "ttft_s")
    meets = done & (ttft <= sla.ttft_s)
    ttft_s = _percentiles(ttft)
    del ttft
    tpot = float_values(records, "tpot_s")
    meets &= ~np.isfinite(tpot) | (tpot <= sla.tpot_s)
    tpot_s = _percentiles(tpot)
    del tpot, done
    return {
        "ttft_s": ttft_s, "tpot_s": tpot_s, "e2e_s": e2e_s,
        "max_gap_s": _percentiles(float_values(records, "max_gap_s")),
        "met": int(meets.sum()), "completed": completed, "start": start, "end": end,
        "duration": duration, "simulated": simulated,
    }  # fmt: skip


def ttft_missed_split(records: Sequence[RequestRecord], limit_s: float) -> dict[str, float]:
    """The mean TTFT of the requests past ``limit_s`` and its parts (``Summary``'s
    ``ttft_missed_split_s``): what the prefill queue, the prefill and (for a first token
    from MD, P-MD) the KV copy over the line do not explain was spent on the decode side,
    split by the tier that gave the first token (``decode_md``, ``decode_rld``: P-RLD and
    P-RLD-MD, whose RDMA copy to RLD is in theirs). ``requests``: how many missed it."""
    ttft = float_values(records, "ttft_s")
    missed = np.isfinite(ttft) & (ttft > limit_s)
    if not missed.any():
        return {}
    total = ttft[missed]
    queue = float_values(records, "prefill_queue_s")[missed]
    prefill = float_values(records, "prefill_s")[missed]
    on_md = equals(records, "pipeline", "P-MD")[missed]
    line = np.where(on_md, np.nan_to_num(float_values(records, "transfer_s")[missed]), 0.0)
    decode = np.maximum(total - queue - prefill - line, 0.0)
    n = int(missed.sum())
    parts = {"ttft": total, "prefill_queue": queue, "prefill": prefill, "line": line,
             "decode": decode, "decode_md": np.where(on_md, decode, 0.0),
             "decode_rld": np.where(on_md, 0.0, decode)}  # fmt: skip
    return {"requests": float(n)} | {k: round(float(v.sum() / n), 6) for k, v in parts.items()}


def _mean(values: Sequence[float]) -> float:
    return round(float(np.mean(values)), 6) if values else 0.0


def _hit_rates(records: Sequence[RequestRecord], served: npt.NDArray[np.bool_]) -> dict[str, float]:
    """Token-weighted realized hit rate per tier (over the requests that used the tier)."""
    out: dict[str, float] = {}
    length = float_values(records, "input_length")
    for tier in ("p", "rld", "md"):
        rate = float_values(records, f"hit_{tier}")
        used = served & ~np.isnan(rate) if tier == "p" else ~np.isnan(rate)
        if used.any():
            hits, weights = rate[used], length[used]
            total = weights.sum()
            out[tier] = round(float((hits * weights).sum() / total), 6) if total else 0.0
    return out
