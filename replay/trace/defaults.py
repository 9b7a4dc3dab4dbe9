"""Defaults of the trace tools, apart from the code that uses them (light to import: the
command line shows them in its help)."""

from __future__ import annotations

__all__ = ["DEFAULT_ODD_MAX_OUTPUT", "DEFAULT_ODD_MIN_INPUT", "PROFILES"]

DEFAULT_ODD_MIN_INPUT = 32768
"""Odd traffic: an input at least this long..."""
DEFAULT_ODD_MAX_OUTPUT = 500
"""...with an output at most this long (the paper's "long input, short output")."""
PROFILES: tuple[str, ...] = ("agentic",)
"""Workload profiles `trace synth` knows."""
