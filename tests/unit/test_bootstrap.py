"""The vectorized bootstrap: statistics equal numpy's, pairing narrows intervals, coverage."""

from __future__ import annotations

import numpy as np
import pytest

from replay.experiments.bootstrap import (
    Resample,
    bootstrap_differences,
    identity,
    interval,
    mean,
    percentile,
    ratio,
    total,
)


def _with_gaps(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.lognormal(0.0, 1.0, size=n)
    values[rng.random(n) < 0.1] = np.nan
    return values


@pytest.mark.parametrize("q", [0.0, 1.0, 50.0, 90.0, 99.0, 100.0])
def test_percentile_on_the_identity_resample_is_numpys(q: float) -> None:
    values = _with_gaps(777, 1)
    got = percentile(values, q)(identity(values.size))[0]
    assert got == pytest.approx(np.nanpercentile(values, q), rel=1e-12)


def test_statistics_of_resamples_equal_numpy_on_the_drawn_samples() -> None:
    values = _with_gaps(300, 2)
    rng = np.random.default_rng(3)
    draws = rng.integers(0, values.size, size=(6, values.size))
    weights = np.stack([np.bincount(row, minlength=values.size) for row in draws])
    block = Resample(weights.astype(np.float64))
    for q in (10.0, 50.0, 99.0):
        expected = [np.nanpercentile(values[row], q) for row in draws]
        assert percentile(values, q)(block) == pytest.approx(expected, rel=1e-12)
    assert mean(values)(block) == pytest.approx([np.nanmean(values[row]) for row in draws])
    ones = np.ones_like(values)
    assert total(ones, 2.0)(block) == pytest.approx([2.0 * values.size] * 6)
    assert ratio(np.nan_to_num(values), ones)(block) == pytest.approx(
        [np.nansum(values[row]) / values.size for row in draws]
    )


def test_a_constant_paired_shift_has_a_zero_width_interval() -> None:
    a = _with_gaps(500, 4)
    b = a + 0.25
    diffs = bootstrap_differences(
        {"mean": (mean(a), mean(b))}, a.size, 400, np.random.default_rng(0)
    )
    ci = interval(diffs["mean"])
    assert ci is not None
    assert ci.low == pytest.approx(0.25)
    assert ci.high == pytest.approx(0.25)
    assert ci.excludes_zero


def test_pairing_makes_the_interval_much_narrower_than_the_spread() -> None:
    rng = np.random.default_rng(5)
    a = rng.exponential(1.0, size=2000)
    b = a * 0.98 + rng.normal(0.0, 0.01, size=a.size)  # the same requests, a bit faster
    diffs = bootstrap_differences(
        {"p90": (percentile(a, 90.0), percentile(b, 90.0))}, a.size, 500, rng
    )
    ci = interval(diffs["p90"])
    assert ci is not None
    assert ci.high < 0.0  # the 2% gain is significant although both spreads are ~1
    unpaired_se = np.sqrt(2.0) * a.std() / np.sqrt(a.size)
    assert ci.high - ci.low < unpaired_se


def test_the_interval_covers_the_true_difference_about_95_percent_of_the_time() -> None:
    rng = np.random.default_rng(6)
    covered = 0
    trials = 120
    for _ in range(trials):
        a = rng.exponential(1.0, size=150)
        b = rng.exponential(1.0, size=150) + 0.1  # true mean difference 0.1
        diffs = bootstrap_differences({"m": (mean(a), mean(b))}, a.size, 400, rng)
        ci = interval(diffs["m"])
        assert ci is not None
        covered += ci.low <= 0.1 <= ci.high
    assert 0.88 <= covered / trials <= 0.99


def test_same_seed_same_interval_and_no_interval_without_data() -> None:
    a, b = _with_gaps(200, 7), _with_gaps(200, 8)
    pair = {"p50": (percentile(a, 50.0), percentile(b, 50.0))}
    first = interval(bootstrap_differences(pair, a.size, 300, np.random.default_rng(9))["p50"])
    again = interval(bootstrap_differences(pair, a.size, 300, np.random.default_rng(9))["p50"])
    assert first == again
    empty = np.full(10, np.nan)
    diffs = bootstrap_differences(
        {"x": (mean(empty), mean(empty))}, 10, 100, np.random.default_rng(0)
    )
    assert interval(diffs["x"]) is None
