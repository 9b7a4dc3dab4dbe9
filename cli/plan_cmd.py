"""`pdd-router replay plan`: search deployments for the best BCR under the SLA on a trace.

The command parses options, shows progress and prints; the search is
``replay.experiments.plan`` (imported when the command runs, so ``--help`` stays instant).
It is registered on ``replay_app`` by ``cli.replay_cmd``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from cli.executor_options import EXECUTOR, RAY_ADDRESS, WORKERS, open_executor
from cli.progress import progress_bars
from router.sla import SLA_TPOT_S, SLA_TTFT_S

if TYPE_CHECKING:
    from rich.progress import TaskID

    from replay.experiments.plan import PlanResult
    from replay.experiments.plan_space import PlanSpace
    from replay.presets.cluster_preset import ClusterPreset

__all__ = ["plan"]


def _space(
    base: ClusterPreset,
    price: float,
    p: str | None,
    rld: str | None,
    md: str | None,
    gpu_p: str | None,
    gpu_rld: str | None,
    gpu_md: str | None,
    wan_gbps: str | None,
    params: list[str],
) -> PlanSpace:
    """The default space around ``base`` with the options' ranges put in."""
    from replay.experiments.plan_space import (
        Layout,
        default_space,
        parse_counts,
        parse_gbps,
        parse_gpus,
        parse_param_grid,
    )

    space = default_space(base, Layout.of(base), price)
    valid = sorted(base.hardware)
    changes: dict[str, object] = {}
    if p is not None:
        changes["p"] = parse_counts(p, "--p")
    if rld is not None:
        changes["rld"] = parse_counts(rld, "--rld")
    if md is not None:
        changes["md"] = parse_counts(md, "--md")
    for key, text in (("gpu_p", gpu_p), ("gpu_rld", gpu_rld), ("gpu_md", gpu_md)):
        if text is not None:
            changes[key] = parse_gpus(text, "--" + key.replace("_", "-"), valid)
    if wan_gbps is not None:
        changes["wan_gbps"] = parse_gbps(wan_gbps)
    if params:
        changes["params"] = parse_param_grid(params)
    return space.model_copy(update=changes)


def _print(console: Console, plan: PlanResult, written: list[Path]) -> None:
    from replay.experiments.plan_output import front_table, verdict_lines, verdict_table

    pruned = plan.pruned_by()
    measured = sum(r.status != "pruned" for r in plan.results)
    reasons = ", ".join(f"{n} by {why}" for why, n in sorted(pruned.items())) or "none"
    families = ", ".join(
        f"{sum(r.family == f for r in plan.results)} {f}"
        for f in ("pdd", "intra-dc-pd", "colocated")
    )
    console.print(
        f"{len(plan.results)} deployments ({families}): {measured} measured, "
        f"{sum(pruned.values())} pruned ({reasons}); target {plan.target_rate_req_s:.3f} "
        f"req/s (the trace's rate x {plan.settings.min_rate_scale:g})",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    if plan.best_of("pdd") is None:
        console.print(
            "no PDD deployment met the SLA at the target rate: widen the ranges (--p, --md, "
            "--wan-gbps) or lower --min-rate-scale",
            highlight=False,
            soft_wrap=True,
        )
    else:
        console.print(front_table(plan))
    if plan.best:
        console.print(verdict_table(plan))
        for line in verdict_lines(plan):
            console.print(line, highlight=False, soft_wrap=True)
    for r in plan.results:
        for warning in r.confirmed.warnings if r.confirmed is not None else []:
            console.print(f"warning: {r.label}: {warning}", highlight=False, soft_wrap=True)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False, soft_wrap=True)


def plan(
    trace: Path = typer.Argument(..., help="Trace file (format detected: mooncake, bailian, ...)"),
    preset: str = typer.Option(
        "pdd-small",
        "--preset",
        help="Base PDD preset (name or file with p, rld and md pools): the default ranges "
        "are around its pools, and everything not searched is its own",
    ),
    policy: str | None = typer.Option(
        None, "--policy", help="Policy of every candidate (default: the preset's)"
    ),
    p: str | None = typer.Option(None, "--p", help="Prefill instances, e.g. 2..6 or 2,4"),
    rld: str | None = typer.Option(None, "--rld", help="RLD instances, e.g. 1..2"),
    md: str | None = typer.Option(None, "--md", help="MD instances, e.g. 1..4"),
    gpu_p: str | None = typer.Option(None, "--gpu-p", help="Prefill GPUs, e.g. h100,h200"),
    gpu_rld: str | None = typer.Option(None, "--gpu-rld", help="RLD GPUs, e.g. h100"),
    gpu_md: str | None = typer.Option(None, "--gpu-md", help="MD GPUs, e.g. h100,h200"),
    wan_gbps: str | None = typer.Option(
        None, "--wan-gbps", help="Line bandwidths, Gbps (default 10,20,40)"
    ),
    wan_price: float | None = typer.Option(
        None,
        "--wan-price",
        help="Line price, USD per Gbps-month (730 h; default: the preset's, else 72.4)",
    ),
    params: list[str] = typer.Option(
        [], "--param", metavar="KEY=V1,V2", help="Policy thresholds to search (repeatable)"
    ),
    min_rate_scale: float = typer.Option(
        1.0, "--min-rate-scale", help="Serve at least the trace's rate times this (target rate)"
    ),
    target: float = typer.Option(0.9, "--target", help="SLA attainment to sustain"),
    tolerance: float = typer.Option(
        0.02, "--tolerance", help="Capacity bracket of each family's best, relative"
    ),
    screen_tolerance: float = typer.Option(
        0.1, "--screen-tolerance", help="Capacity bracket of the screening, relative"
    ),
    max_probes: int = typer.Option(14, "--max-probes", help="Most replays per seed and search"),
    seeds: int = typer.Option(2, "--seeds", help="Seeds of the best's capacity (--seed, +1, ...)"),
    window: float = typer.Option(
        300.0, "--window", help="Steady-state seconds judged at each rate (after --warmup)"
    ),
    warmup: float = typer.Option(60.0, "--warmup", help="Seconds left out at each rate"),
    no_baseline: bool = typer.Option(
        False, "--no-baseline", help="Skip the intra-DC PD and colocated baselines"
    ),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override on the base preset (repeatable)"
    ),
    seed: int = typer.Option(0, "--seed", help="First seed (screening runs on it alone)"),
    sla_ttft: float = typer.Option(SLA_TTFT_S, "--sla-ttft", help="SLA threshold on TTFT, seconds"),
    sla_tpot: float = typer.Option(SLA_TPOT_S, "--sla-tpot", help="SLA threshold on TPOT, seconds"),
    executor: str = EXECUTOR,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
    out: Path = typer.Option(Path("plan-out"), "--out", help="Directory to write"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
) -> None:
    """Search PDD deployments (pool sizes, GPUs, line bandwidth, thresholds) and, over the
    same budget, intra-DC PD and colocated ones for the best BCR on TRACE, each measured as
    capacity at steady state; print PDD's front and the verdict against each family's best,
    and write plan.json, plan.csv and the best PDD deployment as a preset file."""
    import math

    from policies.registry import UnknownPolicyError, parse_policy
    from replay.experiments.plan import PlanSettings, run_plan, screen_window_of
    from replay.experiments.plan_bounds import load_trace_load
    from replay.experiments.plan_output import write_plan
    from replay.experiments.plan_space import line_price_of
    from replay.experiments.policy_spec import parse_policy_spec
    from replay.experiments.steady_replay import SteadyWindow
    from replay.metrics.summary import SlaThresholds
    from replay.presets.loader import load_preset, parse_overrides
    from router.errors import UserError

    if sla_ttft <= 0 or sla_tpot <= 0:
        raise UserError("--sla-ttft and --sla-tpot must be positive")
    if not (math.isfinite(min_rate_scale) and min_rate_scale > 0):
        raise UserError(f"--min-rate-scale must be positive, got {min_rate_scale}")
    if wan_price is not None and not (math.isfinite(wan_price) and wan_price >= 0):
        raise UserError(f"--wan-price must be 0 or more USD per Gbps-month, got {wan_price}")
    if not 0.0 < target <= 1.0:
        raise UserError(f"--target must be within (0, 1], got {target}")
    if tolerance <= 0 or screen_tolerance <= 0 or max_probes < 2:
        raise UserError(
            "--tolerance and --screen-tolerance must be positive and --max-probes at least 2"
        )
    if seeds < 1:
        raise UserError(f"--seeds must be at least 1, got {seeds}")
    if not (math.isfinite(window) and window > 0 and math.isfinite(warmup) and warmup >= 0):
        raise UserError("--window must be positive and --warmup 0 or more seconds")
    if not trace.is_file():
        raise UserError(f"{trace}: no such trace file")
    cluster = parse_overrides(overrides)
    base = load_preset(preset, cluster)
    name = policy or base.spec.default_policy
    if parse_policy_spec(name).params or "@" in name:
        raise UserError(f"--policy {name!r}: give a policy name; search thresholds with --param")
    price = wan_price if wan_price is not None else line_price_of(base)
    space = _space(base, price, p, rld, md, gpu_p, gpu_rld, gpu_md, wan_gbps, params)
    for values in space.params:  # a bad threshold is refused before any replay
        try:
            parse_policy(name, values)
        except UnknownPolicyError as exc:
            raise UserError(f"--param: {exc}") from None
    steady = SteadyWindow(warmup_s=warmup, window_s=window)
    settings = PlanSettings(
        trace=str(trace), preset=preset, policy=name, overrides=cluster,
        seeds=tuple(range(seed, seed + seeds)), target=target, tolerance=tolerance,
        screen_tolerance=screen_tolerance, max_probes=max_probes,
        min_rate_scale=min_rate_scale, sla=SlaThresholds(ttft_s=sla_ttft, tpot_s=sla_tpot),
        window=steady, screen_window=screen_window_of(steady),
    )  # fmt: skip
    load = load_trace_load(trace)
    console = Console()
    with (
        open_executor(executor, workers, ray_address) as pool,
        progress_bars(not no_progress) as bars,
    ):
        advance: Callable[[str, int, int], None] | None = None
        if bars is not None:
            tasks: dict[str, TaskID] = {}

            def advance(stage: str, done: int, total: int) -> None:
                if stage not in tasks:
                    tasks[stage] = bars.add_task(stage, total=total)
                bars.update(tasks[stage], completed=done, total=total)

        result = run_plan(settings, space, load, pool, baseline=not no_baseline, advance=advance)
    written = write_plan(result, out)
    _print(console, result, written)
