"""The hit-rate model: scikit-learn's conventions, the compiled fast path, skops files."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import skops.io as sio  # type: ignore[import-untyped]
from sklearn.base import clone  # type: ignore[import-untyped]
from sklearn.exceptions import NotFittedError  # type: ignore[import-untyped]
from sklearn.linear_model import LinearRegression  # type: ignore[import-untyped]
from sklearn.utils.estimator_checks import parametrize_with_checks  # type: ignore[import-untyped]

from router.errors import UserError
from router.predictor.features import FEATURES
from router.predictor.model import HitRateModel
from router.predictor.persist import KIND, load_predictor, save_predictor

MATCH = FEATURES.index("match_frac")
SINCE = FEATURES.index("inserted_since")


def rows(n: int, seed: int = 0) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The index says ``match``; the block survived unless the instance took in more than
    its capacity since (``inserted_since`` > 1): an LRU's behaviour, with missing ages."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, len(FEATURES)))
    x[:, SINCE] = rng.uniform(0, 2, n)
    x[rng.random(n) < 0.1, SINCE] = np.nan
    y = np.where(x[:, SINCE] > 1.0, 0.0, x[:, MATCH])
    return x, y


@parametrize_with_checks(
    [HitRateModel(n_estimators=5)],
    expected_failed_checks=lambda _: {
        "check_regressors_train": "the target is a hit rate: predictions are clipped to [0, 1]"
    },
)
def test_follows_scikit_learn_conventions(estimator: Any, check: Callable[[Any], None]) -> None:
    check(estimator)


def test_learns_the_correction_to_the_index_match() -> None:
    x, y = rows(3000)
    model = HitRateModel(n_estimators=40, base_column=MATCH)
    with pytest.raises(NotFittedError):
        model.predict(x)
    assert model.fit(x[:2000], y[:2000]) is model
    assert {"pipeline_", "trees_", "n_features_in_"} <= set(vars(model))
    pred = model.predict(x[2000:])
    assert pred.min() >= 0.0
    assert pred.max() <= 1.0
    raw_mae = np.abs(x[2000:, MATCH] - y[2000:]).mean()
    assert np.abs(pred - y[2000:]).mean() < 0.3 * raw_mae
    assert clone(model).get_params() == model.get_params()


def test_the_compiled_trees_predict_exactly_what_the_pipeline_does() -> None:
    x, y = rows(1500, seed=1)
    for loss in ("squared_error", "absolute_error"):
        model = HitRateModel(n_estimators=30, loss=loss, base_column=MATCH).fit(x, y)
        probe, _ = rows(400, seed=2)
        np.testing.assert_allclose(model.predict_fast(probe), model.predict(probe), atol=1e-12)


def split_tiers(x: np.ndarray[Any, Any]) -> tuple[list[int], np.ndarray[Any, Any]]:
    """Even rows on P, odd rows on MD (one-hot); the tier columns, and which rows are P."""
    tiers = [FEATURES.index("tier_p"), FEATURES.index("tier_md")]
    x[:, tiers] = 0.0
    on_p = np.arange(len(x)) % 2 == 0
    x[on_p, tiers[0]] = 1.0
    x[~on_p, tiers[1]] = 1.0
    return tiers, on_p


def test_each_tier_keeps_the_model_only_where_it_beat_the_raw_match() -> None:
    x, y = rows(4000, seed=3)
    tiers, on_p = split_tiers(x)
    y[on_p] = x[on_p, MATCH]  # on P the index is exactly right: nothing to learn
    model = HitRateModel(
        n_estimators=40, base_column=MATCH, fallback_columns=(MATCH,), group_columns=tuple(tiers)
    ).fit(x, y)
    assert model.use_model_.tolist()[:2] == [False, True]
    assert model.choice_.tolist()[:2] == [0, -1]
    probe, _ = rows(300, seed=4)
    probe[:, tiers] = [1.0, 0.0]
    np.testing.assert_allclose(model.predict(probe), np.clip(probe[:, MATCH], 0, 1))
    np.testing.assert_allclose(model.predict_fast(probe), model.predict(probe))


def test_a_model_file_round_trips_with_its_features_and_versions(tmp_path: Path) -> None:
    x, y = rows(500)
    model = HitRateModel(n_estimators=10).fit(x, y)
    path = tmp_path / "m.skops"
    save_predictor(path, model, info={"trained_on": "test"})
    loaded = load_predictor(path)
    assert loaded.features == list(FEATURES)
    assert set(loaded.versions) == {"scikit-learn", "skops", "numpy", "pdd-router"}
    assert loaded.info == {"trained_on": "test"}
    np.testing.assert_allclose(loaded.predict(x[:20]), model.predict(x[:20]))
    with zipfile.ZipFile(path) as archive:  # a skops archive, not a pickle
        assert "schema.json" in archive.namelist()


def test_files_that_are_not_a_model_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such model file"):
        load_predictor(tmp_path / "missing.skops")
    text = tmp_path / "log.jsonl"
    text.write_text('{"kind": "decision"}\n')
    with pytest.raises(UserError, match="not a skops model file"):
        load_predictor(text)
    other = tmp_path / "other.skops"
    sio.dump({"kind": "something else", "model": LinearRegression()}, other)
    with pytest.raises(UserError, match="not a pdd-router hit-rate model"):
        load_predictor(other)
    assert KIND == "pdd-router/hit-rate-model"


def test_a_tier_predicts_whichever_fallback_validated_best() -> None:
    route = FEATURES.index("route_frac")
    x, y = rows(4000, seed=5)
    tiers, on_p = split_tiers(x)
    y[on_p] = x[on_p, route]  # on P the router's record is exactly right, the index is not
    model = HitRateModel(
        n_estimators=40,
        base_column=MATCH,
        fallback_columns=(MATCH, route),
        group_columns=tuple(tiers),
    ).fit(x, y)
    assert model.choice_.tolist()[:2] == [1, -1]  # P: the record; MD: the model
    probe, _ = rows(300, seed=6)
    probe[:, tiers] = [1.0, 0.0]
    np.testing.assert_allclose(model.predict(probe), np.clip(probe[:, route], 0, 1))
    np.testing.assert_allclose(model.predict_fast(probe), model.predict(probe))
