"""The simulator's half of the decision-log join: what happened to each decided request."""

from __future__ import annotations

from policies.tiers import Tier
from replay.sim.request_state import Leg, SimRequest
from router.predictor.outcome import DecisionOutcome

__all__ = ["outcome_of"]


def _leg_hit(leg: Leg | None, n: int) -> float | None:
    """Cached share of the prompt on the leg's destination when its memory was granted;
    None if the copy never got memory (cancelled while waiting) or did not reuse the cache."""
    if leg is None or leg.link is None or not leg.reuse_cache:
        return None
    return leg.hit_tokens / n if n else 0.0


def outcome_of(request: SimRequest) -> DecisionOutcome:
    """Realized hit per tier, instances, output length, TTFT and transfer of a request."""
    n = request.input_length
    hits: dict[Tier, float] = {Tier.P: request.p_hit_tokens / n if n else 0.0}
    instances: dict[Tier, str] = {}
    if request.p is not None:
        instances[Tier.P] = request.p.id
    for tier, leg in ((Tier.MD, request.md_leg), (Tier.RLD, request.rld_leg)):
        hit = _leg_hit(leg, n)
        if hit is not None and leg is not None:
            hits[tier] = hit
            instances[tier] = leg.dest.id
    ttft = None
    if request.first_token_s is not None:
        ttft = request.first_token_s - request.arrival_s
    return DecisionOutcome(
        request_id=str(request.key),
        session_id=request.trace.session_id,
        realized_hit={t: round(h, 6) for t, h in hits.items()},
        instances=instances,
        output_tokens=request.output_length,
        ttft_s=None if ttft is None else round(ttft, 6),
        transfer_s=None if request.transfer_s is None else round(request.transfer_s, 6),
        wan_bytes=request.wan_bytes,
        pipeline=str(request.pipeline),
        finished_s=request.finished_s,
    )
