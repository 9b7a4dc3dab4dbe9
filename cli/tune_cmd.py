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

    from replay.tuning.trial import Trial
    from replay.tuning.tune import TuneResult

__all__ = ["tune"]


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items())) or "(defaults)"


def _joined(values: list[str]) -> str:
    return " / ".join(values)


def _row(trial: Trial) -> tuple[str, ...]:
    figs = trial.figures
    return (
        str(trial.number),
        _joined([f"{f.goodput_rps:.3f}" for f in figs]),
        _joined([f"{f.bcr * 1000:.2f}" for f in figs]),
        _joined([f"{f.sla_attainment:.2%}" for f in figs]),
        _joined(["-" if f.ttft_p99_s is None else f"{f.ttft_p99_s:.2f}" for f in figs]),
        _joined([f"{f.wan_bytes / 1e9:.0f}" for f in figs]),
    )


def _table(title: str, trials: list[Trial]) -> Table:
    """Figures per trial (one value per scenario); the parameters are listed below."""
    from rich.table import Table

    table = Table(title=title, caption="BCR: goodput per 1000 USD/h")
    for name in ("#", "goodput req/s", "BCR", "SLA", "TTFT P99 s", "WAN GB"):
        table.add_column(name, justify="right")
    for trial in trials:
        table.add_row(*_row(trial))
    return table


def _print(result: TuneResult, top: int) -> None:
    console = Console()
    ranked = sorted(result.trials, key=lambda t: (t.score(result.objective), -t.number))[::-1]
    shown = ranked[:top]
    title = (
        f"{result.policy} on {', '.join(result.scenarios)}: best {len(shown)} of "
        f"{len(result.trials)} by {result.objective} ({result.search} search)"
    )
    console.print(_table(title, shown))
    for trial in shown:
        line = f"  #{trial.number}: {_params(trial.params)}"
        console.print(line, highlight=False, soft_wrap=True)
    default = next(t for t in result.trials if t.number == 0)
    console.print(
        f"best: trial {result.best.number}: {_params(result.best.params)}; goodput "
        f"{result.best.goodput_rps:.3f} req/s against {default.goodput_rps:.3f} for the "
        "defaults (summed over the scenarios)",
        highlight=False,
        soft_wrap=True,
    )
    check = result.check
    if check is not None:
        title = f"check on {', '.join(check.scenarios)}"
        console.print(_table(title, [check.default, check.tuned]))
        console.print(
            f"tuned vs defaults on the check: goodput {check.tuned.goodput_rps:.3f} vs "
            f"{check.default.goodput_rps:.3f} req/s, summed over the check's scenarios "
            f"({'not worse' if check.not_worse else 'WORSE'})",
            highlight=False,
            soft_wrap=True,
        )


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
        0.001, "--min-gain", help="Coordinate search: relative gain needed to move a threshold"
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
    out: Path | None = typer.Option(None, "--out", help="Write every trial as JSON here"),
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
