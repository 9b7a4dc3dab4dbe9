"""`pdd-router trace ...`: statistics of a trace and synthetic traces."""

from __future__ import annotations

import typer

__all__ = ["trace_app"]

trace_app = typer.Typer(help="Read, summarize and synthesize request traces.", no_args_is_help=True)
