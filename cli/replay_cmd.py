"""`pdd-router replay ...`: replay a trace through the simulated cluster.

The command only parses options, shows progress and prints; the replay itself is
``replay.runner.run.run_replay`` (imported when the command runs, so ``--help`` is instant).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from cli.config_options import OutputOptions, with_options
from cli.console import stdout_console
from cli.experiment_cmd import command_line, compare, sweep
from cli.live_cmd import live
from cli.overload_cmd import overload
from cli.plan_cmd import plan
from cli.progress import ReplayBar, progress_bars
from cli.run_output import print_run
from cli.tune_cmd import tune
from cli.validate_cmd import validate
from cli.validate_costs_cmd import validate_costs
from replay.runner.config import ReplayConfig

if TYPE_CHECKING:
    from replay.presets.cluster_preset import ClusterPreset

__all__ = ["replay_app"]

replay_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Replay traces through the two-datacenter cluster simulator.",
    no_args_is_help=True,
)


@replay_app.command("run")
@with_options(OutputOptions, into="output", defaults={"out": Path("replay-out")})
@with_options(ReplayConfig, into="config")
def run(
    decision_log: Path | None = typer.Option(
        None, "--decision-log", help="Write every decision as a JSON line to this file"
    ),
    *,
    config: ReplayConfig,
    output: OutputOptions,
) -> None:
    """Replay TRACE on a simulated cluster; write summary.json, requests.jsonl, report.html."""
    from replay.report.run_report import write_run_with_report
    from replay.runner.run import run_replay

    log = decision_log.open("w", encoding="utf-8") if decision_log is not None else None
    try:
        with progress_bars(not output.no_progress) as bars:
            bar = ReplayBar(bars, "replaying") if bars is not None else None
            result = run_replay(config, progress=bar, decision_log=log)
    finally:
        if log is not None:
            log.close()
    files = write_run_with_report(
        output.out, result.summary, result.records, overrides=config.overrides,
        command=command_line(),
    )  # fmt: skip
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
    console = stdout_console()
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
