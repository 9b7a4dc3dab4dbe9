"""How busy each tier and the line were over a run: samples every ``period_s`` simulated.

At each sample: the line's rate (Gbps) and backlog (GB still to send), and per tier (P,
RLD, MD) its utilization and KV occupancy, averaged over its instances. A P instance is
busy while a prefill batch runs (its utilization is the share of P instances busy); a
decode instance's utilization is its running requests over its batch cap. The sampler
stops once nothing else is left to simulate, so it never keeps a run alive.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field

from policies.tiers import Tier
from replay.sim.cluster import SimCluster
from replay.sim.colocated_instance import ColocatedInstance
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
    utilization: dict[str, array[float]] = field(default_factory=dict)
    kv_used: dict[str, array[float]] = field(default_factory=dict)


class Timeline:
    """Samples ``cluster`` every ``period_s`` once started."""

    __slots__ = ("_cluster", "_loop", "_tiers", "samples")

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

    def start(self, at_s: float) -> None:
        self._loop.at(at_s, Priority.SAMPLE, self._tick)

    def _tick(self, _: object) -> None:
        s, cluster = self.samples, self._cluster
        s.t_s.append(self._loop.now)
        wan = cluster.wan
        if wan is not None:
            s.wan_gbps.append(wan.throughput_rates[-1] * 8 / 1e9)
            s.wan_backlog_gb.append(wan.backlog() / 1e9)
        for tier in self._tiers:
            busy = kv = 0.0
            count = 0
            if tier is Tier.P:
                for p in cluster.prefill.values():
                    if isinstance(p, ColocatedInstance):  # running requests over the cap
                        busy += p.load.running / max(p.max_batch, 1)
                    else:
                        busy += 1.0 if p.queue.running else 0.0
                    kv += p.cache.pinned_tokens / max(p.load.kv_capacity_tokens, 1)
                    count += 1
            else:
                for d in cluster.decode.values():
                    if d.tier is tier:
                        load = d.load
                        busy += load.running / max(d.max_batch, 1)
                        kv += load.kv_used_tokens / max(load.kv_capacity_tokens, 1)
                        count += 1
            s.utilization[tier.value].append(busy / count if count else 0.0)
            s.kv_used[tier.value].append(kv / count if count else 0.0)
        if self._loop.pending():  # something is left to simulate: sample again
            self._loop.at(self._loop.now + s.period_s, Priority.SAMPLE, self._tick)
