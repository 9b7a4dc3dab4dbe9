"""`pdd-router serve`: run the control plane's HTTP service."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from policies.registry import policy_names

if TYPE_CHECKING:
    from fastapi import FastAPI

    from router.settings import ServiceSettings

__all__ = ["DEFAULT_POLICY", "serve"]

DEFAULT_POLICY = "pdd-adaptive"
"""The policy `serve` decides with unless told otherwise (``PolicySettings.name``'s default;
named here so that --help needs no settings import)."""


def serve(  # noqa: C901 -- checks each option and names the bad one
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
    import os

    from pydantic import ValidationError

    from policies.registry import UnknownPolicyError, parse_policy
    from router.errors import UserError
    from router.service.app import create_app
    from router.settings import CONFIG_FILE_ENV, Settings, settings_errors

    if config is not None:
        if not config.is_file():
            raise UserError(f"settings file {config} does not exist")
        os.environ[CONFIG_FILE_ENV] = str(config)
    chosen: dict[str, object] = {}
    if policy is not None:  # the settings' policy parameters are checked against this one
        try:
            parse_policy(policy, {})
        except UnknownPolicyError as exc:
            raise UserError(str(exc)) from exc
        chosen["policy"] = {"name": policy}
    try:
        settings = Settings(**chosen)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise UserError(f"invalid settings: {settings_errors(exc)}") from None
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
    known = 0  # engine instances known at start-up, for the file-descriptor budget
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
    if settings.index.backend == "redis":
        from router.index.factory import build_index

        build_index(settings.index, settings.redis)  # fail fast, one line, if unreachable
    if settings.service.decision_log is not None:
        from router.service.app import open_decision_log

        open_decision_log(settings.service.decision_log).close()  # fail fast, one line
    from router.service.auth import exposure_warning
    from router.service.roles import shared_key_warning

    _check_free(settings.service.host, settings.service.port)
    for warning in (exposure_warning(settings.service), shared_key_warning(settings.service)):
        if warning is not None:
            typer.echo(warning, err=True)
    if not demo and settings.service.instances_file is None:
        typer.echo(
            "no engine instances yet: give --instances FILE or register them with POST "
            "/v1/instances; /readyz answers 503 until P and MD each have one",
            err=True,
        )
    if demo:
        from router.service.demo import DEMO_MODEL, demo_app

        app = demo_app(settings)  # the simulated engines are attached when it starts
        typer.echo(_demo_banner(settings.service, DEMO_MODEL))
    else:
        app = create_app(settings)
    _run(app, settings.service, log_level, known)


def _run(app: FastAPI, service: ServiceSettings, log_level: str, instances: int) -> None:
    """uvicorn on ``app``, its connections held to the service's limits; the file-descriptor
    budget checked first (a line when it raises the limit or lowers the cap)."""
    import uvicorn

    from router.service.fd_budget import apply_fd_budget
    from router.service.http_protocol import connection_limits, limited_protocol

    limits = service.connections
    plan = apply_fd_budget(limits.max_connections, instances)
    if plan.line is not None:
        typer.echo(plan.line, err=True)
    uvicorn.run(
        app, host=service.host, port=service.port, log_level=log_level,
        http=limited_protocol(connection_limits(limits, plan.max_connections)),
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


def _demo_banner(service: ServiceSettings, model: str) -> str:
    """The demo's one startup line: where to point an OpenAI client, and with what."""
    host = f"[{service.host}]" if ":" in service.host else service.host
    key = (
        "API key: the configured one (PDD_ROUTER_SERVICE__API_KEY)"
        if service.api_key
        else "any API key (none is checked)"
    )
    return f"pdd-router demo: OpenAI API at http://{host}:{service.port}/v1, model {model}, {key}"
