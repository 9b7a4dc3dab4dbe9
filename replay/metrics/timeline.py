"""The run's load over time for summary.json and timeline.csv, and its busy time overall.

The simulator's ``Timeline`` samples every period; here the samples are merged into at
most ``MAX_WINDOWS`` windows, and the busy seconds it kept per instance and for the line
become the run's utilization: busy time over the run's window (from the first arrival to
the last request's end), per instance and per tier.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, Field

from replay.sim.timeline import TimelineSamples

__all__ = ["MAX_WINDOWS", "BusyShares", "TimelineSummary", "busy_shares", "timeline_summary"]

MAX_WINDOWS = 120
"""The timeline in summary.json has at most this many windows (samples are merged)."""


class TimelineSummary(BaseModel):
    """Load over the run in windows of ``window_s`` (at most ``MAX_WINDOWS``): the line's
    mean rate, largest backlog and busy share, each tier's utilization (busy time over the
    window, averaged over its instances) and mean KV occupancy."""

    window_s: float
    t_s: list[float] = Field(description="Each window's start, seconds after the first arrival")
    wan_gbps: list[float] = Field(default_factory=list, description="Mean line rate, Gbps")
    wan_backlog_gb: list[float] = Field(
        default_factory=list, description="Largest backlog on the line, GB"
    )
    wan_busy: list[float] = Field(
        default_factory=list, description="Share of the window the line was sending"
    )
    utilization: dict[str, list[float]] = Field(
        default_factory=dict, description="Per tier: share of the window its instances were "
        "busy (mean over the instances)",
    )  # fmt: skip
    kv_used: dict[str, list[float]] = Field(default_factory=dict)


def _windows(values: Sequence[float], k: int, how: str) -> list[float]:
    if not values:
        return []
    a = np.asarray(values, dtype=np.float64)
    pad = (-len(a)) % k
    grid = np.concatenate((a, np.full(pad, np.nan))).reshape(-1, k)
    out = np.nanmax(grid, axis=1) if how == "max" else np.nanmean(grid, axis=1)
    return [round(float(x), 6) for x in out]


def _from_start(shares: Sequence[float]) -> list[float]:
    """Busy shares of the periods starting at each sample: a sample holds the share of the
    period ending at it; after the last one nothing was left to run (0)."""
    return [*shares[1:], 0.0] if shares else []


def timeline_summary(samples: TimelineSamples) -> TimelineSummary | None:
    """The samples merged into at most ``MAX_WINDOWS`` windows."""
    if not samples.t_s:
        return None
    k = max(-(-len(samples.t_s) // MAX_WINDOWS), 1)
    origin = samples.t_s[0]
    return TimelineSummary(
        window_s=samples.period_s * k,
        t_s=[round(t - origin, 6) for t in samples.t_s[::k]],
        wan_gbps=_windows(samples.wan_gbps, k, "mean"),
        wan_backlog_gb=_windows(samples.wan_backlog_gb, k, "max"),
        wan_busy=_windows(_from_start(samples.wan_busy), k, "mean"),
        utilization={
            t: _windows(_from_start(v), k, "mean") for t, v in samples.utilization.items()
        },
        kv_used={t: _windows(v, k, "mean") for t, v in samples.kv_used.items()},
    )


class BusyShares(BaseModel):
    """Busy time over the run's window: per tier (over its instances), per instance, line."""

    tiers: dict[str, float] = Field(default_factory=dict)
    instances: dict[str, float] = Field(default_factory=dict)
    wan: float | None = None


def busy_shares(samples: TimelineSamples | None, window_s: float) -> BusyShares:
    """Each instance's busy seconds over ``window_s``, the tiers' over their instances'
    total time, the line's; empty without samples or a window."""
    if samples is None or window_s <= 0.0:
        return BusyShares()
    instances = {key: round(busy / window_s, 6) for key, busy in samples.busy_s.items()}
    busy: dict[str, float] = {}
    count: dict[str, int] = {}
    for key, seconds in samples.busy_s.items():
        tier = samples.tier_of[key]
        busy[tier] = busy.get(tier, 0.0) + seconds
        count[tier] = count.get(tier, 0) + 1
    tiers = {
        t: round(busy.get(t, 0.0) / (max(count.get(t, 0), 1) * window_s), 6)
        for t in samples.utilization
    }
    wan = None if samples.wan_busy_s is None else round(samples.wan_busy_s / window_s, 6)
    return BusyShares(tiers=tiers, instances=instances, wan=wan)
