"""Everything the service owns while it runs, created by the lifespan (no globals)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import structlog
from opentelemetry.trace import Tracer

from router.index.base import PrefixIndex
from router.kv_ingest import KVEventIngestor
from router.predictor.realization import KVRealizations
from router.scheduler import Scheduler
from router.service.experiments import Experiments
from router.service.index_lane import IndexLane
from router.service.metrics import ServiceMetrics
from router.service.models import ModelRegistry
from router.service.peers import Peers
from router.service.pool import InstancePool
from router.settings import Settings

__all__ = ["ServiceState"]

log = structlog.get_logger("pdd_router.service")


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
    models: ModelRegistry
    realizations: KVRealizations | None = None  # with a decision log: hits from KV events
    peers: Peers | None = None  # other replicas on the same Redis index
    lane: IndexLane = field(default_factory=lambda: IndexLane(threaded=False))
    event_tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    background: list[asyncio.Task[None]] = field(default_factory=list)
    request_counter: int = 0
    started: float = field(default_factory=time.time)  # when the service started (epoch s)
    # request ids are unique across restarts: a decision log opened in append mode joins
    # decisions and outcomes by id, so a restarted service must not reuse pdd-...-1
    id_prefix: str = field(default_factory=lambda: secrets.token_hex(4))
    deferred: dict[asyncio.TimerHandle, Callable[[], None]] = field(default_factory=dict)
    flushed: bool = False  # shutdown ran the deferred calls: later ones run at once

    def next_request_id(self) -> str:
        self.request_counter += 1
        return f"pdd-{self.id_prefix}-{self.request_counter:x}"

    def defer(self, delay_s: float, call: Callable[[], None]) -> None:
        """Run ``call`` in ``delay_s`` on the running loop (at once when there is none, or
        once shutdown has flushed); ``flush_deferred`` runs what is still waiting then. A
        call that fails is logged, and the others still run."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None or self.flushed:
            _run_logged(call)
            return
        handle: asyncio.TimerHandle | None = None

        def run() -> None:
            assert handle is not None
            self.deferred.pop(handle, None)
            _run_logged(call)

        handle = loop.call_later(delay_s, run)
        self.deferred[handle] = call

    def flush_deferred(self) -> None:
        """Run every deferred call now (shutdown: nothing waiting is lost); later ones run
        at once."""
        self.flushed = True
        pending, self.deferred = self.deferred, {}
        for handle, call in pending.items():
            handle.cancel()
            _run_logged(call)


def _run_logged(call: Callable[[], None]) -> None:
    try:
        call()
    except Exception as exc:  # e.g. the log's disk is full: the service goes on
        log.error("deferred outcome failed", error=str(exc))
