"""`pdd-router demo`: the project's main job on embedded defaults.

Generates the synthetic agentic trace (5,000 requests, seed 0, 5 req/s for the small
presets and 10 for the paper's) and replays it on
the simulated cluster under intra-datacenter PD, naive cross-datacenter PD and
PDD, then prints the comparison.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
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
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bars"),
) -> None:
    """Replay a synthetic agentic trace (or --trace) under idc-pd, xdc-pd and pdd; compare."""
    from rich.console import Console

    from cli.progress import ReplayBar, progress_bars
    from replay.experiments.demo import DEMO_SETUPS, DemoSetup, comparison_table, run_demo
    from replay.report.run_report import write_run_with_report
    from replay.runner.run import ReplayResult
    from replay.trace.formats import read_trace
    from replay.trace.stats import compute_stats
    from router.errors import UserError

    if scale not in DEMO_SETUPS:
        raise UserError(f"unknown --scale {scale!r}; valid: {', '.join(DEMO_SETUPS)}")
    console = Console()
    with tempfile.TemporaryDirectory(prefix="pdd-demo-") as tmp:
        base = out if out is not None else Path(tmp)
        stats_line = ""
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
        replayed = read_trace(trace_path)
        if trace is not None and requests is not None:
            replayed = itertools.islice(replayed, requests)
        stats_line = _stats_line(compute_stats(replayed))
    console.print(stats_line)
    what = f"{trace}" if trace is not None else f"Synthetic agentic trace (seed {seed})"
    if trace is not None and requests is not None:
        what += f" (its first {requests:,} requests)"
    scaled = f", arrivals x{rate_scale:g}" if rate_scale != 1.0 else ""
    title = f"{what}{scaled} on the simulated two-datacenter cluster ({scale} presets)"
    console.print(comparison_table(results, title))
    pdd = results[-1][1]
    xdc = results[1][1]
    if xdc.wan_bytes and pdd.ttft_s.p99 and xdc.ttft_s.p99:
        console.print(
            f"PDD: TTFT P99 {1 - pdd.ttft_s.p99 / xdc.ttft_s.p99:.1%} below naive cross-DC PD, "
            f"{xdc.wan_bytes / max(pdd.wan_bytes, 1):.1f}x fewer WAN bytes, "
            f"RLD generated {pdd.rld_token_share:.1%} of output tokens."
        )
    if out is not None:
        console.print(f"trace and run directories in {out}")
