"""`colocated`: one engine prefills and decodes each request (no disaggregation).

What most deployments run today, and what a prefix-aware load balancer in front of them
(production-stack, llm-d's scheduler, SGLang's cache-aware router) decides: the engine
that would start this prompt first, counting the prefix it already holds and the prompt
tokens queued ahead, plus a penalty for the requests it is already running."""

from __future__ import annotations

from policies.config import ColocatedParams
from policies.estimates import hit_tokens, prefill_delay_s
from policies.tiers import Tier
from policies.types import ClusterView, Decision, InstanceLoad, Matches, Pipeline, RequestView

__all__ = ["ColocatedPolicy"]


class ColocatedPolicy:
    """Every request on one colocated engine (the instances of the P pool)."""

    name = "colocated"

    def __init__(self, params: ColocatedParams) -> None:
        self.params = params

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        held = matches.get(Tier.P, {})
        best: tuple[float, str, InstanceLoad, int] | None = None
        for inst in cluster.pool(Tier.P):
            hit = hit_tokens(request, held.get(inst.instance_id, 0), inst)
            delay = prefill_delay_s(inst, request.input_length - hit, cluster)
            score = delay + self.params.load_weight_s * inst.occupancy
            if best is None or (score, inst.instance_id) < (best[0], best[1]):
                best = (score, inst.instance_id, inst, hit)
        if best is None:
            raise LookupError("no healthy engine")
        _, instance_id, chosen, chosen_hit = best
        return Decision(
            policy=self.name,
            pipeline=Pipeline.COLOCATED,
            p_instance=instance_id,
            predicted_hit={Tier.P: chosen_hit / max(request.input_length, 1)},
            predicted_ttft_s=prefill_delay_s(chosen, request.input_length - chosen_hit, cluster),
            reason="colocated: the engine that starts this prompt first, and least busy",
        )
