"""Admin endpoints: instances (list, register, remove), KV-event ingestion, experiments."""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import structlog
from fastapi import APIRouter, Query, Request, Response

from engines_adapter.contract import KVEventBatch
from engines_adapter.kv_events_json import KVEventInputError, decode_json_batch
from router.index.base import UnknownInstanceError
from router.service.auth import outside_networks, role_of_request
from router.service.errors import ApiError
from router.service.experiment_report import experiment_report
from router.service.experiments import Experiment, ExperimentSpec
from router.service.lifecycle import Instances
from router.service.pool import UnknownInstance
from router.service.schemas import (
    ERROR_RESPONSES,
    InstanceConfig,
    InstanceStatus,
    KVEventsBody,
)
from router.service.state import ServiceState

__all__ = ["admin_router"]

log = structlog.get_logger("pdd_router.service")

_DECODER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kv-events-decode")
"""Posted KV-event batches are decoded here, two at most at once, off the event loop."""


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.state.svc
    return state


# Access control (the admin key; writes refused without one) is added where the app
# includes this router: router.service.app with router.service.auth.ServiceAuth.
admin_router = APIRouter(tags=["admin"], responses=ERROR_RESPONSES(400, 422))


async def _status(instances: Instances, instance_id: str) -> InstanceStatus:
    config, _, load = instances.pool.get(instance_id)
    blocks = await instances.lane.run(instances.index.num_blocks, instance_id)
    return InstanceStatus(
        **config.model_dump(), healthy=load.healthy, running=load.running, queued=load.queued,
        indexed_blocks=blocks,
    )  # fmt: skip


@admin_router.get("/v1/instances", response_model=list[InstanceStatus])
async def list_instances(request: Request) -> list[InstanceStatus]:
    svc = _state(request)
    return [await _status(svc.instances, iid) for iid in sorted(svc.pool.configs)]


def _audit(request: Request, action: str, **target: object) -> None:
    """One log line per change of the cluster: who (the key's role), what, and on what."""
    log.info("admin change", role=role_of_request(request), action=action, **target)


@admin_router.post(
    "/v1/instances", response_model=InstanceStatus, status_code=201, responses=ERROR_RESPONSES(409)
)
async def register_instance(
    config: InstanceConfig,
    request: Request,
    replace: bool = Query(False, description="Replace an instance registered with this id"),
) -> InstanceStatus:
    """Drive a new engine instance; with service.instance_networks set, its URL (and KV-event
    endpoint) must resolve into one of them. An id already registered is refused (409)
    unless ``replace=true``."""
    svc = _state(request)

    replacing = config.instance_id in svc.pool.configs
    if replacing and not replace:
        raise ApiError(
            409, f"instance {config.instance_id!r} is already registered: remove it first, "
            "or POST /v1/instances?replace=true to replace it", param="instance_id",
            type_="conflict_error",
        )  # fmt: skip
    networks = svc.settings.service.instance_networks
    for field in ("url", "kv_events_endpoint"):
        value = getattr(config, field)
        reason = None if value is None else await outside_networks(value, networks)
        if reason is not None:
            raise ApiError(400, f"{field}: {reason}", param=field)
    await svc.instances.attach(config)
    _audit(request, "replace" if replacing else "register", instance=config.instance_id,
           tier=config.tier.value, url=config.url)  # fmt: skip
    return await _status(svc.instances, config.instance_id)


@admin_router.get(
    "/v1/instances/{instance_id}", response_model=InstanceStatus, responses=ERROR_RESPONSES(404)
)
async def get_instance(instance_id: str, request: Request) -> InstanceStatus:
    try:
        return await _status(_state(request).instances, instance_id)
    except UnknownInstance as exc:
        raise ApiError(404, f"unknown instance {instance_id!r}", param="instance_id") from exc


@admin_router.delete("/v1/instances/{instance_id}", status_code=204, responses=ERROR_RESPONSES(404))
async def remove_instance(instance_id: str, request: Request) -> Response:
    svc = _state(request)
    try:
        await svc.instances.detach(instance_id)
    except UnknownInstance as exc:
        raise ApiError(404, f"unknown instance {instance_id!r}", param="instance_id") from exc
    _audit(request, "remove", instance=instance_id)
    return Response(status_code=204)


_KV_EVENTS_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": KVEventsBody.model_json_schema()}},
    }
}


@admin_router.post(
    "/v1/kv-events", status_code=202, responses=ERROR_RESPONSES(404), openapi_extra=_KV_EVENTS_BODY
)
async def kv_events(request: Request) -> dict[str, int]:
    """Apply a batch of KV events (vLLM's schema, ``KVEventsBody``) to the index.

    The body is decoded and checked in a worker thread, and the events are applied in
    chunks that yield to the event loop: a batch of megabytes holds no other request up.
    """
    svc = _state(request)
    service = svc.settings.service
    raw = await request.body()
    decode = functools.partial(
        decode_json_batch, raw, max_events=service.max_kv_events_per_batch,
        max_tokens_per_event=service.max_kv_event_tokens, vocab_size=service.vocab_size,
    )  # fmt: skip
    try:
        body = await asyncio.get_running_loop().run_in_executor(_DECODER, decode)
    except KVEventInputError as exc:
        status = 422 if exc.kind == "invalid" else 400
        raise ApiError(status, str(exc), param=exc.param) from exc
    if body.instance_id not in svc.pool.configs:
        raise ApiError(404, f"unknown instance {body.instance_id!r}", param="instance_id")
    batch = KVEventBatch.model_construct(
        instance_id=body.instance_id, timestamp=body.timestamp, sequence=None,
        events=body.events, gap=False, missed=0,
    )  # fmt: skip
    try:
        if svc.lane.threaded:  # a shared index: applied off the event loop, on its lane
            await svc.lane.run(svc.instances.ingestor.apply, batch)
        else:
            await svc.instances.ingestor.apply_in_chunks(batch)
    except UnknownInstanceError as exc:  # removed while its events were being applied
        svc.instances.ingestor.forget(body.instance_id)
        raise ApiError(404, f"instance {body.instance_id!r} was removed",
                       param="instance_id") from exc  # fmt: skip
    svc.metrics.kv_events.labels(body.instance_id).inc()
    _audit(request, "kv-events", instance=body.instance_id, events=len(body.events))
    return {"applied": len(body.events)}


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
    _audit(request, "start-experiment", experiment=experiment.id)
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
    stopped = svc.experiments.stop(experiment_id)
    _audit(request, "stop-experiment", experiment=experiment_id)
    return _report(svc, stopped)
