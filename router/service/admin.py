"""Admin endpoints: instances (list, register, remove) and KV-event ingestion."""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import APIRouter, Depends, Request, Response

from engines_adapter.contract import KVEvent, KVEventBatch
from router.service.errors import ApiError
from router.service.experiment_report import experiment_report
from router.service.experiments import Experiment, ExperimentSpec
from router.service.pool import UnknownInstance
from router.service.schemas import (
    ERROR_RESPONSES,
    InstanceConfig,
    InstanceStatus,
    KVEventsBody,
)
from router.service.state import ServiceState

__all__ = ["admin_router", "event_from_wire"]


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.state.svc
    return state


def require_api_key(request: Request) -> None:
    """When an API key is configured, admin calls carry it as a Bearer token."""
    key = _state(request).settings.service.api_key
    if key is None:
        return
    given = request.headers.get("authorization", "")
    if not secrets.compare_digest(given.encode(), f"Bearer {key}".encode()):
        raise ApiError(401, "missing or wrong API key", type_="authentication_error",
                       headers={"WWW-Authenticate": "Bearer"})  # fmt: skip


admin_router = APIRouter(
    dependencies=[Depends(require_api_key)],
    tags=["admin"],
    responses=ERROR_RESPONSES(400, 401, 422),
)


def _status(svc: ServiceState, instance_id: str) -> InstanceStatus:
    config, _, load = svc.pool.get(instance_id)
    return InstanceStatus(
        **config.model_dump(), healthy=load.healthy, running=load.running, queued=load.queued,
        indexed_blocks=svc.index.num_blocks(instance_id),
    )  # fmt: skip


@admin_router.get("/v1/instances", response_model=list[InstanceStatus])
async def list_instances(request: Request) -> list[InstanceStatus]:
    svc = _state(request)
    return [_status(svc, iid) for iid in sorted(svc.pool.configs)]


@admin_router.post("/v1/instances", response_model=InstanceStatus, status_code=201)
async def register_instance(config: InstanceConfig, request: Request) -> InstanceStatus:
    svc = _state(request)
    from router.service.lifecycle import attach_instance

    await attach_instance(svc, config)
    return _status(svc, config.instance_id)


@admin_router.get(
    "/v1/instances/{instance_id}", response_model=InstanceStatus, responses=ERROR_RESPONSES(404)
)
async def get_instance(instance_id: str, request: Request) -> InstanceStatus:
    try:
        return _status(_state(request), instance_id)
    except UnknownInstance as exc:
        raise ApiError(404, f"unknown instance {instance_id!r}", param="instance_id") from exc


@admin_router.delete("/v1/instances/{instance_id}", status_code=204, responses=ERROR_RESPONSES(404))
async def remove_instance(instance_id: str, request: Request) -> Response:
    svc = _state(request)
    from router.service.lifecycle import detach_instance

    try:
        await detach_instance(svc, instance_id)
    except UnknownInstance as exc:
        raise ApiError(404, f"unknown instance {instance_id!r}", param="instance_id") from exc
    return Response(status_code=204)


_POSITIONAL = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}


def event_from_wire(raw: dict[str, object] | list[object]) -> KVEvent:
    """An event as a map ({"type": ...}) or a tagged positional array (["BlockStored", ...])."""
    if isinstance(raw, dict):
        return KVEvent.model_validate(raw)
    if not raw or not isinstance(raw[0], str) or raw[0] not in _POSITIONAL:
        raise ValueError(f"unknown event {raw[:1]!r}; known: {', '.join(_POSITIONAL)}")
    names = _POSITIONAL[raw[0]]
    return KVEvent.model_validate({"type": raw[0], **dict(zip(names, raw[1:], strict=False))})


@admin_router.post("/v1/kv-events", status_code=202, responses=ERROR_RESPONSES(404))
async def kv_events(body: KVEventsBody, request: Request) -> dict[str, int]:
    """Apply a batch of KV events (vLLM's schema) to the index."""
    svc = _state(request)
    if body.instance_id not in svc.pool.configs:
        raise ApiError(404, f"unknown instance {body.instance_id!r}", param="instance_id")
    try:
        events = [event_from_wire(e) for e in body.events]
    except ValueError as exc:
        raise ApiError(422, f"events: {exc}", param="events") from exc
    svc.ingestor.apply(KVEventBatch(instance_id=body.instance_id, timestamp=body.timestamp,
                                    events=events))  # fmt: skip
    svc.metrics.kv_events.labels(body.instance_id).inc()
    return {"applied": len(events)}


def _experiment(svc: ServiceState, experiment_id: str) -> Experiment:
    experiment = svc.experiments.by_id.get(experiment_id)
    if experiment is None:
        raise ApiError(404, f"unknown experiment {experiment_id!r}", param="experiment_id")
    return experiment


def _report(svc: ServiceState, experiment: Experiment) -> dict[str, Any]:
    service = svc.settings.service
    return experiment_report(experiment, sla_ttft_s=service.sla_ttft_s,
                             sla_tpot_s=service.sla_tpot_s)  # fmt: skip


@admin_router.post("/v1/experiments", status_code=201)
async def create_experiment(spec: ExperimentSpec, request: Request) -> dict[str, Any]:
    """Start an experiment (the running one, if any, stops); its arms split the traffic."""
    svc = _state(request)
    try:
        experiment = svc.experiments.create(spec)
    except ValueError as exc:
        raise ApiError(422, str(exc), param="arms") from exc
    return _report(svc, experiment)


@admin_router.get("/v1/experiments")
async def list_experiments(request: Request) -> list[dict[str, Any]]:
    svc = _state(request)
    return [
        {"id": e.id, "name": e.spec.name, "status": e.status, "arms": [a.spec.name for a in e.arms]}
        for e in svc.experiments.by_id.values()
    ]


@admin_router.get("/v1/experiments/{experiment_id}", responses=ERROR_RESPONSES(404))
async def get_experiment(experiment_id: str, request: Request) -> dict[str, Any]:
    """Per-arm counts, TTFT / TPOT percentiles, SLA attainment, prediction error, pipeline
    mix, and each arm's difference from the first with a 95% bootstrap interval."""
    svc = _state(request)
    return _report(svc, _experiment(svc, experiment_id))


@admin_router.post("/v1/experiments/{experiment_id}/stop", responses=ERROR_RESPONSES(404))
async def stop_experiment(experiment_id: str, request: Request) -> dict[str, Any]:
    svc = _state(request)
    _experiment(svc, experiment_id)
    return _report(svc, svc.experiments.stop(experiment_id))
