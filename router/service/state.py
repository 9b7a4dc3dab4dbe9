"""The service's parts as the composition built them (``router.service.composition``).

Only the composition and the dependency functions of ``router.service.deps`` touch this
container: a handler declares the narrow parts it uses (``GenerationDeps``,
``ServedModels``, ``Instances``...) and hands each function just those.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import httpx
from opentelemetry.trace import Tracer

from router.index.base import PrefixIndex
from router.service.decide import Decider
from router.service.deferred import Deferred
from router.service.experiments import Experiments
from router.service.index_lane import IndexLane
from router.service.lifecycle import Instances
from router.service.metrics import ServiceMetrics
from router.service.models import ModelRegistry
from router.service.outcomes import OutcomeRecorder
from router.service.parts import GenerationDeps, Readiness, ServedModels
from router.service.peers import Peers
from router.service.pipelines.upstream import Upstream
from router.service.pool import InstancePool
from router.service.request_ids import RequestIds
from router.settings import Settings

__all__ = ["ServiceState"]


@dataclass(slots=True)
class ServiceState:
    """The parts of one running service (see the module docstring)."""

    settings: Settings
    models: ModelRegistry
    pool: InstancePool
    index: PrefixIndex
    lane: IndexLane
    metrics: ServiceMetrics
    experiments: Experiments
    decider: Decider  # decisions: scheduler and experiments on the pool's view
    upstream: Upstream  # the pipelines' way to the engines
    outcomes: OutcomeRecorder  # finished requests: metrics, history, the decision log
    instances: Instances  # engines coming and going, their KV events and probes
    http: httpx.AsyncClient
    tracer: Tracer  # the handlers' own spans (tokenizing)
    generation: GenerationDeps  # what the generation endpoints use (narrow views of the above)
    served: ServedModels
    readiness: Readiness
    deferred: Deferred = field(default_factory=Deferred)
    ids: RequestIds = field(default_factory=RequestIds)
    peers: Peers | None = None  # other replicas on the same Redis index
    background: list[asyncio.Task[None]] = field(default_factory=list)
    started: float = field(default_factory=time.time)  # when the service started (epoch s)
