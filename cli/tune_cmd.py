"""`pdd-router replay tune`: search a policy's thresholds under the SLA.

The command parses options, shows progress and prints; the search is ``replay.tuning.tune``
(imported when the command runs, so ``--help`` stays instant). It is registered on
``replay_app`` by ``cli.replay_cmd``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from cli.config_options import OutputOptions, with_options
from cli.console import stdout_console
from cli.executor_options import EXECUTOR, RAY_ADDRESS, WORKERS, open_executor
from cli.progress import ReplayCount, progress_bars
from replay.runner.config import ReplaySettings

if TYPE_CHECKING:
    from rich.table import Table

    from replay.tuning.trial import Figures, Trial, TuneSetup
    from replay.tuning.tune import CheckResult, TuneResult

__all__ = ["TuneOptions", "trials_csv", "tune"]

Objective = Literal["goodput", "bcr"]


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items())) or "(defaults)"


TUNE_HEADERS = (
    "SLA goodput at the trace's rate (req/s)", "BCR at the trace's rate (req/s per 1000 USD/h)",
    "SLA met", "TTFT P99 (s)", "WAN (GB)",
)  # fmt: skip
_CAPTION = "the trace's rate: the scenario's (its trace at its load)"


def _figures(f: Figures) -> tuple[str, ...]:
    ttft = "-" if f.ttft_p99_s is None else f"{f.ttft_p99_s:.2f}"
    return (
        f"{f.sla_goodput_req_s:.3f}", f"{f.bcr_at_trace_rate_per_1000_usd_h:.2f}",
        f"{f.sla_attainment:.2%}", ttft, f"{f.wan_bytes / 1e9:.0f}",
    )  # fmt: skip


def _sum(trial: Trial) -> tuple[str, ...]:
    return (
        f"{trial.sla_goodput_req_s:.3f}",
        f"{trial.bcr_at_trace_rate_per_1000_usd_h:.2f}",
        "",
        "",
        "",
    )


def _new_table(title: str, first: tuple[str, ...]) -> Table:
    from rich.table import Table

    table = Table(title=title, caption=_CAPTION)
    for name in first:
        table.add_column(name, no_wrap=True)
    for name in TUNE_HEADERS:  # narrower than 80 columns a figure folds, never ends in "..."
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
    return "BCR at the trace's rate" if objective == "bcr" else "SLA goodput at the trace's rate"


def _print(result: TuneResult, top: int) -> None:
    console = stdout_console()
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
    summed = "summed over the scenarios"
    if best.number == 0:
        line = (
            f"best: trial 0, the defaults: {_objective(result.objective)} {ours:.3f} "
            f"{unit}, {summed}; no trial was kept over them"
        )
    else:
        line = (
            f"best: trial {best.number}: {_params(best.params)}; {_objective(result.objective)} "
            f"{ours:.3f} against {theirs:.3f} {unit} for the defaults{change}, "
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
                "best vs defaults on the check: SLA goodput "
                f"{check.tuned.sla_goodput_req_s:.3f} vs "
                f"{check.default.sla_goodput_req_s:.3f} req/s, summed over the check's scenarios "
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


class TuneOptions(BaseModel):
    """What `replay tune` tunes on and how it searches."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    traces: list[Path] | None = Field(
        None,
        description="Traces to tune on, each at every --rate-scale on --preset",
        json_schema_extra={"argument": True},
    )
    scenarios: list[str] = Field(
        default_factory=list,
        description="A trace on its own preset at its own loads, beside or instead of TRACES "
        "(repeatable): tune on several kinds of traffic at once",
        json_schema_extra={"flags": ["--scenario"], "metavar": "TRACE:PRESET:R1,R2"},
    )
    preset: str | None = Field(None, description="Cluster preset of TRACES (see `replay presets`)")
    policy: str | None = Field(
        None, description="Policy to tune (default: the preset's default policy)"
    )
    rate_scale: list[float] = Field(
        [1.0],
        description="Load(s) to tune at (repeatable: every trace at each)",
        json_schema_extra={"repeat": True},
    )
    objective: Objective = Field(
        "goodput",
        description="goodput: SLA goodput at the trace's rate (req/s); bcr: BCR at the "
        "trace's rate (req/s per 1000 USD/h)",
    )
    search: Literal["coordinate", "random"] = Field(
        "coordinate", description="coordinate (one threshold at a time) or random"
    )
    trials: int = Field(32, ge=1, description="Most configurations (the defaults first)")
    min_gain: float = Field(
        0.001,
        description="Coordinate search: a trial must beat the incumbent by this relative gain "
        "(0.001 = 0.1%) to replace it",
    )
    search_seed: int = Field(0, description="Seed of the random search")
    jobs: int | None = Field(
        None,
        description="Older spelling of --executor process --workers N",
        json_schema_extra={"hidden": True},
    )
    check: Path | None = Field(
        None, description="Also replay the defaults and the best on this other trace"
    )
    check_preset: str | None = Field(
        None, description="Preset of the check (default: --preset, else the first scenario's)"
    )
    check_rate_scale: list[float] = Field(
        [1.0], description="Load(s) of the check (repeatable)", json_schema_extra={"repeat": True}
    )
    top: int = Field(8, description="Trials shown")
    out: Path | None = Field(
        None,
        description="Write every trial as JSON here, and the trial table as CSV beside it "
        "(tune.json: tune.trials.csv, one row per trial and scenario)",
    )


@with_options(OutputOptions, into="output", only=("no_progress",))
@with_options(ReplaySettings, into="settings", skip=("rate_scale",))
@with_options(TuneOptions, into="options")
def tune(
    executor_kind: str = EXECUTOR,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
    *,
    options: TuneOptions,
    settings: ReplaySettings,
    output: OutputOptions,
) -> None:
    """Search the policy's thresholds on TRACES for the best SLA goodput (or BCR) at their rates.

    The configurations of a round (and each one's scenarios) are independent replays: with
    --executor process or ray they run --workers at a time, and the search is the same.
    Every replay has the replay options given.
    """
    from replay.tuning.tune import run_tune
    from router.errors import UserError

    o = options
    setups, check_setups = _setups(o, settings)
    if o.jobs is not None:  # the older spelling: N configurations at once in processes
        if executor_kind != "serial" or workers is not None:
            raise UserError("--jobs is the older spelling of --executor process --workers N")
        executor_kind, workers = ("process", o.jobs) if o.jobs > 1 else ("serial", None)
    with (
        open_executor(executor_kind, workers, ray_address) as executor,
        progress_bars(not output.no_progress) as bars,
    ):
        most = o.trials * len(setups) + 2 * len(check_setups)
        advance = ReplayCount(bars, total=most) if bars is not None else None
        result = run_tune(
            setups, objective=o.objective, search=o.search, trials=o.trials,
            min_gain=o.min_gain, search_seed=o.search_seed, executor=executor,
            check=check_setups, advance=advance,
        )  # fmt: skip
    _print(result, o.top)
    if o.out is not None:
        o.out.write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n", "utf-8")
        table = trials_csv(o.out)
        result.write_trials_csv(table)
        stdout_console().print(f"wrote {o.out} and {table}", highlight=False, soft_wrap=True)


def _setups(o: TuneOptions, settings: ReplaySettings) -> tuple[list[TuneSetup], list[TuneSetup]]:
    """The tuning scenarios and the check's, each a replay with ``settings``; the traces
    and presets checked before any replay."""
    from replay.presets.loader import load_preset
    from replay.tuning.trial import TuneSetup
    from router.errors import UserError

    for value in [*o.rate_scale, *o.check_rate_scale]:
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"--rate-scale and --check-rate-scale must be positive, got {value}")
    traces = o.traces or []
    if traces and o.preset is None:
        raise UserError("--preset is required with TRACES")
    if not traces and o.preset is not None:
        raise UserError("--preset names the preset of TRACES; give TRACES (or drop it)")
    if not traces and o.rate_scale != [1.0]:
        raise UserError("--rate-scale sets the loads of TRACES; a --scenario has its own")
    parsed = [_scenario(text) for text in o.scenarios]
    if not traces and not parsed:
        raise UserError("give at least one trace to tune on (TRACES or --scenario)")
    checked = [o.check] if o.check is not None else []
    for path in [*traces, *(t for t, _, _ in parsed), *checked]:
        if not path.is_file():
            raise UserError(f"{path}: no such trace file")
    first = o.preset if o.preset is not None else parsed[0][1]
    names = {first, *(name for _, name, _ in parsed), o.check_preset or first}
    for name in sorted(names):  # an unknown preset is refused before any replay
        load_preset(name, settings.overrides)
    policy = o.policy or load_preset(first, settings.overrides).spec.default_policy
    common = settings.model_dump()

    def setup(trace: Path, preset: str, scale: float) -> TuneSetup:
        return TuneSetup(**{**common, "rate_scale": scale}, trace=str(trace), preset=preset,
                         policy=policy)  # fmt: skip

    setups = [setup(t, first, r) for t in traces for r in o.rate_scale]
    setups += [setup(t, name, r) for t, name, loads in parsed for r in loads]
    check = [setup(c, o.check_preset or first, r) for c in checked for r in o.check_rate_scale]
    return setups, check


def trials_csv(out: Path) -> Path:
    """Where the trial table goes: beside --out, named after it (tune.json: tune.trials.csv),
    so several tunes can write into one folder."""
    return out.with_name(f"{out.stem}.trials.csv")
