"""Typed policy parameters: one pydantic model per policy, discriminated by ``kind``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "ColocatedParams",
    "IdcPdParams",
    "PddAdaptiveParams",
    "PddParams",
    "PolicyConfig",
    "XdcPdDrcParams",
    "XdcPdParams",
]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    load_weight_s: float = Field(
        1.0, ge=0, description="Seconds of predicted delay one fully busy decode instance is worth"
    )


class IdcPdParams(_Params):
    """Intra-datacenter PD: prefill and decode in one datacenter, KV over RDMA."""

    kind: Literal["idc-pd"] = "idc-pd"


class XdcPdParams(_Params):
    """Naive cross-datacenter PD: every request P-MD, the full prompt KV over the WAN."""

    kind: Literal["xdc-pd"] = "xdc-pd"


class XdcPdDrcParams(_Params):
    """Cross-datacenter PD with a decode-side prefix cache (DRC) and no RLD: every request
    P-MD, only the blocks MD lacks over the WAN."""

    kind: Literal["xdc-pd-drc"] = "xdc-pd-drc"


class ColocatedParams(_Params):
    """Colocated engines: each request prefilled and decoded on one instance."""

    kind: Literal["colocated"] = "colocated"


class PddParams(_Params):
    """PDD: P-MD when the WAN delta is cheap, P-RLD-MD otherwise, P-RLD for odd traffic."""

    kind: Literal["pdd"] = "pdd"
    wan_budget_s: float = Field(
        1.0, gt=0, description="Largest predicted WAN transfer time a P-MD request may wait for"
    )
    rld_saturation: float = Field(
        0.9, gt=0, le=1, description="RLD occupancy at which new requests fall back to P-MD"
    )
    catch_up_below: float = Field(
        0.5, ge=0, le=1, description="RLD occupancy under which handoffs use catch-up"
    )
    chunk_tokens: int = Field(64, gt=0, description="Catch-up chunk size in tokens")
    odd_min_input: int = Field(
        32_768, gt=0, description="Input length from which a short-output request is odd traffic"
    )
    odd_max_output: int = Field(
        500, gt=0, description="Largest max_tokens of odd traffic (finished on RLD)"
    )


class PddAdaptiveParams(_Params):
    """PDD that adapts to load and to the WAN: a WAN budget from the TTFT objective and the
    predicted prefill, backlog-aware borderline moves to P-RLD-MD, handoff mode by RLD load."""

    kind: Literal["pdd-adaptive"] = "pdd-adaptive"
    ttft_objective_s: float = Field(
        2.0, gt=0, description="TTFT a P-MD request should meet: its WAN budget is this minus "
        "the predicted prefill and one decode step",
    )  # fmt: skip
    min_wan_budget_s: float = Field(
        1.0, ge=0, description="Smallest WAN budget, however long the predicted prefill (a "
        "prefill queue is not shortened by sending requests to RLD)",
    )  # fmt: skip
    backlog_guard_s: float = Field(
        1.0, ge=0, description="WAN backlog (seconds to drain) from which borderline requests "
        "move to P-RLD-MD",
    )  # fmt: skip
    borderline_share: float = Field(
        0.5, ge=0, le=1, description="A request is borderline when its WAN time exceeds this "
        "share of its budget",
    )  # fmt: skip
    borderline_max_rld_load: float = Field(
        0.5, ge=0, le=1, description="Borderline requests move to P-RLD-MD only while RLD's "
        "load is under this (RLD has room to spare)",
    )  # fmt: skip
    rld_saturation: float = Field(
        0.85, gt=0, le=1, description="RLD load (largest of batch and KV occupancy) at which "
        "requests fall back to P-MD",
    )  # fmt: skip
    fallback_max_wan_s: float = Field(
        5.0, gt=0, description="A saturated RLD sends a request to P-MD only if its predicted "
        "WAN time is within this; beyond it the request queues on RLD (its MD copy still "
        "travels, so it is never later than P-MD)",
    )  # fmt: skip
    catch_up_below: float = Field(
        0.5, ge=0, le=1, description="RLD load under which handoffs use catch-up (auto mode)"
    )
    handoff_mode: Literal["auto", "one-shot", "catch-up"] = Field(
        "auto", description="auto: catch-up while RLD has room, one-shot when it is busy"
    )
    chunk_tokens: int = Field(64, gt=0, description="Catch-up chunk size in tokens")
    expected_output: int = Field(
        512, gt=0, description="Output tokens assumed when neither max_tokens nor the session "
        "history tells (RLD memory check)",
    )  # fmt: skip
    odd_min_input: int = Field(
        32_768, gt=0, description="Input length from which a short-output request is odd traffic"
    )
    odd_max_output: int = Field(
        500, gt=0, description="Largest max_tokens (or session mean output) of odd traffic"
    )
    odd_unhinted: bool = Field(
        True, description="Treat a long input with no max_tokens and no session history as odd"
    )
    odd_min_wan_s: float = Field(
        0.5, ge=0, description="Finish odd traffic on RLD only when the WAN copy would take "
        "at least this long",
    )  # fmt: skip
    admit_ttft_s: float | None = Field(
        8.0, gt=0, description="Refuse a request whose predicted time to first token exceeds "
        "this (429 with Retry-After live, a counted rejection in replay); keep it under the "
        "SLA's TTFT. null admits every request",
    )  # fmt: skip
    max_wan_backlog_s: float = Field(
        4.0, gt=0, description="Largest WAN backlog (seconds to drain, the request's own "
        "bytes included) a request may join: past it the request is finished on RLD while "
        "RLD has room; otherwise it takes the line, and admission control judges its "
        "predicted first token",
    )  # fmt: skip


PolicyConfig = Annotated[
    IdcPdParams | XdcPdParams | XdcPdDrcParams | PddParams | PddAdaptiveParams | ColocatedParams,
    Field(discriminator="kind"),
]
