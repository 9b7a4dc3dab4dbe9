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
from router.service.deps import ExperimentsDep, InstancesDep, MetricsDep, ServiceDep
from router.service.errors import ApiError
from router.service.experiment_report import experiment_report
from router.service.experiments import Experiment, Experiments, ExperimentSpec
from router.service.lifecycle import Instances
from router.service.pool import UnknownInstance
from router.service.schemas import (
    ERROR_RESPONSES,
    InstanceConfig,
    InstanceStatus,
    KVEventsBody,
)
from router.settings import ServiceSettings

__all__ = ["admin_router"]

log = structlog.get_logger("pdd_router.service")

_DECODER = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kv-events-decode")
"""Posted KV-event batches are decoded here, two at most at once, off the event loop (at
its priority: a thread holding the GIL must not wait for a CPU while the loop waits for it)."""


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
async def list_instances(instances: InstancesDep) -> list[InstanceStatus]:
    return [await _status(instances, iid) for iid in sorted(instances.pool.configs)]


def _audit(request: Request, action: str, **target: object) -> None:
    """One log line per change of the cluster: who (the key's role), what, and on what."""
    log.info("admin change", role=role_of_request(request), action=action, **target)


@admin_router.post(
    "/v1/instances", response_model=InstanceStatus, status_code=201, responses=ERROR_RESPONSES(409)
)
async def register_instance(
    config: InstanceConfig,
    request: Request,
    instances: InstancesDep,
    service: ServiceDep,
    replace: bool = Query(False, description="Replace an instance registered with this id"),
) -> InstanceStatus:
    """Drive a new engine instance; with service.instance_networks set, its URL (and KV-event
    endpoint) must resolve into one of them. An id already registered is refused (409)
    unless ``replace=true``."""
    replacing = config.instance_id in instances.pool.configs
    if replacing and not replace:
        raise ApiError(
            409, f"instance {config.instance_id!r} is already registered: remove it first, "
            "or POST /v1/instances?replace=true to replace it", param="instance_id",
            type_="conflict_error",
        )  # fmt: skip
    networks = service.instance_networks
    for field in ("url", "kv_events_endpoint"):
        value = getattr(config, field)
        reason = None if value is None else await outside_networks(value, networks)
        if reason is not None:
            raise ApiError(400, f"{field}: {reason}", param=field)
    await instances.attach(config)
    _audit(request, "replace" if replacing else "register", instance=config.instance_id,
           tier=config.tier.value, url=config.url)  # fmt: skip
    return await _status(instances, config.instance_id)


@admin_router.get(
    "/v1/instances/{instance_id}", response_model=InstanceStatus, responses=ERROR_RESPONSES(404)
)
async def get_instance(instance_id: str, instances: InstancesDep) -> InstanceStatus:
    try:
        return await _status(instances, instance_id)
    except UnknownInstance as exc:
        raise ApiError(404, f"unknown instance {instance_id!r}", param="instance_id") from exc


@admin_router.delete("/v1/instances/{instance_id}", status_code=204, responses=ERROR_RESPONSES(404))
async def remove_instance(instance_id: str, request: Request, instances: InstancesDep) -> Response:
    try:
        await instances.detach(instance_id)
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
async def kv_events(
    request: Request, instances: InstancesDep, service: ServiceDep, metrics: MetricsDep
) -> dict[str, int]:
    """Apply a batch of KV events (vLLM's schema, ``KVEventsBody``) to the index.

    The body is decoded and checked in a worker thread, and the events are applied in
    chunks that yield to the event loop: a batch of megabytes holds no other request up.
    """
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
    if body.instance_id not in instances.pool.configs:
        raise ApiError(404, f"unknown instance {body.instance_id!r}", param="instance_id")
    batch = KVEventBatch.model_construct(
        instance_id=body.instance_id, timestamp=body.timestamp, sequence=None,
        events=body.events, gap=False, missed=0,
    )  # fmt: skip
    try:
        if instances.lane.threaded:  # a shared index: applied off the event loop, on its lane
            await instances.lane.run(instances.ingestor.apply, batch)
        else:
            await instances.ingestor.apply_in_chunks(batch)
    except UnknownInstanceError as exc:  # removed while its events were being applied
        instances.ingestor.forget(body.instance_id)
        raise ApiError(404, f"instance {body.instance_id!r} was removed",
                       param="instance_id") from exc  # fmt: skip
    metrics.kv_events.labels(body.instance_id).inc()
    _audit(request, "kv-events", instance=body.instance_id, events=len(body.events))
    return {"applied": len(body.events)}


def _experiment(experiments: Experiments, experiment_id: str) -> Experiment:
    experiment = experiments.by_id.get(experiment_id)
    if experiment is None:
        raise ApiError(404, f"unknown experiment {experiment_id!r}", param="experiment_id")
    return experiment


def _report(service: ServiceSettings, experiment: Experiment) -> dict[str, Any]:
    return experiment_report(experiment, sla_ttft_s=service.sla_ttft_s,
                             sla_tpot_s=service.sla_tpot_s)  # fmt: skip


@admin_router.post("/v1/experiments", status_code=201)
async def create_experiment(
    spec: ExperimentSpec, request: Request, experiments: ExperimentsDep, service: ServiceDep
) -> dict[str, Any]:
    """Start an experiment (the running one, if any, stops); its arms split the traffic."""
    try:
        experiment = experiments.create(spec)
    except ValueError as exc:
        raise ApiError(422, str(exc), param="arms") from exc
    _audit(request, "start-experiment", experiment=experiment.id)
    return _report(service, experiment)


@admin_router.get("/v1/experiments")
async def list_experiments(experiments: ExperimentsDep) -> list[dict[str, Any]]:
    return [
        {"id": e.id, "name": e.spec.name, "status": e.status, "arms": [a.spec.name for a in e.arms]}
        for e in experiments.by_id.values()
    ]


@admin_router.get("/v1/experiments/{experiment_id}", responses=ERROR_RESPONSES(404))
async def get_experiment(
    experiment_id: str, experiments: ExperimentsDep, service: ServiceDep
) -> dict[str, Any]:
    """Per-arm counts, TTFT / TPOT percentiles, SLA attainment, prediction error, pipeline
    mix, and each arm's difference from the first with a 95% bootstrap interval."""
    return _report(service, _experiment(experiments, experiment_id))


@admin_router.post("/v1/experiments/{experiment_id}/stop", responses=ERROR_RESPONSES(404))
async def stop_experiment(
    experiment_id: str, request: Request, experiments: ExperimentsDep, service: ServiceDep
) -> dict[str, Any]:
    _experiment(experiments, experiment_id)
    stopped = experiments.stop(experiment_id)
    _audit(request, "stop-experiment", experiment=experiment_id)
    return _report(service, stopped)
