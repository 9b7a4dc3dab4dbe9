"""What the PDD policies (`pdd`, `pdd-adaptive`) share about their pipelines.

Both finish odd traffic on RLD (P-RLD), predict an RLD-served TTFT the same way (the
prefill, the KV over RDMA, one decode step), and describe a request that goes to MD
(P-MD or P-RLD-MD) with the same typed route (``MdRoute``).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.estimates import Placement
from policies.tiers import Tier
from policies.types import (
    ClusterView,
    Decision,
    HandoffMode,
    InstanceLoad,
    Pipeline,
    RequestView,
)

__all__ = ["MdRoute", "finish_on_rld", "relay_ttft_s"]


def relay_ttft_s(request: RequestView, cluster: ClusterView, p_delay_s: float) -> float:
    """TTFT when RLD serves the first token: prefill, the whole KV over RDMA, one step."""
    nbytes = max(request.input_length, 1) * cluster.kv_bytes_per_token
    return p_delay_s + cluster.rdma.transfer_s(nbytes) + cluster.decode_step_s


def finish_on_rld(
    policy: str,
    p: InstanceLoad,
    rld: InstanceLoad,
    hits: dict[Tier, float],
    ttft_s: float,
    reason: str,
) -> Decision:
    """P-RLD: the request is prefilled on P and decoded to the end on RLD."""
    return Decision(
        policy=policy,
        pipeline=Pipeline.P_RLD,
        p_instance=p.instance_id,
        rld_instance=rld.instance_id,
        predicted_hit={**hits, Tier.RLD: 0.0},
        predicted_ttft_s=ttft_s,
        reason=reason,
    )


@dataclass(frozen=True, slots=True)
class MdRoute:
    """A request whose KV goes from P to the main-decode instance: what P-MD and P-RLD-MD
    decisions of one request share."""

    policy: str
    p_instance: str
    md_instance: str
    wan_bytes: float
    wan_s: float

    @classmethod
    def of(cls, policy: str, p: InstanceLoad, md: Placement, wan_s: float) -> MdRoute:
        return cls(policy, p.instance_id, md.instance.instance_id, md.transfer_bytes, wan_s)

    def direct(self, hits: dict[Tier, float], ttft_s: float, reason: str) -> Decision:
        """P-MD: MD decodes from the first token."""
        return Decision(
            policy=self.policy,
            pipeline=Pipeline.P_MD,
            p_instance=self.p_instance,
            md_instance=self.md_instance,
            predicted_hit=hits,
            predicted_wan_bytes=self.wan_bytes,
            predicted_wan_s=self.wan_s,
            predicted_ttft_s=ttft_s,
            reason=reason,
        )

    def relay_then_md(
        self,
        rld: InstanceLoad,
        mode: HandoffMode,
        chunk_tokens: int,
        hits: dict[Tier, float],
        ttft_s: float,
        reason: str,
    ) -> Decision:
        """P-RLD-MD: RLD streams the first tokens while the KV travels to MD, then hands
        off (``chunk_tokens`` is the catch-up chunk; one-shot has none)."""
        return Decision(
            policy=self.policy,
            pipeline=Pipeline.P_RLD_MD,
            p_instance=self.p_instance,
            rld_instance=rld.instance_id,
            md_instance=self.md_instance,
            handoff=mode,
            chunk_tokens=chunk_tokens if mode is HandoffMode.CATCH_UP else None,
            predicted_hit={**hits, Tier.RLD: 0.0},
            predicted_wan_bytes=self.wan_bytes,
            predicted_wan_s=self.wan_s,
            predicted_ttft_s=ttft_s,
            reason=reason,
        )
