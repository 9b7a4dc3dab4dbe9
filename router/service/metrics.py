"""Prometheus metrics of the service, on a registry owned by the app (no globals); the
per-request ones are in ``request_metrics``."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from router.service.loop_watch import LoopWatch
from router.service.request_metrics import RequestFamilies

__all__ = ["ServiceMetrics"]

_LATENCY_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1)
_SHARE_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)


class ServiceMetrics:
    """Every metric the router exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter(
            "pdd_router_decisions", "Decisions by pipeline and handoff mode",
            ["pipeline", "handoff", "arm"], registry=r,
        )  # fmt: skip
        self.rejections = Counter(
            "pdd_router_rejections", "Requests refused by admission control (429), by the "
            "bottleneck that would have made them miss the SLA", ["bottleneck"], registry=r,
        )  # fmt: skip
        self.decision_latency = Histogram(
            "pdd_router_decision_seconds", "Time to decide one request",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.predicted_hit = Histogram(
            "pdd_router_predicted_hit_rate", "Predicted hit rate on the serving decode tier",
            buckets=_SHARE_BUCKETS, registry=r,
        )  # fmt: skip
        self.prediction_error = Histogram(
            "pdd_router_hit_prediction_abs_error",
            "Absolute error of the predicted hit rate against the engine's cached tokens",
            buckets=(0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0), registry=r,
        )  # fmt: skip
        self.requests = Counter(
            "pdd_router_upstream_requests", "Upstream calls by instance", ["instance"], registry=r
        )
        self.errors = Counter(
            "pdd_router_upstream_errors", "Failed upstream calls by instance", ["instance"],
            registry=r,
        )  # fmt: skip
        self.handoffs = Counter(
            "pdd_router_handoffs", "Handoffs from RLD to MD by mode", ["mode"], registry=r
        )
        self.index_blocks = Gauge(
            "pdd_router_index_blocks", "Blocks the index records per instance", ["instance"],
            registry=r,
        )  # fmt: skip
        self.kv_events = Counter(
            "pdd_router_kv_event_batches", "KV event batches ingested", ["instance"], registry=r
        )
        self.kv_event_gaps = Counter(
            "pdd_router_kv_event_gaps",
            "Times KV events of an instance were lost and not replayed: the router then "
            "forgets what the instance holds (no predicted hits) until new events arrive",
            ["instance"], registry=r,
        )  # fmt: skip
        self.replicas = Gauge(
            "pdd_router_replicas",
            "Router replicas sharing the Redis index, this one included (last heartbeat)",
            registry=r,
        )
        self.replica_decisions_alone = Counter(
            "pdd_router_replica_decisions_alone",
            "Decisions published without the other replicas' load: the exchange with Redis "
            "failed or waits out redis.retry_after_s after a failure (each replica then "
            "decides on its own load and its last view of theirs)",
            registry=r,
        )  # fmt: skip
        self.kv_event_leases = Gauge(
            "pdd_router_kv_event_leases",
            "Instances whose KV events this replica writes to the shared index",
            registry=r,
        )
        # per request: latencies, tokens, outcomes, in flight (``RequestMetrics`` records)
        self.request = RequestFamilies(r)
        self.overhead = Histogram(
            "pdd_router_overhead_seconds",
            "The router's own time before a request's first token: its time to first token "
            "less the time it waited on engines (the prefill call, the first token of the "
            "decode stream); its mean is a preset's timing.router_s",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1), registry=r,
        )  # fmt: skip
        self.index_degraded = Gauge(
            "pdd_router_index_degraded",
            "1 while decisions use the local mirror: the shared index is unreachable or being "
            "brought up to date (set by the index when its state changes)",
            registry=r,
        )
        self.loop = LoopWatch(r)  # how long the event loop is held, and by the router's work

    def forget_instance(self, instance_id: str) -> None:
        """Drop the instance's series (it was removed): instances come and go under their
        own names, and each one's series would otherwise stay for as long as the router
        runs (a removed instance's block count, frozen, among them)."""
        per_instance = (self.requests, self.errors, self.index_blocks, self.kv_events,
                        self.kv_event_gaps)  # fmt: skip
        for metric in per_instance:
            with contextlib.suppress(KeyError):  # never had a series
                metric.remove(instance_id)
