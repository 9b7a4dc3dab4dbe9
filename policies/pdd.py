"""`pdd`: the PDD design's choice of pipeline and handoff mode per request."""

from __future__ import annotations

from policies.config import PddParams
from policies.estimates import hit_tokens
from policies.relay import MdRoute, finish_on_rld, relay_ttft_s
from policies.selection import choose_least_loaded, choose_main_decode, choose_prefill
from policies.tiers import Tier
from policies.types import (
    ClusterView,
    Decision,
    HandoffMode,
    Matches,
    RequestView,
)

__all__ = ["PddPolicy"]


class PddPolicy:
    """P-MD when the WAN delta fits the budget, P-RLD-MD when not, P-RLD for odd traffic.

    Odd traffic is recognized from what is known at arrival: a long prompt with a
    small ``max_tokens``. Handoff is catch-up while the chosen RLD has room and
    one-shot when it is busy; a saturated RLD pool sends requests to P-MD instead.
    """

    name = "pdd"

    def __init__(self, params: PddParams) -> None:
        self.params = params

    def _is_odd(self, request: RequestView) -> bool:
        return (
            request.max_tokens is not None
            and request.max_tokens <= self.params.odd_max_output
            and request.input_length >= self.params.odd_min_input
        )

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        prm = self.params
        n = max(request.input_length, 1)
        p, p_blocks, p_delay = choose_prefill(request, cluster, matches.get(Tier.P, {}))
        rld = choose_least_loaded(cluster, Tier.RLD)
        rld_room = rld is not None and rld.occupancy < prm.rld_saturation
        rld_ttft = relay_ttft_s(request, cluster, p_delay)
        hits = {Tier.P: hit_tokens(request, p_blocks, p) / n}

        if self._is_odd(request) and rld is not None and rld_room:
            why = (
                f"odd traffic: {request.input_length} input tokens, max_tokens {request.max_tokens}"
            )
            return finish_on_rld(self.name, p, rld, hits, rld_ttft, why)

        md = choose_main_decode(request, cluster, p, matches, load_weight_s=prm.load_weight_s)
        hits[Tier.MD] = hit_tokens(request, md.hit_blocks, md.instance) / n
        route = MdRoute.of(self.name, p, md, md.transfer_s)
        if md.transfer_s <= prm.wan_budget_s or rld is None or not rld_room:
            why = (
                f"WAN delta {md.transfer_s:.2f}s within budget {prm.wan_budget_s:.2f}s"
                if md.transfer_s <= prm.wan_budget_s
                else f"WAN delta {md.transfer_s:.2f}s over budget but RLD saturated"
            )
            return route.direct(hits, p_delay + md.transfer_s + cluster.decode_step_s, why)
        mode = HandoffMode.CATCH_UP if rld.occupancy < prm.catch_up_below else HandoffMode.ONE_SHOT
        why = (
            f"WAN delta {md.transfer_s:.2f}s over budget {prm.wan_budget_s:.2f}s: "
            f"RLD masks it ({mode.value}, RLD occupancy {rld.occupancy:.2f})"
        )
        return route.relay_then_md(rld, mode, prm.chunk_tokens, hits, rld_ttft, why)
