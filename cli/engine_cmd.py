"""`pdd-router engine-sim ...`: run a simulated engine behind a vLLM-compatible HTTP API."""

from __future__ import annotations

import typer

from policies.tiers import Tier

__all__ = ["engine_app"]

engine_app = typer.Typer(
    rich_markup_mode="markdown",
    help="Simulated engines (no GPU) speaking the vLLM API subset the router drives.",
    no_args_is_help=True,
)


@engine_app.callback()
def _group() -> None:
    """Simulated engines (no GPU) speaking the vLLM API subset the router drives."""


@engine_app.command("serve")
def serve(
    tier: Tier = typer.Option(..., "--tier", help="Which tier this instance serves."),
    port: int = typer.Option(8100, "--port", help="HTTP port."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    instance_id: str | None = typer.Option(
        None, "--instance-id", help="Instance name (default: TIER-PORT)."
    ),
    block_size: int = typer.Option(16, "--block-size", min=1, help="KV block size in tokens."),
    vocab_size: int = typer.Option(512, "--vocab-size", min=2, help="Largest token ID + 1."),
    cache_blocks: int = typer.Option(4096, "--cache-blocks", min=1, help="KV capacity in blocks."),
    max_running: int = typer.Option(64, "--max-running", min=1, help="More requests wait."),
    decode_ms: float = typer.Option(0.0, "--decode-ms", min=0, help="Milliseconds per token."),
    prefill_us_per_token: float = typer.Option(
        0.0, "--prefill-us-per-token", min=0, help="Microseconds per uncached prompt token."
    ),
    kv_events_endpoint: str | None = typer.Option(
        None, "--kv-events-endpoint", help="ZMQ PUB address for KV events, e.g. tcp://*:5557."
    ),
    kv_replay_endpoint: str | None = typer.Option(
        None, "--kv-replay-endpoint", help="ZMQ ROUTER address for KV-event replay."
    ),
    model_name: str = typer.Option("pdd-sim", "--model-name", help="Served model name."),
    log_level: str = typer.Option("warning", "--log-level", help="uvicorn log level."),
) -> None:
    """Serve one simulated engine instance until interrupted."""
    import uvicorn

    from engine_sim.engine import SimEngineConfig
    from engine_sim.server import SimServerConfig, create_app

    config = SimServerConfig(
        instance_id=instance_id or f"{tier.value}-{port}",
        model_name=model_name,
        engine=SimEngineConfig(
            block_size=block_size,
            vocab_size=vocab_size,
            cache_blocks=cache_blocks,
            max_running=max_running,
            decode_s_per_token=decode_ms / 1e3,
            prefill_s_per_token=prefill_us_per_token / 1e6,
        ),
        kv_events_endpoint=kv_events_endpoint,
        kv_replay_endpoint=kv_replay_endpoint,
    )
    typer.echo(
        f"simulated {tier.value} engine {config.instance_id} on http://{host}:{port}"
        + (f", KV events on {kv_events_endpoint}" if kv_events_endpoint else ""),
        err=True,
    )
    uvicorn.run(create_app(config), host=host, port=port, log_level=log_level, ws="none")
