"""`pdd-router replay live`: drive a live endpoint with a trace and record what clients see.

The command parses options, shows progress and prints; the work is
``replay.runner.live.run_live`` (imported when the command runs, so ``--help`` is instant).
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli.config_options import OutputOptions, with_options
from cli.progress import ReplayBar, progress_bars
from cli.run_output import print_run
from replay.runner.config import ReplaySettings

__all__ = ["live"]

_LIVE = (
    "rate_scale", "max_requests", "seed", "trace_format", "strict_trace", "block_size",
    "sla_ttft_s", "sla_tpot_ms",
)  # fmt: skip
"""The replay options that apply to a live run (the rest are the simulator's)."""


@with_options(OutputOptions, into="output", defaults={"out": Path("live-out")})
@with_options(ReplaySettings, into="settings", only=_LIVE)
def live(
    trace: Path = typer.Argument(..., help="Trace file (format detected: mooncake, bailian, ...)"),
    url: str = typer.Option(
        ...,
        "--url",
        help="Base URL of an OpenAI-compatible endpoint: one engine (vLLM, "
        "SGLang, engine-sim) or the router",
    ),
    model: str | None = typer.Option(None, "--model", help="The model field of each request"),
    api_key: str | None = typer.Option(
        None, "--api-key", envvar="PDD_ROUTER_LIVE_API_KEY", help="Bearer key for the endpoint"
    ),
    duration: float | None = typer.Option(
        None, "--duration", help="Send only the requests due within this many seconds"
    ),
    concurrency: int = typer.Option(
        64,
        "--concurrency",
        help="Most requests in flight; a request due beyond waits (its wait counts in its TTFT)",
    ),
    vocab_size: int | None = typer.Option(
        None,
        "--vocab-size",
        help="Token IDs are drawn below this (the model's vocabulary; default: the one "
        "the endpoint's model card gives, as the router's do, else 32000)",
    ),
    timeout: float = typer.Option(600.0, "--timeout", help="Longest one request may take, s"),
    *,
    settings: ReplaySettings,
    output: OutputOptions,
) -> None:
    """Send TRACE's requests to a live endpoint at their timestamps; record what came back.

    Each request is a streaming completion of made-up token IDs (shared trace blocks are
    shared tokens, so prefix caches hit where the trace's do), max_tokens its output
    length, ignore_eos, greedy. Writes requests.jsonl and summary.json in the replay's
    schema, so `replay validate` can set them against a replay of the same trace.
    Ctrl-C stops and writes what was sent. Exits 1 when most requests failed.
    """
    from replay.metrics.writers import write_run
    from replay.runner.live import LiveOptions, run_live
    from replay.trace.formats import read_trace, resolve_format

    s = settings
    fmt = resolve_format(s.trace_format) if s.trace_format is not None else None
    requests = list(read_trace(trace, fmt, s.block_size, strict=s.strict_trace))
    options = LiveOptions(
        url=url.rstrip("/"), model=model, api_key=api_key, rate_scale=s.rate_scale,
        max_requests=s.max_requests, duration_s=duration, concurrency=concurrency,
        vocab_size=vocab_size, seed=s.seed, timeout_s=timeout, sla=s.sla,
    )  # fmt: skip
    with progress_bars(not output.no_progress) as bars:
        bar = ReplayBar(bars, f"sending to {url}") if bars is not None else None
        result = run_live(requests, options, trace_name=str(trace), progress=bar)
    print_run(result.summary, write_run(output.out, result.summary, result.records))
    if result.mostly_failed:
        typer.echo(
            f"error: {result.failed} of {result.sent} requests failed (the warnings above "
            "say why): the run measured errors, not the endpoint",
            err=True,
        )
        raise typer.Exit(1)
