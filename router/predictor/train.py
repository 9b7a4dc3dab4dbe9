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
    held (``known_frac``) with an absolute loss (the MAE's own), and each tier predicts,
    of the model, the raw index match and the router's record of its routes, whichever
    had the lowest MAE on the last fifth of the training rows.
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
    fallback_features: tuple[str, ...] = Field(
        ("match_frac", "route_frac"),
        description="Per tier, predict the one of these that validated better than the model, "
        "if any (empty: the model everywhere, no validation)",
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
    model_tiers: list[str] = []  # tiers where the model beat every fallback on validation
    fallbacks: dict[str, str] = {}  # the other tiers: the fallback feature they predict


def fit_model(train: Dataset, params: TrainParams | None = None) -> Any:
    """A fitted HitRateModel (sklearn is imported here, not at CLI start-up)."""
    from router.predictor.model import HitRateModel

    if len(train) < 10:
        raise UserError(f"only {len(train)} training rows; give longer or more decision logs")
    typed = params or TrainParams()
    kwargs = typed.model_dump(exclude={"base_feature", "fallback_features"})
    named = [("base", typed.base_feature)] + [("fallback", f) for f in typed.fallback_features]
    for key, name in named:
        if name is not None and name not in train.features:
            raise UserError(
                f"unknown {key} feature {name!r}; features: {', '.join(train.features)}"
            )
    base = typed.base_feature
    kwargs["base_column"] = None if base is None else train.features.index(base)
    kwargs["fallback_columns"] = tuple(train.features.index(f) for f in typed.fallback_features)
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
    tiers = ("p", "rld", "md", "none")
    kept = [t for t, used in zip(tiers, model.use_model_, strict=True) if used]
    fallbacks = {
        t: typed.fallback_features[int(c)]
        for t, c in zip(tiers, model.choice_, strict=True)
        if c >= 0 and t != "none" and (train.tier == t).any()
    }
    report = TrainReport(
        logs=[str(p) for p in logs],
        rows=len(data),
        train_rows=len(train),
        train_fraction=train_fraction,
        by_tier={str(t): int((train.tier == t).sum()) for t in sorted(set(train.tier.tolist()))},
        index_modes=sorted(set(train.index_mode.tolist())),
        params=typed,
        model_tiers=[t for t in kept if t != "none"],
        fallbacks=fallbacks,
    )
    save_predictor(out, model, FEATURES, info=report.model_dump(mode="json"))
    return report
