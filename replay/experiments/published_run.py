"""One published run of a real engine (AIConfigurator's silicon sample): its deployment,
workload and measured means."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

__all__ = ["PublishedRun"]


class PublishedRun(BaseModel):
    """One measured run at a fixed concurrency: a single engine (``mode`` agg, ``tp``) or
    a prefill and a decode pool (``disagg``, the ``prefill_*`` and ``decode_*`` sizes)."""

    id: str
    engine: Literal["vllm", "sglang", "trtllm"]
    engine_version: str | None = None
    model: str  # the project's model preset
    model_path: str
    hardware: str
    quant: str
    mode: Literal["agg", "disagg"]
    isl: int
    osl: int
    concurrency: int | None
    tp: int | None
    # a disaggregated run's pools: workers, tensor parallelism and batch of each
    prefill_workers: int | None = None
    prefill_tp: int | None = None
    prefill_batch: int | None = None
    decode_workers: int | None = None
    decode_tp: int | None = None
    decode_batch: int | None = None
    ttft_ms: float
    tpot_ms: float
    measured: str | None = None
