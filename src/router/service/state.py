"""Everything the service owns while it runs, created by the lifespan (no globals)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import httpx
from opentelemetry.trace import Tracer

from router.index.base import PrefixIndex
from router.kv_ingest import KVEventIngestor
from router.predictor.realization import KVRealizations
from router.scheduler import Scheduler
from router.service.experiments import Experiments
from router.service.metrics import ServiceMetrics
from router.service.pool import InstancePool
from router.settings import Settings

__all__ = ["ServiceState"]


@dataclass
class ServiceState:
    settings: Settings
    index: PrefixIndex
    scheduler: Scheduler
    pool: InstancePool
    ingestor: KVEventIngestor
    metrics: ServiceMetrics
    http: httpx.AsyncClient
    tracer: Tracer
    experiments: Experiments
    realizations: KVRealizations | None = None  # with a decision log: hits from KV events
    event_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    background: list[asyncio.Task[None]] = field(default_factory=list)
    request_counter: int = 0

    def next_request_id(self) -> str:
        self.request_counter += 1
        return f"pdd-{self.request_counter:x}"
