"""Instances coming and going while the service runs: adapters, KV-event tasks, load polling."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog
import yaml
from pydantic import TypeAdapter, ValidationError

from engines_adapter.kv_subscriber import follow
from router.errors import UserError, one_line
from router.index.base import PrefixIndex
from router.kv_ingest import KVEventIngestor
from router.kv_relay.receiver import RelaySubscriber, apply_relayed, by_instance
from router.kv_relay.settings import KVRelaySource
from router.kv_relay.wire import Hashing, RelayedBatch
from router.scheduler import Scheduler
from router.service.experiments import Experiments
from router.service.index_lane import IndexLane
from router.service.metrics import ServiceMetrics
from router.service.peers import Peers
from router.service.pool import InstancePool, indexed_instance
from router.service.schemas import InstanceConfig
from router.settings import Settings

__all__ = ["Instances", "load_instances_file"]

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
        raise UserError(f"instances file {path} is not valid YAML/JSON: {one_line(exc)}") from exc
    if isinstance(data, dict):
        data = data.get("instances")
    try:
        return _CONFIGS.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise UserError(f"instances file {path}: {where}: {first['msg']}") from exc


RELAY_RETRY_S = 1.0
"""How long after an unexpected failure a KV relay is subscribed to again."""

SUSPECT_REPROBE_S = 0.25
"""How soon an instance whose last probe failed is probed again."""


@dataclass(slots=True)
class Instances:
    """The engine instances coming and going: the pool, the index and the scheduler learn
    of each; its KV events are consumed and its health and load polled."""

    settings: Settings
    pool: InstancePool
    index: PrefixIndex
    lane: IndexLane
    scheduler: Scheduler
    experiments: Experiments
    ingestor: KVEventIngestor
    metrics: ServiceMetrics
    peers: Peers | None = None
    event_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    async def attach(self, config: InstanceConfig) -> None:
        """Register an instance, start consuming its KV events, and probe it once (its load and
        KV block size count from its first decision on, not from the next poll)."""
        if config.instance_id in self.pool.configs:
            await self.detach(config.instance_id)
        try:
            self.pool.register(config)
        except ValueError as exc:  # the adapter refused the config (e.g. a missing URL)
            from router.service.errors import ApiError

            raise ApiError(400, f"instance {config.instance_id}: {exc}", param="url") from exc
        # a shared index is a network call: on the index's lane, never on the event loop
        await self.lane.run(self.index.register, indexed_instance(config, self.settings.block_size))
        self.scheduler.refresh_instances()
        self.experiments.refresh_instances()
        adapter = self.pool.adapters[config.instance_id]
        relayed = any(config.instance_id in r.instances for r in self.settings.service.kv_relays)
        if not relayed and (config.kv_events_endpoint is not None or config.adapter == "sim"):
            task = asyncio.create_task(
                self._consume_events(config.instance_id, adapter.kv_events())
            )
            self.event_tasks[config.instance_id] = task
        await self._probe(config.instance_id, self.settings.service.probe_timeout_s)

    async def detach(self, instance_id: str, *, shutdown: bool = False) -> None:
        """Stop an instance's event task, forget it in the pool, index and ingestor. At
        ``shutdown`` a shared index keeps the instance: other replicas still route to it, and
        this one finds it there when it starts again."""
        task = self.event_tasks.pop(instance_id, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        adapter = self.pool.remove(instance_id)
        self.ingestor.forget(instance_id)
        if self.peers is not None:
            await self.lane.run(self.peers.forget, instance_id)
        if not (shutdown and self.lane.threaded):  # a threaded lane: the index is shared
            await self.lane.run(self.index.unregister, instance_id)
        self.scheduler.refresh_instances()
        self.experiments.refresh_instances()
        self.metrics.forget_instance(instance_id)
        with contextlib.suppress(Exception):
            await adapter.aclose()

    async def _consume_events(self, instance_id: str, events: object) -> None:
        from collections.abc import AsyncIterator

        from engines_adapter.contract import KVEventBatch

        assert isinstance(events, AsyncIterator)
        stream: AsyncIterator[KVEventBatch] = events
        try:
            async for batch in stream:
                if self.peers is not None:
                    await self.lane.run(self.peers.ingest, self.ingestor, batch)
                else:
                    await self.lane.run(self.ingestor.apply, batch)
                self.metrics.kv_events.labels(instance_id).inc()
                if batch.gap:
                    self.metrics.kv_event_gaps.labels(instance_id).inc()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a broken event source must not take the service down
            log.warning("kv events stopped", instance=instance_id, error=str(exc))

    async def consume_relay(self, source: KVRelaySource) -> None:
        """Forever: apply a KV relay's batches, per instance it covers (those not registered
        here are skipped), with the lease a replica needs to write an instance's events. An
        unexpected failure is logged, the relay's instances are cleared (what they hold
        meanwhile is unknown, as after a gap) and the relay is subscribed to again after
        ``RELAY_RETRY_S``: a broken relay never takes the service down, nor stops for good."""

        async def apply(batch: RelayedBatch) -> None:
            for iid, events in by_instance(batch).items():
                if iid not in self.pool.configs:
                    continue
                if self.peers is not None:
                    await self.lane.run(self.peers.ingest_relayed, self.ingestor, iid, events)
                else:
                    await self.lane.run(apply_relayed, self.ingestor, events)
                self.metrics.kv_events.labels(iid).inc()
                if batch.gap:
                    self.metrics.kv_event_gaps.labels(iid).inc()

        async def lost() -> None:
            try:
                await apply(RelayedBatch(time.time(), []).marked_gap(0, tuple(source.instances)))
            except Exception as exc:  # e.g. the index unreachable: the next gap clears them
                log.warning("kv relay: its instances could not be cleared", error=repr(exc))

        hashing = Hashing(self.ingestor.block_size, self.ingestor.seed)  # what the index holds
        limit = self.settings.service.max_kv_relay_batch_blocks

        def subscribe() -> RelaySubscriber:
            name = "PDD_ROUTER_SERVICE__MAX_KV_RELAY_BATCH_BLOCKS"
            return RelaySubscriber(source, hashing=hashing, max_batch_blocks=limit, limit_name=name)

        await follow(subscribe, apply, lost, retry_s=RELAY_RETRY_S)

    async def poll_loads(self) -> None:
        """Forever: probe each engine for its health and load, all due ones at once, each
        within ``probe_timeout_s``. A failed or late probe counts against the instance in its
        circuit breaker, and a suspect instance is probed again after ``SUSPECT_REPROBE_S``
        rather than ``load_poll_s``, so a hung engine is out of service after about
        ``breaker_failures`` probe timeouts, whatever the other engines do."""
        interval = self.settings.service.load_poll_s
        timeout = self.settings.service.probe_timeout_s
        loop = asyncio.get_running_loop()
        due: dict[str, float] = {}
        while True:
            now = loop.time()
            ids = [iid for iid in self.pool.configs if due.get(iid, 0.0) <= now]
            results = await asyncio.gather(
                *(self._probe(iid, timeout) for iid in ids), return_exceptions=True
            )
            done = loop.time()
            for iid, ok in zip(ids, results, strict=True):
                if isinstance(ok, BaseException):  # a bug must not end the probing of all
                    log.error("probe failed", instance=iid, error=repr(ok))
                    ok = False
                due[iid] = done + (interval if ok else min(interval, SUSPECT_REPROBE_S))
            for iid in [i for i in due if i not in self.pool.configs]:
                del due[iid]
            wake = min(due.values(), default=done + interval)
            await asyncio.sleep(max(wake - loop.time(), 0.01))

    async def _probe(self, instance_id: str, timeout: float) -> bool:
        """One probe of one instance; False when it failed (the breaker was told)."""
        if instance_id not in self.pool.configs:
            return True
        _, adapter, load = self.pool.get(instance_id)
        try:
            async with asyncio.timeout(timeout):
                healthy = await adapter.health()
                figures = await adapter.load() if healthy else None
        except Exception:
            healthy, figures = False, None
        if instance_id not in self.pool.configs:  # removed while probed
            return True
        self.pool.health.probed(instance_id, healthy)
        if figures is not None:
            self.pool.reported(
                instance_id, running=figures.running, waiting=figures.waiting,
                kv_used=int(figures.kv_usage * load.kv_capacity_tokens),
                block_size=figures.block_size, itl=(figures.itl_sum_s, figures.itl_count),
            )  # fmt: skip
            with contextlib.suppress(Exception):
                blocks = await self.lane.run(self.index.num_blocks, instance_id)
                if instance_id in self.pool.configs:  # not removed meanwhile (its series is gone)
                    self.metrics.index_blocks.labels(instance_id).set(blocks)
        return healthy
