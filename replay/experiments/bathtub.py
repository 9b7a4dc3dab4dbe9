"""The "bathtub": benefit per request against the request's hit-rate bucket.

The PDD team's bathtub plots business benefit against prefix hit rate: high at both
ends, low in the middle. Here a request's bucket is its *trace* hit rate in the
paper's seven ranges (``replay.metrics.hit_buckets``), and benefit is measured two ways:

- ``sla_share``: the share of the bucket's requests meeting the SLA (TTFT and TPOT
  thresholds), per policy: the benefit a user sees;
- ``ttft_saved_s``: for each policy after the first (the baseline), the mean TTFT
  saved per request against the baseline, ``ttft(baseline) - ttft(policy)``, over the
  bucket's requests finished under both, with a 95% bootstrap interval (paired by
  request, resampled within the whole run as in ``replay.experiments.compare_stats``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from replay.experiments.bootstrap import Interval, Statistic, bootstrap_differences, interval, ratio
from replay.metrics.hit_buckets import BUCKET_LABELS, bucket_index

__all__ = ["Bathtub", "bathtub"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Bathtub:
    """Per bucket: request counts, SLA share per policy, TTFT saved against the baseline."""

    labels: tuple[str, ...]
    policies: tuple[str, ...]
    counts: list[int]
    sla_share: list[list[float | None]]  # [policy][bucket]
    ttft_mean_s: list[list[float | None]]  # [policy][bucket], finished requests
    ttft_saved_s: list[list[float | None]]  # [policy after the first][bucket]
    ttft_saved_ci: list[list[Interval | None]]

    def to_json(self) -> dict[str, object]:
        return {
            "buckets": list(self.labels),
            "benefit": "sla_share: share of the bucket's requests meeting the SLA; "
            "ttft_saved_s: mean TTFT(baseline) - TTFT(policy) over the bucket's requests",
            "counts": self.counts,
            "sla_share": dict(zip(self.policies, self.sla_share, strict=True)),
            "ttft_mean_s": dict(zip(self.policies, self.ttft_mean_s, strict=True)),
            "ttft_saved_s": {
                name: [
                    {"mean": m, "ci": None if c is None else [c.low, c.high]}
                    for m, c in zip(means, cis, strict=True)
                ]
                for name, means, cis in zip(
                    self.policies[1:], self.ttft_saved_s, self.ttft_saved_ci, strict=True
                )
            },
        }


def _mean(values: FloatArray, mask: npt.NDArray[np.bool_]) -> float | None:
    return round(float(values[mask].mean()), 6) if mask.any() else None


def bathtub(
    policies: Sequence[str],
    hit_rates: FloatArray,
    met: Sequence[FloatArray],
    ttft: Sequence[FloatArray],
    *,
    resamples: int = 1000,
    seed: int = 0,
) -> Bathtub:
    """The bathtub of runs over the same requests (arrays in one common request order).

    ``hit_rates`` may hold NaN (request unknown to the trace): such requests are left out.
    """
    known = np.isfinite(hit_rates)
    bucket = np.where(known, bucket_index(np.nan_to_num(hit_rates)), -1)
    masks = [bucket == k for k in range(len(BUCKET_LABELS))]
    counts = [int(m.sum()) for m in masks]
    sla = [[_mean(m_pol, mask) for mask in masks] for m_pol in met]
    ttft_mean = [[_mean(t, mask & np.isfinite(t)) for mask in masks] for t in ttft]
    base = ttft[0]
    pairs: dict[str, tuple[Statistic, Statistic]] = {}
    means: list[list[float | None]] = []
    for j, other in enumerate(ttft[1:], start=1):
        both = np.isfinite(base) & np.isfinite(other)
        row: list[float | None] = []
        for k, mask in enumerate(masks):
            use = (mask & both).astype(np.float64)
            row.append(round(float((base - other)[use > 0].mean()), 6) if use.any() else None)
            pairs[f"{j}:{k}"] = (
                ratio(np.where(use > 0, other, 0.0), use),
                ratio(np.where(use > 0, base, 0.0), use),
            )
        means.append(row)
    cis: list[list[Interval | None]] = [[None] * len(masks) for _ in ttft[1:]]
    if pairs and base.size:
        rng = np.random.default_rng(np.random.SeedSequence([seed, 7]))
        diffs = bootstrap_differences(pairs, base.size, resamples, rng)
        for name, values in diffs.items():
            j, k = (int(x) for x in name.split(":"))
            cis[j - 1][k] = interval(values) if means[j - 1][k] is not None else None
    return Bathtub(BUCKET_LABELS, tuple(policies), counts, sla, ttft_mean, means, cis)
