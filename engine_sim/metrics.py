"""The simulated engine's ``/metrics``: its load under vLLM's metric names.

A prometheus-client collector read at scrape time, in a registry of its own (no
global state), exposing ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:prefix_cache_queries_total``,
``vllm:prefix_cache_hits_total``, the info gauge ``vllm:cache_config_info``
(``block_size``, ``num_gpu_blocks``) and the per-request timing histograms
``vllm:request_prefill_time_seconds`` and ``vllm:request_decode_time_seconds`` and the
per-token ``vllm:inter_token_latency_seconds`` (their sum and count: the requests'
times as each ends, the tokens' gaps as each is produced; one ``+Inf`` bucket), labelled
``model_name`` and ``engine`` as vLLM does.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine_sim.engine import SimEngine

__all__ = ["SimEngineCollector", "render_metrics"]

_LABELS = ["model_name", "engine"]


class SimEngineCollector(Collector):
    """Reads a SimEngine's figures on every scrape."""

    def __init__(self, engine: SimEngine, model_name: str) -> None:
        self.engine = engine
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        load = self.engine.snapshot()
        values = [self.model_name, "0"]
        gauges = {
            "vllm:num_requests_running": ("Requests in model execution batches.", load.running),
            "vllm:num_requests_waiting": ("Requests waiting to be processed.", load.waiting),
            "vllm:kv_cache_usage_perc": ("KV-cache usage. 1 means 100 percent.", load.kv_usage),
        }
        for name, (doc, value) in gauges.items():
            gauge = GaugeMetricFamily(name, doc, labels=_LABELS)
            gauge.add_metric(values, float(value))
            yield gauge
        counters = {
            "vllm:prefix_cache_queries": (
                "Prefix cache queries, in tokens.",
                load.prefix_cache_queries,
            ),
            "vllm:prefix_cache_hits": (
                "Prefix cache hits, in cached tokens.",
                load.prefix_cache_hits,
            ),
        }
        for name, (doc, total) in counters.items():
            counter = CounterMetricFamily(name, doc, labels=_LABELS)
            counter.add_metric(values, total)
            yield counter
        config = self.engine.config
        info_labels = {
            "block_size": str(config.block_size),
            "num_gpu_blocks": str(config.cache_blocks),
            "enable_prefix_caching": "True",
            "engine": "0",
        }
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(info_labels),
        )
        info.add_metric(list(info_labels.values()), 1.0)
        yield info
        times = self.engine.times
        histograms = {
            "vllm:request_prefill_time_seconds": (
                "Time spent in the prefill phase of a request.",
                times.prefill_s,
            ),
            "vllm:request_decode_time_seconds": (
                "Time spent in the decode phase of a request.",
                times.decode_s,
            ),
        }
        for name, (doc, total) in histograms.items():
            histogram = HistogramMetricFamily(name, doc, labels=_LABELS)
            histogram.add_metric(values, [("+Inf", float(times.requests))], total)
            yield histogram
        gaps = HistogramMetricFamily(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            labels=_LABELS,
        )  # fmt: skip
        gaps.add_metric(values, [("+Inf", load.itl_count)], load.itl_sum_s)
        yield gaps


def render_metrics(registry: CollectorRegistry) -> bytes:
    """The Prometheus text exposition of a registry."""
    return generate_latest(registry)
