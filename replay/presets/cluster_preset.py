"""A cluster preset resolved against its hardware and model tables, with derived figures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from policies.tiers import Tier
from replay.presets.schema import ClusterSpec, HardwareSpec, ModelSpec, PoolSpec

__all__ = ["ClusterPreset"]


@dataclass(frozen=True, slots=True)
class ClusterPreset:
    """Everything the simulator needs to build a cluster, by name."""

    name: str
    spec: ClusterSpec
    model: ModelSpec
    hardware: dict[str, HardwareSpec]

    def resolved(self) -> dict[str, Any]:
        """The whole preset as one mapping: the cluster's keys with the model and the
        hardware it uses as its own ``models`` and ``hardware`` tables. Written as YAML it
        is a preset file that ``--preset FILE`` loads to the same cluster."""
        tree: dict[str, Any] = self.spec.model_dump(mode="json", exclude_none=True)
        tree["models"] = {self.spec.model: self.model.model_dump(mode="json")}
        used = sorted({pool.hardware for pool in self.spec.pools.values()})
        tree["hardware"] = {hw: self.hardware[hw].model_dump(mode="json") for hw in used}
        return tree

    def pools(self) -> dict[str, PoolSpec]:
        """Pools with at least one instance, in the preset's order."""
        return {name: pool for name, pool in self.spec.pools.items() if pool.instances > 0}

    def tiers(self) -> set[Tier]:
        return {pool.tier for pool in self.pools().values()}

    def kv_capacity_tokens(self, pool: PoolSpec) -> int:
        """KV tokens one instance of the pool holds: HBM share minus weights, or explicit;
        whole engine blocks of it when the pool gives their size (``kv_block_tokens``)."""
        if pool.kv_capacity_tokens is not None:
            tokens = pool.kv_capacity_tokens
        else:
            hw = self.hardware[pool.hardware]
            usable = pool.gpus_per_instance * hw.hbm_bytes * self.spec.timing.memory_utilization
            free = usable - self.model.weight_bytes
            tokens = max(int(free // self.model.kv_bytes_per_token), 0)
        block = pool.kv_block_tokens
        return tokens if block is None else tokens - tokens % block

    def gpu_counts(self) -> dict[str, int]:
        """GPUs per hardware name over all pools."""
        counts: dict[str, int] = {}
        for pool in self.pools().values():
            counts[pool.hardware] = counts.get(pool.hardware, 0) + (
                pool.instances * pool.gpus_per_instance
            )
        return counts

    def cost_per_hour(self) -> float:
        """GPUs times their price plus the WAN line (when there is one)."""
        gpus = sum(n * self.hardware[hw].price_per_hour for hw, n in self.gpu_counts().items())
        wan = self.spec.links.wan
        line = wan.hourly_price() if wan is not None and self.spans_datacenters() else 0.0
        return gpus + line

    def cost_split(self) -> dict[str, float]:
        """``cost_per_hour`` by part: the GPUs of each tier, and ``wan`` for the line."""
        out: dict[str, float] = {}
        for pool in self.pools().values():
            gpus = pool.instances * pool.gpus_per_instance
            tier = pool.tier.value
            out[tier] = out.get(tier, 0.0) + gpus * self.hardware[pool.hardware].price_per_hour
        wan = self.spec.links.wan
        if wan is not None and self.spans_datacenters():
            out["wan"] = wan.hourly_price()
        return out

    def datacenters(self) -> list[str]:
        return sorted({pool.datacenter for pool in self.pools().values()})

    def spans_datacenters(self) -> bool:
        return len(self.datacenters()) > 1
