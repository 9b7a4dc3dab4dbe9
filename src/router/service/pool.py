"""The engine instances the service drives: configs, adapters, live load, the cluster view."""

from __future__ import annotations

from collections.abc import Callable

from engines_adapter.contract import EngineAdapter
from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad, LinkState
from router.index.base import IndexedInstance, PrefixIndex
from router.service.schemas import InstanceConfig
from router.settings import ClusterSettings

__all__ = ["InstancePool", "UnknownInstance"]

AdapterFactory = Callable[[InstanceConfig], EngineAdapter]


class UnknownInstance(KeyError):
    """No instance with this id is registered."""


class InstancePool:
    """Registered instances with their adapters and the load the router keeps for each.

    The ClusterView handed to the scheduler is built once; registering or removing
    an instance edits its lists in place, so decisions always see the current pool.
    """

    def __init__(
        self, index: PrefixIndex, cluster: ClusterSettings, adapter_factory: AdapterFactory
    ) -> None:
        self.index = index
        self._factory = adapter_factory
        self.configs: dict[str, InstanceConfig] = {}
        self.adapters: dict[str, EngineAdapter] = {}
        self.loads: dict[str, InstanceLoad] = {}
        block_bytes = cluster.kv_bytes_per_token
        self.view = ClusterView(
            instances={tier: [] for tier in Tier},
            wan=LinkState(bandwidth_bps=cluster.wan_gbps * 1e9 / 8, rtt_s=cluster.wan_rtt_s),
            rdma=LinkState(bandwidth_bps=cluster.rdma_gbps * 1e9 / 8, rtt_s=cluster.rdma_rtt_s),
            kv_bytes_per_token=block_bytes,
            prefill_tokens_per_s=cluster.prefill_tokens_per_s,
            decode_step_s=cluster.decode_step_s,
        )

    def register(self, config: InstanceConfig, block_size: int) -> None:
        """Add or replace an instance (its adapter is rebuilt)."""
        adapter = self._factory(config)  # first: a refused config changes nothing
        if config.instance_id in self.configs:
            self.remove(config.instance_id)
        self.index.register(
            IndexedInstance(
                config.instance_id,
                config.tier,
                config.datacenter,
                capacity_blocks=max(config.capacity_tokens // block_size, 1),
            )
        )
        load = InstanceLoad(
            config.instance_id,
            config.tier,
            config.datacenter,
            kv_capacity_tokens=config.capacity_tokens,
            max_batch=config.max_batch,
        )
        self.configs[config.instance_id] = config
        self.adapters[config.instance_id] = adapter
        self.loads[config.instance_id] = load
        self.view.instances[config.tier].append(load)
        self.view.instances[config.tier].sort(key=lambda i: i.instance_id)

    def remove(self, instance_id: str) -> EngineAdapter:
        """Forget an instance; returns its adapter so the caller can close it."""
        config = self.configs.pop(instance_id, None)
        if config is None:
            raise UnknownInstance(instance_id)
        load = self.loads.pop(instance_id)
        self.view.instances[config.tier].remove(load)
        self.index.unregister(instance_id)
        return self.adapters.pop(instance_id)

    def get(self, instance_id: str) -> tuple[InstanceConfig, EngineAdapter, InstanceLoad]:
        if instance_id not in self.configs:
            raise UnknownInstance(instance_id)
        return self.configs[instance_id], self.adapters[instance_id], self.loads[instance_id]

    def ready_tiers(self) -> dict[Tier, bool]:
        """Whether each tier has a healthy instance (RLD is optional: absent means fine)."""
        out = {}
        for tier in Tier:
            pool = self.view.instances[tier]
            out[tier] = any(i.healthy for i in pool) if pool or tier is not Tier.RLD else True
        return out
