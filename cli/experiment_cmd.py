"""`pdd-router replay compare` and `replay sweep`: offline policy A/B and capacity.

The commands parse options, show progress and print; the work is ``replay.experiments.compare``,
``replay.experiments.sweep`` and ``replay.report`` (imported when a command runs, so ``--help``
stays instant). They are registered on ``replay_app`` by ``cli.replay_cmd``.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from cli.config_options import OutputOptions, with_options
from cli.console import stdout_console
from cli.executor_options import EXECUTOR, RAY_ADDRESS, WORKERS, open_executor
from cli.progress import ReplayBar, ReplayCount, progress_bars
from replay.experiments.experiment_config import CompareConfig, SweepConfig

if TYPE_CHECKING:
    from rich.table import Table

    from replay.experiments.compare import CompareResult
    from replay.experiments.executor import Executor
    from replay.experiments.sweep import SweepResult
    from replay.report import ClusterFacts
    from replay.sim.simulator import ProgressObserver

__all__ = ["command_line", "compare", "sweep"]


def command_line() -> str | None:
    """The command as typed, when run as ``pdd-router`` (for the report's header)."""
    if not sys.argv or Path(sys.argv[0]).name != "pdd-router":
        return None
    return shlex.join(["pdd-router", *sys.argv[1:]])


def _slug(label: str) -> str:
    """A folder name for a policy label; a preset file in it (``pdd@cfg/my.yaml``) by its
    stem (``pdd_my``), so the folder does not read as a file."""
    policy, at, preset = label.partition("@")
    if at and preset.strip().endswith((".yaml", ".yml")):
        label = f"{policy}@{Path(preset.strip()).stem}"
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", label).strip("_") or "policy"


def _shared_facts(presets: list[str], overrides: dict[str, Any]) -> ClusterFacts | None:
    """The capacities the report draws as reference lines, when every arm's cluster has
    the same ones (deployments may not: one line's capacity would cap another's)."""
    from replay.report import ClusterFacts

    facts = {ClusterFacts.of_preset(p, overrides) for p in dict.fromkeys(presets)}
    return facts.pop() if len(facts) == 1 else None


@with_options(OutputOptions, into="output", defaults={"out": Path("compare-out")})
@with_options(CompareConfig, into="config")
def compare(
    all_metrics: bool = typer.Option(False, "--all", help="Print every metric, not the key ones"),
    executor_kind: str = EXECUTOR,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
    *,
    config: CompareConfig,
    output: OutputOptions,
) -> None:
    """Replay TRACE under each --policy (same seed) and compare them with 95% intervals.

    A policy written NAME@PRESET runs on that cluster, so deployments compare too (e.g.
    --policy idc-pd@idc-pd --policy xdc-pd-drc@xdc-pd --policy pdd@pdd). Writes
    compare.json, compare.csv (one row per metric and policy), report.html and each
    policy's summary.json and requests.jsonl.
    With --executor process or ray the policies replay at once.
    """
    from replay.experiments.compare import run_compare
    from replay.report.compare_table import compare_table

    with (
        open_executor(executor_kind, workers, ray_address) as executor,
        progress_bars(not output.no_progress) as bars,
    ):

        def observer(label: str) -> ProgressObserver | None:
            return ReplayBar(bars, f"replaying {label}") if bars is not None else None

        count = ReplayCount(bars) if bars is not None and executor_kind != "serial" else None
        result = run_compare(config, progress=observer, executor=executor, on_replays=count)
    out = output.out
    _write_compare(result, config, out)
    console = stdout_console()
    console.print(compare_table(result, all_metrics=all_metrics, width=console.width))
    for spec, run in zip(result.specs, result.results, strict=True):
        for warning in run.summary.warnings:
            console.print(f"[yellow]warning[/] ({spec.label}): {warning}", highlight=False,
                          soft_wrap=True)  # fmt: skip
    console.print(
        f"wrote {out / 'compare.json'}, {out / 'compare.csv'}, {out / 'report.html'} and one "
        "folder per policy",
        highlight=False,
        soft_wrap=True,
    )


def _write_compare(result: CompareResult, config: CompareConfig, out: Path) -> None:
    """compare.json, compare.csv, report.html and each policy's folder."""
    from replay.experiments.compare_csv import write_compare_csv
    from replay.metrics.writers import write_requests, write_summary
    from replay.report import Report, ReportRun, write_report

    result.write_json(out / "compare.json")
    write_compare_csv(out / "compare.csv", result)
    slugs = [_slug(spec.label) for spec in result.specs]
    for i, run in enumerate(result.results):
        # two labels may slug alike (pdd@x/a.yaml, pdd@a.yaml): then number them
        folder = out / (slugs[i] if slugs.count(slugs[i]) == 1 else f"{i + 1}-{slugs[i]}")
        folder.mkdir(parents=True, exist_ok=True)
        write_summary(folder / "summary.json", run.summary)
        write_requests(folder / "requests.jsonl", run.records)
    runs = [
        ReportRun(s.label, r.summary, r.records)
        for s, r in zip(result.specs, result.results, strict=True)
    ]
    report = Report(
        "compare",
        runs,
        command=command_line(),
        hit_rates=result.hit_rates,
        cluster=_shared_facts(result.presets, config.replay.overrides),
        compare=result,
    )
    write_report(out / "report.html", report)


@with_options(OutputOptions, into="output", defaults={"out": Path("sweep-out")})
@with_options(SweepConfig, into="config")
def sweep(
    executor_kind: str = EXECUTOR,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
    *,
    config: SweepConfig,
    output: OutputOptions,
) -> None:
    """Find the capacity (the highest arrival rate meeting the SLA) and its BCR.

    Bisects --rate-scale for the highest rate at which --target of requests meet the SLA;
    writes sweep.json, probes.csv (one row per probe) and report.html. With --executor
    process or ray and W workers, each round replays the next probe and the ones that may
    follow it, so the same probes take about 1/log2(W+1) of the rounds. Several --policy
    are swept one after the other, each into its own folder of --out.
    """
    from replay.experiments.policy_spec import parse_policy_specs
    from router.errors import UserError

    parse_policy_specs(config.policies)  # a bad or repeated policy: before any replay
    several = len(config.policies) > 1
    missed = []
    with open_executor(executor_kind, workers, ray_address) as executor:
        for policy in config.policies:
            out = output.out / _slug(policy) if several else output.out
            result = _sweep_one(config, policy, executor, executor_kind, output.no_progress)
            if not _print_sweep(result, config, out):
                missed.append(policy)
    if missed:
        lowest = "; ".join(missed)
        raise UserError(
            f"no probe met {config.search.target:.0%} SLA attainment for {lowest}; wrote "
            "sweep.json and probes.csv"
        )


def _sweep_one(
    config: SweepConfig, policy: str, executor: Executor, kind: str, no_progress: bool
) -> SweepResult:
    """One policy's sweep, with its progress bars."""
    from replay.experiments.sweep import run_sweep

    max_probes = config.search.max_probes
    with progress_bars(not no_progress) as bars:
        serial = kind == "serial"
        overall = (
            bars.add_task(f"probes of {policy}", total=max_probes) if bars and serial else None
        )
        count = ReplayCount(bars) if bars is not None and not serial else None

        def observer(number: int, scale: float) -> ProgressObserver | None:
            if bars is None or overall is None:
                return None
            bars.update(overall, completed=number - 1)
            return ReplayBar(bars, f"probe {number}: rate scale {scale:.4g}")

        return run_sweep(
            config, policy=policy, progress=observer, executor=executor, on_replays=count
        )


def _print_sweep(result: SweepResult, config: SweepConfig, out: Path) -> bool:
    """Write and print one policy's sweep; False when no probe met the target."""
    result.write_json(out / "sweep.json")
    result.write_probes_csv(out / "probes.csv")
    console = stdout_console()
    console.print(_sweep_table(result))
    best = result.best_result
    rate, target = result.trace_timing_capacity_req_s, result.target
    if best is None or result.best is None or rate is None:
        console.print(
            f"[red]no probe of {result.spec.label} met {target:.0%} SLA attainment[/] (lowest "
            f"rate scale tried: {min(p.rate_scale for p in result.probes):.4g}); wrote "
            f"{out / 'sweep.json'} and {out / 'probes.csv'}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        return False
    for warning in best.summary.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    _write_best(result, config, out)
    bound = "" if result.bracketed else " (no probe missed the target: a lower bound)"
    there = result.best
    console.print(
        f"capacity of {result.spec.label} on the trace's timing: {rate:.3f} req/s{bound}, the "
        f"highest arrival rate at which {target:.0%} of requests met the SLA (probe "
        f"{result.best_number}, rate scale {there.rate_scale:.4g}: {there.sla_attainment:.1%} "
        f"met it, SLA goodput there {there.sla_goodput_req_s:.3f} req/s)",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    _print_capacity(console, result)
    console.print(
        f"wrote {out / 'sweep.json'}, {out / 'probes.csv'} and {out / 'report.html'}",
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    return True


def _print_capacity(console: Console, result: SweepResult) -> None:
    """The capacity that counts (at steady state when measured), its SLA goodput and BCR."""
    c = result.steady
    if c is not None:
        console.print(
            f"capacity at steady state: {c.capacity_req_s:.3f} req/s [{c.capacity_low_req_s:.3f}"
            f", {c.capacity_high_req_s:.3f}] (95%, over seeds and windows)",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    good, bcr = result.sla_goodput_at_capacity_req_s, result.bcr_per_1000_usd_h
    if good is not None:
        console.print(
            f"SLA goodput at capacity: {good:.3f} req/s; BCR: "
            + ("-" if bcr is None else f"{bcr:.3f} req/s per 1000 USD/h")
            + f" (the SLA goodput at capacity over {result.cost_per_hour:.2f} USD/h)",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    for warning in result.warnings():
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)


def _write_best(result: SweepResult, config: SweepConfig, out: Path) -> None:
    """The best probe's run (best/) and the sweep's report.html."""
    from replay.metrics.writers import write_requests, write_summary
    from replay.report import ClusterFacts, Report, ReportRun, write_report

    best = result.best_result
    assert best is not None
    (out / "best").mkdir(parents=True, exist_ok=True)
    write_summary(out / "best" / "summary.json", best.summary)
    write_requests(out / "best" / "requests.jsonl", best.records)
    write_report(
        out / "report.html",
        Report(
            "sweep",
            [ReportRun(result.spec.label, best.summary, best.records)],
            command=command_line(),
            hit_rates=_hit_rates(Path(config.trace)),
            cluster=ClusterFacts.of_preset(best.summary.preset, config.replay.overrides),
            sweep=result,
        ),
    )


SWEEP_HEADERS = (
    "#", "rate scale", "arrival rate (req/s)", "SLA met", "SLA goodput (req/s)", "TTFT P99 (s)",
)  # fmt: skip
"""The probe table's columns (and a last one, ``target``)."""


def _sweep_table(result: SweepResult) -> Table:
    """One row per probe, in the order they ran; the last column says whether the probe
    met the target and marks the one whose arrival rate is the capacity on the trace's
    timing."""
    from rich.table import Table

    table = Table(
        title=f"replay sweep of {result.spec.label}: target {result.target:.0%} SLA met",
        caption="SLA goodput: requests meeting the SLA per second, at the probe's arrival "
        "rate. capacity: the highest arrival rate that met the target.",
    )
    headers = SWEEP_HEADERS
    for name in headers:  # narrower than 80 columns a figure folds, never ends in "..."
        table.add_column(name, justify="right", overflow="fold")
    table.add_column("target", no_wrap=True)  # "met: capacity" stays on one line
    best = result.best_number
    for i, p in enumerate(result.probes, start=1):
        ttft = "-" if p.ttft_p99_s is None else f"{p.ttft_p99_s:.3g}"
        verdict = "met" if p.passed else "missed"
        if i == best:
            verdict = "met: capacity"
        table.add_row(
            str(i), f"{p.rate_scale:.4g}", f"{p.arrival_rate_req_s:.4g}", f"{p.sla_attainment:.1%}",
            f"{p.sla_goodput_req_s:.4g}", ttft, verdict, style="green" if p.passed else "red",
        )  # fmt: skip
    return table


def _hit_rates(trace: Path) -> dict[int, float] | None:
    from replay.metrics.hit_buckets import load_hit_rates

    return load_hit_rates(trace)
