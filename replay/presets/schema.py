"""Typed presets of the simulated cluster: hardware, model, pools, links, timing, handoff."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.tiers import Tier

__all__ = [
    "HOURS_PER_MONTH",
    "WAN_PRICE_PER_GBPS_MONTH",
    "ClusterSpec",
    "DecodeRecomputes",
    "EngineName",
    "FittedTiming",
    "FluctuationSpec",
    "HandoffSpec",
    "HardwareSpec",
    "LinkSpec",
    "LinksSpec",
    "MemorySpec",
    "ModelSpec",
    "PerfDbModelSpec",
    "PoolSpec",
    "StepCostSource",
    "StepCostsSpec",
    "TimingSpec",
]


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class HardwareSpec(_Spec):
    """One GPU model: peak dense compute, HBM size and bandwidth, rental price."""

    peak_flops: float = Field(gt=0, description="Dense BF16 FLOP/s of one GPU")
    hbm_bytes: float = Field(gt=0, description="Memory of one GPU in bytes, as its driver reports")
    hbm_bandwidth_bytes_s: float = Field(gt=0, description="HBM bandwidth of one GPU, bytes/s")
    price_per_hour: float = Field(ge=0, description="USD per GPU-hour")
    perfdb_system: str | None = Field(
        None, description="This GPU's system in AIConfigurator's performance database "
        "(h100_sxm, h200_sxm, ...): step costs from measured kernels (step_costs: perfdb)",
    )  # fmt: skip
    source: str = ""


class PerfDbModelSpec(_Spec):
    """How AIConfigurator's performance database knows a model: its Hugging Face name
    (a config the database ships) and the quantization its kernels are priced in."""

    model: str = Field(description="Hugging Face name, e.g. meta-llama/Meta-Llama-3.1-8B")
    gemm_quant: str | None = Field(None, description="GEMM quantization (default: the model's)")
    moe_quant: str | None = Field(None, description="MoE quantization (default: the model's)")
    kv_quant: str | None = Field(None, description="KV-cache quantization (default: the model's)")


class ModelSpec(_Spec):
    """A (MoE) transformer as the roofline needs it."""

    layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    total_params: float = Field(gt=0)
    active_params: float = Field(gt=0, description="Parameters used per token")
    num_experts: int = Field(0, ge=0, description="Routed experts per MoE layer (0: dense)")
    experts_per_token: int = Field(0, ge=0)
    weight_bytes_per_param: float = Field(gt=0)
    kv_bytes_per_token: float = Field(gt=0)
    attention_flops_per_token_pair: float = Field(
        gt=0, description="FLOPs of one query token attending to one context token, all layers"
    )
    perfdb: PerfDbModelSpec | None = Field(
        None, description="The model in AIConfigurator's performance database (step_costs: perfdb)"
    )
    source: str = ""

    @property
    def expert_params(self) -> float:
        """Parameters of one routed expert summed over layers (0 for a dense model)."""
        if self.num_experts <= self.experts_per_token:
            return 0.0
        routed = self.num_experts - self.experts_per_token
        return (self.total_params - self.active_params) / routed

    @property
    def dense_params(self) -> float:
        """Parameters every token uses (attention, shared experts, embeddings)."""
        return self.active_params - self.experts_per_token * self.expert_params

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.weight_bytes_per_param


DecodeRecomputes = Literal["none", "last-token", "partial-block"]


class TimingSpec(_Spec):
    """Efficiency factors and fixed overheads of the roofline, and engine limits."""

    prefill_compute_efficiency: float = Field(0.4, gt=0, le=1)
    prefill_bandwidth_efficiency: float = Field(0.7, gt=0, le=1)
    decode_compute_efficiency: float = Field(0.3, gt=0, le=1)
    decode_bandwidth_efficiency: float = Field(0.6, gt=0, le=1)
    prefill_overhead_s: float = Field(0.01, ge=0, description="Fixed cost of one prefill pass")
    decode_overhead_s: float = Field(0.01, ge=0, description="Fixed cost of one decode step")
    memory_utilization: float = Field(
        0.92, gt=0, le=1, description="Share of HBM for weights + KV (the rest: activations)"
    )
    prefill_batch_tokens: int = Field(
        16384,
        ge=0,
        description="Batch queued prefills up to this many new tokens (0: one at a time)",
    )
    step_tokens: int = Field(
        8192, ge=1, description="Tokens one step of a colocated engine processes: a token per "
        "decoding request, the rest prefill chunks (vLLM's max_num_batched_tokens)",
    )  # fmt: skip
    first_token_on_decode: bool = Field(
        False, description="The client's first token comes from the decode instance's first "
        "step, as through the router (it streams what RLD or MD generate); false: the token "
        "the prefill produced reaches the client when the request joins its decode instance",
    )  # fmt: skip
    decode_recomputes: DecodeRecomputes = Field(
        "none", description="What a decode engine (RLD or MD) computes itself of a prompt "
        "whose KV a transfer brought, in its first pass for the request: a prefill pass over "
        "those tokens (alone, or on top of its batch's step) before the first token, when "
        "that token comes from the decode side (first_token_on_decode). none: the transfer "
        "brings every prompt token's KV and the first pass is a decode step; last-token: "
        "the last prompt token, recomputed for its logits; partial-block: the tokens after "
        "the last whole KV block (kv_block_tokens) before the prompt's last token, which a "
        "connector moving whole blocks only leaves (vLLM's ExampleConnector)",
    )  # fmt: skip
    router_s: float = Field(
        0.0, ge=0, description="The router's time per request before its first token, one "
        "request after another: its own (pdd_router_overhead_seconds) and the way to and "
        "from it (calibrate --router measures both on a running router); a request is "
        "decided and sent to its prefill instance that much after the client sent it, and "
        "a burst waits in line (0: a router that costs nothing)",
    )  # fmt: skip


class MemorySpec(_Spec):
    """How decode instances (RLD, MD) hold KV memory for the requests they run."""

    allocation: Literal["on-demand", "reserve-output"] = Field(
        "on-demand", description="on-demand: as vLLM and SGLang do, a request takes memory "
        "for its prompt when admitted and a block more as it generates; when an instance "
        "runs out, its most recently started request is preempted (its memory freed, "
        "recomputed when there is room again). reserve-output: the request's whole output "
        "is reserved at admission, so nothing is ever preempted and fewer requests run "
        "(the conservative model the replay used at first)",
    )  # fmt: skip


class HandoffSpec(_Spec):
    """Extend-decode handoff costs, calibrated on the paper's 100-token microbenchmark."""

    extend_overhead_s: float = Field(0.05, ge=0, description="Fixed cost of one extend on MD")
    extend_per_token_s: float = Field(0.0025, ge=0, description="Extra cost per eager token")
    token_id_bytes: float = Field(15.0, ge=0, description="Bytes per shipped token ID")
    catchup_final_tokens: int = Field(
        4, ge=0, description="Catch-up switches RLD off once MD lacks at most this many tokens"
    )
    catchup_max_rounds: int = Field(256, ge=1)
    default_chunk_tokens: int = Field(64, ge=1, description="Catch-up chunk when undecided")


class FittedTiming(_Spec):
    """Pass times measured on a real engine (``pdd-router calibrate``) instead of the
    roofline: linear in the work of the pass, fitted by least squares."""

    prefill_overhead_s: float = Field(ge=0, description="Fixed cost of one prefill pass")
    prefill_s_per_token: float = Field(ge=0, description="Per new prompt token")
    prefill_s_per_token_pair: float = Field(
        ge=0, description="Per (new token, context token) pair: attention over the cached "
        "prefix and the new tokens before it",
    )  # fmt: skip
    decode_overhead_s: float = Field(ge=0, description="Fixed cost of one decode step")
    decode_s_per_request: float = Field(ge=0, description="Per request in the step's batch")
    decode_s_per_context_token: float = Field(
        ge=0, description="Per KV token the step's batch attends to"
    )
    frontend_s: float = Field(
        0.0, ge=0, description="A request's time in the engine's server outside its passes "
        "(receiving it, handing it to the engine, sending its first token back), one request "
        "after another: calibrate measures it on the engine's clock. The replay charges it "
        "on every engine call: a colocated or P pool's on arrival, a decode pool's when the "
        "request joins it (after its prefill, or at the handoff)",
    )  # fmt: skip
    probed_prompt_tokens: int | None = Field(
        None, ge=1, description="The longest prompt (cached and new) the calibration sent: "
        "beyond it the fitted costs are extrapolated",
    )  # fmt: skip
    probed_batch: int | None = Field(None, ge=1, description="The largest decode batch probed")
    source: str = ""

    def prefill_pass_s(self, tokens: float, pairs: float) -> float:
        """Work of a pass over ``tokens`` new tokens and ``pairs`` (new, context) pairs,
        without the pass overhead."""
        return self.prefill_s_per_token * tokens + self.prefill_s_per_token_pair * pairs

    def prefill_s(self, items: list[tuple[int, int]]) -> float:
        """One prefill pass over requests given as (new tokens, cached tokens)."""
        tokens = sum(new for new, _ in items)
        pairs = sum(new * cached + 0.5 * new * new for new, cached in items)
        return self.prefill_overhead_s + self.prefill_pass_s(tokens, pairs)

    def decode_step_s(self, batch: float, context_tokens: float) -> float:
        """One decode step of ``batch`` requests holding ``context_tokens`` KV tokens."""
        return (
            self.decode_overhead_s
            + self.decode_s_per_request * batch
            + self.decode_s_per_context_token * context_tokens
        )


StepCostSource = Literal["auto", "perfdb", "roofline", "calibrated"]
EngineName = Literal["vllm", "sglang", "trtllm"]


class StepCostsSpec(_Spec):
    """Where a pool's step costs come from, and what a step costs besides its kernels."""

    source: StepCostSource = Field(
        "auto", description="perfdb: measured kernels from AIConfigurator's performance "
        "database for the GPU, the model's shape, the pool's parallelism and engine; "
        "calibrated: the pool's `fitted` pass times; roofline: datasheet FLOPs and bandwidth "
        "times the timing efficiencies; auto: calibrated when fitted, else perfdb where the "
        "database covers the GPU, model and engine, else roofline (the reason is printed)",
    )  # fmt: skip
    engine: EngineName = Field("vllm", description="The serving engine the database prices")
    engine_version: str | None = Field(
        None, description="The engine version's tables (default: the database's default)"
    )
    step_overhead_s: float = Field(
        0.0, ge=0, description="Per-step framework time added to the database's kernels "
        "(scheduling, sampling, detokenizing)",
    )  # fmt: skip
    dispatch_s_per_layer: float | None = Field(
        None, ge=0, description="Per-layer CPU dispatch time each request waits before its "
        "prefill (latency, not engine time), which kernel measurements do not see "
        "(default: the engine's; vLLM 0.8 ms per layer, AIConfigurator's fit to its silicon "
        "runs; 0 for the others)",
    )  # fmt: skip


class PoolSpec(_Spec):
    """A pool of identical instances of one tier in one datacenter."""

    tier: Tier
    datacenter: str
    hardware: str
    instances: int = Field(ge=0)
    gpus_per_instance: int = Field(ge=1)
    kv_capacity_tokens: int | None = Field(
        None, ge=0, description="Explicit KV pool per instance (default: from HBM minus weights)"
    )
    max_batch: int = Field(256, ge=1, description="Most requests decoding at once")
    kv_block_tokens: int | None = Field(
        None, ge=1, description="The engines' KV block (page) size in tokens: their prefix "
        "cache serves whole blocks, and a request holds its last block whole (vLLM: 16 on "
        "GPUs by default, 128 on the CPU; `calibrate` reads it from the engine). Default: "
        "the trace's block size, a request's tokens counted exactly",
    )  # fmt: skip
    colocated: bool = Field(
        False, description="Each instance prefills and decodes its requests (one engine, "
        "chunked prefill, as most deployments run vLLM or SGLang today); a P pool only, "
        "the cluster's only pool, routed by the `colocated` policy",
    )  # fmt: skip
    fitted: FittedTiming | None = Field(
        None, description="Measured pass times of this pool's engines (`pdd-router "
        "calibrate`); used when step_costs.source is calibrated or auto",
    )  # fmt: skip
    step_costs: StepCostsSpec = Field(
        default_factory=StepCostsSpec, description="Where the pool's step costs come from"
    )
    moe_ep: int | None = Field(
        None, ge=1, description="Expert parallelism of a MoE model's experts across the "
        "instance's GPUs (default: all of them; attention is tensor-parallel over them)",
    )  # fmt: skip

    @model_validator(mode="after")
    def _calibrated_needs_fitted(self) -> PoolSpec:
        if self.moe_ep is not None and self.gpus_per_instance % self.moe_ep:
            raise ValueError(f"moe_ep {self.moe_ep} must divide gpus_per_instance "
                             f"{self.gpus_per_instance}")  # fmt: skip
        if self.step_costs.source == "calibrated" and self.fitted is None:
            raise ValueError("step_costs.source is calibrated but the pool has no `fitted` "
                             "pass times (run `pdd-router calibrate`)")  # fmt: skip
        return self


class FluctuationSpec(_Spec):
    """Piecewise-constant bandwidth multiplier drawn uniformly every period (seeded)."""

    period_s: float = Field(gt=0)
    low: float = Field(gt=0, le=1)
    high: float = Field(gt=0, le=1)


HOURS_PER_MONTH = 730.0
"""Hours in the month a line is priced by (8,760 h / 12)."""

WAN_PRICE_PER_GBPS_MONTH = 72.4
"""Default line price, USD per Gbps per month: TeleGeography's weighted median lease of a
10 Gbps wavelength on Frankfurt-London, 724 USD a month (blog.telegeography.com,
"Global Bandwidth Prices Are Converging (Somewhat)"): a short terrestrial route between
two hubs, like a line between two datacenters of one region."""


class LinkSpec(_Spec):
    """A network link: bandwidth shared by its transfers, round-trip time, line price.

    The line is priced per Gbps of its bandwidth per month (``price_per_gbps_month``,
    converted at 730 h a month) or as a whole per hour (``price_per_hour``, as older
    presets do); when both are given, ``price_per_hour`` wins.
    """

    bandwidth_gbps: float = Field(ge=0)
    rtt_s: float = Field(ge=0)
    price_per_gbps_month: float | None = Field(
        None, ge=0, description="USD per Gbps of bandwidth per month (730 h)"
    )
    price_per_hour: float | None = Field(
        None, ge=0, description="USD per hour for the whole line; wins over price_per_gbps_month"
    )
    fluctuation: FluctuationSpec | None = None

    def hourly_price(self) -> float:
        """USD per hour of the line: ``price_per_hour`` when given, else bandwidth times
        ``price_per_gbps_month`` over 730 h, else free."""
        if self.price_per_hour is not None:
            return self.price_per_hour
        if self.price_per_gbps_month is not None:
            return self.bandwidth_gbps * self.price_per_gbps_month / HOURS_PER_MONTH
        return 0.0


class LinksSpec(_Spec):
    """RDMA inside each datacenter; the WAN between A and B (absent for one datacenter)."""

    rdma: LinkSpec
    wan: LinkSpec | None = None


class ClusterSpec(_Spec):
    """A whole simulated deployment (one YAML file under presets/clusters/)."""

    description: str = ""
    default_policy: str
    model: str
    pools: dict[str, PoolSpec]
    links: LinksSpec
    timing: TimingSpec = TimingSpec()
    handoff: HandoffSpec = HandoffSpec()
    memory: MemorySpec = MemorySpec()

    @model_validator(mode="after")
    def _colocated_alone(self) -> ClusterSpec:
        colocated = [name for name, pool in self.pools.items() if pool.colocated]
        for name in colocated:
            if self.pools[name].tier is not Tier.P:
                raise ValueError(f"pool {name!r} is colocated: its tier must be p")
        if colocated and len(self.pools) > 1:
            others = ", ".join(sorted(set(self.pools) - set(colocated)))
            raise ValueError(
                f"pool {colocated[0]!r} is colocated: it serves whole requests and cannot "
                f"share the cluster with other pools ({others})"
            )
        return self

    @property
    def colocated(self) -> bool:
        """Whether the cluster's instances each prefill and decode (no disaggregation)."""
        return any(pool.colocated for pool in self.pools.values())
