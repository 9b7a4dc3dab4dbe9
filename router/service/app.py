"""The FastAPI app factory: state created by the lifespan, routes, errors, metrics, tracing."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TextIO

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from opentelemetry import trace
from opentelemetry.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Receive, Scope, Send

from engines_adapter.contract import EngineAdapter
from router import __version__
from router.errors import UserError
from router.index.base import PrefixIndex
from router.index.resilient_index import ResilientIndex
from router.kv_ingest import KVEventIngestor
from router.predictor.tracking import TrackedIndex
from router.scheduler_factory import SchedulerFactory
from router.service.admin import admin_router
from router.service.api import api_router
from router.service.errors import error_body, install_error_handlers
from router.service.experiments import Experiments
from router.service.lifecycle import (
    attach_instance,
    detach_instance,
    load_instances_file,
    poll_loads,
)
from router.service.metrics import ServiceMetrics
from router.service.pool import InstancePool
from router.service.schemas import InstanceConfig
from router.service.state import ServiceState
from router.settings import Settings

__all__ = ["build_state", "create_app", "open_decision_log"]

AdapterFactory = Callable[[InstanceConfig, httpx.AsyncClient], EngineAdapter]


def adapter_factory_for(settings: Settings) -> AdapterFactory:
    """Adapters built from instance configs; prompts beyond the vocabulary never reach engines
    (one out-of-range token ID takes a real vLLM down)."""

    def build(config: InstanceConfig, client: httpx.AsyncClient) -> EngineAdapter:
        from engines_adapter.factory import build_adapter

        return build_adapter(
            config.adapter,
            config.instance_id,
            None if config.adapter == "sim" else config.url,
            client=client,
            kv_events_endpoint=config.kv_events_endpoint,
            vocab_size=settings.service.vocab_size,
        )

    return build


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


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413 before they reach a handler."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            response = JSONResponse(
                error_body(f"request body over {self.limit} bytes", "invalid_request_error",
                           None, 413),
                status_code=413,
            )  # fmt: skip
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


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
    from router.index.factory import build_index

    idx = index if index is not None else build_index(settings.index, settings.redis)
    if settings.index.backend == "redis" and not isinstance(idx, ResilientIndex):
        idx = ResilientIndex(
            idx, default_capacity_blocks=settings.index.capacity_blocks,
            ttl_s=settings.index.ttl_s,
        )  # fmt: skip
    predictor = None
    if settings.service.predictor_model is not None:
        from router.predictor.persist import load_predictor

        predictor = load_predictor(Path(settings.service.predictor_model))
    schedulers = SchedulerFactory.create(
        idx, predictor=predictor, decision_log=log,
        record_routes=settings.service.approximate_index,
    )  # fmt: skip
    idx = schedulers.index  # tracked when a model or the log needs when blocks were stored
    realizations = None
    if log is not None:
        from router.predictor.realization import KVRealizations

        realizations = KVRealizations()
    timeout = httpx.Timeout(settings.service.engine_timeout_s, connect=2.0)
    http = httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=512))
    return ServiceState(
        settings=settings, index=idx,
        pool=InstancePool(idx, settings.cluster, lambda cfg: factory(cfg, http)),
        scheduler=schedulers.build(settings.policy.name, settings.policy.params),
        ingestor=KVEventIngestor(
            idx, block_size=settings.block_size, seed=settings.hash_seed,
            observer=realizations,
        ),
        metrics=ServiceMetrics(), http=http, tracer=provider.get_tracer("pdd_router"),
        experiments=Experiments(schedulers),
        realizations=realizations,
    )  # fmt: skip


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
                yield {"svc": svc}
            finally:
                try:
                    svc.flush_deferred()  # outcome lines waiting for KV events reach the log
                finally:
                    for task in svc.background:
                        task.cancel()
                    for iid in list(svc.pool.configs):
                        await detach_instance(svc, iid)
                    await svc.http.aclose()

    app = FastAPI(
        title="pdd-router",
        version=__version__,
        description="Control plane for two-datacenter PDD serving.",
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.include_router(api_router)
    app.include_router(admin_router)
    app.add_middleware(BodyLimit, limit=settings.service.max_body_bytes)

    @app.get("/healthz", tags=["ops"])
    async def healthz() -> dict[str, str]:
        """The router process answers."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["ops"],
        responses={503: {"description": "A tier has no healthy instance"}},
    )
    async def readyz(request: Request) -> JSONResponse:
        """200 when each tier has a healthy instance, 503 otherwise."""
        svc: ServiceState = request.state.svc
        tiers = {t.value: ok for t, ok in svc.pool.ready_tiers().items()}
        ready = all(tiers.values())
        base = svc.index.inner if isinstance(svc.index, TrackedIndex) else svc.index
        degraded = isinstance(base, ResilientIndex) and base.degraded
        svc.metrics.index_degraded.set(1 if degraded else 0)
        body = {
            "ready": ready,
            "tiers": tiers,
            "index": settings.index.backend,
            "index_degraded": degraded,
        }
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/version", tags=["ops"])
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @app.get(
        "/metrics",
        tags=["ops"],
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text"}},
    )
    async def metrics_endpoint(request: Request) -> PlainTextResponse:
        svc: ServiceState = request.state.svc
        return PlainTextResponse(
            generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    return app
