"""Instances coming and going while the service runs: adapters, KV-event tasks, load polling."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import structlog
import yaml
from pydantic import TypeAdapter, ValidationError

from router.errors import UserError
from router.service.schemas import InstanceConfig
from router.service.state import ServiceState

__all__ = ["attach_instance", "detach_instance", "load_instances_file", "poll_loads"]

log = structlog.get_logger("pdd_router.service")
_CONFIGS: TypeAdapter[list[InstanceConfig]] = TypeAdapter(list[InstanceConfig])


def load_instances_file(path: str) -> list[InstanceConfig]:
    """Instances from a YAML or JSON list (or a mapping with an ``instances`` list)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise UserError(f"cannot read instances file {path}: {exc.strerror}") from exc
    try:
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise UserError(f"instances file {path} is not valid YAML/JSON: {exc}") from exc
    if isinstance(data, dict):
        data = data.get("instances")
    try:
        return _CONFIGS.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"instances file {path}: {where}: {first['msg']}") from exc


async def attach_instance(svc: ServiceState, config: InstanceConfig) -> None:
    """Register an instance and start consuming its KV events."""
    if config.instance_id in svc.pool.configs:
        await detach_instance(svc, config.instance_id)
    try:
        svc.pool.register(config, svc.settings.block_size)
    except ValueError as exc:  # the adapter refused the config (e.g. a missing URL)
        from router.service.errors import ApiError

        raise ApiError(400, f"instance {config.instance_id}: {exc}", param="url") from exc
    svc.scheduler.refresh_instances()
    svc.experiments.refresh_instances()
    adapter = svc.pool.adapters[config.instance_id]
    if config.kv_events_endpoint is not None or config.adapter == "sim":
        task = asyncio.create_task(_consume_events(svc, config.instance_id, adapter.kv_events()))
        svc.event_tasks[config.instance_id] = task


async def detach_instance(svc: ServiceState, instance_id: str) -> None:
    """Stop an instance's event task, forget it in the pool, index and ingestor."""
    task = svc.event_tasks.pop(instance_id, None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    adapter = svc.pool.remove(instance_id)
    svc.ingestor.forget(instance_id)
    svc.scheduler.refresh_instances()
    svc.experiments.refresh_instances()
    with contextlib.suppress(Exception):
        await adapter.aclose()


async def _consume_events(svc: ServiceState, instance_id: str, events: object) -> None:
    from collections.abc import AsyncIterator

    from engines_adapter.contract import KVEventBatch

    assert isinstance(events, AsyncIterator)
    stream: AsyncIterator[KVEventBatch] = events
    try:
        async for batch in stream:
            svc.ingestor.apply(batch)
            svc.metrics.kv_events.labels(instance_id).inc()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a broken event source must not take the service down
        log.warning("kv events stopped", instance=instance_id, error=str(exc))


PROBE_FAILURES_UNHEALTHY = 3
"""Consecutive failed probes before an instance is taken out (a busy engine may be slow
to answer once; a refused request marks it unhealthy at once, see the API)."""


async def poll_loads(svc: ServiceState) -> None:
    """Forever: read each engine's health and load into the cluster view."""
    interval = svc.settings.service.load_poll_s
    timeout = max(interval * 2, 5.0)
    failures: dict[str, int] = {}
    while True:
        for iid in list(svc.pool.configs):
            if iid not in svc.pool.configs:
                continue
            _, adapter, load = svc.pool.get(iid)
            try:
                healthy = await asyncio.wait_for(adapter.health(), timeout=timeout)
                figures = await asyncio.wait_for(adapter.load(), timeout=timeout)
            except Exception:
                failures[iid] = failures.get(iid, 0) + 1
                if failures[iid] >= PROBE_FAILURES_UNHEALTHY:
                    load.healthy = False
                continue
            failures[iid] = 0
            load.healthy = healthy
            svc.pool.reported(
                iid, running=figures.running, waiting=figures.waiting,
                kv_used=int(figures.kv_usage * load.kv_capacity_tokens),
            )  # fmt: skip
            with contextlib.suppress(Exception):
                svc.metrics.index_blocks.labels(iid).set(svc.index.num_blocks(iid))
        await asyncio.sleep(interval)
