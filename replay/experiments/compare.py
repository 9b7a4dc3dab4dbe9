"""Offline A/B: replay one trace with one seed under several policies and compare them.

``run_compare`` replays the trace once per policy (same seed, rate scale, SLA; the
same preset, unless a policy names its own as ``NAME@PRESET``: then the arms are
deployments) and, for every metric of ``summary.json``, gives each policy's value and its
difference from the first policy (the baseline) with a 95% bootstrap interval:
per-request paired differences for latencies and per-request figures, fixed time
windows for rates (see ``replay.experiments.compare_stats``). An interval that excludes zero
marks the difference as significant. The arms are independent replays: with an
``executor`` of W workers they run W at a time, with the same results.

Policies are given as ``NAME`` or ``NAME:KEY=VALUE[,KEY=VALUE...]`` (values are YAML
scalars), e.g. ``pdd:wan_budget_s=0.5,chunk_tokens=32``; the text is the policy's
label in the outputs and must be unique.

``compare.json`` (``CompareResult.to_json``)::

    {
      "schema": "pdd-router/compare/2",
      "trace": str, "preset": str,           # the baseline's preset
      "deployments": bool,                   # the arms run on different presets
      "seed": int, "rate_scale": float,
      "sla": {"ttft_s": float, "tpot_s": float},
      "baseline": str,                       # label of the first policy
      "policies": [{"label": str, "policy": str, "params": {...},
                    "preset": str}, ...],    # each arm's own preset
      "bootstrap": {"resamples": int, "level": 0.95, "seed": int, "requests": int,
                    "window_s": float, "windows": int,
                    "interval": "percentile of the bootstrap differences"},
      "metrics": [{
        "key": "ttft_s.p99",                 # dotted path into summary.json
        "label": "TTFT P99", "unit": "s",
        "better": "lower" | "higher" | null,
        "method": "requests" | "windows" | null,   # null: no interval (see compare_stats)
        "values": {label: float | null, ...},      # as in each policy's summary.json
        "differences": {label: {                   # every policy but the baseline
            "difference": float | null,            # value - baseline value
            "relative": float | null,              # difference / |baseline value|
            "ci": [low, high] | null,
            "significant": bool | null             # the interval excludes 0
        }, ...}
      }, ...],
      "bathtub": {...} | null,               # replay.experiments.bathtub.Bathtub.to_json
      "summaries": {label: summary.json, ...}
    }

``compare.csv`` (``replay.experiments.compare_csv``): the metrics above as one row per metric
and policy, with their units, values, differences and interval bounds.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from replay.experiments.bathtub import Bathtub, bathtub
from replay.experiments.bootstrap import Interval, Statistic, bootstrap_differences, interval
from replay.experiments.compare_stats import (
    MetricSpec,
    PolicyData,
    metric_specs,
    policy_data,
    window_of,
)
from replay.experiments.executor import Executor
from replay.experiments.experiment_config import CompareConfig
from replay.experiments.policy_spec import PolicySpec, parse_policy_specs
from replay.experiments.replay_job import run_jobs
from replay.metrics.hit_buckets import load_hit_rates, rates_of
from replay.runner.run import ReplayResult
from replay.sim.simulator import ProgressObserver

__all__ = [
    "CompareConfig",
    "CompareResult",
    "Difference",
    "MetricRow",
    "PolicySpec",
    "auto_window",
    "compare_results",
    "parse_policy_specs",
    "run_compare",
]

SCHEMA = "pdd-router/compare/2"
MIN_WINDOWS = 30


@dataclass(frozen=True, slots=True)
class Difference:
    """A policy's difference from the baseline on one metric."""

    difference: float | None
    relative: float | None
    ci: Interval | None

    @property
    def significant(self) -> bool | None:
        return None if self.ci is None else self.ci.excludes_zero

    def to_json(self) -> dict[str, Any]:
        ci = None if self.ci is None else [round(self.ci.low, 9), round(self.ci.high, 9)]
        return {
            "difference": self.difference,
            "relative": self.relative,
            "ci": ci,
            "significant": self.significant,
        }


@dataclass(frozen=True, slots=True)
class MetricRow:
    """One metric: each policy's value, and each later policy's difference from the first."""

    spec: MetricSpec
    values: list[float | None]
    differences: list[Difference]


@dataclass(frozen=True, slots=True)
class CompareResult:
    """What ``replay compare`` produced; ``to_json`` is compare.json."""

    specs: list[PolicySpec]
    results: list[ReplayResult]
    rows: list[MetricRow]
    resamples: int
    seed: int
    window_s: float
    windows: int
    level: float = 0.95
    bathtub: Bathtub | None = None
    hit_rates: dict[int, float] | None = field(default=None, repr=False)

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.specs]

    @property
    def presets(self) -> list[str]:
        """The preset each arm ran on, in the arms' order."""
        return [r.summary.preset for r in self.results]

    @property
    def deployments(self) -> bool:
        """Whether the arms ran on different presets (deployments, not only policies)."""
        return len(set(self.presets)) > 1

    def to_json(self) -> dict[str, Any]:
        first = self.results[0].summary
        labels = self.labels
        return {
            "schema": SCHEMA,
            "trace": first.trace,
            "preset": first.preset,
            "deployments": self.deployments,
            "seed": first.seed,
            "rate_scale": first.rate_scale,
            "sla": first.sla.model_dump(mode="json"),
            "baseline": labels[0],
            "policies": [
                {
                    "label": s.label,
                    "policy": s.name,
                    "params": dict(s.params),
                    "preset": r.summary.preset,
                }
                for s, r in zip(self.specs, self.results, strict=True)
            ],
            "bootstrap": {
                "resamples": self.resamples,
                "level": self.level,
                "seed": self.seed,
                "requests": first.requests,
                "window_s": self.window_s,
                "windows": self.windows,
                "interval": "percentile of the bootstrap differences",
            },
            "metrics": [
                {
                    "key": row.spec.key,
                    "label": row.spec.label,
                    "unit": row.spec.unit,
                    "better": row.spec.better,
                    "method": row.spec.method,
                    "values": dict(zip(labels, row.values, strict=True)),
                    "differences": {
                        label: d.to_json()
                        for label, d in zip(labels[1:], row.differences, strict=True)
                    },
                }
                for row in self.rows
            ],
            "bathtub": None if self.bathtub is None else self.bathtub.to_json(),
            "summaries": {
                label: r.summary.model_dump(mode="json")
                for label, r in zip(labels, self.results, strict=True)
            },
        }

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")


def auto_window(duration_s: float, window_s: float | None) -> float:
    """The rate window: ``window_s`` if given, else 60 s shortened to give 30 windows."""
    if window_s is not None:
        return window_s
    return min(60.0, duration_s / MIN_WINDOWS) if duration_s > 0 else 60.0


def _difference(a: float | None, b: float | None, ci: Interval | None) -> Difference:
    if a is None or b is None:
        return Difference(None, None, None)
    diff = round(b - a, 9)
    relative = round(diff / abs(a), 6) if a != 0 else None
    return Difference(diff, relative, ci)


def compare_results(
    specs: Sequence[PolicySpec],
    results: Sequence[ReplayResult],
    *,
    resamples: int = 1000,
    seed: int = 0,
    window_s: float | None = None,
    hit_rates: Mapping[int, float] | None = None,
) -> CompareResult:
    """Paired comparison of replays of one trace (the first result is the baseline)."""
    ids = sorted(r.request_id for r in results[0].records)
    for spec, result in zip(specs, results, strict=True):
        if sorted(r.request_id for r in result.records) != ids:
            raise ValueError(f"{spec.label}: not the same requests as {specs[0].label}")
    ordered = [sorted(r.records, key=lambda x: x.request_id) for r in results]
    arrival = np.array([r.arrival_s for r in ordered[0]], dtype=np.float64)
    window = auto_window(results[0].summary.trace_duration_s, window_s)
    windows = window_of(arrival, window)
    data = [policy_data(r.summary, recs, windows) for r, recs in zip(results, ordered, strict=True)]
    metrics = metric_specs([r.summary for r in results])
    n_windows = int(windows.max()) + 1
    request_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    window_rng = np.random.default_rng(np.random.SeedSequence([seed, 2]))
    draws: dict[str, dict[str, np.ndarray[Any, np.dtype[np.float64]]]] = {}
    for method, units, rng in (
        ("requests", len(ids), request_rng),
        ("windows", n_windows, window_rng),
    ):
        pairs: dict[str, tuple[Statistic, Statistic]] = {}
        for metric in metrics:
            if metric.method == method and metric.stat is not None:
                for j in range(1, len(data)):
                    pairs[f"{metric.key}@{j}"] = (metric.stat(data[0]), metric.stat(data[j]))
        # one unit cannot vary: no interval rather than a zero-width one
        draws[method] = (
            bootstrap_differences(pairs, units, resamples, rng) if pairs and units > 1 else {}
        )
    rows = [_row(metric, data, draws) for metric in metrics]
    tub = None
    if hit_rates is not None:
        rates = rates_of([r.request_id for r in ordered[0]], hit_rates)
        tub = bathtub(
            [s.label for s in specs],
            rates,
            [d.values["met"] for d in data],
            [d.values["ttft_s"] for d in data],
            resamples=resamples,
            seed=seed,
        )
    return CompareResult(
        list(specs), list(results), rows, resamples, seed, window, n_windows,
        bathtub=tub, hit_rates=dict(hit_rates) if hit_rates is not None else None,
    )  # fmt: skip


def _row(
    spec: MetricSpec,
    data: Sequence[PolicyData],
    draws: Mapping[str, Mapping[str, np.ndarray[Any, np.dtype[np.float64]]]],
) -> MetricRow:
    values = [spec.value(d.summary) for d in data]
    differences = []
    for j in range(1, len(data)):
        ci = None
        if spec.method is not None and values[0] is not None and values[j] is not None:
            got = draws[spec.method].get(f"{spec.key}@{j}")
            ci = interval(got) if got is not None else None
        differences.append(_difference(values[0], values[j], ci))
    return MetricRow(spec, values, differences)


def run_compare(
    config: CompareConfig,
    *,
    progress: Callable[[str], ProgressObserver | None] | None = None,
    executor: Executor | None = None,
    on_replays: Callable[[int, int], None] | None = None,
) -> CompareResult:
    """Replay the trace under each policy (texts as on the command line) and compare them.
    A policy written ``NAME@PRESET`` runs on its own cluster, the others on the config's
    preset: deployments compare as policies do, request by request. Every arm has the
    config's ``replay`` settings.

    Serial (``executor`` None or serial): the arms one after the other, ``progress(label)``
    giving each its observer; else the arms at once on the executor's workers,
    ``on_replays(finished, arms)`` as each finishes. The result is the same either way."""
    specs = parse_policy_specs(config.policies, minimum=2)
    jobs = [
        config.replay.replay(config.trace, spec.preset_or(config.preset), spec.name, spec.params)
        for spec in specs
    ]

    def observer(i: int) -> ProgressObserver | None:
        return progress(specs[i].label) if progress is not None else None

    def finished(n: int) -> None:
        if on_replays is not None:
            on_replays(n, len(jobs))

    results = run_jobs(executor, jobs, observer=observer, on_done=finished)
    return compare_results(
        specs,
        results,
        resamples=config.resamples,
        seed=config.replay.seed,
        window_s=config.window_s,
        hit_rates=load_hit_rates(config.trace),
    )
