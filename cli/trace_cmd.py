"""`pdd-router trace ...`: statistics of a trace and synthetic traces.

The commands only parse options and print; reading, statistics and synthesis live
in ``replay.trace``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from typer.core import TyperCommand

from cli.console import stdout_console
from replay.trace.defaults import DEFAULT_ODD_MAX_OUTPUT, DEFAULT_ODD_MIN_INPUT, PROFILES
from router.errors import UserError

__all__ = ["trace_app"]

trace_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Read, summarize and synthesize request traces.",
    no_args_is_help=True,
)

_INTEGER = re.compile(r"^\d[\d_]*$")


def _expand_multi_values(args: Sequence[str], options: Sequence[str]) -> list[str]:
    """Let ``--opt A B C`` and ``--opt A,B`` mean ``--opt A --opt B --opt C``.

    Integers following one of ``options`` are taken as more of its values (so a trace
    file named only by digits must come before the option, or after ``--``).
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            out.extend(args[i - 1 :])
            break
        name, eq, inline = arg.partition("=")
        if name not in options or (not eq and i >= len(args)):
            out.append(arg)
            continue
        values = [inline] if eq else [args[i]]
        i += 0 if eq else 1
        while i < len(args) and _INTEGER.match(args[i]):
            values.append(args[i])
            i += 1
        for value in values:
            for part in value.split(","):
                out += [name, part]
    return out


class _MultiValueCommand(TyperCommand):
    """A command whose ``--cache-tokens`` takes one or more values after a single flag."""

    multi_value_options = ("--cache-tokens",)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, _expand_multi_values(args, self.multi_value_options))


@contextmanager
def _reading_progress(path: Path, enabled: bool) -> Iterator[Callable[[BinaryIO], BinaryIO] | None]:
    """A progress bar by bytes read, on stderr, only on a terminal; yields the file wrapper."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield None
        return
    columns = (
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as progress:

        def wrap(stream: BinaryIO) -> BinaryIO:
            return progress.wrap_file(stream, total=path.stat().st_size, description="reading")

        yield wrap


@trace_app.command("stats", cls=_MultiValueCommand)
def stats_command(
    trace: Path = typer.Argument(..., help="Trace file (.jsonl or .csv, optionally .gz)"),
    format: str | None = typer.Option(
        None, "--format", "-f", help="mooncake, bailian or azure (default: detected)"
    ),
    block_size: int | None = typer.Option(
        None, "--block-size", help="Convert hash_ids to blocks of this many tokens first"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables"),
    cache_tokens: list[int] | None = typer.Option(
        None,
        "--cache-tokens",
        help="Also compute the hit rate of a global LRU cache of N tokens; takes several "
        "values (--cache-tokens 3000000 10000000) or repeats",
    ),
    odd_min_input: int = typer.Option(
        DEFAULT_ODD_MIN_INPUT, "--odd-min-input", help="Odd traffic: input at least this long"
    ),
    odd_max_output: int = typer.Option(
        DEFAULT_ODD_MAX_OUTPUT, "--odd-max-output", help="Odd traffic: output at most this long"
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="Never show a progress bar"),
    strict: bool = typer.Option(
        False,
        "--strict",
        help="Refuse a trace whose lines contradict themselves (hash_ids against "
        "input_length, output_length 0, a partial last block reused as a full one) "
        "instead of warning",
    ),
) -> None:
    """Summarize a trace: sizes, arrival rate, prefix hit rates, hit-rate buckets, odd traffic.
    Lines that contradict themselves are counted, and named by line number."""
    from replay.trace.checks import TraceChecks
    from replay.trace.formats import detect_format, read_trace, resolve_format
    from replay.trace.report import print_stats, stats_json
    from replay.trace.stats import compute_stats

    fmt = resolve_format(format) if format is not None else detect_format(trace)
    checks = TraceChecks(str(trace))  # every line read before refusing: the full report
    with _reading_progress(trace, enabled=not no_progress) as wrap:
        stats = compute_stats(
            read_trace(trace, fmt, block_size, wrap=wrap, checks=checks),
            cache_tokens=cache_tokens or (),
            odd_min_input=odd_min_input,
            odd_max_output=odd_max_output,
        )
    refusal = checks.refusal() if strict else None
    if refusal is not None:
        raise refusal
    if as_json:
        header = {"trace": str(trace), "format": fmt, "contradictions": checks.as_json()}
        typer.echo(stats_json(stats, header))
        return
    print_stats(stdout_console(), stats, title=f"{trace} ({fmt})")
    warning = checks.warning()
    if warning is not None:
        Console(stderr=True).print(f"[yellow]warning:[/] {warning}", highlight=False)


@trace_app.command("synth")
def synth_command(
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the Mooncake JSONL trace"),
    profile: str = typer.Option(
        "agentic", "--profile", help=f"Workload profile: {', '.join(PROFILES)}"
    ),
    requests: int = typer.Option(5000, "--requests", "-n", help="Number of requests"),
    seed: int = typer.Option(0, "--seed", help="Seed of the random generator"),
    rate: float | None = typer.Option(
        None, "--rate", help="Long-run arrival rate in requests/s (profile default: 10)"
    ),
    param: list[str] = typer.Option(
        [],
        "--param",
        help="Profile parameter KEY=VALUE (repeatable), e.g. output_median=400 or "
        "tool_result_median=3000: every field of replay.trace.synth_agentic.AgenticProfile",
        metavar="KEY=VALUE",
    ),
) -> None:
    """Write a synthetic trace (Mooncake JSONL); the same seed gives the same file."""
    from replay.presets.loader import parse_overrides
    from replay.trace.synth import make_profile, write_synthetic_trace

    overrides = parse_overrides(param)
    if rate is not None:
        if "rate" in overrides and overrides["rate"] != rate:
            raise UserError(
                f"--rate {rate:g} and --param rate={overrides['rate']} disagree: give one"
            )
        overrides["rate"] = rate
    chosen = make_profile(profile, overrides)
    written = write_synthetic_trace(out, chosen, requests, seed)
    typer.echo(
        f"wrote {written} requests to {out} "
        f"(profile {profile}, seed {seed}, rate {chosen.rate:g} req/s)"
    )
