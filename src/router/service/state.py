"""Everything the service owns while it runs, created by the lifespan (no globals)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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
    deferred: dict[asyncio.TimerHandle, Callable[[], None]] = field(default_factory=dict)

    def next_request_id(self) -> str:
        self.request_counter += 1
        return f"pdd-{self.request_counter:x}"

    def defer(self, delay_s: float, call: Callable[[], None]) -> None:
        """Run ``call`` in ``delay_s`` on the running loop (or at once when there is none);
        ``flush_deferred`` runs what is still waiting at shutdown."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            call()
            return
        handle: asyncio.TimerHandle | None = None

        def run() -> None:
            assert handle is not None
            self.deferred.pop(handle, None)
            call()

        handle = loop.call_later(delay_s, run)
        self.deferred[handle] = call

    def flush_deferred(self) -> None:
        """Run every deferred call now (shutdown: nothing waiting is lost)."""
        pending, self.deferred = self.deferred, {}
        for handle, call in pending.items():
            handle.cancel()
            call()
