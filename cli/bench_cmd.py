"""`pdd-router bench ...`: benchmarks that print figures."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from cli.console import stdout_console

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from bench.load_bench import LoadResult

__all__ = ["bench_app"]

bench_app = typer.Typer(
    rich_markup_mode="markdown", help="Benchmarks that print figures.", no_args_is_help=True
)

# options more than one command takes, declared once
REDIS_URL = typer.Option(
    None, "--redis-url", help="Redis of the shared index (default: the settings' redis.url)"
)
NO_REDIS = typer.Option(False, "--no-redis", help="Measure the in-memory index only")
JSON_TABLE = typer.Option(False, "--json", help="Print JSON instead of a table")


@bench_app.command("index")
def index(
    redis_url: str | None = REDIS_URL,
    repeats: int = typer.Option(200, "--repeats", min=10, help="Matches timed per configuration"),
    no_redis: bool = NO_REDIS,
    json_output: bool = JSON_TABLE,
) -> None:
    """Match latency (memory vs Redis, in PING round trips), store throughput, hashing time."""
    import json

    from bench.index_bench import render_index_bench, run_index_bench
    from router.settings import Settings

    url = None if no_redis else (redis_url or Settings().redis.url)
    result = run_index_bench(url, repeats=repeats)
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        stdout_console().print(render_index_bench(result))


@bench_app.command("route")
def route(
    redis_url: str | None = REDIS_URL,
    repeats: int = typer.Option(200, "--repeats", min=10, help="Decisions timed per row"),
    no_redis: bool = NO_REDIS,
    no_http: bool = typer.Option(False, "--no-http", help="Skip the HTTP rows"),
    throughput_s: float = typer.Option(
        3.0, "--throughput-seconds", min=0, help="Length of the sustained-load run (0: skip it)"
    ),
    no_chat: bool = typer.Option(False, "--no-chat", help="Skip the chat-request rows"),
    chat_repeats: int = typer.Option(
        100, "--chat-repeats", min=5, help="Chat requests timed per row (each a full render)"
    ),
    json_output: bool = JSON_TABLE,
) -> None:
    """Decision latency, 8K and 128K-token prompts: in-process and HTTP, memory and Redis;
    then routes per second of a router confined to one core, at 8K tokens; then a chat
    request of 8K and 32K tokens, in-process: render, tokenize, hash and decide."""
    import json
    from dataclasses import asdict

    from bench.route_bench import (
        render_route_bench,
        render_throughput,
        rows_json,
        run_route_bench,
        run_route_throughput,
    )
    from router.settings import Settings

    url = None if no_redis else (redis_url or Settings().redis.url)
    rows = run_route_bench(url, repeats=repeats, http=not no_http)
    load = run_route_throughput(seconds=throughput_s) if throughput_s > 0 and not no_http else None
    chat = None
    if not no_chat:
        from bench.chat_bench import run_chat_bench

        chat = run_chat_bench(repeats=chat_repeats)
    if json_output:
        out = {"latency": rows_json(rows), "throughput": asdict(load) if load else None}
        if chat is not None:
            from bench.chat_bench import chat_rows_json

            out["chat"] = chat_rows_json(chat)
        typer.echo(json.dumps(out, indent=2))
    else:
        console = stdout_console()
        console.print(render_route_bench(rows))
        if load is not None:
            console.print(render_throughput(load))
        if chat is not None:
            from bench.chat_bench import render_chat_bench

            console.print(render_chat_bench(chat))


# `bench load`'s options: long help, declared here so the command reads as what it does
LOAD_REPLICAS = typer.Option(
    [1, 3],
    "--replicas",
    help="Replica count to measure; repeat it for several, in the "
    "same run (default: 1 and 3). Several replicas share the Redis index",
)
LOAD_SECONDS = typer.Option(
    10.0,
    "--seconds",
    help="Length of the routes phase and of the completions phase, "
    "each after 0.5 s of warm-up (0: skip both, e.g. for a soak alone)",
)
LOAD_PROMPT_TOKENS = typer.Option(
    8192,
    "--prompt-tokens",
    help="Prompt length in tokens, 64 to 131072: 1/8 common to "
    "all prompts, 3/4 shared by one of 16 groups, 1/4 distinct",
)
LOAD_CONNECTIONS = typer.Option(
    12,
    "--connections",
    help="Kept-alive connections sending routes back to back, "
    "round robin over the replicas (at least one per replica)",
)
LOAD_CONCURRENCY = typer.Option(
    8,
    "--concurrency",
    help="Concurrent streaming completions, round robin over the "
    "replicas (at least one per replica)",
)
LOAD_CACHE_BLOCKS = typer.Option(
    None,
    "--cache-blocks",
    help="Each engine-sim's KV cache in blocks of 16 tokens, also each instance's "
    "capacity in the replicas' instances (capacity_tokens), at least two prompts' "
    "worth (default: 64 prompts' worth, at least 8192). The index grows until the "
    "caches are full: a soak with a small cache (e.g. 4096) reaches its steady size "
    "within its first minutes",
)
LOAD_REDIS = typer.Option(
    False,
    "--redis",
    help="Use the Redis index (a private redis-server) with one replica "
    "too (several replicas always do)",
)
LOAD_SOAK_MINUTES = typer.Option(
    0.0,
    "--soak-minutes",
    help="After the phases, a soak this long per replica count: "
    "routes and completions at steady rates, each replica's memory sampled (0: none)",
)


@bench_app.command("load")
def load(
    replicas: list[int] = LOAD_REPLICAS,
    seconds: float = LOAD_SECONDS,
    prompt_tokens: int = LOAD_PROMPT_TOKENS,
    connections: int = LOAD_CONNECTIONS,
    concurrency: int = LOAD_CONCURRENCY,
    output_tokens: int = typer.Option(4, "--output-tokens", help="Tokens per completion"),
    engines: str = typer.Option(
        "4,1,4", "--engines", help="engine-sim servers to start: P,RLD,MD counts"
    ),
    decode_ms: float = typer.Option(
        2.0, "--decode-ms", help="Each engine-sim's milliseconds per output token"
    ),
    cache_blocks: int | None = LOAD_CACHE_BLOCKS,
    redis: bool = LOAD_REDIS,
    soak_minutes: float = LOAD_SOAK_MINUTES,
    soak_routes_per_s: float = typer.Option(
        100.0, "--soak-routes-per-s", help="Routes per second during the soak"
    ),
    soak_completions_per_s: float = typer.Option(
        10.0, "--soak-completions-per-s", help="Streaming completions per second in the soak"
    ),
    sample_seconds: float = typer.Option(
        20.0, "--sample-seconds", help="How often the soak reads each replica's resident memory"
    ),
    no_progress: bool = typer.Option(False, "--no-progress", help="No progress bar"),
    json_output: bool = typer.Option(False, "--json", help="Print JSON instead of tables"),
) -> None:
    """A bounded load test on loopback: starts engine-sims, a private redis-server (for
    several replicas) and `serve` replicas, measures routes/s and streaming completions
    (TTFT, errors) for each replica count, optionally soaks them, and stops every process
    it started, also on Ctrl-C or an error.

    The replicas run with default settings plus the index's (the caller's PDD_ROUTER_*
    variables are not passed on). After an error the processes' logs are kept, in the
    folder the error names."""
    import json

    from bench.load_bench import LoadConfig, run_load_bench
    from cli.progress import progress_bars

    config = LoadConfig(
        replicas=tuple(replicas), seconds=seconds, prompt_tokens=prompt_tokens,
        connections=connections, concurrency=concurrency, output_tokens=output_tokens,
        engines=_engine_counts(engines), decode_ms=decode_ms, redis=redis,
        soak_minutes=soak_minutes, soak_routes_per_s=soak_routes_per_s,
        soak_completions_per_s=soak_completions_per_s, sample_s=sample_seconds,
        cache_blocks=cache_blocks,
    )  # fmt: skip
    config.check()
    with progress_bars(not no_progress) as bars:
        result = run_load_bench(config, _phase_progress(bars))
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        _print_load(result)


def _engine_counts(engines: str) -> tuple[int, int, int]:
    """``--engines P,RLD,MD`` as three counts; a UserError naming the option otherwise."""
    from router.errors import UserError

    try:
        p, rld, md = (int(n) for n in engines.split(","))
    except ValueError:
        raise UserError(
            f"--engines: three counts P,RLD,MD such as 4,1,4 (got {engines!r})"
        ) from None
    return p, rld, md


def _phase_progress(bars: Progress | None) -> Callable[[str, float, float], None]:
    """`bench load`'s progress: one bar per phase on a terminal (the last phase's bars go
    when a new one starts), one line per phase elsewhere."""
    tasks: dict[str, TaskID] = {}
    said: set[str] = set()

    def progress(what: str, done: float, total: float) -> None:
        if bars is None:
            if what not in said:
                said.add(what)
                typer.echo(f"{what} ...", err=True)
            return
        if what not in tasks:
            for task in tasks.values():
                bars.remove_task(task)
            tasks.clear()
            tasks[what] = bars.add_task(what, total=total)
        bars.update(tasks[what], completed=round(done), total=total)

    return progress


def _print_load(result: LoadResult) -> None:
    """`bench load`'s tables: the configuration, the results, each soak's samples."""
    from bench.load_tables import render_load_config, render_load_results, render_soak

    console = stdout_console()
    console.print(render_load_config(result))
    console.print(render_load_results(result))
    for run in result.runs:
        if run.soak is not None:
            for table in render_soak(run):
                console.print(table)


@bench_app.command("replay")
def replay(
    requests: str = typer.Option(
        "5000,20000,80000", "--requests", metavar="N[,N...]", help="Trace sizes, in requests"
    ),
    preset: str = typer.Option("pdd-small", "--preset", help="Cluster preset to replay on"),
    policy: str | None = typer.Option(None, "--policy", help="Policy (default: the preset's)"),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic traces"),
    json_output: bool = JSON_TABLE,
) -> None:
    """Replay speed and peak memory against the trace's length.

    For each size a synthetic agentic trace is written to a scratch folder and replayed in
    a process of its own (the summary only): wall time, requests per wall second, times
    real time, and that process's peak RSS.
    """
    import json

    from rich.console import Console
    from rich.table import Table

    from replay.experiments.replay_bench import run_replay_bench
    from router.errors import UserError

    try:
        sizes = [int(n.replace("_", "")) for n in requests.split(",") if n.strip()]
    except ValueError:
        raise UserError(
            f"--requests must be numbers separated by commas, got {requests!r}"
        ) from None
    console = Console(stderr=True)
    rows = run_replay_bench(
        sizes, preset=preset, policy=policy, seed=seed,
        progress=lambda what: console.print(f"[dim]{what}[/dim]"),
    )  # fmt: skip
    if json_output:
        typer.echo(json.dumps([row.model_dump() for row in rows], indent=2))
        return
    table = Table(title=f"replay on {preset}: synthetic agentic traces")
    for name in ("requests", "trace MB", "wall s", "req/s", "x real time", "peak RSS MB"):
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(
            f"{r.requests:,}", f"{r.trace_mb:g}", f"{r.wall_s:.1f}", f"{r.requests_per_s:,.0f}",
            f"{r.realtime_x:,.0f}", f"{r.peak_rss_mb:,.0f}",
        )  # fmt: skip
    stdout_console().print(table)
