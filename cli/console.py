"""The console every command prints its tables and lines to."""

from __future__ import annotations

import os
import sys

from rich.console import Console

__all__ = ["PIPED_WIDTH", "stdout_console"]

PIPED_WIDTH = 240
"""Columns of output written to a file or a pipe: wide enough for every table whole (rich
would fit it to 80 columns, cropping cells and cutting figures short)."""


def stdout_console() -> Console:
    """Standard output: a terminal's width on a terminal (or ``COLUMNS`` when set to a
    number), ``PIPED_WIDTH`` columns otherwise."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS", "").strip().isdigit():
        return Console()
    return Console(width=PIPED_WIDTH)
