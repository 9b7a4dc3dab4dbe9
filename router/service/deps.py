"""The FastAPI dependencies that hand the route handlers their parts: each handler
declares the narrow ones it uses (``GenerationDep``, ``ModelsDep``...) and never sees
the ``ServiceState`` they come from. Only these functions (and the composition that
built it) read that container; the middlewares that run before the routes get their
parts here from the ASGI scope.

The dependencies are ``async``: FastAPI runs a plain function in a worker thread.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import Depends, Request
from starlette.types import Scope

from router.service.experiments import Experiments
from router.service.lifecycle import Instances
from router.service.metrics import ServiceMetrics
from router.service.parts import GenerationDeps, Readiness, ServedModels
from router.service.refusals import ADMISSION_SCOPE, Admission
from router.service.request_metrics import RequestFamilies
from router.service.state import ServiceState
from router.settings import ServiceSettings

__all__ = [
    "AdmissionDep",
    "ExperimentsDep",
    "GenerationDep",
    "InstancesDep",
    "MetricsDep",
    "ModelsDep",
    "ReadinessDep",
    "ServiceDep",
    "generation_of",
    "instances_of",
    "request_families_of",
    "service_of",
]


def _state(request: Request) -> ServiceState:
    state: ServiceState = request.state.svc
    return state


def _scope_state(scope: Scope) -> ServiceState | None:
    """The service's parts, once its lifespan has started (None before)."""
    found: ServiceState | None = (scope.get("state") or {}).get("svc")
    return found


async def generation(request: Request) -> GenerationDeps:
    return _state(request).generation


async def models(request: Request) -> ServedModels:
    return _state(request).served


async def service(request: Request) -> ServiceSettings:
    return _state(request).settings.service


async def instances(request: Request) -> Instances:
    return _state(request).instances


async def experiments(request: Request) -> Experiments:
    return _state(request).experiments


async def metrics(request: Request) -> ServiceMetrics:
    return _state(request).metrics


async def readiness(request: Request) -> Readiness:
    return _state(request).readiness


async def admission(request: Request) -> Admission:
    """The generation request's ``Admission`` (``RefusalCount`` put it in the scope; a
    fresh one, counted nowhere, on an app without that middleware)."""
    found = request.scope.get(ADMISSION_SCOPE)
    return found if isinstance(found, Admission) else Admission()


GenerationDep = Annotated[GenerationDeps, Depends(generation)]
ModelsDep = Annotated[ServedModels, Depends(models)]
ServiceDep = Annotated[ServiceSettings, Depends(service)]
InstancesDep = Annotated[Instances, Depends(instances)]
ExperimentsDep = Annotated[Experiments, Depends(experiments)]
MetricsDep = Annotated[ServiceMetrics, Depends(metrics)]
ReadinessDep = Annotated[Readiness, Depends(readiness)]
AdmissionDep = Annotated[Admission, Depends(admission)]


def generation_of(scope: Scope) -> GenerationDeps | None:
    """The generation parts for a middleware (None before the lifespan started)."""
    svc = _scope_state(scope)
    return svc.generation if svc is not None else None


def service_of(scope: Scope) -> ServiceSettings | None:
    """The service settings for a middleware (None before the lifespan started)."""
    svc = _scope_state(scope)
    return svc.settings.service if svc is not None else None


def request_families_of(scope: Scope) -> RequestFamilies | None:
    """The per-request metrics for a middleware (None before the lifespan started)."""
    svc = _scope_state(scope)
    return svc.metrics.request if svc is not None else None


def instances_of(lifespan_state: Mapping[str, Any]) -> Instances:
    """The instances of the service whose lifespan yielded ``lifespan_state``."""
    svc: ServiceState = lifespan_state["svc"]
    return svc.instances
