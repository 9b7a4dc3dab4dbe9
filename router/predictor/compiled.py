"""A fitted gradient-boosted ensemble as flat numpy arrays, for decision-time prediction.

scikit-learn's ``predict`` validates its input at every step of a pipeline, which costs
milliseconds per call whatever the number of rows; the scheduler calls the model once
per decision on about ten rows. The trees of a fitted ``GradientBoostingRegressor``
(its public ``estimators_[i, 0].tree_`` arrays) are stacked here into one node table
and walked for all trees and rows at once, one level per numpy step. The result equals
the pipeline's prediction (the tests check it); nothing is approximated.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from router.predictor.features import FloatArray

__all__ = ["compile_trees", "predict_compiled"]

Trees = dict[str, Any]


def compile_trees(gbr: Any, fill_value: float) -> Trees:
    """Node tables of a fitted GradientBoostingRegressor (squared or absolute loss)."""
    features: list[npt.NDArray[np.int64]] = []
    thresholds: list[FloatArray] = []
    left: list[npt.NDArray[np.int64]] = []
    right: list[npt.NDArray[np.int64]] = []
    values: list[FloatArray] = []
    offset = 0
    depth = 0
    for estimator in gbr.estimators_[:, 0]:
        tree = estimator.tree_
        n = int(tree.node_count)
        leaf = tree.children_left == -1
        own = np.arange(n, dtype=np.int64) + offset
        features.append(np.where(leaf, 0, tree.feature).astype(np.int64))
        thresholds.append(np.where(leaf, np.inf, tree.threshold).astype(np.float64))
        left.append(np.where(leaf, own, tree.children_left + offset).astype(np.int64))
        right.append(np.where(leaf, own, tree.children_right + offset).astype(np.int64))
        values.append(np.asarray(tree.value, dtype=np.float64).reshape(n))
        depth = max(depth, int(tree.max_depth))
        offset += n
    roots = np.cumsum([0] + [len(f) for f in features[:-1]]).astype(np.int64)
    return {
        "feature": np.concatenate(features),
        "threshold": np.concatenate(thresholds),
        "left": np.concatenate(left),
        "right": np.concatenate(right),
        "value": np.concatenate(values),
        "roots": roots,
        "depth": depth,
        "scale": float(gbr.learning_rate),
        "init": float(np.ravel(gbr.init_.constant_)[0]),
        "fill": float(fill_value),
    }


def predict_compiled(trees: Trees, X: FloatArray) -> FloatArray:
    """The ensemble's raw prediction of rows ``X`` (NaN imputed with the fill value)."""
    x = np.where(np.isnan(X), trees["fill"], X)
    # sklearn's trees compare float32 inputs with float64 thresholds
    x = x.astype(np.float32).astype(np.float64)
    rows = np.arange(len(x))[None, :]
    node = np.broadcast_to(trees["roots"][:, None], (len(trees["roots"]), len(x)))
    feature, threshold = trees["feature"], trees["threshold"]
    left, right = trees["left"], trees["right"]
    for _ in range(trees["depth"]):
        go_left = x[rows, feature[node]] <= threshold[node]
        node = np.where(go_left, left[node], right[node])
    out: FloatArray = trees["init"] + trees["scale"] * trees["value"][node].sum(axis=0)
    return out
