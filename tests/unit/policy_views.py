"""The cluster a PDD policy sees in unit tests: two P and one RLD in A, two MD in B, a
20 Gbps line; each argument loads one part of it."""

from __future__ import annotations

from policies.tiers import Tier
from policies.types import ClusterView, InstanceLoad, LinkState

__all__ = ["BLOCK", "GBPS20", "KV", "cluster"]

KV = 70_000.0  # KV bytes per token
BLOCK = 512
GBPS20 = 20e9 / 8


def cluster(
    *,
    p_queue_tokens: int = 0,
    backlog: float = 0.0,
    wan_active: int = 0,
    rld_running: int = 0,
    rld_kv_used: int = 0,
    rld_pending_tokens: int = 0,
) -> ClusterView:
    def inst(iid: str, tier: Tier, dc: str) -> InstanceLoad:
        return InstanceLoad(iid, tier, dc, kv_capacity_tokens=2_000_000)

    ps = [inst("p0", Tier.P, "A"), inst("p1", Tier.P, "A")]
    for p in ps:
        p.queued_prefill_tokens = p_queue_tokens
    rld = inst("rld0", Tier.RLD, "A")
    rld.running, rld.kv_used_tokens = rld_running, rld_kv_used
    rld.pending_tokens = rld_pending_tokens
    return ClusterView(
        instances={
            Tier.P: ps,
            Tier.RLD: [rld],
            Tier.MD: [inst("md0", Tier.MD, "B"), inst("md1", Tier.MD, "B")],
        },
        wan=LinkState(GBPS20, 0.03, active_transfers=wan_active, backlog_bytes=backlog),
        rdma=LinkState(400e9 / 8, 1e-5),
        kv_bytes_per_token=KV,
        prefill_tokens_per_s=20_000.0,
        decode_step_s=0.03,
    )
