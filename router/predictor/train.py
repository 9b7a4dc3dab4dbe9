"""Fit a hit-rate model on the earlier part of decision logs and save it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from policies.param_errors import model_parameters, parameter_problems
from router.errors import UserError
from router.predictor.dataset import Dataset
from router.predictor.features import TRANSFERABLE

__all__ = [
    "TrainParams",
    "TrainReport",
    "fit_model",
    "model_features",
    "time_order",
    "train_and_save",
    "training_problems",
]


def training_problems(exc: ValidationError) -> str:
    """Training parameters :class:`TrainParams` refused, on one line with the valid ones."""
    return parameter_problems(exc, model_parameters(TrainParams), listing="training parameters")


class TrainParams(BaseModel):
    """Hyper-parameters of :class:`~router.predictor.model.HitRateModel`.

    The defaults were chosen by leave-one-kind-out evaluation (``predictor cross-eval``)
    on replays of agentic traces of several shapes and the conversation trace, and on
    replays with delayed KV events: the trees see only the features that mean the same
    on any trace (:data:`TRANSFERABLE`) and learn the correction to what either the
    index or the router's own record says is held (``known_frac``) with an absolute loss
    (the MAE's own); each tier predicts, of the model, the raw index match, the router's
    record of its routes and ``lru_frac`` (that record aged as an LRU of the instance's
    KV size), whichever had the lowest MAE on the last fifth of each log's training rows.
    The earlier defaults (every logged feature, fallbacks ``match_frac`` and
    ``route_frac`` only) fitted the trace they were trained on and carried over badly to
    others (docs/predictor.md, "Measured"). ``base_feature=lru_frac`` does as well across traces in
    approximate mode but worse with delayed KV events, where the record of routes fills
    the events' gap and an LRU over the events does not.
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
        ("match_frac", "route_frac", "lru_frac"),
        description="Per tier, predict the one of these that validated better than the model, "
        "if any (empty: the model everywhere, no validation)",
    )
    validation_fraction: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="Last share of each log's training rows (by time) for that check",
    )
    features: tuple[str, ...] | None = Field(
        TRANSFERABLE,
        description="The features the trees see: a list, 'transferable' (the default) or "
        "'all' (every logged one, also None); the base, fallback and tier features are added",
    )
    random_state: int | None = 0

    @field_validator("features", mode="before")
    @classmethod
    def _named_feature_set(cls, value: Any) -> Any:
        if value is None or value == "all":
            return None
        if value == "transferable":
            return TRANSFERABLE
        if isinstance(value, str):
            return tuple(v.strip() for v in value.split(",") if v.strip())
        return value


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


def model_features(params: TrainParams, logged: Sequence[str]) -> list[str]:
    """The columns a model with ``params`` is fitted on, in the log's order."""
    wanted = set(logged if params.features is None else params.features)
    wanted |= {"tier_p", "tier_rld", "tier_md", *params.fallback_features}
    if params.base_feature is not None:
        wanted.add(params.base_feature)
    unknown = sorted(wanted - set(logged))
    if unknown:
        raise UserError(f"unknown feature {', '.join(unknown)}; features: {', '.join(logged)}")
    return [f for f in logged if f in wanted]


def time_order(data: Dataset, validation_fraction: float) -> npt.NDArray[np.intp]:
    """Row order for fitting: the first ``1 - validation_fraction`` of every log by time,
    then the rest of every log, so the held-out validation rows are each log's latest
    (not one log's, when logs cover different spans of time)."""
    early: list[npt.NDArray[np.intp]] = []
    late: list[npt.NDArray[np.intp]] = []
    for log in np.unique(data.log):
        rows = np.flatnonzero(data.log == log)
        rows = rows[np.argsort(data.t[rows], kind="stable")]
        cut = len(rows) - round(len(rows) * validation_fraction)
        early.append(rows[:cut])
        late.append(rows[cut:])
    return np.concatenate([*early, *late]).astype(np.intp)


def fit_model(train: Dataset, params: TrainParams | None = None) -> tuple[Any, list[str]]:
    """A fitted HitRateModel and the features (columns) it was fitted on (sklearn is
    imported here, not at CLI start-up)."""
    from router.predictor.model import HitRateModel

    if len(train) < 10:
        raise UserError(f"only {len(train)} training rows; give longer or more decision logs")
    typed = params or TrainParams()
    features = model_features(typed, train.features)
    needed = [f for f in (typed.base_feature, *typed.fallback_features) if f is not None]
    for name in needed:
        if np.isnan(train.X[:, train.features.index(name)]).all():
            raise UserError(
                f"the decision logs never give {name} (written by an older pdd-router?); "
                "replay them again, or pick other features with --param base_feature=... "
                "or --param fallback_features=[...]"
            )
    kwargs = typed.model_dump(exclude={"base_feature", "fallback_features", "features"})
    base = typed.base_feature
    kwargs["base_column"] = None if base is None else features.index(base)
    kwargs["fallback_columns"] = tuple(features.index(f) for f in typed.fallback_features)
    kwargs["group_columns"] = tuple(features.index(f"tier_{t}") for t in ("p", "rld", "md"))
    columns = [train.features.index(f) for f in features]
    order = time_order(train, typed.validation_fraction if typed.fallback_features else 0.0)
    model = HitRateModel(**kwargs).fit(train.X[order][:, columns], train.y[order])
    return model, features


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
        raise UserError(f"bad training parameter: {training_problems(exc)}") from None
    train, _ = data.split(train_fraction)
    model, features = fit_model(train, typed)
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
    save_predictor(out, model, features, info=report.model_dump(mode="json"))
    return report
