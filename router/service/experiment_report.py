"""Per-arm figures of an online experiment with bootstrap intervals on the differences.

Arms see different requests, so a difference from the first arm is bootstrapped by
resampling each arm independently (vectorized: one index matrix per arm). Intervals
are 95% percentile intervals over ``resamples``; a difference whose interval
excludes zero is marked significant. Arms with more than ``max_n`` outcomes are
subsampled (seeded) for the intervals only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from router.service.experiments import Arm, Experiment

__all__ = ["experiment_report"]

Stat = Callable[[npt.NDArray[np.float64]], npt.NDArray[np.float64]]  # (B, n) -> (B,)

_STATS: dict[str, tuple[str, Stat]] = {
    "ttft_p50_s": ("ttft", lambda m: np.percentile(m, 50, axis=1)),
    "ttft_p99_s": ("ttft", lambda m: np.percentile(m, 99, axis=1)),
    "ttft_mean_s": ("ttft", lambda m: m.mean(axis=1)),
    "tpot_p50_s": ("tpot", lambda m: np.percentile(m, 50, axis=1)),
    "sla_attainment": ("sla", lambda m: m.mean(axis=1)),
    "prediction_abs_error": ("error", lambda m: m.mean(axis=1)),
}


def _series(arm: Arm, sla_ttft_s: float, sla_tpot_s: float) -> dict[str, npt.NDArray[np.float64]]:
    outs = arm.outcomes
    ttft = np.array([o.ttft_s for o in outs], dtype=float)
    tpot = np.array([o.tpot_s for o in outs if o.tpot_s is not None], dtype=float)
    met = np.array(
        [o.ttft_s <= sla_ttft_s and (o.tpot_s is None or o.tpot_s <= sla_tpot_s) for o in outs],
        dtype=float,
    )
    error = np.array([o.prediction_error for o in outs if o.prediction_error is not None])
    return {"ttft": ttft, "tpot": tpot, "sla": met, "error": error.astype(float)}


def _resampled(
    values: npt.NDArray[np.float64], stat: Stat, rng: np.random.Generator, resamples: int,
    max_n: int,
) -> npt.NDArray[np.float64] | None:  # fmt: skip
    if len(values) < 2:
        return None
    if len(values) > max_n:
        values = rng.choice(values, max_n, replace=False)
    idx = rng.integers(0, len(values), size=(resamples, len(values)))
    return stat(values[idx])


def experiment_report(
    experiment: Experiment,
    *,
    sla_ttft_s: float,
    sla_tpot_s: float,
    resamples: int = 1000,
    max_n: int = 5000,
    seed: int = 0,
) -> dict[str, Any]:
    """The JSON body of GET /v1/experiments/{id}."""
    rng = np.random.default_rng(seed)
    series = [_series(arm, sla_ttft_s, sla_tpot_s) for arm in experiment.arms]
    arms_out: list[dict[str, Any]] = []
    base_boot: dict[str, npt.NDArray[np.float64] | None] = {}
    for i, (arm, data) in enumerate(zip(experiment.arms, series, strict=True)):
        metrics: dict[str, Any] = {}
        for name, (key, stat) in _STATS.items():
            values = data[key]
            value = float(stat(values[None, :])[0]) if len(values) else None
            entry: dict[str, Any] = {"value": value}
            boot = _resampled(values, stat, rng, resamples, max_n)
            if i == 0:
                base_boot[name] = boot
            elif boot is not None and base_boot.get(name) is not None and value is not None:
                base = base_boot[name]
                assert base is not None
                diff = boot - base
                low, high = np.percentile(diff, [2.5, 97.5])
                first = arms_out[0]["metrics"][name]["value"]
                entry["diff_vs_first"] = value - first if first is not None else None
                entry["ci95"] = [float(low), float(high)]
                entry["significant"] = bool(low > 0 or high < 0)
            metrics[name] = entry
        arms_out.append({
            "name": arm.spec.name,
            "policy": arm.spec.policy,
            "params": arm.spec.params,
            "weight": arm.spec.weight,
            "requests": arm.requests,
            "pipelines": dict(sorted(arm.pipelines.items())),
            "metrics": metrics,
        })  # fmt: skip
    return {
        "id": experiment.id,
        "name": experiment.spec.name,
        "status": experiment.status,
        "created": experiment.created,
        "stopped": experiment.stopped,
        "sla": {"ttft_s": sla_ttft_s, "tpot_s": sla_tpot_s},
        "arms": arms_out,
    }
