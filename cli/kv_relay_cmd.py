"""`pdd-router kv-relay`: carry one datacenter's KV events to the other's routers, compact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from router.kv_relay.settings import KVRelaySettings
    from router.settings import Settings

__all__ = ["kv_relay"]


def kv_relay(
    instances: Path | None = typer.Option(
        None,
        "--instances",
        help="YAML or JSON list of instances (the `serve` format): the relay subscribes to "
        "the kv_events_endpoint of each (of --datacenter's only, if given)",
    ),
    datacenter: str | None = typer.Option(
        None, "--datacenter", help="Relay only the instances of this datacenter"
    ),
    publish: str | None = typer.Option(
        None,
        "--publish",
        help="ZMQ address to publish the compact stream on (default tcp://*:5600)",
    ),
    replay: str | None = typer.Option(
        None, "--replay", help="ZMQ address serving missed batches again (default tcp://*:5601)"
    ),
    no_replay: bool = typer.Option(False, "--no-replay", help="Serve no replay"),
    upstream: str | None = typer.Option(
        None,
        "--upstream",
        help="Relays to forward, as JSON: the list service.kv_relays takes, e.g. "
        '\'[{"endpoint": "tcp://RELAY:5600", "replay_endpoint": "tcp://RELAY:5601", '
        '"instances": ["md0"]}]\' (also PDD_ROUTER_RELAY__UPSTREAM)',
    ),
    config: Path | None = typer.Option(
        None, "--config", help="YAML settings file (also PDD_ROUTER_CONFIG)"
    ),
) -> None:
    """Relay the KV events of a datacenter's engines to the other datacenter's routers.

    Run it beside the engines (datacenter B's, say). It subscribes to each engine's KV
    events, re-hashes every stored block under the router's chain hash (so block_size and
    hash_seed, PDD_ROUTER_BLOCK_SIZE and PDD_ROUTER_HASH_SEED, must be the routers': each
    batch names them, and a router hashing otherwise refuses it and logs both), and
    publishes one compact stream: per event the instance, its kind and the blocks' 64-bit
    hashes, batched every PDD_ROUTER_RELAY__BATCH_WINDOW_S (0.002 s), with its own sequence
    numbers and a replay socket. No token IDs cross the line.

    A router of the other datacenter subscribes to it instead of to those engines:
    PDD_ROUTER_SERVICE__KV_RELAYS='[{"endpoint": "tcp://RELAY:5600", "replay_endpoint":
    "tcp://RELAY:5601", "instances": ["md0", "md1"]}]'.

    With several router replicas there, run a second relay in their datacenter that
    forwards the first (--upstream, the same list as KV_RELAYS above; no
    --instances needed) and subscribe the replicas to it: the line then carries each event
    once, not once per replica.

    Other settings: PDD_ROUTER_RELAY__* variables or --config (section relay)."""
    import asyncio
    import contextlib

    from router.errors import UserError

    settings = _settings(config, instances, datacenter, publish, replay, no_replay, upstream)
    relay_settings = settings.relay
    if relay_settings.instances_file is None and not relay_settings.upstream:
        raise UserError(
            "give --instances (or PDD_ROUTER_RELAY__INSTANCES_FILE), or relays to forward "
            "(--upstream or PDD_ROUTER_RELAY__UPSTREAM)"
        )
    sources = _sources(relay_settings) if relay_settings.instances_file is not None else {}
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_run(settings, sources))


def _settings(
    config: Path | None,
    instances: Path | None,
    datacenter: str | None,
    publish: str | None,
    replay: str | None,
    no_replay: bool,
    upstream: str | None = None,
) -> Settings:
    """The settings, the options over them; a UserError naming what is wrong."""
    import os

    from pydantic import ValidationError

    from router.errors import UserError
    from router.kv_relay.settings import KVRelaySettings
    from router.settings import CONFIG_FILE_ENV, Settings, settings_errors

    if config is not None:
        if not config.is_file():
            raise UserError(f"settings file {config} does not exist")
        os.environ[CONFIG_FILE_ENV] = str(config)
    if replay is not None and no_replay:
        raise UserError("give --replay or --no-replay, not both")
    if instances is not None and not instances.is_file():
        raise UserError(f"instances file {instances} does not exist")
    try:
        settings = Settings()
    except ValidationError as exc:
        raise UserError(f"invalid settings: {settings_errors(exc)}") from None
    given = {
        "instances_file": None if instances is None else str(instances),
        "datacenter": datacenter,
        "publish_endpoint": publish,
        "replay_endpoint": replay,
    }
    updates: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    if no_replay:
        updates["replay_endpoint"] = None
    if upstream is not None:
        try:
            updates["upstream"] = json.loads(upstream)
        except ValueError as exc:
            raise UserError(f"--upstream is not valid JSON: {exc}") from None
    try:
        relay = KVRelaySettings.model_validate({**settings.relay.model_dump(), **updates})
    except ValidationError as exc:
        first = exc.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else ""
        options = {"publish_endpoint": "--publish", "replay_endpoint": "--replay",
                   "datacenter": "--datacenter", "upstream": "--upstream"}  # fmt: skip
        where = options.get(field) or "PDD_ROUTER_RELAY"
        raise UserError(f"{where}: {first['msg']} (got {first.get('input')!r:.80})") from None
    return settings.model_copy(update={"relay": relay})


def _sources(relay: KVRelaySettings) -> dict[str, str]:
    """Instance id -> KV-event endpoint of the instances the relay covers."""
    from router.errors import UserError
    from router.service.lifecycle import load_instances_file

    assert relay.instances_file is not None
    configs = load_instances_file(relay.instances_file)
    if relay.datacenter is not None:
        configs = [c for c in configs if c.datacenter == relay.datacenter]
    sources = {c.instance_id: c.kv_events_endpoint for c in configs if c.kv_events_endpoint}
    if not sources:
        where = f" of datacenter {relay.datacenter}" if relay.datacenter else ""
        raise UserError(
            f"instances file {relay.instances_file}: no instance{where} has a "
            "kv_events_endpoint to relay"
        )
    return sources


async def _run(settings: Settings, sources: dict[str, str]) -> None:
    import zmq

    from engines_adapter.kv_publisher import KVEventPublisher
    from router.errors import UserError
    from router.kv_relay.relay import KVRelay

    relay = settings.relay
    try:
        publisher = KVEventPublisher(
            relay.publish_endpoint, replay_endpoint=relay.replay_endpoint,
            buffer_batches=relay.buffer_batches,
        )  # fmt: skip
    except zmq.ZMQError as exc:
        raise UserError(
            f"cannot bind {relay.publish_endpoint} / {relay.replay_endpoint}: {exc}"
        ) from None
    runner = KVRelay(
        publisher, sources, block_size=settings.block_size, seed=settings.hash_seed,
        batch_window_s=relay.batch_window_s, max_batch_blocks=relay.max_batch_blocks,
        upstream=relay.upstream,
    )  # fmt: skip
    replay = f", replay on {publisher.replay_endpoint}" if publisher.replay_endpoint else ""
    covered = sorted([*sources, *(i for up in relay.upstream for i in up.instances)])
    forwarded = "".join(f", forwarding {up.endpoint}" for up in relay.upstream)
    typer.echo(
        f"kv-relay: {len(covered)} instance(s) ({', '.join(covered)}) relayed on "
        f"{publisher.endpoint}{replay}{forwarded}",
        err=True,
    )
    try:
        await runner.run()
    finally:
        await publisher.aclose()
