"""Summary statistics of a trace: sizes, arrival rate, prefix hit rates, odd traffic.

Hit rates are those of one cache shared by all instances, fed the requests in
arrival order (ties keep file order). For each request the leading blocks already
cached are counted, hit tokens are ``min(hit_blocks * block_size, input_length)``
(the last block is usually partial), then all of its blocks are cached:

- ``hit_rate_tokens``: hit tokens over input tokens, with an unbounded cache;
- ``hit_rate_mean``: mean of the per-request rates ``hit / input_length`` (requests
  with an empty prompt are left out of per-request figures);
- ``hit_buckets``: shares of requests per hit-rate range, the paper's seven ranges
  (0-90%, 90-95%, 95-96%, 96-97%, 97-98%, 98-99%, 99-100%; each range includes its
  lower bound, the last one includes 100%); ``hit_buckets_coarse``: 0-50%, 50-90%,
  90-100%; ``hit_share_above_95``: share of requests hitting at least 95% (the
  paper's agentic traces: 70-80%);
- ``lru_hit_rate_tokens``: token hit rate with a global LRU cache of N tokens
  (``N // block_size`` blocks; a request's blocks are touched first to last), as a
  mapping from N to the rate, one entry per requested size (empty when none; in
  JSON the keys are the sizes as decimal strings).

Traces without prefix information (Azure) have ``prefix_info`` false and null hit
rates. Odd traffic, the long-input short-output requests that PDD finishes on
RelayDecode: ``input_length >= odd_min_input`` and ``output_length <=
odd_max_output``. Defaults 32768 and 500: the paper describes them as very long
inputs with outputs under about 500 tokens, 3-4% of its agentic traffic (5.1% of
the Mooncake conversation trace under these defaults).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, Field

from replay.trace.caches import LruPrefixCache, UnboundedPrefixCache
from replay.trace.defaults import DEFAULT_ODD_MAX_OUTPUT, DEFAULT_ODD_MIN_INPUT
from replay.trace.record import TraceRequest
from router.errors import UserError

__all__ = [
    "COARSE_BUCKETS",
    "DEFAULT_ODD_MAX_OUTPUT",
    "DEFAULT_ODD_MIN_INPUT",
    "HIT_BUCKETS",
    "LengthStats",
    "TraceStats",
    "compute_stats",
    "hit_tokens",
]


HIT_BUCKETS: tuple[tuple[str, float], ...] = (
    ("0-90%", 0.0),
    ("90-95%", 0.90),
    ("95-96%", 0.95),
    ("96-97%", 0.96),
    ("97-98%", 0.97),
    ("98-99%", 0.98),
    ("99-100%", 0.99),
)
"""The paper's hit-rate ranges, as (label, lower bound)."""

COARSE_BUCKETS: tuple[tuple[str, float], ...] = (
    ("0-50%", 0.0),
    ("50-90%", 0.50),
    ("90-100%", 0.90),
)


class LengthStats(BaseModel):
    """Distribution of a token count over the requests."""

    p50: float
    p90: float
    p99: float
    mean: float
    max: int

    @classmethod
    def of(cls, values: npt.NDArray[np.int64]) -> LengthStats:
        p50, p90, p99 = (float(x) for x in np.percentile(values, [50, 90, 99]))
        return cls(p50=p50, p90=p90, p99=p99, mean=float(values.mean()), max=int(values.max()))


class TraceStats(BaseModel):
    """Everything ``pdd-router trace stats`` reports (see the module docstring)."""

    requests: int
    duration_s: float = Field(description="Last arrival minus first arrival")
    arrival_rate_rps: float | None = Field(description="requests / duration_s; null if 0 s")
    block_size: int
    sessions: int | None = Field(description="Distinct session IDs; null if the trace has none")
    input_tokens: int
    output_tokens: int
    input_length: LengthStats
    output_length: LengthStats
    prefix_info: bool = Field(description="Whether the requests carry block IDs")
    hit_rate_tokens: float | None
    hit_rate_mean: float | None
    hit_buckets: dict[str, float] | None
    hit_buckets_coarse: dict[str, float] | None
    hit_share_above_95: float | None
    lru_hit_rate_tokens: dict[int, float | None]
    odd_min_input: int
    odd_max_output: int
    odd_requests: int
    odd_share: float


def hit_tokens(
    cache: UnboundedPrefixCache | LruPrefixCache, requests: Sequence[TraceRequest]
) -> npt.NDArray[np.int64]:
    """Hit tokens of each request (in the given order) against ``cache``, which they fill."""
    hits = np.empty(len(requests), dtype=np.int64)
    for i, request in enumerate(requests):
        blocks = cache.visit(request.hash_ids)
        hits[i] = min(blocks * request.block_size, request.input_length)
    return hits


def _buckets(
    rates: npt.NDArray[np.float64], edges: tuple[tuple[str, float], ...]
) -> dict[str, float]:
    if len(rates) == 0:
        return {label: 0.0 for label, _ in edges}
    lower = np.array([bound for _, bound in edges[1:]])
    index = np.searchsorted(lower, rates, side="right")
    counts = np.bincount(index, minlength=len(edges))
    return {label: float(c) / len(rates) for (label, _), c in zip(edges, counts, strict=True)}


def compute_stats(
    requests: Iterable[TraceRequest],
    *,
    cache_tokens: Sequence[int] = (),
    odd_min_input: int = DEFAULT_ODD_MIN_INPUT,
    odd_max_output: int = DEFAULT_ODD_MAX_OUTPUT,
) -> TraceStats:
    """Read all requests and summarize them; a UserError if there are none."""
    for size in cache_tokens:
        if size < 0:
            raise UserError(f"cache size must be a non-negative number of tokens, got {size}")
    ordered = list(requests)
    if not ordered:
        raise UserError("the trace holds no requests")
    arrival = np.fromiter((r.arrival_s for r in ordered), dtype=np.float64, count=len(ordered))
    if np.any(np.diff(arrival) < 0):
        order = np.argsort(arrival, kind="stable")
        ordered = [ordered[i] for i in order]
        arrival = arrival[order]
    inputs = np.fromiter((r.input_length for r in ordered), dtype=np.int64, count=len(ordered))
    outputs = np.fromiter((r.output_length for r in ordered), dtype=np.int64, count=len(ordered))
    block_size = ordered[0].block_size
    duration = float(arrival[-1] - arrival[0])
    session_ids = {r.session_id for r in ordered if r.session_id is not None}
    odd = (inputs >= odd_min_input) & (outputs <= odd_max_output)
    prefix_info = any(r.hash_ids for r in ordered)
    total_input = int(inputs.sum())

    hit_rate_tokens = hit_rate_mean = None
    hit_buckets = coarse = None
    above_95 = None
    lru: dict[int, float | None] = {size: None for size in cache_tokens}
    if prefix_info:
        hits = hit_tokens(UnboundedPrefixCache(), ordered)
        hit_rate_tokens = float(hits.sum()) / total_input if total_input else 0.0
        nonempty = inputs > 0
        rates = hits[nonempty] / inputs[nonempty]
        hit_rate_mean = float(rates.mean()) if len(rates) else 0.0
        hit_buckets = _buckets(rates, HIT_BUCKETS)
        coarse = _buckets(rates, COARSE_BUCKETS)
        above_95 = float((rates >= 0.95).mean()) if len(rates) else 0.0
        for size in dict.fromkeys(cache_tokens):
            lru_hits = hit_tokens(LruPrefixCache(size // block_size), ordered)
            lru[size] = float(lru_hits.sum()) / total_input if total_input else 0.0

    return TraceStats(
        requests=len(ordered),
        duration_s=duration,
        arrival_rate_rps=len(ordered) / duration if duration > 0 else None,
        block_size=block_size,
        sessions=len(session_ids) if session_ids else None,
        input_tokens=total_input,
        output_tokens=int(outputs.sum()),
        input_length=LengthStats.of(inputs),
        output_length=LengthStats.of(outputs),
        prefix_info=prefix_info,
        hit_rate_tokens=hit_rate_tokens,
        hit_rate_mean=hit_rate_mean,
        hit_buckets=hit_buckets,
        hit_buckets_coarse=coarse,
        hit_share_above_95=above_95,
        lru_hit_rate_tokens=lru,
        odd_min_input=odd_min_input,
        odd_max_output=odd_max_output,
        odd_requests=int(odd.sum()),
        odd_share=float(odd.mean()),
    )
