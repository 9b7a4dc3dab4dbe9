"""`pdd-adaptive`: PDD whose pipeline and handoff choices follow the WAN and RLD's load.

Against the paper's `pdd` (a fixed WAN budget):

- the WAN time is predicted as the delta bytes over the link's current share plus the
  RTT, and compared with a budget derived from the TTFT objective minus the predicted
  prefill (queue included) and one decode step;
- when the WAN backlog grows, borderline requests (over a share of their budget) move
  to P-RLD-MD before the link is saturated, while RLD has room to spare;
- RLD's load is the larger of its batch and its KV occupancy; a saturated RLD (or one
  without memory for the request) sends requests to P-MD instead of queueing them, as
  long as its predicted WAN time stays within ``fallback_max_wan_s`` (a request whose
  WAN copy would take longer still queues on RLD: its MD copy travels meanwhile);
- handoff is catch-up while RLD has room and one-shot when it is busy;
- odd traffic (long input, short output) is recognized from ``max_tokens`` when given,
  else from the session's earlier outputs, and finished on RLD only when the WAN copy
  would be slow.

Past the deployment's capacity it degrades gracefully instead of letting a queue grow
(``policies.admission``): a request that would join a WAN backlog longer than
``max_wan_backlog_s`` is finished on RLD while RLD has room; a request whose predicted
first token misses ``admit_ttft_s`` (the prefill queue; with RLD full, a WAN copy slowed
by the transfers sharing the line, or a wait for a slot on a full MD, ``decode_wait``)
is refused with ``Overloaded`` rather than queued; one that would miss it waiting for
MD is finished on RLD while RLD has room.

Predicted hits arrive through ``matches``: with a model configured the scheduler gives
the expected number of leading blocks still held when the request is served.
"""

from __future__ import annotations

from policies.admission import Bottleneck, Overloaded
from policies.config import PddAdaptiveParams
from policies.decode_wait import slot_wait_s
from policies.estimates import Placement, hit_tokens
from policies.relay import MdRoute, finish_on_rld, relay_ttft_s
from policies.selection import choose_main_decode, choose_prefill
from policies.tiers import Tier
from policies.types import (
    ClusterView,
    Decision,
    HandoffMode,
    InstanceLoad,
    LinkState,
    Matches,
    Pipeline,
    RequestView,
)

__all__ = ["PddAdaptivePolicy", "rld_load", "wan_time_s"]


def rld_load(instance: InstanceLoad) -> float:
    """Load of a relay-decode instance: the larger of its batch and its KV occupancy, the
    requests already on their way to it included."""
    capacity = instance.kv_capacity_tokens
    kv = (instance.kv_used_tokens + instance.pending_tokens) / capacity if capacity else 1.0
    slots = instance.running + instance.queued + instance.pending
    batch = min(slots / instance.max_batch, 1.0) if instance.max_batch else 1.0
    return max(batch, min(kv, 1.0))


def wan_time_s(link: LinkState, nbytes: float) -> float:
    """Predicted transfer time: the bytes over the share a new transfer gets, plus the RTT."""
    if nbytes <= 0:
        return 0.0
    return nbytes / link.share_bps() + link.rtt_s


class PddAdaptivePolicy:
    """P-MD within the TTFT-derived WAN budget, P-RLD-MD beyond it or when the WAN backs up."""

    name = "pdd-adaptive"

    def __init__(self, params: PddAdaptiveParams) -> None:
        self.params = params

    # -- what is known at arrival ---------------------------------------------------

    def expected_output(self, request: RequestView) -> int:
        """Output tokens to plan for: max_tokens, else the session's mean, else the default."""
        if request.max_tokens is not None:
            return request.max_tokens
        history = request.history
        if history is not None and history.mean_output is not None:
            return max(round(history.mean_output), 1)
        return self.params.expected_output

    def is_odd(self, request: RequestView) -> bool:
        """Long input with a short output, judged from what is known at arrival."""
        prm = self.params
        if request.input_length < prm.odd_min_input:
            return False
        if request.max_tokens is not None:
            return request.max_tokens <= prm.odd_max_output
        history = request.history
        if history is not None and history.mean_output is not None:
            return history.mean_output <= prm.odd_max_output
        return prm.odd_unhinted

    def _handoff(self, load: float) -> HandoffMode:
        mode = self.params.handoff_mode
        if mode == "one-shot":
            return HandoffMode.ONE_SHOT
        if mode == "catch-up" or load < self.params.catch_up_below:
            return HandoffMode.CATCH_UP
        return HandoffMode.ONE_SHOT

    # -- the decision ---------------------------------------------------------------

    def decide(self, request: RequestView, cluster: ClusterView, matches: Matches) -> Decision:
        decision, p_delay = self._route(request, cluster, matches)
        admit = self.params.admit_ttft_s
        if admit is None or decision.predicted_ttft_s <= admit:
            return decision
        ttft = decision.predicted_ttft_s
        alone = self._alone_s(request, cluster, decision, p_delay)
        if p_delay + cluster.decode_step_s > admit:
            bottleneck = Bottleneck.PREFILL
        elif decision.pipeline is Pipeline.P_MD:
            md_wait = ttft - p_delay - decision.predicted_wan_s - cluster.decode_step_s
            bottleneck = Bottleneck.MD if md_wait > decision.predicted_wan_s else Bottleneck.WAN
        else:
            bottleneck = Bottleneck.RLD
        raise Overloaded(
            self.name, bottleneck, ttft - admit,
            f"predicted first token {ttft:.2f}s ({decision.pipeline.value}: prefill "
            f"{p_delay:.2f}s), over the admission limit {admit:.2f}s",
            alone_s=alone if alone > admit else None,
        )  # fmt: skip

    def _alone_s(
        self, request: RequestView, cluster: ClusterView, decision: Decision, p_delay: float
    ) -> float:
        """The request's first token with nothing ahead of it: its own prefill and one
        step, plus its own copy over the line when no RLD instance could ever hold it."""
        p = next(i for i in cluster.pool(Tier.P) if i.instance_id == decision.p_instance)
        own = p_delay - p.queued_prefill_tokens / cluster.prefill_tokens_per_s
        own += cluster.decode_step_s
        need = request.input_length + self.expected_output(request)
        if any(i.kv_capacity_tokens >= need for i in cluster.pool(Tier.RLD)):
            return own  # RLD finishes it once it has room, without the line
        if cluster.wan is not None and cluster.wan.bandwidth_bps > 0:
            own += decision.predicted_wan_bytes / cluster.wan.bandwidth_bps
        return own

    def _md_ttft(
        self, cluster: ClusterView, md: Placement, p_delay: float, wan_s: float
    ) -> tuple[float, float]:
        """The first token from MD, and its part spent waiting for a slot there: the
        prefill, the copy (sharing the line with the transfers ahead of it: the larger
        of the two estimates), a slot on MD when it is full, and one step."""
        copied = p_delay + max(wan_s, md.transfer_s)
        life_s = self.params.expected_output * (md.instance.step_s or cluster.decode_step_s)
        slot_s = slot_wait_s(md.instance, life_s, copied)
        return copied + slot_s + cluster.decode_step_s, slot_s

    def _route(
        self, request: RequestView, cluster: ClusterView, matches: Matches
    ) -> tuple[Decision, float]:
        """The decision, before admission control, and the predicted prefill delay."""
        prm = self.params
        n = max(request.input_length, 1)
        p, p_blocks, p_delay = choose_prefill(request, cluster, matches.get(Tier.P, {}))
        rld: InstanceLoad | None = None
        load = 1.0
        for inst in cluster.pool(Tier.RLD):  # the least loaded (ties by id)
            inst_load = rld_load(inst)
            if rld is None or (inst_load, inst.instance_id) < (load, rld.instance_id):
                rld, load = inst, inst_load
        need = request.input_length + self.expected_output(request)
        rld_room = (
            rld is not None and load < prm.rld_saturation and rld.kv_uncommitted_tokens >= need
        )
        rld_ttft = relay_ttft_s(request, cluster, p_delay)
        hits = {Tier.P: hit_tokens(request, p_blocks, p) / n}

        md = choose_main_decode(request, cluster, p, matches, load_weight_s=prm.load_weight_s)
        hits[Tier.MD] = hit_tokens(request, md.hit_blocks, md.instance) / n
        crosses = cluster.wan is not None and md.instance.datacenter != p.datacenter
        link = cluster.wan if crosses and cluster.wan is not None else cluster.rdma
        wan_s = wan_time_s(link, md.transfer_bytes)
        backlog_s = link.backlog_bytes / link.bandwidth_bps if link.bandwidth_bps else 0.0

        if rld is not None and rld_room and wan_s >= prm.odd_min_wan_s and self.is_odd(request):
            why = (
                f"odd traffic: {request.input_length} input tokens, expected output "
                f"{self.expected_output(request)}, WAN copy {wan_s:.2f}s"
            )
            return finish_on_rld(self.name, p, rld, hits, rld_ttft, why), p_delay

        after_s = (link.backlog_bytes + md.transfer_bytes) / link.bandwidth_bps if crosses else 0.0
        if after_s > prm.max_wan_backlog_s and rld is not None and rld_room:
            why = (
                f"WAN backlog {after_s:.1f}s with this request, over "
                f"{prm.max_wan_backlog_s:g}s: RLD finishes it"
            )
            return finish_on_rld(self.name, p, rld, hits, rld_ttft, why), p_delay

        budget = max(prm.ttft_objective_s - p_delay - cluster.decode_step_s, prm.min_wan_budget_s)
        borderline = (
            wan_s > prm.borderline_share * budget
            and backlog_s >= prm.backlog_guard_s
            and load < prm.borderline_max_rld_load
        )
        route = MdRoute.of(self.name, p, md, wan_s)
        md_ttft, slot_s = self._md_ttft(cluster, md, p_delay, wan_s)
        late = prm.admit_ttft_s is not None and md_ttft > prm.admit_ttft_s
        if slot_s > 0 and late and rld is not None and rld_room:
            why = f"MD full: {slot_s:.1f}s for a slot there, first token {md_ttft:.2f}s"
            return finish_on_rld(
                self.name, p, rld, hits, rld_ttft, why + ": RLD finishes it"
            ), p_delay
        tolerable = wan_s <= prm.fallback_max_wan_s
        if prm.admit_ttft_s is not None and not rld_room:
            tolerable = True  # RLD's queue is never the answer: P-MD, or refused if too late
        if (wan_s <= budget and not borderline) or rld is None or (not rld_room and tolerable):
            if wan_s <= budget and not borderline:
                why = f"WAN {wan_s:.2f}s within budget {budget:.2f}s"
            else:
                why = f"WAN {wan_s:.2f}s over budget {budget:.2f}s but RLD load {load:.2f}"
            return route.direct(hits, md_ttft, why), p_delay
        mode = self._handoff(load)
        why = (
            f"WAN {wan_s:.2f}s over budget {budget:.2f}s"
            if wan_s > budget
            else f"WAN {wan_s:.2f}s borderline (budget {budget:.2f}s) with {backlog_s:.1f}s backlog"
        )
        reason = (
            f"{why}: RLD masks it ({mode.value}, RLD load {load:.2f})"
            if rld_room
            else f"{why}: queued on RLD (load {load:.2f}), too long for P-MD"
        )
        decision = route.relay_then_md(rld, mode, prm.chunk_tokens, hits, rld_ttft, reason)
        return decision, p_delay
