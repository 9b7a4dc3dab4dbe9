"""`pdd-router bench ...`: benchmarks that print figures."""

from __future__ import annotations

import typer

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)
