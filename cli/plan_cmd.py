"""`pdd-router replay plan`: search deployments for the best BCR under the SLA on a trace.

The command parses options, shows progress and prints; the search is
``replay.experiments.plan`` (imported when the command runs, so ``--help`` stays instant).
It is registered on ``replay_app`` by ``cli.replay_cmd``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.progress import TaskID

from cli.config_options import OutputOptions, with_options
from cli.console import stdout_console
from cli.executor_options import EXECUTOR, RAY_ADDRESS, WORKERS, open_executor
from cli.progress import progress_bars
from replay.runner.config import ReplaySettings

if TYPE_CHECKING:
    from replay.experiments.plan import PlanResult, PlanSettings
    from replay.experiments.plan_space import PlanSpace
    from replay.presets.cluster_preset import ClusterPreset

__all__ = ["PlanOptions", "plan"]

_NOT_PLANNED = ("rate_scale", "max_requests", "trace_format", "block_size")
"""Replay options plan does not take: it sets each replay's rate and reads the trace whole."""


class PlanOptions(BaseModel):
    """What `replay plan` searches, and how each candidate is swept."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    trace: Path = Field(
        description="Trace file (format detected: mooncake, bailian, ...)",
        json_schema_extra={"argument": True},
    )
    preset: str = Field(
        "pdd-small",
        description="Base PDD preset (name or file with p, rld and md pools): the default "
        "ranges are around its pools, and everything not searched is its own",
    )
    policy: str | None = Field(
        None, description="Policy of every candidate (default: the preset's)"
    )
    p: str | None = Field(None, description="Prefill instances, e.g. 2..6 or 2,4")
    rld: str | None = Field(None, description="RLD instances, e.g. 1..2")
    md: str | None = Field(None, description="MD instances, e.g. 1..4")
    gpu_p: str | None = Field(None, description="Prefill GPUs, e.g. h100,h200")
    gpu_rld: str | None = Field(None, description="RLD GPUs, e.g. h100")
    gpu_md: str | None = Field(None, description="MD GPUs, e.g. h100,h200")
    wan_gbps: str | None = Field(None, description="Line bandwidths, Gbps (default 10,20,40)")
    wan_price: float | None = Field(
        None,
        ge=0,
        description="Line price, USD per Gbps-month (730 h; default: the preset's, else 72.4)",
    )
    params: list[str] = Field(
        default_factory=list,
        description="Policy thresholds to search (repeatable)",
        json_schema_extra={"flags": ["--param"], "metavar": "KEY=V1,V2"},
    )
    min_rate_scale: float = Field(
        1.0, gt=0, description="Serve at least the trace's rate times this (target rate)"
    )
    target: float = Field(0.9, gt=0, le=1, description="SLA attainment to sustain")
    tolerance: float = Field(
        0.02, gt=0, description="Capacity bracket of each family's best, relative"
    )
    screen_tolerance: float = Field(
        0.1, gt=0, description="Capacity bracket of the screening, relative"
    )
    max_probes: int = Field(14, ge=2, description="Most replays per seed and search")
    seeds: int = Field(2, ge=1, description="Seeds of the best's capacity (--seed, +1, ...)")
    window: float = Field(
        300.0, gt=0, description="Steady-state seconds judged at each rate (after --warmup)"
    )
    warmup: float = Field(60.0, ge=0, description="Seconds left out at each rate")
    no_baseline: bool = Field(False, description="Skip the intra-DC PD and colocated baselines")
    no_sensitivity: bool = Field(
        False,
        description="Skip the sensitivity rows measured again (line RTT x2, step costs "
        "x0.85 and x1.15, hit rates flattened to 85-95%); the price rows stay",
    )


def _space(base: ClusterPreset, price: float, o: PlanOptions) -> PlanSpace:
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
    for key in ("p", "rld", "md"):
        text = getattr(o, key)
        if text is not None:
            changes[key] = parse_counts(text, "--" + key)
    for key in ("gpu_p", "gpu_rld", "gpu_md"):
        text = getattr(o, key)
        if text is not None:
            changes[key] = parse_gpus(text, "--" + key.replace("_", "-"), valid)
    if o.wan_gbps is not None:
        changes["wan_gbps"] = parse_gbps(o.wan_gbps)
    if o.params:
        changes["params"] = parse_param_grid(o.params)
    return space.model_copy(update=changes)


def _print(console: Console, plan: PlanResult, written: list[Path]) -> None:
    from replay.experiments.plan_output import (
        front_table,
        plan_warnings,
        printed_warnings,
        sensitivity_table,
        verdict_lines,
        verdict_table,
    )

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
        table = sensitivity_table(plan)
        if table is not None:
            console.print(table)
    for warning in printed_warnings(plan_warnings(plan)):
        console.print(f"warning: {warning}", highlight=False, soft_wrap=True)
    console.print("wrote " + ", ".join(str(p) for p in written), highlight=False, soft_wrap=True)


@with_options(OutputOptions, into="output", defaults={"out": Path("plan-out")})
@with_options(ReplaySettings, into="settings", skip=_NOT_PLANNED)
@with_options(PlanOptions, into="options")
def plan(
    executor: str = EXECUTOR,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
    *,
    options: PlanOptions,
    settings: ReplaySettings,
    output: OutputOptions,
) -> None:
    """Search PDD deployments (pool sizes, GPUs, line bandwidth, thresholds) and, over the
    same budget, intra-DC PD and colocated ones for the best BCR on TRACE, each measured as
    capacity at steady state; print PDD's front and the verdict against each family's best,
    and the verdict's sensitivity, and write plan.json, plan.csv, report.html and the best
    PDD deployment as a preset file. Every replay has the replay options given."""
    from cli.experiment_cmd import command_line
    from replay.experiments.plan import run_plan
    from replay.experiments.plan_bounds import load_trace_load
    from replay.experiments.plan_output import write_plan
    from replay.report.plan_report import write_plan_report

    settings_of_plan, space = _plan_of(options, settings)
    load = load_trace_load(options.trace)
    with (
        open_executor(executor, workers, ray_address) as pool,
        progress_bars(not output.no_progress) as bars,
    ):
        advance: Callable[[str, int, int], None] | None = None
        if bars is not None:
            tasks: dict[str, TaskID] = {}

            def advance(stage: str, done: int, total: int) -> None:
                if stage not in tasks:
                    tasks[stage] = bars.add_task(stage, total=total)
                bars.update(tasks[stage], completed=done, total=total)

        result = run_plan(
            settings_of_plan, space, load, pool, baseline=not options.no_baseline,
            advance=advance,
        )  # fmt: skip
    written = write_plan(result, output.out)
    written.append(write_plan_report(output.out / "report.html", result, command_line()))
    _print(stdout_console(), result, written)


def _plan_of(o: PlanOptions, settings: ReplaySettings) -> tuple[PlanSettings, PlanSpace]:
    """The plan's settings and search space; a bad policy or threshold is refused before
    any replay."""
    from policies.registry import UnknownPolicyError, parse_policy
    from replay.experiments.plan import PlanSettings, screen_window_of
    from replay.experiments.plan_space import line_price_of
    from replay.experiments.policy_spec import parse_policy_spec
    from replay.experiments.steady_replay import SteadyWindow
    from replay.presets.loader import load_preset
    from router.errors import UserError

    if not o.trace.is_file():
        raise UserError(f"{o.trace}: no such trace file")
    base = load_preset(o.preset, settings.overrides)
    name = o.policy or base.spec.default_policy
    if parse_policy_spec(name).params or "@" in name:
        raise UserError(f"--policy {name!r}: give a policy name; search thresholds with --param")
    price = o.wan_price if o.wan_price is not None else line_price_of(base)
    space = _space(base, price, o)
    for values in space.params:
        try:
            parse_policy(name, values)
        except UnknownPolicyError as exc:
            raise UserError(f"--param: {exc}") from None
    steady = SteadyWindow(warmup_s=o.warmup, window_s=o.window)
    plan_settings = PlanSettings(
        trace=str(o.trace), preset=o.preset, policy=name, replay=settings,
        seeds=tuple(range(settings.seed, settings.seed + o.seeds)), target=o.target,
        tolerance=o.tolerance, screen_tolerance=o.screen_tolerance, max_probes=o.max_probes,
        min_rate_scale=o.min_rate_scale, window=steady, screen_window=screen_window_of(steady),
        sensitivity=not o.no_sensitivity,
    )  # fmt: skip
    return plan_settings, space
