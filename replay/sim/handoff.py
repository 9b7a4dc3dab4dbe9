"""P-RLD-MD: RLD decodes at once, MD takes over by extend-decode when its copy lands.

When MD's copy of the KV arrives while RLD is decoding, RLD's eager tokens reach MD
as token IDs (one-way latency RTT/2 plus their bytes) and MD recomputes their KV in
one extend step whose cost grows with their number (``StepCosts.extend_s``).

- one-shot: RLD stops at once and is freed; MD extends every eager token; the user
  sees one stall (ID shipping plus the extend).
- catch-up: RLD keeps decoding while MD digests chunks of at most ``chunk_tokens``;
  when MD lacks at most ``catchup_final_tokens`` (or stops gaining), RLD stops and
  MD extends the small remainder: several short stalls instead of one, RLD busy
  longer.

Odd traffic: if RLD emits the last token before MD's copy has landed, the WAN copy
is cancelled and the request ends on RLD (recorded as a reactive P-RLD).
"""

from __future__ import annotations

from collections.abc import Callable

from policies.types import HandoffMode, Pipeline
from replay.presets.schema import HandoffSpec
from replay.sim.cluster import SimCluster
from replay.sim.event_loop import EventLoop
from replay.sim.events import Priority
from replay.sim.request_state import Leg, LegState, SimRequest

__all__ = ["HandoffDriver"]


class HandoffDriver:
    """The state machine of a P-RLD-MD request from its RLD landing to MD's takeover."""

    __slots__ = ("_abort", "_cluster", "_finish", "_loop", "_spec")

    def __init__(
        self,
        loop: EventLoop,
        cluster: SimCluster,
        spec: HandoffSpec,
        abort: Callable[[Leg], None],
        finish: Callable[[SimRequest], None],
    ) -> None:
        self._loop = loop
        self._cluster = cluster
        self._spec = spec
        self._abort = abort
        self._finish = finish

    # -- the two copies land ----------------------------------------------------------

    def rld_landed(self, request: SimRequest) -> None:
        rld_leg, md_leg = _legs(request)
        if request.md_ready:  # MD's copy came first: RLD is not needed
            self._abort(rld_leg)
            md_leg.dest.arrive(md_leg)
        else:
            rld_leg.dest.arrive(rld_leg)

    def md_ready(self, request: SimRequest) -> None:
        request.md_ready = True
        rld_leg, md_leg = _legs(request)
        if rld_leg.running or request.emitted > 0:  # RLD decoded (it may be preempted or
            self._begin(request)  # waiting now): MD takes over what it emitted
        elif rld_leg.state != LegState.CLOSED:  # RLD has not started: go straight to MD
            self._abort(rld_leg)
            md_leg.dest.arrive(md_leg)

    def rld_finished(self, request: SimRequest) -> None:
        """RLD emitted the last token: MD's copy (in flight or landed) is dropped."""
        _, md_leg = _legs(request)
        if not request.md_ready:
            request.reactive = True
            request.pipeline = Pipeline.P_RLD
        self._abort(md_leg)

    # -- the handoff ------------------------------------------------------------------

    def _begin(self, request: SimRequest) -> None:
        decision = request.decision
        mode = decision.handoff if decision is not None and decision.handoff else None
        request.handoff = mode or HandoffMode.ONE_SHOT
        if request.handoff == HandoffMode.ONE_SHOT:
            self._switch(request)
        else:
            self._round(request)

    def _chunk(self, request: SimRequest) -> int:
        decision = request.decision
        chunk = decision.chunk_tokens if decision is not None else None
        return max(chunk or self._spec.default_chunk_tokens, 1)

    def _round(self, request: SimRequest) -> None:
        if request.finished:
            return
        rld_leg, md_leg = _legs(request)
        lack = rld_leg.dest.emitted_now(request) - request.md_have
        spec = self._spec
        if (
            lack <= spec.catchup_final_tokens
            or request.handoff_rounds >= spec.catchup_max_rounds
            or (request.handoff_rounds > 0 and lack >= request.last_lack)
        ):
            self._switch(request)
            return
        chunk = min(lack, self._chunk(request))
        request.last_lack = lack
        request.handoff_rounds += 1
        md = md_leg.dest
        delay = self._ship_s(request, chunk) + md.step_costs.extend_s(
            chunk, request.input_length + request.md_have
        )
        self._loop.after(delay, Priority.HANDOFF, self._digested, (request, chunk))

    def _digested(self, item: tuple[SimRequest, int]) -> None:
        request, chunk = item
        if request.finished:
            return
        request.md_have += chunk
        self._round(request)

    def _switch(self, request: SimRequest) -> None:
        """RLD stops now; MD extends what it lacks, then emits the next token."""
        rld_leg, md_leg = _legs(request)
        rld_leg.dest.leave(rld_leg)
        request.rld_end_s = self._loop.now
        self._abort(rld_leg)
        request.eager_tokens = request.tokens_rld
        if request.emitted >= request.output_length:  # RLD emitted the last token just now
            self._abort(md_leg)
            request.finished_on = rld_leg.dest.id
            self._finish(request)
            return
        lack = request.emitted - request.md_have
        md = md_leg.dest
        delay = self._ship_s(request, lack) + md.step_costs.extend_s(
            lack, request.input_length + request.md_have
        )
        self._loop.after(delay, Priority.HANDOFF, self._takeover, request)

    def _takeover(self, request: SimRequest) -> None:
        _, md_leg = _legs(request)
        request.md_have = request.emitted
        md_leg.dest.arrive(md_leg)

    def _ship_s(self, request: SimRequest, tokens: int) -> float:
        """Token IDs from RLD to MD: one-way latency plus their bytes at full bandwidth."""
        rld_leg, md_leg = _legs(request)
        link = self._cluster.link_between(rld_leg.dest.datacenter, md_leg.dest.datacenter)
        return link.rtt_s / 2 + tokens * self._spec.token_id_bytes / link.bandwidth_bps


def _legs(request: SimRequest) -> tuple[Leg, Leg]:
    rld_leg, md_leg = request.rld_leg, request.md_leg
    if rld_leg is None or md_leg is None:
        raise RuntimeError(f"request {request.key} is not a P-RLD-MD request")
    return rld_leg, md_leg
