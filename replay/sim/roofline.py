"""Prefill, decode-step and extend times of one instance from a roofline model.

A forward pass takes a fixed overhead plus the larger of its compute time (FLOPs
over the instance's peak times an efficiency) and its memory time (bytes moved over
the HBM bandwidth times an efficiency). FLOPs: ``2 * active_params`` per token plus
``attention_flops_per_token_pair`` for every (query, context) pair, so attention
grows with context. Bytes: the weights a pass touches (the dense part always; of the
routed experts, the share a batch of ``t`` tokens activates,
``1 - (1 - k/E)**t``) plus the KV cache read and written.

A pool calibrated on a real engine (``PoolSpec.fitted``) uses its measured linear costs
instead: a prefill pass costs an overhead plus a cost per new token and per (new,
context) token pair, a decode step an overhead plus a cost per request and per context
token.
"""

from __future__ import annotations

import math

from replay.presets.schema import FittedTiming, HandoffSpec, HardwareSpec, ModelSpec, TimingSpec

__all__ = ["Roofline"]


class Roofline:
    """Timing of one instance: hardware times GPU count, one model, efficiency factors."""

    __slots__ = (
        "_active2",
        "_all_experts_from",
        "_attn",
        "_bpp",
        "_decode_bw",
        "_decode_flops",
        "_decode_overhead",
        "_dense_bytes",
        "_expert_bytes",
        "_extend_overhead",
        "_extend_per_token",
        "_fitted",
        "_kv",
        "_miss",
        "_prefill_bw",
        "_prefill_flops",
        "_prefill_overhead",
        "gpus",
    )

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        gpus: int,
        timing: TimingSpec,
        handoff: HandoffSpec,
        fitted: FittedTiming | None = None,
    ) -> None:
        self.gpus = gpus
        self._fitted = fitted
        flops = gpus * hardware.peak_flops
        bandwidth = gpus * hardware.hbm_bandwidth_bytes_s
        self._prefill_flops = flops * timing.prefill_compute_efficiency
        self._prefill_bw = bandwidth * timing.prefill_bandwidth_efficiency
        self._decode_flops = flops * timing.decode_compute_efficiency
        self._decode_bw = bandwidth * timing.decode_bandwidth_efficiency
        self._prefill_overhead = timing.prefill_overhead_s
        self._decode_overhead = timing.decode_overhead_s
        self._extend_overhead = handoff.extend_overhead_s
        self._extend_per_token = handoff.extend_per_token_s
        self._active2 = 2.0 * model.active_params
        self._attn = model.attention_flops_per_token_pair
        self._kv = model.kv_bytes_per_token
        self._bpp = model.weight_bytes_per_param
        self._dense_bytes = model.dense_params * model.weight_bytes_per_param
        self._expert_bytes = (
            model.total_params - model.dense_params
        ) * model.weight_bytes_per_param
        # probability that a token leaves a given routed expert unused
        self._miss = 1.0 - model.experts_per_token / model.num_experts if model.num_experts else 0.0
        # from this many tokens on every expert is touched (to within 1e-12): skip the power
        self._all_experts_from = (
            math.log(1e-12) / math.log(self._miss) if 0.0 < self._miss < 1.0 else 0.0
        )

    def weight_bytes(self, tokens: float) -> float:
        """Weight bytes one pass over ``tokens`` tokens reads."""
        if tokens >= self._all_experts_from:
            return self._dense_bytes + self._expert_bytes
        touched: float = 1.0 - self._miss**tokens
        return self._dense_bytes + self._expert_bytes * touched

    def _pass_flops_bytes(self, new: float, cached: float) -> tuple[float, float]:
        flops = self._active2 * new + self._attn * (new * cached + 0.5 * new * new)
        return flops, self._kv * (new + cached)

    @property
    def frontend_s(self) -> float:
        """A request's time in the engine's server outside its passes (calibrated pools)."""
        return self._fitted.frontend_s if self._fitted is not None else 0.0

    @property
    def dispatch_s(self) -> float:
        """No per-request dispatch beyond the passes' overheads."""
        return 0.0

    def prefill_s(self, items: list[tuple[int, int]]) -> float:
        """One prefill pass over requests given as (new tokens, cached tokens)."""
        if self._fitted is not None:
            return self._fitted.prefill_s(items)
        flops = kv_bytes = 0.0
        new_total = 0
        for new, cached in items:
            f, b = self._pass_flops_bytes(new, cached)
            flops += f
            kv_bytes += b
            new_total += new
        mem = self.weight_bytes(new_total) + kv_bytes
        return self._prefill_overhead + max(flops / self._prefill_flops, mem / self._prefill_bw)

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        """One decode step of ``batch`` requests holding ``context_tokens`` KV tokens in all."""
        if self._fitted is not None:
            return self._fitted.decode_step_s(batch, context_tokens)
        flops = self._active2 * batch + self._attn * context_tokens
        mem = self.weight_bytes(batch) + self._kv * context_tokens
        return self._decode_overhead + max(flops / self._decode_flops, mem / self._decode_bw)

    def mixed_step_s(
        self, batch: int, context_tokens: float, chunk: float, chunk_context: float
    ) -> float:
        """One step of a colocated engine: ``batch`` requests decoding over
        ``context_tokens`` KV tokens, and a prefill chunk of ``chunk`` new tokens on top of
        ``chunk_context`` (chunked prefill). One pass: its fixed overhead is paid once."""
        prefill = self.prefill_s([(round(chunk), round(chunk_context))])
        if batch <= 0:
            return prefill
        overhead = (
            self._fitted.prefill_overhead_s if self._fitted is not None else self._prefill_overhead
        )
        return self.decode_step_s(batch, context_tokens) + prefill - overhead

    def extend_s(self, tokens: int, context_tokens: int) -> float:
        """Extend-decode of ``tokens`` eager tokens on top of ``context_tokens`` (handoff)."""
        if tokens <= 0:
            return 0.0
        if self._fitted is not None:
            pairs = tokens * context_tokens + 0.5 * tokens * tokens
            pass_s = self._fitted.prefill_pass_s(tokens, pairs)
            return self._extend_overhead + pass_s + self._extend_per_token * tokens
        flops, kv_bytes = self._pass_flops_bytes(tokens, context_tokens)
        mem = self.weight_bytes(tokens) + kv_bytes
        roof = max(flops / self._prefill_flops, mem / self._decode_bw)
        return self._extend_overhead + roof + self._extend_per_token * tokens
