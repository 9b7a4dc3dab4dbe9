"""`pdd-router replay tune`: search a policy's thresholds under the SLA.

The command parses options, shows progress and prints; the search is ``replay.tuning.tune``
(imported when the command runs, so ``--help`` stays instant). It is registered on
``replay_app`` by ``cli.replay_cmd``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from cli.executor_options import EXECUTOR, RAY_ADDRESS, WORKERS, open_executor
from cli.progress import ReplayCount, progress_bars
from router.sla import SLA_TPOT_S, SLA_TTFT_S

if TYPE_CHECKING:
    from rich.table import Table

    from replay.tuning.trial import Figures, Trial
    from replay.tuning.tune import CheckResult, TuneResult

__all__ = ["trials_csv", "tune"]


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items())) or "(defaults)"


_HEADERS = (
    "goodput (req/s)", "BCR (req/s per 1000 USD/h)", "SLA met", "TTFT P99 (s)", "WAN (GB)",
)  # fmt: skip
_CAPTION = "goodput: requests meeting the SLA per second, at the scenario's load"


def _figures(f: Figures) -> tuple[str, ...]:
    ttft = "-" if f.ttft_p99_s is None else f"{f.ttft_p99_s:.2f}"
    return (
        f"{f.goodput_rps:.3f}", f"{f.bcr * 1000:.2f}", f"{f.sla_attainment:.2%}", ttft,
        f"{f.wan_bytes / 1e9:.0f}",
    )  # fmt: skip


def _sum(trial: Trial) -> tuple[str, ...]:
    return (f"{trial.goodput_rps:.3f}", f"{trial.bcr * 1000:.2f}", "", "", "")


def _new_table(title: str, first: tuple[str, ...]) -> Table:
    from rich.table import Table

    table = Table(title=title, caption=_CAPTION)
    for name in first:
        table.add_column(name, no_wrap=True)
    for name in _HEADERS:  # narrower than 80 columns a figure folds, never ends in "..."
        table.add_column(name, justify="right", overflow="fold")
    return table


def _legend(console: Console, what: str, prefix: str, labels: list[str]) -> None:
    """The scenarios' short names (S1, S2, ...: the tables' scenario column)."""
    console.print(f"{what} ({len(labels)}):", highlight=False)
    for i, label in enumerate(labels, start=1):
        console.print(f"  {prefix}{i} = {label}", highlight=False, soft_wrap=True)


def _trial_name(trial: Trial, best: Trial) -> str:
    name = str(trial.number)
    if trial.number == best.number:
        return f"{name} best"
    return f"{name} defaults" if trial.number == 0 else name


def _trials_table(result: TuneResult, shown: list[Trial]) -> Table:
    """One row per trial and scenario (and the trial's sum first, with several)."""
    title = (
        f"{result.policy}: best {len(shown)} of {len(result.trials)} trials by "
        f"{_objective(result.objective)} summed over the scenarios ({result.search} search)"
    )
    table = _new_table(title, ("trial", "scenario"))
    several = len(result.scenarios) > 1
    for trial in shown:
        name = _trial_name(trial, result.best)
        if several:
            table.add_row(name, "sum", *_sum(trial))
        for i, fig in enumerate(trial.figures):
            first = name if i == 0 and not several else ""
            table.add_row(first, f"S{i + 1}", *_figures(fig))
        if several:
            table.add_section()
    return table


def _check_table(check: CheckResult, best: Trial) -> Table:
    """Each configuration (the defaults, the best) once per check scenario."""
    title = f"check: the defaults and the best on {len(check.scenarios)} other scenario(s)"
    table = _new_table(title, ("scenario", "trial"))
    runs = [(_trial_name(check.default, best), check.default)]
    if check.tuned.number != check.default.number:
        runs.append((_trial_name(check.tuned, best), check.tuned))
    for i in range(len(check.scenarios)):
        for j, (name, trial) in enumerate(runs):
            first = f"C{i + 1}" if j == 0 else ""
            table.add_row(first, name, *_figures(trial.figures[i]))
    if len(check.scenarios) > 1:
        table.add_section()
        for name, trial in runs:
            table.add_row("sum", name, *_sum(trial))
    return table


def _objective(objective: str) -> str:
    return "BCR" if objective == "bcr" else "goodput"


def _print(result: TuneResult, top: int) -> None:
    console = Console()
    shown = result.ranked()[:top]
    _legend(console, "tuning scenarios", "S", result.scenarios)
    console.print(_trials_table(result, shown))
    for trial in shown:
        line = f"  #{trial.number}: {_params(trial.params)}"
        console.print(line, highlight=False, soft_wrap=True)
    default = next(t for t in result.trials if t.number == 0)
    best = result.best
    ours, theirs = best.value(result.objective), default.value(result.objective)
    change = f" ({ours / theirs - 1:+.2%})" if theirs > 0 else ""
    unit = "req/s" if result.objective == "goodput" else "req/s per 1000 USD/h"
    scale = 1.0 if result.objective == "goodput" else 1000.0
    summed = "summed over the scenarios"
    if best.number == 0:
        line = (
            f"best: trial 0, the defaults: {_objective(result.objective)} {ours * scale:.3f} "
            f"{unit}, {summed}; no trial was kept over them"
        )
    else:
        line = (
            f"best: trial {best.number}: {_params(best.params)}; {_objective(result.objective)} "
            f"{ours * scale:.3f} against {theirs * scale:.3f} {unit} for the defaults{change}, "
            f"{summed}"
        )
    console.print(line, highlight=False, soft_wrap=True)
    why = result.why_not_first()
    if why is not None:
        console.print(why, highlight=False, soft_wrap=True)
    check = result.check
    if check is not None:
        _legend(console, "check scenarios", "C", check.scenarios)
        console.print(_check_table(check, best))
        if check.tuned.number == check.default.number:
            verdict = "the best is the defaults (trial 0): the check replays them once"
        else:
            verdict = (
                f"best vs defaults on the check: goodput {check.tuned.goodput_rps:.3f} vs "
                f"{check.default.goodput_rps:.3f} req/s, summed over the check's scenarios "
                f"({'not worse' if check.not_worse else 'WORSE'})"
            )
        console.print(verdict, highlight=False, soft_wrap=True)


def _scenario(text: str) -> tuple[Path, str, list[float]]:
    """``TRACE:PRESET:R1,R2`` (the trace may hold colons; the last two fields may not)."""
    from router.errors import UserError

    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not all(parts):
        raise UserError(f"--scenario must be TRACE:PRESET:R1,R2, got {text!r}")
    trace, name, loads = parts
    try:
        scales = [float(v) for v in loads.split(",")]
    except ValueError:
        raise UserError(f"--scenario {text!r}: loads must be numbers, got {loads!r}") from None
    if not all(math.isfinite(v) and v > 0 for v in scales):
        raise UserError(f"--scenario {text!r}: loads must be positive numbers")
    return Path(trace), name, scales


def tune(
    traces: list[Path] = typer.Argument(
        None, help="Traces to tune on, each at every --rate-scale on --preset"
    ),
    scenarios: list[str] = typer.Option(
        [],
        "--scenario",
        metavar="TRACE:PRESET:R1,R2",
        help="A trace on its own preset at "
        "its own loads, beside or instead of TRACES (repeatable): tune on several kinds of "
        "traffic at once",
    ),
    preset: str | None = typer.Option(
        None, "--preset", help="Cluster preset of TRACES (see `replay presets`)"
    ),
    objective: str = typer.Option("goodput", "--objective", help="goodput or bcr (SLA-based)"),
    policy: str | None = typer.Option(
        None, "--policy", help="Policy to tune (default: the preset's default policy)"
    ),
    search: str = typer.Option(
        "coordinate", "--search", help="coordinate (one threshold at a time) or random"
    ),
    trials: int = typer.Option(32, "--trials", help="Most configurations (the defaults first)"),
    min_gain: float = typer.Option(
        0.001,
        "--min-gain",
        help="Coordinate search: a trial must beat the incumbent by this relative gain "
        "(0.001 = 0.1%) to replace it",
    ),
    search_seed: int = typer.Option(0, "--search-seed", help="Seed of the random search"),
    executor_kind: str = EXECUTOR,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
    jobs: int | None = typer.Option(
        None, "--jobs", hidden=True, help="Older spelling of --executor process --workers N"
    ),
    overrides: list[str] = typer.Option(
        [], "--set", metavar="KEY=VALUE", help="Cluster override (repeatable)"
    ),
    rate_scale: list[float] = typer.Option(
        [1.0], "--rate-scale", help="Load(s) to tune at (repeatable: every trace at each)"
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of each replay"),
    sla_ttft: float = typer.Option(SLA_TTFT_S, "--sla-ttft", help="SLA threshold on TTFT, seconds"),
    sla_tpot: float = typer.Option(SLA_TPOT_S, "--sla-tpot", help="SLA threshold on TPOT, seconds"),
    index_mode: str = typer.Option("events", "--index-mode", help="events or approximate"),
    predictor: Path | None = typer.Option(None, "--predictor", help="Hit-rate model file"),
    check: Path | None = typer.Option(
        None, "--check", help="Also replay the defaults and the best on this other trace"
    ),
    check_preset: str | None = typer.Option(
        None,
        "--check-preset",
        help="Preset of the check (default: --preset, else the first scenario's)",
    ),
    check_rate_scale: list[float] = typer.Option(
        [1.0], "--check-rate-scale", help="Load(s) of the check (repeatable)"
    ),
    top: int = typer.Option(8, "--top", help="Trials shown"),
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Write every trial as JSON here, and the trial table as CSV beside it "
        "(tune.json: tune.trials.csv, one row per trial and scenario)",
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
) -> None:
    """Search the policy's thresholds on TRACES for the best SLA goodput (or BCR).

    The configurations of a round (and each one's scenarios) are independent replays: with
    --executor process or ray they run --workers at a time, and the search is the same.
    """
    from replay.metrics.summary import SlaThresholds
    from replay.presets.loader import load_preset, parse_overrides
    from replay.tuning.trial import TuneSetup
    from replay.tuning.tune import run_tune
    from router.errors import UserError

    if objective not in ("goodput", "bcr"):
        raise UserError(f"--objective must be goodput or bcr, got {objective!r}")
    if search not in ("coordinate", "random"):
        raise UserError(f"--search must be coordinate or random, got {search!r}")
    if sla_ttft <= 0 or sla_tpot <= 0:
        raise UserError("--sla-ttft and --sla-tpot must be positive")
    for value in [*rate_scale, *check_rate_scale]:
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"--rate-scale and --check-rate-scale must be positive, got {value}")
    traces = traces or []
    if traces and preset is None:
        raise UserError("--preset is required with TRACES")
    if not traces and preset is not None:
        raise UserError("--preset names the preset of TRACES; give TRACES (or drop it)")
    if not traces and rate_scale != [1.0]:
        raise UserError("--rate-scale sets the loads of TRACES; a --scenario has its own")
    parsed = [_scenario(text) for text in scenarios]
    if not traces and not parsed:
        raise UserError("give at least one trace to tune on (TRACES or --scenario)")
    for path in [*traces, *(t for t, _, _ in parsed), *([check] if check is not None else [])]:
        if not path.is_file():
            raise UserError(f"{path}: no such trace file")
    first = preset if preset is not None else parsed[0][1]
    cluster = parse_overrides(overrides)
    names = {first, *(name for _, name, _ in parsed), *([check_preset] if check_preset else [])}
    for name in sorted(names):  # an unknown preset is refused before any replay
        load_preset(name, cluster)
    common: dict[str, Any] = {
        "policy": policy or load_preset(first, cluster).spec.default_policy,
        "seed": seed,
        "overrides": cluster,
        "sla": SlaThresholds(ttft_s=sla_ttft, tpot_s=sla_tpot),
        "index_mode": index_mode,
        "predictor": None if predictor is None else str(predictor),
    }
    setups = [
        TuneSetup(trace=str(t), preset=first, rate_scale=r, **common)
        for t in traces
        for r in rate_scale
    ]
    setups += [
        TuneSetup(trace=str(t), preset=name, rate_scale=r, **common)
        for t, name, loads in parsed
        for r in loads
    ]
    check_setups = []
    if check is not None:
        check_setups = [
            TuneSetup(trace=str(check), preset=check_preset or first, rate_scale=r, **common)
            for r in check_rate_scale
        ]
    if jobs is not None:  # the older spelling: N configurations at once in processes
        if executor_kind != "serial" or workers is not None:
            raise UserError("--jobs is the older spelling of --executor process --workers N")
        executor_kind, workers = ("process", jobs) if jobs > 1 else ("serial", None)
    with (
        open_executor(executor_kind, workers, ray_address) as executor,
        progress_bars(not no_progress) as bars,
    ):
        most = trials * len(setups) + 2 * len(check_setups)
        advance = ReplayCount(bars, total=most) if bars is not None else None
        result = run_tune(
            setups,
            objective=objective,  # type: ignore[arg-type]  # checked above
            search=search,  # type: ignore[arg-type]  # checked above
            trials=trials,
            min_gain=min_gain,
            search_seed=search_seed,
            executor=executor,
            check=check_setups,
            advance=advance,
        )
    _print(result, top)
    if out is not None:
        out.write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n", "utf-8")
        table = trials_csv(out)
        result.write_trials_csv(table)
        Console().print(f"wrote {out} and {table}", highlight=False, soft_wrap=True)


def trials_csv(out: Path) -> Path:
    """Where the trial table goes: beside --out, named after it (tune.json: tune.trials.csv),
    so several tunes can write into one folder."""
    return out.with_name(f"{out.stem}.trials.csv")
