"""`xdc-pd`: naive cross-datacenter PD, the full prompt KV over the WAN for every request."""

from __future__ import annotations

from policies.config import XdcPdParams
from policies.estimates import hit_tokens
from policies.selection import choose_decode, choose_prefill
from policies.tiers import Tier
from policies.types import ClusterView, Decision, Matches, Pipeline, RequestView

__all__ = ["XdcPdPolicy"]


class XdcPdPolicy:
    """Every request P-MD; no decode-side cache, so the whole prompt's KV crosses the WAN."""

    name = "xdc-pd"

    def __init__(self, params: XdcPdParams) -> None:
        self.params = params

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        p, p_blocks, p_delay = choose_prefill(request, cluster, matches.get(Tier.P, {}))
        md = choose_decode(
            request, cluster, Tier.MD, p, {},
            reuse_cache=False, load_weight_s=self.params.load_weight_s,
        )  # fmt: skip
        if md is None:
            raise LookupError("no healthy decode instance")
        n = max(request.input_length, 1)
        return Decision(
            policy=self.name,
            pipeline=Pipeline.P_MD,
            p_instance=p.instance_id,
            md_instance=md.instance.instance_id,
            reuse_md_cache=False,
            predicted_hit={Tier.P: hit_tokens(request, p_blocks) / n, Tier.MD: 0.0},
            predicted_wan_bytes=md.transfer_bytes,
            predicted_wan_s=md.transfer_s,
            predicted_ttft_s=p_delay + md.transfer_s + cluster.decode_step_s,
            reason="naive cross-datacenter PD: full KV over the WAN",
        )
