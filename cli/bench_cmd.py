"""`pdd-router bench ...`: benchmarks that print figures."""

from __future__ import annotations

import typer

__all__ = ["bench_app"]

bench_app = typer.Typer(help="Benchmarks that print figures.", no_args_is_help=True)


@bench_app.command("index")
def index(
    redis_url: str | None = typer.Option(
        None, "--redis-url", help="Redis of the shared index (default: the settings' redis.url)"
    ),
    repeats: int = typer.Option(200, "--repeats", min=10, help="Matches timed per configuration"),
    no_redis: bool = typer.Option(False, "--no-redis", help="Measure the in-memory index only"),
    json_output: bool = typer.Option(False, "--json", help="Print JSON instead of a table"),
) -> None:
    """Match latency (memory vs Redis, in PING round trips), store throughput, hashing time."""
    import json

    from rich.console import Console

    from router.bench.index_bench import render_index_bench, run_index_bench
    from router.settings import Settings

    url = None if no_redis else (redis_url or Settings().redis.url)
    result = run_index_bench(url, repeats=repeats)
    if json_output:
        typer.echo(json.dumps(result.to_json(), indent=2))
    else:
        Console().print(render_index_bench(result))


@bench_app.command("route")
def route(
    redis_url: str | None = typer.Option(
        None, "--redis-url", help="Redis of the shared index (default: the settings' redis.url)"
    ),
    repeats: int = typer.Option(200, "--repeats", min=10, help="Decisions timed per row"),
    no_redis: bool = typer.Option(False, "--no-redis", help="Measure the in-memory index only"),
    no_http: bool = typer.Option(False, "--no-http", help="Skip the HTTP rows"),
    throughput_s: float = typer.Option(
        3.0, "--throughput-seconds", min=0, help="Length of the sustained-load run (0: skip it)"
    ),
    no_chat: bool = typer.Option(False, "--no-chat", help="Skip the chat-request rows"),
    chat_repeats: int = typer.Option(
        100, "--chat-repeats", min=5, help="Chat requests timed per row (each a full render)"
    ),
    json_output: bool = typer.Option(False, "--json", help="Print JSON instead of a table"),
) -> None:
    """Decision latency, 8K and 128K-token prompts: in-process and HTTP, memory and Redis;
    then routes per second of a router confined to one core, at 8K tokens; then a chat
    request of 8K and 32K tokens, in-process: render, tokenize, hash and decide."""
    import json
    from dataclasses import asdict

    from rich.console import Console

    from router.bench.route_bench import (
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
        from router.bench.chat_bench import run_chat_bench

        chat = run_chat_bench(repeats=chat_repeats)
    if json_output:
        out = {"latency": rows_json(rows), "throughput": asdict(load) if load else None}
        if chat is not None:
            from router.bench.chat_bench import chat_rows_json

            out["chat"] = chat_rows_json(chat)
        typer.echo(json.dumps(out, indent=2))
    else:
        console = Console()
        console.print(render_route_bench(rows))
        if load is not None:
            console.print(render_throughput(load))
        if chat is not None:
            from router.bench.chat_bench import render_chat_bench

            console.print(render_chat_bench(chat))
