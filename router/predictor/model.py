"""The hit-rate model: a scikit-learn estimator over the decision log's features.

``HitRateModel`` follows the library's conventions (parameters stored as given by
``__init__``, ``fit`` returns self, fitted attributes end in ``_``, ``predict`` checks
it is fitted). Inside is a pipeline: missing values (no matched block, so no age)
imputed with a sentinel, then gradient-boosted trees of small depth. ``predict`` goes
through the pipeline; ``predict_fast`` walks the same trees compiled into numpy arrays
at fit time (``trees_``), a fraction of a millisecond for the ten or so candidates of
a decision. The output is clipped to [0, 1]: it is a hit rate.

With ``base_column`` the trees learn the correction to that column (what the index
says is held) rather than the hit rate itself: where the index is right, the
correction is exactly zero. With ``fallback_columns`` the last ``validation_fraction``
of the training rows (they come in time order) is held out: for each group of rows
(``group_columns``, one-hot, e.g. the tier) the model competes there with each
fallback column (e.g. the raw index match, the router's record of its routes) and the
one with the lowest MAE is what the group predicts (``choice_``: -1 for the model, else
the position of the fallback column; ``use_model_`` marks the groups that keep the
model). A model is thus not worse, on its validation rows, than the best of those raw
figures where it did not learn anything they do not already know.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
from sklearn.base import BaseEstimator, RegressorMixin  # type: ignore[import-untyped]
from sklearn.ensemble import GradientBoostingRegressor  # type: ignore[import-untyped]
from sklearn.impute import SimpleImputer  # type: ignore[import-untyped]
from sklearn.pipeline import Pipeline  # type: ignore[import-untyped]
from sklearn.utils.validation import check_is_fitted, validate_data  # type: ignore[import-untyped]

from router.predictor.compiled import compile_trees, predict_compiled
from router.predictor.features import FloatArray

__all__ = ["HitRateModel"]

_MISSING = -1.0  # every feature is >= 0 when present


class HitRateModel(RegressorMixin, BaseEstimator):  # type: ignore[misc]
    """Predicts the realized hit rate of a (request, instance) pair from its features."""

    def __init__(  # noqa: PLR0913 -- scikit-learn estimators take each hyperparameter as an argument
        self,
        *,
        n_estimators: int = 150,
        learning_rate: float = 0.1,
        max_depth: int = 4,
        min_samples_leaf: int = 20,
        subsample: float = 0.8,
        loss: str = "squared_error",
        base_column: int | None = None,
        fallback_columns: tuple[int, ...] = (),
        group_columns: tuple[int, ...] = (),
        validation_fraction: float = 0.2,
        random_state: int | None = 0,
    ) -> None:
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.subsample = subsample
        self.loss = loss
        self.base_column = base_column
        self.fallback_columns = fallback_columns
        self.group_columns = group_columns
        self.validation_fraction = validation_fraction
        self.random_state = random_state

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True  # a missing feature (no match, no age) is NaN
        return tags

    def _pipeline(self) -> Any:
        trees = GradientBoostingRegressor(
            loss=self.loss,
            n_estimators=self.n_estimators,
            learning_rate=self.learning_rate,
            max_depth=self.max_depth,
            min_samples_leaf=self.min_samples_leaf,
            subsample=self.subsample,
            random_state=self.random_state,
        )
        impute = SimpleImputer(strategy="constant", fill_value=_MISSING, keep_empty_features=True)
        return Pipeline([("impute", impute), ("trees", trees)])

    def _column(self, X: FloatArray, column: int | None) -> FloatArray | float:
        if column is None:
            return 0.0
        if not 0 <= column < X.shape[1]:
            raise ValueError(f"column {column} is not a column of X ({X.shape[1]} columns)")
        return np.nan_to_num(X[:, column], nan=0.0)

    def _groups(self, X: FloatArray) -> npt.NDArray[np.intp]:
        """Group of each row: the index of its one-hot group column, or one past the last."""
        cols = list(self.group_columns)
        if not cols:
            return np.zeros(len(X), dtype=np.intp)
        onehot = np.nan_to_num(X[:, cols], nan=0.0) > 0.5
        return np.where(onehot.any(axis=1), onehot.argmax(axis=1), len(cols)).astype(np.intp)

    def _candidates(self, X: FloatArray, model: FloatArray) -> FloatArray:
        """Rows x (the model, then each fallback column), clipped to [0, 1]."""
        columns = [model, *(self._column(X, c) for c in self.fallback_columns)]
        stacked: FloatArray = np.clip(np.column_stack(columns), 0.0, 1.0)
        return stacked

    def _combine(self, X: FloatArray, residual: FloatArray) -> FloatArray:
        model = np.clip(self._column(X, self.base_column) + residual, 0.0, 1.0)
        if not self.fallback_columns:
            return model
        pick = self.choice_[self._groups(X)] + 1  # 0: the model, k: fallback column k - 1
        out: FloatArray = self._candidates(X, model)[np.arange(len(X)), pick]
        return out

    def fit(self, X: Any, y: Any) -> HitRateModel:
        """Fit on feature rows ``X`` (in time order) and realized hit rates ``y`` (0..1)."""
        X, y = validate_data(
            self, X, y, ensure_all_finite="allow-nan", y_numeric=True, dtype=np.float64
        )
        n = X.shape[0]
        if n < 2:
            raise ValueError(f"HitRateModel needs at least 2 rows, got {n} sample")
        held = round(n * self.validation_fraction) if self.fallback_columns else 0
        cut = n - held if held > 0 and n - held >= 2 else n
        target = y[:cut] - self._column(X[:cut], self.base_column)
        self.pipeline_ = self._pipeline().fit(X[:cut], target)
        self.trees_ = compile_trees(self.pipeline_.named_steps["trees"], _MISSING)
        self.choice_ = np.full(len(self.group_columns) + 1, -1, dtype=np.intp)
        if cut < n:
            rest, truth = X[cut:], y[cut:]
            model = np.clip(self._column(rest, self.base_column) + self.pipeline_.predict(rest),
                            0.0, 1.0)  # fmt: skip
            errors = np.abs(self._candidates(rest, model) - truth[:, None])
            groups = self._groups(rest)
            for g in range(len(self.choice_)):
                mask = groups == g
                if mask.any():
                    mae = errors[mask].mean(axis=0)
                    # the model keeps a group only if it is strictly better than every fallback
                    best = int(np.argmin(mae[1:])) + 1
                    self.choice_[g] = -1 if mae[0] < mae[best] else best - 1
        self.use_model_ = self.choice_ < 0
        return self

    def predict(self, X: Any) -> FloatArray:
        """Predicted hit rates, clipped to [0, 1]."""
        check_is_fitted(self)
        X = validate_data(self, X, reset=False, ensure_all_finite="allow-nan", dtype=np.float64)
        return self._combine(X, self.pipeline_.predict(X))

    def predict_fast(self, X: FloatArray) -> FloatArray:
        """``predict`` without input validation, on the compiled trees: for the scheduler,
        which calls it once per decision on a float array laid out as at fit time."""
        return self._combine(X, predict_compiled(self.trees_, X))
