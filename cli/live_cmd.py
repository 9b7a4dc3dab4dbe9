"""`pdd-router replay live`: drive a live endpoint with a trace and record what clients see.

The command parses options, shows progress and prints; the work is
``replay.runner.live.run_live`` (imported when the command runs, so ``--help`` is instant).
"""

from __future__ import annotations

from pathlib import Path

import typer

from cli.progress import ReplayBar, progress_bars
from cli.run_output import print_run
from router.sla import SLA_TPOT_S, SLA_TTFT_S

__all__ = ["live"]


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
    rate_scale: float = typer.Option(1.0, "--rate-scale", help="2 = arrivals twice as fast"),
    max_requests: int | None = typer.Option(
        None, "--max-requests", help="Send only the first N requests"
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
    seed: int = typer.Option(0, "--seed", help="Seed of the made-up token IDs"),
    timeout: float = typer.Option(600.0, "--timeout", help="Longest one request may take, s"),
    trace_format: str | None = typer.Option(
        None, "--format", "-f", help="Trace format: mooncake, bailian or azure (default: detected)"
    ),
    block_size: int | None = typer.Option(
        None, "--block-size", min=1, help="Convert the trace's block IDs to this many tokens"
    ),
    sla_ttft: float = typer.Option(SLA_TTFT_S, "--sla-ttft", help="SLA threshold on TTFT, seconds"),
    sla_tpot: float = typer.Option(SLA_TPOT_S, "--sla-tpot", help="SLA threshold on TPOT, seconds"),
    out: Path = typer.Option(Path("live-out"), "--out", help="Run directory to write"),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
) -> None:
    """Send TRACE's requests to a live endpoint at their timestamps; record what came back.

    Each request is a streaming completion of made-up token IDs (shared trace blocks are
    shared tokens, so prefix caches hit where the trace's do), max_tokens its output
    length, ignore_eos, greedy. Writes requests.jsonl and summary.json in the replay's
    schema, so `replay validate` can set them against a replay of the same trace.
    Ctrl-C stops and writes what was sent. Exits 1 when most requests failed.
    """
    from replay.metrics.summary import SlaThresholds
    from replay.metrics.writers import write_run
    from replay.runner.live import LiveOptions, run_live
    from replay.trace.formats import read_trace, resolve_format
    from router.errors import UserError

    if sla_ttft <= 0 or sla_tpot <= 0:
        raise UserError("--sla-ttft and --sla-tpot must be positive")
    fmt = resolve_format(trace_format) if trace_format is not None else None
    requests = list(read_trace(trace, fmt, block_size))
    options = LiveOptions(
        url=url.rstrip("/"), model=model, api_key=api_key, rate_scale=rate_scale,
        max_requests=max_requests, duration_s=duration, concurrency=concurrency,
        vocab_size=vocab_size, seed=seed, timeout_s=timeout,
        sla=SlaThresholds(ttft_s=sla_ttft, tpot_s=sla_tpot),
    )  # fmt: skip
    with progress_bars(not no_progress) as bars:
        bar = ReplayBar(bars, f"sending to {url}") if bars is not None else None
        result = run_live(requests, options, trace_name=str(trace), progress=bar)
    print_run(result.summary, write_run(out, result.summary, result.records))
    if result.mostly_failed:
        typer.echo(
            f"error: {result.failed} of {result.sent} requests failed (the warnings above "
            "say why): the run measured errors, not the endpoint",
            err=True,
        )
        raise typer.Exit(1)
