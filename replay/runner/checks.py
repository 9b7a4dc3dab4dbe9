"""Before and after a replay: a cluster that cannot serve the trace is refused, and the
figures of one that can but would mislead (a baseline on a cluster it was not made for,
extrapolated costs, a trace without prefixes, a cluster that fell behind) are flagged."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from policies.tiers import Tier
from replay.metrics.columns import float_values, is_none
from replay.metrics.record import RequestRecord
from replay.metrics.summary import Summary
from replay.presets.cluster_preset import ClusterPreset
from replay.runner.trace_source import TraceShape, capacity_error
from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = ["backlog_warning", "check_cluster", "cluster_warnings"]

_REQUIRED_TIERS: dict[str, tuple[Tier, ...]] = {
    "pdd": (Tier.P, Tier.RLD, Tier.MD),
    "pdd-adaptive": (Tier.P, Tier.RLD, Tier.MD),
    "colocated": (Tier.P,),
}
_DEFAULT_TIERS = (Tier.P, Tier.MD)


_ONE_DATACENTER = {"idc-pd"}
_CROSS_DATACENTER = {"xdc-pd", "xdc-pd-drc", "pdd", "pdd-adaptive"}


def cluster_warnings(
    preset: ClusterPreset, policy: str, requests: Sequence[TraceRequest] | TraceShape
) -> list[str]:
    """What makes a replay's answer misleading though it can run: a baseline on a cluster
    it was not made for, a trace without prefix information."""
    shape = requests if isinstance(requests, TraceShape) else TraceShape.of(requests)
    out = []
    spans = preset.spans_datacenters()
    pools = preset.pools().values()
    p_dcs = {p.datacenter for p in pools if p.tier == Tier.P}
    remote_md = sorted({p.datacenter for p in pools if p.tier == Tier.MD} - p_dcs)
    if policy in _ONE_DATACENTER and remote_md:
        out.append(
            f"{policy} models PD inside one datacenter, but preset {preset.name} puts decode "
            f"in {', '.join(remote_md)}, away from prefill: requests' uncached KV crosses "
            "the WAN. That is the xdc-pd-drc baseline: name it so, or replay idc-pd on a "
            "one-datacenter preset"
        )
    if policy in _CROSS_DATACENTER and not spans:
        out.append(
            f"{policy} is a cross-datacenter design, but preset {preset.name} is one "
            "datacenter: nothing crosses a WAN, so the run says nothing about the line"
        )
    longest = shape.longest
    for name, pool in preset.pools().items():
        probed = pool.fitted.probed_prompt_tokens if pool.fitted is not None else None
        if probed is not None and longest > EXTRAPOLATION * probed:
            out.append(
                f"pool {name}'s timing was calibrated on prompts up to {probed:,} tokens, but "
                f"the trace's requests reach {longest:,}: its costs per context token are "
                "extrapolated (calibrate again with a larger --max-prompt)"
            )
    if shape.requests and not shape.has_blocks:
        out.append(
            "the trace has no prefix information (no hash_ids, as in Azure traces): every "
            "request is a cache miss, so hit rates, WAN deltas and the policies' choices "
            "are not those of real traffic"
        )
    return out


EXTRAPOLATION = 2.0
"""Requests longer than this many times a calibrated pool's longest probe are warned of."""

BACKLOG_GROWTH = 3.0
"""Queues grew through a run whose last fifth of arrivals waits this many times longer for
its first token than the first fifth (and longer than the SLA allows)."""
BACKLOG_OVERRUN = 0.5
"""Or the run fell behind from the start: its median TTFT is beyond the SLA and its last
request ends more than this share of the trace's span (and over a minute) after the last
arrival (a short trace overwhelmed at once)."""


def backlog_warning(summary: Summary, records: Sequence[RequestRecord]) -> str | None:
    """A line when the cluster fell behind the trace, else None."""
    served = is_none(records, "rejected")
    arrival = float_values(records, "arrival_s")[served]  # refused requests queued nowhere
    fifth = len(arrival) // 5
    if fifth == 0:
        return None
    ttft = float_values(records, "ttft_s")[served]
    ordered = np.where(np.isnan(ttft), np.inf, ttft)[np.argsort(arrival, kind="stable")]

    def median_ttft(part: npt.NDArray[np.float64]) -> float:
        return float(np.median(part))

    advice = "; lower --rate-scale or add instances"
    first, last = median_ttft(ordered[:fifth]), median_ttft(ordered[-fifth:])
    if last > summary.sla.ttft_s and last >= BACKLOG_GROWTH * first:
        shown = "never got one" if not np.isfinite(last) else f"waited {last:,.1f} s"
        return (
            f"the cluster did not keep up: the last fifth of the requests {shown} (median) "
            f"for their first token, the first fifth {first:,.2f} s, so the latencies "
            f"measure a queue that grew through the run{advice}"
        )
    span = summary.trace_duration_s
    overrun = summary.simulated_s - span
    typical = median_ttft(ordered)
    if typical > summary.sla.ttft_s and overrun > max(BACKLOG_OVERRUN * span, 60.0):
        return (
            f"the cluster did not keep up: requests waited a median {typical:,.1f} s for "
            f"their first token (SLA {summary.sla.ttft_s:g} s) and the last one ended "
            f"{overrun:,.0f} s after the last arrival (the trace spans {span:,.1f} s){advice}"
        )
    return None


def check_cluster(
    preset: ClusterPreset, policy: str, requests: Sequence[TraceRequest] | TraceShape | None
) -> None:
    """Refuse, before the run, a cluster that cannot serve the trace with the policy.

    ``requests`` None checks the cluster alone (a streamed trace's requests are checked
    as they are read, by ``CheckedTrace``)."""
    pools = preset.pools()
    have = preset.tiers()
    listing = ", ".join(f"{n} ({p.tier.value} in {p.datacenter})" for n, p in pools.items())
    if preset.spec.colocated != (policy == "colocated"):
        raise UserError(
            f"preset {preset.name} is colocated (each engine prefills and decodes): route it "
            "with --policy colocated"
            if preset.spec.colocated
            else f"preset {preset.name}: policy colocated needs a colocated pool (`colocated: "
            "true`, as in the colocated presets); this one disaggregates: "
            f"{listing or 'no pools'}"
        )
    for tier in _REQUIRED_TIERS.get(policy, _DEFAULT_TIERS):
        if tier not in have:
            raise UserError(
                f"preset {preset.name}: policy {policy} needs a {tier.value} pool with at least "
                f"one instance; the preset has: {listing or 'no pools'}"
            )
    p_dcs = {p.datacenter for p in pools.values() if p.tier == Tier.P}
    if len(p_dcs) > 1 or len(preset.datacenters()) > 2:
        raise UserError(
            f"preset {preset.name}: P must sit in one datacenter and the cluster span at most "
            f"two; it has: {listing}"
        )
    links = preset.spec.links
    if links.rdma.bandwidth_gbps <= 0:
        raise UserError(f"preset {preset.name}: the RDMA bandwidth must be positive")
    if preset.spans_datacenters():
        if links.wan is None:
            raise UserError(
                f"preset {preset.name}: pools span datacenters {', '.join(preset.datacenters())} "
                "but there is no WAN link (links.wan)"
            )
        if links.wan.bandwidth_gbps <= 0:
            raise UserError(f"preset {preset.name}: the WAN bandwidth must be positive")
    if not requests:
        return
    shape = requests if isinstance(requests, TraceShape) else TraceShape.of(requests)
    error = capacity_error(preset, shape, "the largest request of the trace")
    if error is not None:
        raise error
