"""Typed policy parameters: one pydantic model per policy, discriminated by ``kind``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["IdcPdParams", "PddParams", "PolicyConfig", "XdcPdParams"]


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


PolicyConfig = Annotated[IdcPdParams | XdcPdParams | PddParams, Field(discriminator="kind")]
