"""The operations endpoints: liveness, readiness, version, Prometheus metrics, and the API
documentation (behind the API key, when one is configured)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from router import __version__
from router.index.resilient_index import ResilientIndex
from router.predictor.tracking import TrackedIndex
from router.service.auth import ServiceAuth, auth_responses
from router.service.deps import MetricsDep, ReadinessDep
from router.service.parts import Readiness

__all__ = ["docs_router", "ops_router"]


def ops_router(auth: ServiceAuth) -> APIRouter:
    """``/healthz``, ``/readyz`` (open), ``/version`` (API key), ``/metrics`` (metrics key)."""
    router = APIRouter(tags=["ops"])
    keyed = [Depends(auth.require_key)]

    @router.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The router process answers."""
        return {"status": "ok"}

    @router.get("/readyz", responses={503: {"description": "P or MD has no healthy instance"}})
    async def readyz(parts: ReadinessDep) -> JSONResponse:
        """Whether requests can be served: 200 when P and MD each have a healthy instance
        (P alone with the colocated policy, whose engines decode too), else 503. What runs
        degraded is named (``degraded``): RLD with no healthy instance (requests go P-MD),
        and a shared index that is unreachable or being rebuilt (``index_degraded``:
        decisions use the router's local mirror). The shared index is probed on each call
        (once per retry delay while it is down)."""
        return await readiness(parts)

    @router.get("/version", dependencies=keyed, responses=auth_responses(401, 403))
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @router.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={
            200: {"content": {"text/plain": {}}, "description": "Prometheus text"},
            **auth_responses(401, 403),
        },
        dependencies=[Depends(auth.require_metrics_key)],
    )
    async def metrics_endpoint(metrics: MetricsDep) -> PlainTextResponse:
        """Prometheus metrics; with a key configured, the metrics key or the admin key."""
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router


async def readiness(parts: Readiness) -> JSONResponse:
    """The ``/readyz`` answer: the pool's tiers and the shared index's state."""
    tiers = {t.value: ok for t, ok in parts.pool.health.ready_tiers().items()}
    ready, degraded_tiers = parts.pool.health.readiness(needs_md=parts.needs_md)
    base = parts.index.inner if isinstance(parts.index, TrackedIndex) else parts.index
    index_degraded = isinstance(base, ResilientIndex) and await parts.lane.run(base.check)
    degraded = [t.value for t in degraded_tiers] + (["index"] if index_degraded else [])
    body = {
        "ready": ready,
        "tiers": tiers,
        "degraded": degraded,
        "index": parts.backend,
        "index_degraded": index_degraded,
    }
    if isinstance(base, ResilientIndex):
        body["index_state"] = base.state
    return JSONResponse(body, status_code=200 if ready else 503)


def docs_router(app: FastAPI, auth: ServiceAuth) -> APIRouter:
    """The OpenAPI document, Swagger UI and ReDoc, behind the API key."""
    router = APIRouter(include_in_schema=False, dependencies=[Depends(auth.require_key)])

    @router.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @router.get("/docs")
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - API")

    @router.get("/redoc")
    async def redoc() -> HTMLResponse:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{app.title} - API")

    return router
