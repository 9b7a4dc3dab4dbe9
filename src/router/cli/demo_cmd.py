"""`pdd-router demo`: the project's main job on embedded defaults.

Generates the synthetic agentic trace (default profile, 5,000 requests, seed 0) and
prints its statistics: the skewed prefix hit rate PDD is built for.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import typer
from rich.console import Console

from replay.trace.formats import read_trace
from replay.trace.report import print_stats, stats_json
from replay.trace.stats import compute_stats
from replay.trace.synth import make_profile, write_synthetic_trace

__all__ = ["demo"]


def _run(path: Path, requests: int, seed: int, as_json: bool) -> None:
    profile = make_profile("agentic")
    written = write_synthetic_trace(path, profile, requests, seed)
    stats = compute_stats(read_trace(path, "mooncake"))
    if as_json:
        header = {"trace": str(path), "format": "mooncake", "profile": "agentic", "seed": seed}
        typer.echo(stats_json(stats, header))
        return
    title = (
        f"Synthetic agentic trace: {written:,} requests, seed {seed}, "
        f"{profile.rate:g} req/s target, written to {path}"
    )
    print_stats(Console(), stats, title=title)


def demo(
    out: Path | None = typer.Option(
        None, "--out", "-o", help="Keep the trace in this file (default: a temporary one)"
    ),
    requests: int = typer.Option(5000, "--requests", "-n", help="Number of requests"),
    seed: int = typer.Option(0, "--seed", help="Seed of the random generator"),
    as_json: bool = typer.Option(False, "--json", help="Print the statistics as JSON"),
) -> None:
    """Generate the synthetic agentic trace and print its statistics."""
    if out is not None:
        _run(out, requests, seed, as_json)
        return
    with tempfile.TemporaryDirectory(prefix="pdd-demo-") as tmp:
        _run(Path(tmp) / "agentic.jsonl", requests, seed, as_json)
