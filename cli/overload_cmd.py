"""`pdd-router replay overload`: a policy's SLA goodput from half to twice its capacity.

The command parses options, shows progress and prints the table; the runs are
``replay.experiments.overload.run_overload`` (imported when the command runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from cli.config_options import OutputOptions, with_options
from cli.console import stdout_console
from cli.executor_options import EXECUTOR, RAY_ADDRESS, WORKERS, open_executor
from cli.progress import ReplayCount, progress_bars
from replay.experiments.experiment_config import OverloadConfig

if TYPE_CHECKING:
    from replay.experiments.overload import OverloadResult

__all__ = ["overload"]


@with_options(OutputOptions, into="output", defaults={"out": Path("overload-out")})
@with_options(OverloadConfig, into="config")
def overload(
    executor_kind: str = EXECUTOR,
    workers: int | None = WORKERS,
    ray_address: str | None = RAY_ADDRESS,
    *,
    config: OverloadConfig,
    output: OutputOptions,
) -> None:
    """How the policy holds up past its capacity: SLA goodput at multiples of its capacity.

    Finds the capacity with `replay sweep` (the highest rate at which --target of the
    requests meet the SLA), then replays the trace at --multiples of that rate. "SLA goodput
    kept" is the SLA goodput over the SLA goodput at capacity: a policy that degrades
    gracefully keeps it near 100% past its capacity, by refusing the excess (counted as
    rejected). Writes overload.json and overload.csv.
    """
    from replay.experiments.overload import run_overload

    extra = len(config.multiples)
    with (
        open_executor(executor_kind, workers, ray_address) as executor,
        progress_bars(not output.no_progress) as bars,
    ):
        count = ReplayCount(bars) if bars is not None else None
        done = [0, 0]

        def sweep_progress(finished: int, started: int) -> None:
            done[0], done[1] = finished, started
            if count is not None:
                count(finished, started + extra)

        def multiple_done(finished: int) -> None:
            if count is not None:
                count(done[0] + finished, done[1] + extra)

        result = run_overload(
            config, executor=executor, on_replays=sweep_progress, on_done=multiple_done
        )
    _print(result, result.write(output.out))


OVERLOAD_HEADERS = (
    "x capacity", "arrival rate (req/s)", "SLA met", "SLA goodput (req/s)", "SLA goodput kept (%)",
    "rejected", "TTFT P99 (s)",
)  # fmt: skip
"""The table's columns: each row's SLA goodput is at that row's arrival rate."""


def _print(result: OverloadResult, written: list[Path]) -> None:
    best = result.sweep.best
    assert best is not None  # run_overload refuses a policy without capacity
    console = stdout_console()
    console.print(
        f"capacity of {result.spec.label}: {best.arrival_rate_req_s:.3g} req/s (rate scale "
        f"{best.rate_scale:.4g}), SLA goodput at capacity {best.sla_goodput_req_s:.3g} req/s",
        highlight=False,
    )
    table = Table(title=f"{result.spec.label} past its capacity")
    for header in OVERLOAD_HEADERS:
        table.add_column(header, justify="right")
    for p in result.points:
        table.add_row(
            f"{p.multiple:g}",
            f"{p.arrival_rate_req_s:.3g}",
            f"{p.sla_attainment:.1%}",
            f"{p.sla_goodput_req_s:.3g}",
            "-" if p.sla_goodput_kept is None else f"{p.sla_goodput_kept * 100:.0f}",
            f"{p.rejected_share:.1%}",
            "-" if p.ttft_p99_s is None else f"{p.ttft_p99_s:.3g}",
        )
    console.print(table)
    console.print(f"wrote {', '.join(str(p) for p in written)}", highlight=False)
