"""What the PDD policies (`pdd`, `pdd-adaptive`) share about their pipelines.

Both finish odd traffic on RLD (P-RLD), predict an RLD-served TTFT the same way (the
prefill, the KV over RDMA, one decode step), and describe a request that goes to MD
(P-MD or P-RLD-MD) with the same fields.
"""

from __future__ import annotations

from typing import Any

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

__all__ = ["finish_on_rld", "md_fields", "relay_then_md", "relay_ttft_s"]


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


def md_fields(policy: str, p: InstanceLoad, md: Placement, wan_s: float) -> dict[str, Any]:
    """The Decision fields of a request whose KV goes to the main-decode instance ``md``."""
    return {
        "policy": policy,
        "p_instance": p.instance_id,
        "md_instance": md.instance.instance_id,
        "predicted_wan_bytes": md.transfer_bytes,
        "predicted_wan_s": wan_s,
    }


def relay_then_md(
    rld: InstanceLoad,
    mode: HandoffMode,
    chunk_tokens: int,
    hits: dict[Tier, float],
    ttft_s: float,
    reason: str,
    fields: dict[str, Any],
) -> Decision:
    """P-RLD-MD: RLD streams the first tokens while the KV travels to MD, then hands off
    (``chunk_tokens`` is the catch-up chunk; one-shot has none). ``fields``: ``md_fields``."""
    return Decision(
        pipeline=Pipeline.P_RLD_MD,
        rld_instance=rld.instance_id,
        handoff=mode,
        chunk_tokens=chunk_tokens if mode is HandoffMode.CATCH_UP else None,
        predicted_hit={**hits, Tier.RLD: 0.0},
        predicted_ttft_s=ttft_s,
        reason=reason,
        **fields,
    )
