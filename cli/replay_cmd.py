"""`pdd-router replay ...`: replay a trace through the simulated cluster.

The command only parses options, shows progress and prints; the replay itself is
``replay.runner.run.run_replay`` (imported when the command runs, so ``--help`` is instant).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from cli.experiment_cmd import command_line, compare, sweep
from cli.live_cmd import live
from cli.overload_cmd import overload
from cli.plan_cmd import plan
from cli.progress import ReplayBar, progress_bars
from cli.run_output import print_run
from cli.tune_cmd import tune
from cli.validate_cmd import validate
from cli.validate_costs_cmd import validate_costs
from replay.sim.kv_events import KV_EVENT_DELAY_S
from router.sla import SLA_TPOT_S, SLA_TTFT_S

if TYPE_CHECKING:
    from replay.presets.cluster_preset import ClusterPreset

__all__ = ["replay_app"]

replay_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Replay traces through the two-datacenter cluster simulator.",
    no_args_is_help=True,
)


@replay_app.command("run")
def run(
    trace: Path = typer.Argument(..., help="Trace file (format detected: mooncake, bailian, ...)"),
    preset: str = typer.Option(
        ...,
        "--preset",
        help="Cluster preset: a name from `replay presets`, or a preset file "
        "(`replay presets --show NAME` prints one to start from)",
    ),
    policy: str | None = typer.Option(
        None, "--policy", help="Routing policy (default: the preset's default policy)"
    ),
    trace_format: str | None = typer.Option(
        None, "--format", "-f", help="Trace format: mooncake, bailian or azure (default: detected)"
    ),
    block_size: int | None = typer.Option(
        None,
        "--block-size",
        min=1,
        help="Convert the trace's block IDs to blocks of this many tokens first "
        "(sizes that divide each other)",
    ),
    param: list[str] = typer.Option(
        [], "--param", help="Policy parameter KEY=VALUE (repeatable)", metavar="KEY=VALUE"
    ),
    overrides: list[str] = typer.Option(
        [],
        "--set",
        help="Cluster override KEY=VALUE, e.g. pools.md.instances=8 (repeatable)",
        metavar="KEY=VALUE",
    ),
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="2 = arrivals twice as fast"),
    max_requests: int | None = typer.Option(
        None,
        "--max-requests",
        min=1,
        help="Replay only the trace's first N requests (of a file in time order, the ones "
        "`replay live --max-requests N` sends: the same slice for `replay validate`)",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of everything random in the run"),
    out: Path = typer.Option(Path("replay-out"), "--out", help="Run directory to write"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
    kv_event_delay: float = typer.Option(
        KV_EVENT_DELAY_S, "--kv-event-delay", help="Seconds before KV events reach the index"
    ),
    kv_event_wan_delay: float = typer.Option(
        0.0,
        "--kv-event-wan-delay",
        help="Seconds more before the KV events of instances in the other datacenter than "
        "the prefill pool reach the index: the line's one-way delay when each datacenter's "
        "router keeps its own index (0: one index, everything local)",
    ),
    sla_ttft: float = typer.Option(SLA_TTFT_S, "--sla-ttft", help="SLA threshold on TTFT, seconds"),
    sla_tpot: float = typer.Option(SLA_TPOT_S, "--sla-tpot", help="SLA threshold on TPOT, seconds"),
    decision_log: Path | None = typer.Option(
        None, "--decision-log", help="Write every decision as a JSON line to this file"
    ),
    index_mode: str = typer.Option(
        "events",
        "--index-mode",
        help="events: KV events feed the index; approximate: no events, the router records "
        "where it routed each request",
    ),
    predictor: Path | None = typer.Option(
        None, "--predictor", help="Hit-rate model (`predictor train`) used instead of raw matches"
    ),
    index_capacity: str = typer.Option(
        "exact",
        "--index-capacity",
        help="exact: the index bounds each instance at its KV capacity; unbounded: not told",
    ),
) -> None:
    """Replay TRACE on a simulated cluster; write summary.json, requests.jsonl, report.html."""
    from replay.metrics.summary import SlaThresholds
    from replay.presets.loader import parse_overrides
    from replay.report.run_report import write_run_with_report
    from replay.runner.run import run_replay
    from router.errors import UserError

    if sla_ttft <= 0 or sla_tpot <= 0:
        raise UserError("--sla-ttft and --sla-tpot must be positive")
    params = parse_overrides(param)
    cluster_overrides = parse_overrides(overrides)
    log = decision_log.open("w", encoding="utf-8") if decision_log is not None else None
    try:
        with progress_bars(not no_progress) as bars:
            bar = ReplayBar(bars, "replaying") if bars is not None else None
            result = run_replay(
                trace,
                preset,
                policy,
                policy_params=params,
                rate_scale=rate_scale,
                seed=seed,
                overrides=cluster_overrides,
                kv_event_delay_s=kv_event_delay,
                kv_event_wan_delay_s=kv_event_wan_delay,
                sla=SlaThresholds(ttft_s=sla_ttft, tpot_s=sla_tpot),
                progress=bar,
                decision_log=log,
                index_mode=index_mode,  # type: ignore[arg-type]  # checked by run_replay
                predictor=predictor,
                index_capacity=index_capacity,  # type: ignore[arg-type]  # checked by run_replay
                trace_format=trace_format,
                block_size=block_size,
                max_requests=max_requests,
            )
    finally:
        if log is not None:
            log.close()
    files = write_run_with_report(
        out, result.summary, result.records, overrides=cluster_overrides, command=command_line()
    )
    print_run(result.summary, files)


@replay_app.command("presets")
def presets(
    show: str | None = typer.Option(
        None,
        "--show",
        metavar="PRESET",
        help="Print this preset (a name or a file) whole, as YAML with its model and "
        "hardware entries: save it, edit it, and pass the file to --preset",
    ),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Override applied before --show prints (repeatable)"
    ),
) -> None:
    """List the cluster presets: pools, model, WAN line and prices, cost, default policy."""
    import yaml

    from replay.presets.loader import load_preset, parse_overrides, preset_names
    from replay.sim.step_costs import resolve_step_costs
    from router.errors import UserError

    if show is not None:
        preset = load_preset(show, parse_overrides(overrides))
        typer.echo(f"# preset {show}, resolved by pdd-router replay presets --show")
        for pool in preset.pools():
            try:
                where = resolve_step_costs(preset, pool).describe()
            except UserError as exc:  # shown, so the preset can still be saved and fixed
                where = f"cannot be priced: {exc}"
            typer.echo(f"# step costs of pool {pool}: {where}")
        typer.echo(yaml.safe_dump(preset.resolved(), sort_keys=False, width=88), nl=False)
        return
    console = Console()
    for name in preset_names():
        console.print(_preset_line(load_preset(name), name), highlight=False, soft_wrap=True)


def _preset_line(preset: ClusterPreset, name: str) -> str:
    pools = ", ".join(
        f"{pool_name}: {p.instances}x{p.gpus_per_instance} {p.hardware} "
        f"({'colocated' if p.colocated else p.tier.value}, {p.datacenter})"
        for pool_name, p in preset.pools().items()
    )
    prices = ", ".join(
        f"{hw} {preset.hardware[hw].price_per_hour:g}" for hw in sorted(preset.gpu_counts())
    )
    wan = preset.spec.links.wan
    line = (
        f"WAN {wan.bandwidth_gbps:g} Gbps, {wan.rtt_s * 1e3:g} ms RTT, "
        f"{wan.hourly_price():.2f} USD/h"
        if wan is not None and preset.spans_datacenters()
        else "one datacenter"
    )
    return (
        f"[bold]{name}[/] (policy {preset.spec.default_policy}, model {preset.spec.model}, "
        f"{preset.cost_per_hour():.2f} USD/h): {pools}; {line}; USD per GPU-hour: {prices}"
    )


replay_app.command("compare")(compare)
replay_app.command("validate")(validate)
replay_app.command("validate-costs")(validate_costs)
replay_app.command("sweep")(sweep)
replay_app.command("overload")(overload)
replay_app.command("tune")(tune)
replay_app.command("live")(live)
replay_app.command("plan")(plan)
