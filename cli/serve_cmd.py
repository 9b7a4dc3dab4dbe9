"""`pdd-router serve`: run the control plane's HTTP service."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from policies.registry import policy_names

if TYPE_CHECKING:
    from fastapi import FastAPI

    from router.settings import ServiceSettings, Settings

__all__ = ["DEFAULT_POLICY", "serve"]

DEFAULT_POLICY = "pdd-adaptive"
"""The policy `serve` decides with unless told otherwise (``PolicySettings.name``'s default;
named here so that --help needs no settings import)."""


def serve(
    host: str | None = typer.Option(
        None,
        help="Interface to listen on (default: 127.0.0.1, this machine only; beyond it, set "
        "PDD_ROUTER_SERVICE__API_KEY)",
    ),
    port: int | None = typer.Option(None, help="Port to listen on (default: 8000)"),
    instances: Path | None = typer.Option(
        None, "--instances", help="YAML or JSON list of engine instances to drive"
    ),
    redis_url: str | None = typer.Option(
        None,
        "--redis-url",
        help="Share the prefix index through this Redis (default: in "
        "memory): redis://HOST:6379/0; a Sentinel-watched primary, "
        "redis+sentinel://HOST:26379/SERVICE (more sentinels: HOST:26379,HOST:26380); a "
        "cluster, redis+cluster://HOST:7000",
    ),
    policy: str | None = typer.Option(
        None, help=f"Policy name: {', '.join(policy_names())} (default: {DEFAULT_POLICY})"
    ),
    config: Path | None = typer.Option(
        None, "--config", help="YAML settings file (also PDD_ROUTER_CONFIG)"
    ),
    log_level: str = typer.Option("info", help="uvicorn log level"),
    demo: bool = typer.Option(
        False,
        "--demo",
        help="Serve the model pdd-demo on in-process simulated engines (P and RLD in "
        "datacenter A, MD in B; the built-in tokenizer and chat template): OpenAI clients "
        "work with nothing else installed",
    ),
    demo_tokenizer: Path | None = typer.Option(
        None,
        "--demo-tokenizer",
        help="Folder --demo writes the model's tokenizer to, for load tools' --tokenizer "
        "(default: ~/.cache/pdd-router/pdd-demo-tokenizer)",
    ),
) -> None:
    """Serve the REST API (route, completions, kv-events, instances, experiments, metrics).

    Settings not given as options come from PDD_ROUTER_* variables or --config, e.g.
    PDD_ROUTER_SERVICE__DECISION_LOG=decisions.jsonl to log every decision and its
    outcome for `predictor train`, PDD_ROUTER_SERVICE__PREDICTOR_MODEL=model.skops to
    decide with a trained hit-rate model.

    PDD_ROUTER_SERVICE__API_KEY=KEY makes every endpoint but /healthz and /readyz require
    Authorization: Bearer KEY. PDD_ROUTER_SERVICE__ADMIN_KEY=KEY2 keeps the admin API
    (instances, KV events, experiments) to KEY2, and KEY to the client API;
    PDD_ROUTER_SERVICE__METRICS_KEY opens /metrics only. Without a key, requests that
    change the router's state are refused unless
    PDD_ROUTER_SERVICE__ALLOW_UNAUTHENTICATED_ADMIN=true.

    --demo needs nothing else: `pdd-router serve --demo`, then point any OpenAI client at
    http://127.0.0.1:8000/v1 with model pdd-demo (any API key, unless one is configured)."""
    from router.errors import UserError

    if demo_tokenizer is not None and not demo:
        raise UserError("--demo-tokenizer is where --demo writes its tokenizer: add --demo")
    settings = _settings_from_options(config, policy)
    settings, known = _with_options(settings, host, port, instances, redis_url, demo)
    _fail_fast(settings)
    _warn(settings, demo)
    settings = _within_fd_budget(settings, known)
    if demo:
        from router.service.demo import (
            DEMO_MODEL,
            demo_app,
            demo_tokenizer_dir,
            write_demo_tokenizer,
        )

        folder = write_demo_tokenizer(demo_tokenizer or demo_tokenizer_dir())
        app = demo_app(settings)  # the simulated engines are attached when it starts
        typer.echo(_demo_banner(settings.service, DEMO_MODEL, folder))
    else:
        from router.service.app import create_app

        app = create_app(settings, freeze_heap=True)
    _run(app, settings.service, log_level)


def _settings_from_options(config: Path | None, policy: str | None) -> Settings:
    """The settings from PDD_ROUTER_* variables and --config, with --policy's name (the
    settings' policy parameters are checked against it); a UserError naming what is wrong."""
    import os

    from pydantic import ValidationError

    from policies.registry import UnknownPolicyError, parse_policy
    from router.errors import UserError
    from router.settings import CONFIG_FILE_ENV, Settings, settings_errors

    if config is not None:
        if not config.is_file():
            raise UserError(f"settings file {config} does not exist")
        os.environ[CONFIG_FILE_ENV] = str(config)
    chosen: dict[str, object] = {}
    if policy is not None:
        try:
            parse_policy(policy, {})
        except UnknownPolicyError as exc:
            raise UserError(str(exc)) from exc
        chosen["policy"] = {"name": policy}
    try:
        return Settings(**chosen)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise UserError(f"invalid settings: {settings_errors(exc)}") from None


def _with_options(
    settings: Settings,
    host: str | None,
    port: int | None,
    instances: Path | None,
    redis_url: str | None,
    demo: bool,
) -> tuple[Settings, int]:
    """``settings`` with --host, --port, --instances, --redis-url and --demo applied, and
    the engine instances known at start-up (for the file-descriptor budget)."""
    from router.errors import UserError

    updates: dict[str, object] = {}
    service = settings.service.model_copy(
        update={k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    )
    if instances is not None and demo:
        raise UserError("--demo runs its own simulated engines: drop --instances")
    if instances is not None:
        if not instances.is_file():
            raise UserError(f"instances file {instances} does not exist")
        service = service.model_copy(update={"instances_file": str(instances)})
    known = 0
    if service.instances_file is not None:
        from router.service.lifecycle import load_instances_file

        known = len(load_instances_file(service.instances_file))  # fail fast if malformed
    updates["service"] = service
    if redis_url is not None:
        updates["redis"] = settings.redis.model_copy(update={"url": redis_url})
        updates["index"] = settings.index.model_copy(update={"backend": "redis"})
    settings = settings.model_copy(update=updates)
    if demo:
        from router.service.demo import demo_settings

        settings = demo_settings(settings)
    return settings, known


def _fail_fast(settings: Settings) -> None:
    """One line, before anything starts, when the Redis index is unreachable, the decision
    log cannot be opened or the port is taken."""
    if settings.index.backend == "redis":
        from router.index.factory import build_index

        build_index(settings.index, settings.redis)
    if settings.service.decision_log is not None:
        from router.service.app import open_decision_log

        open_decision_log(settings.service.decision_log).close()
    _check_free(settings.service.host, settings.service.port)


def _warn(settings: Settings, demo: bool) -> None:
    """On stderr: an exposed or shared key's warning, and how to give engines when none is."""
    from router.service.auth import exposure_warning
    from router.service.roles import shared_key_warning

    for warning in (exposure_warning(settings.service), shared_key_warning(settings.service)):
        if warning is not None:
            typer.echo(warning, err=True)
    if not demo and settings.service.instances_file is None:
        typer.echo(
            "no engine instances yet: give --instances FILE or register them with POST "
            "/v1/instances; /readyz answers 503 until P and MD each have one",
            err=True,
        )


def _within_fd_budget(settings: Settings, instances: int) -> Settings:
    """``settings`` whose client connection cap (and so the engine connections sized from
    it) fits the file-descriptor limit, raised as far as needed and allowed; a line says
    what changed."""
    from router.service.fd_budget import apply_fd_budget

    limits = settings.service.connections
    plan = apply_fd_budget(limits.max_connections, instances)
    if plan.line is not None:
        typer.echo(plan.line, err=True)
    if plan.max_connections == limits.max_connections:
        return settings
    capped = limits.model_copy(update={"max_connections": plan.max_connections})
    per_address = min(capped.max_connections_per_address, plan.max_connections)
    capped = capped.model_copy(update={"max_connections_per_address": per_address})
    service = settings.service.model_copy(update={"connections": capped})
    return settings.model_copy(update={"service": service})


def _run(app: FastAPI, service: ServiceSettings, log_level: str) -> None:
    """uvicorn on ``app``, its connections held to the service's limits."""
    import uvicorn

    from router.service.http_protocol import connection_limits, limited_protocol

    limits = service.connections
    uvicorn.run(
        app, host=service.host, port=service.port, log_level=log_level,
        http=limited_protocol(connection_limits(limits)),
        ws="none", timeout_keep_alive=limits.keep_alive_timeout_s,
    )  # fmt: skip


def _check_free(host: str, port: int) -> None:
    """A UserError naming --port when the address cannot be listened on (another process
    holds the port), before anything is printed or started."""
    import socket

    from router.errors import UserError

    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise UserError(f"--host {host}: {exc.strerror}") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            raise UserError(
                f"cannot listen on {host}:{port}: {exc.strerror} (another process holds it?); "
                "pick another port with --port"
            ) from None


def _demo_banner(service: ServiceSettings, model: str, tokenizer: Path) -> str:
    """The demo's startup lines: where to point an OpenAI client, and with what; the
    tokenizer folder load tools take."""
    host = f"[{service.host}]" if ":" in service.host else service.host
    folder = shlex.quote(str(tokenizer))
    key = (
        "API key: the configured one (PDD_ROUTER_SERVICE__API_KEY)"
        if service.api_key
        else "any API key (none is checked)"
    )
    return (
        f"pdd-router demo: OpenAI API at http://{host}:{service.port}/v1, model {model}, {key}\n"
        f"load tools: --model {model} --tokenizer {folder} (aiperf, vllm bench serve; "
        f"guidellm: --processor {folder})"
    )
