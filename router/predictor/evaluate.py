"""Scoring hit-rate predictions: MAE, error by realized-hit bucket, calibration.

Every predictor is scored on the same rows: the model, the raw index match, and the
match in the router's own record of its routes (what approximate mode sees).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel

from router.errors import UserError
from router.predictor.dataset import Dataset
from router.predictor.features import FloatArray

__all__ = [
    "APPROXIMATE",
    "BUCKETS",
    "MODEL",
    "RAW",
    "BucketScore",
    "CalibrationBin",
    "Evaluation",
    "Scores",
    "evaluate",
    "score_logs",
]

MODEL = "model"
RAW = "index match"
APPROXIMATE = "approximate-mode match"

BUCKETS: tuple[tuple[float, float], ...] = (
    (0.0, 0.2),
    (0.2, 0.5),
    (0.5, 0.8),
    (0.8, 0.9),
    (0.9, 0.95),
    (0.95, 0.99),
    (0.99, 1.0),
)
"""Realized-hit ranges (the last one closed): the low-hit minority to the 99-100% majority."""

_CAL_BINS = 10


class BucketScore(BaseModel):
    bucket: str
    rows: int
    mae: float | None


class CalibrationBin(BaseModel):
    """Rows whose prediction fell in [low, high): mean predicted against mean realized."""

    low: float
    high: float
    rows: int
    predicted: float | None
    realized: float | None


class Scores(BaseModel):
    mae: float
    bias: float  # mean predicted minus mean realized
    calibration_error: float  # row-weighted |mean predicted - mean realized| over bins
    by_bucket: list[BucketScore]
    by_tier: dict[str, float]
    calibration: list[CalibrationBin]


class Evaluation(BaseModel):
    rows: int
    by_tier_rows: dict[str, int]
    scores: dict[str, Scores]

    def improvement(self, name: str, baseline: str) -> float:
        """Relative MAE reduction of ``name`` against ``baseline`` (0.3 = 30% lower)."""
        base = self.scores[baseline].mae
        return 1.0 - self.scores[name].mae / base if base > 0 else 0.0


def _bucket_label(low: float, high: float) -> str:
    return f"{low * 100:g}-{high * 100:g}%"


def _scores(y: FloatArray, pred: FloatArray, tier: npt.NDArray[np.str_]) -> Scores:
    err = np.abs(pred - y)
    by_bucket = []
    for i, (low, high) in enumerate(BUCKETS):
        last = i == len(BUCKETS) - 1
        mask = (y >= low) & ((y <= high) if last else (y < high))
        by_bucket.append(
            BucketScore(
                bucket=_bucket_label(low, high),
                rows=int(mask.sum()),
                mae=round(float(err[mask].mean()), 6) if mask.any() else None,
            )
        )
    edges = np.linspace(0.0, 1.0, _CAL_BINS + 1)
    which = np.clip(np.searchsorted(edges, pred, side="right") - 1, 0, _CAL_BINS - 1)
    calibration = []
    gap = 0.0
    for b in range(_CAL_BINS):
        mask = which == b
        n = int(mask.sum())
        mp = float(pred[mask].mean()) if n else None
        mr = float(y[mask].mean()) if n else None
        if mp is not None and mr is not None:
            gap += n * abs(mp - mr)
        calibration.append(
            CalibrationBin(
                low=round(float(edges[b]), 2),
                high=round(float(edges[b + 1]), 2),
                rows=n,
                predicted=None if mp is None else round(mp, 6),
                realized=None if mr is None else round(mr, 6),
            )
        )
    by_tier = {
        str(t): round(float(err[tier == t].mean()), 6) for t in sorted(set(tier.tolist()))
    }  # fmt: skip
    return Scores(
        mae=round(float(err.mean()), 6),
        bias=round(float(pred.mean() - y.mean()), 6),
        calibration_error=round(gap / max(len(y), 1), 6),
        by_bucket=by_bucket,
        by_tier=by_tier,
        calibration=calibration,
    )


def evaluate(data: Dataset, predictions: Mapping[str, FloatArray]) -> Evaluation:
    """Scores of each named prediction (aligned with ``data``'s rows)."""
    if len(data) == 0:
        raise ValueError("no rows to evaluate")
    tiers = sorted(set(data.tier.tolist()))
    return Evaluation(
        rows=len(data),
        by_tier_rows={str(t): int((data.tier == t).sum()) for t in tiers},
        scores={name: _scores(data.y, pred, data.tier) for name, pred in predictions.items()},
    )


def score_logs(
    predict: Callable[[FloatArray], FloatArray], data: Dataset, train_fraction: float
) -> tuple[Evaluation, Dataset]:
    """Evaluate ``predict`` and both baselines on the later part of ``data`` (by time)."""
    _, test = data.split(train_fraction)
    if len(test) == 0:
        raise UserError(f"no rows after the first {train_fraction:.0%} of each log to evaluate on")
    ev = evaluate(
        test,
        {
            MODEL: predict(test.X),
            RAW: test.raw,
            APPROXIMATE: test.approx,
        },
    )
    return ev, test
