"""Capacity by bisection: the highest arrival rate at which enough requests meet the SLA.

``run_sweep`` replays the trace at several ``--rate-scale`` values (each probe is a
full replay with the same seed). From the starting scale it doubles (or halves) until
one probe meets the target SLA attainment (default 90%) and one misses it, then
bisects between the highest passing and the lowest failing scale until they are
within ``tolerance`` of each other (relative) or ``max_probes`` replays have run.

The highest passing probe's arrival rate (requests over the trace's duration at that
scale) is the policy's capacity on the trace's own timing; the probe's
``sla_goodput_req_s`` (SLA-meeting requests per second, at least ``target`` of the rate)
is its SLA goodput there. Attainment need not fall monotonically with the rate, so the
answer is a crossing point found by bisection, not a proof that no higher rate passes.

On W workers (``executor``: processes or Ray) each round replays the next probe together
with the probes that may follow it (``replay.experiments.sweep_search.speculate``) and
keeps those on the path the serial search takes: the same probes, the same sweep.json,
in about 1/log2(W + 1) of the rounds (W = 3: half; W = 7: a third; W = 2: two thirds on
average), each round as long as its slowest replay when there are W cores.

The words are the README's: *capacity* is an arrival rate (req/s), the highest at which
``target`` of the requests meet the SLA; *SLA goodput* is the requests per second that
met the SLA at a given arrival rate (a probe's ``sla_goodput_req_s``, as in ``replay
run``); *BCR* is the SLA goodput at capacity per 1000 USD/h of the cluster's cost.
``sla_attainment`` is a fraction (0-1) in the JSON and a percentage in the printed table.

``sweep.json`` (``SweepResult.to_json``)::

    {"schema": "pdd-router/sweep/2", "trace", "preset", "policy", "params", "seed",
     "sla": {...}, "target": 0.9, "tolerance": 0.02,   # target: a fraction
     "capacity_req_s": float | null,        # the capacity (see below)
     "capacity_low_req_s": float | null, "capacity_high_req_s": float | null,  # 95%
     "sla_goodput_at_capacity_req_s": float | null,
     "bcr_per_1000_usd_h": float | null,    # sla_goodput_at_capacity_req_s per 1000 USD/h
     "trace_timing_capacity_req_s": float | null,  # the best probe's arrival rate
     "cost_per_hour": float,                # USD/h
     "best": probe | null, "bracketed": bool,  # false: no failing probe was found
     "probes": [{"rate_scale", "arrival_rate_req_s",
                 "sla_attainment",          # fraction of requests meeting the SLA
                 "sla_goodput_req_s",       # req/s meeting the SLA at that rate
                 "ttft_p99_s", "passed"}, ...],   # in the order they ran
     "capacity": {...every probe...} | null,
     "warnings": [text, ...],  # trace too short, not monotone, answers apart, extrapolated
     "units": {key: meaning}}               # the units above, in the file itself

With a steady window (``steady``, what ``replay sweep`` runs by default) the capacity is
measured again at steady state (``capacity``): the trace tiled to a window past a warm-up
at each rate (a short trace would otherwise be judged on a burst), bisected from the
bisection's answer per seed, with a 95% interval over seeds and windows. Then
``capacity_req_s``, its interval, the SLA goodput at capacity and the BCR are the steady
state's; without it (``--window 0``) they are the best probe's (no interval), and
``trace_timing_capacity_req_s`` always is. One capacity, one BCR per file.

``probes.csv`` (``SweepResult.write_probes_csv``): one row per probe, in the order they
ran, with the probe's columns above and ``probe`` (its number) and ``best`` (the probe
whose arrival rate is the capacity on the trace's timing).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from replay.experiments.capacity import CapacityResult, CapacitySettings
from replay.experiments.capacity_job import CapacityJob, run_capacity_job
from replay.experiments.executor import Executor, SerialExecutor
from replay.experiments.experiment_config import SweepConfig, SweepSearch
from replay.experiments.policy_spec import PolicySpec, parse_policy_spec
from replay.experiments.replay_job import run_jobs
from replay.experiments.sweep_search import Bisection, SearchState, speculate
from replay.metrics.bcr import bcr_per_1000_usd_h
from replay.metrics.summary import Summary
from replay.runner.config import ReplayConfig
from replay.runner.run import ReplayResult
from replay.sim.simulator import ProgressObserver

__all__ = ["Probe", "SweepConfig", "SweepResult", "SweepSearch", "run_sweep"]

SCHEMA = "pdd-router/sweep/2"

UNITS: dict[str, str] = {
    "capacity_req_s": "req/s: the highest arrival rate at which the target share meets the "
    "SLA (at steady state when measured, else trace_timing_capacity_req_s)",
    "sla_goodput_at_capacity_req_s": "req/s: requests meeting the SLA per second at capacity",
    "bcr_per_1000_usd_h": "req/s per 1000 USD/h: sla_goodput_at_capacity_req_s over "
    "cost_per_hour / 1000",
    "trace_timing_capacity_req_s": "req/s: the highest probe arrival rate "
    "(arrival_rate_req_s) meeting the target, on the trace's own timing",
    "cost_per_hour": "USD/h",
    "target": "fraction (0-1) of requests that must meet the SLA",
    "arrival_rate_req_s": "req/s: the probe's arrival rate (requests over the trace's duration)",
    "sla_attainment": "fraction (0-1) of the probe's requests meeting the SLA",
    "sla_goodput_req_s": "req/s: the probe's SLA goodput (requests meeting the SLA per "
    "second, at its arrival rate)",
    "ttft_p99_s": "seconds",
}
PROBE_COLUMNS = (
    "probe", "rate_scale", "arrival_rate_req_s", "sla_attainment", "sla_goodput_req_s",
    "ttft_p99_s", "passed", "best",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Probe:
    """One replay of the sweep."""

    rate_scale: float
    arrival_rate_req_s: float
    sla_attainment: float
    sla_goodput_req_s: float
    ttft_p99_s: float | None
    passed: bool

    @classmethod
    def of(cls, summary: Summary, target: float) -> Probe:
        duration = summary.trace_duration_s
        return cls(
            rate_scale=summary.rate_scale,
            arrival_rate_req_s=round(summary.requests / duration, 6) if duration > 0 else 0.0,
            sla_attainment=summary.sla_attainment,
            sla_goodput_req_s=summary.sla_goodput_req_s,
            ttft_p99_s=summary.ttft_s.p99,
            passed=summary.sla_attainment >= target,
        )


@dataclass(frozen=True, slots=True)
class SweepResult:
    """The probes, the best passing one and its replay (for the report)."""

    spec: PolicySpec
    target: float
    tolerance: float
    probes: list[Probe]
    best: Probe | None
    best_result: ReplayResult | None
    cost_per_hour: float
    bracketed: bool
    first: Summary = field(repr=False)
    steady: CapacityResult | None = None  # capacity at steady state, when measured

    @property
    def trace_timing_capacity_req_s(self) -> float | None:
        """The bisection's answer: the best probe's arrival rate, on the trace's timing."""
        return self.best.arrival_rate_req_s if self.best is not None else None

    @property
    def capacity_req_s(self) -> float | None:
        """The capacity: at steady state when measured, else on the trace's timing."""
        if self.steady is not None:
            return self.steady.capacity_req_s
        return self.trace_timing_capacity_req_s

    @property
    def sla_goodput_at_capacity_req_s(self) -> float | None:
        if self.steady is not None:
            return self.steady.sla_goodput_req_s
        return self.best.sla_goodput_req_s if self.best is not None else None

    @property
    def bcr_per_1000_usd_h(self) -> float | None:
        """BCR: the SLA goodput at capacity (req/s) per 1000 USD/h."""
        good = self.sla_goodput_at_capacity_req_s
        if good is None or self.cost_per_hour <= 0:
            return None
        return round(bcr_per_1000_usd_h(good, self.cost_per_hour), 6)

    @property
    def best_number(self) -> int | None:
        """The best probe's number (1-based, in the order the probes ran)."""
        if self.best is None:
            return None
        return next(i for i, p in enumerate(self.probes, start=1) if p is self.best)

    def header(self, schema: str) -> dict[str, Any]:
        """What a file about this sweep's deployment starts with (sweep.json, overload.json)."""
        s = self.first
        return {
            "schema": schema,
            "trace": s.trace,
            "preset": s.preset,
            "policy": self.spec.label,
            "params": dict(self.spec.params),
            "seed": s.seed,
            "sla": s.sla.model_dump(mode="json"),
            "target": self.target,
        }

    def to_json(self) -> dict[str, Any]:
        c = self.steady
        return {
            **self.header(SCHEMA),
            "tolerance": self.tolerance,
            "capacity_req_s": self.capacity_req_s,
            "capacity_low_req_s": None if c is None else c.capacity_low_req_s,
            "capacity_high_req_s": None if c is None else c.capacity_high_req_s,
            "sla_goodput_at_capacity_req_s": self.sla_goodput_at_capacity_req_s,
            "bcr_per_1000_usd_h": self.bcr_per_1000_usd_h,
            "trace_timing_capacity_req_s": self.trace_timing_capacity_req_s,
            "cost_per_hour": self.cost_per_hour,
            "best": None if self.best is None else _probe_json(self.best),
            "bracketed": self.bracketed,
            "probes": [_probe_json(p) for p in self.probes],
            "capacity": None if c is None else c.model_dump(mode="json"),
            "warnings": self.warnings(),
            "units": UNITS,
        }

    def warnings(self) -> list[str]:
        """The steady-state search's warnings, and the burst answer's distance from it."""
        c = self.steady
        if c is None:
            return []
        out = list(c.warnings)
        burst = self.trace_timing_capacity_req_s
        if burst is not None and c.capacity_req_s > 0:
            off = burst / c.capacity_req_s - 1.0
            if abs(off) > 2 * self.tolerance:
                span = self.first.trace_duration_s * self.first.rate_scale / burst_scale(self)
                out.append(
                    f"on the trace's own timing the sweep's answer is {burst:.3f} req/s "
                    f"(the whole trace arriving in {span:.0f} s), {off:+.0%} from the "
                    f"steady-state capacity {c.capacity_req_s:.3f} req/s: trust the latter"
                )
        return out

    def write_json(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")

    def write_probes_csv(self, path: Path) -> None:
        """One row per probe (``PROBE_COLUMNS``), the units of sweep.json."""
        path.parent.mkdir(parents=True, exist_ok=True)
        best = self.best_number
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(PROBE_COLUMNS)
            for i, p in enumerate(self.probes, start=1):
                ttft = "" if p.ttft_p99_s is None else p.ttft_p99_s
                writer.writerow([
                    i, p.rate_scale, p.arrival_rate_req_s, p.sla_attainment,
                    p.sla_goodput_req_s, ttft, p.passed, i == best,
                ])  # fmt: skip


def burst_scale(result: SweepResult) -> float:
    """The best probe's rate scale (1 without one)."""
    return result.best.rate_scale if result.best is not None else 1.0


def _steady(
    config: SweepConfig, preset: str, spec: PolicySpec, start_req_s: float
) -> CapacityResult:
    """Capacity at steady state, started from the sweep's answer (one search, the seeds one
    after the other: each starts from the last one's answer)."""
    search, replay = config.search, config.replay
    policy = spec.name + (
        ":" + ",".join(f"{k}={v}" for k, v in sorted(spec.params.items())) if spec.params else ""
    )
    rules = CapacitySettings(
        target=search.target, tolerance=search.tolerance, max_probes=search.max_probes,
        seeds=tuple(range(replay.seed, replay.seed + config.steady.seeds)),
        start_req_s=start_req_s, step=1.25,
    )  # fmt: skip
    job = CapacityJob(trace=config.trace, preset=preset, policy=policy, replay=replay,
                      settings=rules, window=config.steady.window())  # fmt: skip
    return run_capacity_job(job)


def _probe_json(probe: Probe) -> dict[str, Any]:
    return {
        "rate_scale": probe.rate_scale,
        "arrival_rate_req_s": probe.arrival_rate_req_s,
        "sla_attainment": probe.sla_attainment,
        "sla_goodput_req_s": probe.sla_goodput_req_s,
        "ttft_p99_s": probe.ttft_p99_s,
        "passed": probe.passed,
    }


def _observers(
    progress: Callable[[int, float], ProgressObserver | None] | None,
    number: int,
    scales: Sequence[float],
) -> Callable[[int], ProgressObserver | None] | None:
    """The i-th replay of a round is probe ``number + i`` at ``scales[i]``."""
    if progress is None:
        return None
    return lambda i: progress(number + i, scales[i])


def run_sweep(
    config: SweepConfig,
    *,
    policy: str | None = None,
    progress: Callable[[int, float], ProgressObserver | None] | None = None,
    executor: Executor | None = None,
    on_replays: Callable[[int, int], None] | None = None,
) -> SweepResult:
    """Bisect ``--rate-scale`` for the highest rate meeting ``target`` SLA attainment of
    ``policy`` (default: the config's one policy); every probe has the config's ``replay``
    settings at its own rate scale.

    Serial (``executor`` None or serial): one probe at a time, ``progress(number, scale)``
    giving each its observer. On W workers: the probes the serial search would run, found
    ``speculate``-ing W at a time; ``on_replays(finished, started)`` counts the replays.
    Unless the config's ``steady.window_s`` is 0, the capacity at steady state over its
    seeds follows from the sweep's answer (or its start, when no probe passed)."""
    search, target = config.search, config.search.target
    if policy is None and len(config.policies) != 1:
        raise ValueError("run_sweep: name the policy to sweep of several")
    spec = parse_policy_spec(policy if policy is not None else config.policies[0])
    arm_preset = spec.preset_or(config.preset)  # NAME@PRESET: the deployment's own cluster
    executor = executor if executor is not None else SerialExecutor()
    width = executor.workers
    rules = Bisection(search.start_scale, search.tolerance, search.max_probes)
    state = SearchState()
    probes: list[Probe] = []
    first: ReplayResult | None = None
    best: tuple[Probe, ReplayResult] | None = None
    ahead: dict[float, ReplayResult] = {}  # this round's replays not yet walked
    counts = [0, 0]  # replays finished, started

    def job(scale: float) -> ReplayConfig:
        return config.replay.replay(
            config.trace, arm_preset, spec.name, spec.params, rate_scale=scale
        )

    def finished(n: int) -> None:
        if on_replays is not None:
            on_replays(counts[0] + n, counts[1])

    while (scale := rules.next_scale(state)) is not None:
        if scale not in ahead:
            ahead.clear()  # what is left was off the path
            scales = speculate(rules, state, width)
            counts[1] += len(scales)
            observer = _observers(progress, len(probes) + 1, scales)
            results = run_jobs(
                executor, [job(s) for s in scales], observer=observer, on_done=finished
            )
            counts[0] += len(scales)
            ahead.update(zip(scales, results, strict=True))
        result = ahead.pop(scale)
        found = Probe.of(result.summary, target)
        state = rules.advance(state, scale, found.rate_scale, found.passed)
        probes.append(found)
        if first is None:
            first = result
        if found.passed and (best is None or found.rate_scale > best[0].rate_scale):
            best = (found, result)
    assert first is not None  # the first probe always runs
    summary = first.summary
    capacity = None
    if config.steady.window_s > 0:
        duration = summary.trace_duration_s * summary.rate_scale  # at rate scale 1
        rate = summary.requests / duration if duration > 0 else 1.0
        begin = (best[0].rate_scale if best is not None else search.start_scale) * rate
        capacity = _steady(config, arm_preset, spec, begin)
    return SweepResult(
        spec=spec, target=target, tolerance=search.tolerance, probes=probes,
        best=best[0] if best is not None else None,
        best_result=best[1] if best is not None else None,
        cost_per_hour=summary.cost_per_hour, bracketed=state.high is not None, first=summary,
        steady=capacity,
    )  # fmt: skip
