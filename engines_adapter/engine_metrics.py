"""Engine load from Prometheus text: vLLM's and SGLang's metric names into ``EngineLoad``.

Samples of one name are summed over their label sets (several engines behind one
data-parallel server, or SGLang's ``cache_source`` split); KV usage is averaged.
Parsing uses ``prometheus_client.parser``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from engines_adapter.contract import EngineLoad

__all__ = ["SGLANG_METRICS", "VLLM_METRICS", "MetricNames", "parse_load", "parse_samples"]


@dataclass(frozen=True, slots=True)
class MetricNames:
    """Which sample names an engine exposes each figure under (first present wins)."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]
    queries: tuple[str, ...]
    hits: tuple[str, ...]
    cache_info: str | None = None  # an info gauge with block_size / num_gpu_blocks labels
    itl_sum: tuple[str, ...] = ()  # the inter-token latency histogram's sum and count
    itl_count: tuple[str, ...] = ()


VLLM_METRICS = MetricNames(
    running=("vllm:num_requests_running",),
    waiting=("vllm:num_requests_waiting",),
    kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    queries=("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    hits=("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    cache_info="vllm:cache_config_info",
    itl_sum=("vllm:inter_token_latency_seconds_sum", "vllm:time_per_output_token_seconds_sum"),
    itl_count=(
        "vllm:inter_token_latency_seconds_count",
        "vllm:time_per_output_token_seconds_count",
    ),
)

SGLANG_METRICS = MetricNames(
    running=("sglang:num_running_reqs",),
    waiting=("sglang:num_queue_reqs",),
    kv_usage=("sglang:token_usage",),
    queries=("sglang:prompt_tokens_total",),
    hits=("sglang:cached_tokens_total",),
    itl_sum=("sglang:inter_token_latency_seconds_sum", "sglang:time_per_output_token_seconds_sum"),
    itl_count=(
        "sglang:inter_token_latency_seconds_count",
        "sglang:time_per_output_token_seconds_count",
    ),
)


def parse_samples(text: str) -> tuple[dict[str, list[float]], dict[str, list[dict[str, str]]]]:
    """Sample values by sample name, and the label sets seen for each name."""
    values: dict[str, list[float]] = defaultdict(list)
    labels: dict[str, list[dict[str, str]]] = defaultdict(list)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                values[sample.name].append(float(sample.value))
                labels[sample.name].append(dict(sample.labels))
    except ValueError as exc:
        raise ValueError(f"not Prometheus text: {exc}") from exc
    return values, labels


def _first(values: dict[str, list[float]], names: tuple[str, ...]) -> list[float] | None:
    for name in names:
        if name in values:
            return values[name]
    return None


def _int_label(labels: list[dict[str, str]], key: str) -> int | None:
    for label_set in labels:
        raw = label_set.get(key)
        if raw is not None:
            try:
                return int(float(raw))
            except ValueError:
                return None
    return None


def parse_load(text: str, names: MetricNames = VLLM_METRICS) -> EngineLoad:
    """EngineLoad from a /metrics body; figures an engine does not expose stay at 0 / None."""
    values, labels = parse_samples(text)
    running = _first(values, names.running) or [0.0]
    waiting = _first(values, names.waiting) or [0.0]
    usage = _first(values, names.kv_usage) or [0.0]
    queries = _first(values, names.queries) or [0.0]
    hits = _first(values, names.hits) or [0.0]
    info = labels.get(names.cache_info, []) if names.cache_info else []
    return EngineLoad(
        running=int(sum(running)),
        waiting=int(sum(waiting)),
        kv_usage=min(1.0, max(0.0, sum(usage) / len(usage))),
        prefix_cache_queries=sum(queries),
        prefix_cache_hits=sum(hits),
        block_size=_int_label(info, "block_size"),
        num_blocks=_int_label(info, "num_gpu_blocks"),
        itl_sum_s=sum(_first(values, names.itl_sum) or [0.0]),
        itl_count=sum(_first(values, names.itl_count) or [0.0]),
    )
