"""Build an engine adapter by kind: the in-process simulated engine, vLLM or SGLang.

``sim`` is the in-process engine (no URL); a simulated engine *server*
(``pdd-router engine-sim serve``) speaks vLLM's API, so drive it with ``vllm``.
The HTTP kinds share one pooled ``httpx.AsyncClient`` owned by the caller
(``engine_http_client`` makes one with sensible limits and timeouts).
"""

from __future__ import annotations

from typing import Literal

import httpx

from engine_sim.engine import SimEngine, SimEngineConfig
from engines_adapter.contract import EngineAdapter
from engines_adapter.http_engine import DEFAULT_TIMEOUT, PROBE_TIMEOUT
from engines_adapter.sglang import SGLangAdapter
from engines_adapter.sse_transport import engine_transport
from engines_adapter.vllm import VLLMAdapter

__all__ = ["AdapterKind", "build_adapter", "engine_http_client"]

AdapterKind = Literal["sim", "vllm", "sglang"]


def engine_http_client(
    *, max_connections: int = 1024, timeout: httpx.Timeout = DEFAULT_TIMEOUT
) -> httpx.AsyncClient:
    """One pooled client for every HTTP engine adapter of a process: three quarters of
    ``max_connections`` for event streams, the rest for other calls."""
    streams = max(1, max_connections * 3 // 4)
    transport = engine_transport(streams, max_connections - streams, keepalive=256)
    return httpx.AsyncClient(transport=transport, timeout=timeout)


def build_adapter(  # noqa: PLR0913 -- the union of every adapter kind's settings
    kind: AdapterKind,
    instance_id: str,
    url: str | None = None,
    *,
    client: httpx.AsyncClient | None = None,
    kv_events_endpoint: str | None = None,
    kv_replay_endpoint: str | None = None,
    vocab_size: int | None = None,
    model: str | None = None,
    bootstrap_port: int | None = None,
    sim_config: SimEngineConfig | None = None,
    timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    probe_timeout: httpx.Timeout = PROBE_TIMEOUT,
) -> EngineAdapter:
    """An adapter for one engine instance; raises ValueError for a missing URL or client.
    ``timeout`` applies to generation calls, ``probe_timeout`` to health and load."""
    if kind == "sim":
        return SimEngine(instance_id, sim_config)
    if url is None:
        raise ValueError(f"a {kind} adapter needs the engine's URL")
    if client is None:
        raise ValueError(f"a {kind} adapter needs the shared httpx.AsyncClient")
    if kind == "vllm":
        return VLLMAdapter(
            instance_id,
            url,
            client=client,
            kv_events_endpoint=kv_events_endpoint,
            kv_replay_endpoint=kv_replay_endpoint,
            model=model,
            vocab_size=vocab_size,
            timeout=timeout,
            probe_timeout=probe_timeout,
        )
    if kind == "sglang":
        return SGLangAdapter(
            instance_id,
            url,
            client=client,
            bootstrap_port=bootstrap_port,
            kv_events_endpoint=kv_events_endpoint,
            vocab_size=vocab_size,
            timeout=timeout,
            probe_timeout=probe_timeout,
        )
    raise ValueError(f"unknown engine kind {kind!r} (sim, vllm, sglang)")
