"""`pdd-router replay overload`: a policy's SLA goodput from half to twice its capacity.

The command parses options, shows progress and prints the table; the runs are
``replay.experiments.overload.run_overload`` (imported when the command runs).
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from cli.executor_options import EXECUTOR, RAY_ADDRESS, WORKERS, open_executor
from cli.progress import ReplayCount, progress_bars
from replay.sim.kv_events import KV_EVENT_DELAY_S
from router.sla import SLA_TPOT_S, SLA_TTFT_S

__all__ = ["overload"]


def overload(
    trace: Path = typer.Argument(..., help="Trace file (format detected: mooncake, bailian, ...)"),
    preset: str | None = typer.Option(
        None, "--preset", help="Cluster preset: a name from `replay presets`, or a preset file"
    ),
    policy: str = typer.Option(
        "pdd-adaptive",
        "--policy",
        help="NAME [:KEY=VALUE,...] [@PRESET] (@PRESET: its own cluster)",
    ),
    multiples: str = typer.Option(
        "0.5,1,1.2,1.5,2",
        "--multiples",
        help="Arrival rates to replay, as multiples of the capacity rate (comma-separated)",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of every replay"),
    target: float = typer.Option(
        0.9, "--target", help="SLA attainment that defines the capacity (as in `replay sweep`)"
    ),
    overrides: list[str] = typer.Option(
        [], "--set", help="Cluster override KEY=VALUE (repeatable)", metavar="KEY=VALUE"
    ),
    out: Path = typer.Option(Path("overload-out"), "--out", help="Directory to write"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
    kv_event_delay: float = typer.Option(
        KV_EVENT_DELAY_S, "--kv-event-delay", help="Seconds before KV events reach the index"
    ),
    sla_ttft: float = typer.Option(SLA_TTFT_S, "--sla-ttft", help="SLA threshold on TTFT, seconds"),
    sla_tpot: float = typer.Option(SLA_TPOT_S, "--sla-tpot", help="SLA threshold on TPOT, seconds"),
    executor_kind: str = EXECUTOR,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
) -> None:
    """How the policy holds up past its capacity: SLA goodput at multiples of its capacity.

    Finds the capacity with `replay sweep` (the highest rate at which --target of the
    requests meet the SLA), then replays the trace at --multiples of that rate. "kept" is
    the SLA goodput over the capacity's: a policy that degrades gracefully keeps it near
    100% past its capacity, by refusing the excess (counted as rejected). Writes
    overload.json and overload.csv.
    """
    from replay.experiments.overload import run_overload
    from replay.metrics.summary import SlaThresholds
    from replay.presets.loader import parse_overrides
    from router.errors import UserError

    if sla_ttft <= 0 or sla_tpot <= 0:
        raise UserError("--sla-ttft and --sla-tpot must be positive")
    try:
        factors = [float(m) for m in multiples.split(",") if m.strip()]
    except ValueError:
        raise UserError(
            f"--multiples must be numbers separated by commas, got {multiples!r}"
        ) from None
    with (
        open_executor(executor_kind, workers, ray_address) as executor,
        progress_bars(not no_progress) as bars,
    ):
        count = ReplayCount(bars) if bars is not None else None
        done = [0, 0]

        def sweep_progress(finished: int, started: int) -> None:
            done[0], done[1] = finished, started
            if count is not None:
                count(finished, started + len(factors))

        def multiple_done(finished: int) -> None:
            if count is not None:
                count(done[0] + finished, done[1] + len(factors))

        result = run_overload(
            trace, preset, policy, multiples=factors, seed=seed, target=target,
            overrides=parse_overrides(overrides), kv_event_delay_s=kv_event_delay,
            sla=SlaThresholds(ttft_s=sla_ttft, tpot_s=sla_tpot), executor=executor,
            on_replays=sweep_progress, on_done=multiple_done,
        )  # fmt: skip
    written = result.write(out)
    best = result.sweep.best
    assert best is not None  # run_overload refuses a policy without capacity
    console = Console()
    console.print(
        f"capacity of {result.spec.label}: {best.rate_rps:.3g} req/s (rate scale "
        f"{best.rate_scale:.4g}), SLA goodput {best.goodput_rps:.3g} req/s",
        highlight=False,
    )
    table = Table(title=f"{result.spec.label} past its capacity")
    for header in ("x capacity", "rate (req/s)", "SLA met", "SLA goodput", "kept", "rejected",
                   "TTFT P99 (s)"):  # fmt: skip
        table.add_column(header, justify="right")
    for p in result.points:
        table.add_row(
            f"{p.multiple:g}",
            f"{p.rate_rps:.3g}",
            f"{p.sla_attainment:.1%}",
            f"{p.sla_goodput_rps:.3g}",
            "-" if p.goodput_kept is None else f"{p.goodput_kept:.0%}",
            f"{p.rejected_share:.1%}",
            "-" if p.ttft_p99_s is None else f"{p.ttft_p99_s:.3g}",
        )
    console.print(table)
    console.print(f"wrote {', '.join(str(p) for p in written)}", highlight=False)
