"""The FastAPI app factory: the parts composed by the lifespan (``composition``), routes,
errors, metrics, tracing."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TextIO

import httpx
from fastapi import Depends, FastAPI
from opentelemetry import trace
from opentelemetry.trace import TracerProvider

from engines_adapter.contract import EngineAdapter
from router import __version__
from router.errors import UserError
from router.index.base import PrefixIndex
from router.service.admin import admin_router
from router.service.api import api_router
from router.service.auth import ServiceAuth, auth_responses
from router.service.body_limit import BodyLimit
from router.service.composition import AdapterFactory, compose, engine_timeouts, start, stop
from router.service.deps import request_families_of
from router.service.errors import install_error_handlers
from router.service.gc_pause import settle_heap
from router.service.openai_api import openai_router
from router.service.ops_api import docs_router, ops_router
from router.service.refusals import RefusalCount
from router.service.request_tracing import instrument
from router.service.route_fast_path import RouteFastPath
from router.service.schemas import InstanceConfig
from router.service.tokenize_api import tokenize_router
from router.settings import Settings

__all__ = ["AdapterFactory", "adapter_factory_for", "create_app", "open_decision_log"]


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


def create_app(
    settings: Settings,
    *,
    index: PrefixIndex | None = None,
    adapter_factory: AdapterFactory | None = None,
    tracer_provider: TracerProvider | None = None,
    freeze_heap: bool = False,
) -> FastAPI:
    """Build the service; nothing is created until the lifespan starts. ``freeze_heap``:
    once started, what the process holds is moved out of the garbage collector's sight
    (``settle_heap``; for a process that runs this one service)."""
    factory = adapter_factory or adapter_factory_for(settings)
    provider = tracer_provider or _tracer_provider()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, Any]]:
        with contextlib.ExitStack() as files:
            log = None
            if settings.service.decision_log is not None:
                log = files.enter_context(open_decision_log(settings.service.decision_log))
            svc = compose(settings, index, factory, provider, log)
            try:
                await start(svc)
                if freeze_heap:
                    settle_heap()
                yield {"svc": svc}
            finally:
                await stop(svc)

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
    instrument(app, provider)  # with tracing on: a span per HTTP request, its stages' parent
    keyed = [Depends(auth.require_key)]
    app.include_router(api_router, dependencies=keyed, responses=auth_responses(401, 403))
    app.include_router(openai_router, dependencies=keyed, responses=auth_responses(401, 403))
    app.include_router(tokenize_router, dependencies=keyed, responses=auth_responses(401, 403))
    app.include_router(
        admin_router,
        dependencies=[Depends(auth.require_admin)],
        responses=auth_responses(401, 403),
    )
    app.add_middleware(BodyLimit, limit=settings.service.max_body_bytes)
    # outermost: generation requests refused before they start counted, the 413s too
    app.add_middleware(RefusalCount, families=request_families_of)
    app.include_router(ops_router(auth))
    app.include_router(docs_router(app, auth))
    return app
