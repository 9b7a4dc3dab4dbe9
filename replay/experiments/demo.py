"""The demo: one synthetic agentic trace replayed under intra-DC PD, naive cross-DC PD and PDD."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from replay.experiments.capacity import CapacityResult
from replay.experiments.capacity_job import CapacityJob, run_capacity_job
from replay.experiments.demo_capacity import capacity_job, capacity_rows
from replay.metrics.summary import Summary
from replay.runner.config import ReplayConfig, ReplaySettings
from replay.runner.run import ReplayResult, run_replay
from replay.sim.simulator import ProgressObserver
from replay.trace.synth import make_profile, write_synthetic_trace

__all__ = [
    "DEMO_RATES",
    "DEMO_REQUESTS",
    "DEMO_SETUPS",
    "DemoSetup",
    "capacity_jobs",
    "comparison_table",
    "run_capacities",
    "run_demo",
    "summary_rows",
]

DEMO_REQUESTS = 5000
"""Requests of the demo's synthetic trace unless told otherwise."""

DEMO_RATES = {"small": 5.0, "paper": 10.0}
"""The synthetic trace's arrival rate (req/s) for each scale: the paper reports its PDD
cluster's SLA goodput at 9-11.5 req/s of agentic traffic, and the -small presets are
about half its hardware."""


@dataclass(frozen=True, slots=True)
class DemoSetup:
    label: str
    preset: str
    policy: str


DEMO_SETUPS = {
    "small": (
        DemoSetup("intra-DC PD", "idc-pd-small", "idc-pd"),
        DemoSetup("naive cross-DC PD", "xdc-pd-small", "xdc-pd"),
        DemoSetup("PDD", "pdd-small", "pdd"),
    ),
    "paper": (
        DemoSetup("intra-DC PD", "idc-pd", "idc-pd"),
        DemoSetup("naive cross-DC PD", "xdc-pd", "xdc-pd"),
        DemoSetup("PDD", "pdd", "pdd"),
    ),
}


def run_demo(
    trace_path: Path,
    *,
    scale: str = "small",
    requests: int | None = None,
    seed: int = 0,
    rate_scale: float = 1.0,
    synthesize: bool = True,
    on_result: Callable[[DemoSetup, ReplayResult], None] | None = None,
    progress: Callable[[str], ProgressObserver | None] | None = None,
) -> list[tuple[DemoSetup, Summary]]:
    """Replay a trace (by default a fresh synthetic agentic one of ``requests`` requests,
    5,000 if None, at the scale's rate, written to ``trace_path``) under each setup of
    ``scale``; return the summaries. A given trace (``synthesize`` False) is replayed
    whole, or its first ``requests`` requests. ``on_result`` receives each setup's
    result as it ends (the CLI writes its run directory)."""
    if synthesize:
        count = requests if requests is not None else DEMO_REQUESTS
        profile = make_profile("agentic", {"rate": DEMO_RATES[scale]})
        write_synthetic_trace(trace_path, profile, count, seed)
    limit = None if synthesize else requests
    results = []
    for setup in DEMO_SETUPS[scale]:
        observer = progress(f"{setup.label} ({setup.preset})") if progress else None
        config = ReplayConfig(
            trace=str(trace_path), preset=setup.preset, policy=setup.policy,
            rate_scale=rate_scale, seed=seed, max_requests=limit,
        )  # fmt: skip
        result = run_replay(config, progress=observer)
        if on_result is not None:
            on_result(setup, result)
        results.append((setup, result.summary))
    return results


def _pct(values: tuple[float | None, float | None, float | None]) -> str:
    if any(v is None for v in values):
        return "-"
    return " / ".join(f"{v:.3g}" for v in values if v is not None)


def _ms(*values: float | None) -> str:
    if any(v is None for v in values):
        return "-"
    return " / ".join(f"{v * 1e3:.3g}" for v in values if v is not None)


def capacity_jobs(
    trace_path: Path, results: list[tuple[DemoSetup, Summary]], *, seed: int = 0,
    max_requests: int | None = None,
) -> list[CapacityJob]:  # fmt: skip
    """Each setup's capacity search on the trace (its first ``max_requests`` requests when
    given), started at the rate the demo replayed it at."""
    settings = ReplaySettings(seed=seed, max_requests=max_requests)
    jobs = []
    for setup, summary in results:
        duration = summary.trace_duration_s
        start = summary.requests / duration if duration > 0 else 1.0
        jobs.append(capacity_job(trace_path, setup.preset, setup.policy, start_req_s=start,
                                 settings=settings))  # fmt: skip
    return jobs


def run_capacities(
    jobs: list[CapacityJob], on_start: Callable[[int], None] | None = None
) -> list[CapacityResult]:
    """Run the searches one after the other (``on_start(i)`` before the i-th)."""
    found = []
    for i, job in enumerate(jobs):
        if on_start is not None:
            on_start(i)
        found.append(run_capacity_job(job))
    return found


def summary_rows(summaries: list[Summary]) -> list[tuple[str, list[str]]]:
    """The figures at the trace's rate, one cell per summary."""
    cells: list[tuple[str, Callable[[Summary], str]]] = [
        ("TTFT P50 / P90 / P99 (s)", lambda s: _pct((s.ttft_s.p50, s.ttft_s.p90, s.ttft_s.p99))),
        ("TPOT P50 / P99 (ms)", lambda s: _ms(s.tpot_s.p50, s.tpot_s.p99)),
        ("SLA attainment", lambda s: f"{s.sla_attainment:.1%}"),
        ("rejected (admission control)", lambda s: f"{s.rejected}"),
        ("SLA goodput at the trace's rate (req/s)", lambda s: f"{s.sla_goodput_req_s:.2f}"),
        ("WAN bytes (TB)", lambda s: f"{s.wan_bytes / 1e12:.2f}"),
        ("WAN mean / peak (Gbps)", lambda s: f"{s.wan_gbps_mean:.1f} / {s.wan_gbps_peak:.1f}"),
        ("RLD token share", lambda s: f"{s.rld_token_share:.1%}"),
        ("pipelines", lambda s: ", ".join(f"{k} {v}" for k, v in s.pipelines.items())),
        ("cost (USD/h)", lambda s: f"{s.cost_per_hour:.1f}"),
        ("BCR at the trace's rate (req/s per 1000 USD/h)",
         lambda s: f"{s.bcr_at_trace_rate_per_1000_usd_h:.1f}"),
    ]  # fmt: skip
    return [(name, [cell(s) for s in summaries]) for name, cell in cells]


def comparison_table(
    results: list[tuple[DemoSetup, Summary]], title: str,
    capacities: list[CapacityResult] | None = None,
) -> Table:  # fmt: skip
    """One column per setup; rows are the figures the paper compares: at the trace's rate,
    then (``capacities`` given, in the setups' order) at each one's capacity."""
    table = Table(title=title)
    table.add_column("")
    for setup, _ in results:
        table.add_column(f"{setup.label}\n{setup.preset} / {setup.policy}", justify="right")
    summaries = [s for _, s in results]
    rows = summary_rows(summaries)
    if capacities is not None:
        rows += capacity_rows(capacities, [s.cost_per_hour for s in summaries])
    for name, cells in rows:
        table.add_row(name, *cells)
    return table
