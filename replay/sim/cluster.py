"""Build the simulated cluster from a preset: instances, links, and the router's view."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad
from replay.presets.cluster_preset import ClusterPreset
from replay.sim.colocated_instance import ColocatedInstance
from replay.sim.decode_instance import DecodeInstance
from replay.sim.event_loop import EventLoop
from replay.sim.fluctuation import Fluctuation
from replay.sim.kv_events import KvEventFeed
from replay.sim.kv_memory import KvMemory
from replay.sim.link import Link
from replay.sim.prefill_instance import PrefillInstance
from replay.sim.request_state import Leg, SimRequest
from replay.sim.sim_settings import SimSettings
from replay.sim.step_costs import resolve_step_costs

__all__ = ["SimCluster", "build_cluster", "gbps_to_bytes_s"]


def gbps_to_bytes_s(gbps: float) -> float:
    return gbps * 1e9 / 8.0


@dataclass(slots=True)
class SimCluster:
    """The instances and links of one run, and the one ClusterView handed to the router."""

    prefill: dict[str, PrefillInstance | ColocatedInstance]  # colocated engines are P too
    decode: dict[str, DecodeInstance]
    rdma: dict[str, Link]  # one fabric per datacenter
    wan: Link | None
    view: ClusterView
    kv_bytes_per_token: float
    block_size: int
    home: str  # the datacenter of the P pool ("A")
    links: list[Link] = field(default_factory=list)
    step_cost_sources: dict[str, str] = field(default_factory=dict)  # pool -> where from

    def link_between(self, src: str, dst: str) -> Link:
        if src == dst:
            return self.rdma[src]
        if self.wan is None:
            raise RuntimeError(f"no link between datacenters {src} and {dst}")
        return self.wan

    def sync_links(self) -> None:
        for link in self.links:
            link.sync_state()


@dataclass(slots=True)
class _Instances:
    """The pools' instances as they are built, and what the router's view needs of them."""

    prefill: dict[str, PrefillInstance | ColocatedInstance] = field(default_factory=dict)
    decode: dict[str, DecodeInstance] = field(default_factory=dict)
    loads: dict[Tier, list[InstanceLoad]] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # pool -> where its costs came from


@dataclass(frozen=True, slots=True)
class _Callbacks:
    on_prefilled: Callable[[SimRequest], None]
    on_reserved: Callable[[Leg], None]
    on_finish: Callable[[SimRequest, DecodeInstance | ColocatedInstance], None]


def build_cluster(
    loop: EventLoop,
    preset: ClusterPreset,
    block_size: int,
    feed: KvEventFeed,
    settings: SimSettings,
    on_prefilled: Callable[[SimRequest], None],
    on_reserved: Callable[[Leg], None],
    on_finish: Callable[[SimRequest, DecodeInstance | ColocatedInstance], None],
) -> SimCluster:
    """Instances named ``<pool>-<i>``, an RDMA fabric per datacenter, the WAN if any;
    ``settings`` give the line's fluctuation seed and the step costs' scale."""
    calls = _Callbacks(on_prefilled, on_reserved, on_finish)
    built = _Instances()
    for pool_name in preset.pools():
        _add_pool(built, loop, preset, pool_name, block_size, feed, calls, settings.step_cost_scale)
    spec, model = preset.spec, preset.model
    rdma_spec = spec.links.rdma
    rdma = {
        dc: Link(loop, f"rdma-{dc}", gbps_to_bytes_s(rdma_spec.bandwidth_gbps), rdma_spec.rtt_s)
        for dc in preset.datacenters()
    }
    wan: Link | None = None
    wan_spec = spec.links.wan
    if wan_spec is not None and preset.spans_datacenters():
        fluct = Fluctuation(wan_spec.fluctuation, settings.seed) if wan_spec.fluctuation else None
        wan = Link(loop, "wan", gbps_to_bytes_s(wan_spec.bandwidth_gbps), wan_spec.rtt_s, fluct)
    prefill, decode, loads = built.prefill, built.decode, built.loads
    home = next(iter(prefill.values())).datacenter
    view = ClusterView(
        instances=loads,
        wan=wan.state if wan is not None else None,
        rdma=rdma[home].state,
        kv_bytes_per_token=model.kv_bytes_per_token,
        prefill_tokens_per_s=_prefill_rate(prefill),
        decode_step_s=_typical_step(decode, prefill),
        datacenter_of_tier={
            tier: next(p.datacenter for p in preset.pools().values() if p.tier == tier)
            for tier in loads
        },
    )
    links = [*rdma.values(), *([wan] if wan is not None else [])]
    return SimCluster(
        prefill, decode, rdma, wan, view, model.kv_bytes_per_token, block_size, home, links,
        built.sources,
    )  # fmt: skip


def _add_pool(
    built: _Instances,
    loop: EventLoop,
    preset: ClusterPreset,
    pool_name: str,
    block_size: int,
    feed: KvEventFeed,
    calls: _Callbacks,
    step_cost_scale: float,
) -> None:
    """The instances of one pool, each with its KV memory and its pool's step costs
    (every pass ``step_cost_scale`` times as long)."""
    spec, pool = preset.spec, preset.pools()[pool_name]
    capacity = preset.kv_capacity_tokens(pool)
    resolved = resolve_step_costs(preset, pool_name).scaled(step_cost_scale)
    step_costs = resolved.costs
    built.sources[pool_name] = resolved.describe()
    on_demand = spec.memory.allocation == "on-demand"
    for i in range(pool.instances):
        iid = f"{pool_name}-{i}"
        load = InstanceLoad(
            instance_id=iid, tier=pool.tier, datacenter=pool.datacenter,
            kv_capacity_tokens=capacity, max_batch=pool.max_batch,
        )  # fmt: skip
        built.loads.setdefault(pool.tier, []).append(load)
        cache = KvMemory(capacity, block_size, _evict_to(feed, iid), pool.kv_block_tokens)
        if pool.colocated:
            built.prefill[iid] = ColocatedInstance(
                loop, iid, pool.datacenter, load, cache, step_costs,
                max_batch=pool.max_batch, step_tokens=spec.timing.step_tokens,
                on_demand=on_demand, on_stored=feed.stored, on_finish=calls.on_finish,
            )  # fmt: skip
        elif pool.tier == Tier.P:
            built.prefill[iid] = PrefillInstance(
                loop, iid, pool.datacenter, load, cache, step_costs,
                spec.timing.prefill_batch_tokens, calls.on_prefilled,
            )  # fmt: skip
        else:
            built.decode[iid] = DecodeInstance(
                loop, iid, pool.tier, pool.datacenter, load, cache, step_costs,
                pool.max_batch, calls.on_reserved, calls.on_finish,
                spec.timing.first_token_on_decode, on_demand=on_demand,
                recomputes=spec.timing.decode_recomputes,
            )  # fmt: skip


def _evict_to(feed: KvEventFeed, instance_id: str) -> Callable[[list[int]], None]:
    def evicted(blocks: list[int]) -> None:
        feed.removed(instance_id, blocks)

    return evicted


def _prefill_rate(prefill: dict[str, PrefillInstance | ColocatedInstance]) -> float:
    """New tokens per second of one P instance on an 8K-token prompt with no cache hit."""
    costs = next(iter(prefill.values())).step_costs
    return 8192 / costs.prefill_s([(8192, 0)])


def _typical_step(
    decode: dict[str, DecodeInstance], prefill: dict[str, PrefillInstance | ColocatedInstance]
) -> float:
    """A decode step of an MD (or colocated) instance with 32 requests of 8K context each."""
    mds: list[DecodeInstance | ColocatedInstance] = [
        d for d in decode.values() if d.tier == Tier.MD
    ] or list(decode.values())
    mds = mds or [p for p in prefill.values() if isinstance(p, ColocatedInstance)]
    if not mds:
        return 0.0
    batch = min(32, mds[0].max_batch)
    return mds[0].step_costs.decode_step_s(batch, batch * 8192.0)
