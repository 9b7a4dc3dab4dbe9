"""Each request's prefix hit rate in the trace, and the paper's seven hit-rate buckets.

A request's *trace hit rate* is what ``pdd-router trace stats`` counts: the share of
its prompt already cached in one unbounded cache fed the requests in arrival order.
It is a property of the trace, the same under every policy, which is what lets a
report put the same request in the same bucket for every policy (the realized hit
rates of ``requests.jsonl`` depend on the policy: naive cross-DC PD has no MD cache).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from replay.trace.caches import UnboundedPrefixCache
from replay.trace.formats import read_trace
from replay.trace.record import TraceRequest
from replay.trace.stats import HIT_BUCKETS, hit_tokens
from router.errors import UserError

__all__ = ["BUCKET_LABELS", "bucket_index", "load_hit_rates", "rates_of", "request_hit_rates"]

BUCKET_LABELS: tuple[str, ...] = tuple(label for label, _ in HIT_BUCKETS)
"""The paper's seven hit-rate ranges: 0-90%, 90-95%, 95-96%, ..., 99-100%."""

_LOWER = np.array([bound for _, bound in HIT_BUCKETS[1:]], dtype=np.float64)


def bucket_index(rates: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """The bucket (0-6) of each hit rate; each range includes its lower bound."""
    out: npt.NDArray[np.int64] = np.searchsorted(_LOWER, rates, side="right").astype(np.int64)
    return out


def request_hit_rates(requests: Sequence[TraceRequest]) -> dict[int, float]:
    """Trace hit rate of each request, by request id (empty prompts count as 0)."""
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    hits = hit_tokens(UnboundedPrefixCache(), ordered)
    return {
        r.request_id: (float(h) / r.input_length if r.input_length > 0 else 0.0)
        for r, h in zip(ordered, hits, strict=True)
    }


def load_hit_rates(trace: str | Path) -> dict[int, float] | None:
    """Trace hit rates of a trace file; None when it cannot be read or has no block IDs."""
    path = Path(trace)
    if not path.is_file():
        return None
    try:
        requests = list(read_trace(path))
    except (UserError, OSError, ValueError):
        return None
    if not any(r.hash_ids for r in requests):
        return None
    return request_hit_rates(requests)


def rates_of(request_ids: Sequence[int], rates: Mapping[int, float]) -> npt.NDArray[np.float64]:
    """The hit rates of ``request_ids`` in that order (NaN for an unknown id)."""
    return np.array([rates.get(i, np.nan) for i in request_ids], dtype=np.float64)
