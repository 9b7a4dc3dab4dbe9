"""`idc-pd`: intra-datacenter PD, prefill and decode in one datacenter over RDMA."""

from __future__ import annotations

from policies.config import IdcPdParams
from policies.estimates import hit_tokens
from policies.selection import choose_decode, choose_prefill
from policies.tiers import Tier
from policies.types import ClusterView, Decision, Matches, Pipeline, RequestView

__all__ = ["IdcPdPolicy"]


class IdcPdPolicy:
    """Every request P-MD with the decode pool next to prefill; the KV moves over RDMA."""

    name = "idc-pd"

    def __init__(self, params: IdcPdParams) -> None:
        self.params = params

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        p, p_blocks, p_delay = choose_prefill(request, cluster, matches.get(Tier.P, {}))
        md = choose_decode(
            request, cluster, Tier.MD, p, matches.get(Tier.MD, {}),
            reuse_cache=True, load_weight_s=self.params.load_weight_s,
        )  # fmt: skip
        if md is None:
            raise LookupError("no healthy decode instance")
        n = max(request.input_length, 1)
        return Decision(
            policy=self.name,
            pipeline=Pipeline.P_MD,
            p_instance=p.instance_id,
            md_instance=md.instance.instance_id,
            predicted_hit={
                Tier.P: hit_tokens(request, p_blocks) / n,
                Tier.MD: hit_tokens(request, md.hit_blocks) / n,
            },
            predicted_wan_bytes=0.0,
            predicted_wan_s=0.0,
            predicted_ttft_s=p_delay + md.transfer_s + cluster.decode_step_s,
            reason="intra-datacenter PD: KV over RDMA",
        )
