"""`pdd-router serve`: run the control plane's HTTP service."""

from __future__ import annotations

from pathlib import Path

import typer

from policies.registry import policy_names

__all__ = ["serve"]


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
        None, "--redis-url", help="Share the prefix index through this Redis (default: in memory)"
    ),
    policy: str | None = typer.Option(
        None, help=f"Policy name: {', '.join(policy_names())} (default: pdd)"
    ),
    config: Path | None = typer.Option(
        None, "--config", help="YAML settings file (also PDD_ROUTER_CONFIG)"
    ),
    log_level: str = typer.Option("info", help="uvicorn log level"),
) -> None:
    """Serve the REST API (route, completions, kv-events, instances, experiments, metrics).

    Settings not given as options come from PDD_ROUTER_* variables or --config, e.g.
    PDD_ROUTER_SERVICE__DECISION_LOG=decisions.jsonl to log every decision and its
    outcome for `predictor train`, PDD_ROUTER_SERVICE__PREDICTOR_MODEL=model.skops to
    decide with a trained hit-rate model.

    PDD_ROUTER_SERVICE__API_KEY=KEY makes every endpoint but /healthz and /readyz require
    Authorization: Bearer KEY. Without a key, requests that change the router's state
    (instances, KV events, experiments) are refused unless
    PDD_ROUTER_SERVICE__ALLOW_UNAUTHENTICATED_ADMIN=true."""
    import os

    import uvicorn
    from pydantic import ValidationError

    from policies.registry import UnknownPolicyError, parse_policy
    from router.errors import UserError
    from router.service.app import create_app
    from router.settings import CONFIG_FILE_ENV, Settings, settings_errors

    if config is not None:
        if not config.is_file():
            raise UserError(f"settings file {config} does not exist")
        os.environ[CONFIG_FILE_ENV] = str(config)
    try:
        settings = Settings()
    except ValidationError as exc:
        raise UserError(f"invalid settings: {settings_errors(exc)}") from None
    updates: dict[str, object] = {}
    service = settings.service.model_copy(
        update={k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    )
    if instances is not None:
        if not instances.is_file():
            raise UserError(f"instances file {instances} does not exist")
        service = service.model_copy(update={"instances_file": str(instances)})
    updates["service"] = service
    if redis_url is not None:
        updates["redis"] = settings.redis.model_copy(update={"url": redis_url})
        updates["index"] = settings.index.model_copy(update={"backend": "redis"})
    if policy is not None:
        try:
            parse_policy(policy, settings.policy.params)
        except UnknownPolicyError as exc:
            raise UserError(str(exc)) from exc
        updates["policy"] = settings.policy.model_copy(update={"name": policy})
    settings = settings.model_copy(update=updates)
    if settings.index.backend == "redis":
        from router.index.factory import build_index

        build_index(settings.index, settings.redis)  # fail fast, one line, if unreachable
    if settings.service.decision_log is not None:
        from router.service.app import open_decision_log

        open_decision_log(settings.service.decision_log).close()  # fail fast, one line
    from router.service.auth import exposure_warning

    warning = exposure_warning(settings.service)
    if warning is not None:
        typer.echo(warning, err=True)
    app = create_app(settings)
    uvicorn.run(app, host=settings.service.host, port=settings.service.port, log_level=log_level)
