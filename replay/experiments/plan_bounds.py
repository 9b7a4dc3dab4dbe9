"""Upper bounds on the rate a deployment can serve a trace at, before replaying it.

``replay plan`` prunes candidates with these before it runs any sweep. A bound is an
arrival rate (requests per second of the trace's mix) above which the SLA cannot be met
for the target share of requests (``--target``, 90%): the requests that pass include,
FIFO as P serves them, about the first 90% of arrivals, and their work must be done by
the last arrival plus the SLA's slack. At rate scale ``s`` the trace lasts ``D / s``, so
with ``W`` the time that work takes on the deployment and ``slack`` the SLA's allowance,
``D / s + slack >= W`` and the rate ``N / (D / s)`` is at most ``N / (W - slack)``
(unbounded when ``W <= slack``). Every cost is optimistic, so pruning with a bound drops
no deployment that could have served the rate:

- **prefill** (slack: the TTFT threshold): every prompt's uncached tokens are computed
  on P. Hits are counted with one unbounded prefix cache fed the trace in arrival order
  (no real cache holds more), and a pass costs only its FLOPs at the prefill efficiency
  (no overhead, no weight reads: batching shares those), or a calibrated pool's fitted
  per-token costs.
- **decode** (slack: TTFT plus TPOT times the longest output): every output token after
  the first is a decode step's share on RLD or MD. An instance emits at most
  ``b / step(b, b * context)`` tokens per second, with ``b`` its largest batch
  (``max_batch``, and no more requests than its KV pool holds at the trace's mean prompt
  plus output) and ``context`` the mean context a request holds while it decodes
  (prompt plus half its output). The roofline's step time grows more slowly than ``b``,
  so the largest batch gives the most tokens.
- **line** (slack: the TTFT threshold): every request's uncached KV (the same unbounded
  cache: MD's DRC can hit no more) crosses the WAN, except for requests RLD finishes
  itself (odd traffic, P-RLD): RLD's decode capacity is spent on the requests with the
  most bytes per output token (a fractional knapsack), and the line carries the rest.
- **colocated** engines prefill and decode: each bound counts all of them for its own
  work, as if they did nothing else (optimistic, as the others).
- **memory**: an instance must hold the model and the trace's largest request (prompt on
  P; prompt and output on RLD and MD), as the simulator checks before it runs.

The bounds ignore queueing, bursts and latency beyond the slack, so a deployment within
them may still miss the SLA: the sweep decides that.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict

from policies.tiers import Tier
from replay.metrics.summary import SlaThresholds
from replay.presets.cluster_preset import ClusterPreset
from replay.presets.schema import PoolSpec
from replay.sim.perfdb_costs import PerfDbCosts
from replay.sim.step_costs import ResolvedStepCosts, resolve_step_costs
from replay.trace.caches import UnboundedPrefixCache
from replay.trace.formats import read_trace
from replay.trace.record import TraceRequest
from replay.trace.stats import hit_tokens
from router.errors import UserError

__all__ = ["Bounds", "TraceLoad", "bounds_of", "load_trace_load"]

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class TraceLoad:
    """What the bounds need of a trace: per-request lengths and hit tokens, its duration."""

    duration_s: float
    input_tokens: F64
    output_tokens: F64
    hit_tokens: F64  # leading tokens an unbounded cache fed in arrival order holds

    @property
    def requests(self) -> int:
        return len(self.input_tokens)

    @property
    def rate_rps(self) -> float:
        """The trace's own arrival rate (rate scale 1)."""
        return self.requests / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def uncached_tokens(self) -> F64:
        out: F64 = np.maximum(self.input_tokens - self.hit_tokens, 0.0)
        return out

    def head(self, share: float) -> TraceLoad:
        """The first ``share`` of the requests in arrival order (at least one)."""
        k = min(max(math.ceil(share * self.requests - 1e-9), 1), self.requests)
        return TraceLoad(
            duration_s=self.duration_s,
            input_tokens=self.input_tokens[:k],
            output_tokens=self.output_tokens[:k],
            hit_tokens=self.hit_tokens[:k],
        )

    @classmethod
    def of(cls, requests: Sequence[TraceRequest]) -> TraceLoad:
        ordered = sorted(requests, key=lambda r: (r.arrival_s, r.request_id))
        if len(ordered) < 2:
            raise UserError("the trace needs at least two requests to have a rate")
        hits = hit_tokens(UnboundedPrefixCache(), ordered)
        return cls(
            duration_s=ordered[-1].arrival_s - ordered[0].arrival_s,
            input_tokens=np.array([r.input_length for r in ordered], dtype=np.float64),
            output_tokens=np.array([r.output_length for r in ordered], dtype=np.float64),
            hit_tokens=hits.astype(np.float64),
        )


def load_trace_load(path: str | Path) -> TraceLoad:
    """Read a trace file (format detected) into a ``TraceLoad``."""
    return TraceLoad.of(list(read_trace(path)))


class Bounds(BaseModel):
    """A deployment's upper bounds on the arrival rate, req/s (0: cannot run at all)."""

    model_config = ConfigDict(frozen=True)

    prefill_rps: float
    decode_rps: float
    line_rps: float
    memory_ok: bool

    @property
    def rps(self) -> float:
        """The tightest bound (0 when an instance cannot hold the largest request)."""
        if not self.memory_ok:
            return 0.0
        return min(self.prefill_rps, self.decode_rps, self.line_rps)

    @property
    def limit(self) -> str:
        """Which resource binds: memory, prefill, decode or line."""
        if not self.memory_ok:
            return "memory"
        named = {"prefill": self.prefill_rps, "decode": self.decode_rps, "line": self.line_rps}
        return min(named, key=lambda k: named[k])


def _resolved(preset: ClusterPreset, pool: PoolSpec) -> ResolvedStepCosts:
    name = next(name for name, p in preset.spec.pools.items() if p is pool)
    return resolve_step_costs(preset, name)


def _prefill_work_s(preset: ClusterPreset, pool: PoolSpec, load: TraceLoad) -> float:
    """Seconds one instance of ``pool`` needs for the prompts' uncached tokens."""
    new = np.maximum(load.uncached_tokens, 1.0)  # the simulator computes at least one
    cached = load.input_tokens - new
    pairs = new * cached + 0.5 * new * new
    resolved = _resolved(preset, pool)
    if isinstance(resolved.costs, PerfDbCosts):  # measured kernels, batched as P batches
        items = [(int(n), int(c)) for n, c in zip(new, cached, strict=True)]
        batch_tokens = max(preset.spec.timing.prefill_batch_tokens, 1)
        return resolved.costs.prefill_work_s(items, batch_tokens)
    if resolved.source == "calibrated" and pool.fitted is not None:
        return float(pool.fitted.prefill_pass_s(float(new.sum()), float(pairs.sum())))
    model, hw, timing = preset.model, preset.hardware[pool.hardware], preset.spec.timing
    flops = 2.0 * model.active_params * new.sum() + model.attention_flops_per_token_pair * (
        pairs.sum()
    )
    peak = pool.gpus_per_instance * hw.peak_flops * timing.prefill_compute_efficiency
    return float(flops / peak)


def _rate(requests: int, work_s: float, slack_s: float) -> float:
    """``N / (W - slack)``: the highest rate at which work ``W`` ends within the slack."""
    return requests / (work_s - slack_s) if work_s > slack_s else float("inf")


def _decode_tokens_s(preset: ClusterPreset, pool: PoolSpec, load: TraceLoad) -> float:
    """Most output tokens per second one instance of ``pool`` emits on this trace."""
    held = float(np.mean(load.input_tokens + load.output_tokens))
    context = float(np.mean(load.input_tokens + 0.5 * load.output_tokens))
    fits = int(preset.kv_capacity_tokens(pool) // max(held, 1.0))
    batch = max(min(pool.max_batch, fits), 1)
    return batch / _resolved(preset, pool).costs.decode_step_s(batch, batch * context)


def _line_s(
    served: TraceLoad, bytes_per_token: float, line_bytes_s: float, rld_tokens_s: float
) -> float:
    """Shortest time in which the line carries the KV that RLD cannot absorb."""
    wan_bytes = served.uncached_tokens * bytes_per_token
    total = float(wan_bytes.sum())
    if total <= 0.0:
        return 0.0
    if line_bytes_s <= 0.0:
        return float("inf")
    tokens = np.maximum(served.output_tokens, 1.0)
    order = np.argsort(-(wan_bytes / tokens), kind="stable")
    cum_tokens = np.concatenate(([0.0], np.cumsum(tokens[order])))
    cum_bytes = np.concatenate(([0.0], np.cumsum(wan_bytes[order])))

    def carried(span: float) -> bool:  # line and RLD together move it all within span
        saved = float(np.interp(rld_tokens_s * span, cum_tokens, cum_bytes))
        return total - saved <= line_bytes_s * span

    low, high = 0.0, total / line_bytes_s  # carried at high: RLD only helps
    for _ in range(80):  # bisection to double precision
        mid = 0.5 * (low + high)
        low, high = (low, mid) if carried(mid) else (mid, high)
    return high


def bounds_of(
    preset: ClusterPreset,
    load: TraceLoad,
    *,
    target: float = 0.9,
    sla: SlaThresholds | None = None,
    step_cost_scale: float = 1.0,
) -> Bounds:
    """The deployment's bounds on ``load`` (see the module's docstring), with every engine
    pass ``step_cost_scale`` times as long as priced (as the replays take it)."""
    sla = sla or SlaThresholds()
    served = load.head(target)
    largest_prompt = float(load.input_tokens.max())
    largest = float((load.input_tokens + load.output_tokens).max())
    memory_ok = True
    prefill_share = decode_tokens_s = rld_tokens_s = 0.0  # prefill: served sets per second
    for pool in preset.pools().values():
        need = largest_prompt if pool.tier is Tier.P and not pool.colocated else largest
        if preset.kv_capacity_tokens(pool) < need:
            memory_ok = False
            continue
        if pool.tier is Tier.P:
            work = _prefill_work_s(preset, pool, served) * step_cost_scale
            prefill_share += pool.instances / work if work > 0 else float("inf")
        if pool.tier is not Tier.P or pool.colocated:  # a colocated engine decodes too
            tokens_s = pool.instances * _decode_tokens_s(preset, pool, load) / step_cost_scale
            decode_tokens_s += tokens_s
            if pool.tier is Tier.RLD:
                rld_tokens_s += tokens_s
    n = load.requests
    prefill_rps = _rate(n, 1.0 / prefill_share, sla.ttft_s) if prefill_share > 0 else 0.0
    decode_tokens = float(np.maximum(served.output_tokens - 1.0, 0.0).sum())
    decode_slack = sla.ttft_s + sla.tpot_s * max(float(served.output_tokens.max()) - 1.0, 0.0)
    decode_rps = (
        _rate(n, decode_tokens / decode_tokens_s, decode_slack) if decode_tokens_s > 0 else 0.0
    )
    wan = preset.spec.links.wan
    if wan is None or not preset.spans_datacenters():
        line_rps = float("inf")
    else:
        line_bytes_s = wan.bandwidth_gbps * 1e9 / 8.0
        kv = preset.model.kv_bytes_per_token
        line_rps = _rate(n, _line_s(served, kv, line_bytes_s, rld_tokens_s), sla.ttft_s)
    return Bounds(
        prefill_rps=prefill_rps, decode_rps=decode_rps, line_rps=line_rps, memory_ok=memory_ok
    )
