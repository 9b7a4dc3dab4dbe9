"""The one decision the PD baselines make: every request P-MD, decode where it is cheapest.
``PlainPdPolicy`` is that decision as a policy; the baselines differ only in whether MD's
prefix cache is reused and in the reason they give."""

from __future__ import annotations

from typing import ClassVar

from policies.config import IdcPdParams, XdcPdDrcParams, XdcPdParams
from policies.estimates import hit_tokens
from policies.selection import choose_decode, choose_prefill
from policies.tiers import Tier
from policies.types import ClusterView, Decision, Matches, Pipeline, RequestView

__all__ = ["PlainPdPolicy", "p_md_decision"]


def p_md_decision(
    policy: str,
    request: RequestView,
    cluster: ClusterView,
    matches: Matches,
    *,
    reuse_md_cache: bool,
    load_weight_s: float,
    reason: str,
) -> Decision:
    """P-MD on the quickest P and the decode instance with the cheapest transfer plus load.

    With ``reuse_md_cache`` only the blocks the decode instance lacks are shipped;
    without it the whole prompt's KV moves (naive cross-datacenter PD). Bytes count
    as WAN bytes only when they cross datacenters.
    """
    p, p_blocks, p_delay = choose_prefill(request, cluster, matches.get(Tier.P, {}))
    md = choose_decode(
        request, cluster, Tier.MD, p, matches.get(Tier.MD, {}) if reuse_md_cache else {},
        reuse_cache=reuse_md_cache, load_weight_s=load_weight_s,
    )  # fmt: skip
    if md is None:
        raise LookupError("no healthy decode instance")
    crosses = md.instance.datacenter != p.datacenter and cluster.wan is not None
    n = max(request.input_length, 1)
    return Decision(
        policy=policy,
        pipeline=Pipeline.P_MD,
        p_instance=p.instance_id,
        md_instance=md.instance.instance_id,
        reuse_md_cache=reuse_md_cache,
        predicted_hit={
            Tier.P: hit_tokens(request, p_blocks, p) / n,
            Tier.MD: hit_tokens(request, md.hit_blocks, md.instance) / n,
        },
        predicted_wan_bytes=md.transfer_bytes if crosses else 0.0,
        predicted_wan_s=md.transfer_s if crosses else 0.0,
        predicted_ttft_s=p_delay + md.transfer_s + cluster.decode_step_s,
        reason=reason,
    )


class PlainPdPolicy:
    """Every request P-MD (see ``p_md_decision``); subclasses name the policy, say whether
    MD's prefix cache is reused, and give the reason."""

    name: str
    reuse_md_cache: ClassVar[bool]
    reason: ClassVar[str]

    def __init__(self, params: IdcPdParams | XdcPdParams | XdcPdDrcParams) -> None:
        self.params = params

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        return p_md_decision(
            self.name, request, cluster, matches, reuse_md_cache=self.reuse_md_cache,
            load_weight_s=self.params.load_weight_s, reason=self.reason,
        )  # fmt: skip
