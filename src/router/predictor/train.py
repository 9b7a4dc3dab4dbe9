"""Fit a hit-rate model on the earlier part of decision logs and save it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from router.errors import UserError
from router.predictor.dataset import Dataset
from router.predictor.features import FEATURES

__all__ = ["TrainParams", "TrainReport", "fit_model", "one_line", "train_and_save"]


def one_line(exc: ValidationError) -> str:
    """A pydantic validation error as ``field: problem; ...`` on one line."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'value'}: {e['msg']}" for e in exc.errors()
    )


class TrainParams(BaseModel):
    """Hyper-parameters of :class:`~router.predictor.model.HitRateModel`.

    The defaults were chosen on replays of both traces in both index modes: the trees
    learn the correction to what either the index or the router's own record says is
    held (``known_frac``) with an absolute loss (the MAE's own), and each tier keeps the
    model only where it beat the raw index match on the last fifth of the training rows.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_estimators: int = Field(150, gt=0)
    learning_rate: float = Field(0.1, gt=0)
    max_depth: int = Field(4, gt=0)
    min_samples_leaf: int = Field(20, gt=0)
    subsample: float = Field(0.8, gt=0, le=1)
    loss: str = Field(
        "absolute_error", description="absolute_error targets the MAE; squared_error the mean"
    )
    base_feature: str | None = Field(
        "known_frac", description="Learn the correction to this feature (None: the hit itself)"
    )
    fallback_feature: str | None = Field(
        "match_frac", description="Per tier, predict this where the model did not validate better"
    )
    validation_fraction: float = Field(
        0.2, ge=0, lt=1, description="Last share of the training rows (by time) for that check"
    )
    random_state: int | None = 0


class TrainReport(BaseModel):
    """What was fitted on what."""

    logs: list[str]
    rows: int
    train_rows: int
    train_fraction: float
    by_tier: dict[str, int]
    index_modes: list[str]
    params: TrainParams
    model_tiers: list[str] = []  # tiers where the model beat the raw match on validation


def fit_model(train: Dataset, params: TrainParams | None = None) -> Any:
    """A fitted HitRateModel (sklearn is imported here, not at CLI start-up)."""
    from router.predictor.model import HitRateModel

    if len(train) < 10:
        raise UserError(f"only {len(train)} training rows; give longer or more decision logs")
    typed = params or TrainParams()
    kwargs = typed.model_dump(exclude={"base_feature", "fallback_feature"})
    columns: dict[str, int | None] = {}
    for key, name in (("base", typed.base_feature), ("fallback", typed.fallback_feature)):
        if name is not None and name not in train.features:
            raise UserError(
                f"unknown {key} feature {name!r}; features: {', '.join(train.features)}"
            )
        columns[key] = None if name is None else train.features.index(name)
    kwargs["base_column"] = columns["base"]
    kwargs["fallback_column"] = columns["fallback"]
    kwargs["group_columns"] = tuple(train.features.index(f"tier_{t}") for t in ("p", "rld", "md"))
    order = np.argsort(train.t, kind="stable")  # the validation rows are the latest
    return HitRateModel(**kwargs).fit(train.X[order], train.y[order])


def train_and_save(
    data: Dataset,
    logs: Sequence[Path],
    out: Path,
    *,
    train_fraction: float = 0.7,
    params: Mapping[str, Any] | None = None,
) -> TrainReport:
    """Fit on the first ``train_fraction`` of each log (by time) and write the model."""
    from router.predictor.persist import save_predictor

    try:
        typed = TrainParams.model_validate(dict(params or {}))
    except ValidationError as exc:
        raise UserError(f"bad training parameter: {one_line(exc)}") from None
    train, _ = data.split(train_fraction)
    model = fit_model(train, typed)
    kept = [t for t, used in zip(("p", "rld", "md", "none"), model.use_model_, strict=True) if used]
    report = TrainReport(
        logs=[str(p) for p in logs],
        rows=len(data),
        train_rows=len(train),
        train_fraction=train_fraction,
        by_tier={str(t): int((train.tier == t).sum()) for t in sorted(set(train.tier.tolist()))},
        index_modes=sorted(set(train.index_mode.tolist())),
        params=typed,
        model_tiers=[t for t in kept if t != "none"],
    )
    save_predictor(out, model, FEATURES, info=report.model_dump(mode="json"))
    return report
