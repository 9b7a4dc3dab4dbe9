"""Leave one kind of trace out: train on the others, score on it, per tier.

What a model is worth on traffic it never saw: for every kind (one or more decision
logs of one kind of trace), a model is fitted on all rows of every other kind (except
the kinds kept for testing only) and scored on all rows of the held-out one, against the
raw index match on the same rows and against ``lru_frac`` alone (the router's record aged
as an LRU of each instance's KV size would age it, no trees), so the share of the gain
that the trees add is visible.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from router.errors import UserError
from router.predictor.dataset import Dataset
from router.predictor.features import FloatArray
from router.predictor.train import TrainParams, fit_model

__all__ = [
    "ALL_TIERS",
    "CSV_COLUMNS",
    "CrossEvalReport",
    "CrossRow",
    "concat",
    "leave_one_kind_out",
    "write_csv",
]

ALL_TIERS = "all"
CSV_COLUMNS = (
    "held_out",
    "trained_on",
    "tier",
    "rows",
    "index_mae",
    "lru_mae",
    "model_mae",
    "mae_reduction_vs_index",
    "predicts",
)


class CrossRow(BaseModel):
    """One held-out kind and tier: MAEs on its rows and the model's reduction."""

    held_out: str
    trained_on: list[str]
    tier: str  # p, rld, md, or "all"
    rows: int
    index_mae: float  # the raw index match
    lru_mae: float | None  # lru_frac alone (None: not logged)
    model_mae: float
    predicts: str  # what the tier predicts: "model" or the fallback feature it kept; "-": all

    @property
    def reduction(self) -> float:
        """Share by which the model's MAE is below the index's (0.3: 30% lower; negative:
        higher)."""
        return 1.0 - self.model_mae / self.index_mae if self.index_mae > 0 else 0.0


class CrossEvalReport(BaseModel):
    """Every held-out kind's rows, and what was fitted how."""

    kinds: dict[str, int]  # kind -> joined rows
    test_only: list[str]
    params: TrainParams
    rows: list[CrossRow]


def concat(parts: Sequence[Dataset]) -> Dataset:
    """One dataset of several; each part's logs keep distinct numbers."""
    if not parts:
        raise ValueError("nothing to concatenate")
    features = parts[0].features
    if any(p.features != features for p in parts):
        raise ValueError("datasets with different feature lists")
    logs: list[np.ndarray[tuple[int], np.dtype[np.int64]]] = []
    offset = 0
    for part in parts:
        logs.append(part.log + offset)
        offset += int(part.log.max()) + 1 if len(part) else 0
    return Dataset(
        X=np.vstack([p.X for p in parts]),
        y=np.concatenate([p.y for p in parts]),
        tier=np.concatenate([p.tier for p in parts]),
        t=np.concatenate([p.t for p in parts]),
        raw=np.concatenate([p.raw for p in parts]),
        approx=np.concatenate([p.approx for p in parts]),
        log=np.concatenate(logs),
        index_mode=np.concatenate([p.index_mode for p in parts]),
        features=features,
    )


def _mae(pred: FloatArray, y: FloatArray) -> float:
    return round(float(np.abs(pred - y).mean()), 6)


def leave_one_kind_out(
    kinds: Mapping[str, Dataset],
    params: TrainParams | None = None,
    *,
    test_only: Collection[str] = (),
    advance: Callable[[str], None] | None = None,
) -> CrossEvalReport:
    """Per held-out kind, rows for every tier it has and for all its rows together.

    Every kind is held out in turn; the model is fitted on the other kinds, leaving out
    those in ``test_only`` (traffic kept unseen by every model). ``advance(name)`` is
    called before each kind's fit.
    """
    unknown = sorted(set(test_only) - set(kinds))
    if unknown:
        raise UserError(
            f"--test-only {', '.join(unknown)}: no such kind; kinds: {', '.join(kinds)}"
        )
    trainable = [k for k in kinds if k not in test_only]
    if len(kinds) < 2 or not trainable:
        raise UserError(
            "give at least two kinds of trace, at least one of them for training: each kind "
            "is held out in turn and the model is fitted on the others"
        )
    typed = params or TrainParams()
    out: list[CrossRow] = []
    tiers = ("p", "rld", "md", "none")
    for name, test in kinds.items():
        if advance is not None:
            advance(name)
        others = [k for k in trainable if k != name]
        if not others:
            raise UserError(
                f"holding out {name} leaves no kind to train on; give another kind for training"
            )
        model, features = fit_model(concat([kinds[k] for k in others]), typed)
        columns = [test.features.index(f) for f in features]
        pred = model.predict_fast(test.X[:, columns])
        lru = test.X[:, test.features.index("lru_frac")] if "lru_frac" in test.features else None
        choice = {t: int(c) for t, c in zip(tiers, model.choice_, strict=True)}
        for tier in (*sorted(set(test.tier.tolist())), ALL_TIERS):
            mask = np.ones(len(test), dtype=bool) if tier == ALL_TIERS else test.tier == tier
            if not mask.any():
                continue
            lru_mae = None
            if lru is not None and not np.isnan(lru[mask]).all():
                lru_mae = _mae(np.nan_to_num(lru[mask], nan=0.0), test.y[mask])
            c = choice.get(tier, -1)
            out.append(
                CrossRow(
                    held_out=name,
                    trained_on=others,
                    tier=tier,
                    rows=int(mask.sum()),
                    index_mae=_mae(test.raw[mask], test.y[mask]),
                    lru_mae=lru_mae,
                    model_mae=_mae(pred[mask], test.y[mask]),
                    predicts="-" if tier == ALL_TIERS
                    else "model" if c < 0 else typed.fallback_features[c],
                )
            )  # fmt: skip
    return CrossEvalReport(
        kinds={k: len(d) for k, d in kinds.items()},
        test_only=[k for k in kinds if k in test_only],
        params=typed,
        rows=out,
    )


def write_csv(rows: Sequence[CrossRow], path: Path) -> None:
    """The rows as CSV (``mae_reduction_vs_index``: 0.3 means a 30% lower MAE)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for r in rows:
            writer.writerow(
                [r.held_out, "+".join(r.trained_on), r.tier, r.rows, f"{r.index_mae:.6f}",
                 "" if r.lru_mae is None else f"{r.lru_mae:.6f}", f"{r.model_mae:.6f}",
                 f"{r.reduction:.4f}", r.predicts]
            )  # fmt: skip
