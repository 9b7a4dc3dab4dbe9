"""How busy each tier and the line were over a run: samples every ``period_s`` simulated.

At each sample: the line's rate (Gbps), backlog (GB still to send) and busy fraction, and
per tier (P, RLD, MD) its utilization and KV occupancy, averaged over its instances.
Utilization is busy time: the share of the period ending at the sample that an instance
was busy (a P instance running a prefill batch, a decode instance's batch non-empty, a
colocated engine holding admitted requests; the line sending bytes), not a sample of busy
or idle at one instant. Each instance's and the line's busy seconds since the start are
kept too (``busy_s``), for the run's utilization over its whole window. The sampler stops
once nothing else is left to simulate, so it never keeps a run alive.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from policies.tiers import Tier
from replay.sim.busy_time import BusyTime
from replay.sim.cluster import SimCluster
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority

__all__ = ["TIERS", "Timeline", "TimelineSamples"]

TIERS = (Tier.P, Tier.RLD, Tier.MD)


@dataclass(slots=True)
class TimelineSamples:
    """The samples, one entry per tick (tiers the cluster lacks stay empty), in compact
    float arrays: a day of traffic is 86,400 ticks."""

    period_s: float
    t_s: array[float] = field(default_factory=lambda: array("d"))
    wan_gbps: array[float] = field(default_factory=lambda: array("d"))
    wan_backlog_gb: array[float] = field(default_factory=lambda: array("d"))
    wan_busy: array[float] = field(default_factory=lambda: array("d"))
    utilization: dict[str, array[float]] = field(default_factory=dict)
    kv_used: dict[str, array[float]] = field(default_factory=dict)
    busy_s: dict[str, float] = field(default_factory=dict)  # instance ID -> busy seconds
    tier_of: dict[str, str] = field(default_factory=dict)  # instance ID -> its tier
    wan_busy_s: float | None = None  # the line's busy seconds (None: no line)


class Timeline:
    """Samples ``cluster`` every ``period_s`` once started."""

    __slots__ = ("_busy", "_cluster", "_last_t", "_loop", "_tiers", "samples")

    def __init__(self, loop: EventLoop, cluster: SimCluster, period_s: float = 1.0) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be positive, got {period_s}")
        self._loop = loop
        self._cluster = cluster
        present = {i.tier for i in cluster.prefill.values()}
        present |= {i.tier for i in cluster.decode.values()}
        self._tiers = [t for t in TIERS if t in present]
        self.samples = TimelineSamples(period_s)
        for tier in self._tiers:
            self.samples.utilization[tier.value] = array("d")
            self.samples.kv_used[tier.value] = array("d")
        # each instance's busy clock: P-side instances their own, decode ones their batch's
        self._busy: dict[str, tuple[Tier, BusyTime]] = {
            i.id: (i.tier, i.busy_time) for i in cluster.prefill.values()
        }
        self._busy |= {i.id: (i.tier, i.batch.busy_time) for i in cluster.decode.values()}
        self.samples.tier_of = {key: tier.value for key, (tier, _) in self._busy.items()}
        self._last_t: float | None = None

    def start(self, at_s: float) -> None:
        self._loop.at(at_s, Priority.SAMPLE, self._tick)

    def _tick(self, _: object) -> None:
        s, cluster, now = self.samples, self._cluster, self._loop.now
        s.t_s.append(now)
        last, self._last_t = self._last_t, now
        span = now - last if last is not None else 0.0
        wan = cluster.wan
        if wan is not None:
            s.wan_gbps.append(wan.throughput_rates[-1] * 8 / 1e9)
            s.wan_backlog_gb.append(wan.backlog() / 1e9)
            busy = wan.busy_time.busy_s(now)
            s.wan_busy.append(_share(busy - (s.wan_busy_s or 0.0), span))
            s.wan_busy_s = busy
        gained = {tier: 0.0 for tier in self._tiers}
        counts = dict.fromkeys(self._tiers, 0)
        for key, (tier, clock) in self._busy.items():
            busy = clock.busy_s(now)
            gained[tier] += _share(busy - s.busy_s.get(key, 0.0), span)
            counts[tier] += 1
            s.busy_s[key] = busy
        for tier in self._tiers:
            kv = 0.0
            if tier is Tier.P:
                for p in cluster.prefill.values():
                    kv += p.cache.pinned_tokens / max(p.load.kv_capacity_tokens, 1)
            else:
                for d in cluster.decode.values():
                    if d.tier is tier:
                        load = d.load
                        kv += load.kv_used_tokens / max(load.kv_capacity_tokens, 1)
            count = counts[tier]
            s.utilization[tier.value].append(gained[tier] / count if count else 0.0)
            s.kv_used[tier.value].append(kv / count if count else 0.0)
        if self._loop.pending():  # something is left to simulate: sample again
            self._loop.at(now + s.period_s, Priority.SAMPLE, self._tick)


def _share(busy_s: float, span_s: float) -> float:
    """Busy seconds over the span they were gained in (0 for the first sample, which
    closes no span), as a fraction capped at 1 against rounding."""
    return min(busy_s / span_s, 1.0) if span_s > 0.0 else 0.0
