"""Training: which features a model sees, which rows validate it, logs that lack a
feature, the saved model on the scheduler's full rows, and leave-one-kind-out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from router.errors import UserError
from router.predictor.cross_eval import concat, leave_one_kind_out
from router.predictor.dataset import Dataset
from router.predictor.features import FEATURES, TRANSFERABLE
from router.predictor.persist import load_predictor
from router.predictor.train import (
    TrainParams,
    fit_model,
    model_features,
    time_order,
    train_and_save,
)

LRU = FEATURES.index("lru_frac")
MATCH = FEATURES.index("match_frac")


def dataset(n: int, seed: int, *, logs: int = 1, t0: float = 0.0, scale: float = 1.0) -> Dataset:
    """Rows where the realized hit is what an LRU would hold (``lru_frac``), while the
    index says more (``match_frac``), and absolute features differ by ``scale``."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, len(FEATURES)))
    tier = rng.choice(["p", "md"], n)
    x[:, FEATURES.index("tier_p")] = tier == "p"
    x[:, FEATURES.index("tier_md")] = tier == "md"
    x[:, FEATURES.index("tier_rld")] = 0.0
    x[:, LRU] = rng.random(n) * x[:, MATCH]
    x[:, FEATURES.index("log_input")] *= scale  # an absolute size: differs between traces
    y = x[:, LRU].copy()
    return Dataset(
        X=x,
        y=y,
        tier=tier.astype(np.str_),
        t=t0 + np.arange(n, dtype=np.float64),
        raw=x[:, MATCH].copy(),
        approx=x[:, FEATURES.index("route_frac")].copy(),
        log=np.arange(n) % logs,
        index_mode=np.full(n, "approximate").astype(np.str_),
    )


def test_the_default_model_sees_only_features_that_transfer() -> None:
    params = TrainParams()
    chosen = model_features(params, FEATURES)
    assert set(chosen) == set(TRANSFERABLE)  # base, fallbacks and tiers are among them
    assert chosen == [f for f in FEATURES if f in chosen]  # in the log's order
    for absolute in ("log_input", "chain_blocks", "match_age_s", "queued", "wait_s"):
        assert absolute not in chosen
    assert model_features(TrainParams(features="all"), FEATURES) == list(FEATURES)
    assert TrainParams(features="transferable").features == TRANSFERABLE
    few = model_features(TrainParams(features="occupancy, kv_used_frac"), FEATURES)
    assert set(few) == {"tier_p", "tier_rld", "tier_md", "occupancy", "kv_used_frac",
                        "known_frac", "lru_frac", "match_frac", "route_frac"}  # fmt: skip
    with pytest.raises(UserError, match="unknown feature nope"):
        model_features(TrainParams(features=("nope",)), FEATURES)


def test_a_mistyped_training_parameter_is_named_with_the_valid_ones(tmp_path: Path) -> None:
    with pytest.raises(UserError) as info:
        train_and_save(dataset(50, 0), [], tmp_path / "m.skops", params={"n_estimator": 3})
    message = str(info.value)
    assert "n_estimator: unknown parameter; training parameters: " in message
    assert "n_estimators" in message


def test_validation_rows_are_the_latest_of_every_log() -> None:
    data = dataset(100, 0, logs=2)
    order = time_order(data, 0.2)
    assert sorted(order.tolist()) == list(range(100))
    late = order[80:]
    for log in (0, 1):
        mine = np.flatnonzero(data.log == log)
        assert set(late[data.log[late] == log]) == set(mine[-10:])


def test_logs_without_the_base_feature_are_refused_in_one_line() -> None:
    data = dataset(200, 1)
    data.X[:, LRU] = np.nan  # a log from a pdd-router that did not compute lru_frac
    with pytest.raises(UserError, match="never give lru_frac"):
        fit_model(data)
    model, features = fit_model(data, TrainParams(fallback_features=("match_frac",)))
    assert "lru_frac" in features  # a NaN column the trees may ignore
    assert model.predict_fast(data.X[:5, [FEATURES.index(f) for f in features]]).shape == (5,)


def test_a_saved_model_predicts_on_the_schedulers_full_rows(tmp_path: Path) -> None:
    from router.predictor.train import train_and_save

    data = dataset(400, 2)
    report = train_and_save(data, [tmp_path / "log.jsonl"], tmp_path / "m.skops",
                            params={"n_estimators": 20})  # fmt: skip
    loaded = load_predictor(tmp_path / "m.skops")
    assert set(loaded.features) == set(TRANSFERABLE)
    assert report.params.fallback_features == ("match_frac", "route_frac", "lru_frac")
    pred = loaded.predict(data.X)  # laid out as FEATURES, as the scheduler builds them
    assert np.abs(pred - data.y).mean() < 0.5 * np.abs(data.raw - data.y).mean()


def test_leave_one_kind_out_holds_out_each_kind_and_never_trains_on_test_only() -> None:
    kinds = {
        "a": dataset(300, 3),
        "b": dataset(300, 4, scale=10.0),
        "c": dataset(300, 5, scale=100.0),
    }
    report = leave_one_kind_out(kinds, TrainParams(n_estimators=20), test_only=["c"])
    by = {(r.held_out, r.tier): r for r in report.rows}
    assert set(by) == {(k, t) for k in kinds for t in ("md", "p", "all")}
    assert by[("a", "all")].trained_on == ["b"]
    assert by[("c", "all")].trained_on == ["a", "b"]
    for r in report.rows:
        assert r.model_mae <= 0.5 * r.index_mae  # the rule carries over: hit = lru_frac
        assert r.lru_mae == pytest.approx(0.0, abs=1e-9)
    merged = concat(list(kinds.values()))
    assert len(merged) == 900
    assert sorted(set(merged.log.tolist())) == [0, 1, 2]  # each part keeps its own log
    with pytest.raises(UserError, match="at least two kinds"):
        leave_one_kind_out({"a": kinds["a"]})
    with pytest.raises(UserError, match="no such kind"):
        leave_one_kind_out(kinds, test_only=["z"])
