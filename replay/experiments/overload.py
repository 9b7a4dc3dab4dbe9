"""How a policy holds up past its capacity: its SLA goodput at multiples of its capacity.

``run_overload`` first finds the policy's capacity with ``replay sweep`` (the highest
arrival rate at which the target share of requests meets the SLA, and the SLA goodput
there), then replays the trace at multiples of that rate (by default 0.5x to 2x). A
policy that degrades gracefully keeps its SLA goodput near its SLA goodput at capacity past
it (refusing or deferring the excess); one that lets a queue grow collapses: every
request waits behind the queue and misses the SLA.

``overload.json`` (``OverloadResult.to_json``)::

    {"schema": "pdd-router/overload/2", "trace", "preset", "policy", "params", "seed",
     "sla": {...}, "target": 0.9,
     "capacity": {"rate_scale", "capacity_req_s",   # the sweep's, on the trace's timing
                  "sla_goodput_at_capacity_req_s"} | null,
     "points": [{"multiple", "rate_scale", "arrival_rate_req_s", "sla_attainment",
                 "sla_goodput_req_s",  # requests meeting the SLA per second at that rate
                 "sla_goodput_kept",   # sla_goodput_req_s / the capacity's (1.0: all of it)
                 "rejected_share", "ttft_p99_s"}, ...]}

``overload.csv`` has one row per point with the same columns.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from replay.experiments.executor import Executor, OnDone
from replay.experiments.experiment_config import (
    OverloadConfig,
    SteadyOptions,
    SweepConfig,
    SweepSearch,
)
from replay.experiments.policy_spec import PolicySpec, parse_policy_spec
from replay.experiments.replay_job import run_jobs
from replay.experiments.sweep import SweepResult, run_sweep
from replay.metrics.summary import Summary
from router.errors import UserError

__all__ = ["MULTIPLES", "OverloadPoint", "OverloadResult", "run_overload"]

SCHEMA = "pdd-router/overload/2"
MULTIPLES = (0.5, 1.0, 1.2, 1.5, 2.0)
"""Default rates, as multiples of the capacity rate."""
COLUMNS = (
    "multiple", "rate_scale", "arrival_rate_req_s", "sla_attainment", "sla_goodput_req_s",
    "sla_goodput_kept",
    "rejected_share", "ttft_p99_s",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class OverloadPoint:
    """One replay at ``multiple`` times the capacity rate."""

    multiple: float
    rate_scale: float
    arrival_rate_req_s: float
    sla_attainment: float
    sla_goodput_req_s: float
    sla_goodput_kept: float | None
    rejected_share: float
    ttft_p99_s: float | None

    @classmethod
    def of(cls, multiple: float, summary: Summary, at_capacity_req_s: float) -> OverloadPoint:
        duration = summary.trace_duration_s
        n = summary.requests
        return cls(
            multiple=multiple,
            rate_scale=round(summary.rate_scale, 6),
            arrival_rate_req_s=round(n / duration, 6) if duration > 0 else 0.0,
            sla_attainment=summary.sla_attainment,
            sla_goodput_req_s=summary.sla_goodput_req_s,
            sla_goodput_kept=round(summary.sla_goodput_req_s / at_capacity_req_s, 6)
            if at_capacity_req_s > 0
            else None,
            rejected_share=round(summary.rejected / n, 6) if n else 0.0,
            ttft_p99_s=summary.ttft_s.p99,
        )

    def to_json(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in COLUMNS}


@dataclass(frozen=True, slots=True)
class OverloadResult:
    """The capacity sweep and the replays at multiples of its rate."""

    spec: PolicySpec
    sweep: SweepResult
    points: list[OverloadPoint]

    def to_json(self) -> dict[str, Any]:
        best = self.sweep.best
        capacity = (
            None
            if best is None
            else {
                "rate_scale": best.rate_scale,
                "capacity_req_s": best.arrival_rate_req_s,
                "sla_goodput_at_capacity_req_s": best.sla_goodput_req_s,
            }
        )
        return {
            **self.sweep.header(SCHEMA),
            "capacity": capacity,
            "points": [p.to_json() for p in self.points],
        }

    def write(self, out: Path) -> list[Path]:
        out.mkdir(parents=True, exist_ok=True)
        json_path, csv_path = out / "overload.json", out / "overload.csv"
        json_path.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        with csv_path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            for point in self.points:
                writer.writerow(["" if v is None else v for v in point.to_json().values()])
        return [json_path, csv_path]


def run_overload(
    config: OverloadConfig,
    *,
    executor: Executor | None = None,
    on_replays: Callable[[int, int], None] | None = None,
    on_done: OnDone | None = None,
) -> OverloadResult:
    """The policy's capacity (a sweep), then a replay at each multiple of its rate, every
    replay with the config's ``replay`` settings."""
    multiples, target = config.multiples, config.target
    if any(m <= 0 for m in multiples):
        raise UserError(f"--multiples must be positive numbers, got {list(multiples)}")
    spec = parse_policy_spec(config.policy)
    preset = spec.preset_or(config.preset)
    sweep = run_sweep(
        SweepConfig(
            trace=config.trace,
            preset=preset,
            policies=[config.policy],
            replay=config.replay,
            search=SweepSearch(target=target),
            steady=SteadyOptions(window_s=0.0),  # the multiples are of the sweep's answer
        ),
        executor=executor,
        on_replays=on_replays,
    )
    best = sweep.best
    if best is None:
        raise UserError(
            f"{spec.label} meets the SLA for {target:.0%} of the requests at no rate the sweep "
            "tried: it has no capacity on this cluster to overload"
        )
    jobs = [
        config.replay.replay(
            config.trace, preset, spec.name, spec.params, rate_scale=best.rate_scale * m
        )
        for m in multiples
    ]
    results = run_jobs(executor, jobs, on_done=on_done)
    points = [
        OverloadPoint.of(m, r.summary, best.sla_goodput_req_s)
        for m, r in zip(multiples, results, strict=True)
    ]
    return OverloadResult(spec, sweep, points)
