"""One line of requests.jsonl: what happened to a request, and what the router predicted."""

from __future__ import annotations

from dataclasses import asdict, astuple, dataclass
from typing import Any

from policies.admission import Overloaded
from policies.tiers import Tier
from replay.sim.request_state import Leg, SimRequest

__all__ = ["REJECTED", "RequestRecord", "record_fields", "record_of"]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Per-request outcome. Times in seconds from the trace start; None when not reached."""

    request_id: int
    session_id: str | None
    arrival_s: float
    input_length: int
    output_length: int
    decided_pipeline: str
    pipeline: str  # realized: a P-RLD-MD request that ended on RLD early is P-RLD
    reactive: bool  # P-RLD because RLD finished before MD's copy landed (odd traffic)
    handoff: str | None
    handoff_rounds: int
    eager_tokens: int
    p_instance: str
    rld_instance: str | None
    md_instance: str | None
    finished_on: str | None
    ttft_s: float | None  # the first token from the decode side (RLD or MD), as clients see it
    ttft_prefill_s: float | None  # the first token from the prefill side (P's output)
    tpot_s: float | None
    max_gap_s: float | None
    handoff_gap_s: float | None
    e2e_s: float | None
    prefill_queue_s: float
    prefill_s: float
    hit_p: float
    hit_rld: float | None
    hit_md: float | None
    predicted_hit_p: float | None
    predicted_hit_md: float | None
    predicted_wan_s: float
    wan_bytes: float
    transfer_s: float | None
    tokens_rld: int
    tokens_md: int
    rld_busy_s: float | None
    reason: str
    rejected: str | None = None  # the bottleneck admission control refused it for, if it did
    preemptions: int = 0  # times a decode instance ran out of memory and recomputed it later

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _hit(leg: Leg | None, input_length: int) -> float | None:
    if leg is None:
        return None
    return round(leg.hit_tokens / input_length, 6) if input_length else 0.0


def record_of(request: SimRequest) -> RequestRecord:
    """The record of a simulated request (finished or not)."""
    return RequestRecord(*record_fields(request))


def record_fields(request: SimRequest) -> tuple[Any, ...]:
    """The fields of ``record_of(request)`` in their order, without building the record
    (a replay stores them straight into its columns)."""
    if request.rejected is not None:
        return astuple(_rejected_record(request, request.rejected))
    decision = request.decision
    arrival = request.arrival_s
    first, last = request.first_token_s, request.last_token_s
    finished = request.finished_s is not None and first is not None and last is not None
    ttft = e2e = tpot = None
    if finished and first is not None and last is not None:
        # a first token held by a busy server (Frontend.busy_until) may reach the client
        # after the engine produced the rest: they all reach it then
        last = max(last, first)
        ttft = round(first - arrival, 6)
        e2e = round(last - arrival, 6)
        if request.emitted > 1:
            tpot = round((last - first) / (request.emitted - 1), 6)
    predicted = decision.predicted_hit if decision is not None else {}
    rld_busy = None
    if request.rld_start_s is not None and request.rld_end_s is not None:
        rld_busy = round(request.rld_end_s - request.rld_start_s, 6)
    n = request.input_length
    handoff = request.handoff
    # positional, in the order of RequestRecord's fields (keywords cost more to match)
    return (
        request.trace.request_id,
        request.trace.session_id,
        round(arrival, 6),
        n,
        request.output_length,
        str(decision.pipeline) if decision is not None else "",  # decided_pipeline
        str(request.pipeline),
        request.reactive,
        str(handoff) if handoff is not None else None,
        request.handoff_rounds,
        request.eager_tokens,
        request.p.id if request.p is not None else "",  # p_instance
        request.rld.id if request.rld is not None else None,
        request.md.id if request.md is not None else None,
        request.finished_on,
        ttft,
        round(request.prefill_end_s - arrival, 6) if finished else None,  # ttft_prefill_s
        tpot,
        _r(request.max_gap_s) if finished else None,
        _r(request.handoff_gap_s) if handoff is not None else None,
        e2e,
        round(request.prefill_start_s - arrival, 6),  # prefill_queue_s
        round(request.prefill_end_s - request.prefill_start_s, 6),  # prefill_s
        round(request.p_hit_tokens / n, 6) if n else 0.0,  # hit_p
        _hit(request.rld_leg, n),
        _hit(request.md_leg, n),
        _r(predicted.get(Tier.P)),
        _r(predicted.get(Tier.MD)),
        round(decision.predicted_wan_s, 6) if decision is not None else 0.0,
        request.wan_bytes,
        _r(request.transfer_s),
        request.tokens_rld,
        request.tokens_md,
        rld_busy,
        decision.reason if decision is not None else "",
        None,  # rejected
        request.preemptions,
    )


REJECTED = "rejected"
"""The pipeline (and decided pipeline) of a request admission control refused."""


def _rejected_record(request: SimRequest, refused: Overloaded) -> RequestRecord:
    return RequestRecord(
        request_id=request.trace.request_id,
        session_id=request.trace.session_id,
        arrival_s=round(request.arrival_s, 6),
        input_length=request.input_length,
        output_length=request.output_length,
        decided_pipeline=REJECTED,
        pipeline=REJECTED,
        reactive=False,
        handoff=None,
        handoff_rounds=0,
        eager_tokens=0,
        p_instance="",
        rld_instance=None,
        md_instance=None,
        finished_on=None,
        ttft_s=None,
        ttft_prefill_s=None,
        tpot_s=None,
        max_gap_s=None,
        handoff_gap_s=None,
        e2e_s=None,
        prefill_queue_s=0.0,
        prefill_s=0.0,
        hit_p=0.0,
        hit_rld=None,
        hit_md=None,
        predicted_hit_p=None,
        predicted_hit_md=None,
        predicted_wan_s=0.0,
        wan_bytes=0.0,
        transfer_s=None,
        tokens_rld=0,
        tokens_md=0,
        rld_busy_s=None,
        reason=refused.reason,
        rejected=refused.bottleneck.value,
    )
