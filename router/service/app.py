"""The FastAPI app factory: state created by the lifespan, routes, errors, metrics, tracing."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TextIO

import httpx
from fastapi import Depends, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from opentelemetry import trace
from opentelemetry.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from engines_adapter.contract import EngineAdapter
from router import __version__
from router.errors import UserError
from router.index.base import PrefixIndex
from router.index.memory_index import MemoryPrefixIndex
from router.index.resilient_index import ResilientIndex
from router.kv_ingest import KVEventIngestor
from router.predictor.tracking import TrackedIndex
from router.scheduler_factory import SchedulerFactory
from router.service.admin import admin_router
from router.service.api import api_router
from router.service.auth import ServiceAuth, auth_responses
from router.service.body_limit import BodyLimit
from router.service.breaker import CircuitBreakers
from router.service.errors import install_error_handlers
from router.service.experiments import Experiments
from router.service.fd_budget import ENGINE_HTTP_CONNECTIONS
from router.service.index_lane import IndexLane
from router.service.lifecycle import (
    attach_instance,
    consume_relay,
    detach_instance,
    load_instances_file,
    poll_loads,
)
from router.service.metrics import ServiceMetrics
from router.service.models import ModelRegistry
from router.service.openai_api import openai_router
from router.service.peers import Peers
from router.service.pool import InstancePool
from router.service.route_fast_path import RouteFastPath
from router.service.schemas import InstanceConfig
from router.service.state import ServiceState
from router.settings import Settings

__all__ = ["build_state", "create_app", "open_decision_log"]

AdapterFactory = Callable[[InstanceConfig, httpx.AsyncClient], EngineAdapter]


def adapter_factory_for(settings: Settings) -> AdapterFactory:
    """Adapters built from instance configs; prompts beyond the vocabulary never reach engines
    (one out-of-range token ID takes a real vLLM down)."""

    def build(config: InstanceConfig, client: httpx.AsyncClient) -> EngineAdapter:
        from router.adapter_factory import build_adapter

        return build_adapter(
            config.adapter,
            config.instance_id,
            None if config.adapter == "sim" else config.url,
            client=client,
            kv_events_endpoint=config.kv_events_endpoint,
            vocab_size=settings.service.vocab_size,
            model=config.model,
            timeout=engine_timeouts(settings),
            probe_timeout=httpx.Timeout(settings.service.probe_timeout_s),
        )

    return build


def engine_timeouts(settings: Settings) -> httpx.Timeout:
    """The HTTP timeouts of a generation call. The read timeout is a backstop: the
    orchestrator holds each stream to the first-token and inter-token deadlines."""
    service = settings.service
    read = max(service.engine_timeout_s, service.engine_inter_token_timeout_s)
    return httpx.Timeout(connect=service.engine_connect_timeout_s, read=read, write=10.0,
                         pool=service.engine_timeout_s)  # fmt: skip


def open_decision_log(path: str) -> TextIO:
    """The live decision log, opened to append one line at a time (a line reaches the
    file as soon as it is written, so a crash loses nothing); a UserError naming the
    path when it cannot be opened."""
    try:
        return Path(path).open("a", encoding="utf-8", buffering=1)
    except OSError as exc:
        raise UserError(f"cannot open decision log {path}: {exc.strerror or exc}") from exc


def _tracer_provider() -> TracerProvider:
    """An SDK provider exporting over OTLP when OTEL_* variables ask for it, else a no-op."""
    if not (
        os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_TRACES_EXPORTER")
    ):
        return trace.NoOpTracerProvider()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider as SdkProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = SdkProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


def build_state(
    settings: Settings,
    index: PrefixIndex | None,
    factory: AdapterFactory,
    provider: TracerProvider,
    log: TextIO | None,
) -> ServiceState:
    """Everything a running service holds, from the settings: the index (Redis wrapped to
    survive outages; tracked when a model or a decision log needs block ages), the policy
    and scheduler, the engine pool, KV-event ingestion (and, with a decision log, the
    realized hits it reads from stored events), metrics and experiments."""
    from router.index.factory import build_index, build_resilient_index

    metrics = ServiceMetrics()
    idx = index if index is not None else build_index(settings.index, settings.redis)
    if settings.index.backend == "redis" and not isinstance(idx, ResilientIndex):
        idx = build_resilient_index(idx, settings.index, settings.redis)
    if isinstance(idx, ResilientIndex):  # the index keeps the degraded gauge true itself
        idx.on_state_change = lambda degraded: metrics.index_degraded.set(int(degraded))
        metrics.index_degraded.set(int(idx.degraded))
    predictor = None
    if settings.service.predictor_model is not None:
        from router.predictor.persist import load_predictor

        predictor = load_predictor(Path(settings.service.predictor_model))
    # a shared index is used from one worker thread, never on the event loop
    lane = IndexLane(threaded=not isinstance(idx, MemoryPrefixIndex))
    schedulers = SchedulerFactory.create(
        idx, predictor=predictor, decision_log=log,
        record_routes=settings.service.approximate_index,
    )  # fmt: skip
    idx = schedulers.index  # tracked when a model or the log needs when blocks were stored
    realizations = None
    if log is not None:
        from router.predictor.realization import KVRealizations

        realizations = KVRealizations()
    http = httpx.AsyncClient(
        timeout=engine_timeouts(settings),
        limits=httpx.Limits(max_connections=ENGINE_HTTP_CONNECTIONS),
    )
    pool = InstancePool(
        settings.cluster, lambda cfg: factory(cfg, http),
        CircuitBreakers(failures_to_open=settings.service.breaker_failures,
                        open_s=settings.service.breaker_open_s),
    )  # fmt: skip
    return ServiceState(
        settings=settings, index=idx,
        pool=pool,
        peers=_peers(settings, idx, pool, metrics),
        scheduler=schedulers.build(settings.policy.name, settings.policy.params),
        ingestor=KVEventIngestor(
            idx, block_size=settings.block_size, seed=settings.hash_seed,
            observer=realizations,
        ),
        metrics=metrics, http=http, tracer=provider.get_tracer("pdd_router"),
        experiments=Experiments(schedulers, max_samples=settings.service.experiment_samples,
                                max_stopped=settings.service.experiments_kept),
        models=ModelRegistry.of(settings.models, http, settings.service),
        realizations=realizations,
        lane=lane,
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
    from router.service.peers import Peers, default_replica_id

    replicas = settings.replicas
    sync = ReplicaSync(
        client, key_prefix=getattr(base.primary, "key_prefix", settings.redis.key_prefix),
        replica_id=replicas.replica_id or default_replica_id(),
        ttl_s=replicas.ttl_s, retry_after_s=settings.redis.retry_after_s,
    )  # fmt: skip
    return Peers(sync, pool, base, metrics, replicas)


def create_app(
    settings: Settings,
    *,
    index: PrefixIndex | None = None,
    adapter_factory: AdapterFactory | None = None,
    tracer_provider: TracerProvider | None = None,
) -> FastAPI:
    """Build the service; nothing is created until the lifespan starts."""
    factory = adapter_factory or adapter_factory_for(settings)
    provider = tracer_provider or _tracer_provider()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        with contextlib.ExitStack() as files:
            log = None
            if settings.service.decision_log is not None:
                log = files.enter_context(open_decision_log(settings.service.decision_log))
            svc = build_state(settings, index, factory, provider, log)
            try:
                if settings.service.instances_file:
                    for config in load_instances_file(settings.service.instances_file):
                        await attach_instance(svc, config)
                svc.background.append(asyncio.create_task(poll_loads(svc)))
                for source in settings.service.kv_relays:
                    svc.background.append(asyncio.create_task(consume_relay(svc, source)))
                if svc.peers is not None:
                    await svc.lane.run(svc.peers.heartbeat)  # leases before the first events
                    svc.background.append(asyncio.create_task(svc.peers.run(svc.lane)))
                yield {"svc": svc}
            finally:
                try:
                    svc.flush_deferred()  # outcome lines waiting for KV events reach the log
                finally:
                    for task in svc.background:
                        task.cancel()
                    if svc.peers is not None:
                        await svc.lane.run(svc.peers.release)
                    for iid in list(svc.pool.configs):
                        await detach_instance(svc, iid, shutdown=True)
                    await svc.models.aclose()
                    await svc.http.aclose()
                    svc.lane.close()

    app = FastAPI(
        title="pdd-router",
        version=__version__,
        description="Control plane for two-datacenter PDD serving.",
        lifespan=lifespan,
        # served below behind the API key, when one is configured
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    auth = ServiceAuth(settings.service)
    # innermost middleware: ordinary route requests skip the framework (LastResort and the
    # body limit, added after it, still wrap it)
    if settings.service.route_fast_path:
        app.add_middleware(RouteFastPath, auth=auth)
    install_error_handlers(app)
    keyed = [Depends(auth.require_key)]
    app.include_router(api_router, dependencies=keyed, responses=auth_responses(401, 403))
    app.include_router(openai_router, dependencies=keyed, responses=auth_responses(401, 403))
    app.include_router(
        admin_router,
        dependencies=[Depends(auth.require_admin)],
        responses=auth_responses(401, 403),
    )
    app.add_middleware(BodyLimit, limit=settings.service.max_body_bytes)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        """The router process answers."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["ops"],
        responses={503: {"description": "P or MD has no healthy instance"}},
    )
    async def readyz(request: Request) -> JSONResponse:
        """Whether requests can be served: 200 when P and MD each have a healthy instance
        (P alone with the colocated policy, whose engines decode too), else 503. What runs
        degraded is named (``degraded``): RLD with no healthy instance (requests go P-MD),
        and a shared index that is unreachable or being rebuilt (``index_degraded``:
        decisions use the router's local mirror). The shared index is probed on each call
        (once per retry delay while it is down)."""
        svc: ServiceState = request.state.svc
        tiers = {t.value: ok for t, ok in svc.pool.ready_tiers().items()}
        ready, degraded_tiers = svc.pool.readiness(needs_md=settings.policy.name != "colocated")
        base = svc.index.inner if isinstance(svc.index, TrackedIndex) else svc.index
        index_degraded = isinstance(base, ResilientIndex) and await svc.lane.run(base.check)
        degraded = [t.value for t in degraded_tiers] + (["index"] if index_degraded else [])
        body = {
            "ready": ready,
            "tiers": tiers,
            "degraded": degraded,
            "index": settings.index.backend,
            "index_degraded": index_degraded,
        }
        if isinstance(base, ResilientIndex):
            body["index_state"] = base.state
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/version", tags=["ops"], dependencies=keyed, responses=auth_responses(401, 403))
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get(
        "/metrics",
        tags=["ops"],
        response_class=PlainTextResponse,
        responses={
            200: {"content": {"text/plain": {}}, "description": "Prometheus text"},
            **auth_responses(401, 403),
        },
        dependencies=[Depends(auth.require_metrics_key)],
    )
    async def metrics_endpoint(request: Request) -> PlainTextResponse:
        """Prometheus metrics; with a key configured, the metrics key or the admin key."""
        svc: ServiceState = request.state.svc
        return PlainTextResponse(
            generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    @app.get("/openapi.json", include_in_schema=False, dependencies=keyed)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=keyed)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - API")

    @app.get("/redoc", include_in_schema=False, dependencies=keyed)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - API")

    return app
