"""What a command that ran a trace prints: the summary table, its warnings, the files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from cli.console import stdout_console

if TYPE_CHECKING:
    from replay.metrics.summary import Summary

__all__ = ["print_run"]


def print_run(summary: Summary, files: list[Path]) -> None:
    """The summary as a table, each warning on a line, and the files written."""
    from replay.metrics.table import summary_table

    console = stdout_console()
    console.print(summary_table(summary))
    client = summary.client
    if client is not None and client.requests_sent and client.loop_samples:  # a live run
        lag = client.send_lag_s
        console.print(
            f"client: requests sent {1e3 * (lag.p50 or 0.0):.1f} ms (P50) and "
            f"{1e3 * (lag.p99 or 0.0):.1f} ms (P99) after they were due; its event loop "
            f"woke late {client.loop_stalled_share or 0.0:.1%} of the time, at most "
            f"{1e3 * (client.loop_stall_s_max or 0.0):.1f} ms at once",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    if summary.step_costs:
        sources = "; ".join(f"{pool} {where}" for pool, where in summary.step_costs.items())
        console.print(f"step costs: {sources}", highlight=False, soft_wrap=True, style="dim")
    for warning in summary.warnings:
        console.print(f"[yellow]warning:[/] {warning}", highlight=False, soft_wrap=True)
    if summary.binding is not None:
        console.print(
            f"[yellow]short of {summary.binding.resource}[/]: size it with\n  "
            f"{summary.binding.plan_command}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    names = [str(f) for f in files]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    console.print(f"wrote {listed}", highlight=False, soft_wrap=True)
