"""The report's series, from per-request records (numpy): CDFs and loads over time.

Time is seconds from the first arrival, cut into equal bins. What each series is:

- ``cdf``: the sorted finite values at up to ``points`` evenly spaced probabilities;
- ``shares_by_arrival``: per bin, the share of the requests *arriving* in it that fall
  in each category (hit-rate bucket, pipeline);
- ``interval_load``: per bin, the time-average of a sum of weighted intervals
  (requests decoding on RLD; WAN bytes per second);
- ``wan_intervals``: when each request's WAN bytes travelled. The records do not hold
  a transfer's start, so its bytes are spread evenly over ``[end of prefill, end of
  prefill + transfer time]`` (until the request's end for a cancelled copy); a copy
  that first waited for memory on MD is drawn earlier than it ran, so
  ``cap_with_backlog`` then carries whatever exceeds the line's capacity in a bin over
  to the next (bytes are conserved, the line is never drawn above its capacity).
  ``summary.json``'s mean and 1-second peak come from the link itself and are exact.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from replay.metrics.record import RequestRecord

__all__ = [
    "PIPELINE_MIX",
    "bin_edges",
    "cap_with_backlog",
    "cdf",
    "interval_load",
    "mix_category",
    "rld_intervals",
    "shares_by_arrival",
    "wan_intervals",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

PIPELINE_MIX: tuple[str, ...] = (
    "P-MD",
    "P-RLD-MD catch-up",
    "P-RLD-MD one-shot",
    "P-RLD-MD, MD first",
    "P-RLD decided",
    "P-RLD reactive",
)
"""Categories of the pipeline and handoff mix ("MD first": MD's copy landed before RLD
started decoding, so RLD was dropped and there was no handoff)."""


def cdf(values: FloatArray, points: int = 300) -> tuple[FloatArray, FloatArray]:
    """``(x, p)``: the empirical CDF of the finite values, thinned to ``points`` points."""
    finite = np.sort(values[np.isfinite(values)])
    if finite.size == 0:
        return np.empty(0), np.empty(0)
    p = np.linspace(0.0, 1.0, min(points, finite.size))
    x: FloatArray = np.quantile(finite, p)
    return x, p


def bin_edges(end_s: float, bins: int = 60) -> FloatArray:
    """Equal bins from 0 to ``end_s`` with a round width (1, 2, 5 x 10^k seconds)."""
    raw = max(end_s, 1.0) / bins
    magnitude = 10.0 ** math.floor(math.log10(raw))
    width = next(m * magnitude for m in (1.0, 2.0, 5.0, 10.0) if m * magnitude >= raw)
    count = math.ceil(max(end_s, 1.0) / width)
    edges: FloatArray = np.arange(count + 1, dtype=np.float64) * width
    return edges


def shares_by_arrival(
    arrival: FloatArray, category: IntArray, categories: int, edges: FloatArray
) -> FloatArray:
    """``shares[c, b]``: share of bin ``b``'s arrivals in category ``c`` (NaN if none)."""
    bins = len(edges) - 1
    which = np.clip(np.searchsorted(edges, arrival, side="right") - 1, 0, bins - 1)
    ok = category >= 0
    counts = np.zeros((categories, bins), dtype=np.float64)
    np.add.at(counts, (category[ok], which[ok]), 1.0)
    total = counts.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(total > 0, counts / np.where(total > 0, total, 1.0), np.nan)
    return out


def interval_load(
    starts: FloatArray, ends: FloatArray, weights: FloatArray, edges: FloatArray
) -> FloatArray:
    """Per bin, the time-average of ``sum(weight_i * [start_i <= t < end_i])``."""
    if starts.size == 0:
        return np.zeros(len(edges) - 1)
    times = np.concatenate((starts, ends))
    steps = np.concatenate((weights, -weights))
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(steps[order])
    area = np.concatenate(([0.0], np.cumsum(level[:-1] * np.diff(times))))
    k = np.searchsorted(times, edges, side="right") - 1
    inside = k >= 0
    kk = np.clip(k, 0, len(times) - 1)
    at = np.where(inside, area[kk] + level[kk] * (edges - times[kk]), 0.0)
    out: FloatArray = np.diff(at) / np.diff(edges)
    return out


def cap_with_backlog(load: FloatArray, capacity: float, edges: FloatArray) -> FloatArray:
    """``load`` per bin with the excess over ``capacity`` carried to the following bins."""
    width = np.diff(edges)
    out = np.empty_like(load)
    backlog = 0.0
    for i, (rate, w) in enumerate(zip(load, width, strict=True)):  # one step per bin
        want = backlog + rate * w
        sent = min(want, capacity * w)
        out[i] = sent / w
        backlog = want - sent
    return out


def _f(values: Sequence[float | None]) -> FloatArray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def wan_intervals(
    records: Sequence[RequestRecord], origin: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """``(start, end, bytes_per_s)`` of each request's WAN bytes (see the module doc)."""
    sent = [r for r in records if r.wan_bytes > 0]
    arrival = _f([r.arrival_s for r in sent]) - origin
    start = arrival + _f([r.prefill_queue_s + r.prefill_s for r in sent])
    transfer = _f([r.transfer_s for r in sent])
    finish = arrival + _f([r.e2e_s for r in sent])
    end = np.where(np.isfinite(transfer), start + transfer, finish)
    end = np.where(np.isfinite(end) & (end > start), end, start + 1e-3)
    rate = _f([r.wan_bytes for r in sent]) / (end - start)
    return start, end, rate


def rld_intervals(records: Sequence[RequestRecord], origin: float) -> tuple[FloatArray, FloatArray]:
    """``(start, end)`` of each request's decoding on RLD (it starts with the first token)."""
    used = [r for r in records if r.rld_busy_s is not None and r.ttft_s is not None]
    start = _f([r.arrival_s + (r.ttft_s or 0.0) for r in used]) - origin
    return start, start + _f([r.rld_busy_s for r in used])


def mix_category(record: RequestRecord) -> int:
    """The record's index in ``PIPELINE_MIX``."""
    if record.pipeline == "P-RLD":
        return 5 if record.reactive else 4
    if record.pipeline == "P-RLD-MD":
        return {"catch-up": 1, "one-shot": 2}.get(record.handoff or "", 3)
    return 0
