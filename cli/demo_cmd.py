"""`pdd-router demo`: the project's main job on embedded defaults.

Generates the synthetic agentic trace (5,000 requests, seed 0, 5 req/s for the small
presets and 10 for the paper's) and replays it on
the simulated cluster under intra-datacenter PD, naive cross-datacenter PD and
PDD, then measures each deployment's capacity at steady state (as ``replay sweep``
does) and prints the comparison: at the trace's rate and at capacity.
"""

from __future__ import annotations

import itertools
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli.console import stdout_console

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

    from replay.experiments.capacity import CapacityResult
    from replay.experiments.capacity_job import CapacityJob
    from replay.experiments.demo import DemoSetup
    from replay.metrics.summary import Summary
    from replay.trace.stats import TraceStats

__all__ = ["demo"]


def _stats_line(stats: TraceStats) -> str:
    """The trace's shape in one line: what PDD is built for."""
    return (
        f"trace: {stats.requests:,} requests over {stats.duration_s:,.0f} s; per-request prefix "
        f"hit rate mean {stats.hit_rate_mean or 0:.3f}, {stats.hit_share_above_95 or 0:.1%} of "
        f"requests above 95%, {stats.odd_share:.1%} long-input short-output"
    )


def demo(
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Keep the trace and one run directory per setup here"
    ),
    requests: int | None = typer.Option(
        None,
        "--requests",
        "-n",
        min=1,
        help="Number of requests: of the synthetic trace (default 5000), or the first ones "
        "of --trace (default: all)",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the trace and the replays"),
    scale: str = typer.Option(
        "small", "--scale", help="Cluster presets: small (the *-small presets) or paper"
    ),
    trace: Path | None = typer.Option(
        None, "--trace", help="Replay this trace instead of a synthetic agentic one"
    ),
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="2 = arrivals twice as fast"),
    capacity: bool = typer.Option(
        True,
        "--capacity/--no-capacity",
        help="Also measure each deployment's capacity, SLA goodput at capacity and BCR there "
        "(steady state, 2 seeds, bisection to 2%; most of the demo's time)",
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars"),
) -> None:
    """Replay a synthetic agentic trace (or --trace) under idc-pd, xdc-pd and pdd; compare
    them at the trace's rate and at each one's capacity."""

    from cli.progress import ReplayBar, progress_bars
    from replay.experiments.demo import DEMO_SETUPS, comparison_table, run_demo
    from replay.report.run_report import write_run_with_report
    from replay.runner.run import ReplayResult
    from replay.trace.formats import read_trace
    from replay.trace.stats import compute_stats
    from router.errors import UserError

    if scale not in DEMO_SETUPS:
        raise UserError(f"unknown --scale {scale!r}; valid: {', '.join(DEMO_SETUPS)}")
    console = stdout_console()
    limit = requests if trace is not None else None
    with tempfile.TemporaryDirectory(prefix="pdd-demo-") as tmp:
        base = out if out is not None else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        if trace is not None and not trace.is_file():
            raise UserError(f"trace file {trace} does not exist")
        trace_path = trace if trace is not None else base / "agentic.jsonl"

        def write(setup: DemoSetup, result: ReplayResult) -> None:
            if out is not None:
                write_run_with_report(out / setup.preset, result.summary, result.records)

        with progress_bars(not no_progress) as bars:

            def observer(label: str) -> ReplayBar | None:
                return ReplayBar(bars, label) if bars is not None else None

            results = run_demo(trace_path, scale=scale, requests=requests, seed=seed,
                               rate_scale=rate_scale, synthesize=trace is None, on_result=write,
                               progress=observer)  # fmt: skip
            found = _capacities(trace_path, results, seed, limit, bars, out) if capacity else None
        replayed = read_trace(trace_path)
        if limit is not None:
            replayed = itertools.islice(replayed, limit)
        stats_line = _stats_line(compute_stats(replayed))
    console.print(stats_line)
    what = f"{trace}" if trace is not None else f"Synthetic agentic trace (seed {seed})"
    if limit is not None:
        what += f" (its first {limit:,} requests)"
    scaled = f", arrivals x{rate_scale:g}" if rate_scale != 1.0 else ""
    title = f"{what}{scaled} on the simulated two-datacenter cluster ({scale} presets)"
    console.print(comparison_table(results, title, found[1] if found else None))
    _print_closing(console, results, found)
    if out is not None:
        console.print(f"trace and run directories in {out}")


def _capacities(
    trace_path: Path, results: list[tuple[DemoSetup, Summary]], seed: int, limit: int | None,
    bars: Progress | None, out: Path | None,
) -> tuple[list[CapacityJob], list[CapacityResult]]:  # fmt: skip
    """Each setup's capacity search, one bar each; ``out/PRESET/capacity.json`` with ``out``."""
    from replay.experiments.demo import capacity_jobs, run_capacities
    from replay.experiments.demo_capacity import bcr_at_capacity

    jobs = capacity_jobs(trace_path, results, seed=seed, max_requests=limit)

    def started(i: int) -> None:
        if bars is not None:
            setup = results[i][0]
            bars.add_task(f"capacity of {setup.label} ({setup.preset})", total=None)

    found = run_capacities(jobs, on_start=started)
    if out is not None:
        for (setup, summary), c in zip(results, found, strict=True):
            data = c.model_dump(mode="json")
            data["bcr_per_1000_usd_h"] = round(  # BCR proper: at capacity
                bcr_at_capacity(c, summary.cost_per_hour), 6
            )
            path = out / setup.preset / "capacity.json"
            path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return jobs, found


def _print_closing(
    console: Console, results: list[tuple[DemoSetup, Summary]],
    found: tuple[list[CapacityJob], list[CapacityResult]] | None,
) -> None:  # fmt: skip
    """The sentences under the table: WAN bytes, then how capacity was measured, its
    warnings and PDD's BCR at capacity against the others'."""
    from replay.experiments.demo_capacity import bcr_at_capacity, capacity_note, capacity_verdict

    pdd = results[-1][1]
    xdc = results[1][1]
    if xdc.wan_bytes and pdd.ttft_s.p99 and xdc.ttft_s.p99:
        console.print(
            f"PDD: TTFT P99 {1 - pdd.ttft_s.p99 / xdc.ttft_s.p99:.1%} below naive cross-DC PD, "
            f"{xdc.wan_bytes / max(pdd.wan_bytes, 1):.1f}x fewer WAN bytes, "
            f"RLD generated {pdd.rld_token_share:.1%} of output tokens."
        )
    if found is None:
        return
    jobs, capacities = found
    console.print(capacity_note(jobs[0].settings, jobs[0].window))
    for (setup, _), c in zip(results, capacities, strict=True):
        for warning in c.warnings:
            console.print(f"warning: {setup.label} capacity: {warning}")
    labels = [setup.label for setup, _ in results]
    bcrs = [
        bcr_at_capacity(c, s.cost_per_hour) for (_, s), c in zip(results, capacities, strict=True)
    ]
    console.print(capacity_verdict(labels, bcrs))
