"""Where the service's parts are built and wired, once, when the lifespan starts: each
part gets only the collaborators it uses, and what runs in the background is started
and stopped here. The narrow views the route handlers get (``GenerationDeps``,
``ServedModels``, ``Readiness``) are built here too, from the same parts;
``ServiceState`` only carries them to the dependency functions of ``deps``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import httpx
from opentelemetry.trace import TracerProvider

from engines_adapter.contract import EngineAdapter
from engines_adapter.sse_transport import engine_transport
from router.index.base import PrefixIndex
from router.index.memory_index import MemoryPrefixIndex
from router.index.resilient_index import ResilientIndex
from router.kv_ingest import KVEventIngestor
from router.predictor.tracking import TrackedIndex
from router.scheduler_factory import SchedulerFactory
from router.service.breaker import CircuitBreakers
from router.service.decide import Decider
from router.service.deferred import Deferred
from router.service.experiments import Experiments
from router.service.fd_budget import engine_connections
from router.service.index_lane import IndexLane
from router.service.lifecycle import Instances, load_instances_file
from router.service.metrics import ServiceMetrics
from router.service.models import ModelRegistry
from router.service.outcomes import OutcomeRecorder
from router.service.parts import GenerationDeps, Readiness, ServedModels
from router.service.peers import Peers
from router.service.pipelines.upstream import Upstream
from router.service.pool import InstancePool
from router.service.request_ids import RequestIds
from router.service.schemas import InstanceConfig
from router.service.state import ServiceState
from router.settings import Settings

__all__ = ["AdapterFactory", "compose", "engine_timeouts", "start", "stop"]

AdapterFactory = Callable[[InstanceConfig, httpx.AsyncClient], EngineAdapter]


def engine_timeouts(settings: Settings) -> httpx.Timeout:
    """The HTTP timeouts of a generation call. The read timeout is a backstop: the
    pipelines hold each stream to the first-token and inter-token deadlines."""
    service = settings.service
    read = max(service.engine_timeout_s, service.engine_inter_token_timeout_s)
    return httpx.Timeout(connect=service.engine_connect_timeout_s, read=read, write=10.0,
                         pool=service.engine_timeout_s)  # fmt: skip


def _index(settings: Settings, index: PrefixIndex | None, metrics: ServiceMetrics) -> PrefixIndex:
    """The index: Redis wrapped to survive outages, its degraded gauge kept true."""
    from router.index.factory import build_index, build_resilient_index

    idx = index if index is not None else build_index(settings.index, settings.redis)
    if settings.index.backend == "redis" and not isinstance(idx, ResilientIndex):
        idx = build_resilient_index(idx, settings.index, settings.redis)
    if isinstance(idx, ResilientIndex):  # the index keeps the degraded gauge true itself
        idx.recovery.on_state_change = lambda degraded: metrics.index_degraded.set(int(degraded))
        metrics.index_degraded.set(int(idx.degraded))
    return idx


def _schedulers(settings: Settings, index: PrefixIndex, log: TextIO | None) -> SchedulerFactory:
    """The policies' factory over the index (tracked when a model or the decision log
    needs when blocks were stored)."""
    predictor = None
    if settings.service.predictor_model is not None:
        from router.predictor.persist import load_predictor

        predictor = load_predictor(Path(settings.service.predictor_model))
    return SchedulerFactory.create(
        index, predictor=predictor, decision_log=log,
        record_routes=settings.service.approximate_index,
    )  # fmt: skip


def compose(
    settings: Settings,
    index: PrefixIndex | None,
    factory: AdapterFactory,
    provider: TracerProvider,
    log: TextIO | None,
) -> ServiceState:
    """Every part of a running service, from the settings, each wired to what it uses."""
    service = settings.service
    metrics = ServiceMetrics()
    base = _index(settings, index, metrics)
    # a shared index is used from one worker thread, never on the event loop
    lane = IndexLane(threaded=not isinstance(base, MemoryPrefixIndex))
    schedulers = _schedulers(settings, base, log)
    idx = schedulers.index
    realizations = None
    if log is not None:
        from router.predictor.realization import KVRealizations

        realizations = KVRealizations()
    # an event stream for each client connection the router may hold (fd_budget)
    transport = engine_transport(*engine_connections(service.connections.max_connections))
    http = httpx.AsyncClient(timeout=engine_timeouts(settings), transport=transport)
    breakers = CircuitBreakers(failures_to_open=service.breaker_failures,
                               open_s=service.breaker_open_s)  # fmt: skip
    pool = InstancePool(settings.cluster, lambda cfg: factory(cfg, http), breakers)
    peers = _peers(settings, idx, pool, metrics)
    scheduler = schedulers.build(settings.policy.name, settings.policy.params)
    experiments = Experiments(schedulers, max_samples=service.experiment_samples,
                              max_stopped=service.experiments_kept)  # fmt: skip
    ingestor = KVEventIngestor(idx, block_size=settings.block_size, seed=settings.hash_seed,
                               observer=realizations)  # fmt: skip
    tracer = provider.get_tracer("pdd_router")
    deferred = Deferred()
    models = ServedModels(ModelRegistry.of(settings.models, http, service), pool, time.time())
    decider = Decider(pool, scheduler, experiments, lane, tracer, metrics, peers)
    upstream = Upstream(pool, metrics, tracer, first_token_s=service.engine_timeout_s,
                        inter_token_s=service.engine_inter_token_timeout_s,
                        ejected_grace_s=service.ejected_stream_grace_s)  # fmt: skip
    outcomes = OutcomeRecorder(scheduler, lane, metrics, deferred, realizations,
                               service.kv_events_grace_s)  # fmt: skip
    ids = RequestIds()
    return ServiceState(
        settings=settings, models=models.registry, pool=pool, index=idx, lane=lane,
        metrics=metrics, experiments=experiments, decider=decider, upstream=upstream,
        outcomes=outcomes,
        instances=Instances(settings, pool, idx, lane, scheduler, experiments, ingestor,
                            metrics, peers),
        http=http, tracer=tracer, deferred=deferred, ids=ids, peers=peers,
        generation=GenerationDeps(
            service, settings.block_size, settings.hash_seed, ids, decider, upstream,
            outcomes, metrics.request, pool, models, tracer,
        ),
        served=models,
        readiness=Readiness(pool, idx, lane, needs_md=settings.policy.name != "colocated",
                            backend=settings.index.backend),
        started=models.since,
    )  # fmt: skip


def _peers(
    settings: Settings, index: PrefixIndex, pool: InstancePool, metrics: ServiceMetrics
) -> Peers | None:
    """The link to the other replicas on the same Redis (None: the in-memory index, or
    ``replicas.share`` off)."""
    base = index.inner if isinstance(index, TrackedIndex) else index
    if not settings.replicas.share or not isinstance(base, ResilientIndex):
        return None
    client = getattr(base.primary, "client", None)
    if client is None:
        return None
    from router.replicas import ReplicaSync
    from router.service.peers import default_replica_id

    replicas = settings.replicas
    sync = ReplicaSync(
        client, key_prefix=getattr(base.primary, "key_prefix", settings.redis.key_prefix),
        replica_id=replicas.replica_id or default_replica_id(),
        ttl_s=replicas.ttl_s, retry_after_s=settings.redis.retry_after_s,
    )  # fmt: skip
    return Peers(sync, pool, base, metrics, replicas)


async def start(svc: ServiceState) -> None:
    """The instances file's engines attached; the event loop's watch, load polling, KV
    relays and the replicas' heartbeat running."""
    service = svc.settings.service
    svc.background.append(asyncio.create_task(svc.metrics.loop.run()))
    if service.instances_file:
        for config in load_instances_file(service.instances_file):
            await svc.instances.attach(config)
    svc.background.append(asyncio.create_task(svc.instances.poll_loads()))
    for source in service.kv_relays:
        svc.background.append(asyncio.create_task(svc.instances.consume_relay(source)))
    if svc.peers is not None:
        await svc.lane.run(svc.peers.heartbeat)  # leases before the first events
        svc.background.append(asyncio.create_task(svc.peers.run(svc.lane)))


async def stop(svc: ServiceState) -> None:
    """Outcome lines waiting for KV events written; background work stopped, leases
    released, instances detached, connections closed."""
    try:
        svc.deferred.flush()  # outcome lines waiting for KV events reach the log
    finally:
        for task in svc.background:
            task.cancel()
        if svc.peers is not None:
            await svc.lane.run(svc.peers.release)
        for iid in list(svc.pool.configs):
            await svc.instances.detach(iid, shutdown=True)
        await svc.models.aclose()
        await svc.http.aclose()
        svc.lane.close()
