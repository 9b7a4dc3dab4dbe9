"""`pdd-router replay ...`: replay a trace through the simulated cluster."""

from __future__ import annotations

import typer

__all__ = ["replay_app"]

replay_app = typer.Typer(
    help="Replay traces through the two-datacenter cluster simulator.", no_args_is_help=True
)
